//! Health checks run by the agent, with real processes: a real `drover
//! server --dev` and `drover agent --dev` (the `drover` binary on loopback
//! ports they pick) and raw_exec tasks: a Python HTTP server whose `http`
//! and `script` checks pass and make the allocation healthy, a task whose
//! `tcp` check fails and, with `check_restart`, restarts it, and a
//! `shutdown_delay` that deregisters the service before the kill. Every
//! result is read back over the HTTP API as Nomad's clients read it
//! (`/v1/client/allocation/:id/checks`, `DeploymentStatus.Healthy`), and
//! through `drover alloc status`.
//!
//! Waits are the API's blocking queries, bounded by a watchdog that only
//! turns a hang into a failure.

mod common;

use common::api::{alloc_of, allocated_port, until};
use common::dev::DevCluster;
use serde_json::{json, Value};

const SECOND: u64 = 1_000_000_000;

async fn dev_cluster(name: &str, server_flags: &[&str]) -> DevCluster {
    DevCluster::start(&format!("checks-{name}"), server_flags).await
}

impl DevCluster {
    async fn submit(&self, job: &Value) {
        let written = self.api.request("PUT", "/v1/jobs", Some(job)).await.expect("answer");
        assert_eq!(written.status, 200, "{}", written.body);
    }

    /// Blocks until the allocation's checks satisfy `done`; them.
    async fn checks_until(&self, alloc_id: &str, what: &str, done: impl Fn(&[&Value]) -> bool) -> Value {
        until(&self.api, &format!("/v1/client/allocation/{alloc_id}/checks"), what, |checks| {
            let results: Vec<&Value> = checks.as_object().map(|map| map.values().collect()).unwrap_or_default();
            done(&results)
        })
        .await
    }
}

fn id_of(alloc: &Value) -> String {
    alloc["ID"].as_str().expect("an id").to_string()
}

