//! Nomad's `template` blocks with real processes: a real `drover server
//! --dev` and `drover agent --dev` (the `drover` binary, on loopback ports
//! they pick) and raw_exec tasks. Task B's template lists task A's
//! service instances; when A scales from 2 to 3 the file is rendered again
//! and B, with `change_mode = "restart"`, restarts once. A template using
//! a function Drover does not have fails its task with an event naming
//! it; a destination outside the task's directory is refused when the job
//! is submitted; an `env = true` template's variables reach the task's
//! environment and its file has its `perms`.
//!
//! Every wait is a blocking query of the HTTP API (`common::api::until`),
//! bounded by a watchdog that only turns a hang into a failure; files are
//! read through the client file API once what wrote them was observed.

mod common;

use std::collections::BTreeSet;

use common::api::{alloc_of, until};
use common::dev::DevCluster;
use serde_json::{json, Value};

async fn dev_cluster(name: &str) -> DevCluster {
    DevCluster::start(&format!("templates-{name}"), &[]).await
}

/// A raw_exec task that sleeps, as Nomad's JSON has it.
fn sleeper(name: &str) -> Value {
    json!({"Name": name, "Driver": "raw_exec",
        "Config": {"command": "/bin/sh", "args": ["-c", "exec sleep 3600"]},
        "Resources": {"CPU": 100, "MemoryMB": 64}})
}

/// Job `api`: `count` sleepers, each registering service `api` on its port.
fn api_job(count: u32) -> Value {
    json!({"Job": {"ID": "api", "Name": "api", "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "api", "Count": count,
            "Networks": [{"DynamicPorts": [{"Label": "http"}]}],
            "Services": [{"Name": "api", "PortLabel": "http", "Provider": "nomad"}],
            "Tasks": [sleeper("server")]}]}})
}

