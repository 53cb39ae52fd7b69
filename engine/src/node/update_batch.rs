//! Client allocation updates, batched on the server (Nomad's `batchUpdate`):
//! thousands of clients reporting at once become a few commands.
//!
//! 1. [`UpdateBatcher::submit`] adds a client's updates to the open batch
//!    and returns a [`PendingUpdate`]; the client is answered only after its
//!    batch is written, so nothing acknowledged is lost.
//! 2. A batch is sealed when `window` has passed since its first update,
//!    or at once when it holds `max_updates` (the bound; one oversized
//!    submission is a batch of its own). One flusher thread writes sealed
//!    batches in order, each as one [`Command::UpdateAllocsFromClient`] with
//!    an eval for every job whose allocation failed or came back from
//!    `unknown`.
//! 3. The store takes or refuses each update on its own (a node that went
//!    down between submit and write is refused); each submitter learns the
//!    outcome of its own updates, by waiting or awaiting its [`Reply`].
//! 4. On shutdown the flusher writes what is open, then stops; later
//!    submissions are refused. Every submission is answered: should the
//!    flusher end any other way, whatever it left unwritten is answered
//!    with [`StateError::ShuttingDown`] and the batcher refuses more.
//!
//! The hand-offs (submit → flusher through the batch lock and condvar,
//! flusher → submitters through each batch's [`Reply`]) use the [`crate::sync`]
//! shim and are model-checked by loom in `engine/tests/loom.rs`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The replies shared between the flusher and a batch's submitters: loom's
/// `Arc` under the model, so it sees who drops the last one; std's
/// otherwise (which the lint takes for the `Arc` already in scope).
#[allow(unused_qualifications)]
type Shared<T> = sync::Arc<T>;

/// The flusher thread (loom's thread under the model).
pub type FlusherHandle = thread::JoinHandle<()>;

use serde::{Deserialize, Serialize};

use crate::clock::SharedClock;
use crate::scheduler::reconcile::stop_reason;
use crate::state::{Applied, ClientAllocUpdate, Command, Snapshot, StateError, Writer};
use crate::structs::{AllocId, Allocation, ClientStatus, Evaluation, JobKey, TriggerReason};
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{self, lock, thread, Condvar, Mutex, Reply};

/// Batching settings.
#[derive(Clone, Debug)]
pub struct BatchConfig {
    /// How long a batch stays open after its first update.
    pub window: Duration,
    /// Most updates in one batch.
    pub max_updates: usize,
}

impl Default for BatchConfig {
    /// Nomad's 50 ms window; a bound that keeps one write near a millisecond.
    fn default() -> Self {
        BatchConfig { window: Duration::from_millis(50), max_updates: 8_192 }
    }
}

/// Batching counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchStats {
    /// Batches written.
    pub batches: u64,
    /// Updates written (taken or refused).
    pub updates: u64,
    /// Largest batch written.
    pub largest_batch: u64,
}

/// What writing one batch came to, shared by its submitters.
pub type BatchOutcome = Result<Arc<Applied>, StateError>;

/// How the flusher writes a batch: build its command and write it.
pub type WriteBatch = Box<dyn Fn(Vec<ClientAllocUpdate>) -> BatchOutcome + Send + Sync>;

/// A submission waiting for its batch to be written.
#[derive(Debug)]
pub struct PendingUpdate(Pending);

#[derive(Debug)]
enum Pending {
    /// In a batch not yet written.
    Batched { outcome: Shared<Reply<BatchOutcome>>, alloc_ids: Vec<AllocId> },
    /// Written (or refused) without batching.
    Done(Result<u64, StateError>),
}

impl PendingUpdate {
    /// A submission already written (or refused) without batching.
    pub(crate) fn written(result: Result<u64, StateError>) -> Self {
        PendingUpdate(Pending::Done(result))
    }

    /// Blocks until the batch is written; returns the index it was written
    /// at, or why this submission's updates were refused.
    pub fn wait(self) -> Result<u64, StateError> {
        match self.0 {
            Pending::Done(result) => result,
            Pending::Batched { outcome, alloc_ids } => own_outcome(&*outcome.wait()?, &alloc_ids),
        }
    }

    /// Awaits the batch; see [`PendingUpdate::wait`]. No thread waits.
    pub async fn outcome(self) -> Result<u64, StateError> {
        match self.0 {
            Pending::Done(result) => result,
            Pending::Batched { outcome, alloc_ids } => own_outcome(&*outcome.get().await?, &alloc_ids),
        }
    }
}

