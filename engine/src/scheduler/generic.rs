//! The generic scheduler, for `service` and `batch` jobs.
//!
//! For one eval:
//! 1. Reconcile the job against its allocations ([`super::reconcile`]).
//! 2. Build a plan: stops, `unknown` marks, recorded reconnects, in-place
//!    updates, and a node (and its ports) for every placement from the
//!    [`Stack`]. A group that fails to place once is not tried again in
//!    this eval; later failures are coalesced. When the operator's
//!    configuration lets the job type preempt, a placement that finds no
//!    room may evict lower-priority allocations: they go in the plan as
//!    `evict`, and the plan applier's write makes their jobs an eval each.
//! 3. Submit it. If the plan applier refused part of it, re-plan against
//!    the refreshed state, up to 5 times for services and 2 for batch jobs
//!    (Nomad's limits); past that the eval fails and a blocked eval retries
//!    when capacity changes.
//! 4. Finish the eval: a blocked eval (or a reblock, if this eval was the
//!    blocked one) for what could not be placed, follow-up evals for delayed
//!    reschedules, rolling updates and disconnect expiries, and the eval's
//!    status with per-group placement metrics.

use std::collections::BTreeMap;
use std::sync::Arc;

use hashbrown::HashSet;

use super::reconcile::{Reconciled, Reconciler};
use super::stack::Stack;
use super::util::{add_preemptions, finish, Attempt, Summary};
use super::{Planner, Scheduler, SchedulerConfig, SchedulerError, State};
use crate::clock::Timestamp;
use crate::structs::{
    AllocId, AllocMetric, Allocation, ClientStatus, DesiredStatus, EvalId, EvalStatus, Evaluation, Job, JobType,
    NodeId, Plan, RescheduleEvent, TriggerReason,
};

const SERVICE_MAX_ATTEMPTS: u32 = 5;
const BATCH_MAX_ATTEMPTS: u32 = 2;

/// The scheduler for service and batch jobs; see the module docs.
pub struct GenericScheduler<'a> {
    state: Arc<dyn State>,
    planner: &'a mut dyn Planner,
    config: SchedulerConfig,
}

impl std::fmt::Debug for GenericScheduler<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GenericScheduler").field("index", &self.state.index()).finish()
    }
}

impl<'a> GenericScheduler<'a> {
    /// A scheduler reading `state` and writing through `planner`.
    pub fn new(state: Arc<dyn State>, planner: &'a mut dyn Planner, config: SchedulerConfig) -> Self {
        GenericScheduler { state, planner, config }
    }

    fn attempt(&mut self, eval: &Evaluation) -> Result<Attempt, SchedulerError> {
        let key = eval.job_key();
        let job = self.state.job(&key);
        let allocs = self.state.allocs_by_job(&key);
        let nodes = allocs
            .iter()
            .filter(|alloc| !alloc.terminal())
            .filter_map(|alloc| self.state.node(alloc.node_id).map(|node| (node.id, node)))
            .collect();
        let reconciled = Reconciler {
            job: job.as_ref(),
            job_key: &key,
            allocs: &allocs,
            nodes: &nodes,
            now: self.config.now,
            eval_id: eval.id,
            deployment: self.state.latest_deployment(&key).as_ref(),
            eval_priority: eval.priority,
        }
        .compute();
        let mut plan = Plan {
            eval_id: eval.id,
            priority: eval.priority,
            job: job.clone(),
            snapshot_index: self.state.index(),
            deployment: reconciled.deployment.clone(),
            deployment_updates: reconciled.deployment_updates.clone(),
            ..Plan::default()
        };
        let mut summary = Summary { follow_up_at: reconciled.follow_up_at, ..Summary::default() };
        let (algorithm, preemption) = self.config.settings(&*self.state);
        let mut stack = job.as_ref().map(|job| {
            Stack::new(self.state.clone(), job.clone(), algorithm, self.seed(eval))
                .with_claims(self.config.claims.clone())
                .with_preemption(preemption.enabled_for(job.job_type))
        });
        self.plan_changes(eval, &reconciled, &mut plan, stack.as_mut())?;
        if let (Some(job), Some(stack)) = (&job, stack.as_mut()) {
            self.plan_placements(eval, job, &reconciled, stack, &mut plan, &mut summary);
            summary.class_eligibility = stack.class_eligibility();
            summary.escaped = stack.escaped();
        }
        if plan.is_no_op() {
            return Ok(Attempt::Done(summary));
        }
        let (result, refreshed) = self.planner.submit_plan(plan)?;
        if result.refresh_index != 0 {
            return Ok(Attempt::Retry(refreshed.unwrap_or_else(|| self.state.clone())));
        }
        Ok(Attempt::Done(summary))
    }

