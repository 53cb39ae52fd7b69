//! The synchronization under Drover's hand-written hand-offs, swapped for
//! loom's when model checking (`RUSTFLAGS="--cfg loom"`), as tokio's
//! `src/loom` does. Only the hand-offs that the loom models cover use it:
//! the broker's wake-up of dequeuing workers ([`crate::eval::broker`]), the
//! update batcher's sealing and flushing ([`crate::node::update_batch`]) and
//! [`Reply`], the value one side sets and the other waits for or awaits.

mod reply;

pub use reply::Reply;

#[cfg(loom)]
pub(crate) use loom::sync::{atomic, Arc, Condvar, Mutex, MutexGuard};
#[cfg(loom)]
pub(crate) use loom::thread;
#[cfg(not(loom))]
pub(crate) use std::sync::{atomic, Arc, Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::thread;

/// Locks `mutex`. Poison is ignored: every critical section behind these
/// locks is a few assignments that leave the data consistent even if a
/// panic unwinds through them.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
