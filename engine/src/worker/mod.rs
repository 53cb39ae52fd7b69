//! Scheduling workers and their pool.
//!
//! Each worker loops over its [`WorkSource`] (this server's broker, plan
//! queue and log while it leads; the leader's, over the network, on a
//! follower of a cluster):
//! 1. Dequeue an eval of its enabled scheduler types, with a timeout so that
//!    pause and shutdown are noticed.
//! 2. Wait until the state store reaches the eval's wait index (its modify
//!    index, or more for an eval handed out by another server). If it does not
//!    within the sync limit, nack and hold off on a long backoff that ends
//!    early as soon as the state catches up (a server that is behind must not
//!    churn through evals).
//! 3. Take a snapshot and run the scheduler for the eval's type, with the
//!    worker as its [`Planner`]: plans go to the source's plan queue; on a partial
//!    refusal the worker waits for the refresh index in its own store and
//!    hands the scheduler the newer state; eval updates are written through
//!    the source (the leader's apply hook routes them, the worker's own
//!    reblock included: the broker enqueues it again once the worker acks).
//! 4. Ack on success, nack on error and back off exponentially (fast base
//!    for retryable errors such as plan conflicts, slow base for others,
//!    capped), resetting on success. Shutdown is its own outcome, never
//!    counted as a failure. A worker waits for its plans, but not for the
//!    eval writes that end an eval (its status): when the log has not
//!    answered them by the time the scheduler returns (a durable log's
//!    fsync), the worker goes on to its next eval and its acker thread
//!    acks this one once they are written, or nacks it if the log refused
//!    them. The eval stays held meanwhile, so the broker hands out no
//!    other eval of its job.
//!
//! The pool can be resized and re-targeted at run time; each worker can be
//! paused and resumed and reports its status and current activity.

mod claims;
mod source;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam::channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex, RwLock};

pub use claims::ClaimTable;
use serde::{Deserialize, Serialize};
pub use source::{LocalWork, WorkError, WorkSource};

use crate::clock::SharedClock;
use crate::eval::broker::{BrokerError, Dequeued, Token};
use crate::scheduler::{new_scheduler, Algorithm, NodeClaims, Planner, SchedulerConfig, SchedulerError, State};
use crate::state::{PendingWrite, StateStore, WaitError};
use crate::structs::{EvalId, Evaluation, JobType, Plan, PlanResult};

/// Worker settings.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// How long one dequeue waits before checking for pause or shutdown.
    pub dequeue_timeout: Duration,
    /// How long to wait for the state to reach an eval's index.
    pub sync_limit: Duration,
    /// How long to hold off after the sync limit passed (ends early on catch-up).
    pub long_backoff: Duration,
    /// Backoff base after a plan conflict or a retryable error.
    pub backoff_fast_base: Duration,
    /// Backoff base after other errors.
    pub backoff_slow_base: Duration,
    /// Longest backoff.
    pub backoff_cap: Duration,
    /// Scoring strategy for the schedulers.
    pub algorithm: Algorithm,
    /// Share node claims between workers to avoid plan conflicts.
    pub node_claims: bool,
}

impl Default for WorkerConfig {
    /// Nomad's values where it has them.
    fn default() -> Self {
        WorkerConfig {
            dequeue_timeout: Duration::from_millis(500),
            sync_limit: Duration::from_secs(5),
            long_backoff: Duration::from_secs(10),
            backoff_fast_base: Duration::from_millis(20),
            backoff_slow_base: Duration::from_millis(500),
            backoff_cap: Duration::from_secs(10),
            algorithm: Algorithm::Binpack,
            node_claims: true,
        }
    }
}

/// A worker's lifecycle status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum WorkerStatus {
    /// Thread starting.
    Starting,
    /// Running.
    Started,
    /// Asked to pause; finishing its current eval.
    Pausing,
    /// Paused.
    Paused,
    /// Asked to stop; finishing its current eval.
    Stopping,
    /// Stopped.
    Stopped,
}

/// What a worker is doing right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum WorkerActivity {
    /// Not in the loop.
    Idle,
    /// Blocked in dequeue.
    WaitingToDequeue,
    /// Waiting for the state to reach an index.
    WaitingForIndex,
    /// Running a scheduler.
    Scheduling,
    /// Waiting for the plan applier.
    Submitting,
    /// Backing off after an error.
    Backoff,
}

