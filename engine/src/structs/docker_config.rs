//! The `docker` driver's task config, read from [`Task::config`] with
//! Nomad's keys, so that a job is checked at submission with the rules the
//! agent applies when it builds the container.
//!
//! Reading sorts every key into one of three: honoured (a field below),
//! known to Nomad but not implemented by Drover, and unknown. Neither of
//! the last two stops the task; both are named in [`DockerConfig::ignored`],
//! which the HTTP API turns into warnings at submission and the agent logs.
//!
//! Values are read as Nomad's decoder reads them: a scalar where text is
//! wanted is written out (`hostname = 5` is `"5"`), `"true"` and `"8080"`
//! are a bool and a number, and a map may come as HCL1's list of maps
//! (`"labels": [{"a": "b"}]`). Every problem is collected, each naming its
//! key (`config.port_map.http`), so one submission names them all.
//!
//! `${...}` variables are filled in by the client. The agent interpolates
//! every string of the config and then calls [`DockerConfig::from_config`],
//! which is strict: a `"${NOMAD_PORT_http}"` left in a port slot is an
//! error there. At submission the variables are still in the text, so
//! [`DockerConfig::submission_problems`] accepts a string holding `${` in
//! any slot whose value is checked (bools, numbers, ports, durations, the
//! shape of a volume, a ulimit or a mount type): only the client knows it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::duration::human_duration;
use super::task_config::ConfigValue;
use super::{Task, TaskGroup};

/// The `docker` driver's name, as Nomad's.
pub const DOCKER: &str = "docker";

/// A `docker` task's driver config.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct DockerConfig {
    /// The image (`busybox:1.36`, `registry:5000/app`) as written, but for
    /// a leading `https://`, dropped as Nomad does; a missing tag means
    /// `latest` ([`DockerConfig::image_reference`]).
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
    /// `json-file`, `local`, `syslog`, ...; empty when the block names
    /// none (the Docker daemon's default). With no `logging` block at all,
    /// Nomad's default is `json-file` with `max-file=2`, `max-size=2m`.
    pub kind: String,
    /// Its options.
    pub config: BTreeMap<String, String>,
}

/// How long an image pull may take when `image_pull_timeout` is not set,
/// as Nomad.
pub const DEFAULT_IMAGE_PULL_TIMEOUT: Duration = Duration::from_secs(300);

/// Why a key of Nomad's docker driver is not read.
const NOT_IMPLEMENTED: &str = "is not implemented by Drover";

/// Why a key Nomad's docker driver does not have either is not read.
const NOT_DOCKER: &str = "is not a docker setting";

/// The task config keys of Nomad's docker driver (1.0 to 1.9) that Drover
/// does not implement: named in warnings, never an error.
const NOMAD_KEYS_NOT_IMPLEMENTED: &[&str] = &[
    "advertise_ipv6_address",
    "auth_soft_fail",
    "container_exists_attempts",
    "cpu_cfs_period",
    "cpu_hard_limit",
    "cpuset_cpus",
    "devices",
    "group_add",
    "healthchecks",
    "ipc_mode",
    "ipv4_address",
    "ipv6_address",
    "isolation",
    "load",
    "mac_address",
    "network_aliases",
    "oom_score_adj",
    "pid_mode",
    "runtime",
    "security_opt",
    "storage_opt",
    "userns_mode",
    "uts_mode",
    "volume_driver",
];

/// The keys of a `mount` block that Nomad has and Drover does not implement.
const MOUNT_KEYS_NOT_IMPLEMENTED: &[&str] = &["bind_options", "tmpfs_options", "volume_options"];

impl DockerConfig {
    /// Reads `task.config`, or lists every problem in it (strictly: see
    /// [`DockerConfig::from_config`]).
    pub fn from_task(task: &Task) -> Result<DockerConfig, Vec<String>> {
        DockerConfig::from_config(&task.config)
    }

    /// Reads a docker `config` whose `${...}` variables are filled in (the
    /// client's interpolated copy of a task's), or lists every problem in
    /// it. A `${` left in a bool, number or port is an error here.
    pub fn from_config(config: &BTreeMap<String, ConfigValue>) -> Result<DockerConfig, Vec<String>> {
        let (docker, problems) = Reader::read(config, Variables::Filled);
        if problems.is_empty() {
            Ok(docker)
        } else {
            Err(problems)
        }
    }

