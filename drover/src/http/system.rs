//! `PUT /v1/system/gc` and `PUT /v1/system/reconcile/summaries` (Nomad's
//! system endpoints): PUT only (POST answers 405, as Nomad's), a
//! management token when ACLs are on, 200 with an empty body.
//!
//! Nomad enqueues its forced collection and answers at once; Drover runs
//! it on the leader before answering (a follower forwards the request),
//! so what the answer follows is already deleted.

use axum::extract::State;
use axum::routing::put;
use axum::Router;

use super::error::ApiError;
use super::{on_engine, ApiState};

/// The routes of this file.
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/system/gc", put(garbage_collect))
        .route("/v1/system/reconcile/summaries", put(reconcile_summaries))
}

/// `PUT /v1/system/gc`: collects everything eligible now (`engine::gc`).
async fn garbage_collect(State(state): State<ApiState>) -> Result<(), ApiError> {
    let leader = state.leader()?;
    let collected = on_engine(move || leader.gc().force()).await??;
    tracing::info!(?collected, "forced garbage collection");
    Ok(())
}

/// `PUT /v1/system/reconcile/summaries`: Drover keeps no job summaries to
/// drift: every summary it answers (`/v1/job/:id/summary`, the job list's)
/// is counted from the job's allocations when asked, so there is nothing
/// to reconcile and the request only checks that a leader answers.
async fn reconcile_summaries(State(state): State<ApiState>) -> Result<(), ApiError> {
    state.leader()?;
    Ok(())
}
