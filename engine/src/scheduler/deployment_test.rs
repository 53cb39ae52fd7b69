//! Deployments through the real scheduler, store and watcher: each `update`
//! field's behaviour, driven as clients and operators would drive it.

use std::sync::Arc;
use std::time::Duration;

use super::reconcile::stop_reason;
use super::testing::Harness;
use crate::clock::Timestamp;
use crate::deployment::watcher::{decide, Action};
use crate::state::{ClientAllocUpdate, Command};
use crate::structs::{
    deployment_description, AllocHealth, Allocation, ClientStatus, Deployment, DeploymentStatus, Evaluation, Job,
    JobType, Node, NodeId, Resources, TriggerReason, UpdateStrategy,
};

const NOW: Timestamp = Timestamp(1_000_000 * 1_000_000_000);

fn harness() -> Harness {
    let harness = Harness::new(NOW);
    let nodes = (0..10)
        .map(|i| Node::new_ready(NodeId::from_u128(i as u128 + 1), "dc1", "c", Resources::new(4000, 8192, 100_000)));
    harness.add_nodes(nodes);
    harness
}

/// A service job of `count` rolling out `update`.
fn service(count: u32, update: UpdateStrategy) -> Job {
    let mut job = Job::new_simple("web", JobType::Service, count, Resources::new(100, 64, 0));
    job.task_groups[0].update = Some(update);
    job
}

/// The same job with a change that needs new allocations.
fn next_version(job: &Job, command: &str) -> Job {
    let mut next = job.clone();
    next.task_groups[0].tasks[0].env.insert("VERSION".into(), command.into());
    next
}

/// Registers `job` and runs its eval.
fn register(harness: &mut Harness, job: &Job) {
    let eval = harness.register(job);
    harness.process(&eval).expect("the eval is processed");
}

/// Runs one more eval of the job (what a health report or the watcher brings).
fn evaluate(harness: &mut Harness, job: &Job) {
    let eval = Evaluation::for_job(job, TriggerReason::DeploymentWatcher, harness.config.now);
    let applied = harness.store.apply(Command::UpsertEvals { evals: vec![eval] }).expect("eval applies");
    let eval = Evaluation::clone(&applied.evals[0]);
    harness.process(&eval).expect("the eval is processed");
}

/// Reports allocations running with a health verdict, as their clients would.
fn report(harness: &Harness, allocs: &[Arc<Allocation>], healthy: bool) {
    let now = harness.config.now;
    send_running(harness, allocs, Some(AllocHealth { healthy, timestamp: now, modify_index: 0 }));
}

/// Reports allocations running, with `health` as their verdict.
fn send_running(harness: &Harness, allocs: &[Arc<Allocation>], health: Option<AllocHealth>) {
    let updates = allocs
        .iter()
        .map(|alloc| ClientAllocUpdate {
            alloc_id: alloc.id,
            node_id: alloc.node_id,
            client_status: ClientStatus::Running,
            client_description: String::new(),
            task_states: Default::default(),
            services: None,
            checks: None,
            health: health.clone(),
        })
        .collect();
    let now = harness.config.now;
    harness.store.apply(Command::UpdateAllocsFromClient { updates, evals: vec![], time: now }).expect("reports apply");
}

fn live(harness: &Harness, job: &Job) -> Vec<Arc<Allocation>> {
    harness.live_allocs(job)
}

/// Live allocations of the job's current version, and of older ones.
fn by_version(harness: &Harness, job: &Job) -> (Vec<Arc<Allocation>>, Vec<Arc<Allocation>>) {
    let current = harness.store.snapshot().job(&job.key()).expect("job").job_modify_index;
    live(harness, job).into_iter().partition(|alloc| alloc.job.job_modify_index == current)
}

fn not_yet_healthy(allocs: &[Arc<Allocation>]) -> Vec<Arc<Allocation>> {
    allocs.iter().filter(|alloc| alloc.health.is_none()).cloned().collect()
}

fn deployment(harness: &Harness, job: &Job) -> Arc<Deployment> {
    harness.store.snapshot().latest_deployment(&job.key()).expect("a deployment").clone()
}

/// Version 1 of `job` placed, healthy, its deployment successful.
fn deployed(harness: &mut Harness, job: &Job) {
    register(harness, job);
    report(harness, &live(harness, job), true);
    evaluate(harness, job);
    assert_eq!(deployment(harness, job).status, DeploymentStatus::Successful);
}

