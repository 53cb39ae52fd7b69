//! Deployments (Nomad's `/v1/deployments` and `/v1/deployment/...`), and a
//! job's (`/v1/job/<id>/deployments` and `/deployment`, routed by
//! `jobs.rs`, answered by [`job_deployments`] and [`job_deployment`]).
//!
//! Reads answer from the snapshot's deployments table (`engine/src/state/
//! deployments.rs`) and block on its index. Writes go through the engine's
//! `DeploymentEndpoint`, on the leader (`forward.rs` relays them there).
//! Nomad's answers kept:
//! 1. `GET /v1/deployment/<id>` takes a full id only (the CLI resolves
//!    prefixes through `/v1/deployments?prefix=`): 404 `deployment not
//!    found` otherwise. A write naming an unknown deployment is Nomad's RPC
//!    error, 500 `deployment not found`.
//! 2. The bodies of pause, promote and allocation-health must carry the
//!    path's id (400 `DeploymentID must be specified`, 400 `Deployment ID
//!    does not match`); fail ignores its body. Keys match without regard to
//!    case, as Go's decoder does (python-nomad sends
//!    `UnHealthyAllocationIDs`).
//! 3. The engine's refusals (`can't pause terminal deployment`, `Task
//!    group "web" has 0/1 healthy allocations`, ...) are 500 with their
//!    words.
//! 4. Lists are newest first (the order Nomad's api client sorts them
//!    into); `[]` when empty; a job's latest deployment is `null` when it
//!    has none.
//!
//! ACL: reads need namespace `read` (Nomad's `read-job`), writes `write`
//! (`submit-job`); `acl.rs` checks both by method.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::{any, get, post};
use axum::Router;
use engine::deployment::endpoint::{DeploymentError, DeploymentUpdateResponse};
use engine::state::{Snapshot, StateError};
use engine::structs::{AllocId, Capabilities, Deployment, DeploymentId, JobKey};

use super::access::Access;
use super::error::ApiError;
use super::nomad;
use super::paging::{NewestFirst, PageQuery};
use super::query::{blocking, blocking_reply, exact_uuid, matches_uuid_prefix, Params, Reply};
use super::ApiState;
use crate::api::deployments::{
    self as api, read_body, DeploymentAllocHealthRequest, DeploymentPauseRequest, DeploymentPromoteRequest,
};

/// The routes of this file.
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/deployments", get(list))
        .route("/v1/deployment/{id}", get(read))
        .route("/v1/deployment/allocations/{id}", get(allocations))
        .route("/v1/deployment/fail/{id}", post(fail).put(fail))
        .route("/v1/deployment/pause/{id}", post(pause).put(pause))
        .route("/v1/deployment/promote/{id}", post(promote).put(promote))
        .route("/v1/deployment/allocation-health/{id}", post(alloc_health).put(alloc_health))
        .route("/v1/deployment/unblock/{id}", any(unblock))
}

/// The deployments table's index: what the lists report and block on.
fn deployments_index(snapshot: &Snapshot) -> Result<u64, ApiError> {
    Ok(snapshot.table_indexes().deployments)
}

/// Deployments as answered, newest first.
fn newest_first<'a>(deployments: impl Iterator<Item = &'a Arc<Deployment>>) -> Vec<api::Deployment> {
    let mut listed: Vec<&Arc<Deployment>> = deployments.collect();
    listed.sort_by_key(|deployment| (std::cmp::Reverse(deployment.create_index), deployment.id));
    listed.into_iter().map(|deployment| api::Deployment::from(&**deployment)).collect()
}

/// `GET /v1/deployments[?prefix=&namespace=]`: newest first;
/// `namespace=*` lists every namespace; a prefix matches ids as Nomad
/// matches them (hyphens and case ignored); pages and filters as every
/// list (`paging.rs`).
async fn list(
    State(state): State<ApiState>,
    axum::Extension(access): axum::Extension<Access>,
    params: Params,
) -> Result<Reply, ApiError> {
    let scope = access.scope(params.namespace(), Capabilities::READ_JOB);
    let prefix = params.prefix().to_string();
    let query = PageQuery::of(&params)?;
    blocking_reply(&state, &params, deployments_index, |snapshot| {
        let matching: Vec<_> = snapshot
            .deployments()
            .filter(|deployment| scope.admits(&deployment.namespace))
            .filter(|deployment| matches_uuid_prefix(&deployment.id.0, &prefix))
            .collect();
        let key = |deployment: &&Arc<Deployment>| NewestFirst::of(deployment.create_index, deployment.id.0);
        let (page, next_token) = query.page(matching, key, |deployment| api::Deployment::from(&***deployment))?;
        Ok(Reply::json(&page, params.pretty(), deployments_index(snapshot).ok()).with_next_token(next_token))
    })
    .await
}

