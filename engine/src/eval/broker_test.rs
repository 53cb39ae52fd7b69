use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::clock::{Clock, ManualClock};
use crate::structs::{Job, Resources, TriggerReason};

const START: Timestamp = Timestamp(1_000_000_000_000);

fn broker_with(config: BrokerConfig) -> (EvalBroker, Arc<ManualClock>) {
    let clock = ManualClock::new(START);
    (EvalBroker::new(config, clock.clone()), clock)
}

fn broker() -> (EvalBroker, Arc<ManualClock>) {
    broker_with(BrokerConfig::default())
}

/// An eval of job `job` with the given priority and creation index.
fn eval(job: &str, kind: JobType, priority: u8, create_index: u64) -> Arc<Evaluation> {
    let spec = Job::new_simple(job, kind, 1, Resources::new(1, 1, 0));
    let mut eval = Evaluation::for_job(&spec, TriggerReason::JobRegister, START);
    eval.priority = priority;
    eval.create_index = create_index;
    eval.modify_index = create_index;
    Arc::new(eval)
}

fn take(broker: &EvalBroker, types: &[JobType]) -> Option<Dequeued> {
    broker.try_dequeue(types).expect("not shutting down")
}

const SERVICE: &[JobType] = &[JobType::Service];

#[test]
fn ready_evals_come_out_by_priority_then_creation_index() {
    let (broker, _) = broker();
    broker.enqueue(eval("low", JobType::Service, 10, 1));
    broker.enqueue(eval("high-late", JobType::Service, 90, 5));
    broker.enqueue(eval("mid", JobType::Service, 50, 2));
    broker.enqueue(eval("high-early", JobType::Service, 90, 3));
    let order: Vec<_> =
        std::iter::from_fn(|| take(&broker, SERVICE)).map(|dequeued| dequeued.eval.job_id.to_string()).collect();
    assert_eq!(order, ["high-early", "high-late", "mid", "low"]);
}

#[test]
fn dequeue_serves_only_the_requested_types_best_first() {
    let (broker, _) = broker();
    broker.enqueue(eval("batch", JobType::Batch, 80, 1));
    broker.enqueue(eval("service", JobType::Service, 40, 2));
    broker.enqueue(eval("system", JobType::System, 90, 3));
    let first = take(&broker, &[JobType::Service, JobType::Batch]).expect("batch eval");
    assert_eq!(&*first.eval.job_id, "batch");
    let second = take(&broker, &[JobType::Service, JobType::Batch]).expect("service eval");
    assert_eq!(&*second.eval.job_id, "service");
    assert!(take(&broker, &[JobType::Service, JobType::Batch]).is_none(), "system is not served");
    assert_eq!(&*take(&broker, &[JobType::System]).expect("system").eval.job_id, "system");
}

#[test]
fn one_eval_per_job_is_outstanding_and_the_rest_wait() {
    let (broker, _) = broker();
    broker.enqueue(eval("web", JobType::Service, 50, 1));
    broker.enqueue(eval("web", JobType::Service, 50, 2));
    let first = take(&broker, SERVICE).expect("first");
    assert!(take(&broker, SERVICE).is_none(), "the second waits while the first is unacked");
    assert_eq!(broker.stats().total_pending, 1);
    broker.ack(first.eval.id, first.token).expect("ack");
    let second = take(&broker, SERVICE).expect("second is ready after the ack");
    assert_eq!(second.eval.create_index, 2);
    assert_eq!(broker.stats().total_pending, 0);
}

#[test]
fn ack_and_nack_check_the_token() {
    let (broker, _) = broker();
    let queued = eval("web", JobType::Service, 50, 1);
    broker.enqueue(queued.clone());
    assert_eq!(broker.ack(queued.id, Token(1)), Err(BrokerError::NotOutstanding(queued.id)));
    let held = take(&broker, SERVICE).expect("dequeued");
    let wrong = Token(held.token.0.wrapping_add(1));
    assert_eq!(broker.ack(held.eval.id, wrong), Err(BrokerError::TokenMismatch(held.eval.id)));
    assert_eq!(broker.nack(held.eval.id, wrong), Err(BrokerError::TokenMismatch(held.eval.id)));
    assert_eq!(broker.outstanding(held.eval.id), Some(held.token));
    broker.ack(held.eval.id, held.token).expect("right token");
    assert_eq!(broker.ack(held.eval.id, held.token), Err(BrokerError::NotOutstanding(held.eval.id)));
    assert_eq!(broker.outstanding(held.eval.id), None);
}

