//! `drover server`: flags and the TOML file made into [`ServerOptions`],
//! then the server runs until a signal.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use clap::Args;
use engine::node::storm::StormConfig;
use engine::server::ServerConfig;
use engine::structs::JobType;

use super::agent::hostname;
use super::dev::dev_server_tls;
use super::{config_error, file_config, init_logs, raise_open_files_limit, tls_files, Common};
use crate::cli::Failure;
use crate::config::{FileConfig, ServerSection, StormGuardSection};
use crate::server::{ClusterOptions, DurableOptions, HttpOptions, ServerOptions};

#[derive(Debug, Args)]
pub struct ServerArgs {
    #[command(flatten)]
    pub common: Common,
    /// Address to bind the client endpoint to.
    #[arg(long)]
    pub bind: Option<IpAddr>,
    /// UDP port of the client endpoint (0: any free port).
    #[arg(long)]
    pub port: Option<u16>,
    /// The address clients are told to use.
    #[arg(long)]
    pub advertise: Option<String>,
    /// Scheduling workers.
    #[arg(long)]
    pub workers: Option<usize>,
    /// Scheduler types to serve, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub schedulers: Option<Vec<String>>,
    /// Shortest heartbeat TTL (e.g. 10s).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub min_heartbeat_ttl: Option<Duration>,
    /// Extra time past a node's TTL before it is given up on.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub heartbeat_grace: Option<Duration>,
    /// Cluster-wide heartbeat rate the TTL is scaled to.
    #[arg(long)]
    pub max_heartbeats_per_second: Option<f64>,
    /// Print the bound addresses as `listening <addr>` (and `http <addr>`)
    /// on stdout once ready (for scripts, tests and loadgen).
    #[arg(long)]
    pub print_address: bool,
    /// TCP port of the HTTP API (Nomad's 4646; 0: any free port).
    #[arg(long)]
    pub http_port: Option<u16>,
    /// Address the HTTP API binds (default: the client endpoint's).
    #[arg(long)]
    pub http_bind: Option<IpAddr>,
    /// Serve no HTTP API.
    #[arg(long)]
    pub no_http: bool,
    /// Raft entries between snapshots of the state (default 20000).
    #[arg(long)]
    pub snapshot_every: Option<u64>,
    /// Event batches kept for `/v1/event/stream` (Nomad's
    /// `event_buffer_size`, default 100; 0 turns the event stream off).
    #[arg(long)]
    pub event_buffer_size: Option<usize>,
    /// Every HTTP API request needs an ACL token (`acl.enabled`).
    #[arg(long)]
    pub acl_enabled: bool,
    /// Form a cluster of this many servers (with --join); a server given
    /// --bootstrap-expect or --join is one of a cluster.
    #[arg(long)]
    pub bootstrap_expect: Option<usize>,
    /// Server-to-server addresses (host:port) of other servers, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub join: Option<Vec<String>>,
    /// UDP port of the server-to-server endpoint (raft, forwarding; 4648; 0: any free port).
    #[arg(long)]
    pub peer_port: Option<u16>,
    /// This server's name (default: the host name).
    #[arg(long)]
    pub name: Option<String>,
}

/// The engine settings from the file and the flags.
pub fn engine_config(args: &ServerArgs, file: &FileConfig) -> Result<ServerConfig, Failure> {
    let mut config = ServerConfig::default();
    if let Some(workers) = args.workers.or(file.server.workers) {
        if workers == 0 {
            return Err(config_error("server.workers", "must be at least 1"));
        }
        config.workers = workers;
    }
    if let Some(names) = args.schedulers.clone().or(file.server.enabled_schedulers.clone()) {
        let mut types = Vec::new();
        for name in names {
            let found = JobType::ALL.into_iter().find(|kind| kind.as_str() == name.trim());
            types.push(found.ok_or_else(|| {
                config_error(
                    "server.enabled_schedulers",
                    format!("{name:?} is not one of service, batch, system, sysbatch"),
                )
            })?);
        }
        if types.is_empty() {
            return Err(config_error("server.enabled_schedulers", "must name at least one scheduler"));
        }
        config.worker_types = types;
    }
    if let Some(ttl) = args.min_heartbeat_ttl.or(file.server.min_heartbeat_ttl) {
        if ttl.is_zero() {
            return Err(config_error("server.min_heartbeat_ttl", "must be above zero"));
        }
        config.heartbeat.min_heartbeat_ttl = ttl;
    }
    if let Some(grace) = args.heartbeat_grace.or(file.server.heartbeat_grace) {
        config.heartbeat.heartbeat_grace = grace;
    }
    if let Some(rate) = args.max_heartbeats_per_second.or(file.server.max_heartbeats_per_second) {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(config_error("server.max_heartbeats_per_second", "must be a positive number"));
        }
        config.heartbeat.max_heartbeats_per_second = rate;
    }
    storm_guard_config(&mut config.heartbeat.storm, &file.server.storm_guard)?;
    gc_config(&mut config.gc, &file.server)?;
    if let Some(size) = args.event_buffer_size.or(file.server.event_buffer_size) {
        config.event_buffer_size = size;
    }
    Ok(config)
}

