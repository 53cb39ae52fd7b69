//! Deleting from the state: garbage collection ([`Command::GarbageCollect`]),
//! an operator's eval delete ([`Command::DeleteEvals`]) and node purge
//! ([`Command::PurgeNode`]).
//!
//! Contract:
//! 1. What to collect is chosen on a snapshot (`crate::gc::select`) and
//!    written later, so the writer checks again. A collection names the
//!    index of the snapshot it was chosen on (`as_of`); any object written
//!    since (its modify index above `as_of`) came back to life or moved on
//!    and is passed over, as is an object that is gone already. A job is
//!    deleted only when it is still stopped or batch, and none of its
//!    evals and allocations changed since either, and none is live; an
//!    eval only when terminal, an allocation only when terminal and not
//!    running; a node only when still `down` with no live allocation; a
//!    deployment only when no longer active.
//! 2. Deleting a job deletes what hangs off it: its evals, allocations,
//!    kept versions and deployments. Deleting an allocation deletes its
//!    service registrations and takes it out of the by-node and by-job
//!    lists; deleting an eval takes it out of the by-job list; deleting a
//!    node takes it out of the class and schedulable lists and deletes its
//!    registrations. Every list stays exactly what a replay would build.
//! 3. Each table a deletion touched takes the command's index as its table
//!    index, so blocking queries on it wake. The nodes whose allocations
//!    were deleted record the index (`allocs_removed_index`) and their
//!    watchers are woken: the node's allocation watch answers, and its
//!    client, seeing them gone from the list, removes them too.
//! 4. Deleting evals by hand needs the eval broker paused (the stored
//!    scheduler configuration's `pause_eval_broker`), else the whole
//!    command is refused with [`StateError::EvalBrokerNotPaused`].

use std::sync::Arc;

#[cfg(doc)]
use super::command::Command;
use super::snapshot::{index_remove, Snapshot};
use super::{Applied, StateError};
use crate::clock::Timestamp;
use crate::structs::{
    AllocId, Allocation, ClientStatus, DeploymentId, EvalId, Job, JobKey, JobType, NodeId, NodeStatus,
};

/// The description of an allocation whose node was purged.
pub const NODE_PURGED: &str = "node was purged";

/// What one collection asks to delete ([`Command::GarbageCollect`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Collection {
    /// The index of the snapshot the objects were chosen on.
    pub as_of: u64,
    /// Evaluations (of jobs that stay).
    pub evals: Vec<EvalId>,
    /// Allocations (of jobs that stay).
    pub allocs: Vec<AllocId>,
    /// Jobs, with their evals, allocations, versions and deployments.
    pub jobs: Vec<JobKey>,
    /// Nodes.
    pub nodes: Vec<NodeId>,
    /// Deployments (of jobs that stay).
    pub deployments: Vec<DeploymentId>,
}

impl Collection {
    /// How many objects it names (a job counts once).
    pub fn len(&self) -> usize {
        self.evals.len() + self.allocs.len() + self.jobs.len() + self.nodes.len() + self.deployments.len()
    }

    /// Whether it names nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How many objects of each kind a collection deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Collected {
    /// Evaluations, those of deleted jobs included.
    pub evals: u32,
    /// Allocations, those of deleted jobs included.
    pub allocs: u32,
    /// Jobs.
    pub jobs: u32,
    /// Nodes.
    pub nodes: u32,
    /// Deployments, those of deleted jobs included.
    pub deployments: u32,
}

impl Collected {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: Collected) {
        self.evals += other.evals;
        self.allocs += other.allocs;
        self.jobs += other.jobs;
        self.nodes += other.nodes;
        self.deployments += other.deployments;
    }
}

