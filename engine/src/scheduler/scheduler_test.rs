use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;

use super::testing::Harness;
use super::Algorithm;
use crate::clock::Timestamp;
use crate::state::{ClientAllocUpdate, Command};
use crate::structs::{
    ClientStatus, Constraint, ConstraintOperand, DelayFunction, EvalStatus, Evaluation, Job, JobType, NetworkResource,
    Node, NodeId, NodeStatus, Port, PortSet, ReschedulePolicy, Resources, TriggerReason,
};

const NOW: Timestamp = Timestamp(1_000_000 * 1_000_000_000);

fn nodes(n: usize, size: Resources) -> Vec<Node> {
    (0..n).map(|i| Node::new_ready(NodeId::from_u128(i as u128 + 1), "dc1", &format!("c{}", i % 2), size)).collect()
}

fn harness(n_nodes: usize) -> Harness {
    let harness = Harness::new(NOW);
    harness.add_nodes(nodes(n_nodes, Resources::new(4000, 8192, 100_000)));
    harness
}

fn service(count: u32, cpu: u64) -> Job {
    Job::new_simple("web", JobType::Service, count, Resources::new(cpu, 256, 0))
}

fn per_node(harness: &Harness, job: &Job) -> BTreeMap<NodeId, usize> {
    let mut counts = BTreeMap::new();
    for alloc in harness.live_allocs(job) {
        *counts.entry(alloc.node_id).or_insert(0) += 1;
    }
    counts
}

fn assert_not_oversubscribed(harness: &Harness) {
    let oversubscribed = harness.store.snapshot().oversubscribed_nodes();
    assert!(oversubscribed.is_empty(), "(node, used, allocatable): {oversubscribed:?}");
}

fn report(harness: &Harness, alloc: &crate::structs::Allocation, status: ClientStatus, at: Timestamp) {
    harness
        .store
        .apply(Command::UpdateAllocsFromClient {
            updates: vec![ClientAllocUpdate {
                alloc_id: alloc.id,
                node_id: alloc.node_id,
                client_status: status,
                client_description: String::new(),
                services: None,
                checks: None,
                health: None,
                task_states: Default::default(),
            }],
            evals: vec![],
            time: at,
        })
        .expect("client update applies");
}

fn new_eval(harness: &Harness, job: &Job, trigger: TriggerReason) -> Evaluation {
    let eval = Evaluation::for_job(job, trigger, harness.config.now);
    let applied = harness.store.apply(Command::UpsertEvals { evals: vec![eval] }).expect("eval applies");
    Evaluation::clone(&applied.evals[0])
}

#[test]
fn the_score_limit_follows_log2_of_the_cluster() {
    use super::stack::score_limit;
    assert_eq!(
        [score_limit(1), score_limit(2), score_limit(3), score_limit(16), score_limit(10_000)],
        [2, 2, 2, 4, 14]
    );
}

/// Ten nodes: `rank` = i, `version` = 1.i.0, `meta.even` on even ones.
fn ranked_nodes() -> Vec<Node> {
    (0..10)
        .map(|i| {
            let mut node = Node::new_ready(NodeId::from_u128(i + 1), "dc1", "c", Resources::new(4000, 8192, 0));
            node.attributes.insert("rank".into(), i.to_string());
            node.attributes.insert("version".into(), format!("1.{i}.0"));
            if i % 2 == 0 {
                node.meta.insert("even".into(), "yes".into());
            }
            node.computed_class = node.compute_class();
            node
        })
        .collect()
}

