//! The agent's configuration file (TOML) and what it turns into. Flags on
//! the command line override the file; the file overrides the defaults.
//!
//! ```toml
//! log_level = "info"          # error, warn, info, debug, trace
//! log_json = false
//! data_dir = "/var/lib/drover"
//!
//! [server]
//! bind_addr = "0.0.0.0"
//! port = 4647                 # UDP, QUIC; Nomad's RPC port
//! advertise = "10.0.0.5:4647" # what clients are told (default: the bound address)
//! http_port = 4646            # TCP, the HTTP API; Nomad's HTTP port
//! http_bind_addr = "0.0.0.0"  # default: bind_addr
//! verify_https_client = false # ask HTTPS clients for a cluster certificate
//! datacenter = "dc1"          # the server's datacenter in agent/self
//! workers = 2                 # scheduling workers (default: cores)
//! enabled_schedulers = ["service", "batch", "system", "sysbatch"]
//! min_heartbeat_ttl = "10s"
//! max_heartbeats_per_second = 1000.0
//! heartbeat_grace = "10s"
//! snapshot_every = 20000      # raft entries between snapshots of the state
//! event_buffer_size = 100     # event batches kept for /v1/event/stream (0: off)
//! job_gc_interval = "5m"      # garbage collection runs this often (Nomad's names and defaults)
//! eval_gc_threshold = "1h"    # terminal evaluations and their allocations
//! batch_eval_gc_threshold = "24h" # terminal evaluations of batch jobs
//! job_gc_threshold = "4h"     # dead jobs (stopped, or batch)
//! node_gc_threshold = "24h"   # down nodes
//! deployment_gc_threshold = "1h" # finished deployments
//!
//! [server.storm_guard]        # calm under mass heartbeat loss (Drover's own block)
//! enabled = true
//! cluster_share = 0.2         # this share of all nodes missing or late on heartbeats
//! datacenter_share = 0.3      # or this share of one datacenter's turns it on
//! min_nodes = 10              # scopes with fewer nodes are not judged
//! window = "60s"              # how long a missed heartbeat counts
//! release_rate = 20.0         # held nodes whose replacements are placed per second
//!
//! [client]
//! servers = ["10.0.0.5:4647"]
//! name = "web-1"              # the node's name (default: the host name)
//! datacenter = "dc1"
//! node_class = ""
//! network_interface = "eth0"  # the node's address is this interface's first IPv4
//!                             # (default: the default route's interface; `lo` with --dev)
//! cpu_total_compute = 8000    # CPU in MHz (default: cores × MHz, read from the host);
//!                             # `cpu_mhz` is the older name
//! memory_mb = 16384           # default: the machine's memory
//! disk_mb = 100000            # default: what is free on the data dir's file system
//! meta = { rack = "r1" }      # node metadata (`${meta.rack}`); --meta KEY=VALUE adds
//! mock_driver = false         # offer the `mock` driver
//! raw_exec = false            # offer the `raw_exec` driver (tasks as plain processes)
//! gc_max_allocs = 50          # terminal allocations whose directories are kept
//! env_denylist = ["CONSUL_TOKEN", "CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE", "NOMAD_TOKEN",
//!     "VAULT_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
//!     "GOOGLE_APPLICATION_CREDENTIALS"] # the default (Nomad's env.denylist): the agent's variables
//!                             # raw_exec tasks never inherit; `PREFIX_*` denies a prefix; replaces the default
//!
//! [client.drain_on_shutdown]  # drain the node before the agent exits (Nomad's block)
//! deadline = "1h"             # how long its allocations may take to move (default 1h)
//! force = false               # stop them all at once instead
//! ignore_system_jobs = false  # leave the system allocations
//!
//! [client.reserved]           # held back for the host itself: never given to allocations
//! cpu = 500                   # MHz
//! memory = 512                # MiB
//! disk = 1024                 # MiB
//! reserved_ports = "22,80,8000-8100" # Nomad's port list
//! [client.host_network.public] # a named network ports may ask for
//!                             # (`port "http" { host_network = "public" }`); also
//!                             # written `[[client.host_network]]` with `name = "public"`
//! cidr = "203.0.113.0/24"     # its address is the host's in this network,
//! interface = "eth1"          # and/or this interface's (at least one of the two)
//! reserved_ports = "22"       # held back on it (ports are held per node: on every address)
//!
//! [acl]
//! enabled = true              # every HTTP API request needs a token (drover acl bootstrap)
//!
//! [limits]                    # the HTTP API's listener
//! http_max_conns_per_client = 100 # open connections per client address (Nomad's; 0: no limit)
//! https_handshake_timeout = "5s"  # to finish a TLS handshake (Nomad's)
//! http_idle_timeout = "30s"   # to send a whole request head: before the first request,
//!                             # between requests, while headers trickle in (Drover's)
//!
//! [plugin.docker.config]      # the docker driver (Nomad's plugin "docker" { config {} })
//! enabled = true              # offer it whenever the daemon answers (Drover's own key)
//! endpoint = "unix:///var/run/docker.sock" # the daemon (default: DOCKER_HOST if unix://, else this)
//! allow_privileged = false    # tasks may set privileged = true
//! allow_caps = ["CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "SETGID", "SETUID", "SETFCAP",
//!     "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE"] # Nomad's default; ["ALL"]: any
//! volumes = { enabled = false } # host paths and named volumes in volumes/mount
//! health_check_interval = "30s" # how often the daemon is asked (Drover's own key)
//!
//! [tls]                       # required unless --dev
//! ca_file = "ca.pem"
//! cert_file = "server.pem"
//! key_file = "server-key.pem"
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use engine::structs::PortSet;
use serde::Deserialize;

