//! Nomad's client endpoints, served by any server: each finds the node
//! that runs the allocation (or the node asked for) and calls its agent
//! through whichever server holds the agent's connection
//! (`server::agents`). The ACL check in front (`acl.rs`) asks for Nomad's
//! capabilities; this file adds none of its own.
//!
//! - `PUT /v1/client/allocation/:id/restart` (`{"TaskName", "AllTasks"}`,
//!   optional) and `.../signal` (`{"Task", "Signal"}`): `{"Index": 0}`.
//! - `GET /v1/client/allocation/:id/stats`: `AllocResourceUsage`.
//! - `GET /v1/client/allocation/:id/gc`: `null`, once the agent removed a
//!   terminal allocation's directories.
//! - `GET /v1/client/stats?node_id=`: `HostStats`; `GET /v1/client/gc?node_id=`:
//!   `null`. A server has no client of its own, so `node_id` is required.
//!
//! The file endpoints are `client_fs.rs`. An unknown allocation or node is
//! 404, as is a node no server holds a connection to ("No path to node");
//! what the agent refuses is answered with its reason ([`agent_error`]).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::Router;
use engine::structs::{AllocId, NodeId};
use serde_json::Value;
use transport::agent_call::{AgentAnswer, AgentCallError, AgentFrame};
use transport::message::{AgentCall, AgentErrorCode, AgentReply};

use super::error::ApiError;
use super::query::{Params, Reply};
use super::ApiState;
use crate::api::allocations::{AllocRestartRequest, AllocSignalRequest, GenericResponse};
use crate::api::stats::{AllocResourceUsage, HostStats};
use crate::server::agents::{AgentRoute, RouteError};

/// The routes of this file.
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/client/allocation/{id}/restart", post(restart).put(restart))
        .route("/v1/client/allocation/{id}/signal", post(signal).put(signal))
        .route("/v1/client/allocation/{id}/stats", get(alloc_stats))
        .route("/v1/client/allocation/{id}/gc", get(alloc_gc).put(alloc_gc).post(alloc_gc))
        .route("/v1/client/stats", get(host_stats))
        .route("/v1/client/gc", get(host_gc).put(host_gc).post(host_gc))
}

/// The allocation in a path, and the node it is placed on; 404 for one
/// that does not exist.
pub fn alloc_node(state: &ApiState, id: &str) -> Result<(AllocId, NodeId), ApiError> {
    let unknown = || ApiError::NotFound(format!("Unknown allocation \"{id}\""));
    let alloc_id = AllocId(uuid::Uuid::parse_str(id).map_err(|_| unknown())?);
    let snapshot = state.leadership.store().snapshot();
    let alloc = snapshot.alloc(alloc_id).ok_or_else(unknown)?;
    Ok((alloc_id, alloc.node_id))
}

/// The node of `?node_id=`; 400 without one, 404 for one that does not exist.
fn query_node(state: &ApiState, params: &Params) -> Result<NodeId, ApiError> {
    let Some(text) = params.get("node_id").filter(|text| !text.is_empty()) else {
        return Err(ApiError::BadRequest("missing node_id: a server has no client of its own".to_string()));
    };
    let unknown = || ApiError::NotFound(format!("Unknown node \"{text}\""));
    let node_id = NodeId(uuid::Uuid::parse_str(text).map_err(|_| unknown())?);
    state.leadership.store().snapshot().node(node_id).ok_or_else(unknown)?;
    Ok(node_id)
}

/// Makes `call` on the node's agent; the first frame of its answer and
/// the rest of it.
pub async fn call_agent(
    state: &ApiState,
    node_id: NodeId,
    call: AgentCall,
) -> Result<(AgentFrame, AgentAnswer), ApiError> {
    let listener =
        state.listener.clone().ok_or_else(|| ApiError::Internal("this server has no client listener".into()))?;
    let route = AgentRoute::new(listener, state.peers.clone(), state.durable.clone());
    route.call(node_id, call).await.map_err(route_error)
}

/// Makes `call` and answers its reply.
async fn reply_of(state: &ApiState, node_id: NodeId, call: AgentCall) -> Result<AgentReply, ApiError> {
    match call_agent(state, node_id, call).await? {
        (AgentFrame::Reply(reply), _) => Ok(reply),
        (AgentFrame::Chunk(_), _) => Err(ApiError::Internal("the agent answered with a stream".to_string())),
    }
}

/// How a failed call to an agent is answered.
fn route_error(error: RouteError) -> ApiError {
    match error {
        RouteError::NoPath(_) => ApiError::NotFound(error.to_string()),
        RouteError::Call(AgentCallError::Agent(refused)) => agent_error(refused.code, refused.message),
        other => ApiError::Internal(other.to_string()),
    }
}

/// What the agent refused, with its reason.
pub fn agent_error(code: AgentErrorCode, message: String) -> ApiError {
    match code {
        AgentErrorCode::UnknownAlloc | AgentErrorCode::NotFound => ApiError::NotFound(message),
        // A secret path is bad input, not an ACL refusal: its reason says why.
        AgentErrorCode::Invalid | AgentErrorCode::WrongState | AgentErrorCode::Forbidden => {
            ApiError::BadRequest(message)
        }
        AgentErrorCode::Internal => ApiError::Internal(message),
    }
}

