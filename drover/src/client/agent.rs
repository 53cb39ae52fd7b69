//! The client agent: one node's life against the servers.
//!
//! It connects (capped, jittered backoff between attempts, over the server
//! list it is handed), registers once, heartbeats at the TTL the server
//! hands it, keeps its allocation watch open and runs what the servers
//! place on it with the `mock` driver, reporting every
//! status change. Tasks keep running while the servers are unreachable, as
//! a Nomad client's do; what changed meanwhile is reported once it is back.
//!
//! With `raw_exec` enabled ([`Agent::with_tasks`]) allocations whose
//! tasks use it get an allocation runner each (`alloc_runner.rs`): real
//! processes, the restart policy, task states and events in every report.
//! When the agent starts it re-attaches to the allocations it finds in its
//! data dir. On shutdown their tasks keep running (the next agent
//! re-attaches), except in dev mode, where they are stopped.
//!
//! Garbage collection of allocation directories: an allocation's
//! directories go when the servers no longer list it for this node, or
//! when more than `gc_max_allocs` terminal allocations with directories are
//! kept here, the oldest terminal ones first (Nomad's `gc_max_allocs`).
//! Until then a finished allocation's logs can still be read.
//!
//! The reconnect protocol: after a connection is re-established the agent
//! heartbeats first; if the server answers `initializing` (the node was
//! marked disconnected or down while it was away), it sends a full resync
//! of every allocation it holds, then heartbeats again to become `ready`.
//! A server that does not know the node at all (a fresh in-memory server)
//! gets a new registration; the agent then drops what it ran for the old
//! state, which that server never knew.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::state::ClientAllocUpdate;
use engine::structs::{AllocId, Allocation, ClientStatus, DesiredStatus, Node, NodeStatus, TaskState, RAW_EXEC};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{mpsc, watch};
use transport::client::{Backoff, CallError, ClientConnection, ClientEndpoints};
use transport::message::{AllocsPush, RefusalCode};

use crate::client::alloc_runner::{self, AllocEvent, AllocHandle, RunnerContext};
use crate::client::drivers::mock;
use crate::client::drivers::raw_exec::RawExec;
use crate::client::fs::ClientFs;

/// How an agent behaves.
#[derive(Clone, Debug)]
pub struct AgentSettings {
    /// The servers to try, in order.
    pub servers: Vec<SocketAddr>,
    /// Heartbeat this often instead of at the TTL handed while it is set
    /// (load tests).
    pub heartbeat_interval: HeartbeatOverride,
    /// First reconnect delay ceiling.
    pub backoff_base: Duration,
    /// Largest reconnect delay ceiling.
    pub backoff_cap: Duration,
    /// Give up on one call after this long (the connection is then
    /// considered lost).
    pub call_timeout: Duration,
    /// Send a heartbeat again, on the same connection, when it is not
    /// answered in this long. Well inside the servers' grace (10 s by
    /// default), so a slow server costs a retry, not the node.
    pub heartbeat_timeout: Duration,
}

impl AgentSettings {
    /// Defaults for `servers`: backoff from 250 ms up to 30 s (and never
    /// above half the heartbeat TTL once one is handed), 10 s call timeout,
    /// heartbeats retried after 3 s.
    pub fn new(servers: Vec<SocketAddr>) -> AgentSettings {
        AgentSettings {
            servers,
            heartbeat_interval: HeartbeatOverride::default(),
            backoff_base: Duration::from_millis(250),
            backoff_cap: Duration::from_secs(30),
            call_timeout: Duration::from_secs(10),
            heartbeat_timeout: Duration::from_secs(3),
        }
    }
}

/// The agent's real tasks: the `raw_exec` driver and where allocations live.
#[derive(Clone, Debug)]
pub struct TaskSettings {
    /// The driver.
    pub driver: Arc<RawExec>,
    /// The agent's data directory (`alloc/`, `client/` below it).
    pub data_dir: PathBuf,
    /// Terminal allocations whose directories are kept (Nomad's
    /// `gc_max_allocs`, 50).
    pub gc_max_allocs: usize,
    /// Stop the tasks when the agent stops (dev mode); otherwise they keep
    /// running for the next agent to re-attach.
    pub stop_tasks_on_shutdown: bool,
    /// The logs endpoint's view of the allocations, kept up to date.
    pub client_fs: Option<Arc<ClientFs>>,
}

