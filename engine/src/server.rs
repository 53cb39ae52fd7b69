//! `Server`: starts and wires every part of the engine in one process.
//!
//! [`Core`] is what every server is made of, wired once (the stepped
//! server drives the same core on one thread): the store and its writer,
//! the broker, the blocked tracker, the router installed as the store's
//! apply hook, the heartbeat timers and the eval reaper.
//!
//! Start-up: core → plan queue and applier → worker pool → reaper thread →
//! alloc update batcher → restore (pending and blocked evals back in the
//! broker and tracker, the failover TTL for every live node) → timer thread.
//!
//! The timer thread runs the broker's timers (delayed evals, nack
//! timeouts), heartbeat expiry, the retry of evals blocked after plan
//! failures, the deployment watcher, the node drainer, garbage
//! collection and the periodic dispatcher, then sleeps on the clock until the earliest next deadline;
//! whoever sets an earlier one wakes it (see [`crate::clock`]). Nothing
//! ticks.
//!
//! Shutdown, in order, so nothing is left behind and no eval is lost:
//! 1. pause the broker, so no new eval is handed out;
//! 2. stop the workers: each finishes or nacks the eval it holds;
//! 3. shut the plan queue (waiting plans are answered) and stop the applier;
//! 4. stop the reaper and the timer thread; write the open alloc update
//!    batch and stop the batcher;
//! 5. remove the apply hook, then shut the broker;
//! 6. shut the store, waking anything still waiting ([`Server::shutdown`];
//!    [`Server::stop`] ends at step 5 and leaves the store to its log, which
//!    a replicated server stops first).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::acl_endpoint::AclEndpoint;
use crate::clock::{SharedClock, Timestamp};
use crate::deployment::endpoint::DeploymentEndpoint;
use crate::deployment::watcher::DeploymentWatcher;
use crate::eval::blocked::{BlockedEvals, BlockedStats};
use crate::eval::broker::{BrokerConfig, BrokerStats, EvalBroker};
use crate::eval::reaper::{EvalReaper, ReaperConfig, ReaperHandle};
use crate::gc::{GarbageCollector, GcConfig};
use crate::job_endpoint::JobEndpoint;
use crate::node::drainer::NodeDrainer;
use crate::node::endpoint::NodeEndpoint;
use crate::node::heartbeat::{HeartbeatConfig, HeartbeatStats, Heartbeats};
use crate::node::storm::StormStats;
use crate::node::update_batch::{BatchConfig, BatchStats, FlusherHandle, UpdateBatcher};
use crate::operator_endpoint::OperatorEndpoint;
use crate::periodic::PeriodicDispatcher;
use crate::plan::apply::{PlanApplier, PlanApplierConfig, PlanApplierHandle, PlanApplierStats};
use crate::plan::queue::PlanQueue;
use crate::router::Router;
use crate::state::{StateStore, Writer};
use crate::structs::{EvalStatus, JobType, NodeStatus};
use crate::worker::{LocalWork, WorkerConfig, WorkerContext, WorkerPool, WorkerStats};

/// Unblock indexes older than this are forgotten.
const BLOCKED_PRUNE_AGE: Duration = Duration::from_secs(15 * 60);
/// How often the timer thread prunes them, when it is awake anyway.
const BLOCKED_PRUNE_INTERVAL: Duration = Duration::from_secs(60);
/// The longest the timer thread sleeps with nothing due (a bound, not a tick).
const IDLE_SLEEP: Duration = Duration::from_secs(60);

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Scheduling workers (default: number of cores).
    pub workers: usize,
    /// Scheduler types the workers serve.
    pub worker_types: Vec<JobType>,
    /// Worker settings.
    pub worker: WorkerConfig,
    /// Broker settings.
    pub broker: BrokerConfig,
    /// Reaper settings.
    pub reaper: ReaperConfig,
    /// Plan applier settings.
    pub plan_applier: PlanApplierConfig,
    /// Heartbeat TTLs.
    pub heartbeat: HeartbeatConfig,
    /// Batching of client alloc updates.
    pub alloc_updates: BatchConfig,
    /// Garbage collection.
    pub gc: GcConfig,
    /// Event batches the store keeps for the event stream (Nomad's
    /// `event_buffer_size`; 0: no events).
    pub event_buffer_size: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            workers: std::thread::available_parallelism().map_or(2, usize::from),
            worker_types: JobType::ALL.to_vec(),
            worker: WorkerConfig::default(),
            broker: BrokerConfig::default(),
            reaper: ReaperConfig::default(),
            plan_applier: PlanApplierConfig::default(),
            heartbeat: HeartbeatConfig::default(),
            alloc_updates: BatchConfig::default(),
            gc: GcConfig::default(),
            event_buffer_size: crate::events::DEFAULT_EVENT_BUFFER,
        }
    }
}

