//! Job versions: the last versions of every job, as Nomad's `job_version`
//! table keeps them, for `job history`, `job revert` and marking a version
//! stable.
//!
//! Contract:
//! 1. Every write that stores a job ([`Command::RegisterJob`], a stop by
//!    [`Command::DeregisterJob`], [`Command::SetJobStability`]) stores the
//!    same `Arc<Job>` in the job's version list, replacing the entry of
//!    the same version: the newest entry is always the job as stored.
//! 2. A list holds at most [`JOB_TRACKED_VERSIONS`] versions, newest first.
//!    When a new version makes it longer, the oldest is dropped, unless it
//!    is the newest stable version: then the one before it goes instead
//!    (Nomad's `JobTrackedVersions`, which keeps the latest stable one).
//! 3. Purging a job removes its versions with it.
//! 4. The version lists move the jobs table index, as the jobs do.
//!
//! [`Command::RegisterJob`]: super::Command::RegisterJob
//! [`Command::DeregisterJob`]: super::Command::DeregisterJob
//! [`Command::SetJobStability`]: super::Command::SetJobStability

use std::sync::Arc;

use imbl::Vector;

use super::snapshot::Snapshot;
use super::StateError;
use crate::structs::{Job, JobKey};

/// How many versions of a job are kept (Nomad's `JobTrackedVersions`).
pub const JOB_TRACKED_VERSIONS: usize = 6;

impl Snapshot {
    /// The kept versions of a job, newest first (empty for an unknown job).
    pub fn job_versions(&self, key: &JobKey) -> impl Iterator<Item = &Arc<Job>> + '_ {
        self.job_versions.get(key).into_iter().flat_map(|versions| versions.iter())
    }

    /// One kept version of a job.
    pub fn job_version(&self, key: &JobKey, version: u64) -> Option<&Arc<Job>> {
        self.job_versions(key).find(|job| job.version == version)
    }

    /// Records `job`, as just stored, in its version list (contract, 1-2).
    pub(super) fn record_job_version(&mut self, job: &Arc<Job>) {
        let key = job.key();
        let mut versions = self.job_versions.get(&key).cloned().unwrap_or_default();
        match versions.iter().position(|kept| kept.version == job.version) {
            Some(position) => {
                versions.set(position, job.clone());
            }
            None => {
                let position = versions.iter().position(|kept| kept.version < job.version).unwrap_or(versions.len());
                versions.insert(position, job.clone());
                trim(&mut versions);
            }
        }
        self.job_versions.insert(key, versions);
    }

    /// Removes every version of a purged job (contract, 3).
    pub(super) fn forget_job_versions(&mut self, key: &JobKey) {
        self.job_versions.remove(key);
    }

    /// Marks one version of a job stable or not ([`super::Command::SetJobStability`]);
    /// the job itself too when it is that version.
    pub(super) fn set_job_stability(
        &mut self,
        index: u64,
        key: &JobKey,
        version: u64,
        stable: bool,
    ) -> Result<(), StateError> {
        let kept = self
            .job_version(key, version)
            .ok_or_else(|| StateError::UnknownJobVersion { job: key.clone(), version })?
            .clone();
        let mut changed = Job::clone(&kept);
        changed.stable = stable;
        changed.modify_index = index;
        let changed = Arc::new(changed);
        if self.jobs.get(key).is_some_and(|current| current.version == version) {
            self.jobs.insert(key.clone(), changed.clone());
        }
        self.record_job_version(&changed);
        self.table_indexes.jobs = index;
        Ok(())
    }
}

/// Drops the oldest versions beyond [`JOB_TRACKED_VERSIONS`], keeping the
/// newest stable one (contract, 2).
fn trim(versions: &mut Vector<Arc<Job>>) {
    while versions.len() > JOB_TRACKED_VERSIONS {
        let newest_stable = versions.iter().position(|job| job.stable);
        let oldest = versions.len() - 1;
        let dropped = if newest_stable == Some(oldest) { oldest - 1 } else { oldest };
        versions.remove(dropped);
    }
}

#[cfg(test)]
#[path = "job_versions_test.rs"]
mod job_versions_test;
