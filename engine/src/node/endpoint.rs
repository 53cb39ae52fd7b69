//! The node endpoint, transport-free: what clients call. It carries the
//! strict reconnect protocol (`docs/node-lifecycle.md`):
//!
//! 1. `register` stores the node's information; a known node keeps its
//!    status and its scheduling eligibility. A new node gets a heartbeat
//!    deadline, and a new ready node evals for every system job.
//! 2. `update_status` is the heartbeat. A ready node that stays ready
//!    writes nothing: its deadline moves and it gets its TTL back. A
//!    `disconnected` node asking for `ready` becomes `initializing`; an
//!    `initializing` node with live allocations becomes `ready` only once
//!    its last alloc update is newer than its last missed heartbeat (nodes
//!    without live allocations become ready at once). A client told it is
//!    `initializing` therefore reports every allocation it has, changed or
//!    not (the resync), then heartbeats again. Transitions that need
//!    scheduling (to `ready`, to `down`, to or from `disconnected`) create
//!    node evals. Clients may not declare themselves `disconnected`.
//! 3. `update_allocs` is refused with [`NodeError::NotConnected`] while the
//!    node is `down` or `disconnected`, and changes nothing; the client
//!    heartbeats back first and retries. An update naming no allocation is
//!    refused at once ([`NodeError::EmptyUpdate`]). Accepted updates are
//!    batched ([`crate::node::update_batch`]) and record the node's last alloc
//!    update index; every submitter gets an answer.
//! 4. `allocs` waits until an allocation of the node changed after an index
//!    (woken only by writes that touched this node), or answers with the
//!    allocations as they are at its deadline. Allocations whose desired
//!    status is `stop` must not be (re)started.
//! 5. `read_services_async` is a node's read of service registrations for
//!    its templates: a blocking query on the services table's index
//!    ([`service_reads`]); it writes nothing.
//!
//! Every call but the services read has a blocking form for threads and
//! an `_async` form for tasks, which parks no thread; the engine starts
//! no runtime for either.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::service_reads::{self, ServiceQuery, ServicesRead};
use super::transitions::{drain_evals, needs_evals, next_status, node_evals};
use crate::clock::SharedClock;
use crate::node::heartbeat::Heartbeats;
use crate::node::update_batch::{batch_command, own_outcome, PendingUpdate, UpdateBatcher};
use crate::state::Writer;
use crate::state::{wait_until, wait_until_async};
use crate::state::{ClientAllocUpdate, Command, StateError, WaitError};
use crate::structs::{Allocation, DrainDeadline, DrainStrategy, EvalId, Node, NodeEligibility, NodeId, NodeStatus};

/// Why a node request was refused. Nothing was written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    /// No such node.
    #[error("unknown node {0}")]
    UnknownNode(NodeId),
    /// The node is down or disconnected: it must heartbeat back to ready first.
    #[error("node {node} is {status:?}; allocation updates are refused until it heartbeats again")]
    NotConnected {
        /// The node.
        node: NodeId,
        /// Its status.
        status: NodeStatus,
    },
    /// A client asked for a status only the servers set.
    #[error("node {node} may not set its own status to {status:?}")]
    StatusNotAllowed {
        /// The node.
        node: NodeId,
        /// The status asked for.
        status: NodeStatus,
    },
    /// A client reported an allocation that is not its own.
    #[error("node {node} reported allocation {alloc}, which is not placed on it")]
    NotItsAllocation {
        /// The node.
        node: NodeId,
        /// The allocation.
        alloc: crate::structs::AllocId,
    },
    /// An alloc update named no allocation.
    #[error("an alloc update from node {node} must name at least one allocation")]
    EmptyUpdate {
        /// The node.
        node: NodeId,
    },
    /// A call carried a secret that is not the node's.
    #[error("the secret presented for node {node} is not the node's")]
    WrongSecret {
        /// The node.
        node: NodeId,
    },
    /// The write failed.
    #[error(transparent)]
    State(StateError),
    /// The wait for changes ended without any.
    #[error(transparent)]
    Wait(#[from] WaitError),
}

