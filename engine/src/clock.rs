//! Injected time.
//!
//! The broker, blocked evals, heartbeat timers and plan applier never read the
//! system clock themselves: they are handed a [`Clock`], so a test or a
//! simulation can drive them step by step with a [`ManualClock`], while a
//! server runs on the [`SystemClock`].
//!
//! A clock is also where a timer thread sleeps until its next deadline
//! ([`Clock::sleep_until`]): a component that sets an earlier deadline tells
//! the clock ([`Clock::deadline_set`]), which wakes the sleeper, and a
//! [`ManualClock`] wakes it whenever it is moved. Nothing polls.
//!
//! The sleeper's protocol (an eventcount): read [`Clock::sleep_epoch`], then
//! read the deadlines of its components, then sleep with that epoch. A
//! deadline set after the epoch was read ends the sleep at once (it bumps
//! the epoch unless the sleeper already sleeps until before it), so a
//! deadline set while the sleeper was computing its next one is never missed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};

/// A point in time: nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// The Unix epoch.
    pub const ZERO: Timestamp = Timestamp(0);

    /// This time plus `duration`, saturating at the far future.
    pub fn plus(self, duration: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(duration_nanos(duration)))
    }

    /// How long after `earlier` this time is; zero when it is not after it.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

fn duration_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// A source of the current time, and a place to sleep until a time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current time.
    fn now(&self) -> Timestamp;

    /// The epoch a sleeper reads before it reads its deadlines (module docs).
    fn sleep_epoch(&self) -> u64;

    /// Blocks until `deadline` on this clock, or until woken since `epoch`:
    /// a deadline before it was set, [`Clock::wake_sleepers`] was called,
    /// or (on a manual clock) time moved. The caller re-reads its deadlines
    /// either way.
    fn sleep_until(&self, deadline: Timestamp, epoch: u64);

    /// Tells sleepers that something is now due at `at`: one sleeping past
    /// it wakes. Cheap when nobody sleeps past it (one atomic load).
    fn deadline_set(&self, at: Timestamp);

    /// Wakes every sleeper now (shutdown).
    fn wake_sleepers(&self);
}

/// The sleepers of one clock: what a deadline set must beat to wake one
/// (`until`), and a generation bumped at every wake-up so a sleeper knows
/// it was woken. `until` is 0 while no sleeper exists (a deadline set wakes
/// nobody, at the cost of one atomic load), `u64::MAX` while a sleeper is
/// computing its next deadline (every deadline set bumps the epoch), and
/// that deadline while it sleeps.
#[derive(Debug)]
struct Sleepers {
    until: AtomicU64,
    generation: Mutex<u64>,
    woken: Condvar,
}

impl Default for Sleepers {
    fn default() -> Self {
        Sleepers { until: AtomicU64::new(0), generation: Mutex::new(0), woken: Condvar::new() }
    }
}

impl Sleepers {
    fn epoch(&self) -> u64 {
        self.until.store(u64::MAX, Ordering::SeqCst);
        *self.generation.lock()
    }

    /// Sleeps until `deadline` on `clock` or a wake-up after `epoch`;
    /// `real_timeout` says how long that is in real time (`None`: only a
    /// wake-up ends it). While it sleeps, `until` holds its deadline, so a
    /// deadline set before that wakes it; awake, `until` is `u64::MAX`, so
    /// every deadline set bumps the epoch.
    fn sleep(
        &self,
        clock: &dyn Clock,
        deadline: Timestamp,
        epoch: u64,
        real_timeout: impl Fn(Timestamp) -> Option<Duration>,
    ) {
        let mut generation = self.generation.lock();
        self.until.store(deadline.0, Ordering::SeqCst);
        while *generation == epoch && clock.now() < deadline {
            match real_timeout(clock.now()) {
                Some(timeout) => {
                    self.woken.wait_for(&mut generation, timeout);
                }
                None => self.woken.wait(&mut generation),
            }
        }
        self.until.store(u64::MAX, Ordering::SeqCst);
    }

    fn deadline_set(&self, at: Timestamp) {
        if at.0 < self.until.load(Ordering::SeqCst) {
            self.wake();
        }
    }

    fn wake(&self) {
        *self.generation.lock() += 1;
        self.woken.notify_all();
    }
}

/// Shared handle to a clock.
pub type SharedClock = Arc<dyn Clock>;

