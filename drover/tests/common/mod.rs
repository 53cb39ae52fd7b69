//! What the agent tests share: bounded waits on the server's state, and
//! a server on loopback.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub mod agent;
pub mod api;
pub mod dev;
pub mod docker;

use drover::server::{RunningServer, ServerOptions};
use engine::server::ServerConfig;
use engine::state::Snapshot;
use transport::tls::TlsMaterial;

/// How long any one wait may take before the test fails: a hang becomes
/// a failure naming what did not happen, never a timing assertion.
pub const WATCHDOG: Duration = Duration::from_secs(90);

/// `future`'s output, or a panic naming `what` after [`WATCHDOG`].
pub async fn bounded<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WATCHDOG, future).await.unwrap_or_else(|_| panic!("{what} did not happen within {WATCHDOG:?}"))
}

/// Waits until the server's state satisfies `holds`, woken by each write.
pub async fn until(server: &RunningServer, what: &str, holds: impl Fn(&Snapshot) -> bool) -> Arc<Snapshot> {
    let store = server.engine().store().clone();
    bounded(what, async {
        loop {
            let snapshot = store.snapshot();
            if holds(&snapshot) {
                return snapshot;
            }
            store.wait_for_index(snapshot.index() + 1).await.expect("the store is running");
        }
    })
    .await
}

/// Options for a server on loopback `port` (0: any) with heartbeat TTL `ttl`.
pub fn server_options(port: u16, tls: &TlsMaterial, ttl: Duration) -> ServerOptions {
    let mut engine = ServerConfig { workers: 1, ..ServerConfig::default() };
    engine.heartbeat.min_heartbeat_ttl = ttl;
    engine.heartbeat.heartbeat_grace = ttl;
    ServerOptions {
        cluster: None,
        bind: SocketAddr::from(([127, 0, 0, 1], port)),
        advertise: None,
        engine,
        tls: tls.clone(),
        http: None,
        durable: None,
    }
}

/// A fresh temporary directory for one test.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("drover-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Runs the real binary.
pub fn drover() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_drover"))
}

/// `drover agent` against `servers` with the CA, certificate and key
/// files `tls`, keeping its data in `data_dir`; more flags may follow.
pub fn agent_command(servers: &str, tls: &[PathBuf; 3], data_dir: &Path) -> std::process::Command {
    agent::agent_command_of(Path::new(env!("CARGO_BIN_EXE_drover")), servers, tls, data_dir)
}

/// `drover agent --dev` (mock and raw_exec) against the `drover server
/// --dev` at `rpc` whose data dir is `server_dir` (its client files are in
/// `dev-tls`), keeping its own data in `data_dir`.
pub fn dev_agent(server_dir: &Path, rpc: &str, data_dir: &Path) -> std::process::Command {
    let tls = server_dir.join("dev-tls");
    let files = [tls.join("ca.pem"), tls.join("client.pem"), tls.join("client-key.pem")];
    let mut command = agent_command(rpc, &files, data_dir);
    command.args(["--dev", "--log-level", "warn"]);
    command
}

/// The first line `child` prints on its (piped) stdout, such as
/// `--print-address`'s `listening <addr>`. The rest is read on, so the
/// child never writes to a closed pipe.
pub async fn first_line(child: &mut std::process::Child) -> String {
    let stdout = child.stdout.take().expect("stdout is piped");
    let reading = tokio::task::spawn_blocking(move || {
        let mut reader = std::io::BufReader::new(stdout);
        let mut line = String::new();
        std::io::BufRead::read_line(&mut reader, &mut line).expect("reads");
        std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
        line
    });
    bounded("the child's first line", reading).await.expect("reader")
}

