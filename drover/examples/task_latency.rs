//! How long from job submission to the task running on the agent, and
//! what the agent costs with the tasks running, for one task driver:
//! `raw_exec` (100 processes) or `docker` (50 containers).
//!
//! A server runs in this process on loopback; the agent is the real
//! `drover agent` binary (with `--raw-exec` for raw_exec; the docker driver
//! is on whenever the machine's daemon answers), so its CPU and memory are
//! its own. Two rounds, each of N allocations of `sleep 3600`:
//!
//! - burst: one service job of count N, submitted at once;
//! - one at a time: N jobs of count 1, each submitted when the last runs.
//!
//! Latency is the task's `StartedAt` (set by the agent once the executor
//! reports the process started, or once the container started) minus the
//! submission time. Then, with N tasks running, the agent's RSS and CPU
//! over a quiet window of 30 s, and the executors' RSS (raw_exec) or the
//! number of containers running (docker).
//!
//! Docker tasks run the tests' image, `drover-test-busybox:1`, built here
//! as the tests build it (`tests/common/docker.rs`: no registry is
//! reached). Every container carries a label of this run's own, and all of
//! them are removed when the run ends, however it ends (an error, a panic,
//! Ctrl-C).
//!
//! ```sh
//! cargo build --release -p drover --bin drover --example task_latency
//! target/release/examples/task_latency --driver raw_exec
//! target/release/examples/task_latency --driver docker
//! ```

#[path = "../tests/common/agent.rs"]
mod agent;
#[path = "../tests/common/docker.rs"]
#[allow(dead_code)]
mod docker;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use drover::server::{RunningServer, ServerOptions};
use engine::clock::Timestamp;
use engine::server::ServerConfig;
use engine::state::Snapshot;
use engine::structs::{
    ConfigValue, Job, JobKey, JobType, NodeStatus, Resources, TaskStatus, DEFAULT_NAMESPACE, DOCKER, RAW_EXEC,
};
use transport::tls::TlsMaterial;

/// The driver measured (`--driver`, raw_exec unless given).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Driver {
    RawExec,
    Docker,
}

impl Driver {
    fn from_args() -> Result<Driver> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
            [] | ["--driver", "raw_exec"] => Ok(Driver::RawExec),
            ["--driver", "docker"] => Ok(Driver::Docker),
            other => bail!("usage: task_latency [--driver raw_exec|docker], not {other:?}"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Driver::RawExec => RAW_EXEC,
            Driver::Docker => DOCKER,
        }
    }

    /// How many allocations each round places.
    fn allocs(self) -> usize {
        match self {
            Driver::RawExec => 100,
            Driver::Docker => 50,
        }
    }

    /// What a running task is, in the report.
    fn unit(self) -> &'static str {
        match self {
            Driver::RawExec => "process",
            Driver::Docker => "container",
        }
    }
}

fn main() -> Result<()> {
    let driver = Driver::from_args()?;
    transport::install_crypto_provider();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    // On Ctrl-C the measurement is dropped, and with it the agent and the
    // containers (see `AgentProcess`).
    runtime.block_on(async {
        tokio::select! {
            measured = measure(driver) => measured,
            _ = tokio::signal::ctrl_c() => bail!("interrupted"),
        }
    })
}

