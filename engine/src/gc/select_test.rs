//! The selection rules, each on both sides of its line.

use super::*;
use crate::gc::batches;
use crate::gc::fixture::{hours, Fixture, NODE};
use crate::state::Command;
use crate::structs::{Allocation, ClientStatus, DeploymentStatus, EvalStatus, JobType, NodeStatus};

fn at(fixture: &Fixture, hour: u64) -> Collection {
    select(&fixture.store.snapshot(), hours(hour), &GcThresholds::default())
}

#[test]
fn a_finished_batch_job_goes_whole_after_the_job_threshold() {
    let fixture = Fixture::new();
    let (job, _, _) = fixture.finished_batch("batch", hours(0));
    assert!(at(&fixture, 3).is_empty(), "4h have not passed: {:?}", at(&fixture, 3));
    let collection = at(&fixture, 5);
    assert_eq!(collection.jobs, vec![job.key()]);
    // Its evals and allocations go with it, not on their own lists.
    assert!(collection.evals.is_empty() && collection.allocs.is_empty(), "{collection:?}");
}

#[test]
fn a_batch_job_still_running_or_pending_stays() {
    let fixture = Fixture::new();
    let (job, eval) = fixture.register("batch", JobType::Batch, hours(0));
    assert!(at(&fixture, 100).jobs.is_empty(), "pending: its eval is outstanding");
    let alloc = fixture.place(&job, eval.id, hours(0));
    fixture.finish(&eval, EvalStatus::Complete, hours(0));
    fixture.report(&alloc, ClientStatus::Running, hours(0));
    assert!(at(&fixture, 100).is_empty(), "running");
}

#[test]
fn a_batch_eval_outlives_the_eval_threshold_while_its_job_stays() {
    let fixture = Fixture::new();
    let (job, eval, _) = fixture.finished_batch("batch", hours(0));
    // A newer eval of the job keeps the job from being collected.
    let (_, newer) = fixture.register("batch", JobType::Batch, hours(0));
    let collection = at(&fixture, 30);
    assert!(collection.jobs.is_empty());
    assert!(!collection.evals.contains(&eval.id), "a batch job's history stays: {collection:?}");
    assert!(collection.allocs.is_empty());
    // Once the job is purged, its evals go after the batch threshold.
    fixture.finish(&newer, EvalStatus::Complete, hours(0));
    fixture.store.apply(Command::DeregisterJob { job: job.key(), purge: true, eval: None }).expect("purge");
    assert!(at(&fixture, 25).evals.contains(&eval.id));
    assert!(!at(&fixture, 23).evals.contains(&eval.id), "24h for batch evals");
}

#[test]
fn a_service_job_goes_only_once_stopped() {
    let fixture = Fixture::new();
    let (job, eval) = fixture.register("web", JobType::Service, hours(0));
    let alloc = fixture.place(&job, eval.id, hours(0));
    fixture.finish(&eval, EvalStatus::Complete, hours(0));
    fixture.report(&alloc, ClientStatus::Complete, hours(0));
    let collection = at(&fixture, 100);
    assert!(collection.jobs.is_empty(), "dead but never stopped");
    // Its finished eval and allocation go on their own after 1h.
    assert_eq!((collection.evals, collection.allocs), (vec![eval.id], vec![alloc.id]));
    assert!(at(&fixture, 0).is_empty(), "not before 1h");
    fixture.store.apply(Command::DeregisterJob { job: job.key(), purge: false, eval: None }).expect("stop");
    assert_eq!(at(&fixture, 5).jobs, vec![job.key()]);
}

#[test]
fn an_eval_with_an_allocation_still_running_stays() {
    let fixture = Fixture::new();
    let (job, eval) = fixture.register("web", JobType::Service, hours(0));
    let alloc = fixture.place(&job, eval.id, hours(0));
    fixture.finish(&eval, EvalStatus::Complete, hours(0));
    fixture.report(&alloc, ClientStatus::Running, hours(0));
    assert!(at(&fixture, 100).is_empty());
    let (pending_job, pending) = fixture.register("other", JobType::Service, hours(0));
    assert!(!at(&fixture, 100).evals.contains(&pending.id), "not terminal");
    assert!(fixture.store.snapshot().job(&pending_job.key()).is_some());
}

