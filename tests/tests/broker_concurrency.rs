//! Hammers the eval broker from several threads (enqueue, dequeue, ack, nack,
//! failed-queue reaping and cancelable reaping interleaved), then checks that
//! every eval ended exactly once (acked or canceled), and that no two evals
//! of one job were ever handed out at the same time.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use engine::clock::{ManualClock, Timestamp};
use engine::eval::broker::{BrokerConfig, EvalBroker};
use engine::structs::{EvalId, Evaluation, Job, JobKey, JobType, Resources, TriggerReason};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const N_EVALS: usize = 6_000;
const N_JOBS: usize = 300;
const TYPES: &[JobType] = &[JobType::Service, JobType::Batch];

#[derive(Default)]
struct Ledger {
    acked: Mutex<Vec<EvalId>>,
    canceled: Mutex<Vec<EvalId>>,
    in_flight: Mutex<HashSet<JobKey>>,
    ended: AtomicUsize,
}

impl Ledger {
    fn hold(&self, job: JobKey) {
        assert!(self.in_flight.lock().expect("ledger").insert(job.clone()), "two evals of {job} handed out at once");
    }

    fn release(&self, job: &JobKey) {
        self.in_flight.lock().expect("ledger").remove(job);
    }

    fn acked(&self, id: EvalId) {
        self.acked.lock().expect("ledger").push(id);
        self.ended.fetch_add(1, Ordering::SeqCst);
    }

    fn canceled(&self, ids: impl IntoIterator<Item = EvalId>) {
        let mut canceled = self.canceled.lock().expect("ledger");
        let before = canceled.len();
        canceled.extend(ids);
        self.ended.fetch_add(canceled.len() - before, Ordering::SeqCst);
    }

    fn done(&self) -> bool {
        self.ended.load(Ordering::SeqCst) >= N_EVALS
    }
}

fn all_evals() -> Vec<Arc<Evaluation>> {
    (0..N_EVALS)
        .map(|i| {
            let kind = TYPES[i % TYPES.len()];
            let job = Job::new_simple(&format!("job-{}", i % N_JOBS), kind, 1, Resources::new(1, 1, 0));
            let mut eval =
                Evaluation::with_id(EvalId::from_u128(i as u128 + 1), &job, TriggerReason::JobRegister, Timestamp(0));
            eval.priority = (i % 7 * 10 + 10) as u8;
            eval.create_index = i as u64 + 1;
            Arc::new(eval)
        })
        .collect()
}

fn worker(broker: &EvalBroker, ledger: &Ledger, seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    while !ledger.done() {
        if let Some(held) = broker.dequeue(TYPES, Duration::from_millis(1)).expect("running") {
            ledger.hold(held.eval.job_key());
            // "Schedule" for a moment while holding the job, so overlapping holds would be seen.
            let nack = rng.random_bool(0.3);
            for _ in 0..rng.random_range(0..200) {
                std::hint::spin_loop();
            }
            ledger.release(&held.eval.job_key());
            if nack {
                broker.nack(held.eval.id, held.token).expect("nack with our token");
            } else {
                broker.ack(held.eval.id, held.token).expect("ack with our token");
                ledger.acked(held.eval.id);
            }
        }
        reap(broker, ledger);
    }
}

/// What the reaper does: acks failed evals after "writing" them, and takes
/// cancelable ones.
fn reap(broker: &EvalBroker, ledger: &Ledger) {
    for failed in broker.take_failed(16) {
        ledger.hold(failed.eval.job_key());
        ledger.release(&failed.eval.job_key());
        broker.ack(failed.eval.id, failed.token).expect("ack a failed eval");
        ledger.acked(failed.eval.id);
    }
    ledger.canceled(broker.take_cancelable(64).iter().map(|eval| eval.id));
}

#[test]
fn every_eval_ends_exactly_once_under_concurrent_use() {
    let config = BrokerConfig {
        delivery_limit: 3,
        initial_nack_delay: Duration::ZERO,
        subsequent_nack_delay: Duration::ZERO,
        ..BrokerConfig::default()
    };
    let broker = EvalBroker::new(config, ManualClock::new(Timestamp(1)));
    let ledger = Ledger::default();
    let evals = all_evals();
    std::thread::scope(|scope| {
        for half in evals.chunks(N_EVALS / 2) {
            let broker = &broker;
            scope.spawn(move || broker.enqueue_all(half.iter().cloned()));
        }
        for seed in 0..3 {
            let (broker, ledger) = (&broker, &ledger);
            scope.spawn(move || worker(broker, ledger, seed));
        }
    });

    let acked = ledger.acked.into_inner().expect("ledger");
    let canceled = ledger.canceled.into_inner().expect("ledger");
    let acked_set: HashSet<_> = acked.iter().copied().collect();
    let canceled_set: HashSet<_> = canceled.iter().copied().collect();
    assert_eq!(acked_set.len(), acked.len(), "no eval was acked twice");
    assert_eq!(canceled_set.len(), canceled.len(), "no eval was canceled twice");
    assert!(acked_set.is_disjoint(&canceled_set), "no eval was both acked and canceled");
    let all: HashSet<_> = evals.iter().map(|eval| eval.id).collect();
    assert_eq!(&acked_set | &canceled_set, all, "every eval is accounted for");
    let stats = broker.stats();
    assert_eq!(
        (stats.total_ready, stats.total_unacked, stats.total_pending, stats.total_failed_queue, stats.total_cancelable),
        (0, 0, 0, 0, 0),
        "nothing is left in any queue: {stats:?}"
    );
    assert!(stats.total_delivery_limit_reached > 0, "the failed queue was exercised");
    assert!(!canceled.is_empty(), "the cancelable path was exercised");
}
