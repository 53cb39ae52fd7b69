//! Recovery: a random command sequence written through the durable log
//! equals, compared as a canonical dump, the state recovered from the
//! newest snapshot and the log after it, and the state of a plain store
//! that applied the same commands; a corrupt newest snapshot is refused by
//! its checksum and the one before it plus the longer log give the same
//! state again; a data dir whose log is missing or empty, or whose
//! snapshots are all corrupt, is refused with a message naming the files,
//! and the refusal changes nothing on disk.

use std::sync::Arc;

use engine::clock::Timestamp;
use engine::state::{ClientAllocUpdate, Command, Snapshot, StateDump, StateStore};
use engine::structs::{
    Allocation, ClientStatus, EvalId, Evaluation, Job, JobType, Node, NodeId, NodeStatus, Resources, TriggerReason,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use replication::{Durable, DurableConfig};
use storage::{DataDir, FatalError};

fn node(n: u8) -> Node {
    Node::new_ready(NodeId::from_u128(u128::from(n) + 1), "dc1", "c", Resources::new(4_000, 8_192, 0))
}

/// A command against the state in `snapshot` (so it names what exists).
fn command(rng: &mut SmallRng, snapshot: &Snapshot, step: u64) -> Command {
    let time = Timestamp(1_000 + step);
    let mut allocs: Vec<_> = snapshot.allocs().collect();
    allocs.sort_by_key(|alloc| alloc.id);
    let mut jobs: Vec<_> = snapshot.jobs().collect();
    jobs.sort_by_key(|job| job.key());
    let node_id = NodeId::from_u128(rng.random_range(1..=8));
    match rng.random_range(0..8) {
        0 | 1 => Command::UpsertNode { node: node(rng.random_range(0..8)), evals: vec![] },
        2 => {
            let job = Job::new_simple(
                &format!("job-{}", rng.random_range(0..3)),
                JobType::Service,
                3,
                Resources::new(100, 64, 0),
            );
            let eval = Evaluation::with_id(EvalId::from_u128(u128::from(step)), &job, TriggerReason::JobRegister, time);
            Command::RegisterJob { job, eval: Some(eval) }
        }
        3 | 4 if !jobs.is_empty() && !snapshot.schedulable_nodes().is_empty() => {
            let job = jobs[rng.random_range(0..jobs.len())];
            let nodes = snapshot.schedulable_nodes();
            let placed = (0..rng.random_range(1..4u32))
                .map(|index| {
                    let target = nodes.get(rng.random_range(0..nodes.len())).expect("in range");
                    let mut alloc = Allocation::new_placement(job, "group", index, target, EvalId::from_u128(1));
                    alloc.id = engine::structs::AllocId::from_u128(u128::from(step) << 8 | u128::from(index));
                    alloc
                })
                .collect();
            Command::ApplyPlanResults {
                deployment: None,
                deployment_updates: Vec::new(),
                eval_id: EvalId::from_u128(u128::from(step)),
                allocs: placed,
                evals: vec![],
                time,
            }
        }
        5 if !allocs.is_empty() => {
            let alloc = allocs[rng.random_range(0..allocs.len())];
            let client_status =
                [ClientStatus::Running, ClientStatus::Complete, ClientStatus::Failed][rng.random_range(0..3)];
            let update = ClientAllocUpdate {
                alloc_id: alloc.id,
                node_id: alloc.node_id,
                client_status,
                client_description: String::new(),
                services: None,
                checks: None,
                health: None,
                task_states: Default::default(),
            };
            Command::UpdateAllocsFromClient { updates: vec![update], evals: vec![], time }
        }
        6 => Command::MissHeartbeat { node_id, evals: vec![], time: Timestamp::ZERO, release_at: None },
        _ => Command::UpdateNodeStatus { node_id, status: NodeStatus::Ready, evals: vec![], time: Timestamp::ZERO },
    }
}

fn open(dir: &DataDir, snapshot_every: u64) -> Durable {
    let fatal = Arc::new(|error: &FatalError| panic!("a write failed: {error}"));
    Durable::open(dir, &DurableConfig { snapshot_every }, fatal).expect("the durable state opens")
}

/// Writes `n` random commands through `durable` and the same to `reference`.
fn write_random(durable: &Durable, reference: &StateStore, rng: &mut SmallRng, n: u64) {
    let writer = durable.writer();
    for _ in 0..n {
        let step = reference.latest_index() + 1;
        let command = command(rng, &reference.snapshot(), step);
        let expected = reference.apply(command.clone()).map(|applied| applied.index);
        let written = writer.write(command).map(|applied| applied.index);
        assert_eq!(written, expected, "the durable log answers as a plain store does");
    }
}

fn dump(durable: &Durable) -> StateDump {
    durable.store().snapshot().dump()
}

#[test]
fn a_random_sequence_recovers_from_its_snapshot_and_log_tail_to_the_same_state() {
    for (seed, snapshot_every) in [(1, 3), (2, 7), (3, 1_000), (4, 1)] {
        let temp = tempfile::tempdir().expect("a temp dir");
        let dir = DataDir::new(temp.path());
        let mut rng = SmallRng::seed_from_u64(seed);
        let reference = StateStore::new();
        let durable = open(&dir, snapshot_every);
        write_random(&durable, &reference, &mut rng, 60);
        let live = dump(&durable);
        assert_eq!(live, reference.snapshot().dump(), "seed {seed}: live equals a plain store");
        durable.shutdown();

        let recovered = open(&dir, snapshot_every);
        assert!(recovered.recovery().refused.is_empty());
        assert_eq!(dump(&recovered), live, "seed {seed}: recovered equals live");
        if snapshot_every < 60 {
            assert!(recovered.recovery().snapshot.is_some(), "seed {seed}: recovered from a snapshot");
        }
        // And it carries on from there.
        write_random(&recovered, &reference, &mut rng, 20);
        assert_eq!(dump(&recovered), reference.snapshot().dump(), "seed {seed}: writes after recovery");
        recovered.shutdown();
    }
}

#[test]
fn a_corrupt_snapshot_is_refused_and_the_previous_one_with_the_longer_log_is_used() {
    let temp = tempfile::tempdir().expect("a temp dir");
    let dir = DataDir::new(temp.path());
    let mut rng = SmallRng::seed_from_u64(9);
    let reference = StateStore::new();
    let durable = open(&dir, 10);
    write_random(&durable, &reference, &mut rng, 45);
    // Snapshots are written in the background; take one more now so two are on disk.
    durable.snapshot_now().expect("a snapshot");
    let live = dump(&durable);
    durable.shutdown();

    let snapshots = storage::SnapshotDir::open(&dir.snapshot_dir(), Arc::new(|_: &FatalError| {})).expect("opens");
    let kept = snapshots.list().expect("lists");
    assert_eq!(kept.len(), 2, "the newest two are kept: {kept:?}");
    let (newest, older) = (&kept[0], &kept[1]);
    let mut bytes = std::fs::read(&newest.path).expect("reads");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&newest.path, &bytes).expect("corrupts");

    let recovered = open(&dir, 10);
    let recovery = recovered.recovery();
    assert_eq!(recovery.refused.len(), 1, "{:?}", recovery.refused);
    assert!(recovery.refused[0].contains("checksum mismatch"), "{}", recovery.refused[0]);
    assert_eq!(recovery.snapshot.as_ref().map(|info| info.index), Some(older.index), "fell back to the older");
    let (replayed, _) = recovered.replayed();
    assert!(replayed >= newest.index - older.index, "the longer log was replayed: {replayed} entries");
    assert_eq!(dump(&recovered), live);
    recovered.shutdown();
    assert!(!newest.path.exists(), "set aside once the server started");
    assert!(newest.path.with_extension("snap.corrupt").exists(), "kept for a look");
}

