//! Client operations through any server: three real `drover server`
//! processes with ACLs on, one real `drover agent` (raw_exec) connected to
//! the first only, and a task that traps SIGUSR1. Every operation on the
//! allocation is asked of the two other servers, which reach the agent
//! through the first one's connection to it: logs (plain and followed),
//! `ls`, `stat`, `cat`, stats, restart, signal, stop and garbage
//! collection. A token without the capability is refused with 403 and
//! changes nothing; one with it works. Bad input gets a clear error and
//! changes nothing either.
//!
//! Waits are blocking queries on the servers' state or reads of a
//! followed log, each bounded by a watchdog that only turns a hang into a
//! failure; nothing sleeps.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Stdio};

use drover::api::client::{ApiClient, ApiStream};
use serde_json::{json, Value};

mod common;

use common::api::until;
use common::{bounded, drover, first_line, temp_dir, Certs};

/// The task: says it started (with its pid), and answers SIGUSR1.
const SCRIPT: &str = "trap 'echo got-usr1' USR1; echo started $$; while :; do sleep 1; done";

/// One server of the cluster.
struct Member {
    rpc: SocketAddr,
    http_port: u16,
    peer_port: u16,
    process: Option<Child>,
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0").expect("udp").local_addr().expect("addr").port()
}

fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("tcp").local_addr().expect("addr").port()
}

impl Member {
    fn new() -> Member {
        let rpc = SocketAddr::from(([127, 0, 0, 1], free_udp_port()));
        Member { rpc, http_port: free_tcp_port(), peer_port: free_udp_port(), process: None }
    }

    /// Starts it, with ACLs on, to form a cluster of three with `join`.
    async fn start(&mut self, dir: &Path, n: usize, certs: &Certs, join: &str) {
        let mut child = drover()
            .args(["server", "--bind", "127.0.0.1", "--workers", "1", "--print-address", "--acl-enabled"])
            .args(["--name", &format!("server-{n}"), "--bootstrap-expect", "3", "--join", join])
            .args(["--port", &self.rpc.port().to_string(), "--http-port", &self.http_port.to_string()])
            .args(["--peer-port", &self.peer_port.to_string(), "--log-level", "warn"])
            .args(certs.server_flags())
            .arg("--data-dir")
            .arg(dir.join(format!("server-{n}")))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("drover server starts");
        let line = first_line(&mut child).await;
        assert!(line.starts_with("listening "), "server-{n} did not start: {line:?}");
        self.process = Some(child);
    }

