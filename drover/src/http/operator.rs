//! The operator endpoints over the durable state: `GET /v1/operator/snapshot`
//! (a consistent snapshot of the whole state, as Nomad's `nomad operator
//! snapshot save` fetches it), `GET /v1/operator/raft/configuration`
//! (Nomad's shape: every server, its raft id, whether it votes and leads),
//! `DELETE /v1/operator/raft/peer?id=ID` (Nomad's remove-peer), `PUT
//! /v1/operator/raft/peer?address=HOST:PORT` (Drover's add-voter: the
//! server at that server-to-server address is asked who it is, added as a
//! learner, caught up, then made a voter) and `GET /v1/operator/raft/info`
//! (Drover's: the log range and the snapshots on disk, for `drover
//! operator raft info`). Membership changes are the leader's: a follower
//! forwards them. `GET|PUT /v1/operator/scheduler/configuration` reads
//! and writes the cluster's scheduler configuration (`?cas=N`:
//! check-and-set), `PauseEvalBroker` included.
//!
//! A server without a data dir keeps its state in memory: these answer 400
//! saying so. Restoring (`PUT /v1/operator/snapshot` in Nomad) is done on
//! a stopped server's data dir with `drover operator snapshot restore`, so
//! a running server never swaps its state under its leader services; the
//! PUT answers 400 naming that command.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use replication::Durable;

use axum::body::Bytes;
use engine::state::StateError;

use super::error::ApiError;
use super::query::{blocking, Params, Reply};
use super::{on_engine, ApiState};
use crate::api::operator::{
    RaftConfiguration, RaftPeerRemoved, RaftServer, RaftVoterAdded, SchedulerConfiguration,
    SchedulerConfigurationResponse, SchedulerSetConfigurationResponse,
};

const INDEX_HEADER: header::HeaderName = header::HeaderName::from_static("x-nomad-index");

/// The routes of this file.
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/operator/snapshot", get(save).put(restore).post(restore))
        .route("/v1/operator/raft/configuration", get(configuration))
        .route("/v1/operator/raft/peer", axum::routing::delete(remove_peer).put(add_voter).post(add_voter))
        .route("/v1/operator/raft/info", get(info))
        .route(
            "/v1/operator/scheduler/configuration",
            get(scheduler_configuration).put(set_scheduler_configuration).post(set_scheduler_configuration),
        )
}

/// `GET /v1/operator/scheduler/configuration`: the stored one, or the
/// defaults (indexes 0) until one is written.
async fn scheduler_configuration(State(state): State<ApiState>, params: Params) -> Result<Reply, ApiError> {
    blocking(
        &state,
        &params,
        |snapshot| Ok(snapshot.scheduler_config().map_or(snapshot.index(), |config| config.modify_index)),
        |snapshot| {
            Ok(SchedulerConfigurationResponse {
                scheduler_config: snapshot.scheduler_config().unwrap_or_default().into(),
                index: snapshot.index(),
                last_contact: 0,
                known_leader: true,
            })
        },
    )
    .await
}

/// `PUT /v1/operator/scheduler/configuration[?cas=N]`: `Updated` false
/// when the check-and-set index is not the stored one.
async fn set_scheduler_configuration(
    State(state): State<ApiState>,
    params: Params,
    body: Bytes,
) -> Result<Reply, ApiError> {
    let request: SchedulerConfiguration =
        serde_json::from_slice(&body).map_err(|error| ApiError::BadRequest(format!("Invalid request: {error}")))?;
    let config = request.to_engine().map_err(ApiError::BadRequest)?;
    let cas_index = match params.get("cas") {
        None | Some("") => None,
        Some(text) => Some(text.parse::<u64>().map_err(|_| ApiError::BadRequest(format!("invalid cas {text:?}")))?),
    };
    let operator = state.leader()?.operator();
    let written = on_engine(move || operator.set_scheduler_config(config, cas_index)).await?;
    let answer = match written {
        Ok(index) => SchedulerSetConfigurationResponse { updated: true, index },
        Err(StateError::ConfigIndexMismatch { .. }) => {
            SchedulerSetConfigurationResponse { updated: false, index: state.leadership.store().latest_index() }
        }
        Err(other) => return Err(other.into()),
    };
    tracing::info!(pause_eval_broker = config.pause_eval_broker, updated = answer.updated, "scheduler configuration");
    Ok(Reply::json(&answer, params.pretty(), Some(answer.index)))
}

fn durable(state: &ApiState) -> Result<Arc<Durable>, ApiError> {
    state.durable.clone().ok_or_else(|| {
        ApiError::BadRequest("this server keeps its state in memory (it was started without a data dir)".into())
    })
}

/// `GET /v1/operator/snapshot`: takes a snapshot now (it waits until the
/// file is on disk) and answers with that file, checksummed and versioned
/// as the server writes it; `X-Nomad-Index` is the store index it holds.
async fn save(State(state): State<ApiState>) -> Result<Response, ApiError> {
    let durable = durable(&state)?;
    let taken = tokio::task::spawn_blocking(move || durable.snapshot_now())
        .await
        .map_err(|error| ApiError::Internal(format!("taking the snapshot: {error}")))?
        .map_err(|error| ApiError::Internal(format!("taking the snapshot: {error}")))?;
    // Read from one open file: a newer snapshot may replace it meanwhile.
    let bytes = tokio::fs::read(&taken.info.path)
        .await
        .map_err(|error| ApiError::Internal(format!("reading {}: {error}", taken.info.path.display())))?;
    let index = taken.header.store_index.max(1).to_string();
    let headers = [(header::CONTENT_TYPE, "application/octet-stream".to_string()), (INDEX_HEADER, index)];
    Ok((headers, bytes).into_response())
}

