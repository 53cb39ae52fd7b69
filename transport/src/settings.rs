//! QUIC settings for 10,000 client connections per server, each with the
//! reason it has the value it has. quinn's defaults suit a few fat
//! connections (a browser, a file transfer); a server's client endpoint has
//! many thin ones, so every per-connection allowance is multiplied by
//! 10,000 (`docs/transport.md`).

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Once};
use std::time::Duration;

use quinn::{Endpoint, IdleTimeout, TransportConfig, VarInt};
use socket2::{Domain, Protocol, Socket, Type};

/// Streams a client may have open at once towards a server: its call
/// stream, its allocation watch and a services read (`crate::calls`), a
/// call stream it is replacing, and room for an agent of an earlier build,
/// which opens a stream per call (a heartbeat, an alloc update, a
/// re-registration in flight). quinn allocates state for every stream a
/// peer *may* open when the connection is made, so the default of 100
/// would cost 10,000 × 100 stream entries for nothing.
pub const MAX_CLIENT_STREAMS: u32 = 8;

/// Calls a server may have open at once towards an agent, on the agent's
/// connection (`crate::agent_call`): a few followed logs and a stat or
/// a restart. What a slow reader holds up of their answers waits in the
/// server's receive windows, so with [`SERVER_STREAM_WINDOW`] each they
/// fill at most half the connection's window, and the node's own calls
/// (its heartbeats above all) always have the other half.
pub const MAX_SERVER_CALLS: u32 = 4;

/// A server's receive window per stream (see [`MAX_SERVER_CALLS`]).
pub const SERVER_STREAM_WINDOW: u32 = 128 * 1024;

/// A server's receive window per connection.
pub const SERVER_CONNECTION_WINDOW: u32 = 1024 * 1024;

const _: () = assert!(MAX_SERVER_CALLS * SERVER_STREAM_WINDOW <= SERVER_CONNECTION_WINDOW / 2);

/// Both sides close a connection after this long without a packet. Longer
/// than the client keep-alive and any heartbeat interval, so a live client
/// never hits it; a vanished client's connection is reaped after it. Node
/// liveness comes from the heartbeat TTL, never from this timeout.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// A client pings this often when it has nothing else to say, so its
/// connection stays open (and NAT bindings fresh) between heartbeats when an
/// operator sets a heartbeat TTL longer than the idle timeout. One side
/// keeping alive suffices; the server never does.
pub const CLIENT_KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Handshakes a server runs at once; more are refused and the client
/// retries with jittered backoff. quinn holds its endpoint lock across the
/// start of every handshake, so an unbounded reconnect storm would delay
/// the heartbeats of connected clients (quinn-rs/quinn#2633).
pub const MAX_HANDSHAKES: usize = 256;

/// Connections a server queues before it looks at them (quinn's default is
/// 65,536): above 10,000 clients reconnecting at once, bounded memory.
pub const MAX_INCOMING: usize = 20_000;

/// The largest request payload a server reads (an alloc update of a busy
/// node, a registration with many attributes); bigger ones are refused
/// before they are buffered.
pub const MAX_REQUEST: usize = 1024 * 1024;

/// The client-facing server transport.
pub fn server_transport() -> Arc<TransportConfig> {
    let mut config = TransportConfig::default();
    config
        .max_concurrent_bidi_streams(VarInt::from_u32(MAX_CLIENT_STREAMS))
        // Clients never open unidirectional streams.
        .max_concurrent_uni_streams(VarInt::from_u32(0))
        // A request is small; 128 KiB per stream and 1 MiB per connection
        // bound what 10,000 clients can make the server buffer (10 GiB
        // with quinn's unlimited default), and keep half the connection's
        // window free of answers to the server's own calls.
        .stream_receive_window(VarInt::from_u32(SERVER_STREAM_WINDOW))
        .receive_window(VarInt::from_u32(SERVER_CONNECTION_WINDOW))
        // quinn's docs: with many connections, keep the send window low
        // enough that every connection using it cannot exhaust memory. An
        // allocation push of a full node fits in 1 MiB.
        .send_window(1024 * 1024)
        .max_idle_timeout(Some(idle_timeout()))
        .keep_alive_interval(None)
        // No unreliable datagrams in this protocol.
        .datagram_receive_buffer_size(None);
    Arc::new(config)
}

