//! The evaluation broker: hands evaluations to scheduling workers, at most
//! one per job at a time, and takes them back when a worker fails.
//!
//! The protocol, for one eval:
//! 1. [`EvalBroker::enqueue`] admits it. An eval with a `wait_until` in the
//!    future waits in the delay heap. Otherwise, if its job has no eval
//!    outstanding it becomes the job's outstanding eval and goes to the
//!    ready queue of its scheduler type; if it has, it waits as *pending*.
//! 2. [`EvalBroker::dequeue`] hands the highest-priority ready eval (then the
//!    lowest creation index) of the requested scheduler types to a worker
//!    with a fresh [`Token`] and a nack deadline.
//! 3. [`EvalBroker::ack`] with that token finishes it. Of the job's pending
//!    evals, the newest of the highest priority becomes ready; all the others
//!    are superseded and become *cancelable*, to be written as `canceled` by
//!    the reaper in batches ([`EvalBroker::take_cancelable`]). An eval
//!    enqueued again while a worker held it (the unblock of an eval that
//!    worker had just reblocked) is enqueued now.
//! 4. [`EvalBroker::nack`] with that token (or the nack deadline passing,
//!    seen by [`EvalBroker::process_timers`]) gives it back: ready again after
//!    a short delay the first time and a longer one after that, or, once it
//!    was delivered `delivery_limit` times, into the failed queue, where the
//!    reaper marks it failed and creates a delayed follow-up. A re-enqueue
//!    noted while it was held is dropped: the eval itself runs again.
//!
//! Concurrency: per-job and per-eval bookkeeping live in sharded maps, so
//! workers on different jobs do not serialize on one lock on the dequeue and
//! ack paths; each scheduler type's ready queue has a lock of its own held
//! only for a push or a pop; a worker that finds nothing parks on a
//! [`WakeGate`]. Time comes from the injected clock; the only
//! real-time wait is a worker blocking in `dequeue` on an empty broker.

use std::cmp::{Ordering as CmpOrdering, Reverse};
use std::collections::{BinaryHeap, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam::channel::{self, Receiver, Sender};
use crossbeam::utils::CachePadded;
use hashbrown::hash_table::Entry;
use hashbrown::{DefaultHashBuilder, HashTable};
use parking_lot::{Mutex, MutexGuard};

use super::wake::WakeGate;
use serde::{Deserialize, Serialize};

use crate::clock::{SharedClock, Timestamp};
use crate::structs::{EvalId, Evaluation, JobKey, JobType};

const SHARDS: usize = 64;

/// Broker settings.
#[derive(Clone, Debug)]
pub struct BrokerConfig {
    /// How long a worker may hold an eval without acking before it is nacked.
    pub nack_timeout: Duration,
    /// Deliveries after which a nacked eval goes to the failed queue.
    pub delivery_limit: u32,
    /// Delay before an eval nacked once is ready again.
    pub initial_nack_delay: Duration,
    /// Delay before an eval nacked more than once is ready again.
    pub subsequent_nack_delay: Duration,
}

impl Default for BrokerConfig {
    /// Nomad's defaults.
    fn default() -> Self {
        BrokerConfig {
            nack_timeout: Duration::from_secs(60),
            delivery_limit: 3,
            initial_nack_delay: Duration::from_secs(1),
            subsequent_nack_delay: Duration::from_secs(20),
        }
    }
}

/// Proof that a worker holds an eval; ack and nack must present it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Token(pub u64);

/// Why the broker refused an ack, a nack or a dequeue.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum BrokerError {
    /// The eval is not handed out to anyone (never dequeued, already acked
    /// or nacked, or taken back after its nack timeout).
    #[error("evaluation {0} is not outstanding")]
    NotOutstanding(EvalId),
    /// The eval is handed out under another token: the caller's hold expired.
    #[error("evaluation {0} is outstanding under another token")]
    TokenMismatch(EvalId),
    /// The broker is shutting down.
    #[error("the eval broker is shutting down")]
    ShuttingDown,
}

