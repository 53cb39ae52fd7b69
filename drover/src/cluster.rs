//! A server as one of several: its leader services come and go with the
//! raft leadership, and what it cannot serve as a follower goes to the
//! leader over the server-to-server endpoint.
//!
//! - [`Leadership`] holds the leader services (the engine's [`Server`]:
//!   broker, blocked evals, plan applier, workers, heartbeat timers,
//!   reaper) while this server leads. They start after raft's read barrier
//!   (see `replication::cluster`) over the store raft applies to; every
//!   pending eval goes back into the broker and every live node gets the
//!   failover heartbeat TTL, so no node is marked down for the election.
//!   They stop as soon as the leadership goes; the store is left to raft.
//!   A one-server setup leads from the start and never stops leading.
//! - [`ClusterRoute`] is the client endpoint's route: node calls are served
//!   by the leader services when this server leads, forwarded to the
//!   leader otherwise ([`kinds::CLIENT_CALL`]), and answered once this
//!   server's own state has caught up with the write, so the client's next
//!   call here (its allocation watch) sees it.
//! - [`forward_http`] sends the HTTP API's requests to the leader
//!   ([`kinds::HTTP`]), but for what a follower serves itself: its own
//!   agent, health and metrics, the status endpoints, its raft view, and
//!   reads with `?stale` (Nomad's rule).
//! - [`PeerService`] answers the other servers' calls: raft's, forwarded
//!   client calls and HTTP requests.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use engine::clock::SystemClock;
use engine::node::endpoint::NodeEndpoint;
use engine::server::{Server, ServerConfig};
use engine::state::StateStore;
use parking_lot::RwLock;
use replication::{Durable, ServerNode};
use serde::{Deserialize, Serialize};
use transport::frame::Frame;
use transport::message::{AnyMessage, Refusal, RefusalCode};
use transport::peer::{PeerAnswer, PeerHandler, Peers};
use transport::server::{ClientListener, HoldAnswer, Route, RouteAnswer};

use crate::http::ApiState;

/// The kinds of server-to-server calls Drover makes besides raft's
/// (`replication::network::kinds` has 1-5).
pub mod kinds {
    /// A client's call a follower forwards: one byte (1: the client has an
    /// operator certificate), then its request frame.
    pub const CLIENT_CALL: u8 = 10;
    /// An HTTP API request a follower forwards.
    pub const HTTP: u8 = 11;
}

/// How long a forwarded client call may take.
const CLIENT_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a forwarded HTTP request may take: a blocking query waits up
/// to 10 minutes (Nomad's cap), plus its jitter.
const HTTP_TIMEOUT: Duration = Duration::from_secs(11 * 60);
/// How long a follower waits for its state to catch up with a forwarded
/// write before answering anyway.
const CATCH_UP: Duration = Duration::from_secs(5);
/// How long a call waits for a leader before it is refused with "no
/// cluster leader", the default of
/// [`ClusterOptions::hold`](crate::server::ClusterOptions::hold). An
/// election or a new leader's read barrier is then a slow answer rather
/// than an error and a retry (Nomad holds RPCs the same way, for 5 s).
/// It is shorter than an agent's heartbeat timeout (3 s), so a held
/// heartbeat is answered or refused before the agent gives up on it.
pub const HOLD: Duration = Duration::from_millis(2500);

/// This server's leader services, while it leads (module docs).
pub struct Leadership {
    config: ServerConfig,
    store: Arc<StateStore>,
    durable: Option<Arc<Durable>>,
    services: RwLock<Option<Arc<Server>>>,
    /// Whether the leader services run, for whoever waits for a change.
    leading: tokio::sync::watch::Sender<bool>,
    /// Times this server became the leader.
    gained: AtomicU64,
    /// Set at shutdown: the services never start again.
    closed: std::sync::atomic::AtomicBool,
    /// How long [`Leadership::settle`] waits for a leader.
    hold: Duration,
}

/// Who serves a call, once the cluster has a leader.
#[derive(Debug)]
pub enum Settled {
    /// This server, with its leader services.
    Leads(Arc<Server>),
    /// Another server ([`leader_peer`] finds it).
    Follows,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership").field("leading", &self.services.read().is_some()).finish_non_exhaustive()
    }
}

impl Leadership {
    /// A server that leads for good (one server, durable or not).
    pub fn single(server: Server, durable: Option<Arc<Durable>>) -> Arc<Leadership> {
        Arc::new(Leadership {
            config: ServerConfig::default(),
            store: server.store().clone(),
            durable,
            services: RwLock::new(Some(Arc::new(server))),
            leading: tokio::sync::watch::Sender::new(true),
            gained: AtomicU64::new(1),
            closed: std::sync::atomic::AtomicBool::new(false),
            hold: Duration::ZERO,
        })
    }

