//! End to end in one process: wall time from submitting the jobs to every
//! allocation placed, on an embedded server with the default worker count.
//! Building the server and registering the nodes is not timed.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use engine::clock::SystemClock;
use engine::server::{Server, ServerConfig};
use engine::structs::{Job, JobType, Resources};
use engine::testing::node;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const NODES: usize = 10_000;
const JOBS: usize = 1_000;
const ALLOCS_PER_JOB: u32 = 100;

fn jobs() -> Vec<Job> {
    (0..JOBS)
        .map(|j| {
            let kind = if j % 4 == 3 { JobType::Batch } else { JobType::Service };
            let mut job = Job::new_simple(&format!("job-{j}"), kind, ALLOCS_PER_JOB, Resources::new(100, 128, 0));
            job.datacenters = (1..=4).map(|dc| format!("dc{dc}")).collect();
            job
        })
        .collect()
}

/// Submits the jobs and waits (on index notifications) until all are placed;
/// returns the elapsed time and the plan rejection rate.
fn run_once(jobs: &[Job]) -> (Duration, f64) {
    let server = Server::start(ServerConfig::default(), SystemClock::shared());
    for n in 0..NODES {
        server.nodes().register(node(n)).expect("node registers");
    }
    let wanted = JOBS * ALLOCS_PER_JOB as usize;
    let started = Instant::now();
    for job in jobs {
        server.jobs().register(job.clone()).expect("job registers");
    }
    loop {
        let snapshot = server.store().snapshot();
        if snapshot.alloc_count() >= wanted && server.is_idle() {
            break;
        }
        let _ = server.store().snapshot_min_index(snapshot.index() + 1, Duration::from_millis(50));
    }
    let elapsed = started.elapsed();
    let stats = server.stats();
    assert_eq!(server.store().snapshot().alloc_count(), wanted, "every allocation placed");
    server.shutdown();
    (elapsed, stats.plan_applier.plans_partially_refused as f64 / stats.workers.plans_submitted.max(1) as f64)
}

fn end_to_end(c: &mut Criterion) {
    let jobs = jobs();
    let mut group = c.benchmark_group("pipeline/end_to_end");
    group.throughput(Throughput::Elements((JOBS * ALLOCS_PER_JOB as usize) as u64));
    group.bench_function(BenchmarkId::from_parameter("10000_nodes_100000_allocs"), |b| {
        b.iter_custom(|iterations| {
            let mut total = Duration::ZERO;
            for _ in 0..iterations {
                let (elapsed, rejection_rate) = run_once(&jobs);
                eprintln!("  run: {elapsed:.2?}, plan rejection rate {:.2}%", rejection_rate * 100.0);
                total += elapsed;
            }
            total
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).warm_up_time(Duration::from_millis(1)).measurement_time(Duration::from_secs(1));
    targets = end_to_end
}
criterion_main!(benches);
