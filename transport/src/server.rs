//! The server's client-facing endpoint: accepts client connections, serves
//! the calls of each client's call stream (`crate::calls`) against the
//! engine's node endpoint, and pushes each node's allocations on its watch
//! stream.
//!
//! A server of a cluster routes ([`Route`]): while it leads it serves the
//! node calls itself; while it follows it forwards registrations,
//! heartbeats, alloc updates and operator calls to the leader and relays
//! the leader's answer, and serves allocation watches from its own
//! replicated state. Heartbeat replies carry the cluster's client
//! addresses, the leader's first.
//!
//! A node's services read (for its templates) is served like the watch,
//! from this server's own state, leader or not: a blocking query held
//! until the services table changes or its wait ends.
//!
//! The connection a node's authenticated watch runs on is the node's: the
//! server calls the agent back on it ([`ClientListener::call_agent`],
//! `crate::agent_call`).
//!
//! Log lines that traffic from outside can cause (failed handshakes,
//! refused calls) are rate-limited; the counters count every one.
//!
//! Every engine call here is an awaitable form (`register_async`,
//! `update_status_async`, `update_allocs_async`, `allocs_async`): no tokio
//! worker thread ever blocks on the engine, and a watch wakes only when a
//! write touched its node.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use engine::job_endpoint::JobError;
use engine::node::endpoint::{DrainRequest, NodeEndpoint, NodeError};
use engine::node::service_reads::MAX_SERVICE_QUERIES;
use engine::state::{LogError, StateError, WaitError};
use engine::structs::{DrainDeadline, NodeId};
use quinn::{Connection, Endpoint, Incoming, RecvStream, SendStream};
use tokio::sync::{watch, Semaphore};

use crate::agent_call::{AgentAnswer, AgentCallError, AgentConnections};
use crate::frame::{Frame, MAX_PAYLOAD};
use crate::log_limit::RateLimited;
use crate::message::{
    AgentCallRequest, AllocChanges, AllocsPush, ClusterReport, DrainSelfRequest, HeartbeatRequest, IndexReply, Kind,
    ListenerStats, Message, MessageError, NodeReply, ReadServicesRequest, Refusal, RefusalCode, RegisterRequest,
    ReportRequest, ReportScope, ServicesReply, SubmitJobRequest, UpdateAllocsRequest, WatchAllocChangesRequest,
    WatchAllocsRequest, MAX_SERVICES_WAIT,
};
use crate::settings::{self, MAX_HANDSHAKES, MAX_REQUEST};
use crate::stream::{abandon, codes, write_frame, write_last_frame, FrameReader, StreamError};
use crate::tls::{TlsError, TlsMaterial};

/// How long [`ClientListener::close`] waits for peers to be told.
pub const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// What the listener counts (read with [`ClientListener::stats`]).
#[derive(Debug, Default)]
struct Counters {
    connections_accepted: AtomicU64,
    connections_open: AtomicU64,
    handshakes_refused: AtomicU64,
    handshakes_failed: AtomicU64,
    calls: AtomicU64,
    refusals: AtomicU64,
    wrong_secrets: AtomicU64,
    malformed: AtomicU64,
    pushes: AtomicU64,
}

/// The operator calls a server offers (registering jobs, the cluster
/// report); the server binary implements them over its engine. They may
/// block: the listener runs them on the blocking pool.
pub trait Operations: Send + Sync + 'static {
    /// Registers `job`; the index it was written at, or why not (a job
    /// that is not valid, or a write refused as a node call's would be).
    fn submit_job(&self, job: engine::structs::Job) -> Result<u64, JobError>;
    /// The cluster report, as much of it as `scope` asks for (the listener
    /// adds its own counters).
    fn report(&self, scope: ReportScope) -> ClusterReport;
}

/// How a server of a cluster serves node calls (module docs).
pub trait Route: Send + Sync + 'static {
    /// The leader's node endpoint when this server leads now; `None` when
    /// it follows (its calls are forwarded).
    fn leading(&self) -> Option<NodeEndpoint>;
    /// Sends an encoded request frame this server cannot serve to the
    /// leader and answers with the leader's encoded reply frame, once this
    /// server's state has caught up with the reply's index (so the
    /// client's next call here sees its write). `operator`: the client
    /// presented an operator certificate.
    fn forward(&self, request: Vec<u8>, operator: bool) -> RouteAnswer;
    /// Waits, a bounded time, until the cluster has a leader while it has
    /// none (an election, or this server passing its read barrier): the
    /// node endpoint when this server leads by then, `None` when another
    /// server does, a [`RefusalCode::NoLeader`] refusal when the wait ends
    /// without one.
    fn hold(&self) -> HoldAnswer;
    /// The client addresses of the servers, the leader's first.
    fn servers(&self) -> Vec<String>;
}