/// The task's events of `kind`.
fn events_of<'a>(alloc: &'a Value, task: &str, kind: &str) -> Vec<&'a Value> {
    let events = alloc["TaskStates"][task]["Events"].as_array().map(Vec::as_slice).unwrap_or_default();
    events.iter().filter(|event| event["Type"] == kind).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_and_script_checks_pass_and_the_allocation_turns_healthy() {
    let cluster = dev_cluster("pass", &[]).await;
    let script =
        "exec python3 -m http.server ${NOMAD_PORT_http} --bind ${NOMAD_IP_http} --directory \"$NOMAD_TASK_DIR\"";
    let job = json!({"Job": {"ID": "web", "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "web", "Count": 1, "Networks": [{"DynamicPorts": [{"Label": "http"}]}],
            "Update": {"MinHealthyTime": SECOND, "HealthyDeadline": 120 * SECOND},
            "Tasks": [{"Name": "server", "Driver": "raw_exec", "KillTimeout": SECOND,
                "Config": {"command": "sh", "args": ["-c", script]},
                "Services": [{"Name": "web", "PortLabel": "http", "Checks": [
                    {"Name": "root", "Type": "http", "Path": "/", "Interval": SECOND, "Timeout": SECOND},
                    // Run on the host with the task's variables.
                    {"Name": "env", "Type": "script", "Command": "/bin/sh",
                        "Args": ["-c", "test \"$NOMAD_TASK_NAME\" = server"],
                        "Interval": SECOND, "Timeout": 5 * SECOND}]}],
                "Resources": {"CPU": 100, "MemoryMB": 128}}]}]}});
    cluster.submit(&job).await;
    let alloc = alloc_of(&cluster.api, "web", "the server running", |stub| stub["ClientStatus"] == "running").await;
    let id = id_of(&alloc);

    let checks = cluster
        .checks_until(&id, "both checks passing", |results| {
            results.len() == 2 && results.iter().all(|result| result["Status"] == "success")
        })
        .await;
    let by_name: std::collections::BTreeMap<&str, &Value> = checks
        .as_object()
        .expect("an object keyed by check id")
        .iter()
        .map(|(key, result)| {
            assert_eq!(result["ID"].as_str(), Some(key.as_str()), "keyed by its ID");
            (result["Check"].as_str().expect("a name"), result)
        })
        .collect();
    let http = by_name["root"];
    assert_eq!((http["StatusCode"].as_u64(), http["Mode"].as_str()), (Some(200), Some("healthiness")));
    assert_eq!((http["Service"].as_str(), http["Task"].as_str()), (Some("web"), Some("server")));
    assert_eq!(http["Group"].as_str(), Some("web.web"));
    assert!(http["Timestamp"].as_i64().is_some_and(|at| at > 1_600_000_000), "Unix seconds: {http}");
    assert!(by_name["env"].get("StatusCode").is_none(), "left out unless http, as Nomad: {}", by_name["env"]);

    // Its registration is where the check found it.
    let (ip, port) = allocated_port(&alloc, "http");
    let services = cluster.api.get("/v1/service/web").await.expect("answer").json().expect("JSON");
    assert_eq!((services[0]["Address"].as_str(), services[0]["Port"].as_u64()), (Some(ip.as_str()), Some(port)));

    let healthy =
        alloc_of(&cluster.api, "web", "the allocation healthy", |stub| stub["DeploymentStatus"]["Healthy"] == true)
            .await;
    let health = &healthy["DeploymentStatus"];
    assert_eq!(health["Canary"], false);
    assert!(health["ModifyIndex"].as_u64().is_some_and(|index| index > 0), "{health}");
    assert!(health["Timestamp"].as_str().is_some_and(|at| at.contains('T')), "RFC 3339: {health}");

    let status = cluster.cli_ok(&["alloc", "status", &id]).await;
    let health_line = status.lines().find(|line| line.starts_with("Deployment Health"));
    assert!(health_line.is_some_and(|line| line.ends_with("= healthy")), "{status}");
    let table: Vec<&str> = status.lines().skip_while(|line| *line != "Nomad Service Checks:").collect();
    assert_eq!(
        table.get(1).map(|line| line.split_whitespace().collect::<Vec<_>>()),
        Some(vec!["Service", "Task", "Name", "Mode", "Status"]),
        "{status}"
    );
    assert_eq!(
        table.get(2).map(|line| line.split_whitespace().collect::<Vec<_>>()),
        Some(vec!["web", "server", "env", "healthiness", "success"]),
        "{status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_check_turns_critical_restarts_its_task_and_leaves_the_allocation_unhealthy() {
    let cluster = dev_cluster("fail", &[]).await;
    // The task listens on nothing: the tcp check on its port fails. No
    // deployment (`MaxParallel: 0`): one would replace the unhealthy
    // allocation, and this test watches it stay. Outside a deployment the
    // `migrate` block's settings judge its health, as Nomad's.
    let job = json!({"Job": {"ID": "mute", "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "mute", "Count": 1, "Networks": [{"DynamicPorts": [{"Label": "http"}]}],
            "Update": {"MaxParallel": 0},
            "Migrate": {"MinHealthyTime": SECOND, "HealthyDeadline": 4 * SECOND},
            "RestartPolicy": {"Attempts": 10, "Interval": 600 * SECOND, "Delay": 0, "Mode": "fail"},
            "Tasks": [{"Name": "sleeper", "Driver": "raw_exec", "KillTimeout": SECOND,
                "Config": {"command": "sleep", "args": ["600"]},
                "Services": [{"Name": "mute", "PortLabel": "http", "Checks": [
                    {"Name": "listening", "Type": "tcp", "Interval": SECOND, "Timeout": SECOND,
                        "FailuresBeforeCritical": 2,
                        "CheckRestart": {"Limit": 2, "Grace": 0}}]}],
                "Resources": {"CPU": 100, "MemoryMB": 64}}]}]}});
    cluster.submit(&job).await;
    let alloc = alloc_of(&cluster.api, "mute", "the task running", |stub| stub["ClientStatus"] == "running").await;
    let id = id_of(&alloc);

    let checks = cluster
        .checks_until(&id, "the check failing", |results| results.iter().any(|result| result["Status"] == "failure"))
        .await;
    let failed = checks.as_object().expect("an object").values().next().expect("the check");
    assert!(failed["Output"].as_str().is_some_and(|output| output.contains("tcp")), "{failed}");

    let restarted = alloc_of(&cluster.api, "mute", "the task restarted by its check", |stub| {
        stub["TaskStates"]["sleeper"]["Restarts"].as_u64().is_some_and(|restarts| restarts >= 1)
    })
    .await;
    let signaled = events_of(&restarted, "sleeper", "Restart Signaled");
    assert!(
        signaled.iter().any(|event| event["DisplayMessage"] == "healthcheck: check \"listening\" unhealthy"),
        "{:#}",
        restarted["TaskStates"]
    );

    let unhealthy =
        alloc_of(&cluster.api, "mute", "the allocation unhealthy", |stub| stub["DeploymentStatus"]["Healthy"] == false)
            .await;
    // Unhealthy, not stopped: running, or pending between two restarts.
    let status = unhealthy["ClientStatus"].as_str();
    assert!(matches!(status, Some("running" | "pending")), "{status:?}");
    assert_eq!(unhealthy["DesiredStatus"], "run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_delay_deregisters_the_service_before_the_kill() {
    let cluster = dev_cluster("delay", &[]).await;
    let job = json!({"Job": {"ID": "slow", "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "slow", "Count": 1, "Networks": [{"DynamicPorts": [{"Label": "http"}]}],
            "Tasks": [{"Name": "sleeper", "Driver": "raw_exec", "KillTimeout": SECOND,
                "ShutdownDelay": 3 * SECOND,
                "Config": {"command": "sleep", "args": ["600"]},
                "Services": [{"Name": "slow", "PortLabel": "http"}],
                "Resources": {"CPU": 100, "MemoryMB": 64}}]}]}});
    cluster.submit(&job).await;
    alloc_of(&cluster.api, "slow", "the task running", |stub| stub["ClientStatus"] == "running").await;
    until(&cluster.api, "/v1/service/slow", "the service registered", |list| {
        list.as_array().is_some_and(|list| list.len() == 1)
    })
    .await;

    let stopped = cluster.api.request("DELETE", "/v1/job/slow", None).await.expect("answer");
    assert_eq!(stopped.status, 200, "{}", stopped.body);
    until(&cluster.api, "/v1/service/slow", "the service deregistered", |list| list == &json!([])).await;
    let ended = alloc_of(&cluster.api, "slow", "the task stopped", common::api::is_terminal).await;
    let time_of = |kind: &str| {
        let found = events_of(&ended, "sleeper", kind);
        found
            .first()
            .and_then(|event| event["Time"].as_u64())
            .unwrap_or_else(|| panic!("{kind}: {:#}", ended["TaskStates"]))
    };
    // Deregistered first (the registration went with this event), then
    // the delay, then the kill signal.
    let (waiting, killing) = (time_of("Waiting for shutdown delay"), time_of("Killing"));
    assert!(killing >= waiting + 3 * SECOND, "killed {} ns after the wait began", killing - waiting);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_marked_down_loses_its_registrations() {
    // A short TTL, so the node is marked down soon after its agent dies.
    let mut cluster = dev_cluster("down", &["--min-heartbeat-ttl", "1s", "--heartbeat-grace", "1s"]).await;
    let job = json!({"Job": {"ID": "orphan", "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "orphan", "Count": 1, "Networks": [{"DynamicPorts": [{"Label": "http"}]}],
            "Tasks": [{"Name": "sleeper", "Driver": "raw_exec", "KillTimeout": SECOND,
                // Outlives its killed agent for a while, under its executor.
                "Config": {"command": "sleep", "args": ["60"]},
                "Services": [{"Name": "orphan", "PortLabel": "http"}],
                "Resources": {"CPU": 100, "MemoryMB": 64}}]}]}});
    cluster.submit(&job).await;
    let alloc = alloc_of(&cluster.api, "orphan", "the task running", |stub| stub["ClientStatus"] == "running").await;
    until(&cluster.api, "/v1/service/orphan", "the service registered", |list| {
        list.as_array().is_some_and(|list| list.len() == 1)
    })
    .await;

    let mut agent = cluster.children.remove(1);
    agent.kill().expect("SIGKILL");
    agent.wait().expect("reaped");
    let node = alloc["NodeID"].as_str().expect("a node");
    until(&cluster.api, &format!("/v1/node/{node}"), "the node marked down", |node| node["Status"] == "down").await;
    let services =
        until(&cluster.api, "/v1/service/orphan", "the registration removed", |list| list == &json!([])).await;
    assert_eq!(services, json!([]));
    // The node's evaluation marks its allocation lost, after the node's write.
    let lost = alloc_of(&cluster.api, "orphan", "its allocation lost", |stub| stub["ClientStatus"] == "lost").await;
    assert_eq!(lost["ID"], alloc["ID"]);
}
