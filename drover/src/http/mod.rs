//! The HTTP API: Nomad's `/v1/` API, for the parts Drover implements, so
//! the `nomad` CLI, python-nomad and scripts written for Nomad work against
//! a Drover server (`docs/nomad-http-api.md` is the contract).
//!
//! The contract every handler keeps:
//! 1. Success is 200 with a JSON body (`[]` for an empty list, `null` when
//!    there is nothing); an error is its status code and a one-line plain
//!    text body ([`error::ApiError`]); a refused write writes nothing.
//! 2. Reads answer from the newest snapshot (an `ArcSwap` load) and carry
//!    `X-Nomad-Index` (the index of what they read, never 0),
//!    `X-Nomad-KnownLeader` and `X-Nomad-LastContact`. With `?index=N` they
//!    block until that index passes N, woken by the store's index, never
//!    polling ([`query::blocking`]).
//! 3. Writes run the engine's blocking calls on tokio's blocking pool, so no
//!    engine call holds a runtime worker.
//! 4. PUT and POST are both accepted for every write; bodies are parsed as
//!    JSON whatever their `Content-Type`.
//!
//! One file per resource: `jobs.rs`, `job_plan.rs` (plan and validate),
//! `evals.rs`, `events.rs` (the event stream), `allocs.rs`, `nodes.rs`, `agent.rs` (agent, status,
//! workers, search), `operator.rs` (snapshots, raft), `client.rs` and `client_fs.rs` (the client operations, answered
//! by the agent that runs the allocation), `services.rs` (Nomad-native
//! service discovery), `deployments.rs` (deployments, their reads and
//! the operator's writes), `system.rs` (forced garbage collection),
//! `acl.rs` (the ACL check in front of them all, tokens and
//! policies), `forward.rs` (a follower's relay to the leader); `nomad.rs`
//! builds the answers that read the state beyond their object, `query.rs`
//! holds the query parameters, blocking queries and the read headers,
//! `paging.rs` the pages and filters every list takes. The
//! bodies read and answered are the structs of `crate::api`, and a
//! submitted job is converted by `crate::api::job_spec`.

pub mod access;
pub mod acl;
pub mod agent;
pub mod allocs;
pub mod client;
pub mod client_fs;
pub mod deployments;
pub mod error;
pub mod evals;
pub mod events;
pub mod filter;
pub mod forward;
pub mod job_plan;
pub mod jobs;
pub mod metrics;
pub mod namespaces;
pub mod nodes;
pub mod nomad;
pub mod operator;
pub mod paging;
pub mod query;
pub mod services;
pub mod system;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::Router;
use engine::server::Server;

use crate::server::leadership::Leadership;

/// The largest request body the API reads (a job with many groups fits
/// well inside); larger ones are refused with 413 (see `refuse_oversized`).
pub const MAX_BODY: usize = 4 * 1024 * 1024;

/// What the handlers share.
#[derive(Clone, Debug)]
pub struct ApiState {
    /// The leader services (while this server leads) and the store.
    pub leadership: Arc<Leadership>,
    /// The server-to-server endpoint, on a server of a cluster (requests
    /// it does not serve itself go to the leader through it).
    pub peers: Option<Arc<transport::peer::Peers>>,
    /// The QUIC listener: its connection counters, and the agents'
    /// connections it holds (the client operations).
    pub listener: Option<Arc<transport::server::ClientListener>>,
    /// This agent as Nomad's `agent/self` and `agent/members` describe it.
    pub agent: AgentInfo,
    /// The durable state, for `operator/snapshot` and `operator/raft/info`
    /// (none: the server keeps its state in memory).
    pub durable: Option<Arc<replication::Durable>>,
    /// Whether requests need ACL tokens (`acl.enabled`).
    pub acl_enabled: bool,
    /// Where an operator writes a reset index to bootstrap ACLs again
    /// (none: the server keeps its state in memory).
    pub acl_bootstrap_reset: Option<std::path::PathBuf>,
}

/// Runs a blocking engine call on tokio's blocking pool (contract, 3).
pub(crate) async fn on_engine<T: Send + 'static>(
    call: impl FnOnce() -> T + Send + 'static,
) -> Result<T, error::ApiError> {
    tokio::task::spawn_blocking(call)
        .await
        .map_err(|error| error::ApiError::Internal(format!("engine call failed: {error}")))
}

impl ApiState {
    /// The leader services, or 500 "No cluster leader" on a server that
    /// does not lead (a request forwarded during an election).
    pub fn leader(&self) -> Result<Arc<Server>, error::ApiError> {
        self.leadership.leader().ok_or_else(|| error::ApiError::NoLeader("this server does not lead".to_string()))
    }
}

/// Who this server is, for `agent/self`, `agent/members` and `status/leader`.
#[derive(Clone, Debug)]
pub struct AgentInfo {
    /// The server's name (`<host>.<region>` in member lists).
    pub name: String,
    /// Region (`global`).
    pub region: String,
    /// Datacenter.
    pub datacenter: String,
    /// The RPC (QUIC) address clients use: the raft leader address Nomad
    /// reports in `status/leader`.
    pub rpc_addr: SocketAddr,
    /// The HTTP API's bound address.
    pub http_addr: SocketAddr,
    /// Whether the API is served over TLS.
    pub tls: bool,
}

/// The API's routes.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .merge(jobs::routes())
        .merge(job_plan::routes())
        .merge(evals::routes())
        .merge(events::routes())
        .merge(allocs::routes())
        .merge(client::routes())
        .merge(client_fs::routes())
        .merge(nodes::routes())
        .merge(agent::routes())
        .merge(metrics::routes())
        .merge(operator::routes())
        .merge(acl::routes())
        .merge(services::routes())
        .merge(deployments::routes())
        .merge(system::routes())
        .merge(namespaces::routes())
        .fallback(error::unknown_path)
        .layer(axum::middleware::from_fn_with_state(state.clone(), access::authorize))
        // On the server that serves the request (after a follower forwards
        // it), so a namespace just made on the leader is known there.
        .layer(axum::middleware::from_fn_with_state(state.clone(), query::check_namespace))
        .layer(axum::middleware::from_fn_with_state(state.clone(), forward::forward_http))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn(refuse_oversized))
        .with_state(state)
}

/// How much of a body declared over [`MAX_BODY`] is read (and dropped)
/// before the 413: answering while the client still writes, and closing,
/// leaves it a broken pipe instead of the answer. A body declared larger
/// still is answered at once.
const DRAIN_LIMIT: usize = 32 * 1024 * 1024;

/// Answers a request whose declared body is over [`MAX_BODY`] with 413,
/// after reading the body if it is within [`DRAIN_LIMIT`].
async fn refuse_oversized(request: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    use axum::response::IntoResponse;
    use http_body_util::BodyExt;
    let declared = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|length| length.to_str().ok()?.parse::<usize>().ok());
    let Some(length) = declared.filter(|length| *length > MAX_BODY) else {
        return next.run(request).await;
    };
    if length <= DRAIN_LIMIT {
        let mut body = request.into_body();
        while let Some(Ok(_)) = body.frame().await {}
    }
    let message = format!("Request body too large: {length} bytes, at most {MAX_BODY}");
    (axum::http::StatusCode::PAYLOAD_TOO_LARGE, message).into_response()
}