#[test]
fn placement_respects_every_constraint_operator() {
    let rank = |node: &Node| node.attributes["rank"].parse::<u32>().expect("numeric");
    type Check = fn(u32, bool) -> bool;
    let cases: [(&str, ConstraintOperand, &str, Check); 10] = [
        ("${attr.rank}", ConstraintOperand::Equal, "3", |r, _| r == 3),
        ("${attr.rank}", ConstraintOperand::NotEqual, "3", |r, _| r != 3),
        ("${attr.rank}", ConstraintOperand::Less, "3", |r, _| r < 3),
        ("${attr.rank}", ConstraintOperand::LessOrEqual, "3", |r, _| r <= 3),
        ("${attr.rank}", ConstraintOperand::Greater, "6", |r, _| r > 6),
        ("${attr.rank}", ConstraintOperand::GreaterOrEqual, "6", |r, _| r >= 6),
        ("${attr.rank}", ConstraintOperand::Regexp, "^[4-5]$", |r, _| r == 4 || r == 5),
        ("${attr.version}", ConstraintOperand::Version, ">= 1.7, < 1.9", |r, _| r == 7 || r == 8),
        ("${meta.even}", ConstraintOperand::IsSet, "", |_, even| even),
        ("${meta.even}", ConstraintOperand::IsNotSet, "", |_, even| !even),
    ];
    for (left, operand, right, allowed) in cases {
        let mut h = Harness::new(NOW);
        h.add_nodes(ranked_nodes());
        let mut job = service(4, 100);
        job.constraints.push(Constraint::new(left, operand, right));
        let eval = h.register(&job);
        h.process(&eval).expect("scheduled");
        let live = h.live_allocs(&job);
        assert!(!live.is_empty(), "{operand:?} placed something");
        let snapshot = h.store.snapshot();
        for alloc in live {
            let node = snapshot.node(alloc.node_id).expect("node");
            assert!(
                allowed(rank(node), node.meta.contains_key("even")),
                "{operand:?} {right} put one on rank {}",
                rank(node)
            );
        }
    }
}

#[test]
fn distinct_property_limits_allocations_per_value() {
    let mut h = Harness::new(NOW);
    h.add_nodes(ranked_nodes());
    let mut job = service(6, 100);
    job.constraints.push(Constraint::new("${meta.even}", ConstraintOperand::DistinctProperty, "2"));
    let eval = h.register(&job);
    h.process(&eval).expect("scheduled");
    let snapshot = h.store.snapshot();
    let on_even = h
        .live_allocs(&job)
        .iter()
        .filter(|alloc| snapshot.node(alloc.node_id).expect("node").meta.contains_key("even"))
        .count();
    assert_eq!(on_even, 2, "at most two where meta.even = yes; the odd nodes have no value and are filtered");
    assert_eq!(h.live_allocs(&job).len(), 2);
}

#[test]
fn a_service_job_places_its_count_and_completes_the_eval() {
    let mut h = harness(10);
    let job = service(5, 100);
    let eval = h.register(&job);
    h.process(&eval).expect("scheduled");
    assert_eq!(h.plans.len(), 1);
    assert_eq!(h.last_plan().placement_count(), 5);
    let names: BTreeSet<_> = h.live_allocs(&job).iter().map(|alloc| alloc.name.clone()).collect();
    assert_eq!(names.len(), 5, "every slot once");
    let update = h.last_update();
    assert_eq!((update.status, update.failed_tg_allocs.len()), (EvalStatus::Complete, 0));
    assert!(h.created_evals.is_empty(), "nothing blocked");
}

#[test]
fn a_batch_job_places_its_count() {
    let mut h = harness(4);
    let job = Job::new_simple("report", JobType::Batch, 6, Resources::new(100, 100, 0));
    let eval = h.register(&job);
    h.process(&eval).expect("scheduled");
    assert_eq!(h.live_allocs(&job).len(), 6);
}

#[test]
fn a_system_job_runs_on_every_feasible_node() {
    let mut h = harness(6);
    let mut job = Job::new_simple("agent", JobType::System, 1, Resources::new(50, 64, 0));
    job.constraints.push(Constraint::new("${node.class}", ConstraintOperand::Equal, "c0"));
    let eval = h.register(&job);
    h.process(&eval).expect("scheduled");
    let on: BTreeSet<_> = h.live_allocs(&job).iter().map(|alloc| alloc.node_id).collect();
    let expected: BTreeSet<_> = (0..6).filter(|i| i % 2 == 0).map(|i| NodeId::from_u128(i + 1)).collect();
    assert_eq!(on, expected);
    let metric = &h.last_update().failed_tg_allocs;
    assert!(metric.is_empty(), "filtered nodes are not failures");

    // A new node of the class gets one on the next node eval; the others are left alone.
    h.add_nodes([Node::new_ready(NodeId::from_u128(99), "dc1", "c0", Resources::new(4000, 8192, 100_000))]);
    let eval = new_eval(&h, &job, TriggerReason::NodeUpdate);
    h.process(&eval).expect("scheduled");
    assert_eq!(h.last_plan().placement_count(), 1);
    assert_eq!(h.live_allocs(&job).len(), 4);
}