    /// Checks a docker `config` as submitted, its `${...}` variables not
    /// yet filled in: the problems (a string holding `${` is accepted
    /// wherever a bool, number, port or duration goes, since only the
    /// client knows its value), and the keys that are ignored, each with
    /// why, as in [`DockerConfig::ignored`].
    pub fn submission_problems(config: &BTreeMap<String, ConfigValue>) -> (Vec<String>, Vec<(String, &'static str)>) {
        let (docker, problems) = Reader::read(config, Variables::Pending);
        (problems, docker.ignored)
    }

    /// The image's repository and tag, as the driver pulls it: the tag
    /// `latest` when none is written. A colon followed by a `/` belongs to
    /// a registry's port (`registry:5000/app` is repository
    /// `registry:5000/app`, tag `latest`). An image with a digest
    /// (`app@sha256:...`) is pulled by it: the repository is the whole
    /// image and the tag is empty, as Nomad's driver does.
    pub fn image_reference(&self) -> (String, String) {
        let image = self.image.as_str();
        if image.contains('@') {
            return (image.to_string(), String::new());
        }
        match image.rfind(':') {
            Some(colon) if !image[colon + 1..].contains('/') => {
                let tag = &image[colon + 1..];
                let tag = if tag.is_empty() { "latest" } else { tag };
                (image[..colon].to_string(), tag.to_string())
            }
            _ => (image.to_string(), "latest".to_string()),
        }
    }
}

/// Whether the config's `${...}` variables are filled in yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variables {
    /// The client's copy: every string is final.
    Filled,
    /// As submitted: a `${` stands for a value only the client knows.
    Pending,
}

/// Reads one config, collecting every problem and every ignored key.
struct Reader {
    variables: Variables,
    problems: Vec<String>,
    ignored: Vec<(String, &'static str)>,
}

impl Reader {
    /// Reads `config` into a [`DockerConfig`] and the problems found.
    fn read(config: &BTreeMap<String, ConfigValue>, variables: Variables) -> (DockerConfig, Vec<String>) {
        let mut reader = Reader { variables, problems: Vec::new(), ignored: Vec::new() };
        let mut docker = DockerConfig { image_pull_timeout: DEFAULT_IMAGE_PULL_TIMEOUT, ..DockerConfig::default() };
        for (key, value) in config {
            reader.key(&mut docker, key, value);
        }
        if !config.contains_key("image") {
            reader.problems.push("config.image is required for the docker driver".to_string());
        }
        docker.ignored = reader.ignored;
        (docker, reader.problems)
    }

    /// Reads one top-level key into its field, or names it as ignored.
    fn key(&mut self, docker: &mut DockerConfig, key: &str, value: &ConfigValue) {
        let place = format!("config.{key}");
        let place = place.as_str();
        match key {
            "image" => docker.image = self.image(place, value),
            "command" => docker.command = self.text(place, value),
            "args" => docker.args = self.texts(place, value),
            "entrypoint" => docker.entrypoint = Some(self.texts(place, value)),
            "work_dir" => docker.work_dir = self.text(place, value),
            "ports" => docker.ports = self.texts(place, value),
            "port_map" => docker.port_map = self.port_map(place, value),
            "network_mode" => docker.network_mode = self.text(place, value),
            "volumes" => docker.volumes = self.volumes(place, value),
            "mount" | "mounts" => {
                let mounts = self.mounts(place, value);
                docker.mounts.extend(mounts);
            }
            "labels" => docker.labels = self.text_map(place, value),
            "hostname" => docker.hostname = self.text(place, value),
            "extra_hosts" => docker.extra_hosts = self.texts(place, value),
            "dns_servers" => docker.dns_servers = self.texts(place, value),
            "dns_search_domains" => docker.dns_search_domains = self.texts(place, value),
            "dns_options" => docker.dns_options = self.texts(place, value),
            "privileged" => docker.privileged = self.flag(place, value),
            "force_pull" => docker.force_pull = self.flag(place, value),
            "readonly_rootfs" => docker.readonly_rootfs = self.flag(place, value),
            "init" => docker.init = self.flag(place, value),
            "tty" => docker.tty = self.flag(place, value),
            "interactive" => docker.interactive = self.flag(place, value),
            "image_pull_timeout" => docker.image_pull_timeout = self.duration(place, value),
            "auth" => docker.auth = self.auth(place, value),
            "cap_add" => docker.cap_add = self.texts(place, value),
            "cap_drop" => docker.cap_drop = self.texts(place, value),
            "logging" => docker.logging = self.logging(place, value),
            "pids_limit" => docker.pids_limit = self.non_negative(place, value),
            "shm_size" => docker.shm_size = self.non_negative(place, value),
            "memory_hard_limit" => {
                docker.memory_hard_limit = u64::try_from(self.non_negative(place, value)).unwrap_or_default()
            }
            "sysctl" => docker.sysctl = self.text_map(place, value),
            "ulimit" => docker.ulimit = self.ulimits(place, value),
            _ if NOMAD_KEYS_NOT_IMPLEMENTED.contains(&key) => self.ignored.push((key.to_string(), NOT_IMPLEMENTED)),
            _ => self.ignored.push((key.to_string(), NOT_DOCKER)),
        }
    }

