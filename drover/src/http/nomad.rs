//! The answers that read the state besides the object answered: a job's
//! status, submit time and summary, an allocation's node name and job.
//! They are built as the `api` model's structs (`crate::api::jobs`,
//! `crate::api::allocations`); what one engine value is enough for is a
//! `From` impl there (`Evaluation`, `Node`, `NodeListStub`, ...).

use std::collections::BTreeMap;

use engine::state::Snapshot;
use engine::structs::{Allocation, ClientStatus, Job, JobType};

use crate::api::allocations::{self, AllocationListStub};
use crate::api::jobs::{
    self, JobChildrenSummary, JobListStub, JobSummary, TaskGroup, TaskGroupSummary, UpdateStrategy,
};
use crate::api::periodic::{ParameterizedJob, Periodic};
use crate::api::word;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;

pub use crate::api::REGION;

/// When the job's current version was submitted: as the job endpoint
/// stamped it, or (a job written without, such as a test fixture's) when
/// its register eval, written in the same command, was created.
pub fn submit_time(job: &Job, snapshot: &Snapshot) -> u64 {
    if job.submit_time.0 > 0 {
        return job.submit_time.0;
    }
    snapshot
        .evals_by_job(&job.key())
        .find(|eval| eval.create_index == job.job_modify_index)
        .map_or(0, |eval| eval.create_time.0)
}

/// Nomad's job status: `running` while any allocation is live, `pending`
/// while nothing runs and an eval is outstanding or nothing was placed yet,
/// `dead` once stopped, or once everything placed has finished.
///
/// A periodic or parameterized job runs nothing itself: `running` until
/// stopped, as in Nomad.
pub fn job_status(job: &Job, snapshot: &Snapshot) -> &'static str {
    let key = job.key();
    if !job.is_scheduled_directly() {
        return if job.stop { "dead" } else { "running" };
    }
    if snapshot.allocs_by_job(&key).any(|alloc| !alloc.terminal()) {
        return "running";
    }
    if job.stop {
        return "dead";
    }
    let outstanding = snapshot.evals_by_job(&key).any(|eval| !eval.status.is_terminal());
    let placed = snapshot.allocs_by_job(&key).next().is_some();
    if outstanding || !placed {
        "pending"
    } else {
        "dead"
    }
}

/// The server's job (`GET /v1/job/:id`, and `Allocation.Job`).
pub fn job(job: &Job, snapshot: &Snapshot) -> jobs::Job {
    jobs::Job {
        stop: job.stop,
        region: REGION.to_string(),
        namespace: job.namespace.to_string(),
        id: job.id.to_string(),
        name: job.name.clone(),
        job_type: word(job.job_type),
        priority: u64::from(job.priority),
        datacenters: job.datacenters.clone(),
        constraints: job.constraints.iter().map(jobs::Constraint::from).collect(),
        affinities: jobs::none_if_empty(&job.affinities),
        spreads: jobs::none_if_empty(&job.spreads),
        task_groups: job
            .task_groups
            .iter()
            .map(|group| {
                let mut answered = TaskGroup::new(group, job.reschedule_policy(group).as_ref());
                answered.migrate =
                    (job.job_type == JobType::Service).then(|| jobs::MigrateStrategy::of(&group.migrate));
                answered
            })
            .collect(),
        update: Some(UpdateStrategy { stagger: Some(0), max_parallel: 0, ..UpdateStrategy::default() }),
        status: job_status(job, snapshot).to_string(),
        stable: job.stable,
        version: job.version,
        submit_time: submit_time(job, snapshot),
        create_index: job.create_index,
        modify_index: job.modify_index,
        job_modify_index: job.job_modify_index,
        meta: jobs::meta_or_none(&job.meta),
        parent_id: job.parent_id.clone(),
        periodic: job.periodic.as_ref().map(Periodic::from),
        parameterized_job: job.parameterized.as_ref().map(ParameterizedJob::from),
        dispatched: job.dispatched,
        payload: (!job.payload.is_empty()).then(|| BASE64.encode(&job.payload)),
        dispatch_idempotency_token: job.dispatch_idempotency_token.clone(),
        ..jobs::Job::default()
    }
}

