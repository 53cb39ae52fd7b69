//! The job endpoint: revert and stability (a revert registers the kept
//! spec as a new version with its eval), periodic and parameterized jobs
//! (no eval of their own, force launch, dispatch); the refusals are Nomad's.

use std::sync::Arc;

use super::*;
use crate::clock::{ManualClock, Timestamp};
use crate::state::StateStore;
use crate::structs::{EvalStatus, JobType, Resources};

fn endpoint() -> JobEndpoint {
    let store = Arc::new(StateStore::new());
    JobEndpoint::new(Writer::direct(store), ManualClock::new(Timestamp(1_000)))
}

fn key() -> JobKey {
    JobKey::new("default", "web")
}

/// Versions 0, 1 and 2 of the job, each with another count.
fn three_versions(jobs: &JobEndpoint) {
    for count in 1..=3 {
        let job = Job::new_simple("web", JobType::Service, count, Resources::new(10, 10, 0));
        jobs.register(job).expect("registers");
    }
}

#[test]
fn a_revert_registers_the_old_spec_as_a_new_version_with_its_eval() {
    let jobs = endpoint();
    three_versions(&jobs);
    let written = jobs.revert(&key(), 0, None).expect("reverts");
    assert_eq!(written.version, 3);
    let snapshot = jobs.writer.store().snapshot();
    let reverted = snapshot.job(&key()).expect("job");
    let old = snapshot.job_version(&key(), 0).expect("version 0 is kept");
    assert_eq!(reverted.task_groups, old.task_groups, "version 3 is version 0's spec");
    assert_eq!(reverted.task_groups[0].count, 1);
    assert_eq!((reverted.version, reverted.job_modify_index), (3, written.index));
    let eval = snapshot.eval(written.eval_id.expect("an eval")).expect("an eval like any register");
    assert_eq!((eval.status, eval.job_modify_index), (EvalStatus::Pending, written.index));
    let versions: Vec<u64> = jobs.versions(&key()).iter().map(|job| job.version).collect();
    assert_eq!(versions, vec![3, 2, 1, 0]);
}

#[test]
fn a_revert_of_a_stable_version_starts_unstable() {
    let jobs = endpoint();
    three_versions(&jobs);
    jobs.set_stability(&key(), 1, true).expect("marked");
    jobs.revert(&key(), 1, Some(2)).expect("reverts");
    let job = jobs.job(&key()).expect("job");
    assert_eq!((job.version, job.stable, job.task_groups[0].count), (3, false, 2));
    assert!(jobs.versions(&key())[2].stable, "version 1 stays stable");
}

#[test]
fn reverts_are_refused_with_nomads_messages() {
    let jobs = endpoint();
    three_versions(&jobs);
    let index = jobs.writer.store().latest_index();
    let refused = |version, enforce| jobs.revert(&key(), version, enforce).expect_err("refused").to_string();
    assert_eq!(refused(2, None), "can't revert to current version");
    assert_eq!(refused(0, Some(1)), "Current job has version 2; enforcing version 1");
    assert_eq!(refused(7, None), "job \"web\" in namespace \"default\" at version 7 not found");
    let unknown = jobs.revert(&JobKey::new("default", "nope"), 0, None).expect_err("no job");
    assert_eq!(unknown, JobError::UnknownJob(JobKey::new("default", "nope")));
    assert_eq!(jobs.writer.store().latest_index(), index, "nothing was written");
}

#[test]
fn stability_of_an_unknown_version_is_refused() {
    let jobs = endpoint();
    three_versions(&jobs);
    let index = jobs.set_stability(&key(), 2, true).expect("marked");
    assert_eq!(jobs.job(&key()).expect("job").modify_index, index);
    let refused = jobs.set_stability(&key(), 8, true).expect_err("not kept");
    assert_eq!(refused, JobError::UnknownVersion { job: key(), version: 8 });
}

fn periodic_job(id: &str) -> Job {
    let mut job = Job::new_simple(id, JobType::Batch, 1, Resources::new(10, 10, 0));
    job.periodic = Some(crate::structs::PeriodicConfig::cron("*/15 * * * *"));
    job
}

fn parameterized_job(id: &str) -> Job {
    let mut job = Job::new_simple(id, JobType::Batch, 1, Resources::new(10, 10, 0));
    job.parameterized = Some(crate::structs::ParameterizedJobConfig {
        payload: crate::structs::PayloadRule::Optional,
        meta_required: vec!["owner".to_string()],
        meta_optional: vec![],
    });
    job
}

#[test]
fn periodic_and_parameterized_jobs_register_without_an_eval_and_cannot_be_evaluated() {
    let jobs = endpoint();
    for (job, kind) in [(periodic_job("cron"), "periodic"), (parameterized_job("work"), "parameterized")] {
        let key = job.key();
        let written = jobs.register(job).expect("registers");
        assert_eq!(written.eval_id, None, "{kind}: Nomad writes no eval");
        assert!(jobs.evals(&key).is_empty());
        assert_eq!(jobs.evaluate(&key).expect_err("refused").to_string(), format!("can't evaluate {kind} job"));
        assert_eq!(jobs.deregister(&key, false).expect("stops").eval_id, None);
    }
    let mut service = periodic_job("svc");
    service.job_type = JobType::Service;
    let refused = jobs.register(service).expect_err("a periodic service").to_string();
    assert!(refused.contains("Periodic can only be used with \"batch\" or \"sysbatch\" scheduler"), "{refused}");
}

