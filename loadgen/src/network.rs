//! loadgen over QUIC: 10,000 simulated clients, each a real
//! [`drover::client::agent::Agent`] with its own connection, node identity and
//! resumption tickets, spread over a few client endpoints, against a
//! server reached over the network (`--server`) or spawned as a child
//! process on loopback (`--spawn-server`). Jobs go in and the cluster
//! report comes back over the protocol's operator calls.
//!
//! Flapping: every 100 ms each connected client drops with the probability
//! that makes `--flap-rate` of them drop per minute, and stays away for a
//! time drawn from `--flap-duration`; `--storm AT:FRACTION[:AWAY]` drops
//! that fraction at once and brings them all back together.
//!
//! A cluster: `--spawn-server --servers N` starts N server children that
//! form a cluster (each with its own data dir, on fixed loopback ports);
//! the clients know every server and follow the leader on their own, and
//! the operator calls fail over to another server when theirs goes away.
//! `--kill-leader-every D` kills the leader with SIGKILL every D during the
//! run, measures how long until a new leader answers (its leader services
//! restored), and restarts the killed server on its data dir, to rejoin as
//! a follower.
//!
//! `--plot PATH.svg`: one sample a second from the clients' start to the
//! end (`plot.rs`), the leader kills, the storm and the phases marked.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use drover::client::agent::{Agent, AgentCounters, AgentObserver, AgentSettings, HeartbeatOverride};
use engine::structs::{Job, Node};
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use transport::client::{ClientConnection, ClientEndpoints};
use transport::message::ClusterReport;
use transport::tls::{CertificateAuthority, Role, TlsMaterial};

use crate::plot::{Sample, Timeline};
use crate::report::{self, Millis, Report};

/// How long flapping clients stay away: ranges with weights.
#[derive(Clone, Debug)]
pub struct FlapDurations(pub Vec<(Duration, Duration, f64)>);

impl std::str::FromStr for FlapDurations {
    type Err = String;

    /// `MIN-MAX@WEIGHT,...`, e.g. `2s-8s@0.6,30s-60s@0.3,150s-200s@0.1`.
    fn from_str(text: &str) -> Result<Self, String> {
        let mut ranges = Vec::new();
        for part in text.split(',') {
            let (range, weight) = part.split_once('@').unwrap_or((part, "1"));
            let (min, max) = range.split_once('-').ok_or_else(|| format!("{part:?}: expected MIN-MAX@WEIGHT"))?;
            let parse =
                |text: &str| humantime::parse_duration(text.trim()).map_err(|error| format!("{text:?}: {error}"));
            let weight: f64 = weight.trim().parse().map_err(|_| format!("{weight:?} is not a weight"))?;
            let (min, max) = (parse(min)?, parse(max)?);
            if max < min || weight.is_nan() || weight <= 0.0 {
                return Err(format!("{part:?}: MIN must not exceed MAX and the weight must be positive"));
            }
            ranges.push((min, max, weight));
        }
        Ok(FlapDurations(ranges))
    }
}

impl FlapDurations {
    fn sample(&self, rng: &mut SmallRng) -> Duration {
        let total: f64 = self.0.iter().map(|(_, _, weight)| weight).sum();
        let mut pick = rng.random::<f64>() * total;
        for (min, max, weight) in &self.0 {
            if pick < *weight {
                return *min + (*max - *min).mul_f64(rng.random::<f64>());
            }
            pick -= weight;
        }
        self.0.last().map_or(Duration::ZERO, |(min, _, _)| *min)
    }
}

/// `--storm AT:FRACTION[:AWAY]`.
#[derive(Clone, Copy, Debug)]
pub struct Storm {
    /// When, after the workload converged.
    pub at: Duration,
    /// Which share of the clients drops.
    pub fraction: f64,
    /// How long they stay away (default 45 s: past the TTL and grace, so
    /// the servers mark them).
    pub away: Duration,
}

impl std::str::FromStr for Storm {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let mut parts = text.split(':');
        let at = parts.next().ok_or("expected AT:FRACTION[:AWAY]")?;
        let fraction = parts.next().ok_or("expected AT:FRACTION[:AWAY]")?;
        let at = humantime::parse_duration(at).map_err(|error| format!("{at:?}: {error}"))?;
        let fraction: f64 = fraction.parse().map_err(|_| format!("{fraction:?} is not a fraction"))?;
        let away = match parts.next() {
            Some(away) => humantime::parse_duration(away).map_err(|error| format!("{away:?}: {error}"))?,
            None => Duration::from_secs(45),
        };
        if !(0.0..=1.0).contains(&fraction) {
            return Err(format!("{fraction} is not between 0 and 1"));
        }
        Ok(Storm { at, fraction, away })
    }
}

