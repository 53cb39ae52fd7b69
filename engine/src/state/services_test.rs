//! Service registrations in the store: upsert, reads, deletes, the
//! lifecycle rules, refusals and the snapshot round trip.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::clock::Timestamp;
use crate::structs::{
    Allocation, ClientStatus, DesiredStatus, EvalId, Job, JobType, Node, NodeStatus, Resources, ServiceRegistration,
};
use crate::testing::service_registration;

fn node(n: u128) -> Node {
    Node::new_ready(NodeId::from_u128(n), "dc1", "general", Resources::new(4000, 8192, 100_000))
}

/// A store with nodes 1 and 2 and jobs `web` and `api`.
fn store() -> StateStore {
    let store = StateStore::new();
    for n in 1..=2 {
        store.apply(Command::UpsertNode { node: node(n), evals: vec![] }).expect("node");
    }
    for id in ["web", "api"] {
        let job = Job::new_simple(id, JobType::Service, 2, Resources::new(100, 128, 0));
        store.apply(Command::RegisterJob { job, eval: None }).expect("job");
    }
    store
}

/// A running allocation of `job` on node `n`, placed through a plan.
fn running(store: &StateStore, job: &str, n: u128) -> Allocation {
    let stored = store.snapshot().job(&JobKey::new("default", job)).expect("job").clone();
    let mut alloc = Allocation::new_placement(&stored, "group", 0, NodeId::from_u128(n), EvalId::from_u128(9));
    alloc.client_status = ClientStatus::Running;
    let plan = Command::ApplyPlanResults {
        deployment: None,
        deployment_updates: Vec::new(),
        eval_id: EvalId::from_u128(9),
        allocs: vec![alloc.clone()],
        evals: vec![],
        time: Timestamp(2),
    };
    store.apply(plan).expect("placed");
    alloc
}

fn upsert(store: &StateStore, registrations: Vec<ServiceRegistration>) -> Applied {
    store.apply(Command::UpsertServiceRegistrations { registrations }).expect("an upsert is never refused whole")
}

fn client_reports(alloc: &Allocation, status: ClientStatus) -> Command {
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
        time: Timestamp(3),
    }
}

fn ids<'a>(rows: impl Iterator<Item = &'a Arc<ServiceRegistration>>) -> Vec<String> {
    rows.map(|row| row.id.clone()).collect()
}

fn sorted(mut ids: Vec<String>) -> Vec<String> {
    ids.sort();
    ids
}

#[test]
fn registrations_are_stored_and_found_by_name_job_alloc_and_node() {
    let store = store();
    let (web1, web2, api) = (running(&store, "web", 1), running(&store, "web", 2), running(&store, "api", 1));
    let mut canary = service_registration(&web2, "web", 8081);
    canary.tags = vec!["canary".into(), "v1".into()];
    let (web1_web, api_db) = (service_registration(&web1, "web", 8080), service_registration(&api, "db", 5432));
    let applied = upsert(&store, vec![web1_web.clone(), canary.clone(), api_db.clone()]);
    assert!(applied.refused_registrations.is_empty());

    let snapshot = store.snapshot();
    assert_eq!(snapshot.service_registration_count(), 3);
    assert_eq!(snapshot.table_indexes().services, applied.index, "the table index moved");
    let stored = snapshot.service_registration(&web1_web.id).expect("stored");
    assert_eq!((stored.create_index, stored.modify_index), (applied.index, applied.index));
    assert_eq!(stored.address, "10.0.0.1");

    let web = ids(snapshot.service_registrations_by_name("default", "web", None));
    assert_eq!(web, sorted(vec![web1_web.id.clone(), canary.id.clone()]));
    assert_eq!(ids(snapshot.service_registrations_by_name("default", "web", Some("canary"))), vec![canary.id.clone()]);
    assert_eq!(ids(snapshot.service_registrations_by_name("default", "web", Some("nope"))), Vec::<String>::new());
    assert_eq!(ids(snapshot.service_registrations_by_name("other", "web", None)), Vec::<String>::new());
    assert_eq!(ids(snapshot.service_registrations_by_job(&JobKey::new("default", "api"))), vec![api_db.id.clone()]);
    assert_eq!(ids(snapshot.service_registrations_by_alloc(web2.id)), vec![canary.id.clone()]);
    let on_node_1 = ids(snapshot.service_registrations_by_node(NodeId::from_u128(1)));
    assert_eq!(on_node_1, sorted(vec![web1_web.id.clone(), api_db.id.clone()]));

    let names = snapshot.service_names();
    assert_eq!(names.len(), 1, "one namespace");
    let (namespace, listings) = &names[0];
    assert_eq!(&**namespace, "default");
    let listed: Vec<(&str, Vec<&str>)> = listings
        .iter()
        .map(|listing| (listing.service_name.as_str(), listing.tags.iter().map(String::as_str).collect()))
        .collect();
    assert_eq!(listed, vec![("db", vec!["v1"]), ("web", vec!["canary", "v1"])], "names sorted, tags united once");
}

