//! `loadgen`: drives a Drover server with simulated clients and reports
//! what it measured.
//!
//! By default it runs in process: it starts an embedded `engine::Server`,
//! registers `--nodes` simulated nodes (varied sizes, 20 classes, 4
//! datacenters), submits a mix of service and batch jobs plus one system
//! job, lets simulated clients heartbeat and report their allocations
//! running, and waits until every job has what it asked for. With
//! `--spawn-server` or `--server ADDR` the clients are real agents over QUIC
//! instead (see `network.rs`), with flapping and storms. It then checks the
//! final state and prints (and with `--json`, writes) the report.

#![forbid(unsafe_code)]

mod network;
mod plot;
mod report;

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use engine::clock::SystemClock;
use engine::node::storm::StormConfig;
use engine::server::{Server, ServerConfig};
use engine::state::{ClientAllocUpdate, Snapshot};
use engine::structs::{
    Affinity, ClientStatus, ConstraintOperand, Job, JobType, NetworkResource, Node, NodeId, NodeStatus, Port,
    Resources, Spread,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use transport::message::ReportScope;

use report::Report;

/// mimalloc, unless built with `--features system-alloc`: a heap profiler
/// that hooks `malloc` (heaptrack, with `--server-wrapper`) then sees every
/// allocation.
#[cfg(not(feature = "system-alloc"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Simulated clients against a Drover server.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Number of simulated client nodes.
    #[arg(long, default_value_t = 10_000)]
    nodes: usize,
    /// Number of service and batch jobs (one system job is added).
    #[arg(long, default_value_t = 1_000)]
    jobs: usize,
    /// Allocations per service or batch job.
    #[arg(long, default_value_t = 100)]
    allocs_per_job: u32,
    /// Scheduling workers (default: number of cores).
    #[arg(long)]
    workers: Option<usize>,
    /// Operators registering the jobs at once, each waiting for its own
    /// registration's answer before its next (1: one after another).
    #[arg(long, default_value_t = 1)]
    operators: usize,
    /// Seed for the generated cluster and workload.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Give up if the cluster has not converged after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
    /// Also write the report as JSON to this path.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Sample the server (pprof, 999 Hz) and write a flame graph SVG here:
    /// the whole run in process, or the spawned server's whole life with
    /// --spawn-server (a remote --server cannot be sampled).
    #[arg(long, conflicts_with = "server")]
    flamegraph: Option<std::path::PathBuf>,
    /// Start a server child process on loopback (the same server code as
    /// `drover server`, with a fresh cluster CA) and drive it over QUIC.
    #[arg(long, conflicts_with = "server")]
    spawn_server: bool,
    /// Run each spawned server under this command, split on spaces (a
    /// profiler such as `heaptrack -o /tmp/server`); the server's own
    /// arguments follow it.
    #[arg(long, requires = "spawn_server")]
    server_wrapper: Option<String>,
    /// Drive the server at this address over QUIC (needs the TLS files:
    /// a client certificate and an operator certificate of its CA).
    #[arg(long)]
    server: Option<std::net::SocketAddr>,
    /// The cluster CA certificate (with --server).
    #[arg(long)]
    ca_file: Option<std::path::PathBuf>,
    /// A client certificate and key of the cluster (with --server).
    #[arg(long)]
    cert_file: Option<std::path::PathBuf>,
    #[arg(long)]
    key_file: Option<std::path::PathBuf>,
    /// An operator certificate and key (`drover tls cert create --cli`).
    #[arg(long)]
    operator_cert: Option<std::path::PathBuf>,
    #[arg(long)]
    operator_key: Option<std::path::PathBuf>,
    /// Client endpoints (UDP sockets) the clients share (QUIC modes).
    #[arg(long, default_value_t = 8)]
    endpoints: usize,
    /// How long to run (flap) after the workload is placed (QUIC modes).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    duration: Duration,
    /// Fraction of clients that drop per minute during the run.
    #[arg(long, default_value_t = 0.0)]
    flap_rate: f64,
    /// How long a dropped client stays away: MIN-MAX@WEIGHT,... (the
    /// default mixes drops shorter than the heartbeat grace, drops that get
    /// the node marked, and drops longer than max_client_disconnect).
    #[arg(long, default_value = "1s-5s@0.5,25s-50s@0.3,70s-90s@0.2")]
    flap_duration: network::FlapDurations,
    /// `AT:FRACTION[:AWAY]`: drop that fraction of clients at once, AT after
    /// the run starts, and bring them back together after AWAY (45 s).
    #[arg(long)]
    storm: Option<network::Storm>,
    /// Make every client heartbeat at this interval instead of its TTL
    /// during the run (--duration), after start-up and placement.
    #[arg(long, value_parser = humantime::parse_duration)]
    heartbeat_interval: Option<Duration>,
    /// Share of service jobs that tolerate a client disconnect
    /// (max_client_disconnect).
    #[arg(long, default_value_t = 0.5)]
    disconnect_share: f64,
    /// max_client_disconnect of those jobs.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    max_client_disconnect: Duration,
    /// Replace those jobs' allocations elsewhere while they are `unknown`
    /// (Nomad's default). Without it they tolerate the disconnect as
    /// `disconnect { replace = false }` does: kept until they return or
    /// their window runs out.
    #[arg(long)]
    disconnect_replace: bool,
    /// Keep the server's state on disk here (the raft log and snapshots, as
    /// `drover server --data-dir`) instead of in memory: to measure what
    /// durability costs. In process or with --spawn-server.
    #[arg(long, conflicts_with = "server")]
    data_dir: Option<std::path::PathBuf>,
    /// Raft entries between snapshots, with --data-dir.
    #[arg(long, default_value_t = 20_000)]
    snapshot_every: u64,
    /// Servers to spawn with --spawn-server: more than one form a cluster
    /// (each keeps its raft log on disk, under --data-dir or a temporary
    /// directory).
    #[arg(long, default_value_t = 1)]
    servers: usize,
    /// Kill the leader with SIGKILL this often during the run (--duration),
    /// then restart it: with --servers 3 or more.
    #[arg(long, value_parser = humantime::parse_duration)]
    kill_leader_every: Option<Duration>,
    /// Draw the run as an SVG here (QUIC modes): placements and heartbeats
    /// per second, heartbeat RTT percentiles, the server's CPU and memory,
    /// the clients away, with the leader kills and the storm marked.
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
    /// Event batches the server keeps for its event stream (as `drover
    /// server --event-buffer-size`; 0: events off, to measure their cost).
    #[arg(long, default_value_t = engine::events::DEFAULT_EVENT_BUFFER)]
    event_buffer_size: usize,
    /// Run the spawned servers without the storm guard (to compare: nodes
    /// that miss their heartbeat are marked down at once, as in Nomad).
    #[arg(long)]
    no_storm_guard: bool,
    /// Held nodes whose replacements the spawned servers' storm guard
    /// releases per second (`[server.storm_guard] release_rate`).
    #[arg(long, default_value_t = StormConfig::default().release_per_second)]
    storm_release_rate: f64,
    /// Internal: run as the spawned server (used by --spawn-server).
    #[arg(long, hide = true)]
    serve_child: bool,
    /// Internal: the spawned server's client port (a cluster's).
    #[arg(long, hide = true)]
    port: Option<u16>,
    /// Internal: the spawned server's server-to-server port (a cluster's).
    #[arg(long, hide = true)]
    peer_port: Option<u16>,
    /// Internal: the other spawned servers' server-to-server addresses.
    #[arg(long, hide = true, value_delimiter = ',')]
    join: Vec<String>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.serve_child {
        return serve_child(&args);
    }
    if args.nodes == 0 || args.jobs == 0 || args.allocs_per_job == 0 || args.operators == 0 {
        bail!("--nodes, --jobs, --allocs-per-job and --operators must each be at least 1");
    }
    if args.servers == 0 || (args.servers > 1 && !args.spawn_server) {
        bail!("--servers: at least 1, and more than 1 only with --spawn-server");
    }
    if args.kill_leader_every.is_some() && args.servers < 3 {
        bail!("--kill-leader-every needs --servers 3 or more (a cluster that survives losing its leader)");
    }
    let quic = args.spawn_server || args.server.is_some();
    if args.plot.is_some() && !quic {
        bail!("--plot draws a run over QUIC: add --spawn-server (or --server)");
    }
    let workers = args.workers.unwrap_or_else(|| ServerConfig::default().workers);
    // The spawned server samples itself (`serve_child`).
    let profiler = if quic { None } else { start_profiler(&args.flamegraph)? };
    let mut rng = SmallRng::seed_from_u64(args.seed);
    let mut report = Report {
        mode: if quic { "quic" } else { "in-process" }.to_string(),
        durable: args.data_dir.is_some(),
        nodes: args.nodes,
        jobs: args.jobs + 1,
        workers,
        ..Report::default()
    };
    let nodes: Vec<Node> = (0..args.nodes).map(|n| simulated_node(n, quic, &mut rng)).collect();
    let jobs = workload(&args, quic, &mut rng);
    report.allocs_desired = jobs.iter().map(|job| desired_count(job, args.nodes)).sum();
    if quic {
        drover::logging::init("warn", false)?;
        let tls_files = match (&args.ca_file, &args.cert_file, &args.key_file, &args.operator_cert, &args.operator_key)
        {
            (Some(ca), Some(cert), Some(key), Some(op_cert), Some(op_key)) => {
                Some((ca.clone(), cert.clone(), key.clone(), op_cert.clone(), op_key.clone()))
            }
            _ => None,
        };
        let network = network::NetworkArgs {
            server: args.server,
            tls_files,
            endpoints: args.endpoints.max(1),
            flap_rate: args.flap_rate,
            flap_durations: args.flap_duration.clone(),
            storm: args.storm,
            duration: args.duration,
            heartbeat_interval: args.heartbeat_interval,
            workers: args.workers,
            operators: args.operators,
            timeout: Duration::from_secs(args.timeout_secs),
            flamegraph: args.flamegraph.clone(),
            server_wrapper: args
                .server_wrapper
                .as_deref()
                .map(|wrapper| wrapper.split_whitespace().map(String::from).collect()),
            data_dir: args.data_dir.clone().map(|dir| (dir, args.snapshot_every)),
            servers: args.servers,
            kill_leader_every: args.kill_leader_every,
            event_buffer_size: args.event_buffer_size,
            plot: args.plot.clone(),
            storm_guard: (!args.no_storm_guard).then_some(args.storm_release_rate),
        };
        network::run(network, nodes, jobs, &mut report)?;
    } else {
        in_process(&args, workers, nodes, &jobs, &mut report)?;
    }
    report.peak_rss_bytes = report::peak_rss_bytes();
    if let (Some(profiler), Some(path)) = (profiler, &args.flamegraph) {
        write_flamegraph(&profiler, path)?;
    }
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

/// The in-process run: an embedded server, clients simulated by a thread.
fn in_process(args: &Args, workers: usize, nodes: Vec<Node>, jobs: &[Job], report: &mut Report) -> Result<()> {
    let config = ServerConfig { workers, event_buffer_size: args.event_buffer_size, ..ServerConfig::default() };
    let durable = match &args.data_dir {
        Some(dir) => {
            let dir = storage::DataDir::new(dir.join("server"));
            std::fs::create_dir_all(dir.root()).with_context(|| format!("creating {}", dir.root().display()))?;
            let config = replication::DurableConfig { snapshot_every: args.snapshot_every.max(1) };
            Some(replication::Durable::open(&dir, &config, storage::exit_on_fatal())?)
        }
        None => None,
    };
    let server = match &durable {
        Some(durable) => Server::start_with(config, SystemClock::shared(), durable.writer()),
        None => Server::start(config, SystemClock::shared()),
    };
    // The engine's timers, for the report's worker and plan lines.
    let timers = drover::server::timers::installed();
    let started = Instant::now();
    let node_ids: Vec<NodeId> = nodes.iter().map(|node| node.id).collect();
    for node in nodes {
        server.nodes().register(node).context("registering a node")?;
    }
    report.node_register_per_sec = args.nodes as f64 / started.elapsed().as_secs_f64().max(1e-9);
    eprintln!("registered {} nodes in {:.2?}", args.nodes, started.elapsed());
    let clients_done = AtomicBool::new(false);
    let (placed_in, outcome) = std::thread::scope(|scope| {
        let clients = scope.spawn(|| simulate_clients(&server, &node_ids, &clients_done));
        let started = Instant::now();
        let outcome =
            submit_and_wait(&server, jobs, args.nodes, args.operators, Duration::from_secs(args.timeout_secs));
        let placed_in = started.elapsed();
        clients_done.store(true, Ordering::Release);
        let _ = clients.join();
        (placed_in, outcome)
    });
    outcome?;
    report.record_timers(&timers.read());
    let mut cluster =
        drover::server::cluster_report(&server.store().snapshot(), SystemClock::shared().now(), ReportScope::Full);
    cluster.engine = server.stats();
    report.record(&cluster, placed_in);
    report.check_invariants(&cluster);
    server.stop();
    if let Some(durable) = durable {
        durable.shutdown();
    }
    server.store().shutdown();
    Ok(())
}

/// `--serve-child`: the spawned server of `--spawn-server`, the same code
/// as `drover server`, on a free loopback port; prints its address and
/// runs until SIGTERM.
fn serve_child(args: &Args) -> Result<()> {
    drover::logging::init("warn", false)?;
    transport::install_crypto_provider();
    let (Some(ca), Some(cert), Some(key)) = (&args.ca_file, &args.cert_file, &args.key_file) else {
        bail!("--serve-child needs --ca-file, --cert-file and --key-file");
    };
    let mut engine = ServerConfig { event_buffer_size: args.event_buffer_size, ..ServerConfig::default() };
    if let Some(workers) = args.workers {
        engine.workers = workers;
    }
    engine.heartbeat.storm.enabled = !args.no_storm_guard;
    engine.heartbeat.storm.release_per_second = args.storm_release_rate;
    engine.heartbeat.storm.validate().map_err(|message| anyhow::anyhow!("--storm-release-rate: {message}"))?;
    let cluster = (args.servers > 1).then(|| drover::server::ClusterOptions {
        name: format!("loadgen-server-{}", args.peer_port.unwrap_or(0)),
        peer_bind: std::net::SocketAddr::from(([127, 0, 0, 1], args.peer_port.unwrap_or(0))),
        advertise_peer: None,
        bootstrap_expect: args.servers,
        join: args.join.clone(),
        hold: drover::server::leadership::HOLD,
    });
    let options = drover::server::ServerOptions {
        bind: std::net::SocketAddr::from(([127, 0, 0, 1], args.port.unwrap_or(0))),
        advertise: None,
        engine,
        tls: transport::tls::TlsMaterial::from_files(ca, cert, key)?,
        http: None,
        durable: args.data_dir.as_deref().map(|dir| {
            drover::server::DurableOptions::under(
                dir,
                replication::DurableConfig { snapshot_every: args.snapshot_every.max(1) },
            )
        }),
        cluster,
    };
    let profiler = start_profiler(&args.flamegraph)?;
    drover::server::run_until_signal(options, true)?;
    if let (Some(profiler), Some(path)) = (profiler, &args.flamegraph) {
        write_flamegraph(&profiler, path)?;
    }
    Ok(())
}

/// A 999 Hz sampler when a flame graph is asked for.
fn start_profiler(flamegraph: &Option<std::path::PathBuf>) -> Result<Option<pprof::ProfilerGuard<'static>>> {
    match flamegraph {
        Some(_) => {
            Ok(Some(pprof::ProfilerGuardBuilder::default().frequency(999).build().context("starting the profiler")?))
        }
        None => Ok(None),
    }
}

