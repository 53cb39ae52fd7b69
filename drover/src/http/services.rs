//! Nomad-native service discovery (Nomad 1.3+): `/v1/services`,
//! `/v1/service/<name>[/<id>]`, and the registrations of an allocation
//! (`/v1/allocation/<id>/services`) and of a job
//! (`/v1/job/<id>/services`, routed by `jobs.rs`, answered by
//! [`job_services`]).
//!
//! Every read blocks on the services table's index, so a query from the
//! index it last saw wakes when a registration is written or removed.
//! Reads need namespace `read` (Nomad's `read-job`), the delete namespace
//! `write` (Nomad's `submit-job`); `http/acl.rs` checks both by method.
//! Where Drover differs: `?choose=` (Nomad 1.3.2's rendezvous choice) is
//! refused with 400 naming it, never ignored; an unknown id on delete is a
//! 404 (Nomad answers 500 with the same message) because python-nomad and
//! Drover's API take 404 as "no such object".

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::Method;
use axum::routing::{any, get};
use axum::Router;
use engine::state::{Command, Snapshot, StateError};
use engine::structs::{AllocId, Capabilities, JobKey, ServiceRegistration};

use super::access::Access;
use super::error::ApiError;
use super::paging::{ByName, ByNamespacedId, PageQuery};
use super::query::{blocking, blocking_reply, exact_uuid, Params, Reply};
use super::ApiState;
use crate::api::allocations::CheckQueryResult;
use crate::api::services::{self as api, ServiceRegistrationListStub, ServiceRegistrationStub};

/// The routes of this file.
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/services", get(list))
        .route("/v1/service/", any(missing_name))
        .route("/v1/service/{*rest}", any(service))
        .route("/v1/allocation/{id}/services", get(alloc_services))
        .route("/v1/allocation/{id}/checks", get(alloc_checks))
        .route("/v1/client/allocation/{id}/checks", get(alloc_checks))
}

/// The services table's index: what every read here reports and blocks on.
fn services_index(snapshot: &Snapshot) -> Result<u64, ApiError> {
    Ok(snapshot.table_indexes().services)
}

/// Registrations as answered.
fn answer<'a>(registrations: impl Iterator<Item = &'a Arc<ServiceRegistration>>) -> Vec<api::ServiceRegistration> {
    registrations.map(|registration| api::ServiceRegistration::from(&**registration)).collect()
}

/// `GET /v1/services[?namespace=]`: per namespace (sorted), its service
/// names (sorted) with the union of their tags; `namespace=*` lists every
/// namespace; a namespace without services is left out, so none is `[]`.
/// Pages (of namespaces) and filters as every list (`paging.rs`).
async fn list(
    State(state): State<ApiState>,
    axum::Extension(access): axum::Extension<Access>,
    params: Params,
) -> Result<Reply, ApiError> {
    let scope = access.scope(params.namespace(), Capabilities::READ_JOB);
    let query = PageQuery::of(&params)?;
    blocking_reply(&state, &params, services_index, |snapshot| {
        let listed: Vec<_> = snapshot.service_names().into_iter().filter(|(of, _)| scope.admits(of)).collect();
        let stub = |(of, listings): &(Arc<str>, Vec<engine::state::ServiceListing>)| ServiceRegistrationListStub {
            namespace: of.to_string(),
            services: listings
                .iter()
                .map(|listing| ServiceRegistrationStub {
                    service_name: listing.service_name.clone(),
                    tags: listing.tags.clone(),
                })
                .collect(),
        };
        let (page, next_token) = query.page(listed, |(of, _)| ByName(of.to_string()), stub)?;
        Ok(Reply::json(&page, params.pretty(), services_index(snapshot).ok()).with_next_token(next_token))
    })
    .await
}

/// `/v1/service/` without a name: 400, as Nomad.
async fn missing_name() -> ApiError {
    ApiError::BadRequest("missing service name".to_string())
}

/// `/v1/service/<name>` (GET) and `/v1/service/<name>/<id>` (DELETE);
/// more segments are 400 `invalid URI`, another method 405, as Nomad.
async fn service(
    State(state): State<ApiState>,
    method: Method,
    axum::Extension(access): axum::Extension<Access>,
    Path(rest): Path<String>,
    params: Params,
) -> Result<Reply, ApiError> {
    let segments: Vec<&str> = rest.split('/').collect();
    match (segments.as_slice(), method) {
        ([""], _) => Err(missing_name().await),
        ([name], Method::GET) => read(&state, &params, &access, name).await,
        ([_name, id], Method::DELETE) if !id.is_empty() => delete(&state, &params, id).await,
        ([_] | [_, _], _) => Err(ApiError::MethodNotAllowed),
        _ => Err(ApiError::BadRequest("invalid URI".to_string())),
    }
}

