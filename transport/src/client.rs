//! The client side: endpoints to connect from, a connection's calls, the
//! allocation watch.
//!
//! A quinn endpoint owns a UDP socket, a driver task and megabytes of
//! receive buffers, so a process that speaks for many clients (loadgen)
//! shares a few endpoints among all its connections ([`ClientEndpoints`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use engine::node::service_reads::ServiceQuery;
use engine::state::ClientAllocUpdate;
use engine::structs::{Node, NodeId, NodeStatus};
use quinn::{Endpoint, RecvStream, SendStream};
use uuid::Uuid;

use crate::calls::CallStream;
use crate::frame::MAX_PAYLOAD;
use crate::message::{
    AllocChanges, ClusterReport, DrainSelfRequest, HeartbeatRequest, IndexReply, Kind, Message, MessageError,
    NodeReply, ReadServicesRequest, Refusal, RefusalCode, RegisterRequest, ReportRequest, ReportScope, ServicesReply,
    SubmitJobRequest, UpdateAllocsRequest, WatchAllocChangesRequest, WatchAllocsRequest,
};
use crate::settings;
use crate::stream::{codes, write_frame, FrameReader, StreamError};
use crate::tls::{TlsError, TlsMaterial, SERVER_NAME};

/// Why a call did not get its answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The connection could not be started.
    #[error("connecting: {0}")]
    Connect(#[from] quinn::ConnectError),
    /// The connection failed or was closed (by either side).
    #[error("connection: {0}")]
    Connection(#[from] quinn::ConnectionError),
    /// The call's stream failed.
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// The answer was not a valid message.
    #[error(transparent)]
    Message(#[from] MessageError),
    /// The server refused the call.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The server finished the stream without answering.
    #[error("the server closed the call without an answer")]
    NoAnswer,
    /// No answer came within the caller's time limit.
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

impl CallError {
    /// The refusal's code, when the server refused.
    pub fn refusal(&self) -> Option<RefusalCode> {
        match self {
            CallError::Refused(refusal) => Some(refusal.code),
            _ => None,
        }
    }

    /// Whether the call may simply be made again on the same connection: it
    /// timed out or only its stream failed, while the connection lives.
    pub fn is_transient(&self) -> bool {
        match self {
            CallError::TimedOut(_) | CallError::NoAnswer => true,
            // An election: the server lives and will have a leader again.
            CallError::Refused(refusal) => refusal.code == RefusalCode::NoLeader,
            CallError::Stream(_) => !self.is_connection_lost(),
            _ => false,
        }
    }

    /// Whether the connection itself is gone (reconnect before calling again).
    pub fn is_connection_lost(&self) -> bool {
        match self {
            CallError::Connect(_) | CallError::Connection(_) => true,
            CallError::Stream(StreamError::Read(quinn::ReadError::ConnectionLost(_)))
            | CallError::Stream(StreamError::Write(quinn::WriteError::ConnectionLost(_))) => true,
            CallError::Refused(refusal) => refusal.code == RefusalCode::ShuttingDown,
            _ => false,
        }
    }
}

/// A few client endpoints that connections are spread over.
#[derive(Debug)]
pub struct ClientEndpoints {
    endpoints: Vec<Endpoint>,
    next: AtomicUsize,
    tls: TlsMaterial,
    /// One config for connections that share resumption tickets.
    shared: quinn::ClientConfig,
}

impl ClientEndpoints {
    /// `count` endpoints on ephemeral loopback-or-any ports. Call from
    /// within a tokio runtime.
    pub fn bind(count: usize, tls: &TlsMaterial) -> Result<ClientEndpoints, ConnectSetupError> {
        let bind_addr: SocketAddr = "0.0.0.0:0".parse().expect("a valid address");
        let endpoints = (0..count.max(1))
            .map(|_| settings::endpoint(bind_addr, None).map_err(ConnectSetupError::Bind))
            .collect::<Result<Vec<_>, _>>()?;
        let shared = settings::client_config(tls.client_crypto(8)?);
        Ok(ClientEndpoints { endpoints, next: AtomicUsize::new(0), tls: tls.clone(), shared })
    }

    /// A client config of its own (its own resumption tickets), for a
    /// simulated client that should resume like a real agent would.
    pub fn own_config(&self) -> Result<quinn::ClientConfig, TlsError> {
        Ok(settings::client_config(self.tls.client_crypto(2)?))
    }

    /// Connects to `server` (checking its certificate is the cluster's
    /// server certificate) with the shared config.
    pub async fn connect(&self, server: SocketAddr) -> Result<ClientConnection, CallError> {
        self.connect_with(self.shared.clone(), server).await
    }

    /// Connects with `config`.
    pub async fn connect_with(
        &self,
        config: quinn::ClientConfig,
        server: SocketAddr,
    ) -> Result<ClientConnection, CallError> {
        let endpoint = &self.endpoints[self.next.fetch_add(1, Ordering::Relaxed) % self.endpoints.len()];
        let connection = endpoint.connect_with(config, server, SERVER_NAME)?.await?;
        let calls = Arc::new(CallStream::new(connection.clone()));
        Ok(ClientConnection { connection, calls, next_request: Arc::new(AtomicU64::new(1)) })
    }

    /// Closes every connection and waits until the servers were told.
    pub async fn close(&self) {
        for endpoint in &self.endpoints {
            endpoint.close(codes::CLIENT_LEAVING, b"client leaving");
        }
        for endpoint in &self.endpoints {
            endpoint.wait_idle().await;
        }
    }
}

/// Why client endpoints could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ConnectSetupError {
    /// The TLS material is unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A UDP socket could not be bound.
    #[error("binding a client socket: {0}")]
    Bind(std::io::Error),
}

/// One client's connection to a server.
#[derive(Debug, Clone)]
pub struct ClientConnection {
    connection: quinn::Connection,
    /// Where every call but a watch or a services read goes (`crate::calls`).
    calls: Arc<CallStream>,
    next_request: Arc<AtomicU64>,
}

impl ClientConnection {
    /// Registers `node` (its `secret_id` is the secret of every later call).
    pub async fn register(&self, node: Node) -> Result<NodeReply, CallError> {
        self.call(&RegisterRequest { node }).await
    }

    /// Heartbeats, asking for `status`.
    pub async fn heartbeat(
        &self,
        node_id: NodeId,
        secret_id: Uuid,
        status: NodeStatus,
    ) -> Result<NodeReply, CallError> {
        self.call(&HeartbeatRequest { node_id, secret_id, status }).await
    }

    /// Reports allocation statuses; answers with the index they were written at.
    pub async fn update_allocs(
        &self,
        node_id: NodeId,
        secret_id: Uuid,
        updates: Vec<ClientAllocUpdate>,
    ) -> Result<u64, CallError> {
        let reply: IndexReply = self.call(&UpdateAllocsRequest { node_id, secret_id, updates }).await?;
        Ok(reply.index)
    }

    /// Drains the node (its `drain_on_shutdown`): `deadline_nanos` as
    /// Nomad's (negative forces, zero is none); answers with the index
    /// the drain was written at.
    pub async fn drain_self(
        &self,
        node_id: NodeId,
        secret_id: Uuid,
        deadline_nanos: i64,
        ignore_system_jobs: bool,
    ) -> Result<u64, CallError> {
        let reply: IndexReply =
            self.call(&DrainSelfRequest { node_id, secret_id, deadline_nanos, ignore_system_jobs }).await?;
        Ok(reply.index)
    }

    /// Reads service registrations for the node's templates: answered once
    /// the services table changed after `min_index` (at once for 0), or
    /// after `wait` unchanged. Bound the call by more than `wait`.
    pub async fn read_services(
        &self,
        node_id: NodeId,
        secret_id: Uuid,
        queries: Vec<ServiceQuery>,
        min_index: u64,
        wait: Duration,
    ) -> Result<ServicesReply, CallError> {
        // The server holds it, so it goes on a stream of its own (`crate::calls`).
        let request = ReadServicesRequest { node_id, secret_id, queries, min_index, wait };
        let (mut send, mut recv) = self.connection.open_bi().await?;
        let request_id = self.next_request.fetch_add(1, Ordering::Relaxed);
        write_frame(&mut send, &request.to_frame(request_id)).await?;
        let _ = send.finish();
        let frame = FrameReader::new(MAX_PAYLOAD).next(&mut recv).await?.ok_or(CallError::NoAnswer)?;
        reply_of(&frame)
    }

    /// Opens the node's allocation watch, resuming after `last_index` (0:
    /// from the start); each push says what changed ([`AllocChanges`]).
    pub async fn watch_allocs(
        &self,
        node_id: NodeId,
        secret_id: Uuid,
        last_index: u64,
    ) -> Result<AllocWatch, CallError> {
        let (mut send, recv) = self.connection.open_bi().await?;
        let request_id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let request = WatchAllocChangesRequest(WatchAllocsRequest { node_id, secret_id, last_index });
        write_frame(&mut send, &request.to_frame(request_id)).await?;
        Ok(AllocWatch { _send: send, recv, reader: FrameReader::new(MAX_PAYLOAD) })
    }

    /// The next call the server makes on this connection
    /// (`crate::agent_call`); an error once the connection is gone.
    pub async fn accept_call(&self) -> Result<crate::agent_call::ServerCall, CallError> {
        let (send, recv) = self.connection.accept_bi().await?;
        Ok(crate::agent_call::ServerCall::new(send, recv))
    }

    /// Registers `job` (operator certificates only); the index it was written at.
    pub async fn submit_job(&self, job: engine::structs::Job) -> Result<u64, CallError> {
        let reply: IndexReply = self.call(&SubmitJobRequest { job }).await?;
        Ok(reply.index)
    }

    /// The full cluster report, with its audit (operator certificates
    /// only): for the end of a run; poll with [`ClientConnection::progress`].
    pub async fn report(&self) -> Result<ClusterReport, CallError> {
        self.call(&ReportRequest { scope: ReportScope::Full }).await
    }

    /// The cluster report without its audit (operator certificates only):
    /// cheap enough to poll.
    pub async fn progress(&self) -> Result<ClusterReport, CallError> {
        self.call(&ReportRequest { scope: ReportScope::Progress }).await
    }

    /// The round-trip time quinn estimates for the connection.
    pub fn rtt(&self) -> Duration {
        self.connection.rtt()
    }

    /// Closes the connection, telling the server the client is leaving.
    pub fn close(&self) {
        self.connection.close(codes::CLIENT_LEAVING, b"client leaving");
    }

    /// Resolves when the connection is closed, with why.
    pub async fn closed(&self) -> quinn::ConnectionError {
        self.connection.closed().await
    }

    /// Writes raw bytes on a new stream and reads the server's first frame
    /// back: the hook for tests and fuzzing of the server's decoder.
    pub async fn raw_call(&self, bytes: &[u8]) -> Result<Option<crate::frame::Frame>, CallError> {
        let (mut send, mut recv) = self.connection.open_bi().await?;
        send.write_all(bytes).await.map_err(StreamError::from)?;
        let _ = send.finish();
        Ok(FrameReader::new(MAX_PAYLOAD).next(&mut recv).await?)
    }

    /// Writes raw bytes on a new stream, finishes it, and reads every frame
    /// the server sends back until it finishes its side: how a client of
    /// an earlier build calls (one call per stream), and the hook for tests
    /// of a stream carrying several calls.
    pub async fn raw_calls(&self, bytes: &[u8]) -> Result<Vec<crate::frame::Frame>, CallError> {
        let (mut send, mut recv) = self.connection.open_bi().await?;
        send.write_all(bytes).await.map_err(StreamError::from)?;
        let _ = send.finish();
        let mut reader = FrameReader::new(MAX_PAYLOAD);
        let mut frames = Vec::new();
        while let Some(frame) = reader.next(&mut recv).await? {
            frames.push(frame);
        }
        Ok(frames)
    }

    /// One call on the connection's call stream: the request, then its answer.
    async fn call<Request: Message, Reply: Message>(&self, request: &Request) -> Result<Reply, CallError> {
        let request_id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let frame = self.calls.call(&request.to_frame(request_id)).await?;
        reply_of(&frame)
    }
}

/// The reply in `frame`, or the server's refusal.
fn reply_of<Reply: Message>(frame: &crate::frame::Frame) -> Result<Reply, CallError> {
    if frame.kind == Kind::Refusal as u8 {
        return Err(CallError::Refused(Refusal::from_frame(frame)?));
    }
    Ok(Reply::from_frame(frame)?)
}

/// The node's allocation watch: each [`AllocWatch::next`] is what the
/// server's next write changed in the node's allocations.
#[derive(Debug)]
pub struct AllocWatch {
    /// Kept open: dropping it would not end the watch, but keeps the
    /// stream's state in one place.
    _send: SendStream,
    recv: RecvStream,
    reader: FrameReader,
}

impl AllocWatch {
    /// The next push; an error when the server refused the watch, ended
    /// it (shutdown) or the connection is gone.
    pub async fn next(&mut self) -> Result<AllocChanges, CallError> {
        let frame = self.reader.next(&mut self.recv).await?.ok_or(CallError::NoAnswer)?;
        if frame.kind == Kind::Refusal as u8 {
            return Err(CallError::Refused(Refusal::from_frame(&frame)?));
        }
        Ok(AllocChanges::from_frame(&frame)?)
    }
}