#[test]
fn the_same_registrations_again_write_nothing_and_a_change_keeps_the_create_index() {
    let store = store();
    let alloc = running(&store, "web", 1);
    let registration = service_registration(&alloc, "web", 8080);
    let first = upsert(&store, vec![registration.clone()]);

    let again = upsert(&store, vec![registration.clone()]);
    let snapshot = store.snapshot();
    assert_eq!(snapshot.index(), again.index, "the command takes its log position");
    assert_eq!(snapshot.table_indexes().services, first.index, "but the table did not change");
    assert_eq!(snapshot.service_registration(&registration.id).expect("kept").modify_index, first.index);

    let mut moved = registration.clone();
    moved.port = 9090;
    let changed = upsert(&store, vec![moved]);
    let snapshot = store.snapshot();
    let stored = snapshot.service_registration(&registration.id).expect("replaced");
    assert_eq!((stored.create_index, stored.modify_index, stored.port), (first.index, changed.index, 9090));
    assert_eq!(snapshot.service_registration_count(), 1, "one row per id");
    assert_eq!(snapshot.table_indexes().services, changed.index);
}

#[test]
fn a_registration_of_an_allocation_that_is_not_live_here_is_left_out_and_the_rest_taken() {
    let store = store();
    let (live, stopped, ended) = (running(&store, "web", 1), running(&store, "web", 1), running(&store, "web", 2));
    let mut stop = Allocation::clone(store.snapshot().alloc(stopped.id).expect("placed"));
    stop.desired_status = DesiredStatus::Stop;
    let plan = Command::ApplyPlanResults {
        deployment: None,
        deployment_updates: Vec::new(),
        eval_id: EvalId::from_u128(9),
        allocs: vec![stop],
        evals: vec![],
        time: Timestamp(3),
    };
    store.apply(plan).expect("stopped");
    store.apply(client_reports(&ended, ClientStatus::Complete)).expect("ended");

    let taken = service_registration(&live, "web", 8080);
    let mut unknown = service_registration(&live, "web", 1);
    unknown.alloc_id = AllocId::from_u128(404);
    unknown.id = "unknown".into();
    let mut elsewhere = service_registration(&live, "web", 2);
    elsewhere.node_id = NodeId::from_u128(2);
    elsewhere.id = "elsewhere".into();
    let mut other_job = service_registration(&live, "web", 3);
    other_job.job_id = Arc::from("api");
    other_job.id = "other-job".into();
    let batch = vec![
        unknown,
        elsewhere,
        other_job,
        service_registration(&stopped, "web", 4),
        service_registration(&ended, "web", 5),
        taken.clone(),
    ];
    let applied = upsert(&store, batch);

    let refused: Vec<&StateError> = applied.refused_registrations.iter().map(|(_, error)| error).collect();
    assert!(matches!(refused[0], StateError::UnknownAlloc(_)), "{refused:?}");
    assert!(matches!(refused[1], StateError::AllocOnOtherNode { .. }), "{refused:?}");
    assert!(matches!(refused[2], StateError::ServiceRegistrationMismatch { .. }), "{refused:?}");
    assert_eq!(refused[3], &StateError::AllocNotLive(stopped.id));
    assert_eq!(refused[4], &StateError::AllocNotLive(ended.id));
    assert_eq!(refused.len(), 5);
    assert_eq!(ids(store.snapshot().service_registrations()), vec![taken.id], "only the live one is stored");
}