    /// Whether `text` is a value only the client knows, accepted as is.
    fn pending(&self, text: &str) -> bool {
        self.variables == Variables::Pending && text.contains("${")
    }

    /// `image`: required, `https://` dropped.
    fn image(&mut self, place: &str, value: &ConfigValue) -> String {
        let Some(image) = self.text(place, value) else { return String::new() };
        let image = image.trim();
        let image = image.strip_prefix("https://").unwrap_or(image);
        if image.is_empty() {
            self.problems.push(format!("{place} is empty: name the image to run"));
        }
        image.to_string()
    }

    /// A string slot: scalars are written out, as Nomad's decoder does.
    fn text(&mut self, place: &str, value: &ConfigValue) -> Option<String> {
        let text = value.as_text();
        if text.is_none() {
            self.problems.push(format!("{place} must be a string, not {}", value.kind()));
        }
        text
    }

    /// A list of strings (each scalar written out).
    fn texts(&mut self, place: &str, value: &ConfigValue) -> Vec<String> {
        let ConfigValue::List(items) = value else {
            self.problems.push(format!("{place} must be a list of strings, not {}", value.kind()));
            return Vec::new();
        };
        items.iter().enumerate().filter_map(|(at, item)| self.text(&format!("{place}[{at}]"), item)).collect()
    }

    /// A bool: `true`, `false`, or those words as strings.
    fn flag(&mut self, place: &str, value: &ConfigValue) -> bool {
        match value {
            ConfigValue::Bool(flag) => *flag,
            ConfigValue::String(text) if text == "true" => true,
            ConfigValue::String(text) if text == "false" || self.pending(text) => false,
            other => {
                self.problems.push(format!("{place} must be true or false, not {}", shown(other)));
                false
            }
        }
    }

    /// A whole number, written as a number or a string (`8080`, `"8080"`);
    /// `None` when it is not one (a problem named with `what`) or is only
    /// known on the client.
    fn whole(&mut self, place: &str, value: &ConfigValue, what: &str) -> Option<i64> {
        let number = match value {
            ConfigValue::Int(number) => Some(*number),
            ConfigValue::Float(number) if number.fract() == 0.0 && number.abs() < 9.2e18 => Some(*number as i64),
            ConfigValue::String(text) if self.pending(text) => return None,
            ConfigValue::String(text) => text.trim().parse().ok(),
            _ => None,
        };
        if number.is_none() {
            self.problems.push(format!("{place} must be {what}, not {}", shown(value)));
        }
        number
    }

    /// A whole number of at least 0 (0 when absent or unknown).
    fn non_negative(&mut self, place: &str, value: &ConfigValue) -> i64 {
        match self.whole(place, value, "a whole number") {
            Some(number) if number < 0 => {
                self.problems.push(format!("{place} must not be negative (got {number})"));
                0
            }
            number => number.unwrap_or(0),
        }
    }

    /// A port number, 1 to 65535.
    fn port(&mut self, place: &str, value: &ConfigValue) -> Option<u16> {
        const WHAT: &str = "a port number (1-65535)";
        let number = self.whole(place, value, WHAT)?;
        let port = u16::try_from(number).ok().filter(|port| *port != 0);
        if port.is_none() {
            self.problems.push(format!("{place} must be {WHAT}, not {number}"));
        }
        port
    }

    /// `image_pull_timeout`: a Go duration string (`"5m"`, `"1h30m"`).
    fn duration(&mut self, place: &str, value: &ConfigValue) -> Duration {
        match value {
            ConfigValue::String(text) if self.pending(text) => DEFAULT_IMAGE_PULL_TIMEOUT,
            ConfigValue::String(text) => human_duration(text).unwrap_or_else(|error| {
                self.problems.push(format!("{place} must be a duration such as \"5m\" ({error})"));
                DEFAULT_IMAGE_PULL_TIMEOUT
            }),
            other => {
                self.problems.push(format!("{place} must be a duration such as \"5m\", not {}", shown(other)));
                DEFAULT_IMAGE_PULL_TIMEOUT
            }
        }
    }

