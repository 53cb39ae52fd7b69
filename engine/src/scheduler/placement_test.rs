//! Placement preferences, ports and preemption through the whole scheduler
//! (the [`Harness`]): affinities pull and push, spreads end at their
//! targets, ports are never given twice on a node, preemption evicts only
//! what it may.

use std::collections::BTreeMap;

use super::testing::Harness;
use crate::clock::Timestamp;
use crate::state::Command;
use crate::structs::{
    port_env, Affinity, Allocation, ConstraintOperand, DesiredStatus, HostNetwork, Job, JobType, NetworkResource, Node,
    NodeId, NodeNetwork, Port, PortSet, Resources, SchedulerConfiguration, Spread, TriggerReason, NOMAD_ENV_PREFIX,
};

const NOW: Timestamp = Timestamp(1_000_000 * 1_000_000_000);

/// `n` nodes of 4000 MHz; node i is in `dc{i % dcs + 1}`, class `classes(i)`.
fn cluster(n: usize, dcs: usize, classes: impl Fn(usize) -> &'static str) -> Harness {
    let harness = Harness::new(NOW);
    harness.add_nodes((0..n).map(|i| {
        let datacenter = format!("dc{}", i % dcs + 1);
        Node::new_ready(NodeId::from_u128(i as u128 + 1), &datacenter, classes(i), Resources::new(4000, 8192, 0))
    }));
    harness
}

fn service_job(id: &str, count: u32, dcs: usize) -> Job {
    let mut job = Job::new_simple(id, JobType::Service, count, Resources::new(100, 64, 0));
    job.datacenters = (1..=dcs).map(|dc| format!("dc{dc}")).collect();
    job
}

fn place(h: &mut Harness, job: &Job) {
    let eval = h.register(job);
    h.process(&eval).expect("scheduled");
}

/// Live allocations of `job` per value of `of(node)`.
fn per_node_value(h: &Harness, job: &Job, of: impl Fn(&Node) -> String) -> BTreeMap<String, usize> {
    let snapshot = h.store.snapshot();
    let mut counts = BTreeMap::new();
    for alloc in h.live_allocs(job) {
        *counts.entry(of(snapshot.node(alloc.node_id).expect("its node"))).or_insert(0) += 1;
    }
    counts
}

#[test]
fn an_affinity_pulls_allocations_to_the_preferred_nodes() {
    // 10 of 200 nodes are "fast": a walk of the usual score limit (8 nodes)
    // would usually miss them all.
    let mut h = cluster(200, 1, |i| if i % 20 == 7 { "fast" } else { "slow" });
    let mut job = service_job("web", 10, 1);
    job.affinities.push(Affinity::new("${node.class}", ConstraintOperand::Equal, "fast", 50));
    place(&mut h, &job);
    let by_class = per_node_value(&h, &job, |node| node.node_class.to_string());
    assert_eq!(by_class, BTreeMap::from([("fast".to_string(), 10)]), "every allocation on a fast node");
}

#[test]
fn a_negative_affinity_pushes_allocations_away() {
    // 190 of 200 nodes are to be avoided.
    let mut h = cluster(200, 1, |i| if i % 20 == 7 { "quiet" } else { "busy" });
    let mut job = service_job("web", 10, 1);
    job.task_groups[0].tasks[0].affinities.push(Affinity::new("${node.class}", ConstraintOperand::Equal, "busy", -80));
    place(&mut h, &job);
    let by_class = per_node_value(&h, &job, |node| node.node_class.to_string());
    assert_eq!(by_class, BTreeMap::from([("quiet".to_string(), 10)]), "none on an avoided node while others have room");
}

#[test]
fn an_affinity_gives_way_when_its_nodes_are_full() {
    let mut h = cluster(20, 1, |i| if i < 2 { "fast" } else { "slow" });
    let mut job = service_job("web", 10, 1);
    job.task_groups[0].tasks[0].resources = Resources::new(1500, 64, 0);
    job.task_groups[0].affinities.push(Affinity::new("${node.class}", ConstraintOperand::Equal, "fast", 100));
    place(&mut h, &job);
    let by_class = per_node_value(&h, &job, |node| node.node_class.to_string());
    assert_eq!(by_class["fast"], 4, "two of 1500 MHz fit on each fast node");
    assert_eq!(by_class["slow"], 6, "the rest go elsewhere: an affinity never filters");
}