impl WorkerStatus {
    fn from_u8(value: u8) -> Self {
        match value {
            0 => WorkerStatus::Starting,
            1 => WorkerStatus::Started,
            2 => WorkerStatus::Pausing,
            3 => WorkerStatus::Paused,
            4 => WorkerStatus::Stopping,
            _ => WorkerStatus::Stopped,
        }
    }
}

impl WorkerActivity {
    fn from_u8(value: u8) -> Self {
        match value {
            0 => WorkerActivity::Idle,
            1 => WorkerActivity::WaitingToDequeue,
            2 => WorkerActivity::WaitingForIndex,
            3 => WorkerActivity::Scheduling,
            4 => WorkerActivity::Submitting,
            _ => WorkerActivity::Backoff,
        }
    }
}

/// One worker's report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WorkerInfo {
    /// Worker id, unique in the pool.
    pub id: usize,
    /// Lifecycle status.
    pub status: WorkerStatus,
    /// Current activity.
    pub activity: WorkerActivity,
    /// Scheduler types it serves.
    pub types: Vec<JobType>,
}

/// Counters over all workers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerStats {
    /// Evals acked.
    pub evals_processed: u64,
    /// Evals nacked.
    pub evals_nacked: u64,
    /// Plans submitted.
    pub plans_submitted: u64,
    /// Backoffs taken.
    pub backoff_count: u64,
    /// Time spent in backoff, milliseconds.
    pub backoff_ms_total: u64,
    /// Times the state did not reach an eval's index within the sync limit.
    pub index_timeouts: u64,
}

#[derive(Debug, Default)]
struct Counters {
    evals_processed: AtomicU64,
    evals_nacked: AtomicU64,
    plans_submitted: AtomicU64,
    backoff_count: AtomicU64,
    backoff_ms_total: AtomicU64,
    index_timeouts: AtomicU64,
}

/// A worker's controls and its thread.
#[derive(Debug)]
struct WorkerSlot {
    control: Arc<Control>,
    thread: Option<JoinHandle<()>>,
}

/// Everything workers share.
#[derive(Debug)]
pub struct WorkerContext {
    /// Where evals come from and plans and eval updates go.
    pub source: Arc<dyn WorkSource>,
    /// The state schedulers read (this server's own, replicated).
    pub store: Arc<StateStore>,
    /// Time.
    pub clock: SharedClock,
    /// Settings.
    pub config: WorkerConfig,
    claims: Arc<ClaimTable>,
    counters: Counters,
}

impl WorkerContext {
    /// A context over a work source and the store schedulers read.
    pub fn new(source: Arc<dyn WorkSource>, store: Arc<StateStore>, clock: SharedClock, config: WorkerConfig) -> Self {
        WorkerContext { source, store, clock, config, claims: Arc::default(), counters: Counters::default() }
    }
}

/// A worker's controls, shared with its thread.
#[derive(Debug)]
struct Control {
    id: usize,
    paused: Mutex<bool>,
    resumed: Condvar,
    stop: AtomicBool,
    types: RwLock<Vec<JobType>>,
    types_generation: AtomicU64,
    /// The generation of `types` the worker is done with the ones before:
    /// it starts every dequeue with fresh types, so this is set when it
    /// starts one, parks for a pause, or stops (then to `u64::MAX`).
    types_seen: Mutex<u64>,
    types_seen_changed: Condvar,
    status: AtomicU8,
    activity: AtomicU8,
}

impl Control {
    fn set_status(&self, status: WorkerStatus) {
        self.status.store(status as u8, Ordering::Release);
    }
    fn set_activity(&self, activity: WorkerActivity) {
        self.activity.store(activity as u8, Ordering::Release);
    }
    fn info(&self) -> WorkerInfo {
        WorkerInfo {
            id: self.id,
            status: WorkerStatus::from_u8(self.status.load(Ordering::Acquire)),
            activity: WorkerActivity::from_u8(self.activity.load(Ordering::Acquire)),
            types: self.types.read().clone(),
        }
    }
    /// The worker is done with every `types` older than `generation`.
    fn saw_types(&self, generation: u64) {
        *self.types_seen.lock() = generation;
        self.types_seen_changed.notify_all();
    }
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
}

