//! The HTTP listener the server's API runs on (agents serve none): TLS
//! when configured, a connection cap per client address, handshake and
//! idle timeouts, and an accept loop that backs off instead of spinning
//! when the process runs out of file descriptors.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use transport::log_limit::RateLimited;

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