/// Everything the server counts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStats {
    /// State index.
    pub index: u64,
    /// Broker counters.
    pub broker: BrokerStats,
    /// Blocked evals.
    pub blocked: BlockedStats,
    /// Plan applier counters.
    pub plan_applier: PlanApplierStats,
    /// Worker counters.
    pub workers: WorkerStats,
    /// Plans waiting for the applier.
    pub plan_queue_depth: usize,
    /// Heartbeat timers.
    pub heartbeats: HeartbeatStats,
    /// The storm guard.
    pub storm_guard: StormStats,
    /// Client alloc update batches.
    pub alloc_updates: BatchStats,
}

/// The parts every server is made of, wired once (module docs). The
/// router is installed as the store's apply hook by [`Core::lead`].
#[derive(Debug)]
pub struct Core {
    /// Time.
    pub clock: SharedClock,
    /// The state.
    pub store: Arc<StateStore>,
    /// The one write path.
    pub writer: Writer,
    /// The eval broker.
    pub broker: Arc<EvalBroker>,
    /// The blocked-evals tracker.
    pub blocked: Arc<BlockedEvals>,
    /// What follows every write.
    pub router: Router,
    /// The heartbeat timers.
    pub heartbeats: Arc<Heartbeats>,
    /// The eval reaper (run inline, or on its thread with [`EvalReaper::spawn`]).
    pub reaper: EvalReaper,
    /// The deployment watcher, run with the timers.
    pub deployments: Arc<DeploymentWatcher>,
    /// The node drainer, run with the timers.
    pub drainer: Arc<NodeDrainer>,
    /// The garbage collector, run with the timers.
    pub gc: Arc<GarbageCollector>,
    /// The periodic dispatcher, run with the timers.
    pub periodic: Arc<PeriodicDispatcher>,
}

impl Core {
    /// The parts over `store`, which is its own log; `seed` fixes the
    /// heartbeat and reaper jitter (simulations).
    pub fn new(config: &ServerConfig, clock: SharedClock, store: Arc<StateStore>, seed: Option<u64>) -> Core {
        Core::over(config, clock, Writer::direct(store), seed)
    }

    /// The parts over `writer`'s log and store (a replicated log's); `seed`
    /// as for [`Core::new`] (none: drawn from the operating system).
    pub fn over(config: &ServerConfig, clock: SharedClock, writer: Writer, seed: Option<u64>) -> Core {
        let store = writer.store().clone();
        store.events().set_capacity(config.event_buffer_size);
        let broker = Arc::new(EvalBroker::new(config.broker.clone(), clock.clone()));
        let blocked = Arc::new(BlockedEvals::new(broker.clone(), clock.clone()));
        let deployments = DeploymentWatcher::new(writer.clone(), clock.clone());
        let drainer = NodeDrainer::new(writer.clone(), clock.clone());
        let router = Router::new(broker.clone(), blocked.clone()).waking_timers(clock.clone(), drainer.signals());
        let gc = GarbageCollector::new(config.gc.clone(), writer.clone(), clock.clone());
        let periodic = PeriodicDispatcher::new(writer.clone(), clock.clone());
        let seed = seed.unwrap_or_else(rand::random);
        let heartbeats = Heartbeats::seeded(config.heartbeat.clone(), clock.clone(), seed);
        let reaper = EvalReaper::new(
            config.reaper.clone(),
            broker.clone(),
            blocked.clone(),
            writer.clone(),
            clock.clone(),
            seed.wrapping_add(1),
        );
        Core { clock, store, writer, broker, blocked, router, heartbeats, reaper, deployments, drainer, gc, periodic }
    }