#[test]
fn a_sysbatch_job_runs_once_per_node() {
    let mut h = harness(3);
    let job = Job::new_simple("migrate", JobType::Sysbatch, 1, Resources::new(50, 64, 0));
    let eval = h.register(&job);
    h.process(&eval).expect("scheduled");
    for alloc in h.live_allocs(&job) {
        report(&h, &alloc, ClientStatus::Complete, NOW);
    }
    let eval = new_eval(&h, &job, TriggerReason::NodeUpdate);
    let plans_before = h.plans.len();
    h.process(&eval).expect("scheduled");
    assert_eq!(h.plans.len(), plans_before, "finished runs are not repeated");
}

#[test]
fn nothing_is_oversubscribed_within_one_plan() {
    let mut h = Harness::new(NOW);
    h.add_nodes(nodes(3, Resources::new(1000, 1000, 1000)));
    let job = Job::new_simple("big", JobType::Service, 10, Resources::new(400, 100, 0));
    let eval = h.register(&job);
    h.process(&eval).expect("scheduled");
    assert_eq!(h.live_allocs(&job).len(), 6, "two of 400 MHz fit on each 1000 MHz node");
    assert_not_oversubscribed(&h);
    let update = h.last_update();
    let metric = &update.failed_tg_allocs["group"];
    assert_eq!(metric.dimension_exhausted.get("cpu"), Some(&3));
    assert_eq!(metric.coalesced_failures, 3, "4 unplaced: one searched, three coalesced");
    assert_eq!(update.queued_allocations.get("group"), Some(&4));
    let blocked = h.created_evals.iter().find(|eval| eval.status == EvalStatus::Blocked).expect("a blocked eval");
    assert_eq!(update.blocked_eval, Some(blocked.id));
}

/// Four one-alloc jobs on two nodes: bin-pack stacks them on one node,
/// spread alternates. (Within one job, anti-affinity spreads its own allocations.)
fn nodes_used_by_four_jobs(algorithm: Algorithm) -> Vec<usize> {
    let mut h = Harness::new(NOW);
    h.config.algorithm = algorithm;
    h.add_nodes(nodes(2, Resources::new(4000, 8192, 0)));
    let mut counts = BTreeMap::new();
    for j in 0..4 {
        let job = Job::new_simple(&format!("job-{j}"), JobType::Service, 1, Resources::new(100, 256, 0));
        let eval = h.register(&job);
        h.process(&eval).expect("scheduled");
        for alloc in h.live_allocs(&job) {
            *counts.entry(alloc.node_id).or_insert(0) += 1;
        }
    }
    counts.into_values().collect()
}

#[test]
fn binpack_fills_a_node_and_spread_spreads() {
    assert_eq!(nodes_used_by_four_jobs(Algorithm::Binpack), vec![4], "bin-pack uses one node");
    assert_eq!(nodes_used_by_four_jobs(Algorithm::Spread), vec![2, 2], "spread evens out");
}

#[test]
fn a_jobs_own_allocations_are_spread_by_anti_affinity() {
    let mut h = Harness::new(NOW);
    h.add_nodes(nodes(2, Resources::new(4000, 8192, 0)));
    let job = service(4, 100);
    let eval = h.register(&job);
    h.process(&eval).expect("scheduled");
    assert_eq!(per_node(&h, &job).values().copied().collect::<Vec<_>>(), vec![2, 2]);
}