/// Why a configuration could not be used. Exit code 2.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: {source}")]
    Read {
        /// The file.
        file: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has a bad key or value.
    #[error("{file}:{line}:{column}: {key}: {message}")]
    Invalid {
        /// The file.
        file: PathBuf,
        /// Line of the problem (1-based).
        line: usize,
        /// Column of the problem (1-based).
        column: usize,
        /// The key, with its table (`server.workers`), or `(file)`.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A value is well-formed but unusable.
    #[error("{key}: {message}")]
    Value {
        /// The key (or flag).
        key: String,
        /// What is wrong.
        message: String,
    },
}

/// The whole file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Log level.
    pub log_level: Option<String>,
    /// Logs as JSON lines.
    pub log_json: Option<bool>,
    /// Where the agent keeps its state.
    pub data_dir: Option<PathBuf>,
    /// This agent's name (default: the host name).
    pub name: Option<String>,
    /// Server settings.
    #[serde(default)]
    pub server: ServerSection,
    /// Client settings.
    #[serde(default)]
    pub client: ClientSection,
    /// TLS files.
    #[serde(default)]
    pub tls: TlsSection,
    /// ACLs.
    #[serde(default)]
    pub acl: AclSection,
    /// Connection limits.
    #[serde(default)]
    pub limits: LimitsSection,
    /// Task driver plugins, by name (`[plugin.docker.config]`), as Nomad's
    /// `plugin "docker" { config { ... } }`.
    #[serde(default)]
    pub plugin: PluginSection,
}

/// `[plugin.*]`: the drivers' settings.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginSection {
    /// `[plugin.docker]`.
    #[serde(default)]
    pub docker: DockerPlugin,
}

/// `[plugin.docker]`: Nomad's plugin block, whose settings are in `config`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DockerPlugin {
    /// `[plugin.docker.config]`.
    #[serde(default)]
    pub config: DockerPluginConfig,
}

/// `[plugin.docker.config]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DockerPluginConfig {
    /// Offer the driver (Drover's own; default true: it runs whenever the
    /// daemon answers, as Nomad's).
    pub enabled: Option<bool>,
    /// The daemon's socket (`unix:///var/run/docker.sock`).
    pub endpoint: Option<String>,
    /// Tasks may run privileged.
    pub allow_privileged: Option<bool>,
    /// The capabilities tasks may have (`["ALL"]` for any).
    pub allow_caps: Option<Vec<String>>,
    /// Host paths and named volumes.
    #[serde(default)]
    pub volumes: DockerVolumes,
    /// How often the daemon's health is checked (Drover's own; default 30s).
    #[serde(default, with = "duration_text")]
    pub health_check_interval: Option<Duration>,
}

/// `[plugin.docker.config.volumes]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DockerVolumes {
    /// Tasks may bind host paths and use named volumes.
    pub enabled: Option<bool>,
}

