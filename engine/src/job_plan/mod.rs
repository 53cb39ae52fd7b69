//! `job plan`: what registering a job would do, decided by the real
//! scheduler and written nowhere (Nomad's `Job.Plan`).
//!
//! The contract of [`dry_run`]:
//! 1. The submitted job is validated as a register validates it, and a
//!    change of type is refused as a register refuses it.
//! 2. It is laid over the snapshot as a register would store it: a new job
//!    at version 0, a changed spec at the next version with a new
//!    `job_modify_index` (the next index of the log), an unchanged spec as
//!    it is stored (`PlannedState`). Everything else is read from the
//!    snapshot.
//! 3. The scheduler for the job's type (`scheduler::new_scheduler`) runs one
//!    register eval against that view with a [`Planner`] that records the
//!    plan, the evals it would create and the eval's outcome, and commits
//!    nothing: `submit_plan` answers a result equal to the plan, so the
//!    scheduler never re-plans.
//! 4. The recorded plan is read back as Nomad's annotations per task group
//!    ([`annotate()`]); the allocations the scheduler could not place count
//!    as placements too (Nomad counts what its reconciler asked for), and
//!    each group that could not place everything gets Drover's per-class
//!    account of why ([`filtered`]).
//!
//! The snapshot is immutable and the planner holds no writer, so a dry run
//! cannot change state: the store's index after one is the index before.

pub mod annotate;
pub mod filtered;

#[cfg(test)]
mod job_plan_test;

use std::collections::BTreeMap;
use std::sync::Arc;

pub use annotate::{annotate, DesiredUpdates, PlanAnnotations};
pub use filtered::{filtered_classes, FilteredClass};

use crate::clock::Timestamp;
use crate::scheduler::{new_scheduler, Planner, SchedulerConfig, SchedulerError, State};
use crate::state::{NodeList, Snapshot};
use crate::structs::{
    AllocMetric, Allocation, ComputedClass, Evaluation, Job, JobKey, JobType, JobValidationError, Node, NodeId, Plan,
    PlanResult, Resources, SchedulerConfiguration, TriggerReason,
};

