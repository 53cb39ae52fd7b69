//! `drover server`: the engine behind its client-facing QUIC endpoint and
//! its HTTP API, over durable state when it has a data dir.
//!
//! Start-up with a data dir: recover (the newest valid snapshot, then the
//! log after it, see the `replication` crate), then start the leader
//! services over the log's write path, then bind. Shutdown in reverse:
//! stop serving, stop the leader services (their in-flight evals finish
//! and are written), stop raft, shut the store.
//!
//! A server of a cluster (`--bootstrap-expect`, `--join`) binds its
//! server-to-server endpoint first (raft needs it), opens its data dir
//! without waiting to lead, and starts and stops its leader services as
//! the leadership comes and goes; see [`leadership`].
//!
//! - `leadership.rs`: the leader services, started and stopped with raft's
//!   leadership.
//! - `agents.rs`: calls to agents, through whichever server holds the
//!   node's connection.
//! - `routing.rs`: the client endpoint's route (serve here or forward).
//! - `peer.rs`: the server-to-server calls this server answers.
//! - `report.rs`: the cluster report operators and load tests ask for.
//! - `timers.rs`: the process's `metrics` recorder for the engine's timers.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use engine::clock::SystemClock;
use engine::job_endpoint::JobError;
use engine::node::endpoint::NodeEndpoint;
use engine::node::heartbeat::Heartbeats;
use engine::server::{Server, ServerConfig};
use engine::state::{Command, CommandLog, LeaderHint, LogError, PendingWrite, StateError, Writer};
use engine::structs::Job;
use replication::{ClusterSetup, Durable, DurableConfig, ServerNode};
use transport::message::{ClusterReport, ListenerStats, ReportScope};
use transport::peer::Peers;
use transport::server::{ClientListener, ListenError, Operations};

use transport::tls::TlsMaterial;

use crate::http::{AgentInfo, ApiState};
use crate::listener::HttpServer;

pub mod agents;
pub mod kinds;
pub mod leader_calls;
pub mod leadership;
pub mod peer;
pub mod report;
pub mod routing;
pub mod scheduling;
pub mod timers;

pub use report::{cluster_report, process_cpu_millis, process_memory};

use leadership::Leadership;
use peer::PeerService;
use routing::ClusterRoute;

/// What a server runs with.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// The UDP address the client endpoint binds.
    pub bind: SocketAddr,
    /// The address clients are told (default: the bound one).
    pub advertise: Option<String>,
    /// The engine's settings.
    pub engine: ServerConfig,
    /// This server's TLS material.
    pub tls: TlsMaterial,
    /// The HTTP API, if served.
    pub http: Option<HttpOptions>,
    /// Durable state, or none: everything in memory.
    pub durable: Option<DurableOptions>,
    /// One of several servers (needs `durable`), or none: alone.
    pub cluster: Option<ClusterOptions>,
}

/// How a server is one of a cluster.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// This server's name (`server members`).
    pub name: String,
    /// The UDP address the server-to-server endpoint binds (4648 by default).
    pub peer_bind: SocketAddr,
    /// The `host:port` the other servers reach this one's server-to-server
    /// endpoint at (default: the bound address). Its host is also where
    /// they reach its HTTP API, and its client endpoint unless the server
    /// advertises one.
    pub advertise_peer: Option<String>,
    /// Form a new cluster once this many servers know each other (0: only
    /// join a cluster formed already).
    pub bootstrap_expect: usize,
    /// Server-to-server addresses of other servers, to find the cluster.
    pub join: Vec<String>,
    /// How long a call waits for a leader during an election before it is
    /// refused ([`crate::server::leadership::HOLD`] by default).
    pub hold: std::time::Duration,
}

/// Where and how a server keeps its state on disk.
#[derive(Clone, Debug)]
pub struct DurableOptions {
    /// The server's data dir (`<data_dir>/server`, as Nomad lays it out).
    pub dir: PathBuf,
    /// The log's settings (snapshot interval).
    pub config: DurableConfig,
}

