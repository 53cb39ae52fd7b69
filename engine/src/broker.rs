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
//!    the reaper in batches ([`EvalBroker::take_cancelable`]).
//! 4. [`EvalBroker::nack`] with that token (or the nack deadline passing,
//!    seen by [`EvalBroker::process_timers`]) gives it back: ready again after
//!    a short delay the first time and a longer one after that, or, once it
//!    was delivered `delivery_limit` times, into the failed queue, where the
//!    reaper marks it failed and creates a delayed follow-up.
//!
//! Concurrency: per-job and per-eval bookkeeping live in sharded maps, so
//! workers on different jobs do not serialize on one lock on the dequeue and
//! ack paths; each scheduler type's ready queue has a lock of its own held
//! only for a push or a pop. Time comes from the injected clock; the only
//! real-time wait is a worker blocking in `dequeue` on an empty broker.

use std::cmp::Ordering as CmpOrdering;
use std::collections::{BinaryHeap, VecDeque};
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam::channel::{self, Receiver, Sender};
use hashbrown::{DefaultHashBuilder, HashMap};
use parking_lot::{Condvar, Mutex, MutexGuard};
use serde::Serialize;

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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Token(pub u64);

/// Why the broker refused an ack, a nack or a dequeue.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
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
}

/// Counts per scheduler type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SchedulerStats {
    /// Ready to dequeue.
    pub ready: i64,
    /// Handed out, not yet acked.
    pub unacked: i64,
}

/// A snapshot of the broker's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
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
}

/// A ready eval: higher priority first, then lower creation index, then
/// arrival order.
#[derive(Debug)]
struct ReadyItem {
    priority: u8,
    create_index: u64,
    seq: u64,
    eval: Arc<Evaluation>,
}

impl ReadyItem {
    fn rank(&self) -> (u8, std::cmp::Reverse<u64>, std::cmp::Reverse<u64>) {
        (self.priority, std::cmp::Reverse(self.create_index), std::cmp::Reverse(self.seq))
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
    ready_at: Timestamp,
    seq: u64,
    eval: Arc<Evaluation>,
}

impl PartialEq for DelayedItem {
    fn eq(&self, other: &Self) -> bool {
        (self.ready_at, self.seq) == (other.ready_at, other.seq)
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
        (other.ready_at, other.seq).cmp(&(self.ready_at, self.seq))
    }
}

/// Per-job serialization: the one outstanding eval and those held back.
#[derive(Debug, Default)]
struct JobState {
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
    eval: Arc<Evaluation>,
    deliveries: u32,
    hold: Option<Hold>,
}

/// A map split into independently locked shards.
#[derive(Debug)]
struct Sharded<K, V> {
    shards: Vec<Mutex<HashMap<K, V>>>,
    hasher: DefaultHashBuilder,
}

impl<K: Hash + Eq, V> Sharded<K, V> {
    fn new() -> Self {
        Sharded { shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(), hasher: Default::default() }
    }

    fn lock(&self, key: &K) -> MutexGuard<'_, HashMap<K, V>> {
        let shard = self.hasher.hash_one(key) as usize % SHARDS;
        self.shards[shard].lock()
    }
}

/// Atomic counters behind [`BrokerStats`].
#[derive(Debug, Default)]
struct Counters {
    ready: [AtomicI64; 4],
    unacked: [AtomicI64; 4],
    pending: AtomicI64,
    delayed: AtomicI64,
    cancelable: AtomicI64,
    marked_cancelable: AtomicU64,
    failed_queue: AtomicI64,
    delivery_limit_reached: AtomicU64,
    nack_timeouts: AtomicU64,
}

