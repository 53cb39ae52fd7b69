use std::sync::Arc;

use super::*;
use crate::clock::Timestamp;
use crate::structs::{Evaluation, Job, JobType, Resources, TriggerReason};

fn batch(index: u64) -> EventBatch {
    let job = Job::new_simple("web", JobType::Service, 1, Resources::default());
    let eval = Evaluation::for_job(&job, TriggerReason::JobRegister, Timestamp(index));
    EventBatch {
        index,
        events: vec![Event { event_type: "JobRegistered", payload: Payload::Evaluation(Arc::new(eval)) }],
    }
}

fn read_all(subscription: &mut Subscription) -> Result<Vec<u64>, SubscriptionError> {
    let mut indexes = Vec::new();
    while let Some(batch) = subscription.try_next()? {
        indexes.push(batch.index);
    }
    Ok(indexes)
}

#[test]
fn a_subscription_reads_every_batch_from_its_index_in_order() {
    let broker = Arc::new(EventBroker::new(10));
    for index in [3, 5, 8, 9] {
        broker.publish(batch(index));
    }
    assert_eq!(read_all(&mut broker.subscribe(0)), Ok(vec![3, 5, 8, 9]), "0: from the oldest kept");
    assert_eq!(read_all(&mut broker.subscribe(5)), Ok(vec![5, 8, 9]), "inclusive");
    assert_eq!(read_all(&mut broker.subscribe(6)), Ok(vec![8, 9]), "the first at or after");
    let mut later = broker.subscribe(10);
    assert_eq!(read_all(&mut later), Ok(vec![]), "newer than the newest: waits");
    broker.publish(batch(12));
    assert_eq!(read_all(&mut later), Ok(vec![12]));
    assert_eq!(later.last_read(), 12);
}

#[test]
fn an_index_older_than_the_buffer_starts_at_the_oldest_kept_batch() {
    let broker = Arc::new(EventBroker::new(3));
    for index in 1..=6 {
        broker.publish(batch(index));
    }
    assert_eq!(read_all(&mut broker.subscribe(2)), Ok(vec![4, 5, 6]));
}

#[test]
fn a_reader_that_falls_a_whole_buffer_behind_is_dropped_with_where_to_resume() {
    let broker = Arc::new(EventBroker::new(3));
    let mut slow = broker.subscribe(0);
    broker.publish(batch(1));
    assert_eq!(slow.try_next().map(|batch| batch.map(|batch| batch.index)), Ok(Some(1)));
    for index in 2..=5 {
        broker.publish(batch(index));
    }
    let lagged = slow.try_next().expect_err("batch 2 left the ring");
    assert_eq!(lagged, SubscriptionError::Lagged { capacity: 3, last_read: 1, resume_index: 2 });
    assert!(lagged.to_string().contains("index=2"), "{lagged}");
    assert!(slow.try_next().is_err(), "it reads nothing more");
    // A reader that keeps up is not affected.
    let mut fast = broker.subscribe(0);
    assert_eq!(read_all(&mut fast), Ok(vec![3, 4, 5]));
}

#[test]
fn empty_batches_and_a_zero_capacity_keep_nothing() {
    let broker = Arc::new(EventBroker::new(0));
    assert!(!broker.is_enabled());
    broker.publish(batch(1));
    assert_eq!(broker.newest_index(), None);
    broker.set_capacity(2);
    broker.publish(EventBatch { index: 2, events: Vec::new() });
    broker.publish(batch(3));
    assert_eq!(read_all(&mut broker.subscribe(0)), Ok(vec![3]));
}

#[test]
fn an_awaited_next_wakes_on_publish_and_on_close() {
    let broker = Arc::new(EventBroker::new(4));
    let mut subscription = broker.subscribe(0);
    let publisher = {
        let broker = broker.clone();
        std::thread::spawn(move || broker.publish(batch(7)))
    };
    let first = futures_lite::future::block_on(subscription.next()).expect("published");
    assert_eq!(first.index, 7);
    publisher.join().expect("publisher thread");
    let closer = {
        let broker = broker.clone();
        std::thread::spawn(move || broker.close())
    };
    assert_eq!(
        futures_lite::future::block_on(subscription.next()).map(|batch| batch.index),
        Err(SubscriptionError::Closed)
    );
    closer.join().expect("closer thread");
}
