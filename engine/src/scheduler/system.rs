//! The system scheduler, for `system` jobs (one allocation of each group on
//! every feasible node, kept there) and `sysbatch` jobs (one run to
//! completion on every feasible node).
//!
//! For one eval:
//! 1. A stopped or missing job stops every live allocation.
//! 2. Allocations on nodes that are down or gone are stopped as lost (a
//!    system allocation belongs to its node and is not moved); on a
//!    disconnected node that the group tolerates, they are marked `unknown`
//!    with a follow-up eval when the disconnect runs out, and are waited
//!    for. When their node is back and the client reported them, the
//!    reconnect is recorded (see [`super::reconcile`], step 4); until the
//!    report they are ignored, though they still occupy their node.
//!    Allocations on an `initializing` node are left alone, and so are
//!    those on an ineligible node (it takes nothing new), but for a
//!    draining node: it gives them up once every other allocation on it
//!    stopped on its client or its deadline came, unless the drain ignores
//!    system jobs.
//! 3. Feasibility is decided once per computed class, then every ready node
//!    is checked (unique-attribute constraints, room and ports against the
//!    snapshot plus what this plan already changed there, [`PlanUsage`]) in
//!    parallel with rayon; dynamic ports are drawn from a generator seeded
//!    per node, so a seeded run replays.
//! 4. Per node and group: place when feasible, missing and it fits (a
//!    sysbatch group that already ran there for this job version is not run
//!    again); when it does not fit and the operator's configuration lets the
//!    job type preempt (system jobs by default), evict lower-priority
//!    allocations there ([`super::preempt`]); stop when no longer feasible;
//!    stop duplicates; update outdated allocations in place or
//!    destructively. With an `update` block the destructive updates roll:
//!    at most `max_parallel` of the group's allocations unavailable at
//!    once (those not yet running count), the rest held back for a
//!    follow-up eval `stagger` later. Groups are planned one after another, each seeing the
//!    placements, stops and evictions of those before.
//! 5. Submit; re-plan on a partial refusal (up to 5 times); a blocked eval
//!    for nodes that had no room.

use std::sync::Arc;

use hashbrown::HashMap;
use rayon::prelude::*;

use rand::rngs::SmallRng;
use rand::SeedableRng;

use super::feasible::FeasibilityChecker;
use super::preempt::preemption_for;
use super::reconcile::{disconnect_window, is_available, needs_destructive_update, stop_reason, taint_of, Taint};
use super::usage::{PlanUsage, PortAsk};
use super::util::{add_preemptions, finish, Attempt, Summary};
use super::{Planner, Scheduler, SchedulerConfig, SchedulerError, State};
use crate::structs::{
    AllocId, AllocMetric, AllocatedPort, Allocation, ClientStatus, DesiredStatus, EvalStatus, Evaluation, Job, Node,
    NodeId, NodeStatus, Plan, Resources, TaskGroup,
};

const MAX_ATTEMPTS: u32 = 5;

/// What to do on one node for one group.
enum NodeDecision {
    Nothing,
    /// Place, with these ports, after evicting these allocations.
    Place(Vec<AllocatedPort>, Vec<Arc<Allocation>>),
    Exhausted(String),
    Filtered(String),
}

/// What every node's decision for one group reads; shared by rayon's threads.
struct GroupAsk<'a> {
    state: &'a dyn State,
    usage: &'a PlanUsage,
    checker: &'a FeasibilityChecker,
    resources: Resources,
    ports: Option<PortAsk>,
    /// The job's priority when it may preempt.
    preempt_priority: Option<u8>,
    seed: u64,
}

/// The scheduler for system and sysbatch jobs; see the module docs.
pub struct SystemScheduler<'a> {
    state: Arc<dyn State>,
    planner: &'a mut dyn Planner,
    config: SchedulerConfig,
    /// Allocations of this attempt whose reconnect is recorded if kept.
    reconnecting: hashbrown::HashSet<AllocId>,
    /// Nodes and groups of `unknown` allocations whose node is back but
    /// whose client has not reported them: nothing is placed beside them.
    awaiting: hashbrown::HashSet<(NodeId, Arc<str>)>,
    /// What this attempt's plan changed on each node.
    usage: PlanUsage,
    /// The group being planned: how many more available allocations its
    /// rolling update may stop (`None`: no `update` block, all at once),
    /// and whether an update was held back for the next batch.
    rolling: Option<usize>,
    held_back: bool,
}

impl std::fmt::Debug for SystemScheduler<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SystemScheduler").field("index", &self.state.index()).finish()
    }
}