impl From<StateError> for NodeError {
    /// The store's refusals in the node's words.
    fn from(error: StateError) -> Self {
        match error {
            StateError::UnknownNode(node) => NodeError::UnknownNode(node),
            StateError::NodeNotConnected { node_id, status } => NodeError::NotConnected { node: node_id, status },
            other => NodeError::State(other),
        }
    }
}

/// Alloc updates queued for a batch ([`NodeEndpoint::submit_allocs`]).
#[derive(Debug)]
pub struct PendingAllocUpdate(PendingUpdate);

impl PendingAllocUpdate {
    /// Waits for the batch; returns the index it was written at, or why
    /// these updates were refused.
    pub fn wait(self) -> Result<u64, NodeError> {
        self.0.wait().map_err(NodeError::from)
    }

    /// Awaits the batch; see [`PendingAllocUpdate::wait`].
    pub async fn outcome(self) -> Result<u64, NodeError> {
        self.0.outcome().await.map_err(NodeError::from)
    }
}

/// What a node learns from `register` and `update_status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeResponse {
    /// The state index the answer is current at.
    pub index: u64,
    /// The node's status now (it may differ from what was asked for).
    pub status: NodeStatus,
    /// When to heartbeat again (zero for a node that is down).
    pub heartbeat_ttl: Duration,
}

/// What a heartbeat comes to before anything is written.
enum StatusChange {
    /// The status stays: the answer.
    None(NodeResponse),
    /// The status changes: the command to write (boxed: a change is rare,
    /// the unchanged heartbeat is the hot path).
    Write(Box<Command>),
    /// The node's missed heartbeat is being written: ask again once it is.
    Marking,
}

/// A node's allocations and the index they are current at.
pub type NodeAllocs = (Vec<Arc<Allocation>>, u64);

/// An operator's drain change ([`NodeEndpoint::drain`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainRequest {
    /// The drain's deadline and whether system allocations stay (`None`:
    /// the drain ends).
    pub drain: Option<(DrainDeadline, bool)>,
    /// Whether the node becomes eligible as its drain ends.
    pub mark_eligible: bool,
    /// What the operator attaches to the drain's record.
    pub meta: BTreeMap<String, String>,
    /// The ACL token accessor that asks (empty without ACLs).
    pub accessor_id: String,
}

/// What an operator's write on a node did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeWrite {
    /// The index it was written at.
    pub index: u64,
    /// The evals it created.
    pub eval_ids: Vec<EvalId>,
}

/// The node endpoint; see the module docs.
#[derive(Debug, Clone)]
pub struct NodeEndpoint {
    writer: Writer,
    clock: SharedClock,
    heartbeats: Arc<Heartbeats>,
    batcher: Option<Arc<UpdateBatcher>>,
}

impl NodeEndpoint {
    /// An endpoint writing through `writer`. Without a `batcher`, each
    /// alloc update is written as its own command.
    pub fn new(
        writer: Writer,
        clock: SharedClock,
        heartbeats: Arc<Heartbeats>,
        batcher: Option<Arc<UpdateBatcher>>,
    ) -> Self {
        NodeEndpoint { writer, clock, heartbeats, batcher }
    }

    /// Registers a node or updates its information (step 1), blocking this
    /// thread until it is written.
    pub fn register(&self, node: Node) -> Result<NodeResponse, NodeError> {
        let node_id = node.id;
        let applied = self.writer.write(self.registration(node)?)?;
        loop {
            match self.answer(node_id, applied.index)? {
                Some(response) => return Ok(response),
                None => self.heartbeats.wait_marked(node_id),
            }
        }
    }