/// The client transport (agents and loadgen's simulated clients).
pub fn client_transport() -> Arc<TransportConfig> {
    let mut config = TransportConfig::default();
    config
        // The server opens a few, for its calls to the agent.
        .max_concurrent_bidi_streams(VarInt::from_u32(MAX_SERVER_CALLS))
        .max_concurrent_uni_streams(VarInt::from_u32(0))
        // Allocation pushes are the biggest messages; 1 MiB per stream and
        // 2 MiB per connection carry a full node's in one window. loadgen
        // holds 10,000 of these, so they stay bounded too.
        .stream_receive_window(VarInt::from_u32(1024 * 1024))
        .receive_window(VarInt::from_u32(2 * 1024 * 1024))
        .send_window(256 * 1024)
        .max_idle_timeout(Some(idle_timeout()))
        .keep_alive_interval(Some(CLIENT_KEEP_ALIVE))
        .datagram_receive_buffer_size(None);
    Arc::new(config)
}

fn idle_timeout() -> IdleTimeout {
    IdleTimeout::try_from(IDLE_TIMEOUT).expect("60 s is a valid idle timeout")
}

/// The server's QUIC config: the client transport above, migration off
/// (clients do not move between addresses, and a migrating peer costs path
/// validation), a bounded accept queue.
pub fn server_config(crypto: Arc<quinn::crypto::rustls::QuicServerConfig>) -> quinn::ServerConfig {
    let mut config = quinn::ServerConfig::with_crypto(crypto);
    config.transport_config(server_transport());
    config.migration(false);
    config.max_incoming(MAX_INCOMING);
    config
}

/// A client's QUIC config over `crypto`.
pub fn client_config(crypto: Arc<quinn::crypto::rustls::QuicClientConfig>) -> quinn::ClientConfig {
    let mut config = quinn::ClientConfig::new(crypto);
    config.transport_config(client_transport());
    config
}

/// The kernel receive and send buffers each endpoint's UDP socket asks
/// for. One socket carries every client of a server, and the kernel's
/// default (`net.core.rmem_default`, 208 KiB on Linux) holds only about a
/// hundred datagrams: 10,000 agents connecting, or a plan's pushes
/// answered at once, overflowed it and lost a sixth of the datagrams, each
/// loss a retransmission after QUIC's probe timeout (heartbeats unanswered
/// for seconds, handshakes retried, `docs/transport.md`); 8 MiB still
/// overflowed when 10,000 agents answered a system job's pushes at once.
/// It is a bound, not an allocation: the kernel holds only what waits.
/// Linux caps the request at `net.core.rmem_max` / `wmem_max`; a process
/// with `CAP_NET_ADMIN` (a server, or an agent, run as root) asks past the
/// caps, and [`endpoint`] warns when a server's socket is still left less
/// than this (an agent's one connection needs far less, so an agent takes
/// what it is given without a warning).
pub const SOCKET_BUFFER: usize = 32 * 1024 * 1024;

/// A quinn endpoint on `addr` (a server's when `server` is given), its
/// socket's buffers sized by [`SOCKET_BUFFER`]. Call from within a tokio
/// runtime.
pub fn endpoint(addr: SocketAddr, server: Option<quinn::ServerConfig>) -> io::Result<Endpoint> {
    let socket = udp_socket(addr, server.is_some())?;
    let runtime = quinn::default_runtime().ok_or_else(|| io::Error::other("no tokio runtime to run the endpoint"))?;
    Endpoint::new(quinn::EndpointConfig::default(), server, socket, runtime)
}

