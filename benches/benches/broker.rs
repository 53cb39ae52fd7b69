//! Eval broker benches: raw enqueue/dequeue/ack throughput with one and two
//! dequeuing threads, and the cancelable path.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use engine::broker::{BrokerConfig, EvalBroker};
use engine::clock::{SystemClock, Timestamp};
use engine::structs::{EvalId, Evaluation, Job, JobType, Resources, TriggerReason};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const N: usize = 100_000;
const SERVICE: &[JobType] = &[JobType::Service];

/// `N` evals over `n_jobs` jobs, creation indexes in order.
fn evals(n_jobs: usize) -> Vec<Arc<Evaluation>> {
    let jobs: Vec<Job> = (0..n_jobs)
        .map(|j| Job::new_simple(&format!("job-{j}"), JobType::Service, 1, Resources::new(1, 1, 0)))
        .collect();
    (0..N)
        .map(|i| {
            let mut eval = Evaluation::with_id(
                EvalId::from_u128(i as u128 + 1),
                &jobs[i % n_jobs],
                TriggerReason::JobRegister,
                Timestamp(0),
            );
            eval.create_index = i as u64 + 1;
            eval.modify_index = i as u64 + 1;
            Arc::new(eval)
        })
        .collect()
}

fn new_broker() -> EvalBroker {
    EvalBroker::new(BrokerConfig::default(), SystemClock::shared())
}

/// Dequeues and acks until `done` reaches `N`.
fn drain(broker: &EvalBroker, done: &AtomicUsize) {
    while done.load(Ordering::Relaxed) < N {
        if let Some(held) = broker.dequeue(SERVICE, Duration::from_millis(1)).expect("running") {
            broker.ack(held.eval.id, held.token).expect("ack");
            done.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn enqueue_dequeue_ack(c: &mut Criterion) {
    let distinct = evals(N);
    let mut group = c.benchmark_group("broker");
    group.throughput(Throughput::Elements(N as u64));
    group.bench_function(BenchmarkId::new("enqueue_dequeue_ack", N), |b| {
        b.iter_batched(
            || (new_broker(), distinct.clone()),
            |(broker, evals)| {
                broker.enqueue_all(evals);
                let done = AtomicUsize::new(0);
                drain(&broker, &done);
                assert_eq!(broker.stats().total_ready + broker.stats().total_unacked, 0, "every eval was acked");
            },
            BatchSize::PerIteration,
        )
    });
    group.bench_function(BenchmarkId::new("enqueue_dequeue_ack_2threads", N), |b| {
        b.iter_batched(
            || (new_broker(), distinct.clone()),
            |(broker, evals)| {
                broker.enqueue_all(evals);
                let done = AtomicUsize::new(0);
                std::thread::scope(|scope| {
                    scope.spawn(|| drain(&broker, &done));
                    scope.spawn(|| drain(&broker, &done));
                });
                assert_eq!(done.load(Ordering::Relaxed), N, "every eval was acked");
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

fn cancelable(c: &mut Criterion) {
    let per_job = evals(1_000);
    let mut group = c.benchmark_group("broker");
    group.throughput(Throughput::Elements(N as u64));
    group.bench_function(BenchmarkId::new("cancelable", N), |b| {
        b.iter_batched(
            || (new_broker(), per_job.clone()),
            |(broker, evals)| {
                broker.enqueue_all(evals);
                let (mut acked, mut canceled) = (0, 0);
                while let Some(held) = broker.try_dequeue(SERVICE).expect("running") {
                    broker.ack(held.eval.id, held.token).expect("ack");
                    acked += 1;
                    canceled += broker.take_cancelable(728).len();
                }
                canceled += broker.take_cancelable(usize::MAX).len();
                assert_eq!(acked + canceled, N, "everything ends acked or canceled");
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = enqueue_dequeue_ack, cancelable
}
criterion_main!(benches);
