//! A task group's `restart` policy, applied by the client to each of its
//! tasks, as Nomad's restart tracker (`client/allocrunner/taskrunner/restarts`):
//!
//! 1. Restarts are counted in windows of `interval`, the first opening at
//!    the first restart; a decision after a window ended opens a new one
//!    with the count at zero.
//! 2. A batch task that exits 0 is done; a service or system task is
//!    restarted whatever its exit code (it is meant to run for ever).
//! 3. Within `attempts`, the task restarts after `delay` plus up to 25%
//!    jitter. Past them: mode `fail` gives up, and the task (so its
//!    allocation) fails, for the servers' reschedule policy to take over;
//!    mode `delay` waits until the window ends and starts again.
//! 4. A task that could not be started (the driver refused it) is not
//!    restarted: starting it again would fail the same way.
//!
//! The tracker reads no clock: each decision takes `now`.

use std::time::{Duration, Instant};

use engine::structs::{RestartMode, RestartPolicy};
use rand::Rng;

/// What to do after a task ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Start it again after the delay.
    Restart {
        /// How long to wait first.
        delay: Duration,
        /// Why, for the event.
        reason: String,
    },
    /// It finished successfully and is not restarted.
    Done,
    /// It is not restarted and counts as failed.
    Fail {
        /// Why, for the event.
        reason: String,
    },
}

/// One task's restart count under its group's policy.
#[derive(Debug)]
pub struct RestartTracker {
    policy: RestartPolicy,
    restart_on_success: bool,
    count: u32,
    window_start: Option<Instant>,
}

impl RestartTracker {
    /// A tracker for a task of a batch-like job (`batch` true: exit 0 ends
    /// it) or of a service or system job.
    pub fn new(policy: RestartPolicy, batch: bool) -> RestartTracker {
        RestartTracker { policy, restart_on_success: !batch, count: 0, window_start: None }
    }

    /// The decision after the task exited (`success`: code 0) at `now`.
    pub fn exited(&mut self, success: bool, now: Instant, rng: &mut impl Rng) -> Decision {
        if success && !self.restart_on_success {
            return Decision::Done;
        }
        if self.policy.attempts == 0 {
            return if success {
                Decision::Done
            } else {
                Decision::Fail { reason: "Policy allows no restarts".to_string() }
            };
        }
        let window_start = *self.window_start.get_or_insert(now);
        let window_end = window_start + self.policy.interval;
        if now >= window_end {
            self.count = 0;
            self.window_start = Some(now);
        }
        self.count += 1;
        if self.count <= self.policy.attempts {
            return Decision::Restart {
                delay: jittered(self.policy.delay, rng),
                reason: "Restart within policy".to_string(),
            };
        }
        match self.policy.mode {
            RestartMode::Fail => Decision::Fail {
                reason: format!(
                    "Exceeded allowed attempts {} in interval {:?} and mode is \"fail\"",
                    self.policy.attempts, self.policy.interval
                ),
            },
            RestartMode::Delay => {
                let window_end = self.window_start.unwrap_or(now) + self.policy.interval;
                Decision::Restart {
                    delay: window_end.saturating_duration_since(now),
                    reason: format!(
                        "Exceeded allowed attempts {} in interval {:?}; waiting for the interval to end (mode \"delay\")",
                        self.policy.attempts, self.policy.interval
                    ),
                }
            }
        }
    }
}

/// `delay` plus up to a quarter of it, as Nomad's jitter.
fn jittered(delay: Duration, rng: &mut impl Rng) -> Duration {
    delay + delay.mul_f64(0.25 * rng.random::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    fn policy(attempts: u32, mode: RestartMode) -> RestartPolicy {
        RestartPolicy { attempts, interval: Duration::from_secs(60), delay: Duration::from_secs(2), mode }
    }

    #[test]
    fn attempts_within_the_interval_then_fail() {
        let mut rng = SmallRng::seed_from_u64(1);
        let mut tracker = RestartTracker::new(policy(2, RestartMode::Fail), false);
        let start = Instant::now();
        for n in 0..2 {
            let Decision::Restart { delay, .. } = tracker.exited(false, start + Duration::from_secs(n), &mut rng)
            else {
                panic!("restart {n} is within policy");
            };
            assert!(delay >= Duration::from_secs(2) && delay <= Duration::from_millis(2_500), "{delay:?}");
        }
        let Decision::Fail { reason } = tracker.exited(false, start + Duration::from_secs(3), &mut rng) else {
            panic!("the third exit in the window fails");
        };
        assert!(reason.contains("Exceeded allowed attempts 2"), "{reason}");
    }

    #[test]
    fn a_new_window_resets_the_count() {
        let mut rng = SmallRng::seed_from_u64(2);
        let mut tracker = RestartTracker::new(policy(1, RestartMode::Fail), false);
        let start = Instant::now();
        assert!(matches!(tracker.exited(false, start, &mut rng), Decision::Restart { .. }));
        let later = start + Duration::from_secs(61);
        assert!(matches!(tracker.exited(false, later, &mut rng), Decision::Restart { .. }), "a new window");
        assert!(matches!(tracker.exited(false, later, &mut rng), Decision::Fail { .. }));
    }

    #[test]
    fn delay_mode_waits_out_the_window() {
        let mut rng = SmallRng::seed_from_u64(3);
        let mut tracker = RestartTracker::new(policy(1, RestartMode::Delay), false);
        let start = Instant::now();
        assert!(matches!(tracker.exited(false, start, &mut rng), Decision::Restart { .. }));
        let Decision::Restart { delay, reason } = tracker.exited(false, start + Duration::from_secs(10), &mut rng)
        else {
            panic!("delay mode restarts");
        };
        assert_eq!(delay, Duration::from_secs(50), "the rest of the window");
        assert!(reason.contains("mode \"delay\""), "{reason}");
    }

    #[test]
    fn batch_success_is_done_and_service_success_restarts() {
        let mut rng = SmallRng::seed_from_u64(4);
        let now = Instant::now();
        assert_eq!(RestartTracker::new(policy(2, RestartMode::Fail), true).exited(true, now, &mut rng), Decision::Done);
        let service = RestartTracker::new(policy(2, RestartMode::Fail), false).exited(true, now, &mut rng);
        assert!(matches!(service, Decision::Restart { .. }), "{service:?}");
        let none = RestartTracker::new(policy(0, RestartMode::Fail), false).exited(false, now, &mut rng);
        assert!(matches!(none, Decision::Fail { .. }), "{none:?}");
    }
}
