//! The node endpoint, transport-free: what clients call.
//!
//! - `register`: stores the node's information; a known node keeps its
//!   status (DESIGN.md). A new ready node gets evals for every system job.
//! - `update_status`: changes the status and creates node evals when the
//!   change needs scheduling (to or from ready).
//! - `update_allocs`: the client's allocation updates, refused while the
//!   node is down or disconnected; failed allocations get an eval.
//! - `allocs`: blocks until something changes for the node after an index.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::SharedClock;
use crate::router::Router;
use crate::state::{ClientAllocUpdate, Command, Snapshot, StateError, WaitError};
use crate::structs::{Allocation, ClientStatus, Evaluation, Node, NodeId, NodeStatus, TriggerReason};

/// Why a node request was refused. Nothing was written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    /// No such node.
    #[error("unknown node {0}")]
    UnknownNode(NodeId),
    /// The node is down or disconnected: it must heartbeat back to ready first.
    #[error("node {node} is {status:?}; allocation updates are refused until it is ready again")]
    NotConnected {
        /// The node.
        node: NodeId,
        /// Its status.
        status: NodeStatus,
    },
    /// The write failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// The wait for changes ended without any.
    #[error(transparent)]
    Wait(#[from] WaitError),
}

/// The node endpoint; see the module docs.
#[derive(Debug, Clone)]
pub struct NodeEndpoint {
    router: Router,
    clock: SharedClock,
}

impl NodeEndpoint {
    /// An endpoint writing through `router`.
    pub fn new(router: Router, clock: SharedClock) -> Self {
        NodeEndpoint { router, clock }
    }

    /// Registers a node or updates its information; returns the write index.
    pub fn register(&self, node: Node) -> Result<u64, NodeError> {
        let snapshot = self.router.store().snapshot();
        let is_new = snapshot.node(node.id).is_none();
        let node_id = node.id;
        let ready = node.status == NodeStatus::Ready;
        let applied = self.router.apply(Command::UpsertNode { node })?;
        if is_new && ready {
            let evals = node_evals(&self.router.store().snapshot(), node_id, self.clock.now());
            if !evals.is_empty() {
                self.router.apply(Command::UpsertEvals { evals })?;
            }
        }
        Ok(applied.index)
    }

    /// Changes a node's status, with node evals when scheduling is affected.
    pub fn update_status(&self, node_id: NodeId, status: NodeStatus) -> Result<u64, NodeError> {
        let snapshot = self.router.store().snapshot();
        let node = snapshot.node(node_id).ok_or(NodeError::UnknownNode(node_id))?;
        let changes_scheduling = (node.status == NodeStatus::Ready) != (status == NodeStatus::Ready);
        let evals = if changes_scheduling { node_evals(&snapshot, node_id, self.clock.now()) } else { Vec::new() };
        let applied =
            self.router.apply(Command::UpdateNodeStatus { node_id, status, missed_heartbeat: false, evals })?;
        Ok(applied.index)
    }

    /// Applies a client's allocation updates.
    pub fn update_allocs(&self, node_id: NodeId, updates: Vec<ClientAllocUpdate>) -> Result<u64, NodeError> {
        let snapshot = self.router.store().snapshot();
        let node = snapshot.node(node_id).ok_or(NodeError::UnknownNode(node_id))?;
        if node.status.is_terminal_for_scheduling() {
            return Err(NodeError::NotConnected { node: node_id, status: node.status });
        }
        let now = self.clock.now();
        let failed_jobs: BTreeSet<_> = updates
            .iter()
            .filter(|update| update.client_status == ClientStatus::Failed)
            .filter_map(|update| snapshot.alloc(update.alloc_id))
            .map(|alloc| alloc.job_key())
            .collect();
        let evals = failed_jobs
            .iter()
            .filter_map(|key| snapshot.job(key))
            .map(|job| Evaluation::for_job(job, TriggerReason::AllocFailure, now))
            .collect();
        let applied = self.router.apply(Command::UpdateAllocsFromClient { updates, evals, time: now })?;
        Ok(applied.index)
    }

    /// The node's allocations once any of them changed after `min_index`,
    /// waiting up to `timeout`; with the index they are current at.
    pub fn allocs(
        &self,
        node_id: NodeId,
        min_index: u64,
        timeout: Duration,
    ) -> Result<(Vec<Arc<Allocation>>, u64), NodeError> {
        let deadline = Instant::now() + timeout;
        let mut wait_for = min_index + 1;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let snapshot = self.router.store().snapshot_min_index(wait_for, remaining)?;
            if snapshot.node(node_id).is_none() {
                return Err(NodeError::UnknownNode(node_id));
            }
            let allocs: Vec<_> = snapshot.allocs_by_node(node_id).cloned().collect();
            if allocs.iter().any(|alloc| alloc.modify_index > min_index) || min_index == 0 {
                return Ok((allocs, snapshot.index()));
            }
            wait_for = snapshot.index() + 1;
        }
    }
}

/// Evals for every job with live allocations on the node, and every system
/// job (which may now run there).
pub fn node_evals(snapshot: &Snapshot, node_id: NodeId, now: crate::clock::Timestamp) -> Vec<Evaluation> {
    let mut keys: BTreeSet<_> =
        snapshot.allocs_by_node(node_id).filter(|alloc| !alloc.terminal()).map(|alloc| alloc.job_key()).collect();
    keys.extend(snapshot.jobs().filter(|job| job.job_type.is_system_like() && !job.stop).map(|job| job.key()));
    keys.iter()
        .filter_map(|key| snapshot.job(key))
        .map(|job| {
            let mut eval = Evaluation::for_job(job, TriggerReason::NodeUpdate, now);
            eval.node_id = Some(node_id);
            eval
        })
        .collect()
}
