//! `/v1/jobs` and `/v1/job/<id>[/<suffix>]`. As in Nomad, the job id is
//! what comes before a known suffix ([`JOB_SUFFIXES`](crate::api::jobs::JOB_SUFFIXES): every sub-path Nomad
//! has), so ids may hold `/`, and a job whose id ends in a suffix (`a/plan`)
//! is reached by its suffix's handler, never registered under another id
//! (a register's body must name the id of its path; so must a revert's and
//! a stability change's). The sub-paths Drover does not serve yet answer
//! 501, naming the path. `/versions`, `/revert` and `/stable` serve the
//! job versions the state store keeps (`engine/src/state/job_versions.rs`);
//! `/plan` is a register's dry run (`job_plan.rs`); `/deployments` and
//! `/deployment` are answered by `deployments.rs`. `/periodic/force`
//! launches a periodic job's child now and `/dispatch` dispatches a
//! parameterized job (`engine::job_endpoint`), Nomad's refusals answered
//! as its RPC errors (500, its words).
//! `/v1/jobs/parse` reads a job file into Nomad's job JSON, as `drover job
//! run` reads one.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::Method;
use axum::routing::{any, get, put};
use axum::Router;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use engine::job_endpoint::{DispatchRequest, JobError, JobWriteResponse};
use engine::state::Snapshot;
use engine::structs::{Capabilities, Job, JobKey};

use super::access::Access;
use super::error::{register_error, ApiError};
use super::nomad;
use super::paging::{ByNamespacedId, PageQuery};
use super::query::{blocking, blocking_reply, Params, Reply};
use super::{on_engine, ApiState};
use crate::api::evaluations::Evaluation;
use crate::api::job_diff;
use crate::api::job_spec::{self, JobRegisterRequest};
use crate::api::jobs::{
    split_job_path, JobDeregisterResponse, JobRegisterResponse, JobRevertRequest, JobScaleStatusResponse,
    JobStabilityRequest, JobStabilityResponse, JobVersionsResponse, JobsParseRequest, ScalingRequest,
    TaskGroupScaleStatus,
};
use crate::api::periodic::{JobDispatchRequest, JobDispatchResponse, PeriodicForceResponse};
use crate::api::{id_or_empty, WriteMeta};

/// The routes of this file.
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/jobs", get(list).put(register).post(register))
        .route("/v1/jobs/parse", put(parse).post(parse))
        .route("/v1/job/{*rest}", any(job))
}

/// `GET /v1/jobs[?prefix=&namespace=]`: stubs ordered by namespace and
/// id; `namespace=*` lists every namespace; pages and filters as every
/// list (`paging.rs`).
async fn list(
    State(state): State<ApiState>,
    axum::Extension(access): axum::Extension<Access>,
    params: Params,
) -> Result<Reply, ApiError> {
    let scope = access.scope(params.namespace(), Capabilities::LIST_JOBS);
    let prefix = params.prefix().to_string();
    let query = PageQuery::of(&params)?;
    let index = |snapshot: &Snapshot| Ok(snapshot.table_indexes().jobs.max(snapshot.table_indexes().allocs));
    blocking_reply(&state, &params, index, |snapshot| {
        let jobs: Vec<&Arc<Job>> = snapshot
            .jobs()
            .filter(|job| scope.admits(&job.namespace))
            .filter(|job| job.id.starts_with(&prefix))
            .collect();
        let key = |job: &&Arc<Job>| ByNamespacedId(job.namespace.to_string(), job.id.to_string());
        let (page, next_token) = query.page(jobs, key, |job| nomad::job_stub(job, snapshot))?;
        Ok(Reply::json(&page, params.pretty(), index(snapshot).ok()).with_next_token(next_token))
    })
    .await
}

/// `PUT|POST /v1/jobs`: register (or update) a job from Nomad's JSON.
async fn register(
    State(state): State<ApiState>,
    axum::Extension(access): axum::Extension<Access>,
    params: Params,
    body: Bytes,
) -> Result<Reply, ApiError> {
    register_job(state, &access, params, body, None).await
}

