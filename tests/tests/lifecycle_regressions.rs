//! Regressions found in acceptance testing, each on the stepped server and
//! on the threaded [`Server`]:
//! 1. an `unknown` allocation whose node is back (`initializing`) but whose
//!    client has not confirmed it is ignored by the reconciler: it neither
//!    holds its slot against the running replacement nor is rolled over;
//!    only the client's report settles the reconnect;
//! 2. a failed allocation is rescheduled at its delay even when the eval
//!    created by the failure report runs late;
//! 3. an alloc update that names no allocation is refused at once.

use std::time::Duration;

use engine::node::endpoint::NodeError;
use engine::structs::{
    AllocId, Allocation, ClientStatus, DelayFunction, DesiredStatus, Job, JobType, NodeId, NodeStatus,
    ReschedulePolicy, Resources,
};
use tests::{live_allocs, running_allocs, Cluster};

const WINDOW: Duration = Duration::from_secs(600);
const RESCHEDULE_DELAY: Duration = Duration::from_secs(30);

/// Service `web`, count 1, tolerating a 10-minute disconnect.
fn web() -> Job {
    let mut job = Job::new_simple("web", JobType::Service, 1, Resources::new(1_000, 256, 0));
    job.task_groups[0].max_client_disconnect = Some(WINDOW);
    job
}

/// `web` with a changed task: a destructive update.
fn web_v2() -> Job {
    let mut job = web();
    job.task_groups[0].tasks[0].config.insert("image".into(), "web:2".into());
    job
}

/// A service rescheduled after a constant delay, without limit.
fn flaky() -> Job {
    let mut job = Job::new_simple("flaky", JobType::Service, 1, Resources::new(1_000, 256, 0));
    job.task_groups[0].reschedule_policy = Some(ReschedulePolicy {
        attempts: 0,
        interval: Duration::ZERO,
        delay: RESCHEDULE_DELAY,
        delay_function: DelayFunction::Constant,
        max_delay: Duration::ZERO,
        unlimited: true,
    });
    job
}

fn history(alloc: &Allocation) -> Vec<ClientStatus> {
    alloc.alloc_states.iter().map(|state| state.client_status).collect()
}

mod stepped {
    use super::*;

    /// `web` runs on A; A misses its heartbeat; the replacement R runs on B
    /// (which has room). Returns the cluster, A, B, the original and R.
    fn replaced_while_away(seed: u64) -> (Cluster, NodeId, NodeId, AllocId, AllocId) {
        let mut cluster = Cluster::new(seed);
        let node_a = cluster.add_node(1, 4_000);
        cluster.register_job(&web());
        let node_b = cluster.add_node(2, 4_000);
        cluster.report(node_a).expect("web runs on A");
        let original = live_allocs(&cluster.snapshot(), &web())[0].id;
        cluster.miss_heartbeat(node_a, &[node_b]);
        cluster.settle();
        assert_eq!(cluster.snapshot().node(node_a).expect("a").status, NodeStatus::Disconnected);
        let replacement = live_allocs(&cluster.snapshot(), &web())
            .into_iter()
            .find(|alloc| alloc.id != original)
            .expect("a replacement is placed on B");
        assert_eq!(replacement.node_id, node_b);
        assert_eq!(replacement.previous_allocation, Some(original));
        cluster.report(node_b).expect("the replacement runs");
        (cluster, node_a, node_b, original, replacement.id)
    }

    /// A heartbeats back; the evals that creates run before it reports.
    fn back_but_unconfirmed(cluster: &mut Cluster, node_a: NodeId, node_b: NodeId) {
        let response = cluster.heartbeat(node_a).expect("heartbeat");
        assert_eq!(response.status, NodeStatus::Initializing);
        cluster.heartbeat(node_b).expect("heartbeat");
        assert!(cluster.settle() > 0, "the heartbeat's node evals ran");
    }

