//! Deployments: the rollout of one job version, group by group, gated on
//! the health of the allocations it places (Nomad's `Deployment` and
//! `DeploymentState`).
//!
//! The scheduler creates a deployment when a job's version needs placing
//! or updating under an `update` block, and records its progress in the
//! plans it submits; the state store counts placed, healthy and unhealthy
//! allocations as they are written; the leader's deployment watcher fails,
//! promotes and reverts. Statuses and descriptions are Nomad's words.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration::serde_duration;
use super::{AllocId, DeploymentId, Job, JobKey};
use crate::clock::Timestamp;

/// Where a deployment stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeploymentStatus {
    /// Placing and waiting for health.
    Running,
    /// An operator paused it: nothing more is placed until resumed.
    Paused,
    /// Every group has its allocations healthy (and canaries promoted).
    Successful,
    /// An allocation turned unhealthy, the progress deadline passed, or an
    /// operator failed it.
    Failed,
    /// The job was stopped or a newer version registered.
    Cancelled,
}

impl DeploymentStatus {
    /// Nomad's name.
    pub fn as_str(self) -> &'static str {
        match self {
            DeploymentStatus::Running => "running",
            DeploymentStatus::Paused => "paused",
            DeploymentStatus::Successful => "successful",
            DeploymentStatus::Failed => "failed",
            DeploymentStatus::Cancelled => "cancelled",
        }
    }

    /// Whether the deployment may still progress (running or paused).
    pub fn is_active(self) -> bool {
        matches!(self, DeploymentStatus::Running | DeploymentStatus::Paused)
    }
}

impl std::fmt::Display for DeploymentStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The status descriptions, as Nomad words them.
pub mod deployment_description {
    /// Running.
    pub const RUNNING: &str = "Deployment is running";
    /// Running, canaries placed, waiting for an operator.
    pub const RUNNING_NEEDS_PROMOTION: &str = "Deployment is running but requires manual promotion";
    /// Running, canaries placed, promoted once they are healthy.
    pub const RUNNING_AUTO_PROMOTION: &str = "Deployment is running pending automatic promotion";
    /// Paused by an operator.
    pub const PAUSED: &str = "Deployment is paused";
    /// Done.
    pub const SUCCESSFUL: &str = "Deployment completed successfully";
    /// An allocation turned unhealthy (the group has no progress deadline,
    /// or an operator marked it).
    pub const FAILED_ALLOCATIONS: &str = "Failed due to unhealthy allocations";
    /// A group was short of healthy allocations at its progress deadline.
    pub const FAILED_PROGRESS_DEADLINE: &str = "Failed due to progress deadline";
    /// An operator failed it.
    pub const FAILED_BY_USER: &str = "Deployment marked as failed";
    /// The job was stopped.
    pub const STOPPED_JOB: &str = "Cancelled because job is stopped";
    /// A newer version of the job was registered.
    pub const NEWER_JOB: &str = "Cancelled due to newer version of job";

    /// A failure's description when auto-revert registers `version` again.
    pub fn rolling_back(description: &str, version: u64) -> String {
        format!("{description} - rolling back to job version {version}")
    }

    /// A failure's description when the stable version is the current spec.
    pub fn not_rolling_back(description: &str, version: u64) -> String {
        format!(
            "{description} - not rolling back to stable job version {version} as current job has same specification"
        )
    }

    /// A failure's description when no version is stable.
    pub fn no_stable_version(description: &str) -> String {
        format!("{description} - no stable job version to auto revert to")
    }
}

/// One group's part in a deployment (Nomad's `DeploymentState`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentGroup {
    /// Revert to the latest stable version when the deployment fails.
    pub auto_revert: bool,
    /// Promote the canaries once all are healthy.
    pub auto_promote: bool,
    /// How long the group may go without a newly healthy allocation; zero:
    /// the first unhealthy allocation fails the deployment.
    #[serde(with = "serde_duration")]
    pub progress_deadline: Duration,
    /// When the group must next make progress; `None` until its first placement.
    pub require_progress_by: Option<Timestamp>,
    /// Whether its canaries were promoted.
    pub promoted: bool,
    /// The canaries placed in this deployment.
    pub placed_canaries: Vec<AllocId>,
    /// How many canaries the group asks for.
    pub desired_canaries: u32,
    /// How many allocations the deployment must make healthy.
    pub desired_total: u32,
    /// Allocations placed in this deployment (counted by the state store).
    pub placed_allocs: u32,
    /// Of those, how many turned healthy.
    pub healthy_allocs: u32,
    /// Of those, how many turned unhealthy.
    pub unhealthy_allocs: u32,
}

