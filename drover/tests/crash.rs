//! The real `drover server` with a data dir, killed with SIGKILL at random
//! moments while writes are in flight (snapshots are taken every few
//! entries, so some kills land while one is being written), and restarted
//! on the same data dir each time. After every restart:
//! - every job whose registration the server acknowledged is there, and
//!   every job there is one the client submitted;
//! - every node the agents registered is there;
//! - no pending eval was lost: all of them run to completion (a lost one
//!   would stay pending until the watchdog names it);
//! - nothing is placed twice: each job runs exactly its count, and no node
//!   is oversubscribed or holds a port twice.
//!
//! The cluster is a production one: a CA and certificates made with
//! `drover tls`, mutual TLS on QUIC, HTTPS for the API. The same set-up
//! checks the operator tools: `drover operator snapshot save` from a
//! running server, `restore` into a stopped server's data dir, `raft info`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::Duration;

use drover::api::client::ApiClient;
use drover::client::agent::{Agent, AgentSettings, NoObserver};
use rand::{Rng, SeedableRng};
use tokio::sync::{mpsc, watch};
use transport::client::{ClientConnection, ClientEndpoints};
use transport::message::ClusterReport;
use transport::tls::TlsMaterial;

mod common;

use common::{bounded, drover, first_line, mock_node, service_job as job, temp_dir, Certs};

/// SIGKILLs across the run.
const KILLS: usize = 24;
/// Nodes, each run by a real agent in this process.
const NODES: u128 = 4;
/// Concurrent writers.
const WRITERS: usize = 8;

/// A `drover server` process on fixed loopback ports.
struct ServerProcess {
    child: Child,
    http: ApiClient,
}

/// A free port on loopback (UDP for QUIC, TCP for HTTP): bound, then
/// released for the server, which binds it with SO_REUSEADDR.
fn free_ports() -> (u16, u16) {
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp").local_addr().expect("addr").port();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("tcp").local_addr().expect("addr").port();
    (udp, tcp)
}

async fn start_server(certs: &Certs, data_dir: &Path, ports: (u16, u16)) -> ServerProcess {
    start_server_with(certs, data_dir, ports, &[]).await
}

/// [`start_server`] with more flags.
async fn start_server_with(
    certs: &Certs,
    data_dir: &Path,
    (port, http_port): (u16, u16),
    flags: &[&str],
) -> ServerProcess {
    let mut child = drover()
        .args(["server", "--bind", "127.0.0.1", "--workers", "2", "--print-address", "--snapshot-every", "8"])
        .args(["--port", &port.to_string(), "--http-port", &http_port.to_string()])
        .args(certs.server_flags())
        .args(flags)
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--log-level", "warn"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("drover server starts");
    let line = first_line(&mut child).await;
    assert!(line.starts_with("listening "), "the server did not start: {line:?}");
    let ca = std::fs::read_to_string(certs.file("drover-agent-ca.pem")).expect("ca");
    let http = ApiClient::new(&format!("https://127.0.0.1:{http_port}"), None, Some(&ca)).expect("api client");
    ServerProcess { child, http }
}

impl ServerProcess {
    fn kill_9(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
    }

    async fn terminate(mut self) {
        let pid = self.child.id().to_string();
        assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().expect("kill").success());
        let status = bounded("the server's exit", tokio::task::spawn_blocking(move || self.child.wait()))
            .await
            .expect("waiter")
            .expect("status");
        assert_eq!(status.code(), Some(0));
    }

    /// Waits until `holds` is true of the list at `path`, woken by each
    /// write (a blocking query).
    async fn until_list(&self, what: &str, path: &str, holds: impl Fn(&[serde_json::Value]) -> bool) {
        bounded(what, async {
            let mut index = 0;
            loop {
                let answer = self.http.get(&format!("{path}?index={index}&wait=30s")).await.expect("a list");
                let list = answer.json().expect("a JSON list");
                if holds(list.as_array().expect("a list")) {
                    return;
                }
                index = answer.index.expect("X-Nomad-Index");
            }
        })
        .await;
    }

    /// The cluster report once no eval is pending: every eval the server
    /// recovered went back to the broker and ran (a lost one would stay
    /// pending until the watchdog names it).
    async fn settled_report(&self, connection: &ClientConnection) -> ClusterReport {
        loop {
            let no_pending = |evals: &[serde_json::Value]| evals.iter().all(|eval| eval["Status"] != "pending");
            self.until_list("every pending eval to complete", "/v1/evaluations", no_pending).await;
            let report = bounded("the report", connection.report()).await.expect("report");
            // An agent's reconnect may have made an eval since.
            if report.evals_pending == 0 {
                return report;
            }
        }
    }
}

