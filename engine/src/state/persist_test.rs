//! The snapshot format: jobs once, derived indexes rebuilt, bad bytes refused.

use std::sync::Arc;

use super::*;
use crate::clock::Timestamp;
use crate::state::{Command, StateStore};
use crate::structs::{EvalId, JobType, TriggerReason};

const DRIVER: &str = "a-driver-named-only-in-the-job";

/// A store with two nodes, one job in two versions and `n_allocs` allocations.
fn store(n_allocs: u32) -> StateStore {
    let store = StateStore::new();
    for n in 1..=2 {
        let node = Node::new_ready(NodeId::from_u128(n), "dc1", "c", Resources::new(100_000, 100_000, 0));
        store.apply(Command::UpsertNode { node, evals: vec![] }).expect("node");
    }
    let mut job = Job::new_simple("web", JobType::Service, n_allocs, Resources::new(10, 10, 0));
    job.task_groups[0].tasks[0].driver = DRIVER.into();
    for version in 0..2 {
        job.priority = 50 + version;
        let eval = Evaluation::for_job(&job, TriggerReason::JobRegister, Timestamp(1));
        store.apply(Command::RegisterJob { job: job.clone(), eval: Some(eval) }).expect("job");
        let stored = store.snapshot().job(&job.key()).expect("stored").clone();
        let allocs = (0..n_allocs / 2)
            .map(|i| {
                let node = NodeId::from_u128(u128::from(i % 2) + 1);
                Allocation::new_placement(&stored, "group", i, node, EvalId::from_u128(1))
            })
            .collect();
        let plan = Command::ApplyPlanResults {
            deployment: None,
            deployment_updates: Vec::new(),
            eval_id: EvalId::from_u128(1),
            allocs,
            evals: vec![],
            time: Timestamp(2),
        };
        store.apply(plan).expect("plan");
    }
    store
}

fn encoded(store: &StateStore) -> Vec<u8> {
    let mut bytes = Vec::new();
    store.snapshot().encode(&mut bytes).expect("encodes into memory");
    bytes
}

#[test]
fn each_job_version_is_written_once_and_shared_again_on_decode() {
    let store = store(200);
    let bytes = encoded(&store);
    let snapshot = store.snapshot();
    // The task's driver name is written only inside a job: once per version.
    let marker = DRIVER.as_bytes();
    let copies = bytes.windows(marker.len()).filter(|window| *window == marker).count();
    assert_eq!(copies, 2, "two job versions, each written once, for {} allocations", snapshot.alloc_count());

    let decoded = Snapshot::decode(&mut bytes.as_slice()).expect("decodes");
    assert_eq!(decoded.dump(), snapshot.dump());
    let key = JobKey::new("default", "web");
    let current = decoded.job(&key).expect("the job");
    let mut allocs: Vec<_> = decoded.allocs_by_job(&key).collect();
    allocs.sort_by_key(|alloc| alloc.job.version);
    let (old, new) = (allocs.first().expect("allocs"), allocs.last().expect("allocs"));
    assert!(Arc::ptr_eq(&new.job, current), "the job row and its allocations share one version");
    assert!(!Arc::ptr_eq(&old.job, current), "an older version is its own job");
    assert!(allocs.iter().filter(|alloc| alloc.job.version == 0).all(|alloc| Arc::ptr_eq(&alloc.job, &old.job)));
}

#[test]
fn an_empty_store_round_trips() {
    let store = StateStore::new();
    let bytes = encoded(&store);
    let decoded = Snapshot::decode(&mut bytes.as_slice()).expect("decodes");
    assert_eq!(decoded.dump(), store.snapshot().dump());
}

#[test]
fn bad_bytes_get_a_clear_error_and_never_a_panic() {
    let bytes = encoded(&store(20));
    let next = SNAPSHOT_FORMAT_VERSION + 1;
    assert!(matches!(Snapshot::decode(&mut [next].as_slice()), Err(PersistError::UnknownVersion(v)) if v == next));
    for cut in [0, 1, 5, bytes.len() / 2, bytes.len() - 1] {
        let result = Snapshot::decode(&mut &bytes[..cut]);
        assert!(matches!(result, Err(PersistError::Io(_))), "cut at {cut}: {result:?}");
    }
    // Every single-byte change either decodes to something or is refused.
    for position in 0..bytes.len() {
        let mut changed = bytes.clone();
        changed[position] ^= 0x5a;
        let _ = Snapshot::decode(&mut changed.as_slice());
    }
    let mut unknown_section = vec![SNAPSHOT_FORMAT_VERSION];
    unknown_section.extend(&bytes[1..bytes.len() - 1]);
    unknown_section.push(42);
    assert!(matches!(
        Snapshot::decode(&mut unknown_section.as_slice()),
        Err(PersistError::UnexpectedSection { found: 42, .. })
    ));
}

#[test]
fn a_snapshot_that_names_a_missing_allocation_is_refused() {
    let mut bytes = vec![SNAPSHOT_FORMAT_VERSION];
    let header = postcard::to_allocvec(&Header { index: 1, table_indexes: TableIndexes::default() }).expect("header");
    bytes.extend((header.len() as u32).to_le_bytes());
    bytes.extend(header);
    bytes.push(5);
    bytes.extend(1u64.to_le_bytes());
    let row = postcard::to_allocvec(&(JobKey::new("default", "web"), vec![AllocId::from_u128(7)])).expect("row");
    bytes.extend((row.len() as u32).to_le_bytes());
    bytes.extend(row);
    bytes.push(0);
    let result = Snapshot::decode(&mut bytes.as_slice());
    assert!(matches!(result, Err(PersistError::Dangling { section: 5, .. })), "{result:?}");
}
