//! `loadgen`: drives a Drover server with simulated clients and reports
//! what it measured.
//!
//! Until the scheduling pipeline lands, the in-process run exercises what
//! exists: it registers `--nodes` nodes and `--jobs` jobs through the state
//! store, feeds every eval (several per job, so the broker's per-job
//! serialization and cancelable reaping are in play) through the eval broker
//! to `--workers` threads that wait for each eval's index, take a snapshot,
//! write the eval complete and ack it, while the real reaper writes the
//! superseded evals as canceled. Every figure printed is measured in this run.

#![forbid(unsafe_code)]

mod report;

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use engine::blocked::BlockedEvals;
use engine::broker::{BrokerConfig, EvalBroker};
use engine::clock::{SharedClock, SystemClock};
use engine::reaper::{EvalReaper, ReaperConfig};
use engine::state::{Command, StateStore};
use engine::structs::{EvalStatus, Evaluation, Job, JobType, Node, NodeId, Resources, TriggerReason};
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use report::Report;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Simulated clients against a Drover server.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Number of simulated client nodes.
    #[arg(long, default_value_t = 10_000)]
    nodes: usize,
    /// Number of jobs to register.
    #[arg(long, default_value_t = 10_000)]
    jobs: usize,
    /// Evaluations per job (the extra ones exercise per-job serialization and cancelation).
    #[arg(long, default_value_t = 5)]
    evals_per_job: usize,
    /// Scheduling worker threads (default: number of cores).
    #[arg(long)]
    workers: Option<usize>,
    /// Seed for the generated cluster and workload.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also write the report as JSON to this path.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

struct Run {
    store: Arc<StateStore>,
    broker: Arc<EvalBroker>,
    blocked: Arc<BlockedEvals>,
    clock: SharedClock,
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.nodes == 0 || args.jobs == 0 || args.evals_per_job == 0 {
        bail!("--nodes, --jobs and --evals-per-job must each be at least 1");
    }
    let workers = args.workers.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, usize::from));
    let clock = SystemClock::shared();
    let broker = Arc::new(EvalBroker::new(BrokerConfig::default(), clock.clone()));
    let run = Run {
        store: Arc::new(StateStore::new()),
        blocked: Arc::new(BlockedEvals::new(broker.clone(), clock.clone())),
        broker,
        clock,
    };
    let mut rng = SmallRng::seed_from_u64(args.seed);
    let mut report = Report { nodes: args.nodes, jobs: args.jobs, workers, ..Report::default() };

    let started = Instant::now();
    for n in 0..args.nodes {
        run.store.apply(Command::UpsertNode { node: simulated_node(n, &mut rng) }).context("registering a node")?;
    }
    report.node_register_per_sec = per_sec(args.nodes, started.elapsed());
    eprintln!("registered {} nodes in {:.2?}", args.nodes, started.elapsed());

    let evals = register_jobs(&run, &args, &mut rng, &mut report)?;
    process_evals(&run, evals, workers, &mut report)?;
    report.check_invariants(&run.store.snapshot(), &run.broker.stats());
    report.peak_rss_bytes = report::peak_rss_bytes();
    report.print();
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if !report.invariant_violations.is_empty() {
        bail!("{} invariant violations", report.invariant_violations.len());
    }
    Ok(())
}

/// A node of varied size in one of 20 classes and 4 datacenters.
fn simulated_node(n: usize, rng: &mut SmallRng) -> Node {
    let sizes = [(4_000, 8_192), (8_000, 16_384), (16_000, 32_768), (32_000, 131_072)];
    let (cpu, memory) = sizes[rng.random_range(0..sizes.len())];
    let datacenter = format!("dc{}", n % 4 + 1);
    let class = format!("class-{}", rng.random_range(0..20));
    let mut node = Node::new_ready(NodeId::from_rng(rng), &datacenter, &class, Resources::new(cpu, memory, 200_000));
    node.attributes.insert("unique.hostname".into(), format!("client-{n}"));
    node
}

/// Registers the jobs, then `evals_per_job - 1` more evals for each; returns
/// every eval as stored, in creation order.
fn register_jobs(run: &Run, args: &Args, rng: &mut SmallRng, report: &mut Report) -> Result<Vec<Arc<Evaluation>>> {
    let types = [JobType::Service, JobType::Service, JobType::Batch, JobType::System];
    let started = Instant::now();
    let mut evals = Vec::with_capacity(args.jobs * args.evals_per_job);
    let mut specs = Vec::with_capacity(args.jobs);
    for j in 0..args.jobs {
        let kind = types[j % types.len()];
        let count = if kind == JobType::System { 1 } else { rng.random_range(1..=100) };
        let mut job = Job::new_simple(&format!("job-{j}"), kind, count, Resources::new(100, 128, 0));
        job.priority = rng.random_range(1..=100);
        job.validate()?;
        let eval = Evaluation::for_job(&job, TriggerReason::JobRegister, run.clock.now());
        let applied = run.store.apply(Command::RegisterJob { job: job.clone(), eval: Some(eval) })?;
        evals.extend(applied.evals);
        specs.push(job);
    }
    report.job_register_per_sec = per_sec(args.jobs, started.elapsed());
    for round in 1..args.evals_per_job {
        let trigger = if round % 2 == 0 { TriggerReason::NodeUpdate } else { TriggerReason::JobScaling };
        let batch: Vec<_> = specs.iter().map(|job| Evaluation::for_job(job, trigger, run.clock.now())).collect();
        evals.extend(run.store.apply(Command::UpsertEvals { evals: batch })?.evals);
    }
    report.evals_created = evals.len();
    Ok(evals)
}

