//! The deployment endpoint, transport-free: an operator fails, pauses,
//! resumes or promotes a deployment, or sets its allocations' health
//! (Nomad's `Deployment.*` RPCs). Each is one command with the eval that
//! acts on it; refusals are the store's, in Nomad's words.

use serde::Serialize;

use super::failure;
use crate::clock::SharedClock;
use crate::state::{Command, StateError, Writer};
use crate::structs::{
    deployment_description, AllocId, DeploymentId, DeploymentStatus, DeploymentStatusUpdate, EvalId, Evaluation,
    TriggerReason,
};

/// Why a deployment request was refused. Nothing was written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeploymentError {
    /// No such deployment.
    #[error("deployment not found")]
    UnknownDeployment(DeploymentId),
    /// An allocation-health request naming no allocation (Nomad's words).
    #[error("must specify at least one healthy/unhealthy allocation ID")]
    NoAllocations,
    /// The write was refused or failed.
    #[error(transparent)]
    State(#[from] StateError),
}

/// What a deployment write did (Nomad's `DeploymentUpdateResponse`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeploymentUpdateResponse {
    /// The eval created, if any (a pause creates none).
    pub eval_id: Option<EvalId>,
    /// The index the eval was written at.
    pub eval_create_index: u64,
    /// The deployment's modify index after the write.
    pub deployment_modify_index: u64,
    /// The version an auto-revert registered again.
    pub reverted_job_version: Option<u64>,
    /// The index of the write.
    pub index: u64,
}

/// The deployment endpoint.
#[derive(Debug, Clone)]
pub struct DeploymentEndpoint {
    writer: Writer,
    clock: SharedClock,
}

impl DeploymentEndpoint {
    /// An endpoint writing through `writer`.
    pub fn new(writer: Writer, clock: SharedClock) -> Self {
        DeploymentEndpoint { writer, clock }
    }

    /// Marks a deployment failed (reverting when a group auto-reverts).
    pub fn fail(&self, id: DeploymentId) -> Result<DeploymentUpdateResponse, DeploymentError> {
        let snapshot = self.writer.store().snapshot();
        let deployment = snapshot.deployment(id).ok_or(DeploymentError::UnknownDeployment(id))?;
        let failed = failure(
            &snapshot,
            deployment,
            deployment_description::FAILED_BY_USER,
            deployment.auto_reverts(),
            self.clock.now(),
        );
        let reverted = failed.reverted_version;
        let eval_id = failed.eval.as_ref().map(|eval| eval.id);
        let command = Command::UpdateDeploymentStatus {
            update: failed.update,
            job: failed.job,
            eval: failed.eval,
            time: self.clock.now(),
        };
        self.write(command, id, eval_id, reverted)
    }

    /// Pauses a deployment, or resumes it (with an eval, so it rolls on).
    pub fn pause(&self, id: DeploymentId, pause: bool) -> Result<DeploymentUpdateResponse, DeploymentError> {
        let snapshot = self.writer.store().snapshot();
        let deployment = snapshot.deployment(id).ok_or(DeploymentError::UnknownDeployment(id))?;
        let (status, description, eval) = if pause {
            (DeploymentStatus::Paused, deployment_description::PAUSED, None)
        } else {
            let description = match deployment.awaits_promotion() {
                true => deployment_description::RUNNING_NEEDS_PROMOTION,
                false => deployment_description::RUNNING,
            };
            (DeploymentStatus::Running, description, self.eval_of(&snapshot, &deployment.job_key()))
        };
        let update = DeploymentStatusUpdate { deployment_id: id, status, status_description: description.to_string() };
        let eval_id = eval.as_ref().map(|eval| eval.id);
        let command = Command::UpdateDeploymentStatus { update, job: None, eval, time: self.clock.now() };
        self.write(command, id, eval_id, None)
    }

    /// Promotes the canaries of `groups` (every group when empty).
    pub fn promote(&self, id: DeploymentId, groups: Vec<String>) -> Result<DeploymentUpdateResponse, DeploymentError> {
        let snapshot = self.writer.store().snapshot();
        let deployment = snapshot.deployment(id).ok_or(DeploymentError::UnknownDeployment(id))?;
        let eval = self.eval_of(&snapshot, &deployment.job_key());
        let eval_id = eval.as_ref().map(|eval| eval.id);
        let command = Command::PromoteDeployment { deployment_id: id, groups, eval, time: self.clock.now() };
        self.write(command, id, eval_id, None)
    }

    /// Sets allocations' health; any unhealthy one fails the deployment
    /// (reverting when its group auto-reverts).
    pub fn set_alloc_health(
        &self,
        id: DeploymentId,
        healthy: Vec<AllocId>,
        unhealthy: Vec<AllocId>,
    ) -> Result<DeploymentUpdateResponse, DeploymentError> {
        if healthy.is_empty() && unhealthy.is_empty() {
            return Err(DeploymentError::NoAllocations);
        }
        let snapshot = self.writer.store().snapshot();
        let deployment = snapshot.deployment(id).ok_or(DeploymentError::UnknownDeployment(id))?;
        let now = self.clock.now();
        let (update, job, eval, reverted) = if unhealthy.is_empty() {
            (None, None, self.eval_of(&snapshot, &deployment.job_key()), None)
        } else {
            let reverts = unhealthy
                .iter()
                .filter_map(|alloc_id| snapshot.alloc(*alloc_id))
                .any(|alloc| deployment.task_groups.get(&*alloc.task_group).is_some_and(|group| group.auto_revert));
            let failed = failure(&snapshot, deployment, deployment_description::FAILED_ALLOCATIONS, reverts, now);
            (Some(failed.update), failed.job, failed.eval, failed.reverted_version)
        };
        let eval_id = eval.as_ref().map(|eval| eval.id);
        let command = Command::SetAllocHealth { deployment_id: id, healthy, unhealthy, update, job, eval, time: now };
        self.write(command, id, eval_id, reverted)
    }

    fn eval_of(&self, snapshot: &crate::state::Snapshot, key: &crate::structs::JobKey) -> Option<Evaluation> {
        snapshot.job(key).map(|job| Evaluation::for_job(job, TriggerReason::DeploymentWatcher, self.clock.now()))
    }

    fn write(
        &self,
        command: Command,
        id: DeploymentId,
        eval_id: Option<EvalId>,
        reverted_job_version: Option<u64>,
    ) -> Result<DeploymentUpdateResponse, DeploymentError> {
        let applied = self.writer.write(command)?;
        let snapshot = self.writer.store().snapshot();
        let deployment_modify_index =
            snapshot.deployment(id).map_or(applied.index, |deployment| deployment.modify_index);
        Ok(DeploymentUpdateResponse {
            eval_id,
            eval_create_index: if eval_id.is_some() { applied.index } else { 0 },
            deployment_modify_index,
            reverted_job_version,
            index: applied.index,
        })
    }
}
