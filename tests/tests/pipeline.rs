//! The scheduling pipeline in one process: convergence, conflicts (of
//! resources and of ports), index waits, pause/resume, resizing and shutdown. Waits are on the state
//! store's index notifications or on worker status, never on timers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::clock::{SystemClock, Timestamp};
use engine::server::{Server, ServerConfig};
use engine::state::{Command, Snapshot};
use engine::structs::{
    EvalStatus, Evaluation, Job, JobType, NetworkResource, Node, NodeId, Port, Resources, TriggerReason,
};
use engine::worker::WorkerStatus;

const PATIENCE: Duration = Duration::from_secs(120);

fn server(workers: usize, configure: impl FnOnce(&mut ServerConfig)) -> Server {
    let mut config = ServerConfig { workers, ..ServerConfig::default() };
    config.broker.initial_nack_delay = Duration::ZERO;
    config.broker.subsequent_nack_delay = Duration::ZERO;
    configure(&mut config);
    Server::start(config, SystemClock::shared())
}

fn add_nodes(server: &Server, n: usize, size: Resources) {
    for i in 0..n {
        let node = Node::new_ready(
            NodeId::from_u128(i as u128 + 1),
            &format!("dc{}", i % 2 + 1),
            &format!("c{}", i % 5),
            size,
        );
        server.nodes().register(node).expect("node registers");
    }
}

fn job(id: &str, job_type: JobType, count: u32, cpu: u64) -> Job {
    let mut job = Job::new_simple(id, job_type, count, Resources::new(cpu, 64, 0));
    job.datacenters = vec!["dc1".into(), "dc2".into()];
    job
}

/// Waits, on index notifications, until `done` holds for the newest snapshot.
fn wait_for(server: &Server, what: &str, done: impl Fn(&Snapshot) -> bool) -> Arc<Snapshot> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        // Idle first, then the snapshot: a worker writes its eval before it
        // acks, so a snapshot taken after an idle broker holds every write.
        let idle = server.is_idle();
        let snapshot = server.store().snapshot();
        if idle && done(&snapshot) {
            return snapshot;
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        assert!(!remaining.is_zero(), "timed out waiting for {what}: {:?}", server.stats());
        let _ = server.store().snapshot_min_index(snapshot.index() + 1, remaining.min(Duration::from_millis(200)));
    }
}

fn live(snapshot: &Snapshot, job: &Job) -> usize {
    snapshot.allocs_by_job(&job.key()).filter(|alloc| !alloc.terminal()).count()
}

fn assert_not_oversubscribed(snapshot: &Snapshot) {
    let oversubscribed = snapshot.oversubscribed_nodes();
    assert!(oversubscribed.is_empty(), "(node, used, allocatable): {oversubscribed:?}");
}

#[test]
fn jobs_converge_to_their_counts_on_1000_nodes() {
    let server = server(2, |_| {});
    add_nodes(&server, 1000, Resources::new(4000, 8192, 10_000));
    let mut jobs: Vec<Job> = (0..20).map(|j| job(&format!("svc-{j}"), JobType::Service, 50, 100)).collect();
    jobs.extend((0..5).map(|j| job(&format!("batch-{j}"), JobType::Batch, 40, 100)));
    jobs.push(job("agent", JobType::System, 1, 10));
    for job in &jobs {
        server.jobs().register(job.clone()).expect("job registers");
    }
    let snapshot = wait_for(&server, "convergence", |snapshot| {
        jobs.iter().all(|job| {
            live(snapshot, job)
                == if job.job_type == JobType::System { 1000 } else { job.task_groups[0].count as usize }
        })
    });
    assert_not_oversubscribed(&snapshot);
    let unfinished: Vec<_> = snapshot
        .evals()
        .filter(|eval| eval.status != EvalStatus::Complete)
        .map(|eval| (eval.job_id.to_string(), eval.status, eval.triggered_by, eval.status_description.clone()))
        .collect();
    assert!(unfinished.is_empty(), "every eval finished: {unfinished:?} {:?}", server.stats());
    let summary = server.jobs().summary(&jobs[0].key()).expect("summary");
    assert_eq!(summary["group"].starting, 50);
    server.shutdown();
}