/// Why a job could not be planned. Nothing was planned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JobPlanError {
    /// The job spec is invalid; every problem is listed.
    #[error(transparent)]
    Invalid(#[from] JobValidationError),
    /// A job's type cannot change (a register refuses it too).
    #[error("job {job} is a {from} job and cannot become a {to} job; purge it first")]
    TypeChange {
        /// The job.
        job: JobKey,
        /// Its stored type.
        from: JobType,
        /// The type submitted.
        to: JobType,
    },
    /// The job names a namespace that does not exist (Nomad's words).
    #[error("job {job:?} is in nonexistent namespace {namespace:?}")]
    UnknownNamespace {
        /// The job's id.
        job: String,
        /// Its namespace.
        namespace: String,
    },
    /// The scheduler gave up on the dry run.
    #[error("the scheduler failed the dry run: {0}")]
    Scheduler(#[from] SchedulerError),
}

/// What registering a job would do.
#[derive(Clone, Debug)]
pub struct JobPlan {
    /// The stored job, if any: the version the plan is a change from.
    pub current: Option<Arc<Job>>,
    /// The job as a register would store it (step 2).
    pub planned: Arc<Job>,
    /// The plan the scheduler submitted (none: it had nothing to change).
    pub plan: Option<Plan>,
    /// Nomad's per-group counts of what the plan does, and what it evicts.
    pub annotations: PlanAnnotations,
    /// Placement metrics of each group that could not place everything.
    pub failed_tg_allocs: BTreeMap<String, AllocMetric>,
    /// Drover's addition: for each such group, the node classes that were
    /// filtered or had no room, and why.
    pub filtered_classes: BTreeMap<String, Vec<FilteredClass>>,
    /// The evals the scheduler would create (blocked, follow-ups).
    pub created_evals: Vec<Evaluation>,
    /// The snapshot planned against.
    pub snapshot: Arc<Snapshot>,
}

impl JobPlan {
    /// The stored job's `job_modify_index` (0 for a new job): what
    /// `job run -check-index` enforces.
    pub fn job_modify_index(&self) -> u64 {
        self.current.as_ref().map_or(0, |job| job.job_modify_index)
    }
}

/// Plans `job` against `snapshot` at `now`; see the module docs.
pub fn dry_run(snapshot: Arc<Snapshot>, job: Job, now: Timestamp) -> Result<JobPlan, JobPlanError> {
    job.validate()?;
    if !snapshot.has_namespace(&job.namespace) {
        return Err(JobPlanError::UnknownNamespace { job: job.id.to_string(), namespace: job.namespace.to_string() });
    }
    let current = snapshot.job(&job.key()).cloned();
    if let Some(current) = &current {
        if current.job_type != job.job_type {
            return Err(JobPlanError::TypeChange { job: job.key(), from: current.job_type, to: job.job_type });
        }
    }
    let planned = Arc::new(as_registered(current.as_deref(), job, snapshot.index() + 1));
    let state = Arc::new(PlannedState { snapshot: snapshot.clone(), job: planned.clone() });
    let eval = Evaluation::for_job(&planned, TriggerReason::JobRegister, now);
    let mut recorder = DryRunPlanner::default();
    let config = SchedulerConfig { now, ..SchedulerConfig::default() };
    new_scheduler(planned.job_type, state.clone(), &mut recorder, config).process(&eval)?;
    let existing: Vec<Arc<Allocation>> = snapshot.allocs_by_job(&planned.key()).cloned().collect();
    let mut annotations = annotate(&planned, &existing, recorder.plan.as_ref());
    let (queued, failed_tg_allocs) =
        recorder.outcome.map(|eval| (eval.queued_allocations, eval.failed_tg_allocs)).unwrap_or_default();
    // What the scheduler could not place was still asked for: Nomad counts
    // the reconciler's placements, placed or not.
    for (group, queued) in queued {
        annotations.desired_tg_updates.entry(group).or_default().place += queued;
    }
    let filtered_classes = failed_tg_allocs
        .keys()
        .filter_map(|name| planned.group(name))
        .map(|group| (group.name.clone(), filtered_classes(&*state, &planned, group, recorder.plan.as_ref())))
        .collect();
    Ok(JobPlan {
        current,
        planned,
        plan: recorder.plan,
        annotations,
        failed_tg_allocs,
        filtered_classes,
        created_evals: recorder.created_evals,
        snapshot,
    })
}

/// `job` as the state store's register would store it over `current` at
/// `index` (`state/apply.rs`, `register_job`).
fn as_registered(current: Option<&Job>, mut job: Job, index: u64) -> Job {
    match current {
        Some(current) if crate::state::same_spec(current, &job) => return current.clone(),
        Some(current) => {
            job.version = current.version + 1;
            job.create_index = current.create_index;
        }
        None => {
            job.version = 0;
            job.create_index = index;
        }
    }
    job.stable = false;
    job.modify_index = index;
    job.job_modify_index = index;
    job
}

/// The snapshot with the planned job in place of the stored one (step 2).
struct PlannedState {
    snapshot: Arc<Snapshot>,
    job: Arc<Job>,
}

impl State for PlannedState {
    fn index(&self) -> u64 {
        self.snapshot.index()
    }
    fn node(&self, id: NodeId) -> Option<Arc<Node>> {
        State::node(&*self.snapshot, id)
    }
    fn node_ref(&self, id: NodeId) -> Option<&Node> {
        State::node_ref(&*self.snapshot, id)
    }
    fn nodes(&self) -> Vec<Arc<Node>> {
        State::nodes(&*self.snapshot)
    }
    fn job(&self, key: &JobKey) -> Option<Arc<Job>> {
        match *key == self.job.key() {
            true => Some(self.job.clone()),
            false => State::job(&*self.snapshot, key),
        }
    }
    fn allocs_by_job(&self, key: &JobKey) -> Vec<Arc<Allocation>> {
        State::allocs_by_job(&*self.snapshot, key)
    }
    fn allocs_by_node(&self, id: NodeId) -> Vec<Arc<Allocation>> {
        State::allocs_by_node(&*self.snapshot, id)
    }
    fn schedulable_nodes(&self) -> NodeList {
        State::schedulable_nodes(&*self.snapshot)
    }
    fn class_nodes(&self) -> Vec<(ComputedClass, NodeList)> {
        State::class_nodes(&*self.snapshot)
    }
    fn node_usage(&self, id: NodeId) -> Resources {
        State::node_usage(&*self.snapshot, id)
    }
    fn port_in_use(&self, id: NodeId, port: u16) -> bool {
        State::port_in_use(&*self.snapshot, id, port)
    }
    fn ports_in_use_between(&self, id: NodeId, low: u16, high: u16) -> usize {
        State::ports_in_use_between(&*self.snapshot, id, low, high)
    }
    fn scheduler_config(&self) -> Option<SchedulerConfiguration> {
        State::scheduler_config(&*self.snapshot)
    }
    fn latest_deployment(&self, key: &JobKey) -> Option<Arc<crate::structs::Deployment>> {
        State::latest_deployment(&*self.snapshot, key)
    }
}

/// A planner that records and writes nothing (step 3).
#[derive(Default)]
struct DryRunPlanner {
    plan: Option<Plan>,
    created_evals: Vec<Evaluation>,
    outcome: Option<Evaluation>,
}

impl Planner for DryRunPlanner {
    fn submit_plan(&mut self, plan: Plan) -> Result<(PlanResult, Option<Arc<dyn State>>), SchedulerError> {
        let result = PlanResult {
            node_update: plan.node_update.clone(),
            node_allocation: plan.node_allocation.clone(),
            node_preemptions: plan.node_preemptions.clone(),
            refresh_index: 0,
            alloc_index: 0,
            deployment: plan.deployment.clone(),
            deployment_updates: plan.deployment_updates.clone(),
        };
        self.plan = Some(plan);
        Ok((result, None))
    }

    fn write_eval(&mut self, eval: Evaluation) -> Result<(), SchedulerError> {
        self.outcome = Some(eval);
        Ok(())
    }

    fn create_eval(&mut self, eval: Evaluation) -> Result<(), SchedulerError> {
        self.created_evals.push(eval);
        Ok(())
    }
}
