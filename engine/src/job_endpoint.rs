//! The job endpoint, transport-free: register, deregister and scale jobs,
//! revert one to a kept version and mark a version stable, and read a job,
//! its allocations, its evals and its summary.
//!
//! Every write stores the job and the evaluation that schedules it in one
//! command, so a job is never stored without the eval that acts on it. A
//! revert is a register of the kept version's spec (Nomad's `Job.Revert`):
//! a new version equal to the old one, with an eval like any register. A
//! plan is a register's dry run (`job_plan`): nothing is written.
//!
//! Periodic and parameterized jobs run nothing themselves: registering or
//! stopping one writes no eval (Nomad's rule), and `evaluate` refuses
//! them. A periodic job's children are launched by the leader's
//! dispatcher (`periodic/`) or forced here; a parameterized job's are
//! dispatched here (`structs/dispatch.rs` has the rules), an idempotency
//! token returning the child it made before.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use crate::clock::SharedClock;
use crate::job_plan::{dry_run, JobPlan, JobPlanError};
use crate::periodic::{child_id, launch_command};
use crate::state::Writer;
use crate::state::{Command, StateError};
use crate::structs::{
    derive_dispatched, dispatched_id, AllocId, Allocation, ClientStatus, DispatchCheckError, EvalId, Evaluation, Job,
    JobKey, JobValidationError, TriggerReason, MAX_GROUP_COUNT,
};

/// Why a job request was refused. Nothing was written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    /// The job spec is invalid; every problem is listed.
    #[error(transparent)]
    Invalid(#[from] JobValidationError),
    /// No such job.
    #[error("unknown job {0}")]
    UnknownJob(JobKey),
    /// The job has no such task group.
    #[error("job {job} has no task group {group:?}")]
    UnknownGroup {
        /// The job.
        job: JobKey,
        /// The group asked for.
        group: String,
    },
    /// A job's type cannot change: its evals and allocations belong to one
    /// scheduler. Purge the job first.
    #[error("job {job} is a {from} job and cannot become a {to} job; purge it first")]
    TypeChange {
        /// The job.
        job: JobKey,
        /// Its current type.
        from: crate::structs::JobType,
        /// The type asked for.
        to: crate::structs::JobType,
    },
    /// No such allocation.
    #[error("unknown allocation {0}")]
    UnknownAlloc(AllocId),
    /// The job keeps no such version (Nomad's words).
    #[error("job {:?} in namespace {:?} at version {version} not found", job.id, job.namespace)]
    UnknownVersion {
        /// The job.
        job: JobKey,
        /// The version asked for.
        version: u64,
    },
    /// A revert to the version the job is at (Nomad's words).
    #[error("can't revert to current version")]
    RevertToCurrent,
    /// A revert whose `EnforcePriorVersion` is not the job's version (Nomad's words).
    #[error("Current job has version {current}; enforcing version {enforced}")]
    PriorVersionMismatch {
        /// The job's version.
        current: u64,
        /// The version the revert expected.
        enforced: u64,
    },
    /// The job names a namespace that does not exist (Nomad's words).
    #[error("job {job:?} is in nonexistent namespace {namespace:?}")]
    UnknownNamespace {
        /// The job's id.
        job: String,
        /// Its namespace.
        namespace: String,
    },
    /// A submitted job says it was dispatched (Nomad's words).
    #[error("job can't be submitted with 'Dispatched' set")]
    DispatchedSubmitted,
    /// An update would make a job periodic or not (Nomad's words).
    #[error("{}", if *to_periodic { "cannot update non-periodic job to being periodic" } else { "cannot update periodic job to being non-periodic" })]
    PeriodicChange {
        /// Whether the update adds the block.
        to_periodic: bool,
    },
    /// An update would make a job parameterized or not (Nomad's words).
    #[error("{}", if *to_parameterized { "cannot update non-parameterized job to being parameterized" } else { "cannot update parameterized job to being non-parameterized" })]
    ParameterizedChange {
        /// Whether the update adds the block.
        to_parameterized: bool,
    },
    /// `evaluate` of a job that runs nothing itself (Nomad's words).
    #[error("can't evaluate {0} job")]
    CannotEvaluate(&'static str),
    /// A force launch of a job without an active-able schedule (Nomad's words).
    #[error("can't force launch non-periodic job")]
    NotPeriodic,
    /// A dispatch of an unknown job (Nomad's words).
    #[error("parameterized job not found")]
    ParameterizedNotFound,
    /// A dispatch of a job that is not a template (Nomad's words).
    #[error("Specified job {0:?} is not a parameterized job")]
    NotParameterized(String),
    /// A dispatch of a stopped template (Nomad's words).
    #[error("Specified job {0:?} is stopped")]
    ParameterizedStopped(String),
    /// A dispatch's payload or meta do not fit the template.
    #[error(transparent)]
    Dispatch(#[from] DispatchCheckError),
    /// The write failed.
    #[error(transparent)]
    State(#[from] StateError),
}

/// What a register, deregister or scale wrote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct JobWriteResponse {
    /// The eval created to act on it (none for a periodic or parameterized job).
    pub eval_id: Option<EvalId>,
    /// The index of the write.
    pub index: u64,
    /// The job's version after the write.
    pub version: u64,
    /// The index of the job's last spec change after the write (Nomad's
    /// `JobModifyIndex`).
    pub job_modify_index: u64,
}

/// What a force launch or a dispatch wrote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChildWriteResponse {
    /// The child job.
    pub child: JobKey,
    /// Its eval (none when the child is itself periodic).
    pub eval_id: Option<EvalId>,
    /// The index the eval was written at.
    pub eval_create_index: u64,
    /// The index the child was created at.
    pub job_create_index: u64,
    /// The index of the write.
    pub index: u64,
}

/// A dispatch request (Nomad's `JobDispatchRequest`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DispatchRequest {
    /// The payload, uncompressed.
    pub payload: Vec<u8>,
    /// The dispatch's meta.
    pub meta: BTreeMap<String, String>,
    /// A repeated dispatch with the same token returns the child made before.
    pub idempotency_token: String,
    /// Nomad 1.5's `IdPrefixTemplate`: the child is
    /// `<parent>/dispatch-<template>-<unix>-<hex>`.
    pub id_prefix_template: String,
}