/// What [`Route::forward`] answers: the reply frame's bytes, or why not.
pub type RouteAnswer = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<u8>, Refusal>> + Send>>;

/// What [`Route::hold`] answers.
pub type HoldAnswer =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Option<NodeEndpoint>, Refusal>> + Send>>;

/// Failed handshakes and refused calls are logged at most this often (the
/// counters in [`ListenerStats`] count every one).
static HANDSHAKE_FAILURES: RateLimited = RateLimited::new(std::time::Duration::from_secs(10));
/// See [`HANDSHAKE_FAILURES`].
static REFUSALS: RateLimited = RateLimited::new(std::time::Duration::from_secs(10));

/// What the listener serves with.
struct Service {
    /// Serves allocation watches (reads) always, and the node calls when
    /// there is no [`Route`] (one server).
    nodes: NodeEndpoint,
    route: std::sync::OnceLock<Arc<dyn Route>>,
    operations: Option<Arc<dyn Operations>>,
    /// The client addresses of the servers, handed to clients on every heartbeat.
    servers: Vec<String>,
    counters: Counters,
    /// The agents' connections, by node.
    agents: AgentConnections,
    /// Set once at shutdown; watches end when it is.
    shutdown: watch::Receiver<bool>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service").field("servers", &self.servers).finish_non_exhaustive()
    }
}

/// The client-facing QUIC endpoint of a server.
#[derive(Debug)]
pub struct ClientListener {
    endpoint: Endpoint,
    service: Arc<Service>,
    handshakes: Arc<Semaphore>,
    shutdown: watch::Sender<bool>,
}

/// Why a listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// The TLS material is unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The UDP socket could not be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

impl ClientListener {
    /// Binds the endpoint on `addr`. Call from within a tokio runtime.
    /// `servers` is the server list clients are handed (this server's
    /// advertised address first; empty: the bound address); `operations` serves operator calls
    /// (without it they are refused).
    pub fn bind(
        addr: SocketAddr,
        tls: &TlsMaterial,
        nodes: NodeEndpoint,
        servers: Vec<String>,
        operations: Option<Arc<dyn Operations>>,
    ) -> Result<ClientListener, ListenError> {
        let config = settings::server_config(tls.server_crypto()?);
        let endpoint = settings::endpoint(addr, Some(config)).map_err(|source| ListenError::Bind { addr, source })?;
        let servers = match servers.is_empty() {
            true => vec![endpoint.local_addr().map_err(|source| ListenError::Bind { addr, source })?.to_string()],
            false => servers,
        };
        let (shutdown, shutdown_seen) = watch::channel(false);
        let counters = Counters::default();
        let route = std::sync::OnceLock::new();
        let agents = AgentConnections::default();
        let service =
            Arc::new(Service { nodes, route, operations, servers, counters, agents, shutdown: shutdown_seen });
        Ok(ClientListener { endpoint, service, handshakes: Arc::new(Semaphore::new(MAX_HANDSHAKES)), shutdown })
    }

    /// Makes this listener route node calls through `route` (a server of a
    /// cluster; module docs). Set once, before serving.
    pub fn route_through(&self, route: Arc<dyn Route>) {
        let _ = self.service.route.set(route);
    }

    /// Serves a request another server forwarded (its encoded frame) as the
    /// leader; the encoded reply frame. A server that no longer leads
    /// refuses with [`RefusalCode::NoLeader`] rather than forwarding again.
    pub async fn serve_forwarded(&self, request: &[u8], operator: bool) -> Vec<u8> {
        let service = &self.service;
        let reply = match Frame::decode_within(request, MAX_REQUEST) {
            Ok(Some((frame, _))) => {
                let request_id = frame.request_id;
                // The follower sent it here because raft names this server
                // the leader; it is never sent on again.
                match service.settle().await {
                    Ok(Serve::Here(nodes)) => match service.reply(&nodes, FORWARDED, operator, &frame).await {
                        Ok(reply) => reply,
                        Err(Failure::Malformed(error)) => {
                            Refusal { code: RefusalCode::Malformed, message: error.to_string() }.to_frame(request_id)
                        }
                        Err(Failure::Refused(error)) => service.refusal(FORWARDED, &error).to_frame(request_id),
                    },
                    Ok(Serve::Leader(_)) => no_leader().to_frame(request_id),
                    Err(refusal) => refusal.to_frame(request_id),
                }
            }
            Ok(None) => Refusal { code: RefusalCode::Malformed, message: "a truncated frame".into() }.to_frame(0),
            Err(error) => Refusal { code: RefusalCode::Malformed, message: error.to_string() }.to_frame(0),
        };
        let mut bytes = Vec::new();
        if let Err(error) = reply.encode(&mut bytes) {
            bytes.clear();
            let refusal = Refusal { code: RefusalCode::Internal, message: format!("encoding the reply: {error}") };
            refusal.to_frame(reply.request_id).encode(&mut bytes).expect("a refusal encodes");
        }
        bytes
    }

