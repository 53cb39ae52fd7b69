//! The server-to-server endpoint (UDP 4648 by default): raft's RPCs and the
//! calls a follower forwards to the leader, on an endpoint of its own so a
//! storm of client handshakes on the client endpoint cannot delay an
//! AppendEntries and cause an election.
//!
//! Both sides are servers of the cluster: mutual TLS with the cluster CA,
//! [`crate::tls::PEER_ALPN`], and the peer's certificate must name
//! [`crate::tls::SERVER_NAME`] (a client or operator certificate is
//! refused at the handshake's end).
//!
//! One call is one bidirectional stream: the caller writes a kind byte and
//! the request bytes and finishes; the callee answers with a status byte
//! (0 answered, 1 refused with a UTF-8 reason) and the answer, and
//! finishes. What the bytes mean is the [`PeerHandler`]'s business: this
//! module carries opaque bytes and knows nothing of raft or scheduling.
//!
//! A streamed call ([`Peers::call_stream`], for the kinds
//! [`PeerHandler::streams`] names) starts the same way, but its answer
//! is read as it comes: the callee writes the status byte with the first
//! bytes of the answer ([`PeerSink`]) and goes on writing until the answer
//! ends or the caller stops reading. Flow control holds a callee that
//! writes faster than the caller reads. Streamed calls travel on a
//! connection of their own to each peer, with small windows
//! ([`STREAM_WINDOW`]): what a caller that stopped reading holds up stays
//! small, and never fills the window of the connection raft's calls use.
//!
//! Connections are made lazily, one per peer address, and dropped when a
//! call on them fails or times out, so the next call reconnects (a
//! restarted peer answers the old connection's packets with a stateless
//! reset).

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use quinn::{Connection, Endpoint, RecvStream, SendStream, TransportConfig, VarInt};

use crate::settings;
use crate::tls::{TlsError, TlsMaterial, SERVER_NAME};

/// The largest request or answer carried (an AppendEntries of 64 entries of
/// big plans, a snapshot chunk); larger ones are refused before they are
/// buffered.
pub const MAX_PEER_MESSAGE: usize = 256 * 1024 * 1024;

/// How long a connection to a peer may be silent before it is given up;
/// keep-alives every [`PEER_KEEP_ALIVE`] keep a healthy one open.
pub const PEER_IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// See [`PEER_IDLE_TIMEOUT`].
pub const PEER_KEEP_ALIVE: Duration = Duration::from_secs(2);

/// The receive window of one streamed call's answer (module docs).
pub const STREAM_WINDOW: u32 = 256 * 1024;

/// How long connecting to a peer may take.
pub const PEER_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Why a [`PeerHandler`] did not answer a call: the handler's own error,
/// whose message is sent back as the refusal's reason.
pub type PeerRefusal = Box<dyn std::error::Error + Send + Sync>;

/// A boxed answer of a [`PeerHandler`].
pub type PeerAnswer = Pin<Box<dyn Future<Output = Result<Vec<u8>, PeerRefusal>> + Send>>;

/// Serves the calls other servers make: `kind` says what `request` is.
/// An `Err` is sent back as the refusal's reason.
pub trait PeerHandler: Send + Sync + 'static {
    /// Answers one call.
    fn call(&self, kind: u8, request: Vec<u8>) -> PeerAnswer;

    /// Whether calls of `kind` are answered as a stream, by
    /// [`PeerHandler::stream`] (module docs).
    fn streams(&self, _kind: u8) -> bool {
        false
    }

    /// Answers one streamed call through `sink`, until the answer ends or
    /// the caller goes away.
    fn stream(&self, kind: u8, _request: Vec<u8>, sink: PeerSink) -> PeerStreaming {
        Box::pin(async move { sink.refuse(&format!("calls of kind {kind} are not streamed")).await })
    }
}

/// What [`PeerHandler::stream`] runs.
pub type PeerStreaming = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The callee's side of a streamed call (module docs).
#[derive(Debug)]
pub struct PeerSink {
    send: SendStream,
    started: bool,
}

/// The caller of a streamed call stopped reading (or is gone).
#[derive(Debug, thiserror::Error)]
#[error("the calling server stopped reading")]
pub struct CallerGone;

impl PeerSink {
    /// Writes the next bytes of the answer (the status byte first).
    pub async fn write(&mut self, bytes: &[u8]) -> Result<(), CallerGone> {
        if !self.started {
            self.send.write_all(&[0]).await.map_err(|_| CallerGone)?;
            self.started = true;
        }
        self.send.write_all(bytes).await.map_err(|_| CallerGone)
    }