/// What the network mode runs with.
#[derive(Debug)]
pub struct NetworkArgs {
    pub server: Option<SocketAddr>,
    pub tls_files: Option<(PathBuf, PathBuf, PathBuf, PathBuf, PathBuf)>,
    pub endpoints: usize,
    pub flap_rate: f64,
    pub flap_durations: FlapDurations,
    pub storm: Option<Storm>,
    pub duration: Duration,
    pub heartbeat_interval: Option<Duration>,
    pub workers: Option<usize>,
    /// Operators registering jobs at once (`--operators`).
    pub operators: usize,
    pub timeout: Duration,
    /// The spawned server writes its flame graph here when it stops.
    pub flamegraph: Option<PathBuf>,
    /// The command each spawned server runs under (a profiler), if any.
    pub server_wrapper: Option<Vec<String>>,
    /// The spawned server's data dir and snapshot interval (none: in memory).
    pub data_dir: Option<(PathBuf, u64)>,
    /// Servers spawned (a cluster when more than one).
    pub servers: usize,
    /// Kill the leader this often during the run.
    pub kill_leader_every: Option<Duration>,
    /// The spawned servers' event buffer (batches; 0: events off).
    pub event_buffer_size: usize,
    /// The spawned servers' storm guard release rate (`None`: no guard).
    pub storm_guard: Option<f64>,
    /// Draw the run's timeline here (SVG).
    pub plot: Option<PathBuf>,
}

/// Heartbeat and handshake latencies, and the heartbeats counted.
struct Observer {
    heartbeat_rtt_us: Mutex<Histogram<u64>>,
    handshake_us: Mutex<Histogram<u64>>,
    heartbeats: AtomicU64,
    /// Connections made in each second of the run (start-up's are
    /// dropped when the run begins).
    connects: ConnectsPerSecond,
    /// The run's timeline, with `--plot`.
    timeline: Option<Arc<Timeline>>,
}

/// Connections made per second since [`ConnectsPerSecond::restart`]: how
/// bunched a storm's or a killed server's reconnects are.
struct ConnectsPerSecond {
    counts: Mutex<(Instant, Vec<u32>)>,
}

impl ConnectsPerSecond {
    fn new() -> ConnectsPerSecond {
        ConnectsPerSecond { counts: Mutex::new((Instant::now(), Vec::new())) }
    }

    fn count(&self) {
        let mut counts = self.counts.lock();
        let second = counts.0.elapsed().as_secs() as usize;
        if counts.1.len() <= second {
            counts.1.resize(second + 1, 0);
        }
        counts.1[second] += 1;
    }

    fn restart(&self) {
        *self.counts.lock() = (Instant::now(), Vec::new());
    }

    /// The most connections made in one second.
    fn peak(&self) -> u32 {
        self.counts.lock().1.iter().copied().max().unwrap_or(0)
    }
}

impl AgentObserver for Observer {
    fn heartbeat(&self, rtt: Duration) {
        self.heartbeats.fetch_add(1, Ordering::Relaxed);
        let rtt_us = rtt.as_micros() as u64;
        self.heartbeat_rtt_us.lock().saturating_record(rtt_us);
        if let Some(timeline) = &self.timeline {
            timeline.heartbeat(rtt_us);
        }
    }

    fn connected(&self, took: Duration) {
        self.connects.count();
        self.handshake_us.lock().saturating_record(took.as_micros() as u64);
    }
}

/// One simulated client.
struct Client {
    link: watch::Sender<bool>,
    counters: Arc<AgentCounters>,
    /// When a dropped client comes back.
    back_at: Option<Instant>,
    /// Whether it was ever dropped on purpose.
    flapped: bool,
}

/// The spawned server child: killed (SIGTERM, then waited for) on drop.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        // Reaped already (killed): its pid may belong to another process now.
        if let Ok(Some(_)) = self.0.try_wait() {
            return;
        }
        let _ = std::process::Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
        let _ = self.0.wait();
    }
}

/// One spawned server: how to start it, its client address, and its
/// process while it runs.
struct Spawned {
    /// The wrapper's words, then this binary and its server arguments.
    args: Vec<std::ffi::OsString>,
    addr: Option<SocketAddr>,
    child: Option<Child>,
}

impl Spawned {
    /// Starts (or restarts) the server and waits until it listens.
    fn start(&mut self) -> Result<SocketAddr> {
        let (program, args) = self.args.split_first().context("a server command")?;
        let mut command = std::process::Command::new(program);
        command.args(args).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::inherit());
        let mut child = command.spawn().context("spawning the server")?;
        let stdout = child.stdout.take().context("the server's stdout")?;
        let child = Child(child);
        let mut reader = std::io::BufReader::new(stdout);
        // The server's first line says where it listens; a wrapper may
        // print its own lines before it.
        let mut said = String::new();
        let addr: SocketAddr = loop {
            let start = said.len();
            let read = std::io::BufRead::read_line(&mut reader, &mut said).context("reading the server's address")?;
            if let Some(addr) = said[start..].trim().strip_prefix("listening ").and_then(|addr| addr.parse().ok()) {
                break addr;
            }
            if read == 0 {
                bail!("the server did not say where it listens: {said:?}");
            }
        };
        // Keep reading, so the child never writes to a closed pipe.
        std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
        self.addr = Some(addr);
        self.child = Some(child);
        Ok(addr)
    }

    /// SIGKILL, then reap.
    fn kill_9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.0.kill();
            let _ = child.0.wait();
        }
    }
}

