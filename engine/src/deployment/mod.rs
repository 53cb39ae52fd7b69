//! Deployments beyond the scheduler: the operator's endpoint (fail, pause,
//! resume, promote, allocation health) and the leader's watcher (progress
//! deadlines, failing on unhealthy allocations, auto-promote, auto-revert).
//!
//! Both fail deployments the same way ([`failure`]): the status change, the
//! eval of the job, and, when the deployment's groups ask for it, the
//! latest stable version registered again as a new version (Nomad's
//! auto-revert), all in one command.

pub mod endpoint;
pub mod watcher;

use crate::clock::Timestamp;
use crate::state::{same_spec, Snapshot};
use crate::structs::{
    deployment_description, Deployment, DeploymentStatus, DeploymentStatusUpdate, Evaluation, Job, TriggerReason,
};

/// A deployment's failure as written: its status change, the eval of its
/// job, and the job version registered again when it reverts.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    /// The status change.
    pub update: DeploymentStatusUpdate,
    /// The job to register (a revert).
    pub job: Option<Job>,
    /// The eval of the job.
    pub eval: Option<Evaluation>,
    /// The version reverted to.
    pub reverted_version: Option<u64>,
}

/// Fails `deployment` with `description`; with `revert`, registers the
/// job's latest stable version again unless it is the current spec (the
/// description says which, in Nomad's words).
pub fn failure(
    snapshot: &Snapshot,
    deployment: &Deployment,
    description: &str,
    revert: bool,
    now: Timestamp,
) -> Failure {
    let key = deployment.job_key();
    let current = snapshot.job(&key);
    let mut failure = Failure {
        update: DeploymentStatusUpdate {
            deployment_id: deployment.id,
            status: DeploymentStatus::Failed,
            status_description: description.to_string(),
        },
        job: None,
        eval: current.map(|job| Evaluation::for_job(job, TriggerReason::DeploymentWatcher, now)),
        reverted_version: None,
    };
    let Some(current) = current.filter(|_| revert) else { return failure };
    let stable = snapshot.job_versions(&key).find(|kept| kept.stable && kept.version != current.version);
    failure.update.status_description = match stable {
        None => deployment_description::no_stable_version(description),
        Some(stable) if same_spec(current, stable) => {
            deployment_description::not_rolling_back(description, stable.version)
        }
        Some(stable) => {
            let mut job = Job::clone(stable);
            job.stable = false;
            failure.eval = Some(Evaluation::for_job(&job, TriggerReason::DeploymentWatcher, now));
            failure.job = Some(job);
            failure.reverted_version = Some(stable.version);
            deployment_description::rolling_back(description, stable.version)
        }
    };
    failure
}
