//! The disruption budget under random interleavings: workers planning on
//! stale snapshots, clients reporting health, nodes failing and draining,
//! deployments paused and resumed, and plans that ignore the budget on
//! purpose (updates and migrations). Every
//! plan goes through the applier's checks ([`evaluate_plan`] and
//! [`hold_budget`]) before it is written, as in the server.

use std::sync::Arc;

use hashbrown::HashMap;
use proptest::prelude::*;

use super::hold_budget;
use crate::clock::Timestamp;
use crate::plan::apply::evaluate_plan;
use crate::scheduler::reconcile::{is_available, stop_reason};
use crate::scheduler::{new_scheduler, Planner, SchedulerConfig, SchedulerError, State};
use crate::state::{ClientAllocUpdate, Command, Snapshot, StateStore};
use crate::structs::{
    AllocHealth, Allocation, ClientStatus, DeploymentStatus, DeploymentStatusUpdate, DesiredStatus, DrainDeadline,
    DrainStrategy, Evaluation, Job, JobType, Node, NodeId, NodeStatus, Plan, PlanResult, Resources, TriggerReason,
    UpdateStrategy,
};

const NOW: Timestamp = Timestamp(1_000_000 * 1_000_000_000);
const N_NODES: u128 = 8;
const WORKERS: usize = 3;

/// One step of the interleaving.
#[derive(Clone, Debug)]
enum Step {
    /// A worker takes a fresh snapshot.
    Refresh(usize),
    /// A worker plans on the snapshot it holds and submits.
    Plan(usize),
    /// A client reports its allocation (by position among the live ones) healthy or not.
    Health(usize, bool),
    /// A node goes down (an involuntary loss).
    NodeDown(u128),
    /// A plan that stops this many available allocations for an update at once.
    Greedy(usize),
    /// The deployment is paused or resumed.
    Pause(bool),
    /// A node drains (no deadline): its allocations migrate.
    Drain(u128),
    /// A plan that migrates this many available allocations at once.
    GreedyMigrate(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => (0..WORKERS).prop_map(Step::Refresh),
        4 => (0..WORKERS).prop_map(Step::Plan),
        4 => (0usize..12, prop::bool::weighted(0.85)).prop_map(|(alloc, healthy)| Step::Health(alloc, healthy)),
        1 => (1..=N_NODES).prop_map(Step::NodeDown),
        1 => (1usize..6).prop_map(Step::Greedy),
        1 => prop::bool::ANY.prop_map(Step::Pause),
        1 => (1..=N_NODES).prop_map(Step::Drain),
        1 => (1usize..6).prop_map(Step::GreedyMigrate),
    ]
}

/// The server's side: the store, and what the applier let through.
struct Applier {
    store: StateStore,
    job: Arc<Job>,
    count: usize,
    max_parallel: usize,
}

impl Applier {
    /// Checks and commits a plan as the plan applier does, and asserts the
    /// budget: a committed plan that stops available allocations voluntarily
    /// leaves at least `count - max_parallel` available.
    fn submit(&self, plan: &Plan) -> PlanResult {
        let snapshot = self.store.snapshot();
        let (mut result, refused) = evaluate_plan(plan, &snapshot, &HashMap::new());
        let over = hold_budget(plan, &snapshot, &[], &mut result);
        if !refused.is_empty() || over > 0 {
            result.refresh_index = snapshot.index();
        }
        let disrupts = result.node_update.values().flatten().any(|stop| {
            stop_reason::is_voluntary(&stop.desired_description)
                && snapshot.alloc(stop.id).is_some_and(|before| is_available(before))
        });
        if !result.is_empty() {
            self.store.apply(Command::apply_plan_result(plan.eval_id, &result, NOW)).expect("the plan applies");
        }
        if disrupts {
            let available = self.available();
            assert!(
                available + self.max_parallel >= self.count,
                "a committed plan left {available} of {} available with max_parallel {}",
                self.count,
                self.max_parallel
            );
        }
        result
    }

    fn available(&self) -> usize {
        self.live().iter().filter(|alloc| is_available(alloc)).count()
    }

