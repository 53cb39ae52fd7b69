//! The client agent: one node's life against the servers, the runtime
//! around the client core ([`ClientState`], `state/`).
//!
//! The core decides what to connect to, call, start, stop, destroy and
//! report, and when; this file performs it: QUIC connections and calls
//! (each bounded by a timeout), the allocation watch, the runners, the
//! clock (tokio's, as [`Timestamp`]s since the agent started), and the
//! servers' calls on the connection (`ops.rs`: logs, files, restarts,
//! signals, stats, garbage collection). The session protocol and the
//! allocation rules are the core's module docs.
//!
//! The node the agent registers changes while it runs when a driver's
//! attributes do ([`Agent::with_driver_attributes`]: the docker daemon
//! stopped answering, or answers again): the agent takes the driver's new
//! set into its node, which every later registration sends and every
//! allocation started after it sees (`attr.*` in its tasks' environment),
//! and the core registers the node again.
//!
//! Allocations run with the [`mock`] driver, or with
//! real tasks enabled (`raw_exec`, `docker`: [`Agent::with_tasks`]) an allocation runner each
//! (`alloc_runner.rs`): real processes, the restart policy, task states and
//! events in every report. Tasks keep running while the servers are
//! unreachable, as a Nomad client's do; what changed meanwhile is reported
//! once it is back. When the agent starts it re-attaches to the
//! allocations it finds in its data dir. On shutdown their tasks keep
//! running (the next agent re-attaches), except in dev mode, where they are
//! stopped; with `drain_on_shutdown` the agent first drains its node and
//! waits for its allocations to move ([`DrainOnShutdown`]). Until an allocation's directories are garbage collected (the
//! servers no longer list it, or more than `gc_max_allocs` ended ones are
//! kept) its logs can still be read.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use engine::clock::Timestamp;
use engine::structs::{AllocId, Node, NodeStatus};
use tokio::sync::{mpsc, watch};
use transport::client::{AllocWatch, CallError, ClientConnection, ClientEndpoints};
use transport::message::RefusalCode;

use crate::client::alloc_runner::{self, AllocHandle, RunnerContext};
use crate::client::drivers::mock;
use crate::client::drivers::Drivers;
use crate::client::ops::{ClientOps, GcRequest};
use crate::client::service_watch::ServiceWatch;
pub use crate::client::state::AgentCounters;
use crate::client::state::{
    Action, AllocEvent, Answer, Call, ClientConfig, ClientState, Event, Failure, HeartbeatReply, Refusal, RunnerKind,
};

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
    /// Drain the node before exiting (Nomad's `drain_on_shutdown`).
    pub drain_on_shutdown: Option<DrainOnShutdown>,
}

/// Nomad's client `drain_on_shutdown` block: when asked to stop, the agent
/// first drains its node and keeps running its allocations until the
/// servers moved them (or the deadline passed), then exits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainOnShutdown {
    /// How long the allocations may take to move.
    pub deadline: Duration,
    /// Stop them all at once instead.
    pub force: bool,
    /// Leave the system allocations (the agent does not wait for them).
    pub ignore_system_jobs: bool,
}

impl DrainOnShutdown {
    /// Nomad's default deadline.
    pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(3600);
    /// How long past the deadline the agent waits for the allocations the
    /// servers stop then.
    const GRACE: Duration = Duration::from_secs(60);
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
            drain_on_shutdown: None,
        }
    }
}

/// The agent's real tasks: the drivers (`raw_exec`, `docker`) and where
/// allocations live.
#[derive(Clone, Debug)]
pub struct TaskSettings {
    /// The drivers.
    pub drivers: Drivers,
    /// The agent's data directory (`alloc/`, `client/` below it).
    pub data_dir: PathBuf,
    /// Terminal allocations whose directories are kept (Nomad's
    /// `gc_max_allocs`, 50).
    pub gc_max_allocs: usize,
    /// Stop the tasks when the agent stops (dev mode); otherwise they keep
    /// running for the next agent to re-attach.
    pub stop_tasks_on_shutdown: bool,
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
    /// The node as fingerprinted; each run replaces the attributes of the
    /// drivers in `driver_attributes` with their current sets.
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
    /// The drivers whose attributes change while the agent runs.
    driver_attributes: Vec<DriverAttributes>,
}