    /// [`NodeEndpoint::register`], awaited.
    pub async fn register_async(&self, node: Node) -> Result<NodeResponse, NodeError> {
        let node_id = node.id;
        let applied = self.writer.submit(self.registration(node)?).await?;
        loop {
            match self.answer(node_id, applied.index)? {
                Some(response) => return Ok(response),
                None => self.heartbeats.marked(node_id).await,
            }
        }
    }

    /// The registration's one command: the node, and the node's evals
    /// (its jobs' and every system job's, computed from the state before
    /// the write) when it is new and ready, or when a schedulable node now
    /// has another class (a driver became healthy or unhealthy: its system
    /// jobs may now fit, or no longer run), as Nomad's. A node already
    /// registered must present the secret it registered with.
    fn registration(&self, mut node: Node) -> Result<Command, NodeError> {
        node.status_updated_at = self.clock.now();
        let snapshot = self.writer.store().snapshot();
        let known = snapshot.node(node.id);
        if known.is_some_and(|known| known.secret_id != node.secret_id) {
            return Err(NodeError::WrongSecret { node: node.id });
        }
        let is_new_and_ready = known.is_none() && node.status == NodeStatus::Ready;
        let class_changed =
            known.is_some_and(|known| known.is_schedulable() && known.computed_class != node.compute_class());
        let evals = if is_new_and_ready || class_changed {
            node_evals(&snapshot, node.id, self.clock.now())
        } else {
            Vec::new()
        };
        Ok(Command::UpsertNode { node, evals })
    }

    /// An operator marks a node eligible or ineligible for new placements
    /// (Nomad's `node eligibility`); answers the index written. Becoming
    /// eligible creates the node's evals (its jobs and every system job),
    /// as a node becoming ready does; becoming ineligible moves nothing
    /// already placed. A node already so is written again, changing nothing.
    pub fn set_eligibility(&self, node_id: NodeId, eligibility: NodeEligibility) -> Result<u64, NodeError> {
        let snapshot = self.writer.store().snapshot();
        let node = snapshot.node(node_id).ok_or(NodeError::UnknownNode(node_id))?;
        let evals = match eligibility {
            NodeEligibility::Eligible if node.eligibility != eligibility => {
                node_evals(&snapshot, node_id, self.clock.now())
            }
            _ => Vec::new(),
        };
        let applied = self.writer.write(Command::UpdateNodeEligibility { node_id, eligibility, evals })?;
        Ok(applied.index)
    }

    /// An operator starts, changes or ends a node's drain (Nomad's `node
    /// drain`); answers the index written and the evals it created.
    /// Starting or changing one makes an eval for every job with live
    /// allocations on the node (the schedulers move them, paced by each
    /// group's `migrate` block and the disruption budget; the drainer
    /// follows up). Ending one with `mark_eligible` makes the node's evals,
    /// as becoming eligible does.
    pub fn drain(&self, node_id: NodeId, request: DrainRequest) -> Result<NodeWrite, NodeError> {
        let (command, eval_ids) = self.drain_command(node_id, request)?;
        let applied = self.writer.write(command)?;
        Ok(NodeWrite { index: applied.index, eval_ids })
    }

    /// [`NodeEndpoint::drain`], awaited (an agent draining itself).
    pub async fn drain_async(&self, node_id: NodeId, request: DrainRequest) -> Result<NodeWrite, NodeError> {
        let (command, eval_ids) = self.drain_command(node_id, request)?;
        let applied = self.writer.submit(command).await?;
        Ok(NodeWrite { index: applied.index, eval_ids })
    }

