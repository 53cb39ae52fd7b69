//! A new leader's takeover ([`Core::lead`]) of the state an old leader left.

use std::sync::Arc;

use super::*;
use crate::clock::ManualClock;
use crate::state::Command;
use crate::structs::{ComputedClass, Evaluation, Job, Resources, TriggerReason};
use crate::testing::node;

/// A store with a job's blocked eval, checked on a snapshot taken before
/// the one ready node registered, and eligible for the node's class or
/// not; the store and the eval.
fn left_behind(eligible: bool) -> (Arc<StateStore>, Evaluation) {
    let store = Arc::new(StateStore::new());
    let ready = node(0);
    let job = Job::new_simple("web", JobType::Service, 1, Resources::new(1, 1, 0));
    store.apply(Command::RegisterJob { job: job.clone(), eval: None }).expect("job");
    let mut eval = Evaluation::for_job(&job, TriggerReason::QueuedAllocs, Timestamp(0));
    eval.status = EvalStatus::Blocked;
    eval.snapshot_index = store.latest_index();
    eval.class_eligibility = [(ready.computed_class, eligible), (ComputedClass(u64::MAX), false)].into();
    store.apply(Command::UpsertEvals { evals: vec![eval.clone()] }).expect("eval");
    store.apply(Command::UpsertNode { node: ready, evals: vec![] }).expect("node");
    (store, eval)
}

fn new_leader(store: Arc<StateStore>) -> Core {
    let clock = ManualClock::new(Timestamp(1_000_000_000_000));
    let core = Core::new(&ServerConfig::default(), clock, store, Some(1));
    core.lead();
    core
}

/// The old leader released the eval when the node came, then died before
/// a worker ran it (its broker died with it): the new leader runs it.
#[test]
fn a_new_leader_runs_a_blocked_eval_that_capacity_came_for() {
    let (store, eval) = left_behind(true);
    let core = new_leader(store);
    let held = core.broker.try_dequeue(&JobType::ALL).expect("running").expect("the blocked eval runs again");
    assert_eq!(held.eval.id, eval.id);
    assert_eq!(core.blocked.stats().total_blocked, 0);
}

#[test]
fn a_blocked_eval_no_ready_node_can_take_stays_parked() {
    let (store, _) = left_behind(false);
    let core = new_leader(store);
    assert!(core.broker.try_dequeue(&JobType::ALL).expect("running").is_none(), "nothing it could use came");
    assert_eq!(core.blocked.stats().total_blocked, 1);
}