/// A dequeued eval and the token to ack or nack it with.
#[derive(Clone, Debug)]
pub struct Dequeued {
    /// The evaluation.
    pub eval: Arc<Evaluation>,
    /// The token.
    pub token: Token,
    /// The state index the worker's store must reach before it schedules:
    /// the eval's modify index here. A leader handing the eval to another
    /// server's worker raises it to the newest modify index of any eval of
    /// the job, so that server's store holds what the job's earlier evals
    /// committed (Nomad's wait index).
    pub wait_index: u64,
}

impl Dequeued {
    /// `eval` held under `token`, to schedule once the store has the eval.
    pub fn new(eval: Arc<Evaluation>, token: Token) -> Dequeued {
        let wait_index = eval.modify_index;
        Dequeued { eval, token, wait_index }
    }
}

/// Counts per scheduler type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchedulerStats {
    /// Ready to dequeue.
    pub ready: i64,
    /// Handed out, not yet acked.
    pub unacked: i64,
}

/// A snapshot of the broker's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerStats {
    /// Ready to dequeue, all types.
    pub total_ready: i64,
    /// Handed out, not yet acked.
    pub total_unacked: i64,
    /// Held back behind another eval of the same job.
    pub total_pending: i64,
    /// Waiting for a `wait_until` or a nack re-enqueue delay.
    pub total_delayed: i64,
    /// Superseded, waiting to be written as canceled.
    pub total_cancelable: i64,
    /// In the failed queue, waiting to be written as failed.
    pub total_failed_queue: i64,
    /// Evals that reached the delivery limit, ever.
    pub total_delivery_limit_reached: u64,
    /// Evals nacked because their nack timeout passed, ever.
    pub total_nack_timeouts: u64,
    /// Per scheduler type, in [`JobType::ALL`] order.
    pub by_scheduler: Vec<(JobType, SchedulerStats)>,
}

/// What [`EvalBroker::process_timers`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimerOutcome {
    /// Evals nacked because their nack timeout passed.
    pub nacked: usize,
    /// Delayed evals that came due and were enqueued.
    pub released: usize,
    /// When the next nack timeout or delayed eval is due, if any: the timer
    /// thread sleeps until then (an earlier one set meanwhile wakes it).
    pub next_deadline: Option<Timestamp>,
}

/// A ready eval: higher priority first, then lower creation index, then
/// arrival order.
#[derive(Debug)]
struct ReadyItem {
    /// The eval's hash in the broker's tables, taken while the eval was hot.
    eval_hash: u64,
    priority: u8,
    create_index: u64,
    seq: u64,
    eval: Arc<Evaluation>,
}

impl ReadyItem {
    fn rank(&self) -> (u8, Reverse<u64>, Reverse<u64>) {
        (self.priority, Reverse(self.create_index), Reverse(self.seq))
    }
}

/// The ready evals of one scheduler type: a FIFO per priority level, kept
/// sorted by creation index, and a bitmap of the non-empty levels. New evals
/// arrive in index order and go to the back in O(1); the older ones that come
/// back (promoted pending evals, nacked evals) belong near the front, where
/// a `VecDeque` insert moves few items. A binary heap of 100,000 items, by
/// contrast, takes a cache miss per level on every pop.
#[derive(Debug)]
struct ReadyQueue {
    levels: Vec<VecDeque<ReadyItem>>,
    non_empty: u128,
}

impl Default for ReadyQueue {
    fn default() -> Self {
        ReadyQueue { levels: (0..=MAX_PRIORITY_LEVEL).map(|_| VecDeque::new()).collect(), non_empty: 0 }
    }
}

/// Priorities above this share its level (jobs are validated to 1..=100).
const MAX_PRIORITY_LEVEL: usize = 100;

impl ReadyQueue {
    fn level_of(priority: u8) -> usize {
        usize::from(priority).min(MAX_PRIORITY_LEVEL)
    }