impl<'a> SystemScheduler<'a> {
    /// A scheduler reading `state` and writing through `planner`.
    pub fn new(state: Arc<dyn State>, planner: &'a mut dyn Planner, config: SchedulerConfig) -> Self {
        SystemScheduler {
            state,
            planner,
            config,
            reconnecting: hashbrown::HashSet::new(),
            awaiting: hashbrown::HashSet::new(),
            usage: PlanUsage::default(),
            rolling: None,
            held_back: false,
        }
    }

    /// One planning attempt.
    fn attempt(&mut self, eval: &Evaluation) -> Result<Attempt, SchedulerError> {
        let key = eval.job_key();
        let job = self.state.job(&key).filter(|job| !job.stop);
        let allocs = self.state.allocs_by_job(&key);
        let mut plan = Plan {
            eval_id: eval.id,
            priority: eval.priority,
            job: job.clone(),
            snapshot_index: self.state.index(),
            ..Plan::default()
        };
        let mut outcome = Summary::default();
        let nodes = self.state.nodes();
        let by_id: HashMap<NodeId, &Arc<Node>> = nodes.iter().map(|node| (node.id, node)).collect();
        let mut live: HashMap<(NodeId, &str), Vec<&Arc<Allocation>>> = HashMap::new();
        self.reconnecting.clear();
        self.awaiting.clear();
        self.usage = PlanUsage::default();
        let now = self.config.now;
        for alloc in allocs.iter().filter(|alloc| !alloc.terminal()) {
            let group = job.as_ref().and_then(|job| job.group(&alloc.task_group));
            match (group, taint_of(alloc, by_id.get(&alloc.node_id).map(|node| &***node), now)) {
                (None, _) => self.stop(&mut plan, eval, alloc, stop_reason::JOB_STOPPED, None),
                (_, Taint::Lost) => self.stop(&mut plan, eval, alloc, stop_reason::LOST, Some(ClientStatus::Lost)),
                (Some(_), Taint::Disconnecting) => {
                    self.mark_unknown(&mut plan, eval, alloc);
                    if let Some(window) = disconnect_window(alloc) {
                        outcome.follow_up_no_later_than(now.plus(window));
                    }
                }
                (_, Taint::Unknown) => {}
                // A system allocation belongs to its node: held, it waits
                // for it until the node's release, then is lost as on a
                // node that is down (there is nowhere else for it to go).
                (Some(_), Taint::Held { release_at, .. }) if now < release_at => {
                    outcome.follow_up_no_later_than(release_at);
                }
                (Some(_), Taint::Held { .. }) => {
                    self.stop(&mut plan, eval, alloc, stop_reason::LOST, Some(ClientStatus::Lost))
                }
                (Some(_), Taint::AwaitingReport) => {
                    self.awaiting.insert((alloc.node_id, alloc.task_group.clone()));
                }
                (Some(_), taint) => {
                    if taint == Taint::Reconnecting {
                        self.reconnecting.insert(alloc.id);
                    }
                    live.entry((alloc.node_id, &alloc.task_group)).or_default().push(alloc);
                }
            }
        }
        if let Some(job) = &job {
            // In id order, so that a seeded run places the same allocations on the same nodes.
            let mut ready: Vec<Arc<Node>> = nodes
                .iter()
                .filter(|node| node.is_schedulable() && job.datacenters.iter().any(|dc| *dc == *node.datacenter))
                .cloned()
                .collect();
            ready.sort_unstable_by_key(|node| node.id);
            for group in &job.task_groups {
                self.plan_group(eval, job, group, &ready, &allocs, &mut live, &mut plan, &mut outcome);
            }
        }
        // Whatever is left in `live` sits on nodes that are not ready and
        // eligible or not in the job's datacenters. A node that is
        // initializing is coming back: wait for it. An ineligible node keeps
        // what it runs (it only takes nothing new), as Nomad's, but for a
        // draining node that gives its system allocations up.
        for alloc in live.into_values().flatten() {
            let node = by_id.get(&alloc.node_id).filter(|node| {
                let in_datacenter =
                    job.as_ref().is_some_and(|job| job.datacenters.iter().any(|dc| *dc == *node.datacenter));
                node.status == NodeStatus::Initializing || (node.status == NodeStatus::Ready && in_datacenter)
            });
            match node {
                None => self.stop(&mut plan, eval, alloc, stop_reason::NODE_INELIGIBLE, None),
                Some(node) if self.drain_releases(node) => {
                    self.stop(&mut plan, eval, alloc, stop_reason::NODE_DRAINED, None)
                }
                Some(_) if self.reconnecting.contains(&alloc.id) => {
                    plan.node_allocation.entry(alloc.node_id).or_default().push(self.reconnected(alloc, eval));
                }
                Some(_) => {}
            }
        }
        if plan.is_no_op() {
            return Ok(Attempt::Done(outcome));
        }
        let (result, refreshed) = self.planner.submit_plan(plan)?;
        if result.refresh_index != 0 {
            return Ok(Attempt::Retry(refreshed.unwrap_or_else(|| self.state.clone())));
        }
        Ok(Attempt::Done(outcome))
    }