/// `PUT|POST /v1/jobs/parse`: the job file in the body's `JobHCL`, read
/// as `drover job run` reads a file (`api::hcl`), answered with the job in
/// Nomad's JSON, unregistered. Nomad's messages: `Job spec is empty`,
/// `Failed to parse job: <file:line: what>` (400). What Drover's reader
/// cannot do (HCL1, variables, canonicalizing) answers 501 naming it,
/// rather than a job that is not what was asked for.
async fn parse(params: Params, body: Bytes) -> Result<Reply, ApiError> {
    let request: JobsParseRequest =
        serde_json::from_slice(&body).map_err(|error| ApiError::BadRequest(error.to_string()))?;
    let unsupported = [
        (request.hcl_v1, "HCLv1: Drover reads HCL2 job files only"),
        (!request.variables.trim().is_empty(), "Variables: Drover's job file reader takes no variables"),
        (request.canonicalize, "Canonicalize: parse without it; the server applies Nomad's defaults on register"),
    ];
    if let Some((_, what)) = unsupported.iter().find(|(asked, _)| *asked) {
        return Err(ApiError::NotImplemented(format!("/v1/jobs/parse with {what}")));
    }
    if request.job_hcl.trim().is_empty() {
        return Err(ApiError::BadRequest("Job spec is empty".to_string()));
    }
    let mut parsed = crate::api::hcl::job_json("input.hcl", &request.job_hcl)
        .map_err(|error| ApiError::BadRequest(format!("Failed to parse job: {error}")))?;
    Ok(Reply::json(&parsed["Job"].take(), params.pretty(), None))
}

/// What `job` does for `/v1/job/<rest>` by method and suffix.
async fn job(
    State(state): State<ApiState>,
    axum::Extension(access): axum::Extension<Access>,
    method: Method,
    Path(rest): Path<String>,
    params: Params,
    body: Bytes,
) -> Result<Reply, ApiError> {
    let (id, suffix) = split_job_path(&rest);
    let id = id.to_string();
    let key = JobKey { namespace: Arc::from(params.namespace()), id: Arc::from(id.as_str()) };
    match (suffix, method) {
        ("", Method::GET) => read(&state, &params, key).await,
        ("", Method::PUT | Method::POST) => register_job(state, &access, params, body, Some(id)).await,
        ("", Method::DELETE) => deregister(state, params, key).await,
        ("/allocations", Method::GET) => allocations(&state, &params, key).await,
        ("/evaluations", Method::GET) => evaluations(&state, &params, key).await,
        ("/summary", Method::GET) => summary(&state, &params, key).await,
        ("/deployment", Method::GET) => super::deployments::job_deployment(&state, &params, key).await,
        ("/scale", Method::PUT | Method::POST) => scale(state, params, key, body).await,
        ("/scale", Method::GET) => scale_status(&state, &params, key).await,
        ("/evaluate", Method::PUT | Method::POST) => evaluate(state, params, key).await,
        ("/services", Method::GET) => super::services::job_services(&state, &params, key).await,
        ("/versions", Method::GET) => versions(&state, &params, key).await,
        ("/revert", Method::PUT | Method::POST) => revert(state, params, key, body).await,
        ("/stable", Method::PUT | Method::POST) => stable(state, params, key, body).await,
        ("/plan", Method::PUT | Method::POST) => super::job_plan::plan(state, &access, params, id, body).await,
        ("/deployments", Method::GET) => super::deployments::job_deployments(&state, &params, key).await,
        ("/periodic/force", Method::PUT | Method::POST) => periodic_force(state, params, key).await,
        ("/dispatch", Method::PUT | Method::POST) => dispatch(state, params, key, body).await,
        (suffix, _) if NOT_IMPLEMENTED.contains(&suffix) => {
            Err(ApiError::NotImplemented(format!("/v1/job/<id>{suffix} is not implemented by Drover yet (job {id:?})")))
        }
        _ => Err(ApiError::MethodNotAllowed),
    }
}

