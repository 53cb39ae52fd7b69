//! `drover agent`: flags and the TOML file made into the agent's settings,
//! then the agent runs until a signal.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use engine::structs::{Node, NodeEligibility, NodeStatus, Resources};
use tokio::sync::watch;
use transport::client::ClientEndpoints;

use super::{config_error, dev_temp_dir, file_config, init_logs, raise_open_files_limit, runtime, tls_files, Common};
use crate::cli::Failure;
use crate::client::agent::{Agent, AgentSettings, NoObserver, TaskSettings};
use crate::client::task_env::EnvDenylist;
use crate::config::FileConfig;

#[derive(Debug, Args)]
pub struct AgentArgs {
    #[command(flatten)]
    pub common: Common,
    /// Servers to connect to (host:port), comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub servers: Option<Vec<String>>,
    /// Node name.
    #[arg(long)]
    pub name: Option<String>,
    /// Datacenter.
    #[arg(long)]
    pub datacenter: Option<String>,
    /// Node class.
    #[arg(long)]
    pub node_class: Option<String>,
    /// Offer the mock driver (on with --dev).
    #[arg(long)]
    pub mock_driver: bool,
    /// Offer the raw_exec driver: tasks run as processes of this machine,
    /// without isolation (on with --dev).
    #[arg(long)]
    pub raw_exec: bool,
    /// Gone: the agent serves no HTTP of its own. Task logs and files are
    /// read through any server's API; given, it is ignored with a warning
    /// that says so.
    #[arg(long, hide = true)]
    pub http_addr: Option<String>,
}

/// What the agent says of a removed `--http-addr` or `client.http_addr`.
pub const NO_AGENT_HTTP: &str = "the agent no longer serves HTTP of its own: task logs, files, restarts, \
signals and stats go through any server's HTTP API (/v1/client/..., `drover alloc logs|fs|restart|signal`), \
over the agent's own connection to its server; remove this setting";

pub fn run(args: AgentArgs) -> Result<(), Failure> {
    let file = file_config(&args.common)?;
    init_logs(&args.common, &file)?;
    raise_open_files_limit();
    let tls = tls_files(&args.common, &file)?;
    let servers_text =
        args.servers.clone().or(file.client.servers.clone()).unwrap_or_else(|| vec!["127.0.0.1:4647".to_string()]);
    let mut servers = Vec::new();
    for text in &servers_text {
        let addr = std::net::ToSocketAddrs::to_socket_addrs(text.as_str())
            .ok()
            .and_then(|mut addrs| addrs.next())
            .ok_or_else(|| config_error("client.servers", format!("{text:?} is not a host:port")))?;
        servers.push(addr);
    }
    // A dev agent without a data dir keeps its allocations in a temporary
    // directory that goes when it exits (its tasks are stopped first).
    let mut _dev_data_dir = None;
    let data_dir = match (&args.common.data_dir, &file.data_dir, args.common.dev) {
        (Some(dir), _, _) | (None, Some(dir), _) => dir.clone(),
        (None, None, true) => _dev_data_dir.insert(dev_temp_dir("drover-dev-agent-")?).path().to_path_buf(),
        (None, None, false) => return Err(config_error("data_dir", "required for an agent (or --dev)")),
    };
    let identity = crate::client::identity::load_or_create(&data_dir).context("the node identity")?;
    let data_dir = std::fs::canonicalize(&data_dir).with_context(|| format!("the data dir {}", data_dir.display()))?;
    let mock = args.mock_driver || args.common.dev || file.client.mock_driver.unwrap_or(false);
    let raw_exec = args.raw_exec || args.common.dev || file.client.raw_exec.unwrap_or(false);
    if let Some(addr) = &args.http_addr {
        tracing::warn!(flag = "--http-addr", %addr, "ignored: {NO_AGENT_HTTP}");
    }
    if let Some(addr) = &file.client.http_addr {
        tracing::warn!(key = "client.http_addr", %addr, "ignored: {NO_AGENT_HTTP}");
    }
    let gc_max_allocs = file.client.gc_max_allocs.unwrap_or(50);
    let node = local_node(&args, &file, identity, (mock, raw_exec));
    let runtime = runtime()?;
    runtime.block_on(async move {
        let mut signals = crate::server::ShutdownSignals::catch()?;
        let endpoints = Arc::new(ClientEndpoints::bind(1, &tls)?);
        let quic = endpoints.own_config()?;
        let (stop, stopped) = watch::channel(false);
        let env_denylist = file.client.env_denylist.clone().map(EnvDenylist::new).unwrap_or_default();
        let client_side = ClientSide { data_dir, gc_max_allocs, env_denylist, stop_tasks_on_shutdown: args.common.dev };
        let tasks = client_side.start(raw_exec)?;
        tracing::info!(node = %node.id, name = %node.name, servers = ?servers, mock_driver = mock, raw_exec, "drover agent starting");
        let mut agent = Agent::new(node, AgentSettings::new(servers), endpoints.clone(), quic, Arc::new(NoObserver));
        if let Some(tasks) = tasks {
            agent = agent.with_tasks(tasks);
        }
        let running = tokio::spawn(async move { agent.run(stopped).await });
        let signal = signals.recv().await;
        tracing::info!(signal, "agent stopping");
        let _ = stop.send(true);
        let _ = running.await;
        endpoints.close().await;
        Ok::<(), Failure>(())
    })
}