#[test]
fn a_spread_with_targets_ends_within_one_allocation_of_them() {
    let mut h = cluster(60, 3, |_| "c");
    let mut job = service_job("web", 20, 3);
    job.spreads.push(Spread::with_targets("${node.datacenter}", 50, &[("dc1", 50), ("dc2", 30), ("dc3", 20)]));
    place(&mut h, &job);
    let by_dc = per_node_value(&h, &job, |node| node.datacenter.to_string());
    for (dc, target) in [("dc1", 10), ("dc2", 6), ("dc3", 4)] {
        let placed = by_dc.get(dc).copied().unwrap_or(0);
        assert!(placed.abs_diff(target) <= 1, "{dc}: {placed} placed, target {target}: {by_dc:?}");
    }
}

#[test]
fn a_target_left_out_gets_what_the_others_leave() {
    let mut h = cluster(60, 3, |_| "c");
    let mut job = service_job("web", 10, 3);
    job.spreads.push(Spread::with_targets("${node.datacenter}", 50, &[("dc1", 80)]));
    place(&mut h, &job);
    let by_dc = per_node_value(&h, &job, |node| node.datacenter.to_string());
    assert!(by_dc["dc1"].abs_diff(8) <= 1, "{by_dc:?}");
    let others = by_dc.get("dc2").copied().unwrap_or(0) + by_dc.get("dc3").copied().unwrap_or(0);
    assert!(others.abs_diff(2) <= 1, "the implicit target takes the remaining 20%: {by_dc:?}");
}

#[test]
fn an_even_spread_shares_out_over_three_datacenters_and_counts_what_is_placed() {
    let mut h = cluster(60, 3, |_| "c");
    let mut job = service_job("web", 9, 3);
    job.spreads.push(Spread::even("${node.datacenter}", 100));
    place(&mut h, &job);
    let by_dc = per_node_value(&h, &job, |node| node.datacenter.to_string());
    assert_eq!(by_dc.values().copied().collect::<Vec<_>>(), vec![3, 3, 3], "{by_dc:?}");
    // Scaling up counts the nine already placed.
    job.task_groups[0].count = 15;
    place(&mut h, &job);
    let by_dc = per_node_value(&h, &job, |node| node.datacenter.to_string());
    assert_eq!(by_dc.values().copied().collect::<Vec<_>>(), vec![5, 5, 5], "{by_dc:?}");
}

#[test]
fn two_spreads_share_out_over_datacenters_and_racks() {
    let h = Harness::new(NOW);
    h.add_nodes((0..120).map(|i| {
        let mut node =
            Node::new_ready(NodeId::from_u128(i + 1), &format!("dc{}", i % 2 + 1), "c", Resources::new(4000, 8192, 0));
        node.meta.insert("rack".into(), format!("r{}", i % 5));
        node
    }));
    let mut h = h;
    let mut job = service_job("web", 20, 2);
    job.spreads.push(Spread::even("${node.datacenter}", 50));
    job.task_groups[0].spreads.push(Spread::even("${meta.rack}", 50));
    place(&mut h, &job);
    let by_dc = per_node_value(&h, &job, |node| node.datacenter.to_string());
    let by_rack = per_node_value(&h, &job, |node| node.meta["rack"].clone());
    assert_eq!(by_dc.values().copied().collect::<Vec<_>>(), vec![10, 10], "{by_dc:?}");
    assert_eq!(by_rack.values().copied().collect::<Vec<_>>(), vec![4; 5], "{by_rack:?}");
}

fn with_ports(mut job: Job, statics: &[(&str, u16)], dynamics: &[&str]) -> Job {
    job.task_groups[0].networks = vec![NetworkResource {
        reserved_ports: statics.iter().map(|(label, port)| Port::new(label, *port)).collect(),
        dynamic_ports: dynamics.iter().map(|label| Port::new(label, 0)).collect(),
    }];
    job
}

