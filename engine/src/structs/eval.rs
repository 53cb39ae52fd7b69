//! Evaluations: the unit of scheduling work.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{AllocMetric, ComputedClass, EvalId, Job, JobKey, JobType, NodeId};
use crate::clock::Timestamp;

/// An evaluation's lifecycle status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EvalStatus {
    /// Waiting to be scheduled.
    Pending,
    /// Parked until capacity changes.
    Blocked,
    /// Scheduled.
    Complete,
    /// Gave up after the delivery limit.
    Failed,
    /// Superseded by a newer eval for the same job.
    Canceled,
}

impl EvalStatus {
    /// Whether the eval will never be scheduled again.
    pub fn is_terminal(self) -> bool {
        matches!(self, EvalStatus::Complete | EvalStatus::Failed | EvalStatus::Canceled)
    }
}

/// Why an evaluation was created.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TriggerReason {
    /// A job was registered or changed.
    JobRegister,
    /// A job was deregistered or stopped.
    JobDeregister,
    /// A node's status changed.
    NodeUpdate,
    /// A node's allocations changed on the client (failed, completed).
    AllocFailure,
    /// A group was scaled.
    JobScaling,
    /// An operator asked for the job to be evaluated again.
    JobEvaluate,
    /// A delayed reschedule came due.
    RetryFailedAlloc,
    /// Follow-up of an eval that failed its delivery limit.
    FailedFollowUp,
    /// A blocked eval was created for unplaced allocations.
    QueuedAllocs,
    /// A disconnected allocation's `max_client_disconnect` ran out.
    MaxDisconnectTimeout,
    /// A disconnected allocation came back.
    Reconnect,
    /// The plan applier refused part of a plan.
    MaxPlanAttempts,
    /// Allocations of the job were evicted for higher-priority work.
    Preemption,
    /// An operator stopped one of the job's allocations (`alloc stop`).
    AllocStop,
    /// A deployment moved on: an allocation's health was decided, its
    /// canaries were promoted, it was failed, paused or resumed.
    DeploymentWatcher,
    /// The next batch of a system job's rolling update is due.
    RollingUpdate,
    /// A node the job has allocations on drains: they move, or its drain
    /// moved on (a replacement turned healthy, the deadline came).
    NodeDrain,
    /// A periodic job launched this child (Nomad's `periodic-job`).
    PeriodicJob,
}

/// A request to reconcile one job (or one node, for system jobs) against the
/// current state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// Identity.
    pub id: EvalId,
    /// Namespace of the job.
    pub namespace: Arc<str>,
    /// Priority, copied from the job: the broker serves higher first.
    pub priority: u8,
    /// Which scheduler handles it.
    pub eval_type: JobType,
    /// Why it exists.
    pub triggered_by: TriggerReason,
    /// The job to evaluate.
    pub job_id: Arc<str>,
    /// The job's modify index when the eval was made.
    pub job_modify_index: u64,
    /// The node that triggered it, for node updates.
    pub node_id: Option<NodeId>,
    /// Status.
    pub status: EvalStatus,
    /// Why it is in that status.
    pub status_description: String,
    /// Not to be scheduled before this time.
    pub wait_until: Option<Timestamp>,
    /// The eval created to follow this one (delayed reschedules, failed follow-up).
    pub next_eval: Option<EvalId>,
    /// The eval this one follows.
    pub previous_eval: Option<EvalId>,
    /// The blocked eval created for what this one could not place.
    pub blocked_eval: Option<EvalId>,
    /// Placement failures per task group.
    pub failed_tg_allocs: BTreeMap<String, AllocMetric>,
    /// Per computed class: whether the job's constraints can be met there.
    pub class_eligibility: BTreeMap<ComputedClass, bool>,
    /// The job has constraints that class-level checks cannot decide
    /// (unique attributes, distinct_*), so any capacity change may help.
    pub escaped_computed_class: bool,
    /// Allocations still to place per task group.
    pub queued_allocations: BTreeMap<String, u64>,
    /// The state index the scheduler saw; blocked evals compare it with
    /// capacity changes to spot missed unblocks.
    pub snapshot_index: u64,
    /// Index at which the eval was created.
    pub create_index: u64,
    /// Index of the last change to it.
    pub modify_index: u64,
    /// When it was created.
    pub create_time: Timestamp,
    /// When it last changed.
    pub modify_time: Timestamp,
}

impl Evaluation {
    /// The job's namespaced key.
    pub fn job_key(&self) -> JobKey {
        JobKey { namespace: self.namespace.clone(), id: self.job_id.clone() }
    }

    /// A pending eval of `job` with a fresh id.
    pub fn for_job(job: &Job, triggered_by: TriggerReason, now: Timestamp) -> Evaluation {
        Evaluation::with_id(EvalId::new_random(), job, triggered_by, now)
    }

    /// A pending eval of `job` with the given id.
    pub fn with_id(id: EvalId, job: &Job, triggered_by: TriggerReason, now: Timestamp) -> Evaluation {
        Evaluation {
            id,
            namespace: job.namespace.clone(),
            priority: job.priority,
            eval_type: job.job_type,
            triggered_by,
            job_id: job.id.clone(),
            job_modify_index: job.job_modify_index,
            node_id: None,
            status: EvalStatus::Pending,
            status_description: String::new(),
            wait_until: None,
            next_eval: None,
            previous_eval: None,
            blocked_eval: None,
            failed_tg_allocs: BTreeMap::new(),
            class_eligibility: BTreeMap::new(),
            escaped_computed_class: false,
            queued_allocations: BTreeMap::new(),
            snapshot_index: 0,
            create_index: 0,
            modify_index: 0,
            create_time: now,
            modify_time: now,
        }
    }

    /// A follow-up of this eval, scheduled no earlier than `wait_until`.
    pub fn follow_up(&self, triggered_by: TriggerReason, wait_until: Timestamp, now: Timestamp) -> Evaluation {
        let mut next = self.clone();
        next.id = EvalId::new_random();
        next.triggered_by = triggered_by;
        next.status = EvalStatus::Pending;
        next.status_description = String::new();
        next.wait_until = Some(wait_until);
        next.previous_eval = Some(self.id);
        next.next_eval = None;
        next.blocked_eval = None;
        next.failed_tg_allocs.clear();
        next.create_index = 0;
        next.modify_index = 0;
        next.create_time = now;
        next.modify_time = now;
        next
    }
}