    /// The agents' connections this server holds.
    pub fn agents(&self) -> &AgentConnections {
        &self.service.agents
    }

    /// Calls the agent of `node_id` on its connection, if this server
    /// holds it (`None` otherwise).
    pub async fn call_agent(
        &self,
        node_id: NodeId,
        request: &AgentCallRequest,
    ) -> Option<Result<AgentAnswer, AgentCallError>> {
        let (connection, _) = self.service.agents.get(node_id)?;
        Some(crate::agent_call::call(&connection, request).await)
    }

    /// The address the endpoint is bound to.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.endpoint.local_addr()
    }

    /// The counters now.
    pub fn stats(&self) -> ListenerStats {
        ListenerStats {
            connections_open: self.endpoint.open_connections() as u64,
            ..self.service.stats_without_endpoint()
        }
    }
}

impl Service {
    /// The counters, with the open connections counted by the connection
    /// tasks instead of the endpoint.
    fn stats_without_endpoint(&self) -> ListenerStats {
        let counters = &self.counters;
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ListenerStats {
            connections_accepted: read(&counters.connections_accepted),
            connections_open: read(&counters.connections_open),
            handshakes_refused: read(&counters.handshakes_refused),
            handshakes_failed: read(&counters.handshakes_failed),
            calls: read(&counters.calls),
            refusals: read(&counters.refusals),
            wrong_secrets: read(&counters.wrong_secrets),
            malformed: read(&counters.malformed),
            pushes: read(&counters.pushes),
        }
    }
}

impl ClientListener {
    /// Accepts connections until `ClientListener::shutdown` is called.
    pub async fn run(&self) {
        let mut shutdown = self.shutdown.subscribe();
        loop {
            let incoming = tokio::select! {
                incoming = self.endpoint.accept() => incoming,
                _ = shutdown.wait_for(|stopping| *stopping) => break,
            };
            let Some(incoming) = incoming else { break };
            self.admit(incoming);
        }
    }

    /// Starts the handshake of `incoming` if fewer than [`MAX_HANDSHAKES`]
    /// are in progress, or refuses it (the client backs off and retries).
    fn admit(&self, incoming: Incoming) {
        let Ok(permit) = self.handshakes.clone().try_acquire_owned() else {
            self.service.counters.handshakes_refused.fetch_add(1, Ordering::Relaxed);
            incoming.refuse();
            return;
        };
        let service = self.service.clone();
        tokio::spawn(async move {
            let remote = incoming.remote_address();
            let connection = match incoming.accept() {
                Ok(connecting) => connecting.await,
                Err(error) => Err(error),
            };
            drop(permit);
            match connection {
                Ok(connection) => {
                    service.counters.connections_accepted.fetch_add(1, Ordering::Relaxed);
                    service.counters.connections_open.fetch_add(1, Ordering::Relaxed);
                    serve_connection(service.clone(), connection).await;
                    service.counters.connections_open.fetch_sub(1, Ordering::Relaxed);
                }
                Err(error) => {
                    service.counters.handshakes_failed.fetch_add(1, Ordering::Relaxed);
                    if let Some(held_back) = HANDSHAKE_FAILURES.admit() {
                        tracing::info!(%remote, %error, held_back, "client handshake failed");
                    }
                }
            }
        });
    }

    /// Stops accepting connections and ends every watch (each watcher is
    /// told the server is shutting down). Calls in progress finish.
    pub fn stop_accepting(&self) {
        let _ = self.shutdown.send(true);
        self.endpoint.set_server_config(None);
    }

    /// Closes every connection with [`codes::SHUTTING_DOWN`] and waits
    /// until the peers have been told, at most [`CLOSE_WAIT`]: a handshake
    /// caught half-way would otherwise hold the wait for the whole idle
    /// timeout.
    pub async fn close(&self) {
        self.stop_accepting();
        self.endpoint.close(codes::SHUTTING_DOWN, b"server shutting down");
        let _ = tokio::time::timeout(CLOSE_WAIT, self.endpoint.wait_idle()).await;
    }
}

