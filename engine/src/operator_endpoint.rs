//! The operator endpoint, transport-free: the cluster's scheduler
//! configuration (Nomad's `/v1/operator/scheduler/configuration`), read and
//! written as one command with an optional check-and-set index. A new
//! configuration applies to evals scheduled after its write; it does not
//! re-evaluate anything by itself.

use crate::state::{Command, StateError, Writer};
use crate::structs::SchedulerConfiguration;

/// The operator endpoint; see the module docs.
#[derive(Debug, Clone)]
pub struct OperatorEndpoint {
    writer: Writer,
}

impl OperatorEndpoint {
    /// An endpoint writing through `writer`.
    pub fn new(writer: Writer) -> Self {
        OperatorEndpoint { writer }
    }

    /// The stored configuration, or the defaults (indexes 0) when none was
    /// written. Until one is, each server schedules with its own algorithm
    /// setting.
    pub fn scheduler_config(&self) -> SchedulerConfiguration {
        self.writer.store().snapshot().scheduler_config().unwrap_or_default()
    }

    /// Writes `config`; with `cas_index`, only if the stored configuration's
    /// modify index is that (0: none stored yet). Returns the index of the
    /// write; a refused check-and-set is
    /// [`StateError::ConfigIndexMismatch`] and changes nothing.
    pub fn set_scheduler_config(
        &self,
        config: SchedulerConfiguration,
        cas_index: Option<u64>,
    ) -> Result<u64, StateError> {
        Ok(self.writer.write(Command::SetSchedulerConfig { config, cas_index })?.index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StateStore;
    use crate::structs::SchedulerAlgorithm;
    use std::sync::Arc;

    #[test]
    fn the_configuration_is_written_with_check_and_set() {
        let store = Arc::new(StateStore::new());
        let operator = OperatorEndpoint::new(Writer::direct(store.clone()));
        assert_eq!(operator.scheduler_config(), SchedulerConfiguration::default());
        let mut config = SchedulerConfiguration::default();
        config.preemption_config.service_scheduler_enabled = true;
        let first = operator.set_scheduler_config(config, Some(0)).expect("nothing stored yet");
        assert_eq!(operator.scheduler_config().modify_index, first);
        config.scheduler_algorithm = SchedulerAlgorithm::Spread;
        let refused = operator.set_scheduler_config(config, Some(first + 7));
        assert_eq!(refused, Err(StateError::ConfigIndexMismatch { expected: first + 7, stored: first }));
        assert_eq!(operator.scheduler_config().scheduler_algorithm, SchedulerAlgorithm::Binpack, "unchanged");
        let second = operator.set_scheduler_config(config, Some(first)).expect("the right index");
        let stored = operator.scheduler_config();
        assert_eq!((stored.create_index, stored.modify_index), (first, second));
        assert!(stored.preemption_config.service_scheduler_enabled);
        assert_eq!(stored.scheduler_algorithm, SchedulerAlgorithm::Spread);
    }
}