    /// A drain change's one command, and the evals it carries.
    fn drain_command(&self, node_id: NodeId, request: DrainRequest) -> Result<(Command, Vec<EvalId>), NodeError> {
        let snapshot = self.writer.store().snapshot();
        let node = snapshot.node(node_id).ok_or(NodeError::UnknownNode(node_id))?;
        let now = self.clock.now();
        let evals = match (&request.drain, request.mark_eligible) {
            (Some(_), _) => drain_evals(&snapshot, node_id, now),
            (None, true) if !node.is_schedulable() => node_evals(&snapshot, node_id, now),
            (None, _) => Vec::new(),
        };
        let eval_ids = evals.iter().map(|eval| eval.id).collect();
        let drain = request.drain.map(|(deadline, ignore_system_jobs)| DrainStrategy {
            deadline,
            ignore_system_jobs,
            started_at: now,
        });
        let command = Command::UpdateNodeDrain {
            node_id,
            drain,
            mark_eligible: request.mark_eligible,
            complete: false,
            meta: request.meta,
            accessor_id: request.accessor_id,
            evals,
            time: now,
        };
        Ok((command, eval_ids))
    }

    /// An operator asks for the node's jobs to be evaluated again (Nomad's
    /// `node evaluate`): an eval for every job with live allocations there
    /// and every system job.
    pub fn evaluate(&self, node_id: NodeId) -> Result<NodeWrite, NodeError> {
        let snapshot = self.writer.store().snapshot();
        snapshot.node(node_id).ok_or(NodeError::UnknownNode(node_id))?;
        let evals = node_evals(&snapshot, node_id, self.clock.now());
        let eval_ids = evals.iter().map(|eval| eval.id).collect();
        let applied = self.writer.write(Command::UpsertEvals { evals })?;
        Ok(NodeWrite { index: applied.index, eval_ids })
    }

    /// Deletes a node (Nomad's node deregister, `node purge`): its live
    /// allocations become `lost` and every job with allocations there is
    /// evaluated, in the same command, so they are replaced. Returns the
    /// evals' ids and the index of the write. A client of a purged node
    /// must register again.
    pub fn purge(&self, node_id: NodeId) -> Result<(Vec<EvalId>, u64), NodeError> {
        let snapshot = self.writer.store().snapshot();
        snapshot.node(node_id).ok_or(NodeError::UnknownNode(node_id))?;
        let time = self.clock.now();
        let evals = node_evals(&snapshot, node_id, time);
        let ids = evals.iter().map(|eval| eval.id).collect();
        let applied = self.writer.write(Command::PurgeNode { node_id, evals, time })?;
        Ok((ids, applied.index))
    }

    /// Refuses a call for `node_id` that does not carry its secret.
    pub fn authenticate(&self, node_id: NodeId, secret_id: Uuid) -> Result<(), NodeError> {
        let snapshot = self.writer.store().snapshot();
        let node = snapshot.node(node_id).ok_or(NodeError::UnknownNode(node_id))?;
        if node.secret_id != secret_id {
            return Err(NodeError::WrongSecret { node: node_id });
        }
        Ok(())
    }

    /// The heartbeat and status change (step 2), blocking this thread until
    /// any change is written. A heartbeat that changes nothing writes nothing.
    pub fn update_status(&self, node_id: NodeId, asked: NodeStatus) -> Result<NodeResponse, NodeError> {
        loop {
            let answer = match self.status_change(node_id, asked)? {
                StatusChange::None(response) => Some(response),
                StatusChange::Marking => None,
                StatusChange::Write(command) => {
                    let applied = self.writer.write(*command)?;
                    self.answer(node_id, applied.index)?
                }
            };
            match answer {
                Some(response) => return Ok(response),
                None => self.heartbeats.wait_marked(node_id),
            }
        }
    }

    /// [`NodeEndpoint::update_status`], awaited.
    pub async fn update_status_async(&self, node_id: NodeId, asked: NodeStatus) -> Result<NodeResponse, NodeError> {
        loop {
            let answer = match self.status_change(node_id, asked)? {
                StatusChange::None(response) => Some(response),
                StatusChange::Marking => None,
                StatusChange::Write(command) => {
                    let applied = self.writer.submit(*command).await?;
                    self.answer(node_id, applied.index)?
                }
            };
            match answer {
                Some(response) => return Ok(response),
                None => self.heartbeats.marked(node_id).await,
            }
        }
    }