fn write_flamegraph(profiler: &pprof::ProfilerGuard<'_>, path: &std::path::Path) -> Result<()> {
    let report = profiler.report().build().context("building the profile")?;
    let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    report.flamegraph(file).context("writing the flame graph")?;
    eprintln!("flame graph written to {}", path.display());
    Ok(())
}

/// A node of varied size in one of 20 classes and 4 datacenters, on one
/// of 10 racks (`meta.rack`, set by the class, so the classes stay 20 per
/// datacenter); over QUIC its agent offers the mock driver.
fn simulated_node(n: usize, mock: bool, rng: &mut SmallRng) -> Node {
    let sizes = [(4_000, 8_192), (8_000, 16_384), (16_000, 32_768), (32_000, 131_072)];
    let (cpu, memory) = sizes[rng.random_range(0..sizes.len())];
    let datacenter = format!("dc{}", n % 4 + 1);
    let class_index = rng.random_range(0..20);
    let class = format!("class-{class_index}");
    let mut node = Node::new_ready(NodeId::from_rng(rng), &datacenter, &class, Resources::new(cpu, memory, 200_000));
    node.meta.insert("rack".into(), format!("r{}", class_index % 10));
    node.computed_class = node.compute_class();
    node.attributes.insert("unique.hostname".into(), format!("client-{n}"));
    if mock {
        node.attributes.remove("driver.exec");
        node.attributes.insert("driver.mock".into(), "1".into());
        node.computed_class = node.compute_class();
    }
    node
}