    /// Takes over the state as its leader (Nomad's `establishLeadership`):
    /// the router follows every write from now on, the pending and blocked
    /// evals already stored go back to the broker and the tracker, and every
    /// live node gets the failover heartbeat TTL.
    ///
    /// Capacity changes are not stored, and a blocked eval that the last
    /// leader released is still stored as blocked until a worker finishes
    /// it: had that leader gone first, the eval would wait for a change
    /// that came already. So every ready node counts as changed at the
    /// state's index, and each stored blocked eval that could use one of
    /// them runs once more (those that cannot stay parked).
    pub fn lead(&self) {
        self.store.set_hook(Some(Box::new(self.router.clone())));
        // Drains that started while another server led.
        self.drainer.signals().changed();
        let snapshot = self.store.snapshot();
        if snapshot.scheduler_config().is_some_and(|config| config.pause_eval_broker) {
            self.router.pause_broker(true);
        }
        for node in snapshot.nodes().filter(|node| node.status == NodeStatus::Ready) {
            self.blocked.unblock(node.computed_class, snapshot.index());
            self.blocked.unblock_node(node.id, snapshot.index());
        }
        for eval in snapshot.evals().filter(|eval| matches!(eval.status, EvalStatus::Pending | EvalStatus::Blocked)) {
            self.router.route_eval(eval);
        }
        self.heartbeats.initialize(&snapshot);
    }

    /// The job endpoint.
    pub fn jobs(&self) -> JobEndpoint {
        JobEndpoint::new(self.writer.clone(), self.clock.clone())
    }

    /// The deployment endpoint.
    pub fn deployment_endpoint(&self) -> DeploymentEndpoint {
        DeploymentEndpoint::new(self.writer.clone(), self.clock.clone())
    }

    /// The ACL endpoint.
    pub fn acl(&self) -> AclEndpoint {
        AclEndpoint::new(self.writer.clone(), self.clock.clone())
    }

    /// Runs every timer that is due now: delayed evals and nack timeouts,
    /// missed heartbeats, the retry of evals blocked after plan failures,
    /// the deployment watcher, the node drainer, garbage collection and
    /// the periodic dispatcher.
    pub fn run_timers(&self) -> TimersRun {
        let broker = self.broker.process_timers();
        let missed_heartbeats = self.heartbeats.expire(&self.writer);
        if self.blocked.next_deadline().is_some_and(|due| due <= self.clock.now()) {
            self.blocked.unblock_failed();
        }
        let deployments = self.deployments.run();
        let drains = self.drainer.run();
        let gc = self.gc.run();
        let periodic = self.periodic.run();
        let deadlines = [
            broker.next_deadline,
            self.heartbeats.next_deadline(),
            self.blocked.next_deadline(),
            deployments,
            drains,
            gc,
            periodic,
        ];
        TimersRun { next_deadline: deadlines.into_iter().flatten().min(), missed_heartbeats }
    }
}

/// What one run of the timers did, and when they are next due.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimersRun {
    /// When the next timer is due, if any.
    pub next_deadline: Option<Timestamp>,
    /// Nodes marked as having missed their heartbeat.
    pub missed_heartbeats: usize,
}

/// The in-process server; see the module docs.
#[derive(Debug)]
pub struct Server {
    core: Arc<Core>,
    plan_queue: Arc<PlanQueue>,
    applier: Mutex<Option<PlanApplierHandle>>,
    workers: WorkerPool,
    reaper: Mutex<Option<ReaperHandle>>,
    batcher: Arc<UpdateBatcher>,
    batcher_thread: Mutex<Option<FlusherHandle>>,
    timers: Mutex<Option<JoinHandle<()>>>,
    stopping: Arc<AtomicBool>,
    /// Whether dropping the server shuts the store: it does when the store
    /// is its own log, not when a replicated log applies to it (a deposed
    /// leader's store goes on following).
    owns_store: bool,
}

