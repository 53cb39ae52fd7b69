//! Timings the engine records through the `metrics` facade (a no-op until
//! a process installs a recorder; `drover`'s HTTP API installs one and
//! answers them on `/v1/metrics`). Names follow Nomad's timers, in
//! milliseconds as Nomad's are:
//!
//! | name | what |
//! |---|---|
//! | `drover.plan.evaluate` | the applier checking a plan against the state |
//! | `drover.plan.apply` | a plan's write, submitted to written (fsynced and applied with a data dir) |
//! | `drover.worker.dequeue_eval` | a worker blocked in the broker until it got an eval |
//! | `drover.worker.invoke_scheduler` | one eval's scheduling, labelled `type` |
//! | `drover.worker.submit_plan` | a worker's plan, submitted to answered |
//! | `drover.worker.wait_for_index` | a worker waiting for the state to reach an eval's index |
//! | `drover.state.write` | any write, submitted to applied (to written, with a data dir) |

use std::time::Instant;

/// Records the time since `started` under `name`, in milliseconds.
pub fn record_since(name: &'static str, started: Instant) {
    metrics::histogram!(name).record(started.elapsed().as_secs_f64() * 1_000.0);
}

/// [`record_since`] with one label.
pub fn record_since_labelled(name: &'static str, label: &'static str, value: &'static str, started: Instant) {
    metrics::histogram!(name, label => value).record(started.elapsed().as_secs_f64() * 1_000.0);
}