async fn measure(driver: Driver) -> Result<()> {
    let drover_bin = std::env::current_exe()?
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("drover"))
        .context("locating target/<profile>/drover")?;
    anyhow::ensure!(drover_bin.exists(), "build the binary first: cargo build --release -p drover --bin drover");
    let run = format!("task-latency-{}", std::process::id());
    if driver == Driver::Docker {
        docker::test_image();
    }
    // The TLS files and the agent's data: removed with the agent.
    let dir = std::env::temp_dir().join(format!("drover-{run}"));
    std::fs::create_dir_all(&dir)?;
    let (_ca, server_tls, client_tls) = TlsMaterial::dev_pair()?;
    for (name, text) in [
        ("ca.pem", &client_tls.ca_pem),
        ("client.pem", &client_tls.identity.cert_pem),
        ("client-key.pem", &client_tls.identity.key_pem),
    ] {
        std::fs::write(dir.join(name), text)?;
    }
    let engine = ServerConfig { workers: 1, ..ServerConfig::default() };
    let server = RunningServer::start(ServerOptions {
        bind: SocketAddr::from(([127, 0, 0, 1], 0)),
        advertise: None,
        engine,
        tls: server_tls,
        http: None,
        durable: None,
        cluster: None,
    })?;
    let agent = AgentProcess::spawn(driver, &drover_bin, &dir, server.local_addr(), &run)?;
    let offered = format!("driver.{}", driver.name());
    wait(&server, |s| {
        s.nodes()
            .any(|node| node.status == NodeStatus::Ready && node.attributes.get(&offered).is_some_and(|v| v == "1"))
    })
    .await;

    let allocs = driver.allocs();
    let submitted = now();
    server.engine().jobs().register(sleep_job(driver, &run, "burst", allocs as u32))?;
    let burst = latencies(&wait_running(&server, &["burst".to_string()], allocs).await, submitted);
    stop_jobs(&server, &["burst".to_string()]).await;

    let mut one_by_one = Vec::new();
    let mut ids = Vec::new();
    for n in 0..allocs {
        let id = format!("single-{n}");
        let submitted = now();
        server.engine().jobs().register(sleep_job(driver, &run, &id, 1))?;
        ids.push(id.clone());
        one_by_one.extend(latencies(&wait_running(&server, &[id], 1).await, submitted));
    }
    let unit = driver.unit();
    println!("{} driver:", driver.name());
    report(&format!("burst (1 job x {allocs})"), unit, burst);
    report(&format!("one at a time ({allocs} jobs x 1)"), unit, one_by_one);

    report_at_rest(driver, agent.child.id(), &run).await?;
    stop_jobs(&server, &ids).await;
    if driver == Driver::Docker {
        // Before the agent goes, and with it whatever it left behind.
        println!("containers left once stopped: {}", docker::containers(docker::TEST_LABEL, &run).len());
    }
    drop(agent);
    server.shutdown().await;
    Ok(())
}

/// The agent at rest with the tasks running: its RSS and its CPU over a
/// quiet window as long as the docker driver's health check interval (so
/// one check falls in it), and the executors' RSS or the containers running.
async fn report_at_rest(driver: Driver, pid: u32, run: &str) -> Result<()> {
    let cpu_before = cpu_ticks(pid)?;
    let window = Duration::from_secs(30);
    tokio::time::sleep(window).await;
    let cpu_after = cpu_ticks(pid)?;
    let ticks = rustix::param::clock_ticks_per_second() as f64;
    println!(
        "agent with {} running tasks: RSS {} MiB, CPU {:.2}% of one core over {window:?}, {:.2} s CPU since start",
        driver.allocs(),
        rss_kib(pid)? / 1024,
        100.0 * (cpu_after - cpu_before) as f64 / ticks / window.as_secs_f64(),
        cpu_after as f64 / ticks
    );
    match driver {
        Driver::RawExec => {
            let executors = executor_rss_kib(pid)?;
            println!(
                "executors: {} processes, {} MiB RSS in all ({} KiB each on average)",
                executors.len(),
                executors.iter().sum::<u64>() / 1024,
                executors.iter().sum::<u64>() / executors.len().max(1) as u64
            );
        }
        Driver::Docker => println!("containers running: {}", running_containers(run)),
    }
    Ok(())
}

/// The `drover agent` process, its directory, and with docker the run's
/// label on every container: dropped, however the run ends, the agent is
/// killed, every container with the label removed and the directory too.
struct AgentProcess {
    child: Child,
    dir: PathBuf,
    /// The run's value of [`docker::TEST_LABEL`], for docker.
    containers: Option<String>,
}