/// Whether `update` brings a new health verdict on an allocation of an
/// active deployment.
fn decides_health(snapshot: &Snapshot, alloc: &Allocation, update: &ClientAllocUpdate) -> bool {
    let Some(health) = &update.health else { return false };
    let changed = alloc.health.as_ref().is_none_or(|stored| stored.healthy != health.healthy);
    let active =
        alloc.deployment_id.and_then(|id| snapshot.deployment(id)).is_some_and(|deployment| deployment.is_active());
    changed && active
}

/// Whether `update` brings a new health verdict on an allocation of a job
/// that a drain moves: the replacement of an allocation that migrated off
/// a draining node, or any allocation of a job that still has allocations
/// to move off one (a replacement whose link to the migrated allocation was
/// lost, as when the plan applier refused its first placement on a node
/// drained meanwhile and a retry placed it afresh). Either way the drain's
/// next migration may go, and only an eval lets it.
fn paces_a_drain(snapshot: &Snapshot, alloc: &Allocation, update: &ClientAllocUpdate) -> bool {
    let Some(health) = &update.health else { return false };
    let changed = alloc.health.as_ref().is_none_or(|stored| stored.healthy != health.healthy);
    if !changed {
        return false;
    }
    let previous = alloc.previous_allocation.and_then(|id| snapshot.alloc(id));
    if previous.is_some_and(|previous| previous.desired_description == stop_reason::MIGRATING) {
        return true;
    }
    // A draining node is ineligible: with every node schedulable, none drains
    // (O(1), so the placements of a cluster without drains scan nothing).
    if snapshot.schedulable_nodes().len() == snapshot.node_count() {
        return false;
    }
    let on_draining_node =
        |other: &Allocation| snapshot.node(other.node_id).is_some_and(|node| node.drain.strategy.is_some());
    snapshot.allocs_by_job(&alloc.job_key()).any(|other| !other.server_terminal() && on_draining_node(other))
}

/// This submission's part of a written batch: its first refused update, or
/// the index.
pub(crate) fn own_outcome(applied: &Applied, alloc_ids: &[AllocId]) -> Result<u64, StateError> {
    let refused = applied.refused_updates.iter().find(|(alloc_id, _)| alloc_ids.contains(alloc_id));
    match refused {
        Some((_, error)) => Err(error.clone()),
        None => Ok(applied.index),
    }
}

/// The command for a batch: the updates, and an eval for each job with a
/// failed allocation among them, with an allocation that came back from
/// `unknown` (so its reconnect is settled at once, not when its disconnect
/// window runs out), or with a new health verdict for an allocation of an
/// active deployment (so its next batch rolls as soon as this one is
/// healthy, and an unhealthy one is acted on) or for a drain's replacement
/// (so the drain's next migration goes).
pub(crate) fn batch_command(snapshot: &Snapshot, updates: Vec<ClientAllocUpdate>, clock: &SharedClock) -> Command {
    let now = clock.now();
    let mut jobs: BTreeMap<JobKey, TriggerReason> = BTreeMap::new();
    for update in &updates {
        let Some(alloc) = snapshot.alloc(update.alloc_id) else { continue };
        if update.client_status == ClientStatus::Failed {
            jobs.insert(alloc.job_key(), TriggerReason::AllocFailure);
        } else if alloc.needs_reconnect() && !update.client_status.is_terminal() {
            jobs.entry(alloc.job_key()).or_insert(TriggerReason::Reconnect);
        } else if decides_health(snapshot, alloc, update) {
            jobs.entry(alloc.job_key()).or_insert(TriggerReason::DeploymentWatcher);
        } else if paces_a_drain(snapshot, alloc, update) {
            jobs.entry(alloc.job_key()).or_insert(TriggerReason::NodeDrain);
        }
    }
    let evals = jobs
        .iter()
        .filter_map(|(key, reason)| snapshot.job(key).map(|job| Evaluation::for_job(job, *reason, now)))
        .collect();
    Command::UpdateAllocsFromClient { updates, evals, time: now }
}

#[derive(Debug, Default)]
struct Batches {
    open: Vec<ClientAllocUpdate>,
    open_outcome: Shared<Reply<BatchOutcome>>,
    opened_at: Option<Instant>,
    sealed: VecDeque<(Vec<ClientAllocUpdate>, Shared<Reply<BatchOutcome>>)>,
    stopping: bool,
}