    fn push(&mut self, item: ReadyItem) {
        let level_index = Self::level_of(item.priority);
        let level = &mut self.levels[level_index];
        let key = (item.create_index, item.seq);
        if level.back().is_none_or(|last| (last.create_index, last.seq) <= key) {
            level.push_back(item);
        } else {
            let position = level.partition_point(|queued| (queued.create_index, queued.seq) < key);
            level.insert(position, item);
        }
        self.non_empty |= 1 << level_index;
    }

    fn top_level(&self) -> Option<usize> {
        (self.non_empty != 0).then(|| 127 - self.non_empty.leading_zeros() as usize)
    }

    fn peek(&self) -> Option<&ReadyItem> {
        self.levels[self.top_level()?].front()
    }

    fn pop(&mut self) -> Option<ReadyItem> {
        let level_index = self.top_level()?;
        let level = &mut self.levels[level_index];
        let item = level.pop_front();
        if level.is_empty() {
            self.non_empty &= !(1 << level_index);
        }
        item
    }
}

/// A delayed eval: earliest `ready_at` first.
#[derive(Debug)]
struct DelayedItem {
    /// Earliest due first, then first delayed: the max-heap's order.
    key: (Reverse<Timestamp>, Reverse<u64>),
    eval: Arc<Evaluation>,
}

impl PartialEq for DelayedItem {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}
impl Eq for DelayedItem {}
impl PartialOrd for DelayedItem {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for DelayedItem {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        self.key.cmp(&other.key)
    }
}

/// Per-job serialization: the one outstanding eval and those held back.
#[derive(Debug)]
struct JobState {
    key: JobKey,
    outstanding: Option<EvalId>,
    pending: Vec<Arc<Evaluation>>,
}

/// A handed-out eval.
#[derive(Debug, Clone, Copy)]
struct Hold {
    token: Token,
    deadline: Timestamp,
}

/// Everything the broker tracks about one eval between enqueue and ack.
#[derive(Debug)]
struct EvalEntry {
    id: EvalId,
    eval: Arc<Evaluation>,
    /// The job's hash, taken at enqueue so the ack need not read the job's name.
    job_hash: u64,
    deliveries: u32,
    hold: Option<Hold>,
    /// A newer version of the eval enqueued while a worker held it (an
    /// unblock of an eval the worker just reblocked): enqueued on the ack.
    requeue: Option<Arc<Evaluation>>,
}

/// What releasing a hold hands back.
struct Released {
    eval: Arc<Evaluation>,
    deliveries: u32,
    job_hash: u64,
    requeue: Option<Arc<Evaluation>>,
}

/// A hash table split into independently locked shards. Callers hash a key
/// once and use that hash both to pick the shard and inside its table.
#[derive(Debug)]
struct Sharded<T> {
    shards: Vec<CachePadded<Mutex<HashTable<T>>>>,
}

impl<T> Sharded<T> {
    fn new() -> Self {
        Sharded { shards: (0..SHARDS).map(|_| CachePadded::new(Mutex::new(HashTable::new()))).collect() }
    }

    /// The shard for `hash`. Middle bits pick it: hashbrown uses the low
    /// bits for the bucket and the top seven for its control bytes.
    fn lock(&self, hash: u64) -> MutexGuard<'_, HashTable<T>> {
        self.shards[(hash >> 32) as usize % SHARDS].lock()
    }
}

/// Atomic counters behind [`BrokerStats`]. The two written on every
/// dequeue and ack sit on cache lines of their own.
#[derive(Debug, Default)]
struct Counters {
    ready: CachePadded<[AtomicI64; JobType::ALL.len()]>,
    unacked: CachePadded<[AtomicI64; JobType::ALL.len()]>,
    pending: AtomicI64,
    delayed: AtomicI64,
    cancelable: AtomicI64,
    failed_queue: AtomicI64,
    delivery_limit_reached: AtomicU64,
    nack_timeouts: AtomicU64,
}