/// Serves every stream the client opens until the connection ends.
async fn serve_connection(service: Arc<Service>, connection: Connection) {
    let remote = connection.remote_address();
    let operator = crate::tls::is_operator(&connection);
    loop {
        match connection.accept_bi().await {
            Ok((send, recv)) => {
                let (service, connection) = (service.clone(), connection.clone());
                tokio::spawn(async move { serve_stream(&service, &connection, operator, send, recv).await });
            }
            Err(error) => {
                tracing::debug!(%remote, %error, "client connection ended");
                return;
            }
        }
    }
}

/// Serves a stream: a watch or a services read, or the calls of a call
/// stream (`crate::calls`), answered in order, each answer carrying its
/// request's id ([`serve_calls`]). A client of an earlier build sends one
/// call and finishes its side; every client's stream is finished here once
/// the client finished its side and every call on it was answered.
async fn serve_stream(
    service: &Service,
    connection: &Connection,
    operator: bool,
    mut send: SendStream,
    mut recv: RecvStream,
) {
    let remote = connection.remote_address();
    let mut reader = FrameReader::new(MAX_REQUEST);
    let frame = match reader.next(&mut recv).await {
        Ok(Some(frame)) => frame,
        Ok(None) => return,
        Err(StreamError::Read(error)) => {
            tracing::debug!(%remote, %error, "client stream ended before its request");
            return;
        }
        Err(error) => return refuse_malformed(service, remote, &mut send, &mut recv, 0, &error.to_string()).await,
    };
    if is_held(&frame) {
        service.counters.calls.fetch_add(1, Ordering::Relaxed);
        return serve_held(service, connection, frame, send, recv).await;
    }
    serve_calls(service, remote, operator, frame, reader, send, recv).await;
}

/// Serves the calls of a call stream, `first` and those after it, in
/// order, until the client finishes its side or the stream fails. A frame
/// whose message cannot be read is answered with a refusal and the stream
/// goes on (its framing is intact); bytes that are not a frame close it.
/// A call whose client stopped the stream (it gave up waiting) is dropped
/// where it is: node calls are idempotent, and the client repeats it.
async fn serve_calls(
    service: &Service,
    remote: SocketAddr,
    operator: bool,
    first: Frame,
    mut reader: FrameReader,
    mut send: SendStream,
    mut recv: RecvStream,
) {
    let mut frame = first;
    let mut answer = Vec::new();
    loop {
        service.counters.calls.fetch_add(1, Ordering::Relaxed);
        let request_id = frame.request_id;
        let served = tokio::select! {
            served = service.serve_call(remote, operator, &frame) => served,
            _ = send.stopped() => return,
        };
        let reply = served.unwrap_or_else(|error| {
            service.counters.malformed.fetch_add(1, Ordering::Relaxed);
            if let Some(held_back) = REFUSALS.admit() {
                tracing::warn!(%remote, %error, held_back, "refused a malformed client call");
            }
            Refusal { code: RefusalCode::Malformed, message: error.to_string() }.to_frame(request_id)
        });
        answer.clear();
        if let Err(error) = reply.encode(&mut answer) {
            let refusal = Refusal { code: RefusalCode::Internal, message: format!("encoding the reply: {error}") };
            answer.clear();
            refusal.to_frame(request_id).encode(&mut answer).expect("a refusal encodes");
        }
        if let Err(error) = send.write_all(&answer).await {
            tracing::debug!(%remote, %error, "could not answer a client call");
            return;
        }
        frame = match reader.next(&mut recv).await {
            Ok(Some(frame)) if is_held(&frame) => {
                let why = "a watch or a services read opens a stream of its own";
                return refuse_malformed(service, remote, &mut send, &mut recv, frame.request_id, why).await;
            }
            Ok(Some(frame)) => frame,
            Ok(None) => {
                let _ = send.finish();
                return;
            }
            Err(StreamError::Read(error)) => {
                tracing::debug!(%remote, %error, "client call stream ended");
                return;
            }
            Err(error) => return refuse_malformed(service, remote, &mut send, &mut recv, 0, &error.to_string()).await,
        };
    }
}

/// Whether `frame` opens a stream the server holds ([`serve_held`]).
fn is_held(frame: &Frame) -> bool {
    matches!(Kind::try_from(frame.kind), Ok(Kind::WatchAllocs | Kind::WatchAllocChanges | Kind::ReadServices))
}

