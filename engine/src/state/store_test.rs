use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::clock::Timestamp;
use crate::structs::{
    Allocation, ClientStatus, DesiredStatus, EvalStatus, Evaluation, Job, JobType, Node, NodeEligibility, NodeStatus,
    Resources, TriggerReason,
};

pub(super) fn node(n: u128) -> Node {
    Node::new_ready(NodeId::from_u128(n), "dc1", "general", Resources::new(4000, 8192, 100_000))
}

pub(super) fn job(id: &str) -> Job {
    Job::new_simple(id, JobType::Service, 2, Resources::new(100, 128, 0))
}

pub(super) fn register(store: &StateStore, job: &Job) -> Applied {
    let eval = Evaluation::for_job(job, TriggerReason::JobRegister, Timestamp(1));
    store.apply(Command::RegisterJob { job: job.clone(), eval: Some(eval) }).expect("register")
}

pub(super) fn place(store: &StateStore, job: &Job, node_id: NodeId, index: u32) -> Allocation {
    place_alloc(store, placement(store, job, node_id, index))
}

/// Allocation `index` of the stored `job` on `node_id`, not yet placed.
fn placement(store: &StateStore, job: &Job, node_id: NodeId, index: u32) -> Allocation {
    let stored = store.snapshot().job(&job.key()).expect("job stored").clone();
    Allocation::new_placement(&stored, "group", index, node_id, EvalId::from_u128(9))
}

/// Places `alloc` through a plan result.
fn place_alloc(store: &StateStore, alloc: Allocation) -> Allocation {
    store
        .apply(Command::ApplyPlanResults {
            deployment: None,
            deployment_updates: Vec::new(),
            eval_id: EvalId::from_u128(9),
            allocs: vec![alloc.clone()],
            evals: vec![],
            time: Timestamp(5),
        })
        .expect("plan applies");
    alloc
}

/// `alloc`'s client reports `status` at `time`.
pub(super) fn client_reports(alloc: &Allocation, status: ClientStatus, time: u64) -> Command {
    Command::UpdateAllocsFromClient {
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
        time: Timestamp(time),
    }
}

#[test]
fn each_command_applies_at_the_next_index() {
    let store = StateStore::new();
    assert_eq!(store.latest_index(), 0);
    assert_eq!(store.apply(Command::UpsertNode { node: node(1), evals: vec![] }).expect("node").index, 1);
    assert_eq!(register(&store, &job("web")).index, 2);
    assert_eq!(store.latest_index(), 2);
    let snapshot = store.snapshot();
    assert_eq!(snapshot.node(NodeId::from_u128(1)).expect("node").create_index, 1);
    let stored = snapshot.job(&job("web").key()).expect("job");
    assert_eq!((stored.create_index, stored.job_modify_index, stored.version), (2, 2, 0));
    assert_eq!(
        snapshot.table_indexes(),
        TableIndexes { nodes: 1, jobs: 2, allocs: 0, evals: 2, services: 0, deployments: 0, namespaces: 0 }
    );
}

#[test]
fn a_reader_snapshot_never_changes_under_it() {
    let store = StateStore::new();
    store.apply(Command::UpsertNode { node: node(1), evals: vec![] }).expect("node");
    let web = job("web");
    register(&store, &web);
    let alloc = place(&store, &web, NodeId::from_u128(1), 0);
    let before = store.snapshot();

    store.apply(client_reports(&alloc, ClientStatus::Running, 6)).expect("update");
    store.apply(Command::UpsertNode { node: node(2), evals: vec![] }).expect("second node");
    store.apply(Command::DeregisterJob { job: web.key(), purge: true, eval: None }).expect("purge");

    assert_eq!(before.alloc(alloc.id).expect("alloc").client_status, ClientStatus::Pending);
    assert_eq!(before.node_count(), 1);
    assert!(before.job(&web.key()).is_some());
    let after = store.snapshot();
    assert_eq!(after.alloc(alloc.id).expect("alloc").client_status, ClientStatus::Running);
    assert_eq!(after.node_count(), 2);
    assert!(after.job(&web.key()).is_none());
}