/// `GET /v1/service/<name>[?tag=&namespace=]`: the service's
/// registrations sorted by id (by namespace, then id, with `*`), `[]` when
/// none; `?choose=` is refused (module docs).
async fn read(state: &ApiState, params: &Params, access: &Access, name: &str) -> Result<Reply, ApiError> {
    if params.get("choose").is_some() {
        let refused = "failed to choose services: the choose parameter is not supported by Drover";
        return Err(ApiError::BadRequest(refused.to_string()));
    }
    let namespace = params.namespace().to_string();
    let scope = access.scope(&namespace, Capabilities::READ_JOB);
    let tag = params.get("tag").filter(|tag| !tag.is_empty()).map(str::to_string);
    let query = PageQuery::of(params)?;
    blocking_reply(state, params, services_index, |snapshot| {
        let registrations: Vec<&Arc<ServiceRegistration>> = if namespace == "*" {
            let of_name = |registration: &&Arc<ServiceRegistration>| registration.service_name == name;
            let tagged = |registration: &&Arc<ServiceRegistration>| {
                tag.as_ref().is_none_or(|tag| registration.tags.contains(tag))
            };
            let readable = |registration: &&Arc<ServiceRegistration>| scope.admits(&registration.namespace);
            snapshot.service_registrations().filter(of_name).filter(tagged).filter(readable).collect()
        } else {
            snapshot.service_registrations_by_name(&namespace, name, tag.as_deref()).collect()
        };
        let key = |registration: &&Arc<ServiceRegistration>| {
            ByNamespacedId(registration.namespace.to_string(), registration.id.clone())
        };
        let (page, next_token) =
            query.page(registrations, key, |registration| api::ServiceRegistration::from(&***registration))?;
        Ok(Reply::json(&page, params.pretty(), services_index(snapshot).ok()).with_next_token(next_token))
    })
    .await
}

/// `DELETE /v1/service/<name>/<id>[?namespace=]`: removes the registration
/// `id` (by id alone, as Nomad; the name is not checked): `null` with the
/// write's index in `X-Nomad-Index`. An id the namespace does not hold is
/// 404 `service registration not found` and writes nothing.
async fn delete(state: &ApiState, params: &Params, id: &str) -> Result<Reply, ApiError> {
    let command = Command::DeleteServiceRegistration { namespace: params.namespace().to_string(), id: id.to_string() };
    let leader = state.leader()?;
    let written = tokio::task::spawn_blocking(move || leader.writer().write(command))
        .await
        .map_err(|error| ApiError::Internal(format!("engine call failed: {error}")))?;
    match written {
        Ok(applied) => Ok(Reply::json(&(), false, Some(applied.index))),
        Err(StateError::UnknownServiceRegistration { .. }) => {
            Err(ApiError::NotFound("service registration not found".to_string()))
        }
        Err(other) => Err(other.into()),
    }
}

/// `GET /v1/job/<id>/services[?namespace=]`: the job's registrations
/// sorted by id; 404 `job not found` for an unknown job, as Nomad.
pub async fn job_services(state: &ApiState, params: &Params, key: JobKey) -> Result<Reply, ApiError> {
    blocking(state, params, services_index, |snapshot| {
        snapshot.job(&key).ok_or_else(|| ApiError::NotFound("job not found".to_string()))?;
        Ok(answer(snapshot.service_registrations_by_job(&key)))
    })
    .await
}

/// `GET /v1/client/allocation/<id>/checks` (and `/v1/allocation/<id>/checks`):
/// its checks' latest results as its client reported them, keyed by check
/// id; `{}` without checks. Nomad asks the client; Drover's clients report
/// every change of status, so the servers answer, with blocking queries on
/// the allocations' index.
async fn alloc_checks(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    params: Params,
) -> Result<Reply, ApiError> {
    let id = AllocId(exact_uuid(&id, "alloc")?);
    let index = |snapshot: &Snapshot| Ok(snapshot.table_indexes().allocs);
    blocking(&state, &params, index, |snapshot| {
        let alloc = snapshot.alloc(id).ok_or_else(|| ApiError::NotFound("alloc not found".to_string()))?;
        let checks: std::collections::BTreeMap<String, CheckQueryResult> =
            alloc.checks.iter().map(|(id, result)| (id.clone(), CheckQueryResult::from(result))).collect();
        Ok(checks)
    })
    .await
}

/// `GET /v1/allocation/<id>/services`: the allocation's registrations
/// sorted by id; 404 `alloc not found` for an unknown allocation.
async fn alloc_services(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    params: Params,
) -> Result<Reply, ApiError> {
    let id = AllocId(exact_uuid(&id, "alloc")?);
    blocking(&state, &params, services_index, |snapshot| {
        snapshot.alloc(id).ok_or_else(|| ApiError::NotFound("alloc not found".to_string()))?;
        Ok(answer(snapshot.service_registrations_by_alloc(id)))
    })
    .await
}
