//! [`Reply`]: a value set once by one side and waited for by the other,
//! from a thread (blocking, optionally with a deadline) or from an async task
//! (awaiting; no runtime needed: the waker is event-listener's).
//!
//! The protocol, for one reply:
//! 1. [`Reply::set`] stores the value under the lock, then notifies every
//!    listener. Only the first set counts.
//! 2. A waiter checks for the value, and only if there is none registers a
//!    listener, checks again, and then parks on the listener. A set between
//!    the two checks is seen by the second; a set after it notifies the
//!    listener. So no set is missed, whichever order the two sides run in.

use std::time::Instant;

use event_listener::{Event, Listener};

use super::{lock, Mutex};

/// A value set once and waited for; see the module docs.
#[derive(Debug)]
pub struct Reply<T> {
    slot: Mutex<Slot<T>>,
    set: Event,
}

#[derive(Debug)]
enum Slot<T> {
    Empty,
    Full(T),
    /// The one waiter that takes the value has taken it.
    Taken,
}

impl<T> Default for Reply<T> {
    fn default() -> Self {
        Reply { slot: Mutex::new(Slot::Empty), set: Event::new() }
    }
}

impl<T> Reply<T> {
    /// An empty reply.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the value and wakes every waiter (step 1). Returns whether this
    /// call set it (false: it was set before, and keeps that value).
    pub fn set(&self, value: T) -> bool {
        {
            let mut slot = lock(&self.slot);
            if !matches!(*slot, Slot::Empty) {
                return false;
            }
            *slot = Slot::Full(value);
        }
        self.set.notify(usize::MAX);
        true
    }

    /// Whether the value was set.
    pub fn is_set(&self) -> bool {
        !matches!(*lock(&self.slot), Slot::Empty)
    }

    /// Waits for the value and takes it out; for the one waiter a reply
    /// has. `None` if it was taken before.
    pub fn wait_take(&self) -> Option<T> {
        self.wait_until(None, |slot| take(slot)).flatten()
    }

    /// Awaits the value and takes it out; see [`Reply::wait_take`].
    pub async fn take(&self) -> Option<T> {
        self.until(|slot| take(slot)).await
    }

    /// Runs `check` on the slot until it yields, parking in between
    /// (step 2); `None` once `deadline` passes.
    fn wait_until<R>(&self, deadline: Option<Instant>, mut check: impl FnMut(&mut Slot<T>) -> Option<R>) -> Option<R> {
        loop {
            if let Some(found) = check(&mut *lock(&self.slot)) {
                return Some(found);
            }
            let listener = self.set.listen();
            if let Some(found) = check(&mut *lock(&self.slot)) {
                return Some(found);
            }
            match deadline {
                None => listener.wait(),
                Some(deadline) => listener.wait_deadline(deadline)?,
            }
        }
    }

    async fn until<R>(&self, mut check: impl FnMut(&mut Slot<T>) -> Option<R>) -> R {
        loop {
            if let Some(found) = check(&mut *lock(&self.slot)) {
                return found;
            }
            let listener = self.set.listen();
            if let Some(found) = check(&mut *lock(&self.slot)) {
                return found;
            }
            listener.await;
        }
    }
}

impl<T: Clone> Reply<T> {
    /// Waits for the value and returns a copy; for replies many wait on.
    pub fn wait(&self) -> T {
        self.wait_until(None, |slot| cloned(slot)).expect("a wait without deadline ends only with the value")
    }

    /// Waits for the value until `deadline`; `None` if it was not set by then.
    pub fn wait_deadline(&self, deadline: Instant) -> Option<T> {
        self.wait_until(Some(deadline), |slot| cloned(slot))
    }

    /// Awaits the value and returns a copy.
    pub async fn get(&self) -> T {
        self.until(|slot| cloned(slot)).await
    }
}

fn take<T>(slot: &mut Slot<T>) -> Option<Option<T>> {
    match std::mem::replace(slot, Slot::Taken) {
        Slot::Empty => {
            *slot = Slot::Empty;
            None
        }
        Slot::Full(value) => Some(Some(value)),
        Slot::Taken => Some(None),
    }
}

fn cloned<T: Clone>(slot: &mut Slot<T>) -> Option<T> {
    match slot {
        Slot::Full(value) => Some(value.clone()),
        Slot::Empty | Slot::Taken => None,
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_first_set_wins_and_every_waiter_sees_it() {
        let reply = Arc::new(Reply::new());
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let reply = reply.clone();
                std::thread::spawn(move || reply.wait())
            })
            .collect();
        assert!(reply.set(7));
        assert!(!reply.set(8), "only the first set counts");
        for waiter in waiters {
            assert_eq!(waiter.join().expect("waiter"), 7);
        }
        assert_eq!(futures_lite::future::block_on(reply.get()), 7);
    }

    #[test]
    fn one_waiter_takes_the_value_and_a_deadline_ends_a_wait() {
        let reply: Reply<String> = Reply::new();
        assert_eq!(reply.wait_deadline(Instant::now() + Duration::from_millis(1)), None);
        reply.set("plan".to_string());
        assert_eq!(futures_lite::future::block_on(reply.take()), Some("plan".to_string()));
        assert_eq!(reply.wait_take(), None, "taken before");
        assert!(reply.is_set());
    }
}
