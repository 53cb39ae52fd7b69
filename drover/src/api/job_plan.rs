//! `job plan` and `job validate` as the API answers them (Nomad's
//! `JobPlanResponse`, `JobValidateResponse`), and Drover's addition to a
//! plan's failed placements (`DroverFilteredClasses`, below).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::allocations::AllocationListStub;
use super::evaluations::{AllocationMetric, Evaluation};
use super::job_diff::JobDiff;
use super::WriteMeta;

/// Go's zero time, as Nomad answers `NextPeriodicLaunch` for a job that is
/// not periodic.
pub const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// The body of `PUT /v1/job/:id/plan` and of `PUT /v1/validate/job`,
/// its top-level keys matched whatever their case (as Go's decoder
/// matches them).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobPlanRequest {
    /// The job, as clients submit it (`{"ID": ...}`), if given.
    pub job: Option<Value>,
    /// Whether to answer the diff from the stored job.
    pub diff: bool,
    /// Sentinel's override (Drover has no Sentinel policies: ignored).
    pub policy_override: bool,
    /// The namespace, when the query does not name one.
    pub namespace: Option<String>,
}

impl JobPlanRequest {
    /// Reads a body: a JSON object whose keys are matched ignoring case.
    pub fn from_body(body: &[u8]) -> Result<JobPlanRequest, String> {
        let value: Value = serde_json::from_slice(body).map_err(|error| error.to_string())?;
        let Value::Object(fields) = value else { return Err("the body is not a JSON object".to_string()) };
        let mut request = JobPlanRequest::default();
        for (key, value) in fields {
            match key.to_ascii_lowercase().as_str() {
                "job" => request.job = Some(value).filter(|job| !job.is_null()),
                "diff" => request.diff = value.as_bool().unwrap_or(false),
                "policyoverride" => request.policy_override = value.as_bool().unwrap_or(false),
                "namespace" => request.namespace = value.as_str().map(str::to_string).filter(|ns| !ns.is_empty()),
                _ => {}
            }
        }
        Ok(request)
    }
}

/// What a plan does to one task group (`DesiredUpdates`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct DesiredUpdates {
    pub ignore: u64,
    pub place: u64,
    pub migrate: u64,
    pub stop: u64,
    pub in_place_update: u64,
    pub destructive_update: u64,
    pub canary: u64,
    pub preemptions: u64,
}

impl DesiredUpdates {
    /// Nomad's names for the counts, as a diff's `Updates` lists them.
    pub fn by_name(&self) -> BTreeMap<String, u64> {
        let named = [
            ("ignore", self.ignore),
            ("create", self.place),
            ("migrate", self.migrate),
            ("destroy", self.stop),
            ("in-place update", self.in_place_update),
            ("create/destroy update", self.destructive_update),
            ("canary", self.canary),
        ];
        named.into_iter().map(|(name, count)| (name.to_string(), count)).collect()
    }

    /// Whether the plan creates or destroys an allocation of the group
    /// (what `job plan` exits 1 for).
    pub fn changes_allocations(&self) -> bool {
        self.stop + self.place + self.migrate + self.destructive_update + self.canary > 0
    }
}

impl From<&engine::job_plan::DesiredUpdates> for DesiredUpdates {
    fn from(counts: &engine::job_plan::DesiredUpdates) -> Self {
        DesiredUpdates {
            ignore: counts.ignore,
            place: counts.place,
            migrate: counts.migrate,
            stop: counts.stop,
            in_place_update: counts.in_place_update,
            destructive_update: counts.destructive_update,
            canary: counts.canary,
            preemptions: counts.preemptions,
        }
    }
}

/// `PlanAnnotations`: never `null` in an answer (Nomad's CLI dereferences it).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct PlanAnnotations {
    /// Per task group.
    #[serde(rename = "DesiredTGUpdates")]
    pub desired_tg_updates: BTreeMap<String, DesiredUpdates>,
    /// The allocations the plan would evict; `null` when none.
    pub preempted_allocs: Option<Vec<AllocationListStub>>,
}

/// One node of a filtered class.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ExampleNode {
    /// The node's id.
    #[serde(rename = "ID")]
    pub id: String,
    /// The node's name.
    pub name: String,
}

/// Drover's addition: the nodes of one computed class kept out for one
/// reason (`engine::job_plan::filtered`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct FilteredClass {
    /// The computed class, as evaluations' `ClassEligibility` names it.
    pub computed_class: String,
    /// The node class the nodes were given (`""` when none).
    pub node_class: String,
    /// The check that failed (a constraint, `missing driver "x"`, ...),
    /// or the exhausted dimension (`cpu`, `memory`, `disk`).
    pub reason: String,
    /// Whether the nodes passed every check but had no room.
    pub exhausted: bool,
    /// How many nodes of the class.
    pub nodes: u64,
    /// Up to three of them.
    pub example_nodes: Vec<ExampleNode>,
}

impl From<&engine::job_plan::FilteredClass> for FilteredClass {
    fn from(class: &engine::job_plan::FilteredClass) -> Self {
        FilteredClass {
            computed_class: class.computed_class.0.to_string(),
            node_class: class.node_class.clone(),
            reason: class.reason.clone(),
            exhausted: class.exhausted,
            nodes: class.nodes,
            example_nodes: class
                .examples
                .iter()
                .map(|(id, name)| ExampleNode { id: id.to_string(), name: name.clone() })
                .collect(),
        }
    }
}

/// A group's failed placement in a plan: Nomad's `AllocationMetric` and
/// Drover's `DroverFilteredClasses` (Nomad's clients ignore the field).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PlanFailedMetric {
    /// Nomad's metric.
    #[serde(flatten)]
    pub metric: AllocationMetric,
    /// Drover's per-class account.
    #[serde(rename = "DroverFilteredClasses")]
    pub filtered_classes: Vec<FilteredClass>,
}

/// `PUT /v1/job/:id/plan` (`JobPlanResponse`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct JobPlanResponse {
    /// What the plan does per group; never `null`.
    pub annotations: PlanAnnotations,
    /// The groups that could not place everything; `null` when none.
    #[serde(rename = "FailedTGAllocs")]
    pub failed_tg_allocs: Option<BTreeMap<String, PlanFailedMetric>>,
    /// The stored job's `JobModifyIndex` (0 for a new job): what
    /// `job run -check-index` enforces.
    pub job_modify_index: u64,
    /// Evals the scheduler would create (blocked, follow-ups); `null` when none.
    pub created_evals: Option<Vec<Evaluation>>,
    /// The diff from the stored job, when asked for.
    pub diff: Option<JobDiff>,
    /// When a periodic job would launch next (RFC 3339); Go's zero time
    /// for any other job.
    pub next_periodic_launch: String,
    /// The fields Drover ignored, one per line.
    pub warnings: String,
    /// The snapshot's index.
    #[serde(flatten)]
    pub meta: WriteMeta,
}

impl JobPlanResponse {
    /// Whether the plan creates or destroys allocations: `job plan`'s exit 1.
    pub fn changes_allocations(&self) -> bool {
        self.annotations.desired_tg_updates.values().any(DesiredUpdates::changes_allocations)
    }
}

/// `PUT /v1/validate/job` (`JobValidateResponse`): answered 200 whether
/// the job is valid or not.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct JobValidateResponse {
    /// Always true (the server checks drivers' configs as it reads them).
    pub driver_config_validated: bool,
    /// One line per problem.
    pub validation_errors: Vec<String>,
    /// The problems as one message (`""` when valid).
    pub error: String,
    /// The fields Drover ignored, one per line.
    pub warnings: String,
}
