//! The eval reaper: writes what the broker and blocked evals set aside.
//!
//! 1. Cancelable evals (superseded pending evals, duplicate blocked evals)
//!    are written as `canceled` in batches of at most `batch_size`, one
//!    command per batch. The broker wakes the reaper on acks that leave
//!    cancelable evals behind; a periodic sweep catches the rest, so a quiet
//!    cluster does not keep them forever.
//! 2. Evals in the broker's failed queue are written as `failed` together
//!    with a delayed follow-up eval, and only then acked in the broker, so a
//!    failure is never acknowledged without being recorded. The store's
//!    apply hook takes the follow-up to the broker, like any other write.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam::channel::{self, Sender};
use crossbeam::select;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::clock::SharedClock;
use crate::eval::blocked::BlockedEvals;
use crate::eval::broker::EvalBroker;
use crate::state::{Command, StateError, Writer};
use crate::structs::{EvalStatus, Evaluation, TriggerReason};

/// Reaper settings.
#[derive(Clone, Debug)]
pub struct ReaperConfig {
    /// Most evals written in one command.
    pub batch_size: usize,
    /// How often the reaper sweeps without being woken.
    pub sweep_interval: Duration,
    /// Least delay before the follow-up of a failed eval.
    pub failed_follow_up_base: Duration,
    /// Random extra delay, up to this, so failed evals do not all return at once.
    pub failed_follow_up_jitter: Duration,
}

impl Default for ReaperConfig {
    fn default() -> Self {
        ReaperConfig {
            // Nomad writes at most 7,281 ids per request (MaxUUIDsPerWriteRequest);
            // these are whole evaluations, so a tenth of that keeps one
            // command near a few hundred kilobytes.
            batch_size: 728,
            sweep_interval: Duration::from_secs(5),
            failed_follow_up_base: Duration::from_secs(60),
            failed_follow_up_jitter: Duration::from_secs(5 * 60),
        }
    }
}

/// Writes canceled and failed evals; see the module docs.
#[derive(Debug, Clone)]
pub struct EvalReaper {
    config: ReaperConfig,
    broker: Arc<EvalBroker>,
    blocked: Arc<BlockedEvals>,
    writer: Writer,
    clock: SharedClock,
    /// Draws the follow-up jitter: seeded, so a simulation's run is a
    /// function of its seed.
    rng: Arc<parking_lot::Mutex<SmallRng>>,
}

impl EvalReaper {
    /// A reaper over the given broker and blocked evals, writing through
    /// `writer`, its jitter drawn from a generator seeded with `seed`.
    pub fn new(
        config: ReaperConfig,
        broker: Arc<EvalBroker>,
        blocked: Arc<BlockedEvals>,
        writer: Writer,
        clock: SharedClock,
        seed: u64,
    ) -> Self {
        let rng = Arc::new(parking_lot::Mutex::new(SmallRng::seed_from_u64(seed)));
        EvalReaper { config, broker, blocked, writer, clock, rng }
    }

    /// Writes one batch of cancelable evals as canceled; returns how many.
    pub fn reap_cancelable_batch(&self) -> Result<usize, StateError> {
        let mut batch = self.blocked.take_duplicates();
        let room = self.config.batch_size.saturating_sub(batch.len());
        batch.extend(self.broker.take_cancelable(room));
        if batch.is_empty() {
            return Ok(0);
        }
        let now = self.clock.now();
        let evals: Vec<Evaluation> = batch
            .iter()
            .map(|eval| {
                let mut canceled = Evaluation::clone(eval);
                canceled.status = EvalStatus::Canceled;
                canceled.status_description = "canceled after a more recent evaluation of the job was processed".into();
                canceled.modify_time = now;
                canceled
            })
            .collect();
        let count = evals.len();
        self.writer.write(Command::UpsertEvals { evals })?;
        Ok(count)
    }

    /// Writes one batch of failed evals with their follow-ups, then acks
    /// them in the broker; returns how many.
    pub fn reap_failed_batch(&self) -> Result<usize, StateError> {
        let failed = self.broker.take_failed(self.config.batch_size / 2);
        if failed.is_empty() {
            return Ok(0);
        }
        let now = self.clock.now();
        let mut evals = Vec::with_capacity(failed.len() * 2);
        for held in &failed {
            let wait_until = now.plus(self.follow_up_delay());
            let follow_up = held.eval.follow_up(TriggerReason::FailedFollowUp, wait_until, now);
            let mut failed_eval = Evaluation::clone(&held.eval);
            failed_eval.status = EvalStatus::Failed;
            failed_eval.status_description =
                format!("evaluation reached the delivery limit ({})", self.broker.config().delivery_limit);
            failed_eval.next_eval = Some(follow_up.id);
            failed_eval.modify_time = now;
            evals.push(failed_eval);
            evals.push(follow_up);
        }
        self.writer.write(Command::UpsertEvals { evals })?;
        for held in &failed {
            // A failed ack means the hold expired and the broker took the eval
            // back; it is recorded as failed either way.
            let _ = self.broker.ack(held.eval.id, held.token);
        }
        Ok(failed.len())
    }