impl DurableOptions {
    /// The server's part of an agent's `data_dir`.
    pub fn under(data_dir: &std::path::Path, config: DurableConfig) -> DurableOptions {
        DurableOptions { dir: data_dir.join("server"), config }
    }
}

/// Why a server did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Its durable state could not be opened or recovered.
    #[error("opening the data dir {dir}: {why}")]
    Durable {
        /// The server's data dir.
        dir: PathBuf,
        /// Why (in the message, so not also a source: a report of the
        /// error chain would say it twice).
        why: replication::DurableError,
    },
    /// A listener could not be bound.
    #[error(transparent)]
    Listen(#[from] ListenError),
    /// The server-to-server endpoint could not be bound.
    #[error(transparent)]
    Peers(#[from] transport::peer::PeerSetupError),
    /// A cluster needs a data dir, a usable advertised address and a node id.
    #[error("{0}")]
    Cluster(String),
}

/// Where and how the HTTP API is served.
#[derive(Clone, Debug)]
pub struct HttpOptions {
    /// The TCP address it binds (4646 by default).
    pub bind: SocketAddr,
    /// HTTPS with the cluster CA (always, but in dev mode).
    pub tls: bool,
    /// Ask HTTPS clients for a certificate of the cluster CA.
    pub verify_clients: bool,
    /// The server's name in `agent/self` and `agent/members`.
    pub name: String,
    /// Its datacenter.
    pub datacenter: String,
    /// Every request needs an ACL token (`acl.enabled`).
    pub acl_enabled: bool,
    /// Connection limits (`[limits]`).
    pub limits: crate::listener::HttpLimits,
}

/// A running server: the engine and its listener.
#[derive(Debug)]
pub struct RunningServer {
    leadership: Arc<Leadership>,
    durable: Option<Arc<Durable>>,
    peers: Option<Arc<Peers>>,
    listener: Arc<ClientListener>,
    http: Option<HttpServer>,
    accepting: tokio::task::JoinHandle<()>,
}

impl RunningServer {
    /// Recovers the durable state (if any), starts the engine and the
    /// listeners (module docs). Call within a multi-threaded tokio runtime.
    pub fn start(options: ServerOptions) -> Result<RunningServer, StartError> {
        timers::installed();
        if let Some(cluster) = &options.cluster {
            return RunningServer::start_clustered(&options, cluster);
        }
        let durable = match &options.durable {
            Some(durable) => Some(Arc::new(open_durable(durable, None)?)),
            None => None,
        };
        let engine = match &durable {
            Some(durable) => Server::start_with(options.engine.clone(), SystemClock::shared(), durable.writer()),
            None => Server::start(options.engine.clone(), SystemClock::shared()),
        };
        let nodes = engine.nodes();
        let leadership = Leadership::single(engine, durable.clone());
        RunningServer::serve(&options, leadership, durable, None, nodes)
    }

    /// Starts a server of a cluster (module docs).
    fn start_clustered(options: &ServerOptions, cluster: &ClusterOptions) -> Result<RunningServer, StartError> {
        let durable_options = options.durable.as_ref().ok_or_else(|| {
            StartError::Cluster("a server of a cluster needs a data dir (data_dir): raft keeps its log there".into())
        })?;
        let handler = Arc::new(PeerService::default());
        let peers = Peers::bind(cluster.peer_bind, &options.tls, handler.clone())?;
        let peer_addr = peers.local_addr().map_err(|error| StartError::Cluster(error.to_string()))?;
        let me = server_node(options, cluster, peer_addr)?;
        std::fs::create_dir_all(&durable_options.dir)
            .map_err(|error| StartError::Cluster(format!("creating {}: {error}", durable_options.dir.display())))?;
        let id = raft_id(&durable_options.dir)?;
        tracing::info!(id, name = %me.name, peer = %me.peer, rpc = %me.rpc, "server-to-server endpoint listening");
        let setup = ClusterSetup {
            membership: Arc::new(replication::Membership::new(id, me)),
            peers: peers.clone(),
            bootstrap_expect: cluster.bootstrap_expect,
            join: cluster.join.clone(),
        };
        let durable = match open_durable(durable_options, Some(setup)) {
            Ok(durable) => Arc::new(durable),
            Err(error) => {
                peers.close();
                return Err(error);
            }
        };
        let _ = handler.durable.set(durable.clone());
        let leadership = Leadership::clustered(options.engine.clone(), durable.clone(), cluster.hold, peers.clone());
        let _ = handler.leadership.set(leadership.clone());
        let clock = SystemClock::shared();
        // The follower's endpoint serves allocation watches from the
        // replicated store; it never writes (the route forwards writes).
        let reads = Writer::through(Arc::new(NotLeader(durable.clone())), durable.store().clone());
        let heartbeats = Heartbeats::new(options.engine.heartbeat.clone(), clock.clone());
        let nodes = NodeEndpoint::new(reads, clock, heartbeats, None);
        let running =
            RunningServer::serve(options, leadership.clone(), Some(durable.clone()), Some(peers.clone()), nodes)?;
        running.listener.route_through(Arc::new(ClusterRoute::new(leadership, durable, peers)));
        let _ = handler.listener.set(running.listener.clone());
        if let Some(router) = running.http.as_ref().map(HttpServer::router) {
            let _ = handler.http.set(router);
        }
        Ok(running)
    }

    /// Binds the listeners over started leader services and state.
    fn serve(
        options: &ServerOptions,
        leadership: Arc<Leadership>,
        durable: Option<Arc<Durable>>,
        peers: Option<Arc<Peers>>,
        nodes: NodeEndpoint,
    ) -> Result<RunningServer, StartError> {
        // A follower's store keeps events too (a leader's core sets the same).
        leadership.store().events().set_capacity(options.engine.event_buffer_size);
        let started = RunningServer::listen(options, &leadership, nodes, durable.as_ref(), peers.as_ref());
        let (listener, http) = match started {
            Ok(listeners) => listeners,
            Err(error) => {
                // Stopping blocks (raft's runtime ends): not on this async worker.
                std::thread::scope(|scope| scope.spawn(|| stop_engine(&leadership, durable.as_deref())).join())
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                if let Some(peers) = &peers {
                    peers.close();
                }
                return Err(error.into());
            }
        };
        let accepting = tokio::spawn({
            let listener = listener.clone();
            async move { listener.run().await }
        });
        Ok(RunningServer { leadership, durable, peers, listener, http, accepting })
    }

    /// Binds the client endpoint and the HTTP API.
    fn listen(
        options: &ServerOptions,
        leadership: &Arc<Leadership>,
        nodes: NodeEndpoint,
        durable: Option<&Arc<Durable>>,
        peers: Option<&Arc<Peers>>,
    ) -> Result<(Arc<ClientListener>, Option<HttpServer>), ListenError> {
        let advertise: Vec<String> = options.advertise.iter().cloned().collect();
        let rpc = options.advertise.clone().unwrap_or_else(|| options.bind.to_string());
        let operations: Arc<dyn Operations> = Arc::new(EngineOperations { leadership: leadership.clone(), rpc });
        let listener = Arc::new(ClientListener::bind(options.bind, &options.tls, nodes, advertise, Some(operations))?);
        let http = match &options.http {
            Some(http) => {
                let reset_file = options.durable.as_ref().map(|durable| durable.dir.join(ACL_BOOTSTRAP_RESET_FILE));
                let parts = (leadership, &listener, durable.cloned(), peers.cloned(), reset_file);
                Some(start_http(http, &options.tls, parts)?)
            }
            None => None,
        };
        Ok((listener, http))
    }

    /// The durable state, if this server has a data dir.
    pub fn durable(&self) -> Option<&Arc<Durable>> {
        self.durable.as_ref()
    }

    /// The HTTP API's bound address, if it is served.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http.as_ref().map(HttpServer::local_addr)
    }

    /// The bound client address.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound endpoint has an address")
    }

    /// The leader services: a server alone always has them.
    ///
    /// # Panics
    /// On a server of a cluster that does not lead now; use
    /// [`RunningServer::leadership`] there.
    pub fn engine(&self) -> Arc<Server> {
        self.leadership.leader().expect("this server does not lead (RunningServer::leadership says when it does)")
    }

    /// The leader services while this server leads, and its store.
    pub fn leadership(&self) -> &Arc<Leadership> {
        &self.leadership
    }

    /// The listener's counters.
    pub fn listener_stats(&self) -> ListenerStats {
        self.listener.stats()
    }

    /// Graceful shutdown: stop accepting connections and calls, let the
    /// engine finish the evals its workers hold (their plans are applied),
    /// stop it, then close every client connection with the shutting-down
    /// code and wait until the clients were told.
    pub async fn shutdown(self) {
        if let Some(http) = self.http {
            http.shutdown().await;
        }
        self.listener.stop_accepting();
        let leadership = self.leadership.clone();
        let durable = self.durable.clone();
        let _ = tokio::task::spawn_blocking(move || stop_engine(&leadership, durable.as_deref())).await;
        if let Some(peers) = &self.peers {
            peers.close();
        }
        self.listener.close().await;
        let _ = self.accepting.await;
    }
}

