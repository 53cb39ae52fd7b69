//! Periodic jobs: the leader's dispatcher (Nomad's `nomad/periodic.go`)
//! and the pure rule it follows.
//!
//! A periodic job runs nothing itself; at each launch time the leader
//! registers a child, `<parent>/periodic-<unix seconds>`, a copy of the
//! parent without its `periodic` block, with its eval
//! ([`launch_command`]).
//!
//! The dispatcher keeps nothing a new leader needs: the last launch of
//! each job is in the replicated state (`state/periodic.rs`), written by
//! the same command as the child. Each run:
//! 1. reads the snapshot's launch records and, for each job whose schedule
//!    is active, the base time its next launch follows: the recorded
//!    launch; or, for a job updated while this server leads, no earlier
//!    than the update was seen (Nomad computes a changed job's next launch
//!    from now); or the last launch it skipped;
//! 2. asks [`due_launch`] whether a launch is due at the clock's now. At
//!    most one launch per job per run: after a failover that missed
//!    several, the new leader launches once, at now (Nomad's force-run on
//!    leadership), never a catch-up of each;
//! 3. skips a due launch of a `prohibit_overlap` job while a child still
//!    runs (remembered in memory: a new leader may launch it once);
//! 4. writes [`Command::LaunchPeriodicJob`]; a launch the state says
//!    happened already (another leader's) is passed over;
//! 5. returns the earliest next launch, the timer thread's deadline. The
//!    router wakes the timer thread when a periodic job is registered.
//!
//! A run looks only when the jobs table moved (a launch, a new or changed
//! job) or a launch is due; otherwise it answers the deadline it knows,
//! so the timer thread's other timers do not recompute every schedule.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::clock::{SharedClock, Timestamp};
use crate::state::{Command, Snapshot, StateError, Writer};
use crate::structs::{EvalId, Evaluation, Job, JobKey, PeriodicConfig, TriggerReason};

/// The prefix of a launched child's id after its parent's.
pub const PERIODIC_LAUNCH_SUFFIX: &str = "/periodic-";

/// What [`due_launch`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// Nothing is due; the next launch, if the schedule has one.
    Wait(Option<Timestamp>),
    /// Launch now, recorded as `at`; then wait for `next`.
    Launch {
        /// The launch time (the child's id and the record).
        at: Timestamp,
        /// The launch after it.
        next: Option<Timestamp>,
    },
}

/// The scheduling rule: with launches computed after `base` (the last
/// launch), what is due at `now`. The launch after `base` when it has
/// come; but when the one after that has come too (several missed), one
/// launch at `now` (module docs, step 2). A schedule that does not parse
/// launches nothing (validation refuses one at submission).
pub fn due_launch(config: &PeriodicConfig, base: Timestamp, now: Timestamp) -> Due {
    let next_after = |time: Timestamp| config.next_launch(time).ok().flatten();
    let Some(next) = next_after(base) else { return Due::Wait(None) };
    if next > now {
        return Due::Wait(Some(next));
    }
    match next_after(next) {
        Some(following) if following <= now => Due::Launch { at: now, next: next_after(now) },
        following => Due::Launch { at: next, next: following },
    }
}

/// The id of the child launched at `launch` (Nomad's
/// `<parent>/periodic-<unix seconds>`).
pub fn child_id(parent: &str, launch: Timestamp) -> String {
    format!("{parent}{PERIODIC_LAUNCH_SUFFIX}{}", launch.0 / 1_000_000_000)
}

/// The child of `parent` launched at `launch` (Nomad's `deriveJob`): a
/// copy without the `periodic` block, named for its launch, submitted at `now`.
pub fn derive_child(parent: &Job, launch: Timestamp, now: Timestamp) -> Job {
    let mut child = parent.child(&child_id(&parent.id, launch), now);
    child.periodic = None;
    child
}

/// The command that launches `parent` at `launch`, and its eval's id
/// (none when the child is itself a parameterized template).
pub fn launch_command(parent: &Job, launch: Timestamp, now: Timestamp, force: bool) -> (Command, Option<EvalId>) {
    let child = derive_child(parent, launch, now);
    let eval = child.is_scheduled_directly().then(|| Evaluation::for_job(&child, TriggerReason::PeriodicJob, now));
    let eval_id = eval.as_ref().map(|eval| eval.id);
    (Command::LaunchPeriodicJob { parent: parent.key(), child, eval, launch, force }, eval_id)
}

