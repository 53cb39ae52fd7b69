//! A churn run in one process: a steady stream of short batch jobs
//! (10 allocations each, run to completion by simulated clients) through
//! a real in-process server, with garbage collection on (thresholds of
//! 30 s, a collection every 10 s) and off, on the same machine, one after
//! the other. Every 10 s it prints the process's resident memory and the
//! state's rows (jobs, evaluations, allocations); with collection they
//! level off once the first threshold has passed, without it they grow
//! with every job.
//!
//! ```sh
//! cargo run --release -p engine --example gc_churn -- [seconds per mode] [jobs per second] [on|off|both]
//! ```
//!
//! Defaults: 300 s per mode, 300 jobs (3,000 allocations) a second, both
//! modes. Run one mode per process to compare resident memory: a second
//! mode in the same process starts with what the allocator kept of the
//! first. The output is CSV (`mode,second,rss_mib,jobs,evals,allocs,placed`),
//! then a summary per mode.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::clock::{SharedClock, SystemClock};
use engine::gc::{GcConfig, GcThresholds};
use engine::server::{Server, ServerConfig};
use engine::state::ClientAllocUpdate;
use engine::structs::{ClientStatus, Job, JobKey, JobType, Node, NodeId, Resources};

const NODES: u128 = 100;
const COUNT: u32 = 10;
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
const THRESHOLD: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug)]
struct Sample {
    second: u64,
    rss_mib: f64,
    jobs: usize,
    evals: usize,
    allocs: usize,
    placed: u64,
}

fn main() {
    let mut args = std::env::args().skip(1);
    let seconds: u64 = args.next().and_then(|text| text.parse().ok()).unwrap_or(300);
    let rate: u64 = args.next().and_then(|text| text.parse().ok()).unwrap_or(300);
    println!("mode,second,rss_mib,jobs,evals,allocs,placed");
    let modes: &[bool] = match args.next().as_deref() {
        Some("on") => &[true],
        Some("off") => &[false],
        _ => &[true, false],
    };
    let mut summaries = Vec::new();
    for &gc in modes {
        let samples = run(gc, Duration::from_secs(seconds), rate);
        summaries.push((gc, samples));
    }
    for (gc, samples) in &summaries {
        let mode = if *gc { "GC on (thresholds 30 s, every 10 s)" } else { "GC off" };
        println!("\n{mode}:");
        println!("  {:>6} {:>9} {:>9} {:>9} {:>10} {:>11}", "second", "RSS MiB", "jobs", "evals", "allocs", "placed");
        for sample in samples.iter().filter(|sample| sample.second % 60 == 0 || sample.second == 10) {
            println!(
                "  {:>6} {:>9.1} {:>9} {:>9} {:>10} {:>11}",
                sample.second, sample.rss_mib, sample.jobs, sample.evals, sample.allocs, sample.placed
            );
        }
    }
}

fn run(gc: bool, duration: Duration, rate: u64) -> Vec<Sample> {
    let clock: SharedClock = Arc::new(SystemClock::new());
    let mut config = ServerConfig::default();
    // The simulated clients send no heartbeats: TTLs longer than the run.
    config.heartbeat.min_heartbeat_ttl = Duration::from_secs(24 * 3600);
    config.heartbeat.failover_heartbeat_ttl = Duration::from_secs(24 * 3600);
    config.gc = match gc {
        true => GcConfig {
            interval: Duration::from_secs(10),
            thresholds: GcThresholds {
                eval: THRESHOLD,
                batch_eval: THRESHOLD,
                job: THRESHOLD,
                node: THRESHOLD,
                deployment: THRESHOLD,
            },
            ..GcConfig::default()
        },
        false => GcConfig { interval: Duration::from_secs(365 * 24 * 3600), ..GcConfig::default() },
    };
    let server = Server::start(config, clock);
    let nodes = server.nodes();
    for i in 1..=NODES {
        let mut node = Node::new_ready(NodeId::from_u128(i), "dc1", "c", Resources::new(64_000, 256_000, 1_000_000));
        node.attributes.insert("driver.mock".into(), "1".into());
        nodes.register(node).expect("node registers");
    }
    let mode = if gc { "gc" } else { "no-gc" };
    let started = Instant::now();
    let mut next_sample = started + SAMPLE_EVERY;
    let mut running: VecDeque<JobKey> = VecDeque::new();
    let mut placed = 0u64;
    let mut samples = Vec::new();
    let mut sequence = 0u64;
    while started.elapsed() < duration {
        // Register what is due by now, at `rate` jobs a second.
        let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
        while sequence < due {
            let mut job =
                Job::new_simple(&format!("{mode}-{sequence}"), JobType::Batch, COUNT, Resources::new(10, 10, 0));
            job.task_groups[0].tasks[0].driver = "mock".into();
            running.push_back(job.key());
            server.jobs().register(job).expect("a job registers");
            sequence += 1;
        }
        placed += complete(&server, &mut running);
        // Until the state moves (placements to complete) or the next jobs
        // are due, whichever is first.
        let index = server.store().latest_index();
        let _ = server.store().snapshot_min_index(index + 1, Duration::from_millis(1000 / rate.max(1)));
        if Instant::now() >= next_sample {
            let snapshot = server.store().snapshot();
            let sample = Sample {
                second: (next_sample - started).as_secs(),
                rss_mib: rss_mib(),
                jobs: snapshot.jobs().count(),
                evals: snapshot.evals().count(),
                allocs: snapshot.alloc_count(),
                placed,
            };
            println!(
                "{mode},{},{:.1},{},{},{},{}",
                sample.second, sample.rss_mib, sample.jobs, sample.evals, sample.allocs, sample.placed
            );
            samples.push(sample);
            next_sample += SAMPLE_EVERY;
        }
    }
    server.shutdown();
    samples
}

/// Plays the clients of the jobs still running: their placed allocations
/// are reported complete at once. Returns how many were.
fn complete(server: &Server, running: &mut VecDeque<JobKey>) -> u64 {
    let snapshot = server.store().snapshot();
    let mut by_node: BTreeMap<NodeId, Vec<ClientAllocUpdate>> = BTreeMap::new();
    let mut finished = 0;
    running.retain(|key| {
        let allocs: Vec<_> = snapshot.allocs_by_job(key).collect();
        let mut done = allocs.len() == COUNT as usize;
        for alloc in allocs.into_iter().filter(|alloc| !alloc.client_status.is_terminal()) {
            done = false;
            finished += 1;
            by_node.entry(alloc.node_id).or_default().push(ClientAllocUpdate::status(alloc, ClientStatus::Complete));
        }
        !done
    });
    let nodes = server.nodes();
    let pending: Vec<_> = by_node
        .into_iter()
        .map(|(node_id, updates)| nodes.submit_allocs(node_id, updates).expect("reports are taken"))
        .collect();
    for report in pending {
        report.wait().expect("reports are written");
    }
    finished
}

/// The process's resident memory, from `/proc/self/status`.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}