#[test]
fn deleting_an_unknown_id_is_refused_and_changes_nothing() {
    let store = store();
    let alloc = running(&store, "web", 1);
    let registration = service_registration(&alloc, "web", 8080);
    let registered = upsert(&store, vec![registration.clone()]);
    let before = store.snapshot().dump();

    let unknown = Command::DeleteServiceRegistration { namespace: "default".into(), id: "nope".into() };
    let error = store.apply(unknown).expect_err("refused");
    assert_eq!(error, StateError::UnknownServiceRegistration { namespace: "default".into(), id: "nope".into() });
    assert_eq!(error.to_string(), "service registration nope not found in namespace default");
    let wrong_namespace = Command::DeleteServiceRegistration { namespace: "other".into(), id: registration.id.clone() };
    assert!(matches!(store.apply(wrong_namespace), Err(StateError::UnknownServiceRegistration { .. })));
    let after = store.snapshot().dump();
    assert_eq!(after.index, before.index + 2, "each refused command takes its position");
    assert_eq!(StateDump { index: before.index, ..after }, before, "and changes nothing else");

    let delete = Command::DeleteServiceRegistration { namespace: "default".into(), id: registration.id.clone() };
    let deleted = store.apply(delete).expect("deleted");
    let snapshot = store.snapshot();
    assert!(snapshot.service_registration(&registration.id).is_none());
    assert_eq!(snapshot.table_indexes().services, deleted.index);
    assert!(deleted.index > registered.index);
    assert_eq!(snapshot.dump().services, ServiceDump::default(), "every index forgot it");
}

#[test]
fn deleting_the_registrations_of_allocations() {
    let store = store();
    let (first, second) = (running(&store, "web", 1), running(&store, "web", 2));
    let kept = service_registration(&second, "web", 8081);
    upsert(
        &store,
        vec![service_registration(&first, "web", 8080), service_registration(&first, "admin", 9000), kept.clone()],
    );

    let applied = store
        .apply(Command::DeleteServiceRegistrationsOfAllocs { alloc_ids: vec![first.id, AllocId::from_u128(404)] })
        .expect("unknown allocations are passed over");
    let snapshot = store.snapshot();
    assert_eq!(ids(snapshot.service_registrations()), vec![kept.id]);
    assert_eq!(snapshot.table_indexes().services, applied.index);

    let nothing =
        store.apply(Command::DeleteServiceRegistrationsOfAllocs { alloc_ids: vec![first.id] }).expect("none left");
    assert_eq!(store.snapshot().table_indexes().services, applied.index, "nothing removed, the table index stays");
    assert!(nothing.index > applied.index);
}

#[test]
fn an_allocation_ended_on_its_client_loses_its_registrations_in_the_same_command() {
    let store = store();
    let (done, failed, other) = (running(&store, "web", 1), running(&store, "web", 1), running(&store, "api", 1));
    let kept = service_registration(&other, "api", 1);
    let batch = vec![service_registration(&done, "web", 2), service_registration(&failed, "web", 3), kept.clone()];
    let registered = upsert(&store, batch);

    store.apply(client_reports(&done, ClientStatus::Running)).expect("still running");
    assert_eq!(store.snapshot().table_indexes().services, registered.index, "a live report keeps them");

    let completed = store.apply(client_reports(&done, ClientStatus::Complete)).expect("complete");
    let snapshot = store.snapshot();
    assert_eq!(snapshot.service_registrations_by_alloc(done.id).count(), 0);
    assert_eq!(snapshot.table_indexes().services, completed.index, "removed by the report's own command");

    store.apply(client_reports(&failed, ClientStatus::Failed)).expect("failed");
    assert_eq!(ids(store.snapshot().service_registrations()), vec![kept.id]);
}