    /// Refuses the call with `reason`; once bytes of an answer were
    /// written, the stream is reset instead (the caller sees it fail).
    pub async fn refuse(mut self, reason: &str) {
        if self.started {
            return self.abandon();
        }
        if self.send.write_all(&[1]).await.is_ok() && self.send.write_all(reason.as_bytes()).await.is_ok() {
            let _ = self.send.finish();
        }
    }

    /// Ends the answer (an empty one if nothing was written).
    pub async fn finish(mut self) {
        if !self.started && self.send.write_all(&[0]).await.is_err() {
            return;
        }
        let _ = self.send.finish();
    }

    /// Ends the answer as failed: the caller's read fails.
    pub fn abandon(mut self) {
        let _ = self.send.reset(crate::stream::codes::DONE);
    }

    /// Resolves once the caller stopped reading (or is gone).
    pub async fn stopped(&mut self) {
        let _ = self.send.stopped().await;
    }
}

/// Why a call to another server got no answer.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The connection could not be made.
    #[error("connecting to {addr}: {reason}")]
    Connect {
        /// The peer.
        addr: SocketAddr,
        /// Why.
        reason: String,
    },
    /// The connection or the call's stream failed.
    #[error("calling {addr}: {reason}")]
    Failed {
        /// The peer.
        addr: SocketAddr,
        /// Why.
        reason: String,
    },
    /// No answer came in time.
    #[error("calling {addr}: no answer within {after:?}")]
    TimedOut {
        /// The peer.
        addr: SocketAddr,
        /// The time limit.
        after: Duration,
    },
    /// The peer answered with a refusal.
    #[error("{addr} refused the call: {reason}")]
    Refused {
        /// The peer.
        addr: SocketAddr,
        /// Its reason.
        reason: String,
    },
}

/// This server's endpoint towards the other servers: it accepts their
/// calls and makes its own (module docs).
pub struct Peers {
    endpoint: Endpoint,
    client: quinn::ClientConfig,
    connections: parking_lot::Mutex<HashMap<SocketAddr, Connection>>,
    /// The config and connections of streamed calls (module docs).
    stream_client: quinn::ClientConfig,
    stream_connections: parking_lot::Mutex<HashMap<SocketAddr, Connection>>,
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peers").field("addr", &self.endpoint.local_addr().ok()).finish_non_exhaustive()
    }
}

/// The transport of the connections streamed calls use: answers a caller
/// holds up stay within [`STREAM_WINDOW`] each.
fn stream_transport() -> Arc<TransportConfig> {
    let mut config = TransportConfig::default();
    config
        .max_concurrent_bidi_streams(VarInt::from_u32(1024))
        .max_concurrent_uni_streams(VarInt::from_u32(0))
        .stream_receive_window(VarInt::from_u32(STREAM_WINDOW))
        .receive_window(VarInt::from_u32(16 * 1024 * 1024))
        .send_window(16 * 1024 * 1024)
        .max_idle_timeout(Some(PEER_IDLE_TIMEOUT.try_into().expect("10 s is a valid idle timeout")))
        .keep_alive_interval(Some(PEER_KEEP_ALIVE))
        .datagram_receive_buffer_size(None);
    Arc::new(config)
}

fn peer_transport() -> Arc<TransportConfig> {
    let mut config = TransportConfig::default();
    config
        .max_concurrent_bidi_streams(VarInt::from_u32(1024))
        .max_concurrent_uni_streams(VarInt::from_u32(0))
        // Entries and snapshot chunks are megabytes: wide windows between
        // a handful of servers cost little.
        .stream_receive_window(VarInt::from_u32(16 * 1024 * 1024))
        .receive_window(VarInt::from_u32(64 * 1024 * 1024))
        .send_window(64 * 1024 * 1024)
        .max_idle_timeout(Some(PEER_IDLE_TIMEOUT.try_into().expect("10 s is a valid idle timeout")))
        .keep_alive_interval(Some(PEER_KEEP_ALIVE))
        .datagram_receive_buffer_size(None);
    Arc::new(config)
}