/// Two nodes whose dynamic range holds ten ports (20000-20009), reserving 22.
fn port_cluster() -> Harness {
    let h = Harness::new(NOW);
    h.add_nodes((0..2).map(|i| {
        let mut node = Node::new_ready(NodeId::from_u128(i + 1), "dc1", "c", Resources::new(64_000, 64_000, 0));
        node.network = NodeNetwork {
            ip: format!("10.0.0.{}", i + 1).into(),
            reserved_ports: PortSet::of([22]),
            min_dynamic_port: 20_000,
            max_dynamic_port: 20_009,
            ..NodeNetwork::default()
        };
        node
    }));
    h
}

/// Ports held by live allocations, per node, in the order found.
fn ports_per_node(h: &Harness) -> BTreeMap<NodeId, Vec<u16>> {
    let mut held: BTreeMap<NodeId, Vec<u16>> = BTreeMap::new();
    for alloc in h.store.snapshot().allocs().filter(|alloc| !alloc.terminal()) {
        held.entry(alloc.node_id).or_default().extend(alloc.port_values());
    }
    held
}

#[test]
fn dynamic_ports_are_unique_per_node_and_reach_the_task() {
    let mut h = port_cluster();
    let job = with_ports(service_job("web", 8, 1), &[], &["http", "admin"]);
    place(&mut h, &job);
    assert_eq!(h.live_allocs(&job).len(), 8);
    for (node, ports) in ports_per_node(&h) {
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "node {node}: {ports:?}");
        assert!(ports.iter().all(|port| (20_000..=20_009).contains(port)), "{ports:?}");
    }
    assert!(h.store.snapshot().port_collisions().is_empty());
    let alloc = &h.live_allocs(&job)[0];
    let env = port_env(alloc, NOMAD_ENV_PREFIX);
    let http = alloc.ports.iter().find(|port| &*port.label == "http").expect("an http port");
    assert_eq!(env["NOMAD_PORT_http"], http.value.to_string());
    assert_eq!(env["NOMAD_ADDR_http"], format!("{}:{}", http.host_ip, http.value));
    assert!(http.host_ip.starts_with("10.0.0."), "the node's address");
}

#[test]
fn a_node_whose_dynamic_range_is_used_up_gets_no_more() {
    let mut h = port_cluster();
    // Two ports each: twenty ports on two nodes hold ten allocations.
    let job = with_ports(service_job("web", 12, 1), &[], &["http", "admin"]);
    place(&mut h, &job);
    assert_eq!(h.live_allocs(&job).len(), 10);
    let update = h.last_update();
    let metric = &update.failed_tg_allocs["group"];
    assert_eq!(metric.dimension_exhausted.get("network: dynamic port selection failed"), Some(&2), "{metric:?}");
    assert_eq!(update.queued_allocations.get("group"), Some(&2));
    assert!(h.store.snapshot().port_collisions().is_empty());
    // A third job asking for one dynamic port finds none either.
    let other = with_ports(service_job("other", 1, 1), &[], &["http"]);
    place(&mut h, &other);
    assert!(h.live_allocs(&other).is_empty());
}

#[test]
fn a_static_port_is_held_once_per_node_and_never_a_reserved_one() {
    let mut h = port_cluster();
    let job = with_ports(service_job("db", 3, 1), &[("db", 5432)], &["http"]);
    place(&mut h, &job);
    assert_eq!(h.live_allocs(&job).len(), 2, "one per node");
    let metric = &h.last_update().failed_tg_allocs["group"];
    assert_eq!(metric.dimension_exhausted.get("network: reserved port collision db=5432"), Some(&2), "{metric:?}");
    let ssh = with_ports(service_job("ssh", 1, 1), &[("ssh", 22)], &[]);
    place(&mut h, &ssh);
    assert!(h.live_allocs(&ssh).is_empty(), "port 22 is reserved on every node");
    // A stop in the plan frees its port for a replacement: a destructive
    // update moves the static port to the new allocations.
    let mut updated = job.clone();
    updated.task_groups[0].tasks[0].resources.cpu = 200;
    place(&mut h, &updated);
    assert_eq!(h.live_allocs(&updated).len(), 2);
    assert!(h.live_allocs(&updated).iter().all(|alloc| alloc.resources.cpu == 200));
    assert!(h.store.snapshot().port_collisions().is_empty());
}