    fn follow_up_delay(&self) -> Duration {
        let jitter_nanos = self.config.failed_follow_up_jitter.as_nanos() as u64;
        let jitter = if jitter_nanos == 0 { 0 } else { self.rng.lock().random_range(0..jitter_nanos) };
        self.config.failed_follow_up_base + Duration::from_nanos(jitter)
    }

    /// Reaps until nothing is left; returns (canceled, failed).
    pub fn reap_all(&self) -> Result<(usize, usize), StateError> {
        let (mut canceled, mut failed) = (0, 0);
        loop {
            let batch = self.reap_cancelable_batch()?;
            canceled += batch;
            let failed_batch = self.reap_failed_batch()?;
            failed += failed_batch;
            if batch == 0 && failed_batch == 0 {
                return Ok((canceled, failed));
            }
        }
    }

    /// Runs the reaper on a thread until the handle is stopped.
    pub fn spawn(self) -> ReaperHandle {
        let (stop, stopped) = channel::bounded::<()>(1);
        let wake = self.broker.cancelable_signal();
        let sweep = self.config.sweep_interval;
        let thread = std::thread::Builder::new()
            .name("eval-reaper".into())
            .spawn(move || loop {
                if let Err(error) = self.reap_all() {
                    tracing::warn!(%error, "eval reaper could not write");
                    if matches!(error, StateError::ShuttingDown) {
                        return;
                    }
                }
                select! {
                    recv(wake) -> _ => {}
                    recv(stopped) -> _ => return,
                    default(sweep) => {}
                }
            })
            .expect("spawning the reaper thread");
        ReaperHandle { stop, thread: Some(thread) }
    }
}