/// `PUT /v1/operator/snapshot` (module docs).
async fn restore() -> ApiError {
    ApiError::BadRequest(
        "restore a snapshot on the stopped server's data dir: drover operator snapshot restore --data-dir DIR FILE"
            .into(),
    )
}

/// The raft position and files, read on the blocking pool.
async fn raft_info(state: &ApiState) -> Result<replication::RaftInfo, ApiError> {
    let durable = durable(state)?;
    tokio::task::spawn_blocking(move || durable.info())
        .await
        .map_err(|error| ApiError::Internal(error.to_string()))?
        .map_err(|error| ApiError::Internal(error.to_string()))
}

/// `GET /v1/operator/raft/configuration`: this server, the one voter.
async fn configuration(State(state): State<ApiState>, params: Params) -> Result<Reply, ApiError> {
    let info = raft_info(&state).await?;
    let agent = &state.agent;
    let servers = match state.leadership.durable().filter(|_| state.leadership.is_clustered()) {
        Some(durable) => {
            let metrics = durable.metrics();
            let membership = metrics.membership_config.membership();
            let voters: Vec<u64> = membership.voter_ids().collect();
            membership
                .nodes()
                .map(|(id, node)| RaftServer {
                    id: id.to_string(),
                    node: format!("{}.{}", node.name, agent.region),
                    address: node.rpc.clone(),
                    leader: metrics.current_leader == Some(*id),
                    voter: voters.contains(id),
                    raft_protocol: "3".to_string(),
                })
                .collect()
        }
        None => vec![RaftServer {
            id: replication::NODE_ID.to_string(),
            node: format!("{}.{}", agent.name, agent.region),
            address: agent.rpc_addr.to_string(),
            leader: true,
            voter: true,
            raft_protocol: "3".to_string(),
        }],
    };
    let body = RaftConfiguration { index: info.last_applied.map_or(0, |log_id| log_id.index), servers };
    Ok(Reply::json(&body, params.pretty(), Some(state.leadership.store().latest_index())))
}

/// The durable state of a server of a cluster, or 400.
fn clustered(state: &ApiState) -> Result<Arc<Durable>, ApiError> {
    state
        .leadership
        .durable()
        .filter(|_| state.leadership.is_clustered())
        .cloned()
        .ok_or_else(|| ApiError::BadRequest("this server is not one of a cluster (--bootstrap-expect, --join)".into()))
}

fn membership_error(error: replication::cluster::AddError) -> ApiError {
    match error {
        replication::cluster::AddError::NotLeader(_) => ApiError::NoLeader(error.to_string()),
        other => ApiError::BadRequest(other.to_string()),
    }
}

/// `DELETE /v1/operator/raft/peer?id=ID`: removes a server from the cluster.
async fn remove_peer(State(state): State<ApiState>, params: Params) -> Result<Reply, ApiError> {
    let durable = clustered(&state)?;
    let text = params.get("id").ok_or_else(|| ApiError::BadRequest("missing id (the server's raft id)".into()))?;
    let id: u64 = text.parse().map_err(|_| ApiError::BadRequest(format!("raft id {text:?} is not a number")))?;
    tokio::task::spawn_blocking(move || durable.remove_peer(id))
        .await
        .map_err(|error| ApiError::Internal(error.to_string()))?
        .map_err(membership_error)?;
    tracing::info!(id, "server removed from the cluster");
    Ok(Reply::json(&RaftPeerRemoved { removed: id.to_string() }, params.pretty(), None))
}

/// `PUT /v1/operator/raft/peer?address=HOST:PORT` (Drover's): adds the
/// server at that server-to-server address as a voter.
async fn add_voter(State(state): State<ApiState>, params: Params) -> Result<Reply, ApiError> {
    let durable = clustered(&state)?;
    let address = params
        .get("address")
        .ok_or_else(|| ApiError::BadRequest("missing address (the new server's server-to-server host:port)".into()))?;
    let (id, node) = durable.hello(address).await.map_err(|error| ApiError::BadRequest(error.to_string()))?;
    let name = node.name.clone();
    tokio::task::spawn_blocking(move || durable.add_voter(id, node))
        .await
        .map_err(|error| ApiError::Internal(error.to_string()))?
        .map_err(membership_error)?;
    tracing::info!(id, %name, "server added to the cluster as a voter");
    Ok(Reply::json(&RaftVoterAdded { added: id.to_string(), node: name }, params.pretty(), None))
}

/// `GET /v1/operator/raft/info`: the log range, the snapshots and the
/// positions ([`replication::RaftInfo`]).
async fn info(State(state): State<ApiState>, params: Params) -> Result<Reply, ApiError> {
    let info = raft_info(&state).await?;
    Ok(Reply::json(&info, params.pretty(), Some(state.leadership.store().latest_index())))
}