/// The garbage collection keys of `[server]` (Nomad's names).
fn gc_config(gc: &mut engine::gc::GcConfig, server: &ServerSection) -> Result<(), Failure> {
    if let Some(interval) = server.job_gc_interval {
        if interval.is_zero() {
            return Err(config_error("server.job_gc_interval", "must be above zero"));
        }
        gc.interval = interval;
    }
    let thresholds = &mut gc.thresholds;
    let keys = [
        (server.eval_gc_threshold, &mut thresholds.eval),
        (server.batch_eval_gc_threshold, &mut thresholds.batch_eval),
        (server.job_gc_threshold, &mut thresholds.job),
        (server.node_gc_threshold, &mut thresholds.node),
        (server.deployment_gc_threshold, &mut thresholds.deployment),
    ];
    for (value, threshold) in keys {
        if let Some(value) = value {
            *threshold = value;
        }
    }
    Ok(())
}

pub fn run(args: ServerArgs) -> Result<(), Failure> {
    let file = file_config(&args.common)?;
    init_logs(&args.common, &file)?;
    raise_open_files_limit();
    let engine = engine_config(&args, &file)?;
    let bind_ip = match (args.bind, &file.server.bind_addr) {
        (Some(ip), _) => ip,
        (None, Some(text)) => {
            text.parse().map_err(|_| config_error("server.bind_addr", format!("{text:?} is not an IP address")))?
        }
        (None, None) => IpAddr::from([0, 0, 0, 0]),
    };
    let bind = SocketAddr::new(bind_ip, args.port.or(file.server.port).unwrap_or(4647));
    // A dev server without a data dir writes its client files to a
    // temporary directory that goes when it exits.
    let (tls, _dev_tls_dir) = if args.common.dev {
        dev_server_tls(args.common.data_dir.as_deref())?
    } else {
        (tls_files(&args.common, &file)?, None)
    };
    let http = if args.no_http {
        None
    } else {
        let http_ip = match (args.http_bind, &file.server.http_bind_addr) {
            (Some(ip), _) => ip,
            (None, Some(text)) => text
                .parse()
                .map_err(|_| config_error("server.http_bind_addr", format!("{text:?} is not an IP address")))?,
            (None, None) => bind_ip,
        };
        Some(HttpOptions {
            bind: SocketAddr::new(http_ip, args.http_port.or(file.server.http_port).unwrap_or(4646)),
            tls: !args.common.dev,
            verify_clients: file.server.verify_https_client.unwrap_or(false),
            name: server_name(&args, &file),
            datacenter: file.server.datacenter.clone().unwrap_or_else(|| "dc1".to_string()),
            acl_enabled: args.acl_enabled || file.acl.enabled.unwrap_or(false),
            limits: file.limits.http(),
        })
    };
    let durable = match args.common.data_dir.clone().or(file.data_dir.clone()) {
        Some(dir) => {
            let snapshot_every = args.snapshot_every.or(file.server.snapshot_every).unwrap_or(20_000);
            if snapshot_every == 0 {
                return Err(config_error("server.snapshot_every", "must be at least 1"));
            }
            Some(DurableOptions::under(&dir, replication::DurableConfig { snapshot_every }))
        }
        None if args.common.dev => {
            tracing::warn!("DEV MODE without a data dir: the state is kept in memory and lost when the server stops");
            None
        }
        None => {
            return Err(config_error(
                "data_dir",
                "required for a server: it holds the raft log and snapshots (or --dev to keep the state in memory)",
            ))
        }
    };
    let advertise = args.advertise.clone().or(file.server.advertise.clone());
    let cluster = cluster_options(&args, &file, bind_ip, advertise.as_deref())?;
    if cluster.is_some() && durable.is_none() {
        return Err(config_error("data_dir", "required for a server of a cluster: raft keeps its log there"));
    }
    let options = ServerOptions { bind, advertise, engine, tls, http, durable, cluster };
    crate::server::run_until_signal(options, args.print_address).map_err(Failure::Run)
}

