//! Deployments in the state store: the table, its lookups, and how writes
//! move a deployment along.
//!
//! Contract:
//! 1. A plan's deployment ([`Command::ApplyPlanResults`]) is created as the
//!    scheduler made it, or merged into the stored one: the scheduler sets
//!    what it decides (the groups' desired counts and settings, the status
//!    while the stored one is active, the description), the store keeps
//!    what it counts (placed, healthy and unhealthy allocations, placed
//!    canaries, promotion, the progress deadline). A plan read from an
//!    older snapshot so never undoes a health report or a promotion, never
//!    revives a terminal deployment, and never resumes a paused one.
//! 2. Every allocation write counts toward the allocation's deployment
//!    ([`Snapshot::count_in_deployment`]): joining it (placed, or moved in
//!    by an in-place update) counts as placed, and a canary is listed; a
//!    first health verdict counts as healthy or unhealthy; healthy turning
//!    unhealthy moves one count over (the reverse is not counted, as in
//!    Nomad). The first placement sets the group's progress deadline, each
//!    newly healthy allocation pushes it to now + `progress_deadline`.
//! 3. A deployment turning `successful` marks its job version stable in the
//!    same write.
//! 4. Operator and watcher writes ([`Command::UpdateDeploymentStatus`],
//!    [`Command::PromoteDeployment`], [`Command::SetAllocHealth`]) are
//!    refused for an unknown or terminal deployment with Nomad's messages.
//!    Promotion needs every promoted group's desired canaries healthy; it
//!    clears the canaries' mark and restarts the groups' progress deadlines.
//! 5. Deployments move their own table index (`deployments`).
//!
//! [`Command::ApplyPlanResults`]: super::Command::ApplyPlanResults
//! [`Command::UpdateDeploymentStatus`]: super::Command::UpdateDeploymentStatus
//! [`Command::PromoteDeployment`]: super::Command::PromoteDeployment
//! [`Command::SetAllocHealth`]: super::Command::SetAllocHealth

use std::sync::Arc;

use super::snapshot::{index_add, Snapshot};
use super::StateError;
use crate::clock::Timestamp;
use crate::structs::{
    deployment_description, AllocHealth, AllocId, Allocation, Deployment, DeploymentId, DeploymentStatus,
    DeploymentStatusUpdate, JobKey,
};

impl Snapshot {
    /// A deployment by id.
    pub fn deployment(&self, id: DeploymentId) -> Option<&Arc<Deployment>> {
        self.deployments.get(&id)
    }