    /// What a heartbeat asking for `asked` comes to: an answer at once when
    /// the status stays, or the command of the change (with its evals).
    fn status_change(&self, node_id: NodeId, asked: NodeStatus) -> Result<StatusChange, NodeError> {
        if asked == NodeStatus::Disconnected {
            return Err(NodeError::StatusNotAllowed { node: node_id, status: asked });
        }
        let snapshot = self.writer.store().snapshot();
        let node = snapshot.node(node_id).ok_or(NodeError::UnknownNode(node_id))?;
        let status = next_status(&snapshot, node, asked);
        if status == node.status {
            let Some(heartbeat_ttl) = self.heartbeat(node) else { return Ok(StatusChange::Marking) };
            return Ok(StatusChange::None(NodeResponse { index: snapshot.index(), status, heartbeat_ttl }));
        }
        let evals = if needs_evals(node.status, status) {
            node_evals(&snapshot, node_id, self.clock.now())
        } else {
            Vec::new()
        };
        let time = self.clock.now();
        Ok(StatusChange::Write(Box::new(Command::UpdateNodeStatus { node_id, status, evals, time })))
    }

    /// The answer after a write at `index`: the node's status now and its
    /// TTL (`None`: its missed heartbeat is being written; ask again after).
    fn answer(&self, node_id: NodeId, index: u64) -> Result<Option<NodeResponse>, NodeError> {
        let snapshot = self.writer.store().snapshot();
        let node = snapshot.node(node_id).ok_or(NodeError::UnknownNode(node_id))?;
        Ok(self.heartbeat(node).map(|heartbeat_ttl| NodeResponse { index, status: node.status, heartbeat_ttl }))
    }

    /// Moves a live node's deadline, or forgets a down one's; `None` while
    /// a missed heartbeat of the node is being written (`heartbeat` module
    /// docs, 4): the node is read again once it is.
    fn heartbeat(&self, node: &Node) -> Option<Duration> {
        if node.status.is_terminal_for_scheduling() {
            self.heartbeats.remove(node.id);
            Some(Duration::ZERO)
        } else {
            self.heartbeats.reset_unless_marking(node.id)
        }
    }

    /// Applies a client's allocation updates and waits until they are
    /// written (step 3).
    pub fn update_allocs(&self, node_id: NodeId, updates: Vec<ClientAllocUpdate>) -> Result<u64, NodeError> {
        self.submit_allocs(node_id, updates)?.wait()
    }

    /// [`NodeEndpoint::update_allocs`], awaited: no thread waits for the batch.
    pub async fn update_allocs_async(
        &self,
        node_id: NodeId,
        updates: Vec<ClientAllocUpdate>,
    ) -> Result<u64, NodeError> {
        self.submit_allocs(node_id, updates)?.outcome().await
    }

    /// Checks a client's allocation updates and queues them for the next
    /// batch; the caller waits on the returned handle. Lets one thread
    /// speak for many clients.
    pub fn submit_allocs(
        &self,
        node_id: NodeId,
        updates: Vec<ClientAllocUpdate>,
    ) -> Result<PendingAllocUpdate, NodeError> {
        self.check_updates(node_id, &updates)?;
        // The node is alive: its heartbeat may be waiting on this update.
        self.heartbeats.extend(node_id);
        let pending = match &self.batcher {
            Some(batcher) => batcher.submit(updates)?,
            None => {
                let alloc_ids: Vec<_> = updates.iter().map(|update| update.alloc_id).collect();
                let command = batch_command(&self.writer.store().snapshot(), updates, &self.clock);
                PendingUpdate::written(self.writer.write(command).and_then(|applied| own_outcome(&applied, &alloc_ids)))
            }
        };
        Ok(PendingAllocUpdate(pending))
    }