/// Whether a child of `parent` still runs: an eval or an allocation of it
/// is not terminal (what `prohibit_overlap` waits for).
pub fn child_running(snapshot: &Snapshot, parent: &JobKey) -> bool {
    snapshot.job_children(parent).any(|child| {
        let key = child.key();
        snapshot.evals_by_job(&key).any(|eval| !eval.status.is_terminal())
            || snapshot.allocs_by_job(&key).any(|alloc| !alloc.terminal())
    })
}

/// What the dispatcher remembers of one job while this server leads.
#[derive(Clone, Copy, Debug)]
struct Tracked {
    /// The job's spec index when last seen.
    job_modify_index: u64,
    /// No launch is computed from before this (module docs, step 1).
    floor: Timestamp,
}

/// What the dispatcher knows as of its last look.
#[derive(Debug, Default)]
struct Looked {
    tracked: HashMap<JobKey, Tracked>,
    /// The jobs table's index at the last look: launches, new and changed
    /// periodic jobs all write it, so while it stands only a due launch
    /// needs a look.
    jobs_index: u64,
    /// The earliest next launch, as of that look.
    next_deadline: Option<Timestamp>,
}

/// The leader's periodic dispatcher; see the module docs.
#[derive(Debug)]
pub struct PeriodicDispatcher {
    writer: Writer,
    clock: SharedClock,
    looked: Mutex<Looked>,
}

impl PeriodicDispatcher {
    /// A dispatcher launching through `writer`, for a server that starts leading.
    pub fn new(writer: Writer, clock: SharedClock) -> Arc<Self> {
        Arc::new(PeriodicDispatcher { writer, clock, looked: Mutex::new(Looked::default()) })
    }

    /// Launches what is due (module docs) and returns the next launch time.
    pub fn run(&self) -> Option<Timestamp> {
        let mut looked = self.looked.lock();
        let snapshot = self.writer.store().snapshot();
        let now = self.clock.now();
        let jobs_index = snapshot.table_indexes().jobs;
        let due = looked.next_deadline.is_some_and(|at| at <= now);
        if jobs_index == looked.jobs_index && !due {
            return looked.next_deadline;
        }
        let Looked { tracked, .. } = &mut *looked;
        let mut deadline: Option<Timestamp> = None;
        let mut seen = std::collections::HashSet::new();
        for record in snapshot.periodic_launches() {
            let Some(job) = snapshot.job(&record.job).filter(|job| job.is_periodic_active()) else { continue };
            let Some(config) = &job.periodic else { continue };
            seen.insert(record.job.clone());
            let entry = tracked
                .entry(record.job.clone())
                .or_insert(Tracked { job_modify_index: job.job_modify_index, floor: Timestamp::ZERO });
            if entry.job_modify_index != job.job_modify_index {
                *entry = Tracked { job_modify_index: job.job_modify_index, floor: now };
            }
            let next = match due_launch(config, record.launch.max(entry.floor), now) {
                Due::Wait(next) => next,
                Due::Launch { at, next } => {
                    if !(config.prohibit_overlap && child_running(&snapshot, &record.job)) {
                        self.launch(job, at, now);
                    }
                    // Launched, skipped or refused, this time is done here.
                    entry.floor = at;
                    next
                }
            };
            deadline = match (deadline, next) {
                (Some(known), Some(found)) => Some(known.min(found)),
                (known, found) => known.or(found),
            };
        }
        tracked.retain(|key, _| seen.contains(key));
        // The launches just written moved the jobs index: the next run
        // looks once more, finds nothing due, and settles.
        looked.jobs_index = jobs_index;
        looked.next_deadline = deadline;
        deadline
    }

    fn launch(&self, parent: &Job, at: Timestamp, now: Timestamp) {
        let (command, _) = launch_command(parent, at, now, false);
        match self.writer.write(command) {
            Ok(_) => tracing::info!(job = %parent.key(), launch = at.0, "periodic job launched"),
            Err(StateError::LaunchedAlready { .. }) => {}
            Err(error) => tracing::warn!(job = %parent.key(), %error, "periodic launch not written"),
        }
    }
}

#[cfg(test)]
#[path = "periodic_test.rs"]
mod periodic_test;