    fn live(&self) -> Vec<Arc<Allocation>> {
        let snapshot = self.store.snapshot();
        snapshot.allocs_by_job(&self.job.key()).filter(|alloc| !alloc.terminal()).cloned().collect()
    }
}

/// A worker's planner: every plan goes through the applier.
struct Worker<'a> {
    applier: &'a Applier,
}

impl Planner for Worker<'_> {
    fn submit_plan(&mut self, plan: Plan) -> Result<(PlanResult, Option<Arc<dyn State>>), SchedulerError> {
        let result = self.applier.submit(&plan);
        let refreshed: Option<Arc<dyn State>> = (result.refresh_index != 0).then(|| {
            let snapshot: Arc<Snapshot> = self.applier.store.snapshot();
            snapshot as Arc<dyn State>
        });
        Ok((result, refreshed))
    }

    fn write_eval(&mut self, _eval: Evaluation) -> Result<(), SchedulerError> {
        Ok(())
    }
}

/// Version 1 of a job placed and healthy on the nodes, version 2 registered.
fn rolling(count: u32, max_parallel: u32) -> Applier {
    let store = StateStore::new();
    for i in 1..=N_NODES {
        let node = Node::new_ready(NodeId::from_u128(i), "dc1", "c", Resources::new(8000, 16384, 100_000));
        store.apply(Command::UpsertNode { node, evals: vec![] }).expect("node");
    }
    let mut spec = Job::new_simple("web", JobType::Service, count, Resources::new(100, 64, 0));
    spec.task_groups[0].update = Some(UpdateStrategy::rolling(max_parallel));
    spec.task_groups[0].migrate.max_parallel = max_parallel;
    store.apply(Command::RegisterJob { job: spec.clone(), eval: None }).expect("v1");
    let v1 = store.snapshot().job(&spec.key()).expect("v1").clone();
    let allocs: Vec<Allocation> = (0..count)
        .map(|index| {
            let node = NodeId::from_u128(u128::from(index) % N_NODES + 1);
            let mut alloc = Allocation::new_placement(&v1, "group", index, node, crate::structs::EvalId::new_random());
            alloc.client_status = ClientStatus::Running;
            alloc
        })
        .collect();
    let place = Command::ApplyPlanResults {
        eval_id: crate::structs::EvalId::new_random(),
        allocs,
        evals: vec![],
        deployment: None,
        deployment_updates: vec![],
        time: NOW,
    };
    store.apply(place).expect("v1 placed");
    let mut v2 = spec;
    v2.task_groups[0].tasks[0].env.insert("VERSION".into(), "2".into());
    store.apply(Command::RegisterJob { job: v2.clone(), eval: None }).expect("v2");
    let job = store.snapshot().job(&v2.key()).expect("v2").clone();
    Applier { store, job, count: count as usize, max_parallel: max_parallel as usize }
}

fn run(applier: &Applier, steps: &[Step]) {
    let mut held: Vec<Arc<Snapshot>> = (0..WORKERS).map(|_| applier.store.snapshot()).collect();
    for step in steps {
        match step {
            Step::Refresh(worker) => held[*worker] = applier.store.snapshot(),
            Step::Plan(worker) => {
                let eval = Evaluation::for_job(&applier.job, TriggerReason::DeploymentWatcher, NOW);
                let state: Arc<dyn State> = held[*worker].clone();
                let config = SchedulerConfig { now: NOW, seed: *worker as u64, ..SchedulerConfig::default() };
                let mut planner = Worker { applier };
                new_scheduler(JobType::Service, state, &mut planner, config).process(&eval).expect("processed");
            }
            Step::Health(position, healthy) => report(applier, *position, *healthy),
            Step::NodeDown(node) => {
                let down = Command::UpdateNodeStatus {
                    node_id: NodeId::from_u128(*node),
                    status: NodeStatus::Down,
                    evals: vec![],
                    time: Timestamp::ZERO,
                };
                applier.store.apply(down).expect("down");
            }
            Step::Greedy(stops) => greedy(applier, *stops, stop_reason::UPDATING),
            Step::GreedyMigrate(stops) => greedy(applier, *stops, stop_reason::MIGRATING),
            Step::Drain(node) => {
                let drain = DrainStrategy { deadline: DrainDeadline::None, ignore_system_jobs: false, started_at: NOW };
                applier.store.apply(Command::drain_node(NodeId::from_u128(*node), drain, vec![], NOW)).expect("drain");
            }
            Step::Pause(pause) => pause_deployment(applier, *pause),
        }
    }
}