/// Runs what the watcher decides now.
fn watch(harness: &Harness) {
    let snapshot = harness.store.snapshot();
    for (_, _, action) in decide(&snapshot, harness.config.now).actions {
        let command = match action {
            Action::Fail(command) | Action::Promote(command) => *command,
            Action::Evaluate(eval) => Command::UpsertEvals { evals: vec![*eval] },
        };
        harness.store.apply(command).expect("the watcher's write applies");
    }
}

#[test]
fn a_new_job_places_every_allocation_in_one_deployment_that_succeeds_when_all_are_healthy() {
    let mut harness = harness();
    let job = service(3, UpdateStrategy::rolling(1));
    register(&mut harness, &job);
    let allocs = live(&harness, &job);
    assert_eq!(allocs.len(), 3, "a new job is not held back by max_parallel");
    let created = deployment(&harness, &job);
    assert!(allocs.iter().all(|alloc| alloc.deployment_id == Some(created.id)));
    let group = &created.task_groups["group"];
    assert_eq!((group.desired_total, group.placed_allocs, group.healthy_allocs), (3, 3, 0));
    assert_eq!(created.status_description, deployment_description::RUNNING);
    report(&harness, &allocs[..2], true);
    evaluate(&mut harness, &job);
    assert_eq!(deployment(&harness, &job).status, DeploymentStatus::Running, "one is not healthy yet");
    report(&harness, &allocs[2..], true);
    evaluate(&mut harness, &job);
    let done = deployment(&harness, &job);
    assert_eq!(
        (done.status, done.status_description.as_str()),
        (DeploymentStatus::Successful, deployment_description::SUCCESSFUL)
    );
    assert!(harness.store.snapshot().job(&job.key()).expect("job").stable, "its version is marked stable");
}

#[test]
fn each_batch_starts_only_when_the_previous_one_is_healthy() {
    let mut harness = harness();
    let v1 = service(4, UpdateStrategy::rolling(2));
    deployed(&mut harness, &v1);
    let v2 = next_version(&v1, "2");
    register(&mut harness, &v2);
    let (new, old) = by_version(&harness, &v2);
    assert_eq!((new.len(), old.len()), (2, 2), "max_parallel old allocations replaced");
    assert!(harness
        .last_plan()
        .node_update
        .values()
        .flatten()
        .all(|stop| stop.desired_description == stop_reason::UPDATING));
    evaluate(&mut harness, &v2);
    assert_eq!(by_version(&harness, &v2).0.len(), 2, "nothing more before the batch is healthy");
    report(&harness, &new[..1], true);
    evaluate(&mut harness, &v2);
    let (new, old) = by_version(&harness, &v2);
    assert_eq!((new.len(), old.len()), (3, 1), "one healthy: one more slot in the budget");
    report(&harness, &not_yet_healthy(&new), true);
    evaluate(&mut harness, &v2);
    let (new, old) = by_version(&harness, &v2);
    assert_eq!((new.len(), old.len()), (4, 0));
    report(&harness, &not_yet_healthy(&new), true);
    evaluate(&mut harness, &v2);
    let rolled = deployment(&harness, &v2);
    assert_eq!(rolled.status, DeploymentStatus::Successful);
    assert_eq!(rolled.task_groups["group"].healthy_allocs, 4);
    assert!(harness
        .plans
        .iter()
        .all(|plan| plan.deployment.as_ref().is_none_or(|d| d.id == rolled.id || d.job_version == 0)));
}

#[test]
fn an_unhealthy_allocation_stops_the_rollout_and_without_a_progress_deadline_fails_and_reverts() {
    let mut harness = harness();
    let update = UpdateStrategy {
        max_parallel: 1,
        auto_revert: true,
        progress_deadline: Duration::ZERO,
        ..UpdateStrategy::default()
    };
    let v1 = service(3, update);
    deployed(&mut harness, &v1);
    let v2 = next_version(&v1, "crashes");
    register(&mut harness, &v2);
    let (new, old) = by_version(&harness, &v2);
    assert_eq!((new.len(), old.len()), (1, 2));
    report(&harness, &new, false);
    evaluate(&mut harness, &v2);
    assert_eq!(by_version(&harness, &v2).1.len(), 2, "no more old allocations stop after an unhealthy one");
    watch(&harness);
    let failed = deployment(&harness, &v2);
    assert_eq!(failed.status, DeploymentStatus::Failed);
    assert_eq!(
        failed.status_description,
        deployment_description::rolling_back(deployment_description::FAILED_ALLOCATIONS, 0)
    );
    let reverted = harness.store.snapshot().job(&v1.key()).expect("job").clone();
    assert_eq!(reverted.version, 2, "the revert is a new version");
    assert_eq!(reverted.task_groups, v1.task_groups, "equal to the stable version");
    evaluate(&mut harness, &reverted);
    let (new, old) = by_version(&harness, &reverted);
    assert_eq!(new.len() + old.len(), 3);
    let available = live(&harness, &reverted).iter().filter(|alloc| super::reconcile::is_available(alloc)).count();
    assert!(available >= 2, "never below count - max_parallel available: {available}");
}