/// `[limits]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    /// Open HTTP connections per client address (0: no limit).
    pub http_max_conns_per_client: Option<usize>,
    /// Time to finish an HTTPS handshake.
    #[serde(default, with = "duration_text")]
    pub https_handshake_timeout: Option<Duration>,
    /// Time to send a whole request head.
    #[serde(default, with = "duration_text")]
    pub http_idle_timeout: Option<Duration>,
}

impl LimitsSection {
    /// The limits, the defaults where the file says nothing.
    pub fn http(&self) -> crate::listener::HttpLimits {
        let default = crate::listener::HttpLimits::default();
        crate::listener::HttpLimits {
            max_conns_per_client: self.http_max_conns_per_client.unwrap_or(default.max_conns_per_client),
            https_handshake_timeout: self.https_handshake_timeout.unwrap_or(default.https_handshake_timeout),
            idle_timeout: self.http_idle_timeout.unwrap_or(default.idle_timeout),
        }
    }
}

/// `[acl]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AclSection {
    /// Every HTTP request needs a token.
    pub enabled: Option<bool>,
}

/// `[server]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    /// Address to bind.
    pub bind_addr: Option<String>,
    /// UDP port.
    pub port: Option<u16>,
    /// Address handed to clients.
    pub advertise: Option<String>,
    /// TCP port of the HTTP API (4646).
    pub http_port: Option<u16>,
    /// Address the HTTP API binds (default: `bind_addr`).
    pub http_bind_addr: Option<String>,
    /// Ask HTTPS clients for a certificate signed by the cluster CA.
    pub verify_https_client: Option<bool>,
    /// The server's datacenter, as `agent/self` reports it.
    pub datacenter: Option<String>,
    /// Scheduling workers.
    pub workers: Option<usize>,
    /// Scheduler types served.
    pub enabled_schedulers: Option<Vec<String>>,
    /// Shortest heartbeat TTL.
    #[serde(default, with = "duration_text")]
    pub min_heartbeat_ttl: Option<Duration>,
    /// Cluster-wide heartbeat rate.
    pub max_heartbeats_per_second: Option<f64>,
    /// Extra time past the TTL.
    #[serde(default, with = "duration_text")]
    pub heartbeat_grace: Option<Duration>,
    /// Raft entries between snapshots.
    pub snapshot_every: Option<u64>,
    /// Event batches kept for the event stream (0: off).
    pub event_buffer_size: Option<usize>,
    /// Form a cluster once this many servers know each other.
    pub bootstrap_expect: Option<usize>,
    /// Server-to-server addresses of other servers (`host:port`).
    pub join: Option<Vec<String>>,
    /// UDP port of the server-to-server endpoint (4648).
    pub peer_port: Option<u16>,
    /// How often garbage collection runs.
    #[serde(default, with = "duration_text")]
    pub job_gc_interval: Option<Duration>,
    /// Age of terminal evals (and their allocations) to collect.
    #[serde(default, with = "duration_text")]
    pub eval_gc_threshold: Option<Duration>,
    /// Age of terminal evals of batch jobs to collect.
    #[serde(default, with = "duration_text")]
    pub batch_eval_gc_threshold: Option<Duration>,
    /// Age of dead jobs to collect.
    #[serde(default, with = "duration_text")]
    pub job_gc_threshold: Option<Duration>,
    /// Time down of nodes to collect.
    #[serde(default, with = "duration_text")]
    pub node_gc_threshold: Option<Duration>,
    /// Age of finished deployments to collect.
    #[serde(default, with = "duration_text")]
    pub deployment_gc_threshold: Option<Duration>,
    /// The storm guard.
    #[serde(default)]
    pub storm_guard: StormGuardSection,
}

/// `[server.storm_guard]` (`engine::node::storm`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StormGuardSection {
    /// Whether the guard runs.
    pub enabled: Option<bool>,
    /// Share of all nodes in trouble that turns it on.
    pub cluster_share: Option<f64>,
    /// Share of one datacenter's nodes in trouble that turns it on.
    pub datacenter_share: Option<f64>,
    /// The fewest nodes a scope needs to be judged.
    pub min_nodes: Option<usize>,
    /// How long a missed heartbeat counts.
    #[serde(default, with = "duration_text")]
    pub window: Option<Duration>,
    /// Held nodes whose replacements are released per second.
    pub release_rate: Option<f64>,
}

