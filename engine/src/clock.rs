//! Injected time.
//!
//! The broker, blocked evals, heartbeat timers and plan applier never read the
//! system clock themselves: they are handed a [`Clock`], so a test or a
//! simulation can drive them step by step with a [`ManualClock`], while a
//! server runs on the [`SystemClock`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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

/// A source of the current time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// Shared handle to a clock.
pub type SharedClock = Arc<dyn Clock>;

/// Wall-clock time that never goes backwards: the Unix time read once at
/// construction, advanced by a monotonic [`Instant`].
#[derive(Debug)]
pub struct SystemClock {
    unix_at_start: Timestamp,
    start: Instant,
}

impl SystemClock {
    /// A clock anchored at the current wall-clock time.
    pub fn new() -> Self {
        let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        SystemClock { unix_at_start: Timestamp(duration_nanos(since_epoch)), start: Instant::now() }
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
}

/// A clock that moves only when told to; for tests and simulations.
#[derive(Debug, Default)]
pub struct ManualClock {
    nanos: AtomicU64,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> Arc<Self> {
        Arc::new(ManualClock { nanos: AtomicU64::new(start.0) })
    }

    /// Moves the clock forward by `duration`.
    pub fn advance(&self, duration: Duration) {
        self.nanos.fetch_add(duration_nanos(duration), Ordering::SeqCst);
    }

    /// Sets the clock to `at`.
    pub fn set(&self, at: Timestamp) {
        self.nanos.store(at.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.nanos.load(Ordering::SeqCst))
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
    fn timestamp_arithmetic_saturates() {
        assert_eq!(Timestamp(u64::MAX - 1).plus(Duration::from_secs(1)), Timestamp(u64::MAX));
        assert_eq!(Timestamp(5).since(Timestamp(9)), Duration::ZERO);
        assert_eq!(Timestamp(9).since(Timestamp(5)), Duration::from_nanos(4));
    }
}
