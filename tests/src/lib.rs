//! Integration and simulation tests live in `tests/`; this library holds
//! what several of them share: a [`Cluster`] around a [`SteppedServer`],
//! driven one call at a time, with scripted client calls; and in
//! [`client`] the simulated client that runs the real client core.

use std::sync::Arc;
use std::time::Duration;

use engine::node::endpoint::{NodeError, NodeResponse};
use engine::node::heartbeat::HeartbeatConfig;
use engine::state::{ClientAllocUpdate, Snapshot};
use engine::structs::{Allocation, ClientStatus, DesiredStatus, Job, Node, NodeId, NodeStatus, Resources};
use engine::testing::stepped::SteppedServer;

pub mod client;

/// A stepped server and the clients that talk to it.
#[derive(Debug)]
pub struct Cluster {
    /// The server.
    pub server: SteppedServer,
}

impl Cluster {
    /// A cluster whose ids and heartbeat jitter come from `seed`.
    pub fn new(seed: u64) -> Self {
        Cluster::with_heartbeat(seed, HeartbeatConfig::default())
    }

    /// [`Cluster::new`] with these heartbeat (and storm guard) settings.
    pub fn with_heartbeat(seed: u64, heartbeat: HeartbeatConfig) -> Self {
        Cluster { server: SteppedServer::new(seed, heartbeat) }
    }

    /// Node `n` with `cpu` MHz, as its client describes it.
    pub fn node(n: u128, cpu: u64) -> Node {
        Node::new_ready(NodeId::from_u128(n), "dc1", "general", Resources::new(cpu, 8_192, 10_000))
    }

    /// Registers node `n`; returns its id.
    pub fn add_node(&self, n: u128, cpu: u64) -> NodeId {
        let node = Cluster::node(n, cpu);
        self.server.nodes().register(node.clone()).expect("node registers");
        node.id
    }

    /// Registers (or updates) a job and runs the evals that follow.
    pub fn register_job(&mut self, job: &Job) {
        self.server.jobs().register(job.clone()).expect("job registers");
        self.settle();
    }

    /// The node's heartbeat.
    pub fn heartbeat(&self, node_id: NodeId) -> Result<NodeResponse, NodeError> {
        self.server.nodes().update_status(node_id, NodeStatus::Ready)
    }

    /// What a client does with the allocations it fetched: runs what it
    /// should run (reports `running`), never resumes what the servers
    /// stopped (reports `complete`). Only allocations whose reported status
    /// differs are sent, except while the node is `initializing`: a client
    /// that is back then reports every allocation it has (the reconnect
    /// protocol's resync), which lets the node become ready.
    pub fn report(&self, node_id: NodeId) -> Result<u64, NodeError> {
        let snapshot = self.server.store().snapshot();
        let resync = snapshot.node(node_id).is_some_and(|node| node.status == NodeStatus::Initializing);
        let updates: Vec<ClientAllocUpdate> = snapshot
            .allocs_by_node(node_id)
            .filter(|alloc| !alloc.client_terminal())
            .filter_map(|alloc| {
                let status = client_view(alloc).unwrap_or(alloc.client_status);
                (resync || status != alloc.client_status).then(|| update(alloc, status))
            })
            .collect();
        if updates.is_empty() {
            return Ok(snapshot.index());
        }
        self.server.nodes().update_allocs(node_id, updates)
    }

    /// Reports one allocation's status.
    pub fn report_one(&self, alloc: &Allocation, status: ClientStatus) -> Result<u64, NodeError> {
        self.server.nodes().update_allocs(alloc.node_id, vec![update(alloc, status)])
    }

    /// Advances the clock a second at a time, heartbeating `alive`, until
    /// `node_id` is marked as having missed its heartbeat.
    pub fn miss_heartbeat(&self, node_id: NodeId, alive: &[NodeId]) {
        for _ in 0..600 {
            for other in alive {
                self.heartbeat(*other).expect("a live node heartbeats");
            }
            self.server.advance(Duration::from_secs(1));
            let status = self.server.store().snapshot().node(node_id).expect("node").status;
            if status.is_terminal_for_scheduling() {
                return;
            }
        }
        panic!("node {node_id} never missed its heartbeat");
    }

    /// Advances the clock by `by` in one-second steps, heartbeating `alive`
    /// and running the evals that become ready after each step.
    pub fn pass_time(&mut self, by: Duration, alive: &[NodeId]) {
        for _ in 0..seconds_in(by) {
            self.tick(alive);
            self.settle();
        }
    }