impl Server {
    /// Starts every part on an empty state (module docs, start-up order).
    pub fn start(config: ServerConfig, clock: SharedClock) -> Server {
        Server::start_on(config, clock, Arc::new(StateStore::new()))
    }

    /// Starts every part on existing state (module docs).
    pub fn start_on(config: ServerConfig, clock: SharedClock, store: Arc<StateStore>) -> Server {
        let mut server = Server::start_with(config, clock, Writer::direct(store));
        server.owns_store = true;
        server
    }

    /// Starts the leader services over `writer`'s log and the state its
    /// store holds (a recovered or replicated store): what a server does
    /// once it leads. [`Server::stop`] (or dropping it) stops them and
    /// leaves the store to its log.
    pub fn start_with(config: ServerConfig, clock: SharedClock, writer: Writer) -> Server {
        let core = Arc::new(Core::over(&config, clock.clone(), writer, None));
        let plan_queue = Arc::new(PlanQueue::new());
        let applier = PlanApplier::start(
            config.plan_applier.clone(),
            core.writer.clone(),
            plan_queue.clone(),
            core.broker.clone(),
            clock.clone(),
        );
        let context = WorkerContext::new(
            Arc::new(local_work(&core, &plan_queue)),
            core.store.clone(),
            clock.clone(),
            config.worker.clone(),
        );
        let workers = WorkerPool::start(Arc::new(context), config.workers, config.worker_types.clone());
        let reaper = core.reaper.clone().spawn();
        let batcher = UpdateBatcher::new(config.alloc_updates.clone(), core.writer.clone(), clock.clone());
        let batcher_thread = batcher.spawn();
        core.lead();
        let stopping = Arc::new(AtomicBool::new(false));
        let timers = spawn_timers(core.clone(), stopping.clone());
        Server {
            core,
            plan_queue,
            applier: Mutex::new(Some(applier)),
            workers,
            reaper: Mutex::new(Some(reaper)),
            batcher,
            batcher_thread: Mutex::new(Some(batcher_thread)),
            timers: Mutex::new(Some(timers)),
            stopping,
            owns_store: false,
        }
    }

    /// The job endpoint.
    pub fn jobs(&self) -> JobEndpoint {
        self.core.jobs()
    }

    /// The ACL endpoint (bootstrap, policies, tokens).
    pub fn acl(&self) -> AclEndpoint {
        self.core.acl()
    }

    /// The deployment endpoint (fail, pause, resume, promote, allocation health).
    pub fn deployments(&self) -> DeploymentEndpoint {
        self.core.deployment_endpoint()
    }

    /// The operator endpoint (the scheduler configuration).
    pub fn operator(&self) -> OperatorEndpoint {
        OperatorEndpoint::new(self.core.writer.clone())
    }

    /// The node endpoint.
    pub fn nodes(&self) -> NodeEndpoint {
        let core = &self.core;
        NodeEndpoint::new(core.writer.clone(), core.clock.clone(), core.heartbeats.clone(), Some(self.batcher.clone()))
    }

    /// The garbage collector (`PUT /v1/system/gc` forces a collection).
    pub fn gc(&self) -> &Arc<GarbageCollector> {
        &self.core.gc
    }

    /// The state store (read it through snapshots).
    pub fn store(&self) -> &Arc<StateStore> {
        &self.core.store
    }

    /// The one write path, for writes that are not an endpoint's.
    pub fn writer(&self) -> &Writer {
        &self.core.writer
    }

    /// The eval broker.
    pub fn broker(&self) -> &Arc<EvalBroker> {
        &self.core.broker
    }