/// The sub-paths of [`JOB_SUFFIXES`](crate::api::jobs::JOB_SUFFIXES) Drover does not serve yet (501).
const NOT_IMPLEMENTED: [&str; 3] = ["/submission", "/actions", "/action"];

fn find<'a>(snapshot: &'a Snapshot, key: &JobKey) -> Result<&'a Arc<Job>, ApiError> {
    snapshot.job(key).ok_or_else(|| ApiError::NotFound("job not found".to_string()))
}

async fn read(state: &ApiState, params: &Params, key: JobKey) -> Result<Reply, ApiError> {
    let index = |snapshot: &Snapshot| Ok(find(snapshot, &key)?.modify_index);
    blocking(state, params, index, |snapshot| Ok(nomad::job(find(snapshot, &key)?, snapshot))).await
}

async fn allocations(state: &ApiState, params: &Params, key: JobKey) -> Result<Reply, ApiError> {
    // `all` (older versions of the job too) is how Drover always answers:
    // it keeps allocations of every version. A bad value means false, as in Nomad.
    blocking(
        state,
        params,
        |snapshot| Ok(snapshot.table_indexes().allocs),
        |snapshot| {
            let mut allocs: Vec<_> = snapshot.allocs_by_job(&key).collect();
            allocs.sort_by_key(|alloc| std::cmp::Reverse(alloc.create_index));
            Ok(allocs.iter().map(|alloc| nomad::alloc_stub(alloc, snapshot)).collect::<Vec<_>>())
        },
    )
    .await
}

async fn evaluations(state: &ApiState, params: &Params, key: JobKey) -> Result<Reply, ApiError> {
    blocking(
        state,
        params,
        |snapshot| Ok(snapshot.table_indexes().evals),
        |snapshot| {
            let mut evals: Vec<_> = snapshot.evals_by_job(&key).collect();
            evals.sort_by_key(|eval| std::cmp::Reverse(eval.create_index));
            Ok(evals.iter().map(|eval| Evaluation::from(&***eval)).collect::<Vec<_>>())
        },
    )
    .await
}

async fn summary(state: &ApiState, params: &Params, key: JobKey) -> Result<Reply, ApiError> {
    let index = |snapshot: &Snapshot| Ok(snapshot.table_indexes().allocs.max(find(snapshot, &key)?.modify_index));
    blocking(state, params, index, |snapshot| Ok(nomad::job_summary(find(snapshot, &key)?, snapshot))).await
}

async fn scale_status(state: &ApiState, params: &Params, key: JobKey) -> Result<Reply, ApiError> {
    let index = |snapshot: &Snapshot| Ok(find(snapshot, &key)?.modify_index);
    blocking(state, params, index, |snapshot| {
        let job = find(snapshot, &key)?;
        let counts = nomad::summary_counts(job, snapshot);
        let task_groups = job
            .task_groups
            .iter()
            .map(|group| {
                let running = counts.get(&group.name).map_or(0, |counts| counts.running);
                let status = TaskGroupScaleStatus {
                    desired: u64::from(group.count),
                    placed: running,
                    running,
                    healthy: running,
                    unhealthy: 0,
                    events: None,
                };
                (group.name.clone(), status)
            })
            .collect();
        Ok(JobScaleStatusResponse {
            job_id: job.id.to_string(),
            namespace: job.namespace.to_string(),
            job_create_index: job.create_index,
            job_modify_index: job.job_modify_index,
            job_stopped: job.stop,
            task_groups,
        })
    })
    .await
}