/// Serves a stream the server holds: a watch, or a services read.
async fn serve_held(
    service: &Service,
    connection: &Connection,
    frame: Frame,
    mut send: SendStream,
    mut recv: RecvStream,
) {
    let remote = connection.remote_address();
    let request_id = frame.request_id;
    let watch = match Kind::try_from(frame.kind) {
        Ok(Kind::WatchAllocChanges) => {
            Some(WatchAllocChangesRequest::from_frame(&frame).map(|request| (request.0, PushForm::Changes)))
        }
        Ok(Kind::WatchAllocs) => Some(WatchAllocsRequest::from_frame(&frame).map(|request| (request, PushForm::Whole))),
        _ => None,
    };
    if let Some(watch) = watch {
        return match watch {
            Ok((request, form)) => watch_allocs(service, connection, request, form, request_id, send).await,
            Err(error) => refuse_malformed(service, remote, &mut send, &mut recv, request_id, &error.to_string()).await,
        };
    }
    let reply = match ReadServicesRequest::from_frame(&frame) {
        Ok(request) if request.queries.len() <= MAX_SERVICE_QUERIES => {
            // An agent that gave the read up (its wanted set changed)
            // dropped its end, which stops this stream: the hold ends
            // there and the stream is free for its other calls.
            // Boxed, so a watch's task is not sized for it.
            tokio::select! {
                reply = Box::pin(read_services(service, remote, request, request_id)) => reply,
                _ = send.stopped() => return,
            }
        }
        Ok(request) => {
            let why = format!("{} queries: a read carries at most {MAX_SERVICE_QUERIES}", request.queries.len());
            return refuse_malformed(service, remote, &mut send, &mut recv, request_id, &why).await;
        }
        Err(error) => {
            return refuse_malformed(service, remote, &mut send, &mut recv, request_id, &error.to_string()).await
        }
    };
    if let Err(error) = write_last_frame(&mut send, &reply).await {
        tracing::debug!(%remote, %error, "could not answer a services read");
    }
}

impl Service {
    /// Serves one call of a call stream: here while this server leads (or
    /// is the only one), at the leader otherwise; its reply frame, or the
    /// request's flaw.
    async fn serve_call(&self, remote: SocketAddr, operator: bool, frame: &Frame) -> Result<Frame, MessageError> {
        let request_id = frame.request_id;
        let mut outcome = match self.settle().await {
            Ok(Serve::Here(nodes)) => self.reply(&nodes, remote, operator, frame).await,
            Ok(Serve::Leader(route)) => Ok(forward(route.as_ref(), frame, operator).await),
            Err(refusal) => Ok(refusal.to_frame(request_id)),
        };
        // The leadership moved between the settle and the forward (this
        // server taking it over, or the leader losing it): a node's own
        // calls are idempotent (a registration, a heartbeat, a report of
        // its allocations), so one is settled again, once, and served where
        // the leader is now, rather than refused for an election that has
        // ended.
        if matches!(&outcome, Ok(reply) if is_no_leader(reply)) && is_node_call(frame) {
            outcome = match self.settle().await {
                Ok(Serve::Here(nodes)) => self.reply(&nodes, remote, operator, frame).await,
                Ok(Serve::Leader(route)) => Ok(forward(route.as_ref(), frame, operator).await),
                Err(refusal) => Ok(refusal.to_frame(request_id)),
            };
        }
        match outcome {
            Ok(reply) => Ok(reply),
            Err(Failure::Malformed(error)) => Err(error),
            Err(Failure::Refused(error)) => Ok(self.refusal(remote, &error).to_frame(request_id)),
        }
    }
}

/// Who serves a node call ([`Service::settle`]).
enum Serve {
    /// This server, with this node endpoint.
    Here(NodeEndpoint),
    /// The leader, another server, through the route.
    Leader(Arc<dyn Route>),
}

/// The remote address logged for a call another server forwarded.
const FORWARDED: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0);

/// The refusal while the cluster has no leader (an election).
fn no_leader() -> Refusal {
    Refusal { code: RefusalCode::NoLeader, message: "no cluster leader; try again".to_string() }
}

/// Whether `reply` refuses for want of a leader.
fn is_no_leader(reply: &Frame) -> bool {
    matches!(Refusal::from_frame(reply), Ok(refusal) if refusal.code == RefusalCode::NoLeader)
}

/// Whether `frame` is one of a node's own idempotent calls.
fn is_node_call(frame: &Frame) -> bool {
    matches!(Kind::try_from(frame.kind), Ok(Kind::Register | Kind::Heartbeat | Kind::UpdateAllocs))
}

/// Forwards `frame` to the leader through `route`; the leader's reply frame.
async fn forward(route: &dyn Route, frame: &Frame, operator: bool) -> Frame {
    let mut request = Vec::new();
    if let Err(error) = frame.encode(&mut request) {
        return Refusal { code: RefusalCode::Malformed, message: error.to_string() }.to_frame(frame.request_id);
    }
    let answer = match route.forward(request, operator).await {
        Ok(answer) => answer,
        Err(refusal) => return refusal.to_frame(frame.request_id),
    };
    match Frame::decode_within(&answer, MAX_PAYLOAD) {
        Ok(Some((reply, _))) => reply,
        _ => Refusal { code: RefusalCode::Internal, message: "the leader's answer was not a frame".to_string() }
            .to_frame(frame.request_id),
    }
}

