//! A node drain driven as an operator drives it, with Nomad's HTTP API and
//! `drover node drain`, against a real `drover server --dev` and two
//! `drover agent --dev` (the mock driver): a service job of count 4 with
//! `migrate { max_parallel = 1 }` runs on both nodes, with a system job on
//! each. Draining one node with `--ignore-system` moves its service
//! allocations to the other while at least 3 of the 4 run all through
//! (sampled with blocking queries), completes and clears; the system
//! allocation stays. Draining it again without `--ignore-system` stops the
//! system allocation. Disabling the drain makes the node eligible again,
//! and the system job comes back to it.
//!
//! Five of six nodes drained at once, with one group of 12 spread over
//! them and `migrate { max_parallel = 2 }`: at no sampled moment are more
//! than 2 of its allocations unavailable (not running healthy).
//!
//! An agent with a `drain_on_shutdown` block, asked to stop, drains its
//! node first: its allocations move before it exits.
//!
//! Waits are the API's blocking queries, bounded by a watchdog that only
//! turns a hang into a failure.

mod common;

use std::sync::atomic::Ordering;

use common::api::{fewest_of, running_nodes as running, until};
use common::bounded;
use common::dev::DevCluster;
use serde_json::{json, Value};

const COUNT: usize = 4;

fn service_job() -> Value {
    json!({"Job": {"ID": "web", "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "web", "Count": COUNT,
            "Migrate": {"MaxParallel": 1, "HealthCheck": "task_states", "MinHealthyTime": 0},
            "Tasks": [{"Name": "main", "Driver": "mock", "Resources": {"CPU": 10, "MemoryMB": 10}}]}]}})
}

fn system_job() -> Value {
    json!({"Job": {"ID": "agent", "Type": "system", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "agent", "Count": 1,
            "Tasks": [{"Name": "main", "Driver": "mock", "Resources": {"CPU": 10, "MemoryMB": 10}}]}]}})
}

async fn submit(cluster: &DevCluster, job: &Value) {
    let written = cluster.api.request("PUT", "/v1/jobs", Some(job)).await.expect("answer");
    assert_eq!(written.status, 200, "{}", written.body);
}

/// Runs `drover node drain ARGS` against the cluster; its stdout.
async fn drain_cli(cluster: &DevCluster, args: &[&str]) -> String {
    let mut command = common::drover();
    command.args(["node", "drain"]).args(args).args(["--address", &cluster.http]);
    let output = bounded("drover node drain", tokio::task::spawn_blocking(move || command.output()))
        .await
        .expect("joined")
        .expect("the CLI runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{args:?}: {stdout}{}", String::from_utf8_lossy(&output.stderr));
    stdout
}