/// The children of a periodic or parameterized job by status (Nomad's
/// `JobChildrenSummary`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ChildrenSummary {
    /// Not yet running.
    pub pending: u64,
    /// Running.
    pub running: u64,
    /// Finished or stopped.
    pub dead: u64,
}

/// Allocation counts of one task group.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GroupSummary {
    /// Still to be placed, per the job's latest eval.
    pub queued: u64,
    /// Placed, not yet running.
    pub starting: u64,
    /// Running.
    pub running: u64,
    /// Failed.
    pub failed: u64,
    /// Finished.
    pub complete: u64,
    /// Lost with their node.
    pub lost: u64,
    /// On a disconnected node.
    pub unknown: u64,
}

/// The job endpoint; see the module docs.
#[derive(Debug, Clone)]
pub struct JobEndpoint {
    writer: Writer,
    clock: SharedClock,
}

impl JobEndpoint {
    /// An endpoint writing through `writer`.
    pub fn new(writer: Writer, clock: SharedClock) -> Self {
        JobEndpoint { writer, clock }
    }

    /// Validates and registers (or updates) a job with its eval (none for
    /// a periodic or parameterized job).
    pub fn register(&self, job: Job) -> Result<JobWriteResponse, JobError> {
        job.validate()?;
        if job.dispatched {
            return Err(JobError::DispatchedSubmitted);
        }
        let snapshot = self.writer.store().snapshot();
        if !snapshot.has_namespace(&job.namespace) {
            return Err(JobError::UnknownNamespace { job: job.id.to_string(), namespace: job.namespace.to_string() });
        }
        if let Some(existing) = snapshot.job(&job.key()) {
            update_problem(existing, &job)?;
        }
        self.write_job(job, TriggerReason::JobRegister)
    }

    /// What registering `job` would do, written nowhere: the scheduler's
    /// dry run against the newest snapshot at the engine's now
    /// ([`crate::job_plan::dry_run`]).
    pub fn plan(&self, job: Job) -> Result<JobPlan, JobPlanError> {
        dry_run(self.writer.store().snapshot(), job, self.clock.now())
    }