/// A heartbeat period that replaces the TTL handed while it is set, shared
/// so that a load test switches it for all its agents at once (each takes
/// it at once, not after its current period).
#[derive(Clone, Debug)]
pub struct HeartbeatOverride(Arc<watch::Sender<Option<Duration>>>);

impl Default for HeartbeatOverride {
    fn default() -> HeartbeatOverride {
        HeartbeatOverride(Arc::new(watch::channel(None).0))
    }
}

impl HeartbeatOverride {
    /// Heartbeat every `every`, or at the TTL again with `None`.
    pub fn set(&self, every: Option<Duration>) {
        self.0.send_replace(every);
    }

    fn watch(&self) -> watch::Receiver<Option<Duration>> {
        self.0.subscribe()
    }
}

/// What an agent counts, for logs and loadgen.
#[derive(Debug, Default)]
pub struct AgentCounters {
    /// Connections established (the first included).
    pub connections: AtomicU64,
    /// Connections lost and re-established.
    pub reconnects: AtomicU64,
    /// Heartbeats answered.
    pub heartbeats: AtomicU64,
    /// Heartbeats sent again on the same connection after a timeout or a
    /// failed stream.
    pub heartbeat_retries: AtomicU64,
    /// Calls refused because the cluster had no leader (an election) or
    /// the server lost the leadership while writing; each was made again
    /// (on the same connection, or on the next server).
    pub writes_retried: AtomicU64,
    /// Full resyncs sent after the server answered `initializing`.
    pub resyncs: AtomicU64,
    /// Alloc updates the server accepted.
    pub reports: AtomicU64,
    /// Allocation pushes received.
    pub pushes: AtomicU64,
    /// Allocations this agent ran that a push showed `unknown` (the
    /// servers lost touch with the node).
    pub allocs_seen_unknown: AtomicU64,
    /// Of those, the ones a later push showed running again (reconnected).
    pub allocs_reconnected: AtomicU64,
    /// Times the agent learned the servers had given its node up: a
    /// heartbeat answered `initializing` (the node was disconnected), or a
    /// push showing an allocation it runs `lost` (the node was down; a down
    /// node's heartbeat is answered `ready` at once).
    pub marked_away: AtomicU64,
}

/// Something an agent tells whoever watches it (loadgen's measurements).
pub trait AgentObserver: Send + Sync + 'static {
    /// A heartbeat was answered after `rtt`.
    fn heartbeat(&self, _rtt: Duration) {}
    /// A connection's handshake took `took`.
    fn connected(&self, _took: Duration) {}
}

/// An observer that looks at nothing.
#[derive(Debug)]
pub struct NoObserver;

impl AgentObserver for NoObserver {}

/// One node's agent.
pub struct Agent {
    node: Node,
    settings: AgentSettings,
    endpoints: Arc<ClientEndpoints>,
    quic: quinn::ClientConfig,
    counters: Arc<AgentCounters>,
    observer: Arc<dyn AgentObserver>,
    /// The simulated network: while it is `false` the agent has no
    /// connection and makes none (loadgen's flapping).
    link: Option<watch::Receiver<bool>>,
    /// Real tasks, when `raw_exec` is enabled.
    tasks: Option<TaskSettings>,
    /// Set once the first push of the servers' allocations is applied
    /// (task runners restored dead wait for it before restarting).
    servers_reached: watch::Sender<bool>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").field("node", &self.node.id).field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// The allocations the agent holds, and what it has yet to tell the servers.
#[derive(Debug, Default)]
struct Local {
    allocs: HashMap<AllocId, Held>,
    /// The index of the last push applied; the watch resumes after it.
    last_index: u64,
    /// Whether the servers know this node.
    registered: bool,
    /// The heartbeat TTL last handed: reconnect attempts stay below half of it.
    heartbeat_ttl: Option<Duration>,
    /// The servers' client addresses as the last heartbeat reply listed
    /// them (the leader's first); reconnects go through these once known.
    servers: Vec<SocketAddr>,
}

/// Between attempts: the reconnect backoff, and the jitter of heartbeat retries.
struct Pacing {
    backoff: Backoff,
    rng: SmallRng,
}

/// One allocation on the agent.
#[derive(Debug)]
struct Held {
    alloc: Arc<Allocation>,
    status: ClientStatus,
    description: String,
    /// Every task's state (real tasks only).
    task_states: BTreeMap<String, TaskState>,
    /// Whether the servers have this status.
    reported: bool,
    /// What runs it.
    runner: Runner,
    /// A push showed it `unknown` since it last ran.
    seen_unknown: bool,
    /// When it became terminal here (garbage collection order).
    terminal_since: Option<Instant>,
}

impl Held {
    /// An allocation as the servers have it, with nothing running.
    fn idle(alloc: Arc<Allocation>) -> Held {
        let status = alloc.client_status;
        Held {
            task_states: alloc.task_states.clone(),
            alloc,
            status,
            description: String::new(),
            reported: true,
            runner: Runner::None,
            seen_unknown: false,
            terminal_since: Some(Instant::now()),
        }
    }
}

/// What runs an allocation's tasks.
#[derive(Debug)]
enum Runner {
    /// Nothing (finished, or never run here).
    None,
    /// The mock driver's timer, if it has one.
    Mock(Option<tokio::task::AbortHandle>),
    /// An allocation runner with real tasks.
    Tasks(AllocHandle),
}

impl Runner {
    /// Stops the tasks; the mock driver's at once, real ones through
    /// their kill sequence (their end is reported when it comes). Returns
    /// whether the allocation ended here and now.
    fn stop(&mut self) -> bool {
        match std::mem::replace(self, Runner::None) {
            Runner::Tasks(handle) => {
                handle.stop();
                *self = Runner::Tasks(handle);
                false
            }
            Runner::Mock(Some(timer)) => {
                timer.abort();
                true
            }
            Runner::Mock(None) | Runner::None => true,
        }
    }