#[test]
fn a_plan_marking_an_allocation_lost_removes_its_registrations_and_a_stop_alone_does_not() {
    let store = store();
    let (lost, stopping) = (running(&store, "web", 1), running(&store, "web", 2));
    upsert(&store, vec![service_registration(&lost, "web", 1), service_registration(&stopping, "web", 2)]);

    let snapshot = store.snapshot();
    let mut marked_lost = Allocation::clone(snapshot.alloc(lost.id).expect("placed"));
    marked_lost.desired_status = DesiredStatus::Stop;
    marked_lost.client_status = ClientStatus::Lost;
    let mut stopped = Allocation::clone(snapshot.alloc(stopping.id).expect("placed"));
    stopped.desired_status = DesiredStatus::Stop;
    let plan = Command::ApplyPlanResults {
        deployment: None,
        deployment_updates: Vec::new(),
        eval_id: EvalId::from_u128(9),
        allocs: vec![marked_lost, stopped],
        evals: vec![],
        time: Timestamp(4),
    };
    store.apply(plan).expect("plan");
    let snapshot = store.snapshot();
    assert_eq!(snapshot.service_registrations_by_alloc(lost.id).count(), 0, "lost is a terminal client status");
    assert_eq!(
        snapshot.service_registrations_by_alloc(stopping.id).count(),
        1,
        "stopped but still running on its client: its client deregisters it (after shutdown_delay)"
    );

    store.apply(client_reports(&stopping, ClientStatus::Complete)).expect("stopped on the client");
    assert_eq!(store.snapshot().service_registration_count(), 0);
}

#[test]
fn a_node_marked_down_loses_its_registrations_and_a_disconnected_one_keeps_them() {
    let store = store();
    let mut tolerant = Job::new_simple("tolerant", JobType::Service, 1, Resources::new(100, 128, 0));
    tolerant.task_groups[0].max_client_disconnect = Some(Duration::from_secs(60));
    store.apply(Command::RegisterJob { job: tolerant, eval: None }).expect("job");
    let (on_1, on_2) = (running(&store, "web", 1), running(&store, "tolerant", 2));
    upsert(&store, vec![service_registration(&on_1, "web", 1), service_registration(&on_2, "tolerant", 2)]);

    let missed = store
        .apply(Command::MissHeartbeat {
            node_id: NodeId::from_u128(2),
            evals: vec![],
            time: Timestamp::ZERO,
            release_at: None,
        })
        .expect("missed");
    let snapshot = store.snapshot();
    assert_eq!(snapshot.node(NodeId::from_u128(2)).expect("node").status, NodeStatus::Disconnected);
    assert_eq!(snapshot.service_registrations_by_node(NodeId::from_u128(2)).count(), 1, "disconnected keeps them");
    assert!(snapshot.table_indexes().services < missed.index);

    let down = Command::UpdateNodeStatus {
        node_id: NodeId::from_u128(1),
        status: NodeStatus::Down,
        evals: vec![],
        time: Timestamp::ZERO,
    };
    let down = store.apply(down).expect("down");
    let snapshot = store.snapshot();
    assert_eq!(snapshot.service_registrations_by_node(NodeId::from_u128(1)).count(), 0, "down removes them");
    assert_eq!(snapshot.table_indexes().services, down.index, "in the same command");
    assert_eq!(snapshot.service_registration_count(), 1, "the other node's stay");

    let gone = store.apply(Command::MissHeartbeat {
        node_id: NodeId::from_u128(1),
        evals: vec![],
        time: Timestamp::ZERO,
        release_at: None,
    });
    assert!(gone.is_err(), "a down node misses no heartbeat");
}

