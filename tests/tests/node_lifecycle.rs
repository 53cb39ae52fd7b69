//! The node lifecycle on a stepped server (`docs/node-lifecycle.md`):
//! down or disconnected, the strict reconnect steps, disconnect expiry, a
//! second disconnect, a job stopped meanwhile, system jobs on a flapping
//! node, and heartbeats of 10,000 nodes (which, all silent, the storm
//! guard holds).

use std::collections::BTreeMap;
use std::time::Duration;

use engine::node::endpoint::NodeError;
use engine::structs::{
    ClientStatus, Constraint, ConstraintOperand, DesiredStatus, Job, JobType, NodeId, NodeStatus, Resources,
    TriggerReason,
};
use tests::{live_allocs, running_allocs, Cluster};

const WINDOW: Duration = Duration::from_secs(300);

fn service(id: &str, cpu: u64, window: Option<Duration>) -> Job {
    let mut job = Job::new_simple(id, JobType::Service, 1, Resources::new(cpu, 256, 0));
    job.task_groups[0].max_client_disconnect = window;
    job
}

fn pinned(mut job: Job, node: NodeId) -> Job {
    job.constraints.push(Constraint::new("${node.unique.id}", ConstraintOperand::Equal, &node.to_string()));
    job
}

fn status(cluster: &Cluster, node_id: NodeId) -> NodeStatus {
    cluster.snapshot().node(node_id).expect("node").status
}

#[test]
fn a_missed_heartbeat_means_down_unless_an_allocation_tolerates_a_disconnect() {
    let mut cluster = Cluster::new(1);
    let (a, b) = (cluster.add_node(1, 4_000), cluster.add_node(2, 4_000));
    cluster.register_job(&pinned(service("tolerant", 1_000, Some(WINDOW)), a));
    cluster.register_job(&pinned(service("plain", 1_000, None), b));
    cluster.report(a).expect("runs");
    cluster.report(b).expect("runs");

    cluster.miss_heartbeat(a, &[b]);
    cluster.miss_heartbeat(b, &[]);
    let snapshot = cluster.snapshot();
    assert_eq!(status(&cluster, a), NodeStatus::Disconnected);
    assert_eq!(status(&cluster, b), NodeStatus::Down);
    for node_id in [a, b] {
        let node = snapshot.node(node_id).expect("node");
        assert!(node.last_missed_heartbeat_index > 0);
        assert!(snapshot
            .evals()
            .any(|eval| eval.node_id == Some(node_id) && eval.triggered_by == TriggerReason::NodeUpdate));
    }
    assert_eq!(cluster.server.heartbeats().stats().expirations, 2);

    cluster.settle();
    let snapshot = cluster.snapshot();
    let tolerant = &snapshot.allocs_by_node(a).next().expect("alloc").clone();
    assert_eq!(tolerant.client_status, ClientStatus::Unknown);
    assert_eq!(tolerant.desired_status, DesiredStatus::Run);
    assert_eq!(tolerant.alloc_states.last().map(|state| state.client_status), Some(ClientStatus::Unknown));
    let plain = &snapshot.allocs_by_node(b).next().expect("alloc").clone();
    assert_eq!(plain.client_status, ClientStatus::Lost);
    assert_eq!(plain.desired_status, DesiredStatus::Stop);
}