    /// Stops the tasks and removes the allocation's directories.
    fn destroy(self) {
        match self {
            Runner::Tasks(handle) => handle.destroy(),
            Runner::Mock(Some(timer)) => timer.abort(),
            Runner::Mock(None) | Runner::None => {}
        }
    }
}

/// Why a session with a server ended.
enum SessionEnd {
    /// The agent was told to stop.
    Stopped,
    /// The connection (or the server's state) is gone; reconnect.
    Lost(String),
}

impl Agent {
    /// An agent for `node`, connecting from `endpoints` with `quic`.
    pub fn new(
        node: Node,
        settings: AgentSettings,
        endpoints: Arc<ClientEndpoints>,
        quic: quinn::ClientConfig,
        observer: Arc<dyn AgentObserver>,
    ) -> Agent {
        Agent {
            node,
            settings,
            endpoints,
            quic,
            counters: Arc::new(AgentCounters::default()),
            observer,
            link: None,
            tasks: None,
            servers_reached: watch::Sender::new(false),
        }
    }

    /// The agent running `raw_exec` tasks as `tasks` says.
    pub fn with_tasks(mut self, tasks: TaskSettings) -> Agent {
        self.tasks = Some(tasks);
        self
    }

    /// The agent with a simulated network link: when `link` goes `false`
    /// it closes its connection (its tasks keep running) and reconnects
    /// only once it is `true` again.
    pub fn with_link(mut self, link: watch::Receiver<bool>) -> Agent {
        self.link = Some(link);
        self
    }

    /// What the agent counted.
    pub fn counters(&self) -> &Arc<AgentCounters> {
        &self.counters
    }