#[test]
fn on_a_tight_cluster_conflicting_plans_are_refused_retried_and_never_oversubscribe() {
    // 8 workers without node claims, on nodes that each fit exactly one allocation.
    let server = server(8, |config| config.worker.node_claims = false);
    add_nodes(&server, 40, Resources::new(100, 1000, 1000));
    let mut jobs = Vec::new();
    for round in 0..5 {
        server.workers().pause(None);
        for j in 0..8 {
            let job = job(&format!("tight-{round}-{j}"), JobType::Service, 1, 100);
            server.jobs().register(job.clone()).expect("job registers");
            jobs.push(job);
        }
        // Released together, the workers plan against the same state and collide.
        server.workers().resume(None);
        let snapshot =
            wait_for(&server, "the round to settle", |snapshot| jobs.iter().all(|job| live(snapshot, job) == 1));
        assert_not_oversubscribed(&snapshot);
        if server.stats().plan_applier.plans_partially_refused > 0 {
            break;
        }
    }
    let stats = server.stats();
    assert!(stats.plan_applier.plans_partially_refused > 0, "plans conflicted: {stats:?}");
    assert!(stats.workers.plans_submitted > stats.workers.evals_processed, "refused plans were re-planned");
    server.shutdown();
}

#[test]
fn concurrent_plans_on_a_tight_cluster_never_give_a_port_twice() {
    // 8 workers without node claims; 18 nodes with 8 dynamic ports each. A
    // round's 8 jobs of 4 allocations share two static ports (16 holders
    // each) and take one dynamic port each, so workers released together
    // pick the same nodes and ports and the plan applier must refuse.
    let server = server(8, |config| config.worker.node_claims = false);
    for i in 0..18 {
        let mut node = Node::new_ready(NodeId::from_u128(i + 1), "dc1", "c", Resources::new(4000, 8192, 10_000));
        node.network.min_dynamic_port = 20_000;
        node.network.max_dynamic_port = 20_007;
        server.nodes().register(node).expect("node registers");
    }
    let mut jobs = Vec::new();
    for round in 0..3u16 {
        server.workers().pause(None);
        for j in 0..8u16 {
            let mut job = job(&format!("ports-{round}-{j}"), JobType::Service, 4, 100);
            job.datacenters = vec!["dc1".into()];
            job.task_groups[0].networks = vec![NetworkResource {
                reserved_ports: vec![Port::new("static", 8000 + 2 * round + j % 2)],
                dynamic_ports: vec![Port::new("dynamic", 0)],
            }];
            server.jobs().register(job.clone()).expect("job registers");
            jobs.push(job);
        }
        server.workers().resume(None);
        let snapshot =
            wait_for(&server, "the round to place", |snapshot| jobs.iter().all(|job| live(snapshot, job) == 4));
        assert_not_oversubscribed(&snapshot);
        let collisions = snapshot.port_collisions();
        assert!(collisions.is_empty(), "ports held twice: {collisions:?}");
        if server.stats().plan_applier.plans_partially_refused > 0 {
            break;
        }
    }
    let stats = server.stats();
    assert!(stats.plan_applier.plans_partially_refused > 0, "plans conflicted: {stats:?}");
    server.shutdown();
}

#[test]
fn a_worker_that_cannot_reach_the_index_nacks_backs_off_and_proceeds_once_it_catches_up() {
    let server = server(1, |config| {
        config.worker.sync_limit = Duration::from_millis(20);
        config.worker.long_backoff = Duration::from_secs(600);
    });
    add_nodes(&server, 5, Resources::new(4000, 8192, 10_000));
    let spec = job("ahead", JobType::Service, 1, 100);
    server.writer().write(Command::RegisterJob { job: spec.clone(), eval: None }).expect("job stored without an eval");
    // An eval from the future, handed to the broker: its index is three
    // writes ahead of the store.
    let mut eval = Evaluation::for_job(&spec, TriggerReason::JobRegister, Timestamp(0));
    eval.modify_index = server.store().latest_index() + 3;
    server.broker().enqueue(Arc::new(eval.clone()));

    while server.workers().stats().index_timeouts == 0 {
        std::thread::yield_now();
    }
    assert!(server.workers().stats().evals_nacked >= 1, "the eval was nacked");
    assert_eq!(live(&server.store().snapshot(), &spec), 0, "nothing was scheduled for it");
    // Three writes, the last storing the eval itself (a worker schedules
    // only an eval the state holds): the worker's long backoff ends as soon
    // as the index is reached.
    for n in 0..2 {
        server
            .nodes()
            .register(Node::new_ready(NodeId::from_u128(100 + n), "dc1", "late", Resources::new(4000, 8192, 0)))
            .expect("node");
    }
    let stored = server.writer().write(Command::UpsertEvals { evals: vec![eval.clone()] }).expect("the eval stored");
    assert_eq!(stored.index, eval.modify_index, "the eval's own write is the third");
    let snapshot = wait_for(&server, "the eval to run", |snapshot| live(snapshot, &spec) == 1);
    assert_eq!(snapshot.eval(eval.id).expect("stored").status, EvalStatus::Complete);
    server.shutdown();
}

