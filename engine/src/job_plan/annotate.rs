//! A dry run's plan read back as Nomad's annotations (`DesiredTGUpdates`):
//! per task group, how many allocations the plan places, stops, updates
//! in place or destructively, and leaves alone, and what it evicts.
//!
//! The rules, over the plan and the job's allocations before it:
//! 1. A new placement whose `previous_allocation` the plan stops as
//!    "being updated due to job update" is a destructive update, one whose
//!    previous allocation it stops as migrated off a draining node is a
//!    migration, and that stop is not counted again.
//! 2. Another new placement is a canary if it is one, else a placement.
//! 3. An existing allocation in `node_allocation` moved to another job
//!    version is an in-place update; one changed otherwise (a reconnect, a
//!    follow-up eval noted) is left alone.
//! 4. Every other stop is a stop.
//! 5. A live allocation the plan does not touch is ignored.
//! 6. Each eviction counts as a preemption of the group whose placement
//!    needed it, and is listed.

use std::collections::BTreeMap;
use std::sync::Arc;

use hashbrown::{HashMap, HashSet};

use crate::scheduler::reconcile::stop_reason;
use crate::structs::{AllocId, Allocation, Job, Plan};

/// What a plan does to one task group (Nomad's `DesiredUpdates`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredUpdates {
    /// Live allocations left alone.
    pub ignore: u64,
    /// New allocations.
    pub place: u64,
    /// Allocations moved off their node (Drover reports none: a move is a
    /// stop and a placement).
    pub migrate: u64,
    /// Allocations stopped.
    pub stop: u64,
    /// Allocations moved to the new job version without a restart.
    pub in_place_update: u64,
    /// Allocations replaced by new ones of the new job version.
    pub destructive_update: u64,
    /// Canaries placed.
    pub canary: u64,
    /// Allocations of other jobs evicted for this group's placements.
    pub preemptions: u64,
}

/// Nomad's `PlanAnnotations`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlanAnnotations {
    /// Per task group.
    pub desired_tg_updates: BTreeMap<String, DesiredUpdates>,
    /// The allocations the plan evicts, as the plan leaves them.
    pub preempted_allocs: Vec<Allocation>,
}

/// Annotates `plan` (none: the scheduler had nothing to change) for `job`,
/// whose allocations before it are `existing`; see the module docs.
pub fn annotate(job: &Job, existing: &[Arc<Allocation>], plan: Option<&Plan>) -> PlanAnnotations {
    let mut groups: BTreeMap<String, DesiredUpdates> =
        job.task_groups.iter().map(|group| (group.name.clone(), DesiredUpdates::default())).collect();
    let before: HashMap<AllocId, &Arc<Allocation>> = existing.iter().map(|alloc| (alloc.id, alloc)).collect();
    let stops: HashMap<AllocId, &Allocation> =
        plan.into_iter().flat_map(|plan| plan.node_update.values().flatten()).map(|alloc| (alloc.id, alloc)).collect();
    let mut touched: HashSet<AllocId> = HashSet::new();
    let mut replaced: HashSet<AllocId> = HashSet::new();
    for alloc in plan.into_iter().flat_map(|plan| plan.node_allocation.values().flatten()) {
        let counts = groups.entry(alloc.task_group.to_string()).or_default();
        if let Some(old) = before.get(&alloc.id) {
            if old.job.job_modify_index != alloc.job.job_modify_index {
                counts.in_place_update += 1;
                touched.insert(alloc.id);
            }
            continue;
        }
        counts.preemptions += alloc.preempted_allocations.len() as u64;
        let previous_stop = alloc.previous_allocation.and_then(|previous| stops.get(&previous).copied());
        match previous_stop.map(|stop| (stop.id, stop.desired_description.as_str())) {
            Some((previous, stop_reason::UPDATING)) => {
                counts.destructive_update += 1;
                replaced.insert(previous);
            }
            Some((previous, stop_reason::MIGRATING | stop_reason::DRAIN_DEADLINE)) => {
                counts.migrate += 1;
                replaced.insert(previous);
            }
            _ if alloc.canary => counts.canary += 1,
            _ => counts.place += 1,
        }
    }
    for stop in stops.values() {
        touched.insert(stop.id);
        if !replaced.contains(&stop.id) {
            groups.entry(stop.task_group.to_string()).or_default().stop += 1;
        }
    }
    for alloc in existing.iter().filter(|alloc| !alloc.terminal() && !touched.contains(&alloc.id)) {
        groups.entry(alloc.task_group.to_string()).or_default().ignore += 1;
    }
    let preempted_allocs =
        plan.into_iter().flat_map(|plan| plan.node_preemptions.values().flatten()).cloned().collect();
    PlanAnnotations { desired_tg_updates: groups, preempted_allocs }
}