    /// The node order's seed for one eval: the worker's seed mixed with the
    /// eval id by XXH3, fixed across builds, so a recorded seed replays.
    fn seed(&self, eval: &Evaluation) -> u64 {
        let mut bytes = [0u8; 24];
        bytes[..8].copy_from_slice(&self.config.seed.to_le_bytes());
        bytes[8..].copy_from_slice(eval.id.0.as_bytes());
        xxhash_rust::xxh3::xxh3_64(&bytes)
    }

    /// Stops, `unknown` marks, reconnects, in-place updates and delayed
    /// reschedules. One allocation may get several of the last four (a
    /// reconnect and an in-place update); they are merged into one entry.
    fn plan_changes(
        &mut self,
        eval: &Evaluation,
        reconciled: &Reconciled,
        plan: &mut Plan,
        mut stack: Option<&mut Stack>,
    ) -> Result<(), SchedulerError> {
        let now = self.config.now;
        for stop in &reconciled.stop {
            let mut alloc = Allocation::clone(&stop.alloc);
            alloc.desired_status = DesiredStatus::Stop;
            alloc.desired_description = stop.description.to_string();
            alloc.eval_id = eval.id;
            if let Some(status) = stop.client_status {
                alloc.record_client_status(status, now);
            }
            if let Some(stack) = stack.as_deref_mut() {
                stack.note_stopped(&stop.alloc);
            }
            plan.node_update.entry(alloc.node_id).or_default().push(alloc);
        }
        let mut updates: BTreeMap<AllocId, Allocation> = BTreeMap::new();
        let mut update = |alloc: &Arc<Allocation>, change: &mut dyn FnMut(&mut Allocation)| {
            let entry = updates.entry(alloc.id).or_insert_with(|| {
                let mut copy = Allocation::clone(alloc);
                copy.eval_id = eval.id;
                copy
            });
            change(entry);
        };
        for alloc in &reconciled.disconnecting {
            update(alloc, &mut |alloc| alloc.record_client_status(ClientStatus::Unknown, now));
        }
        for alloc in &reconciled.reconnect {
            let status = alloc.client_status;
            update(alloc, &mut |alloc| alloc.record_client_status(status, now));
        }
        if let Some(job) = &plan.job {
            for alloc in &reconciled.inplace {
                update(alloc, &mut |alloc| {
                    alloc.job = job.clone();
                    alloc.deployment_id = reconciled.deployment_id.or(alloc.deployment_id);
                });
            }
        }
        for (alloc, follow_up) in self.delayed_reschedules(eval, reconciled)? {
            update(alloc, &mut |alloc| alloc.follow_up_eval_id = Some(follow_up));
        }
        for alloc in updates.into_values() {
            plan.node_allocation.entry(alloc.node_id).or_default().push(alloc);
        }
        Ok(())
    }

