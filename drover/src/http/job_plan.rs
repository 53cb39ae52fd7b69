//! `PUT|POST /v1/job/<id>/plan` (routed by `jobs.rs`) and `PUT|POST
//! /v1/validate/job`: a register's dry run and a job's check, written
//! nowhere.
//!
//! A plan:
//! 1. reads the body (`Job`, `Diff`, `PolicyOverride`, keys in any case)
//!    with Nomad's refusals (400): `Job must be specified`, `Job must
//!    specify a valid ID`, `Job ID does not match`;
//! 2. converts the job as a register does (`api::job_spec`, its warnings
//!    answered in `Warnings`);
//! 3. runs the engine's dry run on the leader (`JobEndpoint::plan`: the
//!    real scheduler against the newest snapshot, nothing committed);
//! 4. answers Nomad's `JobPlanResponse`, with the diff from the stored
//!    job when asked (`api::job_diff`, annotated by the plan), and, for
//!    each group that could not place everything, Drover's
//!    `DroverFilteredClasses` beside Nomad's metric.

use std::collections::{BTreeMap, BTreeSet};

use axum::body::Bytes;
use axum::routing::put;
use axum::Router;
use engine::job_plan::{JobPlan, JobPlanError};
use engine::scheduler::reconcile::needs_destructive_update;

use engine::structs::Capabilities;

use super::access::Access;
use super::error::{register_error, ApiError};
use super::nomad;
use super::query::{Params, Reply};
use super::{on_engine, ApiState};
use crate::api::evaluations::{AllocationMetric, Evaluation};
use crate::api::job_diff::{annotate, job_diff, DiffAnnotations};
use crate::api::job_plan::{
    DesiredUpdates, FilteredClass, JobPlanRequest, JobPlanResponse, JobValidateResponse, PlanAnnotations,
    PlanFailedMetric, ZERO_TIME,
};
use crate::api::job_spec::{self, Converted, JobSpec};
use crate::api::WriteMeta;

/// The routes of this file (`/plan` is routed with the job's sub-paths).
pub fn routes() -> Router<ApiState> {
    Router::new().route("/v1/validate/job", put(validate).post(validate))
}

/// Step 1 and 2: the request's job, converted, or Nomad's refusal.
fn read_plan(params: &Params, body: &Bytes, path_id: &str) -> Result<(JobPlanRequest, Converted), ApiError> {
    if body.is_empty() {
        return Err(ApiError::BadRequest("Request body is empty".to_string()));
    }
    let request = JobPlanRequest::from_body(body).map_err(ApiError::BadRequest)?;
    let job = request.job.clone().ok_or_else(|| ApiError::BadRequest("Job must be specified".to_string()))?;
    let spec: JobSpec = serde_json::from_value(job).map_err(|error| ApiError::BadRequest(error.to_string()))?;
    match spec.id.as_deref() {
        None | Some("") => return Err(ApiError::BadRequest("Job must specify a valid ID".to_string())),
        Some(id) if id != path_id => return Err(ApiError::BadRequest("Job ID does not match".to_string())),
        Some(_) => {}
    }
    let namespace = params.get("namespace").or(request.namespace.as_deref());
    let converted = job_spec::convert_job(spec, namespace).map_err(|error| ApiError::BadRequest(error.to_string()))?;
    Ok((request, converted))
}

/// `PUT|POST /v1/job/<id>/plan`; see the module docs.
pub async fn plan(
    state: ApiState,
    access: &Access,
    params: Params,
    path_id: String,
    body: Bytes,
) -> Result<Reply, ApiError> {
    let (request, converted) = read_plan(&params, &body, &path_id)?;
    access.check(&converted.job.namespace, Capabilities::SUBMIT_JOB)?;
    let engine = state.leader()?;
    let job = converted.job;
    let next_launch = next_periodic_launch(&job);
    let planned = on_engine(move || engine.jobs().plan(job)).await?.map_err(|error| match error {
        JobPlanError::Invalid(invalid) => register_error(engine::job_endpoint::JobError::Invalid(invalid)),
        refused @ JobPlanError::UnknownNamespace { .. } => ApiError::BadRequest(refused.to_string()),
        other => ApiError::Internal(other.to_string()),
    })?;
    let mut answer = response(&planned, request.diff, &converted.warnings);
    answer.next_periodic_launch = next_launch;
    let index = answer.meta.index;
    Ok(Reply::json(&answer, params.pretty(), Some(index)))
}

/// When a periodic job would launch next, from now (Nomad's
/// `NextPeriodicLaunch`); Go's zero time for any other job.
fn next_periodic_launch(job: &engine::structs::Job) -> String {
    use engine::clock::Clock as _;
    let now = engine::clock::SystemClock::new().now();
    let next = job
        .periodic
        .as_ref()
        .filter(|_| job.is_periodic_active())
        .and_then(|periodic| periodic.next_launch(now).ok().flatten());
    next.map_or_else(|| ZERO_TIME.to_string(), crate::api::format::date)
}

