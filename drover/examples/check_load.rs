//! What health checks cost the servers: 10,000 service registrations,
//! each with a `tcp` check, run as the agent runs them, and the writes
//! they cause on the server, counted while nothing changes and while 1 %
//! of the checks flap.
//!
//! The parts are the real ones, in one process:
//!
//! - the engine's server (scheduler, node endpoint with its update
//!   batcher, state store), with 100 nodes heartbeating and one service
//!   job of count 10,000 placed by the scheduler;
//! - per allocation, the agent's check planning (`checks::plan`, from the
//!   job's `service` and `check` blocks and the allocation's port) and its
//!   check runner (`checks::run`), whose probes open real TCP connections
//!   to listeners on loopback (one per node, the allocation's port pointed
//!   at it);
//! - the agent's reporting rule: an allocation is reported when one of its
//!   checks changes status (the allocation runner's news), and each node's
//!   changed allocations go in one update per second (the client core's
//!   batching), with their service registrations and check results, to
//!   the node endpoint.
//!
//! Phases: registration (every allocation reported running with its
//! service and its checks pending); settling (every check turns
//! `success`); steady (nothing changes: the writes the checks cause should
//! be zero); flapping (the listener of 1 % of the checks closes and
//! reopens every `--flap-every-secs`: two status changes per flapping
//! check per period). For each phase: the allocation rows written, the
//! write commands that carried them, and the service-table writes.
//!
//! ```sh
//! cargo run --release -p drover --example check_load
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use drover::client::alloc_dir::AllocDir;
use drover::client::checks::{self, CheckNews, PlannedCheck};
use drover::client::services::registered;
use drover::client::task_env::TaskEnv;
use engine::clock::SystemClock;
use engine::server::{Server, ServerConfig};
use engine::state::ClientAllocUpdate;
use engine::structs::{
    AllocId, AllocatedPort, Allocation, CheckKind, CheckResult, ClientStatus, Job, JobType, NetworkResource, Node,
    NodeId, NodeStatus, Port, Resources, Service, ServiceCheck, TaskState, TaskStatus,
};
use tokio::sync::{mpsc, watch};

#[derive(Parser, Debug)]
struct Args {
    /// Service registrations (allocations), each with one check.
    #[arg(long, default_value_t = 10_000)]
    allocs: u32,
    /// Nodes.
    #[arg(long, default_value_t = 100)]
    nodes: u32,
    /// Every check's interval.
    #[arg(long, default_value_t = 10)]
    interval_secs: u64,
    /// How long the steady phase lasts.
    #[arg(long, default_value_t = 120)]
    steady_secs: u64,
    /// How long the flapping phase lasts.
    #[arg(long, default_value_t = 180)]
    flap_secs: u64,
    /// The flapping listener closes, then reopens, each this often.
    #[arg(long, default_value_t = 30)]
    flap_every_secs: u64,
    /// One allocation in this many has its check on the flapping listener.
    #[arg(long, default_value_t = 100)]
    flap_one_in: usize,
}

/// One allocation as the simulated agent holds it.
struct Held {
    alloc: Allocation,
    registrations: Vec<engine::structs::ServiceRegistration>,
    checks: BTreeMap<String, CheckResult>,
    _plans: watch::Sender<Vec<PlannedCheck>>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let server = Arc::new(Server::start(ServerConfig { workers: 2, ..ServerConfig::default() }, SystemClock::shared()));
    let nodes: Vec<Node> = (0..args.nodes)
        .map(|n| {
            let mut node =
                Node::new_ready(NodeId::from_u128(u128::from(n) + 1), "dc1", "", Resources::new(100_000, 100_000, 0));
            node.network.ip = Arc::from("127.0.0.1");
            node
        })
        .collect();
    for node in &nodes {
        server.nodes().register(node.clone())?;
    }
    let heartbeats = spawn_heartbeats(server.clone(), nodes.iter().map(|node| node.id).collect());

    let mut job = Job::new_simple("web", JobType::Service, args.allocs, Resources::new(1, 1, 0));
    let group = &mut job.task_groups[0];
    group.networks = vec![NetworkResource { dynamic_ports: vec![Port::new("http", 0)], ..NetworkResource::default() }];
    let mut service = Service::new("web", "http");
    let interval = Duration::from_secs(args.interval_secs);
    service.checks.push(ServiceCheck::new("alive", CheckKind::Tcp, interval, Duration::from_secs(2)));
    group.tasks[0].services.push(service);
    server.jobs().register(job)?;
    let placed = wait_placed(&server, args.allocs as usize).await;
    println!("placed {} allocations on {} nodes", placed.len(), args.nodes);