/// One system job (node agents go on before the workloads, as they would
/// in a real cluster), then service and batch jobs of `--allocs-per-job`
/// each. Service jobs carry placement features by their number j: j % 6 = 0
/// spreads evenly over datacenters and racks, 1 prefers one rack (an
/// affinity), 2 takes two dynamic ports per allocation. Over QUIC the tasks use the mock driver, and a share of the service jobs
/// tolerate a client disconnect.
fn workload(args: &Args, mock: bool, rng: &mut SmallRng) -> Vec<Job> {
    let datacenters: Vec<String> = (1..=4).map(|dc| format!("dc{dc}")).collect();
    let mut system = Job::new_simple("node-agent", JobType::System, 1, Resources::new(20, 32, 0));
    system.datacenters = datacenters.clone();
    let mut jobs = vec![system];
    jobs.extend((0..args.jobs).map(|j| {
        let kind = if j % 4 == 3 { JobType::Batch } else { JobType::Service };
        let resources = Resources::new(rng.random_range(50..=200), rng.random_range(64..=256), 0);
        let mut job = Job::new_simple(&format!("job-{j}"), kind, args.allocs_per_job, resources);
        job.priority = rng.random_range(1..=100);
        job.datacenters = datacenters.clone();
        if kind == JobType::Service {
            with_placement_feature(&mut job, j);
        }
        if kind == JobType::Service && rng.random::<f64>() < args.disconnect_share {
            job.task_groups[0].max_client_disconnect = Some(args.max_client_disconnect);
            job.task_groups[0].replace_on_disconnect = args.disconnect_replace;
        }
        job
    }));
    if mock {
        for task in jobs.iter_mut().flat_map(|job| job.task_groups.iter_mut()).flat_map(|group| group.tasks.iter_mut())
        {
            task.driver = "mock".into();
        }
    }
    jobs
}

