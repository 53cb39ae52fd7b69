//! Eval broker benches: raw enqueue/dequeue/ack throughput with one and two
//! dequeuing threads, and the cancelable path.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use engine::clock::{SystemClock, Timestamp};
use engine::eval::broker::{BrokerConfig, EvalBroker};
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

/// Enqueues `evals`, then dequeues and acks all of them on `threads` threads.
fn run_through(broker: &EvalBroker, evals: Vec<Arc<Evaluation>>, threads: usize) {
    broker.enqueue_all(evals);
    let done = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 1..threads {
            scope.spawn(|| drain(broker, &done));
        }
        drain(broker, &done);
    });
    let stats = broker.stats();
    assert_eq!(done.load(Ordering::Relaxed), N, "every eval was acked");
    assert_eq!(stats.total_ready + stats.total_unacked + stats.total_pending, 0, "nothing is left");
}

/// The benchmark ids measure a broker in steady state, as a server's broker
/// lives for the whole process: one broker serves every iteration, so its
/// tables are already sized. `_cold` ids build a new broker per iteration
/// and include the growth of its tables.
fn enqueue_dequeue_ack(c: &mut Criterion) {
    let distinct = evals(N);
    let mut group = c.benchmark_group("broker");
    group.throughput(Throughput::Elements(N as u64));
    for (name, threads) in [("enqueue_dequeue_ack", 1), ("enqueue_dequeue_ack_2threads", 2)] {
        let broker = new_broker();
        group.bench_function(BenchmarkId::new(name, N), |b| {
            b.iter_batched(|| distinct.clone(), |evals| run_through(&broker, evals, threads), BatchSize::PerIteration)
        });
        group.bench_function(BenchmarkId::new(format!("{name}_cold"), N), |b| {
            b.iter_batched(
                || (new_broker(), distinct.clone()),
                |(broker, evals)| run_through(&broker, evals, threads),
                BatchSize::PerIteration,
            )
        });
    }
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