#[test]
fn the_reconnect_steps_are_strict() {
    let mut cluster = Cluster::new(2);
    let (a, b) = (cluster.add_node(1, 4_000), cluster.add_node(2, 4_000));
    let job = pinned(service("web", 1_000, Some(WINDOW)), a);
    cluster.register_job(&job);
    cluster.report(a).expect("runs");
    cluster.miss_heartbeat(a, &[b]);
    cluster.settle();
    let before = cluster.snapshot();

    // While disconnected: alloc updates are refused and change nothing.
    let refused = cluster.report(a).expect_err("refused while disconnected");
    assert_eq!(refused, NodeError::NotConnected { node: a, status: NodeStatus::Disconnected });
    assert_eq!(cluster.snapshot().index(), before.index());
    // A client may not declare itself disconnected; Register never sets a known node's status.
    assert!(matches!(
        cluster.server.nodes().update_status(a, NodeStatus::Disconnected),
        Err(NodeError::StatusNotAllowed { .. })
    ));
    cluster.server.nodes().register(Cluster::node(1, 4_000)).expect("re-register");
    assert_eq!(status(&cluster, a), NodeStatus::Disconnected);

    // disconnected → initializing, and it stays there until an alloc update is newer than the miss.
    let response = cluster.heartbeat(a).expect("heartbeat");
    assert_eq!(response.status, NodeStatus::Initializing);
    assert!(response.heartbeat_ttl >= Duration::from_secs(10));
    assert_eq!(cluster.heartbeat(a).expect("heartbeat").status, NodeStatus::Initializing);
    cluster.report(a).expect("taken while initializing");
    let node = cluster.snapshot().node(a).expect("node").clone();
    assert!(node.last_alloc_update_index > node.last_missed_heartbeat_index);
    assert_eq!(cluster.heartbeat(a).expect("heartbeat").status, NodeStatus::Ready);

    // The reconnect is settled by the evals that followed, and recorded once.
    cluster.settle();
    cluster.settle();
    let snapshot = cluster.snapshot();
    let alloc = live_allocs(&snapshot, &job).pop().expect("kept");
    let history: Vec<_> = alloc.alloc_states.iter().map(|state| state.client_status).collect();
    assert_eq!(history, [ClientStatus::Unknown, ClientStatus::Running]);
    assert_eq!(running_allocs(&snapshot, &job).len(), 1);
}

#[test]
fn a_node_without_live_allocations_is_ready_on_its_first_heartbeat() {
    let mut cluster = Cluster::new(3);
    let (a, b) = (cluster.add_node(1, 4_000), cluster.add_node(2, 4_000));
    cluster.miss_heartbeat(a, &[b]);
    assert_eq!(status(&cluster, a), NodeStatus::Down);
    assert_eq!(cluster.report(a), Ok(cluster.snapshot().index()), "nothing to report");
    assert_eq!(cluster.heartbeat(a).expect("heartbeat").status, NodeStatus::Ready);
    cluster.settle();
}

#[test]
fn an_unknown_allocation_becomes_lost_when_its_disconnect_runs_out() {
    let mut cluster = Cluster::new(4);
    let (a, b) = (cluster.add_node(1, 4_000), cluster.add_node(2, 4_000));
    let job = service("web", 3_000, Some(WINDOW));
    cluster.register_job(&job);
    let original = live_allocs(&cluster.snapshot(), &job).pop().expect("placed");
    let (home, other) = if original.node_id == a { (a, b) } else { (b, a) };
    cluster.report(home).expect("runs");

    cluster.miss_heartbeat(home, &[other]);
    cluster.settle();
    let snapshot = cluster.snapshot();
    let live = live_allocs(&snapshot, &job);
    assert_eq!(live.len(), 2, "the unknown original and its replacement");
    let replacement = live.iter().find(|alloc| alloc.id != original.id).expect("replacement").clone();
    assert_eq!(replacement.node_id, other);
    assert_eq!(replacement.previous_allocation, Some(original.id));
    cluster.report(other).expect("the replacement runs");

    cluster.pass_time(WINDOW - Duration::from_secs(30), &[other]);
    assert_eq!(cluster.snapshot().alloc(original.id).expect("alloc").client_status, ClientStatus::Unknown);
    cluster.pass_time(Duration::from_secs(60), &[other]);
    let snapshot = cluster.snapshot();
    let expired = snapshot.alloc(original.id).expect("alloc");
    assert_eq!(expired.client_status, ClientStatus::Lost);
    assert_eq!(expired.desired_status, DesiredStatus::Stop);
    assert_eq!(live_allocs(&snapshot, &job).iter().map(|alloc| alloc.id).collect::<Vec<_>>(), [replacement.id]);
    assert!(cluster.server.broker_is_idle());

    // The node coming back afterwards changes nothing: the lost allocation stays stopped.
    cluster.heartbeat(home).expect("heartbeat");
    cluster.report(home).expect("the client stops what it was told to");
    cluster.heartbeat(home).expect("heartbeat");
    cluster.settle();
    let snapshot = cluster.snapshot();
    assert_eq!(live_allocs(&snapshot, &job).iter().map(|alloc| alloc.id).collect::<Vec<_>>(), [replacement.id]);
}