/// The two addresses `--print-address` prints first (`listening <rpc>`,
/// then `http <addr>`), as printed. The rest of `child`'s (piped) stdout is
/// read on, so it never writes to a closed pipe.
pub async fn printed_addresses(child: &mut std::process::Child) -> (String, String) {
    let stdout = child.stdout.take().expect("stdout is piped");
    let reading = tokio::task::spawn_blocking(move || {
        let mut reader = std::io::BufReader::new(stdout);
        let mut next = || {
            let mut line = String::new();
            std::io::BufRead::read_line(&mut reader, &mut line).expect("reads");
            line.trim().to_string()
        };
        let (rpc, http) = (next(), next());
        std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
        (rpc, http)
    });
    let (rpc, http) = bounded("the address lines", reading).await.expect("reader");
    let rpc = rpc.strip_prefix("listening ").expect("a listening line").to_string();
    let http = http.strip_prefix("http ").expect("an http line").to_string();
    (rpc, http)
}

/// A large node offering only the mock driver (the server tests' agents).
pub fn mock_node(n: u128) -> engine::structs::Node {
    use engine::structs::{Node, NodeId, Resources};
    let mut node = Node::new_ready(NodeId::from_u128(n), "dc1", "", Resources::new(64_000, 65_536, 10_000));
    node.attributes.remove("driver.exec");
    node.attributes.insert("driver.mock".into(), "1".into());
    node.computed_class = node.compute_class();
    node
}

/// A small service job of `count` mock tasks.
pub fn service_job(id: &str, count: u32) -> engine::structs::Job {
    use engine::structs::{Job, JobType, Resources};
    let mut job = Job::new_simple(id, JobType::Service, count, Resources::new(1, 1, 0));
    job.task_groups[0].tasks[0].driver = "mock".into();
    job
}

/// The cluster's CA and certificates, made with `drover tls`.
pub struct Certs {
    dir: PathBuf,
}

impl Certs {
    pub fn create(dir: &Path) -> Certs {
        let run = |args: &[&str]| {
            let output = drover().args(args).arg("--dir").arg(dir).current_dir(dir).output().expect("drover tls runs");
            assert!(output.status.success(), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
        };
        run(&["tls", "ca", "create"]);
        for role in ["--server", "--client", "--cli"] {
            run(&["tls", "cert", "create", role]);
        }
        Certs { dir: dir.to_path_buf() }
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `drover server`'s TLS flags for the server certificate.
    pub fn server_flags(&self) -> Vec<std::ffi::OsString> {
        let flags = [
            ("--ca-file", "drover-agent-ca.pem"),
            ("--cert-file", "global-server-drover.pem"),
            ("--key-file", "global-server-drover-key.pem"),
        ];
        flags.into_iter().flat_map(|(flag, name)| [flag.into(), self.file(name).into_os_string()]).collect()
    }

    pub fn material(&self, stem: &str) -> TlsMaterial {
        TlsMaterial::from_files(
            &self.file("drover-agent-ca.pem"),
            &self.file(&format!("{stem}.pem")),
            &self.file(&format!("{stem}-key.pem")),
        )
        .expect("certificates load")
    }
}

/// An in-process server with ACLs on and its HTTP API on a loopback port
/// (`name` in its answers), bootstrapped: the server, `http://<address>`,
/// and the management token's secret.
pub async fn acl_server(name: &str) -> (RunningServer, String, String) {
    transport::install_crypto_provider();
    let (_ca, server_tls, _client_tls) = TlsMaterial::dev_pair().expect("dev material");
    let mut options = server_options(0, &server_tls, Duration::from_secs(3600));
    options.http = Some(drover::server::HttpOptions {
        bind: "127.0.0.1:0".parse().expect("addr"),
        tls: false,
        verify_clients: false,
        name: name.into(),
        datacenter: "dc1".into(),
        acl_enabled: true,
        limits: drover::listener::HttpLimits::default(),
    });
    let server = RunningServer::start(options).expect("starts");
    let http = format!("http://{}", server.http_addr().expect("the HTTP API is served"));
    let anonymous = drover::api::client::ApiClient::new(&http, None, None).expect("client");
    let bootstrap = anonymous.request("POST", "/v1/acl/bootstrap", None).await.expect("answer");
    let secret = bootstrap.json().expect("a token")["SecretID"].as_str().expect("a secret").to_string();
    (server, http, secret)
}
