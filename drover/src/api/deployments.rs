//! Deployments (Nomad's `api/deployments.go`): the deployment as answered
//! by `/v1/deployment/<id>` and every list, the bodies of its writes and
//! the answer they share.
//!
//! Nomad decodes request bodies with Go's `encoding/json`, which matches
//! keys without regard to case, and python-nomad relies on it (it sends
//! `UnHealthyAllocationIDs`); [`read_body`] reads the write bodies the same
//! way.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::format::{nanos, rfc3339};

/// Go's zero `time.Time`, as Nomad writes an unset `RequireProgressBy`.
pub const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// A deployment (`Deployment`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct Deployment {
    #[serde(rename = "ID")]
    pub id: String,
    pub namespace: String,
    #[serde(rename = "JobID")]
    pub job_id: String,
    pub job_version: u64,
    pub job_modify_index: u64,
    pub job_spec_modify_index: u64,
    pub job_create_index: u64,
    /// Always false: Drover has one region.
    pub is_multiregion: bool,
    /// The groups that take part, by name.
    pub task_groups: BTreeMap<String, DeploymentState>,
    pub status: String,
    pub status_description: String,
    pub eval_priority: u64,
    pub create_index: u64,
    pub modify_index: u64,
    /// Unix nanoseconds (Nomad 1.9.2+).
    pub create_time: u64,
    /// Unix nanoseconds (Nomad 1.9.2+).
    pub modify_time: u64,
}

/// One group's part in a deployment (`DeploymentState`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct DeploymentState {
    pub auto_revert: bool,
    pub auto_promote: bool,
    /// Nanoseconds.
    pub progress_deadline: u64,
    /// RFC 3339; Go's zero time ([`ZERO_TIME`]) until the first placement.
    pub require_progress_by: String,
    pub promoted: bool,
    /// The canaries' allocation ids; `null` when none were placed.
    pub placed_canaries: Option<Vec<String>>,
    pub desired_canaries: u64,
    pub desired_total: u64,
    pub placed_allocs: u64,
    pub healthy_allocs: u64,
    pub unhealthy_allocs: u64,
}

impl DeploymentState {
    /// Whether the group has no progress deadline to show yet.
    pub fn progress_unset(&self) -> bool {
        self.require_progress_by.is_empty() || self.require_progress_by == ZERO_TIME
    }
}

impl From<&engine::structs::Deployment> for Deployment {
    fn from(deployment: &engine::structs::Deployment) -> Self {
        Deployment {
            id: deployment.id.to_string(),
            namespace: deployment.namespace.to_string(),
            job_id: deployment.job_id.to_string(),
            job_version: deployment.job_version,
            job_modify_index: deployment.job_modify_index,
            job_spec_modify_index: deployment.job_spec_modify_index,
            job_create_index: deployment.job_create_index,
            is_multiregion: false,
            task_groups: deployment
                .task_groups
                .iter()
                .map(|(name, group)| (name.clone(), DeploymentState::from(group)))
                .collect(),
            status: deployment.status.as_str().to_string(),
            status_description: deployment.status_description.clone(),
            eval_priority: u64::from(deployment.eval_priority),
            create_index: deployment.create_index,
            modify_index: deployment.modify_index,
            create_time: deployment.create_time.0,
            modify_time: deployment.modify_time.0,
        }
    }
}

impl From<&engine::structs::DeploymentGroup> for DeploymentState {
    fn from(group: &engine::structs::DeploymentGroup) -> Self {
        let canaries = &group.placed_canaries;
        DeploymentState {
            auto_revert: group.auto_revert,
            auto_promote: group.auto_promote,
            progress_deadline: nanos(group.progress_deadline),
            require_progress_by: group.require_progress_by.map_or_else(|| ZERO_TIME.to_string(), rfc3339),
            promoted: group.promoted,
            placed_canaries: (!canaries.is_empty()).then(|| canaries.iter().map(|id| id.to_string()).collect()),
            desired_canaries: u64::from(group.desired_canaries),
            desired_total: u64::from(group.desired_total),
            placed_allocs: u64::from(group.placed_allocs),
            healthy_allocs: u64::from(group.healthy_allocs),
            unhealthy_allocs: u64::from(group.unhealthy_allocs),
        }
    }
}

/// What every deployment write answers (`DeploymentUpdateResponse`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct DeploymentUpdateResponse {
    /// `""` when the write made no eval (a pause).
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    pub eval_create_index: u64,
    pub deployment_modify_index: u64,
    /// The version an auto-revert registered again; `null` when none.
    pub reverted_job_version: Option<u64>,
    /// The index of the write.
    pub index: u64,
}