impl Peers {
    /// Binds the endpoint on `addr` and serves other servers' calls with
    /// `handler` until [`Peers::close`]. Call from within a tokio runtime.
    pub fn bind(
        addr: SocketAddr,
        tls: &TlsMaterial,
        handler: Arc<dyn PeerHandler>,
    ) -> Result<Arc<Peers>, PeerSetupError> {
        let mut server = quinn::ServerConfig::with_crypto(tls.peer_server_crypto()?);
        server.transport_config(peer_transport());
        let endpoint =
            settings::endpoint(addr, Some(server)).map_err(|source| PeerSetupError::Bind { addr, source })?;
        let mut client = quinn::ClientConfig::new(tls.peer_client_crypto()?);
        client.transport_config(peer_transport());
        let mut stream_client = quinn::ClientConfig::new(tls.peer_client_crypto()?);
        stream_client.transport_config(stream_transport());
        let peers = Arc::new(Peers {
            endpoint,
            client,
            connections: parking_lot::Mutex::new(HashMap::new()),
            stream_client,
            stream_connections: parking_lot::Mutex::new(HashMap::new()),
        });
        tokio::spawn(accept(peers.endpoint.clone(), handler));
        Ok(peers)
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.endpoint.local_addr()
    }

    /// Calls the server at `addr`: sends `kind` and `request`, waits at most
    /// `timeout` for its answer.
    pub async fn call(
        &self,
        addr: SocketAddr,
        kind: u8,
        request: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, PeerError> {
        let connection = match tokio::time::timeout(timeout, self.connection(addr)).await {
            Ok(connection) => connection?,
            Err(_) => return Err(PeerError::TimedOut { addr, after: timeout }),
        };
        let called = tokio::time::timeout(timeout, exchange(&connection, kind, request)).await;
        let failed = |reason: String| PeerError::Failed { addr, reason };
        let answer = match called {
            Ok(Ok(answer)) => answer,
            Ok(Err(error)) => {
                self.forget(addr, &connection);
                return Err(failed(error.to_string()));
            }
            Err(_) => {
                self.forget(addr, &connection);
                return Err(PeerError::TimedOut { addr, after: timeout });
            }
        };
        match answer.split_first() {
            Some((0, answer)) => Ok(answer.to_vec()),
            Some((1, reason)) => Err(PeerError::Refused { addr, reason: String::from_utf8_lossy(reason).into_owned() }),
            _ => Err(failed("a malformed answer".to_string())),
        }
    }

    /// Makes a streamed call (module docs) to the server at `addr`: the
    /// answer's stream once its first bytes came, within `timeout`; what
    /// follows is read as it comes, with no time limit.
    pub async fn call_stream(
        &self,
        addr: SocketAddr,
        kind: u8,
        request: &[u8],
        timeout: Duration,
    ) -> Result<RecvStream, PeerError> {
        let connection = match tokio::time::timeout(timeout, self.connection_of(Lane::Streams, addr)).await {
            Ok(connection) => connection?,
            Err(_) => return Err(PeerError::TimedOut { addr, after: timeout }),
        };
        let failed = |reason: String| PeerError::Failed { addr, reason };
        let opened = tokio::time::timeout(timeout, open_stream(&connection, kind, request)).await;
        let (mut recv, status) = match opened {
            Ok(Ok(opened)) => opened,
            Ok(Err(error)) => {
                self.forget_of(Lane::Streams, addr, &connection);
                return Err(failed(error.to_string()));
            }
            Err(_) => return Err(PeerError::TimedOut { addr, after: timeout }),
        };
        match status {
            0 => Ok(recv),
            1 => {
                let reason = recv.read_to_end(MAX_PEER_MESSAGE).await.map_err(|error| failed(error.to_string()))?;
                Err(PeerError::Refused { addr, reason: String::from_utf8_lossy(&reason).into_owned() })
            }
            _ => Err(failed("a malformed answer".to_string())),
        }
    }

    /// The open connection to `addr`, or a new one.
    async fn connection(&self, addr: SocketAddr) -> Result<Connection, PeerError> {
        self.connection_of(Lane::Calls, addr).await
    }

    /// The config and the connections of `lane`.
    fn lane(&self, lane: Lane) -> (&quinn::ClientConfig, &parking_lot::Mutex<HashMap<SocketAddr, Connection>>) {
        match lane {
            Lane::Calls => (&self.client, &self.connections),
            Lane::Streams => (&self.stream_client, &self.stream_connections),
        }
    }

    /// The open connection of `lane` to `addr`, or a new one.
    async fn connection_of(&self, lane: Lane, addr: SocketAddr) -> Result<Connection, PeerError> {
        let (client, connections) = self.lane(lane);
        if let Some(connection) = connections.lock().get(&addr).filter(|open| open.close_reason().is_none()) {
            return Ok(connection.clone());
        }
        let connect_error = |reason: String| PeerError::Connect { addr, reason };
        let connecting = self
            .endpoint
            .connect_with(client.clone(), addr, SERVER_NAME)
            .map_err(|error| connect_error(error.to_string()))?;
        let connection = tokio::time::timeout(PEER_CONNECT_TIMEOUT, connecting)
            .await
            .map_err(|_| connect_error(format!("no handshake within {PEER_CONNECT_TIMEOUT:?}")))?
            .map_err(|error| connect_error(error.to_string()))?;
        connections.lock().insert(addr, connection.clone());
        Ok(connection)
    }

    /// Drops `connection` to `addr` (if it is still the one kept).
    fn forget(&self, addr: SocketAddr, connection: &Connection) {
        self.forget_of(Lane::Calls, addr, connection);
    }

    /// Drops `connection` of `lane` to `addr` (if it is still the one kept).
    fn forget_of(&self, lane: Lane, addr: SocketAddr, connection: &Connection) {
        let mut connections = self.lane(lane).1.lock();
        if connections.get(&addr).is_some_and(|kept| kept.stable_id() == connection.stable_id()) {
            connections.remove(&addr);
        }
        connection.close(crate::stream::codes::DONE, b"call failed");
    }

    /// Closes every connection and stops accepting calls.
    pub fn close(&self) {
        self.endpoint.close(crate::stream::codes::SHUTTING_DOWN, b"server shutting down");
    }
}

/// Which connections a call goes on (module docs).
#[derive(Clone, Copy, Debug)]
enum Lane {
    /// Raft's and every other whole-answer call.
    Calls,
    /// Streamed calls.
    Streams,
}

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum PeerSetupError {
    /// The TLS material is unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The UDP socket could not be bound.
    #[error("binding the server-to-server endpoint {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// Why a call's stream failed ([`PeerError::Failed`]).
#[derive(Debug, thiserror::Error)]
enum ExchangeError {
    /// No stream could be opened: the connection is gone.
    #[error(transparent)]
    Open(#[from] quinn::ConnectionError),
    /// The request could not be written.
    #[error(transparent)]
    Write(#[from] quinn::WriteError),
    /// The request's end could not be sent.
    #[error(transparent)]
    Finish(#[from] quinn::ClosedStream),
    /// The answer could not be read (or was larger than [`MAX_PEER_MESSAGE`]).
    #[error(transparent)]
    Read(#[from] quinn::ReadToEndError),
    /// A streamed answer ended before its status byte.
    #[error(transparent)]
    Status(#[from] quinn::ReadExactError),
}

/// One call on `connection` (module docs); the raw answer with its status byte.
async fn exchange(connection: &Connection, kind: u8, request: &[u8]) -> Result<Vec<u8>, ExchangeError> {
    let (mut send, mut recv) = connection.open_bi().await?;
    send.write_all(&[kind]).await?;
    send.write_all(request).await?;
    send.finish()?;
    Ok(recv.read_to_end(MAX_PEER_MESSAGE + 1).await?)
}

/// Opens a streamed call on `connection`: its answer's stream and status byte.
async fn open_stream(connection: &Connection, kind: u8, request: &[u8]) -> Result<(RecvStream, u8), ExchangeError> {
    let (mut send, mut recv) = connection.open_bi().await?;
    send.write_all(&[kind]).await?;
    send.write_all(request).await?;
    send.finish()?;
    let mut status = [0u8; 1];
    recv.read_exact(&mut status).await?;
    Ok((recv, status[0]))
}

/// A call without even a kind byte.
#[derive(Debug, thiserror::Error)]
#[error("an empty call")]
struct EmptyCall;

/// Accepts servers' connections until the endpoint closes.
async fn accept(endpoint: Endpoint, handler: Arc<dyn PeerHandler>) {
    while let Some(incoming) = endpoint.accept().await {
        let handler = handler.clone();
        tokio::spawn(async move {
            let remote = incoming.remote_address();
            let connection = match incoming.await {
                Ok(connection) => connection,
                Err(error) => return tracing::debug!(%remote, %error, "a server's handshake failed"),
            };
            if !crate::tls::is_server(&connection) {
                tracing::warn!(%remote, "refused a connection to the server-to-server endpoint without a server certificate");
                return connection.close(crate::stream::codes::MALFORMED, b"a server certificate is needed");
            }
            serve(connection, handler).await;
        });
    }
}

/// Serves every call on one server's connection.
async fn serve(connection: Connection, handler: Arc<dyn PeerHandler>) {
    while let Ok((mut send, mut recv)) = connection.accept_bi().await {
        let handler = handler.clone();
        tokio::spawn(async move {
            let request = match recv.read_to_end(MAX_PEER_MESSAGE + 1).await {
                Ok(request) => request,
                Err(error) => return tracing::debug!(%error, "a server's call ended before its request"),
            };
            let answer = match request.split_first() {
                Some((&kind, request)) if handler.streams(kind) => {
                    return handler.stream(kind, request.to_vec(), PeerSink { send, started: false }).await;
                }
                Some((&kind, request)) => handler.call(kind, request.to_vec()).await,
                None => Err(EmptyCall.into()),
            };
            let (status, body) = match answer {
                Ok(body) => (0u8, body),
                Err(reason) => (1u8, reason.to_string().into_bytes()),
            };
            if send.write_all(&[status]).await.is_ok() && send.write_all(&body).await.is_ok() {
                let _ = send.finish();
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::{CertificateAuthority, Role};

    struct Echo;

    impl PeerHandler for Echo {
        fn call(&self, kind: u8, request: Vec<u8>) -> PeerAnswer {
            Box::pin(async move {
                match kind {
                    1 => Ok(request),
                    _ => Err(format!("unknown kind {kind}").into()),
                }
            })
        }

        fn streams(&self, kind: u8) -> bool {
            (2..=4).contains(&kind)
        }

        /// Kind 2: the request back, once per byte of it, then the end;
        /// kind 3: refused; kind 4: one piece, then a failure.
        fn stream(&self, kind: u8, request: Vec<u8>, mut sink: PeerSink) -> PeerStreaming {
            Box::pin(async move {
                match kind {
                    2 => {
                        for _ in 0..request.len() {
                            if sink.write(&request).await.is_err() {
                                return;
                            }
                        }
                        sink.finish().await;
                    }
                    4 => {
                        let _ = sink.write(b"partial").await;
                        sink.abandon();
                    }
                    _ => sink.refuse("not this one").await,
                }
            })
        }
    }

    #[tokio::test]
    async fn a_streamed_call_is_read_as_it_comes_and_a_refusal_or_failure_is_told() {
        crate::install_crypto_provider();
        let ca = CertificateAuthority::generate().expect("a CA");
        let loopback: SocketAddr = "127.0.0.1:0".parse().expect("an address");
        let a = Peers::bind(loopback, &material(&ca, Role::Server), Arc::new(Echo)).expect("bound");
        let b = Peers::bind(loopback, &material(&ca, Role::Server), Arc::new(Echo)).expect("bound");
        let b_addr = b.local_addr().expect("bound");
        let timeout = Duration::from_secs(30);
        let mut answer = a.call_stream(b_addr, 2, b"abc", timeout).await.expect("streamed");
        let all = answer.read_to_end(1024).await.expect("the whole answer");
        assert_eq!(all, b"abcabcabc");
        let refused = a.call_stream(b_addr, 3, b"", timeout).await.expect_err("refused");
        assert!(matches!(&refused, PeerError::Refused { reason, .. } if reason == "not this one"), "{refused}");
        // A reset may overtake the bytes before it: the call fails then, or
        // its read does; it never ends cleanly.
        if let Ok(mut broken) = a.call_stream(b_addr, 4, b"", timeout).await {
            assert!(broken.read_to_end(1024).await.is_err(), "a failed answer is not a clean end");
        }
        // The plain calls still work on the same connection.
        assert_eq!(a.call(b_addr, 1, b"plain", timeout).await.expect("answered"), b"plain");
    }

    fn material(ca: &CertificateAuthority, role: Role) -> TlsMaterial {
        TlsMaterial { ca_pem: ca.identity().cert_pem.clone(), identity: ca.issue(role, &[]).expect("issued") }
    }

    #[tokio::test]
    async fn servers_call_each_other_and_a_client_certificate_is_refused() {
        crate::install_crypto_provider();
        let ca = CertificateAuthority::generate().expect("a CA");
        let loopback: SocketAddr = "127.0.0.1:0".parse().expect("an address");
        let a = Peers::bind(loopback, &material(&ca, Role::Server), Arc::new(Echo)).expect("bound");
        let b = Peers::bind(loopback, &material(&ca, Role::Server), Arc::new(Echo)).expect("bound");
        let b_addr = b.local_addr().expect("bound");
        let big = vec![7u8; 3 * 1024 * 1024];
        assert_eq!(a.call(b_addr, 1, &big, Duration::from_secs(30)).await.expect("answered"), big);
        let refused = a.call(b_addr, 9, b"", Duration::from_secs(30)).await.expect_err("refused");
        assert!(matches!(&refused, PeerError::Refused { reason, .. } if reason == "unknown kind 9"), "{refused}");

        // A client's certificate cannot join the servers' conversation.
        let client = Peers::bind(loopback, &material(&ca, Role::Client), Arc::new(Echo)).expect("bound");
        let outcome = client.call(b_addr, 1, b"hello", Duration::from_secs(30)).await;
        assert!(outcome.is_err(), "a client certificate was served: {outcome:?}");
    }
}