/// The deployment a read's path names, or 404 `deployment not found`.
fn find(snapshot: &Snapshot, id: DeploymentId) -> Result<&Arc<Deployment>, ApiError> {
    snapshot.deployment(id).ok_or_else(|| ApiError::NotFound("deployment not found".to_string()))
}

/// `GET /v1/deployment/<id>`: blocks on the deployment's modify index.
async fn read(State(state): State<ApiState>, Path(id): Path<String>, params: Params) -> Result<Reply, ApiError> {
    let id = DeploymentId(exact_uuid(&id, "deployment")?);
    blocking(
        &state,
        &params,
        |snapshot| Ok(find(snapshot, id)?.modify_index),
        |snapshot| Ok(api::Deployment::from(&**find(snapshot, id)?)),
    )
    .await
}

/// `GET /v1/deployment/allocations/<id>`: the allocations placed in the
/// deployment, newest first, as `/v1/allocations` lists them; `[]` for an
/// unknown deployment, as Nomad.
async fn allocations(State(state): State<ApiState>, Path(id): Path<String>, params: Params) -> Result<Reply, ApiError> {
    let id = DeploymentId(exact_uuid(&id, "deployment")?);
    blocking(
        &state,
        &params,
        |snapshot| Ok(snapshot.table_indexes().allocs),
        |snapshot| {
            let Some(deployment) = snapshot.deployment(id) else { return Ok(Vec::new()) };
            let mut allocs: Vec<_> =
                snapshot.allocs_by_job(&deployment.job_key()).filter(|alloc| alloc.deployment_id == Some(id)).collect();
            allocs.sort_by_key(|alloc| (std::cmp::Reverse(alloc.create_index), alloc.id));
            Ok(allocs.iter().map(|alloc| nomad::alloc_stub(alloc, snapshot)).collect::<Vec<_>>())
        },
    )
    .await
}

/// `GET /v1/job/<id>/deployments[?all=true]`: the job's deployments, newest
/// first; without `all`, only those of the job as registered now (not of an
/// earlier job of the same id, purged), so none when the job is gone.
pub async fn job_deployments(state: &ApiState, params: &Params, key: JobKey) -> Result<Reply, ApiError> {
    let all = params.flag("all")?;
    blocking(state, params, job_index, |snapshot| {
        let create_index = snapshot.job(&key).map(|job| job.create_index);
        let current = |deployment: &&Arc<Deployment>| all || Some(deployment.job_create_index) == create_index;
        Ok(newest_first(snapshot.deployments_by_job(&key).filter(current)))
    })
    .await
}

/// `GET /v1/job/<id>/deployment`: the newest deployment of the job as
/// registered now, `null` when it has none.
pub async fn job_deployment(state: &ApiState, params: &Params, key: JobKey) -> Result<Reply, ApiError> {
    blocking(state, params, job_index, |snapshot| {
        let Some(job) = snapshot.job(&key) else { return Ok(None) };
        let latest = snapshot
            .deployments_by_job(&key)
            .filter(|deployment| deployment.job_create_index == job.create_index)
            .max_by_key(|deployment| deployment.create_index);
        Ok(latest.map(|deployment| api::Deployment::from(&**deployment)))
    })
    .await
}

/// What a job's deployments depend on: the deployments, and the job (a
/// purge or a new registration changes which are current).
fn job_index(snapshot: &Snapshot) -> Result<u64, ApiError> {
    Ok(snapshot.table_indexes().deployments.max(snapshot.table_indexes().jobs))
}

/// A write's path id: a full UUID, else Nomad's RPC error for an unknown
/// deployment (500).
fn write_id(id: &str) -> Result<DeploymentId, ApiError> {
    id.parse().map_err(|_| ApiError::Internal("deployment not found".to_string()))
}

/// A write body's `DeploymentID`, which must be the path's (module docs, 2).
fn check_body_id(body_id: Option<&str>, path_id: &str) -> Result<(), ApiError> {
    match body_id {
        None | Some("") => Err(ApiError::BadRequest("DeploymentID must be specified".to_string())),
        Some(body_id) if body_id != path_id => Err(ApiError::BadRequest("Deployment ID does not match".to_string())),
        Some(_) => Ok(()),
    }
}

/// A write's body read as Nomad reads it: 400 when empty or malformed.
fn body_of<T: serde::de::DeserializeOwned + Default>(body: &Bytes, names: &[&str]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadRequest("Request body is empty".to_string()));
    }
    read_body(body, names).map_err(|error| ApiError::BadRequest(error.to_string()))
}