#[test]
fn a_node_that_misses_its_heartbeat_without_tolerance_goes_down_and_loses_them() {
    let store = store();
    let alloc = running(&store, "web", 1);
    upsert(&store, vec![service_registration(&alloc, "web", 1)]);
    let missed = store
        .apply(Command::MissHeartbeat {
            node_id: NodeId::from_u128(1),
            evals: vec![],
            time: Timestamp::ZERO,
            release_at: None,
        })
        .expect("missed");
    let snapshot = store.snapshot();
    assert_eq!(snapshot.node(NodeId::from_u128(1)).expect("node").status, NodeStatus::Down);
    assert_eq!(snapshot.service_registration_count(), 0);
    assert_eq!(snapshot.table_indexes().services, missed.index);
}

#[test]
fn registrations_survive_a_snapshot_round_trip_and_the_log_format() {
    let store = store();
    let (web, api) = (running(&store, "web", 1), running(&store, "api", 2));
    let batch = vec![service_registration(&web, "web", 1), service_registration(&api, "db", 2)];
    let command = Command::UpsertServiceRegistrations { registrations: batch };
    assert_eq!(Command::decode(&command.encode()).expect("decodes"), command);
    for command in [
        Command::DeleteServiceRegistration { namespace: "default".into(), id: "x".into() },
        Command::DeleteServiceRegistrationsOfAllocs { alloc_ids: vec![web.id] },
    ] {
        assert_eq!(Command::decode(&command.encode()).expect("decodes"), command);
    }
    store.apply(command).expect("registered");

    let snapshot = store.snapshot();
    let mut bytes = Vec::new();
    snapshot.encode(&mut bytes).expect("encodes");
    let decoded = Snapshot::decode(&mut bytes.as_slice()).expect("decodes");
    assert_eq!(decoded.dump(), snapshot.dump());
    assert_eq!(decoded.dump().services.registrations.len(), 2);
    assert_eq!(decoded.table_indexes().services, snapshot.table_indexes().services);
    assert_eq!(decoded.service_registrations_by_name("default", "db", None).count(), 1);

    // The restored store goes on from there: the node going down empties it.
    let restored = StateStore::restored(decoded);
    let down = Command::UpdateNodeStatus {
        node_id: NodeId::from_u128(1),
        status: NodeStatus::Down,
        evals: vec![],
        time: Timestamp::ZERO,
    };
    restored.apply(down).expect("down");
    assert_eq!(ids(restored.snapshot().service_registrations_by_node(NodeId::from_u128(2))).len(), 1);
    assert_eq!(restored.snapshot().service_registration_count(), 1);
}