    /// The maps of a map slot: a map, or HCL1's list of maps (read in
    /// order, a later key over an earlier one).
    fn maps<'v>(&mut self, place: &str, value: &'v ConfigValue) -> Vec<&'v BTreeMap<String, ConfigValue>> {
        match value {
            ConfigValue::Map(entries) => vec![entries],
            ConfigValue::List(items) => items
                .iter()
                .enumerate()
                .filter_map(|(at, item)| match item {
                    ConfigValue::Map(entries) => Some(entries),
                    other => {
                        self.problems.push(format!("{place}[{at}] must be a map, not {}", other.kind()));
                        None
                    }
                })
                .collect(),
            other => {
                self.problems.push(format!("{place} must be a map, not {}", other.kind()));
                Vec::new()
            }
        }
    }

    /// A map of strings (`labels`, `sysctl`), each scalar written out.
    fn text_map(&mut self, place: &str, value: &ConfigValue) -> BTreeMap<String, String> {
        let mut texts = BTreeMap::new();
        for entries in self.maps(place, value) {
            for (key, entry) in entries {
                if let Some(text) = self.text(&format!("{place}.{key}"), entry) {
                    texts.insert(key.clone(), text);
                }
            }
        }
        texts
    }

    /// `port_map`: label → container port.
    fn port_map(&mut self, place: &str, value: &ConfigValue) -> BTreeMap<String, u16> {
        let mut ports = BTreeMap::new();
        for entries in self.maps(place, value) {
            for (label, entry) in entries {
                if let Some(port) = self.port(&format!("{place}.{label}"), entry) {
                    ports.insert(label.clone(), port);
                }
            }
        }
        ports
    }

    /// `volumes`: each `source:destination[:mode]`.
    fn volumes(&mut self, place: &str, value: &ConfigValue) -> Vec<String> {
        let volumes = self.texts(place, value);
        for (at, volume) in volumes.iter().enumerate() {
            let parts: Vec<&str> = volume.split(':').collect();
            let well_formed = matches!(parts.len(), 2 | 3) && parts.iter().all(|part| !part.is_empty());
            if !well_formed && !self.pending(volume) {
                self.problems.push(format!("{place}[{at}] must be \"source:destination[:mode]\", not {volume:?}"));
            }
        }
        volumes
    }

    /// `ulimit`: name → `"n"` or `"soft:hard"`, whole numbers (-1: no limit).
    fn ulimits(&mut self, place: &str, value: &ConfigValue) -> BTreeMap<String, String> {
        let limits = self.text_map(place, value);
        for (name, limit) in &limits {
            if self.pending(limit) {
                continue;
            }
            let numbers: Option<Vec<i64>> = limit.split(':').map(|part| part.trim().parse().ok()).collect();
            match numbers.as_deref() {
                Some([_]) => {}
                Some(&[soft, hard]) if hard == -1 || (soft != -1 && soft <= hard) => {}
                Some(&[soft, hard]) => {
                    self.problems.push(format!("{place}.{name}: the soft limit {soft} is above the hard limit {hard}"))
                }
                _ => self
                    .problems
                    .push(format!("{place}.{name} must be \"n\" or \"soft:hard\" with whole numbers, not {limit:?}")),
            }
        }
        limits
    }

    /// A block that appears at most once (`auth`, `logging`): a map, or
    /// HCL1's list holding one map.
    fn block<'v>(&mut self, place: &str, value: &'v ConfigValue) -> Option<&'v BTreeMap<String, ConfigValue>> {
        let mut maps = self.maps(place, value);
        if maps.len() > 1 {
            self.problems.push(format!("{place} must be one block, not {}", maps.len()));
        }
        (!maps.is_empty()).then(|| maps.swap_remove(0))
    }

    /// Names a key of a block that is not read, as ignored.
    fn ignore_in_block(&mut self, place: &str, key: &str, nomad_keys: &[&str]) {
        let why = if nomad_keys.contains(&key) { NOT_IMPLEMENTED } else { NOT_DOCKER };
        let place = place.strip_prefix("config.").unwrap_or(place);
        self.ignored.push((format!("{place}.{key}"), why));
    }

    /// `auth { username, password, email, server_address }`.
    fn auth(&mut self, place: &str, value: &ConfigValue) -> Option<DockerAuth> {
        let block = self.block(place, value)?;
        let mut auth = DockerAuth::default();
        for (key, entry) in block {
            let entry_place = format!("{place}.{key}");
            let field = match key.as_str() {
                "username" => &mut auth.username,
                "password" => &mut auth.password,
                "email" => &mut auth.email,
                "server_address" => &mut auth.server_address,
                _ => {
                    self.ignore_in_block(place, key, &[]);
                    continue;
                }
            };
            *field = self.text(&entry_place, entry).unwrap_or_default();
        }
        Some(auth)
    }

    /// `logging { type, config {} }`; Nomad's older `driver` names the type
    /// when `type` does not. No type: the Docker daemon's default.
    fn logging(&mut self, place: &str, value: &ConfigValue) -> Option<DockerLogging> {
        let block = self.block(place, value)?;
        let mut logging = DockerLogging::default();
        let mut legacy_driver = None;
        for (key, entry) in block {
            let entry_place = format!("{place}.{key}");
            match key.as_str() {
                "type" => logging.kind = self.text(&entry_place, entry).unwrap_or_default(),
                "driver" => legacy_driver = self.text(&entry_place, entry),
                "config" => logging.config = self.text_map(&entry_place, entry),
                _ => self.ignore_in_block(place, key, &[]),
            }
        }
        if logging.kind.is_empty() {
            logging.kind = legacy_driver.unwrap_or_default();
        }
        Some(logging)
    }

    /// `mount` and `mounts`: a list of blocks, or one block.
    fn mounts(&mut self, place: &str, value: &ConfigValue) -> Vec<DockerMount> {
        match value {
            ConfigValue::Map(block) => self.mount(place, block).into_iter().collect(),
            ConfigValue::List(items) => items
                .iter()
                .enumerate()
                .filter_map(|(at, item)| match item {
                    ConfigValue::Map(block) => self.mount(&format!("{place}[{at}]"), block),
                    other => {
                        self.problems.push(format!("{place}[{at}] must be a mount block, not {}", other.kind()));
                        None
                    }
                })
                .collect(),
            other => {
                self.problems.push(format!("{place} must be a list of mount blocks, not {}", other.kind()));
                Vec::new()
            }
        }
    }

    /// One mount block: `type` (default `volume`), `target`, `source`
    /// (required but for `tmpfs`, which takes none), `readonly`.
    fn mount(&mut self, place: &str, block: &BTreeMap<String, ConfigValue>) -> Option<DockerMount> {
        let mut kind_known = true;
        let mut mount =
            DockerMount { kind: MountKind::Volume, target: String::new(), source: String::new(), readonly: false };
        for (key, entry) in block {
            let entry_place = format!("{place}.{key}");
            match key.as_str() {
                "type" => match self.text(&entry_place, entry).as_deref() {
                    Some("bind") => mount.kind = MountKind::Bind,
                    Some("volume") => mount.kind = MountKind::Volume,
                    Some("tmpfs") => mount.kind = MountKind::Tmpfs,
                    Some(kind) if self.pending(kind) => kind_known = false,
                    Some(kind) => {
                        self.problems.push(format!("{entry_place} must be bind, volume or tmpfs, not {kind:?}"));
                        kind_known = false;
                    }
                    None => kind_known = false,
                },
                "target" => mount.target = self.text(&entry_place, entry).unwrap_or_default(),
                "source" => mount.source = self.text(&entry_place, entry).unwrap_or_default(),
                "readonly" => mount.readonly = self.flag(&entry_place, entry),
                _ => self.ignore_in_block(place, key, MOUNT_KEYS_NOT_IMPLEMENTED),
            }
        }
        let problems_before = self.problems.len();
        if mount.target.trim().is_empty() {
            self.problems.push(format!("{place}.target is required: where in the container to mount"));
        }
        match mount.kind {
            _ if !kind_known => {}
            MountKind::Tmpfs if !mount.source.is_empty() => {
                self.problems.push(format!("{place}.source must be empty for a tmpfs mount"));
            }
            MountKind::Bind | MountKind::Volume if mount.source.trim().is_empty() => {
                let what = if mount.kind == MountKind::Bind { "the host path" } else { "the volume's name" };
                self.problems.push(format!("{place}.source is required: {what}"));
            }
            _ => {}
        }
        (self.problems.len() == problems_before).then_some(mount)
    }
}

