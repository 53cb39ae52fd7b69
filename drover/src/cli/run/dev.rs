//! `drover dev`: a server and a client agent in one process, in memory
//! unless given a data dir, with a throwaway CA.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use engine::server::ServerConfig;
use tokio::sync::watch;
use transport::client::ClientEndpoints;
use transport::tls::TlsMaterial;

use crate::client::agent::{Agent, AgentSettings, NoObserver};
use crate::client::task_env::EnvDenylist;

use super::agent::{docker_settings, fingerprint, hostname, local_node, AgentArgs, ClientSide};
use super::{dev_temp_dir, raise_open_files_limit, runtime, Common};
use crate::cli::job::read_job;
use crate::cli::Failure;
use crate::config::FileConfig;
use crate::server::{DurableOptions, HttpOptions, RunningServer, ServerOptions};

#[derive(Debug, Args)]
pub struct DevArgs {
    /// UDP port of the server's client endpoint (0: any free port).
    #[arg(long, default_value_t = 4647)]
    pub port: u16,
    /// TCP port of the HTTP API, plain HTTP in dev mode (0: any free port).
    #[arg(long, default_value_t = 4646)]
    pub http_port: u16,
    /// Print the bound addresses as `listening <addr>` and `http <addr>`
    /// on stdout once ready.
    #[arg(long)]
    pub print_address: bool,
    /// Keep the server's state here (durable across restarts) instead of
    /// in memory; the agent's allocation directories go here too.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Job files (Nomad's HCL or JSON, as `job run` takes) to register
    /// once the agent is up.
    #[arg(long)]
    pub job: Vec<PathBuf>,
    /// Gone: the dev agent serves no HTTP of its own (task logs and files
    /// are on the API's `/v1/client/`); given, it is ignored with a warning.
    #[arg(long, hide = true)]
    pub agent_http_addr: Option<String>,
    /// error, warn, info, debug or trace.
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// Every HTTP API request needs an ACL token, as with `[acl] enabled`
    /// (Nomad's `-acl-enabled`); `drover acl bootstrap` makes the first.
    #[arg(long)]
    pub acl_enabled: bool,
    /// The dev node's name (default: the host name; Nomad's `-node`).
    #[arg(long)]
    pub node_name: Option<String>,
    /// The dev node's class.
    #[arg(long)]
    pub node_class: Option<String>,
    /// Node metadata, `KEY=VALUE`, repeatable.
    #[arg(long, value_name = "KEY=VALUE", value_parser = super::agent::parse_meta)]
    pub meta: Vec<(String, String)>,
}

