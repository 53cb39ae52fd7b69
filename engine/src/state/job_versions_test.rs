//! Job versions: six kept, newest first, the newest stable one kept, the
//! stability command, purge, and the snapshot format.

use std::sync::Arc;

use super::*;
use crate::clock::Timestamp;
use crate::state::{Applied, Command, StateStore};
use crate::structs::{Evaluation, JobType, Resources, TriggerReason};

fn key() -> JobKey {
    JobKey::new("default", "web")
}

/// The job's spec at `version`: a priority per version, so each differs.
fn spec(version: u8) -> Job {
    let mut job = Job::new_simple("web", JobType::Service, 1, Resources::new(10, 10, 0));
    job.priority = 10 + version;
    job
}

fn register(store: &StateStore, job: &Job) -> u64 {
    let eval = Evaluation::for_job(job, TriggerReason::JobRegister, Timestamp(1));
    let applied = store.apply(Command::RegisterJob { job: job.clone(), eval: Some(eval) }).expect("registers");
    applied.job.expect("stored").version
}

fn stability(store: &StateStore, version: u64, stable: bool) -> Result<Applied, StateError> {
    store.apply(Command::SetJobStability { key: key(), version, stable })
}

fn kept(store: &StateStore) -> Vec<(u64, bool)> {
    store.snapshot().job_versions(&key()).map(|job| (job.version, job.stable)).collect()
}

/// A store with versions `0..n` of the job registered.
fn store_with_versions(n: u8) -> StateStore {
    let store = StateStore::new();
    for version in 0..n {
        assert_eq!(register(&store, &spec(version)), u64::from(version));
    }
    store
}

#[test]
fn the_last_six_versions_are_kept_newest_first() {
    let store = store_with_versions(8);
    let versions: Vec<u64> = kept(&store).into_iter().map(|(version, _)| version).collect();
    assert_eq!(versions, vec![7, 6, 5, 4, 3, 2]);
    assert_eq!(JOB_TRACKED_VERSIONS, 6);
    let snapshot = store.snapshot();
    let current = snapshot.job(&key()).expect("the job");
    assert!(Arc::ptr_eq(current, snapshot.job_versions(&key()).next().expect("newest")), "the newest is the job");
    assert_eq!(snapshot.job_version(&key(), 4).expect("kept").priority, 14, "each version keeps its spec");
    assert!(snapshot.job_version(&key(), 1).is_none(), "dropped");
}

#[test]
fn a_resubmission_of_the_same_spec_replaces_its_version_and_adds_none() {
    let store = store_with_versions(2);
    let index_before = store.snapshot().job(&key()).expect("job").modify_index;
    assert_eq!(register(&store, &spec(1)), 1, "same spec, same version");
    let snapshot = store.snapshot();
    assert_eq!(kept(&store), vec![(1, false), (0, false)]);
    let newest = snapshot.job_version(&key(), 1).expect("kept");
    assert!(newest.modify_index > index_before, "the entry is the job as stored now");
    assert!(Arc::ptr_eq(newest, snapshot.job(&key()).expect("job")));
}

#[test]
fn the_newest_stable_version_outlives_the_limit() {
    let store = store_with_versions(1);
    stability(&store, 0, true).expect("v0 stable");
    for version in 1..8 {
        register(&store, &spec(version));
    }
    assert_eq!(kept(&store), vec![(7, false), (6, false), (5, false), (4, false), (3, false), (0, true)]);
    // A newer stable version: the old one is no longer kept for being stable.
    stability(&store, 5, true).expect("v5 stable");
    register(&store, &spec(8));
    assert_eq!(kept(&store), vec![(8, false), (7, false), (6, false), (5, true), (4, false), (3, false)]);
}

#[test]
fn stability_marks_the_version_and_the_job_when_it_is_current() {
    let store = store_with_versions(3);
    let before = store.snapshot().job(&key()).expect("job").clone();
    let applied = stability(&store, 2, true).expect("current version");
    let snapshot = store.snapshot();
    let job = snapshot.job(&key()).expect("job");
    assert!(job.stable);
    assert_eq!((job.version, job.job_modify_index), (before.version, before.job_modify_index), "spec unchanged");
    assert_eq!(job.modify_index, applied.index);
    assert_eq!(snapshot.table_indexes().jobs, applied.index, "blocking queries on jobs wake");
    assert!(Arc::ptr_eq(job, snapshot.job_version(&key(), 2).expect("kept")));

    stability(&store, 0, true).expect("an older version");
    assert_eq!(kept(&store), vec![(2, true), (1, false), (0, true)]);
    assert!(store.snapshot().job(&key()).expect("job").stable, "the job is still version 2");
    stability(&store, 2, false).expect("unmarked");
    assert!(!store.snapshot().job(&key()).expect("job").stable);

    let index = store.latest_index();
    let refused = stability(&store, 9, true).expect_err("not kept");
    assert_eq!(refused, StateError::UnknownJobVersion { job: key(), version: 9 });
    assert_eq!(refused.to_string(), "job \"web\" in namespace \"default\" at version 9 not found");
    assert_eq!(store.latest_index(), index + 1, "a refused command takes its position");
    assert_eq!(kept(&store), vec![(2, false), (1, false), (0, true)], "and changes nothing");
}

#[test]
fn a_new_version_is_not_stable_but_the_same_spec_stays_stable() {
    let store = store_with_versions(1);
    stability(&store, 0, true).expect("stable");
    register(&store, &spec(0));
    assert_eq!(kept(&store), vec![(0, true)], "resubmitted: still version 0, still stable");
    let mut marked = spec(1);
    marked.stable = true;
    register(&store, &marked);
    assert_eq!(kept(&store), vec![(1, false), (0, true)], "a submission cannot mark itself stable");
}

#[test]
fn stopping_adds_a_version_and_purging_removes_them_all() {
    let store = store_with_versions(2);
    let stop = Command::DeregisterJob { job: key(), purge: false, eval: None };
    store.apply(stop).expect("stopped");
    assert_eq!(kept(&store).len(), 3);
    assert!(store.snapshot().job_version(&key(), 2).expect("the stopped version").stop);
    store.apply(Command::DeregisterJob { job: key(), purge: true, eval: None }).expect("purged");
    assert!(kept(&store).is_empty());
    assert_eq!(register(&store, &spec(0)), 0, "registered again, it starts over");
    assert_eq!(kept(&store), vec![(0, false)]);
}

#[test]
fn kept_versions_survive_the_snapshot_format_sharing_jobs() {
    let store = store_with_versions(7);
    stability(&store, 6, true).expect("stable");
    let mut other = spec(0);
    other.id = "api".into();
    register(&store, &other);
    let mut bytes = Vec::new();
    store.snapshot().encode(&mut bytes).expect("encodes");
    let decoded = Snapshot::decode(&mut bytes.as_slice()).expect("decodes");
    assert_eq!(decoded.dump(), store.snapshot().dump());
    let versions: Vec<(u64, bool)> = decoded.job_versions(&key()).map(|job| (job.version, job.stable)).collect();
    assert_eq!(versions, vec![(6, true), (5, false), (4, false), (3, false), (2, false), (1, false)]);
    let current = decoded.job(&key()).expect("job");
    assert!(Arc::ptr_eq(current, decoded.job_versions(&key()).next().expect("newest")), "one Arc per version");
    assert_eq!(decoded.job_versions(&JobKey::new("default", "api")).count(), 1);
}