pub fn server_name(args: &ServerArgs, file: &FileConfig) -> String {
    args.name.clone().or(file.name.clone()).unwrap_or_else(hostname)
}

/// The cluster a server is one of, if it was given `bootstrap_expect` or
/// `join`.
pub fn cluster_options(
    args: &ServerArgs,
    file: &FileConfig,
    bind_ip: IpAddr,
    advertise: Option<&str>,
) -> Result<Option<ClusterOptions>, Failure> {
    let bootstrap_expect = args.bootstrap_expect.or(file.server.bootstrap_expect);
    let join = args.join.clone().or(file.server.join.clone()).unwrap_or_default();
    if bootstrap_expect.is_none() && join.is_empty() {
        return Ok(None);
    }
    if bootstrap_expect == Some(0) {
        return Err(config_error("server.bootstrap_expect", "must be at least 1"));
    }
    let peer_port = args.peer_port.or(file.server.peer_port).unwrap_or(4648);
    let advertise_peer = match advertise {
        Some(addr) => match addr.rsplit_once(':') {
            Some((host, _)) => Some(format!("{host}:{peer_port}")),
            None => return Err(config_error("server.advertise", format!("{addr:?} is not host:port"))),
        },
        None => None,
    };
    Ok(Some(ClusterOptions {
        name: server_name(args, file),
        peer_bind: SocketAddr::new(bind_ip, peer_port),
        advertise_peer,
        // --join alone joins a cluster formed already; it never forms one.
        bootstrap_expect: bootstrap_expect.unwrap_or(0),
        join,
        hold: crate::server::leadership::HOLD,
    }))
}

/// `[server.storm_guard]` over the defaults, refused whole when it makes no sense.
fn storm_guard_config(config: &mut StormConfig, section: &StormGuardSection) -> Result<(), Failure> {
    config.enabled = section.enabled.unwrap_or(config.enabled);
    config.cluster_share = section.cluster_share.unwrap_or(config.cluster_share);
    config.datacenter_share = section.datacenter_share.unwrap_or(config.datacenter_share);
    config.min_nodes = section.min_nodes.unwrap_or(config.min_nodes);
    config.window = section.window.unwrap_or(config.window);
    config.release_per_second = section.release_rate.unwrap_or(config.release_per_second);
    config.validate().map_err(|message| config_error("server.storm_guard", message))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn the_storm_guard_table_is_read_and_settings_that_make_no_sense_are_refused() {
        let text = "[server.storm_guard]\ncluster_share = 0.5\nrelease_rate = 5.0\nwindow = \"2m\"\n";
        let file = FileConfig::parse(text, Path::new("a.toml")).expect("valid");
        let mut config = StormConfig::default();
        storm_guard_config(&mut config, &file.server.storm_guard).expect("sensible");
        assert_eq!((config.cluster_share, config.release_per_second), (0.5, 5.0));
        assert_eq!((config.window, config.enabled), (Duration::from_secs(120), true));
        let text = "[server.storm_guard]\ndatacenter_share = 2.0\n";
        let file = FileConfig::parse(text, Path::new("a.toml")).expect("parses");
        let refused = storm_guard_config(&mut StormConfig::default(), &file.server.storm_guard).expect_err("over 1");
        let shown = format!("{refused:?}");
        assert!(shown.contains("server.storm_guard") && shown.contains("datacenter_share must be"), "{shown}");
        let unknown = FileConfig::parse("[server.storm_guard]\nrate = 1\n", Path::new("a.toml"));
        assert!(unknown.expect_err("unknown key").to_string().contains("rate"));
    }
}