#[test]
fn a_second_disconnect_is_handled_like_the_first() {
    let mut cluster = Cluster::new(5);
    let (a, b) = (cluster.add_node(1, 8_000), cluster.add_node(2, 4_000));
    let job = service("web", 3_000, Some(WINDOW));
    cluster.register_job(&pinned(service("filler", 3_000, None), b));
    cluster.register_job(&job);
    cluster.report(a).expect("runs");
    cluster.report(b).expect("runs");
    let original = live_allocs(&cluster.snapshot(), &job).pop().expect("placed").id;

    for round in 1..=2 {
        cluster.miss_heartbeat(a, &[b]);
        cluster.settle();
        assert_eq!(cluster.snapshot().alloc(original).expect("alloc").client_status, ClientStatus::Unknown);
        assert_eq!(
            cluster.report(a).map(|_| ()),
            Err(NodeError::NotConnected { node: a, status: NodeStatus::Disconnected })
        );
        cluster.heartbeat(a).expect("heartbeat");
        cluster.report(a).expect("report");
        cluster.heartbeat(a).expect("heartbeat");
        cluster.pass_time(Duration::from_secs(5), &[a, b]);
        let snapshot = cluster.snapshot();
        let allocs: Vec<_> = snapshot.allocs_by_job(&job.key()).cloned().collect();
        assert_eq!(allocs.len(), 1, "round {round}: no replacement was placed");
        let history: Vec<_> = allocs[0].alloc_states.iter().map(|state| state.client_status).collect();
        let expected: Vec<_> = (0..round).flat_map(|_| [ClientStatus::Unknown, ClientStatus::Running]).collect();
        assert_eq!(history, expected, "round {round}");
        assert_eq!(running_allocs(&snapshot, &job).len(), 1);
    }
    // Through the end of both windows nothing more happens.
    cluster.pass_time(WINDOW + Duration::from_secs(30), &[a, b]);
    assert_eq!(running_allocs(&cluster.snapshot(), &job).len(), 1);
}

#[test]
fn a_job_stopped_while_its_node_was_disconnected_does_not_resume() {
    let mut cluster = Cluster::new(6);
    let (a, b) = (cluster.add_node(1, 4_000), cluster.add_node(2, 4_000));
    let job = pinned(service("web", 1_000, Some(WINDOW)), a);
    cluster.register_job(&job);
    cluster.report(a).expect("runs");
    let original = live_allocs(&cluster.snapshot(), &job).pop().expect("placed").id;
    cluster.miss_heartbeat(a, &[b]);
    cluster.settle();

    cluster.server.jobs().deregister(&job.key(), false).expect("stopped");
    cluster.settle();
    let stopped = cluster.snapshot().alloc(original).expect("alloc").clone();
    assert_eq!(stopped.desired_status, DesiredStatus::Stop);

    cluster.heartbeat(a).expect("heartbeat");
    // What the client fetches tells it not to resume the allocation.
    let (fetched, _) = cluster.server.nodes().allocs(a, 0, Duration::ZERO).expect("allocs");
    assert!(fetched.iter().all(|alloc| alloc.desired_status == DesiredStatus::Stop));
    cluster.report(a).expect("the client reports it stopped");
    cluster.heartbeat(a).expect("heartbeat");
    cluster.pass_time(WINDOW + Duration::from_secs(30), &[a, b]);
    let snapshot = cluster.snapshot();
    let alloc = snapshot.alloc(original).expect("alloc");
    assert_eq!(alloc.client_status, ClientStatus::Complete);
    assert!(running_allocs(&snapshot, &job).is_empty());
    assert!(live_allocs(&snapshot, &job).is_empty());
    assert_eq!(alloc.alloc_states.last().map(|state| state.client_status), Some(ClientStatus::Unknown));
}