/// Why processing one eval did not end in an ack.
#[derive(Debug)]
enum Failure {
    /// The server is shutting down.
    Shutdown,
    /// The state did not reach the eval's index in time.
    IndexTimeout(u64),
    /// The scheduler gave up; its error says whether to retry soon.
    Scheduler(SchedulerError),
}

impl From<SchedulerError> for Failure {
    fn from(error: SchedulerError) -> Self {
        match error {
            SchedulerError::ShuttingDown => Failure::Shutdown,
            other => Failure::Scheduler(other),
        }
    }
}

/// A worker's acker: acks, in order, the evals its worker left with their
/// writes unanswered, once they are answered; an eval whose write the log
/// refused goes back to the broker. Ends with its worker, after the last.
fn ack_loop(ctx: &WorkerContext, to_ack: Receiver<Unacked>) {
    for unacked in to_ack {
        settle(ctx, unacked);
    }
}

/// Waits for all of an eval's writes, then acks it, or nacks it if one was
/// refused (what the others wrote is written before the eval goes back).
fn settle(ctx: &WorkerContext, Unacked { eval, token, writes }: Unacked) {
    let refused = writes.into_iter().filter_map(|write| write.wait().err()).reduce(|first, _| first);
    match refused {
        None => ack(ctx, eval, token),
        Some(error) => {
            tracing::warn!(%eval, %error, "the eval's status was not written; it goes back to the broker");
            nack(ctx, eval, token);
        }
    }
}

/// Ends the hold on an eval done, counting it.
fn ack(ctx: &WorkerContext, eval: EvalId, token: Token) {
    if ctx.source.ack(eval, token).is_ok() {
        ctx.counters.evals_processed.fetch_add(1, Ordering::Relaxed);
    }
}

/// Gives an eval that failed here back to the broker, counting it.
fn nack(ctx: &WorkerContext, eval: EvalId, token: Token) {
    if ctx.source.nack(eval, token).is_ok() {
        ctx.counters.evals_nacked.fetch_add(1, Ordering::Relaxed);
    }
}

/// The pool; see the module docs.
#[derive(Debug)]
pub struct WorkerPool {
    ctx: Arc<WorkerContext>,
    workers: Mutex<Vec<WorkerSlot>>,
    next_id: AtomicUsize,
    types: RwLock<Vec<JobType>>,
}

impl WorkerPool {
    /// Starts `n` workers serving `types`.
    pub fn start(ctx: Arc<WorkerContext>, n: usize, types: Vec<JobType>) -> Self {
        let pool = WorkerPool {
            ctx,
            workers: Mutex::new(Vec::new()),
            next_id: AtomicUsize::new(0),
            types: RwLock::new(types),
        };
        pool.resize(n);
        pool
    }

    /// Grows or shrinks the pool to `n` workers. Removed workers finish
    /// their current eval first.
    pub fn resize(&self, n: usize) {
        let removed: Vec<_> = {
            let mut workers = self.workers.lock();
            while workers.len() < n {
                workers.push(self.spawn());
            }
            let keep = n.min(workers.len());
            workers.drain(keep..).collect()
        };
        stop_and_join(removed);
    }

    fn spawn(&self) -> WorkerSlot {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let control = Arc::new(Control {
            id,
            paused: Mutex::new(false),
            resumed: Condvar::new(),
            stop: AtomicBool::new(false),
            types: RwLock::new(self.types.read().clone()),
            types_generation: AtomicU64::new(0),
            types_seen: Mutex::new(0),
            types_seen_changed: Condvar::new(),
            status: AtomicU8::new(0),
            activity: AtomicU8::new(0),
        });
        let (ctx, thread_control) = (self.ctx.clone(), control.clone());
        let thread = std::thread::Builder::new()
            .name(format!("worker-{id}"))
            .spawn(move || Worker { ctx, control: thread_control, backoff_attempt: 0, writes: Vec::new() }.run())
            .expect("spawning a worker thread");
        WorkerSlot { control, thread: Some(thread) }
    }