    // One listener per node; the flapping one is bound and dropped in turn.
    let mut listeners = BTreeMap::new();
    for node in &nodes {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        listeners.insert(node.id, listener.local_addr()?);
        tokio::spawn(accept_forever(listener));
    }
    let flapping_addr = tokio::net::TcpListener::bind("127.0.0.1:0").await?.local_addr()?;
    let mut flapper: Option<tokio::net::TcpListener> = Some(bind_again(flapping_addr).await?);

    // The agent's side: registrations and planned checks per allocation.
    let by_id: BTreeMap<NodeId, &Node> = nodes.iter().map(|node| (node.id, node)).collect();
    let (news_tx, mut news) = mpsc::unbounded_channel();
    let mut held: BTreeMap<AllocId, Held> = BTreeMap::new();
    let mut owner: BTreeMap<String, AllocId> = BTreeMap::new();
    let mut flapping = 0;
    for (position, stored) in placed.iter().enumerate() {
        let node = by_id[&stored.node_id];
        let mut alloc = Allocation::clone(stored);
        let flaps = position % args.flap_one_in == 0;
        flapping += usize::from(flaps);
        let addr: SocketAddr = if flaps { flapping_addr } else { listeners[&node.id] };
        alloc.ports = vec![AllocatedPort {
            label: Arc::from("http"),
            value: addr.port(),
            to: 0,
            host_ip: Arc::from("127.0.0.1"),
        }];
        let task = alloc.job.task_groups[0].tasks[0].clone();
        let dir = AllocDir::new(std::path::Path::new("/nonexistent"), alloc.id);
        let envs = BTreeMap::from([(task.name.clone(), TaskEnv::new(&alloc, &task, node, &dir))]);
        let states =
            BTreeMap::from([(task.name.clone(), TaskState { state: TaskStatus::Running, ..TaskState::default() })]);
        let registered = registered(&alloc, node, &envs, &states);
        let planned = checks::plan(&alloc, node, &registered, &envs, &BTreeMap::new(), &Default::default());
        let registrations = registered.into_iter().map(|found| found.registration).collect();
        let checks: BTreeMap<String, CheckResult> =
            planned.iter().map(|check| (check.initial.id.clone(), check.initial.clone())).collect();
        for id in checks.keys() {
            owner.insert(id.clone(), alloc.id);
        }
        let (plans, watched) = watch::channel(planned);
        tokio::spawn(checks::run(watched, news_tx.clone(), None));
        held.insert(alloc.id, Held { alloc, registrations, checks, _plans: plans });
    }
    println!("{} checks planned ({} on the flapping listener), interval {:?}", owner.len(), flapping, interval);

    // Registration: every allocation reported running, with its service and pending checks.
    let services_before = server.store().snapshot().table_indexes().services;
    let all: BTreeSet<AllocId> = held.keys().copied().collect();
    let mut registration = report(&server, &held, &all).await;
    registration.services_changed = server.store().snapshot().table_indexes().services > services_before;
    println!("registration: {registration}");

    let mut phase = Phase::new("settling", Duration::from_secs(args.interval_secs + 5), &server);
    let mut next_flap = None;
    let mut dirty: BTreeSet<AllocId> = BTreeSet::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut results = Vec::new();
    loop {
        tokio::select! {
            Some(item) = news.recv() => {
                if let CheckNews::Changed(result) = item {
                    if let Some(alloc_id) = owner.get(&result.id) {
                        if let Some(entry) = held.get_mut(alloc_id) {
                            entry.checks.insert(result.id.clone(), result);
                            dirty.insert(*alloc_id);
                        }
                    }
                }
            }
            Ok((stream, _)) = async { flapper.as_ref().expect("bound").accept().await }, if flapper.is_some() => drop(stream),
            _ = tick.tick() => {
                if !dirty.is_empty() {
                    phase.writes.add(report(&server, &held, &std::mem::take(&mut dirty)).await);
                }
                if next_flap.is_some_and(|at| Instant::now() >= at) {
                    flapper = match flapper.take() {
                        Some(listener) => {
                            drop(listener);
                            None
                        }
                        None => Some(bind_again(flapping_addr).await?),
                    };
                    next_flap = Some(Instant::now() + Duration::from_secs(args.flap_every_secs));
                }
                if phase.over() {
                    results.push(phase.finish(&server));
                    phase = match results.len() {
                        1 => Phase::new("steady", Duration::from_secs(args.steady_secs), &server),
                        2 => {
                            next_flap = Some(Instant::now());
                            Phase::new("flapping", Duration::from_secs(args.flap_secs), &server)
                        }
                        _ => break,
                    };
                }
            }
        }
    }
    println!("\nphase       secs  alloc rows  per min  commands  service writes");
    for result in &results {
        println!("{result}");
    }
    heartbeats.abort();
    Ok(())
}