    /// Runs until `stop` is set: connects, serves a session, reconnects
    /// with backoff when it is lost. Tasks are stopped at the end.
    pub async fn run(&self, mut stop: watch::Receiver<bool>) {
        let mut pacing = Pacing {
            backoff: Backoff::new(self.settings.backoff_base, self.settings.backoff_cap),
            rng: SmallRng::seed_from_u64(self.node.id.0.as_u128() as u64),
        };
        let (ended_tx, mut ended_rx) = mpsc::unbounded_channel();
        let mut local = Local::default();
        let runners = self.tasks.as_ref().map(|tasks| {
            Arc::new(RunnerContext {
                driver: tasks.driver.clone(),
                node: self.node.clone(),
                data_dir: tasks.data_dir.clone(),
                events: ended_tx.clone(),
                servers_reached: self.servers_reached.subscribe(),
            })
        });
        if let Some(runners) = &runners {
            self.restore(runners, &mut local);
        }
        let mut server = 0usize;
        let mut link = self.link.clone();
        while !stop_requested(&stop) {
            if let Some(link) = &mut link {
                tokio::select! {
                    _ = link.wait_for(|up| *up) => {}
                    _ = stopped(&mut stop) => break,
                }
            }
            let servers = if local.servers.is_empty() { &self.settings.servers } else { &local.servers };
            let addr = servers[server % servers.len()];
            let started = Instant::now();
            let connected = tokio::select! {
                connected = self.call(self.endpoints.connect_with(self.quic.clone(), addr)) => connected,
                _ = stopped(&mut stop) => break,
            };
            let end = match connected {
                Ok(connection) => {
                    self.observer.connected(started.elapsed());
                    if self.counters.connections.fetch_add(1, Ordering::Relaxed) > 0 {
                        self.counters.reconnects.fetch_add(1, Ordering::Relaxed);
                    }
                    self.link_logs(Some(&connection));
                    let session = self.session(
                        &connection,
                        &mut local,
                        (&ended_tx, runners.as_ref()),
                        &mut ended_rx,
                        &mut stop,
                        &mut pacing,
                    );
                    let end = tokio::select! {
                        end = session => end,
                        _ = link_down(&mut link) => SessionEnd::Lost("the network link went down".to_string()),
                    };
                    self.link_logs(None);
                    connection.close();
                    end
                }
                Err(error) => SessionEnd::Lost(format!("connecting to {addr}: {error}")),
            };
            match end {
                SessionEnd::Stopped => break,
                SessionEnd::Lost(why) => {
                    tracing::info!(node = %self.node.id, %why, "lost the server; reconnecting");
                    server += 1;
                    // Back before the servers give up on the node, if they will let us in.
                    let cap = self.settings.backoff_cap;
                    pacing.backoff.set_cap(local.heartbeat_ttl.map_or(cap, |ttl| (ttl / 2).min(cap)));
                    let delay = pacing.backoff.next_delay(&mut pacing.rng);
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = stopped(&mut stop) => break,
                    }
                }
            }
        }
        self.shut_down(local).await;
    }

    /// The agent stops: the mock driver's timers end; real tasks keep
    /// running for the next agent, or are stopped (dev mode).
    async fn shut_down(&self, local: Local) {
        let stop_tasks = self.tasks.as_ref().is_some_and(|tasks| tasks.stop_tasks_on_shutdown);
        let mut stopping = Vec::new();
        for (_, held) in local.allocs {
            match held.runner {
                Runner::Tasks(handle) if stop_tasks => {
                    handle.stop();
                    stopping.push(handle.finished());
                }
                Runner::Tasks(handle) => handle.detach(),
                Runner::Mock(Some(timer)) => timer.abort(),
                Runner::Mock(None) | Runner::None => {}
            }
        }
        for finished in stopping {
            finished.await;
        }
    }

    /// Re-attaches to the allocations a previous agent left in the data
    /// dir; they are reported once connected, and stopped then if the
    /// servers no longer want them.
    fn restore(&self, runners: &Arc<RunnerContext>, local: &mut Local) {
        for alloc_id in crate::client::alloc_dir::AllocDir::existing(&runners.data_dir) {
            let Some((alloc, handle)) = alloc_runner::restore(runners, alloc_id) else { continue };
            self.note_logs(&alloc, &BTreeMap::new());
            local.allocs.insert(
                alloc_id,
                Held {
                    status: ClientStatus::Pending,
                    description: "re-attaching after an agent restart".to_string(),
                    task_states: BTreeMap::new(),
                    alloc,
                    reported: true,
                    runner: Runner::Tasks(handle),
                    seen_unknown: false,
                    terminal_since: None,
                },
            );
        }
        if !local.allocs.is_empty() {
            tracing::info!(allocs = local.allocs.len(), "restored allocations from the data dir");
        }
    }

