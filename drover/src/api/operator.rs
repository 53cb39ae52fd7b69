//! Operator endpoints (Nomad's `api/operator.go`): the raft configuration,
//! and Drover's answers to its membership changes. `GET
//! /v1/operator/raft/info` answers `replication::RaftInfo` as it is.

use serde::{Deserialize, Serialize};

/// `GET /v1/operator/raft/configuration` (`RaftConfiguration`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct RaftConfiguration {
    /// The raft index the configuration was read at.
    pub index: u64,
    /// Every server.
    pub servers: Vec<RaftServer>,
}

/// One server of the cluster (`RaftServer`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct RaftServer {
    /// Its raft id.
    #[serde(rename = "ID")]
    pub id: String,
    /// `<name>.<region>`.
    pub node: String,
    /// Its client (RPC) address.
    pub address: String,
    pub leader: bool,
    pub voter: bool,
    /// Always `3`.
    pub raft_protocol: String,
}

/// `DELETE /v1/operator/raft/peer?id=ID` answer (Drover's).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct RaftPeerRemoved {
    /// The removed server's raft id.
    pub removed: String,
}

/// `PUT /v1/operator/raft/peer?address=HOST:PORT` answer (Drover's).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct RaftVoterAdded {
    /// The new voter's raft id.
    pub added: String,
    /// Its name.
    pub node: String,
}