/// Job `reader`: one sleeper whose template lists `api`'s instances.
fn reader_job() -> Value {
    let mut task = sleeper("reader");
    task["Templates"] = json!([{
        "EmbeddedTmpl": "{{ range nomadService \"api\" }}{{ .Address }}:{{ .Port }}\n{{ end }}",
        "DestPath": "local/upstreams.txt",
        "ChangeMode": "restart",
        "Splay": 1_000_000u64,
    }]);
    json!({"Job": {"ID": "reader", "Name": "reader", "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "reader", "Count": 1, "Tasks": [task]}]}})
}

async fn register(cluster: &DevCluster, job: &Value) {
    let answer = cluster.api.request("PUT", "/v1/jobs", Some(job)).await.expect("answer");
    assert_eq!(answer.status, 200, "{}", answer.body);
}

/// `api`'s registered instances, `address:port`, once there are `count`.
async fn instances(cluster: &DevCluster, count: usize) -> BTreeSet<String> {
    let what = format!("{count} registrations of api");
    let list =
        until(&cluster.api, "/v1/service/api", &what, |list| list.as_array().is_some_and(|l| l.len() == count)).await;
    let rows = list.as_array().expect("a list").iter();
    rows.map(|row| format!("{}:{}", row["Address"].as_str().expect("address"), row["Port"])).collect()
}

/// The lines of the reader's rendered file, read through the agent.
async fn rendered(cluster: &DevCluster, alloc: &str) -> BTreeSet<String> {
    let path = format!("/v1/client/fs/cat/{alloc}?path=reader/local/upstreams.txt");
    let answer = cluster.api.get(&path).await.expect("answer");
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body.lines().map(str::to_string).collect()
}

fn restart_events(state: &Value) -> Vec<&Value> {
    let events = state["Events"].as_array().expect("events");
    events.iter().filter(|event| event["Type"] == "Restart Signaled").collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_lists_a_service_s_instances_and_restarts_its_task_once_when_they_change() {
    let cluster = dev_cluster("scale").await;
    register(&cluster, &api_job(2)).await;
    let two = instances(&cluster, 2).await;

    register(&cluster, &reader_job()).await;
    let running = |stub: &Value| stub["ClientStatus"] == "running";
    let reader = alloc_of(&cluster.api, "reader", "the reader running", running).await;
    let id = reader["ID"].as_str().expect("id").to_string();
    assert_eq!(reader["TaskStates"]["reader"]["Restarts"], 0);
    assert_eq!(rendered(&cluster, &id).await, two, "rendered before the start");

    register(&cluster, &api_job(3)).await;
    let three = instances(&cluster, 3).await;
    assert!(three.is_superset(&two), "{three:?} {two:?}");
    let path = format!("/v1/allocation/{id}");
    let restarted = until(&cluster.api, &path, "the reader restarted and running again", |alloc| {
        let state = &alloc["TaskStates"]["reader"];
        // Any number of restarts ends the wait; the file being the new one
        // says the change was handled, so more than one would show here.
        state["Restarts"].as_u64().is_some_and(|restarts| restarts >= 1) && state["State"] == "running"
    })
    .await;
    let state = &restarted["TaskStates"]["reader"];
    assert_eq!(rendered(&cluster, &id).await, three, "rendered again with the third instance");
    let events = restart_events(state);
    assert_eq!((state["Restarts"].as_u64(), events.len()), (Some(1), 1), "one restart for the change: {state:#}");
    assert_eq!(events[0]["Details"]["restart_reason"], "Template with change_mode restart re-rendered");
    assert_eq!(restarted["ClientStatus"], "running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_using_a_function_drover_lacks_fails_its_task_naming_it() {
    let cluster = dev_cluster("unsupported").await;
    let mut task = sleeper("web");
    task["Templates"] = json!([{"EmbeddedTmpl": "db={{ key \"config/db\" }}", "DestPath": "local/app.conf"}]);
    let job = json!({"Job": {"ID": "consul", "Name": "consul", "Type": "batch", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "web", "Count": 1, "Tasks": [task],
            "ReschedulePolicy": {"Attempts": 0, "Unlimited": false}}]}});
    register(&cluster, &job).await;
    let failed = |stub: &Value| stub["ClientStatus"] == "failed";
    let alloc = alloc_of(&cluster.api, "consul", "the allocation failed", failed).await;
    let state = &alloc["TaskStates"]["web"];
    assert_eq!((state["State"].as_str(), state["Failed"].as_bool()), (Some("dead"), Some(true)), "{state:#}");
    let events = state["Events"].as_array().expect("events");
    let killing = events.iter().find(|event| event["Type"] == "Killing").expect("a Killing event");
    assert_eq!(
        killing["DisplayMessage"], "Template failed: template uses key, which Drover does not support (Consul)",
        "{state:#}"
    );
    assert_eq!(killing["FailsTask"], true);
    assert!(events.iter().all(|event| event["Type"] != "Started"), "the task never started: {state:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_outside_the_task_directory_is_refused_at_submission() {
    let cluster = dev_cluster("escape").await;
    for (destination, why) in [
        ("../../../../etc/cron.d/drover", "climbs out of the task's directory"),
        ("/etc/cron.d/drover", "is an absolute path"),
    ] {
        let mut task = sleeper("web");
        task["Templates"] = json!([{"EmbeddedTmpl": "x", "DestPath": destination}]);
        let job = json!({"Job": {"ID": "escape", "Name": "escape", "Datacenters": ["dc1"],
            "TaskGroups": [{"Name": "web", "Tasks": [task]}]}});
        let answer = cluster.api.request("PUT", "/v1/jobs", Some(&job)).await.expect("answer");
        assert!(matches!(answer.status, 400 | 500), "{destination}: {} {}", answer.status, answer.body);
        assert!(answer.body.contains(why), "{destination}: {}", answer.body);
        assert!(answer.body.contains("would become a path outside it"), "{}", answer.body);
    }
    let jobs = cluster.api.get("/v1/jobs").await.expect("answer").json().expect("jobs");
    assert_eq!(jobs, json!([]), "nothing was registered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_env_template_s_variables_reach_the_task_s_environment() {
    let cluster = dev_cluster("env").await;
    let task = json!({"Name": "printer", "Driver": "raw_exec",
        "Config": {"command": "/bin/sh", "args": ["-c", "echo \"greeting=$GREETING alloc=$ALLOC\""]},
        "Resources": {"CPU": 100, "MemoryMB": 64},
        "Templates": [{"EmbeddedTmpl": "GREETING=\"hello {{ env \"NOMAD_TASK_NAME\" }}\"\nALLOC={{ env \"NOMAD_ALLOC_ID\" }}\n",
            "DestPath": "secrets/app.env", "Envvars": true, "Perms": "0600"}]});
    let job = json!({"Job": {"ID": "printer", "Name": "printer", "Type": "batch", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "printer", "Count": 1, "Tasks": [task]}]}});
    register(&cluster, &job).await;
    let alloc = alloc_of(&cluster.api, "printer", "the printer done", common::api::is_terminal).await;
    assert_eq!(alloc["ClientStatus"], "complete", "{:#}", alloc["TaskStates"]);
    let id = alloc["ID"].as_str().expect("id");
    let path = format!("/v1/client/fs/logs/{id}?task=printer&type=stdout&plain=true");
    let printed = cluster.api.get(&path).await.expect("answer");
    assert_eq!(printed.status, 200, "{}", printed.body);
    assert_eq!(printed.body.trim(), format!("greeting=hello printer alloc={id}"));
    let stat = cluster.api.get(&format!("/v1/client/fs/stat/{id}?path=printer/secrets/app.env")).await.expect("answer");
    let stat = stat.json().expect("a file");
    assert_eq!(stat["FileMode"], "-rw-------", "{stat}");
}