#[test]
fn a_client_report_replaces_its_allocations_registrations() {
    let store = store();
    let (web, api) = (running(&store, "web", 1), running(&store, "api", 1));
    let (http, admin) = (service_registration(&web, "web", 8080), service_registration(&web, "web-admin", 9090));
    let report = |services: Option<Vec<ServiceRegistration>>, status| {
        let Command::UpdateAllocsFromClient { mut updates, evals, time } = client_reports(&web, status) else {
            unreachable!("client_reports makes a client update")
        };
        updates[0].services = services;
        Command::UpdateAllocsFromClient { updates, evals, time }
    };
    store.apply(report(Some(vec![http.clone(), admin.clone()]), ClientStatus::Running)).expect("report");
    let snapshot = store.snapshot();
    assert_eq!(
        sorted(ids(snapshot.service_registrations_by_alloc(web.id))),
        sorted(vec![http.id.clone(), admin.id.clone()])
    );
    let index = snapshot.table_indexes().services;

    // The same list again changes nothing; `None` leaves them as they are.
    store.apply(report(Some(vec![http.clone(), admin.clone()]), ClientStatus::Running)).expect("report");
    store.apply(report(None, ClientStatus::Running)).expect("report");
    let snapshot = store.snapshot();
    assert_eq!(snapshot.table_indexes().services, index, "nothing changed");
    assert_eq!(snapshot.service_registrations_by_alloc(web.id).count(), 2);

    // A shorter list drops what it no longer names; another allocation's
    // registration in it is refused, never stored under this one.
    let stray = service_registration(&api, "db", 5432);
    let applied = store.apply(report(Some(vec![http.clone(), stray.clone()]), ClientStatus::Running)).expect("report");
    let snapshot = store.snapshot();
    assert_eq!(ids(snapshot.service_registrations_by_alloc(web.id)), vec![http.id.clone()]);
    assert!(snapshot.service_registration(&stray.id).is_none());
    assert_eq!(applied.refused_registrations.len(), 1, "{:?}", applied.refused_registrations);

    // The servers stop it: while its client still runs it, a report
    // without the registration removes it (its task is being killed), and
    // none is added any more.
    let mut stopped = Allocation::clone(store.snapshot().alloc(web.id).expect("placed"));
    stopped.desired_status = DesiredStatus::Stop;
    let plan = Command::ApplyPlanResults {
        deployment: None,
        deployment_updates: Vec::new(),
        eval_id: EvalId::from_u128(9),
        allocs: vec![stopped],
        evals: vec![],
        time: Timestamp(4),
    };
    store.apply(plan).expect("stopped");
    assert_eq!(store.snapshot().service_registrations_by_alloc(web.id).count(), 1, "a stop alone keeps it");
    store.apply(report(Some(vec![]), ClientStatus::Running)).expect("report");
    assert_eq!(store.snapshot().service_registrations_by_alloc(web.id).count(), 0, "deregistered before the kill");
    let applied = store.apply(report(Some(vec![http.clone()]), ClientStatus::Running)).expect("report");
    assert_eq!(store.snapshot().service_registrations_by_alloc(web.id).count(), 0, "no addition once stopped");
    assert_eq!(applied.refused_registrations.len(), 1);

    // The allocation ends: its registrations go, whatever the report lists.
    store.apply(report(Some(vec![http.clone()]), ClientStatus::Complete)).expect("report");
    assert_eq!(store.snapshot().service_registrations_by_alloc(web.id).count(), 0);
}

#[test]
fn a_client_report_replaces_the_check_results_and_stores_a_health_verdict_once() {
    use crate::structs::{AllocHealth, CheckMode, CheckResult, CheckResultStatus};
    let store = store();
    let web = running(&store, "web", 1);
    let result = |status| CheckResult {
        id: "c1".into(),
        check: "alive".into(),
        group: "web.group".into(),
        task: "task".into(),
        service: "web".into(),
        mode: CheckMode::Healthiness,
        status,
        output: String::new(),
        status_code: 0,
        timestamp: Timestamp(5),
    };
    let report = |checks: Option<Vec<CheckResult>>, healthy: Option<bool>| {
        let Command::UpdateAllocsFromClient { mut updates, evals, time } = client_reports(&web, ClientStatus::Running)
        else {
            unreachable!("client_reports makes a client update")
        };
        updates[0].checks = checks.map(|checks| checks.into_iter().map(|check| (check.id.clone(), check)).collect());
        updates[0].health = healthy.map(|healthy| AllocHealth { healthy, timestamp: Timestamp(6), modify_index: 0 });
        Command::UpdateAllocsFromClient { updates, evals, time }
    };
    store.apply(report(Some(vec![result(CheckResultStatus::Pending)]), None)).expect("report");
    let first = store.apply(report(Some(vec![result(CheckResultStatus::Success)]), Some(true))).expect("report");
    let stored = store.snapshot().alloc(web.id).expect("alloc").clone();
    assert_eq!(stored.checks["c1"].status, CheckResultStatus::Success, "replaced");
    let health = stored.health.clone().expect("the verdict");
    assert!(health.healthy);
    assert_eq!(health.modify_index, first.index, "the store's index");
    store.apply(report(None, Some(true))).expect("the same verdict again");
    let again = store.snapshot().alloc(web.id).expect("alloc").clone();
    assert_eq!(again.health, Some(health), "a repeated verdict keeps its index");
    assert_eq!(again.checks.len(), 1, "no checks in the report leaves them");
    store.apply(report(Some(vec![]), None)).expect("its service deregistered");
    assert!(store.snapshot().alloc(web.id).expect("alloc").checks.is_empty());
}
