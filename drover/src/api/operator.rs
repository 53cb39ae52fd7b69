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

/// The scheduler configuration as `/v1/operator/scheduler/configuration`
/// reads and writes it (Nomad's `SchedulerConfiguration`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct SchedulerConfiguration {
    /// `binpack` or `spread`.
    pub scheduler_algorithm: String,
    /// Which schedulers may preempt.
    pub preemption_config: PreemptionConfig,
    /// Whether the leader's eval broker hands out nothing.
    pub pause_eval_broker: bool,
    /// Nomad's memory oversubscription (`memory_max`): always false, and
    /// refused when set (Drover does not oversubscribe memory).
    pub memory_oversubscription_enabled: bool,
    /// Nomad's refusal of job registrations: always false, and refused
    /// when set.
    pub reject_job_registration: bool,
    /// Index of the first write.
    pub create_index: u64,
    /// Index of the last write.
    pub modify_index: u64,
}

/// Which schedulers may preempt (Nomad's `PreemptionConfig`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct PreemptionConfig {
    /// System jobs.
    pub system_scheduler_enabled: bool,
    /// Sysbatch jobs.
    #[serde(rename = "SysBatchSchedulerEnabled")]
    pub sysbatch_scheduler_enabled: bool,
    /// Batch jobs.
    pub batch_scheduler_enabled: bool,
    /// Service jobs.
    pub service_scheduler_enabled: bool,
}

/// `GET /v1/operator/scheduler/configuration`'s answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct SchedulerConfigurationResponse {
    /// The configuration (the defaults until one is written).
    pub scheduler_config: SchedulerConfiguration,
    /// The index of the read.
    pub index: u64,
    /// 0.
    pub last_contact: u64,
    /// true.
    pub known_leader: bool,
}

/// `PUT /v1/operator/scheduler/configuration`'s answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct SchedulerSetConfigurationResponse {
    /// Whether the write was done (false: a check-and-set refused).
    pub updated: bool,
    /// The index of the write.
    pub index: u64,
}

impl From<engine::structs::SchedulerConfiguration> for SchedulerConfiguration {
    fn from(config: engine::structs::SchedulerConfiguration) -> Self {
        let algorithm = match config.scheduler_algorithm {
            engine::structs::SchedulerAlgorithm::Binpack => "binpack",
            engine::structs::SchedulerAlgorithm::Spread => "spread",
        };
        let preemption = config.preemption_config;
        SchedulerConfiguration {
            scheduler_algorithm: algorithm.to_string(),
            preemption_config: PreemptionConfig {
                system_scheduler_enabled: preemption.system_scheduler_enabled,
                sysbatch_scheduler_enabled: preemption.sysbatch_scheduler_enabled,
                batch_scheduler_enabled: preemption.batch_scheduler_enabled,
                service_scheduler_enabled: preemption.service_scheduler_enabled,
            },
            pause_eval_broker: config.pause_eval_broker,
            memory_oversubscription_enabled: false,
            reject_job_registration: false,
            create_index: config.create_index,
            modify_index: config.modify_index,
        }
    }
}

impl SchedulerConfiguration {
    /// The engine's configuration; an unknown algorithm, and what Drover
    /// does not do, are refused.
    pub fn to_engine(&self) -> Result<engine::structs::SchedulerConfiguration, String> {
        if self.memory_oversubscription_enabled {
            return Err(
                "MemoryOversubscriptionEnabled: Drover does not oversubscribe memory (a task's memory_max)".into()
            );
        }
        if self.reject_job_registration {
            return Err("RejectJobRegistration: Drover cannot refuse job registrations cluster-wide".into());
        }
        let scheduler_algorithm = match self.scheduler_algorithm.as_str() {
            "" | "binpack" => engine::structs::SchedulerAlgorithm::Binpack,
            "spread" => engine::structs::SchedulerAlgorithm::Spread,
            other => return Err(format!("invalid scheduler algorithm {other:?}")),
        };
        let preemption = &self.preemption_config;
        Ok(engine::structs::SchedulerConfiguration {
            scheduler_algorithm,
            preemption_config: engine::structs::PreemptionConfig {
                system_scheduler_enabled: preemption.system_scheduler_enabled,
                sysbatch_scheduler_enabled: preemption.sysbatch_scheduler_enabled,
                batch_scheduler_enabled: preemption.batch_scheduler_enabled,
                service_scheduler_enabled: preemption.service_scheduler_enabled,
            },
            pause_eval_broker: self.pause_eval_broker,
            create_index: 0,
            modify_index: 0,
        })
    }
}
