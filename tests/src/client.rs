//! A simulated client: the real client core ([`ClientState`], the one the
//! agent and loadgen's clients run) with a runtime that makes its calls
//! straight to a [`SteppedServer`]'s node endpoint, on the server's clock.
//! The network is the caller's to decide, step by step: a client may be
//! unreachable (every call times out, no connection opens) or have its
//! reports held back a while. Runners are the mock driver's light path;
//! what they report (a task failed, batch work completed) is the caller's
//! too, through [`SimClient::runners_say`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use drover::client::state::{
    Action, AgentCounters, AllocEvent, Answer, Call, ClientConfig, ClientState, Event, Failure, HeartbeatReply, Refusal,
};
use engine::clock::Timestamp;
use engine::node::endpoint::NodeError;
use engine::state::ClientAllocUpdate;
use engine::structs::{Node, NodeStatus};
use engine::testing::stepped::SteppedServer;

use crate::Watchdog;

/// The network between one client and the servers, for one step.
#[derive(Debug)]
pub struct Net<'a> {
    /// The servers.
    pub server: &'a SteppedServer,
    /// Every endpoint call goes through it.
    pub watchdog: &'a Watchdog,
    /// The run's seed, for the watchdog's message.
    pub seed: u64,
    /// Whether the client's packets get through; when not, calls time out
    /// and connections do not open.
    pub reachable: bool,
    /// Reports sent before this time arrive only then (a slow link).
    pub reports_held_until: Timestamp,
}

/// A report that reached the servers, and their answer.
#[derive(Debug)]
pub struct Delivered {
    /// What was reported.
    pub updates: Vec<ClientAllocUpdate>,
    /// The servers' answer.
    pub result: Result<u64, NodeError>,
}

/// One simulated client.
#[derive(Debug)]
pub struct SimClient {
    node: Node,
    core: ClientState,
    /// The index the open watch has pushed up to.
    watch: Option<u64>,
    /// A report the network holds back.
    held: Option<Call>,
}

impl SimClient {
    /// A client for `node` that has not connected yet; its jitter comes
    /// from `seed`.
    pub fn new(node: Node, seed: u64) -> SimClient {
        let config = ClientConfig {
            node_id: node.id,
            servers: vec![std::net::SocketAddr::from(([127, 0, 0, 1], 4647))],
            backoff_base: Duration::from_millis(250),
            backoff_cap: Duration::from_secs(30),
            real_tasks: false,
            gc_max_allocs: 50,
            seed,
        };
        SimClient { node, core: ClientState::new(config, Arc::new(AgentCounters::default())), watch: None, held: None }
    }

    /// The node the client is.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The client's core, to read.
    pub fn core(&self) -> &ClientState {
        &self.core
    }

    /// What the client counted.
    pub fn counters(&self) -> &AgentCounters {
        self.core.counters()
    }

    /// Time passes for the client: a held report arrives once due, then
    /// whatever else is due by now happens.
    pub fn tick(&mut self, net: &Net<'_>) -> Vec<Delivered> {
        let mut delivered = Vec::new();
        if self.held.is_some() && net.server.now() >= net.reports_held_until {
            let call = self.held.take().expect("checked above");
            let event = self.call(net, call, &mut delivered);
            self.run(net, event, &mut delivered);
        }
        self.run(net, Event::Tick, &mut delivered);
        delivered
    }

    /// The watch delivers a push if the node's allocations changed since
    /// the last one.
    pub fn watch(&mut self, net: &Net<'_>) -> Vec<Delivered> {
        let mut delivered = Vec::new();
        let Some(after) = self.watch.filter(|_| net.reachable) else { return delivered };
        let nodes = net.server.nodes();
        let found = net.watchdog.call("alloc watch", net.seed, || nodes.allocs(self.node.id, after, Duration::ZERO));
        let Ok((allocs, index)) = found else { return delivered };
        if after == 0 || allocs.iter().any(|alloc| alloc.modify_index > after) {
            self.watch = Some(index);
            self.run(net, Event::Push { index, allocs, listed: None }, &mut delivered);
        }
        delivered
    }