/// Gives some service jobs a spread, an affinity or dynamic ports (by `j`).
fn with_placement_feature(job: &mut Job, j: usize) {
    let group = &mut job.task_groups[0];
    match j % 6 {
        0 => {
            job.spreads.push(Spread::even("${node.datacenter}", 50));
            group.spreads.push(Spread::even("${meta.rack}", 50));
        }
        1 => {
            let rack = format!("r{}", j / 6 % 10);
            job.affinities.push(Affinity::new("${meta.rack}", ConstraintOperand::Equal, &rack, 50));
        }
        2 => {
            let ports = vec![Port::new("http", 0), Port::new("admin", 0)];
            group.networks = vec![NetworkResource { reserved_ports: vec![], dynamic_ports: ports }];
        }
        _ => {}
    }
}

/// The jobs below their count and what their last evals said, for a run
/// that did not converge.
fn short_jobs(snapshot: &Snapshot, jobs: &[Job], n_nodes: usize) -> String {
    let mut lines = Vec::new();
    for job in jobs {
        let live = snapshot.allocs_by_job(&job.key()).filter(|alloc| !alloc.terminal()).count();
        let count = desired_count(job, n_nodes) as usize;
        if live >= count {
            continue;
        }
        let evals: Vec<String> = snapshot
            .evals_by_job(&job.key())
            .map(|eval| {
                format!(
                    "{} {:?} {:?} blocked {:?} queued {:?} failed {:?}",
                    eval.id,
                    eval.triggered_by,
                    eval.status,
                    eval.blocked_eval,
                    eval.queued_allocations,
                    eval.failed_tg_allocs
                )
            })
            .collect();
        lines.push(format!("  {} has {live} of {count}:\n    {}", job.id, evals.join("\n    ")));
    }
    lines.truncate(5);
    lines.join("\n")
}

