//! Three real `drover server` processes forming a cluster over their
//! server-to-server endpoints, with agents and job writers running all the
//! while. The leader is killed with SIGKILL, again and again; each time:
//! - the writers' calls go to any server (followers forward them) and are
//!   retried on another server when refused or cut off; writes are
//!   acknowledged again, so a new leader was elected;
//! - no node is marked down or disconnected because of the election (the
//!   new leader gives every node the failover heartbeat TTL);
//! - the killed server is restarted on its data dir, rejoins as a follower
//!   and catches up.
//!
//! At the end, with the writers stopped: every acknowledged job is there,
//! every job there was submitted, each runs exactly its count (nothing
//! placed twice), no node is oversubscribed or holds a port twice, no eval
//! is left pending, and all three servers hold the same jobs at the same
//! index.
//!
//! A deployment waiting for its canary's promotion when the leader dies
//! is promoted through a survivor and completes under the next leader; a
//! drain set just before the leader dies reaches its deadline and
//! completes under the next one; a periodic job with a one-minute cron
//! launches once each minute across a leader kill (three launches, none
//! missed, none doubled); an operator adds a voter and removes it again;
//! with the leader's own workers set to none, the followers' workers
//! schedule every job through the leader's broker and plan applier.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use drover::api::client::ApiClient;
use drover::client::agent::{Agent, AgentCounters, AgentSettings, NoObserver};
use tokio::sync::{mpsc, watch};
use transport::client::{ClientConnection, ClientEndpoints};
use transport::message::ClusterReport;
use transport::tls::TlsMaterial;

mod common;

use common::{bounded, drover, first_line, mock_node, service_job as job, temp_dir, Certs};

const SERVERS: usize = 3;
/// Leaders killed across the run.
const FAILOVERS: usize = 3;
/// Nodes, each run by a real agent in this process.
const NODES: u128 = 4;
/// Concurrent job writers.
const WRITERS: usize = 4;
/// Acknowledged writes awaited before each kill, and after it (more than
/// [`WRITERS`], so some were acknowledged by the new leader).
const WRITES_PER_PHASE: usize = 12;

/// One server of the cluster: its ports, its data dir and, while it runs,
/// its process.
struct Member {
    name: String,
    rpc: SocketAddr,
    http_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    process: Option<Child>,
    api: ApiClient,
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0").expect("udp").local_addr().expect("addr").port()
}

fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("tcp").local_addr().expect("addr").port()
}

impl Member {
    fn new(dir: &Path, n: usize) -> Member {
        let http_port = free_tcp_port();
        let ca = std::fs::read_to_string(dir.join("drover-agent-ca.pem")).expect("ca");
        Member {
            name: format!("server-{n}"),
            rpc: SocketAddr::from(([127, 0, 0, 1], free_udp_port())),
            http_port,
            peer_port: free_udp_port(),
            data_dir: dir.join(format!("data-{n}")),
            process: None,
            api: ApiClient::new(&format!("https://127.0.0.1:{http_port}"), None, Some(&ca)).expect("api client"),
        }
    }

    fn peer(&self) -> String {
        format!("127.0.0.1:{}", self.peer_port)
    }