impl Batches {
    fn seal(&mut self) {
        if !self.open.is_empty() {
            self.sealed.push_back((std::mem::take(&mut self.open), std::mem::take(&mut self.open_outcome)));
        }
        self.opened_at = None;
    }
}

/// The batcher; see the module docs.
pub struct UpdateBatcher {
    config: BatchConfig,
    write: WriteBatch,
    batches: Mutex<Batches>,
    changed: Condvar,
    batches_written: AtomicU64,
    updates_written: AtomicU64,
    largest_batch: AtomicU64,
    stopped: AtomicBool,
}

impl std::fmt::Debug for UpdateBatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpdateBatcher").field("config", &self.config).field("stats", &self.stats()).finish()
    }
}

impl UpdateBatcher {
    /// A batcher writing through `writer`; start its flusher with [`UpdateBatcher::spawn`].
    pub fn new(config: BatchConfig, writer: Writer, clock: SharedClock) -> Arc<Self> {
        let write: WriteBatch = Box::new(move |updates| {
            let command = batch_command(&writer.store().snapshot(), updates, &clock);
            writer.write(command).map(Arc::new)
        });
        Self::with_write(config, write)
    }

    /// A batcher that writes each batch with `write` (a model check's stand-in for the store).
    pub fn with_write(config: BatchConfig, write: WriteBatch) -> Arc<Self> {
        Arc::new(UpdateBatcher {
            config,
            write,
            batches: Mutex::new(Batches::default()),
            changed: Condvar::new(),
            batches_written: AtomicU64::new(0),
            updates_written: AtomicU64::new(0),
            largest_batch: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
        })
    }

    /// Starts the flusher thread.
    pub fn spawn(self: &Arc<Self>) -> FlusherHandle {
        let batcher = self.clone();
        thread::Builder::new()
            .name("alloc-update-batcher".into())
            .spawn(move || batcher.flush_loop())
            .expect("spawning the alloc update batcher")
    }

    /// Adds updates to the open batch (step 1). An empty submission has
    /// nothing to wait for: it is answered at once with index 0.
    pub fn submit(&self, updates: Vec<ClientAllocUpdate>) -> Result<PendingUpdate, StateError> {
        if updates.is_empty() {
            return Ok(PendingUpdate::written(Ok(0)));
        }
        let alloc_ids = updates.iter().map(|update| update.alloc_id).collect();
        let mut batches = lock(&self.batches);
        if batches.stopping {
            return Err(StateError::ShuttingDown);
        }
        if batches.open.len() + updates.len() > self.config.max_updates {
            batches.seal();
        }
        batches.open.extend(updates);
        let outcome = batches.open_outcome.clone();
        if batches.open.len() >= self.config.max_updates {
            batches.seal();
            self.changed.notify_one();
        } else if batches.opened_at.is_none() {
            batches.opened_at = Some(Instant::now());
            self.changed.notify_one();
        }
        Ok(PendingUpdate(Pending::Batched { outcome, alloc_ids }))
    }

    /// Counters.
    pub fn stats(&self) -> BatchStats {
        BatchStats {
            batches: self.batches_written.load(Ordering::Relaxed),
            updates: self.updates_written.load(Ordering::Relaxed),
            largest_batch: self.largest_batch.load(Ordering::Relaxed),
        }
    }

    /// Writes what is open and stops the flusher (step 4).
    pub fn stop(&self) {
        let mut batches = lock(&self.batches);
        batches.stopping = true;
        batches.seal();
        self.changed.notify_all();
    }

    /// Whether the flusher has written everything and stopped.
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    fn flush_loop(&self) {
        let _answer_the_rest = AnswerTheRest(self);
        while let Some((updates, outcome)) = self.next_batch() {
            self.write(updates, &outcome);
        }
    }

    /// The next batch to write, waiting for one to be sealed or for the
    /// open one's window to pass; `None` once stopped and drained.
    fn next_batch(&self) -> Option<(Vec<ClientAllocUpdate>, Shared<Reply<BatchOutcome>>)> {
        let mut batches = lock(&self.batches);
        loop {
            if let Some(batch) = batches.sealed.pop_front() {
                return Some(batch);
            }
            if batches.stopping {
                return None;
            }
            batches = match batches.opened_at {
                Some(opened) if opened.elapsed() >= self.config.window => {
                    batches.seal();
                    batches
                }
                Some(opened) => {
                    let remaining = self.config.window.saturating_sub(opened.elapsed());
                    let waited = self.changed.wait_timeout(batches, remaining);
                    waited.unwrap_or_else(std::sync::PoisonError::into_inner).0
                }
                None => self.changed.wait(batches).unwrap_or_else(std::sync::PoisonError::into_inner),
            };
        }
    }