fn desired_count(job: &Job, n_nodes: usize) -> u64 {
    if job.job_type.is_system_like() {
        n_nodes as u64
    } else {
        job.task_groups.iter().map(|group| u64::from(group.count)).sum()
    }
}

/// Submits the node agents (system jobs) and waits until they are placed,
/// as a real cluster runs them before its workloads (placed later, an agent
/// could find a node already filled by bin-packing, and without preemption
/// it would wait for capacity forever); then submits the rest and waits
/// until every allocation is placed and the server is idle. `operators`
/// threads register at once (`--operators`). Prints a progress line.
fn submit_and_wait(server: &Server, jobs: &[Job], n_nodes: usize, operators: usize, timeout: Duration) -> Result<()> {
    let started = Instant::now();
    let waiting = Waiting { server, jobs, n_nodes, started, deadline: started + timeout };
    let (agents, workloads): (Vec<&Job>, Vec<&Job>) = jobs.iter().partition(|job| job.job_type.is_system_like());
    let mut desired = 0;
    for batch in [agents, workloads] {
        // Operator `k` registers every `operators`-th job from the k-th.
        std::thread::scope(|scope| {
            let lanes: Vec<_> = (0..operators.min(batch.len()))
                .map(|lane| {
                    let batch = &batch;
                    scope.spawn(move || {
                        for job in batch.iter().skip(lane).step_by(operators) {
                            server
                                .jobs()
                                .register(Job::clone(job))
                                .with_context(|| format!("registering {}", job.id))?;
                        }
                        Ok::<(), anyhow::Error>(())
                    })
                })
                .collect();
            lanes.into_iter().try_for_each(|lane| lane.join().expect("an operator thread panicked"))
        })?;
        desired += batch.iter().map(|job| desired_count(job, n_nodes)).sum::<u64>();
        waiting.until_placed(desired)?;
    }
    eprintln!("\r  placed {desired}/{desired} allocations in {:.2?}", started.elapsed());
    Ok(())
}