    #[test]
    fn an_unconfirmed_original_leaves_its_running_replacement_alone() {
        let (mut cluster, node_a, node_b, original, replacement) = replaced_while_away(11);
        back_but_unconfirmed(&mut cluster, node_a, node_b);
        let snapshot = cluster.snapshot();
        let r = snapshot.alloc(replacement).expect("replacement");
        assert_eq!(r.desired_status, DesiredStatus::Run, "the replacement is not stopped for an unconfirmed original");
        assert_eq!(r.client_status, ClientStatus::Running);
        let o = snapshot.alloc(original).expect("original");
        assert_eq!((o.desired_status, o.client_status), (DesiredStatus::Run, ClientStatus::Unknown), "not rolled over");
        assert_eq!(snapshot.allocs_by_job(&web().key()).count(), 2, "nothing else was placed");

        // The client confirms the original: now the reconnect is decided.
        cluster.report(node_a).expect("resync");
        cluster.heartbeat(node_a).expect("heartbeat");
        cluster.settle();
        let snapshot = cluster.snapshot();
        let o = snapshot.alloc(original).expect("original");
        assert_eq!((o.desired_status, o.client_status), (DesiredStatus::Run, ClientStatus::Running));
        assert_eq!(history(o), [ClientStatus::Unknown, ClientStatus::Running]);
        assert_eq!(snapshot.alloc(replacement).expect("replacement").desired_status, DesiredStatus::Stop);
        assert_eq!(running_allocs(&snapshot, &web()).iter().map(|alloc| alloc.id).collect::<Vec<_>>(), [original]);
        assert_eq!(snapshot.allocs_by_job(&web().key()).count(), 2);
    }

    #[test]
    fn an_original_reported_failed_on_return_leaves_the_replacement_running() {
        let (mut cluster, node_a, node_b, original, replacement) = replaced_while_away(12);
        back_but_unconfirmed(&mut cluster, node_a, node_b);
        let failed = cluster.snapshot().alloc(original).expect("original").clone();
        cluster.report_one(&failed, ClientStatus::Failed).expect("the client reports it failed");
        cluster.heartbeat(node_a).expect("heartbeat");
        cluster.pass_time(Duration::from_secs(5), &[node_a, node_b]);
        let snapshot = cluster.snapshot();
        assert_eq!(snapshot.alloc(original).expect("original").client_status, ClientStatus::Failed);
        let r = snapshot.alloc(replacement).expect("replacement");
        assert_eq!((r.desired_status, r.client_status), (DesiredStatus::Run, ClientStatus::Running));
        assert_eq!(snapshot.allocs_by_job(&web().key()).count(), 2, "nothing new was placed");
    }

    #[test]
    fn a_job_updated_while_away_keeps_its_new_version_running() {
        let (mut cluster, node_a, node_b, original, replacement) = replaced_while_away(13);
        cluster.register_job(&web_v2());
        let snapshot = cluster.snapshot();
        assert_eq!(snapshot.alloc(replacement).expect("replacement").desired_status, DesiredStatus::Stop);
        let current = live_allocs(&snapshot, &web())
            .into_iter()
            .find(|alloc| alloc.id != original)
            .expect("the new version is placed");
        assert_eq!(current.job.version, 1);
        cluster.report(node_b).expect("the new version runs");
        let placed_before = snapshot.allocs_by_job(&web().key()).count();

        back_but_unconfirmed(&mut cluster, node_a, node_b);
        let snapshot = cluster.snapshot();
        let kept = snapshot.alloc(current.id).expect("new version");
        assert_eq!((kept.desired_status, kept.client_status), (DesiredStatus::Run, ClientStatus::Running));
        assert_eq!(snapshot.allocs_by_job(&web().key()).count(), placed_before, "nothing else was placed");

        // Confirmed, the original runs an older version: it is the one stopped.
        cluster.report(node_a).expect("resync");
        cluster.heartbeat(node_a).expect("heartbeat");
        cluster.settle();
        let snapshot = cluster.snapshot();
        assert_eq!(snapshot.alloc(original).expect("original").desired_status, DesiredStatus::Stop);
        assert_eq!(running_allocs(&snapshot, &web()).iter().map(|alloc| alloc.id).collect::<Vec<_>>(), [current.id]);
        assert_eq!(snapshot.allocs_by_job(&web().key()).count(), placed_before);
    }