#[test]
fn an_unacked_eval_is_nacked_when_its_timeout_passes_and_delivered_again() {
    let config = BrokerConfig { initial_nack_delay: Duration::from_secs(1), ..BrokerConfig::default() };
    let (broker, clock) = broker_with(config.clone());
    broker.enqueue(eval("web", JobType::Service, 50, 1));
    let first = take(&broker, SERVICE).expect("dequeued");

    clock.advance(config.nack_timeout - Duration::from_millis(1));
    assert_eq!(broker.process_timers().nacked, 0, "not yet");
    broker.outstanding_reset(first.eval.id, first.token).expect("still held");
    clock.advance(config.nack_timeout - Duration::from_millis(1));
    assert_eq!(broker.process_timers().nacked, 0, "the reset moved the deadline");
    clock.advance(Duration::from_millis(2));
    let nacked_at = clock.now();
    let delay_due = nacked_at.plus(config.initial_nack_delay);
    assert_eq!(broker.process_timers(), TimerOutcome { nacked: 1, released: 0, next_deadline: Some(delay_due) });
    assert_eq!(broker.stats().total_nack_timeouts, 1);

    clock.advance(config.initial_nack_delay);
    assert_eq!(broker.process_timers().released, 1);
    let second = take(&broker, SERVICE).expect("delivered again");
    assert_eq!(second.eval.id, first.eval.id);
    assert_ne!(second.token, first.token);
    assert_eq!(broker.ack(first.eval.id, first.token), Err(BrokerError::TokenMismatch(first.eval.id)));
}

#[test]
fn nacked_evals_wait_a_short_delay_the_first_time_and_a_longer_one_after() {
    let config = BrokerConfig {
        delivery_limit: 5,
        initial_nack_delay: Duration::from_secs(1),
        subsequent_nack_delay: Duration::from_secs(20),
        ..BrokerConfig::default()
    };
    let (broker, clock) = broker_with(config);
    broker.enqueue(eval("web", JobType::Service, 50, 1));

    let first = take(&broker, SERVICE).expect("first delivery");
    broker.nack(first.eval.id, first.token).expect("nack");
    let next = broker.process_timers().next_deadline;
    assert_eq!(next, Some(clock.now().plus(Duration::from_secs(1))), "the timer thread sleeps until the delay ends");
    clock.advance(Duration::from_millis(999));
    broker.process_timers();
    assert!(take(&broker, SERVICE).is_none(), "inside the first delay");
    clock.advance(Duration::from_millis(1));
    broker.process_timers();
    let second = take(&broker, SERVICE).expect("after the first delay");

    broker.nack(second.eval.id, second.token).expect("nack");
    clock.advance(Duration::from_millis(19_999));
    broker.process_timers();
    assert!(take(&broker, SERVICE).is_none(), "inside the longer delay");
    clock.advance(Duration::from_millis(1));
    broker.process_timers();
    assert!(take(&broker, SERVICE).is_some(), "after the longer delay");
}

#[test]
fn the_delivery_limit_sends_an_eval_to_the_failed_queue() {
    let config = BrokerConfig {
        delivery_limit: 2,
        initial_nack_delay: Duration::ZERO,
        subsequent_nack_delay: Duration::ZERO,
        ..BrokerConfig::default()
    };
    let (broker, _) = broker_with(config);
    broker.enqueue(eval("web", JobType::Service, 50, 1));
    broker.enqueue(eval("web", JobType::Service, 50, 2));
    for _ in 0..2 {
        let held = take(&broker, SERVICE).expect("delivered");
        assert_eq!(held.eval.create_index, 1);
        broker.nack(held.eval.id, held.token).expect("nack");
    }
    assert!(take(&broker, SERVICE).is_none(), "the failed eval still holds its job");
    let stats = broker.stats();
    assert_eq!((stats.total_failed_queue, stats.total_delivery_limit_reached, stats.total_ready), (1, 1, 0));

    let failed = broker.take_failed(10);
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].eval.create_index, 1);
    broker.ack(failed[0].eval.id, failed[0].token).expect("the reaper acks it");
    assert_eq!(take(&broker, SERVICE).expect("the job's next eval").eval.create_index, 2);
}

#[test]
fn delayed_evals_wait_until_their_time() {
    let (broker, clock) = broker();
    let mut delayed = Evaluation::clone(&eval("web", JobType::Service, 50, 1));
    delayed.wait_until = Some(START.plus(Duration::from_secs(30)));
    broker.enqueue(Arc::new(delayed));
    assert_eq!(broker.stats().total_delayed, 1);
    assert!(take(&broker, SERVICE).is_none());
    clock.advance(Duration::from_secs(30));
    assert_eq!(broker.process_timers().released, 1);
    assert!(take(&broker, SERVICE).is_some());
    assert_eq!(broker.stats().total_delayed, 0);
}