/// The evaluation broker. See the module docs for the protocol.
#[derive(Debug)]
pub struct EvalBroker {
    config: BrokerConfig,
    clock: SharedClock,
    ready: [Mutex<ReadyQueue>; JobType::ALL.len()],
    jobs: Sharded<JobState>,
    evals: Sharded<EvalEntry>,
    hasher: DefaultHashBuilder,
    delayed: Mutex<BinaryHeap<DelayedItem>>,
    failed: Mutex<VecDeque<Arc<Evaluation>>>,
    cancelable: Mutex<Vec<Arc<Evaluation>>>,
    cancelable_signal: (Sender<()>, Receiver<()>),
    counters: Counters,
    next_seq: AtomicU64,
    next_token: AtomicU64,
    /// Where dequeuing workers park (see [`super::wake`]).
    gate: WakeGate,
    paused: AtomicBool,
    shutting_down: AtomicBool,
}

impl EvalBroker {
    /// A broker with `config`, reading time from `clock`.
    pub fn new(config: BrokerConfig, clock: SharedClock) -> Self {
        EvalBroker {
            config,
            clock,
            ready: Default::default(),
            jobs: Sharded::new(),
            evals: Sharded::new(),
            hasher: DefaultHashBuilder::default(),
            delayed: Mutex::new(BinaryHeap::new()),
            failed: Mutex::new(VecDeque::new()),
            cancelable: Mutex::new(Vec::new()),
            cancelable_signal: channel::bounded(1),
            counters: Counters::default(),
            next_seq: AtomicU64::new(0),
            next_token: AtomicU64::new(rand::random::<u64>() >> 1),
            gate: WakeGate::new(),
            paused: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
        }
    }

    /// The broker's settings.
    pub fn config(&self) -> &BrokerConfig {
        &self.config
    }

    fn eval_hash(&self, eval_id: EvalId) -> u64 {
        self.hasher.hash_one(eval_id)
    }

    fn job_hash(&self, namespace: &str, job_id: &str) -> u64 {
        self.hasher.hash_one((namespace, job_id))
    }

    /// Admits an eval (protocol step 1). An eval the broker already tracks
    /// is ignored, unless a worker holds it: then it is enqueued again once
    /// that worker acks (Nomad's re-queue by token; a reblocked eval that is
    /// unblocked before its worker is done is not lost).
    pub fn enqueue(&self, eval: Arc<Evaluation>) {
        let hash = self.eval_hash(eval.id);
        let job_hash = self.job_hash(&eval.namespace, &eval.job_id);
        match self.evals.lock(hash).entry(hash, |entry| entry.id == eval.id, |entry| self.eval_hash(entry.id)) {
            Entry::Occupied(mut held) if held.get().hold.is_some() => {
                held.get_mut().requeue = Some(eval);
                return;
            }
            Entry::Occupied(_) => return,
            Entry::Vacant(slot) => {
                let entry =
                    EvalEntry { id: eval.id, eval: eval.clone(), job_hash, deliveries: 0, hold: None, requeue: None };
                slot.insert(entry);
            }
        }
        match eval.wait_until {
            Some(ready_at) if ready_at > self.clock.now() => self.push_delayed(eval, ready_at),
            _ => self.admit(eval, job_hash),
        }
    }

    /// Admits every eval of `evals`.
    pub fn enqueue_all(&self, evals: impl IntoIterator<Item = Arc<Evaluation>>) {
        for eval in evals {
            self.enqueue(eval);
        }
    }