/// Opens and recovers a data dir on a thread of its own (recovery blocks,
/// and starts raft's runtime, which must not happen on an async worker).
fn open_durable(options: &DurableOptions, cluster: Option<ClusterSetup>) -> Result<Durable, StartError> {
    let dir = options.dir.clone();
    let config = options.config.clone();
    let opened = std::thread::spawn(move || {
        std::fs::create_dir_all(&dir)
            .map_err(|source| replication::DurableError::Io { what: format!("creating {}", dir.display()), source })?;
        let data_dir = storage::DataDir::new(&dir);
        match cluster {
            Some(cluster) => Durable::open_cluster(&data_dir, &config, storage::exit_on_fatal(), cluster),
            None => Durable::open(&data_dir, &config, storage::exit_on_fatal()),
        }
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    let durable = opened.map_err(|why| StartError::Durable { dir: options.dir.clone(), why })?;
    let recovery = durable.recovery();
    for refused in &recovery.refused {
        tracing::warn!(dir = %options.dir.display(), "a snapshot was refused, recovering from the one before it: {refused}");
    }
    let (replayed, took) = durable.replayed();
    tracing::info!(
        dir = %options.dir.display(),
        snapshot = ?recovery.snapshot.as_ref().map(|loaded| loaded.path.display().to_string()),
        snapshot_load_ms = recovery.load_time.as_millis() as u64,
        replayed_entries = replayed,
        store_index = durable.store().latest_index(),
        took_ms = took.as_millis() as u64,
        "durable state recovered"
    );
    Ok(durable)
}

/// Stops the leader services, then raft, then the store (module docs).
/// Blocks: run it off the async workers.
///
/// A server of a cluster stops raft first: its leader services' in-flight
/// writes may never commit (the other servers may be gone already, so there
/// is no quorum), and with raft stopped they fail at once instead of holding
/// the services' threads; the next leader redoes their evals from the store.
fn stop_engine(leadership: &Leadership, durable: Option<&Durable>) {
    match durable {
        Some(durable) if leadership.is_clustered() => {
            leadership.refuse_leading();
            durable.shutdown();
            leadership.close();
        }
        Some(durable) => {
            leadership.close();
            durable.shutdown();
        }
        None => leadership.close(),
    }
    leadership.store().shutdown();
}

/// A command log that takes no write: a follower's endpoint reads only
/// (its calls go to the leader).
#[derive(Debug)]
struct NotLeader(Arc<Durable>);

impl CommandLog for NotLeader {
    fn submit(&self, _command: Command) -> PendingWrite {
        PendingWrite::done(Err(StateError::Log(LogError::NotLeader { leader: leader_hint(&self.0) })))
    }
}

/// The leader a write refused on this server names: the one raft knows of,
/// unless that is this server.
fn leader_hint(durable: &Durable) -> Option<LeaderHint> {
    let (id, node) = durable.leader().filter(|(id, _)| *id != durable.id())?;
    Some(replication::command_log::leader_hint(id, Some(&node)))
}

/// This server as the cluster's membership records it.
fn server_node(options: &ServerOptions, cluster: &ClusterOptions, peer: SocketAddr) -> Result<ServerNode, StartError> {
    let refuse = |why: &str| Err(StartError::Cluster(why.to_string()));
    let peer = match &cluster.advertise_peer {
        Some(advertised) => advertised.clone(),
        None if peer.ip().is_unspecified() => {
            return refuse("bound to every address: set the address the other servers reach this one at (--advertise)")
        }
        None => peer.to_string(),
    };
    let host = match peer.rsplit_once(':') {
        Some((host, _)) => host.to_string(),
        None => return refuse("the advertised server-to-server address is not host:port"),
    };
    if options.bind.port() == 0 && options.advertise.is_none() {
        return refuse("a server of a cluster needs a fixed client port (--port) or an advertised address");
    }
    let rpc = options.advertise.clone().unwrap_or_else(|| format!("{host}:{}", options.bind.port()));
    let http = options.http.as_ref().map(|http| format!("{host}:{}", http.bind.port())).unwrap_or_default();
    Ok(ServerNode { name: cluster.name.clone(), peer, rpc, http })
}

/// This server's raft id, kept in `<dir>/node-id` (made on first start).
fn raft_id(dir: &std::path::Path) -> Result<u64, StartError> {
    let path = dir.join("node-id");
    let failed = |error: std::io::Error| StartError::Cluster(format!("{}: {error}", path.display()));
    match std::fs::read_to_string(&path) {
        Ok(text) => text
            .trim()
            .parse()
            .map_err(|_| StartError::Cluster(format!("{}: {:?} is not a raft id", path.display(), text.trim()))),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let id = rand::random::<u64>().max(2);
            storage::write_atomic(&path, format!("{id}\n").as_bytes(), 0o600).map_err(failed)?;
            Ok(id)
        }
        Err(error) => Err(failed(error)),
    }
}

/// Runs a server until SIGINT or SIGTERM, then shuts it down gracefully:
/// what `drover server` does (and loadgen's spawned server). With
/// `print_address`, prints `listening <addr>` on stdout once bound.
pub fn run_until_signal(options: ServerOptions, print_address: bool) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let mut signals = ShutdownSignals::catch()?;
        let running = RunningServer::start(options)?;
        let addr = running.local_addr();
        tracing::info!(%addr, "drover server listening (QUIC, mutual TLS)");
        if let Some(http) = running.http_addr() {
            tracing::info!(%http, "HTTP API listening");
        }
        if print_address {
            let mut lines = format!("listening {addr}\n");
            if let Some(http) = running.http_addr() {
                lines.push_str(&format!("http {http}\n"));
            }
            // One write; a reader that went away is no reason to stop serving.
            let _ = std::io::Write::write_all(&mut std::io::stdout(), lines.as_bytes());
        }
        let signal = signals.recv().await;
        tracing::info!(
            signal,
            "shutting down: no new connections, finishing in-flight evals, then closing connections"
        );
        let stats = running.listener_stats();
        running.shutdown().await;
        tracing::info!(?stats, "drover server stopped");
        Ok(())
    })
}

