//! The job and node endpoints on a running server: bad input is refused and
//! changes nothing, blocking queries wake on change, blocked evals are
//! unblocked by new capacity.

use std::time::{Duration, Instant};

use engine::clock::SystemClock;
use engine::job_endpoint::JobError;
use engine::node::endpoint::NodeError;
use engine::server::{Server, ServerConfig};
use engine::state::{ClientAllocUpdate, Snapshot};
use engine::structs::{ClientStatus, EvalStatus, Job, JobType, Node, NodeId, NodeStatus, Resources};

fn server() -> Server {
    Server::start(ServerConfig { workers: 1, ..ServerConfig::default() }, SystemClock::shared())
}

fn node(n: u128, cpu: u64) -> Node {
    Node::new_ready(NodeId::from_u128(n), "dc1", "c", Resources::new(cpu, 8192, 10_000))
}

/// Waits on index notifications until the server is idle and `done` holds.
fn settle(server: &Server, done: impl Fn(&Snapshot) -> bool) -> std::sync::Arc<Snapshot> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let idle = server.is_idle();
        let snapshot = server.store().snapshot();
        if idle && done(&snapshot) {
            return snapshot;
        }
        assert!(Instant::now() < deadline, "did not settle: {:?}", server.stats());
        let _ = server.store().snapshot_min_index(snapshot.index() + 1, Duration::from_millis(200));
    }
}

fn live(snapshot: &Snapshot, job: &Job) -> usize {
    snapshot.allocs_by_job(&job.key()).filter(|alloc| !alloc.terminal()).count()
}

#[test]
fn an_invalid_job_is_refused_and_nothing_is_written() {
    let server = server();
    let mut job = Job::new_simple("bad", JobType::Service, 1, Resources::new(0, 64, 0));
    job.priority = 0;
    let before = server.store().latest_index();
    let error = server.jobs().register(job.clone()).expect_err("invalid");
    assert!(matches!(error, JobError::Invalid(_)));
    assert!(error.to_string().contains("priority 0"), "{error}");
    assert_eq!(server.store().latest_index(), before, "nothing written");
    assert!(server.jobs().job(&job.key()).is_err());
    let unknown = server.jobs().scale(&job.key(), "group", 3).expect_err("unknown job");
    assert!(matches!(unknown, JobError::UnknownJob(_)));

    // A job's type is fixed: its pending evals and allocations belong to one scheduler.
    let service = Job::new_simple("typed", JobType::Service, 1, Resources::new(10, 64, 0));
    server.jobs().register(service.clone()).expect("service");
    // The store's index may move meanwhile (a worker writes the service's
    // eval): the job itself must not.
    let before = server.jobs().job(&service.key()).expect("stored");
    let as_system = Job { job_type: JobType::System, ..service.clone() };
    let error = server.jobs().register(as_system).expect_err("type change");
    assert!(matches!(error, JobError::TypeChange { .. }), "{error}");
    assert!(error.to_string().contains("purge it first"), "{error}");
    let after = server.jobs().job(&service.key()).expect("stored");
    assert_eq!((after.job_type, after.modify_index), (JobType::Service, before.modify_index), "nothing written");
}

#[test]
fn scale_and_deregister_act_through_their_evals() {
    let server = server();
    server.nodes().register(node(1, 4000)).expect("node");
    let job = Job::new_simple("web", JobType::Service, 2, Resources::new(100, 64, 0));
    server.jobs().register(job.clone()).expect("job");
    settle(&server, |snapshot| live(snapshot, &job) == 2);
    let error = server.jobs().scale(&job.key(), "nope", 3).expect_err("no such group");
    assert!(error.to_string().contains("no task group \"nope\""), "{error}");
    server.jobs().scale(&job.key(), "group", 4).expect("scaled");
    settle(&server, |snapshot| live(snapshot, &job) == 4);
    assert_eq!(server.jobs().summary(&job.key()).expect("summary")["group"].starting, 4);
    server.jobs().deregister(&job.key(), false).expect("stopped");
    let snapshot = settle(&server, |snapshot| live(snapshot, &job) == 0);
    assert!(snapshot.job(&job.key()).expect("kept").stop);
    server.shutdown();
}

#[test]
fn an_allocation_stopped_by_an_operator_is_replaced_through_its_eval() {
    let server = server();
    server.nodes().register(node(1, 4000)).expect("node");
    let job = Job::new_simple("web", JobType::Service, 1, Resources::new(100, 64, 0));
    server.jobs().register(job.clone()).expect("job");
    let snapshot = settle(&server, |snapshot| live(snapshot, &job) == 1);
    let first = snapshot.allocs_by_job(&job.key()).next().expect("placed").id;

    let before = server.store().latest_index();
    let unknown = server.jobs().stop_alloc(engine::structs::AllocId::from_u128(404)).expect_err("unknown");
    assert!(matches!(unknown, JobError::UnknownAlloc(_)), "{unknown}");
    assert_eq!(server.store().latest_index(), before, "nothing written");

    let (eval_id, index) = server.jobs().stop_alloc(first).expect("stopped");
    let snapshot = settle(&server, |snapshot| {
        snapshot.eval(eval_id).is_some_and(|eval| eval.status == EvalStatus::Complete) && live(snapshot, &job) == 1
    });
    assert!(index > before);
    let stopped = snapshot.alloc(first).expect("kept");
    assert_eq!(stopped.desired_status, engine::structs::DesiredStatus::Stop);
    let replacement = snapshot.allocs_by_job(&job.key()).find(|alloc| !alloc.terminal()).expect("a replacement");
    assert_ne!(replacement.id, first);
    server.shutdown();
}

