//! `/v1/allocations`, `/v1/allocation/<id>` and `/v1/allocation/<id>/stop`.

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::Extension;
use axum::Router;
use std::sync::Arc;

use engine::state::Snapshot;
use engine::structs::{AllocId, Allocation, Capabilities};

use super::access::Access;

use super::error::ApiError;
use super::nomad;
use super::paging::{NewestFirst, PageQuery};
use super::query::{blocking, blocking_reply, exact_uuid, matches_uuid_prefix, Params, Reply};
use super::ApiState;

/// The routes of this file.
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/allocations", get(list))
        .route("/v1/allocation/{id}", get(read))
        .route("/v1/allocation/{id}/stop", post(stop).put(stop))
}

/// `GET /v1/allocations[?prefix=&namespace=]`: newest first; `namespace=*`
/// lists every namespace, no namespace means `default`; pages and filters
/// as every list (`paging.rs`).
async fn list(
    State(state): State<ApiState>,
    Extension(access): Extension<Access>,
    params: Params,
) -> Result<Reply, ApiError> {
    let prefix = params.prefix().to_string();
    let scope = access.scope(params.namespace(), Capabilities::READ_JOB);
    let query = PageQuery::of(&params)?;
    blocking_reply(
        &state,
        &params,
        |snapshot| Ok(snapshot.table_indexes().allocs),
        |snapshot| {
            let allocs: Vec<_> = snapshot
                .allocs()
                .filter(|alloc| scope.admits(&alloc.namespace))
                .filter(|alloc| matches_uuid_prefix(&alloc.id.0, &prefix))
                .collect();
            let key = |alloc: &&Arc<Allocation>| NewestFirst::of(alloc.create_index, alloc.id.0);
            let (page, next_token) = query.page(allocs, key, |alloc| nomad::alloc_stub(alloc, snapshot))?;
            let index = snapshot.table_indexes().allocs;
            Ok(Reply::json(&page, params.pretty(), Some(index)).with_next_token(next_token))
        },
    )
    .await
}

/// `GET /v1/allocation/<id>`: 404 `alloc not found` for an unknown id.
async fn read(State(state): State<ApiState>, Path(id): Path<String>, params: Params) -> Result<Reply, ApiError> {
    let id = AllocId(exact_uuid(&id, "alloc")?);
    let find = |snapshot: &Snapshot| -> Result<Arc<Allocation>, ApiError> {
        snapshot.alloc(id).cloned().ok_or_else(|| ApiError::NotFound("alloc not found".to_string()))
    };
    blocking(
        &state,
        &params,
        |snapshot| Ok(find(snapshot)?.modify_index),
        |snapshot| Ok(nomad::alloc(&*find(snapshot)?, snapshot)),
    )
    .await
}

/// `PUT /v1/allocation/<id>/stop`: Nomad's `alloc stop`. The allocation is
/// marked desired `stop` and its job evaluated in one write, so its agent
/// stops it and a replacement is placed where the job's count asks for
/// one: `{"EvalID", "Index"}`. 404 `alloc not found` for an unknown id.
async fn stop(State(state): State<ApiState>, Path(id): Path<String>) -> Result<Reply, ApiError> {
    let id = AllocId(exact_uuid(&id, "alloc")?);
    let jobs = state.leader()?.jobs();
    let stopped = tokio::task::spawn_blocking(move || jobs.stop_alloc(id))
        .await
        .map_err(|error| ApiError::Internal(format!("engine call failed: {error}")))?;
    let (eval_id, index) = stopped?;
    let answer = crate::api::allocations::AllocStopResponse { eval_id: eval_id.to_string(), index };
    Ok(Reply::json(&answer, false, Some(index)))
}
