//! `/v1/nodes` and `/v1/node/<id>[/allocations|/eligibility|/drain|/evaluate|/purge]`.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;

use super::access::{Access, Caller};
use super::error::ApiError;
use super::nomad;
use super::paging::{ById, PageQuery};
use super::query::{blocking, blocking_reply, exact_uuid, matches_uuid_prefix, Params, Reply};
use super::{on_engine, ApiState};
use crate::api::format::parse_bool;
use crate::api::nodes::{
    self as api_nodes, DrainSpec, NodeEligibilityUpdateResponse, NodeListStub, NodeUpdateDrainRequest,
    NodeUpdateEligibilityRequest, NodeWriteResponse,
};
use crate::api::WriteMeta;
use engine::node::endpoint::{DrainRequest, NodeWrite};
use engine::node::NodeError;
use engine::state::Snapshot;
use engine::structs::{Capabilities, DrainDeadline, Node, NodeEligibility, NodeId};

/// The routes of this file.
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/nodes", get(list))
        .route("/v1/node/{id}", get(read))
        .route("/v1/node/{id}/allocations", get(allocations))
        .route("/v1/node/{id}/eligibility", post(eligibility).put(eligibility))
        .route("/v1/node/{id}/drain", post(drain).put(drain))
        .route("/v1/node/{id}/evaluate", post(evaluate).put(evaluate))
        .route("/v1/node/{id}/purge", post(purge).put(purge))
        // Host and allocation statistics are not collected: an error, not
        // `{}`, since `nomad node status` crashes on an empty 200 there.
        .route("/v1/client/{*rest}", get(client_stats))
}

/// `GET /v1/nodes[?prefix=][&resources=true]`, by id.
async fn list(State(state): State<ApiState>, params: Params) -> Result<Reply, ApiError> {
    let prefix = params.prefix().to_string();
    let resources = params.flag("resources")?;
    let query = PageQuery::of(&params)?;
    blocking_reply(
        &state,
        &params,
        |snapshot| Ok(snapshot.table_indexes().nodes),
        |snapshot| {
            let nodes: Vec<_> = snapshot.nodes().filter(|node| matches_uuid_prefix(&node.id.0, &prefix)).collect();
            let (page, next_token) =
                query.page(nodes, |node| ById(node.id.0), |node| NodeListStub::of(node, resources))?;
            let index = snapshot.table_indexes().nodes;
            Ok(Reply::json(&page, params.pretty(), Some(index)).with_next_token(next_token))
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
/// Of every namespace, those the caller's token may read, as Nomad.
async fn allocations(
    State(state): State<ApiState>,
    axum::Extension(access): axum::Extension<Access>,
    Path(id): Path<String>,
    params: Params,
) -> Result<Reply, ApiError> {
    let id = NodeId(exact_uuid(&id, "node")?);
    let scope = access.scope("*", Capabilities::READ_JOB);
    blocking(
        &state,
        &params,
        |snapshot| Ok(snapshot.table_indexes().allocs),
        |snapshot| {
            let readable = snapshot.allocs_by_node(id).filter(|alloc| scope.admits(&alloc.namespace));
            Ok(readable.map(|alloc| nomad::alloc(alloc, snapshot)).collect::<Vec<_>>())
        },
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
    let index = on_engine(move || engine.nodes().set_eligibility(id, eligibility)).await?.map_err(node_error)?;
    let body = NodeEligibilityUpdateResponse {
        eval_ids: Vec::new(),
        eval_create_index: index,
        node_modify_index: index,
        meta: WriteMeta::at(index),
    };
    Ok(Reply::json(&body, params.pretty(), Some(index)))
}

/// An engine refusal of a node write, as the API answers it.
fn node_error(error: NodeError) -> ApiError {
    match error {
        NodeError::UnknownNode(_) => ApiError::NotFound("node not found".to_string()),
        NodeError::State(state) => ApiError::from(state),
        other => ApiError::Internal(other.to_string()),
    }
}

/// `PUT /v1/node/<id>/drain`: starts, changes or ends a node's drain. A
/// forced drain is a negative deadline, none is zero; Nomad 1.0's
/// `?enable=true|false` without a body is a forced drain or its end (with
/// the node eligible again), as python-nomad's `drain_node` sends it.
async fn drain(
    State(state): State<ApiState>,
    caller: Option<axum::Extension<Caller>>,
    Path(id): Path<String>,
    params: Params,
    body: Bytes,
) -> Result<Reply, ApiError> {
    let id = NodeId(exact_uuid(&id, "node")?);
    let request: NodeUpdateDrainRequest = match params.get("enable") {
        Some(enable) if body.iter().all(u8::is_ascii_whitespace) => {
            let enable = parse_bool(enable).ok_or_else(|| ApiError::BadRequest("invalid enable value".to_string()))?;
            let spec = DrainSpec { deadline: -1, ignore_system_jobs: false };
            NodeUpdateDrainRequest { drain_spec: enable.then_some(spec), mark_eligible: !enable, ..Default::default() }
        }
        _ => serde_json::from_slice(&body).map_err(|error| ApiError::BadRequest(error.to_string()))?,
    };
    if let Some(named) = request.node_id.as_deref().filter(|named| !named.is_empty()) {
        if named != id.to_string() {
            return Err(ApiError::BadRequest(format!("the body names node {named}, the path {id}")));
        }
    }
    let accessor_id = caller
        .and_then(|axum::Extension(Caller(token))| token)
        .map(|token| token.accessor_id.to_string())
        .unwrap_or_default();
    let change = DrainRequest {
        drain: request.drain_spec.map(|spec| (DrainDeadline::from_nanos(spec.deadline), spec.ignore_system_jobs)),
        mark_eligible: request.mark_eligible,
        meta: request.meta.unwrap_or_default(),
        accessor_id,
    };
    let engine = state.leader()?;
    let written = on_engine(move || engine.nodes().drain(id, change)).await?.map_err(node_error)?;
    Ok(node_write(written, &params))
}

/// `PUT /v1/node/<id>/evaluate`: an eval for every job on the node and every system job.
async fn evaluate(State(state): State<ApiState>, Path(id): Path<String>, params: Params) -> Result<Reply, ApiError> {
    let id = NodeId(exact_uuid(&id, "node")?);
    let engine = state.leader()?;
    let written = on_engine(move || engine.nodes().evaluate(id)).await?.map_err(node_error)?;
    Ok(node_write(written, &params))
}

fn node_write(written: NodeWrite, params: &Params) -> Reply {
    let eval_ids: Vec<String> = written.eval_ids.iter().map(ToString::to_string).collect();
    let body = NodeWriteResponse {
        eval_ids: (!eval_ids.is_empty()).then_some(eval_ids),
        eval_create_index: written.index,
        node_modify_index: written.index,
        meta: WriteMeta::at(written.index),
    };
    Reply::json(&body, params.pretty(), Some(written.index))
}

/// `PUT /v1/node/<id>/purge` (Nomad's node deregister): the node is
/// deleted, its live allocations marked `lost` and replaced by the evals
/// of their jobs.
async fn purge(State(state): State<ApiState>, Path(id): Path<String>, params: Params) -> Result<Reply, ApiError> {
    let id = NodeId(exact_uuid(&id, "node")?);
    let engine = state.leader()?;
    let (evals, index) = on_engine(move || engine.nodes().purge(id)).await?.map_err(node_error)?;
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