fn wait_for_status(server: &Server, wanted: WorkerStatus) {
    while !server.workers().workers().iter().all(|worker| worker.status == wanted) {
        std::thread::yield_now();
    }
}

#[test]
fn paused_workers_take_nothing_and_resuming_continues() {
    let server = server(2, |_| {});
    add_nodes(&server, 10, Resources::new(4000, 8192, 10_000));
    server.workers().pause(None);
    wait_for_status(&server, WorkerStatus::Paused);
    let spec = job("waits", JobType::Service, 3, 100);
    server.jobs().register(spec.clone()).expect("job registers");
    let stats = server.stats().broker;
    assert_eq!((stats.total_ready, stats.total_unacked), (1, 0), "the eval waits in the broker");
    assert_eq!(live(&server.store().snapshot(), &spec), 0);
    server.workers().resume(None);
    wait_for(&server, "the job to place", |snapshot| live(snapshot, &spec) == 3);
    server.shutdown();
}

#[test]
fn the_pool_resizes_and_retargets_at_run_time() {
    let server = server(1, |_| {});
    add_nodes(&server, 10, Resources::new(4000, 8192, 10_000));
    server.workers().resize(4);
    assert_eq!(server.workers().workers().len(), 4);
    wait_for_status(&server, WorkerStatus::Started);
    server.workers().resize(2);
    assert_eq!(server.workers().workers().len(), 2);
    server.workers().set_types(vec![JobType::Batch]);
    assert!(server.workers().workers().iter().all(|worker| worker.types == [JobType::Batch]));
    let service = job("svc", JobType::Service, 2, 100);
    let batch = job("batch", JobType::Batch, 2, 100);
    server.jobs().register(service.clone()).expect("service");
    server.jobs().register(batch.clone()).expect("batch");
    while live(&server.store().snapshot(), &batch) < 2 {
        server.store().snapshot_min_index(server.store().latest_index() + 1, Duration::from_millis(200)).ok();
    }
    assert_eq!(live(&server.store().snapshot(), &service), 0, "no worker serves service evals");
    assert_eq!(server.stats().broker.total_ready, 1, "the service eval waits");
    server.workers().set_types(JobType::ALL.to_vec());
    wait_for(&server, "the service job", |snapshot| live(snapshot, &service) == 2);
    server.shutdown();
}

#[test]
fn shutdown_under_load_leaves_nothing_held_and_loses_nothing() {
    let server = server(2, |_| {});
    add_nodes(&server, 200, Resources::new(4000, 8192, 10_000));
    let jobs: Vec<Job> = (0..100).map(|j| job(&format!("load-{j}"), JobType::Service, 20, 50)).collect();
    for job in &jobs {
        server.jobs().register(job.clone()).expect("job registers");
    }
    server.shutdown();
    let stats = server.stats();
    assert_eq!(stats.broker.total_unacked, 0, "no eval is left held");
    assert!(server.workers().workers().is_empty(), "every worker stopped");
    let snapshot = server.store().snapshot();
    assert_not_oversubscribed(&snapshot);
    for job in &jobs {
        let evals: Vec<_> = snapshot.evals_by_job(&job.key()).collect();
        assert!(!evals.is_empty(), "{} kept its eval", job.id);
        let placed = live(&snapshot, job);
        let finished = evals.iter().any(|eval| eval.status == EvalStatus::Complete);
        assert!(
            finished || evals.iter().any(|eval| eval.status == EvalStatus::Pending),
            "{}: an eval is still there to run",
            job.id
        );
        assert!(placed == 0 || placed == 20, "{} was placed whole or not at all: {placed}", job.id);
    }
    assert!(
        server.store().apply(Command::UpsertEvals { evals: vec![] }).is_err(),
        "the store refuses writes after shutdown"
    );
}
