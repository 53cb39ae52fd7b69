//! `/v1/evaluations` and `/v1/evaluation/<id>[/allocations]`.
//!
//! The list takes `?prefix=`, `?filter=` (`filter.rs`) and pages with
//! `?per_page=` and `?next_token=` (Nomad 1.3+): newest first, a page's
//! `X-Nomad-NextToken` is `<CreateIndex>.<ID>` of the first evaluation of
//! the next page, and the page it names starts there.
//!
//! `DELETE /v1/evaluations` (Nomad 1.4+'s backlog tool) deletes the
//! evaluations named by `EvalIDs`, or matched by `Filter`, through the
//! log; only while the eval broker is paused (the scheduler
//! configuration's `PauseEvalBroker`), else 400 with Nomad's message.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::get;
use axum::Extension;
use axum::Router;
use std::sync::Arc;

use engine::state::{Command, Snapshot, StateError};
use engine::structs::{Capabilities, EvalId, Evaluation};

use super::access::Access;

use super::error::ApiError;
use super::filter::Filter;
use super::nomad;
use super::paging::{NewestFirst, PageQuery};
use super::query::{blocking, blocking_reply, exact_uuid, matches_uuid_prefix, Params, Reply};
use super::{on_engine, ApiState};
use crate::api;
use crate::api::evaluations::{EvalDeleteRequest, EvalDeleteResponse};

/// The most evaluations one delete command carries: a filter matching a
/// million is deleted in commands of this many.
const DELETE_BATCH: usize = 10_000;

/// The routes of this file.
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/evaluations", get(list).delete(delete))
        .route("/v1/evaluation/{id}", get(read))
        .route("/v1/evaluation/{id}/allocations", get(allocations))
}

/// `GET /v1/evaluations[?prefix=][&filter=][&per_page=][&next_token=]`:
/// of the namespace named (`*`: all) as the caller's token may read them, newest first (module docs, `paging.rs`).
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
        |snapshot| Ok(snapshot.table_indexes().evals),
        |snapshot| {
            let evals: Vec<_> = snapshot
                .evals()
                .filter(|eval| scope.admits(&eval.namespace) && matches_uuid_prefix(&eval.id.0, &prefix))
                .collect();
            let (page, next_token) =
                query.page(evals, |eval| key(eval), |eval| api::evaluations::Evaluation::from(&***eval))?;
            let index = snapshot.table_indexes().evals;
            Ok(Reply::json(&page, params.pretty(), Some(index)).with_next_token(next_token))
        },
    )
    .await
}

/// The list's order: newest first, then by id.
fn key(eval: &Evaluation) -> NewestFirst {
    NewestFirst::of(eval.create_index, eval.id.0)
}

/// `DELETE /v1/evaluations` (module docs).
async fn delete(State(state): State<ApiState>, params: Params, body: Bytes) -> Result<Reply, ApiError> {
    let request: EvalDeleteRequest =
        serde_json::from_slice(&body).map_err(|error| ApiError::BadRequest(format!("Invalid request: {error}")))?;
    let ids = match (request.eval_ids.is_empty(), request.filter.trim().is_empty()) {
        (false, false) => return Err(ApiError::BadRequest("evals cannot be deleted by both ID and filter".into())),
        (true, true) => return Err(ApiError::BadRequest("evals must be deleted by either ID or filter".into())),
        (false, true) => request
            .eval_ids
            .iter()
            .map(|id| uuid::Uuid::parse_str(id).map(EvalId))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| ApiError::BadRequest(format!("invalid eval id: {error}")))?,
        (true, false) => {
            let filter = Filter::parse(&request.filter)
                .map_err(|error| ApiError::BadRequest(format!("failed to read filter expression: {error}")))?;
            let snapshot = state.leadership.store().snapshot();
            let matches = |eval: &&Arc<Evaluation>| {
                let answered = serde_json::to_value(api::evaluations::Evaluation::from(&***eval));
                filter.matches(&answered.expect("an eval serializes"))
            };
            snapshot.evals().filter(matches).map(|eval| eval.id).collect()
        }
    };
    let writer = state.leader()?.writer().clone();
    let (index, count) = on_engine(move || -> Result<(u64, u64), StateError> {
        let (mut index, mut count) = (writer.store().latest_index(), 0);
        // Checked once before the first write, so a running broker refuses the whole delete.
        if !writer.store().snapshot().scheduler_config().is_some_and(|config| config.pause_eval_broker) {
            return Err(StateError::EvalBrokerNotPaused);
        }
        for batch in ids.chunks(DELETE_BATCH) {
            let applied = writer.write(Command::DeleteEvals { eval_ids: batch.to_vec() })?;
            index = applied.index;
            count += applied.deleted_evals.len() as u64;
        }
        Ok((index, count))
    })
    .await??;
    tracing::info!(count, "evaluations deleted by an operator");
    Ok(Reply::json(&EvalDeleteResponse { count, index }, params.pretty(), Some(index)))
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