#[test]
fn distinct_hosts_with_too_few_nodes_places_what_it_can_and_blocks() {
    let mut h = harness(2);
    let mut job = service(3, 100);
    job.constraints.push(Constraint {
        l_target: String::new(),
        r_target: String::new(),
        operand: ConstraintOperand::DistinctHosts,
    });
    let eval = h.register(&job);
    h.process(&eval).expect("scheduled");
    assert_eq!(per_node(&h, &job).values().copied().collect::<Vec<_>>(), vec![1, 1]);
    let metric = &h.last_update().failed_tg_allocs["group"];
    assert_eq!(metric.constraint_filtered.get("distinct_hosts"), Some(&2));
    let blocked = h.created_evals.iter().find(|eval| eval.status == EvalStatus::Blocked).expect("blocked");
    assert!(blocked.escaped_computed_class, "distinct_hosts depends on placement, so any change may help");
}

#[test]
fn unplaceable_groups_record_which_constraint_filtered_them() {
    let mut h = harness(4);
    let mut job = service(2, 100);
    job.constraints.push(Constraint::new("${attr.kernel.name}", ConstraintOperand::Equal, "windows"));
    let eval = h.register(&job);
    h.process(&eval).expect("scheduled");
    let update = h.last_update();
    let metric = &update.failed_tg_allocs["group"];
    assert_eq!(metric.nodes_evaluated, 4);
    assert_eq!(metric.constraint_filtered.get("${attr.kernel.name} = windows"), Some(&4));
    assert_eq!(metric.class_filtered.values().sum::<u64>(), 4);
    let blocked = h.created_evals.iter().find(|eval| eval.status == EvalStatus::Blocked).expect("blocked");
    assert!(blocked.class_eligibility.values().all(|eligible| !eligible));
    assert_eq!(blocked.class_eligibility.len(), 2, "both classes were checked");
}

#[test]
fn scaling_up_and_down() {
    let mut h = harness(5);
    let mut job = service(3, 100);
    let eval = h.register(&job);
    h.process(&eval).expect("scheduled");
    job.task_groups[0].count = 5;
    let eval = h.register(&job);
    h.process(&eval).expect("scaled up");
    let new_allocs = h.last_plan().node_allocation.values().flatten().filter(|alloc| alloc.create_index == 0).count();
    assert_eq!(new_allocs, 2, "the three running ones are only moved to the new version");
    assert_eq!(h.live_allocs(&job).len(), 5);
    job.task_groups[0].count = 1;
    let eval = h.register(&job);
    h.process(&eval).expect("scaled down");
    let live = h.live_allocs(&job);
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].index(), Some(0), "the highest indexes were stopped");
}

#[test]
fn an_inplace_change_keeps_allocations_and_a_destructive_one_replaces_them() {
    let mut h = harness(3);
    let mut job = service(2, 100);
    let eval = h.register(&job);
    h.process(&eval).expect("scheduled");
    let before: BTreeSet<_> = h.live_allocs(&job).iter().map(|alloc| alloc.id).collect();

    job.priority = 80;
    let eval = h.register(&job);
    h.process(&eval).expect("in place");
    let plan = h.last_plan();
    assert!(plan.node_update.is_empty());
    let updated: BTreeSet<_> = plan.node_allocation.values().flatten().map(|alloc| alloc.id).collect();
    assert_eq!(updated, before, "the same allocations, moved to the new version");
    assert!(h.live_allocs(&job).iter().all(|alloc| alloc.job.priority == 80));

    job.task_groups[0].tasks[0].resources.memory_mb = 512;
    let eval = h.register(&job);
    h.process(&eval).expect("destructive");
    let after: BTreeSet<_> = h.live_allocs(&job).iter().map(|alloc| alloc.id).collect();
    assert_eq!(after.len(), 2);
    assert!(after.is_disjoint(&before), "new allocations replaced the old");
}