/// `[client]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientSection {
    /// Servers to connect to.
    pub servers: Option<Vec<String>>,
    /// Node name (default: the host name).
    pub name: Option<String>,
    /// Datacenter.
    pub datacenter: Option<String>,
    /// Node class.
    pub node_class: Option<String>,
    /// CPU in MHz.
    pub cpu_mhz: Option<u64>,
    /// Memory in MiB.
    pub memory_mb: Option<u64>,
    /// Disk in MiB.
    pub disk_mb: Option<u64>,
    /// Offer the mock driver.
    pub mock_driver: Option<bool>,
    /// Offer the raw_exec driver.
    pub raw_exec: Option<bool>,
    /// Gone (the agent serves no HTTP): read only to warn that it is
    /// ignored, naming what replaced it.
    pub http_addr: Option<String>,
    /// Terminal allocations whose directories are kept.
    pub gc_max_allocs: Option<usize>,
    /// The agent's environment variables tasks never inherit (replaces
    /// the default list).
    pub env_denylist: Option<Vec<String>>,
    /// Node metadata.
    pub meta: Option<BTreeMap<String, String>>,
    /// The interface whose address is the node's.
    pub network_interface: Option<String>,
    /// CPU in MHz, instead of cores × the fingerprinted frequency.
    pub cpu_total_compute: Option<u64>,
    /// What the host keeps for itself.
    #[serde(default)]
    pub reserved: ReservedSection,
    /// Named host networks.
    #[serde(default)]
    pub host_network: HostNetworks,
    /// Drain the node before the agent exits.
    pub drain_on_shutdown: Option<DrainOnShutdownSection>,
}

/// `[client.drain_on_shutdown]`: the agent drains its node before it exits.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainOnShutdownSection {
    /// How long its allocations may take to move (default 1 h).
    #[serde(default, with = "duration_text")]
    pub deadline: Option<Duration>,
    /// Stop them all at once.
    #[serde(default)]
    pub force: bool,
    /// Leave the system allocations.
    #[serde(default)]
    pub ignore_system_jobs: bool,
}

/// `[client.reserved]`: resources and ports never given to allocations.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReservedSection {
    /// CPU in MHz.
    pub cpu: Option<u64>,
    /// Memory in MiB.
    pub memory: Option<u64>,
    /// Disk in MiB.
    pub disk: Option<u64>,
    /// Ports, as Nomad writes them (`"22,80,8000-8100"`).
    #[serde(default, with = "port_list")]
    pub reserved_ports: PortSet,
}

/// One `host_network`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostNetworkSection {
    /// Its name (the table's name in the `[client.host_network.NAME]` form).
    #[serde(default)]
    pub name: String,
    /// The network its address is in.
    pub cidr: Option<String>,
    /// The interface its address is on.
    pub interface: Option<String>,
    /// Ports held back on it.
    #[serde(default, with = "port_list")]
    pub reserved_ports: PortSet,
}

/// The `host_network` blocks, as an array of tables with names or as a
/// table of tables by name.
#[derive(Clone, Debug, Default)]
pub struct HostNetworks(pub Vec<HostNetworkSection>);

impl<'de> Deserialize<'de> for HostNetworks {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Blocks;
        impl<'de> serde::de::Visitor<'de> for Blocks {
            type Value = HostNetworks;

            fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                formatter.write_str("[[client.host_network]] blocks with a name, or [client.host_network.NAME] tables")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<HostNetworks, A::Error> {
                let mut networks = Vec::new();
                while let Some(network) = seq.next_element::<HostNetworkSection>()? {
                    networks.push(network);
                }
                Ok(HostNetworks(networks))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<HostNetworks, A::Error> {
                let mut networks = Vec::new();
                while let Some((name, mut network)) = map.next_entry::<String, HostNetworkSection>()? {
                    if !network.name.is_empty() && network.name != name {
                        return Err(serde::de::Error::custom(format!(
                            "host network {name:?} names itself {:?}",
                            network.name
                        )));
                    }
                    network.name = name;
                    networks.push(network);
                }
                Ok(HostNetworks(networks))
            }
        }
        deserializer.deserialize_any(Blocks)
    }
}