    /// Sets the scheduler types every worker serves. Returns once every
    /// worker is done with the old ones (it started a dequeue with the new
    /// types, within one dequeue timeout, or is paused or stopped), so no
    /// eval of a dropped type is taken after it returns. It waits on each
    /// worker's condvar; nothing spins.
    pub fn set_types(&self, types: Vec<JobType>) {
        *self.types.write() = types.clone();
        let workers: Vec<Arc<Control>> = self.workers.lock().iter().map(|slot| slot.control.clone()).collect();
        for control in &workers {
            *control.types.write() = types.clone();
            control.types_generation.fetch_add(1, Ordering::AcqRel);
        }
        for control in &workers {
            let wanted = control.types_generation.load(Ordering::Acquire);
            let mut seen = control.types_seen.lock();
            while *seen < wanted {
                control.types_seen_changed.wait(&mut seen);
            }
        }
    }

    /// Pauses one worker (all when `id` is `None`); it finishes its current eval first.
    pub fn pause(&self, id: Option<usize>) {
        self.for_workers(id, |control| {
            *control.paused.lock() = true;
            if control.info().status == WorkerStatus::Started {
                control.set_status(WorkerStatus::Pausing);
            }
        });
    }

    /// Resumes paused workers.
    pub fn resume(&self, id: Option<usize>) {
        self.for_workers(id, |control| {
            *control.paused.lock() = false;
            control.resumed.notify_all();
        });
    }

    fn for_workers(&self, id: Option<usize>, action: impl Fn(&Control)) {
        for slot in self.workers.lock().iter().filter(|slot| id.is_none_or(|id| id == slot.control.id)) {
            action(&slot.control);
        }
    }

    /// Every worker's status and activity.
    pub fn workers(&self) -> Vec<WorkerInfo> {
        self.workers.lock().iter().map(|slot| slot.control.info()).collect()
    }

    /// Counters over all workers.
    pub fn stats(&self) -> WorkerStats {
        let c = &self.ctx.counters;
        WorkerStats {
            evals_processed: c.evals_processed.load(Ordering::Relaxed),
            evals_nacked: c.evals_nacked.load(Ordering::Relaxed),
            plans_submitted: c.plans_submitted.load(Ordering::Relaxed),
            backoff_count: c.backoff_count.load(Ordering::Relaxed),
            backoff_ms_total: c.backoff_ms_total.load(Ordering::Relaxed),
            index_timeouts: c.index_timeouts.load(Ordering::Relaxed),
        }
    }

    /// Stops every worker and waits for their threads.
    pub fn stop(&self) {
        let all: Vec<_> = self.workers.lock().drain(..).collect();
        stop_and_join(all);
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.stop();
    }
}

