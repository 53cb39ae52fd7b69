use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::clock::ManualClock;
use crate::eval::broker::BrokerConfig;
use crate::structs::{EvalStatus, Job, JobType, Resources, TriggerReason};

const GENERAL: ComputedClass = ComputedClass(1);
const GPU: ComputedClass = ComputedClass(2);
const EDGE: ComputedClass = ComputedClass(3);

fn tracker() -> (BlockedEvals, Arc<EvalBroker>, Arc<ManualClock>) {
    let clock = ManualClock::new(Timestamp(1_000_000_000_000));
    let broker = Arc::new(EvalBroker::new(BrokerConfig::default(), clock.clone()));
    (BlockedEvals::new(broker.clone(), clock.clone()), broker, clock)
}

/// A blocked eval of `job`, checked against GENERAL (eligible) and GPU (not).
fn blocked(job: &str, create_index: u64, snapshot_index: u64) -> Arc<Evaluation> {
    let spec = Job::new_simple(job, JobType::Service, 1, Resources::new(1, 1, 0));
    let mut eval = Evaluation::for_job(&spec, TriggerReason::QueuedAllocs, Timestamp(0));
    eval.status = EvalStatus::Blocked;
    eval.create_index = create_index;
    eval.snapshot_index = snapshot_index;
    eval.class_eligibility = [(GENERAL, true), (GPU, false)].into_iter().collect();
    Arc::new(eval)
}

fn ready_ids(broker: &EvalBroker) -> Vec<EvalId> {
    let all = JobType::ALL;
    std::iter::from_fn(|| broker.try_dequeue(&all).expect("running")).map(|dequeued| dequeued.eval.id).collect()
}

#[test]
fn capacity_on_an_eligible_class_unblocks() {
    let (tracker, broker, _) = tracker();
    let eval = blocked("web", 10, 10);
    tracker.block(eval.clone());
    assert_eq!(tracker.stats().total_blocked, 1);
    assert_eq!(tracker.unblock(GPU, 11), 0, "the job cannot run on GPU nodes");
    assert!(ready_ids(&broker).is_empty());
    assert_eq!(tracker.unblock(GENERAL, 12), 1);
    assert_eq!(ready_ids(&broker), vec![eval.id]);
    assert_eq!(tracker.stats().total_blocked, 0);
    assert_eq!(tracker.stats().total_unblocked, 1);
}

#[test]
fn a_class_the_eval_never_saw_unblocks_it() {
    let (tracker, broker, _) = tracker();
    let eval = blocked("web", 10, 10);
    tracker.block(eval.clone());
    assert_eq!(tracker.unblock(EDGE, 11), 1, "a new class may fit");
    assert_eq!(ready_ids(&broker), vec![eval.id]);
}

#[test]
fn escaped_evals_unblock_on_any_capacity_change() {
    let (tracker, broker, _) = tracker();
    let mut eval = Evaluation::clone(&blocked("web", 10, 10));
    eval.escaped_computed_class = true;
    let eval = Arc::new(eval);
    tracker.block(eval.clone());
    assert_eq!(tracker.stats().total_escaped, 1);
    assert_eq!(tracker.unblock(GPU, 11), 1);
    assert_eq!(ready_ids(&broker), vec![eval.id]);
}

#[test]
fn one_blocked_eval_per_job_and_the_older_is_a_duplicate() {
    let (tracker, broker, _) = tracker();
    let older = blocked("web", 10, 10);
    let newer = blocked("web", 20, 20);
    tracker.block(older.clone());
    tracker.block(newer.clone());
    assert_eq!(tracker.stats().total_blocked, 1);
    assert_eq!(tracker.blocked_eval_of(&newer.job_key()).map(|eval| eval.id), Some(newer.id));
    assert_eq!(tracker.take_duplicates().iter().map(|eval| eval.id).collect::<Vec<_>>(), vec![older.id]);

    // An older eval arriving late is the duplicate, not the parked one.
    let late = blocked("web", 5, 5);
    tracker.block(late.clone());
    assert_eq!(tracker.take_duplicates().iter().map(|eval| eval.id).collect::<Vec<_>>(), vec![late.id]);
    tracker.unblock(GENERAL, 30);
    assert_eq!(ready_ids(&broker), vec![newer.id]);
}

#[test]
fn an_eval_that_missed_an_unblock_runs_at_once() {
    let (tracker, broker, _) = tracker();
    tracker.unblock(GENERAL, 15);
    let stale = blocked("web", 10, 10);
    tracker.block(stale.clone());
    assert_eq!(ready_ids(&broker), vec![stale.id], "capacity appeared after its snapshot");
    let fresh = blocked("api", 20, 20);
    tracker.block(fresh);
    assert!(ready_ids(&broker).is_empty(), "no capacity change since its snapshot");
    assert_eq!(tracker.stats().total_blocked, 1);
}

#[test]
fn an_ineligible_class_change_is_not_a_missed_unblock() {
    let (tracker, broker, _) = tracker();
    tracker.unblock(GPU, 15);
    tracker.block(blocked("web", 10, 10));
    assert!(ready_ids(&broker).is_empty());
}

#[test]
fn system_evals_wait_on_their_node() {
    let (tracker, broker, _) = tracker();
    let spec = Job::new_simple("agent", JobType::System, 1, Resources::new(1, 1, 0));
    let mut eval = Evaluation::for_job(&spec, TriggerReason::NodeUpdate, Timestamp(0));
    eval.node_id = Some(NodeId::from_u128(7));
    eval.create_index = 3;
    eval.snapshot_index = 3;
    let eval = Arc::new(eval);
    tracker.block(eval.clone());
    assert_eq!(tracker.stats().total_system, 1);
    assert_eq!(tracker.unblock_node(NodeId::from_u128(8), 4), 0);
    assert_eq!(tracker.unblock_node(NodeId::from_u128(7), 5), 1);
    assert_eq!(ready_ids(&broker), vec![eval.id]);
}

#[test]
fn untrack_drops_a_jobs_blocked_evals() {
    let (tracker, broker, _) = tracker();
    let eval = blocked("web", 10, 10);
    tracker.block(eval.clone());
    assert_eq!(tracker.untrack(&eval.job_key()).len(), 1);
    assert_eq!(tracker.unblock(GENERAL, 11), 0);
    assert!(ready_ids(&broker).is_empty());
}

#[test]
fn prune_forgets_old_unblock_indexes() {
    let (tracker, broker, clock) = tracker();
    tracker.unblock(GENERAL, 15);
    clock.advance(Duration::from_secs(20 * 60));
    tracker.prune(Duration::from_secs(15 * 60));
    tracker.block(blocked("web", 10, 10));
    assert!(ready_ids(&broker).is_empty(), "the old unblock was forgotten");
    assert_eq!(tracker.stats().total_blocked, 1);
}

#[test]
fn evals_blocked_by_plan_failures_are_retried_on_the_timer() {
    let (tracker, broker, _) = tracker();
    let mut failed = Evaluation::clone(&blocked("web", 10, 10));
    failed.triggered_by = TriggerReason::MaxPlanAttempts;
    failed.escaped_computed_class = true;
    let failed = Arc::new(failed);
    tracker.block(failed.clone());
    tracker.block(blocked("api", 11, 11));
    assert_eq!(tracker.unblock_failed(), 1);
    assert_eq!(ready_ids(&broker), vec![failed.id]);
    assert_eq!(tracker.stats().total_blocked, 1, "the capacity-blocked eval stays");
}