/// A wait for placements, with what a progress line and an error need.
struct Waiting<'a> {
    server: &'a Server,
    jobs: &'a [Job],
    n_nodes: usize,
    started: Instant,
    deadline: Instant,
}

impl Waiting<'_> {
    /// Until `desired` allocations are live and the server is idle. Wakes
    /// on each write, and every 50 ms to see the broker go idle.
    fn until_placed(&self, desired: u64) -> Result<()> {
        let terminal = std::io::stderr().is_terminal();
        let mut last_line = Instant::now();
        loop {
            // No allocation ends during a fault-free placement, so the O(1) row
            // count stands in for the live count until the target is reached.
            let snapshot = self.server.store().snapshot();
            let mut placed = snapshot.alloc_count() as u64;
            if placed >= desired && self.server.is_idle() {
                placed = live_allocs(&snapshot);
                if placed >= desired {
                    return Ok(());
                }
            }
            if Instant::now() > self.deadline {
                let timeout = self.deadline - self.started;
                bail!(
                    "not converged after {timeout:?}: {placed}/{desired} placed, {:?}\n{}",
                    self.server.stats(),
                    short_jobs(&snapshot, self.jobs, self.n_nodes)
                );
            }
            if terminal || last_line.elapsed() > Duration::from_secs(5) {
                let line = format!("  placed {placed}/{desired} allocations, {:.1?} elapsed", self.started.elapsed());
                if terminal {
                    eprint!("\r{line}");
                } else {
                    eprintln!("{line}");
                }
                last_line = Instant::now();
            }
            let _ = self.server.store().snapshot_min_index(snapshot.index() + 1, Duration::from_millis(50));
        }
    }
}