/// Feeds every eval through the broker to `workers` threads; returns when
/// each one is acked or canceled.
fn process_evals(run: &Run, evals: Vec<Arc<Evaluation>>, workers: usize, report: &mut Report) -> Result<()> {
    let reaper = EvalReaper::new(
        ReaperConfig { sweep_interval: Duration::from_millis(50), ..ReaperConfig::default() },
        run.broker.clone(),
        run.blocked.clone(),
        run.store.clone(),
        run.clock.clone(),
    );
    let reaper_handle = reaper.clone().spawn();
    let latency = Mutex::new(Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)?);
    let acked = AtomicU64::new(0);
    let total = evals.len() as u64;
    let started = Instant::now();
    run.broker.enqueue_all(evals);
    let (finished, finished_signal) = crossbeam::channel::bounded::<()>(0);
    let (results, elapsed) = std::thread::scope(|scope| {
        let progress = scope.spawn(|| progress_line(run, &acked, total, finished_signal));
        let handles: Vec<_> = (0..workers).map(|_| scope.spawn(|| work(run, &latency, &acked, total))).collect();
        let results: Vec<_> = handles.into_iter().map(|handle| handle.join()).collect();
        let elapsed = started.elapsed();
        drop(finished);
        let _ = progress.join();
        (results, elapsed)
    });
    for outcome in results {
        outcome.map_err(|_| anyhow::anyhow!("a worker panicked"))??;
    }
    reaper_handle.stop();
    reaper.reap_all()?;
    report.record_evals(&run.broker.stats(), acked.load(Ordering::SeqCst), elapsed, &latency.lock());
    report.evals_canceled = run.store.snapshot().evals().filter(|eval| eval.status == EvalStatus::Canceled).count();
    eprintln!();
    Ok(())
}

/// One worker: dequeue → wait for the eval's index → snapshot → write the
/// eval complete → ack. Stops once every eval is acked or cancelable.
fn work(run: &Run, latency: &Mutex<Histogram<u64>>, acked: &AtomicU64, total: u64) -> Result<()> {
    let types = JobType::ALL;
    while acked.load(Ordering::SeqCst) + canceled_so_far(run) < total {
        let Some(held) = run.broker.dequeue(&types, Duration::from_millis(20))? else {
            continue;
        };
        let snapshot = run.store.snapshot_min_index(held.eval.modify_index, Duration::from_secs(5))?;
        let job = snapshot.job(&held.eval.job_key()).context("an eval's job is in the snapshot")?;
        let mut done = Evaluation::clone(&held.eval);
        done.status = EvalStatus::Complete;
        done.snapshot_index = snapshot.index();
        done.job_modify_index = job.job_modify_index;
        done.modify_time = run.clock.now();
        run.store.apply(Command::UpsertEvals { evals: vec![done] })?;
        run.broker.ack(held.eval.id, held.token)?;
        let micros = run.clock.now().since(held.eval.create_time).as_micros() as u64;
        latency.lock().saturating_record(micros.max(1));
        acked.fetch_add(1, Ordering::SeqCst);
    }
    Ok(())
}

/// Evals the broker has set aside as superseded (taken or not yet taken by the reaper).
fn canceled_so_far(run: &Run) -> u64 {
    run.broker.canceled_total()
}

/// A progress line: rewritten in place on a terminal, one line every few
/// seconds otherwise.
fn progress_line(run: &Run, acked: &AtomicU64, total: u64, finished: crossbeam::channel::Receiver<()>) {
    let terminal = std::io::stderr().is_terminal();
    let interval = if terminal { Duration::from_millis(200) } else { Duration::from_secs(5) };
    loop {
        let (acked, canceled) = (acked.load(Ordering::SeqCst), canceled_so_far(run));
        let line = format!("  evals: {}/{total} done (acked {acked}, canceled {canceled})", acked + canceled);
        if terminal {
            eprint!("\r{line}");
        } else {
            eprintln!("{line}");
        }
        if acked + canceled >= total {
            return;
        }
        if finished.recv_timeout(interval).is_err_and(|error| error.is_disconnected()) {
            return;
        }
    }
}

fn per_sec(count: usize, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64().max(1e-9)
}