#[test]
fn with_a_progress_deadline_an_unhealthy_allocation_is_replaced_until_the_deadline_fails_the_deployment() {
    let mut harness = harness();
    let update =
        UpdateStrategy { max_parallel: 1, progress_deadline: Duration::from_secs(600), ..UpdateStrategy::default() };
    let v1 = service(2, update);
    deployed(&mut harness, &v1);
    let v2 = next_version(&v1, "flaps");
    register(&mut harness, &v2);
    let (new, _) = by_version(&harness, &v2);
    report(&harness, &new, false);
    watch(&harness);
    assert_eq!(deployment(&harness, &v2).status, DeploymentStatus::Running, "a deadline: not failed yet");
    evaluate(&mut harness, &v2);
    let stops: Vec<_> =
        harness.last_plan().node_update.values().flatten().map(|stop| stop.desired_description.clone()).collect();
    assert_eq!(stops, [stop_reason::UNHEALTHY], "the unhealthy one is replaced");
    assert_eq!(by_version(&harness, &v2).1.len(), 1, "no old allocation stops meanwhile");
    let by = deployment(&harness, &v2).task_groups["group"].require_progress_by.expect("a deadline");
    harness.config.now = by;
    watch(&harness);
    let failed = deployment(&harness, &v2);
    assert_eq!(failed.status, DeploymentStatus::Failed);
    assert_eq!(failed.status_description, deployment_description::FAILED_PROGRESS_DEADLINE);
}

#[test]
fn canaries_run_beside_the_old_allocations_until_promoted() {
    let mut harness = harness();
    let v1 = service(3, UpdateStrategy { canary: 1, ..UpdateStrategy::default() });
    deployed(&mut harness, &v1);
    let v2 = next_version(&v1, "2");
    register(&mut harness, &v2);
    let (new, old) = by_version(&harness, &v2);
    assert_eq!((new.len(), old.len()), (1, 3), "one canary, every old allocation kept");
    assert!(new[0].canary);
    let waiting = deployment(&harness, &v2);
    assert_eq!(waiting.status_description, deployment_description::RUNNING_NEEDS_PROMOTION);
    assert_eq!(waiting.task_groups["group"].placed_canaries, [new[0].id]);
    report(&harness, &new, true);
    evaluate(&mut harness, &v2);
    assert_eq!(by_version(&harness, &v2).1.len(), 3, "nothing replaced before promotion");
    watch(&harness);
    assert!(!deployment(&harness, &v2).task_groups["group"].promoted, "no auto_promote: an operator promotes");
    let refused = harness.store.apply(Command::PromoteDeployment {
        deployment_id: waiting.id,
        groups: vec!["nope".into()],
        eval: None,
        time: NOW,
    });
    assert!(refused.is_err(), "an unknown group is refused");
    harness
        .store
        .apply(Command::PromoteDeployment { deployment_id: waiting.id, groups: vec![], eval: None, time: NOW })
        .expect("promoted");
    assert!(!harness.store.snapshot().alloc(new[0].id).expect("canary").canary, "promotion clears the mark");
    evaluate(&mut harness, &v2);
    let stops: Vec<_> =
        harness.last_plan().node_update.values().flatten().map(|stop| stop.desired_description.clone()).collect();
    assert!(stops.contains(&stop_reason::REPLACED_BY_CANARY.to_string()), "{stops:?}");
    for _ in 0..4 {
        report(&harness, &not_yet_healthy(&by_version(&harness, &v2).0), true);
        evaluate(&mut harness, &v2);
    }
    let (new, old) = by_version(&harness, &v2);
    assert_eq!((new.len(), old.len()), (3, 0));
    assert_eq!(deployment(&harness, &v2).status, DeploymentStatus::Successful);
}

