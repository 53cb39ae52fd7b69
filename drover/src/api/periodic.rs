//! Periodic and parameterized jobs in Nomad's JSON (`api/jobs.go`'s
//! `PeriodicConfig`, `ParameterizedJobConfig`, `DispatchPayloadConfig`,
//! `JobDispatchRequest`/`Response`, `PeriodicForceResponse`): the blocks
//! as a client submits them (every field optional, Nomad's defaults
//! filled in by [`PeriodicSpec::convert`] and
//! [`ParameterizedSpec::convert`]) and as the server answers them.

use std::collections::BTreeMap;

use engine::structs::{
    DispatchPayloadConfig, ParameterizedJobConfig, PayloadRule, PeriodicConfig, DEFAULT_TIME_ZONE, SPEC_TYPE_CRON,
};
use serde::{Deserialize, Serialize};

use super::spec::JobSpecError;
use super::WriteMeta;

/// A submitted `Periodic` block.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct PeriodicSpec {
    pub enabled: Option<bool>,
    pub spec: Option<String>,
    pub specs: Option<Vec<String>>,
    pub spec_type: Option<String>,
    pub prohibit_overlap: Option<bool>,
    pub time_zone: Option<String>,
}

impl PeriodicSpec {
    /// The engine's block, with Nomad's api defaults (enabled, `cron`, UTC).
    /// `Specs` (Nomad 1.7's `crons`) wins over `Spec`, which a job read
    /// back carries as its first spec.
    pub fn convert(self) -> PeriodicConfig {
        let specs: Vec<String> = self.specs.unwrap_or_default().into_iter().filter(|spec| !spec.is_empty()).collect();
        let specs = match specs.is_empty() {
            true => self.spec.into_iter().filter(|spec| !spec.is_empty()).collect(),
            false => specs,
        };
        PeriodicConfig {
            enabled: self.enabled.unwrap_or(true),
            specs,
            spec_type: self.spec_type.filter(|kind| !kind.is_empty()).unwrap_or_else(|| SPEC_TYPE_CRON.to_string()),
            prohibit_overlap: self.prohibit_overlap.unwrap_or(false),
            time_zone: self.time_zone.filter(|zone| !zone.is_empty()).unwrap_or_else(|| DEFAULT_TIME_ZONE.to_string()),
        }
    }
}

/// A submitted `ParameterizedJob` block.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct ParameterizedSpec {
    pub payload: Option<String>,
    pub meta_required: Option<Vec<String>>,
    pub meta_optional: Option<Vec<String>>,
}

impl ParameterizedSpec {
    /// The engine's block; an unknown payload word is refused (Nomad's words).
    pub fn convert(self) -> Result<ParameterizedJobConfig, JobSpecError> {
        let word = self.payload.unwrap_or_default();
        let payload = PayloadRule::parse(&word).ok_or_else(|| {
            JobSpecError(format!("Unknown payload requirement: {word:?}; must be optional, required or forbidden"))
        })?;
        Ok(ParameterizedJobConfig {
            payload,
            meta_required: self.meta_required.unwrap_or_default(),
            meta_optional: self.meta_optional.unwrap_or_default(),
        })
    }
}

/// A task's submitted `DispatchPayload` block.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct DispatchPayloadSpec {
    pub file: Option<String>,
}

impl DispatchPayloadSpec {
    /// The engine's block.
    pub fn convert(self) -> DispatchPayloadConfig {
        DispatchPayloadConfig { file: self.file.unwrap_or_default() }
    }
}

/// `Job.Periodic` as the server answers it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct Periodic {
    pub enabled: bool,
    /// The first spec (Nomad before 1.7 has only this).
    pub spec: String,
    /// Every spec when there are several (Nomad 1.7's `crons`); `null` otherwise.
    pub specs: Option<Vec<String>>,
    pub spec_type: String,
    pub prohibit_overlap: bool,
    pub time_zone: String,
}