    fn write_job(&self, mut job: Job, trigger: TriggerReason) -> Result<JobWriteResponse, JobError> {
        let now = self.clock.now();
        job.submit_time = now;
        let eval = job.is_scheduled_directly().then(|| Evaluation::for_job(&job, trigger, now));
        let eval_id = eval.as_ref().map(|eval| eval.id);
        let applied = self.writer.write(Command::RegisterJob { job, eval })?;
        let stored = applied.job.as_ref().expect("a registered job is stored");
        Ok(JobWriteResponse {
            eval_id,
            index: applied.index,
            version: stored.version,
            job_modify_index: stored.job_modify_index,
        })
    }

    /// Registers a kept version's spec again as the job's next version
    /// (Nomad's `Job.Revert`), with its eval. With `enforce_prior_version`,
    /// only if the job is at that version now. The check and the write are
    /// two steps, as in Nomad: a register between them is not detected.
    pub fn revert(
        &self,
        key: &JobKey,
        version: u64,
        enforce_prior_version: Option<u64>,
    ) -> Result<JobWriteResponse, JobError> {
        let snapshot = self.writer.store().snapshot();
        let current = snapshot.job(key).ok_or_else(|| JobError::UnknownJob(key.clone()))?;
        // Nomad's order of checks (`Job.Revert`).
        if version == current.version {
            return Err(JobError::RevertToCurrent);
        }
        let kept =
            snapshot.job_version(key, version).ok_or_else(|| JobError::UnknownVersion { job: key.clone(), version })?;
        if let Some(enforced) = enforce_prior_version.filter(|enforced| *enforced != current.version) {
            return Err(JobError::PriorVersionMismatch { current: current.version, enforced });
        }
        let mut job = Job::clone(kept);
        job.stable = false;
        self.register(job)
    }

    /// Marks a kept version of a job stable, or not (Nomad's
    /// `Job.Stable`); the index of the write.
    pub fn set_stability(&self, key: &JobKey, version: u64, stable: bool) -> Result<u64, JobError> {
        let command = Command::SetJobStability { key: key.clone(), version, stable };
        match self.writer.write(command) {
            Ok(applied) => Ok(applied.index),
            Err(StateError::UnknownJobVersion { job, version }) => Err(JobError::UnknownVersion { job, version }),
            Err(other) => Err(other.into()),
        }
    }

    /// The kept versions of a job, newest first; none for an unknown job.
    pub fn versions(&self, key: &JobKey) -> Vec<Arc<Job>> {
        self.writer.store().snapshot().job_versions(key).cloned().collect()
    }

    /// Stops a job (or removes it with `purge`); its eval stops the allocations.
    pub fn deregister(&self, key: &JobKey, purge: bool) -> Result<JobWriteResponse, JobError> {
        let job = self.job(key)?;
        let eval = job
            .is_scheduled_directly()
            .then(|| Evaluation::for_job(&job, TriggerReason::JobDeregister, self.clock.now()));
        let eval_id = eval.as_ref().map(|eval| eval.id);
        let applied = self.writer.write(Command::DeregisterJob { job: key.clone(), purge, eval })?;
        let stored = applied.job.as_deref().unwrap_or(&job);
        Ok(JobWriteResponse {
            eval_id,
            index: applied.index,
            version: stored.version,
            job_modify_index: stored.job_modify_index,
        })
    }

    /// Creates an eval for a job as it stands, without changing it (Nomad's
    /// `job eval`): its allocations are reconciled again.
    pub fn evaluate(&self, key: &JobKey) -> Result<JobWriteResponse, JobError> {
        let job = self.job(key)?;
        if job.is_periodic() {
            return Err(JobError::CannotEvaluate("periodic"));
        }
        if job.is_parameterized() {
            return Err(JobError::CannotEvaluate("parameterized"));
        }
        let eval = Evaluation::for_job(&job, TriggerReason::JobEvaluate, self.clock.now());
        let eval_id = eval.id;
        let applied = self.writer.write(Command::UpsertEvals { evals: vec![eval] })?;
        Ok(JobWriteResponse {
            eval_id: Some(eval_id),
            index: applied.index,
            version: job.version,
            job_modify_index: job.job_modify_index,
        })
    }

