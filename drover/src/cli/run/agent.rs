//! `drover agent`: flags and the TOML file made into the agent's settings,
//! then the agent runs until a signal.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use engine::structs::{HostNetwork, Node, NodeEligibility, NodeNetwork, NodeStatus, PortSet, Resources};
use tokio::sync::watch;
use transport::client::ClientEndpoints;

use super::{config_error, dev_temp_dir, file_config, init_logs, raise_open_files_limit, runtime, tls_files, Common};
use crate::cli::Failure;
use crate::client::agent::{Agent, AgentSettings, DrainOnShutdown, NoObserver, TaskSettings};
use crate::client::drivers::docker::{Docker, DockerSettings};
use crate::client::drivers::Drivers;
use crate::client::fingerprint::{Cidr, Fingerprint, FingerprintError, FingerprintSettings, HostNetworkSpec};
use crate::client::task_env::EnvDenylist;
use crate::config::{FileConfig, HostNetworks};

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
    /// The interface whose address is the node's (`client.network_interface`).
    #[arg(long)]
    pub network_interface: Option<String>,
    /// Node metadata, `KEY=VALUE`, repeatable; over the file's `client.meta`.
    #[arg(long, value_name = "KEY=VALUE", value_parser = parse_meta)]
    pub meta: Vec<(String, String)>,
}

/// One `--meta KEY=VALUE`.
pub fn parse_meta(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => Ok((key.trim().to_string(), value.to_string())),
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
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
    let fingerprint = fingerprint(&args, &file, &data_dir, servers.first().copied())?;
    let node = local_node(&args, &file, identity, (mock, raw_exec), &fingerprint)?;
    let runtime = runtime()?;
    runtime.block_on(async move {
        let mut signals = crate::server::ShutdownSignals::catch()?;
        let endpoints = Arc::new(ClientEndpoints::bind(1, &tls)?);
        let quic = endpoints.own_config()?;
        let (stop, stopped) = watch::channel(false);
        let env_denylist = file.client.env_denylist.clone().map(EnvDenylist::new).unwrap_or_default();
        let client_side = ClientSide { data_dir, gc_max_allocs, env_denylist, stop_tasks_on_shutdown: args.common.dev };
        let tasks = client_side.start(raw_exec, docker_settings(&file)?).await?;
        tracing::info!(node = %node.id, name = %node.name, servers = ?servers, mock_driver = mock, raw_exec, "drover agent starting");
        let mut settings = AgentSettings::new(servers);
        settings.drain_on_shutdown = file.client.drain_on_shutdown.as_ref().map(|section| DrainOnShutdown {
            deadline: section.deadline.unwrap_or(DrainOnShutdown::DEFAULT_DEADLINE),
            force: section.force,
            ignore_system_jobs: section.ignore_system_jobs,
        });
        let agent = Agent::new(node, settings, endpoints.clone(), quic, Arc::new(NoObserver));
        let agent = ClientSide::attach(agent, tasks);
        let running = tokio::spawn(async move { agent.run(stopped).await });
        let signal = signals.recv().await;
        tracing::info!(signal, "agent stopping");
        let _ = stop.send(true);
        let _ = running.await;
        endpoints.close().await;
        Ok::<(), Failure>(())
    })
}

