//! The HTTP API: Nomad's `/v1/` API, for the parts Drover implements, so
//! the `nomad` CLI, python-nomad and scripts written for Nomad work against
//! a Drover server (`../shared/reference/nomad-http-api.md` is the contract).
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
//! One file per resource: `jobs.rs`, `evals.rs`, `allocs.rs`, `nodes.rs`,
//! `agent.rs` (agent, status, workers, search), `operator.rs` (snapshots,
//! raft), `acl.rs` (the ACL check in front of them all, tokens and
//! policies); `job_spec.rs` reads the
//! submitted job, `nomad.rs` shapes the answers, `query.rs` holds the query
//! parameters, blocking queries and the read headers.

pub mod acl;
pub mod agent;
pub mod allocs;
pub mod error;
pub mod evals;
pub mod job_spec;
pub mod jobs;
pub mod metrics;
pub mod nodes;
pub mod nomad;
pub mod operator;
pub mod query;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::Router;
use engine::server::Server;

use crate::cluster::Leadership;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use transport::log_limit::RateLimited;

/// The largest request body the API reads (a job with many groups fits
/// well inside); larger ones are refused with 413 (see [`refuse_oversized`]).
pub const MAX_BODY: usize = 4 * 1024 * 1024;

/// What the handlers share.
#[derive(Clone, Debug)]
pub struct ApiState {
    /// The leader services (while this server leads) and the store.
    pub leadership: Arc<Leadership>,
    /// The server-to-server endpoint, on a server of a cluster (requests
    /// it does not serve itself go to the leader through it).
    pub peers: Option<Arc<transport::peer::Peers>>,
    /// The QUIC listener, for its connection counters.
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
        .merge(evals::routes())
        .merge(allocs::routes())
        .merge(nodes::routes())
        .merge(agent::routes())
        .merge(metrics::routes())
        .merge(operator::routes())
        .merge(acl::routes())
        .fallback(error::unknown_path)
        .layer(axum::middleware::from_fn_with_state(state.clone(), acl::authorize))
        .layer(axum::middleware::from_fn_with_state(state.clone(), crate::cluster::forward_http))
        .layer(axum::middleware::from_fn(query::check_namespace))
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

/// The connection limits of an HTTP listener (TOML `[limits]`; the
/// defaults are Nomad's where Nomad has the setting).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Open connections one client address may hold; more are answered
    /// 429 (plain HTTP) or closed (HTTPS) at once. 0: no limit. Nomad's
    /// `limits.http_max_conns_per_client`, 100.
    pub max_conns_per_client: usize,
    /// How long an HTTPS connection may take to finish its TLS handshake.
    /// Nomad's `limits.https_handshake_timeout`, 5 s.
    pub https_handshake_timeout: std::time::Duration,
    /// How long a connection may wait for a whole request head: before its
    /// first request, between requests, and while a slow client trickles
    /// header lines (a request being answered, a blocking query included,
    /// is not idle). Drover's `limits.http_idle_timeout`, 30 s.
    pub idle_timeout: std::time::Duration,
}

impl Default for HttpLimits {
    fn default() -> HttpLimits {
        HttpLimits {
            max_conns_per_client: 100,
            https_handshake_timeout: std::time::Duration::from_secs(5),
            idle_timeout: std::time::Duration::from_secs(30),
        }
    }
}

/// A running HTTP API listener.
#[derive(Debug)]
pub struct HttpServer {
    local_addr: SocketAddr,
    router: Router,
    stop: tokio::sync::watch::Sender<bool>,
    serving: tokio::task::JoinHandle<()>,
}

impl HttpServer {
    /// Binds `addr` and serves `router`, over TLS with `tls`, plain HTTP
    /// without (dev mode only), within `limits`. Call within a tokio runtime.
    pub fn start(
        addr: SocketAddr,
        tls: Option<Arc<rustls::ServerConfig>>,
        router: Router,
        limits: HttpLimits,
    ) -> std::io::Result<HttpServer> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        let local_addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
        let serving = tokio::spawn(serve(listener, acceptor, router.clone(), limits, stopped));
        Ok(HttpServer { local_addr, router, stop, serving })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The API it serves (requests other servers forward are served with it).
    pub fn router(&self) -> Router {
        self.router.clone()
    }

    /// Stops accepting and ends the open connections (blocking queries
    /// waiting on them end with them).
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.serving.await;
    }
}