/// TLS for the clients and the operator connection, and the spawned servers if any.
struct Cluster {
    addrs: Vec<SocketAddr>,
    client: TlsMaterial,
    operator: TlsMaterial,
    spawned: tokio::sync::Mutex<Vec<Spawned>>,
    _dir: Option<TempDir>,
}

/// A directory removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn free_port(udp: bool) -> Result<u16> {
    Ok(if udp {
        std::net::UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port()
    } else {
        std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port()
    })
}

/// Starts `loadgen --serve-child` (this binary, running the same server
/// code as `drover server`) on loopback with a fresh cluster CA, once or
/// `--servers` times as a cluster, and waits for their addresses.
fn spawn_servers(args: &NetworkArgs) -> Result<Cluster> {
    let dir = std::env::temp_dir().join(format!("loadgen-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let temp = TempDir(dir.clone());
    let ca = CertificateAuthority::generate()?;
    let server = ca.issue(Role::Server, &["127.0.0.1".to_string(), "localhost".to_string()])?;
    let write = |name: &str, text: &str| -> Result<PathBuf> {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    };
    let ca_file = write("ca.pem", &ca.identity().cert_pem)?;
    let cert_file = write("server.pem", &server.cert_pem)?;
    let key_file = write("server-key.pem", &server.key_pem)?;
    let mut common: Vec<std::ffi::OsString> = args.server_wrapper.iter().flatten().map(Into::into).collect();
    common.push(std::env::current_exe().context("finding this binary")?.into());
    common.extend(["--serve-child".into(), "--ca-file".into(), ca_file.into()]);
    common.extend(["--cert-file".into(), cert_file.into(), "--key-file".into(), key_file.into()]);
    if let Some(workers) = args.workers {
        common.extend(["--workers".into(), workers.to_string().into()]);
    }
    if let Some(path) = &args.flamegraph {
        common.extend(["--flamegraph".into(), path.clone().into()]);
    }
    common.extend(["--event-buffer-size".into(), args.event_buffer_size.to_string().into()]);
    match args.storm_guard {
        Some(rate) => common.extend(["--storm-release-rate".into(), rate.to_string().into()]),
        None => common.push("--no-storm-guard".into()),
    }
    let clustered = args.servers > 1;
    let snapshot_every = args.data_dir.as_ref().map_or(20_000, |(_, every)| *every);
    let ports: Vec<(u16, u16)> =
        (0..args.servers).map(|_| Ok((free_port(true)?, free_port(true)?))).collect::<Result<_>>()?;
    let join = ports.iter().map(|(_, peer)| format!("127.0.0.1:{peer}")).collect::<Vec<_>>().join(",");
    let mut spawned = Vec::new();
    for (n, (port, peer)) in ports.iter().enumerate() {
        let mut server_args = common.clone();
        let data_dir = match &args.data_dir {
            Some((data_dir, _)) if clustered => Some(data_dir.join(format!("server-{n}"))),
            Some((data_dir, _)) => Some(data_dir.clone()),
            // A cluster keeps its raft log on disk, always.
            None if clustered => Some(dir.join(format!("server-{n}"))),
            None => None,
        };
        if let Some(data_dir) = data_dir {
            server_args.extend(["--data-dir".into(), data_dir.into()]);
            server_args.extend(["--snapshot-every".into(), snapshot_every.to_string().into()]);
        }
        if clustered {
            server_args.extend([
                "--port".into(),
                port.to_string().into(),
                "--peer-port".into(),
                peer.to_string().into(),
            ]);
            server_args.extend([
                "--servers".into(),
                args.servers.to_string().into(),
                "--join".into(),
                join.clone().into(),
            ]);
        }
        spawned.push(Spawned { args: server_args, addr: None, child: None });
    }
    let mut addrs = Vec::new();
    for server in &mut spawned {
        addrs.push(server.start()?);
    }
    let ca_pem = ca.identity().cert_pem.clone();
    Ok(Cluster {
        addrs,
        client: TlsMaterial { ca_pem: ca_pem.clone(), identity: ca.issue(Role::Client, &[])? },
        operator: TlsMaterial { ca_pem, identity: ca.issue(Role::Operator, &[])? },
        spawned: tokio::sync::Mutex::new(spawned),
        _dir: Some(temp),
    })
}

/// The operator's calls, failing over to the next server when the one it
/// talks to goes away or has no leader for a moment (an election).
struct Operator {
    endpoints: ClientEndpoints,
    addrs: Vec<SocketAddr>,
    current: tokio::sync::Mutex<(usize, Option<ClientConnection>)>,
    /// A server this run killed and has not restarted yet: calls skip it
    /// rather than wait out a connection timeout on it.
    killed: Mutex<Option<SocketAddr>>,
    /// Calls made again after a failure.
    retried: AtomicU64,
}

/// How many times an operator call is tried before the run gives up.
const OPERATOR_TRIES: usize = 300;
/// How long one operator call may take (a report of 10,000 nodes takes
/// tens of milliseconds; a killed server answers never).
const OPERATOR_CALL_TIMEOUT: Duration = Duration::from_secs(5);

impl Operator {
    async fn connect(endpoints: ClientEndpoints, addrs: Vec<SocketAddr>) -> Result<Operator> {
        let first = endpoints.connect(addrs[0]).await.context("the operator connection")?;
        Ok(Operator {
            endpoints,
            addrs,
            current: tokio::sync::Mutex::new((0, Some(first))),
            killed: Mutex::new(None),
            retried: AtomicU64::new(0),
        })
    }

    /// Runs `call` on the current connection; on a failure that another
    /// server (or a moment) may cure, tries again on the next server.
    async fn call<T, F>(&self, call: impl Fn(ClientConnection) -> F) -> Result<T>
    where
        F: std::future::Future<Output = Result<T, transport::client::CallError>>,
    {
        let mut last_error = None;
        for _ in 0..OPERATOR_TRIES {
            let connection = {
                let mut current = self.current.lock().await;
                if current.1.is_none() && self.addrs.len() > 1 && *self.killed.lock() == Some(self.addr_of(&current)) {
                    current.0 += 1;
                }
                if current.1.is_none() {
                    let addr = self.addr_of(&current);
                    let connecting = tokio::time::timeout(Duration::from_secs(3), self.endpoints.connect(addr));
                    current.1 = connecting.await.ok().and_then(Result::ok);
                }
                current.1.clone()
            };
            let outcome = match connection {
                Some(connection) => match tokio::time::timeout(OPERATOR_CALL_TIMEOUT, call(connection)).await {
                    Ok(outcome) => outcome,
                    Err(_) => Err(transport::client::CallError::TimedOut(OPERATOR_CALL_TIMEOUT)),
                },
                None => Err(transport::client::CallError::NoAnswer),
            };
            let error = match outcome {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            let cured_elsewhere = error.refusal().is_none_or(|code| code == transport::message::RefusalCode::NoLeader);
            if self.addrs.len() == 1 && !error.is_transient() || !cured_elsewhere {
                return Err(error.into());
            }
            self.retried.fetch_add(1, Ordering::Relaxed);
            last_error = Some(error);
            move_on(&mut *self.current.lock().await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("the operator call failed {OPERATOR_TRIES} times, last: {last_error:?}")
    }

    /// Moves off `addr` (a server about to be killed) and skips it until
    /// [`Operator::restored`]: calls go to the other servers at once
    /// instead of timing out on a dead one.
    async fn avoid(&self, addr: SocketAddr) {
        let mut current = self.current.lock().await;
        *self.killed.lock() = Some(addr);
        if self.addr_of(&current) == addr {
            move_on(&mut current);
        }
    }

    /// The killed server runs again.
    fn restored(&self) {
        *self.killed.lock() = None;
    }

    fn addr_of(&self, current: &(usize, Option<ClientConnection>)) -> SocketAddr {
        self.addrs[current.0 % self.addrs.len()]
    }

    /// The full report, with its audit: for the record of a run.
    async fn report(&self) -> Result<ClusterReport> {
        self.call(|connection| async move { connection.report().await }).await
    }

    /// The report without its audit: what a poll asks for.
    async fn progress(&self) -> Result<ClusterReport> {
        self.call(|connection| async move { connection.progress().await }).await
    }

    async fn submit_job(&self, job: &Job) -> Result<u64> {
        self.call(|connection| {
            let job = job.clone();
            async move { connection.submit_job(job).await }
        })
        .await
    }

    async fn close(&self) {
        if let Some(connection) = self.current.lock().await.1.take() {
            connection.close();
        }
        self.endpoints.close().await;
    }
}

/// Closes the operator's current connection; the next call goes to the next server.
fn move_on(current: &mut (usize, Option<ClientConnection>)) {
    if let Some(connection) = current.1.take() {
        connection.close();
    }
    current.0 += 1;
}

/// What killing the leader measured.
#[derive(Debug, Default)]
struct Failovers {
    elections: u64,
    failover_ms: Vec<f64>,
}

/// Every `every` during the run: finds the leader (the server that answers
/// the report), kills it, waits until a new leader answers, and restarts
/// the killed server on its data dir.
async fn kill_leaders(
    cluster: &Cluster,
    operator: &Operator,
    phases: &Phases<'_>,
    every: Duration,
    run: Duration,
) -> Result<Failovers> {
    let mut failovers = Failovers::default();
    let started = Instant::now();
    while started.elapsed() + every <= run {
        tokio::time::sleep(every).await;
        let leader = operator.progress().await?.leader;
        let mut spawned = cluster.spawned.lock().await;
        let Some(victim) =
            spawned.iter().position(|server| server.addr.map(|addr| addr.to_string()) == Some(leader.clone()))
        else {
            eprintln!("  kill-leader: the leader {leader:?} is not one of the spawned servers");
            continue;
        };
        eprintln!("  kill-leader: SIGKILL to the leader {leader}");
        if let Some(addr) = spawned[victim].addr {
            operator.avoid(addr).await;
        }
        let killed = Instant::now();
        spawned[victim].kill_9();
        phases.mark("leader killed");
        let new_leader = loop {
            let report = operator.progress().await?;
            if !report.leader.is_empty() && report.leader != leader {
                break report.leader;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let took = killed.elapsed();
        phases.mark(format!("new leader {:.1}s", took.as_secs_f64()));
        eprintln!("  kill-leader: {new_leader} leads after {took:.2?}; restarting {leader}");
        failovers.elections += 1;
        failovers.failover_ms.push(took.as_secs_f64() * 1000.0);
        let restarted = &mut spawned[victim];
        tokio::task::block_in_place(|| restarted.start())?;
        operator.restored();
    }
    Ok(failovers)
}

/// Runs the whole network mode and fills `report`.
pub fn run(args: NetworkArgs, nodes: Vec<Node>, jobs: Vec<Job>, report: &mut Report) -> Result<()> {
    transport::install_crypto_provider();
    let cluster = match (&args.server, &args.tls_files) {
        (Some(addr), Some((ca, cert, key, op_cert, op_key))) => Cluster {
            addrs: vec![*addr],
            client: TlsMaterial::from_files(ca, cert, key)?,
            operator: TlsMaterial::from_files(ca, op_cert, op_key)?,
            spawned: tokio::sync::Mutex::new(Vec::new()),
            _dir: None,
        },
        (Some(_), None) => {
            bail!("--server needs --ca-file, --cert-file, --key-file, --operator-cert and --operator-key")
        }
        (None, _) => spawn_servers(&args)?,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let outcome = runtime.block_on(drive(&args, &cluster, nodes, jobs, report));
    for server in cluster.spawned.blocking_lock().iter() {
        if let Some(Child(child)) = &server.child {
            eprintln!("stopping the spawned server (pid {})", child.id());
        }
    }
    drop(cluster);
    outcome
}

async fn drive(
    args: &NetworkArgs,
    cluster: &Cluster,
    nodes: Vec<Node>,
    jobs: Vec<Job>,
    report: &mut Report,
) -> Result<()> {
    let operator = Operator::connect(ClientEndpoints::bind(1, &cluster.operator)?, cluster.addrs.clone()).await?;
    let timeline = args.plot.as_ref().map(|_| Arc::new(Timeline::new()));
    let observer = Arc::new(Observer {
        heartbeat_rtt_us: Mutex::new(Histogram::new_with_bounds(1, 600_000_000, 3).expect("bounds")),
        handshake_us: Mutex::new(Histogram::new_with_bounds(1, 600_000_000, 3).expect("bounds")),
        heartbeats: AtomicU64::new(0),
        connects: ConnectsPerSecond::new(),
        timeline: timeline.clone(),
    });
    let phases = Phases { timeline: timeline.as_deref(), away: AtomicU64::new(0) };
    let done = AtomicBool::new(false);
    let run = async {
        let outcome = run_clients(args, cluster, &operator, &observer, &phases, nodes, jobs, report).await;
        done.store(true, Ordering::Relaxed);
        outcome
    };
    let sampling = async {
        if let Some(timeline) = &timeline {
            sample_every_second(timeline, &operator, &observer, &phases.away, &done).await;
        }
    };
    let (outcome, ()) = tokio::join!(run, sampling);
    operator.close().await;
    if let (Some(timeline), Some(path)) = (&timeline, &args.plot) {
        let title = format!(
            "loadgen: {} clients, {} server(s){}{}",
            report.nodes,
            cluster.addrs.len(),
            args.kill_leader_every.map_or(String::new(), |every| format!(", leader killed every {every:?}")),
            if args.flap_rate > 0.0 {
                format!(", {}% of clients/min flapping", args.flap_rate * 100.0)
            } else {
                String::new()
            },
        );
        // A run that failed says why first; its timeline is drawn all the same.
        match (timeline.draw(path, &title), &outcome) {
            (Ok(()), _) => eprintln!("the run's timeline is drawn in {}", path.display()),
            (Err(error), Ok(())) => return Err(error),
            (Err(error), Err(_)) => eprintln!("{error:#}"),
        }
    }
    outcome
}

/// What the phases of a run leave for the timeline: its marks, and how
/// many clients are dropped on purpose now.
struct Phases<'a> {
    timeline: Option<&'a Timeline>,
    away: AtomicU64,
}

impl Phases<'_> {
    fn mark(&self, what: impl Into<String>) {
        if let Some(timeline) = self.timeline {
            timeline.mark(what);
        }
    }
}

/// One [`Sample`] a second until `done`: the server's progress report
/// (allocations by status, CPU, memory, its address: a new leader's CPU
/// clock is not compared with the old one's), the heartbeats and their
/// round trips since the last sample, the clients away.
async fn sample_every_second(
    timeline: &Timeline,
    operator: &Operator,
    observer: &Observer,
    away: &AtomicU64,
    done: &AtomicBool,
) {
    let mut last: Option<(f64, u64, u64, u64, String)> = None;
    while !done.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Ok(report) = operator.progress().await else { continue };
        let at = timeline.now();
        let allocs = report.allocs_pending
            + report.allocs_running
            + report.allocs_unknown
            + report.allocs_lost
            + report.allocs_complete
            + report.allocs_failed;
        let beats = observer.heartbeats.load(Ordering::Relaxed);
        if let Some((then, allocs_then, beats_then, cpu_then, leader)) = &last {
            let secs = (at - then).max(1e-3);
            timeline.push(Sample {
                at,
                placements_per_sec: allocs.saturating_sub(*allocs_then) as f64 / secs,
                heartbeats_per_sec: beats.saturating_sub(*beats_then) as f64 / secs,
                rtt_ms: timeline.take_rtt(),
                server_cores: (*leader == report.leader)
                    .then(|| report.cpu_millis.saturating_sub(*cpu_then) as f64 / 1000.0 / secs),
                server_rss_mib: report.rss_bytes as f64 / (1024.0 * 1024.0),
                clients_away: away.load(Ordering::Relaxed),
            });
        }
        last = Some((at, allocs, beats, report.cpu_millis, report.leader));
    }
}

/// The clients, the workload, the run and the report (module docs).
#[allow(clippy::too_many_arguments)]
async fn run_clients(
    args: &NetworkArgs,
    cluster: &Cluster,
    operator: &Operator,
    observer: &Arc<Observer>,
    phases: &Phases<'_>,
    nodes: Vec<Node>,
    jobs: Vec<Job>,
    report: &mut Report,
) -> Result<()> {
    let endpoints = Arc::new(ClientEndpoints::bind(args.endpoints, &cluster.client)?);
    let (stop, stopped) = watch::channel(false);
    let n_nodes = nodes.len();
    let started = Instant::now();
    let mut clients = Vec::with_capacity(n_nodes);
    let mut tasks = Vec::with_capacity(n_nodes);
    let heartbeat_override = HeartbeatOverride::default();
    for (n, node) in nodes.into_iter().enumerate() {
        // Each client starts with a different server: the load spreads.
        let mut servers = cluster.addrs.clone();
        servers.rotate_left(n % cluster.addrs.len());
        let mut settings = AgentSettings::new(servers);
        settings.heartbeat_interval = heartbeat_override.clone();
        let quic = endpoints.own_config()?;
        let (link, link_seen) = watch::channel(true);
        let agent = Agent::new(node, settings, endpoints.clone(), quic, observer.clone()).with_link(link_seen);
        clients.push(Client { link, counters: agent.counters().clone(), back_at: None, flapped: false });
        let stopped = stopped.clone();
        tasks.push(tokio::spawn(async move { agent.run(stopped).await }));
    }
    let ready = wait_for(operator, "every node ready", args.timeout, |cluster| {
        (cluster.nodes_ready as usize >= n_nodes).then_some(())
    })
    .await;
    if let Err(error) = ready {
        let _ = stop.send(true);
        return Err(error);
    }
    report.node_register_per_sec = n_nodes as f64 / started.elapsed().as_secs_f64().max(1e-9);
    eprintln!("{n_nodes} clients connected and ready in {:.2?}", started.elapsed());

    // Node agents first (system jobs), then the workloads, as a real cluster.
    phases.mark("placing");
    let placing = Instant::now();
    let (agents, workloads): (Vec<Job>, Vec<Job>) = jobs.into_iter().partition(|job| job.job_type.is_system_like());
    let before_placing = operator.progress().await?;
    let loadgen_cpu_placing = drover::server::process_cpu_millis();
    let submit_us = Mutex::new(Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("bounds"));
    for batch in [agents, workloads] {
        // Operator `k` registers every `operators`-th job from the k-th, on
        // the one operator connection (its call stream carries them at once).
        let lanes = (0..args.operators.min(batch.len())).map(|lane| {
            let (batch, submit_us) = (&batch, &submit_us);
            async move {
                for job in batch.iter().skip(lane).step_by(args.operators) {
                    let sent = Instant::now();
                    operator.submit_job(job).await.with_context(|| format!("registering {}", job.id))?;
                    submit_us.lock().saturating_record(sent.elapsed().as_micros() as u64);
                }
                Ok::<(), anyhow::Error>(())
            }
        });
        futures::future::try_join_all(lanes).await?;
        wait_for(operator, "every allocation placed and running", args.timeout, converged).await?;
    }
    let submit_us = submit_us.into_inner();
    let placed_in = placing.elapsed();
    eprintln!("  placed and running in {placed_in:.2?}");
    phases.mark("run");
    let loadgen_cpu_placed = drover::server::process_cpu_millis();
    let after_placement = operator.report().await?;
    report.record(&after_placement, placed_in);
    report.network.job_submit_ms = Millis::of(&submit_us);
    if after_placement.leader == before_placing.leader {
        // Otherwise two processes' CPU clocks: no figure.
        report.network.placing_server_cpu_secs =
            after_placement.cpu_millis.saturating_sub(before_placing.cpu_millis) as f64 / 1000.0;
    }
    report.network.placing_loadgen_cpu_secs = loadgen_cpu_placed.saturating_sub(loadgen_cpu_placing) as f64 / 1000.0;
    let loadgen_cpu_before = drover::server::process_cpu_millis();
    // The override holds for the run only: start-up (10,000 handshakes and
    // the placements) is measured at the TTL, as a real cluster starts.
    heartbeat_override.set(args.heartbeat_interval);
    observer.heartbeat_rtt_us.lock().reset();
    observer.connects.restart();
    let beats_before = observer.heartbeats.load(Ordering::Relaxed);
    let run_started = Instant::now();

    let killing = async {
        match args.kill_leader_every {
            Some(every) => kill_leaders(cluster, operator, phases, every, args.duration).await.map(Some),
            None => Ok(None),
        }
    };
    let (storm, failovers) = tokio::join!(flap(args, &mut clients, operator, phases), killing);
    let (storm, failovers) = (storm?, failovers?);
    let heartbeats = observer.heartbeats.load(Ordering::Relaxed) - beats_before;
    let run_secs = run_started.elapsed().as_secs_f64();
    let reconnects_peak_per_sec = observer.connects.peak();
    let loadgen_cpu_millis = drover::server::process_cpu_millis() - loadgen_cpu_before;
    let after_run = operator.progress().await?;
    for client in &clients {
        let _ = client.link.send(true);
    }
    phases.mark("end");
    let settled = Instant::now();
    wait_for(operator, "the cluster converged after the run", args.timeout, |cluster| {
        (converged(cluster).is_some() && cluster.nodes_ready as usize == n_nodes).then_some(())
    })
    .await?;
    let end = operator.report().await?;
    eprintln!("  converged {:.2?} after the last client came back", settled.elapsed());

    let net = &mut report.network;
    net.duration_secs = run_secs;
    net.heartbeats_per_sec = heartbeats as f64 / run_secs.max(1e-9);
    net.server_cpu_secs = after_run.cpu_millis.saturating_sub(after_placement.cpu_millis) as f64 / 1000.0;
    net.loadgen_cpu_secs = loadgen_cpu_millis as f64 / 1000.0;
    net.heartbeats_per_server_cpu_sec = heartbeats as f64 / net.server_cpu_secs.max(1e-3);
    if after_run.leader != after_placement.leader {
        // Two processes' CPU clocks: no figure.
        (net.server_cpu_secs, net.heartbeats_per_server_cpu_sec) = (0.0, 0.0);
    }
    net.heartbeat_rtt_ms = Millis::of(&observer.heartbeat_rtt_us.lock());
    net.handshake_ms = Millis::of(&observer.handshake_us.lock());
    let sum = |read: fn(&AgentCounters) -> u64| clients.iter().map(|client| read(&client.counters)).sum::<u64>();
    net.reconnects = sum(|c| c.reconnects.load(Ordering::Relaxed));
    net.reconnects_peak_per_sec = reconnects_peak_per_sec;
    net.heartbeat_retries = sum(|c| c.heartbeat_retries.load(Ordering::Relaxed));
    net.resyncs = sum(|c| c.resyncs.load(Ordering::Relaxed));
    net.allocs_unknown = sum(|c| c.allocs_seen_unknown.load(Ordering::Relaxed));
    net.allocs_reconnected = sum(|c| c.allocs_reconnected.load(Ordering::Relaxed));
    net.flaps = clients.iter().filter(|client| client.flapped).count() as u64;
    net.wrongly_marked_down = clients
        .iter()
        .filter(|client| !client.flapped && client.counters.marked_away.load(Ordering::Relaxed) > 0)
        .count() as u64;
    net.servers = cluster.addrs.len();
    net.writes_retried = sum(|c| c.writes_retried.load(Ordering::Relaxed)) + operator.retried.load(Ordering::Relaxed);
    if let Some(failovers) = failovers {
        net.leader_elections = failovers.elections;
        let mut sorted = failovers.failover_ms;
        sorted.sort_by(f64::total_cmp);
        net.failover_ms = Some(report::Failover {
            p50: sorted.get(sorted.len() / 2).copied().unwrap_or(0.0),
            max: sorted.last().copied().unwrap_or(0.0),
        });
    }
    if let Some((storm_nodes, convergence)) = storm {
        net.storm_nodes = storm_nodes;
        net.convergence_after_storm_ms = convergence.map(|took| took.as_secs_f64() * 1000.0);
    }
    report.record_end(&end);
    report.check_invariants(&end);

    let _ = stop.send(true);
    for task in tasks {
        let _ = task.await;
    }
    endpoints.close().await;
    Ok(())
}

/// Whether every job has its allocations running and the server has
/// nothing to do now. Evals waiting for a later time are not work yet: a
/// reconnected allocation's disconnect-expiry eval still waits out its
/// `max_client_disconnect`, and will find nothing to do.
fn converged(cluster: &ClusterReport) -> Option<()> {
    let placed = cluster.jobs.iter().all(|job| job.live == job.desired && job.running == job.desired);
    let broker = &cluster.engine.broker;
    let busy =
        broker.total_ready + broker.total_unacked + broker.total_pending > 0 || cluster.engine.plan_queue_depth > 0;
    (placed && !busy && cluster.unknown_on_ready_nodes == 0).then_some(())
}

/// Polls the cluster report's progress (every second: one pass over the
/// state, no audit) until `done` says yes; prints a progress line.
async fn wait_for<T>(
    operator: &Operator,
    what: &str,
    timeout: Duration,
    done: impl Fn(&ClusterReport) -> Option<T>,
) -> Result<T> {
    let started = Instant::now();
    let mut last_line = Instant::now();
    loop {
        let cluster = operator.progress().await.context("the cluster report")?;
        if let Some(value) = done(&cluster) {
            return Ok(value);
        }
        if started.elapsed() > timeout {
            let short: Vec<_> = cluster.jobs.iter().filter(|job| job.running < job.desired).take(5).collect();
            bail!(
                "{what}: not after {timeout:?}: nodes ready {} initializing {} down {} disconnected {}; short jobs {short:?}; engine {:?}",
                cluster.nodes_ready,
                cluster.nodes_initializing,
                cluster.nodes_down,
                cluster.nodes_disconnected,
                cluster.engine
            );
        }
        if last_line.elapsed() > Duration::from_secs(5) {
            let desired: u64 = cluster.jobs.iter().map(|job| job.desired).sum();
            let running: u64 = cluster.jobs.iter().map(|job| job.running.min(job.desired)).sum();
            eprintln!(
                "  {what}: {running}/{desired} running, nodes ready {}/{}, {} connections, {:.0?} elapsed",
                cluster.nodes_ready,
                cluster.nodes_ready + cluster.nodes_initializing + cluster.nodes_down + cluster.nodes_disconnected,
                cluster.listener.connections_open,
                started.elapsed()
            );
            last_line = Instant::now();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The flapping phase for `--duration`; returns the storm's size and the
/// time from its return until the cluster converged.
async fn flap(
    args: &NetworkArgs,
    clients: &mut [Client],
    operator: &Operator,
    phases: &Phases<'_>,
) -> Result<Option<(u64, Option<Duration>)>> {
    let mut rng = SmallRng::seed_from_u64(7);
    let tick = Duration::from_millis(100);
    let per_tick = args.flap_rate * tick.as_secs_f64() / 60.0;
    let started = Instant::now();
    let mut storm_state: Option<(u64, Instant)> = None;
    let mut storm_result = None;
    let mut last_line = Instant::now();
    while started.elapsed() < args.duration {
        let now = Instant::now();
        for client in clients.iter_mut() {
            match client.back_at {
                Some(at) if at <= now => {
                    client.back_at = None;
                    let _ = client.link.send(true);
                }
                None if per_tick > 0.0 && rng.random::<f64>() < per_tick => {
                    client.back_at = Some(now + args.flap_durations.sample(&mut rng));
                    client.flapped = true;
                    let _ = client.link.send(false);
                }
                _ => {}
            }
        }
        if let Some(storm) = args.storm {
            if storm_state.is_none() && started.elapsed() >= storm.at {
                let back = now + storm.away;
                let mut dropped = 0;
                for client in clients.iter_mut().filter(|_| rng.random::<f64>() < storm.fraction) {
                    client.back_at = Some(back);
                    client.flapped = true;
                    let _ = client.link.send(false);
                    dropped += 1;
                }
                eprintln!("  storm: {dropped} clients dropped at once, back in {:?}", storm.away);
                phases.mark(format!("storm: {dropped} away"));
                storm_state = Some((dropped, back));
            }
            if let Some((dropped, back)) = storm_state {
                if storm_result.is_none() && now >= back {
                    // Everyone came back on this tick (above); wait here
                    // for the cluster to converge before going on.
                    for client in clients.iter_mut().filter(|client| client.back_at.is_some_and(|at| at <= now)) {
                        client.back_at = None;
                        let _ = client.link.send(true);
                    }
                    phases.mark("storm back");
                    let away = clients.iter().filter(|client| client.back_at.is_some()).count();
                    phases.away.store(away as u64, Ordering::Relaxed);
                    let n = clients.len() as u64;
                    let converged = wait_for(operator, "convergence after the storm", args.timeout, |cluster| {
                        (converged(cluster).is_some() && cluster.nodes_ready == n).then_some(())
                    })
                    .await;
                    let took = converged.ok().map(|()| back.elapsed());
                    eprintln!("  storm converged after {took:.2?}");
                    storm_result = Some((dropped, took));
                }
            }
        }
        let away = clients.iter().filter(|client| client.back_at.is_some()).count();
        phases.away.store(away as u64, Ordering::Relaxed);
        if last_line.elapsed() > Duration::from_secs(5) {
            eprintln!("  flapping: {away} clients away, {:.0?} of {:?}", started.elapsed(), args.duration);
            last_line = Instant::now();
        }
        tokio::time::sleep(tick).await;
    }
    Ok(storm_result.or(storm_state.map(|(dropped, _)| (dropped, None))))
}
