//! The raft networks: none for a one-voter cluster, and raft's RPCs over
//! the server-to-server QUIC endpoint ([`transport::peer`]) for a cluster.
//!
//! openraft needs a [`RaftNetworkFactory`] even when it never calls it (a
//! single voter elects itself and commits alone): [`NoNetworkFactory`]
//! refuses every call with [`NoPeers`], which openraft treats as an
//! unreachable peer.
//!
//! [`PeerNetworkFactory`] sends each RPC as one call of kind
//! [`kinds::APPEND`], [`kinds::VOTE`] or [`kinds::SNAPSHOT`], postcard on
//! both ways; the receiving server answers it with [`serve`]. Snapshots
//! travel in openraft's chunks ([`openraft::Config::snapshot_max_chunk_size`]),
//! one call each. A peer that cannot be connected to is `Unreachable`
//! (openraft backs off); a call that failed or timed out is a network error
//! (retried at the next heartbeat).

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use transport::peer::{PeerError, Peers};

use crate::types::{ServerNode, TypeConfig};

/// The kinds of server-to-server calls raft makes (`transport::peer`).
pub mod kinds {
    /// AppendEntries (and heartbeats).
    pub const APPEND: u8 = 1;
    /// RequestVote.
    pub const VOTE: u8 = 2;
    /// One chunk of InstallSnapshot.
    pub const SNAPSHOT: u8 = 3;
    /// A forming server's hello (formation, in `cluster.rs`).
    pub const HELLO: u8 = 4;
    /// A server asking the leader to be added as a voter.
    pub const JOIN: u8 = 5;
}

/// Why a server's `host:port` gives no socket address.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The name lookup failed (or the text is not `host:port`).
    #[error("{addr} does not resolve: {source}")]
    Lookup {
        /// The address as written.
        addr: String,
        /// Why the lookup failed.
        source: std::io::Error,
    },
    /// The name resolves to no address.
    #[error("{addr} resolves to no address")]
    Empty {
        /// The address as written.
        addr: String,
    },
}

/// The first address `addr` (`host:port`) resolves to.
pub fn resolve(addr: &str) -> Result<SocketAddr, ResolveError> {
    let mut found = addr.to_socket_addrs().map_err(|source| ResolveError::Lookup { addr: addr.to_string(), source })?;
    found.next().ok_or_else(|| ResolveError::Empty { addr: addr.to_string() })
}