/// A UDP socket bound on `addr` with [`SOCKET_BUFFER`] asked for each way
/// (an IPv6 one takes IPv4 too, where the system allows, as quinn's own);
/// with `warn_if_capped`, a warning when the kernel gave less.
fn udp_socket(addr: SocketAddr, warn_if_capped: bool) -> io::Result<std::net::UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        if let Err(error) = socket.set_only_v6(false) {
            tracing::debug!(%error, "an IPv6 UDP socket without IPv4: only IPv6 peers reach it");
        }
    }
    socket.set_recv_buffer_size(SOCKET_BUFFER)?;
    socket.set_send_buffer_size(SOCKET_BUFFER)?;
    let (mut received, mut sent) = (socket.recv_buffer_size()?, socket.send_buffer_size()?);
    if received.min(sent) < SOCKET_BUFFER && force_buffers(&socket) {
        (received, sent) = (socket.recv_buffer_size()?, socket.send_buffer_size()?);
    }
    // Linux grants up to its cap and reports twice the grant (its own
    // bookkeeping counts in it): a report below the request means a cap
    // under half of it.
    if warn_if_capped && received.min(sent) < SOCKET_BUFFER {
        static CAPPED: Once = Once::new();
        CAPPED.call_once(|| {
            tracing::warn!(
                receive_kib = received / 1024,
                send_kib = sent / 1024,
                wanted_kib = SOCKET_BUFFER / 1024,
                "the kernel capped the UDP socket buffers: under bursts (thousands of agents connecting, \
                 a large plan's pushes) datagrams are dropped and sent again; run the server with \
                 CAP_NET_ADMIN, or raise net.core.rmem_max and net.core.wmem_max to at least {}",
                SOCKET_BUFFER / 2
            );
        });
    }
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// Asks for [`SOCKET_BUFFER`] past the kernel's caps, which a process with
/// `CAP_NET_ADMIN` (a server run as root) may; whether it was granted.
#[cfg(target_os = "linux")]
fn force_buffers(socket: &Socket) -> bool {
    use nix::sys::socket::{setsockopt, sockopt};
    use std::os::fd::AsRawFd;
    let fd = socket.as_raw_fd();
    let forced = setsockopt(fd, sockopt::RcvBufForce, &SOCKET_BUFFER)
        .and_then(|()| setsockopt(fd, sockopt::SndBufForce, &SOCKET_BUFFER));
    if let Err(error) = &forced {
        tracing::debug!(%error, "the UDP socket buffers stay within the kernel's caps");
    }
    forced.is_ok()
}

#[cfg(not(target_os = "linux"))]
fn force_buffers(_socket: &Socket) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel maximum from `/proc/sys/net/core` (Linux).
    fn kernel_max(name: &str) -> Option<usize> {
        std::fs::read_to_string(format!("/proc/sys/net/core/{name}")).ok()?.trim().parse().ok()
    }

    #[test]
    fn an_endpoints_socket_has_the_buffers_asked_for_past_the_kernels_cap_where_privileged() {
        let socket = Socket::from(udp_socket("127.0.0.1:0".parse().expect("an address"), true).expect("binds"));
        let (Some(rmem_max), Some(wmem_max)) = (kernel_max("rmem_max"), kernel_max("wmem_max")) else {
            return; // not Linux: no caps to compare with
        };
        // Linux grants the request up to its maximum, or all of it to a
        // process with CAP_NET_ADMIN, and reports twice the grant.
        let received = socket.recv_buffer_size().expect("reads");
        let sent = socket.send_buffer_size().expect("reads");
        let forced = (received, sent) == (2 * SOCKET_BUFFER, 2 * SOCKET_BUFFER);
        let capped = (received, sent) == (2 * SOCKET_BUFFER.min(rmem_max), 2 * SOCKET_BUFFER.min(wmem_max));
        assert!(forced || capped, "granted {received} and {sent} bytes of {SOCKET_BUFFER} asked");
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let privileged = status
            .lines()
            .find_map(|line| line.strip_prefix("CapEff:"))
            .and_then(|caps| u64::from_str_radix(caps.trim(), 16).ok())
            .is_some_and(|caps| caps & (1 << 12) != 0); // CAP_NET_ADMIN
        assert_eq!(forced, privileged || SOCKET_BUFFER <= rmem_max.min(wmem_max), "forced exactly where privileged");
        assert!(socket.local_addr().expect("bound").as_socket().is_some_and(|addr| addr.port() != 0));
    }
}
