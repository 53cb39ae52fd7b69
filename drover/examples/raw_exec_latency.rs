//! How long from job submission to the task's process running on the
//! agent, and what the agent costs with 100 running tasks.
//!
//! A server runs in this process on loopback; the agent is the real
//! `drover agent --raw-exec` binary, so its CPU and memory are its own.
//! Two rounds, each of 100 allocations of `sleep 3600`:
//!
//! - burst: one service job of count 100, submitted at once;
//! - one at a time: 100 jobs of count 1, each submitted when the last runs.
//!
//! Latency is the task's `StartedAt` (set by the agent once the executor
//! reports the process started) minus the submission time. Then, with 100
//! tasks running, the agent's RSS and CPU over a quiet window, and the
//! executors' RSS.
//!
//! ```sh
//! cargo build --release -p drover && cargo run --release -p drover --example raw_exec_latency
//! ```

#[path = "../tests/common/agent.rs"]
mod agent;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use drover::server::{RunningServer, ServerOptions};
use engine::clock::Timestamp;
use engine::server::ServerConfig;
use engine::state::Snapshot;
use engine::structs::{ConfigValue, Job, JobKey, JobType, Resources, TaskStatus, DEFAULT_NAMESPACE, RAW_EXEC};
use transport::tls::TlsMaterial;

const ALLOCS: usize = 100;

fn main() -> Result<()> {
    transport::install_crypto_provider();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(measure())
}

async fn measure() -> Result<()> {
    let drover_bin = std::env::current_exe()?
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("drover"))
        .context("locating target/<profile>/drover")?;
    anyhow::ensure!(drover_bin.exists(), "build the binary first: cargo build --release -p drover");
    let dir = std::env::temp_dir().join(format!("drover-latency-{}", std::process::id()));
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
    let mut agent = spawn_agent(&drover_bin, &dir, server.local_addr())?;
    wait(&server, |s| s.nodes().any(|node| node.status == engine::structs::NodeStatus::Ready)).await;

    let submitted = now();
    server.engine().jobs().register(sleep_job("burst", ALLOCS as u32))?;
    let burst = latencies(&wait_running(&server, &["burst".to_string()], ALLOCS).await, submitted);
    stop_jobs(&server, &["burst".to_string()]).await;

    let mut one_by_one = Vec::new();
    let mut ids = Vec::new();
    for n in 0..ALLOCS {
        let id = format!("single-{n}");
        let submitted = now();
        server.engine().jobs().register(sleep_job(&id, 1))?;
        ids.push(id.clone());
        one_by_one.extend(latencies(&wait_running(&server, &[id], 1).await, submitted));
    }
    report("burst (1 job x 100)", burst);
    report("one at a time (100 jobs x 1)", one_by_one);

    // 100 tasks run now: the agent at rest with them.
    let pid = agent.id();
    let cpu_before = cpu_ticks(pid)?;
    let window = Duration::from_secs(10);
    tokio::time::sleep(window).await;
    let cpu_after = cpu_ticks(pid)?;
    let ticks = rustix::param::clock_ticks_per_second() as f64;
    println!(
        "agent with {ALLOCS} running tasks: RSS {} MiB, CPU {:.2}% of one core over {window:?}, {:.2} s CPU since start",
        rss_kib(pid)? / 1024,
        100.0 * (cpu_after - cpu_before) as f64 / ticks / window.as_secs_f64(),
        cpu_after as f64 / ticks
    );
    let executors = executor_rss_kib(pid)?;
    println!(
        "executors: {} processes, {} MiB RSS in all ({} KiB each on average)",
        executors.len(),
        executors.iter().sum::<u64>() / 1024,
        executors.iter().sum::<u64>() / executors.len().max(1) as u64
    );
    stop_jobs(&server, &ids).await;
    agent.kill()?;
    agent.wait()?;
    server.shutdown().await;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

fn spawn_agent(bin: &Path, dir: &Path, server: SocketAddr) -> Result<std::process::Child> {
    let tls = [dir.join("ca.pem"), dir.join("client.pem"), dir.join("client-key.pem")];
    let mut command = agent::agent_command_of(bin, &server.to_string(), &tls, &dir.join("data"));
    Ok(command.args(["--raw-exec", "--log-level", "warn"]).spawn()?)
}

fn sleep_job(id: &str, count: u32) -> Job {
    let mut job = Job::new_simple(id, JobType::Service, count, Resources::new(20, 32, 0));
    let task = &mut job.task_groups[0].tasks[0];
    task.driver = RAW_EXEC.to_string();
    task.config.insert("command".to_string(), ConfigValue::from("sleep"));
    task.config.insert("args".to_string(), ConfigValue::List(vec!["3600".into()]));
    task.kill_signal = Some("SIGTERM".to_string());
    job
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

fn report(name: &str, mut latencies: Vec<Duration>) {
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1];
    println!(
        "{name}: {} allocations, submission to process running: p50 {:.1?}, p99 {:.1?}, max {:.1?}",
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
