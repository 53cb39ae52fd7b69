//! The `docker` driver's task config, read from [`Task::config`] with
//! Nomad's keys, so that a job is checked at submission with the rules the
//! agent applies when it builds the container.
//!
//! Reading sorts every key into one of three: honoured (a field below),
//! known to Nomad but not implemented by Drover, and unknown. Neither of
//! the last two stops the task; both are named in [`DockerConfig::ignored`],
//! which the HTTP API turns into warnings at submission and the agent logs.

use std::collections::BTreeMap;
use std::time::Duration;

use super::task_config::ConfigValue;
use super::Task;

/// The `docker` driver's name, as Nomad's.
pub const DOCKER: &str = "docker";

/// A `docker` task's driver config.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct DockerConfig {
    /// The image (`busybox:1.36`, `registry:5000/app`); a leading
    /// `https://` is dropped and a missing tag is `latest`, as Nomad.
    pub image: String,
    /// The program: `Cmd[0]`, `args` after it.
    pub command: Option<String>,
    /// Its arguments (alone: the whole `Cmd`).
    pub args: Vec<String>,
    /// Replaces the image's entrypoint.
    pub entrypoint: Option<Vec<String>>,
    /// The working directory in the container.
    pub work_dir: Option<String>,
    /// Group network port labels published.
    pub ports: Vec<String>,
    /// The older form: port label → container port.
    pub port_map: BTreeMap<String, u16>,
    /// `bridge` (default), `host`, `none`, or a network's name.
    pub network_mode: Option<String>,
    /// `src:dst[:mode]` binds; a relative `src` is in the task directory.
    pub volumes: Vec<String>,
    /// `mount` blocks.
    pub mounts: Vec<DockerMount>,
    /// Container labels (the driver adds its own).
    pub labels: BTreeMap<String, String>,
    /// The container's host name.
    pub hostname: Option<String>,
    /// `host:ip` entries for `/etc/hosts`.
    pub extra_hosts: Vec<String>,
    /// DNS servers.
    pub dns_servers: Vec<String>,
    /// DNS search domains.
    pub dns_search_domains: Vec<String>,
    /// resolv.conf options.
    pub dns_options: Vec<String>,
    /// Privileged mode (only where the client allows it).
    pub privileged: bool,
    /// Pull even when the image is present.
    pub force_pull: bool,
    /// How long a pull may take (Nomad's default: 5 minutes).
    pub image_pull_timeout: Duration,
    /// A registry login, used only to pull.
    pub auth: Option<DockerAuth>,
    /// Capabilities added (checked against the client's allow-list).
    pub cap_add: Vec<String>,
    /// Capabilities dropped.
    pub cap_drop: Vec<String>,
    /// Docker's own log driver for the container.
    pub logging: Option<DockerLogging>,
    /// A read-only root file system.
    pub readonly_rootfs: bool,
    /// Docker's `--init`.
    pub init: bool,
    /// A terminal.
    pub tty: bool,
    /// Standard input kept open.
    pub interactive: bool,
    /// At most this many processes (0: no limit).
    pub pids_limit: i64,
    /// `/dev/shm`'s size in bytes (0: Docker's default).
    pub shm_size: i64,
    /// Nomad 1.0's hard memory limit in MiB (0: none); `memory_max` is the
    /// newer way, the larger of the two wins.
    pub memory_hard_limit: u64,
    /// Kernel parameters.
    pub sysctl: BTreeMap<String, String>,
    /// Limits: name → `"soft:hard"` or `"n"`.
    pub ulimit: BTreeMap<String, String>,
    /// Keys Drover read but does not honour, each with why, for warnings:
    /// `("devices", "is not implemented by Drover")`,
    /// `("colour", "is not a docker setting")`.
    pub ignored: Vec<(String, &'static str)>,
}

/// One `mount` block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DockerMount {
    /// `bind`, `volume` or `tmpfs`.
    pub kind: MountKind,
    /// Where in the container.
    pub target: String,
    /// What (a host path for `bind`, relative paths in the task directory;
    /// a volume's name; nothing for `tmpfs`).
    pub source: String,
    /// Mounted read-only.
    pub readonly: bool,
}

/// What a mount is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MountKind {
    /// A host path.
    Bind,
    /// A Docker volume (Nomad's default type).
    Volume,
    /// Memory.
    Tmpfs,
}

/// A registry login.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct DockerAuth {
    /// User name.
    pub username: String,
    /// Password.
    pub password: String,
    /// E-mail (older registries).
    pub email: String,
    /// The registry (default: the image's).
    pub server_address: String,
}

/// Docker's log driver for the container.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct DockerLogging {
    /// `json-file`, `local`, `syslog`, ... (Nomad's default: `json-file`).
    pub kind: String,
    /// Its options.
    pub config: BTreeMap<String, String>,
}

impl DockerConfig {
    /// Reads `task.config`, or lists every problem in it.
    pub fn from_task(task: &Task) -> Result<DockerConfig, Vec<String>> {
        DockerConfig::from_config(&task.config)
    }

    /// Reads a docker `config` (a task's, or the client's interpolated copy
    /// of it), or lists every problem in it.
    pub fn from_config(config: &BTreeMap<String, ConfigValue>) -> Result<DockerConfig, Vec<String>> {
        let mut problems = Vec::new();
        let image = match config.get("image") {
            Some(ConfigValue::String(image)) if !image.trim().is_empty() => image.clone(),
            _ => {
                problems.push("config.image is required for the docker driver".to_string());
                String::new()
            }
        };
        let text = |key: &str| config.get(key).and_then(ConfigValue::as_text);
        let list = |key: &str| match config.get(key) {
            Some(ConfigValue::List(items)) => items.iter().filter_map(ConfigValue::as_text).collect(),
            _ => Vec::new(),
        };
        let flag = |key: &str| matches!(config.get(key), Some(ConfigValue::Bool(true)));
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(DockerConfig {
            image,
            command: text("command"),
            args: list("args"),
            work_dir: text("work_dir"),
            ports: list("ports"),
            network_mode: text("network_mode"),
            privileged: flag("privileged"),
            force_pull: flag("force_pull"),
            image_pull_timeout: Duration::from_secs(300),
            ..DockerConfig::default()
        })
    }
}