    /// Launches a periodic job's child now, whatever its schedule and
    /// `prohibit_overlap` say (Nomad's `Job.PeriodicForce`).
    pub fn periodic_force(&self, key: &JobKey) -> Result<ChildWriteResponse, JobError> {
        let job = self.job(key)?;
        if !job.is_periodic() || job.is_parameterized() {
            return Err(JobError::NotPeriodic);
        }
        let now = self.clock.now();
        let (command, eval_id) = launch_command(&job, now, now, true);
        let child = JobKey { namespace: job.namespace.clone(), id: Arc::from(child_id(&job.id, now)) };
        self.write_child(command, child, eval_id)
    }

    /// Dispatches a parameterized job (Nomad's `Job.Dispatch`): checks the
    /// request against the template and registers the child with its eval
    /// (none when the child is periodic); with an idempotency token a
    /// child made before with it is returned instead.
    pub fn dispatch(&self, key: &JobKey, request: DispatchRequest) -> Result<ChildWriteResponse, JobError> {
        let snapshot = self.writer.store().snapshot();
        let parent = snapshot.job(key).ok_or(JobError::ParameterizedNotFound)?;
        let Some(config) = parent.parameterized.as_ref().filter(|_| parent.is_parameterized()) else {
            return Err(JobError::NotParameterized(key.id.to_string()));
        };
        if parent.stop {
            return Err(JobError::ParameterizedStopped(key.id.to_string()));
        }
        config.check_dispatch(&request.payload, &request.meta)?;
        if !request.idempotency_token.is_empty() {
            let token = request.idempotency_token.as_str();
            let earlier = snapshot.job_children(key).find(|child| child.dispatch_idempotency_token == token);
            if let Some(child) = earlier {
                let eval = snapshot.evals_by_job(&child.key()).min_by_key(|eval| eval.create_index);
                return Ok(ChildWriteResponse {
                    child: child.key(),
                    eval_id: eval.map(|eval| eval.id),
                    eval_create_index: eval.map_or(0, |eval| eval.create_index),
                    job_create_index: child.create_index,
                    index: snapshot.index(),
                });
            }
        }
        let now = self.clock.now();
        let id = dispatched_id(&key.id, &request.id_prefix_template, now, rand::random());
        let child = derive_dispatched(parent, &id, &request.payload, &request.meta, &request.idempotency_token, now);
        child.validate()?;
        let eval = child.is_scheduled_directly().then(|| Evaluation::for_job(&child, TriggerReason::JobRegister, now));
        let eval_id = eval.as_ref().map(|eval| eval.id);
        let child_key = child.key();
        self.write_child(Command::RegisterJob { job: child, eval }, child_key, eval_id)
    }

    fn write_child(
        &self,
        command: Command,
        child: JobKey,
        eval_id: Option<EvalId>,
    ) -> Result<ChildWriteResponse, JobError> {
        let applied = self.writer.write(command)?;
        let stored = applied.job.as_ref().expect("a launched child is stored");
        Ok(ChildWriteResponse {
            child,
            eval_id,
            eval_create_index: if eval_id.is_some() { applied.index } else { 0 },
            job_create_index: stored.create_index,
            index: applied.index,
        })
    }

    /// Stops one allocation (Nomad's `alloc stop`): it is marked desired
    /// `stop` and its job evaluated in the same command, so a replacement
    /// is placed where the job's count asks for one. The eval's id and the
    /// index of the write.
    pub fn stop_alloc(&self, alloc_id: AllocId) -> Result<(EvalId, u64), JobError> {
        let snapshot = self.writer.store().snapshot();
        let alloc = snapshot.alloc(alloc_id).ok_or(JobError::UnknownAlloc(alloc_id))?;
        // The job as stored now, so the eval carries its current modify index.
        let job = snapshot.job(&alloc.job_key()).cloned().unwrap_or_else(|| alloc.job.clone());
        let now = self.clock.now();
        let eval = Evaluation::for_job(&job, TriggerReason::AllocStop, now);
        let eval_id = eval.id;
        let applied = self.writer.write(Command::StopAlloc { alloc_id, eval, time: now })?;
        Ok((eval_id, applied.index))
    }

    /// Sets a group's count.
    pub fn scale(&self, key: &JobKey, group: &str, count: u32) -> Result<JobWriteResponse, JobError> {
        let mut job = Job::clone(&*self.job(key)?);
        let target = job
            .task_groups
            .iter_mut()
            .find(|candidate| candidate.name == group)
            .ok_or_else(|| JobError::UnknownGroup { job: key.clone(), group: group.to_string() })?;
        target.count = count.min(MAX_GROUP_COUNT.saturating_add(1));
        job.validate()?;
        self.write_job(job, TriggerReason::JobScaling)
    }