#[test]
fn a_refused_command_changes_nothing_but_takes_its_log_position() {
    let store = StateStore::new();
    store.apply(Command::UpsertNode { node: node(1), evals: vec![] }).expect("node");
    let web = job("web");
    register(&store, &web);
    let before = store.snapshot();
    let alloc = Allocation::new_placement(
        before.job(&web.key()).expect("job"),
        "group",
        0,
        NodeId::from_u128(1),
        EvalId::from_u128(1),
    );
    let mut stranger = alloc.clone();
    stranger.id = AllocId::from_u128(78);
    stranger.node_id = NodeId::from_u128(9);

    // The first placement is fine, the second names an unknown node: neither lands.
    let result = store.apply(Command::ApplyPlanResults {
        deployment: None,
        deployment_updates: Vec::new(),
        eval_id: EvalId::from_u128(1),
        allocs: vec![alloc, stranger],
        evals: vec![],
        time: Timestamp(6),
    });
    assert!(matches!(result, Err(StateError::PlacementOnUnknownNode { .. })), "{result:?}");
    let after = store.snapshot();
    assert_eq!(after.alloc_count(), 0, "nothing of the refused command landed");
    assert_eq!(after.table_indexes(), before.table_indexes(), "no table changed");
    // The index rule: the refused command took the next log position.
    assert_eq!(after.index(), before.index() + 1);
    assert!(Arc::ptr_eq(&before.job(&web.key()).expect("job").clone(), &after.job(&web.key()).expect("job").clone()));
}

#[test]
fn the_state_index_is_the_log_position_of_the_last_command() {
    let store = StateStore::new();
    let commands = [
        Command::UpsertNode { node: node(1), evals: vec![] },
        Command::UpdateNodeStatus {
            node_id: NodeId::from_u128(7),
            status: NodeStatus::Down,
            evals: vec![],
            time: Timestamp::ZERO,
        },
        Command::UpsertEvals { evals: vec![] },
        Command::DeregisterJob { job: job("gone").key(), purge: true, eval: None },
    ];
    let outcomes: Vec<bool> = commands.into_iter().map(|command| store.apply(command).is_ok()).collect();
    assert_eq!(outcomes, [true, false, true, false], "two of the four were refused");
    assert_eq!(store.latest_index(), 4, "every command submitted took one position");

    // A replicated log applies at its own positions, which may skip (its own entries).
    assert_eq!(
        store.apply_at(9, Command::UpsertNode { node: node(2), evals: vec![] }).map(|applied| applied.index),
        Ok(9)
    );
    assert_eq!(
        store.apply_at(9, Command::UpsertEvals { evals: vec![] }).map(|_| ()),
        Err(StateError::StaleIndex { index: 9, last: 9 })
    );
    store.advance_to(12).expect("an entry without a command");
    assert_eq!(store.latest_index(), 12);
    assert_eq!(store.snapshot().node(NodeId::from_u128(2)).expect("node").create_index, 9);
}

#[test]
fn client_updates_are_taken_or_refused_one_by_one() {
    let store = StateStore::new();
    store.apply(Command::UpsertNode { node: node(1), evals: vec![] }).expect("node");
    store.apply(Command::UpsertNode { node: node(2), evals: vec![] }).expect("node");
    let web = job("web");
    register(&store, &web);
    let alloc = place(&store, &web, NodeId::from_u128(1), 0);
    let other = place(&store, &web, NodeId::from_u128(2), 1);
    store
        .apply(Command::UpdateNodeStatus {
            node_id: NodeId::from_u128(2),
            status: NodeStatus::Down,
            evals: vec![],
            time: Timestamp::ZERO,
        })
        .expect("down");
    let update = |alloc_id, node_id| ClientAllocUpdate {
        alloc_id,
        node_id,
        client_status: ClientStatus::Running,
        client_description: String::new(),
        services: None,
        checks: None,
        health: None,
        task_states: Default::default(),
    };
    let applied = store
        .apply(Command::UpdateAllocsFromClient {
            updates: vec![
                update(alloc.id, alloc.node_id),
                update(AllocId::from_u128(77), alloc.node_id),
                update(other.id, NodeId::from_u128(1)),
                update(other.id, other.node_id),
            ],
            evals: vec![],
            time: Timestamp(6),
        })
        .expect("the batch applies");
    let refused: Vec<_> = applied.refused_updates.iter().map(|(_, error)| error.clone()).collect();
    assert_eq!(refused.len(), 3, "{refused:?}");
    assert_eq!(refused[0], StateError::UnknownAlloc(AllocId::from_u128(77)));
    assert!(refused[1].to_string().contains("not on the reporting node"), "{}", refused[1]);
    assert_eq!(refused[2], StateError::NodeNotConnected { node_id: other.node_id, status: NodeStatus::Down });
    let snapshot = store.snapshot();
    assert_eq!(snapshot.alloc(alloc.id).expect("alloc").client_status, ClientStatus::Running);
    assert_eq!(snapshot.alloc(other.id).expect("alloc").client_status, ClientStatus::Pending);
    assert_eq!(snapshot.node(other.node_id).expect("node").last_alloc_update_index, 0);
}