/// Waits until raft purged its log behind a snapshot (purging runs in the
/// background after each snapshot); the test fails if it never does.
fn until_purged(durable: &Durable) {
    let mut metrics = durable.raft().metrics();
    let (done, purged) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        futures_lite::future::block_on(async {
            while metrics.borrow().purged.is_none() {
                if metrics.changed().await.is_err() {
                    return;
                }
            }
            let _ = done.send(());
        });
    });
    purged.recv_timeout(std::time::Duration::from_secs(60)).expect("raft purges its log behind the older snapshot");
}

/// A data dir written through [`Durable`] with two snapshots kept and its
/// log purged behind the older: the state as it was, and the snapshots.
fn used_data_dir(dir: &DataDir) -> (StateDump, Vec<storage::SnapshotInfo>) {
    let mut rng = SmallRng::seed_from_u64(11);
    let reference = StateStore::new();
    let durable = open(dir, 10);
    write_random(&durable, &reference, &mut rng, 45);
    durable.snapshot_now().expect("a snapshot");
    until_purged(&durable);
    let live = dump(&durable);
    durable.shutdown();
    let snapshots = storage::SnapshotDir::open(&dir.snapshot_dir(), Arc::new(|_: &FatalError| {})).expect("opens");
    let kept = snapshots.list().expect("lists");
    assert_eq!(kept.len(), 2, "the newest two are kept: {kept:?}");
    (live, kept)
}

/// Every file under `root`, with its bytes.
fn files(root: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("lists") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                found.push((path.clone(), std::fs::read(&path).expect("reads")));
            }
        }
    }
    found.sort();
    found
}

fn open_error(dir: &DataDir) -> replication::DurableError {
    let fatal = Arc::new(|error: &FatalError| panic!("a write failed: {error}"));
    Durable::open(dir, &DurableConfig { snapshot_every: 10 }, fatal).expect_err("the start is refused")
}