#[test]
fn system_jobs_follow_a_flapping_node() {
    let mut cluster = Cluster::new(7);
    let nodes: Vec<NodeId> = (1..=3).map(|n| cluster.add_node(n, 4_000)).collect();
    let (flappy, steady) = (nodes[0], &nodes[1..]);
    let mut agent = Job::new_simple("agent", JobType::System, 1, Resources::new(100, 64, 0));
    agent.priority = 90;
    let mut tolerant = Job::new_simple("logs", JobType::System, 1, Resources::new(100, 64, 0));
    tolerant.task_groups[0].max_client_disconnect = Some(WINDOW);
    cluster.register_job(&agent);
    cluster.register_job(&tolerant);
    for node_id in &nodes {
        cluster.report(*node_id).expect("runs");
    }
    let per_node = |cluster: &Cluster, job: &Job| {
        let mut counts: BTreeMap<NodeId, usize> = BTreeMap::new();
        for alloc in live_allocs(&cluster.snapshot(), job) {
            *counts.entry(alloc.node_id).or_default() += 1;
        }
        counts
    };
    let logs_alloc = cluster.snapshot().allocs_by_node(flappy).find(|alloc| &*alloc.job_id == "logs").expect("logs").id;

    for flap in 1..=3 {
        cluster.miss_heartbeat(flappy, steady);
        cluster.settle();
        assert_eq!(status(&cluster, flappy), NodeStatus::Disconnected, "logs tolerates a disconnect");
        assert_eq!(per_node(&cluster, &agent).get(&flappy), None, "flap {flap}: agent lost with its node");
        assert_eq!(cluster.snapshot().alloc(logs_alloc).expect("logs").client_status, ClientStatus::Unknown);
        assert!(per_node(&cluster, &agent).values().all(|count| *count == 1));

        cluster.heartbeat(flappy).expect("heartbeat");
        cluster.report(flappy).expect("report");
        cluster.heartbeat(flappy).expect("heartbeat");
        cluster.pass_time(Duration::from_secs(3), &nodes);
        cluster.report(flappy).expect("the new agent runs");
        let agents = per_node(&cluster, &agent);
        assert_eq!(agents.len(), 3, "flap {flap}: the agent is back on the node");
        assert!(agents.values().all(|count| *count == 1), "flap {flap}: {agents:?}");
        let logs = per_node(&cluster, &tolerant);
        assert!(logs.values().all(|count| *count == 1) && logs.len() == 3, "flap {flap}: {logs:?}");
        let kept = cluster.snapshot().alloc(logs_alloc).expect("logs").clone();
        assert_eq!(kept.desired_status, DesiredStatus::Run, "flap {flap}: the tolerant one is kept");
        assert_eq!(kept.alloc_states.len(), flap * 2, "flap {flap}: one unknown, one reconnect each time");
    }
    let snapshot = cluster.snapshot();
    let agents_ever = snapshot.allocs_by_job(&agent.key()).filter(|alloc| alloc.node_id == flappy).count();
    assert_eq!(agents_ever, 4, "one agent per stay");
    assert!(snapshot.oversubscribed_nodes().is_empty());
}