    /// Whether a draining node gives up its system allocations: its
    /// deadline came, or every other allocation on it stopped on its
    /// client; never when the drain ignores system jobs.
    fn drain_releases(&self, node: &Node) -> bool {
        let Some(drain) = &node.drain.strategy else { return false };
        if drain.ignore_system_jobs {
            return false;
        }
        let others_gone = || {
            let allocs = self.state.allocs_by_node(node.id);
            allocs.iter().all(|alloc| alloc.job.job_type.is_system_like() || alloc.client_terminal())
        };
        drain.is_forced(self.config.now) || others_gone()
    }

    #[allow(clippy::too_many_arguments)]
    fn plan_group<'b>(
        &mut self,
        eval: &Evaluation,
        job: &Arc<Job>,
        group: &'b TaskGroup,
        ready: &[Arc<Node>],
        allocs: &[Arc<Allocation>],
        live: &mut HashMap<(NodeId, &'b str), Vec<&'b Arc<Allocation>>>,
        plan: &mut Plan,
        outcome: &mut Summary,
    ) {
        let mut checker = FeasibilityChecker::new(job, group);
        checker.warm(ready);
        self.rolling = group.update.as_ref().map(|update| rolling_budget(allocs, group, update.max_parallel));
        self.held_back = false;
        let ran_here: hashbrown::HashSet<NodeId> = allocs
            .iter()
            .filter(|alloc| job.job_type.is_batch_like() && alloc.client_terminal() && *alloc.task_group == *group.name)
            .filter(|alloc| alloc.job.job_modify_index == job.job_modify_index)
            .map(|alloc| alloc.node_id)
            .collect();
        let awaiting_here: hashbrown::HashSet<NodeId> =
            self.awaiting.iter().filter(|(_, name)| **name == *group.name).map(|(node_id, _)| *node_id).collect();
        let (_, preemption) = self.config.settings(&*self.state);
        let ask = GroupAsk {
            state: &*self.state,
            usage: &self.usage,
            checker: &checker,
            resources: group.resources(),
            ports: PortAsk::of(group),
            preempt_priority: preemption.enabled_for(job.job_type).then_some(job.priority),
            seed: xxhash_rust::xxh3::xxh3_64_with_seed(
                group.name.as_bytes(),
                self.config.seed ^ eval.id.0.as_u64_pair().0,
            ),
        };
        let decisions: Vec<NodeDecision> = ready
            .par_iter()
            .map(|node| {
                let present = live.contains_key(&(node.id, group.name.as_str()))
                    || ran_here.contains(&node.id)
                    || awaiting_here.contains(&node.id);
                decide(&ask, node, present)
            })
            .collect();
        let port_ask = ask.ports.clone();
        let mut metric = AllocMetric::default();
        for (node, decision) in ready.iter().zip(decisions) {
            let existing = live.remove(&(node.id, group.name.as_str())).unwrap_or_default();
            metric.nodes_evaluated += 1;
            match decision {
                NodeDecision::Nothing => self.keep_one(eval, job, group, existing, port_ask.as_ref(), plan),
                NodeDecision::Place(ports, evicted) => {
                    let mut alloc = Allocation::new_placement(job, &group.name, 0, node.id, eval.id);
                    alloc.create_time = self.config.now;
                    alloc.modify_time = self.config.now;
                    alloc.ports = ports;
                    for victim in &evicted {
                        self.usage.remove(&*self.state, victim);
                    }
                    add_preemptions(plan, &mut alloc, &evicted, eval);
                    self.usage.place(&*self.state, &alloc);
                    plan.node_allocation.entry(node.id).or_default().push(alloc);
                }
                NodeDecision::Exhausted(dimension) => {
                    metric.nodes_exhausted += 1;
                    *metric.class_exhausted.entry(node.node_class.to_string()).or_insert(0) += 1;
                    *metric.dimension_exhausted.entry(dimension).or_insert(0) += 1;
                    *outcome.queued.entry(group.name.clone()).or_insert(0) += 1;
                }
                NodeDecision::Filtered(reason) => {
                    metric.nodes_filtered += 1;
                    *metric.class_filtered.entry(node.node_class.to_string()).or_insert(0) += 1;
                    *metric.constraint_filtered.entry(reason).or_insert(0) += 1;
                    for alloc in existing {
                        self.stop(plan, eval, alloc, stop_reason::NODE_INFEASIBLE, None);
                    }
                }
            }
        }
        if let (true, Some(update)) = (self.held_back, &group.update) {
            let at = self.config.now.plus(update.stagger);
            outcome.rolling_update_at = Some(outcome.rolling_update_at.map_or(at, |current| current.min(at)));
        }
        if metric.nodes_exhausted > 0 {
            outcome.failed.insert(group.name.clone(), metric);
        }
        for (class, eligible) in &checker.class_eligibility {
            *outcome.class_eligibility.entry(*class).or_insert(false) |= *eligible;
        }
        outcome.escaped |= checker.escaped();
    }