/// A JSON body, or `T`'s default for an empty one (Nomad's clients may
/// send none).
fn body_or_default<T: serde::de::DeserializeOwned + Default>(body: &Bytes) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|error| ApiError::BadRequest(format!("the request body: {error}")))
}

/// `PUT /v1/client/allocation/:id/restart`.
async fn restart(State(state): State<ApiState>, Path(id): Path<String>, body: Bytes) -> Result<Reply, ApiError> {
    let (alloc_id, node_id) = alloc_node(&state, &id)?;
    let request: AllocRestartRequest = body_or_default(&body)?;
    let all_tasks = request.all_tasks.unwrap_or(false);
    let task = request.task_name.filter(|task| !task.is_empty() && !all_tasks);
    reply_of(&state, node_id, AgentCall::Restart { alloc_id, task }).await?;
    Ok(Reply::json(&GenericResponse::default(), false, None))
}

/// `PUT /v1/client/allocation/:id/signal`.
async fn signal(State(state): State<ApiState>, Path(id): Path<String>, body: Bytes) -> Result<Reply, ApiError> {
    let (alloc_id, node_id) = alloc_node(&state, &id)?;
    let request: AllocSignalRequest = body_or_default(&body)?;
    let signal = signal_name(request.signal.as_deref().unwrap_or_default())?;
    let task = request.task.filter(|task| !task.is_empty());
    reply_of(&state, node_id, AgentCall::Signal { alloc_id, task, signal }).await?;
    Ok(Reply::json(&GenericResponse::default(), false, None))
}

/// A signal's name as job files write it: `SIGUSR1` (or `USR1`, any
/// case), one of those a task may be sent; 400 for anything else.
pub fn signal_name(text: &str) -> Result<String, ApiError> {
    let upper = text.trim().to_ascii_uppercase();
    if upper.is_empty() {
        return Err(ApiError::BadRequest("missing signal".to_string()));
    }
    let name = if upper.starts_with("SIG") { upper } else { format!("SIG{upper}") };
    match engine::structs::KILL_SIGNALS.contains(&name.as_str()) {
        true => Ok(name),
        false => Err(ApiError::BadRequest(format!(
            "invalid signal {text:?}: one of {}",
            engine::structs::KILL_SIGNALS.join(", ")
        ))),
    }
}

/// `GET /v1/client/allocation/:id/stats`.
async fn alloc_stats(State(state): State<ApiState>, Path(id): Path<String>, params: Params) -> Result<Reply, ApiError> {
    let (alloc_id, node_id) = alloc_node(&state, &id)?;
    match reply_of(&state, node_id, AgentCall::AllocStats { alloc_id }).await? {
        AgentReply::AllocStats(usage) => Ok(Reply::json(&AllocResourceUsage::from(&usage), params.pretty(), None)),
        other => Err(unexpected(&other)),
    }
}

/// `GET /v1/client/allocation/:id/gc`.
async fn alloc_gc(State(state): State<ApiState>, Path(id): Path<String>) -> Result<Reply, ApiError> {
    let (alloc_id, node_id) = alloc_node(&state, &id)?;
    reply_of(&state, node_id, AgentCall::AllocGc { alloc_id }).await?;
    Ok(Reply::json(&Value::Null, false, None))
}

/// `GET /v1/client/stats?node_id=`.
async fn host_stats(State(state): State<ApiState>, params: Params) -> Result<Reply, ApiError> {
    let node_id = query_node(&state, &params)?;
    match reply_of(&state, node_id, AgentCall::HostStats).await? {
        AgentReply::HostStats(stats) => Ok(Reply::json(&HostStats::from(&stats), params.pretty(), None)),
        other => Err(unexpected(&other)),
    }
}

/// `GET /v1/client/gc?node_id=`.
async fn host_gc(State(state): State<ApiState>, params: Params) -> Result<Reply, ApiError> {
    let node_id = query_node(&state, &params)?;
    reply_of(&state, node_id, AgentCall::HostGc).await?;
    Ok(Reply::json(&Value::Null, false, None))
}

/// An agent's reply that is not the one its call has.
fn unexpected(reply: &AgentReply) -> ApiError {
    ApiError::Internal(format!("the agent answered with an unexpected reply: {reply:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_are_read_with_or_without_sig_in_any_case() {
        assert_eq!(signal_name("SIGUSR1").expect("valid"), "SIGUSR1");
        assert_eq!(signal_name("usr1").expect("valid"), "SIGUSR1");
        assert!(signal_name("").is_err());
        assert!(signal_name("SIG").is_err());
        assert!(signal_name("SIGNOPE").expect_err("unknown").to_string().contains("SIGUSR1"));
        assert!(signal_name("SIGUSR1; rm -rf /").is_err());
    }
}