    /// Advances the clock by `by` in one-second steps, heartbeating `alive`
    /// and running due timers, but no eval: evals that become ready wait.
    pub fn pass_time_without_evals(&self, by: Duration, alive: &[NodeId]) {
        for _ in 0..seconds_in(by) {
            self.tick(alive);
        }
    }

    /// One second: `alive` heartbeats, then the clock moves and timers run.
    fn tick(&self, alive: &[NodeId]) {
        for node_id in alive {
            self.heartbeat(*node_id).expect("a live node heartbeats");
        }
        self.server.advance(Duration::from_secs(1));
    }

    /// Runs evals until none is ready.
    pub fn settle(&mut self) -> usize {
        self.server.advance(Duration::ZERO);
        self.server.run_evals()
    }

    /// The newest state.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.server.store().snapshot()
    }
}

/// Whole seconds in `by`, a part of a second counting as one.
fn seconds_in(by: Duration) -> u64 {
    by.as_secs() + u64::from(by.subsec_nanos() > 0)
}

/// The status a client reports for an allocation it was handed, if any.
fn client_view(alloc: &Allocation) -> Option<ClientStatus> {
    match alloc.desired_status {
        DesiredStatus::Stop | DesiredStatus::Evict => Some(ClientStatus::Complete),
        DesiredStatus::Run if matches!(alloc.client_status, ClientStatus::Pending | ClientStatus::Unknown) => {
            Some(ClientStatus::Running)
        }
        DesiredStatus::Run => None,
    }
}

fn update(alloc: &Allocation, status: ClientStatus) -> ClientAllocUpdate {
    ClientAllocUpdate {
        alloc_id: alloc.id,
        node_id: alloc.node_id,
        client_status: status,
        client_description: String::new(),
        services: None,
        checks: None,
        health: None,
        task_states: Default::default(),
    }
}

/// Allocations of `job` the servers want running.
pub fn live_allocs(snapshot: &Snapshot, job: &Job) -> Vec<Arc<Allocation>> {
    snapshot.allocs_by_job(&job.key()).filter(|alloc| !alloc.terminal()).cloned().collect()
}

/// Allocations of `job` running on their client with desired status `run`.
pub fn running_allocs(snapshot: &Snapshot, job: &Job) -> Vec<Arc<Allocation>> {
    snapshot
        .allocs_by_job(&job.key())
        .filter(|alloc| alloc.desired_status == DesiredStatus::Run && alloc.client_status == ClientStatus::Running)
        .cloned()
        .collect()
}

/// Turns an endpoint call that never returns into a failure that names it,
/// instead of a test that hangs: each call is announced to a watchdog
/// thread, which aborts the process, printing the call and the seed, when
/// one is still outstanding `bound` after it was announced. It measures
/// nothing: the bound is generous and only there so that a hang ends.
#[derive(Debug)]
pub struct Watchdog {
    announce: std::sync::mpsc::Sender<Option<(&'static str, u64)>>,
    calls: std::cell::Cell<u64>,
}

impl Watchdog {
    /// A watchdog allowing each call `bound`.
    pub fn new(bound: Duration) -> Watchdog {
        let (announce, announced) = std::sync::mpsc::channel::<Option<(&'static str, u64)>>();
        std::thread::Builder::new()
            .name("endpoint-watchdog".into())
            .spawn(move || {
                let mut outstanding = None;
                loop {
                    match announced.recv_timeout(bound) {
                        Ok(call) => outstanding = call,
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                            if let Some((call, seed)) = outstanding {
                                eprintln!("seed {seed}: endpoint call {call} did not return within {bound:?}");
                                std::process::abort();
                            }
                        }
                        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                }
            })
            .expect("spawning the watchdog");
        Watchdog { announce, calls: std::cell::Cell::new(0) }
    }

    /// Runs the endpoint call `what` of run `seed` under the watchdog.
    pub fn call<T>(&self, what: &'static str, seed: u64, call: impl FnOnce() -> T) -> T {
        let _ = self.announce.send(Some((what, seed)));
        let result = call();
        let _ = self.announce.send(None);
        self.calls.set(self.calls.get() + 1);
        result
    }

    /// Calls made, every one of which returned.
    pub fn calls(&self) -> u64 {
        self.calls.get()
    }
}
