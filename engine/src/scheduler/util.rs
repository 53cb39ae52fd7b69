//! What both schedulers share to finish an eval (Nomad's
//! `scheduler/util.go`): the summary of an attempt, one finish path
//! that parks the shortfall, schedules the disconnect expiry and records
//! the outcome on the eval, and how evictions enter a plan.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Planner, SchedulerError, State};
use crate::clock::Timestamp;
use crate::structs::{
    AllocMetric, Allocation, ComputedClass, DesiredStatus, EvalId, EvalStatus, Evaluation, Plan, TriggerReason,
};

/// What one planning attempt came to.
pub(crate) enum Attempt {
    /// The plan was committed whole (or there was nothing to do).
    Done(Summary),
    /// Part of the plan was refused: re-plan against this state.
    Retry(Arc<dyn State>),
}

/// What an eval records about its attempt, and what it could not place.
#[derive(Default)]
pub(crate) struct Summary {
    /// Placement metrics per task group that could not place everything.
    pub failed: BTreeMap<String, AllocMetric>,
    /// Allocations still to place per task group.
    pub queued: BTreeMap<String, u64>,
    /// Per computed class: whether the job can run there.
    pub class_eligibility: BTreeMap<ComputedClass, bool>,
    /// Whether class checks could not decide the job's constraints.
    pub escaped: bool,
    /// When the `unknown` allocations this eval marked run out of time.
    pub follow_up_at: Option<Timestamp>,
    /// When a system job's rolling update takes its next batch.
    pub rolling_update_at: Option<Timestamp>,
    /// Block even without failed placements (every plan attempt was refused).
    pub block: bool,
}

impl Summary {
    /// Notes a disconnect expiry at `at`, keeping the earliest.
    pub fn follow_up_no_later_than(&mut self, at: Timestamp) {
        self.follow_up_at = Some(self.follow_up_at.map_or(at, |current| current.min(at)));
    }
}

/// Where a shortfall was parked.
enum Parked {
    /// A new blocked eval was created with this id.
    Created(EvalId),
    /// `eval` was itself the blocked eval, unblocked and still short: it went
    /// back to the blocked tracker and needs no further update.
    Reblocked,
}

/// Finishes `eval`: the follow-up for the disconnect expiry, a blocked eval
/// (or a reblock) for what could not be placed, and the eval's status with
/// its placement metrics.
pub(crate) fn finish(
    planner: &mut dyn Planner,
    eval: &Evaluation,
    summary: Summary,
    outcome: (EvalStatus, &str),
    snapshot_index: u64,
    now: Timestamp,
) -> Result<(), SchedulerError> {
    let mut done = eval.clone();
    // Before parking: a reblocked eval returns early, and the expiry of
    // what it marked `unknown` must still be scheduled.
    let follow_ups = [
        summary.follow_up_at.map(|at| (TriggerReason::MaxDisconnectTimeout, at)),
        summary.rolling_update_at.map(|at| (TriggerReason::RollingUpdate, at)),
    ];
    for (reason, at) in follow_ups.into_iter().flatten() {
        let follow_up = eval.follow_up(reason, at, now);
        done.next_eval.get_or_insert(follow_up.id);
        planner.create_eval(follow_up)?;
    }
    if !summary.failed.is_empty() || summary.block {
        match park_shortfall(planner, eval, &summary, snapshot_index, now)? {
            Parked::Reblocked => return Ok(()),
            Parked::Created(id) => done.blocked_eval = Some(id),
        }
    }
    let (status, description) = outcome;
    done.status = status;
    done.status_description = description.to_string();
    done.failed_tg_allocs = summary.failed;
    done.queued_allocations = summary.queued;
    done.snapshot_index = snapshot_index;
    done.modify_time = now;
    planner.update_eval(done)
}

/// Parks what `eval` could not place until capacity changes after
/// `snapshot_index`: a new blocked eval, or the eval itself when it was the
/// blocked one (Nomad's reblock).
fn park_shortfall(
    planner: &mut dyn Planner,
    eval: &Evaluation,
    summary: &Summary,
    snapshot_index: u64,
    now: Timestamp,
) -> Result<Parked, SchedulerError> {
    let reblock = eval.status == EvalStatus::Blocked;
    let mut parked = if reblock {
        eval.clone()
    } else {
        let trigger = if summary.block { TriggerReason::MaxPlanAttempts } else { TriggerReason::QueuedAllocs };
        let mut blocked = eval.follow_up(trigger, now, now);
        blocked.wait_until = None;
        blocked.status = EvalStatus::Blocked;
        blocked.status_description = "created to place remaining allocations".into();
        blocked
    };
    parked.class_eligibility = summary.class_eligibility.clone();
    parked.escaped_computed_class = summary.escaped;
    parked.snapshot_index = snapshot_index;
    parked.queued_allocations = summary.queued.clone();
    if reblock {
        parked.failed_tg_allocs = summary.failed.clone();
        planner.reblock_eval(parked)?;
        return Ok(Parked::Reblocked);
    }
    let id = parked.id;
    planner.create_eval(parked)?;
    Ok(Parked::Created(id))
}

/// Puts the evictions `alloc` needs in the plan, each an `evict` copy
/// pointing at it, and lists them on it.
pub(crate) fn add_preemptions(
    plan: &mut Plan,
    alloc: &mut Allocation,
    preempted: &[Arc<Allocation>],
    eval: &Evaluation,
) {
    for victim in preempted {
        let mut evicted = Allocation::clone(victim);
        evicted.desired_status = DesiredStatus::Evict;
        evicted.desired_description = format!("preempted by allocation {}", alloc.id);
        evicted.preempted_by_allocation = Some(alloc.id);
        evicted.eval_id = eval.id;
        alloc.preempted_allocations.push(victim.id);
        plan.node_preemptions.entry(victim.node_id).or_default().push(evicted);
    }
}