    fn write(&self, updates: Vec<ClientAllocUpdate>, outcome: &Reply<BatchOutcome>) {
        let n_updates = updates.len() as u64;
        outcome.set((self.write)(updates));
        self.batches_written.fetch_add(1, Ordering::Relaxed);
        self.updates_written.fetch_add(n_updates, Ordering::Relaxed);
        self.largest_batch.fetch_max(n_updates, Ordering::Relaxed);
    }
}

/// Ends the flusher however it ends (step 4): refuses later submissions
/// and answers every batch it did not write, so no submitter waits forever.
struct AnswerTheRest<'a>(&'a UpdateBatcher);

impl Drop for AnswerTheRest<'_> {
    fn drop(&mut self) {
        let mut batches = lock(&self.0.batches);
        batches.stopping = true;
        batches.seal();
        for (_, outcome) in batches.sealed.drain(..) {
            outcome.set(Err(StateError::ShuttingDown));
        }
        self.0.stopped.store(true, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::clock::{ManualClock, Timestamp};
    use crate::state::StateStore;
    use crate::structs::{AllocHealth, Allocation, EvalId, Job, JobType, NodeStatus, Resources};
    use crate::testing::node;

    /// A writer over a store with two nodes and `per_node` pending allocations on each.
    fn fixture(per_node: u32) -> (Writer, SharedClock, Vec<Allocation>) {
        let clock: SharedClock = ManualClock::new(Timestamp(1));
        let store = Arc::new(StateStore::new());
        let writer = Writer::direct(store.clone());
        for n in 0..2 {
            store.apply(Command::UpsertNode { node: node(n), evals: vec![] }).expect("node");
        }
        let spec = Job::new_simple("web", JobType::Service, per_node * 2, Resources::new(10, 10, 0));
        store.apply(Command::RegisterJob { job: spec.clone(), eval: None }).expect("job");
        let job = store.snapshot().job(&spec.key()).expect("job").clone();
        let allocs: Vec<Allocation> = (0..per_node * 2)
            .map(|i| Allocation::new_placement(&job, "group", i, node((i % 2) as usize).id, EvalId::from_u128(1)))
            .collect();
        let command = Command::ApplyPlanResults {
            deployment: None,
            deployment_updates: Vec::new(),
            eval_id: EvalId::from_u128(1),
            allocs: allocs.clone(),
            evals: vec![],
            time: Timestamp(1),
        };
        store.apply(command).expect("allocs");
        (writer, clock, allocs)
    }

    fn running(alloc: &Allocation) -> ClientAllocUpdate {
        ClientAllocUpdate {
            alloc_id: alloc.id,
            node_id: alloc.node_id,
            client_status: ClientStatus::Running,
            client_description: String::new(),
            services: None,
            checks: None,
            health: None,
            task_states: Default::default(),
        }
    }

    fn never_by_time() -> BatchConfig {
        BatchConfig { window: Duration::from_secs(3_600), max_updates: 10 }
    }

    #[test]
    fn many_clients_become_a_few_bounded_batches_and_each_hears_its_outcome() {
        let (writer, clock, allocs) = fixture(13);
        let batcher = UpdateBatcher::new(never_by_time(), writer.clone(), clock);
        let flusher = batcher.spawn();
        let pending: Vec<PendingUpdate> =
            allocs.iter().map(|alloc| batcher.submit(vec![running(alloc)]).expect("submitted")).collect();
        batcher.stop();
        let indexes: Vec<u64> = pending.into_iter().map(|pending| pending.wait().expect("written")).collect();
        flusher.join().expect("flusher");
        assert!(batcher.is_stopped());
        let stats = batcher.stats();
        assert_eq!(stats, BatchStats { batches: 3, updates: 26, largest_batch: 10 });
        let distinct: std::collections::BTreeSet<_> = indexes.iter().collect();
        assert_eq!(distinct.len(), 3, "one write per batch");
        let snapshot = writer.store().snapshot();
        assert!(allocs
            .iter()
            .all(|alloc| snapshot.alloc(alloc.id).expect("alloc").client_status == ClientStatus::Running));
        assert!(matches!(batcher.submit(vec![running(&allocs[0])]), Err(StateError::ShuttingDown)));
    }

    #[test]
    fn a_node_that_left_before_the_write_is_refused_alone() {
        let (writer, clock, allocs) = fixture(1);
        let batcher = UpdateBatcher::new(never_by_time(), writer.clone(), clock);
        let flusher = batcher.spawn();
        let (first, second) = (&allocs[0], &allocs[1]);
        let refused = batcher.submit(vec![running(first)]).expect("submitted");
        let taken = batcher.submit(vec![running(second)]).expect("submitted");
        let down = Command::UpdateNodeStatus {
            node_id: first.node_id,
            status: NodeStatus::Down,
            evals: vec![],
            time: Timestamp::ZERO,
        };
        writer.write(down).expect("the node leaves");
        batcher.stop();
        assert_eq!(
            refused.wait(),
            Err(StateError::NodeNotConnected { node_id: first.node_id, status: NodeStatus::Down })
        );
        assert!(taken.wait().is_ok());
        flusher.join().expect("flusher");
        let snapshot = writer.store().snapshot();
        assert_eq!(snapshot.alloc(first.id).expect("alloc").client_status, ClientStatus::Pending);
        assert_eq!(snapshot.alloc(second.id).expect("alloc").client_status, ClientStatus::Running);
    }

    #[test]
    fn a_failed_allocation_and_a_reconnecting_one_get_evals() {
        let (writer, clock, allocs) = fixture(1);
        let mut marked = allocs[1].clone();
        marked.record_client_status(ClientStatus::Unknown, Timestamp(2));
        let command = Command::ApplyPlanResults {
            deployment: None,
            deployment_updates: Vec::new(),
            eval_id: EvalId::from_u128(1),
            allocs: vec![marked],
            evals: vec![],
            time: Timestamp(2),
        };
        writer.store().apply(command).expect("marked unknown");
        let snapshot = writer.store().snapshot();
        let mut failed = running(&allocs[0]);
        failed.client_status = ClientStatus::Failed;
        let Command::UpdateAllocsFromClient { evals, .. } = batch_command(&snapshot, vec![failed], &clock) else {
            panic!("an alloc update command")
        };
        assert_eq!(evals.iter().map(|eval| eval.triggered_by).collect::<Vec<_>>(), [TriggerReason::AllocFailure]);
        let Command::UpdateAllocsFromClient { evals, .. } = batch_command(&snapshot, vec![running(&allocs[1])], &clock)
        else {
            panic!("an alloc update command")
        };
        assert_eq!(evals.iter().map(|eval| eval.triggered_by).collect::<Vec<_>>(), [TriggerReason::Reconnect]);
        let Command::UpdateAllocsFromClient { evals, .. } = batch_command(&snapshot, vec![running(&allocs[0])], &clock)
        else {
            panic!("an alloc update command")
        };
        assert!(evals.is_empty(), "a plain running report needs no scheduling");
    }

    #[test]
    fn a_health_verdict_while_the_job_has_allocations_on_a_draining_node_paces_the_drain() {
        let (writer, clock, allocs) = fixture(1);
        let mut healthy = running(&allocs[1]);
        healthy.health = Some(AllocHealth { healthy: true, timestamp: Timestamp(2), modify_index: 0 });
        let evals_of = |update: &ClientAllocUpdate| {
            let snapshot = writer.store().snapshot();
            let Command::UpdateAllocsFromClient { evals, .. } = batch_command(&snapshot, vec![update.clone()], &clock)
            else {
                panic!("an alloc update command")
            };
            evals.iter().map(|eval| eval.triggered_by).collect::<Vec<_>>()
        };
        assert!(evals_of(&healthy).is_empty(), "no drain: a verdict outside a deployment needs no scheduling");
        let drain = crate::structs::DrainStrategy {
            deadline: crate::structs::DrainDeadline::None,
            ignore_system_jobs: false,
            started_at: Timestamp(2),
        };
        writer.write(Command::drain_node(allocs[0].node_id, drain, vec![], Timestamp(2))).expect("drains");
        // allocs[1] has no link to a migrated allocation (a retry placed it
        // afresh), yet its job still has allocs[0] to move off the drain.
        assert_eq!(evals_of(&healthy), [TriggerReason::NodeDrain]);
    }
}
