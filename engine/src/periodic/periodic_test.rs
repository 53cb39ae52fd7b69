//! The scheduling rule with a driven clock, and the dispatcher over a
//! store: launches once per time, across a change of leader.

use std::time::Duration;

use super::*;
use crate::clock::ManualClock;
use crate::state::StateStore;
use crate::structs::{JobType, Resources};

const SECOND: u64 = 1_000_000_000;
/// A whole minute: 2026-03-07T10:20:00Z.
const MINUTE_START: u64 = 1_772_878_800;

fn at(seconds: u64) -> Timestamp {
    Timestamp(seconds * SECOND)
}

fn every_minute() -> PeriodicConfig {
    PeriodicConfig::cron("* * * * *")
}

#[test]
fn the_rule_waits_then_launches_at_the_scheduled_time() {
    let config = every_minute();
    let base = at(MINUTE_START + 5);
    assert_eq!(due_launch(&config, base, at(MINUTE_START + 30)), Due::Wait(Some(at(MINUTE_START + 60))));
    // The timer fires a little late: the launch keeps its scheduled time.
    let due = due_launch(&config, base, Timestamp(at(MINUTE_START + 60).0 + 3_000_000));
    assert_eq!(due, Due::Launch { at: at(MINUTE_START + 60), next: Some(at(MINUTE_START + 120)) });
    // Launched: the record moves to the launch, and the next one waits.
    assert_eq!(
        due_launch(&config, at(MINUTE_START + 60), at(MINUTE_START + 61)),
        Due::Wait(Some(at(MINUTE_START + 120)))
    );
}

#[test]
fn after_several_missed_launches_the_rule_launches_once_at_now() {
    let config = every_minute();
    let now = at(MINUTE_START + 10 * 60 + 7);
    let due = due_launch(&config, at(MINUTE_START), now);
    assert_eq!(due, Due::Launch { at: now, next: Some(at(MINUTE_START + 11 * 60)) });
    assert_eq!(due_launch(&config, now, now), Due::Wait(Some(at(MINUTE_START + 11 * 60))), "once, not ten times");
}

#[test]
fn a_schedule_that_never_matches_again_waits_forever() {
    let config = PeriodicConfig::cron("0 0 1 1 * 2020");
    assert_eq!(due_launch(&config, at(MINUTE_START), at(MINUTE_START)), Due::Wait(None));
}

/// A store with a periodic batch job registered at `registered`.
fn store_with_periodic_job(registered: Timestamp, config: PeriodicConfig) -> (Arc<StateStore>, Job) {
    let store = Arc::new(StateStore::new());
    let mut job = Job::new_simple("report", JobType::Batch, 1, Resources::new(10, 10, 0));
    job.periodic = Some(config);
    job.submit_time = registered;
    assert_eq!(job.validate(), Ok(()));
    store.apply(Command::RegisterJob { job: job.clone(), eval: None }).expect("registers");
    (store, job)
}

fn children(store: &StateStore, job: &Job) -> Vec<String> {
    let snapshot = store.snapshot();
    let mut ids: Vec<String> = snapshot.job_children(&job.key()).map(|child| child.id.to_string()).collect();
    ids.sort();
    ids
}

fn launched(job: &Job, minutes: &[u64]) -> Vec<String> {
    minutes.iter().map(|minute| child_id(&job.id, at(MINUTE_START + minute * 60))).collect()
}

#[test]
fn the_dispatcher_launches_each_minute_once_with_an_eval_and_a_record() {
    let clock = ManualClock::new(at(MINUTE_START + 5));
    let (store, job) = store_with_periodic_job(at(MINUTE_START + 5), every_minute());
    let dispatcher = PeriodicDispatcher::new(Writer::direct(store.clone()), clock.clone());
    assert_eq!(dispatcher.run(), Some(at(MINUTE_START + 60)), "nothing due before the first minute");
    assert!(children(&store, &job).is_empty());
    for minute in 1..=3 {
        clock.set(at(MINUTE_START + minute * 60));
        assert_eq!(dispatcher.run(), Some(at(MINUTE_START + (minute + 1) * 60)));
        assert_eq!(dispatcher.run(), Some(at(MINUTE_START + (minute + 1) * 60)), "a second run launches nothing");
    }
    assert_eq!(children(&store, &job), launched(&job, &[1, 2, 3]));
    let snapshot = store.snapshot();
    assert_eq!(snapshot.periodic_launch(&job.key()).expect("recorded").launch, at(MINUTE_START + 180));
    let child =
        snapshot.job(&JobKey { namespace: job.namespace.clone(), id: Arc::from(launched(&job, &[2])[0].as_str()) });
    let child = child.expect("the child is stored");
    assert_eq!(child.parent_id, "report");
    assert!(child.periodic.is_none() && child.is_scheduled_directly());
    let evals: Vec<_> = snapshot.evals_by_job(&child.key()).collect();
    assert_eq!(evals.len(), 1);
    assert_eq!(evals[0].triggered_by, TriggerReason::PeriodicJob);
}