/// The agents run in this process for the whole test and reconnect to
/// each new server process on their own.
fn start_agents(server: SocketAddr, tls: &TlsMaterial) -> (watch::Sender<bool>, Vec<tokio::task::JoinHandle<()>>) {
    let (stop, stopped) = watch::channel(false);
    let tasks = (1..=NODES)
        .map(|n| {
            let endpoints = Arc::new(ClientEndpoints::bind(1, tls).expect("client endpoint"));
            let mut settings = AgentSettings::new(vec![server]);
            settings.backoff_base = Duration::from_millis(20);
            settings.backoff_cap = Duration::from_millis(200);
            settings.call_timeout = Duration::from_secs(1);
            let quic = endpoints.own_config().expect("config");
            let agent = Agent::new(mock_node(n), settings, endpoints, quic, Arc::new(NoObserver));
            let stopped = stopped.clone();
            tokio::spawn(async move { agent.run(stopped).await })
        })
        .collect();
    (stop, tasks)
}

async fn operator(endpoints: &ClientEndpoints, server: SocketAddr) -> ClientConnection {
    bounded("the operator connection", endpoints.connect(server)).await.expect("connects")
}

/// What the client knows: the jobs it sent (with their counts) and those
/// acknowledged.
#[derive(Default)]
struct Ledger {
    submitted: Arc<parking_lot::Mutex<BTreeMap<String, u32>>>,
    acknowledged: BTreeSet<String>,
}

/// Checks the recovered state against the ledger (module docs).
fn check(report: &ClusterReport, ledger: &Ledger, restart: usize) {
    let present: BTreeMap<&str, _> = report.jobs.iter().map(|job| (job.id.as_str(), job)).collect();
    assert_eq!(present.len(), report.jobs.len(), "restart {restart}: a job is listed twice");
    for id in &ledger.acknowledged {
        assert!(present.contains_key(id.as_str()), "restart {restart}: the acknowledged job {id} was lost");
    }
    for (id, counts) in &present {
        let submitted = ledger.submitted.lock();
        let count = submitted.get(*id).unwrap_or_else(|| panic!("restart {restart}: unknown job {id}"));
        assert_eq!(counts.desired, u64::from(*count), "restart {restart}: job {id}");
        assert_eq!(counts.live, counts.desired, "restart {restart}: job {id} runs {} of {count}", counts.live);
    }
    let nodes = report.nodes_ready + report.nodes_initializing + report.nodes_down + report.nodes_disconnected;
    assert_eq!(nodes, NODES as u64, "restart {restart}: nodes");
    let audit = report.audit.as_ref().expect("a full report");
    assert!(audit.nodes_oversubscribed.is_empty(), "restart {restart}: {:?}", audit.nodes_oversubscribed);
    assert!(audit.port_collisions.is_empty(), "restart {restart}: {:?}", audit.port_collisions);
    assert_eq!(report.evals_pending, 0, "restart {restart}: pending evals");
}

/// What both server tests start from: a temp dir with the cluster's
/// certificates, a data dir, two free ports and an operator endpoint.
struct Setup {
    dir: PathBuf,
    certs: Certs,
    data_dir: PathBuf,
    ports: (u16, u16),
    addr: SocketAddr,
    operators: ClientEndpoints,
}

impl Setup {
    fn new(name: &str) -> Setup {
        transport::install_crypto_provider();
        let dir = temp_dir(name);
        let certs = Certs::create(&dir);
        let ports = free_ports();
        let operators = ClientEndpoints::bind(1, &certs.material("global-cli-drover")).expect("operator endpoint");
        Setup {
            data_dir: dir.join("data"),
            dir,
            certs,
            ports,
            addr: SocketAddr::from(([127, 0, 0, 1], ports.0)),
            operators,
        }
    }

    async fn finish(self) {
        self.operators.close().await;
        std::fs::remove_dir_all(&self.dir).expect("clean up");
    }
}