impl AgentProcess {
    fn spawn(driver: Driver, bin: &Path, dir: &Path, server: SocketAddr, run: &str) -> Result<AgentProcess> {
        let tls = [dir.join("ca.pem"), dir.join("client.pem"), dir.join("client-key.pem")];
        let mut command = agent::agent_command_of(bin, &server.to_string(), &tls, &dir.join("data"));
        if driver == Driver::RawExec {
            command.arg("--raw-exec");
        }
        let child = command.args(["--log-level", "warn"]).spawn()?;
        let containers = (driver == Driver::Docker).then(|| run.to_string());
        Ok(AgentProcess { child, dir: dir.to_path_buf(), containers })
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(run) = &self.containers {
            docker::remove_test_containers(run);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A service job of `count` tasks of `sleep 3600` for `driver`; a docker
/// task's container is labelled with `run`.
fn sleep_job(driver: Driver, run: &str, id: &str, count: u32) -> Job {
    let mut job = Job::new_simple(id, JobType::Service, count, Resources::new(20, 32, 0));
    let task = &mut job.task_groups[0].tasks[0];
    task.driver = driver.name().to_string();
    task.config.insert("command".to_string(), ConfigValue::from("sleep"));
    task.config.insert("args".to_string(), ConfigValue::List(vec!["3600".into()]));
    task.kill_signal = Some("SIGTERM".to_string());
    if driver == Driver::Docker {
        task.config.insert("image".to_string(), ConfigValue::from(docker::IMAGE));
        let label = BTreeMap::from([(docker::TEST_LABEL.to_string(), ConfigValue::from(run))]);
        task.config.insert("labels".to_string(), ConfigValue::Map(label));
        // `sleep` is the container's pid 1, which SIGTERM does not end:
        // the stop is the kill timeout's SIGKILL.
        task.kill_timeout = Duration::from_secs(1);
    }
    job
}

/// The run's containers that are running.
fn running_containers(run: &str) -> usize {
    let label = format!("label={}={run}", docker::TEST_LABEL);
    docker::docker(&["ps", "-q", "--filter", &label, "--filter", "status=running"]).lines().count()
}

fn now() -> Timestamp {
    drover::client::clock::now()
}

async fn wait(server: &RunningServer, holds: impl Fn(&Snapshot) -> bool) -> Arc<Snapshot> {
    let store = server.engine().store().clone();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let snapshot = store.snapshot();
        if holds(&snapshot) {
            return snapshot;
        }
        assert!(Instant::now() < deadline, "no convergence within 300 s");
        let _ = tokio::time::timeout(Duration::from_secs(5), store.wait_for_index(snapshot.index() + 1)).await;
    }
}

/// The `StartedAt` of every running task of `jobs`, once `count` run.
async fn wait_running(server: &RunningServer, jobs: &[String], count: usize) -> Vec<Timestamp> {
    let started = |s: &Snapshot| -> Vec<Timestamp> {
        s.allocs()
            .filter(|alloc| jobs.iter().any(|job| **job == *alloc.job_id))
            .filter_map(|alloc| alloc.task_states.get("task"))
            .filter(|state| state.state == TaskStatus::Running)
            .filter_map(|state| state.started_at)
            .collect()
    };
    let snapshot = wait(server, |s| started(s).len() >= count).await;
    started(&snapshot)
}

fn latencies(started: &[Timestamp], submitted: Timestamp) -> Vec<Duration> {
    started.iter().map(|at| at.since(submitted)).collect()
}

async fn stop_jobs(server: &RunningServer, ids: &[String]) {
    for id in ids {
        let key = JobKey { namespace: Arc::from(DEFAULT_NAMESPACE), id: Arc::from(id.as_str()) };
        let _ = server.engine().jobs().deregister(&key, false);
    }
    wait(server, |s| {
        s.allocs()
            .filter(|alloc| ids.iter().any(|id| **id == *alloc.job_id))
            .all(|alloc| alloc.client_status.is_terminal())
    })
    .await;
}

fn report(name: &str, unit: &str, mut latencies: Vec<Duration>) {
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1];
    println!(
        "{name}: {} allocations, submission to {unit} running: p50 {:.1?}, p99 {:.1?}, max {:.1?}",
        latencies.len(),
        at(0.50),
        at(0.99),
        at(1.0)
    );
}

fn stat(pid: u32) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = text.rfind(')').context("stat format")?;
    Ok(text[after + 1..].split_whitespace().map(str::to_string).collect())
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> Result<u64> {
    let fields = stat(pid)?;
    Ok(fields[11].parse::<u64>()? + fields[12].parse::<u64>()?)
}

fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:")).context("VmRSS")?;
    Ok(line.split_whitespace().nth(1).context("VmRSS value")?.parse()?)
}

/// The RSS of every executor the agent started (its children).
fn executor_rss_kib(agent: u32) -> Result<Vec<u64>> {
    let mut sizes = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let Some(pid) = entry?.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
        let Ok(fields) = stat(pid) else { continue };
        if fields.get(1).and_then(|ppid| ppid.parse::<u32>().ok()) == Some(agent) {
            sizes.push(rss_kib(pid).unwrap_or(0));
        }
    }
    Ok(sizes)
}