async fn node(cluster: &DevCluster, id: &str) -> Value {
    cluster.api.get(&format!("/v1/node/{id}")).await.expect("node").json().expect("JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_moves_a_service_one_allocation_at_a_time_and_system_jobs_last() {
    let mut cluster = DevCluster::start("drain", &[]).await;
    cluster.add_agent("second", &[]);
    until(&cluster.api, "/v1/nodes", "two nodes ready", |nodes| {
        nodes.as_array().is_some_and(|list| list.iter().filter(|node| node["Status"] == "ready").count() == 2)
    })
    .await;
    submit(&cluster, &system_job()).await;
    submit(&cluster, &service_job()).await;
    let allocs =
        until(&cluster.api, "/v1/job/web/allocations", "the service running", |allocs| running(allocs).len() == COUNT)
            .await;
    until(&cluster.api, "/v1/job/agent/allocations", "the system job on both", |allocs| running(allocs).len() == 2)
        .await;
    let nodes = running(&allocs);
    let drained = nodes[0].clone();
    let on_drained = nodes.iter().filter(|node| **node == drained).count();
    assert!(on_drained > 0 && on_drained < COUNT, "the service is spread over both nodes: {nodes:?}");

    // Sample the running allocations all through the drain.
    let (sampler, fewest) = fewest_of(&cluster.api, "/v1/job/web/allocations", COUNT, |allocs| running(allocs).len());
    let printed = drain_cli(&cluster, &["--enable", "--ignore-system", "--deadline", "5m", &drained]).await;
    assert!(printed.contains("drain strategy set"), "{printed}");
    assert!(printed.contains(&format!("Drain complete for node {drained}")), "{printed}");
    assert!(printed.contains("have stopped"), "{printed}");
    let allocs = until(&cluster.api, "/v1/job/web/allocations", "the service moved", |allocs| {
        let nodes = running(allocs);
        nodes.len() == COUNT && nodes.iter().all(|node| *node != drained)
    })
    .await;
    sampler.abort();
    let fewest = fewest.load(Ordering::SeqCst);
    assert!(fewest >= COUNT - 1, "only {fewest} of {COUNT} ran during the drain: {allocs}");

    let drained_node = node(&cluster, &drained).await;
    assert_eq!(drained_node["DrainStrategy"], Value::Null, "{drained_node}");
    assert_eq!(drained_node["Drain"], false);
    assert_eq!(drained_node["SchedulingEligibility"], "ineligible");
    assert_eq!(drained_node["LastDrain"]["Status"], "complete");
    let system: Value = cluster.api.get("/v1/job/agent/allocations").await.expect("read").json().expect("JSON");
    assert!(running(&system).contains(&drained), "--ignore-system leaves the system allocation: {system}");

    // Again, without --ignore-system: the system allocation goes too.
    let printed = drain_cli(&cluster, &["--enable", "--deadline", "5m", &drained]).await;
    assert!(printed.contains(&format!("Drain complete for node {drained}")), "{printed}");
    let system = until(&cluster.api, "/v1/job/agent/allocations", "the system allocation stopped", |allocs| {
        !running(allocs).contains(&drained)
    })
    .await;
    let stopped = system.as_array().expect("a list").iter().find(|stub| stub["NodeID"] == drained.as_str());
    assert_eq!(stopped.expect("the drained node's")["DesiredDescription"], "alloc not needed as node is tainted");

    // Ending the drain makes the node eligible: the system job returns.
    let printed = drain_cli(&cluster, &["--disable", &drained]).await;
    assert!(printed.contains("drain strategy unset"), "{printed}");
    assert_eq!(node(&cluster, &drained).await["SchedulingEligibility"], "eligible");
    until(&cluster.api, "/v1/job/agent/allocations", "the system job back on the node", |allocs| {
        running(allocs).contains(&drained)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_drain_request_is_refused_and_changes_nothing() {
    let cluster = DevCluster::start("drain-refused", &[]).await;
    let nodes = until(&cluster.api, "/v1/nodes", "the node ready", |nodes| {
        nodes.as_array().is_some_and(|list| list.iter().any(|node| node["Status"] == "ready"))
    })
    .await;
    let id = nodes[0]["ID"].as_str().expect("an id").to_string();
    let unknown = "00000000-0000-0000-0000-000000000001";
    let answer = cluster
        .api
        .request("PUT", &format!("/v1/node/{unknown}/drain"), Some(&json!({"DrainSpec": {"Deadline": 0}})))
        .await
        .expect("answer");
    assert_eq!(answer.status, 404, "{}", answer.body);
    let answer = cluster.api.request("PUT", &format!("/v1/node/{id}/drain"), Some(&json!({"DrainSpec": "soon"}))).await;
    assert_eq!(answer.expect("answer").status, 400);

    // A batch allocation holds the drain open (it has no deadline), and a
    // draining node cannot be made eligible.
    let batch = json!({"Job": {"ID": "report", "Type": "batch", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "report", "Count": 1,
            "Tasks": [{"Name": "main", "Driver": "mock", "Resources": {"CPU": 10, "MemoryMB": 10}}]}]}});
    submit(&cluster, &batch).await;
    until(&cluster.api, "/v1/job/report/allocations", "the batch job running", |allocs| running(allocs).len() == 1)
        .await;
    let drain = json!({"DrainSpec": {"Deadline": 0, "IgnoreSystemJobs": false}, "Meta": {"ticket": "OPS-1"}});
    let answer = cluster.api.request("PUT", &format!("/v1/node/{id}/drain"), Some(&drain)).await.expect("answer");
    assert_eq!(answer.status, 200, "{}", answer.body);
    let eligible = json!({"Eligibility": "eligible"});
    let answer = cluster.api.request("PUT", &format!("/v1/node/{id}/eligibility"), Some(&eligible)).await;
    let answer = answer.expect("answer");
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert!(answer.body.contains("while it is draining"), "{}", answer.body);
    let draining = node(&cluster, &id).await;
    assert_eq!(draining["DrainStrategy"]["Deadline"], 0, "{draining}");
    assert_eq!(draining["LastDrain"]["Status"], "draining");
    assert_eq!(draining["LastDrain"]["Meta"]["ticket"], "OPS-1");
    let batch_allocs: Value = cluster.api.get("/v1/job/report/allocations").await.expect("read").json().expect("JSON");
    assert_eq!(running(&batch_allocs), vec![id.clone()], "a batch allocation runs on without a deadline");

    // Ended by the operator, kept ineligible: the record says canceled.
    let end = json!({"DrainSpec": null, "MarkEligible": false});
    let answer = cluster.api.request("PUT", &format!("/v1/node/{id}/drain"), Some(&end)).await.expect("answer");
    assert_eq!(answer.status, 200, "{}", answer.body);
    let ended = node(&cluster, &id).await;
    assert_eq!(ended["DrainStrategy"], Value::Null);
    assert_eq!(ended["LastDrain"]["Status"], "canceled");
    assert_eq!(ended["LastDrain"]["Meta"]["ticket"], "OPS-1", "the record keeps the drain's meta");
    assert_eq!(ended["SchedulingEligibility"], "ineligible");

    let evaluated = cluster.api.request("PUT", &format!("/v1/node/{id}/evaluate"), None).await.expect("answer");
    assert_eq!(evaluated.status, 200, "{}", evaluated.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_with_drain_on_shutdown_moves_its_allocations_before_it_exits() {
    let mut cluster = DevCluster::start("drain-on-shutdown", &[]).await;
    let config = cluster.dir.join("leaving.toml");
    std::fs::write(&config, "[client.drain_on_shutdown]\ndeadline = \"1m\"\n").expect("config");
    let leaving = cluster.add_agent("leaving", &["--config".as_ref(), config.as_os_str()]);
    let nodes = until(&cluster.api, "/v1/nodes", "two nodes ready", |nodes| {
        nodes.as_array().is_some_and(|list| list.iter().filter(|node| node["Status"] == "ready").count() == 2)
    })
    .await;
    let list = nodes.as_array().expect("a list");
    let leaving_node = list.iter().find(|node| node["Name"] == "leaving").expect("the leaving agent's node");
    let leaving_node = leaving_node["ID"].as_str().expect("an id").to_string();
    submit(&cluster, &service_job()).await;
    until(&cluster.api, "/v1/job/web/allocations", "the service on both nodes", |allocs| {
        let nodes = running(allocs);
        nodes.len() == COUNT && nodes.contains(&leaving_node)
    })
    .await;

    let mut agent = cluster.children.remove(leaving);
    let pid = rustix::process::Pid::from_child(&agent);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
    let status = bounded("the agent's exit", tokio::task::spawn_blocking(move || agent.wait()))
        .await
        .expect("joined")
        .expect("status");
    assert!(status.success(), "the agent exits cleanly: {status}");
    // It left only once everything it ran had moved and was reported.
    let allocs: Value = cluster.api.get("/v1/job/web/allocations").await.expect("read").json().expect("JSON");
    let nodes = running(&allocs);
    assert!(!nodes.contains(&leaving_node), "nothing runs on the node the agent left: {allocs}");
    let moved = allocs.as_array().expect("a list").iter().filter(|stub| stub["NodeID"] == leaving_node.as_str());
    assert!(moved.clone().count() > 0);
    assert!(moved.clone().all(|stub| stub["DesiredDescription"] == "alloc is being migrated"), "{allocs}");
    until(&cluster.api, "/v1/job/web/allocations", "the service whole again", |allocs| running(allocs).len() == COUNT)
        .await;
    let node = node(&cluster, &leaving_node).await;
    assert_eq!(node["SchedulingEligibility"], "ineligible", "{node}");
    assert!(node["LastDrain"]["Status"] == "draining" || node["LastDrain"]["Status"] == "complete", "{node}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_drains_at_once_keep_the_group_within_its_budget() {
    const SPREAD: usize = 12;
    const MAX_PARALLEL: usize = 2;
    let mut cluster = DevCluster::start("drain-many", &[]).await;
    for n in 1..=5 {
        cluster.add_agent(&format!("extra-{n}"), &[]);
    }
    let nodes = until(&cluster.api, "/v1/nodes", "six nodes ready", |nodes| {
        nodes.as_array().is_some_and(|list| list.iter().filter(|node| node["Status"] == "ready").count() == 6)
    })
    .await;
    let job = json!({"Job": {"ID": "wide", "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "wide", "Count": SPREAD,
            "Migrate": {"MaxParallel": MAX_PARALLEL, "HealthCheck": "task_states", "MinHealthyTime": 0},
            "Tasks": [{"Name": "main", "Driver": "mock", "Resources": {"CPU": 10, "MemoryMB": 10}}]}]}});
    submit(&cluster, &job).await;
    /// Running, healthy allocations the group wants.
    fn serving(allocs: &Value) -> Vec<String> {
        let list = allocs.as_array().map(Vec::as_slice).unwrap_or_default();
        let serving = list.iter().filter(|stub| {
            stub["DesiredStatus"] == "run"
                && stub["ClientStatus"] == "running"
                && stub["DeploymentStatus"]["Healthy"] == true
        });
        serving.map(|stub| stub["NodeID"].as_str().expect("a node").to_string()).collect()
    }
    until(&cluster.api, "/v1/job/wide/allocations", "the group serving", |allocs| serving(allocs).len() == SPREAD)
        .await;
    let ids: Vec<String> =
        nodes.as_array().expect("a list").iter().map(|node| node["ID"].as_str().expect("an id").to_string()).collect();
    let (kept, drained) = ids.split_first().expect("six");

    let (sampler, fewest) = fewest_of(&cluster.api, "/v1/job/wide/allocations", SPREAD, |allocs| serving(allocs).len());
    let mut drains = tokio::task::JoinSet::new();
    for id in drained {
        let (api, path) = (cluster.api.clone(), format!("/v1/node/{id}/drain"));
        let drain = json!({"DrainSpec": {"Deadline": 0, "IgnoreSystemJobs": false}});
        drains.spawn(async move {
            let answer = api.request("PUT", &path, Some(&drain)).await.expect("answer");
            assert_eq!(answer.status, 200, "{}", answer.body);
        });
    }
    while let Some(drained) = drains.join_next().await {
        drained.expect("a drain request");
    }
    let allocs = until(&cluster.api, "/v1/job/wide/allocations", "the group moved to the one node left", |allocs| {
        let nodes = serving(allocs);
        nodes.len() == SPREAD && nodes.iter().all(|node| node == kept)
    })
    .await;
    sampler.abort();
    let fewest = fewest.load(Ordering::SeqCst);
    println!("fewest serving during the drains: {fewest} of {SPREAD}");
    assert!(fewest >= SPREAD - MAX_PARALLEL, "only {fewest} of {SPREAD} served during the drains: {allocs}");
    for id in drained {
        let path = format!("/v1/node/{id}");
        until(&cluster.api, &path, "each drain complete", |node| node["LastDrain"]["Status"] == "complete").await;
    }
}