impl DeploymentGroup {
    /// Whether the group waits for its canaries to be promoted.
    pub fn awaits_promotion(&self) -> bool {
        self.desired_canaries > 0 && !self.promoted
    }

    /// Whether the group reached its goal: canaries promoted (if any) and
    /// as many healthy allocations as it wants.
    pub fn is_complete(&self) -> bool {
        !self.awaits_promotion() && self.healthy_allocs >= self.desired_total.max(self.desired_canaries)
    }

    /// Whether the group is short of what its progress deadline asks for:
    /// unpromoted canaries not all healthy, or fewer healthy allocations
    /// than it wants.
    pub fn is_short(&self) -> bool {
        if self.awaits_promotion() {
            self.healthy_allocs < self.desired_canaries
        } else {
            self.healthy_allocs < self.desired_total
        }
    }
}

/// The rollout of one job version (Nomad's `Deployment`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deployment {
    /// Its id.
    pub id: DeploymentId,
    /// The job's namespace.
    pub namespace: Arc<str>,
    /// The job's id.
    pub job_id: Arc<str>,
    /// The version it rolls out.
    pub job_version: u64,
    /// The job's modify index when it was created.
    pub job_modify_index: u64,
    /// The job's spec modify index when it was created: the version's identity.
    pub job_spec_modify_index: u64,
    /// The job's create index: tells a purged and re-registered job apart.
    pub job_create_index: u64,
    /// The groups that take part, by name.
    pub task_groups: BTreeMap<String, DeploymentGroup>,
    /// Its status.
    pub status: DeploymentStatus,
    /// Why, in Nomad's words ([`deployment_description`]).
    pub status_description: String,
    /// The priority of the eval that created it (evals it makes take it).
    pub eval_priority: u8,
    /// Set by the store.
    pub create_index: u64,
    /// Set by the store.
    pub modify_index: u64,
    /// When it was created, by the servers' clock.
    pub create_time: Timestamp,
    /// When it last changed.
    pub modify_time: Timestamp,
}

impl Deployment {
    /// A running deployment of `job`'s current version, without groups yet.
    pub fn new(job: &Job, eval_priority: u8, now: Timestamp) -> Deployment {
        Deployment {
            id: DeploymentId::new_random(),
            namespace: job.namespace.clone(),
            job_id: job.id.clone(),
            job_version: job.version,
            job_modify_index: job.modify_index,
            job_spec_modify_index: job.job_modify_index,
            job_create_index: job.create_index,
            task_groups: BTreeMap::new(),
            status: DeploymentStatus::Running,
            status_description: deployment_description::RUNNING.to_string(),
            eval_priority,
            create_index: 0,
            modify_index: 0,
            create_time: now,
            modify_time: now,
        }
    }

    /// Its job's key.
    pub fn job_key(&self) -> JobKey {
        JobKey { namespace: self.namespace.clone(), id: self.job_id.clone() }
    }

    /// Whether it may still progress.
    pub fn is_active(&self) -> bool {
        self.status.is_active()
    }

    /// Whether it rolls out `job`'s current version (not an older version,
    /// nor an earlier job of the same name).
    pub fn is_for(&self, job: &Job) -> bool {
        self.job_create_index == job.create_index && self.job_spec_modify_index == job.job_modify_index
    }

    /// Whether some group waits for its canaries to be promoted.
    pub fn awaits_promotion(&self) -> bool {
        self.task_groups.values().any(DeploymentGroup::awaits_promotion)
    }

    /// Whether a group that failed asks for the job to be reverted.
    pub fn auto_reverts(&self) -> bool {
        self.task_groups.values().any(|group| group.auto_revert)
    }
}

/// A status change of a deployment, carried in plans and commands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentStatusUpdate {
    /// The deployment.
    pub deployment_id: DeploymentId,
    /// Its new status.
    pub status: DeploymentStatus,
    /// Its new description.
    pub status_description: String,
}