fn stop_and_join(workers: Vec<WorkerSlot>) {
    for WorkerSlot { control, .. } in &workers {
        control.stop.store(true, Ordering::Release);
        control.set_status(WorkerStatus::Stopping);
        *control.paused.lock() = false;
        control.resumed.notify_all();
    }
    for WorkerSlot { thread, .. } in workers {
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

/// One worker thread.
struct Worker {
    ctx: Arc<WorkerContext>,
    control: Arc<Control>,
    backoff_attempt: u32,
    /// The eval writes the scheduler made for the eval in hand.
    writes: Vec<PendingWrite>,
}

/// An eval processed whose writes were not answered when its worker moved
/// on: its acker acks it once they are (step 4).
struct Unacked {
    eval: EvalId,
    token: Token,
    writes: Vec<PendingWrite>,
}

impl Worker {
    fn run(mut self) {
        self.control.set_status(WorkerStatus::Started);
        std::thread::scope(|scope| {
            let (acks, to_ack) = crossbeam::channel::unbounded();
            let ctx = self.ctx.clone();
            std::thread::Builder::new()
                .name(format!("worker-{}-acks", self.control.id))
                .spawn_scoped(scope, move || ack_loop(&ctx, to_ack))
                .expect("spawning a worker's acker");
            self.work(&acks);
        });
        self.control.set_activity(WorkerActivity::Idle);
        self.control.set_status(WorkerStatus::Stopped);
        self.control.saw_types(u64::MAX);
    }

    /// Steps 1-4 until the worker is stopped.
    fn work(&mut self, acks: &Sender<Unacked>) {
        while !self.control.stopping() {
            self.wait_while_paused();
            if self.control.stopping() {
                break;
            }
            self.control.set_activity(WorkerActivity::WaitingToDequeue);
            let generation = self.control.types_generation.load(Ordering::Acquire);
            let types = self.control.types.read().clone();
            self.control.saw_types(generation);
            let started = std::time::Instant::now();
            match self.ctx.source.dequeue(&types, self.ctx.config.dequeue_timeout) {
                Err(WorkError::Broker(BrokerError::ShuttingDown)) => break,
                Err(_) | Ok(None) => continue,
                Ok(Some(held)) => {
                    crate::timing::record_since("drover.worker.dequeue_eval", started);
                    self.handle(held, acks)
                }
            }
        }
    }

    fn wait_while_paused(&self) {
        let mut paused = self.control.paused.lock();
        if *paused {
            self.control.set_status(WorkerStatus::Paused);
            self.control.set_activity(WorkerActivity::Idle);
            // Resumed, it dequeues with whatever types are set then.
            self.control.saw_types(self.control.types_generation.load(Ordering::Acquire));
            while *paused && !self.control.stopping() {
                self.control.resumed.wait(&mut paused);
            }
            if !self.control.stopping() {
                self.control.set_status(WorkerStatus::Started);
            }
        }
    }

    /// Steps 2-4 for one eval. When the scheduler's eval writes are still
    /// being made durable, the worker goes on to its next eval and its
    /// acker acks this one once they are: a worker waits for its plans,
    /// but not for the status write that ends an eval.
    fn handle(&mut self, held: Dequeued, acks: &Sender<Unacked>) {
        let mut outcome = self.process(&held);
        let mut unanswered = Vec::new();
        for mut write in std::mem::take(&mut self.writes) {
            match write.answer_now() {
                // A write the log refused fails the eval, as a scheduler error.
                Some(Err(refused)) if outcome.is_ok() => outcome = Err(Failure::from(SchedulerError::from(refused))),
                Some(_) => {}
                None => unanswered.push(write),
            }
        }
        match outcome {
            Ok(()) if !unanswered.is_empty() => {
                self.backoff_attempt = 0;
                let unacked = Unacked { eval: held.eval.id, token: held.token, writes: unanswered };
                if let Err(unsent) = acks.send(unacked) {
                    settle(&self.ctx, unsent.into_inner());
                }
            }
            Ok(()) => {
                ack(&self.ctx, held.eval.id, held.token);
                self.backoff_attempt = 0;
            }
            Err(failure) => {
                // What the scheduler wrote is written before the eval goes back.
                for write in unanswered {
                    let _ = write.wait();
                }
                nack(&self.ctx, held.eval.id, held.token);
                self.back_off(failure, &held.eval);
            }
        }
    }

    fn process(&mut self, held: &Dequeued) -> Result<(), Failure> {
        self.control.set_activity(WorkerActivity::WaitingForIndex);
        let store = &self.ctx.store;
        let started = std::time::Instant::now();
        let snapshot = match store.snapshot_min_index(held.wait_index, self.ctx.config.sync_limit) {
            Ok(snapshot) => snapshot,
            Err(WaitError::Shutdown { .. }) => return Err(Failure::Shutdown),
            Err(WaitError::Timeout { wanted, .. }) => return Err(Failure::IndexTimeout(wanted)),
        };
        crate::timing::record_since("drover.worker.wait_for_index", started);
        // An operator deleted it while the broker was paused (or it was
        // collected): there is nothing to schedule, and writing its status
        // would bring it back.
        if snapshot.eval(held.eval.id).is_none() {
            return Ok(());
        }
        self.control.set_activity(WorkerActivity::Scheduling);
        let mut planner = WorkerPlanner {
            ctx: &self.ctx,
            control: &self.control,
            eval_id: held.eval.id,
            token: held.token,
            writes: &mut self.writes,
        };
        let claims: Arc<dyn NodeClaims> = self.ctx.claims.clone();
        let config = SchedulerConfig {
            algorithm: self.ctx.config.algorithm,
            seed: self.control.id as u64,
            now: self.ctx.clock.now(),
            claims: self.ctx.config.node_claims.then_some((claims, self.control.id as u64)),
        };
        let state: Arc<dyn State> = snapshot;
        let started = std::time::Instant::now();
        let result = new_scheduler(held.eval.eval_type, state, &mut planner, config).process(&held.eval);
        crate::timing::record_since_labelled(
            "drover.worker.invoke_scheduler",
            "type",
            held.eval.eval_type.as_str(),
            started,
        );
        self.ctx.claims.release(self.control.id as u64);
        result.map_err(Failure::from)
    }

    fn back_off(&mut self, failure: Failure, eval: &Evaluation) {
        let store = self.ctx.store.clone();
        let config = &self.ctx.config;
        let started = std::time::Instant::now();
        self.control.set_activity(WorkerActivity::Backoff);
        match failure {
            Failure::Shutdown => return,
            Failure::IndexTimeout(wanted) => {
                self.ctx.counters.index_timeouts.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(eval = %eval.id, wanted, "state did not reach the eval's index; backing off");
                // Ends as soon as the state catches up (or the store shuts down).
                let _ = store.snapshot_min_index(wanted, config.long_backoff);
            }
            Failure::Scheduler(error) if self.control.stopping() => {
                tracing::debug!(eval = %eval.id, %error, "eval nacked while stopping");
                return;
            }
            Failure::Scheduler(error) => {
                let base = if error.is_retryable() { config.backoff_fast_base } else { config.backoff_slow_base };
                self.sleep_backoff(base, &error, eval);
            }
        }
        self.ctx.counters.backoff_count.fetch_add(1, Ordering::Relaxed);
        self.ctx.counters.backoff_ms_total.fetch_add(started.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Exponential backoff from `base`, capped; a pause or stop cuts it short.
    fn sleep_backoff(&mut self, base: Duration, error: &SchedulerError, eval: &Evaluation) {
        tracing::warn!(eval = %eval.id, %error, "eval nacked; backing off");
        let delay = base.saturating_mul(1u32 << self.backoff_attempt.min(16)).min(self.ctx.config.backoff_cap);
        self.backoff_attempt += 1;
        let mut paused = self.control.paused.lock();
        if !self.control.stopping() {
            self.control.resumed.wait_for(&mut paused, delay);
        }
    }
}

/// The worker as the scheduler's [`Planner`].
struct WorkerPlanner<'a> {
    ctx: &'a WorkerContext,
    control: &'a Control,
    eval_id: EvalId,
    token: Token,
    /// The eval writes made, answered or not (step 4).
    writes: &'a mut Vec<PendingWrite>,
}

impl Planner for WorkerPlanner<'_> {
    fn submit_plan(&mut self, mut plan: Plan) -> Result<(PlanResult, Option<Arc<dyn State>>), SchedulerError> {
        self.control.set_activity(WorkerActivity::Submitting);
        // Scheduling may have been slow: keep the hold alive while the plan waits.
        let _ = self.ctx.source.outstanding_reset(self.eval_id, self.token);
        plan.eval_token = self.token.0;
        self.ctx.counters.plans_submitted.fetch_add(1, Ordering::Relaxed);
        let started = std::time::Instant::now();
        let answer = self.ctx.source.submit_plan(plan);
        crate::timing::record_since("drover.worker.submit_plan", started);
        // What was committed stays claimed for workers reading older snapshots.
        match &answer {
            Ok(result) if result.alloc_index > 0 => self.ctx.claims.settle(self.control.id as u64, result.alloc_index),
            _ => self.ctx.claims.release(self.control.id as u64),
        }
        let result = answer?;
        self.control.set_activity(WorkerActivity::Scheduling);
        if result.refresh_index == 0 {
            return Ok((result, None));
        }
        self.control.set_activity(WorkerActivity::WaitingForIndex);
        let state = self.ctx.store.snapshot_min_index(result.refresh_index, self.ctx.config.sync_limit)?;
        self.control.set_activity(WorkerActivity::Scheduling);
        let state: Arc<dyn State> = state;
        Ok((result, Some(state)))
    }

    fn write_eval(&mut self, eval: Evaluation) -> Result<(), SchedulerError> {
        let mut write = self.ctx.source.submit_evals(self.eval_id, self.token, vec![eval]);
        match write.answer_now() {
            // Answered at once (a store that is its own log, a call to the
            // leader): a refusal is the scheduler's error, as any other.
            Some(answer) => {
                answer?;
            }
            None => self.writes.push(write),
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "worker_test.rs"]
mod worker_test;