/// A driver's attributes as its health checks change them.
#[derive(Clone, Debug)]
struct DriverAttributes {
    /// The driver's name.
    driver: String,
    /// Its full current set (`driver.<name>`, `driver.<name>.*`).
    attributes: watch::Receiver<BTreeMap<String, String>>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").field("node", &self.node.id).field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// What runs an allocation's tasks (none: nothing to stop).
#[derive(Debug)]
enum Runner {
    /// The mock driver's timer.
    Mock(tokio::task::AbortHandle),
    /// An allocation runner with real tasks.
    Tasks(AllocHandle),
}

/// What one run of the agent holds beside its core.
struct Runtime<'a> {
    agent: &'a Agent,
    core: ClientState,
    /// The node as registered now: the agent's, with its drivers' current
    /// attributes (the runner context holds the same).
    node: Node,
    /// The drivers' attributes, watched for changes.
    drivers: Vec<DriverAttributes>,
    /// Where `Timestamp::ZERO` is: the core's clock.
    origin: tokio::time::Instant,
    connection: Option<ClientConnection>,
    watch: Option<AllocWatch>,
    runners: HashMap<AllocId, Runner>,
    ended_tx: mpsc::UnboundedSender<AllocEvent>,
    context: Option<Arc<RunnerContext>>,
    link: Option<watch::Receiver<bool>>,
    /// What answers the servers' calls, and the task doing it on the
    /// open connection.
    ops: Arc<ClientOps>,
    serving: Option<tokio::task::AbortHandle>,
    /// The open connection, for the templates' service reads
    /// (`service_watch.rs`), and the task doing them.
    services_link: watch::Sender<Option<ClientConnection>>,
    service_reads: Option<tokio::task::AbortHandle>,
}

/// Whether the agent goes on.
enum Flow {
    Go(Option<Event>),
    Stop,
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
            driver_attributes: Vec::new(),
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

    /// The agent advertising the driver `driver` as `attributes` says:
    /// `attributes` holds the driver's full current set (`driver.<name>`,
    /// `driver.<name>.*`; their convention is [`Node::has_driver`]'s). The
    /// set current when the agent runs goes with its first registration;
    /// each change replaces all of the driver's attributes in the node,
    /// which is then registered again. Keys in the set that are not the
    /// driver's are left out.
    pub fn with_driver_attributes(
        mut self,
        driver: &str,
        attributes: watch::Receiver<BTreeMap<String, String>>,
    ) -> Agent {
        self.driver_attributes.push(DriverAttributes { driver: driver.to_string(), attributes });
        self
    }

    /// What the agent counted.
    pub fn counters(&self) -> &Arc<AgentCounters> {
        &self.counters
    }

    /// The core's settings for this agent.
    fn client_config(&self) -> ClientConfig {
        ClientConfig {
            node_id: self.node.id,
            servers: self.settings.servers.clone(),
            backoff_base: self.settings.backoff_base,
            backoff_cap: self.settings.backoff_cap,
            real_tasks: self.tasks.is_some(),
            gc_max_allocs: self.tasks.as_ref().map_or(0, |tasks| tasks.gc_max_allocs),
            seed: self.node.id.0.as_u128() as u64,
        }
    }