    /// A client of its API with `token`.
    fn api(&self, certs: &Certs, token: Option<&str>) -> ApiClient {
        let ca = std::fs::read_to_string(certs.file("drover-agent-ca.pem")).expect("ca");
        let address = format!("https://127.0.0.1:{}", self.http_port);
        ApiClient::new(&address, token.map(str::to_string), Some(&ca)).expect("api client")
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(mut child) = self.process.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The agent: a dev agent (its tasks stop with it) with the cluster's
/// client certificate, told of the first server only.
struct AgentProcess(Child);

impl AgentProcess {
    fn start(dir: &Path, certs: &Certs, server: SocketAddr) -> AgentProcess {
        let files = ["drover-agent-ca.pem", "global-client-drover.pem", "global-client-drover-key.pem"]
            .map(|name| certs.file(name));
        let child = common::agent_command(&server.to_string(), &files, &dir.join("agent"))
            .args(["--dev", "--log-level", "warn"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("drover agent starts");
        AgentProcess(child)
    }
}

impl Drop for AgentProcess {
    /// SIGTERM, so the dev agent stops its tasks before it exits.
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.0.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let _ = self.0.wait();
    }
}

/// The management token, once the cluster has a leader: a bootstrap made
/// during the election is held by the server, then refused "no leader",
/// and made again.
async fn bootstrap(api: &ApiClient) -> String {
    bounded("an ACL bootstrap", async {
        loop {
            let answer = api.request("POST", "/v1/acl/bootstrap", None).await.expect("answer");
            if answer.status == 200 {
                let token = answer.json().expect("token");
                return token["SecretID"].as_str().expect("secret").to_string();
            }
            assert!(answer.body.contains("No cluster leader"), "{}: {}", answer.status, answer.body);
        }
    })
    .await
}

/// A client token for a new policy of `rules`.
async fn token_for(management: &ApiClient, name: &str, rules: &str) -> String {
    let policy = json!({"Name": name, "Rules": rules});
    let put = management.request("PUT", &format!("/v1/acl/policy/{name}"), Some(&policy)).await.expect("answer");
    assert_eq!(put.status, 200, "{}", put.body);
    let body = json!({"Name": name, "Type": "client", "Policies": [name]});
    let token = management.request("POST", "/v1/acl/token", Some(&body)).await.expect("answer").json().expect("token");
    token["SecretID"].as_str().expect("secret").to_string()
}

/// The event types of the task `t` of `alloc`.
fn events(alloc: &Value) -> Vec<String> {
    let events = alloc["TaskStates"]["t"]["Events"].as_array().cloned().unwrap_or_default();
    events.iter().map(|event| event["Type"].as_str().unwrap_or_default().to_string()).collect()
}

/// The pid of the task's last start.
fn last_pid(alloc: &Value) -> Option<String> {
    let events = alloc["TaskStates"]["t"]["Events"].as_array()?;
    let started = events.iter().rev().find(|event| event["Type"] == "Started")?;
    started["Details"]["pid"].as_str().map(str::to_string)
}

/// Reads a followed log until its text so far contains `wanted`.
async fn read_until(stream: &mut ApiStream, text: &mut String, wanted: &str) {
    bounded(&format!("{wanted:?} in the followed log"), async {
        while !text.contains(wanted) {
            let frame = stream.next_frame().await.expect("a frame").expect("the log goes on");
            text.push_str(&String::from_utf8_lossy(&frame.bytes().expect("base64")));
        }
    })
    .await
}

/// `method path` with `body` through `api`: status and body.
async fn call(api: &ApiClient, method: &str, path: &str, body: Option<Value>) -> (u16, String) {
    let answer = api.request(method, path, body.as_ref()).await.expect("answer");
    (answer.status, answer.body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_files_restart_signal_and_stop_go_through_any_server_with_the_acl_checks() {
    transport::install_crypto_provider();
    let dir = temp_dir("client-ops");
    let certs = Certs::create(&dir);
    let mut members: Vec<Member> = (0..3).map(|_| Member::new()).collect();
    let join = members.iter().map(|member| format!("127.0.0.1:{}", member.peer_port)).collect::<Vec<_>>().join(",");
    for (n, member) in members.iter_mut().enumerate() {
        member.start(&dir, n + 1, &certs, &join).await;
    }
    let agent = AgentProcess::start(&dir, &certs, members[0].rpc);
    let secret = bootstrap(&members[1].api(&certs, None)).await;
    let management = members[1].api(&certs, Some(&secret));
    let writer = token_for(&management, "writer", "namespace \"default\" { policy = \"write\" }").await;
    let reader = token_for(&management, "reader", "namespace \"default\" { policy = \"read\" }").await;
    // The agent's connection is the first server's; the others are asked.
    let (second, third) = (&members[1], &members[2]);
    let (writer_2, writer_3) = (second.api(&certs, Some(&writer)), third.api(&certs, Some(&writer)));
    let (reader_2, reader_3) = (second.api(&certs, Some(&reader)), third.api(&certs, Some(&reader)));
    let management_3 = third.api(&certs, Some(&secret));

    let nodes = until(&management_3, "/v1/nodes", "the agent's node ready", |nodes| {
        nodes.as_array().is_some_and(|nodes| nodes.iter().any(|node| node["Status"] == "ready"))
    })
    .await;
    let node_id = nodes[0]["ID"].as_str().expect("node id").to_string();
    let job = json!({"Job": {"ID": "trapper", "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "g", "Count": 1, "Tasks": [{"Name": "t", "Driver": "raw_exec",
            "Config": {"command": "sh", "args": ["-c", SCRIPT]}, "Resources": {"CPU": 100, "MemoryMB": 64}}]}]}});
    let (status, body) = call(&writer_2, "PUT", "/v1/jobs", Some(job)).await;
    assert_eq!(status, 200, "{body}");
    let allocs = until(&management_3, "/v1/job/trapper/allocations", "the task running", |allocs| {
        allocs.as_array().is_some_and(|list| list.iter().any(|alloc| alloc["ClientStatus"] == "running"))
    })
    .await;
    let id = allocs[0]["ID"].as_str().expect("alloc id").to_string();
    // The first server holds the agent's connection (its watch brought the
    // allocation), the others none: what they are asked goes through it.
    for (n, member) in members.iter().enumerate() {
        let metrics: Value = member.api(&certs, Some(&secret)).query("/v1/metrics").await.expect("metrics");
        let gauges = metrics["Gauges"].as_array().expect("gauges");
        let held = gauges.iter().find(|gauge| gauge["Name"] == "drover.quic.agent_connections").expect("the gauge");
        assert_eq!(held["Value"], if n == 0 { 1.0 } else { 0.0 }, "server-{}", n + 1);
    }
    let alloc_path = format!("/v1/allocation/{id}");
    let alloc = until(&management_3, &alloc_path, "the task started", |alloc| last_pid(alloc).is_some()).await;
    let first_pid = last_pid(&alloc).expect("a pid");

    // Logs: read-logs (namespace write); the reader is refused.
    let logs = format!("/v1/client/fs/logs/{id}?task=t&plain=true");
    assert_eq!(call(&reader_3, "GET", &logs, None).await, (403, "Permission denied".to_string()));
    let mut stream = writer_3.stream(&format!("/v1/client/fs/logs/{id}?task=t&follow=true")).await.expect("stream");
    let mut stream_text = String::new();
    assert_eq!(stream.status, 200);
    read_until(&mut stream, &mut stream_text, &format!("started {first_pid}")).await;
    let (status, plain) = call(&writer_2, "GET", &logs, None).await;
    assert_eq!((status, plain), (200, format!("started {first_pid}\n")));

    // Files: read-fs; a path leaving the allocation is refused.
    assert_eq!(call(&reader_2, "GET", &format!("/v1/client/fs/ls/{id}?path=/"), None).await.0, 403);
    let listed: Vec<drover::api::fs::AllocFileInfo> =
        writer_2.query(&format!("/v1/client/fs/ls/{id}?path=/")).await.expect("ls");
    let names: Vec<&str> = listed.iter().map(|file| file.name.as_str()).collect();
    assert_eq!(names, ["alloc", "t"]);
    assert!(listed.iter().all(|file| file.is_dir && file.file_mode.starts_with('d')), "{listed:?}");
    let stat: drover::api::fs::AllocFileInfo =
        writer_3.query(&format!("/v1/client/fs/stat/{id}?path=alloc/logs/t.stdout.0")).await.expect("stat");
    assert_eq!((stat.name.as_str(), stat.is_dir), ("t.stdout.0", false));
    assert!(stat.size >= "started 1\n".len() as u64, "{stat:?}");
    let (status, cat) =
        call(&writer_3, "GET", &format!("/v1/client/fs/cat/{id}?path=alloc/logs/t.stdout.0"), None).await;
    assert_eq!((status, cat.as_str()), (200, format!("started {first_pid}\n").as_str()));
    let (status, body) =
        call(&writer_3, "GET", &format!("/v1/client/fs/cat/{id}?path=../../../etc/passwd"), None).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("escapes the allocation directory"), "{body}");
    let (status, body) = call(&writer_2, "GET", &format!("/v1/client/fs/ls/{id}?path=t/nowhere"), None).await;
    assert_eq!(status, 404, "{body}");