#[test]
fn a_failed_allocation_is_rescheduled_after_its_delay_on_another_node() {
    let mut h = harness(3);
    let job = service(1, 100);
    let eval = h.register(&job);
    h.process(&eval).expect("scheduled");
    let original = h.live_allocs(&job)[0].clone();
    report(&h, &original, ClientStatus::Failed, NOW);

    let eval = new_eval(&h, &job, TriggerReason::AllocFailure);
    h.process(&eval).expect("delayed");
    let follow_up = h.created_evals.last().expect("a follow-up").clone();
    assert_eq!(follow_up.triggered_by, TriggerReason::RetryFailedAlloc);
    assert_eq!(follow_up.wait_until, Some(NOW.plus(Duration::from_secs(30))), "service default delay");
    assert_eq!(h.store.snapshot().alloc(original.id).expect("stored").follow_up_eval_id, Some(follow_up.id));

    // Re-running the same eval does not make a second follow-up.
    let created = h.created_evals.len();
    h.process(&eval).expect("again");
    assert_eq!(h.created_evals.len(), created);

    h.config.now = NOW.plus(Duration::from_secs(30));
    h.process(&follow_up).expect("rescheduled");
    let replacement = h.live_allocs(&job).into_iter().next().expect("replacement");
    assert_eq!(replacement.previous_allocation, Some(original.id));
    assert_ne!(replacement.node_id, original.node_id, "the failed node is penalized");
    assert_eq!(replacement.reschedule_events.len(), 1);
    assert_eq!(h.store.snapshot().alloc(original.id).expect("stored").next_allocation, Some(replacement.id));
}

#[test]
fn reschedule_attempts_are_limited() {
    let mut h = harness(3);
    let mut job = Job::new_simple("report", JobType::Batch, 1, Resources::new(100, 100, 0));
    job.task_groups[0].reschedule_policy = Some(ReschedulePolicy {
        attempts: 1,
        interval: Duration::from_secs(3600),
        delay: Duration::ZERO,
        delay_function: DelayFunction::Constant,
        max_delay: Duration::ZERO,
        unlimited: false,
    });
    let eval = h.register(&job);
    h.process(&eval).expect("scheduled");
    let first = h.live_allocs(&job)[0].clone();
    report(&h, &first, ClientStatus::Failed, NOW);
    let eval = new_eval(&h, &job, TriggerReason::AllocFailure);
    h.process(&eval).expect("rescheduled once");
    let second = h.live_allocs(&job)[0].clone();
    assert_eq!(second.previous_allocation, Some(first.id));
    report(&h, &second, ClientStatus::Failed, NOW);
    let eval = new_eval(&h, &job, TriggerReason::AllocFailure);
    h.process(&eval).expect("no more attempts");
    assert!(h.live_allocs(&job).is_empty(), "the one attempt in the hour is used");
}

#[test]
fn allocations_on_a_down_node_are_replaced_elsewhere() {
    let mut h = harness(3);
    let job = service(2, 100);
    let eval = h.register(&job);
    h.process(&eval).expect("scheduled");
    let victim = h.live_allocs(&job)[0].clone();
    h.store
        .apply(Command::UpdateNodeStatus {
            node_id: victim.node_id,
            status: NodeStatus::Down,
            evals: vec![],
            time: Timestamp::ZERO,
        })
        .expect("down");
    let eval = new_eval(&h, &job, TriggerReason::NodeUpdate);
    h.process(&eval).expect("replaced");
    let snapshot = h.store.snapshot();
    let lost = snapshot.alloc(victim.id).expect("stored");
    assert_eq!(lost.client_status, ClientStatus::Lost);
    let live = h.live_allocs(&job);
    assert_eq!(live.len(), 2);
    assert!(live.iter().all(|alloc| alloc.node_id != victim.node_id));
}

#[test]
fn a_refused_plan_is_refreshed_and_retried() {
    let mut h = harness(3);
    h.refuse_plans = 1;
    let job = service(2, 100);
    let eval = h.register(&job);
    h.process(&eval).expect("scheduled");
    assert_eq!(h.plans.len(), 2, "refused once, then re-planned");
    assert_eq!(h.live_allocs(&job).len(), 2);
    assert_eq!(h.last_update().status, EvalStatus::Complete);
}

#[test]
fn plans_refused_past_the_limit_fail_the_eval_and_block() {
    let mut h = harness(3);
    h.refuse_plans = 100;
    let job = Job::new_simple("report", JobType::Batch, 2, Resources::new(100, 100, 0));
    let eval = h.register(&job);
    h.process(&eval).expect("handled");
    assert_eq!(h.plans.len(), 2, "batch jobs try twice");
    let update = h.last_update();
    assert_eq!(update.status, EvalStatus::Failed);
    assert!(update.status_description.contains("maximum attempts"), "{}", update.status_description);
    assert!(h.created_evals.iter().any(|eval| eval.status == EvalStatus::Blocked));
}