impl HostNetworks {
    /// Why the blocks cannot be used, naming the key: a block without a
    /// name, a name twice, `default` (the node's own address), or one with
    /// nowhere to look.
    pub fn problem(&self) -> Option<ConfigError> {
        let mut seen = std::collections::BTreeSet::new();
        let problem = |key: String, message: &str| Some(ConfigError::Value { key, message: message.to_string() });
        for network in &self.0 {
            let key = format!("client.host_network.{}", network.name);
            if network.name.is_empty() {
                return problem("client.host_network.name".to_string(), "every host network needs a name");
            }
            if network.name == "default" {
                return problem(key, "\"default\" is the node's own address; name the network otherwise");
            }
            if !seen.insert(network.name.as_str()) {
                return problem(key, "is configured twice");
            }
            if network.cidr.is_none() && network.interface.is_none() {
                return problem(key, "needs a cidr or an interface to find its address");
            }
        }
        None
    }
}

/// `[tls]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// The cluster CA certificate.
    pub ca_file: Option<PathBuf>,
    /// This agent's certificate.
    pub cert_file: Option<PathBuf>,
    /// Its key.
    pub key_file: Option<PathBuf>,
}

impl FileConfig {
    /// Reads and checks `file`.
    pub fn load(file: &Path) -> Result<FileConfig, ConfigError> {
        let text =
            std::fs::read_to_string(file).map_err(|source| ConfigError::Read { file: file.to_path_buf(), source })?;
        FileConfig::parse(&text, file)
    }

    /// Parses `text`, naming `file` in errors.
    pub fn parse(text: &str, file: &Path) -> Result<FileConfig, ConfigError> {
        toml::from_str(text).map_err(|error| {
            let offset = error.span().map_or(0, |span| span.start);
            let (line, column) = line_and_column(text, offset);
            ConfigError::Invalid {
                file: file.to_path_buf(),
                line,
                column,
                key: key_at(text, offset),
                message: error.message().trim().to_string(),
            }
        })
    }
}

/// 1-based line and column of byte `offset`.
fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |newline| newline + 1) + 1;
    (line, column)
}

/// The dotted key whose line holds byte `offset`, with the table it is in.
fn key_at(text: &str, offset: usize) -> String {
    let before = &text[..offset.min(text.len())];
    let line_start = before.rfind('\n').map_or(0, |newline| newline + 1);
    let line = text[line_start..].lines().next().unwrap_or("").trim();
    let table = before[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|line| line.starts_with('[') && line.ends_with(']'))
        .map(|header| header.trim_matches(|c| c == '[' || c == ']').trim().to_string());
    if line.starts_with('[') {
        return line.trim_matches(|c| c == '[' || c == ']').trim().to_string();
    }
    match (line.split_once('=').map(|(key, _)| key.trim()), table) {
        (Some(key), Some(table)) => format!("{table}.{key}"),
        (Some(key), None) => key.to_string(),
        (None, Some(table)) => table,
        (None, None) => "(file)".to_string(),
    }
}

/// Port lists written as Nomad writes them (`"22,80,8000-8100"`).
mod port_list {
    use engine::structs::PortSet;
    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<PortSet, D::Error> {
        let text = String::deserialize(deserializer)?;
        PortSet::parse_list(&text).map_err(|error| serde::de::Error::custom(format!("bad port list: {error}")))
    }
}

