//! The client agent's core: what to start, stop, destroy, report and
//! resync, and when to connect, call and heartbeat, decided by a state
//! machine that takes events and returns actions. It does no I/O, reads
//! no clock and draws its jitter from a seeded source, as quinn-proto's
//! connections and the engine's `HeartbeatTimers` do. The agent
//! (`agent.rs`), loadgen's network clients (which are agents) and the
//! deterministic simulation (`tests/`) all run it; each is a runtime that
//! performs the actions and hands back what came of them.
//!
//! The contract with a runtime:
//!
//! 1. Every event carries `now`, a [`Timestamp`] on any monotonic clock
//!    the runtime likes. Timers (a connection, a heartbeat, a retry) fire
//!    only on [`Event::Tick`], which the runtime hands in at
//!    [`ClientState::deadline`] unless something else comes first.
//! 2. At most one call is out at a time. The runtime answers every
//!    [`Action::Call`] with [`Event::Answered`] or [`Event::CallFailed`];
//!    pushes, runner updates and ticks that come meanwhile are taken, and
//!    what they need sent goes once the call is answered.
//! 3. [`Action::Connect`] is answered with [`Event::Connected`] or
//!    [`Event::Disconnected`]; a connection lost later (the watch ended,
//!    the network went away) is [`Event::Disconnected`] too.
//! 4. Every [`Call::Register`] sends the node as the runtime has it when
//!    the call goes out; when the runtime changes it (a driver's health),
//!    it hands in [`Event::NodeChanged`].
//!
//! The session protocol, each step one call:
//!
//! 1. Connect to the next server (those the last heartbeat listed, else
//!    the configured ones), after a jittered backoff when the last session
//!    was lost, its ceiling doubling from `backoff_base` up to
//!    `backoff_cap` and never above half the heartbeat TTL last handed
//!    (back before the servers give up on the node).
//! 2. Register, when the servers do not know the node yet (the first
//!    session) or said they do not (`UnknownNode`). A server that did not
//!    know the node never knew what the agent ran: it is all destroyed,
//!    and the watch starts over.
//! 3. Heartbeat; a heartbeat that times out is sent again after 0.5-1.5 s,
//!    three tries in all. A success resets the backoff.
//! 4. Open the allocation watch after the last push applied.
//! 5. When the heartbeat said `initializing` (the node was marked while the
//!    agent was away), resync: report every allocation held, changed or
//!    not, then heartbeat again. Otherwise report what changed.
//! 6. The session runs: heartbeats at the TTL handed (or the override);
//!    an `initializing` answer is a resync and a heartbeat at once; a
//!    heartbeat not answered is retried after 0.5-1.5 s, and the third in a
//!    row unanswered ends the session. Pushes and runner updates are
//!    applied and what changed is reported. Any other failed call ends
//!    the session (a report naming an allocation the servers no longer
//!    place here also restarts the watch from the beginning).
//! 7. A node the runtime changed is registered again once the session
//!    runs and no call is out (after a report due, before a heartbeat
//!    due); changes that come before it goes make one call, one that comes
//!    while it is out makes another after. The change is the servers' only
//!    once a registration sent after it is answered: a session lost first
//!    (a failed registration ends it, as other failed calls do) leaves it
//!    due, and the next session sends it once it runs (its handshake only
//!    heartbeats, the servers knowing the node already).
//!
//! The allocation rules (`allocs.rs`):
//!
//! - A push lists every allocation placed on the node. One this agent does
//!   not hold is started if the servers want it running and its client
//!   status has not ended; otherwise it is only held as the servers have
//!   it. One the agent holds is never started again: if the servers stop
//!   it, its tasks are stopped and it is reported `complete` (at once for
//!   the mock driver, when the runner says so for real tasks). One the
//!   push no longer lists is destroyed and forgotten.
//! - An allocation restored from the data dir after an agent restart
//!   ([`ClientState::restored`]) is held, so it too is never started
//!   again: the servers' first push stops it or keeps it.
//! - A runner's update replaces the allocation's status and task states;
//!   one for an allocation that has ended here is dropped, unless real
//!   tasks report it (their runner has the last word).
//! - With real tasks on, the directories of the oldest ended allocations
//!   beyond `gc_max_allocs` are destroyed, and those of any ended one when
//!   an operator asks ([`Event::CollectGarbage`]).
//! - An allocation whose group says `stop_after_client_disconnect` (Nomad
//!   1.8: `disconnect { stop_on_client_after }`) is stopped here once the
//!   agent has been out of touch with the servers that long: from the last
//!   heartbeat they answered before the session was lost (or from the
//!   agent's start, if none was). [`ClientState::deadline`] includes that
//!   moment, and every event checks it, so a runtime that is waiting to
//!   connect gives up the attempt at [`ClientState::stop_deadline`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use engine::clock::Timestamp;
use engine::state::ClientAllocUpdate;
use engine::structs::{
    AllocHealth, AllocId, Allocation, CheckResult, ClientStatus, NodeId, NodeStatus, ServiceRegistration, TaskState,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use self::allocs::Allocs;
use crate::client::drivers::mock::MockEnd;

mod allocs;

/// Tries of a session's first heartbeat before the session is given up.
const GREETING_TRIES: u32 = 3;
/// Heartbeats in a row a session may leave unanswered (or refused for
/// want of a leader) before it is given up for the next server.
const MAX_UNANSWERED: u32 = 3;

/// How a client behaves.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// The node the client is.
    pub node_id: NodeId,
    /// The servers to try, in order, until a heartbeat lists them.
    pub servers: Vec<SocketAddr>,
    /// First reconnect delay ceiling.
    pub backoff_base: Duration,
    /// Largest reconnect delay ceiling.
    pub backoff_cap: Duration,
    /// Whether allocations of real tasks (any driver but `mock`) run, an
    /// allocation runner each; otherwise they fail at once.
    pub real_tasks: bool,
    /// Ended allocations of real tasks whose directories are kept.
    pub gc_max_allocs: usize,
    /// The seed of the reconnect and retry jitter.
    pub seed: u64,
}