fn snapshot_temporaries(data_dir: &Path) -> usize {
    let dir = data_dir.join("server").join("raft").join("snapshots");
    std::fs::read_dir(dir)
        .map(|entries| entries.flatten().filter(|entry| entry.path().to_string_lossy().ends_with(".tmp")).count())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_survives_kill_9_at_random_moments() {
    let setup = Setup::new("crash");
    let (certs, data_dir, ports, addr, operators) =
        (&setup.certs, &setup.data_dir, setup.ports, setup.addr, &setup.operators);
    let seed: u64 = rand::random();
    println!("seed {seed}");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let (stop_agents, agents) = start_agents(addr, &certs.material("global-client-drover"));
    let mut ledger = Ledger::default();
    let mut next_job = 0usize;
    let mut killed_while_writing_a_snapshot = 0;

    for round in 0..=KILLS {
        let server = start_server(certs, data_dir, ports).await;
        let connection = operator(operators, addr).await;
        if round == 0 {
            let all = |nodes: &[serde_json::Value]| nodes.len() == NODES as usize;
            server.until_list("every agent's node registered", "/v1/nodes", all).await;
        } else {
            let report = server.settled_report(&connection).await;
            check(&report, &ledger, round);
        }
        if round == KILLS {
            server.terminate().await;
            break;
        }
        // Writers submit jobs until the server dies; each answer goes to
        // the ledger. The kill comes after a random number of answers.
        let (answers, mut answered) = mpsc::unbounded_channel();
        let mut writers = Vec::new();
        for _ in 0..WRITERS {
            let connection = connection.clone();
            let answers = answers.clone();
            let submitted = ledger.submitted.clone();
            let ids: Vec<(String, u32)> = (0..1_000)
                .map(|_| {
                    next_job += 1;
                    (format!("crash-{next_job}"), rng.random_range(1..=3))
                })
                .collect();
            writers.push(tokio::spawn(async move {
                for (id, count) in ids {
                    submitted.lock().insert(id.clone(), count);
                    let outcome = connection.submit_job(job(&id, count)).await;
                    if answers.send((id, outcome.is_ok())).is_err() || outcome.is_err() {
                        return;
                    }
                }
            }));
        }
        drop(answers);
        let kill_after = rng.random_range(1..=40);
        let mut answers_seen = 0;
        while answers_seen < kill_after {
            let (id, acknowledged) = bounded("a write's answer", answered.recv()).await.expect("writers running");
            if acknowledged {
                ledger.acknowledged.insert(id);
            }
            answers_seen += 1;
        }
        server.kill_9();
        // A killed peer sends nothing: close the connection so the calls in
        // flight fail now. Answers that arrived before the kill count.
        connection.close();
        while let Some((id, acknowledged)) = bounded("the writers' end", answered.recv()).await {
            if acknowledged {
                ledger.acknowledged.insert(id);
            }
        }
        for writer in writers {
            writer.await.expect("writer");
        }
        if snapshot_temporaries(data_dir) > 0 {
            killed_while_writing_a_snapshot += 1;
        }
    }
    println!(
        "{KILLS} kills, {} jobs acknowledged of {} submitted, {killed_while_writing_a_snapshot} kills left a snapshot \
         half-written",
        ledger.acknowledged.len(),
        ledger.submitted.lock().len(),
    );
    assert!(ledger.acknowledged.len() >= KILLS, "every round acknowledged at least one write");
    let _ = stop_agents.send(true);
    for agent in agents {
        let _ = bounded("an agent's stop", agent).await;
    }
    setup.finish().await;
}

/// `drover operator snapshot save` from a running server, `raft info` of
/// it and of its stopped data dir, `restore` into a fresh data dir, and a
/// server on that data dir serving the saved state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_snapshot_restores_into_a_stopped_servers_data_dir() {
    let setup = Setup::new("snapshot-restore");
    let (dir, certs, data_dir, ports, addr, operators) =
        (&setup.dir, &setup.certs, &setup.data_dir, setup.ports, setup.addr, &setup.operators);

    let server = start_server(certs, data_dir, ports).await;
    let connection = operator(operators, addr).await;
    for n in 0..20 {
        bounded("a write", connection.submit_job(job(&format!("saved-{n}"), 1))).await.expect("registered");
    }
    let address = format!("https://127.0.0.1:{}", ports.1);
    let cli = |args: &[&str]| {
        let output = drover()
            .args(args)
            .args(["--address", &address])
            .arg("--ca-cert")
            .arg(certs.file("drover-agent-ca.pem"))
            .output()
            .expect("drover runs");
        assert!(output.status.success(), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).expect("utf-8")
    };
    let backup = dir.join("backup.snap");
    let saved = cli(&["operator", "snapshot", "save", backup.to_str().expect("utf-8 path")]);
    assert!(saved.contains("State file written"), "{saved}");
    let info = cli(&["operator", "raft", "info"]);
    assert!(info.contains("Last snapshot") && info.contains("Snapshot size"), "{info}");
    let configuration = bounded("raft configuration", server.http.get("/v1/operator/raft/configuration")).await;
    let configuration = configuration.expect("answer").json().expect("JSON");
    assert_eq!(configuration["Servers"][0]["Leader"], true, "{configuration}");
    let restore = bounded("online restore", server.http.send("PUT", "/v1/operator/snapshot", Default::default())).await;
    let restore = restore.expect("answer");
    assert_eq!(restore.status, 400, "a running server never swaps its state");
    assert!(restore.body.contains("drover operator snapshot restore"), "{}", restore.body);
    // Written after the backup: not in the restored state.
    bounded("a write", connection.submit_job(job("after-backup", 1))).await.expect("registered");
    server.terminate().await;

    let offline = drover().args(["operator", "raft", "info", "--data-dir"]).arg(data_dir).output().expect("runs");
    let offline_text = String::from_utf8_lossy(&offline.stdout);
    assert!(offline.status.success() && offline_text.contains("Log last index"), "{offline_text}");

    let restored_dir = dir.join("restored");
    let restore = drover()
        .args(["operator", "snapshot", "restore", "--data-dir"])
        .arg(&restored_dir)
        .arg(&backup)
        .output()
        .expect("runs");
    assert!(restore.status.success(), "{}", String::from_utf8_lossy(&restore.stderr));

    let server = start_server(certs, &restored_dir, ports).await;
    let connection = operator(operators, addr).await;
    let report = bounded("the report", connection.report()).await.expect("report");
    let ids: BTreeSet<String> = report.jobs.iter().map(|job| job.id.clone()).collect();
    let expected: BTreeSet<String> = (0..20).map(|n| format!("saved-{n}")).collect();
    assert_eq!(ids, expected);
    // The restored server takes writes after the snapshot's index.
    bounded("a write", connection.submit_job(job("after-restore", 1))).await.expect("registered");
    server.terminate().await;

    // A corrupt file is refused and the data dir is left as it was.
    let corrupt = dir.join("corrupt.snap");
    let mut bytes = std::fs::read(&backup).expect("backup");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&corrupt, bytes).expect("write");
    let refused = drover()
        .args(["operator", "snapshot", "restore", "--data-dir"])
        .arg(&restored_dir)
        .arg(&corrupt)
        .output()
        .expect("runs");
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("corrupt.snap"));

    setup.finish().await;
}