impl From<&PeriodicConfig> for Periodic {
    fn from(config: &PeriodicConfig) -> Self {
        Periodic {
            enabled: config.enabled,
            spec: config.specs.first().cloned().unwrap_or_default(),
            specs: (config.specs.len() > 1).then(|| config.specs.clone()),
            spec_type: config.spec_type.clone(),
            prohibit_overlap: config.prohibit_overlap,
            time_zone: config.time_zone.clone(),
        }
    }
}

/// `Job.ParameterizedJob` as the server answers it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct ParameterizedJob {
    pub payload: String,
    pub meta_required: Option<Vec<String>>,
    pub meta_optional: Option<Vec<String>>,
}

impl From<&ParameterizedJobConfig> for ParameterizedJob {
    fn from(config: &ParameterizedJobConfig) -> Self {
        let list = |keys: &Vec<String>| (!keys.is_empty()).then(|| keys.clone());
        ParameterizedJob {
            payload: config.payload.as_str().to_string(),
            meta_required: list(&config.meta_required),
            meta_optional: list(&config.meta_optional),
        }
    }
}

/// `Task.DispatchPayload` as the server answers it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct DispatchPayload {
    pub file: String,
}

/// `PUT|POST /v1/job/:id/dispatch`'s body (`JobDispatchRequest`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct JobDispatchRequest {
    #[serde(rename = "JobID")]
    pub job_id: String,
    /// Base64, as Go encodes a `[]byte`.
    pub payload: Option<String>,
    pub meta: Option<BTreeMap<String, String>>,
    /// Nomad 1.5's prefix of the child's id after `dispatch-`.
    pub id_prefix_template: Option<String>,
    /// The token as python-nomad sends it, in the body (Nomad's clients
    /// send `?idempotency_token=`, which wins).
    #[serde(alias = "idempotency_token")]
    pub idempotency_token: Option<String>,
}

/// The answer to a dispatch (`JobDispatchResponse`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct JobDispatchResponse {
    #[serde(rename = "DispatchedJobID")]
    pub dispatched_job_id: String,
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    pub eval_create_index: u64,
    pub job_create_index: u64,
    #[serde(flatten)]
    pub meta: WriteMeta,
}

/// The answer to `PUT|POST /v1/job/:id/periodic/force` (`PeriodicForceResponse`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct PeriodicForceResponse {
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    pub eval_create_index: u64,
    #[serde(flatten)]
    pub meta: WriteMeta,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn submitted_blocks_get_nomads_defaults_and_answer_with_its_names() {
        let spec: PeriodicSpec = serde_json::from_str(r#"{"Spec": "*/5 * * * *"}"#).expect("reads");
        let config = spec.convert();
        assert_eq!(config, PeriodicConfig::cron("*/5 * * * *"));
        let answered = serde_json::to_value(Periodic::from(&config)).expect("serializes");
        assert_eq!(
            answered,
            serde_json::json!({"Enabled": true, "Spec": "*/5 * * * *", "Specs": null, "SpecType": "cron",
                               "ProhibitOverlap": false, "TimeZone": "UTC"})
        );
        let several: PeriodicSpec = serde_json::from_str(r#"{"Specs": ["@daily", "@hourly"]}"#).expect("reads");
        let several = several.convert();
        assert_eq!(several.specs, ["@daily", "@hourly"]);
        let answered = serde_json::to_string(&Periodic::from(&several)).expect("serializes");
        let read_back: PeriodicSpec = serde_json::from_str(&answered).expect("reads");
        assert_eq!(read_back.convert(), several, "a job read back registers the same block");
        let parameterized: ParameterizedSpec =
            serde_json::from_str(r#"{"Payload": "required", "MetaRequired": ["a"]}"#).expect("reads");
        let config = parameterized.convert().expect("converts");
        assert_eq!(config.payload, PayloadRule::Required);
        let bad: ParameterizedSpec = serde_json::from_str(r#"{"Payload": "maybe"}"#).expect("reads");
        assert!(bad.convert().is_err());
    }
}