impl From<&engine::deployment::endpoint::DeploymentUpdateResponse> for DeploymentUpdateResponse {
    fn from(written: &engine::deployment::endpoint::DeploymentUpdateResponse) -> Self {
        DeploymentUpdateResponse {
            eval_id: super::id_or_empty(written.eval_id),
            eval_create_index: written.eval_create_index,
            deployment_modify_index: written.deployment_modify_index,
            reverted_job_version: written.reverted_job_version,
            index: written.index,
        }
    }
}

/// `PUT /v1/deployment/fail/<id>`'s body (`DeploymentFailRequest`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeploymentFailRequest {
    /// Must be the path's id.
    #[serde(rename = "DeploymentID")]
    pub deployment_id: Option<String>,
}

/// `PUT /v1/deployment/pause/<id>`'s body (`DeploymentPauseRequest`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct DeploymentPauseRequest {
    /// Must be the path's id.
    #[serde(rename = "DeploymentID")]
    pub deployment_id: Option<String>,
    /// Pause (true) or resume (false).
    pub pause: bool,
}

/// `PUT /v1/deployment/promote/<id>`'s body (`DeploymentPromoteRequest`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct DeploymentPromoteRequest {
    /// Must be the path's id.
    #[serde(rename = "DeploymentID")]
    pub deployment_id: Option<String>,
    /// Promote every group's canaries (`Groups` is then ignored).
    pub all: bool,
    /// The groups whose canaries to promote.
    pub groups: Option<Vec<String>>,
}

/// `PUT /v1/deployment/allocation-health/<id>`'s body
/// (`DeploymentAllocHealthRequest`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeploymentAllocHealthRequest {
    /// Must be the path's id.
    #[serde(rename = "DeploymentID")]
    pub deployment_id: Option<String>,
    /// Allocations to mark healthy.
    #[serde(rename = "HealthyAllocationIDs")]
    pub healthy_allocation_ids: Option<Vec<String>>,
    /// Allocations to mark unhealthy (fails the deployment).
    #[serde(rename = "UnhealthyAllocationIDs")]
    pub unhealthy_allocation_ids: Option<Vec<String>>,
}

/// Why a write body was refused.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// Not JSON, or a field of the wrong type.
    #[error("{0}")]
    Malformed(#[from] serde_json::Error),
    /// JSON, but not an object.
    #[error("the request body is not a JSON object")]
    NotAnObject,
}

/// Reads `body` as `T` with its top-level keys matched without regard to
/// case, as Go does: each key equal to one of `names` but for case is
/// read as that name. An empty body reads as `T::default()`.
pub fn read_body<T: DeserializeOwned + Default>(body: &[u8], names: &[&str]) -> Result<T, BodyError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    let Value::Object(fields) = serde_json::from_slice::<Value>(body)? else {
        return Err(BodyError::NotAnObject);
    };
    let canonical = fields
        .into_iter()
        .map(|(key, value)| {
            let name = names.iter().find(|name| name.eq_ignore_ascii_case(&key)).map_or(key, |name| name.to_string());
            (name, value)
        })
        .collect();
    Ok(serde_json::from_value(Value::Object(canonical))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_keys_match_whatever_their_case() {
        let names = ["DeploymentID", "HealthyAllocationIDs", "UnhealthyAllocationIDs"];
        let body = br#"{"deploymentid": "d", "UnHealthyAllocationIDs": ["a"], "healthyAllocationIds": ["b"]}"#;
        let read: DeploymentAllocHealthRequest = read_body(body, &names).expect("reads");
        assert_eq!(read.deployment_id.as_deref(), Some("d"));
        assert_eq!(read.unhealthy_allocation_ids, Some(vec!["a".to_string()]));
        assert_eq!(read.healthy_allocation_ids, Some(vec!["b".to_string()]));
        let empty: DeploymentAllocHealthRequest = read_body(b"", &names).expect("an empty body");
        assert_eq!(empty, DeploymentAllocHealthRequest::default());
        assert!(read_body::<DeploymentAllocHealthRequest>(b"[1]", &names).is_err());
        assert!(read_body::<DeploymentPauseRequest>(br#"{"Pause": "yes"}"#, &["Pause"]).is_err());
    }

    #[test]
    fn a_group_without_progress_has_go_s_zero_time() {
        let group = engine::structs::DeploymentGroup {
            progress_deadline: std::time::Duration::from_secs(600),
            ..Default::default()
        };
        let state = DeploymentState::from(&group);
        assert_eq!((state.require_progress_by.as_str(), state.progress_deadline), (ZERO_TIME, 600_000_000_000));
        assert!(state.progress_unset() && state.placed_canaries.is_none());
    }
}