#[test]
fn a_missing_or_emptied_log_is_refused_naming_it_and_a_restore_recovers_on_purpose() {
    let temp = tempfile::tempdir().expect("a temp dir");
    let dir = DataDir::new(temp.path());
    let (_, kept) = used_data_dir(&dir);
    let log = dir.log_path();
    std::fs::remove_dir_all(&log).expect("deletes the log");
    let before = files(dir.root());
    let error = open_error(&dir).to_string();
    assert!(error.contains(&format!("the raft log {} is missing", log.display())), "{error}");
    assert!(error.contains(&kept[0].path.display().to_string()), "names the snapshots: {error}");
    assert!(error.contains("drover operator snapshot restore"), "says how to recover: {error}");
    assert_eq!(files(dir.root()), before, "a refused start changes nothing");

    std::fs::create_dir(&log).expect("an emptied log: its directory without segments");
    let error = open_error(&dir).to_string();
    assert!(error.contains(&format!("the raft log {} is empty (no segments)", log.display())), "{error}");
    std::fs::remove_dir(&log).expect("a restore starts from no log");

    // Recovering on purpose: the newest snapshot becomes the state.
    replication::restore(&dir, &kept[0].path).expect("restores");
    let restored = open(&dir, 10);
    let header = restored.recovery().header.clone();
    assert_eq!(restored.store().latest_index(), header.store_index, "exactly the snapshot's state");
    restored.shutdown();
}

#[test]
fn putting_a_missing_log_back_recovers_every_write() {
    let temp = tempfile::tempdir().expect("a temp dir");
    let dir = DataDir::new(temp.path());
    let (live, _) = used_data_dir(&dir);
    let log = dir.log_path();
    let moved = temp.path().join("wal.moved");
    std::fs::rename(&log, &moved).expect("moves the log away");
    open_error(&dir);
    std::fs::rename(&moved, &log).expect("puts it back");
    let recovered = open(&dir, 10);
    assert_eq!(dump(&recovered), live);
    recovered.shutdown();
}

#[test]
fn all_snapshots_corrupt_is_refused_naming_each_and_nothing_changes() {
    let temp = tempfile::tempdir().expect("a temp dir");
    let dir = DataDir::new(temp.path());
    let (_, kept) = used_data_dir(&dir);
    for info in &kept {
        let mut bytes = std::fs::read(&info.path).expect("reads");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x40;
        std::fs::write(&info.path, &bytes).expect("corrupts");
    }
    let before = files(&dir.snapshot_dir());

    let error = open_error(&dir);
    let message = error.to_string();
    assert!(matches!(error, replication::DurableError::NoUsableSnapshot { .. }), "{message}");
    for info in &kept {
        let named = format!("snapshot {} is corrupt: checksum mismatch", info.path.display());
        assert!(message.contains(&named), "names {}: {message}", info.path.display());
    }
    assert!(message.contains(&dir.log_path().display().to_string()), "{message}");
    assert!(message.contains("drover operator snapshot restore"), "says how to recover: {message}");
    assert_eq!(files(&dir.snapshot_dir()), before, "same names, same bytes");
    // Refused again, the same way: nothing was set aside.
    assert!(matches!(open_error(&dir), replication::DurableError::NoUsableSnapshot { .. }));
}

#[test]
fn the_log_and_snapshots_are_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &std::path::Path| std::fs::metadata(path).expect("exists").permissions().mode() & 0o777;
    let temp = tempfile::tempdir().expect("a temp dir");
    let dir = DataDir::new(temp.path().join("server"));
    let (_, kept) = used_data_dir(&dir);
    assert_eq!(mode(&dir.log_path()), 0o700);
    for segment in std::fs::read_dir(dir.log_path()).expect("the log's segments") {
        let segment = segment.expect("a segment").path();
        assert_eq!(mode(&segment), 0o600, "{}", segment.display());
    }
    for info in &kept {
        assert_eq!(mode(&info.path), 0o600, "{}", info.path.display());
    }
    for directory in [dir.root().to_path_buf(), dir.root().join("raft"), dir.snapshot_dir()] {
        assert_eq!(mode(&directory), 0o700, "{}", directory.display());
    }
}

#[test]
fn concurrent_writers_are_all_acknowledged_and_all_recovered() {
    let temp = tempfile::tempdir().expect("a temp dir");
    let dir = DataDir::new(temp.path());
    let durable = open(&dir, 50);
    let writer = durable.writer();
    std::thread::scope(|scope| {
        for thread in 0..8u8 {
            let writer = writer.clone();
            scope.spawn(move || {
                for n in 0..25u8 {
                    let mut node = node(0);
                    node.id = NodeId::from_u128(u128::from(thread) << 8 | u128::from(n));
                    writer.write(Command::UpsertNode { node, evals: vec![] }).expect("acknowledged");
                }
            });
        }
    });
    assert_eq!(durable.store().latest_index(), 200);
    let live = dump(&durable);
    durable.shutdown();
    let recovered = open(&dir, 50);
    assert_eq!(recovered.store().snapshot().node_count(), 200);
    assert_eq!(dump(&recovered), live);
    recovered.shutdown();
}