    /// One follow-up eval per distinct reschedule time; each failed alloc
    /// records its follow-up so later evals do not make another.
    fn delayed_reschedules<'r>(
        &mut self,
        eval: &Evaluation,
        reconciled: &'r Reconciled,
    ) -> Result<Vec<(&'r Arc<Allocation>, EvalId)>, SchedulerError> {
        let mut by_time: BTreeMap<Timestamp, Evaluation> = BTreeMap::new();
        let mut marked = Vec::new();
        for (alloc, at) in &reconciled.delayed_reschedules {
            let follow_up = by_time
                .entry(*at)
                .or_insert_with(|| eval.follow_up(TriggerReason::RetryFailedAlloc, *at, self.config.now));
            marked.push((alloc, follow_up.id));
        }
        for follow_up in by_time.into_values() {
            self.planner.create_eval(follow_up)?;
        }
        Ok(marked)
    }

    fn plan_placements(
        &mut self,
        eval: &Evaluation,
        job: &Arc<Job>,
        reconciled: &Reconciled,
        stack: &mut Stack,
        plan: &mut Plan,
        summary: &mut Summary,
    ) {
        let now = self.config.now;
        for request in &reconciled.place {
            let Some(group) = job.group(&request.group) else { continue };
            if let Some(metric) = summary.failed.get_mut(&group.name) {
                metric.coalesced_failures += 1;
                *summary.queued.entry(group.name.clone()).or_insert(0) += 1;
                continue;
            }
            let penalty: HashSet<NodeId> = match (&request.previous, request.reschedule) {
                (Some(previous), true) => std::iter::once(previous.node_id)
                    .chain(previous.reschedule_events.iter().map(|event| event.prev_node_id))
                    .collect(),
                _ => HashSet::new(),
            };
            let mut metric = AllocMetric::default();
            match stack.select(group, &penalty, &mut metric) {
                Some(selection) => {
                    let mut alloc =
                        Allocation::new_placement(job, &group.name, request.index, selection.node.id, eval.id);
                    alloc.create_time = now;
                    alloc.modify_time = now;
                    alloc.ports = selection.ports;
                    alloc.score = selection.score;
                    alloc.deployment_id = reconciled.deployment_id;
                    alloc.canary = request.canary;
                    if let Some(previous) = &request.previous {
                        link_replacement(&mut alloc, previous, request.reschedule, now);
                    }
                    add_preemptions(plan, &mut alloc, &selection.preempted, eval);
                    stack.note_placed(&alloc);
                    plan.node_allocation.entry(alloc.node_id).or_default().push(alloc);
                }
                None => {
                    summary.failed.insert(group.name.clone(), metric);
                    *summary.queued.entry(group.name.clone()).or_insert(0) += 1;
                }
            }
        }
    }
}

/// Links a replacement to the allocation it replaces and, for reschedules,
/// carries the reschedule history forward with one more event.
fn link_replacement(alloc: &mut Allocation, previous: &Allocation, reschedule: bool, now: Timestamp) {
    alloc.previous_allocation = Some(previous.id);
    if reschedule {
        alloc.reschedule_events = previous.reschedule_events.clone();
        alloc.reschedule_events.push(RescheduleEvent {
            time: now,
            prev_alloc_id: previous.id,
            prev_node_id: previous.node_id,
            delay_nanos: now.since(previous.client_status_time).as_nanos() as u64,
        });
    }
}

impl Scheduler for GenericScheduler<'_> {
    fn process(&mut self, eval: &Evaluation) -> Result<(), SchedulerError> {
        if eval.eval_type.is_system_like() {
            return Err(SchedulerError::InvalidEval(format!("{} eval given to the generic scheduler", eval.eval_type)));
        }
        let max_attempts = if eval.eval_type == JobType::Batch { BATCH_MAX_ATTEMPTS } else { SERVICE_MAX_ATTEMPTS };
        for _ in 0..max_attempts {
            match self.attempt(eval)? {
                Attempt::Done(summary) => return self.finish(eval, summary, EvalStatus::Complete, ""),
                Attempt::Retry(state) => self.state = state,
            }
        }
        // Every attempt was partly refused: fail this eval and let a blocked eval retry on a capacity change.
        let summary = Summary { escaped: true, block: true, ..Summary::default() };
        let description = format!("maximum attempts reached ({max_attempts})");
        self.finish(eval, summary, EvalStatus::Failed, &description)
    }
}

impl GenericScheduler<'_> {
    /// Step 4.
    fn finish(
        &mut self,
        eval: &Evaluation,
        summary: Summary,
        status: EvalStatus,
        description: &str,
    ) -> Result<(), SchedulerError> {
        finish(&mut *self.planner, eval, summary, (status, description), self.state.index(), self.config.now)
    }
}