impl Snapshot {
    /// Applies a [`Command::GarbageCollect`] (contract, 1-3).
    pub(super) fn garbage_collect(&mut self, index: u64, collection: &Collection, applied: &mut Applied) {
        let as_of = collection.as_of;
        for key in &collection.jobs {
            if self.job_collectable(key, as_of) {
                self.delete_job(index, key, applied);
            }
        }
        for id in &collection.evals {
            if self.evals.get(id).is_some_and(|eval| eval.modify_index <= as_of && eval.status.is_terminal()) {
                self.delete_eval(index, *id, applied);
            }
        }
        for id in &collection.allocs {
            if self.allocs.get(id).is_some_and(|alloc| alloc.modify_index <= as_of && alloc_finished(alloc)) {
                self.delete_alloc(index, *id, applied);
            }
        }
        for id in &collection.deployments {
            if self.deployments.get(id).is_some_and(|it| it.modify_index <= as_of && !it.is_active()) {
                self.delete_deployment(index, *id, applied);
            }
        }
        for id in &collection.nodes {
            let node = self.nodes.get(id);
            let down = node.is_some_and(|node| node.modify_index <= as_of && node.status == NodeStatus::Down);
            if down && self.allocs_by_node(*id).all(|alloc| alloc.terminal()) {
                self.delete_node(index, *id);
                applied.collected.nodes += 1;
            }
        }
    }

    /// Whether a job named by a collection chosen at `as_of` may still go
    /// (contract, 1).
    fn job_collectable(&self, key: &JobKey, as_of: u64) -> bool {
        let Some(job) = self.jobs.get(key) else { return false };
        let kind = job.stop || job.job_type == JobType::Batch;
        let evals_settled = self.evals_by_job(key).all(|eval| eval.modify_index <= as_of && eval.status.is_terminal());
        let allocs_settled = self.allocs_by_job(key).all(|alloc| alloc.modify_index <= as_of && alloc_finished(alloc));
        kind && job.modify_index <= as_of && evals_settled && allocs_settled
    }

    /// Deletes a job and everything that hangs off it (contract, 2).
    pub(super) fn delete_job(&mut self, index: u64, key: &JobKey, applied: &mut Applied) {
        let evals: Vec<EvalId> = self.evals_by_job(key).map(|eval| eval.id).collect();
        for id in evals {
            self.delete_eval(index, id, applied);
        }
        let allocs: Vec<AllocId> = self.allocs_by_job(key).map(|alloc| alloc.id).collect();
        for id in allocs {
            self.delete_alloc(index, id, applied);
        }
        let deployments: Vec<DeploymentId> = self.deployments_by_job(key).map(|it| it.id).collect();
        for id in deployments {
            self.delete_deployment(index, id, applied);
        }
        if self.jobs.remove(key).is_some() {
            applied.collected.jobs += 1;
        }
        self.forget_job_versions(key);
        self.forget_periodic(key);
        self.table_indexes.jobs = index;
    }

    fn delete_eval(&mut self, index: u64, id: EvalId, applied: &mut Applied) {
        let Some(eval) = self.evals.remove(&id) else { return };
        index_remove(&mut self.evals_by_job, &eval.job_key(), &id);
        self.table_indexes.evals = index;
        applied.collected.evals += 1;
        applied.deleted_evals.push(eval);
    }

    fn delete_alloc(&mut self, index: u64, id: AllocId, applied: &mut Applied) {
        let Some(alloc) = self.allocs.get(&id).cloned() else { return };
        // As a terminal write first, so the node's usage and ports let go
        // of it whatever it held.
        if !alloc.terminal() {
            let mut stopped = Allocation::clone(&alloc);
            stopped.client_status = ClientStatus::Lost;
            self.put_alloc(stopped);
        }
        self.allocs.remove(&id);
        index_remove(&mut self.allocs_by_node, &alloc.node_id, &id);
        index_remove(&mut self.allocs_by_job, &alloc.job_key(), &id);
        self.delete_alloc_service_registrations(index, &[id]);
        self.table_indexes.allocs = index;
        self.note_alloc_removed(index, alloc.node_id);
        applied.touch(alloc.node_id);
        applied.collected.allocs += 1;
    }