    /// Keeps the oldest live allocation of a group on a node, stopping
    /// duplicates, and moves it to the current job version.
    fn keep_one(
        &mut self,
        eval: &Evaluation,
        job: &Arc<Job>,
        group: &TaskGroup,
        mut existing: Vec<&Arc<Allocation>>,
        ports: Option<&PortAsk>,
        plan: &mut Plan,
    ) {
        existing.sort_by_key(|alloc| alloc.create_index);
        let mut existing = existing.into_iter();
        let Some(kept) = existing.next() else { return };
        for duplicate in existing {
            self.stop(plan, eval, duplicate, stop_reason::NODE_TAKEN, None);
        }
        let reconnected = self.reconnecting.contains(&kept.id);
        if kept.job.job_modify_index == job.job_modify_index {
            if reconnected {
                plan.node_allocation.entry(kept.node_id).or_default().push(self.reconnected(kept, eval));
            }
            return;
        }
        let destructive =
            kept.job.group(&group.name).is_none_or(|old| needs_destructive_update(&kept.job, old, job, group));
        if destructive {
            if is_available(kept) {
                match self.rolling.as_mut() {
                    Some(0) => {
                        self.held_back = true;
                        return;
                    }
                    Some(left) => *left -= 1,
                    None => {}
                }
            }
            self.replace(eval, job, group, kept, ports, plan);
        } else {
            let mut alloc = if reconnected { self.reconnected(kept, eval) } else { Allocation::clone(kept) };
            alloc.job = job.clone();
            alloc.eval_id = eval.id;
            plan.node_allocation.entry(kept.node_id).or_default().push(alloc);
        }
    }

    /// A destructive update on the allocation's own node: the old one stops
    /// and a new one takes its place, with ports drawn afresh (the old
    /// one's are free again). When the node cannot give the new version its
    /// ports, the old one is left running.
    fn replace(
        &mut self,
        eval: &Evaluation,
        job: &Arc<Job>,
        group: &TaskGroup,
        kept: &Arc<Allocation>,
        ports: Option<&PortAsk>,
        plan: &mut Plan,
    ) {
        let Some(node) = self.state.node(kept.node_id) else { return };
        let given = match ports {
            Some(ports) => {
                let (state, stopped) = (&*self.state, [kept.clone()]);
                let mut rng = SmallRng::seed_from_u64(self.config.seed ^ kept.id.0.as_u64_pair().0);
                match self.usage.ports_fit_evicting(state, &node, ports, &stopped) {
                    Ok(()) => self.usage.assign_ports_evicting(state, &node, ports, &stopped, &mut rng),
                    Err(_) => None,
                }
            }
            None => Some(Vec::new()),
        };
        let Some(given) = given else { return };
        self.stop(plan, eval, kept, stop_reason::UPDATING, None);
        let mut alloc = Allocation::new_placement(job, &group.name, 0, kept.node_id, eval.id);
        alloc.previous_allocation = Some(kept.id);
        alloc.create_time = self.config.now;
        alloc.modify_time = self.config.now;
        alloc.ports = given;
        self.usage.place(&*self.state, &alloc);
        plan.node_allocation.entry(kept.node_id).or_default().push(alloc);
    }

    /// A kept reconnecting allocation with its reconnect recorded.
    fn reconnected(&self, alloc: &Allocation, eval: &Evaluation) -> Allocation {
        let mut alloc = alloc.clone();
        alloc.record_client_status(alloc.client_status, self.config.now);
        alloc.eval_id = eval.id;
        alloc
    }