#[test]
fn a_stopped_job_stops_its_allocations() {
    let mut h = harness(3);
    let job = service(3, 100);
    let eval = h.register(&job);
    h.process(&eval).expect("scheduled");
    h.store.apply(Command::DeregisterJob { job: job.key(), purge: false, eval: None }).expect("stopped");
    let eval = new_eval(&h, &job, TriggerReason::JobDeregister);
    h.process(&eval).expect("stopping");
    assert!(h.live_allocs(&job).is_empty());
}

#[test]
fn an_unblocked_eval_that_still_cannot_place_is_reblocked() {
    let mut h = harness(1);
    let job = service(2, 3000);
    let eval = h.register(&job);
    h.process(&eval).expect("one placed");
    let mut blocked = h.created_evals.last().expect("blocked").clone();
    assert_eq!(blocked.status, EvalStatus::Blocked);
    blocked.status = EvalStatus::Blocked;
    h.process(&blocked).expect("still short");
    assert_eq!(h.reblocked_evals.len(), 1);
    assert_eq!(h.reblocked_evals[0].id, blocked.id);
}

/// A job of `count` allocations asking for `statics` static ports (from a
/// pool of three, so jobs collide) and `dynamics` dynamic ones.
fn job_with_ports(id: &str, count: u32, ask: Resources, statics: &[u16], dynamics: usize) -> Job {
    let mut job = Job::new_simple(id, JobType::Service, count, ask);
    if !statics.is_empty() || dynamics > 0 {
        job.task_groups[0].networks = vec![NetworkResource {
            reserved_ports: statics.iter().map(|port| Port::new(&format!("s{port}"), 8000 + port)).collect(),
            dynamic_ports: (0..dynamics).map(|i| Port::new(&format!("d{i}"), 0)).collect(),
        }];
    }
    job
}