/// What a client counts, for logs and loadgen.
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

fn count(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

/// An allocation's new status, from its runner.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocEvent {
    /// The allocation.
    pub alloc_id: AllocId,
    /// Its client status.
    pub status: ClientStatus,
    /// Why, in a few words.
    pub description: String,
    /// Every task's state (empty for the mock driver's light path).
    pub task_states: BTreeMap<String, TaskState>,
    /// The service registrations of its running tasks (`None` for the
    /// mock driver's light path, which registers none).
    pub services: Option<Vec<ServiceRegistration>>,
    /// Every check's latest result (`None` for the light path).
    pub checks: Option<BTreeMap<String, CheckResult>>,
    /// Its health, once decided.
    pub health: Option<AllocHealth>,
}

/// What happened, as the runtime hands it in.
#[derive(Clone, Debug)]
pub enum Event {
    /// Time passed; whatever is due by `now` happens.
    Tick,
    /// The connection [`Action::Connect`] asked for is open.
    Connected,
    /// The connection could not be opened, or the open one is gone.
    Disconnected(Failure),
    /// The call out was answered.
    Answered(Answer),
    /// The call out failed.
    CallFailed(Failure),
    /// The servers pushed the node's allocations on the watch.
    Push {
        /// The state index the push is current at.
        index: u64,
        /// The allocations stored anew since the last push (all of them
        /// when `listed` is `None`).
        allocs: Vec<Arc<Allocation>>,
        /// Every allocation on the node, by id, when `allocs` holds only
        /// those that changed: the others are as the last push had them.
        listed: Option<Vec<AllocId>>,
    },
    /// Runners changed allocations' statuses.
    AllocsUpdated(Vec<AllocEvent>),
    /// Heartbeat at this period instead of the TTL handed (`None`: at the TTL).
    HeartbeatPeriod(Option<Duration>),
    /// An operator asks for the directories of this ended allocation, or
    /// of every ended one, to go now (Nomad's client GC): each such
    /// allocation with real tasks is destroyed, as if beyond `gc_max_allocs`.
    CollectGarbage(Option<AllocId>),
    /// The runtime changed the node it registers (a driver's attributes):
    /// the servers must be sent it again (module docs, session step 7).
    NodeChanged,
}

