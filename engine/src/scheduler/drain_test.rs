//! Drains through the real schedulers, store and drainer: service
//! allocations migrate within their group's `migrate.max_parallel` as
//! replacements turn healthy, batch ones wait for the deadline, system ones
//! go last (or stay), and the drain completes when nothing is left.

use std::sync::Arc;
use std::time::Duration;

use super::reconcile::stop_reason;
use super::testing::Harness;
use crate::clock::Timestamp;
use crate::node::drainer::{decide, Action};
use crate::state::{ClientAllocUpdate, Command};
use crate::structs::{
    AllocHealth, Allocation, ClientStatus, DrainDeadline, DrainStatus, DrainStrategy, Evaluation, Job, JobType, Node,
    NodeEligibility, NodeId, Resources, TriggerReason,
};

const NOW: Timestamp = Timestamp(1_000_000 * 1_000_000_000);
const HOUR: Duration = Duration::from_secs(3600);

/// Nodes with room for two allocations of [`job`] each.
fn harness(nodes: u128) -> Harness {
    let harness = Harness::new(NOW);
    let nodes = (1..=nodes).map(|n| Node::new_ready(NodeId::from_u128(n), "dc1", "c", Resources::new(250, 1024, 0)));
    harness.add_nodes(nodes);
    harness
}

fn job(id: &str, job_type: JobType, count: u32) -> Job {
    let mut job = Job::new_simple(id, job_type, count, Resources::new(100, 64, 0));
    job.task_groups[0].update = None;
    job
}

fn register(harness: &mut Harness, job: &Job) {
    let eval = harness.register(job);
    harness.process(&eval).expect("the eval is processed");
}

/// Runs one more eval of the job (what a drain, a health report or the drainer brings).
fn evaluate(harness: &mut Harness, job: &Job) {
    let eval = Evaluation::for_job(job, TriggerReason::NodeDrain, harness.config.now);
    let applied = harness.store.apply(Command::UpsertEvals { evals: vec![eval] }).expect("eval applies");
    let eval = Evaluation::clone(&applied.evals[0]);
    harness.process(&eval).expect("the eval is processed");
}

/// Reports allocations as their clients would: `status`, with `healthy` as the verdict if any.
fn report(harness: &Harness, allocs: &[Arc<Allocation>], status: ClientStatus, healthy: Option<bool>) {
    let now = harness.config.now;
    let updates = allocs
        .iter()
        .map(|alloc| ClientAllocUpdate {
            health: healthy.map(|healthy| AllocHealth { healthy, timestamp: now, modify_index: 0 }),
            ..ClientAllocUpdate::status(alloc, status)
        })
        .collect();
    harness.store.apply(Command::UpdateAllocsFromClient { updates, evals: vec![], time: now }).expect("reports apply");
}

fn drain(harness: &Harness, node_id: NodeId, deadline: DrainDeadline, ignore_system_jobs: bool) {
    let drain = DrainStrategy { deadline, ignore_system_jobs, started_at: harness.config.now };
    harness.store.apply(Command::drain_node(node_id, drain, vec![], harness.config.now)).expect("the drain applies");
}

/// Live allocations of the job on `node`, and elsewhere.
fn split(harness: &Harness, job: &Job, node: NodeId) -> (Vec<Arc<Allocation>>, Vec<Arc<Allocation>>) {
    harness.live_allocs(job).into_iter().partition(|alloc| alloc.node_id == node)
}

/// Live allocations that serve: running, and healthy when a verdict is awaited.
fn available(harness: &Harness, job: &Job) -> usize {
    harness.live_allocs(job).iter().filter(|alloc| super::reconcile::is_available(alloc)).count()
}

/// What the drainer decides now, written.
fn drainer(harness: &Harness) -> Vec<Action> {
    let snapshot = harness.store.snapshot();
    let draining: Vec<NodeId> = snapshot.nodes().filter(|node| node.is_draining()).map(|node| node.id).collect();
    let decisions = decide(&snapshot, &draining, harness.config.now);
    for (node_id, _, action) in &decisions.actions {
        let command = match action {
            Action::Complete => Command::complete_drain(*node_id, harness.config.now),
            Action::Deadline(evals) | Action::ReleaseSystem(evals) => Command::UpsertEvals { evals: evals.clone() },
        };
        harness.store.apply(command).expect("the drainer's write applies");
    }
    decisions.actions.into_iter().map(|(_, _, action)| action).collect()
}