    /// Makes the eval ready if its job has no other eval outstanding, else
    /// holds it back as pending.
    fn admit(&self, eval: Arc<Evaluation>, hash: u64) {
        let ready = {
            let mut jobs = self.jobs.lock(hash);
            let job = jobs
                .entry(hash, |job| is_job_of(job, &eval), |job| self.job_hash(&job.key.namespace, &job.key.id))
                .or_insert_with(|| JobState { key: eval.job_key(), outstanding: None, pending: Vec::new() })
                .into_mut();
            match job.outstanding {
                None => {
                    job.outstanding = Some(eval.id);
                    true
                }
                Some(id) if id == eval.id => true,
                Some(_) => {
                    job.pending.push(eval.clone());
                    false
                }
            }
        };
        if ready {
            self.push_ready(eval);
        } else {
            self.counters.pending.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn push_ready(&self, eval: Arc<Evaluation>) {
        let kind = eval.eval_type.index();
        let item = ReadyItem {
            eval_hash: self.eval_hash(eval.id),
            priority: eval.priority,
            create_index: eval.create_index,
            seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
            eval,
        };
        self.ready[kind].lock().push(item);
        // The gate's fence orders this before its read of the sleepers
        // (see `super::wake`).
        self.counters.ready[kind].fetch_add(1, Ordering::Relaxed);
        self.gate.notify();
    }

    fn push_delayed(&self, eval: Arc<Evaluation>, ready_at: Timestamp) {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        self.delayed.lock().push(DelayedItem { key: (Reverse(ready_at), Reverse(seq)), eval });
        self.counters.delayed.fetch_add(1, Ordering::Relaxed);
        self.clock.deadline_set(ready_at);
    }

    /// A fresh token and nack deadline for a hand-out.
    fn new_hold(&self) -> Hold {
        let token = Token(self.next_token.fetch_add(1, Ordering::Relaxed));
        let deadline = self.clock.now().plus(self.config.nack_timeout);
        self.clock.deadline_set(deadline);
        Hold { token, deadline }
    }

    /// Hands out the best ready eval of `types` (protocol step 2), waiting up
    /// to `timeout` for one. `Ok(None)` means none came in time (or the
    /// broker stayed paused).
    pub fn dequeue(&self, types: &[JobType], timeout: Duration) -> Result<Option<Dequeued>, BrokerError> {
        if let Some(dequeued) = self.try_dequeue(types)? {
            return Ok(Some(dequeued));
        }
        let deadline = Instant::now() + timeout;
        self.gate.wait_for(Some(deadline), || self.try_dequeue(types).transpose()).transpose()
    }

    /// Hands out the best ready eval of `types` without waiting.
    pub fn try_dequeue(&self, types: &[JobType]) -> Result<Option<Dequeued>, BrokerError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(BrokerError::ShuttingDown);
        }
        if self.paused.load(Ordering::Acquire) {
            return Ok(None);
        }
        let Some(ReadyItem { eval, eval_hash: hash, .. }) = self.pop_best(types) else {
            return Ok(None);
        };
        let hold = self.new_hold();
        {
            let mut evals = self.evals.lock(hash);
            let entry =
                evals.find_mut(hash, |entry| entry.id == eval.id).expect("a ready eval is tracked until it is acked");
            entry.deliveries += 1;
            entry.hold = Some(hold);
        }
        self.counters.unacked[eval.eval_type.index()].fetch_add(1, Ordering::Relaxed);
        Ok(Some(Dequeued::new(eval, hold.token)))
    }