    /// Runs until `stop` is set: connects, serves a session, reconnects
    /// with backoff when it is lost, as the core says. Tasks are stopped
    /// at the end (or left running for the next agent).
    pub async fn run(&self, mut stop: watch::Receiver<bool>) {
        let (ended_tx, mut ended_rx) = mpsc::unbounded_channel();
        let mut drivers = self.driver_attributes.clone();
        let node = self.current_node(&mut drivers);
        let services = ServiceWatch::new();
        let (services_link, link_seen) = watch::channel(None);
        let service_reads = self
            .tasks
            .as_ref()
            .map(|_| tokio::spawn(services.clone().run(node.id, node.secret_id, link_seen)).abort_handle());
        let context = self.tasks.as_ref().map(|tasks| {
            Arc::new(RunnerContext {
                drivers: tasks.drivers.clone(),
                node: node.clone(),
                data_dir: tasks.data_dir.clone(),
                events: ended_tx.clone(),
                servers_reached: self.servers_reached.subscribe(),
                services: services.clone(),
            })
        });
        let (ops, mut gc_requests) = ClientOps::new(&node, self.tasks.as_ref().map(|tasks| tasks.data_dir.clone()));
        let mut runtime = Runtime {
            agent: self,
            core: ClientState::new(self.client_config(), self.counters.clone()),
            node,
            drivers,
            origin: tokio::time::Instant::now(),
            connection: None,
            watch: None,
            runners: HashMap::new(),
            ended_tx,
            context,
            link: self.link.clone(),
            ops,
            serving: None,
            services_link,
            service_reads,
        };
        runtime.restore();
        let mut period = self.settings.heartbeat_interval.watch();
        let mut event = Event::HeartbeatPeriod(*period.borrow_and_update());
        // Until when a drain before exiting waits for the allocations to move.
        let mut draining: Option<Instant> = None;
        loop {
            let mut actions: VecDeque<Action> = runtime.core.handle(runtime.now(), event).into();
            while let Some(action) = actions.pop_front() {
                match runtime.perform(action, &mut stop).await {
                    Flow::Go(Some(event)) => actions.extend(runtime.core.handle(runtime.now(), event)),
                    Flow::Go(None) => {}
                    Flow::Stop => return runtime.shut_down().await,
                }
            }
            if draining.is_some() && runtime.drained() {
                tracing::info!("the node is drained: the agent exits");
                return runtime.shut_down().await;
            }
            let deadline = runtime.core.deadline().map(|at| runtime.origin + at.since(Timestamp::ZERO));
            let in_session = runtime.core.is_ready();
            event = tokio::select! {
                _ = sleep_until(deadline) => Event::Tick,
                push = next_push(&mut runtime.watch) => match push {
                    Ok(push) => Event::Push { index: push.index, allocs: push.allocs, listed: Some(push.listed) },
                    Err(error) => Event::Disconnected(failure(&error)),
                },
                Some(first) = ended_rx.recv(), if in_session => {
                    let mut events = vec![first];
                    while let Ok(event) = ended_rx.try_recv() {
                        events.push(event);
                    }
                    runtime.alloc_events(&events);
                    Event::AllocsUpdated(events)
                }
                Ok(()) = period.changed() => Event::HeartbeatPeriod(*period.borrow()),
                changed = driver_changed(&mut runtime.drivers) => runtime.take_driver_attributes(changed),
                Some(request) = gc_requests.recv() => {
                    runtime.collect_garbage(request, &mut stop).await;
                    // Whatever came due meanwhile happens now.
                    Event::Tick
                }
                _ = link_down(&mut runtime.link), if runtime.connection.is_some() => {
                    Event::Disconnected(Failure::lost("the network link went down"))
                }
                _ = stopped(&mut stop), if draining.is_none() => match runtime.drain_before_exit().await {
                    Some(until) => {
                        draining = Some(until);
                        Event::Tick
                    }
                    None => return runtime.shut_down().await,
                },
                _ = tokio::time::sleep_until(draining.unwrap_or_else(Instant::now).into()), if draining.is_some() => {
                    tracing::warn!("the drain's deadline passed with allocations still here: the agent exits");
                    return runtime.shut_down().await;
                }
            };
        }
    }

    /// The node with the drivers' current attributes, each marked seen.
    fn current_node(&self, drivers: &mut [DriverAttributes]) -> Node {
        let mut node = self.node.clone();
        for driver in drivers {
            node.set_driver_attributes(&driver.driver, &driver.attributes.borrow_and_update());
        }
        node
    }

    async fn call<T>(&self, call: impl Future<Output = Result<T, CallError>>) -> Result<T, CallError> {
        within(self.settings.call_timeout, call).await
    }
}