    /// A server of a cluster: follows until raft says it leads. Calls wait
    /// up to `hold` for a leader ([`Leadership::settle`]).
    pub fn clustered(config: ServerConfig, durable: Arc<Durable>, hold: Duration) -> Arc<Leadership> {
        let leadership = Arc::new(Leadership {
            config,
            store: durable.store().clone(),
            durable: Some(durable.clone()),
            services: RwLock::new(None),
            leading: tokio::sync::watch::Sender::new(false),
            gained: AtomicU64::new(0),
            closed: std::sync::atomic::AtomicBool::new(false),
            hold,
        });
        let weak = Arc::downgrade(&leadership);
        durable.watch_leadership(Arc::new(move |leads| {
            if let Some(leadership) = weak.upgrade() {
                if leads {
                    leadership.lead();
                } else {
                    leadership.follow();
                }
            }
        }));
        leadership
    }

    /// The leader services, while this server leads.
    pub fn leader(&self) -> Option<Arc<Server>> {
        self.services.read().clone()
    }

    /// Watches whether the leader services run (they start after the read
    /// barrier, so `true` means this server takes writes).
    pub fn watch(&self) -> tokio::sync::watch::Receiver<bool> {
        self.leading.subscribe()
    }

    /// Who serves a call: this server once its leader services run, or
    /// the server raft names the leader. During an election, or while
    /// this server passes its read barrier, it waits for either, at most
    /// the hold; then the error says why there is no leader.
    pub async fn settle(&self) -> Result<Settled, String> {
        let Some(durable) = &self.durable else {
            return self.leader().map(Settled::Leads).ok_or_else(|| "this server does not lead".to_string());
        };
        let settled = || match self.leader() {
            Some(server) => Some(Settled::Leads(server)),
            None => durable.leader().filter(|(id, _)| *id != durable.id()).map(|_| Settled::Follows),
        };
        // Most calls find a leader at once: nothing to subscribe to.
        if let Some(settled) = settled() {
            return Ok(settled);
        }
        // Subscribed before looking again, so no change between is missed.
        let mut leading = self.leading.subscribe();
        let mut metrics = durable.raft().metrics();
        let wait = async {
            loop {
                if let Some(settled) = settled() {
                    return Ok(settled);
                }
                tokio::select! {
                    _ = leading.changed() => {}
                    changed = metrics.changed() => {
                        if changed.is_err() {
                            return Err("raft has stopped on this server".to_string());
                        }
                    }
                }
            }
        };
        match tokio::time::timeout(self.hold, wait).await {
            Ok(settled) => settled,
            Err(_) => Err(match leader_peer(durable) {
                Err(why) => format!("{why} (waited {:?})", self.hold),
                Ok(_) => "no cluster leader; try again".to_string(),
            }),
        }
    }

    /// The store (replicated on every server; reads are served from it).
    pub fn store(&self) -> &Arc<StateStore> {
        &self.store
    }

    /// The durable state, if the server has a data dir.
    pub fn durable(&self) -> Option<&Arc<Durable>> {
        self.durable.as_ref()
    }

    /// Whether this server is one of several.
    pub fn is_clustered(&self) -> bool {
        self.durable.as_ref().is_some_and(|durable| durable.cluster().is_some())
    }

    /// Times this server became the leader.
    pub fn times_led(&self) -> u64 {
        self.gained.load(Ordering::Relaxed)
    }

    /// Starts the leader services (after raft's read barrier).
    fn lead(&self) {
        let Some(durable) = &self.durable else { return };
        let mut services = self.services.write();
        // A server shutting down may still win an election: it does not lead.
        if services.is_some() || self.closed.load(Ordering::Acquire) {
            return;
        }
        let server = Server::start_with(self.config.clone(), SystemClock::shared(), durable.writer());
        let stats = server.stats();
        tracing::info!(
            term = durable.metrics().current_term,
            index = stats.index,
            pending_evals = stats.broker.total_ready + stats.broker.total_pending,
            blocked_evals = stats.blocked.total_blocked,
            "leading: leader services started"
        );
        *services = Some(Arc::new(server));
        self.gained.fetch_add(1, Ordering::Relaxed);
        self.leading.send_replace(true);
    }

    /// Stops the leader services for good: how a server shuts down (a
    /// leadership won after this starts nothing).
    pub fn close(&self) {
        self.refuse_leading();
        self.follow();
    }

