//! Agents against real servers over QUIC on loopback: a server restart,
//! a network loss long enough to mark the node disconnected, and the real
//! `drover` binary shutting down on SIGTERM and refusing a bad config.
//! Waits are on events (the store's index, an agent's heartbeat); every
//! wait is bounded by a watchdog that only turns a hang into a failure.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use drover::client::agent::{Agent, AgentObserver, AgentSettings};
use drover::server::RunningServer;
use engine::state::Snapshot;
use engine::structs::{ClientStatus, Job, JobType, Node, NodeId, NodeStatus, Resources};
use tokio::net::UdpSocket;
use tokio::sync::watch;
use transport::client::ClientEndpoints;
use transport::tls::TlsMaterial;

mod common;

use common::{bounded, drover, first_line, server_options, temp_dir, until};

/// Counts heartbeats on a watch channel.
struct Beats(watch::Sender<u64>);

impl AgentObserver for Beats {
    fn heartbeat(&self, _rtt: Duration) {
        self.0.send_modify(|beats| *beats += 1);
    }
}

fn mock_node(n: u128) -> Node {
    let mut node = Node::new_ready(NodeId::from_u128(n), "dc1", "", Resources::new(4_000, 4_096, 10_000));
    node.attributes.remove("driver.exec");
    node.attributes.insert("driver.mock".into(), "1".into());
    node.computed_class = node.compute_class();
    node
}

fn mock_job(id: &str, max_client_disconnect: Option<Duration>) -> Job {
    let mut job = Job::new_simple(id, JobType::Service, 1, Resources::new(100, 64, 0));
    job.task_groups[0].tasks[0].driver = "mock".into();
    job.task_groups[0].max_client_disconnect = max_client_disconnect;
    job
}

struct RunningAgent {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    beats: watch::Receiver<u64>,
    counters: Arc<drover::client::agent::AgentCounters>,
}

fn start_agent(node: Node, server: SocketAddr, tls: &TlsMaterial) -> RunningAgent {
    let endpoints = Arc::new(ClientEndpoints::bind(1, tls).expect("client endpoint"));
    let mut settings = AgentSettings::new(vec![server]);
    settings.backoff_base = Duration::from_millis(50);
    settings.backoff_cap = Duration::from_millis(500);
    settings.call_timeout = Duration::from_secs(1);
    let (beats_tx, beats) = watch::channel(0);
    let quic = endpoints.own_config().expect("config");
    let agent = Agent::new(node, settings, endpoints, quic, Arc::new(Beats(beats_tx)));
    let counters = agent.counters().clone();
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(async move { agent.run(stopped).await });
    RunningAgent { stop, task, beats, counters }
}

impl RunningAgent {
    async fn heartbeats_beyond(&mut self, count: u64) {
        let mut beats = self.beats.clone();
        bounded("agent heartbeats", beats.wait_for(|beats| *beats > count)).await.expect("agent running");
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = bounded("agent stop", self.task).await;
    }
}

