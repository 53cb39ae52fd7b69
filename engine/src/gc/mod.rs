//! Server-side garbage collection (Nomad's core scheduler): the leader
//! deletes old evaluations, finished allocations, dead jobs, down nodes
//! and finished deployments, through the log, so a long-running cluster's
//! state stays bounded.
//!
//! 1. [`select`] is pure: from a snapshot, the time and the thresholds it
//!    says what may go (`select.rs` has the rules).
//! 2. [`GarbageCollector`] writes the selection as
//!    [`Command::GarbageCollect`]s of at most `max_per_command` objects
//!    each (a job counts with its evals and allocations), so no command
//!    grows with the backlog. The writer checks every object again
//!    (`state/gc.rs`): one written since the selection is kept.
//! 3. It runs on the server's timer thread every `interval`
//!    ([`GarbageCollector::run`] returns its next deadline; nothing ticks),
//!    and on demand ([`GarbageCollector::force`], `PUT /v1/system/gc`)
//!    with thresholds of zero. It keeps nothing a new leader needs: ages
//!    are read from the objects' times.

#[cfg(test)]
pub(crate) mod fixture;
mod select;

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

pub use select::{select, GcThresholds};

use crate::clock::{SharedClock, Timestamp};
use crate::state::{Collected, Collection, Command, Snapshot, StateError, Writer};

/// Garbage collection settings (Nomad's names and defaults).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GcConfig {
    /// How often a collection runs (`job_gc_interval`, 5m).
    pub interval: Duration,
    /// How old each kind of object must be.
    pub thresholds: GcThresholds,
    /// The most objects one command deletes.
    pub max_per_command: usize,
}

impl Default for GcConfig {
    fn default() -> Self {
        GcConfig { interval: Duration::from_secs(5 * 60), thresholds: GcThresholds::default(), max_per_command: 10_000 }
    }
}

/// The leader's garbage collector (module docs, steps 2-3).
#[derive(Debug)]
pub struct GarbageCollector {
    config: GcConfig,
    writer: Writer,
    clock: SharedClock,
    /// When the next periodic collection is due; held while one runs, so
    /// a forced one and a periodic one never interleave.
    next_run: Mutex<Timestamp>,
}

impl GarbageCollector {
    /// A collector writing through `writer`; its first periodic run is one
    /// interval from now.
    pub fn new(config: GcConfig, writer: Writer, clock: SharedClock) -> Arc<Self> {
        let next_run = Mutex::new(clock.now().plus(config.interval));
        Arc::new(GarbageCollector { config, writer, clock, next_run })
    }

    /// Collects with the configured thresholds when due, and returns when
    /// it is next due.
    pub fn run(&self) -> Option<Timestamp> {
        let mut next_run = self.next_run.lock();
        let now = self.clock.now();
        if now < *next_run {
            return Some(*next_run);
        }
        if let Err(error) = self.collect(now, &self.config.thresholds) {
            tracing::warn!(%error, "garbage collection stopped");
        }
        *next_run = self.clock.now().plus(self.config.interval);
        Some(*next_run)
    }

    /// Collects everything eligible now (Nomad's force GC), and returns
    /// what was deleted.
    pub fn force(&self) -> Result<Collected, StateError> {
        let _running = self.next_run.lock();
        self.collect(self.clock.now(), &GcThresholds::force())
    }

    /// One collection at `now` (module docs, step 2).
    fn collect(&self, now: Timestamp, thresholds: &GcThresholds) -> Result<Collected, StateError> {
        let snapshot = self.writer.store().snapshot();
        let collection = select(&snapshot, now, thresholds);
        let mut collected = Collected::default();
        for batch in batches(collection, &snapshot, self.config.max_per_command) {
            let applied = self.writer.write(Command::GarbageCollect { collection: batch })?;
            collected.add(applied.collected);
        }
        if collected != Collected::default() {
            tracing::info!(?collected, "garbage collected");
        }
        Ok(collected)
    }
}

/// `collection` cut into collections of at most `max` objects each, a job
/// weighing one plus its evals and allocations.
pub fn batches(collection: Collection, snapshot: &Snapshot, max: usize) -> Vec<Collection> {
    let max = max.max(1);
    let as_of = collection.as_of;
    let mut batches = vec![];
    let mut current = Collection { as_of, ..Collection::default() };
    let mut weight = 0;
    let mut add = |cost: usize, put: &mut dyn FnMut(&mut Collection)| {
        if weight > 0 && weight + cost > max {
            batches.push(std::mem::replace(&mut current, Collection { as_of, ..Collection::default() }));
            weight = 0;
        }
        put(&mut current);
        weight += cost;
    };
    for key in collection.jobs {
        let cost = 1 + snapshot.evals_by_job(&key).count() + snapshot.allocs_by_job(&key).count();
        add(cost, &mut |batch| batch.jobs.push(key.clone()));
    }
    for id in collection.evals {
        add(1, &mut |batch| batch.evals.push(id));
    }
    for id in collection.allocs {
        add(1, &mut |batch| batch.allocs.push(id));
    }
    for id in collection.deployments {
        add(1, &mut |batch| batch.deployments.push(id));
    }
    for id in collection.nodes {
        add(1, &mut |batch| batch.nodes.push(id));
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use fixture::{hours, Fixture};

    #[test]
    fn the_collector_runs_every_interval_and_when_forced() {
        let fixture = Fixture::new();
        let clock = ManualClock::new(hours(0));
        let config = GcConfig { max_per_command: 1, ..GcConfig::default() };
        let collector = GarbageCollector::new(config, Writer::direct(fixture.store.clone()), clock.clone());
        let (old, _, _) = fixture.finished_batch("old", hours(0));
        let (young, _, _) = fixture.finished_batch("young", hours(5));
        let first = collector.run().expect("a deadline");
        assert_eq!(first, hours(0).plus(Duration::from_secs(300)), "the first run is one interval after the start");
        assert!(fixture.store.snapshot().job(&old.key()).is_some(), "not run yet");
        clock.set(hours(5));
        let index = fixture.store.latest_index();
        assert_eq!(collector.run(), Some(hours(5).plus(Duration::from_secs(300))), "the next one interval later");
        assert!(fixture.store.snapshot().job(&old.key()).is_none(), "4h old");
        assert!(fixture.store.snapshot().job(&young.key()).is_some(), "not 4h old");
        assert_eq!(fixture.store.latest_index(), index + 1, "one job per command: one command");
        let forced = collector.force().expect("forced");
        assert_eq!((forced.jobs, forced.evals, forced.allocs), (1, 1, 1));
        assert_eq!(fixture.store.snapshot().jobs().count(), 0);
    }
}