    /// One connection's life: (re-)register if needed, heartbeat, resync
    /// when asked, then serve pushes, task ends and heartbeats until the
    /// connection is lost or the agent stops.
    async fn session(
        &self,
        connection: &ClientConnection,
        local: &mut Local,
        (ended_tx, runners): (&mpsc::UnboundedSender<AllocEvent>, Option<&Arc<RunnerContext>>),
        ended_rx: &mut mpsc::UnboundedReceiver<AllocEvent>,
        stop: &mut watch::Receiver<bool>,
        pacing: &mut Pacing,
    ) -> SessionEnd {
        let lost = |error: CallError| {
            if error.refusal() == Some(RefusalCode::NoLeader) {
                self.counters.writes_retried.fetch_add(1, Ordering::Relaxed);
            }
            SessionEnd::Lost(error.to_string())
        };
        if !local.registered {
            if let Err(error) = self.register(connection, local).await {
                return lost(error);
            }
        }
        let mut reply = match self.first_heartbeat(connection, local, pacing).await {
            Err(error) if error.refusal() == Some(RefusalCode::UnknownNode) => {
                if let Err(error) = self.register(connection, local).await {
                    return lost(error);
                }
                match self.first_heartbeat(connection, local, pacing).await {
                    Ok(reply) => reply,
                    Err(error) => return lost(error),
                }
            }
            Err(error) => return lost(error),
            Ok(reply) => reply,
        };
        pacing.backoff.reset();
        let mut watch =
            match self.call(connection.watch_allocs(self.node.id, self.node.secret_id, local.last_index)).await {
                Ok(watch) => watch,
                Err(error) => return lost(error),
            };
        if reply.status == NodeStatus::Initializing {
            self.counters.marked_away.fetch_add(u64::from(local.last_index > 0), Ordering::Relaxed);
            if let Err(error) = self.resync(connection, local).await {
                return lost(error);
            }
            reply = match self.heartbeat(connection, local).await {
                Ok(reply) => reply,
                Err(error) => return lost(error),
            };
        } else if let Err(error) = self.report(connection, local).await {
            return lost(error);
        }
        let mut period = self.settings.heartbeat_interval.watch();
        let mut next_heartbeat = tokio::time::Instant::now() + interval(&period, reply.heartbeat_ttl);
        let mut unanswered = 0;
        loop {
            tokio::select! {
                Ok(()) = period.changed() => {
                    let ttl = local.heartbeat_ttl.unwrap_or(reply.heartbeat_ttl);
                    next_heartbeat = next_heartbeat.min(tokio::time::Instant::now() + interval(&period, ttl));
                }
                _ = tokio::time::sleep_until(next_heartbeat) => {
                    match self.heartbeat(connection, local).await {
                        Ok(reply) if reply.status == NodeStatus::Initializing => {
                            self.counters.marked_away.fetch_add(1, Ordering::Relaxed);
                            if let Err(error) = self.resync(connection, local).await {
                                return lost(error);
                            }
                            next_heartbeat = tokio::time::Instant::now();
                        }
                        Ok(reply) => {
                            unanswered = 0;
                            next_heartbeat = tokio::time::Instant::now() + interval(&period, reply.heartbeat_ttl)
                        }
                        // A slow server or a reset stream: the connection
                        // lives, so try again on it (after 0.5-1.5 s) rather
                        // than queue for a new handshake. A server that
                        // answers nothing several times in a row is gone (a
                        // killed process sends no close): try the next one.
                        // Refusals for want of a leader count too: a server
                        // that stays without one (it is cut off, or has not
                        // caught up since its restart) is left for another.
                        Err(error) if error.is_transient() && unanswered + 1 < MAX_UNANSWERED => {
                            unanswered += 1;
                            tracing::debug!(node = %self.node.id, %error, "heartbeat not answered; retrying");
                            if error.refusal() == Some(RefusalCode::NoLeader) {
                                self.counters.writes_retried.fetch_add(1, Ordering::Relaxed);
                            }
                            self.counters.heartbeat_retries.fetch_add(1, Ordering::Relaxed);
                            next_heartbeat = tokio::time::Instant::now() + retry_pause(&mut pacing.rng);
                        }
                        Err(error) => return lost(error),
                    }
                }
                push = watch.next() => {
                    let push = match push {
                        Ok(push) => push,
                        Err(error) => return lost(error),
                    };
                    self.counters.pushes.fetch_add(1, Ordering::Relaxed);
                    self.apply_push(local, push, ended_tx, runners);
                    if !*self.servers_reached.borrow() {
                        self.servers_reached.send_replace(true);
                    }
                    self.collect_garbage(local);
                    if let Err(error) = self.report(connection, local).await {
                        return lost(error);
                    }
                }
                Some(event) = ended_rx.recv() => {
                    self.alloc_event(local, event);
                    while let Ok(event) = ended_rx.try_recv() {
                        self.alloc_event(local, event);
                    }
                    self.collect_garbage(local);
                    if let Err(error) = self.report(connection, local).await {
                        return lost(error);
                    }
                }
                _ = stopped(stop) => return SessionEnd::Stopped,
            }
        }
    }