    // Stats: the allocation's need read-job, the node's node:read.
    let usage: drover::api::stats::AllocResourceUsage =
        reader_3.query(&format!("/v1/client/allocation/{id}/stats")).await.expect("alloc stats");
    assert!(usage.tasks["t"].resource_usage.memory_stats.rss > 0, "{usage:?}");
    let host = format!("/v1/client/stats?node_id={node_id}");
    assert_eq!(call(&reader_2, "GET", &host, None).await.0, 403, "namespace read is not node read");
    let host: drover::api::stats::HostStats = management.query(&host).await.expect("host stats");
    assert!(host.memory.total > 0 && !host.cpu.is_empty() && !host.disk_stats.is_empty(), "{host:?}");

    // Signal: alloc-lifecycle. A refused signal, one with a name that is
    // no signal and one to a task that does not exist change nothing; the
    // allowed one reaches the process, whose log then says so.
    let signal = format!("/v1/client/allocation/{id}/signal");
    let usr1 = json!({"Signal": "SIGUSR1", "Task": "t"});
    assert_eq!(call(&reader_2, "POST", &signal, Some(usr1.clone())).await.0, 403);
    let (status, body) = call(&writer_2, "POST", &signal, Some(json!({"Signal": "SIGNOPE"}))).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("invalid signal"), "{body}");
    let (status, body) = call(&writer_2, "POST", &signal, Some(json!({"Signal": "SIGUSR1", "Task": "nope"}))).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(call(&writer_2, "POST", &signal, Some(usr1)).await, (200, "{\"Index\":0}".to_string()));
    read_until(&mut stream, &mut stream_text, "got-usr1").await;
    assert_eq!(stream_text.matches("got-usr1").count(), 1, "one signal reached the task: {stream_text:?}");

    // Restart: alloc-lifecycle; the refused one and the unknown task's
    // leave the task alone, the allowed one starts it again.
    let restart = format!("/v1/client/allocation/{id}/restart");
    assert_eq!(call(&reader_3, "PUT", &restart, None).await.0, 403);
    assert_eq!(call(&writer_3, "PUT", &restart, Some(json!({"TaskName": "nope"}))).await.0, 404);
    assert_eq!(call(&writer_3, "PUT", &restart, None).await.0, 200);
    let restarted = until(&management, &alloc_path, "the task started again", |alloc| {
        last_pid(alloc).is_some_and(|pid| pid != first_pid)
    })
    .await;
    let types = events(&restarted);
    assert_eq!(types.iter().filter(|kind| *kind == "Restart Signaled").count(), 1, "{types:?}");
    assert_eq!(types.iter().filter(|kind| *kind == "Signaling").count(), 1, "{types:?}");
    assert_eq!(restarted["TaskStates"]["t"]["Restarts"], 1);
    let second_pid = last_pid(&restarted).expect("a pid");
    read_until(&mut stream, &mut stream_text, &format!("started {second_pid}")).await;

    // Unknown allocations and nodes.
    let nobody = "00000000-0000-4000-8000-000000000000";
    assert_eq!(call(&writer_2, "GET", &format!("/v1/client/fs/logs/{nobody}?task=t"), None).await.0, 404);
    assert_eq!(call(&writer_2, "PUT", &format!("/v1/allocation/{nobody}/stop"), None).await.0, 404);
    let (status, body) = call(&management, "GET", &format!("/v1/client/stats?node_id={nobody}"), None).await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = call(&writer_2, "GET", &format!("/v1/client/allocation/{id}/gc"), None).await;
    assert_eq!(status, 400, "a running allocation is not collected: {body}");

    // A node no server holds a connection to: no path to it.
    let endpoints =
        transport::client::ClientEndpoints::bind(1, &certs.material("global-client-drover")).expect("endpoint");
    let connection = bounded("a connection", endpoints.connect(members[2].rpc)).await.expect("connects");
    let mut ghost = common::mock_node(77);
    ghost.name = "ghost".into();
    bounded("the ghost's registration", connection.register(ghost.clone())).await.expect("registers");
    let (status, body) = call(&management, "GET", &format!("/v1/client/stats?node_id={}", ghost.id), None).await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("No path to node"), "{body}");
    connection.close();

    // Stop: alloc-lifecycle; a server write, its eval places a replacement.
    let stop = format!("/v1/allocation/{id}/stop");
    assert_eq!(call(&reader_3, "PUT", &stop, None).await.0, 403);
    let kept: Value = management.query(&alloc_path).await.expect("the allocation");
    assert_eq!(kept["DesiredStatus"], "run", "a refused stop stops nothing");
    let stopped: drover::api::allocations::AllocStopResponse =
        writer_3.write_empty("PUT", &stop).await.expect("stopped");
    assert!(!stopped.eval_id.is_empty() && stopped.index > 0, "{stopped:?}");
    let alloc = until(&management, &alloc_path, "the allocation stopped", |alloc| {
        alloc["DesiredStatus"] == "stop" && alloc["ClientStatus"] == "complete"
    })
    .await;
    assert!(events(&alloc).iter().any(|kind| kind == "Killed"), "{:?}", events(&alloc));
    let eval = until(&management, &format!("/v1/evaluation/{}", stopped.eval_id), "its eval done", |eval| {
        eval["Status"] == "complete"
    })
    .await;
    assert_eq!(eval["TriggeredBy"], "alloc-stop");
    until(&management, "/v1/job/trapper/allocations", "a replacement running", |allocs| {
        allocs
            .as_array()
            .is_some_and(|list| list.iter().any(|a| a["ID"] != id.as_str() && a["ClientStatus"] == "running"))
    })
    .await;
    // The followed log ends with the task.
    bounded("the followed log's end", async { while stream.next_frame().await.expect("a frame").is_some() {} }).await;

    // Garbage collection: submit-job for the allocation, node:write for the node.
    let gc = format!("/v1/client/allocation/{id}/gc");
    assert_eq!(call(&reader_2, "GET", &gc, None).await.0, 403);
    let kept = call(&writer_3, "GET", &format!("/v1/client/fs/ls/{id}?path=/"), None).await;
    assert_eq!(kept.0, 200, "a refused collection collects nothing: {}", kept.1);
    assert_eq!(call(&writer_2, "GET", &gc, None).await, (200, "null".to_string()));
    let (status, body) = call(&writer_3, "GET", &format!("/v1/client/fs/ls/{id}?path=/"), None).await;
    assert_eq!(status, 404, "its files went with it: {body}");
    assert_eq!(call(&writer_3, "GET", &format!("/v1/client/gc?node_id={node_id}"), None).await.0, 403);
    assert_eq!(call(&management, "GET", &format!("/v1/client/gc?node_id={node_id}"), None).await.0, 200);

    let (status, body) = call(&writer_2, "DELETE", "/v1/job/trapper", None).await;
    assert_eq!(status, 200, "{body}");
    drop(agent);
    drop(members);
    let _ = std::fs::remove_dir_all(&dir);
}