/// The evaluation broker. See the module docs for the protocol.
#[derive(Debug)]
pub struct EvalBroker {
    config: BrokerConfig,
    clock: SharedClock,
    ready: [Mutex<ReadyQueue>; 4],
    jobs: Sharded<JobKey, JobState>,
    evals: Sharded<EvalId, EvalEntry>,
    delayed: Mutex<BinaryHeap<DelayedItem>>,
    failed: Mutex<VecDeque<Arc<Evaluation>>>,
    cancelable: Mutex<Vec<Arc<Evaluation>>>,
    cancelable_signal: (Sender<()>, Receiver<()>),
    counters: Counters,
    next_seq: AtomicU64,
    next_token: AtomicU64,
    sleepers: AtomicUsize,
    wake_lock: Mutex<()>,
    wake: Condvar,
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
            delayed: Mutex::new(BinaryHeap::new()),
            failed: Mutex::new(VecDeque::new()),
            cancelable: Mutex::new(Vec::new()),
            cancelable_signal: channel::bounded(1),
            counters: Counters::default(),
            next_seq: AtomicU64::new(0),
            next_token: AtomicU64::new(rand::random::<u64>() >> 1),
            sleepers: AtomicUsize::new(0),
            wake_lock: Mutex::new(()),
            wake: Condvar::new(),
            paused: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
        }
    }

    /// The broker's settings.
    pub fn config(&self) -> &BrokerConfig {
        &self.config
    }

    /// Admits an eval (protocol step 1). An eval the broker already tracks is ignored.
    pub fn enqueue(&self, eval: Arc<Evaluation>) {
        {
            let mut evals = self.evals.lock(&eval.id);
            if evals.contains_key(&eval.id) {
                return;
            }
            evals.insert(eval.id, EvalEntry { eval: eval.clone(), deliveries: 0, hold: None });
        }
        match eval.wait_until {
            Some(ready_at) if ready_at > self.clock.now() => self.push_delayed(eval, ready_at),
            _ => self.admit(eval),
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
    fn admit(&self, eval: Arc<Evaluation>) {
        let key = eval.job_key();
        let ready = {
            let mut jobs = self.jobs.lock(&key);
            let job = jobs.entry(key).or_default();
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
            priority: eval.priority,
            create_index: eval.create_index,
            seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
            eval,
        };
        self.ready[kind].lock().push(item);
        self.counters.ready[kind].fetch_add(1, Ordering::Relaxed);
        self.wake_sleepers();
    }

    fn push_delayed(&self, eval: Arc<Evaluation>, ready_at: Timestamp) {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        self.delayed.lock().push(DelayedItem { ready_at, seq, eval });
        self.counters.delayed.fetch_add(1, Ordering::Relaxed);
    }

    fn wake_sleepers(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = self.wake_lock.lock();
            self.wake.notify_all();
        }
    }

    /// Hands out the best ready eval of `types` (protocol step 2), waiting up
    /// to `timeout` for one. `Ok(None)` means none came in time (or the
    /// broker stayed paused).
    pub fn dequeue(&self, types: &[JobType], timeout: Duration) -> Result<Option<Dequeued>, BrokerError> {
        if let Some(dequeued) = self.try_dequeue(types)? {
            return Ok(Some(dequeued));
        }
        let deadline = Instant::now() + timeout;
        let mut guard = self.wake_lock.lock();
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let result = loop {
            match self.try_dequeue(types) {
                Ok(None) => {}
                other => break other,
            }
            if self.wake.wait_until(&mut guard, deadline).timed_out() {
                break self.try_dequeue(types);
            }
        };
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        result
    }

    /// Hands out the best ready eval of `types` without waiting.
    pub fn try_dequeue(&self, types: &[JobType]) -> Result<Option<Dequeued>, BrokerError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(BrokerError::ShuttingDown);
        }
        if self.paused.load(Ordering::Acquire) {
            return Ok(None);
        }
        let Some(eval) = self.pop_best(types) else {
            return Ok(None);
        };
        let token = Token(self.next_token.fetch_add(1, Ordering::Relaxed));
        let deadline = self.clock.now().plus(self.config.nack_timeout);
        {
            let mut evals = self.evals.lock(&eval.id);
            let entry = evals.get_mut(&eval.id).expect("a ready eval is tracked until it is acked");
            entry.deliveries += 1;
            entry.hold = Some(Hold { token, deadline });
        }
        self.counters.unacked[eval.eval_type.index()].fetch_add(1, Ordering::Relaxed);
        Ok(Some(Dequeued { eval, token }))
    }

    /// Pops the best head among the ready queues of `types`. The queues are
    /// locked in a fixed order so that two dequeuers never deadlock.
    fn pop_best(&self, types: &[JobType]) -> Option<Arc<Evaluation>> {
        let mut kinds: smallvec::SmallVec<[usize; 4]> = types.iter().map(|kind| kind.index()).collect();
        kinds.sort_unstable();
        kinds.dedup();
        let mut heaps: smallvec::SmallVec<[(usize, MutexGuard<'_, ReadyQueue>); 4]> = kinds
            .into_iter()
            .filter(|&kind| self.counters.ready[kind].load(Ordering::Relaxed) > 0)
            .map(|kind| (kind, self.ready[kind].lock()))
            .collect();
        let best = heaps
            .iter_mut()
            .filter_map(|(kind, heap)| heap.peek().map(|item| (item.rank(), *kind)))
            .max()
            .map(|(_, kind)| kind)?;
        let (_, heap) = heaps.iter_mut().find(|(kind, _)| *kind == best)?;
        let item = heap.pop()?;
        self.counters.ready[best].fetch_sub(1, Ordering::Relaxed);
        Some(item.eval)
    }

    /// Removes the hold on an eval if `token` matches it.
    fn release_hold(&self, eval_id: EvalId, token: Token) -> Result<(Arc<Evaluation>, u32), BrokerError> {
        let mut evals = self.evals.lock(&eval_id);
        let entry = evals.get_mut(&eval_id).ok_or(BrokerError::NotOutstanding(eval_id))?;
        match entry.hold {
            None => Err(BrokerError::NotOutstanding(eval_id)),
            Some(hold) if hold.token != token => Err(BrokerError::TokenMismatch(eval_id)),
            Some(_) => {
                entry.hold = None;
                self.counters.unacked[entry.eval.eval_type.index()].fetch_sub(1, Ordering::Relaxed);
                Ok((entry.eval.clone(), entry.deliveries))
            }
        }
    }

    /// Finishes a handed-out eval (protocol step 3).
    pub fn ack(&self, eval_id: EvalId, token: Token) -> Result<(), BrokerError> {
        let (eval, _) = self.release_hold(eval_id, token)?;
        self.evals.lock(&eval_id).remove(&eval_id);
        let (next, superseded) = {
            let mut jobs = self.jobs.lock(&eval.job_key());
            let job = jobs.get_mut(&eval.job_key()).expect("an outstanding eval's job is tracked");
            let (next, superseded) = pick_next_pending(&mut job.pending);
            job.outstanding = next.as_ref().map(|next| next.id);
            if job.outstanding.is_none() {
                jobs.remove(&eval.job_key());
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
        Ok(())
    }

    fn mark_cancelable(&self, superseded: Vec<Arc<Evaluation>>) {
        for eval in &superseded {
            self.evals.lock(&eval.id).remove(&eval.id);
        }
        self.counters.cancelable.fetch_add(superseded.len() as i64, Ordering::Relaxed);
        self.counters.marked_cancelable.fetch_add(superseded.len() as u64, Ordering::Relaxed);
        self.cancelable.lock().extend(superseded);
        // Pace the reaper by acks: wake it if it is not already awake.
        let _ = self.cancelable_signal.0.try_send(());
    }

    /// Gives a handed-out eval back (protocol step 4).
    pub fn nack(&self, eval_id: EvalId, token: Token) -> Result<(), BrokerError> {
        let (eval, deliveries) = self.release_hold(eval_id, token)?;
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
        let mut evals = self.evals.lock(&eval_id);
        let entry = evals.get_mut(&eval_id).ok_or(BrokerError::NotOutstanding(eval_id))?;
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
        self.evals.lock(&eval_id).get(&eval_id).and_then(|entry| entry.hold.map(|hold| hold.token))
    }

    /// Nacks handed-out evals whose deadline passed and enqueues delayed
    /// evals that came due. The server calls this periodically; tests call it
    /// after moving the clock.
    pub fn process_timers(&self) -> TimerOutcome {
        let now = self.clock.now();
        let expired = self.expired_holds(now);
        let mut outcome = TimerOutcome::default();
        for (eval_id, token) in expired {
            if self.nack(eval_id, token).is_ok() {
                self.counters.nack_timeouts.fetch_add(1, Ordering::Relaxed);
                outcome.nacked += 1;
            }
        }
        for eval in self.due_delayed(now) {
            self.admit(eval);
            outcome.released += 1;
        }
        outcome
    }

    fn expired_holds(&self, now: Timestamp) -> Vec<(EvalId, Token)> {
        let mut expired = Vec::new();
        for shard in &self.evals.shards {
            let shard = shard.lock();
            expired.extend(shard.iter().filter_map(|(id, entry)| {
                entry.hold.filter(|hold| hold.deadline <= now).map(|hold| (*id, hold.token))
            }));
        }
        expired
    }

    fn due_delayed(&self, now: Timestamp) -> Vec<Arc<Evaluation>> {
        let mut delayed = self.delayed.lock();
        let mut due = Vec::new();
        while delayed.peek().is_some_and(|item| item.ready_at <= now) {
            due.push(delayed.pop().expect("peeked").eval);
        }
        self.counters.delayed.fetch_sub(due.len() as i64, Ordering::Relaxed);
        due
    }

    /// The time the next delayed eval comes due, so a runtime can sleep until then.
    pub fn next_delayed_at(&self) -> Option<Timestamp> {
        self.delayed.lock().peek().map(|item| item.ready_at)
    }

    /// Takes up to `max` superseded evals for the reaper to write as canceled.
    pub fn take_cancelable(&self, max: usize) -> Vec<Arc<Evaluation>> {
        let mut cancelable = self.cancelable.lock();
        let take = max.min(cancelable.len());
        let batch: Vec<_> = cancelable.drain(..take).collect();
        self.counters.cancelable.fetch_sub(batch.len() as i64, Ordering::Relaxed);
        batch
    }

    /// Evals set aside as superseded, ever (reaped or not).
    pub fn canceled_total(&self) -> u64 {
        self.counters.marked_cancelable.load(Ordering::Relaxed)
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
        let token = Token(self.next_token.fetch_add(1, Ordering::Relaxed));
        let deadline = self.clock.now().plus(self.config.nack_timeout);
        let mut evals = self.evals.lock(&eval.id);
        let entry = evals.get_mut(&eval.id).expect("a failed eval is tracked until it is acked");
        entry.hold = Some(Hold { token, deadline });
        self.counters.unacked[eval.eval_type.index()].fetch_add(1, Ordering::Relaxed);
        Dequeued { eval, token }
    }

    /// Stops handing out evals; enqueues, acks and nacks still work.
    pub fn pause(&self) {
        self.paused.store(true, Ordering::Release);
    }

    /// Resumes handing out evals and wakes waiting workers.
    pub fn resume(&self) {
        self.paused.store(false, Ordering::Release);
        let _guard = self.wake_lock.lock();
        self.wake.notify_all();
    }

    /// Whether the broker is paused.
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }

    /// Makes every dequeue fail with [`BrokerError::ShuttingDown`] and wakes
    /// waiting workers.
    pub fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
        let _guard = self.wake_lock.lock();
        self.wake.notify_all();
    }

    /// How many workers are blocked in [`EvalBroker::dequeue`].
    pub fn waiting_workers(&self) -> usize {
        self.sleepers.load(Ordering::SeqCst)
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