    /// The job as stored.
    pub fn job(&self, key: &JobKey) -> Result<Arc<Job>, JobError> {
        self.writer.store().snapshot().job(key).cloned().ok_or_else(|| JobError::UnknownJob(key.clone()))
    }

    /// The job's allocations, terminal ones included.
    pub fn allocs(&self, key: &JobKey) -> Vec<Arc<Allocation>> {
        self.writer.store().snapshot().allocs_by_job(key).cloned().collect()
    }

    /// The job's evals.
    pub fn evals(&self, key: &JobKey) -> Vec<Arc<Evaluation>> {
        self.writer.store().snapshot().evals_by_job(key).cloned().collect()
    }

    /// The children of a periodic or parameterized job by status.
    pub fn children(&self, key: &JobKey) -> ChildrenSummary {
        children_summary(&self.writer.store().snapshot(), key)
    }

    /// Allocation counts per task group.
    pub fn summary(&self, key: &JobKey) -> Result<BTreeMap<String, GroupSummary>, JobError> {
        let job = self.job(key)?;
        let snapshot = self.writer.store().snapshot();
        let mut groups: BTreeMap<String, GroupSummary> =
            job.task_groups.iter().map(|group| (group.name.clone(), GroupSummary::default())).collect();
        for alloc in snapshot.allocs_by_job(key) {
            let Some(summary) = groups.get_mut(&*alloc.task_group) else { continue };
            let counter = match (alloc.client_status, alloc.server_terminal()) {
                (ClientStatus::Pending, false) => &mut summary.starting,
                (ClientStatus::Pending, true) => continue,
                (ClientStatus::Running, false) => &mut summary.running,
                (ClientStatus::Running, true) => continue,
                (ClientStatus::Failed, _) => &mut summary.failed,
                (ClientStatus::Complete, _) => &mut summary.complete,
                (ClientStatus::Lost, _) => &mut summary.lost,
                (ClientStatus::Unknown, _) => &mut summary.unknown,
            };
            *counter += 1;
        }
        let latest =
            snapshot.evals_by_job(key).filter(|eval| eval.status.is_terminal()).max_by_key(|eval| eval.modify_index);
        for (group, queued) in latest.map(|eval| eval.queued_allocations.clone()).unwrap_or_default() {
            if let Some(summary) = groups.get_mut(&group) {
                summary.queued = queued;
            }
        }
        Ok(groups)
    }
}

/// Nomad's rules for an update of `existing` to `job`: the type, and
/// whether it is periodic, parameterized or dispatched, do not change.
fn update_problem(existing: &Job, job: &Job) -> Result<(), JobError> {
    if existing.job_type != job.job_type {
        return Err(JobError::TypeChange { job: job.key(), from: existing.job_type, to: job.job_type });
    }
    if existing.is_periodic() != job.is_periodic() {
        return Err(JobError::PeriodicChange { to_periodic: job.is_periodic() });
    }
    if existing.is_parameterized() != job.is_parameterized() {
        return Err(JobError::ParameterizedChange { to_parameterized: job.is_parameterized() });
    }
    Ok(())
}

/// The children of `parent` by status, by Nomad's job status rule:
/// running while an allocation is live (a periodic or parameterized
/// child, which runs nothing itself, until stopped); dead once stopped or
/// once everything placed ended; pending otherwise.
pub fn children_summary(snapshot: &crate::state::Snapshot, parent: &JobKey) -> ChildrenSummary {
    let mut summary = ChildrenSummary::default();
    for child in snapshot.job_children(parent) {
        let key = child.key();
        let live = snapshot.allocs_by_job(&key).any(|alloc| !alloc.terminal());
        let outstanding = snapshot.evals_by_job(&key).any(|eval| !eval.status.is_terminal());
        let placed = snapshot.allocs_by_job(&key).next().is_some();
        let counter = if live || (!child.stop && !child.is_scheduled_directly()) {
            &mut summary.running
        } else if child.stop || (placed && !outstanding) {
            &mut summary.dead
        } else {
            &mut summary.pending
        };
        *counter += 1;
    }
    summary
}

#[cfg(test)]
#[path = "job_endpoint_test.rs"]
mod job_endpoint_test;
