//! The `docker` driver with real containers on the machine's Docker
//! Engine: a real `drover server --dev` and a real `drover agent --dev`
//! (the `drover` binary on loopback ports they pick), jobs sent as Nomad
//! users send them (HCL files through `drover job run`), and everything
//! checked from the outside: the HTTP API (allocations, task events, logs,
//! the node's drivers), the engine (`docker inspect`, `docker ps`) and the
//! task's own HTTP answer.
//!
//! The image is built by the tests (`common::docker`): no registry can be
//! reached. Every container a test makes carries a label of its own, and
//! the test removes them when it ends, however it ends.
//!
//! Waits are the API's blocking queries, bounded by a watchdog that only
//! turns a hang into a failure; what nothing announces (a port that starts
//! answering, a log line, the engine's view) is polled with a deadline.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::api::{alloc_of, allocated_port, is_terminal, until};
use common::docker::{containers, docker, remove_test_containers, test_image, TEST_LABEL};
use drover::api::client::ApiClient;
use serde_json::{json, Value};

/// A real `drover server --dev` and `drover agent --dev` (docker on, its
/// plugin settings in `agent.toml` when given), killed and cleaned up when
/// dropped: the processes, the test's containers, the directory.
struct DevCluster {
    server: Child,
    agent: Option<Child>,
    rpc: String,
    api: ApiClient,
    http: String,
    dir: PathBuf,
    /// This test's value of [`TEST_LABEL`].
    label: String,
    agent_config: Option<PathBuf>,
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        for child in self.agent.iter_mut().chain(std::iter::once(&mut self.server)) {
            let _ = child.kill();
            let _ = child.wait();
        }
        remove_test_containers(&self.label);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl DevCluster {
    async fn start(name: &str, agent_config: Option<&str>) -> DevCluster {
        test_image();
        let dir = common::temp_dir(&format!("docker-{name}"));
        let mut server = common::drover()
            .args(["server", "--dev", "--bind", "127.0.0.1", "--port", "0", "--http-port", "0", "--print-address"])
            .args(["--workers", "1", "--log-level", "warn", "--data-dir"])
            .arg(&dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("drover server starts");
        let (rpc, http) = common::printed_addresses(&mut server).await;
        let http = format!("http://{http}");
        let agent_config = agent_config.map(|text| {
            let path = dir.join("agent.toml");
            std::fs::write(&path, text).expect("agent config");
            path
        });
        let api = ApiClient::new(&http, None, None).expect("client");
        let label = format!("{name}-{}", std::process::id());
        let mut cluster = DevCluster { server, agent: None, rpc, api, http, dir, label, agent_config };
        cluster.start_agent();
        cluster
    }

    fn start_agent(&mut self) {
        let mut command = common::dev_agent(&self.dir, &self.rpc, &self.dir.join("agent"));
        if let Some(config) = &self.agent_config {
            command.arg("--config").arg(config);
        }
        let agent = command.stdout(Stdio::null()).stderr(Stdio::inherit()).spawn().expect("drover agent starts");
        self.agent = Some(agent);
    }

    /// SIGKILL: the agent gets no chance to stop anything.
    fn kill_agent(&mut self) {
        let mut agent = self.agent.take().expect("an agent runs");
        agent.kill().expect("SIGKILL");
        agent.wait().expect("reaped");
    }

    /// `drover job run --detach` of `hcl`.
    fn run_job(&self, name: &str, hcl: &str) {
        let file = self.dir.join(format!("{name}.hcl"));
        std::fs::write(&file, hcl).expect("job file");
        let run = common::drover()
            .args(["job", "run", "--detach", "--address", &self.http])
            .arg(&file)
            .output()
            .expect("drover job run");
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    }

    /// A job of one task of the test image: `kind`, the group's `network`
    /// block, the task's `config` lines (besides the image and the test's
    /// label) and its other lines.
    fn job(&self, id: &str, kind: &str, network: &str, config: &str, task: &str) -> String {
        let restart = if kind == "batch" { "restart {\n      attempts = 0\n      mode = \"fail\"\n    }" } else { "" };
        format!(
            r#"
job "{id}" {{
  datacenters = ["dc1"]
  type = "{kind}"
  group "g" {{
    {network}
    {restart}
    task "t" {{
      driver = "docker"
      config {{
        image = "{image}"
        labels {{
          {TEST_LABEL} = "{label}"
        }}
        {config}
      }}
      {task}
    }}
  }}
}}
"#,
            image = common::docker::IMAGE,
            label = self.label,
        )
    }
}

fn status_is(status: &'static str) -> impl Fn(&Value) -> bool {
    move |stub| stub["ClientStatus"] == status
}

/// Task `t`'s events.
fn events(alloc: &Value) -> Vec<Value> {
    alloc["TaskStates"]["t"]["Events"].as_array().cloned().unwrap_or_default()
}

fn event<'a>(events: &'a [Value], kind: &str) -> Option<&'a Value> {
    events.iter().find(|event| event["Type"] == kind)
}