/// Why a call another server made here was not answered (the caller gets
/// the message as the refusal's reason).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The request did not decode.
    #[error("a malformed {what}: {source}")]
    Malformed {
        /// What the request should have been.
        what: &'static str,
        /// What postcard found wrong.
        source: postcard::Error,
    },
    /// The answer did not encode.
    #[error("encoding the answer to a {what}: {source}")]
    Encode {
        /// What the request was.
        what: &'static str,
        /// What postcard found wrong.
        source: postcard::Error,
    },
    /// The call was understood but could not be carried out (a join the
    /// leader could not make).
    #[error("the {what} failed: {source}")]
    Failed {
        /// What the request was.
        what: &'static str,
        /// Why it failed.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Why a call to another server was refused.
#[derive(Debug, thiserror::Error)]
#[error("this server runs as a one-voter cluster and has no network to reach server {target}")]
pub struct NoPeers {
    /// The server the call was for.
    pub target: u64,
}

/// The factory of [`NoNetwork`] clients (module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoNetworkFactory;

/// A client that refuses every call (module docs).
#[derive(Clone, Copy, Debug)]
pub struct NoNetwork {
    target: u64,
}

impl NoNetwork {
    fn refuse<E: std::error::Error>(&self) -> RPCError<u64, ServerNode, E> {
        RPCError::Unreachable(Unreachable::new(&NoPeers { target: self.target }))
    }
}

impl RaftNetworkFactory<TypeConfig> for NoNetworkFactory {
    type Network = NoNetwork;

    async fn new_client(&mut self, target: u64, _node: &ServerNode) -> NoNetwork {
        NoNetwork { target }
    }
}

impl RaftNetwork<TypeConfig> for NoNetwork {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, ServerNode, RaftError<u64>>> {
        Err(self.refuse())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RPCError<u64, ServerNode, RaftError<u64, InstallSnapshotError>>> {
        Err(self.refuse())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<u64>,
        _option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, ServerNode, RaftError<u64>>> {
        Err(self.refuse())
    }
}

/// The factory of [`PeerNetwork`] clients (module docs).
#[derive(Clone, Debug)]
pub struct PeerNetworkFactory {
    peers: Arc<Peers>,
}

impl PeerNetworkFactory {
    /// Raft's calls go out through `peers`.
    pub fn new(peers: Arc<Peers>) -> PeerNetworkFactory {
        PeerNetworkFactory { peers }
    }
}

/// Raft's RPCs to one server over the server-to-server endpoint.
#[derive(Clone, Debug)]
pub struct PeerNetwork {
    peers: Arc<Peers>,
    target: u64,
    addr: Result<SocketAddr, Arc<ResolveError>>,
}

impl RaftNetworkFactory<TypeConfig> for PeerNetworkFactory {
    type Network = PeerNetwork;

    /// Does not connect: the first call does (openraft's contract).
    async fn new_client(&mut self, target: u64, node: &ServerNode) -> PeerNetwork {
        let addr = resolve(&node.peer).map_err(Arc::new);
        PeerNetwork { peers: self.peers.clone(), target, addr }
    }
}

impl PeerNetwork {
    async fn call<Request: Serialize, Answer: DeserializeOwned, E: std::error::Error>(
        &self,
        kind: u8,
        request: &Request,
        timeout: Duration,
    ) -> Result<Answer, RPCError<u64, ServerNode, E>> {
        let addr = match &self.addr {
            Ok(addr) => *addr,
            Err(why) => {
                let unusable = NoAddress { target: self.target, why: why.clone() };
                return Err(RPCError::Unreachable(Unreachable::new(&unusable)));
            }
        };
        let bytes = postcard::to_allocvec(request).map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
        let answer = self.peers.call(addr, kind, &bytes, timeout).await.map_err(|error| match error {
            PeerError::Connect { .. } => RPCError::Unreachable(Unreachable::new(&error)),
            _ => RPCError::Network(NetworkError::new(&error)),
        })?;
        postcard::from_bytes(&answer).map_err(|error| RPCError::Network(NetworkError::new(&error)))
    }
}

/// A member whose peer address does not resolve.
#[derive(Debug, thiserror::Error)]
#[error("server {target} has no usable peer address: {why}")]
struct NoAddress {
    target: u64,
    why: Arc<ResolveError>,
}

/// What a raft call answered, as sent back: openraft's own result.
type Answered<T, E = RaftError<u64>> = Result<T, E>;

/// Unwraps an answered call: a raft error of the remote server is openraft's
/// `RemoteError`.
fn remote<T, E: std::error::Error>(target: u64, answered: Answered<T, E>) -> Result<T, RPCError<u64, ServerNode, E>> {
    answered.map_err(|error| RPCError::RemoteError(openraft::error::RemoteError::new(target, error)))
}

impl RaftNetwork<TypeConfig> for PeerNetwork {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, ServerNode, RaftError<u64>>> {
        let answered: Answered<AppendEntriesResponse<u64>> = self.call(kinds::APPEND, &rpc, option.hard_ttl()).await?;
        remote(self.target, answered)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RPCError<u64, ServerNode, RaftError<u64, InstallSnapshotError>>> {
        let answered: Answered<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>> =
            self.call(kinds::SNAPSHOT, &rpc, option.hard_ttl()).await?;
        remote(self.target, answered)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, ServerNode, RaftError<u64>>> {
        let answered: Answered<VoteResponse<u64>> = self.call(kinds::VOTE, &rpc, option.hard_ttl()).await?;
        remote(self.target, answered)
    }
}

/// Answers a raft call another server made (module docs): `None` when
/// `kind` is not raft's.
pub async fn serve(raft: &openraft::Raft<TypeConfig>, kind: u8, request: &[u8]) -> Option<Result<Vec<u8>, ServeError>> {
    const WHAT: &str = "raft call";
    fn decode<T: DeserializeOwned>(request: &[u8]) -> Result<T, ServeError> {
        postcard::from_bytes(request).map_err(|source| ServeError::Malformed { what: WHAT, source })
    }
    fn encode<T: Serialize>(answer: &T) -> Result<Vec<u8>, ServeError> {
        postcard::to_allocvec(answer).map_err(|source| ServeError::Encode { what: WHAT, source })
    }
    Some(match kind {
        kinds::APPEND => match decode(request) {
            Ok(rpc) => encode(&raft.append_entries(rpc).await),
            Err(error) => Err(error),
        },
        kinds::VOTE => match decode(request) {
            Ok(rpc) => encode(&raft.vote(rpc).await),
            Err(error) => Err(error),
        },
        kinds::SNAPSHOT => match decode(request) {
            Ok(rpc) => encode(&raft.install_snapshot(rpc).await),
            Err(error) => Err(error),
        },
        _ => return None,
    })
}