/// `GET /v1/job/<id>/versions`: the kept versions, newest first, each as
/// `GET /v1/job/<id>` answers the job (404 `job versions not found` when
/// none are kept). With `?diffs=true`, `Diffs[i]` is the diff from
/// version `i + 1` of the list to version `i` (`api::job_diff`), as Nomad.
async fn versions(state: &ApiState, params: &Params, key: JobKey) -> Result<Reply, ApiError> {
    let diffs = match params.get("diffs") {
        None | Some("") => false,
        // As Nomad, a bad value is a 500 naming it.
        Some(text) => crate::api::format::parse_bool(text)
            .ok_or_else(|| ApiError::Internal(format!("Failed to parse value of \"diffs\" ({text:?}) as a bool")))?,
    };
    blocking(
        state,
        params,
        |snapshot| Ok(snapshot.table_indexes().jobs),
        |snapshot| {
            let versions: Vec<_> = snapshot.job_versions(&key).map(|job| nomad::job(job, snapshot)).collect();
            if versions.is_empty() {
                return Err(ApiError::NotFound("job versions not found".to_string()));
            }
            let diffs = diffs.then(|| {
                versions.windows(2).filter_map(|pair| job_diff::job_diff(Some(&pair[1]), Some(&pair[0]))).collect()
            });
            Ok(JobVersionsResponse { versions, diffs, meta: WriteMeta::at(snapshot.table_indexes().jobs) })
        },
    )
    .await
}

/// A revert's or a stability change's body, whose `JobID` must be the path's.
fn job_body<T: serde::de::DeserializeOwned>(
    body: &Bytes,
    path_id: &str,
    body_id: impl Fn(&T) -> &str,
) -> Result<T, ApiError> {
    if body.is_empty() {
        return Err(ApiError::BadRequest("Request body is empty".to_string()));
    }
    let request: T = serde_json::from_slice(body).map_err(|error| ApiError::BadRequest(error.to_string()))?;
    if body_id(&request) != path_id {
        return Err(ApiError::BadRequest("Job ID does not match".to_string()));
    }
    Ok(request)
}

/// `PUT|POST /v1/job/<id>/revert`: the kept version registered again as
/// a new version, with its eval (Nomad's `JobRegisterResponse`). Refusals
/// are Nomad's RPC errors, 500 with its words.
async fn revert(state: ApiState, params: Params, key: JobKey, body: Bytes) -> Result<Reply, ApiError> {
    let request: JobRevertRequest = job_body(&body, &key.id, |request: &JobRevertRequest| &request.job_id)?;
    let engine = state.leader()?;
    let target = key.clone();
    let reverted =
        on_engine(move || engine.jobs().revert(&target, request.job_version, request.enforce_prior_version)).await?;
    let written = reverted.map_err(|error| match error {
        JobError::UnknownJob(_) => ApiError::Internal(format!("job {:?} not found", key.id)),
        other => register_error(other),
    })?;
    Ok(write_reply(&written, written.job_modify_index, &[], params.pretty()))
}

/// `PUT|POST /v1/job/<id>/stable`: marks a kept version stable or not;
/// `{"Index": n}`. An unknown version is Nomad's RPC error, 500.
async fn stable(state: ApiState, params: Params, key: JobKey, body: Bytes) -> Result<Reply, ApiError> {
    let request: JobStabilityRequest = job_body(&body, &key.id, |request: &JobStabilityRequest| &request.job_id)?;
    let engine = state.leader()?;
    let index = on_engine(move || engine.jobs().set_stability(&key, request.job_version, request.stable))
        .await?
        .map_err(|error| match error {
            JobError::State(state) => ApiError::from(state),
            other => ApiError::Internal(other.to_string()),
        })?;
    Ok(Reply::json(&JobStabilityResponse { index }, params.pretty(), Some(index)))
}

/// The answer to a job write, as Nomad's `JobRegisterResponse`.
fn write_reply(written: &JobWriteResponse, job_modify_index: u64, warnings: &[String], pretty: bool) -> Reply {
    let body = JobRegisterResponse {
        eval_id: id_or_empty(written.eval_id),
        eval_create_index: if written.eval_id.is_some() { written.index } else { 0 },
        job_modify_index,
        warnings: warnings.join("\n"),
        meta: WriteMeta::at(written.index),
    };
    Reply::json(&body, pretty, Some(written.index))
}