/// A running reaper; stopping it (or dropping the handle) joins its thread.
#[derive(Debug)]
pub struct ReaperHandle {
    stop: Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl ReaperHandle {
    /// Stops the reaper and waits for its thread.
    pub fn stop(mut self) {
        self.join();
    }

    fn join(&mut self) {
        let _ = self.stop.try_send(());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for ReaperHandle {
    fn drop(&mut self) {
        self.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{ManualClock, Timestamp};
    use crate::eval::broker::BrokerConfig;
    use crate::router::Router;
    use crate::state::StateStore;
    use crate::structs::{ComputedClass, Job, JobType, Resources};

    struct Fixture {
        reaper: EvalReaper,
        broker: Arc<EvalBroker>,
        blocked: Arc<BlockedEvals>,
        store: Arc<StateStore>,
    }

    fn fixture(broker_config: BrokerConfig, batch_size: usize) -> Fixture {
        let clock = ManualClock::new(Timestamp(1_000_000_000_000));
        let broker = Arc::new(EvalBroker::new(broker_config, clock.clone()));
        let blocked = Arc::new(BlockedEvals::new(broker.clone(), clock.clone()));
        let store = Arc::new(StateStore::new());
        store.set_hook(Some(Box::new(Router::new(broker.clone(), blocked.clone()))));
        // Hours: the tests that need the reaper woken must see it woken by acks.
        let config =
            ReaperConfig { batch_size, sweep_interval: Duration::from_secs(6 * 3600), ..ReaperConfig::default() };
        let reaper = EvalReaper::new(config, broker.clone(), blocked.clone(), Writer::direct(store.clone()), clock, 7);
        Fixture { reaper, broker, blocked, store }
    }

    /// Registers `job` with `n` evals written to the store and enqueued.
    fn evals_for(store: &StateStore, broker: &EvalBroker, job: &str, n: usize) -> Vec<Arc<Evaluation>> {
        let spec = Job::new_simple(job, JobType::Service, 1, Resources::new(1, 1, 0));
        let evals = (0..n).map(|_| Evaluation::for_job(&spec, TriggerReason::JobRegister, Timestamp(0))).collect();
        let applied = store.apply(Command::UpsertEvals { evals }).expect("written and routed by the hook");
        assert_eq!(broker.stats().total_ready + broker.stats().total_pending, n as i64);
        applied.evals
    }

    #[test]
    fn the_follow_up_jitter_is_a_function_of_the_seed() {
        let delays = |seed: u64| {
            let f = fixture(BrokerConfig::default(), 8);
            let reaper =
                EvalReaper { rng: Arc::new(parking_lot::Mutex::new(SmallRng::seed_from_u64(seed))), ..f.reaper };
            (0..4).map(|_| reaper.follow_up_delay()).collect::<Vec<_>>()
        };
        assert_eq!(delays(1), delays(1));
        assert_ne!(delays(1), delays(2));
        assert!(delays(3).iter().all(|delay| *delay >= ReaperConfig::default().failed_follow_up_base));
    }

    fn status_of(store: &StateStore, eval: &Evaluation) -> EvalStatus {
        store.snapshot().eval(eval.id).expect("stored").status
    }

    #[test]
    fn cancelable_evals_are_written_as_canceled_in_bounded_batches() {
        let f = fixture(BrokerConfig::default(), 3);
        let evals = evals_for(&f.store, &f.broker, "web", 8);
        let first = f.broker.try_dequeue(&[JobType::Service]).expect("running").expect("first");
        f.broker.ack(first.eval.id, first.token).expect("ack");
        assert_eq!(f.broker.stats().total_cancelable, 6, "one of the 7 pending is kept");

        let index_before = f.store.latest_index();
        assert_eq!(f.reaper.reap_cancelable_batch(), Ok(3));
        assert_eq!(f.store.latest_index(), index_before + 1, "one command per batch");
        assert_eq!(f.reaper.reap_all(), Ok((3, 0)));
        let canceled = evals.iter().filter(|eval| status_of(&f.store, eval) == EvalStatus::Canceled).count();
        assert_eq!(canceled, 6);
        assert_eq!(status_of(&f.store, &evals[7]), EvalStatus::Pending, "the newest is kept");
    }

    #[test]
    fn duplicate_blocked_evals_are_canceled_too() {
        let f = fixture(BrokerConfig::default(), 10);
        let evals = evals_for(&f.store, &f.broker, "web", 2);
        for eval in &evals {
            let mut blocked = Evaluation::clone(eval);
            blocked.class_eligibility.insert(ComputedClass(1), true);
            f.blocked.block(Arc::new(blocked));
        }
        assert_eq!(f.reaper.reap_all(), Ok((1, 0)));
        assert_eq!(status_of(&f.store, &evals[0]), EvalStatus::Canceled);
    }

    #[test]
    fn failed_evals_are_recorded_with_a_follow_up_before_the_ack() {
        let config = BrokerConfig { delivery_limit: 1, ..BrokerConfig::default() };
        let f = fixture(config, 10);
        let evals = evals_for(&f.store, &f.broker, "web", 2);
        let held = f.broker.try_dequeue(&[JobType::Service]).expect("running").expect("first");
        f.broker.nack(held.eval.id, held.token).expect("nack");
        assert_eq!(f.broker.stats().total_failed_queue, 1);

        assert_eq!(f.reaper.reap_all(), Ok((0, 1)));
        let snapshot = f.store.snapshot();
        let failed = snapshot.eval(evals[0].id).expect("stored");
        assert_eq!(failed.status, EvalStatus::Failed);
        let follow_up = snapshot.eval(failed.next_eval.expect("has a follow-up")).expect("follow-up stored");
        assert_eq!(follow_up.triggered_by, TriggerReason::FailedFollowUp);
        assert_eq!(follow_up.previous_eval, Some(failed.id));
        assert!(follow_up.wait_until.is_some());
        assert_eq!(f.broker.stats().total_delayed, 1, "the follow-up waits in the broker");
        let next = f.broker.try_dequeue(&[JobType::Service]).expect("running").expect("the job is free again");
        assert_eq!(next.eval.id, evals[1].id);
    }

    #[test]
    fn the_running_reaper_is_woken_by_acks_and_stops_cleanly() {
        let f = fixture(BrokerConfig::default(), 10);
        let evals = evals_for(&f.store, &f.broker, "web", 3);
        let handle = f.reaper.clone().spawn();
        let first = f.broker.try_dequeue(&[JobType::Service]).expect("running").expect("first");
        f.broker.ack(first.eval.id, first.token).expect("ack");
        let wanted = evals[1].id;
        let store = f.store.clone();
        let mut index = store.latest_index();
        // Waits on the store's index notifications, not on a timer. The sweep
        // is hours away, so only the ack's signal can have woken the reaper.
        while store.snapshot().eval(wanted).expect("stored").status != EvalStatus::Canceled {
            index += 1;
            store.snapshot_min_index(index, Duration::from_secs(60)).expect("the reaper, woken by the ack, writes");
        }
        handle.stop();
    }
}