#[test]
fn a_server_without_a_data_dir_is_refused_unless_in_dev_mode() {
    let dir = temp_dir("no-data-dir");
    let certs = Certs::create(&dir);
    let output =
        drover().args(["server", "--port", "0", "--http-port", "0"]).args(certs.server_flags()).output().expect("runs");
    let error = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{error}");
    assert!(error.contains("data_dir"), "{error}");
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// Starts `drover server` on `data_dir`, expects it to refuse to start,
/// and returns what it said on stderr.
async fn refused_start(certs: &Certs, data_dir: &Path, flags: &[&str]) -> String {
    let (port, http_port) = free_ports();
    let mut command = drover();
    command.args(["server", "--bind", "127.0.0.1", "--port", &port.to_string()]);
    command.args(["--http-port", &http_port.to_string()]);
    command.args(certs.server_flags()).args(flags).arg("--data-dir").arg(data_dir).args(["--log-level", "warn"]);
    let child = command.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("runs");
    let pid = child.id().to_string();
    let output = tokio::task::spawn_blocking(move || child.wait_with_output().expect("waits"));
    let Ok(output) = tokio::time::timeout(common::WATCHDOG, output).await else {
        // A server that started runs until killed; the test's runtime waits
        // for the waiting thread before it can report the failure.
        let _ = std::process::Command::new("kill").args(["-KILL", &pid]).status();
        panic!("the server started on {} instead of refusing to", data_dir.display());
    };
    let output = output.expect("waiter");
    assert!(!output.status.success(), "the server started");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A data dir is refused, saying what to do, by a server started the
/// other way: a one-server cluster's by a server started alone, a lone
/// server's by a server of a cluster. Neither waits for an election it
/// cannot win, and neither changes the data dir.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_is_refused_by_a_server_started_the_other_way() {
    let dir = temp_dir("other-way");
    let certs = Certs::create(&dir);
    let (lone, clustered) = (dir.join("lone"), dir.join("clustered"));
    let peer_port = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp").local_addr().expect("addr").port();
    let cluster_flags = ["--bootstrap-expect", "1", "--peer-port", &peer_port.to_string()];
    start_server(&certs, &lone, free_ports()).await.terminate().await;
    start_server_with(&certs, &clustered, free_ports(), &cluster_flags).await.terminate().await;

    let error = refused_start(&certs, &clustered, &[]).await;
    assert!(error.contains("holds the raft log of a cluster of 1 servers"), "{error}");
    let error = refused_start(&certs, &lone, &cluster_flags).await;
    assert!(error.contains("holds the state of a server run alone"), "{error}");

    // Both still start the way they were made.
    start_server(&certs, &lone, free_ports()).await.terminate().await;
    start_server_with(&certs, &clustered, free_ports(), &cluster_flags).await.terminate().await;
    std::fs::remove_dir_all(&dir).expect("clean up");
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap_or_else(|error| panic!("{}: {error}", path.display())).permissions().mode() & 0o777
}

/// A stopped server's raft log deleted, or emptied: the restart is
/// refused, naming the log, and makes no new one; with the log put back
/// the server starts with every job it acknowledged. The log, the
/// snapshots and the key files are readable by their owner only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_log_is_missing_or_emptied_refuses_to_start() {
    let setup = Setup::new("missing-log");
    let (dir, certs, data_dir, ports, addr, operators) =
        (&setup.dir, &setup.certs, &setup.data_dir, setup.ports, setup.addr, &setup.operators);
    let server = start_server(certs, data_dir, ports).await;
    let connection = operator(operators, addr).await;
    let ids: BTreeSet<String> = (0..20).map(|n| format!("acknowledged-{n}")).collect();
    for id in &ids {
        bounded("a write", connection.submit_job(job(id, 1))).await.expect("registered");
    }
    server.terminate().await;

    let raft = data_dir.join("server").join("raft");
    let log = raft.join("wal");
    let snapshots: Vec<PathBuf> = std::fs::read_dir(raft.join("snapshots"))
        .expect("the snapshot directory")
        .map(|entry| entry.expect("an entry").path())
        .collect();
    assert!(!snapshots.is_empty(), "--snapshot-every 8 took a snapshot");
    let segments: Vec<PathBuf> =
        std::fs::read_dir(&log).expect("the log").map(|entry| entry.expect("an entry").path()).collect();
    assert!(!segments.is_empty(), "the log has segments");
    for file in snapshots.iter().chain(&segments) {
        assert_eq!(mode(file), 0o600, "{}", file.display());
    }
    for directory in [data_dir.join("server"), raft.clone(), raft.join("snapshots"), log.clone()] {
        assert_eq!(mode(&directory), 0o700, "{}", directory.display());
    }
    for key in ["drover-agent-ca-key.pem", "global-server-drover-key.pem", "global-cli-drover-key.pem"] {
        assert_eq!(mode(&certs.file(key)), 0o600, "{key}");
    }

    let moved = dir.join("wal.moved");
    std::fs::rename(&log, &moved).expect("moves the log away");
    let error = refused_start(certs, data_dir, &[]).await;
    assert!(error.contains(&format!("the raft log {} is missing", log.display())), "{error}");
    assert!(error.contains("drover operator snapshot restore"), "says how to recover on purpose: {error}");
    assert!(!log.exists(), "a refused start makes no log");

    std::fs::create_dir(&log).expect("an emptied log: its directory without segments");
    let error = refused_start(certs, data_dir, &[]).await;
    assert!(error.contains(&format!("the raft log {} is empty (no segments)", log.display())), "{error}");
    std::fs::remove_dir(&log).expect("removes the empty log");

    std::fs::rename(&moved, &log).expect("puts the log back");
    let server = start_server(certs, data_dir, ports).await;
    let connection = operator(operators, addr).await;
    let report = bounded("the report", connection.report()).await.expect("report");
    let present: BTreeSet<String> = report.jobs.iter().map(|job| job.id.clone()).collect();
    assert_eq!(present, ids, "every acknowledged job is there");
    server.terminate().await;
    setup.finish().await;
}