    #[test]
    fn a_failed_allocation_whose_eval_runs_late_is_rescheduled_at_its_delay() {
        let mut cluster = Cluster::new(14);
        let (node_a, node_b) = (cluster.add_node(1, 4_000), cluster.add_node(2, 4_000));
        cluster.register_job(&flaky());
        let first = live_allocs(&cluster.snapshot(), &flaky())[0].clone();
        cluster.report(first.node_id).expect("runs");
        let failed_at = cluster.server.now();
        cluster.report_one(&first, ClientStatus::Failed).expect("fails");

        // The failure's eval runs three seconds late.
        cluster.pass_time_without_evals(Duration::from_secs(3), &[node_a, node_b]);
        cluster.settle();
        assert!(cluster.snapshot().alloc(first.id).expect("alloc").next_allocation.is_none(), "not yet due");

        let due = failed_at.plus(RESCHEDULE_DELAY);
        cluster.pass_time(due.since(cluster.server.now()), &[node_a, node_b]);
        let snapshot = cluster.snapshot();
        let next = snapshot.alloc(first.id).expect("alloc").next_allocation.expect("rescheduled at its delay");
        let replacement = snapshot.alloc(next).expect("replacement");
        assert_eq!(replacement.create_time, due, "placed when the delay ran out");
        assert_eq!(replacement.reschedule_events.len(), 1);
        assert_eq!(replacement.reschedule_events[0].delay_nanos, RESCHEDULE_DELAY.as_nanos() as u64);
        assert_eq!(live_allocs(&snapshot, &flaky()).len(), 1);
    }

    #[test]
    fn an_empty_alloc_update_is_refused_and_writes_nothing() {
        let cluster = Cluster::new(15);
        let node_a = cluster.add_node(1, 4_000);
        let before = cluster.snapshot().index();
        assert_eq!(cluster.server.nodes().update_allocs(node_a, vec![]), Err(NodeError::EmptyUpdate { node: node_a }));
        assert_eq!(cluster.snapshot().index(), before);
    }
}

mod threaded {
    use std::sync::Arc;
    use std::time::Instant;

    use engine::clock::{Clock, ManualClock, SharedClock, Timestamp};
    use engine::server::{Server, ServerConfig};
    use engine::state::{ClientAllocUpdate, Snapshot};

    use super::*;

    /// A threaded server on a manual clock.
    struct Threaded {
        clock: Arc<ManualClock>,
        server: Server,
    }

    impl Threaded {
        fn start() -> Threaded {
            let clock = ManualClock::new(Timestamp(1_000_000_000_000));
            let shared: SharedClock = clock.clone();
            let server = Server::start(ServerConfig { workers: 1, ..ServerConfig::default() }, shared);
            Threaded { clock, server }
        }

        fn add_node(&self, n: u128) -> NodeId {
            self.server.nodes().register(Cluster::node(n, 4_000)).expect("registers");
            NodeId::from_u128(n)
        }

        /// Whether no eval is ready, held or waiting behind another of its
        /// job, and no plan is queued (delayed evals wait for the clock).
        fn is_idle(&self) -> bool {
            let stats = self.server.stats();
            stats.broker.total_ready + stats.broker.total_unacked + stats.broker.total_pending == 0
                && stats.plan_queue_depth == 0
        }

        /// Waits on index notifications until the server is idle and `done`
        /// holds; a wait that does not end is a failure, not a hang.
        fn settle(&self, what: &str, done: impl Fn(&Snapshot) -> bool) -> Arc<Snapshot> {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let idle = self.is_idle();
                let snapshot = self.server.store().snapshot();
                if idle && done(&snapshot) {
                    return snapshot;
                }
                assert!(Instant::now() < deadline, "never {what}: {:?}", self.server.stats());
                let _ = self.server.store().snapshot_min_index(snapshot.index() + 1, Duration::from_millis(100));
            }
        }

        fn report(&self, alloc: &Allocation, status: ClientStatus) -> Result<u64, NodeError> {
            let update = ClientAllocUpdate {
                alloc_id: alloc.id,
                node_id: alloc.node_id,
                client_status: status,
                client_description: String::new(),
                services: None,
                checks: None,
                health: None,
                task_states: Default::default(),
            };
            self.server.nodes().update_allocs(alloc.node_id, vec![update])
        }