/// A call's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// [`Call::Register`] succeeded.
    Registered,
    /// [`Call::Heartbeat`]'s answer.
    Heartbeat(HeartbeatReply),
    /// [`Call::Watch`] opened the watch; pushes follow.
    Watching,
    /// [`Call::Report`] was accepted.
    Reported,
}

/// What a heartbeat learns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeartbeatReply {
    /// The node's status as the servers have it.
    pub status: NodeStatus,
    /// Heartbeat again within this (zero: at once).
    pub ttl: Duration,
    /// The servers' client addresses, the leader's first.
    pub servers: Vec<String>,
}

/// Why a call or a connection failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The call may be made again on the same connection (it timed out,
    /// its stream failed, or the cluster had no leader).
    pub transient: bool,
    /// The server's refusal, when it refused.
    pub refusal: Option<Refusal>,
    /// What happened, for the log.
    pub message: String,
}

impl Failure {
    /// A connection that could not be made or is gone.
    pub fn lost(message: impl Into<String>) -> Failure {
        Failure { transient: false, refusal: None, message: message.into() }
    }
}

/// The refusals the client acts upon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The servers do not know the node: register.
    UnknownNode,
    /// The node is down or disconnected: heartbeat first.
    NotConnected,
    /// A report named an allocation not placed on the node.
    NotItsAllocation,
    /// The cluster has no leader right now.
    NoLeader,
    /// Any other.
    Other,
}

/// What the runtime is asked to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Open a connection to this server.
    Connect(SocketAddr),
    /// The session is over: close the connection and its watch, if open.
    /// The next attempt is at [`ClientState::deadline`].
    Disconnect {
        /// Why, for the log.
        why: String,
    },
    /// Make this call on the open connection.
    Call(Call),
    /// Start a runner for an allocation new to this agent.
    Start {
        /// The allocation.
        alloc: Arc<Allocation>,
        /// What runs it.
        runner: RunnerKind,
    },
    /// Stop the allocation's tasks (its end is reported by the runner for
    /// real tasks; the mock driver's ends now).
    Stop(AllocId),
    /// Stop the allocation's tasks, remove its directories and forget it.
    Destroy(AllocId),
    /// The servers' view of the node's allocations was applied for the
    /// first time since the agent started: restored runners may restart
    /// tasks they found dead. Once per agent.
    FirstPushApplied,
}

/// A call to the servers.
#[derive(Clone, Debug, PartialEq)]
pub enum Call {
    /// Register the node as the runtime has it now, as `initializing` (a
    /// node the servers know keeps its status): the first registration, one
    /// after the servers forgot the node, or one after the node changed.
    Register,
    /// Heartbeat, asking for `ready`.
    Heartbeat,
    /// Open the allocation watch, pushing what changed after this index
    /// (everything, at 0).
    Watch {
        /// The index of the last push applied.
        after: u64,
    },
    /// Send these allocation updates.
    Report(Vec<ClientAllocUpdate>),
}

/// What runs an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunnerKind {
    /// An allocation runner with real tasks (`raw_exec`, `docker`).
    Tasks,
    /// The mock driver's light path, ending by itself when it says.
    Mock(Option<MockEnd>),
}

/// An allocation as the client holds it, for a runtime to read.
#[derive(Clone, Copy, Debug)]
pub struct HeldAlloc<'a> {
    /// The allocation as last pushed.
    pub alloc: &'a Arc<Allocation>,
    /// Its status here.
    pub status: ClientStatus,
    /// Whether the servers have that status.
    pub reported: bool,
}

