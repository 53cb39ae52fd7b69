//! The wake-up of dequeuing workers: the hand-off between a producer that
//! makes a ready eval visible and a worker about to park because it saw none.
//!
//! 1. The producer publishes (pushes the eval, increments its ready
//!    counter), issues a `SeqCst` fence, then reads `sleepers`; only when a
//!    worker sleeps does it take the gate's lock and notify.
//! 2. A worker that found nothing takes the lock, counts itself in
//!    `sleepers`, issues a `SeqCst` fence, then looks again before it parks
//!    on the condvar.
//!
//! Each side writes, fences, then reads what the other wrote; of two
//! `SeqCst` fences one comes first, so at least one side sees the other's
//! write: either the worker's second look finds the eval, or the producer
//! sees the sleeper and notifies. The worker holds the lock from its second
//! look until it parks, so that notify cannot slip in between. Without the
//! fences both could read the old values (store buffering) and the worker
//! would sleep out its whole dequeue timeout; the loom model in
//! `engine/tests/loom.rs` checks the protocol (loom models `SeqCst` fences,
//! not `SeqCst` accesses, which is one more reason for fences here).

use std::time::Instant;

use crate::sync::atomic::{fence, AtomicUsize, Ordering};
use crate::sync::{lock, Condvar, Mutex};

/// Parks workers until a producer may have published work; see the module docs.
#[derive(Debug, Default)]
pub struct WakeGate {
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

impl WakeGate {
    /// A gate with no sleepers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Step 1, after the producer published: wakes the sleepers, if any.
    pub fn notify(&self) {
        fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::Relaxed) > 0 {
            self.notify_all();
        }
    }

    /// Wakes every sleeper whatever the counters say (pause, resume, shutdown).
    pub fn notify_all(&self) {
        let _guard = lock(&self.lock);
        self.wake.notify_all();
    }

    /// Step 2: runs `look` until it yields, parking in between, until
    /// `deadline` (`None`: no deadline).
    pub fn wait_for<T>(&self, deadline: Option<Instant>, mut look: impl FnMut() -> Option<T>) -> Option<T> {
        let mut guard = lock(&self.lock);
        self.sleepers.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let found = loop {
            if let Some(found) = look() {
                break Some(found);
            }
            match deadline {
                None => guard = self.wake.wait(guard).unwrap_or_else(std::sync::PoisonError::into_inner),
                Some(deadline) => {
                    let timeout = deadline.saturating_duration_since(Instant::now());
                    let (next, waited) =
                        self.wake.wait_timeout(guard, timeout).unwrap_or_else(std::sync::PoisonError::into_inner);
                    guard = next;
                    if waited.timed_out() {
                        break look();
                    }
                }
            }
        };
        self.sleepers.fetch_sub(1, Ordering::Relaxed);
        found
    }

    /// Workers parked right now.
    pub fn sleepers(&self) -> usize {
        self.sleepers.load(Ordering::Relaxed)
    }
}
