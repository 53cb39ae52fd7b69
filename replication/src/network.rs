//! The raft network of a one-voter cluster: there is no one to talk to.
//!
//! openraft needs a [`RaftNetworkFactory`] even when it never calls it (a
//! single voter elects itself and commits alone). This one refuses every
//! call with [`NoPeers`], which openraft treats as an unreachable peer. It
//! is the seam the server-to-server QUIC network fills in when a cluster
//! has three servers (issue 14).

use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::BasicNode;

use crate::types::TypeConfig;

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
    fn refuse<E: std::error::Error>(&self) -> RPCError<u64, BasicNode, E> {
        RPCError::Unreachable(Unreachable::new(&NoPeers { target: self.target }))
    }
}

impl RaftNetworkFactory<TypeConfig> for NoNetworkFactory {
    type Network = NoNetwork;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> NoNetwork {
        NoNetwork { target }
    }
}

impl RaftNetwork<TypeConfig> for NoNetwork {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        Err(self.refuse())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>> {
        Err(self.refuse())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<u64>,
        _option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        Err(self.refuse())
    }
}