    /// The blocked-evals tracker.
    pub fn blocked(&self) -> &Arc<BlockedEvals> {
        &self.core.blocked
    }

    /// The heartbeat timers.
    pub fn heartbeats(&self) -> &Arc<Heartbeats> {
        &self.core.heartbeats
    }

    /// The worker pool (resize, retarget, pause, resume, status).
    pub fn workers(&self) -> &WorkerPool {
        &self.workers
    }

    /// This server's broker, plan queue and log as a work source: what
    /// workers elsewhere (a follower's, through the network) schedule from.
    pub fn work(&self) -> LocalWork {
        local_work(&self.core, &self.plan_queue)
    }

    /// Everything the server counts.
    pub fn stats(&self) -> ServerStats {
        ServerStats {
            index: self.core.store.latest_index(),
            broker: self.core.broker.stats(),
            blocked: self.core.blocked.stats(),
            plan_applier: self.applier.lock().as_ref().map(PlanApplierHandle::stats).unwrap_or_default(),
            workers: self.workers.stats(),
            plan_queue_depth: self.plan_queue.depth(),
            heartbeats: self.core.heartbeats.stats(),
            storm_guard: self.core.heartbeats.storm_stats(),
            alloc_updates: self.batcher.stats(),
        }
    }

    /// Whether nothing is queued, held or being planned.
    pub fn is_idle(&self) -> bool {
        let broker = self.core.broker.stats();
        broker.total_ready + broker.total_unacked + broker.total_pending + broker.total_delayed == 0
            && self.plan_queue.depth() == 0
    }

    /// Stops everything and shuts the store (module docs, shutdown order).
    /// Idempotent.
    pub fn shutdown(&self) {
        self.stop();
        self.core.store.shutdown();
    }

    /// Stops the leader services (module docs, steps 1-5) and leaves the
    /// store running: a replicated log keeps applying to it. Idempotent.
    pub fn stop(&self) {
        if self.stopping.swap(true, Ordering::AcqRel) {
            return;
        }
        self.core.broker.pause();
        self.workers.stop();
        self.plan_queue.shutdown();
        if let Some(applier) = self.applier.lock().take() {
            applier.stop();
        }
        if let Some(reaper) = self.reaper.lock().take() {
            reaper.stop();
        }
        if let Some(timers) = self.timers.lock().take() {
            self.core.clock.wake_sleepers();
            let _ = timers.join();
        }
        self.batcher.stop();
        if let Some(batcher) = self.batcher_thread.lock().take() {
            let _ = batcher.join();
        }
        self.core.store.set_hook(None);
        self.core.broker.shutdown();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
        if self.owns_store {
            self.core.store.shutdown();
        }
    }
}

/// The leader's own work source over `core` and its plan queue.
fn local_work(core: &Core, plan_queue: &Arc<PlanQueue>) -> LocalWork {
    LocalWork { broker: core.broker.clone(), plan_queue: plan_queue.clone(), writer: core.writer.clone() }
}

/// The timer thread (module docs): runs what is due, then sleeps on the
/// clock until the next deadline, or [`IDLE_SLEEP`] when nothing is due.
fn spawn_timers(core: Arc<Core>, stopping: Arc<AtomicBool>) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name("server-timers".into())
        .spawn(move || {
            let mut next_prune = core.clock.now().plus(BLOCKED_PRUNE_INTERVAL);
            loop {
                // The epoch first: a deadline set from here on ends the sleep.
                let epoch = core.clock.sleep_epoch();
                if stopping.load(Ordering::Acquire) {
                    return;
                }
                let next = core.run_timers().next_deadline;
                let now = core.clock.now();
                if now >= next_prune {
                    core.blocked.prune(BLOCKED_PRUNE_AGE);
                    next_prune = now.plus(BLOCKED_PRUNE_INTERVAL);
                }
                core.clock.sleep_until(next.unwrap_or(now.plus(IDLE_SLEEP)), epoch);
            }
        })
        .expect("spawning the timer thread")
}

#[cfg(test)]
#[path = "server_test.rs"]
mod server_test;
