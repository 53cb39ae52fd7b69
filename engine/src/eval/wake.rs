//! The wake-up of dequeuing workers: the hand-off between a producer that
//! makes a ready eval visible and a worker about to park because it saw none.
//!
//! 1. The producer publishes (pushes the eval and increments its ready
//!    counter with `SeqCst`), then reads `sleepers` (`SeqCst`); only when a
//!    worker sleeps does it take the gate's lock and notify.
//! 2. A worker that found nothing takes the lock, counts itself in
//!    `sleepers` (`SeqCst`), then looks again, reading the ready counters
//!    with `SeqCst`, before it parks on the condvar.
//!
//! Each side writes, then reads what the other wrote, all `SeqCst`, so at
//! least one of them sees the other: either the worker's second look finds
//! the eval, or the producer sees the sleeper and notifies. The worker holds
//! the lock from its second look until it parks, so that notify cannot slip
//! in between. (With a relaxed counter both could miss each other and the
//! worker would sleep out its whole dequeue timeout; the loom model in
//! `engine/tests/loom.rs` checks this protocol.)

use std::time::Instant;

use crate::sync::atomic::{AtomicUsize, Ordering};
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
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            self.notify_all();
        }
    }

    /// Wakes every sleeper whatever the counters say (pause, resume, shutdown).
    pub fn notify_all(&self) {
        let _guard = lock(&self.lock);
        self.wake.notify_all();
    }

    /// Step 2: runs `look` until it yields, parking in between, until
    /// `deadline` (`None`: no deadline). `look` must read what producers
    /// publish with `SeqCst`.
    pub fn wait_for<T>(&self, deadline: Option<Instant>, mut look: impl FnMut() -> Option<T>) -> Option<T> {
        let mut guard = lock(&self.lock);
        self.sleepers.fetch_add(1, Ordering::SeqCst);
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
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        found
    }

    /// Workers parked right now.
    pub fn sleepers(&self) -> usize {
        self.sleepers.load(Ordering::SeqCst)
    }
}
