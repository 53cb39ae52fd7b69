//! What a client reports of an allocation's health: each check's latest
//! result (Nomad 1.4+'s native checks, `/v1/client/allocation/:id/checks`)
//! and the allocation's health verdict (Nomad's `DeploymentStatus`), and
//! the group settings that decide the verdict.
//!
//! Contract:
//! 1. A check's result changes only when its status changes: the client
//!    reports it then, and never for a run that changed nothing, so checks
//!    passing on 10,000 allocations write nothing.
//! 2. The verdict is decided once by the client (healthy, or unhealthy
//!    with a reason in a task event) and then kept; the servers store it
//!    with the index it was written at.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration::serde_duration;
use super::ids::AllocId;
use crate::clock::Timestamp;

/// A check's status as Nomad's native checks name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckResultStatus {
    /// Not yet decided (before the first runs).
    Pending,
    /// Passing.
    Success,
    /// Failing.
    Failure,
}

impl CheckResultStatus {
    /// Nomad's name.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckResultStatus::Pending => "pending",
            CheckResultStatus::Success => "success",
            CheckResultStatus::Failure => "failure",
        }
    }
}

/// Whether a check counts toward the allocation's health (Nomad's check
/// mode: a check with `on_update = "ignore"` is a readiness check).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckMode {
    /// Its failure makes the allocation unhealthy.
    Healthiness,
    /// It only says whether the service is ready.
    Readiness,
}

/// One check's latest result, as its client reported it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResult {
    /// A stable id of the check within its allocation ([`CheckResult::make_id`]).
    pub id: String,
    /// The check's name.
    pub check: String,
    /// The allocation's group.
    pub group: String,
    /// The task whose service it checks; empty for a group's service.
    pub task: String,
    /// The service's name.
    pub service: String,
    /// Whether it counts toward health.
    pub mode: CheckMode,
    /// Its status.
    pub status: CheckResultStatus,
    /// What the run that set the status said (`HTTP 200 OK`, a script's output).
    pub output: String,
    /// An `http` check's status code (0 otherwise).
    pub status_code: u16,
    /// When the status was set, by the client's clock.
    pub timestamp: Timestamp,
}

impl CheckResult {
    /// The check's id: a hash of the allocation, the service registration
    /// it checks and its name, as hex (as Nomad's, opaque and stable across
    /// agent restarts).
    pub fn make_id(alloc_id: AllocId, registration_id: &str, check: &str) -> String {
        let text = format!("{alloc_id}\0{registration_id}\0{check}");
        format!("{:032x}", xxhash_rust::xxh3::xxh3_128(text.as_bytes()))
    }
}

/// The allocation's health as its client decided it (Nomad's
/// `AllocDeploymentStatus`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocHealth {
    /// Healthy or not.
    pub healthy: bool,
    /// When the client decided, by its clock.
    pub timestamp: Timestamp,
    /// The index at which the servers stored it (set by the store).
    pub modify_index: u64,
}

/// How an allocation's health is decided (Nomad's `health_check`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthCheckMode {
    /// Its tasks run and every check passes for `min_healthy_time` (the default).
    #[default]
    Checks,
    /// Its tasks run for `min_healthy_time`; checks do not count.
    TaskStates,
    /// The client decides nothing: an operator does.
    Manual,
}

impl HealthCheckMode {
    /// Nomad's name.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthCheckMode::Checks => "checks",
            HealthCheckMode::TaskStates => "task_states",
            HealthCheckMode::Manual => "manual",
        }
    }

    /// The mode of Nomad's name, if it is one.
    pub fn parse(text: &str) -> Option<HealthCheckMode> {
        match text {
            "checks" => Some(HealthCheckMode::Checks),
            "task_states" => Some(HealthCheckMode::TaskStates),
            "manual" => Some(HealthCheckMode::Manual),
            _ => None,
        }
    }
}

/// A group's health settings (from its `update` block, Nomad's defaults
/// otherwise).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HealthPolicy {
    /// How health is decided.
    pub mode: HealthCheckMode,
    /// How long the tasks must run and the checks pass.
    #[serde(with = "serde_duration")]
    pub min_healthy_time: Duration,
    /// The allocation is unhealthy when not healthy by this long after it started.
    #[serde(with = "serde_duration")]
    pub healthy_deadline: Duration,
}

impl Default for HealthPolicy {
    fn default() -> HealthPolicy {
        HealthPolicy {
            mode: HealthCheckMode::Checks,
            min_healthy_time: Duration::from_secs(10),
            healthy_deadline: Duration::from_secs(300),
        }
    }
}