        /// Moves the clock in five-second steps, heartbeating `alive`, until
        /// `node_id` is marked as having missed its heartbeat. Each step
        /// waits until no eval is held first: a worker still holding one
        /// while the clock jumps past the broker's nack timeout would see
        /// it nacked and re-enqueued with a delay that this manual clock
        /// never reaches (a CI run on a loaded machine did exactly that).
        fn miss_heartbeat(&self, node_id: NodeId, alive: NodeId) {
            for _ in 0..20 {
                self.server.nodes().update_status(alive, NodeStatus::Ready).expect("heartbeat");
                self.settle("ran the evals due so far", |_| true);
                self.clock.advance(Duration::from_secs(5));
            }
            self.settle("marked the silent node", |snapshot| {
                snapshot.node(node_id).is_some_and(|node| node.status.is_terminal_for_scheduling())
            });
        }
    }

    /// The threaded form of [`stepped::replaced_while_away`].
    fn replaced_while_away() -> (Threaded, NodeId, NodeId, AllocId, AllocId) {
        let threaded = Threaded::start();
        let node_a = threaded.add_node(1);
        threaded.server.jobs().register(web()).expect("registers");
        let snapshot = threaded.settle("placed web", |snapshot| live_allocs(snapshot, &web()).len() == 1);
        let original = live_allocs(&snapshot, &web())[0].clone();
        threaded.report(&original, ClientStatus::Running).expect("runs");
        let node_b = threaded.add_node(2);
        threaded.miss_heartbeat(node_a, node_b);
        let snapshot = threaded.settle("placed the replacement", |snapshot| live_allocs(snapshot, &web()).len() == 2);
        assert_eq!(snapshot.node(node_a).expect("a").status, NodeStatus::Disconnected);
        let replacement = live_allocs(&snapshot, &web()).into_iter().find(|alloc| alloc.id != original.id).expect("r");
        assert_eq!(replacement.node_id, node_b);
        threaded.report(&replacement, ClientStatus::Running).expect("runs");
        (threaded, node_a, node_b, original.id, replacement.id)
    }

    /// A heartbeats back; the evals that creates (enqueued before the
    /// call returns) run before it reports.
    fn back_but_unconfirmed(threaded: &Threaded, node_a: NodeId) {
        let response = threaded.server.nodes().update_status(node_a, NodeStatus::Ready).expect("heartbeat");
        assert_eq!(response.status, NodeStatus::Initializing);
        let snapshot = threaded.settle("ran the heartbeat's evals", |_| true);
        assert!(snapshot.evals().any(|eval| eval.create_index == response.index && eval.status.is_terminal()));
    }

    #[test]
    fn an_unconfirmed_original_leaves_its_running_replacement_alone() {
        let (threaded, node_a, _, original, replacement) = replaced_while_away();
        back_but_unconfirmed(&threaded, node_a);
        let snapshot = threaded.server.store().snapshot();
        let r = snapshot.alloc(replacement).expect("replacement");
        assert_eq!((r.desired_status, r.client_status), (DesiredStatus::Run, ClientStatus::Running));
        assert_eq!(snapshot.alloc(original).expect("original").client_status, ClientStatus::Unknown);

        let o = snapshot.alloc(original).expect("original").clone();
        threaded.report(&o, ClientStatus::Running).expect("resync");
        let snapshot = threaded.settle("settled the reconnect", |snapshot| {
            snapshot.alloc(replacement).is_some_and(|alloc| alloc.desired_status == DesiredStatus::Stop)
        });
        assert_eq!(
            history(snapshot.alloc(original).expect("original")),
            [ClientStatus::Unknown, ClientStatus::Running]
        );
        assert_eq!(running_allocs(&snapshot, &web()).iter().map(|alloc| alloc.id).collect::<Vec<_>>(), [original]);
        threaded.server.shutdown();
    }

    #[test]
    fn an_original_reported_failed_on_return_leaves_the_replacement_running() {
        let (threaded, node_a, _, original, replacement) = replaced_while_away();
        back_but_unconfirmed(&threaded, node_a);
        let o = threaded.server.store().snapshot().alloc(original).expect("original").clone();
        let index = threaded.report(&o, ClientStatus::Failed).expect("reports it failed");
        let snapshot = threaded.settle("ran the failure's eval", |_| true);
        assert!(snapshot.evals().any(|eval| eval.create_index == index && eval.status.is_terminal()));
        let r = snapshot.alloc(replacement).expect("replacement");
        assert_eq!((r.desired_status, r.client_status), (DesiredStatus::Run, ClientStatus::Running));
        assert_eq!(snapshot.allocs_by_job(&web().key()).count(), 2, "nothing new was placed");
        threaded.server.shutdown();
    }

    #[test]
    fn a_job_updated_while_away_keeps_its_new_version_running() {
        let (threaded, node_a, _, original, _) = replaced_while_away();
        threaded.server.jobs().register(web_v2()).expect("updated");
        let snapshot = threaded.settle("placed the new version", |snapshot| {
            live_allocs(snapshot, &web()).iter().any(|alloc| alloc.job.version == 1)
        });
        let current = live_allocs(&snapshot, &web()).into_iter().find(|alloc| alloc.job.version == 1).expect("v1");
        threaded.report(&current, ClientStatus::Running).expect("runs");
        let placed_before = snapshot.allocs_by_job(&web().key()).count();

        back_but_unconfirmed(&threaded, node_a);
        let snapshot = threaded.server.store().snapshot();
        let kept = snapshot.alloc(current.id).expect("v1");
        assert_eq!((kept.desired_status, kept.client_status), (DesiredStatus::Run, ClientStatus::Running));
        assert_eq!(snapshot.allocs_by_job(&web().key()).count(), placed_before, "nothing else was placed");

        let o = snapshot.alloc(original).expect("original").clone();
        threaded.report(&o, ClientStatus::Running).expect("resync");
        let snapshot = threaded.settle("stopped the outdated original", |snapshot| {
            snapshot.alloc(original).is_some_and(|alloc| alloc.desired_status == DesiredStatus::Stop)
        });
        assert_eq!(running_allocs(&snapshot, &web()).iter().map(|alloc| alloc.id).collect::<Vec<_>>(), [current.id]);
        threaded.server.shutdown();
    }

    #[test]
    fn a_failed_allocation_whose_eval_runs_late_is_rescheduled_at_its_delay() {
        let threaded = Threaded::start();
        let node_a = threaded.add_node(1);
        threaded.server.jobs().register(flaky()).expect("registers");
        let snapshot = threaded.settle("placed flaky", |snapshot| live_allocs(snapshot, &flaky()).len() == 1);
        let first = live_allocs(&snapshot, &flaky())[0].clone();
        threaded.report(&first, ClientStatus::Running).expect("runs");

        // The workers are paused, so the failure's eval runs three seconds late.
        threaded.server.workers().pause(None);
        let failed_at = threaded.clock.now();
        threaded.report(&first, ClientStatus::Failed).expect("fails");
        threaded.clock.advance(Duration::from_secs(3));
        threaded.server.nodes().update_status(node_a, NodeStatus::Ready).expect("heartbeat");
        threaded.server.workers().resume(None);
        let snapshot = threaded.settle("scheduled the delayed reschedule", |snapshot| {
            snapshot.alloc(first.id).is_some_and(|alloc| alloc.follow_up_eval_id.is_some())
        });
        assert!(snapshot.alloc(first.id).expect("alloc").next_allocation.is_none(), "not yet due");

        threaded.clock.set(failed_at.plus(RESCHEDULE_DELAY));
        threaded.server.nodes().update_status(node_a, NodeStatus::Ready).expect("heartbeat");
        let snapshot = threaded.settle("rescheduled the failed allocation", |snapshot| {
            snapshot.alloc(first.id).is_some_and(|alloc| alloc.next_allocation.is_some())
        });
        assert_eq!(live_allocs(&snapshot, &flaky()).len(), 1);
        threaded.server.shutdown();
    }

    #[test]
    fn an_empty_alloc_update_is_refused_at_once() {
        let threaded = Threaded::start();
        let node_a = threaded.add_node(1);
        let before = threaded.server.store().latest_index();
        let server = Arc::new(threaded.server);
        let (answer, answered) = std::sync::mpsc::channel();
        let caller = server.clone();
        std::thread::spawn(move || {
            let _ = answer.send(caller.nodes().update_allocs(node_a, vec![]));
        });
        let result = answered.recv_timeout(Duration::from_secs(60)).expect("an empty alloc update returns");
        assert_eq!(result, Err(NodeError::EmptyUpdate { node: node_a }));
        assert_eq!(server.store().latest_index(), before, "nothing written");
        server.shutdown();
    }
}
