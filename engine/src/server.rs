//! `Server`: starts and wires every part of the engine in one process.
//!
//! Start-up: state store → broker → blocked evals → router → plan queue and
//! applier → worker pool → eval reaper → heartbeat timers and the alloc
//! update batcher → timer thread (broker timers, heartbeat expiry,
//! blocked-eval retries and pruning, driven by the server's clock).
//!
//! A server started on existing state ([`Server::start_on`], a restore or a
//! new leader) re-enqueues its pending and blocked evals and gives every
//! live node the failover heartbeat TTL before it can be marked down.
//!
//! Shutdown, in order, so nothing is left behind and no eval is lost:
//! 1. pause the broker, so no new eval is handed out;
//! 2. stop the workers: each finishes or nacks the eval it holds;
//! 3. shut the plan queue (waiting plans are answered) and stop the applier;
//! 4. stop the reaper and the timer thread; write the open alloc update
//!    batch and stop the batcher;
//! 5. shut the broker and the store, waking anything still waiting.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;

use crate::clock::SharedClock;
use crate::eval::blocked::{BlockedEvals, BlockedStats};
use crate::eval::broker::{BrokerConfig, BrokerStats, EvalBroker};
use crate::eval::reaper::{EvalReaper, ReaperConfig, ReaperHandle};
use crate::job_endpoint::JobEndpoint;
use crate::node::endpoint::NodeEndpoint;
use crate::node::heartbeat::{HeartbeatConfig, HeartbeatStats, Heartbeats};
use crate::node::update_batch::{BatchConfig, BatchStats, UpdateBatcher};
use crate::plan::apply::{OnApplied, PlanApplier, PlanApplierConfig, PlanApplierHandle, PlanApplierStats};
use crate::plan::queue::PlanQueue;
use crate::router::Router;
use crate::state::StateStore;
use crate::structs::{EvalStatus, JobType};
use crate::worker::{WorkerConfig, WorkerContext, WorkerPool, WorkerStats};

/// How often the timer thread runs the broker's timers.
const TIMER_INTERVAL: Duration = Duration::from_millis(20);
/// Unblock indexes older than this are forgotten.
const BLOCKED_PRUNE_AGE: Duration = Duration::from_secs(15 * 60);

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
        }
    }
}

/// Everything the server counts.
#[derive(Clone, Debug, Serialize)]
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
    /// Client alloc update batches.
    pub alloc_updates: BatchStats,
}

/// The in-process server; see the module docs.
#[derive(Debug)]
pub struct Server {
    clock: SharedClock,
    store: Arc<StateStore>,
    broker: Arc<EvalBroker>,
    blocked: Arc<BlockedEvals>,
    router: Router,
    plan_queue: Arc<PlanQueue>,
    applier: Mutex<Option<PlanApplierHandle>>,
    workers: WorkerPool,
    reaper: Mutex<Option<ReaperHandle>>,
    heartbeats: Arc<Heartbeats>,
    batcher: Arc<UpdateBatcher>,
    batcher_thread: Mutex<Option<JoinHandle<()>>>,
    timers: Mutex<Option<JoinHandle<()>>>,
    stopping: Arc<AtomicBool>,
}

impl Server {
    /// Starts every part on an empty state (module docs, start-up order).
    pub fn start(config: ServerConfig, clock: SharedClock) -> Server {
        Server::start_on(config, clock, Arc::new(StateStore::new()))
    }

    /// Starts every part on existing state (module docs).
    pub fn start_on(config: ServerConfig, clock: SharedClock, store: Arc<StateStore>) -> Server {
        let broker = Arc::new(EvalBroker::new(config.broker.clone(), clock.clone()));
        let blocked = Arc::new(BlockedEvals::new(broker.clone(), clock.clone()));
        let router = Router::new(store.clone(), broker.clone(), blocked.clone());
        let plan_queue = Arc::new(PlanQueue::new());
        let on_applied: OnApplied = {
            let router = router.clone();
            Arc::new(move |applied| router.route(applied, None))
        };
        let applier = PlanApplier::start(
            config.plan_applier.clone(),
            store.clone(),
            plan_queue.clone(),
            broker.clone(),
            clock.clone(),
            on_applied,
        );
        let context = WorkerContext::new(
            router.clone(),
            broker.clone(),
            plan_queue.clone(),
            clock.clone(),
            config.worker.clone(),
        );
        let workers = WorkerPool::start(Arc::new(context), config.workers, config.worker_types.clone());
        let reaper =
            EvalReaper::new(config.reaper.clone(), broker.clone(), blocked.clone(), store.clone(), clock.clone())
                .spawn();
        let heartbeats = Heartbeats::new(config.heartbeat.clone(), clock.clone());
        let batcher = UpdateBatcher::new(config.alloc_updates.clone(), router.clone(), clock.clone());
        let batcher_thread = batcher.spawn();
        restore(&store, &router, &heartbeats);
        let stopping = Arc::new(AtomicBool::new(false));
        let timers = spawn_timers(
            TimerParts { broker: broker.clone(), blocked: blocked.clone(), heartbeats: heartbeats.clone() },
            router.clone(),
            stopping.clone(),
        );
        Server {
            clock,
            store,
            broker,
            blocked,
            router,
            plan_queue,
            applier: Mutex::new(Some(applier)),
            workers,
            reaper: Mutex::new(Some(reaper)),
            heartbeats,
            batcher,
            batcher_thread: Mutex::new(Some(batcher_thread)),
            timers: Mutex::new(Some(timers)),
            stopping,
        }
    }