#[test]
fn a_drain_moves_one_allocation_at_a_time_each_after_its_replacement_turned_healthy() {
    let mut harness = harness(2);
    let web = job("web", JobType::Service, 4);
    register(&mut harness, &web);
    let spare = Node::new_ready(NodeId::from_u128(3), "dc1", "c", Resources::new(250, 1024, 0));
    harness.add_nodes([spare]);
    report(&harness, &harness.live_allocs(&web), ClientStatus::Running, None);
    let drained = harness.live_allocs(&web)[0].node_id;
    let (on_it, _) = split(&harness, &web, drained);
    assert_eq!(on_it.len(), 2, "two allocations fit a node");
    drain(&harness, drained, DrainDeadline::After(HOUR), false);
    assert_eq!(harness.store.snapshot().node(drained).expect("node").eligibility, NodeEligibility::Ineligible);

    evaluate(&mut harness, &web);
    let plan = harness.last_plan();
    let stops: Vec<&Allocation> = plan.node_update.values().flatten().collect();
    assert_eq!(stops.len(), 1, "migrate.max_parallel = 1");
    assert_eq!(stops[0].desired_description, stop_reason::MIGRATING);
    let placed: Vec<&Allocation> = plan.node_allocation.values().flatten().collect();
    assert_eq!(placed.len(), 1);
    assert_eq!(placed[0].previous_allocation, Some(stops[0].id), "the replacement links to what it replaces");
    assert_ne!(placed[0].node_id, drained);
    let replacement = harness.store.snapshot().alloc(placed[0].id).expect("stored").clone();

    // Running is not enough: the replacement proves itself healthy first.
    report(&harness, std::slice::from_ref(&replacement), ClientStatus::Running, None);
    evaluate(&mut harness, &web);
    assert_eq!(split(&harness, &web, drained).0.len(), 1, "nothing more moves while the replacement is unproven");
    assert!(available(&harness, &web) >= 3);

    report(&harness, &[replacement], ClientStatus::Running, Some(true));
    evaluate(&mut harness, &web);
    let (left, elsewhere) = split(&harness, &web, drained);
    assert!(left.is_empty(), "the second one moves once the first replacement is healthy");
    assert_eq!(elsewhere.len(), 4);
    assert!(available(&harness, &web) >= 3, "never below count - max_parallel");

    // The drain completes once the client stopped what moved.
    assert!(drainer(&harness).is_empty(), "the moved allocations still run on the node's client");
    let stopped: Vec<Arc<Allocation>> =
        harness.store.snapshot().allocs_by_node(drained).filter(|alloc| !alloc.client_terminal()).cloned().collect();
    report(&harness, &stopped, ClientStatus::Complete, None);
    assert_eq!(drainer(&harness), vec![Action::Complete]);
    let node = harness.store.snapshot().node(drained).expect("node").clone();
    assert!(!node.is_draining());
    assert_eq!(node.drain.last.as_ref().map(|last| last.status), Some(DrainStatus::Complete));
    assert_eq!(node.eligibility, NodeEligibility::Ineligible, "a drained node stays ineligible");
}

#[test]
fn a_batch_allocation_runs_on_until_the_deadline_then_moves() {
    let mut harness = harness(2);
    let batch = job("report", JobType::Batch, 1);
    register(&mut harness, &batch);
    report(&harness, &harness.live_allocs(&batch), ClientStatus::Running, None);
    let drained = harness.live_allocs(&batch)[0].node_id;
    drain(&harness, drained, DrainDeadline::After(HOUR), false);

    evaluate(&mut harness, &batch);
    assert_eq!(split(&harness, &batch, drained).0.len(), 1, "a batch allocation is left to finish");
    let snapshot = harness.store.snapshot();
    let decisions = decide(&snapshot, &[drained], harness.config.now);
    assert!(decisions.actions.is_empty());
    assert_eq!(decisions.next_deadline, Some(NOW.plus(HOUR)), "the drainer wakes at the deadline");

    harness.config.now = NOW.plus(HOUR);
    let actions = drainer(&harness);
    assert!(matches!(&actions[..], [Action::Deadline(evals)] if evals.len() == 1), "{actions:?}");
    evaluate(&mut harness, &batch);
    let (left, elsewhere) = split(&harness, &batch, drained);
    assert!(left.is_empty());
    assert_eq!(elsewhere.len(), 1, "moved at the deadline");
    let stopped = harness.store.snapshot().allocs_by_node(drained).next().expect("the old one").clone();
    assert_eq!(stopped.desired_description, stop_reason::DRAIN_DEADLINE);
}