/// One node of 1000 MHz full with allocations of (job, priority, cpu).
fn full_node(allocs: &[(&str, u8, u64)]) -> Harness {
    let mut h = Harness::new(NOW);
    h.add_nodes([Node::new_ready(NodeId::from_u128(1), "dc1", "c", Resources::new(1000, 1000, 0))]);
    for (id, priority, cpu) in allocs {
        let mut low = Job::new_simple(id, JobType::Service, 1, Resources::new(*cpu, 10, 0));
        low.priority = *priority;
        place(&mut h, &low);
        assert_eq!(h.live_allocs(&low).len(), 1, "{id} placed");
    }
    h
}

fn system_job(priority: u8, cpu: u64) -> Job {
    let mut job = Job::new_simple("agent", JobType::System, 1, Resources::new(cpu, 10, 0));
    job.priority = priority;
    job
}

#[test]
fn a_system_job_preempts_lower_priority_work_and_not_higher() {
    let mut h = full_node(&[("batchy", 20, 600), ("servicey", 40, 400)]);
    let agent = system_job(80, 300);
    place(&mut h, &agent);
    assert_eq!(h.live_allocs(&agent).len(), 1, "placed by evicting");
    let plan = h.last_plan();
    assert_eq!(plan.preemption_count(), 1);
    let snapshot = h.store.snapshot();
    let evicted: Vec<&std::sync::Arc<Allocation>> =
        snapshot.allocs().filter(|alloc| alloc.desired_status == DesiredStatus::Evict).collect();
    assert_eq!(evicted.len(), 1);
    assert_eq!(&*evicted[0].job_id, "batchy", "the lowest priority, and enough");
    let placed = &h.live_allocs(&agent)[0];
    assert_eq!(evicted[0].preempted_by_allocation, Some(placed.id));
    assert_eq!(placed.preempted_allocations, vec![evicted[0].id]);
    let follow_up = snapshot
        .evals_by_job(&evicted[0].job_key())
        .find(|eval| eval.triggered_by == TriggerReason::Preemption)
        .expect("the evicted job gets an eval");
    assert_eq!(follow_up.priority, 20);
    assert!(snapshot.oversubscribed_nodes().is_empty());

    let mut h = full_node(&[("important", 90, 1000)]);
    let agent = system_job(80, 300);
    place(&mut h, &agent);
    assert!(h.live_allocs(&agent).is_empty(), "priority 90 is not evicted for 80");
    assert_eq!(h.last_update().failed_tg_allocs["group"].dimension_exhausted.get("cpu"), Some(&1));
    assert!(h.store.snapshot().allocs().all(|alloc| alloc.desired_status != DesiredStatus::Evict));
}

#[test]
fn service_preemption_is_off_unless_the_operator_turns_it_on() {
    let mut h = full_node(&[("low", 20, 900)]);
    let mut urgent = Job::new_simple("urgent", JobType::Service, 1, Resources::new(500, 10, 0));
    urgent.priority = 90;
    place(&mut h, &urgent);
    assert!(h.live_allocs(&urgent).is_empty(), "Nomad's default: services do not preempt");
    assert!(h.store.snapshot().allocs().all(|alloc| alloc.desired_status != DesiredStatus::Evict));

    let mut config = SchedulerConfiguration::default();
    config.preemption_config.service_scheduler_enabled = true;
    h.store.apply(Command::SetSchedulerConfig { config, cas_index: None }).expect("config written");
    place(&mut h, &urgent);
    assert_eq!(h.live_allocs(&urgent).len(), 1, "now it evicts");
    let evicted = h.store.snapshot().allocs().filter(|alloc| alloc.desired_status == DesiredStatus::Evict).count();
    assert_eq!(evicted, 1);
}

#[test]
fn an_evicted_job_is_placed_again_where_there_is_room() {
    let mut h = full_node(&[("low", 20, 600)]);
    h.add_nodes([Node::new_ready(NodeId::from_u128(2), "dc1", "c", Resources::new(2000, 1000, 0))]);
    let agent = system_job(80, 500);
    place(&mut h, &agent);
    assert_eq!(h.live_allocs(&agent).len(), 2, "one per node, the first by evicting");
    let snapshot = h.store.snapshot();
    let low = crate::structs::JobKey::new("default", "low");
    let eval = snapshot
        .evals_by_job(&low)
        .find(|eval| eval.triggered_by == TriggerReason::Preemption)
        .expect("an eval for the evicted job")
        .clone();
    h.process(&eval).expect("scheduled");
    let live: Vec<_> = h.store.snapshot().allocs_by_job(&low).filter(|alloc| !alloc.terminal()).cloned().collect();
    assert_eq!(live.len(), 1, "placed again");
    assert_eq!(live[0].node_id, NodeId::from_u128(2), "on the node with room");
}

