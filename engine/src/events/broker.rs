//! [`EventBroker`]: the ring of the newest event batches, and the
//! subscriptions that read it (contract: the module docs of `events`).
//!
//! Batches are numbered in publish order; a subscription holds the number
//! of the next batch it reads. The ring is the only copy of a batch, so a
//! subscriber's backlog is bounded by the ring: when its next batch has
//! been pushed out it has lagged, and it is told so instead of holding
//! memory or the writer back.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use event_listener::Event as Notify;
use parking_lot::Mutex;

use super::EventBatch;

/// How many batches a server keeps unless configured otherwise (Nomad's
/// `event_buffer_size`).
pub const DEFAULT_EVENT_BUFFER: usize = 100;

/// Why a subscription reads nothing more.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubscriptionError {
    /// The subscriber read too slowly: the batch it needed next left the
    /// buffer of `capacity` batches before it was read.
    #[error(
        "the subscriber fell more than {capacity} event batches behind and was dropped; \
         resubscribe with index={resume_index} to continue (events after index {last_read} may have been missed)"
    )]
    Lagged {
        /// The buffer's size in batches.
        capacity: usize,
        /// The index of the last batch the subscriber read (0: none).
        last_read: u64,
        /// The index to subscribe from again.
        resume_index: u64,
    },
    /// The server is shutting down.
    #[error("the server's event broker closed")]
    Closed,
}

/// The newest batches (module docs).
#[derive(Debug)]
pub struct EventBroker {
    ring: Mutex<Ring>,
    /// The ring's capacity, readable without the lock: 0 means off.
    capacity: AtomicUsize,
    published: Notify,
}

#[derive(Debug)]
struct Ring {
    batches: VecDeque<Arc<EventBatch>>,
    /// The number of `batches[0]` (of the next batch, when empty).
    first_number: u64,
    closed: bool,
}

impl Ring {
    fn next_number(&self) -> u64 {
        self.first_number + self.batches.len() as u64
    }
}

impl Default for EventBroker {
    fn default() -> Self {
        EventBroker::new(DEFAULT_EVENT_BUFFER)
    }
}

impl EventBroker {
    /// A broker keeping the newest `capacity` batches (0: events off).
    pub fn new(capacity: usize) -> EventBroker {
        EventBroker {
            ring: Mutex::new(Ring { batches: VecDeque::with_capacity(capacity), first_number: 0, closed: false }),
            capacity: AtomicUsize::new(capacity),
            published: Notify::new(),
        }
    }

    /// Whether batches are kept: the store builds none when not.
    pub fn is_enabled(&self) -> bool {
        self.capacity.load(Ordering::Relaxed) > 0
    }

    /// How many batches are kept.
    pub fn capacity(&self) -> usize {
        self.capacity.load(Ordering::Relaxed)
    }

    /// Keeps `capacity` batches from now on (the server's configuration);
    /// the oldest go when the ring shrinks.
    pub fn set_capacity(&self, capacity: usize) {
        let mut ring = self.ring.lock();
        self.capacity.store(capacity, Ordering::Relaxed);
        Self::trim(&mut ring, capacity);
    }

    /// Adds `batch` as the newest and wakes the readers. A batch with no
    /// events is not kept.
    pub fn publish(&self, batch: EventBatch) {
        if batch.events.is_empty() {
            return;
        }
        {
            let mut ring = self.ring.lock();
            let capacity = self.capacity();
            if capacity == 0 || ring.closed {
                return;
            }
            ring.batches.push_back(Arc::new(batch));
            Self::trim(&mut ring, capacity);
        }
        self.published.notify(usize::MAX);
    }

    fn trim(ring: &mut Ring, capacity: usize) {
        while ring.batches.len() > capacity {
            ring.batches.pop_front();
            ring.first_number += 1;
        }
    }

    /// A subscription from the first kept batch whose index is at least
    /// `from_index` (contract, step 3): 0 or an index older than the
    /// buffer starts at the oldest kept batch, one newer than the newest
    /// waits for the next.
    pub fn subscribe(self: &Arc<Self>, from_index: u64) -> Subscription {
        let ring = self.ring.lock();
        let skipped = ring.batches.partition_point(|batch| batch.index < from_index);
        Subscription { broker: self.clone(), next_number: ring.first_number + skipped as u64, last_read: 0 }
    }

    /// Ends every subscription (shutdown); nothing is published after.
    pub fn close(&self) {
        let mut ring = self.ring.lock();
        ring.closed = true;
        ring.batches.clear();
        drop(ring);
        self.published.notify(usize::MAX);
    }

    /// The index of the newest kept batch, if any.
    pub fn newest_index(&self) -> Option<u64> {
        self.ring.lock().batches.back().map(|batch| batch.index)
    }
}

/// One reader of the broker's batches, in order (module docs).
#[derive(Debug)]
pub struct Subscription {
    broker: Arc<EventBroker>,
    next_number: u64,
    last_read: u64,
}

impl Subscription {
    /// The next batch if one was published, without waiting.
    pub fn try_next(&mut self) -> Result<Option<Arc<EventBatch>>, SubscriptionError> {
        let ring = self.broker.ring.lock();
        if ring.closed {
            return Err(SubscriptionError::Closed);
        }
        if self.next_number < ring.first_number {
            return Err(SubscriptionError::Lagged {
                capacity: self.broker.capacity(),
                last_read: self.last_read,
                resume_index: self.last_read + 1,
            });
        }
        if self.next_number >= ring.next_number() {
            return Ok(None);
        }
        let batch = ring.batches[(self.next_number - ring.first_number) as usize].clone();
        self.next_number += 1;
        self.last_read = batch.index;
        Ok(Some(batch))
    }

    /// The next batch, waited for without blocking a thread.
    pub async fn next(&mut self) -> Result<Arc<EventBatch>, SubscriptionError> {
        loop {
            if let Some(batch) = self.try_next()? {
                return Ok(batch);
            }
            // Listen, then look again: a batch published in between is not missed.
            let listener = self.broker.published.listen();
            if let Some(batch) = self.try_next()? {
                return Ok(batch);
            }
            listener.await;
        }
    }

    /// The index of the last batch read (0: none yet).
    pub fn last_read(&self) -> u64 {
        self.last_read
    }
}
