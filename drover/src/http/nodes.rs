//! `/v1/nodes` and `/v1/node/<id>[/allocations|/eligibility|/purge]`.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;

use super::error::ApiError;
use super::nomad;
use super::query::{blocking, exact_uuid, matches_uuid_prefix, Params, Reply};
use super::{on_engine, ApiState};
use crate::api::nodes::{self as api_nodes, NodeEligibilityUpdateResponse, NodeListStub, NodeUpdateEligibilityRequest};
use crate::api::WriteMeta;
use engine::state::Snapshot;
use engine::structs::{Node, NodeEligibility, NodeId};

/// The routes of this file.
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/nodes", get(list))
        .route("/v1/node/{id}", get(read))
        .route("/v1/node/{id}/allocations", get(allocations))
        .route("/v1/node/{id}/eligibility", post(eligibility).put(eligibility))
        .route("/v1/node/{id}/purge", post(purge).put(purge))
        // Host and allocation statistics are not collected: an error, not
        // `{}`, since `nomad node status` crashes on an empty 200 there.
        .route("/v1/client/{*rest}", get(client_stats))
}

/// `GET /v1/nodes[?prefix=][&resources=true]`, by id.
async fn list(State(state): State<ApiState>, params: Params) -> Result<Reply, ApiError> {
    let prefix = params.prefix().to_string();
    let resources = params.flag("resources")?;
    blocking(
        &state,
        &params,
        |snapshot| Ok(snapshot.table_indexes().nodes),
        |snapshot| {
            let mut nodes: Vec<_> = snapshot.nodes().filter(|node| matches_uuid_prefix(&node.id.0, &prefix)).collect();
            nodes.sort_by_key(|node| node.id);
            Ok(nodes.iter().map(|node| NodeListStub::of(node, resources)).collect::<Vec<_>>())
        },
    )
    .await
}

/// `GET /v1/node/<id>`.
async fn read(State(state): State<ApiState>, Path(id): Path<String>, params: Params) -> Result<Reply, ApiError> {
    let id = NodeId(exact_uuid(&id, "node")?);
    let find = |snapshot: &Snapshot| -> Result<Arc<Node>, ApiError> {
        snapshot.node(id).cloned().ok_or_else(|| ApiError::NotFound("node not found".to_string()))
    };
    blocking(
        &state,
        &params,
        |snapshot| Ok(find(snapshot)?.modify_index),
        |snapshot| Ok(api_nodes::Node::from(&*find(snapshot)?)),
    )
    .await
}

/// `GET /v1/node/<id>/allocations`: full allocations, as the CLI reads them.
async fn allocations(State(state): State<ApiState>, Path(id): Path<String>, params: Params) -> Result<Reply, ApiError> {
    let id = NodeId(exact_uuid(&id, "node")?);
    blocking(
        &state,
        &params,
        |snapshot| Ok(snapshot.table_indexes().allocs),
        |snapshot| Ok(snapshot.allocs_by_node(id).map(|alloc| nomad::alloc(alloc, snapshot)).collect::<Vec<_>>()),
    )
    .await
}

/// Marks a node eligible or ineligible for new placements.
async fn eligibility(
    State(state): State<ApiState>,
    Path(id): Path<String>,
    params: Params,
    body: Bytes,
) -> Result<Reply, ApiError> {
    let id = NodeId(exact_uuid(&id, "node")?);
    let request: NodeUpdateEligibilityRequest =
        serde_json::from_slice(&body).map_err(|error| ApiError::BadRequest(error.to_string()))?;
    let eligibility = match request.eligibility.as_deref() {
        Some("eligible") => NodeEligibility::Eligible,
        Some("ineligible") => NodeEligibility::Ineligible,
        other => {
            return Err(ApiError::BadRequest(format!(
                "invalid scheduling eligibility {:?}: eligible or ineligible",
                other.unwrap_or("")
            )))
        }
    };
    let engine = state.leader()?;
    let index = tokio::task::spawn_blocking(move || engine.nodes().set_eligibility(id, eligibility))
        .await
        .map_err(|error| ApiError::Internal(format!("engine call failed: {error}")))?
        .map_err(|error| match error {
            engine::node::NodeError::UnknownNode(_) => ApiError::NotFound("node not found".to_string()),
            other => ApiError::Internal(other.to_string()),
        })?;
    let body = NodeEligibilityUpdateResponse {
        eval_ids: Vec::new(),
        eval_create_index: index,
        node_modify_index: index,
        meta: WriteMeta::at(index),
    };
    Ok(Reply::json(&body, params.pretty(), Some(index)))
}

/// `PUT /v1/node/<id>/purge` (Nomad's node deregister): the node is
/// deleted, its live allocations marked `lost` and replaced by the evals
/// of their jobs.
async fn purge(State(state): State<ApiState>, Path(id): Path<String>, params: Params) -> Result<Reply, ApiError> {
    let id = NodeId(exact_uuid(&id, "node")?);
    let engine = state.leader()?;
    let (evals, index) = on_engine(move || engine.nodes().purge(id)).await?.map_err(|error| match error {
        engine::node::NodeError::UnknownNode(_) => ApiError::NotFound("node not found".to_string()),
        engine::node::NodeError::State(state) => ApiError::from(state),
        other => ApiError::Internal(other.to_string()),
    })?;
    tracing::info!(node = %id, evals = evals.len(), "node purged");
    let body = NodeEligibilityUpdateResponse {
        eval_ids: evals.iter().map(|eval| eval.to_string()).collect(),
        eval_create_index: index,
        node_modify_index: index,
        meta: WriteMeta::at(index),
    };
    Ok(Reply::json(&body, params.pretty(), Some(index)))
}

async fn client_stats() -> ApiError {
    ApiError::NotFound("client statistics are not collected by Drover".to_string())
}