impl Runtime<'_> {
    /// The core's clock: time since the agent started.
    fn now(&self) -> Timestamp {
        Timestamp::ZERO.plus(self.origin.elapsed())
    }

    /// Takes the new attributes of the driver at `changed` into the node:
    /// [`Event::NodeChanged`] when they changed it (the core registers it
    /// again), else nothing.
    fn take_driver_attributes(&mut self, changed: usize) -> Event {
        let driver = &mut self.drivers[changed];
        if !self.node.set_driver_attributes(&driver.driver, &driver.attributes.borrow_and_update()) {
            return Event::Tick;
        }
        // Allocations started from now on see the node as registered;
        // those running keep the environment they started with.
        if let Some(context) = &mut self.context {
            Arc::make_mut(context).node = self.node.clone();
        }
        let healthy = self.node.has_driver(&driver.driver);
        tracing::info!(node = %self.node.id, driver = %driver.driver, healthy, "driver attributes changed; registering the node again");
        Event::NodeChanged
    }

    /// Re-attaches to the allocations a previous agent left in the data
    /// dir; the core holds them, so they are reported once connected and
    /// stopped then if the servers no longer want them, never started again.
    fn restore(&mut self) {
        let Some(context) = &self.context else { return };
        for alloc_id in crate::client::alloc_dir::AllocDir::existing(&context.data_dir) {
            let Some((alloc, handle)) = alloc_runner::restore(context, alloc_id) else { continue };
            self.ops.note(&alloc, &BTreeMap::new());
            self.ops.attach(alloc_id, handle.control());
            self.core.restored(alloc);
            self.runners.insert(alloc_id, Runner::Tasks(handle));
        }
        if !self.runners.is_empty() {
            tracing::info!(allocs = self.runners.len(), "restored allocations from the data dir");
        }
    }

    /// Does what the core asked; what came of it, for the core.
    async fn perform(&mut self, action: Action, stop: &mut watch::Receiver<bool>) -> Flow {
        let agent = self.agent;
        match action {
            Action::Connect(addr) => return self.connect(addr, stop).await,
            Action::Disconnect { why } => {
                if let Some(serving) = self.serving.take() {
                    serving.abort();
                }
                self.watch = None;
                if let Some(connection) = self.connection.take() {
                    connection.close();
                }
                self.services_link.send_replace(None);
                tracing::info!(node = %agent.node.id, %why, "lost the server; reconnecting");
            }
            Action::Call(call) => {
                let Some(connection) = &self.connection else {
                    return Flow::Go(Some(Event::Disconnected(Failure::lost("no connection"))));
                };
                let event = tokio::select! {
                    event = make_call(agent, &self.node, connection, &mut self.watch, call) => event,
                    _ = link_down(&mut self.link) => Event::Disconnected(Failure::lost("the network link went down")),
                };
                return Flow::Go(Some(event));
            }
            Action::Start { alloc, runner: RunnerKind::Tasks } => {
                if let Some(context) = &self.context {
                    self.ops.note(&alloc, &BTreeMap::new());
                    let handle = alloc_runner::start(context, alloc.clone());
                    self.ops.attach(alloc.id, handle.control());
                    self.runners.insert(alloc.id, Runner::Tasks(handle));
                }
            }
            Action::Start { alloc, runner: RunnerKind::Mock(end) } => {
                if let Some(end) = end {
                    let (ended, alloc_id) = (self.ended_tx.clone(), alloc.id);
                    let timer = mock::end_after(end, move |status, description| {
                        let _ = ended.send(AllocEvent {
                            alloc_id,
                            status,
                            description,
                            task_states: BTreeMap::new(),
                            services: None,
                            checks: None,
                            health: None,
                        });
                    });
                    self.runners.insert(alloc_id, Runner::Mock(timer));
                }
            }
            Action::Stop(alloc_id) => match self.runners.remove(&alloc_id) {
                Some(Runner::Tasks(handle)) => {
                    handle.stop();
                    self.runners.insert(alloc_id, Runner::Tasks(handle));
                }
                Some(Runner::Mock(timer)) => timer.abort(),
                None => {}
            },
            Action::Destroy(alloc_id) => {
                match self.runners.remove(&alloc_id) {
                    Some(Runner::Tasks(handle)) => handle.destroy(),
                    Some(Runner::Mock(timer)) => timer.abort(),
                    None => {}
                }
                self.ops.forget(alloc_id);
            }
            Action::FirstPushApplied => {
                agent.servers_reached.send_replace(true);
            }
        }
        Flow::Go(None)
    }

    /// Opens a connection to `addr`, once the simulated link (if any) is up.
    async fn connect(&mut self, addr: SocketAddr, stop: &mut watch::Receiver<bool>) -> Flow {
        let agent = self.agent;
        if *stop.borrow() {
            return Flow::Stop;
        }
        // Allocations due to stop for the servers' silence are stopped on
        // time: the attempt is given up for it (and made again after).
        let silence = self.core.stop_deadline().map(|at| self.origin + at.since(Timestamp::ZERO));
        let give_up = || {
            let why = "gave up connecting: allocations are due to stop after the servers' silence";
            Flow::Go(Some(Event::Disconnected(Failure::lost(why))))
        };
        if let Some(link) = &mut self.link {
            tokio::select! {
                _ = link.wait_for(|up| *up) => {}
                _ = sleep_until(silence) => return give_up(),
                _ = stopped(stop) => return Flow::Stop,
            }
        }
        let started = Instant::now();
        let connected = tokio::select! {
            connected = agent.call(agent.endpoints.connect_with(agent.quic.clone(), addr)) => connected,
            _ = sleep_until(silence) => return give_up(),
            _ = stopped(stop) => return Flow::Stop,
        };
        Flow::Go(Some(match connected {
            Ok(connection) => {
                agent.observer.connected(started.elapsed());
                let serving = tokio::spawn(self.ops.clone().serve(connection.clone()));
                if let Some(previous) = self.serving.replace(serving.abort_handle()) {
                    previous.abort();
                }
                self.services_link.send_replace(Some(connection.clone()));
                self.connection = Some(connection);
                Event::Connected
            }
            Err(error) => Event::Disconnected(Failure::lost(format!("connecting to {addr}: {error}"))),
        }))
    }

    /// Before the core takes runners' news: the servers' calls learn the
    /// task states of real tasks, and a mock timer that fired is done.
    fn alloc_events(&mut self, events: &[AllocEvent]) {
        for event in events {
            match self.runners.get(&event.alloc_id) {
                Some(Runner::Tasks(_)) if !event.task_states.is_empty() => {
                    if let Some(held) = self.core.alloc(event.alloc_id) {
                        self.ops.note(held.alloc, &event.task_states);
                    }
                }
                Some(Runner::Mock(_)) => {
                    self.runners.remove(&event.alloc_id);
                }
                _ => {}
            }
        }
    }

    /// An operator's garbage collection: the core decides what goes (what
    /// has ended here and still has its directories), the runtime destroys
    /// it, and the asker learns whether the allocation it named went.
    async fn collect_garbage(&mut self, request: GcRequest, stop: &mut watch::Receiver<bool>) {
        let actions = self.core.handle(self.now(), Event::CollectGarbage(request.alloc_id));
        let destroyed: Vec<AllocId> = actions
            .iter()
            .filter_map(|action| match action {
                Action::Destroy(id) => Some(*id),
                _ => None,
            })
            .collect();
        let outcome = match request.alloc_id {
            Some(id) if !destroyed.contains(&id) => Err(self.not_collected(id)),
            _ => Ok(()),
        };
        for action in actions {
            // Destroying reaches no server and is never stopped.
            let _ = self.perform(action, stop).await;
        }
        let _ = request.reply.send(outcome);
    }

    /// Why the allocation `id` was not collected.
    fn not_collected(&self, id: AllocId) -> transport::message::AgentError {
        use transport::message::AgentErrorCode;
        let error = crate::client::fs::error;
        match self.core.alloc(id) {
            None => error(AgentErrorCode::UnknownAlloc, format!("Unknown allocation \"{id}\"")),
            Some(held) if !held.status.is_terminal() => error(
                AgentErrorCode::WrongState,
                format!("allocation {id} is {}, not terminal: stop it first", crate::api::word(held.status)),
            ),
            Some(_) => error(AgentErrorCode::UnknownAlloc, format!("allocation {id} was collected already")),
        }
    }

    /// With `drain_on_shutdown`, asks the servers (on the open connection)
    /// to drain the node; until when to wait for its allocations to move.
    /// `None`: exit at once (no such block, no connection, or the servers
    /// did not take the drain).
    async fn drain_before_exit(&mut self) -> Option<Instant> {
        let drain = self.agent.settings.drain_on_shutdown?;
        let Some(connection) = &self.connection else {
            tracing::warn!("no server to drain the node through: the agent exits without a drain");
            return None;
        };
        let deadline = match drain.force {
            true => -1,
            false => i64::try_from(drain.deadline.as_nanos()).unwrap_or(i64::MAX),
        };
        let asked = connection.drain_self(self.node.id, self.node.secret_id, deadline, drain.ignore_system_jobs);
        match tokio::time::timeout(self.agent.settings.call_timeout, asked).await {
            Ok(Ok(index)) => {
                tracing::info!(index, deadline = ?drain.deadline, "draining the node before the agent exits");
                Some(
                    Instant::now() + if drain.force { Duration::ZERO } else { drain.deadline } + DrainOnShutdown::GRACE,
                )
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "the servers did not take the drain: the agent exits without one");
                None
            }
            Err(_) => {
                tracing::warn!("the drain was not answered in time: the agent exits without one");
                None
            }
        }
    }

    /// Whether nothing the drain moves still runs here, and the servers
    /// know it: every allocation ended and was reported (but the system
    /// ones a drain leaves).
    fn drained(&self) -> bool {
        let ignore_system = self.agent.settings.drain_on_shutdown.is_some_and(|drain| drain.ignore_system_jobs);
        self.core.allocs().all(|held| {
            let left = ignore_system && held.alloc.job.job_type.is_system_like();
            left || (held.status.is_terminal() && held.reported)
        })
    }

    /// The agent stops: the mock driver's timers end; real tasks keep
    /// running for the next agent, or are stopped (dev mode).
    async fn shut_down(self) {
        if let Some(serving) = &self.serving {
            serving.abort();
        }
        if let Some(reads) = &self.service_reads {
            reads.abort();
        }
        if let Some(connection) = &self.connection {
            connection.close();
        }
        let stop_tasks = self.agent.tasks.as_ref().is_some_and(|tasks| tasks.stop_tasks_on_shutdown);
        let mut stopping = Vec::new();
        for (_, runner) in self.runners {
            match runner {
                Runner::Tasks(handle) if stop_tasks => {
                    handle.stop();
                    stopping.push(handle.finished());
                }
                Runner::Tasks(handle) => handle.detach(),
                Runner::Mock(timer) => timer.abort(),
            }
        }
        for finished in stopping {
            finished.await;
        }
    }
}

