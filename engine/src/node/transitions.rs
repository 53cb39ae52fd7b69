//! The pure decisions of the reconnect protocol
//! (`docs/node-lifecycle.md`): the status a node moves to when it asks for one, which
//! moves need its jobs evaluated, and the evals that follow. No I/O, no
//! clock: the caller passes the snapshot and the time.

use std::collections::BTreeSet;

use crate::clock::Timestamp;
use crate::state::Snapshot;
use crate::structs::{Evaluation, Node, NodeId, NodeStatus, TriggerReason};

/// The status a node asking for `asked` moves to (the endpoint's step 2).
#[inline]
pub fn next_status(snapshot: &Snapshot, node: &Node, asked: NodeStatus) -> NodeStatus {
    match (node.status, asked) {
        (NodeStatus::Disconnected, NodeStatus::Ready) => NodeStatus::Initializing,
        (NodeStatus::Initializing, NodeStatus::Ready) => {
            let has_live_allocs = snapshot.allocs_by_node(node.id).any(|alloc| !alloc.terminal());
            if has_live_allocs && node.last_alloc_update_index <= node.last_missed_heartbeat_index {
                NodeStatus::Initializing
            } else {
                NodeStatus::Ready
            }
        }
        (_, asked) => asked,
    }
}

/// Whether moving from `from` to `to` needs the node's jobs evaluated.
#[inline]
pub fn needs_evals(from: NodeStatus, to: NodeStatus) -> bool {
    from != to
        && (to == NodeStatus::Ready
            || to == NodeStatus::Down
            || from == NodeStatus::Disconnected
            || to == NodeStatus::Disconnected)
}

/// An eval for every job with live allocations on a draining node
/// (triggered by `node-drain`).
pub fn drain_evals(snapshot: &Snapshot, node_id: NodeId, now: Timestamp) -> Vec<Evaluation> {
    let keys: BTreeSet<_> =
        snapshot.allocs_by_node(node_id).filter(|alloc| !alloc.terminal()).map(|alloc| alloc.job_key()).collect();
    keys.iter()
        .filter_map(|key| snapshot.job(key))
        .map(|job| {
            let mut eval = Evaluation::for_job(job, TriggerReason::NodeDrain, now);
            eval.node_id = Some(node_id);
            eval
        })
        .collect()
}

/// Evals for every job with live allocations on the node, and every system
/// job (which may now run there, or must leave).
pub fn node_evals(snapshot: &Snapshot, node_id: NodeId, now: Timestamp) -> Vec<Evaluation> {
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