/// The client of the live allocation at `position` reports it running with a verdict.
fn report(applier: &Applier, position: usize, healthy: bool) {
    let live = applier.live();
    let Some(alloc) = live.get(position % live.len().max(1)) else { return };
    let snapshot = applier.store.snapshot();
    if snapshot.node(alloc.node_id).is_none_or(|node| node.status != NodeStatus::Ready) {
        return;
    }
    let update = ClientAllocUpdate {
        health: Some(AllocHealth { healthy, timestamp: NOW, modify_index: 0 }),
        ..ClientAllocUpdate::status(alloc, ClientStatus::Running)
    };
    applier
        .store
        .apply(Command::UpdateAllocsFromClient { updates: vec![update], evals: vec![], time: NOW })
        .expect("report");
}

/// A plan stopping `stops` available allocations at once, with
/// replacements: old ones for an update, any for a migration.
fn greedy(applier: &Applier, stops: usize, reason: &str) {
    let mut plan =
        Plan { eval_id: crate::structs::EvalId::new_random(), job: Some(applier.job.clone()), ..Plan::default() };
    let stoppable = applier
        .live()
        .into_iter()
        .filter(|alloc| reason == stop_reason::MIGRATING || alloc.job.job_modify_index != applier.job.job_modify_index);
    for alloc in stoppable.filter(|alloc| is_available(alloc)).take(stops) {
        let mut stop = Allocation::clone(&alloc);
        stop.desired_status = DesiredStatus::Stop;
        stop.desired_description = reason.to_string();
        plan.node_update.entry(alloc.node_id).or_default().push(stop);
        let index = alloc.index().unwrap_or(0);
        let mut new = Allocation::new_placement(&applier.job, "group", index, alloc.node_id, plan.eval_id);
        new.previous_allocation = Some(alloc.id);
        plan.node_allocation.entry(alloc.node_id).or_default().push(new);
    }
    applier.submit(&plan);
}

fn pause_deployment(applier: &Applier, pause: bool) {
    let Some(deployment) = applier.store.snapshot().latest_deployment(&applier.job.key()).cloned() else { return };
    let (status, description) = match pause {
        true => (DeploymentStatus::Paused, "Deployment is paused"),
        false => (DeploymentStatus::Running, "Deployment is running"),
    };
    let update =
        DeploymentStatusUpdate { deployment_id: deployment.id, status, status_description: description.into() };
    // Refused once the deployment ended; that is fine here.
    let _ = applier.store.apply(Command::UpdateDeploymentStatus { update, job: None, eval: None, time: NOW });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn no_committed_plan_takes_a_group_below_its_budget(
        count in 2u32..10,
        max_parallel in 1u32..4,
        steps in prop::collection::vec(step(), 1..60),
    ) {
        let applier = rolling(count, max_parallel);
        run(&applier, &steps);
    }
}

#[test]
fn a_plan_over_the_budget_is_committed_in_part() {
    let applier = rolling(4, 1);
    let before = applier.available();
    greedy(&applier, 3, stop_reason::UPDATING);
    assert_eq!(applier.available(), before - 1, "one stop of the three was committed");
    let stopped =
        applier.live().iter().filter(|alloc| alloc.job.job_modify_index == applier.job.job_modify_index).count();
    assert_eq!(stopped, 1, "only the committed stop's replacement was placed");
    greedy(&applier, 1, stop_reason::UPDATING);
    assert_eq!(applier.available(), before - 1, "nothing more until the replacement is available");
}
