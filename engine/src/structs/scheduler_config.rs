//! The cluster-wide scheduler configuration an operator sets (Nomad's
//! `SchedulerConfiguration`, `/v1/operator/scheduler/configuration`): the
//! scoring algorithm and which schedulers may preempt. It lives in the state
//! store, written by `Command::SetSchedulerConfig`; until one is written the
//! defaults hold (and the server's own algorithm setting).

use serde::{Deserialize, Serialize};

use super::JobType;

/// Scoring strategy for placements (Nomad's `SchedulerAlgorithm`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchedulerAlgorithm {
    /// Fill nodes before using empty ones (Nomad's default).
    #[default]
    Binpack,
    /// Prefer the emptiest nodes.
    Spread,
}

/// Which schedulers may evict lower-priority allocations to make room
/// (Nomad's `PreemptionConfig`; its defaults: system jobs only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PreemptionConfig {
    /// System jobs may preempt (default true). JSON `SystemSchedulerEnabled`.
    pub system_scheduler_enabled: bool,
    /// Sysbatch jobs may preempt (default false). JSON `SysBatchSchedulerEnabled`.
    pub sysbatch_scheduler_enabled: bool,
    /// Batch jobs may preempt (default false). JSON `BatchSchedulerEnabled`.
    pub batch_scheduler_enabled: bool,
    /// Service jobs may preempt (default false). JSON `ServiceSchedulerEnabled`.
    pub service_scheduler_enabled: bool,
}

impl Default for PreemptionConfig {
    fn default() -> Self {
        PreemptionConfig {
            system_scheduler_enabled: true,
            sysbatch_scheduler_enabled: false,
            batch_scheduler_enabled: false,
            service_scheduler_enabled: false,
        }
    }
}

impl PreemptionConfig {
    /// Whether jobs of `job_type` may preempt.
    pub fn enabled_for(&self, job_type: JobType) -> bool {
        match job_type {
            JobType::System => self.system_scheduler_enabled,
            JobType::Sysbatch => self.sysbatch_scheduler_enabled,
            JobType::Batch => self.batch_scheduler_enabled,
            JobType::Service => self.service_scheduler_enabled,
        }
    }
}

/// The scheduler configuration (Nomad's field names in JSON:
/// `SchedulerAlgorithm`, `PreemptionConfig`, `CreateIndex`, `ModifyIndex`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SchedulerConfiguration {
    /// The scoring algorithm for every scheduler.
    #[serde(default)]
    pub scheduler_algorithm: SchedulerAlgorithm,
    /// Which schedulers may preempt.
    #[serde(default)]
    pub preemption_config: PreemptionConfig,
    /// The leader's eval broker hands out no evaluation while this is set
    /// (Nomad's `PauseEvalBroker`): what deleting evaluations needs.
    #[serde(default)]
    pub pause_eval_broker: bool,
    /// Index at which a configuration was first written (set by the store).
    #[serde(default)]
    pub create_index: u64,
    /// Index of the last write (set by the store); a check-and-set write
    /// names the one it replaces.
    #[serde(default)]
    pub modify_index: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_default_only_system_jobs_preempt() {
        let config = SchedulerConfiguration::default();
        assert_eq!(config.scheduler_algorithm, SchedulerAlgorithm::Binpack);
        let enabled: Vec<JobType> =
            JobType::ALL.into_iter().filter(|job_type| config.preemption_config.enabled_for(*job_type)).collect();
        assert_eq!(enabled, vec![JobType::System]);
        let read: SchedulerConfiguration = serde_json::from_str("{}").expect("defaults fill an empty object");
        assert_eq!(read, config);
    }
}
