//! The agent (Nomad's `api/agent.go`): `agent/self`, the members, the
//! health check, and the scheduling workers (`agent/schedulers`, in
//! snake_case as Nomad has them).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `GET /v1/agent/self` (`AgentSelf`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "lowercase")]
pub struct AgentSelf {
    /// The parts of the agent's configuration clients read.
    pub config: AgentConfig,
    /// This agent as a member.
    pub member: AgentMember,
    /// Subsystem to stat to value, every value a string (`nomad`,
    /// `drover`, `runtime`).
    pub stats: BTreeMap<String, BTreeMap<String, String>>,
}

/// `AgentSelf.config`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct AgentConfig {
    pub region: String,
    pub datacenter: String,
    pub node_name: String,
    pub version: AgentVersion,
    pub server: AgentServerConfig,
    pub ports: AgentPorts,
}

/// `config.Version`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct AgentVersion {
    pub version: String,
}

/// `config.Server`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct AgentServerConfig {
    pub enabled: bool,
}

/// `config.Ports`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct AgentPorts {
    #[serde(rename = "HTTP")]
    pub http: u16,
    #[serde(rename = "RPC")]
    pub rpc: u16,
}

/// A server in `agent/members` (`AgentMember`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct AgentMember {
    /// `<name>.<region>`.
    pub name: String,
    pub addr: String,
    pub port: u16,
    /// `alive`, or `failed` for a member lagging behind the leader's log.
    pub status: String,
    /// Nomad's tags (`role`, `region`, `dc`, `build`, `port`, ...), and on
    /// a cluster Drover's raft view (`raft_id`, `raft_role`, `term`,
    /// `last_index`, `health`, `peer_addr`, `http_addr`).
    pub tags: BTreeMap<String, String>,
    pub protocol_min: u8,
    pub protocol_max: u8,
    pub protocol_cur: u8,
    pub delegate_min: u8,
    pub delegate_max: u8,
    pub delegate_cur: u8,
}

/// `GET /v1/agent/members` (`ServerMembers`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct ServerMembers {
    pub server_name: String,
    pub server_region: String,
    #[serde(rename = "ServerDC")]
    pub server_dc: String,
    pub members: Vec<AgentMember>,
}

/// `GET /v1/agent/health` (`AgentHealthResponse`): a server's.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentHealthResponse {
    /// The server's health.
    pub server: AgentHealth,
}

/// One side's health (`AgentHealth`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct AgentHealth {
    pub ok: bool,
    pub message: String,
}

/// `GET /v1/agent/schedulers` (`AgentSchedulerWorkersInfo`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct AgentSchedulerWorkersInfo {
    pub server_id: String,
    pub schedulers: Vec<AgentSchedulerWorkerInfo>,
}

/// One scheduling worker (`AgentSchedulerWorkerInfo`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct AgentSchedulerWorkerInfo {
    pub id: String,
    /// The job types it takes, and `_core`.
    pub enabled_schedulers: Vec<String>,
    /// Always `null`.
    pub started: Option<String>,
    /// `Started`, `Paused`, ...
    pub status: String,
    /// What it is doing: `WaitingToDequeue`, `Scheduling`, ...
    pub workload_status: String,
}

/// `GET|PUT /v1/agent/schedulers/config` answer
/// (`AgentSchedulerWorkerConfigResponse`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct AgentSchedulerWorkerConfigResponse {
    pub server_id: String,
    pub num_schedulers: u64,
    pub enabled_schedulers: Vec<String>,
}

/// `PUT /v1/agent/schedulers/config` body
/// (`AgentSchedulerWorkerConfigRequest`): both fields are required; a
/// `server_id` is ignored, so a GET's answer can be sent back as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentSchedulerWorkerConfigRequest {
    /// How many workers to run.
    pub num_schedulers: i64,
    /// The job types they take; `_core` must be among them.
    pub enabled_schedulers: Vec<String>,
}