impl Service {
    /// Who serves node calls: the listener's own endpoint when not routed;
    /// when routed, the leader services' while this server leads, the
    /// leader through the route while another server does, and while
    /// there is none, whichever of the two the hold ends with
    /// ([`Route::hold`]).
    async fn settle(&self) -> Result<Serve, Refusal> {
        let Some(route) = self.route.get() else { return Ok(Serve::Here(self.nodes.clone())) };
        if let Some(nodes) = route.leading() {
            return Ok(Serve::Here(nodes));
        }
        Ok(match route.hold().await? {
            Some(nodes) => Serve::Here(nodes),
            None => Serve::Leader(route.clone()),
        })
    }

    /// Serves one request frame other than a watch with `nodes`; its reply frame.
    async fn reply(
        &self,
        nodes: &NodeEndpoint,
        remote: SocketAddr,
        operator: bool,
        frame: &Frame,
    ) -> Result<Frame, Failure> {
        let request_id = frame.request_id;
        match Kind::try_from(frame.kind) {
            // The calls a node makes rarely are boxed: a registration
            // carries a whole node, and its future would size every call
            // stream's task for it (2.3 of its 3.4 KB), 10,000 times over.
            // Heartbeats and allocation updates stay inline.
            Ok(Kind::Register) => Box::pin(answer(frame, |request: RegisterRequest| async move {
                let reply = nodes.register_async(request.node).await?;
                Ok(self.node_reply(reply))
            }))
            .await
            .map(|reply| reply.to_frame(request_id)),
            Ok(Kind::Heartbeat) => answer(frame, |request: HeartbeatRequest| async move {
                nodes.authenticate(request.node_id, request.secret_id)?;
                let reply = nodes.update_status_async(request.node_id, request.status).await?;
                Ok(self.node_reply(reply))
            })
            .await
            .map(|reply| reply.to_frame(request_id)),
            Ok(Kind::DrainSelf) => Box::pin(answer(frame, |request: DrainSelfRequest| async move {
                nodes.authenticate(request.node_id, request.secret_id)?;
                let drain = (DrainDeadline::from_nanos(request.deadline_nanos), request.ignore_system_jobs);
                let change = DrainRequest { drain: Some(drain), ..DrainRequest::default() };
                let written = nodes.drain_async(request.node_id, change).await?;
                Ok(IndexReply { index: written.index })
            }))
            .await
            .map(|reply| reply.to_frame(request_id)),
            Ok(Kind::UpdateAllocs) => answer(frame, |request: UpdateAllocsRequest| async move {
                nodes.authenticate(request.node_id, request.secret_id)?;
                let index = nodes.update_allocs_async(request.node_id, request.updates).await?;
                Ok(IndexReply { index })
            })
            .await
            .map(|reply| reply.to_frame(request_id)),
            Ok(Kind::SubmitJob) => match SubmitJobRequest::from_frame(frame) {
                Ok(request) => {
                    match Box::pin(self.operation(remote, operator, move |ops| ops.submit_job(request.job))).await {
                        Ok(Ok(index)) => Ok(IndexReply { index }.to_frame(request_id)),
                        Ok(Err(error)) => Ok(self.job_refusal(&error).to_frame(request_id)),
                        Err(refusal) => Ok(refusal.to_frame(request_id)),
                    }
                }
                Err(error) => Err(Failure::Malformed(error)),
            },
            Ok(Kind::Report) => match ReportRequest::from_frame(frame) {
                Ok(ReportRequest { scope }) => {
                    match Box::pin(self.operation(remote, operator, move |ops| ops.report(scope))).await {
                        Ok(mut report) => {
                            report.listener = self.stats_without_endpoint();
                            Ok(report.to_frame(request_id))
                        }
                        Err(refusal) => Ok(refusal.to_frame(request_id)),
                    }
                }
                Err(error) => Err(Failure::Malformed(error)),
            },
            Ok(other) => {
                Err(Failure::Malformed(MessageError::Malformed { kind: other, reason: "not a request".to_string() }))
            }
            Err(error) => Err(Failure::Malformed(error)),
        }
    }
}

/// Why a call got no reply of its own kind.
enum Failure {
    /// The request was not a valid message.
    Malformed(MessageError),
    /// The engine refused it.
    Refused(NodeError),
}