/// Nomad's file for an ACL bootstrap reset, in the server's directory of
/// the data dir (`<data_dir>/server/acl-bootstrap-reset`): holding the
/// reset index a refused bootstrap named, it allows one more bootstrap.
pub const ACL_BOOTSTRAP_RESET_FILE: &str = "acl-bootstrap-reset";

/// What the HTTP API serves with: the leader services, the client
/// listener, the durable state, the server-to-server endpoint and the
/// bootstrap reset file.
type HttpParts<'a> =
    (&'a Arc<Leadership>, &'a Arc<ClientListener>, Option<Arc<Durable>>, Option<Arc<Peers>>, Option<PathBuf>);

/// Binds the HTTP API next to the client listener.
fn start_http(options: &HttpOptions, tls: &TlsMaterial, parts: HttpParts<'_>) -> Result<HttpServer, ListenError> {
    let (leadership, listener, durable, peers, acl_bootstrap_reset) = parts;
    let bind_error = |source| ListenError::Bind { addr: options.bind, source };
    let rpc_addr = listener.local_addr().map_err(bind_error)?;
    let https = if options.tls { Some(tls.https_server_config(options.verify_clients)?) } else { None };
    let agent = AgentInfo {
        name: options.name.clone(),
        region: crate::http::nomad::REGION.to_string(),
        datacenter: options.datacenter.clone(),
        rpc_addr,
        http_addr: options.bind,
        tls: options.tls,
    };
    let state = ApiState {
        leadership: leadership.clone(),
        peers,
        listener: Some(listener.clone()),
        agent,
        durable,
        acl_enabled: options.acl_enabled,
        acl_bootstrap_reset,
    };
    if options.acl_enabled {
        tracing::info!("ACLs enabled: every request needs a token (drover acl bootstrap makes the first)");
    }
    let server =
        HttpServer::start(options.bind, https, crate::http::router(state), options.limits).map_err(bind_error)?;
    if !options.tls {
        tracing::warn!(addr = %server.local_addr(), "the HTTP API is served WITHOUT TLS (dev mode)");
    }
    Ok(server)
}