#[test]
fn a_plan_keeps_what_the_client_reported_and_never_places_on_a_node_that_left() {
    let store = StateStore::new();
    store.apply(Command::UpsertNode { node: node(1), evals: vec![] }).expect("node");
    store.apply(Command::UpsertNode { node: node(2), evals: vec![] }).expect("node");
    let web = job("web");
    register(&store, &web);
    let alloc = place(&store, &web, NodeId::from_u128(1), 0);
    // A plan made before the client's report: it updates the alloc in place.
    let mut inplace = Allocation::clone(&alloc);
    inplace.desired_description = "updated in place".into();
    let report = ClientAllocUpdate {
        alloc_id: alloc.id,
        node_id: alloc.node_id,
        client_status: ClientStatus::Running,
        client_description: "started".into(),
        services: None,
        checks: None,
        health: None,
        task_states: Default::default(),
    };
    store
        .apply(Command::UpdateAllocsFromClient { updates: vec![report], evals: vec![], time: Timestamp(6) })
        .expect("report");
    store
        .apply(Command::UpdateNodeStatus {
            node_id: NodeId::from_u128(2),
            status: NodeStatus::Down,
            evals: vec![],
            time: Timestamp::ZERO,
        })
        .expect("down");
    let mut late = Allocation::new_placement(&alloc.job, "group", 1, NodeId::from_u128(2), EvalId::from_u128(1));
    late.id = AllocId::from_u128(99);
    let applied = store
        .apply(Command::ApplyPlanResults {
            deployment: None,
            deployment_updates: Vec::new(),
            eval_id: EvalId::from_u128(1),
            allocs: vec![inplace, late],
            evals: vec![],
            time: Timestamp(7),
        })
        .expect("plan applies");
    assert_eq!(applied.refused_placements, vec![AllocId::from_u128(99)]);
    let snapshot = store.snapshot();
    let stored = snapshot.alloc(alloc.id).expect("alloc");
    assert_eq!(stored.client_status, ClientStatus::Running, "the report is not overwritten");
    assert_eq!(stored.client_description, "started");
    assert_eq!(stored.desired_description, "updated in place");
    assert!(snapshot.alloc(AllocId::from_u128(99)).is_none());
}

#[test]
fn client_updates_record_the_node_index_and_freed_capacity() {
    let store = StateStore::new();
    store.apply(Command::UpsertNode { node: node(1), evals: vec![] }).expect("node");
    let web = job("web");
    register(&store, &web);
    let alloc = place(&store, &web, NodeId::from_u128(1), 0);
    let update = |status| client_reports(&alloc, status, 7);
    let running = store.apply(update(ClientStatus::Running)).expect("running");
    assert!(running.capacity_changes.is_empty());
    let failed = store.apply(update(ClientStatus::Failed)).expect("failed");
    assert_eq!(failed.capacity_changes.len(), 1, "a failed alloc frees its node");
    let snapshot = store.snapshot();
    let stored = snapshot.alloc(alloc.id).expect("alloc");
    assert_eq!(stored.client_status, ClientStatus::Failed);
    assert!(stored.alloc_states.is_empty(), "the history holds only the servers' decisions");
    assert_eq!(snapshot.node(alloc.node_id).expect("node").last_alloc_update_index, failed.index);
}

/// A failed allocation frees its port, a new one takes it, and then the
/// failed one's client says it runs: the update is refused (it would hold
/// the port twice) and nothing else changes.
#[test]
fn a_client_cannot_report_an_ended_allocation_live_again() {
    let store = StateStore::new();
    store.apply(Command::UpsertNode { node: node(1), evals: vec![] }).expect("node");
    let web = job("web");
    register(&store, &web);
    let with_port = |index: u32| {
        let mut alloc = placement(&store, &web, NodeId::from_u128(1), index);
        alloc.ports = vec![crate::structs::AllocatedPort {
            label: "http".into(),
            value: 20_000,
            to: 0,
            host_ip: "10.0.0.1".into(),
        }];
        place_alloc(&store, alloc)
    };
    let update = |alloc: &Allocation, status| client_reports(alloc, status, 7);
    let first = with_port(0);
    store.apply(update(&first, ClientStatus::Failed)).expect("failed");
    let second = with_port(1);

    let applied = store.apply(update(&first, ClientStatus::Running)).expect("the command applies");
    let refused = StateError::AllocEnded { alloc_id: first.id, status: ClientStatus::Failed };
    assert_eq!(applied.refused_updates, vec![(first.id, refused)]);
    let snapshot = store.snapshot();
    assert_eq!(snapshot.alloc(first.id).expect("alloc").client_status, ClientStatus::Failed);
    assert!(snapshot.port_collisions().is_empty());
    assert_eq!(snapshot.node_ports(second.node_id).map(|ports| ports.iter().collect::<Vec<_>>()), Some(vec![20_000]));
    // A terminal report about it is still taken.
    store.apply(update(&first, ClientStatus::Complete)).expect("complete");
    assert!(store.snapshot().alloc(first.id).expect("alloc").client_terminal());
}