    /// The job endpoint.
    pub fn jobs(&self) -> JobEndpoint {
        JobEndpoint::new(self.router.clone(), self.clock.clone())
    }

    /// The node endpoint.
    pub fn nodes(&self) -> NodeEndpoint {
        NodeEndpoint::new(self.router.clone(), self.clock.clone(), self.heartbeats.clone(), Some(self.batcher.clone()))
    }

    /// The state store (read it through snapshots).
    pub fn store(&self) -> &Arc<StateStore> {
        &self.store
    }

    /// The router, for writes that are not an endpoint's.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// The eval broker.
    pub fn broker(&self) -> &Arc<EvalBroker> {
        &self.broker
    }

    /// The blocked-evals tracker.
    pub fn blocked(&self) -> &Arc<BlockedEvals> {
        &self.blocked
    }

    /// The heartbeat timers.
    pub fn heartbeats(&self) -> &Arc<Heartbeats> {
        &self.heartbeats
    }

    /// The worker pool (resize, retarget, pause, resume, status).
    pub fn workers(&self) -> &WorkerPool {
        &self.workers
    }

    /// Everything the server counts.
    pub fn stats(&self) -> ServerStats {
        ServerStats {
            index: self.store.latest_index(),
            broker: self.broker.stats(),
            blocked: self.blocked.stats(),
            plan_applier: self.applier.lock().as_ref().map(PlanApplierHandle::stats).unwrap_or_default(),
            workers: self.workers.stats(),
            plan_queue_depth: self.plan_queue.depth(),
            heartbeats: self.heartbeats.stats(),
            alloc_updates: self.batcher.stats(),
        }
    }

    /// Whether nothing is queued, held or being planned.
    pub fn is_idle(&self) -> bool {
        let broker = self.broker.stats();
        broker.total_ready + broker.total_unacked + broker.total_pending + broker.total_delayed == 0
            && self.plan_queue.depth() == 0
    }

    /// Stops everything (module docs, shutdown order). Idempotent.
    pub fn shutdown(&self) {
        if self.stopping.swap(true, Ordering::AcqRel) {
            return;
        }
        self.broker.pause();
        self.workers.stop();
        self.plan_queue.shutdown();
        if let Some(applier) = self.applier.lock().take() {
            applier.stop();
        }
        if let Some(reaper) = self.reaper.lock().take() {
            reaper.stop();
        }
        if let Some(timers) = self.timers.lock().take() {
            let _ = timers.join();
        }
        self.batcher.stop();
        if let Some(batcher) = self.batcher_thread.lock().take() {
            let _ = batcher.join();
        }
        self.broker.shutdown();
        self.store.shutdown();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Re-enqueues the pending and blocked evals of existing state and gives
/// every live node the failover heartbeat TTL (Nomad's `establishLeadership`).
fn restore(store: &StateStore, router: &Router, heartbeats: &Heartbeats) {
    let snapshot = store.snapshot();
    for eval in snapshot.evals().filter(|eval| matches!(eval.status, EvalStatus::Pending | EvalStatus::Blocked)) {
        router.route_eval(eval);
    }
    heartbeats.initialize(&snapshot);
}

/// What the timer thread drives.
struct TimerParts {
    broker: Arc<EvalBroker>,
    blocked: Arc<BlockedEvals>,
    heartbeats: Arc<Heartbeats>,
}

fn spawn_timers(parts: TimerParts, router: Router, stopping: Arc<AtomicBool>) -> JoinHandle<()> {
    let TimerParts { broker, blocked, heartbeats } = parts;
    std::thread::Builder::new()
        .name("server-timers".into())
        .spawn(move || {
            let mut ticks: u64 = 0;
            while !stopping.load(Ordering::Acquire) {
                broker.process_timers();
                heartbeats.expire(&router);
                ticks += 1;
                if ticks % 50 == 0 {
                    blocked.unblock_failed();
                }
                if ticks % 3_000 == 0 {
                    blocked.prune(BLOCKED_PRUNE_AGE);
                }
                std::thread::sleep(TIMER_INTERVAL);
            }
        })
        .expect("spawning the timer thread")
}
