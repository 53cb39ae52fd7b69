//! The periodic launch table (Nomad's `periodic_launch`): the last launch
//! of each periodic job, replicated with the launches themselves.
//!
//! 1. Registering a periodic job whose schedule is active records its
//!    first "launch" at its submit time, when it has no record yet (Nomad
//!    records the registration time); an update keeps the record.
//! 2. [`Command::LaunchPeriodicJob`](super::Command::LaunchPeriodicJob)
//!    registers the child, its eval and the new record in one command. A
//!    scheduled launch at or before the record is refused
//!    ([`StateError::LaunchedAlready`]): two leaders (the old one's last
//!    write committed after the new one read the state) cannot launch the
//!    same time twice. A forced launch is always taken; the record only
//!    moves forward.
//! 3. Purging or collecting the job drops its record.

use serde::{Deserialize, Serialize};

use super::snapshot::Snapshot;
use super::StateError;
use crate::clock::Timestamp;
use crate::structs::{Job, JobKey};

/// The last launch of one periodic job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeriodicLaunch {
    /// The periodic job.
    pub job: JobKey,
    /// When it last launched (first: when it was registered).
    pub launch: Timestamp,
    /// The index the record was created at.
    pub create_index: u64,
    /// The index of its last change.
    pub modify_index: u64,
}

impl Snapshot {
    /// The last launch of a periodic job, if recorded.
    pub fn periodic_launch(&self, job: &JobKey) -> Option<&PeriodicLaunch> {
        self.periodic_launches.get(job)
    }

    /// Every launch record.
    pub fn periodic_launches(&self) -> impl Iterator<Item = &PeriodicLaunch> + '_ {
        self.periodic_launches.values()
    }

    /// The children launched or dispatched from `parent` (a scan of the jobs).
    pub fn job_children<'a>(&'a self, parent: &'a JobKey) -> impl Iterator<Item = &'a std::sync::Arc<Job>> + 'a {
        self.jobs().filter(move |job| job.namespace == parent.namespace && *job.parent_id == *parent.id)
    }

    /// Records a registered job's first launch (module docs, step 1).
    pub(super) fn track_periodic(&mut self, index: u64, job: &Job) {
        let key = job.key();
        if !job.is_periodic_active() || self.periodic_launches.get(&key).is_some() {
            return;
        }
        let record =
            PeriodicLaunch { job: key.clone(), launch: job.submit_time, create_index: index, modify_index: index };
        self.periodic_launches.insert(key, record);
    }

    /// Checks and moves a job's launch record (module docs, step 2).
    pub(super) fn record_launch(
        &mut self,
        index: u64,
        parent: &JobKey,
        launch: Timestamp,
        force: bool,
    ) -> Result<(), StateError> {
        if !self.job(parent).is_some_and(|job| job.is_periodic()) {
            return Err(StateError::NotPeriodic(parent.clone()));
        }
        let record = self.periodic_launches.get(parent).cloned();
        if let Some(recorded) = record.as_ref().map(|record| record.launch).filter(|recorded| launch <= *recorded) {
            if !force {
                return Err(StateError::LaunchedAlready { job: parent.clone(), launch, recorded });
            }
        }
        let record = match record {
            Some(mut record) => {
                record.launch = record.launch.max(launch);
                record.modify_index = index;
                record
            }
            None => PeriodicLaunch { job: parent.clone(), launch, create_index: index, modify_index: index },
        };
        self.periodic_launches.insert(parent.clone(), record);
        Ok(())
    }

    /// Drops a removed job's record (module docs, step 3).
    pub(super) fn forget_periodic(&mut self, key: &JobKey) {
        self.periodic_launches.remove(key);
    }
}