#[test]
fn a_failed_allocation_stays_while_it_may_be_rescheduled() {
    let fixture = Fixture::new();
    let (job, eval) = fixture.register("web", JobType::Service, hours(0));
    let failed = fixture.place(&job, eval.id, hours(0));
    fixture.finish(&eval, EvalStatus::Complete, hours(0));
    fixture.report(&failed, ClientStatus::Failed, hours(0));
    // Another allocation runs, so the job is not dead.
    let (_, other) = fixture.register("web", JobType::Service, hours(0));
    fixture.finish(&other, EvalStatus::Complete, hours(0));
    let running = fixture.place(&job, other.id, hours(0));
    fixture.report(&running, ClientStatus::Running, hours(0));
    let collection = at(&fixture, 100);
    assert!(collection.allocs.is_empty() && collection.evals.is_empty(), "unlimited: kept until replaced");
    // Its replacement links it: now it goes, and its eval with it.
    let mut replacement = Allocation::new_placement(&job, "group", 0, NODE, eval.id);
    replacement.previous_allocation = Some(failed.id);
    let plan = Command::ApplyPlanResults {
        eval_id: eval.id,
        allocs: vec![replacement.clone()],
        evals: vec![],
        deployment: None,
        deployment_updates: vec![],
        time: hours(0),
    };
    fixture.store.apply(plan).expect("replaced");
    fixture.report(&replacement, ClientStatus::Complete, hours(0));
    let collection = at(&fixture, 100);
    assert_eq!(collection.evals, vec![eval.id]);
    assert_eq!(collection.allocs.len(), 2);
}

#[test]
fn a_down_node_goes_after_the_node_threshold_without_live_allocations() {
    let fixture = Fixture::new();
    let down = Command::UpdateNodeStatus { node_id: NODE, status: NodeStatus::Down, evals: vec![], time: hours(1) };
    assert!(at(&fixture, 100).nodes.is_empty(), "ready");
    fixture.store.apply(down).expect("down");
    assert!(at(&fixture, 24).nodes.is_empty(), "down 23h");
    assert_eq!(at(&fixture, 25).nodes, vec![NODE]);
}

#[test]
fn a_down_node_with_a_live_allocation_stays() {
    let fixture = Fixture::new();
    let (job, eval) = fixture.register("web", JobType::Service, hours(0));
    fixture.place(&job, eval.id, hours(0));
    let down = Command::UpdateNodeStatus { node_id: NODE, status: NodeStatus::Down, evals: vec![], time: hours(1) };
    fixture.store.apply(down).expect("down");
    assert!(at(&fixture, 100).nodes.is_empty());
}

#[test]
fn a_finished_deployment_goes_after_its_threshold_when_its_allocations_ended() {
    let fixture = Fixture::new();
    let (job, eval) = fixture.register("web", JobType::Service, hours(0));
    fixture.finish(&eval, EvalStatus::Complete, hours(0));
    let (running, _) = fixture.deployment(&job, DeploymentStatus::Running, hours(0));
    assert!(!at(&fixture, 100).deployments.contains(&running.id), "active");
    let (done, alloc) = fixture.deployment(&job, DeploymentStatus::Successful, hours(0));
    assert!(!at(&fixture, 100).deployments.contains(&done.id), "its allocation is live");
    fixture.report(&alloc, ClientStatus::Complete, hours(0));
    assert!(at(&fixture, 2).deployments.contains(&done.id));
    assert!(!at(&fixture, 0).deployments.contains(&done.id), "not before 1h");
}

#[test]
fn a_forced_collection_takes_everything_eligible_now() {
    let fixture = Fixture::new();
    let (job, _, _) = fixture.finished_batch("batch", hours(10));
    assert!(at(&fixture, 10).is_empty());
    let forced = select(&fixture.store.snapshot(), hours(10), &GcThresholds::force());
    assert_eq!(forced.jobs, vec![job.key()]);
}

#[test]
fn big_collections_are_cut_into_batches() {
    let fixture = Fixture::new();
    for n in 0..5 {
        fixture.finished_batch(&format!("batch-{n}"), hours(0));
    }
    let snapshot = fixture.store.snapshot();
    let collection = select(&snapshot, hours(10), &GcThresholds::default());
    assert_eq!(collection.jobs.len(), 5);
    // Each job weighs 3 (itself, an eval, an allocation): two fit in 7.
    let cut = batches(collection.clone(), &snapshot, 7);
    let sizes: Vec<usize> = cut.iter().map(|batch| batch.jobs.len()).collect();
    assert_eq!(sizes, vec![2, 2, 1]);
    assert!(cut.iter().all(|batch| batch.as_of == collection.as_of));
}
