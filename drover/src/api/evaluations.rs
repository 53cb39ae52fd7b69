//! Evaluations (Nomad's `api/evaluations.go`) and the placement metrics
//! they carry for the groups they could not place (`AllocationMetric`,
//! from `api/allocations.go`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::format::rfc3339_or_none;
use super::{id_or_empty, word};

/// An evaluation (`GET /v1/evaluation/:id`, and in lists).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct Evaluation {
    #[serde(rename = "ID")]
    pub id: String,
    pub namespace: String,
    pub priority: u64,
    #[serde(rename = "Type")]
    pub eval_type: String,
    /// Nomad's trigger word (`job-register`, `node-update`, ...).
    pub triggered_by: String,
    #[serde(rename = "JobID")]
    pub job_id: String,
    pub job_modify_index: u64,
    /// `""` unless a node's change triggered it.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    pub node_modify_index: u64,
    #[serde(rename = "DeploymentID")]
    pub deployment_id: String,
    pub status: String,
    pub status_description: String,
    /// Nanoseconds from its creation to `WaitUntil`.
    pub wait: u64,
    /// RFC 3339, `null` unless it is delayed.
    pub wait_until: Option<String>,
    pub next_eval: String,
    pub previous_eval: String,
    pub blocked_eval: String,
    /// The groups it could not place, `null` when it placed them all.
    #[serde(rename = "FailedTGAllocs")]
    pub failed_tg_allocs: Option<BTreeMap<String, AllocationMetric>>,
    /// Computed node class to whether its nodes were feasible.
    pub class_eligibility: BTreeMap<String, bool>,
    pub quota_limit_reached: String,
    pub escaped_computed_class: bool,
    pub annotate_plan: bool,
    pub queued_allocations: BTreeMap<String, u64>,
    pub snapshot_index: u64,
    pub create_index: u64,
    pub modify_index: u64,
    /// Unix nanoseconds.
    pub create_time: u64,
    /// Unix nanoseconds.
    pub modify_time: u64,
}

/// Nomad's `TriggeredBy` word for Drover's trigger reasons.
fn nomad_trigger(reason: engine::structs::TriggerReason) -> &'static str {
    use engine::structs::TriggerReason::*;
    match reason {
        JobRegister => "job-register",
        JobDeregister => "job-deregister",
        NodeUpdate => "node-update",
        AllocFailure => "alloc-failure",
        JobScaling => "job-scaling",
        JobEvaluate => "job-register",
        RetryFailedAlloc => "alloc-failure",
        FailedFollowUp => "failed-follow-up",
        QueuedAllocs => "queued-allocs",
        MaxDisconnectTimeout => "max-disconnect-timeout",
        Reconnect => "reconnect",
        MaxPlanAttempts => "max-plan-attempts",
        Preemption => "preemption",
        AllocStop => "alloc-stop",
        DeploymentWatcher => "deployment-watcher",
        RollingUpdate => "rolling-update",
        NodeDrain => "node-drain",
        PeriodicJob => "periodic-job",
    }
}

impl From<&engine::structs::Evaluation> for Evaluation {
    fn from(eval: &engine::structs::Evaluation) -> Self {
        let failed: BTreeMap<String, AllocationMetric> = eval
            .failed_tg_allocs
            .iter()
            .map(|(group, metric)| (group.clone(), AllocationMetric::from(metric)))
            .collect();
        Evaluation {
            id: eval.id.to_string(),
            namespace: eval.namespace.to_string(),
            priority: u64::from(eval.priority),
            eval_type: word(eval.eval_type),
            triggered_by: nomad_trigger(eval.triggered_by).to_string(),
            job_id: eval.job_id.to_string(),
            job_modify_index: eval.job_modify_index,
            node_id: id_or_empty(eval.node_id),
            node_modify_index: 0,
            deployment_id: String::new(),
            status: word(eval.status),
            status_description: eval.status_description.clone(),
            wait: eval.wait_until.map_or(0, |until| until.0.saturating_sub(eval.create_time.0)),
            wait_until: eval.wait_until.and_then(rfc3339_or_none),
            next_eval: id_or_empty(eval.next_eval),
            previous_eval: id_or_empty(eval.previous_eval),
            blocked_eval: id_or_empty(eval.blocked_eval),
            failed_tg_allocs: (!failed.is_empty()).then_some(failed),
            class_eligibility: eval.class_eligibility.iter().map(|(class, ok)| (class.0.to_string(), *ok)).collect(),
            quota_limit_reached: String::new(),
            escaped_computed_class: eval.escaped_computed_class,
            annotate_plan: false,
            queued_allocations: eval.queued_allocations.clone(),
            snapshot_index: eval.snapshot_index,
            create_index: eval.create_index,
            modify_index: eval.modify_index,
            create_time: eval.create_time.0,
            modify_time: eval.modify_time.0,
        }
    }
}

/// Where a group's placement failed (`AllocationMetric`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct AllocationMetric {
    pub nodes_evaluated: u64,
    pub nodes_filtered: u64,
    /// Ready nodes per datacenter.
    pub nodes_available: BTreeMap<String, u64>,
    /// Nodes filtered per node class.
    pub class_filtered: BTreeMap<String, u64>,
    /// Nodes filtered per constraint.
    pub constraint_filtered: BTreeMap<String, u64>,
    pub nodes_exhausted: u64,
    /// Nodes exhausted per node class.
    pub class_exhausted: BTreeMap<String, u64>,
    /// Nodes exhausted per resource dimension.
    pub dimension_exhausted: BTreeMap<String, u64>,
    /// Always empty: Drover has no quotas.
    pub quota_exhausted: Vec<String>,
    /// Always `null`.
    pub scores: Option<BTreeMap<String, f64>>,
    /// Always empty: Drover keeps no per-node scores.
    pub score_meta_data: Vec<Value>,
    pub allocation_time: u64,
    pub coalesced_failures: u64,
}

impl From<&engine::structs::AllocMetric> for AllocationMetric {
    fn from(metric: &engine::structs::AllocMetric) -> Self {
        AllocationMetric {
            nodes_evaluated: metric.nodes_evaluated,
            nodes_filtered: metric.nodes_filtered,
            nodes_available: metric.nodes_available.clone(),
            class_filtered: metric.class_filtered.clone(),
            constraint_filtered: metric.constraint_filtered.clone(),
            nodes_exhausted: metric.nodes_exhausted,
            class_exhausted: metric.class_exhausted.clone(),
            dimension_exhausted: metric.dimension_exhausted.clone(),
            coalesced_failures: metric.coalesced_failures,
            ..AllocationMetric::default()
        }
    }
}

/// `DELETE /v1/evaluations`'s body (Nomad's `EvalDeleteRequest`): ids, or
/// a filter expression, not both.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct EvalDeleteRequest {
    /// The evaluations to delete.
    #[serde(rename = "EvalIDs")]
    pub eval_ids: Vec<String>,
    /// Or every evaluation this expression matches.
    pub filter: String,
}

/// `DELETE /v1/evaluations`'s answer: how many were deleted (Drover's;
/// Nomad answers with an empty body, which its clients do not read).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct EvalDeleteResponse {
    /// How many evaluations were deleted.
    pub count: u64,
    /// The index of the delete.
    pub index: u64,
}