    /// Every deployment, in no particular order.
    pub fn deployments(&self) -> impl Iterator<Item = &Arc<Deployment>> + '_ {
        self.deployments.values()
    }

    /// A job's deployments, oldest first.
    pub fn deployments_by_job(&self, key: &JobKey) -> impl Iterator<Item = &Arc<Deployment>> + '_ {
        let ids = self.deployments_by_job.get(key).into_iter().flat_map(|ids| ids.iter());
        ids.filter_map(|id| self.deployments.get(id))
    }

    /// A job's newest deployment (Nomad's `LatestDeploymentByJobID`).
    pub fn latest_deployment(&self, key: &JobKey) -> Option<&Arc<Deployment>> {
        self.deployments_by_job(key).max_by_key(|deployment| deployment.create_index)
    }

    /// The deployments still running or paused, by id.
    pub fn active_deployments(&self) -> impl Iterator<Item = &Arc<Deployment>> + '_ {
        self.active_deployments.iter().filter_map(|id| self.deployments.get(id))
    }

    /// Stores a deployment as given, keeping the lookups in step.
    pub(super) fn put_deployment(&mut self, index: u64, deployment: Deployment) {
        if self.deployments.get(&deployment.id).is_none() {
            index_add(&mut self.deployments_by_job, deployment.job_key(), deployment.id);
        }
        if deployment.is_active() {
            self.active_deployments.insert(deployment.id);
        } else {
            self.active_deployments.remove(&deployment.id);
        }
        if deployment.status == DeploymentStatus::Successful {
            // A kept version or not (it may have been trimmed), the deployment stands.
            let _ = self.set_job_stability(index, &deployment.job_key(), deployment.job_version, true);
        }
        self.deployments.insert(deployment.id, Arc::new(deployment));
        self.table_indexes.deployments = index;
    }

    /// A plan's deployment, created or merged into the stored one (contract, 1).
    pub(super) fn upsert_plan_deployment(&mut self, index: u64, mut planned: Deployment, time: Timestamp) {
        planned.modify_index = index;
        planned.modify_time = time;
        let Some(stored) = self.deployments.get(&planned.id).cloned() else {
            planned.create_index = index;
            planned.create_time = time;
            self.put_deployment(index, planned);
            return;
        };
        let mut merged = Deployment::clone(&stored);
        for (name, group) in planned.task_groups {
            let entry = merged.task_groups.entry(name).or_default();
            entry.desired_total = group.desired_total;
            entry.desired_canaries = group.desired_canaries;
            entry.auto_revert = group.auto_revert;
            entry.auto_promote = group.auto_promote;
            entry.progress_deadline = group.progress_deadline;
        }
        let resumes_paused = stored.status == DeploymentStatus::Paused && planned.status == DeploymentStatus::Running;
        if stored.is_active() && !resumes_paused {
            merged.status = planned.status;
            merged.status_description = planned.status_description;
        }
        merged.modify_index = index;
        merged.modify_time = time;
        self.put_deployment(index, merged);
    }

    /// Applies status changes to deployments that are still active; others
    /// are left as they are (a plan's cancel of one that ended meanwhile).
    pub(super) fn apply_deployment_updates(
        &mut self,
        index: u64,
        updates: Vec<DeploymentStatusUpdate>,
        time: Timestamp,
    ) {
        for update in updates {
            if let Some(stored) = self.deployments.get(&update.deployment_id).filter(|stored| stored.is_active()) {
                let stored = stored.clone();
                self.put_status(index, &stored, update, time);
            }
        }
    }

    /// Stores `stored` with the status `update` gives it.
    fn put_status(&mut self, index: u64, stored: &Deployment, update: DeploymentStatusUpdate, time: Timestamp) {
        let mut changed = stored.clone();
        changed.status = update.status;
        changed.status_description = update.status_description;
        changed.modify_index = index;
        changed.modify_time = time;
        self.put_deployment(index, changed);
    }

    /// An operator's or the watcher's status change: refused for an unknown
    /// or terminal deployment (contract, 4).
    pub(super) fn update_deployment_status(
        &mut self,
        index: u64,
        update: DeploymentStatusUpdate,
        time: Timestamp,
    ) -> Result<(), StateError> {
        let stored = self.active_deployment(update.deployment_id, status_verb(update.status))?.clone();
        self.put_status(index, &stored, update, time);
        Ok(())
    }

    /// Promotes the canaries of `groups` (every group when empty), contract 4.
    pub(super) fn promote_deployment(
        &mut self,
        index: u64,
        id: DeploymentId,
        groups: &[String],
        time: Timestamp,
    ) -> Result<(), StateError> {
        let stored = self.active_deployment(id, "promote")?;
        let mut changed = Deployment::clone(stored);
        for name in groups {
            if !changed.task_groups.contains_key(name) {
                return Err(StateError::UnknownDeploymentGroup { deployment_id: id, group: name.clone() });
            }
        }
        let mut promoted_canaries = Vec::new();
        for (name, group) in changed.task_groups.iter_mut() {
            if !groups.is_empty() && !groups.contains(name) {
                continue;
            }
            let healthy: Vec<AllocId> = group
                .placed_canaries
                .iter()
                .filter(|alloc_id| {
                    self.allocs.get(alloc_id).is_some_and(|alloc| {
                        !alloc.terminal() && alloc.health.as_ref().is_some_and(|health| health.healthy)
                    })
                })
                .copied()
                .collect();
            if (healthy.len() as u32) < group.desired_canaries {
                return Err(StateError::CanariesNotHealthy {
                    group: name.clone(),
                    healthy: healthy.len() as u32,
                    desired: group.desired_canaries,
                });
            }
            group.promoted = true;
            if !group.progress_deadline.is_zero() {
                group.require_progress_by = Some(time.plus(group.progress_deadline));
            }
            promoted_canaries.extend(healthy);
        }
        if changed.status == DeploymentStatus::Running {
            changed.status_description = deployment_description::RUNNING.to_string();
        }
        changed.modify_index = index;
        changed.modify_time = time;
        self.put_deployment(index, changed);
        for alloc_id in promoted_canaries {
            self.change_alloc(index, alloc_id, time, |alloc| alloc.canary = false);
        }
        Ok(())
    }

    /// An operator's health verdicts on allocations of a deployment
    /// (Nomad's `allocation-health`), contract 4.
    pub(super) fn set_alloc_health(
        &mut self,
        index: u64,
        id: DeploymentId,
        healthy: &[AllocId],
        unhealthy: &[AllocId],
        time: Timestamp,
    ) -> Result<(), StateError> {
        self.active_deployment(id, "set health of allocations for a")?;
        let verdicts = healthy.iter().map(|alloc_id| (*alloc_id, true));
        let verdicts: Vec<(AllocId, bool)> =
            verdicts.chain(unhealthy.iter().map(|alloc_id| (*alloc_id, false))).collect();
        for (alloc_id, _) in &verdicts {
            let alloc = self.allocs.get(alloc_id).ok_or(StateError::UnknownAlloc(*alloc_id))?;
            if alloc.deployment_id != Some(id) {
                return Err(StateError::AllocNotInDeployment { alloc_id: *alloc_id, deployment_id: id });
            }
        }
        for (alloc_id, healthy) in verdicts {
            let health = AllocHealth { healthy, timestamp: time, modify_index: index };
            self.change_alloc(index, alloc_id, time, |alloc| alloc.health = Some(health.clone()));
        }
        self.table_indexes.allocs = index;
        Ok(())
    }

    /// Counts an allocation write toward its deployment (contract, 2).
    /// `old` is the allocation as stored before the write.
    pub(super) fn count_in_deployment(
        &mut self,
        index: u64,
        old: Option<&Allocation>,
        new: &Allocation,
        time: Timestamp,
    ) {
        let Some(id) = new.deployment_id else { return };
        let Some(stored) = self.deployments.get(&id) else { return };
        if !stored.task_groups.contains_key(&*new.task_group) {
            return;
        }
        let joined = old.is_none_or(|old| old.deployment_id != Some(id));
        let before = if joined { None } else { old.and_then(|old| old.health.as_ref()).map(|health| health.healthy) };
        let after = new.health.as_ref().map(|health| health.healthy);
        if !joined && before == after {
            return;
        }
        let mut changed = Deployment::clone(stored);
        let group = changed.task_groups.get_mut(&*new.task_group).expect("checked above");
        if joined {
            group.placed_allocs += 1;
            if new.canary && !group.placed_canaries.contains(&new.id) {
                group.placed_canaries.push(new.id);
            }
            if group.require_progress_by.is_none() && !group.progress_deadline.is_zero() {
                group.require_progress_by = Some(time.plus(group.progress_deadline));
            }
        }
        match (before, after) {
            (None, Some(true)) => group.healthy_allocs += 1,
            (None, Some(false)) => group.unhealthy_allocs += 1,
            (Some(true), Some(false)) => {
                group.healthy_allocs = group.healthy_allocs.saturating_sub(1);
                group.unhealthy_allocs += 1;
            }
            _ => {}
        }
        if after == Some(true) && before != Some(true) && !group.progress_deadline.is_zero() {
            let by = time.plus(group.progress_deadline);
            group.require_progress_by = Some(group.require_progress_by.map_or(by, |current| current.max(by)));
        }
        changed.modify_index = index;
        changed.modify_time = time;
        self.put_deployment(index, changed);
    }

    /// The deployment `id` if it is still active; else Nomad's refusal,
    /// "can't `verb` terminal deployment".
    fn active_deployment(&self, id: DeploymentId, verb: &'static str) -> Result<&Arc<Deployment>, StateError> {
        let stored = self.deployments.get(&id).ok_or(StateError::UnknownDeployment(id))?;
        if !stored.is_active() {
            return Err(StateError::DeploymentTerminal { deployment_id: id, action: verb.to_string() });
        }
        Ok(stored)
    }

    /// Changes one stored allocation in place (a server-side mark), counting
    /// the change toward its deployment.
    fn change_alloc(&mut self, index: u64, alloc_id: AllocId, time: Timestamp, change: impl FnOnce(&mut Allocation)) {
        let Some(existing) = self.allocs.get(&alloc_id).cloned() else { return };
        let mut alloc = Allocation::clone(&existing);
        change(&mut alloc);
        alloc.modify_index = index;
        alloc.modify_time = time;
        self.count_in_deployment(index, Some(&existing), &alloc, time);
        self.put_alloc(alloc);
        self.table_indexes.allocs = index;
    }
}

/// The verb of Nomad's refusal for a status change of a terminal deployment.
fn status_verb(status: DeploymentStatus) -> &'static str {
    match status {
        DeploymentStatus::Paused => "pause",
        DeploymentStatus::Running => "resume",
        _ => "fail",
    }
}