#[test]
fn secondary_indexes_follow_writes() {
    let store = StateStore::new();
    for n in 1..=3 {
        store.apply(Command::UpsertNode { node: node(n), evals: vec![] }).expect("node");
    }
    let web = job("web");
    let applied = register(&store, &web);
    let first = place(&store, &web, NodeId::from_u128(1), 0);
    let second = place(&store, &web, NodeId::from_u128(1), 1);
    place(&store, &web, NodeId::from_u128(2), 2);
    let snapshot = store.snapshot();
    let on_node_one: Vec<_> = snapshot.allocs_by_node(NodeId::from_u128(1)).map(|alloc| alloc.id).collect();
    assert_eq!(on_node_one, vec![first.id, second.id]);
    assert_eq!(snapshot.allocs_by_job(&web.key()).count(), 3);
    assert_eq!(snapshot.evals_by_job(&web.key()).map(|eval| eval.id).collect::<Vec<_>>(), vec![applied.evals[0].id]);
    let class = snapshot.node(NodeId::from_u128(1)).expect("node").computed_class;
    assert_eq!(snapshot.nodes_by_class(class).count(), 3);

    let mut moved = node(3);
    moved.node_class = Arc::from("gpu");
    store.apply(Command::UpsertNode { node: moved, evals: vec![] }).expect("class change");
    let snapshot = store.snapshot();
    assert_eq!(snapshot.nodes_by_class(class).count(), 2);
    let new_class = snapshot.node(NodeId::from_u128(3)).expect("node").computed_class;
    assert_eq!(snapshot.nodes_by_class(new_class).collect::<Vec<_>>(), vec![NodeId::from_u128(3)]);
}

#[test]
fn register_keeps_the_status_of_a_known_node() {
    let store = StateStore::new();
    store.apply(Command::UpsertNode { node: node(1), evals: vec![] }).expect("node");
    store
        .apply(Command::MissHeartbeat {
            node_id: NodeId::from_u128(1),
            evals: vec![],
            time: Timestamp::ZERO,
            release_at: None,
        })
        .expect("missed heartbeat");
    let missed_at = store.latest_index();
    let mut again = node(1);
    again.status = NodeStatus::Ready;
    again.attributes.insert("os.version".into(), "12".into());
    store.apply(Command::UpsertNode { node: again, evals: vec![] }).expect("re-register");
    let snapshot = store.snapshot();
    let stored = snapshot.node(NodeId::from_u128(1)).expect("node");
    assert_eq!(stored.status, NodeStatus::Down, "no allocation tolerates a disconnect");
    assert_eq!(stored.last_missed_heartbeat_index, missed_at);
    assert_eq!(stored.attributes.get("os.version").map(String::as_str), Some("12"));
}

#[test]
fn register_keeps_the_eligibility_an_operator_set() {
    let store = StateStore::new();
    store.apply(Command::UpsertNode { node: node(1), evals: vec![] }).expect("node");
    let eligibility = NodeEligibility::Ineligible;
    store
        .apply(Command::UpdateNodeEligibility { node_id: NodeId::from_u128(1), eligibility, evals: vec![] })
        .expect("marked");
    // The client's next registration (a driver's health changed) says eligible.
    let mut again = node(1);
    again.attributes.insert("driver.docker".into(), "1".into());
    let applied = store.apply(Command::UpsertNode { node: again, evals: vec![] }).expect("re-register");
    let snapshot = store.snapshot();
    let stored = snapshot.node(NodeId::from_u128(1)).expect("node");
    assert_eq!(stored.eligibility, NodeEligibility::Ineligible, "the operator's mark stays");
    assert!(stored.has_driver("docker"), "the new attributes are taken");
    assert!(!stored.is_schedulable());
    assert!(snapshot.schedulable_nodes().is_empty(), "not in the schedulable list");
    assert!(applied.capacity_changes.is_empty(), "no capacity for blocked evals on an ineligible node");
}