#[test]
fn a_job_cannot_become_or_stop_being_periodic_or_parameterized_nor_be_submitted_dispatched() {
    let jobs = endpoint();
    jobs.register(Job::new_simple("plain", JobType::Batch, 1, Resources::new(10, 10, 0))).expect("plain");
    let refused = jobs.register(periodic_job("plain")).expect_err("to periodic");
    assert_eq!(refused.to_string(), "cannot update non-periodic job to being periodic");
    jobs.register(periodic_job("cron")).expect("periodic");
    let plain = Job::new_simple("cron", JobType::Batch, 1, Resources::new(10, 10, 0));
    assert_eq!(
        jobs.register(plain).expect_err("to plain").to_string(),
        "cannot update periodic job to being non-periodic"
    );
    jobs.register(parameterized_job("work")).expect("parameterized");
    let plain = Job::new_simple("work", JobType::Batch, 1, Resources::new(10, 10, 0));
    let refused = jobs.register(plain).expect_err("to plain").to_string();
    assert_eq!(refused, "cannot update parameterized job to being non-parameterized");
    let mut dispatched = parameterized_job("other");
    dispatched.dispatched = true;
    assert_eq!(jobs.register(dispatched), Err(JobError::DispatchedSubmitted));
}

#[test]
fn a_force_launch_registers_a_child_with_its_eval_at_once() {
    let jobs = endpoint();
    jobs.register(periodic_job("cron")).expect("periodic");
    let launched = jobs.periodic_force(&JobKey::new("default", "cron")).expect("forced");
    assert_eq!(&*launched.child.id, "cron/periodic-0", "the clock stands at 1 µs after the epoch");
    let snapshot = jobs.writer.store().snapshot();
    let eval = snapshot.eval(launched.eval_id.expect("an eval")).expect("stored");
    assert_eq!((eval.triggered_by, eval.create_index), (TriggerReason::PeriodicJob, launched.eval_create_index));
    assert_eq!(jobs.children(&JobKey::new("default", "cron")).pending, 1);
    jobs.register(parameterized_job("work")).expect("parameterized");
    for id in ["work", "cron/periodic-0"] {
        let refused = jobs.periodic_force(&JobKey::new("default", id)).expect_err("not periodic");
        assert_eq!(refused.to_string(), "can't force launch non-periodic job", "{id}");
    }
    assert!(matches!(jobs.periodic_force(&JobKey::new("default", "nope")), Err(JobError::UnknownJob(_))));
}

#[test]
fn a_dispatch_registers_a_child_and_a_token_returns_it_again() {
    let jobs = endpoint();
    jobs.register(parameterized_job("work")).expect("parameterized");
    let key = JobKey::new("default", "work");
    let meta = |value: &str| [("owner".to_string(), value.to_string())].into_iter().collect();
    let request = DispatchRequest {
        payload: b"input".to_vec(),
        meta: meta("me"),
        idempotency_token: "t1".into(),
        ..DispatchRequest::default()
    };
    let first = jobs.dispatch(&key, request.clone()).expect("dispatched");
    assert!(first.child.id.starts_with("work/dispatch-0-"), "{}", first.child.id);
    assert_eq!(first.child.id.len(), "work/dispatch-0-".len() + 8);
    let child = jobs.job(&first.child).expect("stored");
    assert!(child.dispatched && child.meta["owner"] == "me" && child.parent_id == "work");
    assert!(jobs.evals(&first.child).len() == 1 && first.eval_id.is_some());
    let again = jobs.dispatch(&key, request).expect("the same token");
    assert_eq!((&again.child, again.eval_id), (&first.child, first.eval_id));
    let other = DispatchRequest { idempotency_token: String::new(), ..DispatchRequest::default() };
    let missing = jobs.dispatch(&key, other).expect_err("no owner").to_string();
    assert_eq!(missing, "Dispatch did not provide required meta keys: [\"owner\"]");
    let spaced = DispatchRequest { meta: meta("me"), id_prefix_template: "a b".into(), ..DispatchRequest::default() };
    assert!(matches!(jobs.dispatch(&key, spaced), Err(JobError::Invalid(_))), "the child's id is checked");
    let unknown = jobs.dispatch(&JobKey::new("default", "nope"), DispatchRequest::default());
    assert_eq!(unknown.expect_err("unknown").to_string(), "parameterized job not found");
    jobs.register(Job::new_simple("plain", JobType::Batch, 1, Resources::new(10, 10, 0))).expect("plain");
    let plain = jobs.dispatch(&JobKey::new("default", "plain"), DispatchRequest::default());
    assert_eq!(plain.expect_err("plain").to_string(), "Specified job \"plain\" is not a parameterized job");
    jobs.deregister(&key, false).expect("stopped");
    let stopped = jobs.dispatch(&key, DispatchRequest { meta: meta("me"), ..DispatchRequest::default() });
    assert_eq!(stopped.expect_err("stopped").to_string(), "Specified job \"work\" is stopped");
    assert_eq!(jobs.children(&key).pending, 1);
}