    /// The runners report their allocations' news.
    pub fn runners_say(&mut self, net: &Net<'_>, events: Vec<AllocEvent>) -> Vec<Delivered> {
        let mut delivered = Vec::new();
        if !events.is_empty() {
            self.run(net, Event::AllocsUpdated(events), &mut delivered);
        }
        delivered
    }

    /// Hands `event` to the core and performs what it asks, calls
    /// answered at once, until it waits.
    fn run(&mut self, net: &Net<'_>, event: Event, delivered: &mut Vec<Delivered>) {
        let now = net.server.now();
        let mut actions: VecDeque<Action> = self.core.handle(now, event).into();
        while let Some(action) = actions.pop_front() {
            if let Some(event) = self.perform(net, action, delivered) {
                actions.extend(self.core.handle(now, event));
            }
        }
    }

    fn perform(&mut self, net: &Net<'_>, action: Action, delivered: &mut Vec<Delivered>) -> Option<Event> {
        match action {
            Action::Connect(_) if net.reachable => Some(Event::Connected),
            Action::Connect(addr) => {
                Some(Event::Disconnected(Failure::lost(format!("connecting to {addr}: timed out"))))
            }
            Action::Disconnect { .. } => {
                self.watch = None;
                self.held = None;
                None
            }
            Action::Call(Call::Report(updates)) if net.reachable && net.server.now() < net.reports_held_until => {
                self.held = Some(Call::Report(updates));
                None
            }
            Action::Call(call) => Some(self.call(net, call, delivered)),
            // The mock driver's light path runs nothing; its ends come
            // from the caller (`runners_say`).
            Action::Start { .. } | Action::Stop(_) | Action::Destroy(_) | Action::FirstPushApplied => None,
        }
    }

    /// Makes `call` on the servers; its answer or failure.
    fn call(&mut self, net: &Net<'_>, call: Call, delivered: &mut Vec<Delivered>) -> Event {
        if !net.reachable {
            return Event::CallFailed(Failure { transient: true, refusal: None, message: "no answer".to_string() });
        }
        let (nodes, id, seed) = (net.server.nodes(), self.node.id, net.seed);
        let answer = match call {
            Call::Register => {
                let mut node = self.node.clone();
                node.status = NodeStatus::Initializing;
                net.watchdog.call("node register", seed, || nodes.register(node)).map(|_| Answer::Registered)
            }
            Call::Heartbeat => {
                net.watchdog.call("heartbeat", seed, || nodes.update_status(id, NodeStatus::Ready)).map(|reply| {
                    Answer::Heartbeat(HeartbeatReply {
                        status: reply.status,
                        ttl: reply.heartbeat_ttl,
                        servers: vec![],
                    })
                })
            }
            Call::Watch { after } => nodes.authenticate(id, self.node.secret_id).map(|()| {
                self.watch = Some(after);
                Answer::Watching
            }),
            Call::Report(updates) => {
                let result = net.watchdog.call("alloc update", seed, || nodes.update_allocs(id, updates.clone()));
                delivered.push(Delivered { updates, result: result.clone() });
                result.map(|_| Answer::Reported)
            }
        };
        match answer {
            Ok(answer) => Event::Answered(answer),
            Err(error) => Event::CallFailed(failure(&error)),
        }
    }
}

/// A refusal as the client core sees it.
fn failure(error: &NodeError) -> Failure {
    let refusal = match error {
        NodeError::UnknownNode(_) => Refusal::UnknownNode,
        NodeError::NotConnected { .. } => Refusal::NotConnected,
        NodeError::NotItsAllocation { .. } => Refusal::NotItsAllocation,
        _ => Refusal::Other,
    };
    Failure { transient: false, refusal: Some(refusal), message: error.to_string() }
}