#[test]
fn a_new_leader_neither_misses_nor_repeats_a_launch() {
    let clock = ManualClock::new(at(MINUTE_START + 5));
    let (store, job) = store_with_periodic_job(at(MINUTE_START + 5), every_minute());
    let old_leader = PeriodicDispatcher::new(Writer::direct(store.clone()), clock.clone());
    clock.set(at(MINUTE_START + 60));
    old_leader.run();
    // The old leader dies; a follower holds the replicated state (here
    // through the snapshot format, as a restarted server reads it).
    let mut bytes = Vec::new();
    store.snapshot().encode(&mut bytes).expect("encodes");
    let follower = Arc::new(StateStore::restored(Snapshot::decode(&mut bytes.as_slice()).expect("decodes")));
    drop(old_leader);
    // The election takes 20 seconds: nothing was due meanwhile.
    clock.set(at(MINUTE_START + 80));
    let new_leader = PeriodicDispatcher::new(Writer::direct(follower.clone()), clock.clone());
    assert_eq!(new_leader.run(), Some(at(MINUTE_START + 120)), "minute 1 was launched already");
    clock.set(at(MINUTE_START + 120));
    new_leader.run();
    clock.set(at(MINUTE_START + 180));
    new_leader.run();
    assert_eq!(children(&follower, &job), launched(&job, &[1, 2, 3]), "three launches, none missed or doubled");
}

#[test]
fn a_launch_the_old_leader_wrote_late_is_not_written_twice() {
    let clock = ManualClock::new(at(MINUTE_START + 5));
    let (store, job) = store_with_periodic_job(at(MINUTE_START + 5), every_minute());
    // The old leader's launch of minute 1 was in flight when it died...
    let (in_flight, _) = launch_command(&job, at(MINUTE_START + 60), at(MINUTE_START + 60), false);
    // ...and the new leader launched minute 1 itself before the entry committed.
    clock.set(at(MINUTE_START + 62));
    let new_leader = PeriodicDispatcher::new(Writer::direct(store.clone()), clock.clone());
    new_leader.run();
    let refused = store.apply(in_flight).expect_err("the same launch again");
    assert!(matches!(refused, StateError::LaunchedAlready { .. }), "{refused}");
    assert_eq!(children(&store, &job), launched(&job, &[1]));
}

#[test]
fn a_leader_that_missed_several_launches_launches_once_at_once() {
    let clock = ManualClock::new(at(MINUTE_START + 5));
    let (store, job) = store_with_periodic_job(at(MINUTE_START + 5), every_minute());
    clock.set(at(MINUTE_START + 10 * 60 + 7));
    let dispatcher = PeriodicDispatcher::new(Writer::direct(store.clone()), clock.clone());
    assert_eq!(dispatcher.run(), Some(at(MINUTE_START + 11 * 60)));
    assert_eq!(dispatcher.run(), Some(at(MINUTE_START + 11 * 60)));
    assert_eq!(children(&store, &job), [child_id(&job.id, at(MINUTE_START + 10 * 60 + 7))]);
}

#[test]
fn prohibit_overlap_skips_a_launch_while_a_child_runs() {
    let clock = ManualClock::new(at(MINUTE_START + 5));
    let mut config = every_minute();
    config.prohibit_overlap = true;
    let (store, job) = store_with_periodic_job(at(MINUTE_START + 5), config);
    let dispatcher = PeriodicDispatcher::new(Writer::direct(store.clone()), clock.clone());
    clock.set(at(MINUTE_START + 60));
    dispatcher.run();
    // The first child's eval is still pending: minute 2 is skipped.
    clock.set(at(MINUTE_START + 120));
    assert_eq!(dispatcher.run(), Some(at(MINUTE_START + 180)));
    assert_eq!(children(&store, &job), launched(&job, &[1]));
    // The child finished: minute 3 launches.
    let snapshot = store.snapshot();
    let child_key = JobKey { namespace: job.namespace.clone(), id: Arc::from(launched(&job, &[1])[0].as_str()) };
    let mut eval = Evaluation::clone(snapshot.evals_by_job(&child_key).next().expect("its eval"));
    eval.status = crate::structs::EvalStatus::Complete;
    store.apply(Command::UpsertEvals { evals: vec![eval] }).expect("completes");
    clock.advance(Duration::from_secs(60));
    dispatcher.run();
    assert_eq!(children(&store, &job), launched(&job, &[1, 3]));
}

#[test]
fn disabled_stopped_and_parameterized_schedules_launch_nothing() {
    let clock = ManualClock::new(at(MINUTE_START + 5));
    let (store, mut job) = store_with_periodic_job(at(MINUTE_START + 5), every_minute());
    job.stop = true;
    store.apply(Command::RegisterJob { job: job.clone(), eval: None }).expect("stops");
    let dispatcher = PeriodicDispatcher::new(Writer::direct(store.clone()), clock.clone());
    clock.set(at(MINUTE_START + 600));
    assert_eq!(dispatcher.run(), None);
    assert!(children(&store, &job).is_empty());
}

#[test]
fn a_forced_launch_is_taken_whatever_the_record_says() {
    let (store, job) = store_with_periodic_job(at(MINUTE_START + 5), every_minute());
    let (forced, eval) = launch_command(&job, at(MINUTE_START + 1), at(MINUTE_START + 1), true);
    assert!(eval.is_some());
    store.apply(forced).expect("forced");
    let record = store.snapshot().periodic_launch(&job.key()).expect("recorded").launch;
    assert_eq!(record, at(MINUTE_START + 5), "the record only moves forward");
    let mut plain = Job::new_simple("plain", JobType::Batch, 1, Resources::new(10, 10, 0));
    store.apply(Command::RegisterJob { job: plain.clone(), eval: None }).expect("registers");
    plain.periodic = Some(every_minute());
    let (not_periodic, _) = launch_command(&plain, at(MINUTE_START), at(MINUTE_START), true);
    assert_eq!(store.apply(not_periodic).expect_err("not periodic").to_string(), "can't force launch non-periodic job");
}
