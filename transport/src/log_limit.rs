//! Log lines that traffic from outside can cause as often as it likes (a
//! failed handshake, a refused request, a failed accept) are rate-limited,
//! so a flood of bad traffic cannot fill a disk with logs.

/// A log line that traffic from outside can cause as often as it likes (a
/// failed handshake, a refused request, a failed accept): logged at most
/// once per period, with how many were left out since the last.
#[derive(Debug)]
pub struct RateLimited {
    every: std::time::Duration,
    /// When a line was last let through, and how many were held back since.
    last: std::sync::Mutex<(Option<std::time::Instant>, u64)>,
}

impl RateLimited {
    /// At most one line per `every`.
    pub const fn new(every: std::time::Duration) -> RateLimited {
        RateLimited { every, last: std::sync::Mutex::new((None, 0)) }
    }

    /// `Some(held back since the last line)` when a line may be logged now.
    pub fn admit(&self) -> Option<u64> {
        let now = std::time::Instant::now();
        let mut last = self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match last.0 {
            Some(at) if now.duration_since(at) < self.every => {
                last.1 += 1;
                None
            }
            _ => {
                let held_back = last.1;
                *last = (Some(now), 0);
                Some(held_back)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_period_with_the_count_held_back() {
        let limited = RateLimited::new(std::time::Duration::from_secs(3600));
        assert_eq!(limited.admit(), Some(0));
        assert_eq!((limited.admit(), limited.admit()), (None, None));
        let every_time = RateLimited::new(std::time::Duration::ZERO);
        assert_eq!((every_time.admit(), every_time.admit()), (Some(0), Some(0)));
    }
}
