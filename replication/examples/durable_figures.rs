//! The durable log's figures, on this machine's disk:
//! 1. commit latency (submit to acknowledged: fsynced and applied) with 1,
//!    8 and 64 concurrent writers, p50/p99/max;
//! 2. the snapshot's size and write time for 10,000 nodes and 110,000
//!    allocations, and for 1,000,000 allocations;
//! 3. recovery time from that last snapshot plus 100,000 commands in the
//!    log after it (loading the snapshot, replaying the log, leading).
//!
//! `cargo run --release -p replication --example durable_figures [DIR]`
//! (DIR: where the data dirs go; default the system's temp dir).

use std::sync::Arc;
use std::time::Instant;

use engine::clock::Timestamp;
use engine::state::{ClientAllocUpdate, Command};
use engine::structs::{AllocId, Allocation, ClientStatus, EvalId, Job, JobType, NodeId, Resources};
use hdrhistogram::Histogram;
use replication::{Durable, DurableConfig};
use storage::{DataDir, FatalError};

/// Snapshots only when asked: the figures time them one by one.
const NO_AUTOMATIC_SNAPSHOTS: u64 = 1 << 40;

fn open(root: &std::path::Path, name: &str, fresh: bool) -> Durable {
    let dir = root.join(name);
    if fresh {
        let _ = std::fs::remove_dir_all(&dir);
    }
    std::fs::create_dir_all(&dir).expect("data dir");
    let fatal = Arc::new(|error: &FatalError| panic!("a write failed: {error}"));
    Durable::open(&DataDir::new(dir), &DurableConfig { snapshot_every: NO_AUTOMATIC_SNAPSHOTS }, fatal).expect("opens")
}

/// Runs `commands` from `writers` threads at once; each write's latency
/// goes into the histogram (microseconds).
fn concurrent(
    durable: &Durable,
    writers: usize,
    commands: impl Fn(usize, usize) -> Option<Command> + Sync,
) -> Histogram<u64> {
    let histogram = parking_lot::Mutex::new(Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds"));
    std::thread::scope(|scope| {
        for writer in 0..writers {
            let log = durable.writer();
            let commands = &commands;
            let histogram = &histogram;
            scope.spawn(move || {
                let mut own = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
                let mut n = 0;
                while let Some(command) = commands(writer, n) {
                    let started = Instant::now();
                    log.write(command).expect("written");
                    own.saturating_record(started.elapsed().as_micros() as u64);
                    n += 1;
                }
                histogram.lock().add(own).expect("same bounds");
            });
        }
    });
    histogram.into_inner()
}

fn populate(durable: &Durable, nodes: usize, allocs: usize) {
    let node_commands = |writer: usize, n: usize| {
        let index = n * 16 + writer;
        (index < nodes).then(|| Command::UpsertNode { node: engine::testing::node(index), evals: vec![] })
    };
    concurrent(durable, 16, node_commands);
    let spec = Job::new_simple("fixture", JobType::Service, allocs as u32, Resources::new(1, 1, 0));
    durable.writer().write(Command::RegisterJob { job: spec.clone(), eval: None }).expect("job");
    let job = durable.store().snapshot().job(&spec.key()).expect("stored").clone();
    for start in (0..allocs).step_by(10_000) {
        let placed: Vec<Allocation> = (start..(start + 10_000).min(allocs))
            .map(|i| {
                let node_id = NodeId::from_u128((i % nodes) as u128 + 1);
                Allocation::new_placement(&job, "group", i as u32, node_id, EvalId::from_u128(1))
            })
            .collect();
        let command = Command::ApplyPlanResults {
            deployment: None,
            deployment_updates: Vec::new(),
            eval_id: EvalId::from_u128(1),
            allocs: placed,
            evals: vec![],
            time: Timestamp(1),
        };
        durable.writer().write(command).expect("plan");
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn main() {
    let root = std::env::args().nth(1).map_or_else(|| std::env::temp_dir().join("drover-durable-figures"), Into::into);
    std::fs::create_dir_all(&root).expect("root");
    println!("data dirs under {}", root.display());

    // 1. Commit latency.
    let durable = open(&root, "latency", true);
    populate(&durable, 100, 0);
    for (writers, each) in [(1, 3_000), (8, 600), (64, 100)] {
        let started = Instant::now();
        let histogram = concurrent(&durable, writers, |writer, n| {
            (n < each)
                .then(|| Command::UpsertNode { node: engine::testing::node((writer * 7 + n) % 100), evals: vec![] })
        });
        let took = started.elapsed();
        println!(
            "commit latency, {writers:>2} writers: p50 {} µs, p99 {} µs, max {} µs ({} writes, {:.0} writes/s)",
            histogram.value_at_quantile(0.5),
            histogram.value_at_quantile(0.99),
            histogram.max(),
            histogram.len(),
            histogram.len() as f64 / took.as_secs_f64()
        );
    }
    durable.shutdown();

    // 2. Snapshots.
    for (name, nodes, allocs) in [("snapshot-110k", 10_000, 110_000), ("snapshot-1m", 10_000, 1_000_000)] {
        let durable = open(&root, name, true);
        populate(&durable, nodes, allocs);
        let taken = durable.snapshot_now().expect("snapshot");
        println!(
            "snapshot of {nodes} nodes and {allocs} allocations: {:.1} MiB, written in {} ms",
            mib(taken.info.size),
            taken.write_time.as_millis()
        );
        if allocs == 1_000_000 {
            // 3. 100,000 commands after the snapshot, then recover.
            let ids: Vec<AllocId> = durable.store().snapshot().allocs().take(100_000).map(|alloc| alloc.id).collect();
            let nodes_of: Vec<NodeId> =
                ids.iter().map(|id| durable.store().snapshot().alloc(*id).expect("alloc").node_id).collect();
            let started = Instant::now();
            concurrent(&durable, 64, |writer, n| {
                let index = n * 64 + writer;
                (index < ids.len()).then(|| Command::UpdateAllocsFromClient {
                    updates: vec![ClientAllocUpdate {
                        alloc_id: ids[index],
                        node_id: nodes_of[index],
                        client_status: ClientStatus::Running,
                        client_description: String::new(),
                        services: None,
                        checks: None,
                        health: None,
                        task_states: Default::default(),
                    }],
                    evals: vec![],
                    time: Timestamp(2),
                })
            });
            let info = durable.info().expect("info");
            println!(
                "then 100000 commands in {:.1?} (raft log {:?}..={:?})",
                started.elapsed(),
                info.log_first,
                info.log_last
            );
            let index = durable.store().latest_index();
            durable.shutdown();
            let started = Instant::now();
            let recovered = open(&root, name, false);
            let took = started.elapsed();
            let (replayed, _) = recovered.replayed();
            assert_eq!(recovered.store().latest_index(), index, "recovered to the same index");
            println!(
                "recovery from the snapshot ({} ms to load) plus {replayed} raft entries (100000 commands): {:.2?} in all",
                recovered.recovery().load_time.as_millis(),
                took
            );
            recovered.shutdown();
        } else {
            durable.shutdown();
        }
    }
    let _ = std::fs::remove_dir_all(&root);
}