    /// Pops the best head among the ready queues of `types`. The queues are
    /// locked in a fixed order (by type) so that two dequeuers never deadlock.
    fn pop_best(&self, types: &[JobType]) -> Option<ReadyItem> {
        let wanted = types.iter().fold(0u8, |mask, kind| mask | 1 << kind.index());
        let mut queues: smallvec::SmallVec<[(usize, MutexGuard<'_, ReadyQueue>); JobType::ALL.len()]> =
            smallvec::SmallVec::new();
        for kind in 0..JobType::ALL.len() {
            if wanted & 1 << kind != 0 && self.counters.ready[kind].load(Ordering::Relaxed) > 0 {
                queues.push((kind, self.ready[kind].lock()));
            }
        }
        let best = match queues.len() {
            0 => return None,
            1 => 0,
            _ => {
                queues
                    .iter()
                    .enumerate()
                    .filter_map(|(position, (_, queue))| queue.peek().map(|item| (item.rank(), position)))
                    .max()?
                    .1
            }
        };
        let (kind, queue) = &mut queues[best];
        let item = queue.pop()?;
        self.counters.ready[*kind].fetch_sub(1, Ordering::Relaxed);
        Some(item)
    }

    /// Removes the hold on an eval if `token` matches it; on an ack, stops
    /// tracking the eval too.
    fn release_hold(&self, eval_id: EvalId, token: Token, acked: bool) -> Result<Released, BrokerError> {
        let hash = self.eval_hash(eval_id);
        let mut evals = self.evals.lock(hash);
        let Ok(mut slot) = evals.find_entry(hash, |entry| entry.id == eval_id) else {
            return Err(BrokerError::NotOutstanding(eval_id));
        };
        let entry = slot.get_mut();
        match entry.hold {
            None => return Err(BrokerError::NotOutstanding(eval_id)),
            Some(hold) if hold.token != token => return Err(BrokerError::TokenMismatch(eval_id)),
            Some(_) => entry.hold = None,
        }
        self.counters.unacked[entry.eval.eval_type.index()].fetch_sub(1, Ordering::Relaxed);
        let (deliveries, job_hash, requeue) = (entry.deliveries, entry.job_hash, entry.requeue.take());
        let eval = if acked { slot.remove().0.eval } else { entry.eval.clone() };
        Ok(Released { eval, deliveries, job_hash, requeue })
    }

    /// Finishes a handed-out eval (protocol step 3).
    pub fn ack(&self, eval_id: EvalId, token: Token) -> Result<(), BrokerError> {
        let Released { eval, job_hash, requeue, .. } = self.release_hold(eval_id, token, true)?;
        let (next, superseded) = {
            let mut jobs = self.jobs.lock(job_hash);
            let Ok(mut slot) = jobs.find_entry(job_hash, |job| is_job_of(job, &eval)) else {
                unreachable!("an outstanding eval's job is tracked until the ack")
            };
            let job = slot.get_mut();
            let (next, superseded) = pick_next_pending(&mut job.pending);
            job.outstanding = next.as_ref().map(|next| next.id);
            if job.outstanding.is_none() {
                slot.remove();
            }
            (next, superseded)
        };
        let released = superseded.len() as i64 + i64::from(next.is_some());
        self.counters.pending.fetch_sub(released, Ordering::Relaxed);
        if !superseded.is_empty() {
            self.mark_cancelable(superseded);
        }
        if let Some(next) = next {
            self.push_ready(next);
        }
        if let Some(requeue) = requeue {
            self.enqueue(requeue);
        }
        Ok(())
    }

    fn mark_cancelable(&self, superseded: Vec<Arc<Evaluation>>) {
        for eval in &superseded {
            let hash = self.eval_hash(eval.id);
            if let Ok(slot) = self.evals.lock(hash).find_entry(hash, |entry| entry.id == eval.id) {
                slot.remove();
            }
        }
        self.counters.cancelable.fetch_add(superseded.len() as i64, Ordering::Relaxed);
        self.cancelable.lock().extend(superseded);
        // Pace the reaper by acks: wake it if it is not already awake.
        let _ = self.cancelable_signal.0.try_send(());
    }

    /// Gives a handed-out eval back (protocol step 4).
    pub fn nack(&self, eval_id: EvalId, token: Token) -> Result<(), BrokerError> {
        let Released { eval, deliveries, .. } = self.release_hold(eval_id, token, false)?;
        if deliveries >= self.config.delivery_limit {
            self.counters.delivery_limit_reached.fetch_add(1, Ordering::Relaxed);
            self.counters.failed_queue.fetch_add(1, Ordering::Relaxed);
            self.failed.lock().push_back(eval);
            return Ok(());
        }
        let delay = match deliveries {
            0 | 1 => self.config.initial_nack_delay,
            _ => self.config.subsequent_nack_delay,
        };
        if delay.is_zero() {
            self.push_ready(eval);
        } else {
            self.push_delayed(eval, self.clock.now().plus(delay));
        }
        Ok(())
    }

    /// Extends the nack deadline of a handed-out eval, for a worker that is
    /// still busy with it.
    pub fn outstanding_reset(&self, eval_id: EvalId, token: Token) -> Result<(), BrokerError> {
        let deadline = self.clock.now().plus(self.config.nack_timeout);
        let hash = self.eval_hash(eval_id);
        let mut evals = self.evals.lock(hash);
        let entry = evals.find_mut(hash, |entry| entry.id == eval_id).ok_or(BrokerError::NotOutstanding(eval_id))?;
        match entry.hold.as_mut() {
            None => Err(BrokerError::NotOutstanding(eval_id)),
            Some(hold) if hold.token != token => Err(BrokerError::TokenMismatch(eval_id)),
            Some(hold) => {
                hold.deadline = deadline;
                Ok(())
            }
        }
    }

    /// The token an eval is handed out under, if it is.
    pub fn outstanding(&self, eval_id: EvalId) -> Option<Token> {
        let hash = self.eval_hash(eval_id);
        self.evals
            .lock(hash)
            .find(hash, |entry| entry.id == eval_id)
            .and_then(|entry| entry.hold.map(|hold| hold.token))
    }

    /// Nacks handed-out evals whose deadline passed and enqueues delayed
    /// evals that came due. The server calls this periodically; tests call it
    /// after moving the clock.
    pub fn process_timers(&self) -> TimerOutcome {
        let now = self.clock.now();
        let (expired, next_hold) = self.expired_holds(now);
        let mut outcome = TimerOutcome::default();
        for (eval_id, token) in expired {
            if self.nack(eval_id, token).is_ok() {
                self.counters.nack_timeouts.fetch_add(1, Ordering::Relaxed);
                outcome.nacked += 1;
            }
        }
        for eval in self.due_delayed(now) {
            let job_hash = self.job_hash(&eval.namespace, &eval.job_id);
            self.admit(eval, job_hash);
            outcome.released += 1;
        }
        let next_delayed = self.delayed.lock().peek().map(|item| item.key.0 .0);
        outcome.next_deadline = [next_hold, next_delayed].into_iter().flatten().min();
        outcome
    }

    /// The holds whose nack deadline passed, and the earliest deadline of
    /// the others. One pass over the tracked evals per timer wake-up; no
    /// index of deadlines is kept, so the dequeue and ack paths pay nothing.
    fn expired_holds(&self, now: Timestamp) -> (Vec<(EvalId, Token)>, Option<Timestamp>) {
        let mut expired = Vec::new();
        let mut next: Option<Timestamp> = None;
        for shard in &self.evals.shards {
            for entry in shard.lock().iter() {
                match entry.hold {
                    Some(hold) if hold.deadline <= now => expired.push((entry.id, hold.token)),
                    Some(hold) => next = Some(next.map_or(hold.deadline, |next| next.min(hold.deadline))),
                    None => {}
                }
            }
        }
        (expired, next)
    }

    fn due_delayed(&self, now: Timestamp) -> Vec<Arc<Evaluation>> {
        let mut delayed = self.delayed.lock();
        let mut due = Vec::new();
        while delayed.peek().is_some_and(|item| item.key.0 .0 <= now) {
            due.push(delayed.pop().expect("peeked").eval);
        }
        self.counters.delayed.fetch_sub(due.len() as i64, Ordering::Relaxed);
        due
    }

    /// Takes up to `max` superseded evals for the reaper to write as canceled.
    pub fn take_cancelable(&self, max: usize) -> Vec<Arc<Evaluation>> {
        let mut cancelable = self.cancelable.lock();
        let take = max.min(cancelable.len());
        let batch: Vec<_> = cancelable.drain(..take).collect();
        self.counters.cancelable.fetch_sub(batch.len() as i64, Ordering::Relaxed);
        batch
    }

    /// Signalled on acks that leave cancelable evals behind; the reaper waits on it.
    pub fn cancelable_signal(&self) -> Receiver<()> {
        self.cancelable_signal.1.clone()
    }

    /// Takes up to `max` evals from the failed queue, handed out with tokens:
    /// the reaper writes them as failed, then acks them, which lets the next
    /// eval of their job through.
    pub fn take_failed(&self, max: usize) -> Vec<Dequeued> {
        let batch: Vec<_> = {
            let mut failed = self.failed.lock();
            let take = max.min(failed.len());
            failed.drain(..take).collect()
        };
        self.counters.failed_queue.fetch_sub(batch.len() as i64, Ordering::Relaxed);
        batch.into_iter().map(|eval| self.hold_failed(eval)).collect()
    }

    fn hold_failed(&self, eval: Arc<Evaluation>) -> Dequeued {
        let hold = self.new_hold();
        let hash = self.eval_hash(eval.id);
        let mut evals = self.evals.lock(hash);
        let entry =
            evals.find_mut(hash, |entry| entry.id == eval.id).expect("a failed eval is tracked until it is acked");
        entry.hold = Some(hold);
        self.counters.unacked[eval.eval_type.index()].fetch_add(1, Ordering::Relaxed);
        Dequeued::new(eval, hold.token)
    }

    /// Stops handing out evals; enqueues, acks and nacks still work.
    pub fn pause(&self) {
        self.paused.store(true, Ordering::Release);
    }

    /// Resumes handing out evals and wakes waiting workers.
    pub fn resume(&self) {
        self.paused.store(false, Ordering::Release);
        self.gate.notify_all();
    }

    /// Whether the broker is paused.
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }

    /// Makes every dequeue fail with [`BrokerError::ShuttingDown`] and wakes
    /// waiting workers.
    pub fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
        self.gate.notify_all();
    }

