//! The storm guard on a stepped server (`engine/src/node/storm.rs`): half
//! the nodes fall silent at once; they are held `disconnected`, not
//! `down`; their replacements are placed no faster than the release rate;
//! no original is stopped before its replacement runs; a node that comes
//! back before its release keeps what it ran, and one back after it keeps
//! its original over a replacement that has not started; a system
//! allocation waits for its node's release, then is lost. A single silent
//! node in a calm cluster is still marked `down`.

use std::collections::BTreeMap;
use std::time::Duration;

use engine::node::heartbeat::HeartbeatConfig;
use engine::node::storm::StormConfig;
use engine::scheduler::reconcile::stop_reason;
use engine::structs::{AllocId, ClientStatus, DesiredStatus, Job, JobType, NodeId, NodeStatus, Resources};
use tests::{live_allocs, running_allocs, Cluster};

/// Two seconds between released nodes: one release per two steps of one second.
const RELEASE_EVERY: Duration = Duration::from_secs(2);

fn guarded(seed: u64) -> Cluster {
    let storm = StormConfig { release_per_second: 1.0 / RELEASE_EVERY.as_secs_f64(), ..StormConfig::default() };
    Cluster::with_heartbeat(seed, HeartbeatConfig { storm, ..HeartbeatConfig::default() })
}

/// Twenty nodes; a job of ten allocations, one per node (each takes most of
/// a node), all running. Returns the job, the nodes that run it and the others.
fn cluster_with_job(cluster: &mut Cluster) -> (Job, Vec<NodeId>, Vec<NodeId>) {
    let nodes: Vec<NodeId> = (1..=20).map(|n| cluster.add_node(n, 4_000)).collect();
    for node_id in &nodes {
        cluster.heartbeat(*node_id).expect("ready");
    }
    let job = Job::new_simple("web", JobType::Service, 10, Resources::new(3_000, 256, 0));
    cluster.register_job(&job);
    for node_id in &nodes {
        cluster.report(*node_id).expect("runs");
    }
    let snapshot = cluster.snapshot();
    let (busy, idle): (Vec<NodeId>, Vec<NodeId>) =
        nodes.iter().partition(|node_id| snapshot.allocs_by_node(**node_id).next().is_some());
    assert_eq!(running_allocs(&snapshot, &job).len(), 10);
    (job, busy, idle)
}

/// Every original the servers stopped has a running allocation in its slot.
fn no_original_stopped_before_its_replacement_runs(cluster: &Cluster, job: &Job, originals: &[AllocId]) {
    let snapshot = cluster.snapshot();
    for original in originals.iter().filter_map(|id| snapshot.alloc(*id)) {
        if original.desired_status == DesiredStatus::Run {
            continue;
        }
        assert_eq!(original.desired_description, stop_reason::HELD_REPLACED);
        let slot_runs = running_allocs(&snapshot, job).iter().any(|alloc| alloc.name == original.name);
        assert!(slot_runs, "{} was stopped before a replacement in its slot ran", original.name);
    }
}

