//! Relaying the HTTP API to the leader: a follower sends what it does not
//! serve itself to the leader ([`kinds::HTTP`]) and relays the answer, but
//! for what a follower serves itself: its own agent, health and metrics,
//! the status endpoints, its raft view, the event stream, reads with `?stale` (Nomad's
//! rule), and the client operations (`/v1/client/` but an allocation's
//! `checks`, which the servers' state answers), which go to the
//! server that holds the agent's connection, not to the leader
//! (`server::agents`). The leader serves the relayed request with its own router
//! (`server::peer`).

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use replication::Durable;
use transport::peer::Peers;

use super::error::ApiError;
use super::ApiState;
use crate::server::kinds;
use crate::server::leader_calls::{leader_peer, while_it_leads, LeaderError};
use crate::server::leadership::Settled;
use crate::server::peer::{ForwardedRequest, ForwardedResponse};

/// How long a forwarded HTTP request may take: a blocking query waits up
/// to 10 minutes (Nomad's cap), plus its jitter.
const HTTP_TIMEOUT: Duration = Duration::from_secs(11 * 60);

/// Whether a follower answers `request` itself (module docs).
fn served_here(request: &Request) -> bool {
    let path = request.uri().path();
    let stale =
        request.uri().query().is_some_and(|query| query.split('&').any(|pair| pair.split('=').next() == Some("stale")));
    // Every server keeps the same events: a stream is not relayed.
    let local = ["/v1/agent/self", "/v1/agent/health", "/v1/metrics", "/v1/event/stream"];
    local.contains(&path)
        || path.starts_with("/v1/status/")
        || path.starts_with("/v1/operator/raft/")
        // Every server schedules: its workers are its own (`server::scheduling`).
        || path.starts_with("/v1/agent/schedulers")
        // An allocation's checks are state the servers hold, read as any other.
        || (path.starts_with("/v1/client/") && !path.ends_with("/checks"))
        || (request.method() == axum::http::Method::GET && stale)
}

/// The HTTP API's forwarding (module docs): a follower sends what it does
/// not serve itself to the leader and relays the answer.
pub async fn forward_http(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    let leadership = &state.leadership;
    let Some(peers) = state.peers.clone().filter(|_| leadership.is_clustered()) else {
        return next.run(request).await;
    };
    if leadership.leader().is_some() || served_here(&request) {
        return next.run(request).await;
    }
    let durable = leadership.durable().expect("a clustered server is durable");
    let relayed = match leadership.settle().await {
        Ok(Settled::Leads(_)) => return next.run(request).await,
        Ok(Settled::Follows) => match leader_peer(durable) {
            Ok(leader) => relay(durable, &peers, leader, request).await,
            Err(error) => Err(RelayError::Leader(error)),
        },
        Err(error) => Err(RelayError::Leader(error)),
    };
    relayed.unwrap_or_else(|error| error.into_response())
}

/// Why a request was not relayed to the leader.
#[derive(Debug, thiserror::Error)]
enum RelayError {
    /// There is no leader to relay to, or it could not be reached.
    #[error(transparent)]
    Leader(#[from] LeaderError),
    /// The request's body could not be read.
    #[error("reading the request's body: {0}")]
    Body(axum::Error),
    /// The leader's answer did not decode.
    #[error("the leader's answer is malformed: {0}")]
    Answer(postcard::Error),
    /// The leader's answer is not a valid HTTP response.
    #[error("the leader's answer is not a valid response: {0}")]
    Response(axum::http::Error),
}

impl IntoResponse for RelayError {
    /// raft stopped on this server: what it is. Anything else: "no
    /// leader", which a client retries.
    fn into_response(self) -> Response {
        match self {
            RelayError::Leader(LeaderError::Stopped) => {
                ApiError::LogStopped("it takes no part in the cluster any more".to_string())
            }
            _ => ApiError::NoLeader(self.to_string()),
        }
        .into_response()
    }
}

/// Sends `request` to the leader at `leader` and rebuilds its answer.
async fn relay(
    durable: &Durable,
    peers: &Peers,
    leader: (u64, SocketAddr),
    request: Request,
) -> Result<Response, RelayError> {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, super::MAX_BODY).await.map_err(RelayError::Body)?;
    let forwarded = ForwardedRequest {
        method: parts.method.to_string(),
        uri: parts.uri.to_string(),
        headers: parts.headers.iter().map(|(name, value)| (name.to_string(), value.as_bytes().to_vec())).collect(),
        body: body.to_vec(),
    };
    let bytes = postcard::to_allocvec(&forwarded).expect("a forwarded request encodes");
    let answer = while_it_leads(durable, leader.0, peers.call(leader.1, kinds::HTTP, &bytes, HTTP_TIMEOUT)).await?;
    let answer: ForwardedResponse = postcard::from_bytes(&answer).map_err(RelayError::Answer)?;
    let mut response = Response::builder().status(answer.status);
    for (name, value) in answer.headers {
        response = response.header(name, value);
    }
    response.body(Body::from(answer.body)).map_err(RelayError::Response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_operations_stay_here_but_an_allocations_checks_are_read_on_the_leader() {
        let request = |path: &str| Request::builder().uri(path).body(Body::empty()).expect("a request");
        assert!(served_here(&request("/v1/client/allocation/a/stats")), "the agent's connection may be here");
        assert!(!served_here(&request("/v1/client/allocation/a/checks")), "state, read as any other");
        assert!(served_here(&request("/v1/client/allocation/a/checks?stale")));
        assert!(!served_here(&request("/v1/jobs")));
    }
}