/// Registers the job of a `PUT /v1/jobs` or `/v1/job/<id>`, if the
/// caller's token may submit jobs in its namespace.
async fn register_job(
    state: ApiState,
    access: &Access,
    params: Params,
    body: Bytes,
    path_id: Option<String>,
) -> Result<Reply, ApiError> {
    if body.is_empty() {
        return Err(ApiError::BadRequest("Request body is empty".to_string()));
    }
    let request: JobRegisterRequest =
        serde_json::from_slice(&body).map_err(|error| ApiError::BadRequest(error.to_string()))?;
    let spec = request.job.ok_or_else(|| ApiError::BadRequest("Job must be specified".to_string()))?;
    let query_namespace = params.get("namespace").or(request.namespace.as_deref().filter(|ns| !ns.is_empty()));
    let converted =
        job_spec::convert_job(spec, query_namespace).map_err(|refused| ApiError::BadRequest(refused.to_string()))?;
    if let Some(path_id) = path_id {
        if *converted.job.id != *path_id {
            return Err(ApiError::BadRequest("Job ID does not match name".to_string()));
        }
    }
    access.check(&converted.job.namespace, Capabilities::SUBMIT_JOB)?;
    let key = converted.job.key();
    if request.enforce_index.unwrap_or(false) {
        enforce_index(&state.leadership.store().snapshot(), &key, request.job_modify_index.unwrap_or(0))?;
    }
    let engine = state.leader()?;
    let job = converted.job;
    let written = on_engine(move || engine.jobs().register(job)).await?.map_err(register_error)?;
    let job_modify_index = written.job_modify_index;
    for warning in &converted.warnings {
        tracing::info!(job = %key, %warning, "job registered with a field Drover ignores");
    }
    Ok(write_reply(&written, job_modify_index, &converted.warnings, params.pretty()))
}

/// `job run -check-index`: Nomad's messages, which the CLI looks for.
fn enforce_index(snapshot: &Snapshot, key: &JobKey, wanted: u64) -> Result<(), ApiError> {
    let message = match snapshot.job(key).map(|job| job.job_modify_index) {
        Some(index) if index == wanted => return Ok(()),
        None if wanted == 0 => return Ok(()),
        Some(_) if wanted == 0 => "Enforcing job modify index 0: job already exists".to_string(),
        Some(index) => {
            format!("Enforcing job modify index {wanted}: job exists with conflicting job modify index: {index}")
        }
        None => format!("Enforcing job modify index {wanted}: job does not exist"),
    };
    Err(ApiError::BadRequest(message))
}

async fn deregister(state: ApiState, params: Params, key: JobKey) -> Result<Reply, ApiError> {
    let purge = params.flag("purge")?;
    params.flag("global")?;
    let engine = state.leader()?;
    let lookup = key.clone();
    match on_engine(move || engine.jobs().deregister(&lookup, purge)).await? {
        Ok(written) => {
            let body = JobDeregisterResponse {
                eval_id: id_or_empty(written.eval_id),
                eval_create_index: if written.eval_id.is_some() { written.index } else { 0 },
                job_modify_index: written.index,
                meta: WriteMeta::at(written.index),
                ..JobDeregisterResponse::default()
            };
            Ok(Reply::json(&body, params.pretty(), Some(written.index)))
        }
        // As Nomad 1.6: stopping a job that does not exist changes nothing.
        Err(JobError::UnknownJob(_)) => {
            let index = state.leadership.store().latest_index();
            let body = JobDeregisterResponse { meta: WriteMeta::at(index), ..JobDeregisterResponse::default() };
            Ok(Reply::json(&body, params.pretty(), Some(index)))
        }
        Err(error) => Err(error.into()),
    }
}

