//! Finding the leader and calling it: what a follower does with a call it
//! cannot serve (client calls in `routing.rs`, HTTP requests in
//! `http::forward`, its workers' scheduling calls in `scheduling.rs`).
//! [`LeaderError`] says why no leader serves a call, keeping apart what a
//! caller may retry (an election, a leader that changed) from raft having
//! stopped on this server ([`LeaderError::Stopped`]), which no retry here
//! cures.

use std::net::SocketAddr;

use replication::network::ResolveError;
use replication::Durable;
use transport::peer::PeerError;

/// Why no leader serves a call (module docs).
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The cluster has no leader now (an election): retry shortly.
    #[error("no cluster leader; try again")]
    NoLeader,
    /// raft names this server the leader, but its leader services have not
    /// started yet (the read barrier): retry shortly.
    #[error("this server is taking over the leadership")]
    TakingOver,
    /// This server runs alone and its leader services are gone (it is
    /// shutting down).
    #[error("this server does not lead")]
    NotLeading,
    /// The leader's server-to-server address does not resolve.
    #[error("the leader, server {id}, cannot be reached: {source}")]
    Unresolvable {
        /// The leader's raft id.
        id: u64,
        /// Why its address does not resolve.
        source: ResolveError,
    },
    /// The call to the leader failed or got no answer in time.
    #[error("forwarding to the leader: {0}")]
    Forward(#[from] PeerError),
    /// raft stopped naming the server the call was forwarded to the leader
    /// (it was killed, or lost an election); the call may have taken effect.
    #[error("the leader changed while the call was forwarded to it")]
    LeaderChanged,
    /// raft has stopped on this server (shut down, or failed): it takes no
    /// part in the cluster any more, and a retry here cannot succeed.
    #[error("raft has stopped on this server")]
    Stopped,
}

/// The leader's raft id and server-to-server address, unless this server
/// is the leader or none is known (an election).
pub(crate) fn leader_peer(durable: &Durable) -> Result<(u64, SocketAddr), LeaderError> {
    if durable.has_stopped() {
        return Err(LeaderError::Stopped);
    }
    match durable.leader() {
        Some((id, _)) if id == durable.id() => Err(LeaderError::TakingOver),
        Some((id, node)) => match replication::network::resolve(&node.peer) {
            Ok(addr) => Ok((id, addr)),
            Err(source) => Err(LeaderError::Unresolvable { id, source }),
        },
        None => Err(LeaderError::NoLeader),
    }
}

/// Calls the leader `leader` with `call`, giving up as soon as raft no
/// longer names it the leader: a killed leader sends nothing back, and
/// this server notices it is gone when its election timer fires (2-2.5 s),
/// long before the connection would time out.
pub(crate) async fn while_it_leads<T>(
    durable: &Durable,
    leader: u64,
    call: impl std::future::Future<Output = Result<T, PeerError>>,
) -> Result<T, LeaderError> {
    let mut metrics = durable.raft().metrics();
    tokio::select! {
        answer = call => Ok(answer?),
        changed = metrics.wait_for(|now| now.current_leader != Some(leader)) => match changed {
            Ok(_) => Err(LeaderError::LeaderChanged),
            // raft's metrics end only when raft stops.
            Err(_) => Err(LeaderError::Stopped),
        },
    }
}