/// Makes `call` on the open connection for `node` (as registered now);
/// its answer or failure.
async fn make_call(
    agent: &Agent,
    node: &Node,
    connection: &ClientConnection,
    watch: &mut Option<AllocWatch>,
    call: Call,
) -> Event {
    let answer = match call {
        Call::Register => {
            let mut node = node.clone();
            node.status = NodeStatus::Initializing;
            agent.call(connection.register(node)).await.map(|_| Answer::Registered)
        }
        Call::Heartbeat => {
            let started = Instant::now();
            let call = connection.heartbeat(node.id, node.secret_id, NodeStatus::Ready);
            within(agent.settings.heartbeat_timeout, call).await.map(|reply| {
                agent.observer.heartbeat(started.elapsed());
                Answer::Heartbeat(HeartbeatReply {
                    status: reply.status,
                    ttl: reply.heartbeat_ttl,
                    servers: reply.servers,
                })
            })
        }
        Call::Watch { after } => {
            agent.call(connection.watch_allocs(node.id, node.secret_id, after)).await.map(|opened| {
                *watch = Some(opened);
                Answer::Watching
            })
        }
        Call::Report(updates) => {
            agent.call(connection.update_allocs(node.id, node.secret_id, updates)).await.map(|_| Answer::Reported)
        }
    };
    match answer {
        Ok(answer) => Event::Answered(answer),
        Err(error) => Event::CallFailed(failure(&error)),
    }
}