    /// Refuses an update that names no allocation, updates from a node that
    /// is not connected, and updates about allocations that are not the node's.
    fn check_updates(&self, node_id: NodeId, updates: &[ClientAllocUpdate]) -> Result<(), NodeError> {
        if updates.is_empty() {
            return Err(NodeError::EmptyUpdate { node: node_id });
        }
        let snapshot = self.writer.store().snapshot();
        let node = snapshot.node(node_id).ok_or(NodeError::UnknownNode(node_id))?;
        if node.status.is_terminal_for_scheduling() {
            return Err(NodeError::NotConnected { node: node_id, status: node.status });
        }
        for update in updates {
            let placed_here = snapshot.alloc(update.alloc_id).is_some_and(|alloc| alloc.node_id == node_id);
            if update.node_id != node_id || !placed_here {
                return Err(NodeError::NotItsAllocation { node: node_id, alloc: update.alloc_id });
            }
        }
        Ok(())
    }

    /// The node's allocations once any of them changed after `min_index`
    /// (at once when `min_index` is 0), with the index they are current at.
    /// Blocks this thread up to `timeout`; at the timeout it answers with
    /// the allocations as they are, like a Nomad blocking query. Only a
    /// write where the servers changed this node's allocations wakes it:
    /// the client's own reports are not pushed back (they come along with
    /// the next change, or at once if found on the first look).
    pub fn allocs(&self, node_id: NodeId, min_index: u64, timeout: Duration) -> Result<NodeAllocs, NodeError> {
        let watch = self.writer.store().watch_node(node_id);
        let found = wait_until(|| watch.listen(), Instant::now() + timeout, || self.allocs_after(node_id, min_index))?;
        match found {
            Some(found) => Ok(found),
            None => Ok(self.allocs_after(node_id, 0)?.expect("a min index of 0 always answers")),
        }
    }

    /// [`NodeEndpoint::allocs`], awaited and without a deadline (bound it
    /// with the runtime's timeout): no thread waits, and only a write where
    /// the servers changed this node's allocations wakes the task.
    pub async fn allocs_async(
        &self,
        node_id: NodeId,
        min_index: u64,
    ) -> Result<(Vec<Arc<Allocation>>, u64), NodeError> {
        let watch = self.writer.store().watch_node(node_id);
        wait_until_async(|| watch.listen(), || self.allocs_after(node_id, min_index)).await
    }

    /// What `queries` find for a node's templates once the services table
    /// changed after `min_index` (at once for 0), awaited without a
    /// deadline (bound it with the runtime's timeout, then answer with
    /// [`NodeEndpoint::read_services_now`]); see [`service_reads`]. An
    /// unknown node is refused.
    pub async fn read_services_async(
        &self,
        node_id: NodeId,
        queries: &[ServiceQuery],
        min_index: u64,
    ) -> Result<ServicesRead, NodeError> {
        if self.writer.store().snapshot().node(node_id).is_none() {
            return Err(NodeError::UnknownNode(node_id));
        }
        Ok(service_reads::read_after(self.writer.store(), queries, min_index).await?)
    }

    /// What `queries` find now.
    pub fn read_services_now(&self, queries: &[ServiceQuery]) -> ServicesRead {
        service_reads::read_now(&self.writer.store().snapshot(), queries)
    }

    /// The node's allocations if one changed, or one was deleted, after
    /// `min_index` (or `min_index` is 0); an error for an unknown node or a store shut down.
    fn allocs_after(&self, node_id: NodeId, min_index: u64) -> Result<Option<NodeAllocs>, NodeError> {
        let store = self.writer.store();
        let snapshot = store.snapshot();
        let node = snapshot.node(node_id).ok_or(NodeError::UnknownNode(node_id))?;
        let allocs: Vec<_> = snapshot.allocs_by_node(node_id).cloned().collect();
        let removed = node.allocs_removed_index > min_index;
        if min_index == 0 || removed || allocs.iter().any(|alloc| alloc.modify_index > min_index) {
            return Ok(Some((allocs, snapshot.index())));
        }
        if store.is_shutting_down() {
            return Err(NodeError::Wait(WaitError::Shutdown { wanted: min_index + 1 }));
        }
        Ok(None)
    }
}