/// A stream of task `t`'s logs, through the server from the agent.
async fn log_of(cluster: &DevCluster, alloc: &Value, kind: &str) -> String {
    let path = format!("/v1/client/fs/logs/{}?task=t&type={kind}&plain=true", alloc["ID"].as_str().expect("id"));
    let answer = cluster.api.get(&path).await.expect("answer");
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

/// Polls `check` until it gives a value, or fails naming `what` after the
/// watchdog: for what nothing announces.
async fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + common::WATCHDOG;
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(Instant::now() < deadline, "{what} did not happen within {:?}", common::WATCHDOG);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls task `t`'s stdout until it holds `text` (a task's output is
/// announced by nothing), or fails after the watchdog.
async fn log_containing(cluster: &DevCluster, alloc: &Value, text: &str) {
    let deadline = Instant::now() + common::WATCHDOG;
    while !log_of(cluster, alloc, "stdout").await.contains(text) {
        assert!(Instant::now() < deadline, "{text:?} not in the task's stdout within {:?}", common::WATCHDOG);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The containers of allocation `alloc`.
fn alloc_containers(alloc: &Value) -> Vec<String> {
    containers("com.hashicorp.nomad.alloc_id", alloc["ID"].as_str().expect("id"))
}

/// `GET path` on `addr` over plain HTTP/1.0; the body, or `None` while
/// nothing answers.
fn http_get(addr: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.").then(|| body.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_in_bridge_mode_answers_on_its_host_port_with_its_limits_in_the_host_config() {
    let cluster = DevCluster::start("bridge", None).await;
    let hcl = cluster.job(
        "web",
        "service",
        "network {\n      port \"http\" {\n        to = 8080\n      }\n    }",
        r#"command = "sh"
        args = ["-c", "echo \"alloc=$NOMAD_ALLOC_ID port=$NOMAD_PORT_http host=$NOMAD_HOST_PORT_http dir=$NOMAD_TASK_DIR\" > /local/index.html && exec httpd -f -p $NOMAD_PORT_http -h /local"]
        ports = ["http"]"#,
        r#"resources {
        cpu = 200
        memory = 32
        memory_max = 64
      }
      service {
        name = "web"
        port = "http"
        check {
          name = "index"
          type = "http"
          path = "/index.html"
          interval = "1s"
          timeout = "1s"
        }
        # Run inside the container: the file is at /local there only.
        check {
          name = "inside"
          type = "script"
          command = "/bin/sh"
          args = ["-c", "test -f /local/index.html"]
          interval = "1s"
          timeout = "5s"
        }
      }"#,
    );
    cluster.run_job("web", &hcl);
    let alloc = alloc_of(&cluster.api, "web", "the allocation running", status_is("running")).await;
    let (ip, port) = allocated_port(&alloc, "http");
    let id = alloc["ID"].as_str().expect("id").to_string();
    let addr = format!("{ip}:{port}");
    let body = eventually("the task answering on its host port", || http_get(&addr, "/index.html")).await;
    assert_eq!(body.trim(), format!("alloc={id} port=8080 host={port} dir=/local"));

    let ids = alloc_containers(&alloc);
    assert_eq!(ids.len(), 1, "one container: {ids:?}");
    let started = event(&events(&alloc), "Started").expect("a Started event").clone();
    let started_id = started["Details"]["container_id"].as_str().expect("the container's id");
    assert!(started_id.starts_with(&ids[0]), "{started_id} is {ids:?}");
    let inspected: Value = serde_json::from_str(&docker(&["inspect", &ids[0]])).expect("inspect JSON");
    let host = &inspected[0]["HostConfig"];
    assert_eq!(host["Memory"], json!(64 << 20), "memory_max is the hard limit");
    assert_eq!(host["MemoryReservation"], json!(32 << 20), "memory is the reservation");
    assert_eq!(host["MemorySwap"], host["Memory"], "no swap");
    assert_eq!(host["CpuShares"], json!(200));
    assert_eq!(inspected[0]["Name"], format!("/t-{id}"), "named <task>-<alloc id>");
    // The http check reaches the host port; the script runs in the container.
    until(&cluster.api, &format!("/v1/client/allocation/{id}/checks"), "both checks passing", |checks| {
        let results: Vec<&Value> = checks.as_object().map(|map| map.values().collect()).unwrap_or_default();
        results.len() == 2 && results.iter().all(|result| result["Status"] == "success")
    })
    .await;

    let stopped = cluster.api.request("DELETE", "/v1/job/web", None).await.expect("stop");
    assert_eq!(stopped.status, 200, "{}", stopped.body);
    let alloc = alloc_of(&cluster.api, "web", "the allocation stopped", is_terminal).await;
    assert_eq!(alloc["ClientStatus"], "complete", "{:#}", alloc["TaskStates"]);
    eventually("the container removed", || alloc_containers(&alloc).is_empty().then_some(())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_tasks_exit_code_and_logs_reach_alloc_status_and_alloc_logs() {
    let cluster = DevCluster::start("batch", None).await;
    let hcl = cluster.job(
        "once",
        "batch",
        "",
        r#"command = "sh"
        args = ["-c", "echo out-line; echo err-line >&2; exit 3"]"#,
        "",
    );
    cluster.run_job("once", &hcl);
    let alloc = alloc_of(&cluster.api, "once", "the allocation ended", is_terminal).await;
    assert_eq!(alloc["ClientStatus"], "failed", "{:#}", alloc["TaskStates"]);
    let events = events(&alloc);
    let terminated = event(&events, "Terminated").expect("a Terminated event");
    assert_eq!(terminated["ExitCode"], 3, "{terminated:#}");
    assert_eq!(terminated["Details"]["oom_killed"], "false");
    assert_eq!(log_of(&cluster, &alloc, "stdout").await, "out-line\n");
    assert_eq!(log_of(&cluster, &alloc, "stderr").await, "err-line\n");
    eventually("the ended container removed", || alloc_containers(&alloc).is_empty().then_some(())).await;

    // `drover alloc logs` reads the same files.
    let logs = common::drover()
        .args(["alloc", "logs", "--address", &cluster.http, alloc["ID"].as_str().expect("id"), "t"])
        .output()
        .expect("drover alloc logs");
    assert!(logs.status.success(), "{}", String::from_utf8_lossy(&logs.stderr));
    assert_eq!(String::from_utf8_lossy(&logs.stdout), "out-line\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_memory_max_a_task_is_oom_killed_and_reported_so() {
    let enforced = docker(&["info", "--format", "{{.MemoryLimit}}"]);
    let cluster = DevCluster::start("oom", None).await;
    let hcl = cluster.job(
        "hog",
        "batch",
        "",
        // 100 MB in a shell variable, past a 24 MiB limit.
        r#"command = "sh"
        args = ["-c", "x=$(head -c 100000000 /dev/zero | tr '\\0' a); echo survived"]"#,
        "resources {\n        memory = 16\n        memory_max = 24\n      }",
    );
    cluster.run_job("hog", &hcl);
    let alloc = alloc_of(&cluster.api, "hog", "the allocation ended", is_terminal).await;
    let events = events(&alloc);
    let terminated = event(&events, "Terminated").expect("a Terminated event");
    if enforced == "true" {
        assert_eq!(alloc["ClientStatus"], "failed");
        assert_eq!(terminated["Details"]["oom_killed"], "true", "{terminated:#}");
        assert_eq!((terminated["ExitCode"].as_i64(), terminated["Signal"].as_i64()), (Some(137), Some(9)), "SIGKILL");
        assert!(terminated["DisplayMessage"].as_str().unwrap_or_default().contains("OOM Killed"), "{terminated:#}");
        assert_eq!(log_of(&cluster, &alloc, "stdout").await, "");
    } else {
        // This engine cannot hold a container to a memory limit: what
        // reaches the host config is checked by the bridge test.
        eprintln!("the Docker Engine here does not enforce memory limits; OOM not checked");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signal_restart_and_stop_reach_the_container_and_the_kill_timeout_is_honoured() {
    let cluster = DevCluster::start("stop", None).await;
    let hcl = cluster.job(
        "stubborn",
        "service",
        "",
        r#"command = "sh"
        args = ["-c", "trap 'echo got-term' TERM; trap 'echo got-usr1' USR1; echo ready; while true; do sleep 0.1; done"]"#,
        "kill_signal = \"SIGTERM\"\n      kill_timeout = \"2s\"",
    );
    cluster.run_job("stubborn", &hcl);
    let alloc = alloc_of(&cluster.api, "stubborn", "the allocation running", status_is("running")).await;
    let id = alloc["ID"].as_str().expect("id").to_string();
    log_containing(&cluster, &alloc, "ready").await;

    // An operator's signal reaches the container's main process.
    let signal = json!({"Signal": "SIGUSR1", "Task": "t"});
    let sent =
        cluster.api.request("PUT", &format!("/v1/client/allocation/{id}/signal"), Some(&signal)).await.expect("signal");
    assert_eq!(sent.status, 200, "{}", sent.body);
    log_containing(&cluster, &alloc, "got-usr1").await;

    // An operator's restart: the task is killed as in a stop and started
    // again, in a new container; never two at once.
    let first = alloc_containers(&alloc);
    assert_eq!(first.len(), 1, "{first:?}");
    let restart = json!({"TaskName": "t"});
    let sent = cluster
        .api
        .request("PUT", &format!("/v1/client/allocation/{id}/restart"), Some(&restart))
        .await
        .expect("restart");
    assert_eq!(sent.status, 200, "{}", sent.body);
    let restarted = until(&cluster.api, &format!("/v1/allocation/{id}"), "the task started again", |alloc| {
        events(alloc).iter().filter(|event| event["Type"] == "Started").count() == 2
            && alloc["ClientStatus"] == "running"
    })
    .await;
    assert!(event(&events(&restarted), "Restart Signaled").is_some(), "{:#}", restarted["TaskStates"]);
    let second = alloc_containers(&alloc);
    assert_eq!(second.len(), 1, "one container after a restart: {second:?}");
    assert_ne!(first, second, "a new container");

    // The stop: SIGTERM is trapped, so SIGKILL comes after the 2s timeout.
    let stopped = cluster.api.request("DELETE", "/v1/job/stubborn", None).await.expect("stop");
    assert_eq!(stopped.status, 200, "{}", stopped.body);
    let alloc = alloc_of(&cluster.api, "stubborn", "the allocation stopped", is_terminal).await;
    let events = events(&alloc);
    let killing = events.iter().rev().find(|event| event["Type"] == "Killing").expect("a Killing event");
    assert_eq!(killing["Details"]["kill_timeout"], "2000000000", "{killing:#}");
    let killed = events.iter().rev().find(|event| event["Type"] == "Killed").expect("a Killed event");
    assert_eq!(killed["DisplayMessage"], "Task killed after its kill timeout", "{killed:#}");
    assert!(log_of(&cluster, &alloc, "stdout").await.contains("got-term"), "the kill signal reached the task");
    eventually("the container removed", || alloc_containers(&alloc).is_empty().then_some(())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_with_sigkill_reattaches_and_removes_what_was_stopped_meanwhile() {
    let mut cluster = DevCluster::start("reattach", None).await;
    for id in ["keep", "drop"] {
        let hcl = cluster.job(
            id,
            "service",
            "network {\n      port \"http\" {}\n    }",
            r#"command = "sleep"
        args = ["3600"]"#,
            &format!("service {{\n        name = \"{id}-svc\"\n        port = \"http\"\n      }}"),
        );
        cluster.run_job(id, &hcl);
    }
    let keep = alloc_of(&cluster.api, "keep", "keep running", status_is("running")).await;
    let dropped = alloc_of(&cluster.api, "drop", "drop running", status_is("running")).await;
    let kept_container = alloc_containers(&keep);
    assert_eq!(kept_container.len(), 1, "{kept_container:?}");
    assert_eq!(alloc_containers(&dropped).len(), 1);

    cluster.kill_agent();
    let stopped = cluster.api.request("DELETE", "/v1/job/drop", None).await.expect("stop");
    assert_eq!(stopped.status, 200, "{}", stopped.body);
    assert_eq!(alloc_containers(&dropped).len(), 1, "nobody stopped it while the agent was away");
    cluster.start_agent();

    let dropped = alloc_of(&cluster.api, "drop", "the stopped allocation reported", is_terminal).await;
    assert_eq!(dropped["ClientStatus"], "complete", "{:#}", dropped["TaskStates"]);
    eventually("its container removed", || alloc_containers(&dropped).is_empty().then_some(())).await;
    let keep_id = keep["ID"].as_str().expect("id").to_string();
    let keep = until(&cluster.api, &format!("/v1/allocation/{keep_id}"), "the kept task re-attached", |alloc| {
        event(&events(alloc), "Reattached").is_some()
    })
    .await;
    assert_eq!(keep["ClientStatus"], "running", "{:#}", keep["TaskStates"]);
    assert_eq!(alloc_containers(&keep), kept_container, "the same container, and only it");
    assert_eq!(events(&keep).iter().filter(|event| event["Type"] == "Started").count(), 1, "never started again");

    // One registration per allocation, no orphan: the kept one is there
    // once (the agent reported it again under the same id), the stopped
    // one's went with it.
    let kept = until(&cluster.api, "/v1/service/keep-svc", "the kept service registered", |list| {
        list.as_array().is_some_and(|list| !list.is_empty())
    })
    .await;
    let kept = kept.as_array().expect("a list");
    assert_eq!(kept.len(), 1, "{kept:#?}");
    assert_eq!(kept[0]["AllocID"], keep["ID"]);
    let services = cluster.api.get("/v1/services").await.expect("answer").json().expect("JSON");
    let names: Vec<&Value> =
        services[0]["Services"].as_array().expect("a list").iter().map(|service| &service["ServiceName"]).collect();
    assert_eq!(names, [&json!("keep-svc")], "{services:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absent_image_fails_the_task_with_a_clear_event() {
    let cluster = DevCluster::start("absent", None).await;
    let hcl = cluster.job("absent", "batch", "", "", "").replace(common::docker::IMAGE, "drover-test-absent:1");
    cluster.run_job("absent", &hcl);
    let alloc = alloc_of(&cluster.api, "absent", "the allocation failed", is_terminal).await;
    assert_eq!(alloc["ClientStatus"], "failed");
    let events = events(&alloc);
    let failure = event(&events, "Driver Failure").expect("a Driver Failure event");
    let message = failure["DisplayMessage"].as_str().expect("a message");
    assert!(message.starts_with("Failed to pull `drover-test-absent:1`: "), "{message}");
    assert!(event(&events, "Driver").is_some_and(|downloading| downloading["DisplayMessage"] == "Downloading image"));
    assert!(event(&events, "Not Restarting").is_some(), "{events:#?}");
}

/// A Unix socket of the test's own in front of the machine's Docker
/// daemon: up, it passes every connection through; down, it closes them
/// all and listens no more.
struct DaemonProxy {
    path: PathBuf,
    running: Option<tokio::task::JoinHandle<()>>,
}

impl DaemonProxy {
    fn new(path: &Path) -> DaemonProxy {
        DaemonProxy { path: path.to_path_buf(), running: None }
    }

    fn up(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let listener = tokio::net::UnixListener::bind(&self.path).expect("binds the proxy socket");
        self.running = Some(tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                connections.spawn(async move {
                    if let Ok(mut outbound) = tokio::net::UnixStream::connect("/var/run/docker.sock").await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        }));
    }

    /// Aborting the task drops the listener and every connection.
    fn down(&mut self) {
        if let Some(running) = self.running.take() {
            running.abort();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for DaemonProxy {
    fn drop(&mut self) {
        self.down();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_stops_answering_makes_the_driver_unhealthy_until_it_returns() {
    let dir = common::temp_dir("docker-proxy");
    let socket = dir.join("docker.sock");
    let mut proxy = DaemonProxy::new(&socket);
    proxy.up();
    let config = format!(
        "[plugin.docker.config]\nendpoint = \"unix://{}\"\nhealth_check_interval = \"200ms\"\n",
        socket.display()
    );
    let cluster = DevCluster::start("health", Some(&config)).await;
    let driver = |healthy: bool| {
        move |nodes: &Value| {
            nodes.as_array().is_some_and(|nodes| {
                nodes.iter().any(|node| {
                    node["Drivers"]["docker"]["Healthy"] == healthy && node["Drivers"]["docker"]["Detected"] == true
                })
            })
        }
    };
    let nodes = until(&cluster.api, "/v1/nodes", "the docker driver healthy", driver(true)).await;
    let node_id = nodes[0]["ID"].as_str().expect("id").to_string();
    let node = cluster.api.get(&format!("/v1/node/{node_id}")).await.expect("node").json().expect("JSON");
    assert_eq!(node["Attributes"]["driver.docker"], "1");
    assert!(node["Attributes"]["driver.docker.version"].as_str().is_some_and(|version| !version.is_empty()));

    proxy.down();
    until(&cluster.api, "/v1/nodes", "the docker driver unhealthy", driver(false)).await;
    let node = cluster.api.get(&format!("/v1/node/{node_id}")).await.expect("node").json().expect("JSON");
    let health = node["Drivers"]["docker"]["HealthDescription"].as_str().expect("a description");
    assert!(health.starts_with("Failed to connect to docker daemon"), "{health}");
    assert_eq!(node["Attributes"]["driver.docker"], "0", "not feasible for docker tasks");

    proxy.up();
    until(&cluster.api, "/v1/nodes", "the docker driver healthy again", driver(true)).await;
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}
