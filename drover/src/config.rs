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
//!
//! [client]
//! servers = ["10.0.0.5:4647"]
//! datacenter = "dc1"
//! node_class = ""
//! cpu_mhz = 8000              # default: cores × 2000
//! memory_mb = 16384           # default: the machine's memory
//! disk_mb = 100000
//! mock_driver = false         # offer the `mock` driver
//! raw_exec = false            # offer the `raw_exec` driver (tasks as plain processes)
//! gc_max_allocs = 50          # terminal allocations whose directories are kept
//! env_denylist = ["CONSUL_TOKEN", "CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE", "NOMAD_TOKEN",
//!     "VAULT_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
//!     "GOOGLE_APPLICATION_CREDENTIALS"] # the default (Nomad's env.denylist): the agent's variables
//!                             # raw_exec tasks never inherit; `PREFIX_*` denies a prefix; replaces the default
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
//! [tls]                       # required unless --dev
//! ca_file = "ca.pem"
//! cert_file = "server.pem"
//! key_file = "server-key.pem"
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

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
    /// Form a cluster once this many servers know each other.
    pub bootstrap_expect: Option<usize>,
    /// Server-to-server addresses of other servers (`host:port`).
    pub join: Option<Vec<String>>,
    /// UDP port of the server-to-server endpoint (4648).
    pub peer_port: Option<u16>,
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