/// The node this machine is, from the file and the flags.
pub fn local_node(
    args: &AgentArgs,
    file: &FileConfig,
    identity: crate::client::identity::Identity,
    (mock, raw_exec): (bool, bool),
) -> Node {
    let client = &file.client;
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as u64;
    let resources = Resources::new(
        client.cpu_mhz.unwrap_or(cores * 2_000),
        client.memory_mb.unwrap_or_else(machine_memory_mb),
        client.disk_mb.unwrap_or(100_000),
    );
    let datacenter = args.datacenter.clone().or(client.datacenter.clone()).unwrap_or_else(|| "dc1".to_string());
    let class = args.node_class.clone().or(client.node_class.clone()).unwrap_or_default();
    let mut node = Node::new_ready(identity.node_id, &datacenter, &class, resources);
    node.secret_id = identity.secret_id;
    node.name = args.name.clone().or(client.name.clone()).unwrap_or_else(hostname);
    node.attributes.remove("driver.exec");
    node.attributes.insert("unique.hostname".to_string(), hostname());
    if mock {
        node.attributes.insert(format!("driver.{}", crate::client::drivers::mock::DRIVER), "1".to_string());
    }
    if raw_exec {
        node.attributes.insert(format!("driver.{}", engine::structs::RAW_EXEC), "1".to_string());
    }
    node.meta = client.meta.clone().unwrap_or_default();
    node.status = NodeStatus::Initializing;
    node.eligibility = NodeEligibility::Eligible;
    node.computed_class = node.compute_class();
    node
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_or_else(|_| "localhost".to_string(), |name| name.trim().to_string())
}

/// MemTotal from /proc/meminfo, in MiB (4 GiB if unreadable).
pub fn machine_memory_mb() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|line| line.starts_with("MemTotal:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(4_096, |kib| kib / 1024)
}

/// The client side of an agent that runs real tasks.
#[derive(Debug)]
pub struct ClientSide {
    /// Where the allocation directories go.
    pub data_dir: PathBuf,
    /// Terminal allocations kept on disk.
    pub gc_max_allocs: usize,
    /// Agent variables kept out of task environments.
    pub env_denylist: EnvDenylist,
    /// Stop the tasks when the agent stops (dev mode) instead of leaving
    /// them running for the next agent.
    pub stop_tasks_on_shutdown: bool,
}

impl ClientSide {
    /// With raw_exec: finds the isolation and the executor's binary.
    pub fn start(self, raw_exec: bool) -> Result<Option<TaskSettings>, Failure> {
        if !raw_exec {
            return Ok(None);
        }
        let isolation = crate::client::drivers::isolation::Isolation::detect();
        tracing::info!(isolation = %isolation.describe(), "raw_exec driver enabled: tasks run without isolation");
        let executable = std::env::current_exe().context("finding the drover binary for task executors")?;
        Ok(Some(TaskSettings {
            driver: Arc::new(
                crate::client::drivers::raw_exec::RawExec::new(isolation, executable)
                    .with_env_denylist(self.env_denylist),
            ),
            data_dir: self.data_dir,
            gc_max_allocs: self.gc_max_allocs,
            stop_tasks_on_shutdown: self.stop_tasks_on_shutdown,
        }))
    }
}