/// Per task group counts, as `JobSummary.Summary`.
pub fn summary_counts(job: &Job, snapshot: &Snapshot) -> BTreeMap<String, TaskGroupSummary> {
    let mut groups: BTreeMap<String, TaskGroupSummary> =
        job.task_groups.iter().map(|group| (group.name.clone(), TaskGroupSummary::default())).collect();
    for alloc in snapshot.allocs_by_job(&job.key()) {
        let Some(counts) = groups.get_mut(&*alloc.task_group) else { continue };
        let slot = match (alloc.client_status, alloc.server_terminal()) {
            (ClientStatus::Pending, false) => &mut counts.starting,
            (ClientStatus::Running, false) => &mut counts.running,
            (ClientStatus::Pending | ClientStatus::Running, true) => continue,
            (ClientStatus::Failed, _) => &mut counts.failed,
            (ClientStatus::Complete, _) => &mut counts.complete,
            (ClientStatus::Lost, _) => &mut counts.lost,
            (ClientStatus::Unknown, _) => &mut counts.unknown,
        };
        *slot += 1;
    }
    let latest =
        snapshot.evals_by_job(&job.key()).filter(|eval| eval.status.is_terminal()).max_by_key(|e| e.modify_index);
    if let Some(eval) = latest {
        for (group, queued) in &eval.queued_allocations {
            if let Some(counts) = groups.get_mut(group.as_str()) {
                counts.queued = *queued;
            }
        }
    }
    groups
}

/// `JobSummary` (`/v1/job/:id/summary`, and in every list stub).
pub fn job_summary(job: &Job, snapshot: &Snapshot) -> JobSummary {
    JobSummary {
        job_id: job.id.to_string(),
        namespace: job.namespace.to_string(),
        summary: summary_counts(job, snapshot),
        children: children(job, snapshot),
        create_index: job.create_index,
        modify_index: job.modify_index,
    }
}

/// A periodic or parameterized job's children by status (none for others:
/// only they have children).
fn children(job: &Job, snapshot: &Snapshot) -> JobChildrenSummary {
    if job.is_scheduled_directly() {
        return JobChildrenSummary::default();
    }
    let counts = engine::job_endpoint::children_summary(snapshot, &job.key());
    JobChildrenSummary { pending: counts.pending, running: counts.running, dead: counts.dead }
}

/// A `JobListStub`.
pub fn job_stub(job: &Job, snapshot: &Snapshot) -> JobListStub {
    JobListStub {
        id: job.id.to_string(),
        parent_id: job.parent_id.clone(),
        name: job.name.clone(),
        namespace: job.namespace.to_string(),
        datacenters: job.datacenters.clone(),
        multiregion: None,
        job_type: word(job.job_type),
        priority: u64::from(job.priority),
        periodic: job.is_periodic(),
        parameterized_job: job.is_parameterized(),
        stop: job.stop,
        status: job_status(job, snapshot).to_string(),
        status_description: String::new(),
        job_summary: job_summary(job, snapshot),
        create_index: job.create_index,
        modify_index: job.modify_index,
        job_modify_index: job.job_modify_index,
        submit_time: submit_time(job, snapshot),
    }
}

/// An `AllocationListStub`, with its node's name.
pub fn alloc_stub(alloc: &Allocation, snapshot: &Snapshot) -> AllocationListStub {
    let node_name = snapshot.node(alloc.node_id).map(|node| node.name.clone()).unwrap_or_default();
    AllocationListStub::new(alloc, node_name)
}

/// A full `Allocation`: the stub, the job it runs and its resources.
pub fn alloc(alloc: &Allocation, snapshot: &Snapshot) -> allocations::Allocation {
    allocations::Allocation::new(alloc, alloc_stub(alloc, snapshot), job(&alloc.job, snapshot))
}