    /// Starts this server: to form a cluster of [`SERVERS`] with the
    /// servers in `join`, or (no `join`) on its own, waiting to be added.
    async fn start(&mut self, dir: &Path, join: Option<&str>) {
        let cluster: Vec<String> = match join {
            Some(join) => vec!["--bootstrap-expect".into(), SERVERS.to_string(), "--join".into(), join.into()],
            None => vec!["--bootstrap-expect".into(), "2".into()],
        };
        let mut child = drover()
            .args(["server", "--bind", "127.0.0.1", "--workers", "1", "--print-address", "--snapshot-every", "16"])
            .args(["--name", &self.name])
            .args(&cluster)
            .args(["--port", &self.rpc.port().to_string(), "--http-port", &self.http_port.to_string()])
            .args(["--peer-port", &self.peer_port.to_string()])
            .arg("--ca-file")
            .arg(dir.join("drover-agent-ca.pem"))
            .arg("--cert-file")
            .arg(dir.join("global-server-drover.pem"))
            .arg("--key-file")
            .arg(dir.join("global-server-drover-key.pem"))
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(["--log-level", "warn"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("drover server starts");
        let line = first_line(&mut child).await;
        assert!(line.starts_with("listening "), "{} did not start: {line:?}", self.name);
        self.process = Some(child);
    }

    fn kill_9(&mut self) {
        let mut child = self.process.take().expect("running");
        child.kill().expect("SIGKILL");
        child.wait().expect("reaped");
    }

    async fn terminate(&mut self) {
        let mut child = self.process.take().expect("running");
        let pid = child.id().to_string();
        assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().expect("kill").success());
        let status = bounded("a server's exit", tokio::task::spawn_blocking(move || child.wait()))
            .await
            .expect("waiter")
            .expect("status");
        assert_eq!(status.code(), Some(0), "{} exited badly", self.name);
    }

    /// The leader's client address as this server knows it (empty during
    /// an election).
    async fn leader(&self) -> String {
        let answer = self.api.get("/v1/status/leader").await.expect("status/leader");
        answer.json().expect("JSON").as_str().unwrap_or_default().to_string()
    }

    /// Waits until this server's own state (a stale read, blocking on each
    /// write) has every agent's node ready.
    async fn all_nodes_ready(&self) {
        bounded("every agent's node ready", async {
            let mut index = 0;
            loop {
                let answer = self.api.get(&format!("/v1/nodes?stale&index={index}&wait=30s")).await.expect("nodes");
                let list = answer.json().expect("JSON");
                let ready = list.as_array().expect("a list").iter().filter(|node| node["Status"] == "ready").count();
                if ready == NODES as usize {
                    return;
                }
                index = answer.index.expect("X-Nomad-Index");
            }
        })
        .await
    }

    /// This server's own job ids once its state has passed `index` (a
    /// stale read, blocking until then).
    async fn jobs_after(&self, index: u64) -> (u64, BTreeSet<String>) {
        bounded("a server catching up", async {
            loop {
                let path = format!("/v1/jobs?stale&index={index}&wait=30s");
                let answer = self.api.get(&path).await.expect("jobs");
                let at = answer.index.expect("X-Nomad-Index");
                if at > index {
                    let list = answer.json().expect("JSON");
                    let ids =
                        list.as_array().expect("a list").iter().map(|job| job["ID"].as_str().expect("ID").to_string());
                    return (at, ids.collect());
                }
            }
        })
        .await
    }
}

impl Drop for Member {
    /// A failing test leaves no server behind.
    fn drop(&mut self) {
        if let Some(mut child) = self.process.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The `--join` list of `members`' server-to-server addresses.
fn join_of(members: &[Member]) -> String {
    members.iter().map(Member::peer).collect::<Vec<_>>().join(",")
}

/// [`SERVERS`] servers started to form one cluster.
async fn form_cluster(dir: &Path) -> Vec<Member> {
    let mut members: Vec<Member> = (1..=SERVERS).map(|n| Member::new(dir, n)).collect();
    let join = join_of(&members);
    for member in &mut members {
        member.start(dir, Some(&join)).await;
    }
    members
}

/// Agents that know every server and follow the leader on their own.
fn start_agents(
    servers: &[SocketAddr],
    tls: &TlsMaterial,
) -> (watch::Sender<bool>, Vec<Arc<AgentCounters>>, Vec<tokio::task::JoinHandle<()>>) {
    let (stop, stopped) = watch::channel(false);
    let mut counters = Vec::new();
    let mut tasks = Vec::new();
    for n in 1..=NODES {
        let endpoints = Arc::new(ClientEndpoints::bind(1, tls).expect("client endpoint"));
        let mut servers = servers.to_vec();
        servers.rotate_left(n as usize % SERVERS);
        let mut settings = AgentSettings::new(servers);
        settings.backoff_base = Duration::from_millis(20);
        settings.backoff_cap = Duration::from_millis(500);
        settings.call_timeout = Duration::from_secs(2);
        let quic = endpoints.own_config().expect("config");
        let agent = Agent::new(mock_node(n), settings, endpoints, quic, Arc::new(NoObserver));
        counters.push(agent.counters().clone());
        let stopped = stopped.clone();
        tasks.push(tokio::spawn(async move { agent.run(stopped).await }));
    }
    (stop, counters, tasks)
}

/// The writers' shared record: what was submitted (with its count) and
/// what was acknowledged.
#[derive(Default)]
struct Ledger {
    submitted: parking_lot::Mutex<BTreeMap<String, u32>>,
    acknowledged: parking_lot::Mutex<BTreeSet<String>>,
    retried: std::sync::atomic::AtomicU64,
}

/// One writer: registers jobs one after the other through any server,
/// retrying a job (the same registration: safe to repeat) on the next
/// server until it is acknowledged. Each acknowledgement is announced.
async fn writer(
    n: usize,
    servers: Vec<SocketAddr>,
    operators: Arc<ClientEndpoints>,
    ledger: Arc<Ledger>,
    acks: mpsc::UnboundedSender<()>,
    mut stop: watch::Receiver<bool>,
) {
    let mut connections: Vec<Option<ClientConnection>> = vec![None; servers.len()];
    let mut server = n;
    for sequence in 0.. {
        let id = format!("writer-{n}-{sequence}");
        let count = (sequence % 3 + 1) as u32;
        ledger.submitted.lock().insert(id.clone(), count);
        loop {
            if *stop.borrow() {
                return;
            }
            let slot = server % servers.len();
            if connections[slot].is_none() {
                let connecting = tokio::time::timeout(Duration::from_secs(2), operators.connect(servers[slot]));
                connections[slot] = connecting.await.ok().and_then(Result::ok);
            }
            let outcome = match &connections[slot] {
                Some(connection) => {
                    tokio::time::timeout(Duration::from_secs(5), connection.submit_job(job(&id, count))).await
                }
                None => Ok(Err(transport::client::CallError::NoAnswer)),
            };
            if let Ok(Ok(_)) = outcome {
                ledger.acknowledged.lock().insert(id.clone());
                let _ = acks.send(());
                break;
            }
            // Refused (no leader), cut off (a killed server) or slow: the
            // write may or may not have been applied; repeat it elsewhere.
            ledger.retried.fetch_add(1, Ordering::Relaxed);
            connections[slot] = None;
            server += 1;
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = stop.changed() => return,
            }
        }
    }
}

/// Checks the cluster's final state against the ledger (module docs).
fn check(report: &ClusterReport, ledger: &Ledger) {
    let present: BTreeMap<&str, _> = report.jobs.iter().map(|job| (job.id.as_str(), job)).collect();
    assert_eq!(present.len(), report.jobs.len(), "a job is listed twice");
    for id in ledger.acknowledged.lock().iter() {
        assert!(present.contains_key(id.as_str()), "the acknowledged job {id} was lost");
    }
    let submitted = ledger.submitted.lock();
    for (id, counts) in &present {
        let count = submitted.get(*id).unwrap_or_else(|| panic!("unknown job {id}"));
        assert_eq!(counts.desired, u64::from(*count), "job {id}");
        assert_eq!(counts.live, counts.desired, "job {id} runs {} of {count}", counts.live);
    }
    let statuses = (report.nodes_ready, report.nodes_initializing, report.nodes_down, report.nodes_disconnected);
    assert_eq!(statuses, (NODES as u64, 0, 0, 0), "every node is ready (ready, initializing, down, disconnected)");
    let audit = report.audit.as_ref().expect("a full report");
    assert!(audit.nodes_oversubscribed.is_empty(), "{:?}", audit.nodes_oversubscribed);
    assert!(audit.port_collisions.is_empty(), "{:?}", audit.port_collisions);
    assert_eq!(report.evals_pending, 0, "pending evals");
}

/// Waits for `count` acknowledgements.
async fn acknowledged(acks: &mut mpsc::UnboundedReceiver<()>, count: usize, what: &str) {
    bounded(what, async {
        for _ in 0..count {
            acks.recv().await.expect("writers running");
        }
    })
    .await;
}

/// The member that leads now: the running member that names itself the
/// leader. While none does (an election), the next acknowledged write says
/// the election is over.
async fn leader_of(members: &[Member], acks: &mut mpsc::UnboundedReceiver<()>) -> usize {
    bounded("a known leader", async {
        loop {
            for (n, member) in members.iter().enumerate().filter(|(_, member)| member.process.is_some()) {
                if member.leader().await == member.rpc.to_string() {
                    return n;
                }
            }
            acks.recv().await.expect("writers running");
        }
    })
    .await
}

/// The cluster report, through `connection`'s server. Another election
/// may start at any time on a loaded machine; a call made during one is
/// held by the server (up to its hold) and refused with "no cluster
/// leader" if the election outlasts it: then it is made again.
async fn report_of(connection: &ClientConnection) -> ClusterReport {
    bounded("the report", async {
        loop {
            match connection.report().await {
                Ok(report) => return report,
                Err(error) if error.is_transient() => println!("the report, again: {error}"),
                Err(error) => panic!("report: {error}"),
            }
        }
    })
    .await
}

/// Starts `count` writers over `servers`; their ledger, the stop switch,
/// the acknowledgements and the tasks.
fn start_writers(
    count: usize,
    servers: &[SocketAddr],
    operators: &Arc<ClientEndpoints>,
) -> (Arc<Ledger>, watch::Sender<bool>, mpsc::UnboundedReceiver<()>, Vec<tokio::task::JoinHandle<()>>) {
    let ledger = Arc::new(Ledger::default());
    let (stop, stopped) = watch::channel(false);
    let (ack, acks) = mpsc::unbounded_channel();
    let tasks = (0..count)
        .map(|n| {
            let task = writer(n, servers.to_vec(), operators.clone(), ledger.clone(), ack.clone(), stopped.clone());
            tokio::spawn(task)
        })
        .collect();
    (ledger, stop, acks, tasks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_survives_its_leader_being_killed_again_and_again() {
    transport::install_crypto_provider();
    let dir = temp_dir("ha");
    let certs = Certs::create(&dir);
    let mut members = form_cluster(&dir).await;
    let join = join_of(&members);
    let servers: Vec<SocketAddr> = members.iter().map(|member| member.rpc).collect();
    let (stop_agents, agent_counters, agents) = start_agents(&servers, &certs.material("global-client-drover"));
    let operators =
        Arc::new(ClientEndpoints::bind(1, &certs.material("global-cli-drover")).expect("operator endpoint"));
    let (ledger, stop_writers, mut acks, writers) = start_writers(WRITERS, &servers, &operators);
    members[0].all_nodes_ready().await;
    for round in 0..FAILOVERS {
        acknowledged(&mut acks, WRITES_PER_PHASE, "writes before the kill").await;
        let leader = leader_of(&members, &mut acks).await;
        println!("round {round}: killing the leader {}", members[leader].name);
        members[leader].kill_9();
        // Acknowledgements queued before the kill do not count; of those
        // that follow, at most one per writer was answered by the old
        // leader just before it died, the rest by a new one.
        while acks.try_recv().is_ok() {}
        acknowledged(&mut acks, WRITES_PER_PHASE, "writes after the kill (a new leader)").await;
        let new_leader = leader_of(&members, &mut acks).await;
        assert_ne!(new_leader, leader, "a killed server cannot lead");
        let connection =
            bounded("an operator connection", operators.connect(members[new_leader].rpc)).await.expect("connects");
        let report = report_of(&connection).await;
        assert_eq!(
            report.nodes_down + report.nodes_disconnected,
            0,
            "round {round}: a node was marked away by the election"
        );
        connection.close();
        members[leader].start(&dir, Some(&join)).await;
    }
    acknowledged(&mut acks, WRITES_PER_PHASE, "writes with the last server back").await;
    let leader = leader_of(&members, &mut acks).await;
    let _ = stop_writers.send(true);
    for writer in writers {
        bounded("a writer's end", writer).await.expect("writer");
    }

    // Everything settles on the leader; every server catches up to it.
    let connection = bounded("an operator connection", operators.connect(members[leader].rpc)).await.expect("connects");
    let report = loop {
        let report = report_of(&connection).await;
        // An agent that lost its server in the last election may still be
        // on its way back: its node is ready again once it is.
        let settled = report.evals_pending == 0 && report.jobs.iter().all(|job| job.live == job.desired);
        if settled && report.nodes_ready == NODES as u64 {
            break report;
        }
        let (_, _) = members[leader].jobs_after(report.index).await;
    };
    check(&report, &ledger);
    let (index, leader_jobs) = members[leader].jobs_after(report.index - 1).await;
    for member in &members {
        let (_, jobs) = member.jobs_after(index - 1).await;
        assert_eq!(jobs, leader_jobs, "{} holds other jobs than the leader", member.name);
    }
    let marked_away: u64 = agent_counters.iter().map(|counters| counters.marked_away.load(Ordering::Relaxed)).sum();
    assert_eq!(marked_away, 0, "an agent was told its node had been given up");
    println!(
        "{FAILOVERS} leaders killed; {} jobs acknowledged of {} submitted, {} writes retried, {} agent calls retried",
        ledger.acknowledged.lock().len(),
        ledger.submitted.lock().len(),
        ledger.retried.load(Ordering::Relaxed),
        agent_counters.iter().map(|counters| counters.writes_retried.load(Ordering::Relaxed)).sum::<u64>(),
    );

    connection.close();
    let _ = stop_agents.send(true);
    for agent in agents {
        let _ = bounded("an agent's stop", agent).await;
    }
    for member in &mut members {
        member.terminate().await;
    }
    operators.close().await;
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// Runs the CLI against `member`'s HTTP API; its stdout.
fn cli(dir: &Path, member: &Member, args: &[&str]) -> String {
    let output = drover()
        .args(args)
        .args(["--address", &format!("https://127.0.0.1:{}", member.http_port)])
        .arg("--ca-cert")
        .arg(dir.join("drover-agent-ca.pem"))
        .output()
        .expect("the CLI runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{args:?}: {stdout}{}", String::from_utf8_lossy(&output.stderr));
    stdout
}

/// The rows of a CLI table whose `column` (0-based) is `value`.
fn rows_with(table: &str, column: usize, value: &str) -> usize {
    table.lines().skip(1).filter(|line| line.split_whitespace().nth(column) == Some(value)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_adds_a_voter_and_removes_it_again() {
    transport::install_crypto_provider();
    let dir = temp_dir("ha-membership");
    let certs = Certs::create(&dir);
    let mut members: Vec<Member> = (1..=SERVERS + 1).map(|n| Member::new(&dir, n)).collect();
    let join = join_of(&members[..SERVERS]);
    for member in &mut members[..SERVERS] {
        member.start(&dir, Some(&join)).await;
    }
    let servers: Vec<SocketAddr> = members[..SERVERS].iter().map(|member| member.rpc).collect();
    let operators =
        Arc::new(ClientEndpoints::bind(1, &certs.material("global-cli-drover")).expect("operator endpoint"));
    let (_, stop_writer, mut acks, writer) = start_writers(1, &servers, &operators);
    acknowledged(&mut acks, 1, "a first write (the cluster formed)").await;
    let leader = leader_of(&members, &mut acks).await;
    let listed = cli(&dir, &members[leader], &["server", "members"]);
    assert_eq!(rows_with(&listed, 4, "true"), 1, "one leader among the members:\n{listed}");
    assert_eq!(listed.lines().count(), SERVERS + 1, "every server is a member:\n{listed}");
    assert!(listed.contains("Raft Role") && listed.contains("leader"), "the raft view is shown:\n{listed}");

    // A fourth server, started on its own, is added by the operator: the
    // call answers once it has caught up and votes.
    let fourth = SERVERS;
    members[fourth].start(&dir, None).await;
    let added = cli(&dir, &members[leader], &["operator", "raft", "add-voter", &members[fourth].peer()]);
    assert!(added.contains("server-4"), "{added}");
    let peers = cli(&dir, &members[leader], &["operator", "raft", "list-peers"]);
    assert_eq!(rows_with(&peers, 4, "true"), SERVERS + 1, "four voters:\n{peers}");
    let id = peers.lines().find(|line| line.starts_with("server-4")).and_then(|line| line.split_whitespace().nth(1));
    let id = id.unwrap_or_else(|| panic!("server-4 is listed:\n{peers}")).to_string();
    // The new voter holds the cluster's state: a write through it lands.
    let connection = bounded("an operator connection", operators.connect(members[fourth].rpc)).await.expect("connects");
    let index =
        bounded("a write through the new server", connection.submit_job(job("added", 1))).await.expect("written");
    let (_, jobs) = members[fourth].jobs_after(index - 1).await;
    assert!(jobs.contains("added"));
    connection.close();

    let removed = cli(&dir, &members[leader], &["operator", "raft", "remove-peer", "--peer-id", &id]);
    assert!(removed.contains(&id), "{removed}");
    let peers = cli(&dir, &members[leader], &["operator", "raft", "list-peers"]);
    assert_eq!(peers.lines().count(), SERVERS + 1, "three servers again:\n{peers}");
    assert!(!peers.contains("server-4"), "{peers}");

    let _ = stop_writer.send(true);
    for writer in writer {
        bounded("the writer's end", writer).await.expect("writer");
    }
    for member in &mut members {
        member.terminate().await;
    }
    operators.close().await;
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// Three servers formed and four agents on them, every node ready: the
/// base of the tests that kill a leader mid-operation.
struct AgentsCluster {
    dir: PathBuf,
    members: Vec<Member>,
    stop_agents: watch::Sender<bool>,
    agents: Vec<tokio::task::JoinHandle<()>>,
}

impl AgentsCluster {
    async fn start(name: &str) -> AgentsCluster {
        transport::install_crypto_provider();
        let dir = temp_dir(name);
        let certs = Certs::create(&dir);
        let members = form_cluster(&dir).await;
        let servers: Vec<SocketAddr> = members.iter().map(|member| member.rpc).collect();
        let (stop_agents, _, agents) = start_agents(&servers, &certs.material("global-client-drover"));
        members[0].all_nodes_ready().await;
        AgentsCluster { dir, members, stop_agents, agents }
    }

    /// Stops the agents, then the servers still running; removes the directory.
    async fn stop(mut self) {
        let _ = self.stop_agents.send(true);
        for agent in self.agents.drain(..) {
            let _ = bounded("an agent's stop", agent).await;
        }
        for member in self.members.iter_mut().filter(|member| member.process.is_some()) {
            member.terminate().await;
        }
        std::fs::remove_dir_all(&self.dir).expect("clean up");
    }
}

/// Job `web` on the mock driver: three allocations rolled out one at a
/// time behind one canary; `version` goes into its metadata, so each
/// value is a new version that replaces the allocations.
fn canary_job(version: &str) -> serde_json::Value {
    serde_json::json!({"Job": {"ID": "web", "Type": "service", "Datacenters": ["dc1"], "Meta": {"version": version},
        "TaskGroups": [{"Name": "web", "Count": 3,
            "Update": {"MaxParallel": 1, "Canary": 1, "HealthCheck": "task_states", "ProgressDeadline": 0},
            "Tasks": [{"Name": "main", "Driver": "mock", "Resources": {"CPU": 10, "MemoryMB": 10}}]}]}})
}

/// `method` `path` with `body` through `member`, made again while the
/// cluster has no leader to serve it (an election under way): the answer.
async fn write_through(member: &Member, method: &str, path: &str, body: &serde_json::Value) -> serde_json::Value {
    bounded("a write once a leader serves it", async {
        loop {
            let answer = member.api.request(method, path, Some(body)).await.expect("an answer");
            match answer.status {
                200 => return answer.json().expect("JSON"),
                500 => println!("{path}, again: {}", answer.body),
                status => panic!("{path}: {status} {}", answer.body),
            }
        }
    })
    .await
}

/// Counter `name` of `member`'s `/v1/metrics`.
async fn counter(member: &Member, name: &str) -> u64 {
    let metrics: serde_json::Value = member.api.get("/v1/metrics").await.expect("metrics").json().expect("JSON");
    let counters = metrics["Counters"].as_array().expect("counters");
    let found = counters.iter().find(|counter| counter["Name"] == name).unwrap_or_else(|| panic!("no {name}"));
    found["Count"].as_u64().expect("a count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_schedule_through_the_leaders_broker_and_applier() {
    let mut cluster = AgentsCluster::start("ha-schedulers").await;
    let members = &mut cluster.members;
    let leader_address = members[0].leader().await;
    let leader = members.iter().position(|member| member.rpc.to_string() == leader_address).expect("a leader");

    // The leader's own workers set to none: from now on, it schedules
    // nothing itself, whether it keeps leading or not.
    let none = serde_json::json!({"num_schedulers": 0,
        "enabled_schedulers": ["service", "batch", "system", "sysbatch", "_core"]});
    let answer = write_through(&members[leader], "PUT", "/v1/agent/schedulers/config", &none).await;
    assert_eq!(answer["num_schedulers"], 0, "{answer}");
    let idle = counter(&members[leader], "drover.worker.evals_processed").await;
    // A follower answers for its own workers (the request is not relayed).
    let follower = &members[(leader + 1) % SERVERS];
    let workers: serde_json::Value =
        follower.api.get("/v1/agent/schedulers").await.expect("workers").json().expect("JSON");
    assert_eq!(workers["schedulers"].as_array().map(Vec::len), Some(1), "{workers}");

    const JOBS: usize = 4;
    for n in 0..JOBS {
        let job = serde_json::json!({"Job": {"ID": format!("job-{n}"), "Type": "service", "Datacenters": ["dc1"],
            "TaskGroups": [{"Name": "web", "Count": 2,
                "Tasks": [{"Name": "main", "Driver": "mock", "Resources": {"CPU": 10, "MemoryMB": 10}}]}]}});
        write_through(follower, "PUT", "/v1/jobs", &job).await;
    }
    for n in 0..JOBS {
        let path = format!("/v1/job/job-{n}/allocations?stale");
        common::api::until(&follower.api, &path, "both allocations running", |allocs| {
            common::api::running_nodes(allocs).len() == 2
        })
        .await;
    }

    // Every eval was scheduled elsewhere: on a follower, through the
    // leader's broker and applier.
    assert_eq!(counter(&members[leader], "drover.worker.evals_processed").await, idle);
    let mut from_leader = 0;
    let mut plans_to_leader = 0;
    for (_, member) in members.iter().enumerate().filter(|(n, _)| *n != leader) {
        from_leader += counter(member, "drover.worker.evals_from_leader").await;
        plans_to_leader += counter(member, "drover.worker.plans_to_leader").await;
    }
    assert!(from_leader >= 1 && plans_to_leader >= 1, "{from_leader} evals, {plans_to_leader} plans");

    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_waiting_for_promotion_completes_under_the_next_leader() {
    let mut cluster = AgentsCluster::start("ha-deployment").await;
    let members = &mut cluster.members;
    let deployment_until = |member: &Member, what: &'static str, done: fn(&serde_json::Value) -> bool| {
        let api = member.api.clone();
        async move { common::api::until(&api, "/v1/job/web/deployment?stale", what, |d| !d.is_null() && done(d)).await }
    };

    write_through(&members[0], "PUT", "/v1/jobs", &canary_job("1")).await;
    deployment_until(&members[0], "version 0 deployed", |d| d["JobVersion"] == 0 && d["Status"] == "successful").await;
    write_through(&members[0], "PUT", "/v1/jobs", &canary_job("2")).await;
    let waiting = deployment_until(&members[0], "version 1's canary healthy", |d| {
        d["JobVersion"] == 1 && d["TaskGroups"]["web"]["HealthyAllocs"] == 1
    })
    .await;
    assert_eq!(waiting["StatusDescription"], "Deployment is running but requires manual promotion");

    // The leader dies while the deployment waits; a survivor's promotion
    // reaches the next leader, whose scheduler and watcher carry it on.
    let leader_address = members[0].leader().await;
    let leader = members.iter().position(|member| member.rpc.to_string() == leader_address).expect("a leader");
    println!("killing the leader {} mid-deployment", members[leader].name);
    members[leader].kill_9();
    let survivor = &members[(leader + 1) % SERVERS];
    let id = waiting["ID"].as_str().expect("an id");
    let promote = serde_json::json!({"DeploymentID": id, "All": true});
    write_through(survivor, "POST", &format!("/v1/deployment/promote/{id}"), &promote).await;
    let done =
        deployment_until(survivor, "version 1 rolled out", |d| d["JobVersion"] == 1 && d["Status"] != "running").await;
    assert_eq!((done["ID"].as_str(), done["Status"].as_str()), (Some(id), Some("successful")), "{done}");
    let versions: serde_json::Value =
        survivor.api.get("/v1/job/web/versions?stale").await.expect("versions").json().expect("JSON");
    assert_eq!((&versions["Versions"][0]["Version"], &versions["Versions"][0]["Stable"]), (&1.into(), &true.into()));
    let allocs: serde_json::Value =
        survivor.api.get("/v1/job/web/allocations?stale").await.expect("allocs").json().expect("JSON");
    let live: Vec<_> =
        allocs.as_array().expect("a list").iter().filter(|stub| stub["DesiredStatus"] == "run").collect();
    assert_eq!(live.len(), 3, "{allocs}");
    assert!(live.iter().all(|stub| stub["JobVersion"] == 1 && stub["DeploymentStatus"]["Healthy"] == true), "{allocs}");

    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_set_before_the_leader_dies_reaches_its_deadline_and_completes_under_the_next_leader() {
    let mut cluster = AgentsCluster::start("ha-drain").await;
    let members = &mut cluster.members;

    // A batch allocation stays on a draining node until the deadline.
    let batch = serde_json::json!({"Job": {"ID": "report", "Type": "batch", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "report", "Count": 1,
            "Tasks": [{"Name": "main", "Driver": "mock", "Resources": {"CPU": 10, "MemoryMB": 10}}]}]}});
    write_through(&members[0], "PUT", "/v1/jobs", &batch).await;
    let running = common::api::running_nodes;
    let allocs = common::api::until(&members[0].api, "/v1/job/report/allocations", "the batch job running", |a| {
        running(a).len() == 1
    })
    .await;
    let drained = running(&allocs)[0].clone();
    let drain = serde_json::json!({"DrainSpec": {"Deadline": 2_000_000_000i64, "IgnoreSystemJobs": false}});
    write_through(&members[0], "PUT", &format!("/v1/node/{drained}/drain"), &drain).await;

    // The leader dies before the deadline; the next one's drainer keeps it.
    let leader_address = members[0].leader().await;
    let leader = members.iter().position(|member| member.rpc.to_string() == leader_address).expect("a leader");
    println!("killing the leader {} with a drain under way", members[leader].name);
    members[leader].kill_9();
    let survivor = &members[(leader + 1) % SERVERS];
    // Stale reads: the survivor answers from its own state, which follows
    // the next leader's, while the election goes on.
    let path = format!("/v1/node/{drained}?stale");
    let node = common::api::until(&survivor.api, &path, "the drain complete", |node| {
        node["DrainStrategy"].is_null() && node["LastDrain"]["Status"] == "complete"
    })
    .await;
    assert_eq!(node["SchedulingEligibility"], "ineligible");
    let allocs = common::api::until(&survivor.api, "/v1/job/report/allocations?stale", "the batch job moved", |a| {
        running(a).len() == 1 && running(a)[0] != drained
    })
    .await;
    let list = allocs.as_array().expect("a list");
    let old = list.iter().find(|stub| stub["NodeID"] == drained.as_str()).expect("the drained node's");
    assert_eq!(old["DesiredDescription"], "alloc is being migrated: its node's drain deadline was reached");

    cluster.stop().await;
}

/// The unix seconds of each launched child of `parent` in `children` (a
/// job list), in order.
fn launch_times(children: &serde_json::Value, parent: &str) -> Vec<u64> {
    let prefix = format!("{parent}/periodic-");
    let ids = children.as_array().expect("a list").iter().map(|stub| stub["ID"].as_str().expect("an id"));
    let mut times: Vec<u64> =
        ids.map(|id| id.strip_prefix(&prefix).and_then(|time| time.parse().ok()).expect("a launch time")).collect();
    times.sort_unstable();
    times
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minute_cron_launches_once_a_minute_across_a_leader_kill() {
    let mut cluster = AgentsCluster::start("ha-periodic").await;
    let members = &mut cluster.members;
    let cron = serde_json::json!({"Job": {"ID": "tick", "Type": "batch", "Datacenters": ["dc1"],
        "Periodic": {"Spec": "* * * * *"},
        "TaskGroups": [{"Name": "tick", "Count": 1, "Tasks": [{"Name": "main", "Driver": "mock",
            "Config": {"run_for": "1ms"}, "Resources": {"CPU": 10, "MemoryMB": 10}}]}]}});
    write_through(&members[0], "PUT", "/v1/jobs", &cron).await;
    // A follower answers the write once the leader has it; its own state may apply it a moment later.
    let has_tick =
        |jobs: &serde_json::Value| jobs.as_array().is_some_and(|jobs| jobs.iter().any(|j| j["ID"] == "tick"));
    common::api::until(&members[0].api, "/v1/jobs?prefix=tick&stale", "the job on this member", has_tick).await;
    let parent: serde_json::Value = members[0].api.get("/v1/job/tick?stale").await.expect("job").json().expect("JSON");
    let registered = parent["SubmitTime"].as_u64().expect("a submit time") / 1_000_000_000;
    let path = "/v1/jobs?prefix=tick/periodic-&stale";
    let launched =
        |count: usize| move |children: &serde_json::Value| children.as_array().is_some_and(|c| c.len() >= count);
    common::api::until(&members[0].api, path, "the first launch", launched(1)).await;

    // The leader dies after the first launch; the next one launches the
    // following minutes from the launch record it finds in the state.
    let leader_address = members[0].leader().await;
    let leader = members.iter().position(|member| member.rpc.to_string() == leader_address).expect("a leader");
    println!("killing the leader {} between launches", members[leader].name);
    members[leader].kill_9();
    let survivor = &members[(leader + 1) % SERVERS];
    common::api::until(&survivor.api, path, "the second launch", launched(2)).await;
    let children = common::api::until(&survivor.api, path, "the third launch", launched(3)).await;

    // Each whole minute from the registration on, once: none missed, none
    // doubled, and no catch-up launch at another time.
    let times = launch_times(&children, "tick");
    let first_minute = (registered / 60 + 1) * 60;
    let expected: Vec<u64> = (0..times.len() as u64).map(|minute| first_minute + minute * 60).collect();
    assert_eq!(times, expected, "registered at {registered}");
    let summary: serde_json::Value =
        survivor.api.get("/v1/job/tick/summary?stale").await.expect("summary").json().expect("JSON");
    let children = &summary["Children"];
    let total = ["Pending", "Running", "Dead"].iter().map(|key| children[key].as_u64().expect("a count")).sum::<u64>();
    // The parent's summary counts the same children (a list read after it
    // bounds a launch that came between the reads).
    let after: serde_json::Value = survivor.api.get(path).await.expect("jobs").json().expect("JSON");
    let counted = times.len() as u64..=launch_times(&after, "tick").len() as u64;
    assert!(counted.contains(&total), "{summary}");

    cluster.stop().await;
}