    /// From now on, a leadership won starts nothing (shutting down).
    pub fn refuse_leading(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Stops the leader services, leaving the store to raft. Idempotent.
    pub fn follow(&self) {
        let taken = self.services.write().take();
        self.leading.send_replace(false);
        if let Some(server) = taken {
            server.stop();
            tracing::info!("following: leader services stopped");
        }
    }
}

/// The leader's raft id and server-to-server address, unless this server
/// is the leader or none is known (an election).
fn leader_peer(durable: &Durable) -> Result<(u64, SocketAddr), String> {
    match durable.leader() {
        Some((id, _)) if id == durable.id() => Err("this server is taking over the leadership".to_string()),
        Some((id, node)) => Ok((id, replication::cluster::resolve(&node.peer).map_err(|error| error.to_string())?)),
        None => Err("no cluster leader".to_string()),
    }
}

/// Calls the leader `leader` with `call`, giving up as soon as raft no
/// longer names it the leader: a killed leader sends nothing back, and
/// this server notices it is gone when its election timer fires (1-2 s),
/// long before the connection would time out.
async fn while_it_leads<T>(
    durable: &Durable,
    leader: u64,
    call: impl std::future::Future<Output = Result<T, transport::peer::PeerError>>,
) -> Result<T, String> {
    let mut metrics = durable.raft().metrics();
    tokio::select! {
        answer = call => answer.map_err(|error| format!("forwarding to the leader: {error}")),
        _ = metrics.wait_for(|now| now.current_leader != Some(leader)) => {
            Err("the leader changed while the call was forwarded to it".to_string())
        }
    }
}

/// The client endpoint's route on a server of a cluster (module docs).
#[derive(Debug)]
pub struct ClusterRoute {
    leadership: Arc<Leadership>,
    durable: Arc<Durable>,
    peers: Arc<Peers>,
}

impl ClusterRoute {
    /// The route of a server with these leader services, state and endpoint.
    pub fn new(leadership: Arc<Leadership>, durable: Arc<Durable>, peers: Arc<Peers>) -> ClusterRoute {
        ClusterRoute { leadership, durable, peers }
    }
}

impl Route for ClusterRoute {
    fn leading(&self) -> Option<NodeEndpoint> {
        self.leadership.leader().map(|server| server.nodes())
    }

    fn forward(&self, request: Vec<u8>, operator: bool) -> RouteAnswer {
        let durable = self.durable.clone();
        let peers = self.peers.clone();
        let store = self.leadership.store().clone();
        Box::pin(async move {
            let no_leader = |message: String| Refusal { code: RefusalCode::NoLeader, message };
            let (leader, addr) = leader_peer(&durable).map_err(no_leader)?;
            let mut call = Vec::with_capacity(request.len() + 1);
            call.push(u8::from(operator));
            call.extend_from_slice(&request);
            let forwarded = peers.call(addr, kinds::CLIENT_CALL, &call, CLIENT_CALL_TIMEOUT);
            let answer = while_it_leads(&durable, leader, forwarded).await.map_err(no_leader)?;
            if let Some(index) = written_index(&answer) {
                let _ = tokio::time::timeout(CATCH_UP, store.wait_for_index(index)).await;
            }
            Ok(answer)
        })
    }

    fn hold(&self) -> HoldAnswer {
        let leadership = self.leadership.clone();
        Box::pin(async move {
            match leadership.settle().await {
                Ok(Settled::Leads(server)) => Ok(Some(server.nodes())),
                Ok(Settled::Follows) => Ok(None),
                Err(message) => Err(Refusal { code: RefusalCode::NoLeader, message }),
            }
        })
    }