/// One client's state; see the module docs.
#[derive(Debug)]
pub struct ClientState {
    config: ClientConfig,
    counters: Arc<AgentCounters>,
    rng: SmallRng,
    backoff: Backoff,
    allocs: Allocs,
    /// The index of the last push applied; the watch resumes after it.
    last_index: u64,
    /// Whether the servers know this node.
    registered: bool,
    /// The heartbeat TTL last handed (not zero).
    heartbeat_ttl: Option<Duration>,
    /// The servers as the last heartbeat listed them.
    servers: Vec<SocketAddr>,
    /// Which server the next connection tries.
    server: usize,
    /// The heartbeat period override.
    period: Option<Duration>,
    first_push_applied: bool,
    link: Link,
    /// When the servers last answered a heartbeat (the first event's time
    /// until they have).
    heard_at: Option<Timestamp>,
    /// Since when the agent has been out of touch: the last answered
    /// heartbeat before the session was lost; `None` while a session runs.
    out_of_touch_since: Option<Timestamp>,
    /// How many times the runtime changed the node ([`Event::NodeChanged`]).
    node_version: u64,
    /// The `node_version` of the last registration the servers answered.
    node_version_sent: u64,
}

/// The connection.
#[derive(Debug)]
enum Link {
    /// None: connect at `at`.
    Down { at: Timestamp },
    /// [`Action::Connect`] is out.
    Connecting,
    /// Open: a session.
    Up(Session),
}

#[derive(Debug)]
struct Session {
    step: Step,
    /// The call out.
    call: Option<Out>,
}

/// A session's progress (module docs, steps 2-6).
#[derive(Debug)]
enum Step {
    /// Registering; `again` after the servers said they did not know the node.
    Register { again: bool },
    /// The first heartbeat: `tries` made; after a transient failure the next
    /// goes at `retry_at`.
    Greet { tries: u32, retry_at: Option<Timestamp>, again: bool },
    /// Opening the watch, with the greeting's answer.
    Watch { initializing: bool, ttl: Duration },
    /// The resync's report is out; a heartbeat follows.
    Resync,
    /// The heartbeat after the resync is out.
    Confirm,
    /// The report of what changed is out.
    Report { ttl: Duration },
    /// The session runs.
    Ready { next_heartbeat: Timestamp, unanswered: u32, ttl: Duration },
}

/// The call out.
#[derive(Debug)]
enum Out {
    /// A session's registration (module docs, step 2), of the node at this version.
    Register {
        node_version: u64,
    },
    /// A running session's registration of the changed node, at this version.
    NodeUpdate {
        node_version: u64,
    },
    Heartbeat,
    Watch,
    /// The allocations sent, each at the version sent.
    Report(Vec<(AllocId, u64)>),
}

impl ClientState {
    /// A client that has not connected yet; it connects at the first event.
    pub fn new(config: ClientConfig, counters: Arc<AgentCounters>) -> ClientState {
        ClientState {
            rng: SmallRng::seed_from_u64(config.seed),
            backoff: Backoff::new(config.backoff_base, config.backoff_cap),
            allocs: Allocs::new(&config),
            config,
            counters,
            last_index: 0,
            registered: false,
            heartbeat_ttl: None,
            servers: Vec::new(),
            server: 0,
            period: None,
            first_push_applied: false,
            link: Link::Down { at: Timestamp::ZERO },
            heard_at: None,
            out_of_touch_since: None,
            node_version: 0,
            node_version_sent: 0,
        }
    }

    /// Holds an allocation whose runner a restarted agent re-attached to
    /// (real tasks, from the data dir): `pending` until the runner reports,
    /// nothing to report before, never started again. Before any event.
    pub fn restored(&mut self, alloc: Arc<Allocation>) {
        self.allocs.restored(alloc);
    }

    /// What the client counted.
    pub fn counters(&self) -> &Arc<AgentCounters> {
        &self.counters
    }

    /// When the runtime must hand in [`Event::Tick`] if nothing else
    /// happens; `None` while it owes an answer.
    pub fn deadline(&self) -> Option<Timestamp> {
        let link = self.link_deadline();
        match (link, self.stop_deadline()) {
            (Some(link), Some(stop)) => Some(link.min(stop)),
            (Some(link), None) => Some(link),
            // Owing an answer, the runtime still ticks for a stop (a call
            // or a connection attempt it gives up for it fails as lost).
            (None, stop) => stop,
        }
    }