#[test]
fn a_storm_holds_nodes_and_releases_their_replacements_at_the_rate_and_stops_no_original_first() {
    let mut cluster = guarded(11);
    let (job, silent, alive) = cluster_with_job(&mut cluster);
    let originals: Vec<AllocId> = live_allocs(&cluster.snapshot(), &job).iter().map(|alloc| alloc.id).collect();

    // Half the nodes (all that run the job) fall silent at once.
    let started = cluster.server.now();
    cluster.miss_heartbeat(silent[0], &alive);
    let stats = cluster.server.heartbeats().storm_stats();
    assert!(stats.on, "one miss with the other silent nodes late is half the cluster");
    assert!(stats.reason.contains("of 20 nodes"), "{}", stats.reason);

    // Every silent node ends up held: disconnected, with release times
    // spaced by the rate, and no replacement before its node's release.
    let mut first_placed: BTreeMap<AllocId, u64> = BTreeMap::new();
    let mut releases = BTreeMap::new();
    for step in 0..90u64 {
        cluster.pass_time(Duration::from_secs(1), &alive);
        for node_id in &alive {
            cluster.report(*node_id).expect("the replacements run");
        }
        cluster.settle();
        no_original_stopped_before_its_replacement_runs(&cluster, &job, &originals);
        let snapshot = cluster.snapshot();
        for node_id in &silent {
            let node = snapshot.node(*node_id).expect("node");
            if node.status != NodeStatus::Ready {
                assert_eq!(node.status, NodeStatus::Disconnected, "a silent node is held, never down");
                let hold = node.hold.expect("held");
                releases.insert(*node_id, hold.release_at);
            }
        }
        for alloc in live_allocs(&snapshot, &job).iter().filter(|alloc| !originals.contains(&alloc.id)) {
            first_placed.entry(alloc.id).or_insert(step);
            let previous = alloc.previous_allocation.and_then(|id| snapshot.alloc(id)).expect("replaces an original");
            let release = snapshot.node(previous.node_id).and_then(|node| node.hold).expect("held").release_at;
            assert!(cluster.server.now() >= release, "a replacement was placed before its node's release");
        }
    }
    assert_eq!(releases.len(), 10, "every silent node was held");
    let mut times: Vec<_> = releases.values().copied().collect();
    times.sort();
    for pair in times.windows(2) {
        assert_eq!(pair[1].since(pair[0]), RELEASE_EVERY, "release times are spaced by the rate");
    }
    assert!(times[0] >= started);

    // In the end: ten replacements run, and every original was stopped after its replacement ran.
    let snapshot = cluster.snapshot();
    assert_eq!(running_allocs(&snapshot, &job).len(), 10);
    assert_eq!(first_placed.len(), 10, "one replacement per original");

    for original in originals.iter().filter_map(|id| snapshot.alloc(*id)) {
        assert_eq!((original.desired_status, original.client_status), (DesiredStatus::Stop, ClientStatus::Lost));
        assert_eq!(original.desired_description, stop_reason::HELD_REPLACED);
    }
    let stats = cluster.server.heartbeats().storm_stats();
    assert_eq!((stats.activations, stats.nodes_held), (1, 10));
    assert!(!stats.on, "a minute after the last miss the guard is off");
    assert!(stats.held_millis > 0);
}

#[test]
fn a_held_node_back_before_its_release_keeps_what_it_ran() {
    let mut cluster = guarded(12);
    let (job, silent, alive) = cluster_with_job(&mut cluster);
    let originals: Vec<AllocId> = live_allocs(&cluster.snapshot(), &job).iter().map(|alloc| alloc.id).collect();
    cluster.miss_heartbeat(silent[0], &alive);
    cluster.pass_time(Duration::from_secs(1), &alive);
    let snapshot = cluster.snapshot();
    let last =
        silent.iter().max_by_key(|node_id| snapshot.node(**node_id).and_then(|node| node.hold).map(|h| h.release_at));
    let last = *last.expect("a node");
    assert!(snapshot.node(last).and_then(|node| node.hold).is_some_and(|hold| hold.release_at > cluster.server.now()));
    // Not released yet: nothing was done to what it runs.
    assert!(snapshot.allocs_by_node(last).all(|alloc| alloc.client_status == ClientStatus::Running));

    // It comes back: the reconnect steps, then it runs its original again and no replacement is placed for it.
    cluster.heartbeat(last).expect("heartbeat");
    cluster.report(last).expect("resync");
    cluster.heartbeat(last).expect("ready");
    cluster.settle();
    let snapshot = cluster.snapshot();
    let node = snapshot.node(last).expect("node");
    assert_eq!((node.status, node.hold), (NodeStatus::Ready, None));
    let original = snapshot.allocs_by_node(last).next().expect("its original").clone();
    assert!(originals.contains(&original.id));
    assert_eq!((original.desired_status, original.client_status), (DesiredStatus::Run, ClientStatus::Running));
    let replacing = |snapshot: &engine::state::Snapshot| {
        live_allocs(snapshot, &job).iter().filter(|alloc| alloc.previous_allocation == Some(original.id)).count()
    };
    let mut back = alive.clone();
    back.push(last);
    cluster.pass_time(Duration::from_secs(60), &back);
    assert_eq!(replacing(&cluster.snapshot()), 0, "no replacement for an original that came back");
    no_original_stopped_before_its_replacement_runs(&cluster, &job, &originals);
}