    async fn call<T>(&self, call: impl std::future::Future<Output = Result<T, CallError>>) -> Result<T, CallError> {
        within(self.settings.call_timeout, call).await
    }

    async fn heartbeat(
        &self,
        connection: &ClientConnection,
        local: &mut Local,
    ) -> Result<transport::message::NodeReply, CallError> {
        let started = Instant::now();
        let call = connection.heartbeat(self.node.id, self.node.secret_id, NodeStatus::Ready);
        let reply = within(self.settings.heartbeat_timeout, call).await?;
        self.observer.heartbeat(started.elapsed());
        self.counters.heartbeats.fetch_add(1, Ordering::Relaxed);
        if !reply.heartbeat_ttl.is_zero() {
            local.heartbeat_ttl = Some(reply.heartbeat_ttl);
        }
        let servers: Vec<SocketAddr> = reply
            .servers
            .iter()
            .filter_map(|addr| addr.parse::<SocketAddr>().ok())
            .filter(|addr| !addr.ip().is_unspecified() && addr.port() != 0)
            .collect();
        if !servers.is_empty() {
            local.servers = servers;
        }
        Ok(reply)
    }

    /// A session's first heartbeat: a slow answer is asked for again on the
    /// same connection (three tries in all) before the handshake is given up.
    async fn first_heartbeat(
        &self,
        connection: &ClientConnection,
        local: &mut Local,
        pacing: &mut Pacing,
    ) -> Result<transport::message::NodeReply, CallError> {
        let mut tries = 1;
        loop {
            match self.heartbeat(connection, local).await {
                Err(error) if error.is_transient() && tries < 3 => {
                    tries += 1;
                    self.counters.heartbeat_retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(retry_pause(&mut pacing.rng)).await;
                }
                outcome => return outcome,
            }
        }
    }

    /// Registers as `initializing` (the first heartbeat makes the node
    /// ready, after a resync if the servers hold allocations for it); a
    /// server that did not know the node never knew the allocations the
    /// agent ran, so they are dropped (their tasks stopped).
    async fn register(&self, connection: &ClientConnection, local: &mut Local) -> Result<(), CallError> {
        let mut node = self.node.clone();
        node.status = NodeStatus::Initializing;
        self.call(connection.register(node)).await?;
        if local.registered {
            tracing::warn!(node = %self.node.id, "the server did not know this node; registered again and dropped its old allocations");
        }
        if local.registered {
            for (_, held) in local.allocs.drain() {
                held.runner.destroy();
            }
        }
        local.last_index = 0;
        local.registered = true;
        Ok(())
    }

    /// Tells the server the status of every allocation the agent holds
    /// (the reconnect protocol's resync).
    async fn resync(&self, connection: &ClientConnection, local: &mut Local) -> Result<(), CallError> {
        for held in local.allocs.values_mut() {
            held.reported = false;
        }
        self.counters.resyncs.fetch_add(1, Ordering::Relaxed);
        self.report(connection, local).await
    }

    /// Sends every status the servers do not have yet. An allocation the
    /// server no longer places here is dropped from the agent.
    async fn report(&self, connection: &ClientConnection, local: &mut Local) -> Result<(), CallError> {
        let updates: Vec<ClientAllocUpdate> = local
            .allocs
            .values()
            .filter(|held| !held.reported)
            .map(|held| ClientAllocUpdate {
                alloc_id: held.alloc.id,
                node_id: self.node.id,
                client_status: held.status,
                client_description: held.description.clone(),
                task_states: held.task_states.clone(),
            })
            .collect();
        if updates.is_empty() {
            return Ok(());
        }
        let ids: Vec<AllocId> = updates.iter().map(|update| update.alloc_id).collect();
        match self.call(connection.update_allocs(self.node.id, self.node.secret_id, updates)).await {
            Ok(_) => {
                self.counters.reports.fetch_add(1, Ordering::Relaxed);
                for id in ids {
                    if let Some(held) = local.allocs.get_mut(&id) {
                        held.reported = true;
                    }
                }
                Ok(())
            }
            Err(error) if error.refusal() == Some(RefusalCode::NotItsAllocation) => {
                // The servers' state moved on (an allocation was removed):
                // start the watch over to learn the whole list again.
                local.last_index = 0;
                Err(error)
            }
            Err(error) => Err(error),
        }
    }

