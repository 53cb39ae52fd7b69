use std::sync::Arc;

use super::{annotate, dry_run, DesiredUpdates, JobPlanError};
use crate::clock::Timestamp;
use crate::scheduler::reconcile::stop_reason;
use crate::scheduler::testing::Harness;
use crate::structs::{
    Allocation, Constraint, ConstraintOperand, DesiredStatus, EvalId, EvalStatus, Job, JobType, Node, NodeId, Plan,
    Resources,
};

const NOW: Timestamp = Timestamp(1_000_000 * 1_000_000_000);

/// Three nodes: two of class `small`, one of class `big`.
fn harness() -> Harness {
    let harness = Harness::new(NOW);
    let node = |n: u128, class: &str, size| Node::new_ready(NodeId::from_u128(n), "dc1", class, size);
    harness.add_nodes([
        node(1, "small", Resources::new(1000, 1024, 10_000)),
        node(2, "small", Resources::new(1000, 1024, 10_000)),
        node(3, "big", Resources::new(4000, 8192, 10_000)),
    ]);
    harness
}

fn web(count: u32) -> Job {
    Job::new_simple("web", JobType::Service, count, Resources::new(100, 128, 0))
}

/// Registers `job` and runs its eval, as a server would.
fn run(harness: &mut Harness, job: &Job) {
    let eval = harness.register(job);
    harness.process(&eval).expect("the eval is processed");
}

fn updates(plan: &super::JobPlan) -> &DesiredUpdates {
    &plan.annotations.desired_tg_updates["group"]
}

#[test]
fn a_new_job_is_planned_as_placements_and_nothing_is_written() {
    let harness = harness();
    let index = harness.store.latest_index();
    let plan = dry_run(harness.store.snapshot(), web(3), NOW).expect("planned");
    assert_eq!(*updates(&plan), DesiredUpdates { place: 3, ..DesiredUpdates::default() });
    assert_eq!(plan.job_modify_index(), 0, "no stored job");
    assert_eq!(plan.planned.version, 0);
    assert_eq!(plan.plan.as_ref().map(Plan::placement_count), Some(3));
    assert!(plan.failed_tg_allocs.is_empty() && plan.created_evals.is_empty());
    assert_eq!(harness.store.latest_index(), index, "a dry run writes nothing");
    let snapshot = harness.store.snapshot();
    assert!(snapshot.job(&web(3).key()).is_none(), "the job is not registered");
    assert_eq!(snapshot.evals().count(), 0, "no eval is written");
}

#[test]
fn an_unchanged_job_is_all_ignore_at_its_stored_version() {
    let mut harness = harness();
    run(&mut harness, &web(2));
    let stored = harness.store.snapshot().job(&web(2).key()).cloned().expect("stored");
    let plan = dry_run(harness.store.snapshot(), web(2), NOW).expect("planned");
    assert_eq!(*updates(&plan), DesiredUpdates { ignore: 2, ..DesiredUpdates::default() });
    assert!(plan.plan.is_none(), "nothing to change");
    assert_eq!(plan.job_modify_index(), stored.job_modify_index);
    assert_eq!(plan.planned, stored, "the stored job, not a new version");
}

#[test]
fn a_count_change_places_or_stops_the_difference_and_ignores_the_rest() {
    let mut harness = harness();
    run(&mut harness, &web(2));
    let index = harness.store.latest_index();
    let up = dry_run(harness.store.snapshot(), web(3), NOW).expect("planned");
    assert_eq!(up.annotations.desired_tg_updates["group"].place, 1);
    assert_eq!(up.planned.version, 1, "a changed spec is the next version");
    assert_eq!(up.planned.job_modify_index, index + 1, "as the next write would store it");
    let down = dry_run(harness.store.snapshot(), web(1), NOW).expect("planned");
    let counts = updates(&down);
    assert_eq!((counts.stop, counts.place, counts.destructive_update), (1, 0, 0));
    assert_eq!(counts.ignore + counts.in_place_update, 1, "the kept allocation");
    assert_eq!(harness.store.latest_index(), index, "a dry run writes nothing");
}

#[test]
fn a_task_change_is_a_destructive_update_not_a_stop() {
    let mut harness = harness();
    run(&mut harness, &web(2));
    let mut changed = web(2);
    changed.task_groups[0].tasks[0].resources.memory_mb = 256;
    let plan = dry_run(harness.store.snapshot(), changed, NOW).expect("planned");
    let counts = updates(&plan);
    assert_eq!((counts.destructive_update, counts.stop, counts.place), (2, 0, 0), "{counts:?}");
}