    fn stop(
        &mut self,
        plan: &mut Plan,
        eval: &Evaluation,
        alloc: &Allocation,
        description: &str,
        status: Option<ClientStatus>,
    ) {
        let mut stopped = alloc.clone();
        stopped.desired_status = DesiredStatus::Stop;
        stopped.desired_description = description.to_string();
        stopped.eval_id = eval.id;
        if let Some(status) = status {
            stopped.record_client_status(status, self.config.now);
        }
        self.usage.remove(&*self.state, alloc);
        plan.node_update.entry(alloc.node_id).or_default().push(stopped);
    }

    fn mark_unknown(&self, plan: &mut Plan, eval: &Evaluation, alloc: &Allocation) {
        let mut unknown = alloc.clone();
        unknown.record_client_status(ClientStatus::Unknown, self.config.now);
        unknown.eval_id = eval.id;
        plan.node_allocation.entry(alloc.node_id).or_default().push(unknown);
    }
}

/// How many available allocations of `group` a rolling update may stop
/// now: its live allocations may go at most `max_parallel` below their
/// number (what the plan applier holds too, [`crate::plan::budget`]).
fn rolling_budget(allocs: &[Arc<Allocation>], group: &TaskGroup, max_parallel: u32) -> usize {
    let of_group = allocs.iter().filter(|alloc| *alloc.task_group == *group.name && !alloc.terminal());
    let (total, available) = of_group
        .fold((0usize, 0usize), |(total, available), alloc| (total + 1, available + usize::from(is_available(alloc))));
    available.saturating_sub(total.saturating_sub(max_parallel as usize))
}

/// Decides one node; runs on rayon's threads.
fn decide(ask: &GroupAsk<'_>, node: &Node, present: bool) -> NodeDecision {
    match ask.checker.check_cached(node) {
        Some(Err(filtered)) => return NodeDecision::Filtered(filtered.metric_key()),
        None => return NodeDecision::Filtered("class not checked".to_string()),
        Some(Ok(())) => {}
    }
    if present {
        return NodeDecision::Nothing;
    }
    let used = ask.usage.used(ask.state, node.id);
    let ports_fit = ask.ports.as_ref().map_or(Ok(()), |ports| ask.usage.ports_fit(ask.state, node, ports));
    let short = match node.allocatable().exhausted_dimension(used.plus(ask.resources)) {
        Some(dimension) => Some(dimension.to_string()),
        None => ports_fit.err().map(|refused| refused.to_string()),
    };
    let evicted = match (short, ask.preempt_priority) {
        (None, _) => Vec::new(),
        (Some(dimension), None) => return NodeDecision::Exhausted(dimension),
        (Some(dimension), Some(priority)) => {
            match preemption_for(ask.state, ask.usage, node, ask.resources, ask.ports.as_ref(), priority) {
                Some(preemption) => preemption.allocs,
                None => return NodeDecision::Exhausted(dimension),
            }
        }
    };
    let Some(ports) = &ask.ports else { return NodeDecision::Place(Vec::new(), evicted) };
    let mut rng = SmallRng::seed_from_u64(ask.seed ^ node.id.0.as_u64_pair().0);
    match ask.usage.assign_ports_evicting(ask.state, node, ports, &evicted, &mut rng) {
        Some(given) => NodeDecision::Place(given, evicted),
        None => NodeDecision::Exhausted(super::usage::DYNAMIC_PORTS_EXHAUSTED.to_string()),
    }
}

impl Scheduler for SystemScheduler<'_> {
    fn process(&mut self, eval: &Evaluation) -> Result<(), SchedulerError> {
        if !eval.eval_type.is_system_like() {
            return Err(SchedulerError::InvalidEval(format!("{} eval given to the system scheduler", eval.eval_type)));
        }
        let now = self.config.now;
        for _ in 0..MAX_ATTEMPTS {
            match self.attempt(eval)? {
                Attempt::Done(summary) => {
                    let index = self.state.index();
                    return finish(&mut *self.planner, eval, summary, (EvalStatus::Complete, ""), index, now);
                }
                Attempt::Retry(state) => self.state = state,
            }
        }
        let description = format!("maximum attempts reached ({MAX_ATTEMPTS})");
        let index = self.state.index();
        finish(&mut *self.planner, eval, Summary::default(), (EvalStatus::Failed, &description), index, now)
    }
}