/// Reports `which` allocations of `held` to the server, one update per
/// node, as the client core does; waits until written. What it wrote.
async fn report(server: &Server, held: &BTreeMap<AllocId, Held>, which: &BTreeSet<AllocId>) -> Writes {
    let mut writes = Writes::default();
    let mut by_node: BTreeMap<NodeId, Vec<ClientAllocUpdate>> = BTreeMap::new();
    for id in which {
        let Some(entry) = held.get(id) else { continue };
        let states =
            BTreeMap::from([("task".to_string(), TaskState { state: TaskStatus::Running, ..TaskState::default() })]);
        by_node.entry(entry.alloc.node_id).or_default().push(ClientAllocUpdate {
            alloc_id: entry.alloc.id,
            node_id: entry.alloc.node_id,
            client_status: ClientStatus::Running,
            client_description: "Tasks are running".into(),
            task_states: states,
            services: Some(entry.registrations.clone()),
            checks: Some(entry.checks.clone()),
            health: None,
        });
    }
    let nodes = server.nodes();
    let pending: Vec<_> = by_node
        .into_iter()
        .filter_map(|(node_id, updates)| {
            let rows = updates.len();
            let submitted = nodes.submit_allocs(node_id, updates);
            submitted.map(|pending| (rows, pending)).map_err(|error| eprintln!("{node_id}: {error}")).ok()
        })
        .collect();
    for (rows, pending) in pending {
        match pending.outcome().await {
            Ok(index) => {
                writes.rows += rows;
                writes.commands.insert(index);
            }
            Err(error) => eprintln!("update refused: {error}"),
        }
    }
    writes
}

/// The writes reports caused: allocation rows, the commands (log
/// indexes) that carried them, and whether the services table changed.
#[derive(Default)]
struct Writes {
    rows: usize,
    commands: BTreeSet<u64>,
    services_changed: bool,
}

impl Writes {
    fn add(&mut self, more: Writes) {
        self.rows += more.rows;
        self.commands.extend(more.commands);
    }
}

impl std::fmt::Display for Writes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} allocation rows in {} commands; services table written: {}",
            self.rows,
            self.commands.len(),
            self.services_changed
        )
    }
}

/// One measured phase.
struct Phase {
    name: &'static str,
    started: Instant,
    length: Duration,
    services_index: u64,
    writes: Writes,
}

impl Phase {
    fn new(name: &'static str, length: Duration, server: &Server) -> Phase {
        println!("{name}: {length:?}");
        let services_index = server.store().snapshot().table_indexes().services;
        Phase { name, started: Instant::now(), length, services_index, writes: Writes::default() }
    }

    fn over(&self) -> bool {
        self.started.elapsed() >= self.length
    }

    fn finish(&mut self, server: &Server) -> String {
        self.writes.services_changed = server.store().snapshot().table_indexes().services > self.services_index;
        let secs = self.started.elapsed().as_secs_f64();
        let per_min = self.writes.rows as f64 * 60.0 / secs;
        format!(
            "{:<10} {:>5.0} {:>11} {:>8.1} {:>9} {:>15}",
            self.name,
            secs,
            self.writes.rows,
            per_min,
            self.writes.commands.len(),
            if self.writes.services_changed { "yes" } else { "no" }
        )
    }
}

async fn wait_placed(server: &Server, count: usize) -> Vec<Arc<Allocation>> {
    loop {
        let snapshot = server.store().snapshot();
        let placed: Vec<Arc<Allocation>> = snapshot.allocs().filter(|alloc| !alloc.terminal()).cloned().collect();
        if placed.len() >= count {
            return placed;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Heartbeats every node at half its TTL, as its agent would.
fn spawn_heartbeats(server: Arc<Server>, nodes: Vec<NodeId>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let mut ttl = Duration::from_secs(10);
            for node in &nodes {
                match server.nodes().update_status(*node, NodeStatus::Ready) {
                    Ok(response) => ttl = ttl.min(response.heartbeat_ttl),
                    Err(error) => eprintln!("heartbeat of {node}: {error}"),
                }
            }
            tokio::time::sleep(ttl / 2).await;
        }
    })
}

async fn accept_forever(listener: tokio::net::TcpListener) {
    while let Ok((stream, _)) = listener.accept().await {
        drop(stream);
    }
}

/// Binds `addr` again (the flapping listener reopening), its accept loop running.
async fn bind_again(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(socket.listen(1024)?)
}