fn live_allocs(snapshot: &Snapshot) -> u64 {
    snapshot.allocs().filter(|alloc| !alloc.terminal()).count() as u64
}

/// Simulated clients: every node heartbeats at half its TTL, and reports
/// its new allocations running (one update per node, as a client does after
/// starting them). All nodes' updates of a round are submitted before any
/// is waited for, so the server batches them as it would for real clients
/// reporting at once.
fn simulate_clients(server: &Server, node_ids: &[NodeId], done: &AtomicBool) {
    let nodes = server.nodes();
    let mut next_heartbeat: Vec<Instant> = vec![Instant::now(); node_ids.len()];
    let mut seen_index = 0;
    while !done.load(Ordering::Acquire) {
        let now = Instant::now();
        for (node_id, due) in node_ids.iter().zip(next_heartbeat.iter_mut()).filter(|(_, due)| **due <= now) {
            match nodes.update_status(*node_id, NodeStatus::Ready) {
                Ok(response) => *due = now + response.heartbeat_ttl / 2,
                Err(error) => eprintln!("client {node_id}: heartbeat refused: {error}"),
            }
        }
        let snapshot = server.store().snapshot();
        if snapshot.table_indexes().allocs > seen_index {
            seen_index = snapshot.table_indexes().allocs;
            report_started(&nodes, &snapshot);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Reports every pending allocation running, one batched update per node.
fn report_started(nodes: &engine::node::endpoint::NodeEndpoint, snapshot: &Snapshot) {
    let mut by_node: std::collections::BTreeMap<NodeId, Vec<ClientAllocUpdate>> = Default::default();
    for alloc in snapshot.allocs().filter(|alloc| alloc.client_status == ClientStatus::Pending && !alloc.terminal()) {
        by_node.entry(alloc.node_id).or_default().push(ClientAllocUpdate {
            alloc_id: alloc.id,
            node_id: alloc.node_id,
            client_status: ClientStatus::Running,
            client_description: "started".into(),
            services: None,
            checks: None,
            health: None,
            task_states: Default::default(),
        });
    }
    let pending: Vec<_> = by_node
        .into_iter()
        .filter_map(|(node_id, updates)| match nodes.submit_allocs(node_id, updates) {
            Ok(pending) => Some((node_id, pending)),
            Err(error) => {
                eprintln!("client {node_id}: {error}");
                None
            }
        })
        .collect();
    for (node_id, pending) in pending {
        if let Err(error) = pending.wait() {
            eprintln!("client {node_id}: {error}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_workload_asks_for_at_least_100000_allocations() {
        let args = Args::parse_from(["loadgen"]);
        let jobs = workload(&args, false, &mut SmallRng::seed_from_u64(1));
        let desired: u64 = jobs.iter().map(|job| desired_count(job, args.nodes)).sum();
        assert!(desired >= 100_000, "{desired}");
        assert!(jobs.iter().all(|job| job.validate().is_ok()));
    }
}