#[test]
fn system_allocations_go_last_or_stay_when_the_drain_ignores_them() {
    for ignore_system_jobs in [false, true] {
        let mut harness = harness(2);
        let agent = job("agent", JobType::System, 1);
        register(&mut harness, &agent);
        let web = job("web", JobType::Service, 1);
        register(&mut harness, &web);
        report(&harness, &harness.live_allocs(&agent), ClientStatus::Running, None);
        report(&harness, &harness.live_allocs(&web), ClientStatus::Running, None);
        let drained = harness.live_allocs(&web)[0].node_id;
        drain(&harness, drained, DrainDeadline::None, ignore_system_jobs);

        evaluate(&mut harness, &agent);
        assert_eq!(split(&harness, &agent, drained).0.len(), 1, "kept while other allocations remain");
        evaluate(&mut harness, &web);
        assert!(split(&harness, &web, drained).0.is_empty(), "unavailable alone: moves at once");
        let moved: Vec<Arc<Allocation>> =
            harness.store.snapshot().allocs_by_node(drained).filter(|alloc| alloc.job_id == web.id).cloned().collect();
        evaluate(&mut harness, &agent);
        assert_eq!(split(&harness, &agent, drained).0.len(), 1, "the moved one still runs on its client");
        report(&harness, &moved, ClientStatus::Complete, None);

        let actions = drainer(&harness);
        if ignore_system_jobs {
            assert_eq!(actions, vec![Action::Complete], "the system allocation is not waited for");
            evaluate(&mut harness, &agent);
            assert_eq!(split(&harness, &agent, drained).0.len(), 1, "and it stays");
            continue;
        }
        assert!(matches!(&actions[..], [Action::ReleaseSystem(evals)] if evals.len() == 1), "{actions:?}");
        evaluate(&mut harness, &agent);
        let system_left = split(&harness, &agent, drained).0;
        assert!(system_left.is_empty(), "released once the rest left");
        let stopped = harness.store.snapshot().allocs_by_node(drained).find(|alloc| alloc.job_id == agent.id).cloned();
        assert_eq!(stopped.expect("stopped").desired_description, stop_reason::NODE_DRAINED);
        assert_eq!(harness.live_allocs(&agent).len(), 1, "nothing placed on the drained node; the other keeps its own");
    }
}

#[test]
fn drains_of_many_nodes_at_once_keep_the_group_within_its_budget() {
    let mut harness = harness(10);
    let mut web = job("web", JobType::Service, 10);
    web.task_groups[0].migrate.max_parallel = 2;
    register(&mut harness, &web);
    report(&harness, &harness.live_allocs(&web), ClientStatus::Running, None);
    let mut drained: Vec<NodeId> = harness.live_allocs(&web).iter().map(|alloc| alloc.node_id).collect();
    drained.sort_unstable();
    drained.dedup();
    assert_eq!(drained.len(), 10, "one per node");
    drained.truncate(5);
    for node in &drained {
        drain(&harness, *node, DrainDeadline::None, false);
    }
    let mut rounds = 0;
    while harness.live_allocs(&web).iter().any(|alloc| drained.contains(&alloc.node_id)) {
        evaluate(&mut harness, &web);
        assert!(available(&harness, &web) >= 8, "at most migrate.max_parallel unavailable");
        let fresh: Vec<Arc<Allocation>> = harness
            .live_allocs(&web)
            .into_iter()
            .filter(|alloc| alloc.client_status != ClientStatus::Running)
            .collect();
        report(&harness, &fresh, ClientStatus::Running, Some(true));
        rounds += 1;
        assert!(rounds <= 3, "two at a time: three rounds for five");
    }
    assert_eq!(rounds, 3);
}
