//! The disruption budget: one per task group, held by the plan applier.
//!
//! A voluntary disruption is a stop the servers choose while the group
//! still wants the allocation's slot: a destructive update, an old
//! allocation whose slot a promoted canary took (and, with drains,
//! migrations): [`stop_reason::is_voluntary`]. A group whose job has an
//! `update` block may have at most `max_parallel` of its `count` slots
//! without an available allocation ([`is_available`]) because of updates,
//! and a service group at most its `migrate.max_parallel` because of
//! migrations off draining nodes (a system job's count: its live
//! allocations before the plan, one per node). Both kinds draw on the one
//! count of the group's available allocations.
//!
//! 1. The applier checks the part of a plan it is about to commit against
//!    the newest state: the snapshot, the plans still being written (the
//!    overlay) and the plan itself.
//! 2. Per group, stopping an allocation that is not available costs
//!    nothing. Stopping available ones is allowed while the group keeps at
//!    least `count - max_parallel` available allocations after the plan.
//! 3. Stops beyond that are taken out of the result with the placements
//!    that replace them, and the worker re-plans against the refreshed
//!    state, as for a node that no longer fits. So two workers planning on
//!    the same snapshot never take a group below its budget together: the
//!    second plan is checked after the first, against the first's stops.
//!
//! The reconciler computes the same budget, so plans rarely exceed it; this
//! check makes the bound exact whatever runs in parallel.

use std::collections::{BTreeMap, BTreeSet};

use hashbrown::HashMap;

use crate::scheduler::reconcile::{is_available, stop_reason};
use crate::state::Snapshot;
use crate::structs::{AllocId, Allocation, JobType, NodeId, Plan, PlanResult};

/// Takes the voluntary stops beyond each group's budget out of `result`
/// (with their replacements); returns how many stops were taken out.
pub fn hold_budget(
    plan: &Plan,
    snapshot: &Snapshot,
    overlays: &[&HashMap<NodeId, Vec<Allocation>>],
    result: &mut PlanResult,
) -> usize {
    let Some(job) = &plan.job else { return 0 };
    let voluntary: Vec<&Allocation> = result
        .node_update
        .values()
        .flatten()
        .filter(|stop| stop.job_id == job.id && stop_reason::is_voluntary(&stop.desired_description))
        .collect();
    if voluntary.is_empty() {
        return 0;
    }
    let key = job.key();
    // The group's allocations as they stand after the plans in flight and this one.
    let mut latest: BTreeMap<AllocId, &Allocation> =
        snapshot.allocs_by_job(&key).map(|alloc| (alloc.id, &**alloc)).collect();
    let in_flight = overlays.iter().flat_map(|overlay| overlay.values().flatten());
    for alloc in in_flight.filter(|alloc| alloc.job_id == job.id && alloc.namespace == job.namespace) {
        latest.insert(alloc.id, alloc);
    }
    let before: BTreeMap<AllocId, bool> = latest.iter().map(|(id, alloc)| (*id, is_available(alloc))).collect();
    let mut before_live: BTreeMap<&str, usize> = BTreeMap::new();
    for alloc in latest.values().filter(|alloc| !alloc.terminal()) {
        *before_live.entry(&alloc.task_group).or_insert(0) += 1;
    }
    let committed = result.node_update.values().chain(result.node_allocation.values()).flatten();
    for alloc in committed {
        latest.insert(alloc.id, alloc);
    }
    let mut refused: BTreeSet<AllocId> = BTreeSet::new();
    for group in &job.task_groups {
        // A system job's group wants one allocation per node it runs on.
        let count = match job.job_type.is_system_like() {
            true => before_live.get(group.name.as_str()).copied().unwrap_or(0),
            false => group.count as usize,
        };
        let mut available =
            latest.values().filter(|alloc| *alloc.task_group == *group.name && is_available(alloc)).count();
        let costly = |class: fn(&str) -> bool| -> Vec<AllocId> {
            let stops =
                voluntary.iter().filter(|stop| *stop.task_group == *group.name && class(&stop.desired_description));
            stops.filter(|stop| before.get(&stop.id) == Some(&true)).map(|stop| stop.id).collect()
        };
        // Each kind of voluntary stop is held to its own limit, the tighter
        // one first, against the one count of available allocations.
        let mut kinds = Vec::new();
        if let Some(update) = &group.update {
            kinds.push((update.max_parallel, costly(stop_reason::is_update)));
        }
        if job.job_type == JobType::Service {
            kinds.push((group.migrate.max_parallel, costly(|description| description == stop_reason::MIGRATING)));
        }
        kinds.sort_by_key(|(limit, _)| *limit);
        for (limit, mut stops) in kinds {
            let floor = count.saturating_sub(limit as usize);
            let over = floor.saturating_sub(available).min(stops.len());
            stops.sort_unstable();
            refused.extend(stops.into_iter().rev().take(over));
            available += over;
        }
    }
    if refused.is_empty() {
        return 0;
    }
    take_out(result, &refused);
    refused.len()
}

/// Removes the stops in `refused` and the placements replacing them.
fn take_out(result: &mut PlanResult, refused: &BTreeSet<AllocId>) {
    for stops in result.node_update.values_mut() {
        stops.retain(|stop| !refused.contains(&stop.id));
    }
    result.node_update.retain(|_, stops| !stops.is_empty());
    for allocs in result.node_allocation.values_mut() {
        allocs.retain(|alloc| alloc.previous_allocation.is_none_or(|previous| !refused.contains(&previous)));
    }
    result.node_allocation.retain(|_, allocs| !allocs.is_empty());
}

#[cfg(test)]
#[path = "budget_test.rs"]
mod budget_test;