/// A failed call as the core sees it.
fn failure(error: &CallError) -> Failure {
    let refusal = error.refusal().map(|code| match code {
        RefusalCode::UnknownNode => Refusal::UnknownNode,
        RefusalCode::NotConnected => Refusal::NotConnected,
        RefusalCode::NotItsAllocation => Refusal::NotItsAllocation,
        RefusalCode::NoLeader => Refusal::NoLeader,
        _ => Refusal::Other,
    });
    Failure { transient: error.is_transient(), refusal, message: error.to_string() }
}

/// Resolves at `deadline`; never without one.
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// The watch's next push; never without a watch.
async fn next_push(watch: &mut Option<AllocWatch>) -> Result<transport::message::AllocChanges, CallError> {
    match watch {
        Some(watch) => watch.next().await,
        None => std::future::pending().await,
    }
}

/// The index of a driver whose attributes changed; never without drivers,
/// nor for one whose sender is gone (its last attributes stay).
async fn driver_changed(drivers: &mut [DriverAttributes]) -> usize {
    let mut changes: Vec<_> = drivers
        .iter_mut()
        .enumerate()
        .map(|(at, driver)| {
            Box::pin(async move {
                match driver.attributes.changed().await {
                    Ok(()) => at,
                    Err(_) => std::future::pending().await,
                }
            })
        })
        .collect();
    std::future::poll_fn(|cx| {
        let ready = changes.iter_mut().find_map(|change| match change.as_mut().poll(cx) {
            Poll::Ready(at) => Some(at),
            Poll::Pending => None,
        });
        ready.map_or(Poll::Pending, Poll::Ready)
    })
    .await
}

/// `call`'s outcome, or [`CallError::TimedOut`] after `limit`.
async fn within<T>(limit: Duration, call: impl Future<Output = Result<T, CallError>>) -> Result<T, CallError> {
    tokio::time::timeout(limit, call).await.unwrap_or(Err(CallError::TimedOut(limit)))
}

/// Resolves once `stop` is set (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
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