#[test]
fn a_changed_spec_bumps_the_version_and_a_resubmission_does_not() {
    let store = StateStore::new();
    let mut web = job("web");
    register(&store, &web);
    register(&store, &web);
    assert_eq!(store.snapshot().job(&web.key()).expect("job").version, 0);
    web.task_groups[0].count = 5;
    let applied = register(&store, &web);
    let snapshot = store.snapshot();
    let stored = snapshot.job(&web.key()).expect("job");
    assert_eq!((stored.version, stored.job_modify_index), (1, applied.index));
    assert_eq!(applied.evals[0].job_modify_index, applied.index);
    store.apply(Command::DeregisterJob { job: web.key(), purge: false, eval: None }).expect("stop");
    let stopped = store.snapshot().job(&web.key()).expect("job").clone();
    assert!(stopped.stop);
    assert_eq!(stopped.version, 2);
}

#[test]
fn evals_keep_their_create_index_across_updates() {
    let store = StateStore::new();
    let web = job("web");
    let applied = register(&store, &web);
    let mut eval = Evaluation::clone(&applied.evals[0]);
    eval.status = EvalStatus::Complete;
    let updated = store.apply(Command::UpsertEvals { evals: vec![eval.clone()] }).expect("update");
    let stored = store.snapshot().eval(eval.id).expect("eval").clone();
    assert_eq!((stored.create_index, stored.modify_index), (applied.index, updated.index));
    assert_eq!(stored.status, EvalStatus::Complete);
}

#[test]
fn stopping_an_alloc_in_a_plan_frees_capacity() {
    let store = StateStore::new();
    store.apply(Command::UpsertNode { node: node(1), evals: vec![] }).expect("node");
    let web = job("web");
    register(&store, &web);
    let mut alloc = place(&store, &web, NodeId::from_u128(1), 0);
    alloc.desired_status = DesiredStatus::Stop;
    let applied = store
        .apply(Command::ApplyPlanResults {
            deployment: None,
            deployment_updates: Vec::new(),
            eval_id: EvalId::from_u128(9),
            allocs: vec![alloc],
            evals: vec![],
            time: Timestamp(9),
        })
        .expect("stop");
    assert_eq!(applied.capacity_changes.len(), 1);
}

#[test]
fn a_placement_on_an_unknown_node_is_refused() {
    let store = StateStore::new();
    let web = job("web");
    register(&store, &web);
    let stored = store.snapshot().job(&web.key()).expect("job").clone();
    let alloc = Allocation::new_placement(&stored, "group", 0, NodeId::from_u128(5), EvalId::from_u128(1));
    let error = store
        .apply(Command::ApplyPlanResults {
            deployment: None,
            deployment_updates: Vec::new(),
            eval_id: EvalId::from_u128(1),
            allocs: vec![alloc],
            evals: vec![],
            time: Timestamp(1),
        })
        .expect_err("unknown node");
    assert_eq!(
        error,
        StateError::PlacementOnUnknownNode { eval_id: EvalId::from_u128(1), node_id: NodeId::from_u128(5) }
    );
    assert_eq!(store.snapshot().alloc_count(), 0);
}

#[test]
fn snapshot_min_index_wakes_when_the_index_is_reached() {
    let store = Arc::new(StateStore::new());
    let waiter = {
        let store = store.clone();
        std::thread::spawn(move || {
            store.snapshot_min_index(2, Duration::from_secs(600)).map(|snapshot| snapshot.index())
        })
    };
    while store.waiters() == 0 {
        std::thread::yield_now();
    }
    store.apply(Command::UpsertNode { node: node(1), evals: vec![] }).expect("index 1");
    store.apply(Command::UpsertNode { node: node(2), evals: vec![] }).expect("index 2");
    assert_eq!(waiter.join().expect("waiter"), Ok(2));
}

#[test]
fn snapshot_min_index_returns_at_once_when_already_there() {
    let store = StateStore::new();
    store.apply(Command::UpsertNode { node: node(1), evals: vec![] }).expect("index 1");
    assert_eq!(store.snapshot_min_index(1, Duration::ZERO).expect("reached").index(), 1);
}

