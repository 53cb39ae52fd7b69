//! `/v1/evaluations` and `/v1/evaluation/<id>[/allocations]`.

use axum::extract::{Path, State};
use axum::routing::get;
use axum::Router;
use std::sync::Arc;

use engine::state::Snapshot;
use engine::structs::{EvalId, Evaluation};

use super::error::ApiError;
use super::nomad;
use super::query::{blocking, exact_uuid, matches_uuid_prefix, Params, Reply};
use super::ApiState;
use crate::api;

/// The routes of this file.
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/evaluations", get(list))
        .route("/v1/evaluation/{id}", get(read))
        .route("/v1/evaluation/{id}/allocations", get(allocations))
}

/// `GET /v1/evaluations[?prefix=]`: every namespace, newest first.
async fn list(State(state): State<ApiState>, params: Params) -> Result<Reply, ApiError> {
    let prefix = params.prefix().to_string();
    blocking(
        &state,
        &params,
        |snapshot| Ok(snapshot.table_indexes().evals),
        |snapshot| {
            let mut evals: Vec<_> = snapshot.evals().filter(|eval| matches_uuid_prefix(&eval.id.0, &prefix)).collect();
            evals.sort_by_key(|eval| (std::cmp::Reverse(eval.create_index), eval.id));
            Ok(evals.iter().map(|eval| api::evaluations::Evaluation::from(&***eval)).collect::<Vec<_>>())
        },
    )
    .await
}

/// `GET /v1/evaluation/<id>`: 404 `eval not found` for an unknown id.
async fn read(State(state): State<ApiState>, Path(id): Path<String>, params: Params) -> Result<Reply, ApiError> {
    let id = EvalId(exact_uuid(&id, "eval")?);
    let find = |snapshot: &Snapshot| -> Result<Arc<Evaluation>, ApiError> {
        snapshot.eval(id).cloned().ok_or_else(|| ApiError::NotFound("eval not found".to_string()))
    };
    blocking(
        &state,
        &params,
        |snapshot| Ok(find(snapshot)?.modify_index),
        |snapshot| Ok(api::evaluations::Evaluation::from(&*find(snapshot)?)),
    )
    .await
}

/// `GET /v1/evaluation/<id>/allocations`: the allocations the eval placed or changed.
async fn allocations(State(state): State<ApiState>, Path(id): Path<String>, params: Params) -> Result<Reply, ApiError> {
    let id = EvalId(exact_uuid(&id, "eval")?);
    blocking(
        &state,
        &params,
        |snapshot| Ok(snapshot.table_indexes().allocs),
        |snapshot| {
            let stubs: Vec<_> = match snapshot.eval(id) {
                Some(eval) => snapshot
                    .allocs_by_job(&eval.job_key())
                    .filter(|alloc| alloc.eval_id == id)
                    .map(|alloc| nomad::alloc_stub(alloc, snapshot))
                    .collect(),
                None => Vec::new(),
            };
            Ok(stubs)
        },
    )
    .await
}