/// Every label in a docker task's `config.ports` that is not one of its
/// group's network ports, with Nomad's words for it. A label holding `${`
/// is left to the client.
pub(crate) fn docker_port_problems(task: &Task, group: &TaskGroup, place: &str, problems: &mut Vec<String>) {
    let Some(ConfigValue::List(labels)) = task.config.get("ports") else { return };
    let known: BTreeSet<&str> = group
        .networks
        .iter()
        .flat_map(|network| network.reserved_ports.iter().chain(&network.dynamic_ports))
        .map(|port| &*port.label)
        .collect();
    for label in labels.iter().filter_map(ConfigValue::as_text) {
        if !label.contains("${") && !known.contains(label.as_str()) {
            problems.push(format!("{place}: config.ports: Port {label:?} not found, check network stanza"));
        }
    }
}

/// A value as a problem shows it: text quoted, numbers and bools as they
/// are, lists and maps by kind.
fn shown(value: &ConfigValue) -> String {
    match value {
        ConfigValue::String(text) => format!("{text:?}"),
        ConfigValue::List(_) | ConfigValue::Map(_) => value.kind().to_string(),
        scalar => scalar.as_text().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(value: serde_json::Value) -> BTreeMap<String, ConfigValue> {
        serde_json::from_value(value).expect("a config")
    }

    fn read(value: serde_json::Value) -> DockerConfig {
        DockerConfig::from_config(&config(value)).expect("valid")
    }

    fn problems(value: serde_json::Value) -> Vec<String> {
        DockerConfig::from_config(&config(value)).expect_err("problems")
    }

    fn texts(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect()
    }

    #[test]
    fn every_honoured_key_is_read() {
        let docker = read(json!({
            "image": "https://registry.example:5000/web:1.2", "command": "/bin/web", "args": ["-port", 8080, true],
            "entrypoint": ["/init", "--"], "work_dir": "/srv", "ports": ["http", "admin"],
            "port_map": {"http": 8080, "admin": "9090"}, "network_mode": "host",
            "volumes": ["local/data:/data", "/etc/ssl:/etc/ssl:ro"],
            "mount": [{"type": "bind", "source": "local/conf", "target": "/conf", "readonly": true},
                      {"target": "/cache", "source": "cache"}],
            "mounts": [{"type": "tmpfs", "target": "/scratch"}],
            "labels": {"team": "web", "tier": 2}, "hostname": "web-1", "extra_hosts": ["db:10.0.0.7"],
            "dns_servers": ["10.0.0.2"], "dns_search_domains": ["example"], "dns_options": ["ndots:2"],
            "privileged": true, "force_pull": "true", "readonly_rootfs": true, "init": true, "tty": "false",
            "interactive": true, "image_pull_timeout": "1h30m",
            "auth": {"username": "u", "password": "p", "email": "e@example", "server_address": "registry.example"},
            "cap_add": ["NET_ADMIN"], "cap_drop": ["ALL"],
            "logging": {"type": "json-file", "config": {"max-file": 3, "max-size": "10m"}},
            "pids_limit": 100, "shm_size": "67108864", "memory_hard_limit": 512.0,
            "sysctl": {"net.core.somaxconn": "16384"}, "ulimit": {"nofile": "1024:2048", "nproc": 64}
        }));
        assert_eq!(docker.image, "registry.example:5000/web:1.2", "https:// dropped");
        assert_eq!(docker.command.as_deref(), Some("/bin/web"));
        assert_eq!(docker.args, ["-port", "8080", "true"]);
        assert_eq!(docker.entrypoint, Some(vec!["/init".to_string(), "--".to_string()]));
        assert_eq!(docker.work_dir.as_deref(), Some("/srv"));
        assert_eq!(docker.ports, ["http", "admin"]);
        assert_eq!(docker.port_map, BTreeMap::from([("admin".to_string(), 9090), ("http".to_string(), 8080)]));
        assert_eq!(docker.network_mode.as_deref(), Some("host"));
        assert_eq!(docker.volumes, ["local/data:/data", "/etc/ssl:/etc/ssl:ro"]);
        let mount = |kind, source: &str, target: &str, readonly| DockerMount {
            kind,
            source: source.to_string(),
            target: target.to_string(),
            readonly,
        };
        assert_eq!(
            docker.mounts,
            [
                mount(MountKind::Bind, "local/conf", "/conf", true),
                mount(MountKind::Volume, "cache", "/cache", false),
                mount(MountKind::Tmpfs, "", "/scratch", false),
            ],
            "mount, then mounts; the type defaults to volume"
        );
        assert_eq!(docker.labels, texts(&[("team", "web"), ("tier", "2")]));
        assert_eq!(docker.hostname.as_deref(), Some("web-1"));
        assert_eq!(docker.extra_hosts, ["db:10.0.0.7"]);
        assert_eq!((docker.dns_servers, docker.dns_search_domains), (vec!["10.0.0.2".into()], vec!["example".into()]));
        assert_eq!(docker.dns_options, ["ndots:2"]);
        let flags = [docker.privileged, docker.force_pull, docker.readonly_rootfs, docker.init, docker.tty];
        assert_eq!(flags, [true, true, true, true, false]);
        assert!(docker.interactive);
        assert_eq!(docker.image_pull_timeout, Duration::from_secs(5400));
        let auth = DockerAuth {
            username: "u".into(),
            password: "p".into(),
            email: "e@example".into(),
            server_address: "registry.example".into(),
        };
        assert_eq!(docker.auth, Some(auth));
        assert_eq!((docker.cap_add, docker.cap_drop), (vec!["NET_ADMIN".into()], vec!["ALL".into()]));
        let logging =
            DockerLogging { kind: "json-file".into(), config: texts(&[("max-file", "3"), ("max-size", "10m")]) };
        assert_eq!(docker.logging, Some(logging));
        assert_eq!((docker.pids_limit, docker.shm_size, docker.memory_hard_limit), (100, 64 << 20, 512));
        assert_eq!(docker.sysctl, texts(&[("net.core.somaxconn", "16384")]));
        assert_eq!(docker.ulimit, texts(&[("nofile", "1024:2048"), ("nproc", "64")]));
        assert!(docker.ignored.is_empty(), "{:?}", docker.ignored);
    }

    #[test]
    fn defaults_are_nomads() {
        let docker = read(json!({"image": "busybox"}));
        assert_eq!(docker.image_pull_timeout, DEFAULT_IMAGE_PULL_TIMEOUT);
        assert_eq!((docker.entrypoint, docker.auth, docker.logging), (None, None, None));
        assert!(!docker.privileged && docker.mounts.is_empty());
    }

    #[test]
    fn hcl1_block_lists_read_as_the_plain_blocks() {
        let plain = read(json!({"image": "busybox", "labels": {"a": "b"}, "port_map": {"http": 8080},
            "auth": {"username": "u"}, "logging": {"type": "syslog", "config": {"tag": "web"}},
            "sysctl": {"k": "v"}, "ulimit": {"nofile": "10"}, "mounts": {"target": "/t", "source": "s"}}));
        let listed = read(json!({"image": "busybox", "labels": [{"a": "b"}], "port_map": [{"http": "8080"}],
            "auth": [{"username": "u"}], "logging": [{"type": "syslog", "config": [{"tag": "web"}]}],
            "sysctl": [{"k": "v"}], "ulimit": [{"nofile": 10}], "mounts": [{"target": "/t", "source": "s"}]}));
        assert_eq!(plain, listed);
        assert_eq!(plain.mounts.len(), 1);
        let legacy = read(json!({"image": "busybox", "logging": [{"driver": "gelf"}]}));
        assert_eq!(legacy.logging.map(|logging| logging.kind), Some("gelf".to_string()), "Nomad's older key");
        let both = read(json!({"image": "busybox", "logging": {"driver": "gelf", "type": "local"}}));
        assert_eq!(both.logging.map(|logging| logging.kind), Some("local".to_string()), "type wins");
        let spread = read(json!({"image": "busybox", "labels": [{"a": "1"}, {"b": "2", "a": "3"}]}));
        assert_eq!(spread.labels, texts(&[("a", "3"), ("b", "2")]), "HCL1's maps read in order");
    }

    #[test]
    fn every_problem_is_named_together() {
        let found = problems(json!({
            "image": "", "command": ["sh"], "args": "-c", "port_map": {"http": "x", "admin": 70000, "zero": 0},
            "privileged": "yes", "pids_limit": -1, "shm_size": 1.5, "image_pull_timeout": "5 minutes",
            "volumes": ["data", "a:b:c:d", ":/x"], "ulimit": {"nofile": "2048:1024", "nproc": "many"},
            "mount": [{"type": "nfs", "target": "/n"}, {"type": "bind", "target": "/b"},
                      {"type": "tmpfs", "source": "x", "target": "/t"}, {"source": "v"}, "bad"],
            "auth": [{"username": "a"}, {"username": "b"}], "labels": ["x"], "cap_add": "NET_ADMIN",
            "logging": {"config": {"nested": {"x": 1}}}, "tty": 1
        }));
        let expected = [
            "config.args must be a list of strings, not a string",
            "config.auth must be one block, not 2",
            "config.cap_add must be a list of strings, not a string",
            "config.command must be a string, not a list",
            "config.image is empty: name the image to run",
            "config.image_pull_timeout must be a duration such as \"5m\" (duration \"5 minutes\": unknown unit \" minutes\" (use h, m, s, ms, us or ns))",
            "config.labels[0] must be a map, not a string",
            "config.logging.config.nested must be a string, not a map",
            "config.mount[0].type must be bind, volume or tmpfs, not \"nfs\"",
            "config.mount[1].source is required: the host path",
            "config.mount[2].source must be empty for a tmpfs mount",
            "config.mount[3].target is required: where in the container to mount",
            "config.mount[4] must be a mount block, not a string",
            "config.pids_limit must not be negative (got -1)",
            "config.port_map.admin must be a port number (1-65535), not 70000",
            "config.port_map.http must be a port number (1-65535), not \"x\"",
            "config.port_map.zero must be a port number (1-65535), not 0",
            "config.privileged must be true or false, not \"yes\"",
            "config.shm_size must be a whole number, not 1.5",
            "config.tty must be true or false, not 1",
            "config.ulimit.nofile: the soft limit 2048 is above the hard limit 1024",
            "config.ulimit.nproc must be \"n\" or \"soft:hard\" with whole numbers, not \"many\"",
            "config.volumes[0] must be \"source:destination[:mode]\", not \"data\"",
            "config.volumes[1] must be \"source:destination[:mode]\", not \"a:b:c:d\"",
            "config.volumes[2] must be \"source:destination[:mode]\", not \":/x\"",
        ];
        assert_eq!(found, expected);
        assert_eq!(problems(json!({"command": "sh"})), ["config.image is required for the docker driver"]);
        assert!(read(json!({"image": "busybox", "ulimit": {"memlock": "-1:-1", "core": "0:-1"}})).ulimit.len() == 2);
    }

    #[test]
    fn ignored_keys_are_sorted_into_nomads_and_unknown() {
        let docker = read(json!({"image": "busybox", "devices": [{"host_path": "/dev/fuse"}], "runtime": "runsc",
            "colour": "blue", "auth_soft_fail": true,
            "mount": {"type": "bind", "source": "s", "target": "/t", "bind_options": {"propagation": "rshared"},
                      "speed": "fast"},
            "auth": {"username": "u", "token": "x"}, "logging": {"type": "local", "mode": "non-blocking"}}));
        let ignored: Vec<(&str, &str)> = docker.ignored.iter().map(|(key, why)| (key.as_str(), *why)).collect();
        assert_eq!(
            ignored,
            [
                ("auth.token", NOT_DOCKER),
                ("auth_soft_fail", NOT_IMPLEMENTED),
                ("colour", NOT_DOCKER),
                ("devices", NOT_IMPLEMENTED),
                ("logging.mode", NOT_DOCKER),
                ("mount.bind_options", NOT_IMPLEMENTED),
                ("mount.speed", NOT_DOCKER),
                ("runtime", NOT_IMPLEMENTED),
            ]
        );
        assert_eq!(docker.mounts.len(), 1, "an ignored key does not drop its mount");
        let listed =
            read(json!({"image": "busybox", "mounts": [{"target": "/t", "source": "v", "volume_options": {}}]}));
        assert_eq!(listed.ignored, [("mounts[0].volume_options".to_string(), NOT_IMPLEMENTED)]);
        assert_eq!(NOT_IMPLEMENTED, "is not implemented by Drover");
        assert_eq!(NOT_DOCKER, "is not a docker setting");
    }

    #[test]
    fn variables_are_left_to_the_client_at_submission_only() {
        let submitted = config(json!({"image": "web:${NOMAD_META_version}",
            "port_map": {"http": "${NOMAD_PORT_http}"}, "privileged": "${NOMAD_META_privileged}",
            "pids_limit": "${NOMAD_META_pids}", "image_pull_timeout": "${NOMAD_META_timeout}",
            "volumes": ["${NOMAD_META_volume}"], "ulimit": {"nofile": "${NOMAD_META_files}"},
            "mount": {"type": "${NOMAD_META_kind}", "target": "/t"}, "runtime": "runsc"}));
        let (found, ignored) = DockerConfig::submission_problems(&submitted);
        assert!(found.is_empty(), "{found:?}");
        assert_eq!(ignored, [("runtime".to_string(), NOT_IMPLEMENTED)]);
        let strict = DockerConfig::from_config(&submitted).expect_err("not filled in");
        assert_eq!(strict.len(), 7, "{strict:?}");
        assert!(strict
            .contains(&"config.port_map.http must be a port number (1-65535), not \"${NOMAD_PORT_http}\"".to_string()));
        let (still_wrong, _) = DockerConfig::submission_problems(&config(json!({"privileged": "yes"})));
        assert_eq!(
            still_wrong,
            ["config.privileged must be true or false, not \"yes\"", "config.image is required for the docker driver"]
        );
    }

    #[test]
    fn image_references_take_latest_when_no_tag_is_written() {
        let reference = |image: &str| {
            let (repository, tag) = read(json!({"image": image})).image_reference();
            (repository, tag)
        };
        let pair = |repository: &str, tag: &str| (repository.to_string(), tag.to_string());
        assert_eq!(reference("busybox"), pair("busybox", "latest"));
        assert_eq!(reference("busybox:1.36"), pair("busybox", "1.36"));
        assert_eq!(reference("registry:5000/app"), pair("registry:5000/app", "latest"), "a port, not a tag");
        assert_eq!(reference("registry:5000/team/app:v2"), pair("registry:5000/team/app", "v2"));
        assert_eq!(reference("https://hub.internal/redis:7"), pair("hub.internal/redis", "7"));
        assert_eq!(reference("app@sha256:abcd"), pair("app@sha256:abcd", ""), "pulled by digest");
        assert_eq!(reference("registry:5000/app:1@sha256:abcd"), pair("registry:5000/app:1@sha256:abcd", ""));
        assert_eq!(reference("app:"), pair("app", "latest"));
        assert_eq!(problems(json!({"image": "https://"})), ["config.image is empty: name the image to run"]);
        assert_eq!(problems(json!({"image": ["busybox"]})), ["config.image must be a string, not a list"]);
    }
}