    /// How many workers are blocked in [`EvalBroker::dequeue`].
    pub fn waiting_workers(&self) -> usize {
        self.gate.sleepers()
    }

    /// The broker's counters.
    pub fn stats(&self) -> BrokerStats {
        let by_scheduler: Vec<_> = JobType::ALL
            .iter()
            .map(|&kind| {
                let ready = self.counters.ready[kind.index()].load(Ordering::Relaxed);
                let unacked = self.counters.unacked[kind.index()].load(Ordering::Relaxed);
                (kind, SchedulerStats { ready, unacked })
            })
            .collect();
        BrokerStats {
            total_ready: by_scheduler.iter().map(|(_, stats)| stats.ready).sum(),
            total_unacked: by_scheduler.iter().map(|(_, stats)| stats.unacked).sum(),
            total_pending: self.counters.pending.load(Ordering::Relaxed),
            total_delayed: self.counters.delayed.load(Ordering::Relaxed),
            total_cancelable: self.counters.cancelable.load(Ordering::Relaxed),
            total_failed_queue: self.counters.failed_queue.load(Ordering::Relaxed),
            total_delivery_limit_reached: self.counters.delivery_limit_reached.load(Ordering::Relaxed),
            total_nack_timeouts: self.counters.nack_timeouts.load(Ordering::Relaxed),
            by_scheduler,
        }
    }
}

/// Whether `job` is the job of `eval`; names are compared by pointer first,
/// as evals of one job usually share them, so the strings are rarely read.
fn is_job_of(job: &JobState, eval: &Evaluation) -> bool {
    let same = |ours: &Arc<str>, theirs: &Arc<str>| Arc::ptr_eq(ours, theirs) || **ours == **theirs;
    same(&job.key.id, &eval.job_id) && same(&job.key.namespace, &eval.namespace)
}

/// Splits a job's pending evals into the one to run next (the newest of the
/// highest priority) and the superseded rest.
fn pick_next_pending(pending: &mut Vec<Arc<Evaluation>>) -> (Option<Arc<Evaluation>>, Vec<Arc<Evaluation>>) {
    let best = pending
        .iter()
        .enumerate()
        .max_by_key(|(position, eval)| (eval.priority, eval.modify_index.max(eval.create_index), *position))
        .map(|(position, _)| position);
    let next = best.map(|position| pending.swap_remove(position));
    (next, std::mem::take(pending))
}

#[cfg(test)]
#[path = "broker_test.rs"]
mod broker_test;