#[test]
fn snapshot_min_index_times_out_with_a_distinct_error() {
    let store = StateStore::new();
    store.apply(Command::UpsertNode { node: node(1), evals: vec![] }).expect("index 1");
    let error = store.snapshot_min_index(5, Duration::from_millis(1)).expect_err("not reached");
    assert_eq!(error, WaitError::Timeout { wanted: 5, reached: 1 });
}

#[test]
fn shutdown_wakes_waiters_and_refuses_writes() {
    let store = Arc::new(StateStore::new());
    let waiter = {
        let store = store.clone();
        std::thread::spawn(move || store.snapshot_min_index(10, Duration::from_secs(600)).map(|_| ()))
    };
    while store.waiters() == 0 {
        std::thread::yield_now();
    }
    store.shutdown();
    assert_eq!(waiter.join().expect("waiter"), Err(WaitError::Shutdown { wanted: 10 }));
    assert_eq!(
        store.apply(Command::UpsertNode { node: node(1), evals: vec![] }).expect_err("shut"),
        StateError::ShuttingDown
    );
}

#[test]
fn commands_round_trip_through_serde() {
    let web = job("web");
    let command = Command::RegisterJob {
        eval: Some(Evaluation::for_job(&web, TriggerReason::JobRegister, Timestamp(3))),
        job: web,
    };
    let text = serde_json::to_string(&command).expect("serializes");
    let back: Command = serde_json::from_str(&text).expect("deserializes");
    assert_eq!(back, command);
}

#[test]
fn the_oversubscription_audit_reports_nodes_past_their_capacity() {
    let store = StateStore::new();
    store.apply(Command::UpsertNode { node: node(1), evals: vec![] }).expect("node");
    let web = job("web");
    register(&store, &web);
    place(&store, &web, NodeId::from_u128(1), 0);
    assert!(store.snapshot().oversubscribed_nodes().is_empty());
    // The store does not check fit (the plan applier does), so an oversized placement lands and the audit sees it.
    let stored = store.snapshot().job(&web.key()).expect("job").clone();
    let mut huge = Allocation::new_placement(&stored, "group", 1, NodeId::from_u128(1), EvalId::from_u128(9));
    huge.resources = Resources::new(4000, 1, 0);
    store
        .apply(Command::ApplyPlanResults {
            deployment: None,
            deployment_updates: Vec::new(),
            eval_id: EvalId::from_u128(9),
            allocs: vec![huge],
            evals: vec![],
            time: Timestamp(6),
        })
        .expect("applies");
    let reported = store.snapshot().oversubscribed_nodes();
    assert_eq!(
        reported,
        vec![(NodeId::from_u128(1), Resources::new(4100, 129, 0), Resources::new(4000, 8192, 100_000))]
    );
    assert_eq!(
        store.snapshot().node_usage(NodeId::from_u128(1)),
        Resources::new(4100, 129, 0),
        "the usage index agrees"
    );
}

#[test]
fn a_plan_written_with_an_older_copy_keeps_the_link_to_the_replacement() {
    let store = StateStore::new();
    store.apply(Command::UpsertNode { node: node(1), evals: vec![] }).expect("node");
    store.apply(Command::UpsertNode { node: node(2), evals: vec![] }).expect("node");
    let web = job("web");
    register(&store, &web);
    let original = place(&store, &web, NodeId::from_u128(1), 0);
    // One plan marks the original `unknown` and places its replacement; the
    // replacement is written first, so the marked copy (read before the
    // plan) does not know it was replaced.
    let stored = store.snapshot().job(&web.key()).expect("job").clone();
    let mut replacement = Allocation::new_placement(&stored, "group", 0, NodeId::from_u128(2), EvalId::from_u128(9));
    replacement.previous_allocation = Some(original.id);
    let mut marked = store.snapshot().alloc(original.id).expect("alloc").as_ref().clone();
    marked.record_client_status(ClientStatus::Unknown, Timestamp(6));
    let command = Command::ApplyPlanResults {
        deployment: None,
        deployment_updates: Vec::new(),
        eval_id: EvalId::from_u128(9),
        allocs: vec![replacement.clone(), marked],
        evals: vec![],
        time: Timestamp(6),
    };
    store.apply(command).expect("plan");
    let snapshot = store.snapshot();
    let original = snapshot.alloc(original.id).expect("original");
    assert_eq!(original.client_status, ClientStatus::Unknown);
    assert_eq!(original.next_allocation, Some(replacement.id));
}