#[test]
fn a_blocked_eval_is_unblocked_by_new_capacity() {
    let server = server();
    server.nodes().register(node(1, 1000)).expect("node");
    let job = Job::new_simple("big", JobType::Service, 2, Resources::new(800, 64, 0));
    server.jobs().register(job.clone()).expect("job");
    let snapshot = settle(&server, |snapshot| live(snapshot, &job) == 1 && server.blocked().stats().total_blocked == 1);
    assert!(snapshot.evals_by_job(&job.key()).any(|eval| eval.status == EvalStatus::Blocked));
    server.nodes().register(node(2, 1000)).expect("capacity arrives");
    settle(&server, |snapshot| live(snapshot, &job) == 2);
    assert_eq!(server.blocked().stats().total_blocked, 0);
    server.shutdown();
}

#[test]
fn a_driver_that_becomes_healthy_on_a_node_brings_its_system_jobs() {
    let server = server();
    let mut bare = node(1, 1000);
    bare.attributes.insert("driver.docker".into(), "0".into());
    server.nodes().register(bare.clone()).expect("node");
    let mut system = Job::new_simple("agentd", JobType::System, 1, Resources::new(100, 64, 0));
    system.task_groups[0].tasks[0].driver = "docker".into();
    system.task_groups[0].tasks[0].config.insert("image".into(), "agentd:1".into());
    server.jobs().register(system.clone()).expect("job");
    settle(&server, |snapshot| snapshot.evals_by_job(&system.key()).all(|eval| eval.status.is_terminal()));
    assert_eq!(live(&server.store().snapshot(), &system), 0, "docker is unhealthy there");
    // The agent registers the node again with the driver healthy: a new
    // class, and the node's evals with it.
    let mut healthy = bare;
    healthy.attributes.insert("driver.docker".into(), "1".into());
    server.nodes().register(healthy).expect("re-registered");
    settle(&server, |snapshot| live(snapshot, &system) == 1);
    server.shutdown();
}

#[test]
fn the_allocs_query_blocks_until_the_node_has_news() {
    let server = server();
    server.nodes().register(node(1, 4000)).expect("node");
    let (allocs, index) = server.nodes().allocs(NodeId::from_u128(1), 0, Duration::ZERO).expect("first read");
    assert!(allocs.is_empty());
    let job = Job::new_simple("web", JobType::Service, 1, Resources::new(100, 64, 0));
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| server.nodes().allocs(NodeId::from_u128(1), index, Duration::from_secs(60)));
        server.jobs().register(job.clone()).expect("job");
        let (allocs, newer) = waiter.join().expect("waiter").expect("woken by the placement");
        assert_eq!(allocs.len(), 1);
        assert!(newer > index);
    });
    // No news until the deadline: the answer is the allocations as they are,
    // at the index they are current at, as a Nomad blocking query answers.
    let latest = server.store().latest_index();
    let (unchanged, at) =
        server.nodes().allocs(NodeId::from_u128(1), latest, Duration::from_millis(1)).expect("answered");
    assert_eq!(unchanged.len(), 1);
    assert!(at >= latest && unchanged[0].modify_index <= latest, "nothing of the node changed");
    assert!(matches!(server.nodes().allocs(NodeId::from_u128(9), 0, Duration::ZERO), Err(NodeError::UnknownNode(_))));
    server.shutdown();
}

#[test]
fn alloc_updates_from_a_down_node_are_refused_and_change_nothing() {
    let server = server();
    server.nodes().register(node(1, 4000)).expect("node");
    let job = Job::new_simple("web", JobType::Service, 1, Resources::new(100, 64, 0));
    server.jobs().register(job.clone()).expect("job");
    let snapshot = settle(&server, |snapshot| live(snapshot, &job) == 1);
    let alloc = snapshot.allocs_by_job(&job.key()).next().expect("placed").clone();
    let update = |status| ClientAllocUpdate {
        alloc_id: alloc.id,
        node_id: alloc.node_id,
        client_status: status,
        client_description: String::new(),
        services: None,
        checks: None,
        health: None,
        task_states: Default::default(),
    };
    server.nodes().update_allocs(alloc.node_id, vec![update(ClientStatus::Running)]).expect("running");
    server.nodes().update_status(alloc.node_id, NodeStatus::Down).expect("down");
    let before = server.store().snapshot().alloc(alloc.id).expect("stored").clone();
    let error = server.nodes().update_allocs(alloc.node_id, vec![update(ClientStatus::Complete)]).expect_err("refused");
    assert!(matches!(error, NodeError::NotConnected { status: NodeStatus::Down, .. }), "{error}");
    let after = server.store().snapshot().alloc(alloc.id).expect("stored").clone();
    assert_eq!(after.client_status, before.client_status, "nothing changed");
    assert!(matches!(
        server.nodes().update_status(NodeId::from_u128(9), NodeStatus::Ready),
        Err(NodeError::UnknownNode(_))
    ));
    server.shutdown();
}