fn running_on(snapshot: &Snapshot, node: NodeId, job: &str) -> bool {
    snapshot.allocs_by_node(node).any(|alloc| &*alloc.job_id == job && alloc.client_status == ClientStatus::Running)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_reconnect_and_resync_after_a_server_restart() {
    transport::install_crypto_provider();
    let (_ca, server_tls, client_tls) = TlsMaterial::dev_pair().expect("dev material");
    let first = RunningServer::start(server_options(0, &server_tls, Duration::from_secs(10))).expect("starts");
    let addr = first.local_addr();
    let node = mock_node(1);
    let agent = start_agent(node.clone(), addr, &client_tls);
    first.engine().jobs().register(mock_job("web", None)).expect("job registers");
    until(&first, "the alloc running on the first server", |s| running_on(s, node.id, "web")).await;
    first.shutdown().await;

    // A new (in-memory) server on the same address knows nothing: the
    // agent reconnects, registers again and runs what it is given. The
    // old endpoint's driver task releases the port just after shutdown
    // (asynchronously), so wait for the port before binding it again.
    bounded("the port released", async {
        while std::net::UdpSocket::bind(addr).is_err() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let second =
        RunningServer::start(server_options(addr.port(), &server_tls, Duration::from_secs(10))).expect("restarts");
    until(&second, "the node registered again", |s| s.node(node.id).is_some_and(|n| n.status == NodeStatus::Ready))
        .await;
    second.engine().jobs().register(mock_job("web", None)).expect("job registers");
    until(&second, "the alloc running on the second server", |s| running_on(s, node.id, "web")).await;
    assert!(agent.counters.reconnects.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    agent.stop().await;
    second.shutdown().await;
}

/// A UDP relay between agents and a server that can be cut and restored:
/// a real network loss on loopback.
struct Relay {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
}

/// Binds the relay's front socket: the address the server advertises, so
/// an agent that learns the server list from heartbeats keeps using the
/// relay (as a real client keeps using the network between it and the
/// server).
async fn relay_socket() -> Arc<UdpSocket> {
    Arc::new(UdpSocket::bind("127.0.0.1:0").await.expect("relay socket"))
}

/// Relays between `front` and `server`.
async fn relay(front: Arc<UdpSocket>, server: SocketAddr) -> Relay {
    let addr = front.local_addr().expect("bound");
    let (cut, is_cut) = watch::channel(false);
    tokio::spawn(async move {
        // One client (the agent's endpoint): its address, learned from
        // its first datagram, and one back socket towards the server.
        let back = Arc::new(UdpSocket::bind("127.0.0.1:0").await.expect("back socket"));
        back.connect(server).await.expect("connect back");
        let client = Arc::new(tokio::sync::Mutex::new(None::<SocketAddr>));
        let (back_reader, front_writer, client_seen, cut_seen) =
            (back.clone(), front.clone(), client.clone(), is_cut.clone());
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65_536];
            while let Ok(len) = back_reader.recv(&mut buf).await {
                let to = *client_seen.lock().await;
                let is_cut = *cut_seen.borrow();
                if let (Some(to), false) = (to, is_cut) {
                    let _ = front_writer.send_to(&buf[..len], to).await;
                }
            }
        });
        let mut buf = vec![0u8; 65_536];
        while let Ok((len, from)) = front.recv_from(&mut buf).await {
            *client.lock().await = Some(from);
            let cut_now = *is_cut.borrow();
            if !cut_now {
                let _ = back.send(&buf[..len]).await;
            }
        }
    });
    Relay { addr, cut }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_drops_and_returns_resyncs_and_keeps_its_disconnect_tolerant_alloc() {
    transport::install_crypto_provider();
    let (_ca, server_tls, client_tls) = TlsMaterial::dev_pair().expect("dev material");
    let front = relay_socket().await;
    let mut options = server_options(0, &server_tls, Duration::from_secs(1));
    options.advertise = Some(front.local_addr().expect("bound").to_string());
    let server = RunningServer::start(options).expect("starts");
    let relay = relay(front, server.local_addr()).await;
    let node = mock_node(2);
    let agent = start_agent(node.clone(), relay.addr, &client_tls);
    server.engine().jobs().register(mock_job("db", Some(Duration::from_secs(600)))).expect("job registers");
    let before = until(&server, "the alloc running", |s| running_on(s, node.id, "db")).await;
    let alloc_id = before.allocs_by_node(node.id).next().expect("placed").id;

    relay.cut.send(true).expect("cut");
    // The node is marked disconnected and its eval marks the allocation
    // unknown (not lost: it tolerates a disconnect of 10 minutes).
    until(&server, "the node disconnected and its alloc unknown", |s| {
        s.node(node.id).is_some_and(|n| n.status == NodeStatus::Disconnected)
            && s.alloc(alloc_id).is_some_and(|a| a.client_status == ClientStatus::Unknown)
    })
    .await;

    relay.cut.send(false).expect("restore");
    let back = until(&server, "the node ready again with its alloc running", |s| {
        s.node(node.id).is_some_and(|n| n.status == NodeStatus::Ready)
            && s.alloc(alloc_id).is_some_and(|a| a.client_status == ClientStatus::Running)
    })
    .await;
    let live: Vec<_> = back.allocs_by_node(node.id).filter(|alloc| !alloc.terminal()).map(|alloc| alloc.id).collect();
    assert_eq!(live, vec![alloc_id], "the original allocation is kept, nothing replaced it");
    // The agent learned it had been marked away and resent everything it
    // runs. Whether its QUIC connection survived the cut (the idle timeout is
    // 60 s, and unanswered heartbeats are retried on the same connection)
    // or it reconnected does not matter to the protocol, so it is not asserted.
    let counters = &agent.counters;
    assert!(counters.marked_away.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    assert!(counters.resyncs.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    agent.stop().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_calls_need_an_operator_certificate() {
    transport::install_crypto_provider();
    let (ca, server_tls, client_tls) = TlsMaterial::dev_pair().expect("dev material");
    let operator_tls = TlsMaterial {
        ca_pem: client_tls.ca_pem.clone(),
        identity: ca.issue(transport::tls::Role::Operator, &[]).expect("operator certificate"),
    };
    let server = RunningServer::start(server_options(0, &server_tls, Duration::from_secs(10))).expect("starts");
    let addr = server.local_addr();

    let agents = ClientEndpoints::bind(1, &client_tls).expect("endpoint");
    let agent = bounded("connect", agents.connect(addr)).await.expect("connects");
    let refused = bounded("submit", agent.submit_job(mock_job("web", None))).await.expect_err("a client certificate");
    assert_eq!(refused.refusal(), Some(transport::message::RefusalCode::Forbidden));
    let refused = bounded("report", agent.report()).await.expect_err("a client certificate");
    assert_eq!(refused.refusal(), Some(transport::message::RefusalCode::Forbidden));
    assert_eq!(server.engine().store().snapshot().jobs().count(), 0);

    let operators = ClientEndpoints::bind(1, &operator_tls).expect("endpoint");
    let operator = bounded("connect", operators.connect(addr)).await.expect("connects");
    let mut invalid = mock_job("bad", None);
    invalid.task_groups.clear();
    let refused = bounded("submit", operator.submit_job(invalid)).await.expect_err("an invalid job");
    assert_eq!(refused.refusal(), Some(transport::message::RefusalCode::Invalid), "{refused}");
    let index = bounded("submit", operator.submit_job(mock_job("web", None))).await.expect("registered");
    let report = bounded("report", operator.report()).await.expect("report");
    assert!(report.index >= index);
    assert_eq!(report.jobs.len(), 1);
    assert_eq!(report.jobs[0].id, "web");
    assert_eq!(report.listener.connections_accepted, 2);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drover_server_shuts_down_cleanly_on_sigterm_with_agents_connected() {
    transport::install_crypto_provider();
    let dir = temp_dir("sigterm");
    let mut child = drover()
        .args(["server", "--dev", "--bind", "127.0.0.1", "--port", "0", "--http-port", "0", "--print-address"])
        .args(["--workers", "1"])
        .arg("--data-dir")
        .arg(&dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("drover server starts");
    let line = first_line(&mut child).await;
    let addr: SocketAddr = line.trim().strip_prefix("listening ").expect("listening line").parse().expect("address");
    let tls_dir = dir.join("dev-tls");
    let client_tls =
        TlsMaterial::from_files(&tls_dir.join("ca.pem"), &tls_dir.join("client.pem"), &tls_dir.join("client-key.pem"))
            .expect("dev client material");
    let mut agents: Vec<_> = (10..13).map(|n| start_agent(mock_node(n), addr, &client_tls)).collect();
    for agent in &mut agents {
        agent.heartbeats_beyond(0).await;
    }

    let kill = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill runs");
    assert!(kill.success());
    let output = bounded("the server's exit", tokio::task::spawn_blocking(move || child.wait_with_output()))
        .await
        .expect("waiter")
        .expect("exit status");
    let log = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{log}");
    assert!(log.contains("SIGTERM") && log.contains("drover server stopped"), "{log}");
    for agent in agents {
        agent.stop().await;
    }
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn a_bad_config_file_is_named_with_its_key_and_exits_2() {
    let dir = temp_dir("bad-config");
    let file = dir.join("server.toml");
    std::fs::write(&file, "[server]\nport = 4647\nworkers = \"many\"\n").expect("write");
    let output = drover().args(["server", "--dev", "--config"]).arg(&file).output().expect("runs");
    let error = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{error}");
    assert!(error.contains(&file.display().to_string()) && error.contains("server.workers"), "{error}");

    let output = drover().args(["server", "--port", "0"]).output().expect("runs");
    let error = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{error}");
    assert!(error.contains("tls.ca_file"), "{error}");
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// The agent's own HTTP listener is gone: a `--http-addr` or
/// `client.http_addr` someone still sets is not dropped silently, the log
/// says it is ignored and what replaced it, and no port is opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_told_to_serve_http_says_it_no_longer_does_and_where_logs_are() {
    use std::io::BufRead;

    let dir = temp_dir("agent-http-addr");
    let certs = common::Certs::create(&dir);
    let config = dir.join("agent.toml");
    std::fs::write(&config, "[client]\nhttp_addr = \"127.0.0.1:4646\"\n").expect("config");
    let files = ["drover-agent-ca.pem", "global-client-drover.pem", "global-client-drover-key.pem"]
        .map(|name| certs.file(name));
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let asked = held.local_addr().expect("bound").to_string();
    drop(held);
    let mut child = common::agent_command("127.0.0.1:9", &files, &dir.join("agent"))
        .args(["--raw-exec", "--http-addr", &asked, "--config"])
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("drover agent starts");
    let stderr = child.stderr.take().expect("piped");
    let warnings = tokio::task::spawn_blocking(move || {
        let mut seen = Vec::new();
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("no longer serves HTTP") {
                seen.push(line);
                if seen.len() == 2 {
                    break;
                }
            }
        }
        seen
    });
    let warnings = bounded("both warnings", warnings).await.expect("reader");
    let _ = child.kill();
    let _ = child.wait();
    assert!(warnings.iter().any(|line| line.contains("--http-addr") && line.contains(&asked)), "{warnings:?}");
    assert!(warnings.iter().any(|line| line.contains("client.http_addr")), "{warnings:?}");
    assert!(warnings.iter().all(|line| line.contains("/v1/client/")), "names the replacement: {warnings:?}");
    assert!(std::net::TcpListener::bind(&asked).is_ok(), "the agent opened no port there");
    std::fs::remove_dir_all(&dir).expect("clean up");
}
