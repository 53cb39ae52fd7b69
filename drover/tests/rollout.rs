//! A rollout driven as a user drives it, through Nomad's HTTP API, against a
//! real `drover server --dev` and `drover agent --dev` running raw_exec
//! tasks: version 0 deploys; version 1 with `canary = 1` places one canary
//! while the old allocations keep running; promoting it rolls the group
//! over and the version turns stable; version 2 crashes on start: its
//! deployment fails on the first unhealthy allocation and auto-revert
//! registers version 3 equal to version 1, and all through version 2 at
//! least `count - max_parallel` healthy allocations run. `drover job plan`
//! is not needed here; `drover deployment status` reads the end.
//!
//! Waits are the API's blocking queries, bounded by a watchdog that only
//! turns a hang into a failure.

mod common;

use common::api::until;
use common::bounded;
use common::dev::DevCluster;
use serde_json::{json, Value};

const SECOND: u64 = 1_000_000_000;
const COUNT: u64 = 3;
const MAX_PARALLEL: u64 = 1;

/// Job `web`: `COUNT` raw_exec tasks running `command`, rolled out one at a
/// time with `canary` canaries, health from task states held for 1 s, and
/// auto-revert on the first unhealthy allocation.
fn job(command: &str, canary: u64) -> Value {
    json!({"Job": {"ID": "web", "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "web", "Count": COUNT,
            "Update": {"MaxParallel": MAX_PARALLEL, "Canary": canary, "AutoRevert": true,
                "HealthCheck": "task_states", "MinHealthyTime": SECOND, "HealthyDeadline": 20 * SECOND,
                "ProgressDeadline": 0},
            "RestartPolicy": {"Attempts": 0, "Interval": 600 * SECOND, "Delay": 0, "Mode": "fail"},
            "ReschedulePolicy": {"Attempts": 0, "Unlimited": false},
            "Tasks": [{"Name": "main", "Driver": "raw_exec", "KillTimeout": SECOND,
                "Config": {"command": "/bin/sh", "args": ["-c", command]},
                "Resources": {"CPU": 50, "MemoryMB": 32}}]}]}})
}

async fn submit(cluster: &DevCluster, job: &Value) {
    let written = cluster.api.request("PUT", "/v1/jobs", Some(job)).await.expect("answer");
    assert_eq!(written.status, 200, "{}", written.body);
}

/// Blocks until the job's latest deployment satisfies `done`; it.
async fn deployment_until(cluster: &DevCluster, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    until(&cluster.api, "/v1/job/web/deployment", what, |deployment| !deployment.is_null() && done(deployment)).await
}

/// Live allocations of the job that run and are healthy, by job version.
fn healthy_running(allocs: &Value) -> Vec<u64> {
    let list = allocs.as_array().map(Vec::as_slice).unwrap_or_default();
    list.iter()
        .filter(|stub| stub["DesiredStatus"] == "run" && stub["ClientStatus"] == "running")
        .filter(|stub| stub["DeploymentStatus"]["Healthy"] == true)
        .map(|stub| stub["JobVersion"].as_u64().expect("a version"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_promote_then_a_crashing_version_fails_and_reverts_without_dropping_below_the_budget() {
    let cluster = DevCluster::start("rollout", &[]).await;
    submit(&cluster, &job("sleep 600", 1)).await;
    let first = deployment_until(&cluster, "version 0 deployed", |d| d["Status"] == "successful").await;
    assert_eq!(first["JobVersion"], 0);

    // Version 1: one canary beside the three running allocations.
    submit(&cluster, &job("sleep 601", 1)).await;
    let waiting = deployment_until(&cluster, "the canary healthy", |d| {
        d["JobVersion"] == 1 && d["TaskGroups"]["web"]["HealthyAllocs"] == 1
    })
    .await;
    assert_eq!(waiting["StatusDescription"], "Deployment is running but requires manual promotion");
    assert_eq!(waiting["TaskGroups"]["web"]["PlacedCanaries"].as_array().map(Vec::len), Some(1));
    let allocs = cluster.api.get("/v1/job/web/allocations").await.expect("allocations").json().expect("JSON");
    let versions = healthy_running(&allocs);
    assert_eq!(versions.iter().filter(|version| **version == 0).count(), 3, "the old ones keep running: {versions:?}");

    let id = waiting["ID"].as_str().expect("an id");
    let promote = json!({"DeploymentID": id, "All": true});
    let promoted =
        cluster.api.request("POST", &format!("/v1/deployment/promote/{id}"), Some(&promote)).await.expect("answer");
    assert_eq!(promoted.status, 200, "{}", promoted.body);
    deployment_until(&cluster, "version 1 rolled out", |d| d["JobVersion"] == 1 && d["Status"] == "successful").await;
    let versions = until(&cluster.api, "/v1/job/web/versions", "version 1 stable", |versions| {
        versions["Versions"][0]["Version"] == 1 && versions["Versions"][0]["Stable"] == true
    })
    .await;
    assert_eq!(versions["Versions"][0]["Version"], 1);

    // Version 2 crashes on start; no canary this time, so it rolls.
    submit(&cluster, &job("exit 1", 0)).await;
    let fewest = bounded("version 2 fails and reverts", async {
        let mut index = 0;
        let mut fewest = COUNT as usize;
        loop {
            let answer =
                cluster.api.get(&format!("/v1/job/web/allocations?index={index}&wait=30s")).await.expect("read");
            index = answer.index.unwrap_or(index);
            let allocs: Value = answer.json().expect("JSON");
            let good = healthy_running(&allocs).iter().filter(|version| **version != 2).count();
            fewest = fewest.min(good);
            let job: Value = cluster.api.get("/v1/job/web").await.expect("job").json().expect("JSON");
            if job["Version"] == 3 && good == COUNT as usize {
                return fewest;
            }
        }
    })
    .await;
    assert!(fewest >= (COUNT - MAX_PARALLEL) as usize, "only {fewest} good allocations ran during version 2");
    let deployments: Value =
        cluster.api.get("/v1/job/web/deployments").await.expect("deployments").json().expect("JSON");
    let failed = deployments.as_array().expect("a list").iter().find(|d| d["JobVersion"] == 2).expect("version 2's");
    assert_eq!(failed["Status"], "failed");
    assert_eq!(failed["StatusDescription"], "Failed due to unhealthy allocations - rolling back to job version 1");
    let reverted: Value = cluster.api.get("/v1/job/web/versions").await.expect("versions").json().expect("JSON");
    let (v3, v1) = (&reverted["Versions"][0], &reverted["Versions"][2]);
    assert_eq!(v3["Version"], 3);
    assert_eq!(
        v3["TaskGroups"][0]["Tasks"][0]["Config"], v1["TaskGroups"][0]["Tasks"][0]["Config"],
        "equal to version 1"
    );
}