/// Durations written as text (`"10s"`, `"1m30s"`).
mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
        let text = Option::<String>::deserialize(deserializer)?;
        text.map(|text| {
            humantime::parse_duration(&text)
                .map_err(|error| serde::de::Error::custom(format!("{text:?} is not a duration ({error})")))
        })
        .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_value_names_the_file_the_key_and_the_problem() {
        let text = "log_level = \"info\"\n\n[server]\nport = 4647\nworkers = \"two\"\n";
        let error = FileConfig::parse(text, Path::new("drover.toml")).expect_err("workers is not a number");
        let shown = error.to_string();
        assert!(shown.starts_with("drover.toml:5:"), "{shown}");
        assert!(shown.contains("server.workers"), "{shown}");
        assert!(shown.contains("invalid type"), "{shown}");
    }

    #[test]
    fn an_unknown_key_is_refused() {
        let text = "[server]\nwrokers = 2\n";
        let shown = FileConfig::parse(text, Path::new("a.toml")).expect_err("typo").to_string();
        assert!(shown.contains("server.wrokers") && shown.contains("unknown field"), "{shown}");
    }

    #[test]
    fn the_client_section_reads_nomad_s_node_settings() {
        let text = "[client]\nnetwork_interface = \"eth0\"\ncpu_total_compute = 4000\nmeta = { rack = \"r1\" }\n\
            [client.reserved]\ncpu = 500\nmemory = 256\ndisk = 1024\nreserved_ports = \"22,8000-8002\"\n\
            [client.host_network.public]\ncidr = \"203.0.113.0/24\"\nreserved_ports = \"80\"\n\
            [client.host_network.private]\ninterface = \"eth1\"\n";
        let config = FileConfig::parse(text, Path::new("a.toml")).expect("valid");
        let client = &config.client;
        assert_eq!(client.network_interface.as_deref(), Some("eth0"));
        assert_eq!(client.cpu_total_compute, Some(4000));
        assert_eq!(
            (client.reserved.cpu, client.reserved.memory, client.reserved.disk),
            (Some(500), Some(256), Some(1024))
        );
        assert_eq!(client.reserved.reserved_ports.iter().collect::<Vec<_>>(), vec![22, 8000, 8001, 8002]);
        let mut names: Vec<&str> = client.host_network.0.iter().map(|network| network.name.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, vec!["private", "public"]);
        let public = client.host_network.0.iter().find(|network| network.name == "public").expect("public");
        assert_eq!(public.reserved_ports.iter().collect::<Vec<_>>(), vec![80]);
        assert_eq!(public.cidr.as_deref(), Some("203.0.113.0/24"));
        assert!(client.host_network.problem().is_none());

        let blocks = "[[client.host_network]]\nname = \"public\"\ninterface = \"eth1\"\n";
        let config = FileConfig::parse(blocks, Path::new("a.toml")).expect("the array form");
        assert_eq!(config.client.host_network.0[0].interface.as_deref(), Some("eth1"));
    }

    #[test]
    fn a_bad_port_list_or_host_network_names_its_key() {
        let text = "[client.reserved]\nreserved_ports = \"22,9000-8000\"\n";
        let shown = FileConfig::parse(text, Path::new("a.toml")).expect_err("backwards").to_string();
        assert!(shown.starts_with("a.toml:2:"), "{shown}");
        assert!(shown.contains("client.reserved.reserved_ports") && shown.contains("ends before it starts"), "{shown}");
        let text = "[client.host_network.public]\nreserved_ports = \"http\"\n";
        let shown = FileConfig::parse(text, Path::new("a.toml")).expect_err("not a port").to_string();
        assert!(shown.contains("reserved_ports") && shown.contains("\"http\" is not a port number"), "{shown}");
        let nowhere = "[client.host_network.public]\nreserved_ports = \"22\"\n";
        let config = FileConfig::parse(nowhere, Path::new("a.toml")).expect("parses");
        let problem = config.client.host_network.problem().expect("nowhere to look").to_string();
        assert!(problem.starts_with("client.host_network.public: needs a cidr or an interface"), "{problem}");
        let default = "[client.host_network.default]\ninterface = \"eth0\"\n";
        let config = FileConfig::parse(default, Path::new("a.toml")).expect("parses");
        assert!(config.client.host_network.problem().expect("reserved name").to_string().contains("\"default\""));
        let unnamed = "[[client.host_network]]\ninterface = \"eth0\"\n";
        let config = FileConfig::parse(unnamed, Path::new("a.toml")).expect("parses");
        assert!(config.client.host_network.problem().expect("no name").to_string().contains("needs a name"));
    }

    #[test]
    fn durations_are_read_as_text() {
        let text = "[server]\nmin_heartbeat_ttl = \"2s\"\nheartbeat_grace = \"500ms\"\n";
        let config = FileConfig::parse(text, Path::new("a.toml")).expect("valid");
        assert_eq!(config.server.min_heartbeat_ttl, Some(Duration::from_secs(2)));
        assert_eq!(config.server.heartbeat_grace, Some(Duration::from_millis(500)));
        let shown = FileConfig::parse("[server]\nheartbeat_grace = \"soon\"\n", Path::new("a.toml"))
            .expect_err("not a duration")
            .to_string();
        assert!(shown.contains("server.heartbeat_grace") && shown.contains("not a duration"), "{shown}");
    }
}