/// Decodes the request in `frame` and serves it with `serve`.
async fn answer<Request, Reply, Serve, Served>(frame: &Frame, serve: Serve) -> Result<Reply, Failure>
where
    Request: Message,
    Serve: FnOnce(Request) -> Served,
    Served: std::future::Future<Output = Result<Reply, NodeError>>,
{
    let request = Request::from_frame(frame).map_err(Failure::Malformed)?;
    serve(request).await.map_err(Failure::Refused)
}

/// Answers a request that could not be read with a [`Refusal`] saying why,
/// then closes the stream; the connection and other streams carry on.
async fn refuse_malformed(
    service: &Service,
    remote: SocketAddr,
    send: &mut SendStream,
    recv: &mut RecvStream,
    request_id: u64,
    why: &str,
) {
    service.counters.malformed.fetch_add(1, Ordering::Relaxed);
    if let Some(held_back) = REFUSALS.admit() {
        tracing::warn!(%remote, why, held_back, "closed a client stream: malformed request");
    }
    let refusal = Refusal { code: RefusalCode::Malformed, message: why.to_string() };
    let _ = recv.stop(codes::MALFORMED);
    if write_last_frame(send, &refusal.to_frame(request_id)).await.is_err() {
        abandon(send, recv, codes::MALFORMED);
    }
}

/// The node's allocation watch: pushes its allocations whenever a write
/// changed them after the last index pushed (or the client's `last_index`
/// on a resumed watch), in `form`, until the client goes away or the
/// server stops.
async fn watch_allocs(
    service: &Service,
    connection: &Connection,
    request: WatchAllocsRequest,
    form: PushForm,
    request_id: u64,
    mut send: SendStream,
) {
    let remote = connection.remote_address();
    if let Err(error) = service.nodes.authenticate(request.node_id, request.secret_id) {
        let refusal = service.refusal(remote, &error);
        let _ = write_last_frame(&mut send, &refusal.to_frame(request_id)).await;
        return;
    }
    service.agents.hold(request.node_id, connection);
    push_allocs(service, remote, &request, form, request_id, send).await;
    service.agents.release(request.node_id, connection);
}

/// How a watch's pushes carry the node's allocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PushForm {
    /// All of them each time ([`AllocsPush`]), for agents of earlier builds.
    Whole,
    /// Those stored anew since the stream's last push (all of them in its
    /// first), and every id ([`AllocChanges`]).
    Changes,
}

/// The pushes of an authenticated watch ([`watch_allocs`]).
async fn push_allocs(
    service: &Service,
    remote: SocketAddr,
    request: &WatchAllocsRequest,
    form: PushForm,
    request_id: u64,
    mut send: SendStream,
) {
    let mut shutdown = service.shutdown.clone();
    let mut last_index = request.last_index;
    let mut pushed = false;
    loop {
        let found = tokio::select! {
            found = service.nodes.allocs_async(request.node_id, last_index) => found,
            _ = send.stopped() => return,
            _ = shutdown.wait_for(|stopping| *stopping) => Err(NodeError::Wait(WaitError::Shutdown { wanted: last_index + 1 })),
        };
        let frame = match (found, form) {
            (Ok((allocs, index)), PushForm::Whole) => {
                last_index = index;
                AllocsPush { index, allocs }.to_frame(request_id)
            }
            (Ok((allocs, index)), PushForm::Changes) => {
                // What the agent has not seen: stored after the last index
                // pushed on this stream. A stream's first push carries them
                // all, even on a resumed watch: the agent's index may come
                // from another timeline (a server restored from an older
                // snapshot), and only this stream's own indexes are sure.
                let listed = allocs.iter().map(|alloc| alloc.id).collect();
                let since = if pushed { last_index } else { 0 };
                last_index = index;
                let allocs = allocs.into_iter().filter(|alloc| alloc.modify_index > since).collect();
                AllocChanges { index, listed, allocs }.to_frame(request_id)
            }
            (Err(error), _) => {
                let refusal = service.refusal(remote, &error);
                let _ = write_last_frame(&mut send, &refusal.to_frame(request_id)).await;
                return;
            }
        };
        if let Err(error) = write_frame(&mut send, &frame).await {
            tracing::debug!(%remote, %error, "allocation watch ended");
            return;
        }
        pushed = true;
        service.counters.pushes.fetch_add(1, Ordering::Relaxed);
    }
}