#[test]
fn ten_thousand_nodes_heartbeat_with_jitter_spread_across_the_ttl() {
    let cluster = Cluster::new(8);
    let n_nodes = 10_000u128;
    let mut ttls = Vec::new();
    for n in 1..=n_nodes {
        let response = cluster.server.nodes().register(Cluster::node(n, 4_000)).expect("node registers");
        ttls.push(response.heartbeat_ttl);
    }
    let base = Duration::from_secs(10);
    assert!(ttls.iter().all(|ttl| *ttl >= base && *ttl < base * 2));
    let mut buckets = [0usize; 10];
    for ttl in &ttls {
        buckets[((ttl.as_secs_f64() / base.as_secs_f64() - 1.0) * 10.0) as usize] += 1;
    }
    assert!(buckets.iter().all(|count| (700..1_300).contains(count)), "TTLs bunch up: {buckets:?}");

    // Every client heartbeats at half its TTL: for a minute, nobody is missed.
    let mut due: Vec<(Duration, NodeId)> =
        ttls.iter().enumerate().map(|(n, ttl)| (*ttl / 2, NodeId::from_u128(n as u128 + 1))).collect();
    let mut elapsed = Duration::ZERO;
    while elapsed < Duration::from_secs(60) {
        elapsed += Duration::from_secs(1);
        assert_eq!(cluster.server.advance(Duration::from_secs(1)), 0);
        for (next, node_id) in due.iter_mut().filter(|(next, _)| *next <= elapsed) {
            *next = elapsed + cluster.heartbeat(*node_id).expect("heartbeat").heartbeat_ttl / 2;
        }
    }
    let stats = cluster.server.heartbeats().stats();
    assert_eq!(stats.active_timers, 10_000);
    assert_eq!(stats.expirations, 0);
    assert!(stats.resets > 40_000, "{stats:?}");

    // Then they all go silent: the misses are spread over the TTL, not at once.
    let mut per_second = Vec::new();
    while cluster.server.heartbeats().stats().active_timers > 0 {
        per_second.push(cluster.server.advance(Duration::from_secs(1)));
    }
    let busy = per_second.iter().filter(|count| **count > 0).count();
    assert!(busy >= 10, "{per_second:?}");
    assert!(per_second.iter().all(|count| *count <= 1_300), "{per_second:?}");
    // All of them at once is a storm: the guard holds every one
    // disconnected rather than marking it down (`storm_guard.rs`).
    let snapshot = cluster.snapshot();
    assert!(snapshot.nodes().all(|node| node.status == NodeStatus::Disconnected && node.hold.is_some()));
    assert_eq!(cluster.server.heartbeats().storm_stats().nodes_held, 10_000);
}

#[test]
fn a_server_taking_over_existing_state_gives_every_live_node_the_failover_ttl() {
    use engine::clock::{ManualClock, SharedClock, Timestamp};
    use engine::server::{Server, ServerConfig};
    use engine::state::{Command, StateStore};
    use engine::structs::Evaluation;
    use std::sync::Arc;

    // State as a previous leader left it: three nodes (one down) and a job whose eval is pending.
    let store = Arc::new(StateStore::new());
    let nodes: Vec<NodeId> = (1..=3).map(|n| Cluster::node(n, 4_000).id).collect();
    for n in 1..=3 {
        store.apply(Command::UpsertNode { node: Cluster::node(n, 4_000), evals: vec![] }).expect("node");
    }
    store
        .apply(Command::UpdateNodeStatus {
            node_id: nodes[2],
            status: NodeStatus::Down,
            evals: vec![],
            time: Timestamp::ZERO,
        })
        .expect("down");
    let job = service("web", 1_000, None);
    let eval = Evaluation::for_job(&job, TriggerReason::JobRegister, Timestamp(1));
    store.apply(Command::RegisterJob { job: job.clone(), eval: Some(eval) }).expect("job");

    let start = Timestamp(1_000_000_000_000);
    let clock = ManualClock::new(start);
    let shared: SharedClock = clock.clone();
    let server = Server::start_on(ServerConfig { workers: 1, ..ServerConfig::default() }, shared, store.clone());
    let failover = ServerConfig::default().heartbeat.failover_heartbeat_ttl;
    assert_eq!(server.heartbeats().stats().active_timers, 2, "the down node gets no deadline");
    for node_id in &nodes[..2] {
        assert_eq!(server.heartbeats().deadline(*node_id), Some(start.plus(failover)));
    }
    assert_eq!(server.heartbeats().deadline(nodes[2]), None);

    // The pending eval was re-enqueued and runs.
    let wait_for = |done: &dyn Fn(&engine::state::Snapshot) -> bool| loop {
        let snapshot = store.snapshot();
        if done(&snapshot) {
            return;
        }
        store.snapshot_min_index(snapshot.index() + 1, Duration::from_secs(30)).expect("progress");
    };
    wait_for(&|snapshot| live_allocs(snapshot, &job).len() == 1);

    // Past the failover TTL, silent nodes are marked: held disconnected by
    // the storm guard (this server never heard from them), not down.
    clock.set(start.plus(failover + Duration::from_secs(1)));
    wait_for(&|snapshot| {
        nodes[..2].iter().all(|id| {
            snapshot.node(*id).is_some_and(|node| node.status == NodeStatus::Disconnected && node.hold.is_some())
        })
    });
    server.shutdown();
}