#[test]
fn a_restart_policy_change_is_an_in_place_update() {
    let mut harness = harness();
    run(&mut harness, &web(2));
    let mut changed = web(2);
    changed.task_groups[0].restart_policy.attempts += 1;
    let plan = dry_run(harness.store.snapshot(), changed, NOW).expect("planned");
    assert_eq!(*updates(&plan), DesiredUpdates { in_place_update: 2, ..DesiredUpdates::default() });
}

#[test]
fn a_group_that_cannot_place_names_the_classes_that_kept_it_out() {
    let harness = harness();
    let mut job = web(1);
    job.task_groups[0].tasks[0].resources = Resources::new(5000, 128, 0);
    job.constraints.push(Constraint {
        l_target: "${node.class}".into(),
        r_target: "small".into(),
        operand: ConstraintOperand::NotEqual,
    });
    let plan = dry_run(harness.store.snapshot(), job, NOW).expect("planned");
    assert!(plan.failed_tg_allocs.contains_key("group"), "{:?}", plan.failed_tg_allocs);
    assert_eq!(updates(&plan).place, 1, "a placement asked for, if not made");
    assert_eq!(plan.created_evals.len(), 1, "a blocked eval would be created");
    assert_eq!(plan.created_evals[0].status, EvalStatus::Blocked);
    let classes = &plan.filtered_classes["group"];
    let mut summary: Vec<(&str, &str, bool, u64)> = classes
        .iter()
        .map(|class| (class.node_class.as_str(), class.reason.as_str(), class.exhausted, class.nodes))
        .collect();
    summary.sort();
    assert_eq!(summary, vec![("big", "cpu", true, 1), ("small", "${node.class} != small", false, 2)]);
    let small = classes.iter().find(|class| class.node_class == "small").expect("small");
    let examples: Vec<NodeId> = small.examples.iter().map(|(id, _)| *id).collect();
    assert_eq!(examples, vec![NodeId::from_u128(1), NodeId::from_u128(2)]);
}

#[test]
fn an_invalid_job_or_a_type_change_is_refused_as_a_register_refuses_it() {
    let mut harness = harness();
    let mut invalid = web(1);
    invalid.datacenters.clear();
    assert!(matches!(dry_run(harness.store.snapshot(), invalid, NOW), Err(JobPlanError::Invalid(_))));
    run(&mut harness, &web(1));
    let batch = Job::new_simple("web", JobType::Batch, 1, Resources::new(100, 128, 0));
    assert!(matches!(dry_run(harness.store.snapshot(), batch, NOW), Err(JobPlanError::TypeChange { .. })));
}

/// A live allocation of `job`'s group `group` on node 1.
fn alloc(job: &Arc<Job>, index: u32) -> Allocation {
    Allocation::new_placement(job, "group", index, NodeId::from_u128(1), EvalId::new_random())
}

#[test]
fn annotations_tell_canaries_in_place_updates_and_evictions_apart() {
    let old = Arc::new(web(3));
    let mut new_job = web(3);
    new_job.job_modify_index = old.job_modify_index + 1;
    let new_job = Arc::new(new_job);
    let existing: Vec<Arc<Allocation>> = (0..3).map(|i| Arc::new(alloc(&old, i))).collect();
    let mut in_place = Allocation::clone(&existing[0]);
    in_place.job = new_job.clone();
    let mut canary = alloc(&new_job, 0);
    canary.canary = true;
    let victim = alloc(&Arc::new(Job::new_simple("low", JobType::Batch, 1, Resources::new(1, 1, 0))), 0);
    let mut evicted = victim.clone();
    evicted.desired_status = DesiredStatus::Evict;
    let mut placed = alloc(&new_job, 1);
    placed.preempted_allocations.push(victim.id);
    let mut stopped = Allocation::clone(&existing[2]);
    stopped.desired_description = stop_reason::SCALED_DOWN.into();
    let node = NodeId::from_u128(1);
    let plan = Plan {
        node_allocation: [(node, vec![in_place, canary, placed])].into(),
        node_update: [(node, vec![stopped])].into(),
        node_preemptions: [(node, vec![evicted])].into(),
        ..Plan::default()
    };
    let annotations = annotate(&new_job, &existing, Some(&plan));
    let expected = DesiredUpdates {
        in_place_update: 1,
        canary: 1,
        place: 1,
        preemptions: 1,
        stop: 1,
        ignore: 1,
        ..Default::default()
    };
    assert_eq!(annotations.desired_tg_updates["group"], expected);
    assert_eq!(annotations.preempted_allocs.iter().map(|alloc| alloc.id).collect::<Vec<_>>(), vec![victim.id]);
}
