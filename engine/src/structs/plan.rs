//! Plans: what a scheduler wants changed, and what the plan applier made of it.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Allocation, Deployment, DeploymentStatusUpdate, EvalId, Job, NodeId};

/// A scheduler's proposed changes for one evaluation. Only the plan applier
/// turns plans into state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The evaluation that produced it.
    pub eval_id: EvalId,
    /// The broker token the worker holds for that evaluation.
    pub eval_token: u64,
    /// Priority of the job; plans queue by it.
    pub priority: u8,
    /// The job version the placements are for (absent for pure stops).
    pub job: Option<Arc<Job>>,
    /// Allocations to stop or evict, per node.
    pub node_update: BTreeMap<NodeId, Vec<Allocation>>,
    /// Allocations to create or update in place, per node.
    pub node_allocation: BTreeMap<NodeId, Vec<Allocation>>,
    /// Lower-priority allocations evicted to make room for this plan's
    /// placements, per node: copies with desired status `evict` and
    /// `preempted_by_allocation` set. The plan applier counts them as freed
    /// on their node and refuses the node whole if the placements still do
    /// not fit.
    pub node_preemptions: BTreeMap<NodeId, Vec<Allocation>>,
    /// The state index the scheduler planned against.
    pub snapshot_index: u64,
    /// The job's deployment as this plan leaves it: created, or with new
    /// desired counts, canaries or status.
    pub deployment: Option<Deployment>,
    /// Status changes of other deployments (an older version's, cancelled).
    pub deployment_updates: Vec<DeploymentStatusUpdate>,
}

impl Plan {
    /// Whether the plan changes nothing.
    pub fn is_no_op(&self) -> bool {
        self.deployment.is_none()
            && self.deployment_updates.is_empty()
            && self.node_update.values().all(Vec::is_empty)
            && self.node_allocation.values().all(Vec::is_empty)
            && self.node_preemptions.values().all(Vec::is_empty)
    }

    /// Number of placements and in-place updates.
    pub fn placement_count(&self) -> usize {
        self.node_allocation.values().map(Vec::len).sum()
    }

    /// Number of allocations the plan evicts.
    pub fn preemption_count(&self) -> usize {
        self.node_preemptions.values().map(Vec::len).sum()
    }

    /// The jobs its allocations hold (to encode each once:
    /// [`super::job_refs::to_postcard_sharing`]).
    pub fn alloc_jobs(&self) -> impl Iterator<Item = &Arc<Job>> + '_ {
        alloc_jobs([&self.node_update, &self.node_allocation, &self.node_preemptions])
    }
}

/// What the plan applier committed of a plan. A partly refused plan is a
/// result, not an error: `refresh_index` tells the worker which state to
/// re-plan against.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PlanResult {
    /// Stops that were committed.
    pub node_update: BTreeMap<NodeId, Vec<Allocation>>,
    /// Placements that were committed.
    pub node_allocation: BTreeMap<NodeId, Vec<Allocation>>,
    /// Evictions that were committed (with the placements of their node).
    pub node_preemptions: BTreeMap<NodeId, Vec<Allocation>>,
    /// Non-zero when part of the plan was refused: wait for this index, then re-plan.
    pub refresh_index: u64,
    /// The index at which the committed part was applied (0 if nothing was).
    pub alloc_index: u64,
    /// The deployment written with it.
    pub deployment: Option<Deployment>,
    /// The deployment status changes written with it.
    pub deployment_updates: Vec<DeploymentStatusUpdate>,
}

impl PlanResult {
    /// Whether it writes nothing.
    pub fn is_empty(&self) -> bool {
        self.node_update.is_empty()
            && self.node_allocation.is_empty()
            && self.node_preemptions.is_empty()
            && self.deployment.is_none()
            && self.deployment_updates.is_empty()
    }

    /// The jobs its allocations hold, as [`Plan::alloc_jobs`].
    pub fn alloc_jobs(&self) -> impl Iterator<Item = &Arc<Job>> + '_ {
        alloc_jobs([&self.node_update, &self.node_allocation, &self.node_preemptions])
    }

    /// Takes out placements the state store refused at commit time (their
    /// node left between the applier's check and the write, or a port they
    /// were given was taken) and asks for a re-plan at `index`. Evictions on
    /// that node were written: the evicted jobs' evals place them again.
    pub fn refuse_placements(&mut self, refused: &[super::AllocId], index: u64) {
        if refused.is_empty() {
            return;
        }
        for allocs in self.node_allocation.values_mut() {
            allocs.retain(|alloc| !refused.contains(&alloc.id));
        }
        self.node_allocation.retain(|_, allocs| !allocs.is_empty());
        self.refresh_index = index;
    }
}

/// The jobs of the allocations in `maps`.
fn alloc_jobs<'a>(maps: [&'a BTreeMap<NodeId, Vec<Allocation>>; 3]) -> impl Iterator<Item = &'a Arc<Job>> + 'a {
    maps.into_iter().flat_map(BTreeMap::values).flatten().map(|alloc| &alloc.job)
}