/// `PUT|POST /v1/deployment/fail/<id>`: fails the deployment (reverting
/// the job when a group auto-reverts); the body is not read, as Nomad.
async fn fail(State(state): State<ApiState>, Path(id): Path<String>, params: Params) -> Result<Reply, ApiError> {
    let id = write_id(&id)?;
    let engine = state.leader()?;
    write(&params, move || engine.deployments().fail(id)).await
}

/// `PUT|POST /v1/deployment/pause/<id>`: `{"DeploymentID", "Pause"}`;
/// pausing makes no eval (`EvalID` is `""`), resuming makes one.
async fn pause(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    params: Params,
    body: Bytes,
) -> Result<Reply, ApiError> {
    let request: DeploymentPauseRequest = body_of(&body, &["DeploymentID", "Pause"])?;
    check_body_id(request.deployment_id.as_deref(), &id)?;
    let id = write_id(&id)?;
    let engine = state.leader()?;
    write(&params, move || engine.deployments().pause(id, request.pause)).await
}

/// `PUT|POST /v1/deployment/promote/<id>`: `{"DeploymentID", "All",
/// "Groups"}`; `All` promotes every group's canaries, else the named
/// groups'. Naming none is refused: Drover's engine reads no groups as all.
async fn promote(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    params: Params,
    body: Bytes,
) -> Result<Reply, ApiError> {
    let request: DeploymentPromoteRequest = body_of(&body, &["DeploymentID", "All", "Groups"])?;
    check_body_id(request.deployment_id.as_deref(), &id)?;
    let id = write_id(&id)?;
    let groups = match (request.all, request.groups.unwrap_or_default()) {
        (true, _) => Vec::new(),
        (false, groups) if !groups.is_empty() => groups,
        (false, _) => {
            let refused = "no task groups to promote: set All, or name the groups in Groups";
            return Err(ApiError::Internal(refused.to_string()));
        }
    };
    let engine = state.leader()?;
    write(&params, move || engine.deployments().promote(id, groups)).await
}

/// `PUT|POST /v1/deployment/allocation-health/<id>`: `{"DeploymentID",
/// "HealthyAllocationIDs", "UnhealthyAllocationIDs"}`; an unhealthy
/// allocation fails the deployment.
async fn alloc_health(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    params: Params,
    body: Bytes,
) -> Result<Reply, ApiError> {
    let names = ["DeploymentID", "HealthyAllocationIDs", "UnhealthyAllocationIDs"];
    let request: DeploymentAllocHealthRequest = body_of(&body, &names)?;
    check_body_id(request.deployment_id.as_deref(), &id)?;
    let id = write_id(&id)?;
    let healthy = alloc_ids(request.healthy_allocation_ids.unwrap_or_default())?;
    let unhealthy = alloc_ids(request.unhealthy_allocation_ids.unwrap_or_default())?;
    let engine = state.leader()?;
    write(&params, move || engine.deployments().set_alloc_health(id, healthy, unhealthy)).await
}

/// Allocation ids from a body; one that is not a UUID names no allocation.
fn alloc_ids(texts: Vec<String>) -> Result<Vec<AllocId>, ApiError> {
    texts.iter().map(|text| text.parse().map_err(|_| unknown_alloc(text))).collect()
}

/// Nomad's words for an allocation the state does not have.
fn unknown_alloc(id: &str) -> ApiError {
    ApiError::Internal(format!("unknown alloc {id:?}"))
}

/// `/v1/deployment/unblock/<id>`: multiregion deployments only, which
/// Drover (one region) does not have.
async fn unblock() -> ApiError {
    ApiError::NotImplemented(
        "/v1/deployment/unblock/<id> is not implemented by Drover (multiregion deployments)".into(),
    )
}

/// Runs a deployment write on the blocking pool and answers Nomad's
/// `DeploymentUpdateResponse`, or its refusal (module docs, 3).
async fn write(
    params: &Params,
    call: impl FnOnce() -> Result<DeploymentUpdateResponse, DeploymentError> + Send + 'static,
) -> Result<Reply, ApiError> {
    let written = tokio::task::spawn_blocking(call)
        .await
        .map_err(|error| ApiError::Internal(format!("engine call failed: {error}")))?
        .map_err(refusal)?;
    let answer = api::DeploymentUpdateResponse::from(&written);
    Ok(Reply::json(&answer, params.pretty(), Some(written.index)))
}

/// A deployment write's refusal as Nomad answers it: its RPC errors are 500.
fn refusal(error: DeploymentError) -> ApiError {
    match error {
        DeploymentError::State(StateError::UnknownAlloc(alloc_id)) => unknown_alloc(&alloc_id.to_string()),
        DeploymentError::State(StateError::UnknownDeployment(_)) | DeploymentError::UnknownDeployment(_) => {
            ApiError::Internal("deployment not found".to_string())
        }
        DeploymentError::State(state) => ApiError::from(state),
        other => ApiError::Internal(other.to_string()),
    }
}