pub fn run(args: DevArgs) -> Result<(), Failure> {
    crate::logging::init(&args.log_level, false)?;
    raise_open_files_limit();
    let mut jobs = Vec::new();
    for path in &args.job {
        let converted = read_job(path)?;
        for warning in &converted.warnings {
            tracing::warn!(file = %path.display(), %warning, "job file: a field Drover ignores");
        }
        jobs.push(converted.job);
    }
    if let Some(addr) = &args.agent_http_addr {
        tracing::warn!(flag = "--agent-http-addr", %addr, "ignored: {}", super::agent::NO_AGENT_HTTP);
    }
    let (_ca, server_tls, client_tls) = TlsMaterial::dev_pair()?;
    match &args.data_dir {
        Some(dir) => tracing::warn!(
            data_dir = %dir.display(),
            "DEV MODE: server and agent in one process, durable state in the data dir, a throwaway CA; NOT for production"
        ),
        None => tracing::warn!(
            "DEV MODE: server and agent in one process, state in memory, a throwaway CA; NOT for production"
        ),
    }
    let runtime = runtime()?;
    runtime.block_on(async move {
        let mut signals = crate::server::ShutdownSignals::catch()?;
        let options = ServerOptions {
            bind: SocketAddr::from(([127, 0, 0, 1], args.port)),
            advertise: None,
            engine: ServerConfig::default(),
            tls: server_tls,
            http: Some(HttpOptions {
                bind: SocketAddr::from(([127, 0, 0, 1], args.http_port)),
                tls: false,
                verify_clients: false,
                name: hostname(),
                datacenter: "dc1".to_string(),
                acl_enabled: args.acl_enabled,
                limits: crate::listener::HttpLimits::default(),
            }),
            durable: args
                .data_dir
                .as_deref()
                .map(|dir| DurableOptions::under(dir, replication::DurableConfig::default())),
            cluster: None,
        };
        let running = RunningServer::start(options)?;
        let addr = running.local_addr();
        tracing::info!(%addr, "dev server listening");
        if let Some(http) = running.http_addr() {
            tracing::info!("HTTP API at http://{http} (try: curl http://{http}/v1/nodes)");
            if args.print_address {
                let lines = format!("listening {addr}\nhttp {http}\n");
                let _ = std::io::Write::write_all(&mut std::io::stdout(), lines.as_bytes());
            }
        }
        let endpoints = Arc::new(ClientEndpoints::bind(1, &client_tls)?);
        // With a data dir the node keeps its identity across restarts, as
        // the server keeps its state.
        let identity = match &args.data_dir {
            Some(dir) => crate::client::identity::load_or_create(dir).context("the node identity")?,
            None => crate::client::identity::Identity {
                node_id: engine::structs::NodeId::from_rng(&mut rand::rng()),
                secret_id: uuid::Builder::from_random_bytes(rand::random()).into_uuid(),
            },
        };
        let agent_args = AgentArgs {
            common: Common {
                config: None,
                dev: true,
                ca_file: None,
                cert_file: None,
                key_file: None,
                log_level: None,
                log_json: false,
                data_dir: None,
            },
            servers: None,
            name: args.node_name.clone(),
            datacenter: None,
            node_class: args.node_class.clone(),
            mock_driver: true,
            raw_exec: true,
            http_addr: None,
            network_interface: None,
            meta: args.meta.clone(),
        };
        let (stop, stopped) = watch::channel(false);
        let mut _dev_data_dir = None;
        let data_dir = match &args.data_dir {
            Some(dir) => dir.clone(),
            None => _dev_data_dir.insert(dev_temp_dir("drover-dev-agent-")?).path().to_path_buf(),
        };
        std::fs::create_dir_all(&data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
        let file = FileConfig::default();
        let fingerprint = fingerprint(&agent_args, &file, &data_dir, Some(addr))?;
        let node = local_node(&agent_args, &file, identity, (true, true), &fingerprint)?;
        tracing::info!(data_dir = %data_dir.display(), "dev agent data dir (allocation directories and logs)");
        let client_side = ClientSide {
            data_dir,
            gc_max_allocs: 50,
            env_denylist: EnvDenylist::default(),
            stop_tasks_on_shutdown: true,
        };
        let tasks = client_side.start(true, docker_settings(&file)?).await?;
        let agent = Agent::new(
            node,
            AgentSettings::new(vec![addr]),
            endpoints.clone(),
            endpoints.own_config()?,
            Arc::new(NoObserver),
        );
        let agent = ClientSide::attach(agent, tasks);
        let running_agent = tokio::spawn(async move { agent.run(stopped).await });
        for job in jobs {
            let id = job.id.clone();
            match running.engine().jobs().register(job) {
                Ok(_) => tracing::info!(job = %id, "registered"),
                Err(error) => tracing::error!(job = %id, %error, "job refused"),
            }
        }
        let signal = signals.recv().await;
        tracing::info!(signal, "dev agent stopping");
        let _ = stop.send(true);
        let _ = running_agent.await;
        endpoints.close().await;
        running.shutdown().await;
        Ok::<(), Failure>(())
    })
}

/// `--dev` on a server: a throwaway CA in memory. Agents need a client
/// certificate of that CA, so it is written (the key readable by its owner
/// only) to `<data_dir>/dev-tls`, or without a data dir to a temporary
/// directory that is removed when the returned guard drops, and the log
/// names it, loudly.
pub fn dev_server_tls(data_dir: Option<&Path>) -> Result<(TlsMaterial, Option<tempfile::TempDir>), Failure> {
    let (_ca, server, client) = TlsMaterial::dev_pair()?;
    let (dir, temporary) = match data_dir {
        Some(dir) => (dir.join("dev-tls"), None),
        None => {
            let temporary = dev_temp_dir("drover-dev-tls-")?;
            (temporary.path().to_path_buf(), Some(temporary))
        }
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let files = [
        ("ca.pem", &client.ca_pem),
        ("client.pem", &client.identity.cert_pem),
        ("client-key.pem", &client.identity.key_pem),
    ];
    for (name, text) in files {
        let path = dir.join(name);
        if name.ends_with("-key.pem") {
            crate::tls_files::replace_key(&path, text)?;
        } else {
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        }
    }
    tracing::warn!(
        dir = %dir.display(),
        "DEV MODE: this server uses a throwaway CA generated in memory; it is NOT SECURE and lasts only as long as \
         this process. Agents connect with --ca-file {0}/ca.pem --cert-file {0}/client.pem --key-file {0}/client-key.pem",
        dir.display()
    );
    Ok((server, temporary))
}