/// Wall-clock time that never goes backwards: the Unix time read once at
/// construction, advanced by a monotonic [`Instant`].
#[derive(Debug)]
pub struct SystemClock {
    unix_at_start: Timestamp,
    start: Instant,
    sleepers: Sleepers,
}

impl SystemClock {
    /// A clock anchored at the current wall-clock time.
    pub fn new() -> Self {
        let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        SystemClock {
            unix_at_start: Timestamp(duration_nanos(since_epoch)),
            start: Instant::now(),
            sleepers: Sleepers::default(),
        }
    }

    /// A shared system clock.
    pub fn shared() -> SharedClock {
        Arc::new(SystemClock::new())
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        self.unix_at_start.plus(self.start.elapsed())
    }

    fn sleep_epoch(&self) -> u64 {
        self.sleepers.epoch()
    }

    fn sleep_until(&self, deadline: Timestamp, epoch: u64) {
        self.sleepers.sleep(self, deadline, epoch, |now| Some(deadline.since(now)));
    }

    fn deadline_set(&self, at: Timestamp) {
        self.sleepers.deadline_set(at);
    }

    fn wake_sleepers(&self) {
        self.sleepers.wake();
    }
}

/// A clock that moves only when told to; for tests and simulations. A
/// sleeper on it wakes whenever it is moved.
#[derive(Debug, Default)]
pub struct ManualClock {
    nanos: AtomicU64,
    sleepers: Sleepers,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> Arc<Self> {
        Arc::new(ManualClock { nanos: AtomicU64::new(start.0), sleepers: Sleepers::default() })
    }

    /// Moves the clock forward by `duration`.
    pub fn advance(&self, duration: Duration) {
        self.nanos.fetch_add(duration_nanos(duration), Ordering::SeqCst);
        self.sleepers.wake();
    }

    /// Sets the clock to `at`.
    pub fn set(&self, at: Timestamp) {
        self.nanos.store(at.0, Ordering::SeqCst);
        self.sleepers.wake();
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.nanos.load(Ordering::SeqCst))
    }

    fn sleep_epoch(&self) -> u64 {
        self.sleepers.epoch()
    }

    fn sleep_until(&self, deadline: Timestamp, epoch: u64) {
        self.sleepers.sleep(self, deadline, epoch, |_| None);
    }

    fn deadline_set(&self, at: Timestamp) {
        self.sleepers.deadline_set(at);
    }

    fn wake_sleepers(&self) {
        self.sleepers.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(Timestamp(1_000));
        assert_eq!(clock.now(), Timestamp(1_000));
        clock.advance(Duration::from_nanos(500));
        assert_eq!(clock.now(), Timestamp(1_500));
        clock.set(Timestamp(7));
        assert_eq!(clock.now(), Timestamp(7));
    }

    #[test]
    fn system_clock_never_goes_backwards() {
        let clock = SystemClock::new();
        let first = clock.now();
        let second = clock.now();
        assert!(second >= first);
        assert!(first.0 > 1_600_000_000 * 1_000_000_000, "anchored at the Unix time, not at zero");
    }

    #[test]
    fn a_sleeper_wakes_once_its_clock_reaches_its_deadline() {
        let clock = ManualClock::new(Timestamp(0));
        let epoch = clock.sleep_epoch();
        let sleeper = {
            let clock = clock.clone();
            std::thread::spawn(move || clock.sleep_until(Timestamp(100), epoch))
        };
        clock.advance(Duration::from_nanos(100));
        sleeper.join().expect("woken by the clock moving to its deadline");

        // A deadline set after the epoch was read ends the sleep at once.
        let epoch = clock.sleep_epoch();
        clock.deadline_set(Timestamp(150));
        clock.sleep_until(Timestamp(1_000_000), epoch);

        let system = SystemClock::new();
        let at = system.now().plus(Duration::from_millis(5));
        system.sleep_until(at, system.sleep_epoch());
        assert!(system.now() >= at, "a system clock sleeper wakes at its deadline");
    }

    #[test]
    fn timestamp_arithmetic_saturates() {
        assert_eq!(Timestamp(u64::MAX - 1).plus(Duration::from_secs(1)), Timestamp(u64::MAX));
        assert_eq!(Timestamp(5).since(Timestamp(9)), Duration::ZERO);
        assert_eq!(Timestamp(9).since(Timestamp(5)), Duration::from_nanos(4));
    }
}