/// Step 4.
fn response(planned: &JobPlan, with_diff: bool, warnings: &[String]) -> JobPlanResponse {
    let snapshot = &planned.snapshot;
    let updates: BTreeMap<String, DesiredUpdates> = planned
        .annotations
        .desired_tg_updates
        .iter()
        .map(|(group, counts)| (group.clone(), DesiredUpdates::from(counts)))
        .collect();
    let preempted: Vec<_> =
        planned.annotations.preempted_allocs.iter().map(|alloc| nomad::alloc_stub(alloc, snapshot)).collect();
    let failed: BTreeMap<String, PlanFailedMetric> = planned
        .failed_tg_allocs
        .iter()
        .map(|(group, metric)| {
            let classes = planned.filtered_classes.get(group).into_iter().flatten().map(FilteredClass::from);
            let failed =
                PlanFailedMetric { metric: AllocationMetric::from(metric), filtered_classes: classes.collect() };
            (group.clone(), failed)
        })
        .collect();
    let created: Vec<Evaluation> = planned.created_evals.iter().map(Evaluation::from).collect();
    JobPlanResponse {
        diff: with_diff.then(|| plan_diff(planned, &updates)).flatten(),
        annotations: PlanAnnotations {
            desired_tg_updates: updates,
            preempted_allocs: (!preempted.is_empty()).then_some(preempted),
        },
        failed_tg_allocs: (!failed.is_empty()).then_some(failed),
        job_modify_index: planned.job_modify_index(),
        created_evals: (!created.is_empty()).then_some(created),
        next_periodic_launch: ZERO_TIME.to_string(),
        warnings: warnings.join("\n"),
        meta: WriteMeta::at(snapshot.index()),
    }
}

/// The diff from the stored job to the planned one, annotated by the plan.
fn plan_diff(planned: &JobPlan, updates: &BTreeMap<String, DesiredUpdates>) -> Option<crate::api::job_diff::JobDiff> {
    let snapshot = &planned.snapshot;
    let old = planned.current.as_ref().map(|job| nomad::job(job, snapshot));
    let new = nomad::job(&planned.planned, snapshot);
    let mut diff = job_diff(old.as_ref(), Some(&new))?;
    let destructive_groups: BTreeSet<String> = match &planned.current {
        None => BTreeSet::new(),
        Some(current) => planned
            .planned
            .task_groups
            .iter()
            .filter(|group| {
                current
                    .group(&group.name)
                    .is_some_and(|old| needs_destructive_update(current, old, &planned.planned, group))
            })
            .map(|group| group.name.clone())
            .collect(),
    };
    let updates = updates.iter().map(|(group, counts)| (group.clone(), counts.by_name())).collect();
    annotate(&mut diff, &DiffAnnotations { updates, destructive_groups });
    Some(diff)
}

/// `PUT|POST /v1/validate/job`: the job read and checked as a register
/// would, answered 200 with its problems (Nomad's `JobValidateResponse`);
/// a body without a job is 400 `Job must be specified`; the caller's
/// token needs `read-job` in the namespace named.
async fn validate(
    axum::Extension(access): axum::Extension<Access>,
    params: Params,
    body: Bytes,
) -> Result<Reply, ApiError> {
    if body.is_empty() {
        return Err(ApiError::BadRequest("Request body is empty".to_string()));
    }
    let request = JobPlanRequest::from_body(&body).map_err(ApiError::BadRequest)?;
    let job = request.job.ok_or_else(|| ApiError::BadRequest("Job must be specified".to_string()))?;
    let namespace = params.get("namespace").map(str::to_string).or(request.namespace);
    let named = namespace.as_deref().filter(|named| !named.is_empty() && *named != "*");
    access.check(named.unwrap_or(engine::structs::DEFAULT_NAMESPACE), Capabilities::READ_JOB)?;
    let checked = serde_json::from_value::<JobSpec>(job)
        .map_err(|error| vec![error.to_string()])
        .and_then(|spec| job_spec::convert_job(spec, namespace.as_deref()).map_err(|error| vec![error.to_string()]))
        .and_then(|converted| match converted.job.validate() {
            Ok(()) => Ok(converted.warnings),
            Err(invalid) => Err(invalid.problems),
        });
    let answer = match checked {
        Ok(warnings) => JobValidateResponse {
            driver_config_validated: true,
            warnings: warnings.join("\n"),
            ..JobValidateResponse::default()
        },
        Err(problems) => JobValidateResponse {
            driver_config_validated: true,
            error: format!("{} error(s) occurred: {}", problems.len(), problems.join("; ")),
            validation_errors: problems,
            warnings: String::new(),
        },
    };
    Ok(Reply::json(&answer, params.pretty(), None))
}