    /// Records on the node that its allocation list shrank at `index`, so
    /// its watch answers (contract, 3), as a client's update is recorded:
    /// the node's own modify index stays.
    fn note_alloc_removed(&mut self, index: u64, node_id: NodeId) {
        let Some(existing) = self.nodes.get(&node_id) else { return };
        if existing.allocs_removed_index != index {
            let mut node = crate::structs::Node::clone(existing);
            node.allocs_removed_index = index;
            self.nodes.insert(node_id, Arc::new(node));
            self.table_indexes.nodes = index;
        }
    }

    fn delete_deployment(&mut self, index: u64, id: DeploymentId, applied: &mut Applied) {
        let Some(deployment) = self.deployments.remove(&id) else { return };
        index_remove(&mut self.deployments_by_job, &deployment.job_key(), &id);
        self.active_deployments.remove(&id);
        self.table_indexes.deployments = index;
        applied.collected.deployments += 1;
    }

    fn delete_node(&mut self, index: u64, id: NodeId) {
        let Some(node) = self.nodes.remove(&id) else { return };
        index_remove(&mut self.nodes_by_class, &node.computed_class, &id);
        self.schedulable.remove(id);
        self.forget_services_of_node(index, id);
        self.table_indexes.nodes = index;
    }

    /// Applies a [`Command::DeleteEvals`] (contract, 4): unknown ids are
    /// passed over.
    pub(super) fn delete_evals(
        &mut self,
        index: u64,
        eval_ids: &[EvalId],
        applied: &mut Applied,
    ) -> Result<(), StateError> {
        if !self.scheduler_config.is_some_and(|config| config.pause_eval_broker) {
            return Err(StateError::EvalBrokerNotPaused);
        }
        for id in eval_ids {
            self.delete_eval(index, *id, applied);
        }
        Ok(())
    }

    /// Applies a [`Command::PurgeNode`]: the node's live allocations are
    /// marked `lost` (their jobs' evals, in the same command, replace
    /// them), then the node is deleted.
    pub(super) fn purge_node(
        &mut self,
        index: u64,
        node_id: NodeId,
        time: Timestamp,
        applied: &mut Applied,
    ) -> Result<(), StateError> {
        if !self.nodes.contains_key(&node_id) {
            return Err(StateError::UnknownNode(node_id));
        }
        let live: Vec<Arc<Allocation>> = self.allocs_by_node(node_id).filter(|a| !a.terminal()).cloned().collect();
        for existing in live {
            let mut alloc = Allocation::clone(&existing);
            alloc.set_client_status(ClientStatus::Lost, NODE_PURGED, time);
            alloc.modify_index = index;
            alloc.modify_time = time;
            self.forget_services_if_ended(index, &alloc);
            self.count_in_deployment(index, Some(&existing), &alloc, time);
            self.put_alloc(alloc);
            applied.touch(node_id);
            self.table_indexes.allocs = index;
        }
        self.delete_node(index, node_id);
        applied.collected.nodes += 1;
        Ok(())
    }
}

/// Whether an allocation is done for good: terminal, and not still
/// running on its client (one the servers stopped may be).
pub fn alloc_finished(alloc: &Allocation) -> bool {
    alloc.terminal() && alloc.client_status != ClientStatus::Running
}

/// Whether a job is `dead` as Nomad's job status says it: nothing of it
/// runs, and it was stopped, or everything it placed has finished and no
/// eval of it is outstanding.
pub fn job_is_dead(snapshot: &Snapshot, job: &Job) -> bool {
    let key = job.key();
    if snapshot.allocs_by_job(&key).any(|alloc| !alloc.terminal()) {
        return false;
    }
    if job.stop {
        return true;
    }
    let outstanding = snapshot.evals_by_job(&key).any(|eval| !eval.status.is_terminal());
    !outstanding && snapshot.allocs_by_job(&key).next().is_some()
}