/// The first pause after a failed `accept` (out of file descriptors and
/// the like) and the longest, as Go's `net/http` (Nomad's) backs off: the
/// pause doubles while accepts keep failing, and the failures are logged
/// at most once per [`ACCEPT_LOG_EVERY`], so a full descriptor table
/// neither spins a core nor floods the log.
const ACCEPT_PAUSE: (std::time::Duration, std::time::Duration) =
    (std::time::Duration::from_millis(5), std::time::Duration::from_secs(1));
/// See [`ACCEPT_PAUSE`].
const ACCEPT_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Accepts connections until stopped; each is served on its own task (its
/// TLS handshake included, so a slow client delays no other), within `limits`.
async fn serve(
    listener: TcpListener,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    router: Router,
    limits: HttpLimits,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    let per_client = PerClient::new(limits.max_conns_per_client);
    let accept_failures = RateLimited::new(ACCEPT_LOG_EVERY);
    let mut pause = ACCEPT_PAUSE.0;
    loop {
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => {
                    pause = ACCEPT_PAUSE.0;
                    accepted
                }
                Err(error) => {
                    if let Some(held_back) = accept_failures.admit() {
                        tracing::warn!(%error, held_back, pause = ?pause, "HTTP accept failed; pausing accepts");
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = stopped.changed() => break,
                    }
                    pause = (pause * 2).min(ACCEPT_PAUSE.1);
                    continue;
                }
            },
            _ = stopped.changed() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let Some(slot) = per_client.admit(remote.ip()) else {
            refuse_over_limit(stream, acceptor.is_some());
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let acceptor = acceptor.clone();
        connections.spawn(async move {
            let _slot = slot;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(limits.idle_timeout);
            let served = match acceptor {
                Some(acceptor) => {
                    match tokio::time::timeout(limits.https_handshake_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => builder.serve_connection(TokioIo::new(tls), service).await,
                        Ok(Err(error)) => {
                            tracing::debug!(%remote, %error, "HTTPS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%remote, "HTTPS handshake not finished in time; closed");
                            return;
                        }
                    }
                }
                None => builder.serve_connection(TokioIo::new(stream), service).await,
            };
            if let Err(error) = served {
                tracing::debug!(%remote, %error, "HTTP connection ended with an error");
            }
        });
    }
    connections.shutdown().await;
}

/// Answers a connection over its address's limit: 429 on plain HTTP (a
/// write that fits the socket buffer, never waited for), a close on HTTPS.
fn refuse_over_limit(stream: TcpStream, tls: bool) {
    if !tls {
        let _ = stream.try_write(
            b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: text/plain\r\ncontent-length: 34\r\nconnection: close\r\n\r\nToo many connections from your IP\n",
        );
    }
}

/// Open connections per client address, for [`HttpLimits::max_conns_per_client`].
#[derive(Clone, Debug)]
struct PerClient {
    limit: usize,
    open: Arc<parking_lot::Mutex<hashbrown::HashMap<std::net::IpAddr, usize>>>,
}

/// One admitted connection; its count ends when it is dropped.
#[derive(Debug)]
struct Slot {
    ip: std::net::IpAddr,
    open: Option<PerClient>,
}

impl PerClient {
    fn new(limit: usize) -> PerClient {
        PerClient { limit, open: Arc::default() }
    }

    /// A slot for one more connection from `ip`, or `None` over the limit.
    fn admit(&self, ip: std::net::IpAddr) -> Option<Slot> {
        if self.limit == 0 {
            return Some(Slot { ip, open: None });
        }
        let mut open = self.open.lock();
        let count = open.entry(ip).or_insert(0);
        if *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(Slot { ip, open: Some(self.clone()) })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(per_client) = &self.open else { return };
        let mut open = per_client.open.lock();
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_counted_per_client_address_until_they_end() {
        let per_client = PerClient::new(2);
        let (a, b) = ("127.0.0.2".parse().expect("ip"), "127.0.0.3".parse().expect("ip"));
        let first = per_client.admit(a).expect("one");
        let second = per_client.admit(a).expect("two");
        assert!(per_client.admit(a).is_none(), "a third from the same address is refused");
        assert!(per_client.admit(b).is_some(), "another address has its own count");
        drop(first);
        assert!(per_client.admit(a).is_some(), "a closed connection frees its slot");
        drop(second);
        assert!(PerClient::new(0).admit(a).is_some(), "0: no limit");
    }
}