#[test]
fn canaries_that_all_turn_healthy_are_promoted_by_auto_promote() {
    let mut harness = harness();
    let v1 = service(2, UpdateStrategy { canary: 2, auto_promote: true, ..UpdateStrategy::default() });
    deployed(&mut harness, &v1);
    let v2 = next_version(&v1, "2");
    register(&mut harness, &v2);
    let (canaries, _) = by_version(&harness, &v2);
    assert_eq!(canaries.len(), 2);
    assert_eq!(deployment(&harness, &v2).status_description, deployment_description::RUNNING_AUTO_PROMOTION);
    report(&harness, &canaries[..1], true);
    watch(&harness);
    assert!(!deployment(&harness, &v2).task_groups["group"].promoted, "not before all are healthy");
    report(&harness, &canaries[1..], true);
    watch(&harness);
    let promoted = deployment(&harness, &v2);
    assert!(promoted.task_groups["group"].promoted);
    assert_eq!(promoted.status_description, deployment_description::RUNNING);
}

#[test]
fn a_paused_deployment_replaces_nothing_until_resumed_and_a_newer_version_cancels_it() {
    let mut harness = harness();
    let v1 = service(2, UpdateStrategy::rolling(1));
    deployed(&mut harness, &v1);
    let v2 = next_version(&v1, "2");
    register(&mut harness, &v2);
    let rolling = deployment(&harness, &v2);
    let pause = crate::structs::DeploymentStatusUpdate {
        deployment_id: rolling.id,
        status: DeploymentStatus::Paused,
        status_description: deployment_description::PAUSED.into(),
    };
    harness
        .store
        .apply(Command::UpdateDeploymentStatus { update: pause, job: None, eval: None, time: NOW })
        .expect("paused");
    report(&harness, &by_version(&harness, &v2).0, true);
    evaluate(&mut harness, &v2);
    assert_eq!(by_version(&harness, &v2).1.len(), 1, "paused: the old one stays");
    assert_eq!(deployment(&harness, &v2).status, DeploymentStatus::Paused, "a plan does not resume it");
    let v3 = next_version(&v1, "3");
    register(&mut harness, &v3);
    let cancelled = harness.store.snapshot().deployment(rolling.id).expect("kept").clone();
    assert_eq!(cancelled.status, DeploymentStatus::Cancelled);
    assert_eq!(cancelled.status_description, deployment_description::NEWER_JOB);
    assert_ne!(deployment(&harness, &v3).id, rolling.id, "the new version has its own deployment");
}

#[test]
fn a_job_without_an_update_block_replaces_everything_at_once_without_a_deployment() {
    let mut harness = harness();
    let v1 = Job::new_simple("web", JobType::Service, 3, Resources::new(100, 64, 0));
    register(&mut harness, &v1);
    let v2 = next_version(&v1, "2");
    register(&mut harness, &v2);
    let (new, old) = by_version(&harness, &v2);
    assert_eq!((new.len(), old.len()), (3, 0));
    assert!(harness.store.snapshot().latest_deployment(&v1.key()).is_none());
}

#[test]
fn a_system_job_rolls_max_parallel_nodes_at_a_time() {
    let mut harness = harness();
    let mut v1 = Job::new_simple("agents", JobType::System, 1, Resources::new(100, 64, 0));
    v1.task_groups[0].update = Some(UpdateStrategy { max_parallel: 3, ..UpdateStrategy::default() });
    register(&mut harness, &v1);
    let first = live(&harness, &v1);
    assert_eq!(first.len(), 10, "a new system job is placed everywhere at once");
    report_running(&harness, &first);
    let v2 = next_version(&v1, "2");
    register(&mut harness, &v2);
    let (new, old) = by_version(&harness, &v2);
    assert_eq!((new.len(), old.len()), (3, 7), "one batch of max_parallel nodes");
    let follow_up = harness.created_evals.iter().find(|eval| eval.triggered_by == TriggerReason::RollingUpdate);
    let stagger = UpdateStrategy::DEFAULT_STAGGER;
    assert_eq!(follow_up.and_then(|eval| eval.wait_until), Some(NOW.plus(stagger)), "the next batch after the stagger");
    let eval = follow_up.expect("a follow-up").clone();
    harness.process(&eval).expect("processed");
    assert_eq!(by_version(&harness, &v2).0.len(), 3, "not while the batch is not running");
    report_running(&harness, &by_version(&harness, &v2).0);
    evaluate(&mut harness, &v2);
    assert_eq!(by_version(&harness, &v2).0.len(), 6);
}

/// Reports allocations running without a health verdict.
fn report_running(harness: &Harness, allocs: &[Arc<Allocation>]) {
    send_running(harness, allocs, None);
}
