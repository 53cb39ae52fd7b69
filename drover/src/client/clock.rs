//! The wall clock, for the times people read: task events, stats.

use std::time::SystemTime;

use engine::clock::Timestamp;

/// The wall clock as a timestamp (nanoseconds since the Unix epoch).
pub fn now() -> Timestamp {
    let since_epoch = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    Timestamp(u64::try_from(since_epoch.as_nanos()).unwrap_or(u64::MAX))
}