#[test]
fn an_ack_keeps_the_newest_highest_priority_pending_eval_and_cancels_the_rest() {
    let (broker, _) = broker();
    broker.enqueue(eval("web", JobType::Service, 50, 1));
    broker.enqueue(eval("web", JobType::Service, 50, 2));
    broker.enqueue(eval("web", JobType::Service, 70, 3));
    broker.enqueue(eval("web", JobType::Service, 70, 4));
    broker.enqueue(eval("web", JobType::Service, 50, 5));
    let signal = broker.cancelable_signal();
    let first = take(&broker, SERVICE).expect("first");
    assert!(signal.try_recv().is_err(), "nothing cancelable yet");
    broker.ack(first.eval.id, first.token).expect("ack");
    assert!(signal.try_recv().is_ok(), "the ack woke the reaper");

    let next = take(&broker, SERVICE).expect("the kept eval");
    assert_eq!(next.eval.create_index, 4, "newest of the highest priority");
    assert_eq!(broker.stats().total_cancelable, 3);
    let mut canceled: Vec<_> = broker.take_cancelable(2).iter().map(|eval| eval.create_index).collect();
    assert_eq!(canceled.len(), 2, "batches are bounded");
    canceled.extend(broker.take_cancelable(2).iter().map(|eval| eval.create_index));
    canceled.sort_unstable();
    assert_eq!(canceled, [2, 3, 5]);
    assert_eq!(broker.stats().total_cancelable, 0);
    assert_eq!(broker.stats().total_pending, 0);
}

#[test]
fn enqueueing_a_tracked_eval_again_is_ignored() {
    let (broker, _) = broker();
    let queued = eval("web", JobType::Service, 50, 1);
    broker.enqueue(queued.clone());
    broker.enqueue(queued.clone());
    assert_eq!(broker.stats().total_ready, 1);
    let held = take(&broker, SERVICE).expect("dequeued");
    broker.enqueue(queued);
    assert_eq!(broker.stats().total_ready, 0, "an unacked eval is not enqueued twice");
    broker.ack(held.eval.id, held.token).expect("ack");
}

#[test]
fn pause_stops_dequeues_until_resume() {
    let (broker, _) = broker();
    broker.enqueue(eval("web", JobType::Service, 50, 1));
    broker.pause();
    assert!(broker.is_paused());
    assert!(broker.dequeue(SERVICE, Duration::from_millis(1)).expect("paused, not shut down").is_none());
    broker.resume();
    assert!(take(&broker, SERVICE).is_some());
}

#[test]
fn a_waiting_dequeue_wakes_on_enqueue() {
    let (broker, _) = broker();
    let broker = Arc::new(broker);
    let waiter = {
        let broker = broker.clone();
        std::thread::spawn(move || broker.dequeue(SERVICE, Duration::from_secs(600)).map(|got| got.map(|d| d.eval.id)))
    };
    while broker.waiting_workers() == 0 {
        std::thread::yield_now();
    }
    let queued = eval("web", JobType::Service, 50, 1);
    broker.enqueue(queued.clone());
    assert_eq!(waiter.join().expect("waiter"), Ok(Some(queued.id)));
}

#[test]
fn shutdown_ends_waiting_dequeues_with_its_own_error() {
    let (broker, _) = broker();
    let broker = Arc::new(broker);
    let waiter = {
        let broker = broker.clone();
        std::thread::spawn(move || broker.dequeue(SERVICE, Duration::from_secs(600)).map(|got| got.is_some()))
    };
    while broker.waiting_workers() == 0 {
        std::thread::yield_now();
    }
    broker.shutdown();
    assert_eq!(waiter.join().expect("waiter"), Err(BrokerError::ShuttingDown));
}

#[test]
fn stats_count_per_scheduler_type() {
    let (broker, _) = broker();
    broker.enqueue(eval("a", JobType::Service, 50, 1));
    broker.enqueue(eval("b", JobType::Service, 50, 2));
    broker.enqueue(eval("c", JobType::Batch, 50, 3));
    take(&broker, SERVICE).expect("one service eval");
    let stats = broker.stats();
    assert_eq!((stats.total_ready, stats.total_unacked), (2, 1));
    let service = stats.by_scheduler.iter().find(|(kind, _)| *kind == JobType::Service).expect("service").1;
    let batch = stats.by_scheduler.iter().find(|(kind, _)| *kind == JobType::Batch).expect("batch").1;
    assert_eq!(service, SchedulerStats { ready: 1, unacked: 1 });
    assert_eq!(batch, SchedulerStats { ready: 1, unacked: 0 });
}