#[test]
fn a_write_wakes_only_the_watchers_of_the_nodes_it_touched() {
    use std::future::Future;
    use std::task::{Context, Waker};

    let store = StateStore::new();
    let n_nodes = 10_000;
    for n in 1..=n_nodes {
        store.apply(Command::UpsertNode { node: node(n), evals: vec![] }).expect("node");
    }
    let web = job("web");
    register(&store, &web);
    // One watcher per node, each listening before the write.
    let mut listeners: Vec<_> = (1..=n_nodes).map(|n| store.watch_node(NodeId::from_u128(n)).listen()).collect();
    let mut context = Context::from_waker(Waker::noop());
    let woken = |listeners: &mut Vec<event_listener::EventListener>, context: &mut Context<'_>| -> Vec<u128> {
        let mut woken = Vec::new();
        for (position, listener) in listeners.iter_mut().enumerate() {
            if std::pin::Pin::new(listener).poll(context).is_ready() {
                woken.push(position as u128 + 1);
            }
        }
        woken
    };
    assert!(woken(&mut listeners, &mut context).is_empty(), "nobody woke before the write");
    listeners = (1..=n_nodes).map(|n| store.watch_node(NodeId::from_u128(n)).listen()).collect();

    // A plan placing on three nodes.
    let stored = store.snapshot().job(&web.key()).expect("job").clone();
    let allocs = [17, 4_242, 9_999]
        .into_iter()
        .map(|n| Allocation::new_placement(&stored, "group", n as u32, NodeId::from_u128(n), EvalId::from_u128(9)))
        .collect();
    let applied = store
        .apply(Command::ApplyPlanResults {
            deployment: None,
            deployment_updates: Vec::new(),
            eval_id: EvalId::from_u128(9),
            allocs,
            evals: vec![],
            time: Timestamp(5),
        })
        .expect("plan");
    let mut touched = applied.touched_nodes.clone();
    touched.sort();
    assert_eq!(touched, [NodeId::from_u128(17), NodeId::from_u128(4_242), NodeId::from_u128(9_999)]);
    assert_eq!(woken(&mut listeners, &mut context), [17, 4_242, 9_999], "exactly the three touched nodes' watchers");

    // A write that touches no allocation wakes no node watcher.
    listeners = (1..=n_nodes).map(|n| store.watch_node(NodeId::from_u128(n)).listen()).collect();
    register(&store, &job("other"));
    assert!(woken(&mut listeners, &mut context).is_empty());

    // A client's own report changes its allocation but is not pushed back
    // to it; the drainer still sees the node touched.
    let on_17 = store.snapshot().allocs_by_node(NodeId::from_u128(17)).next().expect("placed").clone();
    listeners = (1..=n_nodes).map(|n| store.watch_node(NodeId::from_u128(n)).listen()).collect();
    let applied = store.apply(client_reports(&on_17, ClientStatus::Running, 6)).expect("report");
    assert_eq!(applied.touched_nodes, [NodeId::from_u128(17)]);
    assert!(applied.reported_by_clients);
    assert!(woken(&mut listeners, &mut context).is_empty(), "no watcher woke for the client's own report");
    // The watch still finds the report when the servers next change the node.
    let stop = Command::StopAlloc {
        alloc_id: on_17.id,
        eval: Evaluation::for_job(&stored, TriggerReason::AllocStop, Timestamp(7)),
        time: Timestamp(7),
    };
    store.apply(stop).expect("stop");
    assert_eq!(woken(&mut listeners, &mut context), [17], "a stop by the servers is pushed");
}

#[test]
fn the_port_index_follows_live_allocations_and_refuses_a_port_held_twice() {
    let store = StateStore::new();
    store.apply(Command::UpsertNode { node: node(1), evals: vec![] }).expect("node");
    let web = job("web");
    register(&store, &web);
    let stored = store.snapshot().job(&web.key()).expect("job stored").clone();
    let with_port = |index: u32, port: u16| {
        let mut alloc = Allocation::new_placement(&stored, "group", index, NodeId::from_u128(1), EvalId::from_u128(9));
        alloc.ports =
            vec![crate::structs::AllocatedPort { label: "http".into(), value: port, to: 0, host_ip: "".into() }];
        alloc
    };
    let plan = |allocs: Vec<Allocation>| Command::ApplyPlanResults {
        deployment: None,
        deployment_updates: Vec::new(),
        eval_id: EvalId::from_u128(9),
        allocs,
        evals: vec![],
        time: Timestamp(5),
    };
    let holder = with_port(0, 8080);
    store.apply(plan(vec![holder.clone()])).expect("placed");
    assert!(store.snapshot().port_in_use(NodeId::from_u128(1), 8080));
    let second = with_port(1, 8080);
    let applied = store.apply(plan(vec![second.clone()])).expect("applies");
    assert_eq!(applied.refused_placements, vec![second.id], "8080 is held");
    // Stopping the holder first, in the same command, frees the port.
    let mut stopped = holder;
    stopped.desired_status = DesiredStatus::Stop;
    let applied = store.apply(plan(vec![stopped, second])).expect("applies");
    assert!(applied.refused_placements.is_empty());
    let snapshot = store.snapshot();
    assert_eq!(snapshot.node_ports(NodeId::from_u128(1)).map(|ports| ports.len()), Some(1));
    assert!(snapshot.port_collisions().is_empty());
}

