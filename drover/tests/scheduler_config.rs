//! The scheduler configuration on a running cluster (a real `drover
//! server --dev` and `drover agent --dev`): a high-priority service job
//! that does not fit waits while service preemption is off; `drover
//! operator scheduler set-config --preempt-service-scheduler true` turns
//! it on (a stale `--check-index` is refused first, as Nomad's
//! check-and-set), and the job, evaluated again, preempts the
//! low-priority allocation. What Drover does not do (memory
//! oversubscription) is refused, not dropped.

mod common;

use common::api::{json_of, send, until};
use common::dev::DevCluster;
use serde_json::{json, Value};

fn service_job(id: &str, priority: u32, memory_mb: u64) -> Value {
    json!({"Job": {"ID": id, "Name": id, "Type": "service", "Priority": priority, "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "web", "Count": 1,
            "Tasks": [{"Name": "web", "Driver": "mock", "Config": {"run_for": "1h"},
                "Resources": {"CPU": 100, "MemoryMB": memory_mb}}]}]}})
}

fn stdout_of(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turning_on_service_preemption_lets_a_high_priority_job_preempt() {
    let cluster = DevCluster::start("scheduler-config", &[]).await;
    let api = &cluster.api;
    let nodes =
        until(api, "/v1/nodes", "the agent registers", |nodes| nodes.as_array().is_some_and(|list| list.len() == 1))
            .await;
    let node = json_of(api, "GET", &format!("/v1/node/{}", nodes[0]["ID"].as_str().expect("an id")), None).await;
    let memory = node["NodeResources"]["Memory"]["MemoryMB"].as_u64().expect("the node's memory");
    // Each job takes 60% of the node: the two cannot run side by side.
    let share = memory * 6 / 10;
    json_of(api, "PUT", "/v1/jobs", Some(&service_job("low", 20, share))).await;
    until(api, "/v1/job/low/allocations", "low runs", |allocs| allocs[0]["ClientStatus"] == "running").await;
    json_of(api, "PUT", "/v1/jobs", Some(&service_job("high", 80, share))).await;
    until(api, "/v1/job/high/evaluations", "high waits", |evals| {
        evals.as_array().is_some_and(|list| list.iter().any(|eval| eval["Status"] == "blocked"))
    })
    .await;
    assert_eq!(json_of(api, "GET", "/v1/job/high/allocations", None).await, json!([]));

    let before = stdout_of(&cluster.cli(&["operator", "scheduler", "get-config"]).await);
    assert!(before.contains("Preemption Service Scheduler  = false"), "{before}");
    let stale = cluster
        .cli(&["operator", "scheduler", "set-config", "--preempt-service-scheduler", "true", "--check-index", "999999"])
        .await;
    assert_eq!(stale.status.code(), Some(1));
    assert!(stdout_of(&stale).contains("could not be atomically updated"), "{}", stdout_of(&stale));
    let current = json_of(api, "GET", "/v1/operator/scheduler/configuration", None).await;
    let index = current["SchedulerConfig"]["ModifyIndex"].as_u64().expect("an index").to_string();
    let set = cluster
        .cli(&["operator", "scheduler", "set-config", "--preempt-service-scheduler", "true", "--check-index", &index])
        .await;
    assert!(stdout_of(&set).contains("Scheduler configuration updated!"), "{}", stdout_of(&set));
    let after = stdout_of(&cluster.cli(&["operator", "scheduler", "get-config"]).await);
    assert!(after.contains("Preemption Service Scheduler  = true"), "{after}");
    assert!(after.contains("Preemption System Scheduler   = true"), "the rest as it was: {after}");

    json_of(api, "PUT", "/v1/job/high/evaluate", Some(&json!({}))).await;
    until(api, "/v1/job/high/allocations", "high runs", |allocs| {
        allocs.as_array().is_some_and(|list| list.iter().any(|alloc| alloc["ClientStatus"] == "running"))
    })
    .await;
    let low =
        until(api, "/v1/job/low/allocations", "low is preempted", |allocs| allocs[0]["DesiredStatus"] == "evict").await;
    let evicted = json_of(api, "GET", &format!("/v1/allocation/{}", low[0]["ID"].as_str().expect("an id")), None).await;
    assert!(evicted["PreemptedByAllocation"].as_str().is_some_and(|id| !id.is_empty()), "{evicted}");

    let oversubscribe = json!({"SchedulerAlgorithm": "binpack", "MemoryOversubscriptionEnabled": true});
    let refused = send(api, "PUT", "/v1/operator/scheduler/configuration", Some(&oversubscribe)).await;
    assert_eq!(refused.status, 400);
    assert!(refused.body.contains("MemoryOversubscriptionEnabled"), "{}", refused.body);
}