/// An agent's services read, served from this server's own state like a
/// watch (any server answers it): authenticated by the node's secret, then
/// held until the services table changes after the agent's index or the
/// wait ends (at most [`MAX_SERVICES_WAIT`]), when it answers with the data
/// as it is. A shutdown ends the hold with a refusal.
async fn read_services(service: &Service, remote: SocketAddr, request: ReadServicesRequest, request_id: u64) -> Frame {
    if let Err(error) = service.nodes.authenticate(request.node_id, request.secret_id) {
        return service.refusal(remote, &error).to_frame(request_id);
    }
    let wait = request.wait.min(MAX_SERVICES_WAIT);
    let mut shutdown = service.shutdown.clone();
    let read = service.nodes.read_services_async(request.node_id, &request.queries, request.min_index);
    let found = tokio::select! {
        found = tokio::time::timeout(wait, read) => match found {
            Ok(found) => found,
            Err(_) => Ok(service.nodes.read_services_now(&request.queries)),
        },
        _ = shutdown.wait_for(|stopping| *stopping) => {
            Err(NodeError::Wait(WaitError::Shutdown { wanted: request.min_index.saturating_add(1) }))
        }
    };
    match found {
        Ok(read) => ServicesReply { index: read.index, answers: read.answers }.to_frame(request_id),
        Err(error) => service.refusal(remote, &error).to_frame(request_id),
    }
}

impl Service {
    /// Runs an operator call on the blocking pool, or refuses it: the
    /// connection has no operator certificate, or the server offers none.
    async fn operation<T: Send + 'static>(
        &self,
        remote: SocketAddr,
        operator: bool,
        call: impl FnOnce(&dyn Operations) -> T + Send + 'static,
    ) -> Result<T, Refusal> {
        let Some(operations) = self.operations.clone().filter(|_| operator) else {
            self.counters.refusals.fetch_add(1, Ordering::Relaxed);
            if let Some(held_back) = REFUSALS.admit() {
                tracing::warn!(%remote, held_back, "refused an operator call from a connection without an operator certificate");
            }
            return Err(Refusal {
                code: RefusalCode::Forbidden,
                message: "operator calls need an operator certificate".to_string(),
            });
        };
        tokio::task::spawn_blocking(move || call(operations.as_ref())).await.map_err(|error| Refusal {
            code: RefusalCode::Internal,
            message: format!("the operator call failed: {error}"),
        })
    }

    fn node_reply(&self, reply: engine::node::endpoint::NodeResponse) -> NodeReply {
        NodeReply {
            index: reply.index,
            status: reply.status,
            heartbeat_ttl: reply.heartbeat_ttl,
            servers: match self.route.get() {
                Some(route) => route.servers(),
                None => self.servers.clone(),
            },
        }
    }

    /// The refusal for `error`, counted; a wrong secret is logged.
    fn refusal(&self, remote: SocketAddr, error: &NodeError) -> Refusal {
        self.counters.refusals.fetch_add(1, Ordering::Relaxed);
        let code = match error {
            NodeError::UnknownNode(_) => RefusalCode::UnknownNode,
            NodeError::WrongSecret { node } => {
                self.counters.wrong_secrets.fetch_add(1, Ordering::Relaxed);
                if let Some(held_back) = REFUSALS.admit() {
                    tracing::warn!(%remote, node = %node, held_back, "refused a call with a wrong node secret");
                }
                RefusalCode::WrongSecret
            }
            NodeError::NotConnected { .. } => RefusalCode::NotConnected,
            NodeError::StatusNotAllowed { .. } => RefusalCode::StatusNotAllowed,
            NodeError::NotItsAllocation { .. } => RefusalCode::NotItsAllocation,
            NodeError::EmptyUpdate { .. } => RefusalCode::EmptyUpdate,
            NodeError::Wait(WaitError::Shutdown { .. }) => RefusalCode::ShuttingDown,
            NodeError::State(error) => state_refusal_code(error),
            NodeError::Wait(_) => RefusalCode::Internal,
        };
        Refusal { code, message: error.to_string() }
    }

    /// The refusal for an operator's job that was not registered.
    fn job_refusal(&self, error: &JobError) -> Refusal {
        let code = match error {
            JobError::State(error) => state_refusal_code(error),
            _ => RefusalCode::Invalid,
        };
        Refusal { code, message: error.to_string() }
    }
}

/// How a write the state or its log refused is answered.
fn state_refusal_code(error: &StateError) -> RefusalCode {
    match error {
        StateError::ShuttingDown => RefusalCode::ShuttingDown,
        // This server does not lead (any more): in a cluster, it lost the
        // leadership or its quorum while writing. The write may still
        // commit; every call is safe to repeat, on the leader the message
        // names or here after the election.
        StateError::Log(LogError::NotLeader { .. }) => RefusalCode::NoLeader,
        // raft stopped or failed here: no retry on this server helps.
        StateError::Log(LogError::Stopped { .. }) => RefusalCode::LogStopped,
        _ => RefusalCode::Internal,
    }
}