#[test]
fn a_system_job_takes_its_static_port_from_lower_priority_holders_only() {
    let mut h = port_cluster();
    // Node 1 and node 2 each get one holder of 8080: low priority first, then high.
    let mut low = with_ports(service_job("low", 1, 1), &[("web", 8080)], &[]);
    low.priority = 20;
    place(&mut h, &low);
    let mut high = with_ports(service_job("high", 1, 1), &[("web", 8080)], &[]);
    high.priority = 90;
    place(&mut h, &high);
    let low_node = h.live_allocs(&low)[0].node_id;
    assert_ne!(low_node, h.live_allocs(&high)[0].node_id, "one holder of 8080 per node");
    let agent = with_ports(system_job(80, 100), &[("web", 8080)], &["metrics"]);
    place(&mut h, &agent);
    let placed = h.live_allocs(&agent);
    assert_eq!(placed.len(), 1, "only where the holder may be evicted");
    assert_eq!(placed[0].node_id, low_node);
    assert!(h.live_allocs(&low).is_empty(), "the low-priority holder was evicted");
    let metric = &h.last_update().failed_tg_allocs["group"];
    assert_eq!(metric.dimension_exhausted.get("network: reserved port collision web=8080"), Some(&1), "{metric:?}");
    assert!(h.store.snapshot().port_collisions().is_empty());
}

#[test]
fn two_groups_of_a_system_job_never_share_a_port_on_a_node() {
    let mut h = port_cluster();
    let mut agent = with_ports(system_job(50, 100), &[("web", 8080)], &[]);
    let mut second = agent.task_groups[0].clone();
    second.name = "second".into();
    agent.task_groups.push(second);
    place(&mut h, &agent);
    let by_group = |group: &str| h.live_allocs(&agent).iter().filter(|alloc| &*alloc.task_group == group).count();
    assert_eq!((by_group("group"), by_group("second")), (2, 0), "the first group holds 8080 on both nodes");
    assert!(h.store.snapshot().port_collisions().is_empty());
    let metric = &h.last_update().failed_tg_allocs["second"];
    assert_eq!(metric.dimension_exhausted.get("network: reserved port collision web=8080"), Some(&2), "{metric:?}");
}

/// Three nodes: 1 and 2 with the host network `public` (203.0.113.1 and
/// .2), 3 without.
fn host_network_cluster() -> Harness {
    let h = port_cluster();
    h.add_nodes([1, 2, 3].map(|i| {
        let mut node = Node::new_ready(NodeId::from_u128(i), "dc1", "c", Resources::new(64_000, 64_000, 0));
        node.network.ip = format!("10.0.0.{i}").into();
        if i < 3 {
            let public = HostNetwork {
                ip: format!("203.0.113.{i}").into(),
                device: "eth1".into(),
                reserved_ports: PortSet::default(),
            };
            node.network.host_networks.insert("public".into(), public);
        }
        node
    }));
    h
}