fn management_token(n: u128) -> crate::structs::AclToken {
    crate::structs::AclToken {
        accessor_id: uuid::Uuid::from_u128(n),
        secret_id: uuid::Uuid::from_u128(n + 1_000),
        name: format!("management-{n}"),
        token_type: crate::structs::AclTokenType::Management,
        policies: vec![],
        create_time: Timestamp(1),
        create_index: 0,
        modify_index: 0,
    }
}

#[test]
fn a_bootstrap_reset_needs_the_index_of_the_last_bootstrap_and_keeps_older_tokens() {
    let store = StateStore::new();
    let first = store.apply(Command::AclBootstrap { token: management_token(1) }).expect("bootstrap").index;
    let again = store.apply(Command::AclBootstrap { token: management_token(2) }).expect_err("once");
    assert_eq!(again.to_string(), format!("ACL bootstrap already done (reset index: {first})"));
    let stale = Command::AclBootstrapReset { token: management_token(3), reset_index: first + 1 };
    assert!(matches!(store.apply(stale), Err(StateError::AclBootstrapped(done)) if done == first));
    let reset = Command::AclBootstrapReset { token: management_token(4), reset_index: first };
    let second = store.apply(reset).expect("the reset index matches").index;
    let acl = store.snapshot().acl().clone();
    assert_eq!(acl.bootstrap_index, Some(second));
    assert!(acl.tokens.contains_key(&uuid::Uuid::from_u128(1)) && acl.tokens.contains_key(&uuid::Uuid::from_u128(4)));
    assert!(!acl.tokens.contains_key(&uuid::Uuid::from_u128(3)), "a refused reset wrote nothing");
    let replayed = Command::AclBootstrapReset { token: management_token(5), reset_index: first };
    assert!(store.apply(replayed).is_err(), "the same reset index works once");
}

#[test]
fn an_operator_stop_marks_the_allocation_stopped_with_its_eval_and_refuses_an_unknown_one() {
    let store = StateStore::new();
    store.apply(Command::UpsertNode { node: node(1), evals: vec![] }).expect("node");
    let web = job("web");
    register(&store, &web);
    let alloc = place(&store, &web, NodeId::from_u128(1), 0);
    assert_eq!(store.snapshot().node_usage(NodeId::from_u128(1)), Resources::new(100, 128, 0), "live on the node");

    let before = store.latest_index();
    let eval = Evaluation::for_job(&web, TriggerReason::AllocStop, Timestamp(7));
    let unknown = Command::StopAlloc { alloc_id: AllocId::from_u128(404), eval: eval.clone(), time: Timestamp(7) };
    assert!(matches!(store.apply(unknown), Err(StateError::UnknownAlloc(_))));
    let snapshot = store.snapshot();
    assert_eq!(snapshot.index(), before + 1, "a refused command takes its index and nothing else");
    assert!(snapshot.eval(eval.id).is_none(), "nor its eval");

    let applied = store.apply(Command::StopAlloc { alloc_id: alloc.id, eval: eval.clone(), time: Timestamp(7) });
    let applied = applied.expect("stopped");
    assert_eq!(applied.evals.len(), 1, "its eval goes to the broker");
    assert_eq!(applied.capacity_changes.len(), 1, "its resources are free again");
    let snapshot = store.snapshot();
    let stopped = snapshot.alloc(alloc.id).expect("kept");
    assert_eq!(stopped.desired_status, DesiredStatus::Stop);
    assert_eq!(stopped.desired_description, Allocation::STOPPED_BY_OPERATOR);
    assert_eq!(stopped.modify_time, Timestamp(7));
    assert_eq!(snapshot.eval(eval.id).expect("written").triggered_by, TriggerReason::AllocStop);
    assert_eq!(snapshot.node_usage(NodeId::from_u128(1)), Resources::default(), "nothing live is left on the node");
}