#[test]
fn one_silent_node_in_a_calm_cluster_is_marked_down() {
    let mut cluster = guarded(13);
    let (job, busy, idle) = cluster_with_job(&mut cluster);
    let mut alive: Vec<NodeId> = idle.clone();
    alive.extend(&busy[1..]);
    cluster.miss_heartbeat(busy[0], &alive);
    cluster.settle();
    let snapshot = cluster.snapshot();
    let node = snapshot.node(busy[0]).expect("node");
    assert_eq!((node.status, node.hold), (NodeStatus::Down, None));
    assert!(!cluster.server.heartbeats().storm_stats().on);
    let lost = snapshot.allocs_by_node(busy[0]).next().expect("alloc").clone();
    assert_eq!(lost.desired_description, stop_reason::LOST);
    assert_eq!(live_allocs(&snapshot, &job).len(), 10, "replaced at once, as without the guard");
}

#[test]
fn a_released_node_back_before_its_replacement_runs_keeps_its_original() {
    let mut cluster = guarded(14);
    let (job, silent, alive) = cluster_with_job(&mut cluster);
    cluster.miss_heartbeat(silent[0], &alive);
    // Time passes; the replacements placed on release never start (their
    // nodes do not report them).
    let mut found = None;
    for _ in 0..30 {
        cluster.pass_time(Duration::from_secs(1), &alive);
        let snapshot = cluster.snapshot();
        found = live_allocs(&snapshot, &job).into_iter().find_map(|replacement| {
            let original = snapshot.alloc(replacement.previous_allocation?)?.clone();
            (replacement.client_status == ClientStatus::Pending).then_some((original, replacement))
        });
        if found.is_some() {
            break;
        }
    }
    let (original, replacement) = found.expect("a replacement placed on a node's release");
    assert_eq!(original.client_status, ClientStatus::Unknown, "marked unknown on release");

    // Its node comes back: the original runs, the replacement does not: the original stays.
    let home = original.node_id;
    cluster.heartbeat(home).expect("heartbeat");
    cluster.report(home).expect("resync");
    cluster.heartbeat(home).expect("ready");
    cluster.settle();
    let snapshot = cluster.snapshot();
    let original = snapshot.alloc(original.id).expect("original").clone();
    assert_eq!((original.desired_status, original.client_status), (DesiredStatus::Run, ClientStatus::Running));
    let replacement = snapshot.alloc(replacement.id).expect("replacement").clone();
    assert_eq!(replacement.desired_status, DesiredStatus::Stop);
    assert_eq!(replacement.desired_description, stop_reason::ORIGINAL_RECONNECTED);
}

#[test]
fn a_system_allocation_on_a_held_node_waits_for_its_release_then_is_lost() {
    let mut cluster = guarded(15);
    let (_, silent, alive) = cluster_with_job(&mut cluster);
    let system = Job::new_simple("agent", JobType::System, 1, Resources::new(100, 64, 0));
    cluster.register_job(&system);
    for node_id in silent.iter().chain(&alive) {
        cluster.report(*node_id).expect("runs");
    }
    cluster.miss_heartbeat(silent[0], &alive);
    let held = |cluster: &Cluster| {
        let snapshot = cluster.snapshot();
        silent.iter().filter_map(|id| Some((snapshot.node(*id)?.hold?.release_at, *id))).collect::<Vec<_>>()
    };
    while held(&cluster).len() < silent.len() {
        cluster.pass_time(Duration::from_secs(1), &alive);
    }
    // The node released last.
    let (release_at, home) = held(&cluster).into_iter().max().expect("held nodes");
    assert!(release_at > cluster.server.now());
    let on_home = |cluster: &Cluster| {
        cluster.snapshot().allocs_by_job(&system.key()).find(|alloc| alloc.node_id == home).cloned().expect("alloc")
    };
    let kept = on_home(&cluster);
    assert_eq!((kept.desired_status, kept.client_status), (DesiredStatus::Run, ClientStatus::Running));
    cluster.pass_time(release_at.since(cluster.server.now()) + Duration::from_secs(1), &alive);
    let lost = on_home(&cluster);
    assert_eq!((lost.desired_status, lost.client_status), (DesiredStatus::Stop, ClientStatus::Lost));
}