    fn servers(&self) -> Vec<String> {
        client_addresses(&self.durable)
    }
}

/// The index a forwarded write's reply names, if it is a write's reply.
fn written_index(reply: &[u8]) -> Option<u64> {
    let (frame, _) = Frame::decode_within(reply, transport::frame::MAX_PAYLOAD).ok()??;
    match AnyMessage::from_frame(&frame).ok()? {
        AnyMessage::NodeReply(reply) => Some(reply.index),
        AnyMessage::IndexReply(reply) => Some(reply.index),
        _ => None,
    }
}

/// The client addresses of the cluster's servers, the leader's first.
pub fn client_addresses(durable: &Durable) -> Vec<String> {
    let metrics = durable.metrics();
    let mut servers: Vec<(bool, String)> = metrics
        .membership_config
        .nodes()
        .map(|(id, node)| (metrics.current_leader != Some(*id), node.rpc.clone()))
        .collect();
    servers.sort();
    servers.into_iter().map(|(_, rpc)| rpc).collect()
}

/// An HTTP request a follower forwards, as it travels.
#[derive(Debug, Serialize, Deserialize)]
struct ForwardedRequest {
    method: String,
    uri: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

/// The leader's answer to a [`ForwardedRequest`].
#[derive(Debug, Serialize, Deserialize)]
struct ForwardedResponse {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

/// Whether a follower answers `request` itself (module docs).
fn served_here(request: &Request) -> bool {
    let path = request.uri().path();
    let stale =
        request.uri().query().is_some_and(|query| query.split('&').any(|pair| pair.split('=').next() == Some("stale")));
    let local = ["/v1/agent/self", "/v1/agent/health", "/v1/metrics"];
    local.contains(&path)
        || path.starts_with("/v1/status/")
        || path.starts_with("/v1/operator/raft/")
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
            Err(why) => Err(why),
        },
        Err(why) => Err(why),
    };
    relayed.unwrap_or_else(|why| crate::http::error::ApiError::NoLeader(why).into_response())
}

/// Sends `request` to the leader at `leader` and rebuilds its answer.
async fn relay(
    durable: &Durable,
    peers: &Peers,
    leader: (u64, SocketAddr),
    request: Request,
) -> Result<Response, String> {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, crate::http::MAX_BODY).await.map_err(|error| error.to_string())?;
    let forwarded = ForwardedRequest {
        method: parts.method.to_string(),
        uri: parts.uri.to_string(),
        headers: parts.headers.iter().map(|(name, value)| (name.to_string(), value.as_bytes().to_vec())).collect(),
        body: body.to_vec(),
    };
    let bytes = postcard::to_allocvec(&forwarded).map_err(|error| error.to_string())?;
    let answer = while_it_leads(durable, leader.0, peers.call(leader.1, kinds::HTTP, &bytes, HTTP_TIMEOUT)).await?;
    let answer: ForwardedResponse = postcard::from_bytes(&answer).map_err(|error| error.to_string())?;
    let mut response = Response::builder().status(answer.status);
    for (name, value) in answer.headers {
        response = response.header(name, value);
    }
    response.body(Body::from(answer.body)).map_err(|error| error.to_string())
}

/// Serves a forwarded HTTP request with this server's API.
async fn serve_http(router: axum::Router, request: &[u8]) -> Result<Vec<u8>, String> {
    use tower::ServiceExt;
    let forwarded: ForwardedRequest =
        postcard::from_bytes(request).map_err(|error| format!("a malformed forwarded request: {error}"))?;
    let mut builder = axum::http::Request::builder().method(forwarded.method.as_str()).uri(forwarded.uri.as_str());
    for (name, value) in &forwarded.headers {
        builder = builder.header(name.as_str(), value.as_slice());
    }
    let request = builder.body(Body::from(forwarded.body)).map_err(|error| error.to_string())?;
    let Ok(response) = router.oneshot(request).await;
    let (parts, body) = response.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.map_err(|error| error.to_string())?;
    let answer = ForwardedResponse {
        status: parts.status.as_u16(),
        headers: parts.headers.iter().map(|(name, value)| (name.to_string(), value.as_bytes().to_vec())).collect(),
        body: body.to_vec(),
    };
    postcard::to_allocvec(&answer).map_err(|error| error.to_string())
}

/// Answers the other servers' calls (module docs). Its parts are set once
/// they exist: the endpoint is bound before raft starts.
#[derive(Debug, Default)]
pub struct PeerService {
    /// raft, hellos and joins.
    pub durable: OnceLock<Arc<Durable>>,
    /// Forwarded client calls.
    pub listener: OnceLock<Arc<ClientListener>>,
    /// Forwarded HTTP requests.
    pub http: OnceLock<axum::Router>,
}

impl PeerHandler for PeerService {
    fn call(&self, kind: u8, request: Vec<u8>) -> PeerAnswer {
        let durable = self.durable.get().cloned();
        let listener = self.listener.get().cloned();
        let http = self.http.get().cloned();
        Box::pin(async move {
            let starting = || "this server is starting".to_string();
            match kind {
                kinds::CLIENT_CALL => {
                    let listener = listener.ok_or_else(starting)?;
                    let (operator, frame) = request.split_first().ok_or("an empty forwarded call")?;
                    Ok(listener.serve_forwarded(frame, *operator == 1).await)
                }
                kinds::HTTP => serve_http(http.ok_or_else(starting)?, &request).await,
                _ => match durable.ok_or_else(starting)?.serve_peer(kind, &request).await {
                    Some(answer) => answer,
                    None => Err(format!("unknown call kind {kind}")),
                },
            }
        })
    }
}

/// A member of the cluster as `drover server members` shows it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Member {
    /// Raft id.
    pub id: u64,
    /// Its addresses.
    pub node: ServerNode,
    /// Whether it votes.
    pub voter: bool,
    /// Whether it leads.
    pub leader: bool,
}