/// SIGTERM and SIGINT, caught from [`ShutdownSignals::catch`] on: made
/// before a process says it is up, so a signal that comes before anyone
/// waits for it is kept rather than ending the process by default.
#[derive(Debug)]
pub struct ShutdownSignals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    /// Catches both signals from now on (inside a tokio runtime).
    pub fn catch() -> anyhow::Result<ShutdownSignals> {
        use anyhow::Context;
        use tokio::signal::unix::{signal, SignalKind};
        Ok(ShutdownSignals {
            terminate: signal(SignalKind::terminate()).context("listening for SIGTERM")?,
            interrupt: signal(SignalKind::interrupt()).context("listening for SIGINT")?,
        })
    }

    /// Waits for the first of them; names the one that came.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.interrupt.recv() => "SIGINT",
        }
    }
}

/// The operator calls over the engine (on the leader: a follower's are
/// forwarded to it).
struct EngineOperations {
    leadership: Arc<Leadership>,
    /// This server's client address, as clients are told it.
    rpc: String,
}

impl Operations for EngineOperations {
    fn submit_job(&self, job: Job) -> Result<u64, JobError> {
        let Some(engine) = self.leadership.leader() else {
            let leader = self.leadership.durable().and_then(|durable| leader_hint(durable));
            return Err(JobError::State(StateError::Log(LogError::NotLeader { leader })));
        };
        engine.jobs().register(job).map(|written| written.index)
    }

    fn report(&self, scope: ReportScope) -> ClusterReport {
        // Read before the report is made, so that two reports bracket what
        // happened between them, not what making them cost.
        let cpu_millis = process_cpu_millis();
        let snapshot = self.leadership.store().snapshot();
        let mut report = cluster_report(&snapshot, SystemClock::shared().now(), scope);
        if let Some(engine) = self.leadership.leader() {
            report.idle = engine.is_idle();
            report.engine = engine.stats();
            // A server of a cluster's workers are its own, not the services'.
            report.engine.workers = self.leadership.worker_stats();
            report.leader = self.rpc.clone();
        }
        (report.rss_bytes, report.peak_rss_bytes) = process_memory();
        report.cpu_millis = cpu_millis;
        report
    }
}
