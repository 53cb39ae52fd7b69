//! The job endpoint's revert and stability: a revert registers the kept
//! spec as a new version with its eval; the refusals are Nomad's.

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
    let eval = snapshot.eval(written.eval_id).expect("an eval like any register");
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