    /// Brings the agent's allocations in line with a push: starts what it
    /// should run, stops what the servers stopped (reported complete, never
    /// resumed), forgets what is no longer placed here.
    fn apply_push(
        &self,
        local: &mut Local,
        push: AllocsPush,
        ended_tx: &mpsc::UnboundedSender<AllocEvent>,
        runners: Option<&Arc<RunnerContext>>,
    ) {
        local.last_index = push.index;
        let listed: std::collections::HashSet<AllocId> = push.allocs.iter().map(|alloc| alloc.id).collect();
        let forgotten: Vec<AllocId> = local.allocs.keys().filter(|id| !listed.contains(id)).copied().collect();
        for id in forgotten {
            if let Some(held) = local.allocs.remove(&id) {
                held.runner.destroy();
                self.forget_logs(id);
            }
        }
        let mut lost_here = false;
        for alloc in push.allocs {
            let wants_run = alloc.desired_status == DesiredStatus::Run;
            match local.allocs.get_mut(&alloc.id) {
                Some(held) => {
                    lost_here |= alloc.client_status == ClientStatus::Lost
                        && held.alloc.client_status != ClientStatus::Lost
                        && !held.status.is_terminal();
                    if alloc.client_status == ClientStatus::Unknown && !held.seen_unknown && !held.status.is_terminal()
                    {
                        held.seen_unknown = true;
                        self.counters.allocs_seen_unknown.fetch_add(1, Ordering::Relaxed);
                    } else if alloc.client_status == ClientStatus::Running && held.seen_unknown {
                        held.seen_unknown = false;
                        self.counters.allocs_reconnected.fetch_add(1, Ordering::Relaxed);
                    }
                    if !wants_run && !held.status.is_terminal() && held.runner.stop() {
                        held.status = ClientStatus::Complete;
                        held.description = "stopped by the servers".to_string();
                        held.reported = false;
                        held.terminal_since = Some(Instant::now());
                    }
                    held.alloc = alloc;
                }
                None if wants_run && !alloc.client_status.is_terminal() => {
                    let held = self.start(alloc, ended_tx, runners);
                    local.allocs.insert(held.alloc.id, held);
                }
                None => {
                    // Stopped or finished before this agent ran it: hold it
                    // as the servers have it, nothing to run or report.
                    local.allocs.insert(alloc.id, Held::idle(alloc));
                }
            }
        }
        if lost_here {
            self.counters.marked_away.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Starts an allocation new to this agent with the driver its tasks
    /// name: real tasks through an allocation runner, the mock driver's
    /// light path, or failed when this agent does not offer the driver.
    fn start(
        &self,
        alloc: Arc<Allocation>,
        ended_tx: &mpsc::UnboundedSender<AllocEvent>,
        runners: Option<&Arc<RunnerContext>>,
    ) -> Held {
        let tasks = alloc.job.group(&alloc.task_group).map(|group| group.tasks.as_slice()).unwrap_or_default();
        let real = tasks.iter().any(|task| task.driver == RAW_EXEC);
        let mut held = Held {
            status: ClientStatus::Pending,
            description: String::new(),
            task_states: BTreeMap::new(),
            alloc: alloc.clone(),
            reported: false,
            runner: Runner::None,
            seen_unknown: false,
            terminal_since: None,
        };
        match (real, runners) {
            (true, Some(runners)) if tasks.iter().all(|task| task.driver == RAW_EXEC) => {
                self.note_logs(&alloc, &BTreeMap::new());
                held.description = "starting tasks".to_string();
                held.runner = Runner::Tasks(alloc_runner::start(runners, alloc));
            }
            (true, _) => {
                held.status = ClientStatus::Failed;
                held.description = match tasks.iter().find(|task| task.driver != RAW_EXEC) {
                    Some(other) if runners.is_some() => {
                        format!("driver {:?} cannot run beside raw_exec in one group", other.driver)
                    }
                    _ => "driver \"raw_exec\" is not enabled on this node".to_string(),
                };
                held.terminal_since = Some(Instant::now());
            }
            (false, _) => {
                let (status, description, timer) = mock::start(&alloc, ended_tx);
                held.status = status;
                held.description = description;
                held.runner = Runner::Mock(timer);
            }
        }
        held
    }

    /// Records an allocation's new status; reported with the next report.
    fn alloc_event(&self, local: &mut Local, event: AllocEvent) {
        let Some(held) = local.allocs.get_mut(&event.alloc_id) else { return };
        let real = matches!(held.runner, Runner::Tasks(_));
        if held.status.is_terminal() && !real {
            return;
        }
        if let Runner::Mock(_) = held.runner {
            held.runner = Runner::None;
        }
        if !event.task_states.is_empty() {
            self.note_logs(&held.alloc, &event.task_states);
        }
        if held.status != event.status && event.status.is_terminal() {
            held.terminal_since = Some(Instant::now());
        }
        held.status = event.status;
        held.description = event.description;
        held.task_states = event.task_states;
        held.reported = false;
    }

    /// Removes the directories of the oldest terminal allocations beyond
    /// `gc_max_allocs` (each stops its tasks first, should any still run).
    fn collect_garbage(&self, local: &mut Local) {
        let Some(tasks) = &self.tasks else { return };
        let mut finished: Vec<(Instant, AllocId)> = local
            .allocs
            .iter()
            .filter(|(_, held)| matches!(held.runner, Runner::Tasks(_)) && held.status.is_terminal())
            .filter_map(|(id, held)| Some((held.terminal_since?, *id)))
            .collect();
        if finished.len() <= tasks.gc_max_allocs {
            return;
        }
        finished.sort_unstable();
        let excess = finished.len() - tasks.gc_max_allocs;
        for (_, id) in finished.into_iter().take(excess) {
            if let Some(held) = local.allocs.get_mut(&id) {
                std::mem::replace(&mut held.runner, Runner::None).destroy();
                self.forget_logs(id);
            }
        }
    }

    /// Tells the logs endpoint about an allocation's tasks.
    fn note_logs(&self, alloc: &Allocation, states: &BTreeMap<String, TaskState>) {
        if let Some(fs) = self.tasks.as_ref().and_then(|tasks| tasks.client_fs.as_ref()) {
            fs.note(alloc, states);
        }
    }

    /// Tells the logs endpoint which connection checks its callers' tokens.
    fn link_logs(&self, connection: Option<&ClientConnection>) {
        if let Some(fs) = self.tasks.as_ref().and_then(|tasks| tasks.client_fs.as_ref()) {
            fs.link(connection.map(|connection| crate::client::fs::ServerLink {
                connection: connection.clone(),
                node_id: self.node.id,
                secret_id: self.node.secret_id,
            }));
        }
    }

    fn forget_logs(&self, alloc_id: AllocId) {
        if let Some(fs) = self.tasks.as_ref().and_then(|tasks| tasks.client_fs.as_ref()) {
            fs.forget(alloc_id);
        }
    }
}

/// Resolves once `stop` is set (or its sender is gone).
/// The heartbeat period: the override, or the TTL handed (a zero TTL, a
/// node down, means register again at once).
fn interval(period: &watch::Receiver<Option<Duration>>, ttl: Duration) -> Duration {
    period.borrow().unwrap_or(ttl)
}

/// How long to wait before sending an unanswered heartbeat again: 0.5-1.5 s.
/// Heartbeats in a row a connection may leave unanswered (or refused for
/// want of a leader) before the agent gives it up for the next server.
const MAX_UNANSWERED: u32 = 3;

fn retry_pause(rng: &mut SmallRng) -> Duration {
    Duration::from_millis(500).mul_f64(1.0 + 2.0 * rng.random::<f64>())
}

/// `call`'s outcome, or [`CallError::TimedOut`] after `limit`.
async fn within<T>(
    limit: Duration,
    call: impl std::future::Future<Output = Result<T, CallError>>,
) -> Result<T, CallError> {
    tokio::time::timeout(limit, call).await.unwrap_or(Err(CallError::TimedOut(limit)))
}

async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// Whether `stop` is set now.
fn stop_requested(stop: &watch::Receiver<bool>) -> bool {
    *stop.borrow()
}

/// Resolves once the simulated link goes down; never without one.
async fn link_down(link: &mut Option<watch::Receiver<bool>>) {
    match link {
        Some(link) => {
            let _ = link.wait_for(|up| !*up).await;
        }
        None => std::future::pending().await,
    }
}