/// What this host is: its fingerprint as the file and flags ask for it
/// (the interface, the host networks), with the data dir's file system.
pub fn fingerprint(
    args: &AgentArgs,
    file: &FileConfig,
    data_dir: &Path,
    server: Option<SocketAddr>,
) -> Result<Fingerprint, Failure> {
    let client = &file.client;
    if let Some(problem) = client.host_network.problem() {
        return Err(Failure::Config(problem.into()));
    }
    let mut host_networks = Vec::new();
    for network in &client.host_network.0 {
        let cidr = match &network.cidr {
            Some(text) => Some(
                Cidr::parse(text)
                    .map_err(|error| config_error(&format!("client.host_network.{}.cidr", network.name), error))?,
            ),
            None => None,
        };
        host_networks.push(HostNetworkSpec { name: network.name.clone(), cidr, interface: network.interface.clone() });
    }
    // As Nomad's dev agent: the loopback interface, so that nothing a dev
    // agent runs listens on the machine's network.
    let dev_interface = args.common.dev.then(|| "lo".to_string());
    let settings = FingerprintSettings {
        data_dir: data_dir.to_path_buf(),
        network_interface: args.network_interface.clone().or(client.network_interface.clone()).or(dev_interface),
        server,
        host_networks,
    };
    let found = Fingerprint::of_host(&settings).map_err(|error| match error {
        FingerprintError::NoInterface(..) | FingerprintError::NoAddress(_) => {
            config_error("client.network_interface", error.to_string())
        }
        other => Failure::from(anyhow::Error::from(other).context("fingerprinting the host")),
    })?;
    for spec in &settings.host_networks {
        if !found.host_networks.contains_key(&spec.name) {
            tracing::warn!(
                host_network = %spec.name,
                "no address of this host matches the host network: ports on it cannot be placed here"
            );
        }
    }
    Ok(found)
}

/// The node this machine is: its fingerprint, with what the file and the
/// flags configure over it (resources, reservations, class, meta).
pub fn local_node(
    args: &AgentArgs,
    file: &FileConfig,
    identity: crate::client::identity::Identity,
    (mock, raw_exec): (bool, bool),
    fingerprint: &Fingerprint,
) -> Result<Node, Failure> {
    let client = &file.client;
    let cpu = client.cpu_total_compute.or(client.cpu_mhz).or(fingerprint.cpu_total_compute()).ok_or_else(|| {
        config_error("client.cpu_total_compute", "this host does not publish its CPU frequency: set the CPU in MHz")
    })?;
    let memory_mb = client.memory_mb.or(fingerprint.memory_bytes.map(|bytes| bytes / MIB)).ok_or_else(|| {
        config_error("client.memory_mb", "this host does not publish its memory (/proc/meminfo): set it in MiB")
    })?;
    let disk_mb = client.disk_mb.unwrap_or(fingerprint.disk_free_bytes / MIB);
    let resources = Resources::new(cpu, memory_mb, disk_mb);
    let datacenter = args.datacenter.clone().or(client.datacenter.clone()).unwrap_or_else(|| "dc1".to_string());
    let class = args.node_class.clone().or(client.node_class.clone()).unwrap_or_default();
    let mut node = Node::new_ready(identity.node_id, &datacenter, &class, resources);
    node.secret_id = identity.secret_id;
    node.name = args.name.clone().or(client.name.clone()).unwrap_or_else(hostname);
    node.attributes = fingerprint.attributes.clone();
    if client.cpu_total_compute.or(client.cpu_mhz).is_some() {
        // As Nomad: the configured compute is what the node advertises.
        node.attributes.insert("cpu.totalcompute".to_string(), cpu.to_string());
    }
    if mock {
        node.attributes.insert(format!("driver.{}", crate::client::drivers::mock::DRIVER), "1".to_string());
    }
    if raw_exec {
        node.attributes.insert(format!("driver.{}", engine::structs::RAW_EXEC), "1".to_string());
    }
    let reserved = &client.reserved;
    node.reserved = Resources::new(reserved.cpu.unwrap_or(0), reserved.memory.unwrap_or(0), reserved.disk.unwrap_or(0));
    node.network = node_network(&client.reserved.reserved_ports, &client.host_network, fingerprint);
    node.meta = client.meta.clone().unwrap_or_default();
    node.meta.extend(args.meta.iter().cloned());
    node.status = NodeStatus::Initializing;
    node.eligibility = NodeEligibility::Eligible;
    node.computed_class = node.compute_class();
    tracing::info!(
        address = %node.network.ip,
        device = %node.network.device,
        cpu_mhz = node.resources.cpu,
        memory_mb = node.resources.memory_mb,
        disk_mb = node.resources.disk_mb,
        reserved = ?node.reserved,
        host_networks = ?node.network.host_networks.keys().collect::<Vec<_>>(),
        "node fingerprinted"
    );
    Ok(node)
}

const MIB: u64 = 1024 * 1024;