async fn scale(state: ApiState, params: Params, key: JobKey, body: Bytes) -> Result<Reply, ApiError> {
    if body.is_empty() {
        return Err(ApiError::BadRequest("Request body is empty".to_string()));
    }
    let request: ScalingRequest =
        serde_json::from_slice(&body).map_err(|error| ApiError::BadRequest(error.to_string()))?;
    let group = request
        .target
        .as_ref()
        .and_then(|target| target.get("Group").cloned())
        .ok_or_else(|| ApiError::BadRequest("missing task group name for scaling action".to_string()))?;
    let count = request.count.ok_or_else(|| ApiError::BadRequest("scaling action needs a Count".to_string()))?;
    let count = u32::try_from(count).map_err(|_| ApiError::BadRequest(format!("Count {count} is invalid")))?;
    if let Some(message) = request.message.filter(|message| !message.is_empty()) {
        tracing::info!(job = %key, %group, count, %message, "scaling");
    }
    let engine = state.leader()?;
    let target = key.clone();
    let written = on_engine(move || engine.jobs().scale(&target, &group, count)).await??;
    Ok(write_reply(&written, written.index, &[], params.pretty()))
}

/// `PUT|POST /v1/job/<id>/periodic/force` (no body): Nomad's
/// `PeriodicForceResponse`.
async fn periodic_force(state: ApiState, params: Params, key: JobKey) -> Result<Reply, ApiError> {
    let engine = state.leader()?;
    let written = on_engine(move || engine.jobs().periodic_force(&key)).await??;
    let body = PeriodicForceResponse {
        eval_id: id_or_empty(written.eval_id),
        eval_create_index: written.eval_create_index,
        meta: WriteMeta::at(written.index),
    };
    Ok(Reply::json(&body, params.pretty(), Some(written.index)))
}

/// `PUT|POST /v1/job/<id>/dispatch[?idempotency_token=]`, body
/// `{"Payload": base64, "Meta": {...}}` (a `JobID`, when given, must be
/// the path's): Nomad's `JobDispatchResponse`.
async fn dispatch(state: ApiState, params: Params, key: JobKey, body: Bytes) -> Result<Reply, ApiError> {
    let request: JobDispatchRequest = match body.is_empty() {
        true => JobDispatchRequest::default(),
        false => serde_json::from_slice(&body).map_err(|error| ApiError::BadRequest(error.to_string()))?,
    };
    if !request.job_id.is_empty() && request.job_id != *key.id {
        return Err(ApiError::BadRequest("Job ID does not match".to_string()));
    }
    let payload = match request.payload.as_deref().filter(|payload| !payload.is_empty()) {
        Some(encoded) => BASE64
            .decode(encoded)
            .map_err(|error| ApiError::BadRequest(format!("Payload is not valid base64: {error}")))?,
        None => Vec::new(),
    };
    let token = params.get("idempotency_token").map(str::to_string).or(request.idempotency_token);
    let request = DispatchRequest {
        payload,
        meta: request.meta.unwrap_or_default(),
        idempotency_token: token.unwrap_or_default(),
        id_prefix_template: request.id_prefix_template.unwrap_or_default(),
    };
    let engine = state.leader()?;
    let written = on_engine(move || engine.jobs().dispatch(&key, request)).await??;
    let body = JobDispatchResponse {
        dispatched_job_id: written.child.id.to_string(),
        eval_id: id_or_empty(written.eval_id),
        eval_create_index: written.eval_create_index,
        job_create_index: written.job_create_index,
        meta: WriteMeta::at(written.index),
    };
    Ok(Reply::json(&body, params.pretty(), Some(written.index)))
}

async fn evaluate(state: ApiState, params: Params, key: JobKey) -> Result<Reply, ApiError> {
    let engine = state.leader()?;
    let written = on_engine(move || engine.jobs().evaluate(&key)).await??;
    Ok(write_reply(&written, written.index, &[], params.pretty()))
}