/// No port twice on a node among the live placements of any plan.
fn assert_no_port_twice_in_a_plan(harness: &Harness) {
    for plan in &harness.plans {
        for (node, allocs) in &plan.node_allocation {
            let mut ports: Vec<u16> =
                allocs.iter().filter(|alloc| !alloc.terminal()).flat_map(|alloc| alloc.port_values()).collect();
            let given = ports.len();
            ports.sort_unstable();
            ports.dedup();
            assert_eq!(ports.len(), given, "a port given twice on node {node} in one plan");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn a_plan_never_puts_more_on_a_node_than_it_has(
        sizes in proptest::collection::vec((500u64..8000, 256u64..16_384, 1u16..12), 1..8),
        count in 1u32..40,
        cpu in 50u64..3000,
        memory in 32u64..4096,
        statics in proptest::collection::vec(0u16..3, 0..2),
        dynamics in 0usize..3,
        spread in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let mut h = Harness::new(NOW);
        h.config.seed = seed;
        h.config.algorithm = if spread { Algorithm::Spread } else { Algorithm::Binpack };
        h.add_nodes(sizes.iter().enumerate().map(|(i, (cpu, memory, dynamic_ports))| {
            let mut node =
                Node::new_ready(NodeId::from_u128(i as u128 + 1), "dc1", "c", Resources::new(*cpu, *memory, 10_000));
            node.network.min_dynamic_port = 30_000;
            node.network.max_dynamic_port = 30_000 + dynamic_ports - 1;
            node.network.reserved_ports = PortSet::of([8002]);
            node
        }));
        // Another job holds ports first, so the snapshot has some.
        let first = job_with_ports("first", 3, Resources::new(10, 10, 0), &[1], 1);
        let eval = h.register(&first);
        h.process(&eval).expect("scheduled");
        let job = job_with_ports("prop", count, Resources::new(cpu, memory, 0), &statics, dynamics);
        let eval = h.register(&job);
        h.process(&eval).expect("scheduled");
        assert_not_oversubscribed(&h);
        assert_no_port_twice_in_a_plan(&h);
        let collisions = h.store.snapshot().port_collisions();
        prop_assert!(collisions.is_empty(), "ports held twice or reserved: {:?}", collisions);
        let placed = h.live_allocs(&job).len() as u64;
        let queued = h.last_update().queued_allocations.get("group").copied().unwrap_or(0);
        prop_assert_eq!(placed + queued, u64::from(count), "every slot is placed or queued");
    }
}

#[test]
fn a_reblocked_eval_that_marks_allocations_unknown_still_schedules_their_expiry() {
    let mut h = harness(2);
    let mut job = service(2, 3000);
    job.task_groups[0].max_client_disconnect = Some(Duration::from_secs(300));
    let eval = h.register(&job);
    h.process(&eval).expect("one per node");
    let live = h.live_allocs(&job);
    for alloc in &live {
        report(&h, alloc, ClientStatus::Running, NOW);
    }
    let away = live[0].node_id;
    h.store
        .apply(Command::MissHeartbeat { node_id: away, evals: vec![], time: Timestamp::ZERO, release_at: None })
        .expect("missed heartbeat");
    assert_eq!(h.store.snapshot().node(away).expect("node").status, NodeStatus::Disconnected);
    // The job's blocked eval runs: it marks the allocation unknown, cannot place a replacement, and is reblocked.
    let mut blocked = Evaluation::for_job(&job, TriggerReason::QueuedAllocs, NOW);
    blocked.status = EvalStatus::Blocked;
    let blocked =
        Evaluation::clone(&h.store.apply(Command::UpsertEvals { evals: vec![blocked] }).expect("eval").evals[0]);
    h.process(&blocked).expect("still short");
    assert_eq!(h.reblocked_evals.len(), 1);
    let unknown = h.store.snapshot().alloc(live[0].id).expect("alloc").clone();
    assert_eq!(unknown.client_status, ClientStatus::Unknown);
    let expiry = h.created_evals.iter().find(|eval| eval.triggered_by == TriggerReason::MaxDisconnectTimeout);
    assert_eq!(expiry.map(|eval| eval.wait_until), Some(Some(NOW.plus(Duration::from_secs(300)))));
}

#[test]
fn an_unconfirmed_system_allocation_on_a_node_that_is_back_is_left_alone_and_not_doubled() {
    let mut h = harness(2);
    let mut job = Job::new_simple("logs", JobType::System, 1, Resources::new(100, 64, 0));
    job.task_groups[0].max_client_disconnect = Some(Duration::from_secs(300));
    let eval = h.register(&job);
    h.process(&eval).expect("one per node");
    for alloc in h.live_allocs(&job) {
        report(&h, &alloc, ClientStatus::Running, NOW);
    }
    let away = NodeId::from_u128(1);
    h.store
        .apply(Command::MissHeartbeat { node_id: away, evals: vec![], time: Timestamp::ZERO, release_at: None })
        .expect("missed heartbeat");
    let eval = new_eval(&h, &job, TriggerReason::NodeUpdate);
    h.process(&eval).expect("marks it unknown");
    let unknown = h.live_allocs(&job).into_iter().find(|alloc| alloc.node_id == away).expect("kept");
    assert_eq!(unknown.client_status, ClientStatus::Unknown);

    // The node is back and ready, but its client has not reported this allocation.
    let back =
        Command::UpdateNodeStatus { node_id: away, status: NodeStatus::Ready, evals: vec![], time: Timestamp::ZERO };
    h.store.apply(back).expect("ready");
    let mut updated = job.clone();
    updated.priority = 70;
    let eval = h.register(&updated);
    h.process(&eval).expect("scheduled");
    let on_node: Vec<_> = h.live_allocs(&job).into_iter().filter(|alloc| alloc.node_id == away).collect();
    assert_eq!(on_node.len(), 1, "nothing placed beside the unconfirmed allocation");
    assert_eq!(on_node[0].id, unknown.id);
    assert_eq!(on_node[0].job.priority, job.priority, "not rolled over before its client confirms it");
    assert_eq!(on_node[0].client_status, ClientStatus::Unknown);
}