#[test]
fn a_port_on_a_host_network_is_given_its_address_and_a_node_without_it_is_filtered() {
    let mut h = host_network_cluster();
    let mut job = with_ports(service_job("web", 3, 1), &[("http", 8080)], &["admin"]);
    job.task_groups[0].networks[0].reserved_ports[0].host_network = Some("public".into());
    place(&mut h, &job);
    let placed = h.live_allocs(&job);
    assert_eq!(placed.len(), 2, "one per node with the network (a static port)");
    for alloc in &placed {
        let n = alloc.node_id.0.as_u128();
        assert!(n < 3, "never on the node without `public`");
        let port = |label: &str| alloc.ports.iter().find(|port| &*port.label == label).expect("given").clone();
        assert_eq!(&*port("http").host_ip, format!("203.0.113.{n}"), "the host network's address");
        assert_eq!(port("http").value, 8080);
        assert_eq!(&*port("admin").host_ip, format!("10.0.0.{n}"), "no host network: the node's own address");
    }
    let update = h.last_update();
    let metric = &update.failed_tg_allocs["group"];
    assert!(
        metric.constraint_filtered.get("missing host network \"public\" for port \"http\"").is_some_and(|n| *n >= 1),
        "{metric:?}"
    );
    let blocked = h.created_evals.iter().find(|eval| eval.status == crate::structs::EvalStatus::Blocked);
    assert!(
        blocked.is_some_and(|eval| eval.escaped_computed_class),
        "host networks are not in the computed class: the blocked eval escapes it"
    );

    let mut nowhere = with_ports(service_job("private", 1, 1), &[], &["http"]);
    nowhere.task_groups[0].networks[0].dynamic_ports[0].host_network = Some("private".into());
    place(&mut h, &nowhere);
    assert!(h.live_allocs(&nowhere).is_empty(), "no node has `private`");
    let metric = &h.last_update().failed_tg_allocs["group"];
    assert_eq!(metric.constraint_filtered.get("missing host network \"private\" for port \"http\""), Some(&3));
}

#[test]
fn a_system_job_runs_only_on_the_nodes_with_its_host_network() {
    let mut h = host_network_cluster();
    let mut agent = with_ports(system_job(50, 100), &[], &["metrics"]);
    agent.task_groups[0].networks[0].dynamic_ports[0].host_network = Some("public".into());
    place(&mut h, &agent);
    let mut on: Vec<(u128, String)> = h
        .live_allocs(&agent)
        .iter()
        .map(|alloc| (alloc.node_id.0.as_u128(), alloc.ports[0].host_ip.to_string()))
        .collect();
    on.sort();
    assert_eq!(on, vec![(1, "203.0.113.1".to_string()), (2, "203.0.113.2".to_string())]);
}

#[test]
fn what_a_node_reserves_is_never_given() {
    let mut h = Harness::new(NOW);
    let mut node = Node::new_ready(NodeId::from_u128(1), "dc1", "c", Resources::new(4000, 8192, 10_000));
    node.reserved = Resources::new(1000, 4192, 2000);
    node.network = NodeNetwork {
        reserved_ports: PortSet::parse_list("22,8080,20000-20004").expect("a port list"),
        min_dynamic_port: 20_000,
        max_dynamic_port: 20_009,
        ..NodeNetwork::default()
    };
    h.add_nodes([node]);
    for (id, cpu, memory, disk) in [("cpu", 3001, 1, 0), ("memory", 1, 4001, 0), ("disk", 1, 1, 8001)] {
        let mut job = service_job(id, 1, 1);
        job.task_groups[0].tasks[0].resources = Resources::new(cpu, memory, disk);
        place(&mut h, &job);
        assert!(h.live_allocs(&job).is_empty(), "{id}: more than the allocatable");
        let metric = &h.last_update().failed_tg_allocs["group"];
        assert_eq!(metric.dimension_exhausted.get(id), Some(&1), "{id}: {metric:?}");
    }
    for port in [22, 8080, 20_003] {
        let job = with_ports(service_job(&format!("static{port}"), 1, 1), &[("p", port)], &[]);
        place(&mut h, &job);
        assert!(h.live_allocs(&job).is_empty(), "{port} is reserved");
    }
    let dynamic = with_ports(service_job("dynamic", 6, 1), &[], &["http"]);
    place(&mut h, &dynamic);
    let mut given: Vec<u16> = h.live_allocs(&dynamic).iter().flat_map(|alloc| alloc.port_values()).collect();
    given.sort_unstable();
    assert_eq!(given, vec![20_005, 20_006, 20_007, 20_008, 20_009], "five free in the range, none reserved");
    assert!(h.store.snapshot().port_collisions().is_empty());
    // What the five use (100 MHz, 64 MiB each) and this one make exactly the allocatable.
    let mut fits = service_job("fits", 1, 1);
    fits.task_groups[0].tasks[0].resources = Resources::new(2500, 3680, 0);
    place(&mut h, &fits);
    assert_eq!(h.live_allocs(&fits).len(), 1, "exactly the allocatable fits");
    assert!(h.store.snapshot().oversubscribed_nodes().is_empty());
}