/// The node's network: its fingerprinted address, the host networks found,
/// and every reserved port (the node's and its host networks': ports are
/// held per node).
fn node_network(reserved_ports: &PortSet, configured: &HostNetworks, fingerprint: &Fingerprint) -> NodeNetwork {
    let mut reserved: Vec<u16> = reserved_ports.iter().collect();
    let mut host_networks = BTreeMap::new();
    for network in &configured.0 {
        reserved.extend(network.reserved_ports.iter());
        if let Some(found) = fingerprint.host_networks.get(&network.name) {
            let host_network = HostNetwork {
                ip: Arc::from(found.ip.to_string()),
                device: Arc::from(found.device.as_str()),
                reserved_ports: network.reserved_ports.clone(),
            };
            host_networks.insert(Arc::from(network.name.as_str()), host_network);
        }
    }
    reserved.sort_unstable();
    reserved.dedup();
    NodeNetwork {
        ip: Arc::from(fingerprint.address.ip.to_string()),
        device: Arc::from(fingerprint.address.device.as_str()),
        reserved_ports: PortSet::from(reserved),
        host_networks,
        ..NodeNetwork::default()
    }
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_or_else(|_| "localhost".to_string(), |name| name.trim().to_string())
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
    /// The drivers that run real tasks: raw_exec when enabled (its
    /// isolation and the executor's binary found), docker unless disabled
    /// (its daemon's health checked once before the node registers).
    pub async fn start(self, raw_exec: bool, docker: Option<DockerSettings>) -> Result<Option<TaskSettings>, Failure> {
        let mut drivers = Drivers::default();
        if raw_exec {
            let isolation = crate::client::drivers::isolation::Isolation::detect();
            tracing::info!(isolation = %isolation.describe(), "raw_exec driver enabled: tasks run without isolation");
            let executable = std::env::current_exe().context("finding the drover binary for task executors")?;
            drivers.raw_exec = Some(Arc::new(
                crate::client::drivers::raw_exec::RawExec::new(isolation, executable)
                    .with_env_denylist(self.env_denylist),
            ));
        }
        if let Some(settings) = docker {
            let docker = Docker::connect(settings)
                .await
                .map_err(|error| config_error("plugin.docker.config.endpoint", error))?;
            drivers.docker = Some(docker);
        }
        if drivers.raw_exec.is_none() && drivers.docker.is_none() {
            return Ok(None);
        }
        Ok(Some(TaskSettings {
            drivers,
            data_dir: self.data_dir,
            gc_max_allocs: self.gc_max_allocs,
            stop_tasks_on_shutdown: self.stop_tasks_on_shutdown,
        }))
    }
}

impl ClientSide {
    /// `agent` with `tasks`, if any, its node advertising the docker
    /// driver as its health checks find it.
    pub fn attach(agent: Agent, tasks: Option<TaskSettings>) -> Agent {
        let Some(tasks) = tasks else { return agent };
        let docker = tasks.drivers.docker.clone();
        let agent = agent.with_tasks(tasks);
        match docker {
            Some(docker) => agent.with_driver_attributes(engine::structs::DOCKER, docker.attributes()),
            None => agent,
        }
    }
}

/// The docker driver's settings from `[plugin.docker.config]`, or `None`
/// when it is disabled there.
pub fn docker_settings(file: &FileConfig) -> Result<Option<DockerSettings>, Failure> {
    let config = &file.plugin.docker.config;
    if config.enabled == Some(false) {
        return Ok(None);
    }
    let default = DockerSettings::default();
    let interval = config.health_check_interval.unwrap_or(default.health_check_interval);
    if interval.is_zero() {
        return Err(config_error("plugin.docker.config.health_check_interval", "must be more than 0s"));
    }
    Ok(Some(DockerSettings {
        endpoint: config.endpoint.clone().unwrap_or(default.endpoint),
        allow_privileged: config.allow_privileged.unwrap_or(default.allow_privileged),
        allow_caps: config.allow_caps.clone().unwrap_or(default.allow_caps),
        volumes_enabled: config.volumes.enabled.unwrap_or(default.volumes_enabled),
        health_check_interval: interval,
    }))
}