    /// When the next allocation is due to be stopped for the servers'
    /// silence (`stop_after_client_disconnect`), while the agent is out of touch.
    pub fn stop_deadline(&self) -> Option<Timestamp> {
        self.allocs.next_silence_stop(self.out_of_touch_since?)
    }

    fn link_deadline(&self) -> Option<Timestamp> {
        match &self.link {
            Link::Down { at } => Some(*at),
            Link::Connecting => None,
            Link::Up(Session { call: Some(_), .. }) => None,
            Link::Up(Session { step: Step::Greet { retry_at, .. }, .. }) => *retry_at,
            Link::Up(Session { step: Step::Ready { next_heartbeat, .. }, .. }) => Some(*next_heartbeat),
            Link::Up(_) => None,
        }
    }

    /// Whether the session runs (past its handshake): runner updates are
    /// reported as they come.
    pub fn is_ready(&self) -> bool {
        matches!(&self.link, Link::Up(Session { step: Step::Ready { .. }, .. }))
    }

    /// Whether a connection is open.
    pub fn is_connected(&self) -> bool {
        matches!(self.link, Link::Up(_))
    }

    /// The allocation held under `id`.
    pub fn alloc(&self, id: AllocId) -> Option<HeldAlloc<'_>> {
        self.allocs.get(id)
    }

    /// Every allocation held, by id.
    pub fn allocs(&self) -> impl Iterator<Item = HeldAlloc<'_>> {
        self.allocs.iter()
    }

    /// Takes `event` at `now`; returns what the runtime must do, in order.
    pub fn handle(&mut self, now: Timestamp, event: Event) -> Vec<Action> {
        let mut out = Vec::new();
        let started = *self.heard_at.get_or_insert(now);
        if matches!(self.link, Link::Down { .. } | Link::Connecting) && self.out_of_touch_since.is_none() {
            // Not yet in touch since the agent started.
            self.out_of_touch_since = Some(started);
        }
        let tick = matches!(event, Event::Tick);
        match event {
            Event::Tick => {}
            Event::Connected => self.connected(&mut out),
            Event::Disconnected(failure) => {
                if !matches!(self.link, Link::Down { .. }) {
                    self.lose(now, failure, &mut out);
                }
            }
            Event::Answered(answer) => self.answered(now, answer, &mut out),
            Event::CallFailed(failure) => self.call_failed(now, failure, &mut out),
            Event::Push { index, allocs, listed } => self.push(now, index, allocs, listed, &mut out),
            Event::AllocsUpdated(events) => {
                for event in events {
                    self.allocs.runner_news(now, event);
                }
                self.allocs.collect_garbage(&mut out);
            }
            Event::HeartbeatPeriod(period) => self.set_period(now, period),
            Event::CollectGarbage(alloc_id) => self.allocs.collect_now(alloc_id, &mut out),
            Event::NodeChanged => self.node_version += 1,
        }
        if let Some(since) = self.out_of_touch_since {
            self.allocs.stop_for_silence(now, since, &mut out);
        }
        self.pump(now, tick, &mut out);
        out
    }

    /// Sends a report of what changed, else the changed node, if the
    /// session runs and no call is out; on a tick, also starts what is due
    /// by now: a connection, a retried greeting, a heartbeat. (Timers fire
    /// on ticks only, so a runtime takes in what else came, a push say,
    /// before a heartbeat that is due at once.)
    fn pump(&mut self, now: Timestamp, tick: bool, out: &mut Vec<Action>) {
        match &self.link {
            Link::Down { at } if tick && *at <= now => {
                let servers = if self.servers.is_empty() { &self.config.servers } else { &self.servers };
                if let Some(addr) = servers.get(self.server % servers.len().max(1)) {
                    out.push(Action::Connect(*addr));
                    self.link = Link::Connecting;
                }
            }
            Link::Up(Session { call: None, step: Step::Greet { retry_at: Some(at), tries, again } })
                if tick && *at <= now =>
            {
                let step = Step::Greet { tries: *tries, retry_at: None, again: *again };
                self.set_step(step);
                self.call(Out::Heartbeat, Call::Heartbeat, out);
            }
            Link::Up(Session { call: None, step: Step::Ready { next_heartbeat, .. } }) => {
                let due = tick && *next_heartbeat <= now;
                if !self.report(out) && !self.update_node(out) && due {
                    self.call(Out::Heartbeat, Call::Heartbeat, out);
                }
            }
            _ => {}
        }
    }

    fn connected(&mut self, out: &mut Vec<Action>) {
        if !matches!(self.link, Link::Connecting) {
            return;
        }
        if self.counters.connections.fetch_add(1, Ordering::Relaxed) > 0 {
            count(&self.counters.reconnects, 1);
        }
        if self.registered {
            self.link = Link::Up(Session { step: greeting(false), call: None });
            self.call(Out::Heartbeat, Call::Heartbeat, out);
        } else {
            self.link = Link::Up(Session { step: Step::Register { again: false }, call: None });
            self.register(out);
        }
    }

    /// The session is lost: the next connection goes to the next server
    /// after the backoff.
    fn lose(&mut self, now: Timestamp, failure: Failure, out: &mut Vec<Action>) {
        if failure.refusal == Some(Refusal::NoLeader) {
            count(&self.counters.writes_retried, 1);
        }
        out.push(Action::Disconnect { why: failure.message });
        self.out_of_touch_since = self.out_of_touch_since.or(self.heard_at).or(Some(now));
        self.server = self.server.wrapping_add(1);
        let cap = self.config.backoff_cap;
        self.backoff.set_cap(self.heartbeat_ttl.map_or(cap, |ttl| (ttl / 2).min(cap)));
        let delay = self.backoff.next_delay(&mut self.rng);
        self.link = Link::Down { at: now.plus(delay) };
    }

    /// Sends `call`, remembering it as `what`.
    fn call(&mut self, what: Out, call: Call, out: &mut Vec<Action>) {
        if let Link::Up(session) = &mut self.link {
            session.call = Some(what);
            out.push(Action::Call(call));
        }
    }

    /// Sends the session's registration (module docs, step 2).
    fn register(&mut self, out: &mut Vec<Action>) {
        self.call(Out::Register { node_version: self.node_version }, Call::Register, out);
    }

    /// Registers the node again if the runtime changed it since the
    /// servers last took it (module docs, step 7); whether a call went.
    fn update_node(&mut self, out: &mut Vec<Action>) -> bool {
        if self.node_version_sent == self.node_version {
            return false;
        }
        self.call(Out::NodeUpdate { node_version: self.node_version }, Call::Register, out);
        true
    }

    /// The servers have the node as it was at `node_version`.
    fn node_taken(&mut self, node_version: u64) {
        self.node_version_sent = self.node_version_sent.max(node_version);
    }

    /// The call out, taken; `None` when none is (the answer is dropped).
    fn take_call(&mut self) -> Option<Out> {
        match &mut self.link {
            Link::Up(session) => session.call.take(),
            _ => None,
        }
    }

    fn answered(&mut self, now: Timestamp, answer: Answer, out: &mut Vec<Action>) {
        let Some(call) = self.take_call() else { return };
        match (call, answer) {
            (Out::Register { node_version }, Answer::Registered) => {
                self.node_taken(node_version);
                let again = matches!(self.step(), Some(Step::Register { again: true }));
                self.set_step(greeting(again));
                self.registered_now(out);
                self.call(Out::Heartbeat, Call::Heartbeat, out);
            }
            (Out::NodeUpdate { node_version }, Answer::Registered) => self.node_taken(node_version),
            (Out::Heartbeat, Answer::Heartbeat(reply)) => self.heard(now, reply, out),
            (Out::Watch, Answer::Watching) => {
                let Some(&mut Step::Watch { initializing, ttl }) = self.step() else { return };
                if initializing {
                    self.set_step(Step::Resync);
                    count(&self.counters.marked_away, u64::from(self.last_index > 0));
                    self.resync();
                    if !self.report(out) {
                        self.confirm(out);
                    }
                } else {
                    self.set_step(Step::Report { ttl });
                    if !self.report(out) {
                        self.enter_ready(now, ttl);
                    }
                }
            }
            (Out::Report(sent), Answer::Reported) => {
                count(&self.counters.reports, 1);
                self.allocs.reported(sent);
                match self.step() {
                    Some(Step::Resync) => self.confirm(out),
                    Some(&mut Step::Report { ttl }) => self.enter_ready(now, ttl),
                    _ => {}
                }
            }
            (call, answer) => {
                debug_assert!(false, "{answer:?} does not answer {call:?}");
            }
        }
    }

    /// The servers took the registration: a re-registration drops what
    /// the agent ran for the state they forgot.
    fn registered_now(&mut self, out: &mut Vec<Action>) {
        if self.registered {
            tracing::warn!(node = %self.config.node_id, "the server did not know this node; registered again and dropped its old allocations");
            self.allocs.drop_all(out);
        }
        self.last_index = 0;
        self.registered = true;
    }

    /// A heartbeat's answer, in whichever step it was sent.
    fn heard(&mut self, now: Timestamp, reply: HeartbeatReply, out: &mut Vec<Action>) {
        count(&self.counters.heartbeats, 1);
        self.heard_at = Some(now);
        self.out_of_touch_since = None;
        if !reply.ttl.is_zero() {
            self.heartbeat_ttl = Some(reply.ttl);
        }
        let servers: Vec<SocketAddr> = reply
            .servers
            .iter()
            .filter_map(|addr| addr.parse::<SocketAddr>().ok())
            .filter(|addr| !addr.ip().is_unspecified() && addr.port() != 0)
            .collect();
        if !servers.is_empty() {
            self.servers = servers;
        }
        let initializing = reply.status == NodeStatus::Initializing;
        match self.step() {
            Some(Step::Greet { .. }) => {
                self.backoff.reset();
                self.set_step(Step::Watch { initializing, ttl: reply.ttl });
                self.call(Out::Watch, Call::Watch { after: self.last_index }, out);
            }
            Some(Step::Confirm) => self.enter_ready(now, reply.ttl),
            Some(&mut Step::Ready { unanswered, ttl, .. }) if initializing => {
                count(&self.counters.marked_away, 1);
                self.resync();
                // Reported first (pump), then a heartbeat makes it ready.
                self.set_step(Step::Ready { next_heartbeat: now, unanswered, ttl });
            }
            Some(Step::Ready { .. }) => self.enter_ready(now, reply.ttl),
            _ => {}
        }
    }

    fn call_failed(&mut self, now: Timestamp, failure: Failure, out: &mut Vec<Action>) {
        let Some(call) = self.take_call() else { return };
        let heartbeat = matches!(call, Out::Heartbeat);
        match self.step() {
            Some(&mut Step::Greet { tries, again, .. }) if heartbeat && failure.transient && tries < GREETING_TRIES => {
                let retry_at = now.plus(retry_pause(&mut self.rng));
                self.set_step(Step::Greet { tries: tries + 1, retry_at: Some(retry_at), again });
                count(&self.counters.heartbeat_retries, 1);
            }
            Some(Step::Greet { again: false, .. }) if heartbeat && failure.refusal == Some(Refusal::UnknownNode) => {
                self.set_step(Step::Register { again: true });
                self.register(out);
            }
            Some(&mut Step::Ready { unanswered, ttl, .. })
                if heartbeat && failure.transient && unanswered + 1 < MAX_UNANSWERED =>
            {
                // A slow server or a reset stream: the connection lives, so
                // try again on it rather than queue for a new handshake. A
                // server that answers nothing several times in a row is gone
                // (a killed process sends no close): try the next one.
                // Refusals for want of a leader count too: a server that
                // stays without one is left for another.
                let next_heartbeat = now.plus(retry_pause(&mut self.rng));
                self.set_step(Step::Ready { next_heartbeat, unanswered: unanswered + 1, ttl });
                tracing::debug!(node = %self.config.node_id, error = %failure.message, "heartbeat not answered; retrying");
                if failure.refusal == Some(Refusal::NoLeader) {
                    count(&self.counters.writes_retried, 1);
                }
                count(&self.counters.heartbeat_retries, 1);
            }
            _ => {
                if matches!(call, Out::Report(_)) && failure.refusal == Some(Refusal::NotItsAllocation) {
                    // The servers' state moved on (an allocation was
                    // removed): start the watch over to learn the whole list.
                    self.last_index = 0;
                }
                self.lose(now, failure, out);
            }
        }
    }

    fn step(&mut self) -> Option<&mut Step> {
        match &mut self.link {
            Link::Up(session) => Some(&mut session.step),
            _ => None,
        }
    }

    fn set_step(&mut self, step: Step) {
        if let Some(current) = self.step() {
            *current = step;
        }
    }

    /// The heartbeat after a handshake's resync.
    fn confirm(&mut self, out: &mut Vec<Action>) {
        self.set_step(Step::Confirm);
        self.call(Out::Heartbeat, Call::Heartbeat, out);
    }

    fn enter_ready(&mut self, now: Timestamp, ttl: Duration) {
        let next_heartbeat = now.plus(self.period.unwrap_or(ttl));
        self.set_step(Step::Ready { next_heartbeat, unanswered: 0, ttl });
    }

    fn set_period(&mut self, now: Timestamp, period: Option<Duration>) {
        self.period = period;
        let known_ttl = self.heartbeat_ttl;
        if let Some(Step::Ready { next_heartbeat, ttl, .. }) = self.step() {
            let every = period.unwrap_or(known_ttl.unwrap_or(*ttl));
            *next_heartbeat = (*next_heartbeat).min(now.plus(every));
        }
    }

    /// Sends every status the servers do not have yet; whether a report went.
    fn report(&mut self, out: &mut Vec<Action>) -> bool {
        let Some((updates, sent)) = self.allocs.report() else { return false };
        self.call(Out::Report(sent), Call::Report(updates), out);
        true
    }

    /// Every allocation held must be reported again (the resync).
    fn resync(&mut self) {
        self.allocs.resync();
        count(&self.counters.resyncs, 1);
    }

    /// Applies a push (the allocation rules, `allocs.rs`).
    fn push(
        &mut self,
        now: Timestamp,
        index: u64,
        allocs: Vec<Arc<Allocation>>,
        listed: Option<Vec<AllocId>>,
        out: &mut Vec<Action>,
    ) {
        count(&self.counters.pushes, 1);
        self.last_index = index;
        self.allocs.push(now, allocs, listed, &self.counters, out);
        if !self.first_push_applied {
            self.first_push_applied = true;
            out.push(Action::FirstPushApplied);
        }
        self.allocs.collect_garbage(out);
    }
}

/// How long to wait before sending an unanswered heartbeat again: 0.5-1.5 s.
fn retry_pause(rng: &mut SmallRng) -> Duration {
    Duration::from_millis(500).mul_f64(1.0 + 2.0 * rng.random::<f64>())
}

/// The first heartbeat's step.
fn greeting(again: bool) -> Step {
    Step::Greet { tries: 1, retry_at: None, again }
}

/// The reconnect backoff: full jitter under a ceiling that doubles from
/// `base` up to `cap`.
#[derive(Debug)]
struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
}

impl Backoff {
    fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff { base, cap, attempt: 0 }
    }

    /// How long to wait before the next attempt.
    fn next_delay(&mut self, rng: &mut SmallRng) -> Duration {
        let ceiling = self.base.saturating_mul(1 << self.attempt.min(20)).min(self.cap);
        self.attempt = self.attempt.saturating_add(1);
        ceiling.mul_f64(rng.random::<f64>())
    }

    fn set_cap(&mut self, cap: Duration) {
        self.cap = cap;
    }

    fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod state_test;
