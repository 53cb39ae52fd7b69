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

fn pause_eval_broker(paused: bool) -> Command {
    let config = crate::structs::SchedulerConfiguration { pause_eval_broker: paused, ..Default::default() };
    Command::SetSchedulerConfig { config, cas_index: None }
}

/// `PauseEvalBroker` outlives a change of leader, and its writes pause and
/// resume the broker through the router.
#[test]
fn the_stored_configuration_pauses_the_broker() {
    let (store, _) = left_behind(true);
    store.apply(pause_eval_broker(true)).expect("paused");
    let core = new_leader(store);
    assert!(core.broker.is_paused(), "a new leader keeps it paused");
    assert!(core.broker.try_dequeue(&JobType::ALL).expect("running").is_none(), "nothing handed out");
    core.writer.write(pause_eval_broker(false)).expect("resumed");
    assert!(!core.broker.is_paused());
    assert!(core.broker.try_dequeue(&JobType::ALL).expect("running").is_some(), "handed out again");
}

/// A blocked eval deleted by hand is forgotten, and not written back as
/// canceled (which would bring it back).
#[test]
fn a_deleted_blocked_eval_is_forgotten_without_a_trace() {
    let (store, eval) = left_behind(false);
    let core = new_leader(store);
    assert_eq!(core.blocked.stats().total_blocked, 1);
    core.writer.write(pause_eval_broker(true)).expect("paused");
    core.writer.write(Command::DeleteEvals { eval_ids: vec![eval.id] }).expect("deleted");
    assert_eq!(core.blocked.stats().total_blocked, 0);
    assert!(core.blocked.blocked_eval_of(&eval.job_key()).is_none());
    assert!(core.blocked.take_duplicates().is_empty(), "nothing to write as canceled");
    assert!(core.store.snapshot().eval(eval.id).is_none());
}
