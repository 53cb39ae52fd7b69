//! How a task's container is made, as Nomad's docker driver makes it
//! (a pure function of the task, its allocation and the client's
//! settings, so every rule here is tested without a daemon):
//!
//! - Name `<task>-<alloc id>`; labels: the task's, then
//!   `com.hashicorp.nomad.alloc_id`, `com.hashicorp.nomad.task_name` and
//!   the job's and group's names.
//! - The allocation's directories bound at `/alloc`, the task's `local/`
//!   at `/local`, `secrets/` at `/secrets`; then `volumes` and `mount`s
//!   (host paths outside the allocation only with `volumes.enabled`).
//! - Memory: `memory` MiB is the limit, or the reservation when
//!   `memory_max` (or the older `memory_hard_limit`) sets a larger hard
//!   limit; no swap. CPU: `cpu` MHz as CPU shares.
//! - Ports: each label in `ports` (or, without it, every port of the
//!   allocation) published on its host address and port, to the port the
//!   task listens on (`to`, or `port_map`, or the host port), for TCP and
//!   UDP alike; none in `host` or `none` network mode.
//! - `privileged` and capabilities only as the client allows them; the
//!   capabilities Docker grants by default beyond the allowed ones are
//!   dropped, so a task never has one the operator did not allow.
//! - Docker's own copy of the logs is kept small (json-file, two files of
//!   2 MiB) unless the task says otherwise: the agent keeps the logs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Component, Path};

use bollard::models::{
    ContainerCreateBody, HostConfig, HostConfigLogConfig, Mount, MountType, PortBinding, ResourcesUlimits,
};
use engine::structs::{Allocation, DockerConfig, MountKind, Task};

use super::DockerSettings;
use crate::client::alloc_dir::AllocDir;

/// The label naming a container's allocation.
pub const ALLOC_ID_LABEL: &str = "com.hashicorp.nomad.alloc_id";

/// The capabilities Docker gives a container unless told otherwise.
const DOCKER_DEFAULT_CAPS: [&str; 14] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "NET_RAW",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Everything a container is made from.
pub struct Spec<'a> {
    /// The allocation.
    pub alloc: &'a Allocation,
    /// The task.
    pub task: &'a Task,
    /// The allocation's directories.
    pub dir: &'a AllocDir,
    /// The task's config, interpolated and read.
    pub config: &'a DockerConfig,
    /// The container's environment.
    pub env: &'a BTreeMap<String, String>,
    /// The client's settings.
    pub settings: &'a DockerSettings,
}

/// The container's name and how to create it, or why the task cannot run
/// here as written.
pub fn build(spec: &Spec<'_>) -> Result<(String, ContainerCreateBody), String> {
    let Spec { alloc, task, dir, config, env, settings } = spec;
    let name = format!("{}-{}", task.name.replace('/', "_"), alloc.id);
    if config.privileged && !settings.allow_privileged {
        return Err("Docker privileged mode is disabled on this Nomad agent".to_string());
    }
    let (cap_add, cap_drop) = capabilities(config, &settings.allow_caps)?;
    let mut binds = vec![
        format!("{}:/alloc", dir.shared_dir().display()),
        format!("{}:/local", dir.task_local_dir(&task.name).display()),
        format!("{}:/secrets", dir.task_secrets_dir(&task.name).display()),
    ];
    for volume in &config.volumes {
        binds.push(bind(volume, dir, &task.name, settings.volumes_enabled)?);
    }
    let mounts = config
        .mounts
        .iter()
        .map(|mount| docker_mount(mount, dir, &task.name, settings.volumes_enabled))
        .collect::<Result<Vec<_>, _>>()?;
    let network_mode = config.network_mode.clone().unwrap_or_else(|| "bridge".to_string());
    let (exposed_ports, port_bindings) = ports(alloc, config, &network_mode)?;
    let hard_limit = task.memory_max_mb.max(config.memory_hard_limit);
    let (memory, reservation) = if hard_limit > task.resources.memory_mb {
        (hard_limit, Some(task.resources.memory_mb))
    } else {
        (task.resources.memory_mb, None)
    };
    let memory_bytes = mib(memory);
    let mut labels: HashMap<String, String> = config.labels.clone().into_iter().collect();
    labels.insert(ALLOC_ID_LABEL.to_string(), alloc.id.to_string());
    labels.insert("com.hashicorp.nomad.task_name".to_string(), task.name.clone());
    labels.insert("com.hashicorp.nomad.task_group_name".to_string(), alloc.task_group.to_string());
    labels.insert("com.hashicorp.nomad.job_id".to_string(), alloc.job_id.to_string());
    labels.insert("com.hashicorp.nomad.namespace".to_string(), alloc.namespace.to_string());
    let log_config = match &config.logging {
        Some(logging) => HostConfigLogConfig {
            typ: Some(if logging.kind.is_empty() { "json-file".to_string() } else { logging.kind.clone() }),
            config: Some(logging.config.clone().into_iter().collect()),
        },
        None => HostConfigLogConfig {
            typ: Some("json-file".to_string()),
            config: Some(HashMap::from([
                ("max-file".to_string(), "2".to_string()),
                ("max-size".to_string(), "2m".to_string()),
            ])),
        },
    };
    let ulimits = config.ulimit.iter().map(|(name, value)| ulimit(name, value)).collect::<Result<Vec<_>, _>>()?;
    let non_empty = |list: &Vec<String>| (!list.is_empty()).then(|| list.clone());
    let host_config = HostConfig {
        binds: Some(binds),
        mounts: (!mounts.is_empty()).then_some(mounts),
        memory: Some(memory_bytes),
        memory_reservation: reservation.map(mib),
        memory_swap: Some(memory_bytes),
        cpu_shares: Some(i64::try_from(task.resources.cpu).unwrap_or(i64::MAX)),
        network_mode: Some(network_mode),
        port_bindings: (!port_bindings.is_empty()).then_some(port_bindings),
        privileged: Some(config.privileged),
        cap_add: non_empty(&cap_add),
        cap_drop: non_empty(&cap_drop),
        dns: non_empty(&config.dns_servers),
        dns_search: non_empty(&config.dns_search_domains),
        dns_options: non_empty(&config.dns_options),
        extra_hosts: non_empty(&config.extra_hosts),
        log_config: Some(log_config),
        readonly_rootfs: config.readonly_rootfs.then_some(true),
        init: config.init.then_some(true),
        pids_limit: (config.pids_limit > 0).then_some(config.pids_limit),
        shm_size: (config.shm_size > 0).then_some(config.shm_size),
        sysctls: (!config.sysctl.is_empty()).then(|| config.sysctl.clone().into_iter().collect()),
        ulimits: (!ulimits.is_empty()).then_some(ulimits),
        ..HostConfig::default()
    };
    let cmd = match &config.command {
        Some(command) => Some(std::iter::once(command.clone()).chain(config.args.iter().cloned()).collect()),
        None if !config.args.is_empty() => Some(config.args.clone()),
        None => None,
    };
    let body = ContainerCreateBody {
        image: Some(image(config)),
        cmd,
        entrypoint: config.entrypoint.clone(),
        env: Some(env.iter().map(|(key, value)| format!("{key}={value}")).collect()),
        working_dir: config.work_dir.clone(),
        hostname: config.hostname.clone(),
        user: task.user.clone(),
        labels: Some(labels),
        exposed_ports: (!exposed_ports.is_empty()).then_some(exposed_ports),
        tty: config.tty.then_some(true),
        open_stdin: config.interactive.then_some(true),
        host_config: Some(host_config),
        ..ContainerCreateBody::default()
    };
    Ok((name, body))
}

/// The image as the engine names it: `repo:tag`, or `repo@digest`.
pub fn image(config: &DockerConfig) -> String {
    match config.image_reference() {
        (repo, tag) if tag.is_empty() => repo,
        (repo, tag) => format!("{repo}:{tag}"),
    }
}

fn mib(megabytes: u64) -> i64 {
    i64::try_from(megabytes.saturating_mul(1024 * 1024)).unwrap_or(i64::MAX)
}

/// `cap_add` and `cap_drop` checked against `allowed`: the capabilities
/// the container would have (Docker's defaults, plus added, less dropped)
/// must all be allowed; Docker's defaults that are not allowed are
/// dropped. Nomad's rule and message.
fn capabilities(config: &DockerConfig, allowed: &[String]) -> Result<(Vec<String>, Vec<String>), String> {
    let normal = |cap: &String| cap.trim().to_uppercase().trim_start_matches("CAP_").to_string();
    let allowed: BTreeSet<String> = allowed.iter().map(normal).collect();
    let all_allowed = allowed.contains("ALL");
    let add: Vec<String> = config.cap_add.iter().map(normal).collect();
    let drop: Vec<String> = config.cap_drop.iter().map(normal).collect();
    if !all_allowed {
        let mut missing: Vec<&str> = if add.iter().any(|cap| cap == "ALL") {
            vec!["ALL"]
        } else {
            add.iter().filter(|cap| !allowed.contains(*cap)).map(String::as_str).collect()
        };
        missing.sort_unstable();
        missing.dedup();
        if !missing.is_empty() {
            return Err(format!(
                "Docker driver does not have the following caps allow-listed on this Nomad agent: {}",
                missing.join(", ")
            ));
        }
    }
    let mut cap_drop = drop.clone();
    if !all_allowed && !drop.iter().any(|cap| cap == "ALL") {
        for cap in DOCKER_DEFAULT_CAPS {
            if !allowed.contains(cap) && !add.iter().any(|added| added == cap) && !drop.iter().any(|d| d == cap) {
                cap_drop.push(cap.to_string());
            }
        }
    }
    Ok((add, cap_drop))
}

/// A `volumes` entry (`src:dst[:mode]`) as a bind: a relative source is
/// in the task directory and may not leave the allocation's; an absolute
/// one needs `volumes.enabled`.
fn bind(volume: &str, dir: &AllocDir, task: &str, volumes_enabled: bool) -> Result<String, String> {
    let mut parts = volume.splitn(3, ':');
    let (Some(source), Some(target)) = (parts.next(), parts.next()) else {
        return Err(format!("config.volumes: {volume:?} is not src:dst[:mode]"));
    };
    let mode = parts.next();
    let source = host_path(source, dir, task, volumes_enabled).map_err(|why| format!("config.volumes: {why}"))?;
    Ok(match mode {
        Some(mode) => format!("{source}:{target}:{mode}"),
        None => format!("{source}:{target}"),
    })
}

/// A host path a task names: relative ones in its task directory, kept
/// inside the allocation's directory; absolute ones only when the client
/// enables volumes.
fn host_path(source: &str, dir: &AllocDir, task: &str, volumes_enabled: bool) -> Result<String, String> {
    let path = Path::new(source);
    if path.is_absolute() {
        if !volumes_enabled {
            return Err(format!(
                "{source:?}: volumes are not enabled on this client; only paths in the task directory"
            ));
        }
        return Ok(source.to_string());
    }
    let mut depth: i32 = 1; // the task directory is one below the allocation's
    for component in path.components() {
        match component {
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            _ => {}
        }
        if depth < 0 {
            return Err(format!("{source:?} leaves the allocation's directory"));
        }
    }
    Ok(dir.task_dir(task).join(path).display().to_string())
}

fn docker_mount(
    mount: &engine::structs::DockerMount,
    dir: &AllocDir,
    task: &str,
    volumes_enabled: bool,
) -> Result<Mount, String> {
    let (typ, source) = match mount.kind {
        MountKind::Bind => (MountType::BIND, Some(host_path(&mount.source, dir, task, volumes_enabled)?)),
        MountKind::Volume if !volumes_enabled => {
            return Err(format!("config.mount {:?}: volume mounts need volumes enabled on this client", mount.target))
        }
        MountKind::Volume => (MountType::VOLUME, Some(mount.source.clone())),
        MountKind::Tmpfs => (MountType::TMPFS, None),
    };
    Ok(Mount {
        target: Some(mount.target.clone()),
        source,
        typ: Some(typ),
        read_only: Some(mount.readonly),
        ..Mount::default()
    })
}

/// Docker's port bindings: `"8080/tcp"` to the host addresses and ports.
type PortBindings = HashMap<String, Option<Vec<PortBinding>>>;

/// The ports to publish: `(exposed, bindings)`.
fn ports(alloc: &Allocation, config: &DockerConfig, network_mode: &str) -> Result<(Vec<String>, PortBindings), String> {
    let mut exposed = Vec::new();
    let mut bindings = PortBindings::new();
    for label in &config.ports {
        if !alloc.ports.iter().any(|port| *port.label == **label) {
            return Err(format!("Port {label:?} not found, check network stanza"));
        }
    }
    if matches!(network_mode, "host" | "none") || network_mode.starts_with("container:") {
        return Ok((exposed, bindings));
    }
    let published =
        alloc.ports.iter().filter(|port| config.ports.is_empty() || config.ports.iter().any(|l| *l == *port.label));
    for port in published {
        let inside = match config.port_map.get(&*port.label) {
            Some(mapped) => *mapped,
            None if port.to > 0 => port.to,
            None => port.value,
        };
        for protocol in ["tcp", "udp"] {
            let key = format!("{inside}/{protocol}");
            let binding =
                PortBinding { host_ip: Some(port.host_ip.to_string()), host_port: Some(port.value.to_string()) };
            bindings.entry(key.clone()).or_insert_with(|| Some(Vec::new())).get_or_insert_with(Vec::new).push(binding);
            if !exposed.contains(&key) {
                exposed.push(key);
            }
        }
    }
    Ok((exposed, bindings))
}

/// One `ulimit` entry: `"n"` or `"soft:hard"`.
fn ulimit(name: &str, value: &str) -> Result<ResourcesUlimits, String> {
    let number = |text: &str| {
        text.trim().parse::<i64>().map_err(|_| format!("config.ulimit.{name}: {value:?} is not \"n\" or \"soft:hard\""))
    };
    let (soft, hard) = match value.split_once(':') {
        Some((soft, hard)) => (number(soft)?, number(hard)?),
        None => (number(value)?, number(value)?),
    };
    Ok(ResourcesUlimits { name: Some(name.to_string()), soft: Some(soft), hard: Some(hard) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::structs::{AllocatedPort, ConfigValue, EvalId, Job, JobType, NodeId, Resources};
    use std::sync::Arc;

    fn fixture(config: &str) -> (Allocation, Task, DockerConfig) {
        let job = Arc::new(Job::new_simple("web", JobType::Service, 1, Resources::new(500, 256, 0)));
        let mut task = job.task_groups[0].tasks[0].clone();
        task.driver = "docker".to_string();
        task.config = serde_json::from_str::<BTreeMap<String, ConfigValue>>(config).expect("a config");
        let group = job.task_groups[0].name.clone();
        let mut alloc = Allocation::new_placement(&job, &group, 0, NodeId::from_u128(1), EvalId::from_u128(1));
        alloc.ports = vec![
            AllocatedPort { label: Arc::from("http"), value: 23456, to: 8080, host_ip: Arc::from("10.0.0.5") },
            AllocatedPort { label: Arc::from("admin"), value: 23457, to: 0, host_ip: Arc::from("10.0.0.5") },
        ];
        let docker = DockerConfig::from_task(&task).expect("valid");
        (alloc, task, docker)
    }

    fn made(
        alloc: &Allocation,
        task: &Task,
        config: &DockerConfig,
        settings: &DockerSettings,
    ) -> Result<(String, ContainerCreateBody), String> {
        let dir = AllocDir::new(Path::new("/data"), alloc.id);
        let env = BTreeMap::from([("NOMAD_TASK_NAME".to_string(), task.name.clone())]);
        build(&Spec { alloc, task, dir: &dir, config, env: &env, settings })
    }

    #[test]
    fn a_container_is_made_as_nomad_makes_it() {
        let (alloc, mut task, config) = fixture(
            r#"{"image": "app:1.2", "command": "/bin/app", "args": ["-p", "8080"], "ports": ["http"],
                "labels": {"team": "web"}}"#,
        );
        task.user = Some("nobody".to_string());
        let (name, body) = made(&alloc, &task, &config, &DockerSettings::default()).expect("made");
        assert_eq!(name, format!("{}-{}", task.name, alloc.id));
        assert_eq!(body.image.as_deref(), Some("app:1.2"));
        assert_eq!(body.cmd, Some(vec!["/bin/app".to_string(), "-p".to_string(), "8080".to_string()]));
        assert_eq!(body.user.as_deref(), Some("nobody"));
        let labels = body.labels.expect("labels");
        assert_eq!(labels[ALLOC_ID_LABEL], alloc.id.to_string());
        assert_eq!(labels["team"], "web");
        let host = body.host_config.expect("host config");
        let binds = host.binds.expect("binds");
        assert_eq!(binds[0], format!("/data/alloc/{}/alloc:/alloc", alloc.id));
        assert!(binds[1].ends_with("/local:/local") && binds[2].ends_with("/secrets:/secrets"), "{binds:?}");
        assert_eq!(host.memory, Some(256 * 1024 * 1024));
        assert_eq!(host.memory_swap, host.memory, "no swap");
        assert_eq!(host.memory_reservation, None);
        assert_eq!(host.cpu_shares, Some(500));
        assert_eq!(host.network_mode.as_deref(), Some("bridge"));
        let bindings = host.port_bindings.expect("ports");
        assert_eq!(bindings.len(), 2, "only http, for tcp and udp: {bindings:?}");
        let tcp = bindings["8080/tcp"].as_ref().expect("bound");
        assert_eq!(tcp[0].host_port.as_deref(), Some("23456"));
        assert_eq!(tcp[0].host_ip.as_deref(), Some("10.0.0.5"));
        assert!(host.cap_drop.expect("drops").contains(&"NET_RAW".to_string()), "not in Nomad's allow-list");
    }

    #[test]
    fn memory_max_is_the_hard_limit_and_memory_the_reservation() {
        let (alloc, mut task, config) = fixture(r#"{"image": "app:1"}"#);
        task.memory_max_mb = 512;
        let (_, body) = made(&alloc, &task, &config, &DockerSettings::default()).expect("made");
        let host = body.host_config.expect("host config");
        assert_eq!((host.memory, host.memory_reservation), (Some(512 << 20), Some(256 << 20)));
        let (_, body) =
            made(&alloc, &task, &DockerConfig { memory_hard_limit: 1024, ..config }, &DockerSettings::default())
                .expect("made");
        assert_eq!(body.host_config.expect("host").memory, Some(1024 << 20), "the larger of the two");
    }

    #[test]
    fn ports_without_a_list_publish_every_port_and_port_map_moves_them() {
        let (alloc, task, config) = fixture(r#"{"image": "app:1", "port_map": {"admin": 9000}}"#);
        let (_, body) = made(&alloc, &task, &config, &DockerSettings::default()).expect("made");
        let bindings = body.host_config.expect("host").port_bindings.expect("ports");
        assert!(bindings.contains_key("8080/udp") && bindings.contains_key("9000/tcp"), "{bindings:?}");
        let (alloc, task, config) = fixture(r#"{"image": "app:1", "ports": ["nope"]}"#);
        let error = made(&alloc, &task, &config, &DockerSettings::default()).expect_err("unknown label");
        assert_eq!(error, "Port \"nope\" not found, check network stanza");
        let (alloc, task, config) = fixture(r#"{"image": "app:1", "network_mode": "host"}"#);
        let (_, body) = made(&alloc, &task, &config, &DockerSettings::default()).expect("made");
        assert!(body.host_config.expect("host").port_bindings.is_none(), "host mode publishes nothing");
    }

    #[test]
    fn privileged_capabilities_and_host_paths_only_as_the_client_allows() {
        let settings = DockerSettings::default();
        let (alloc, task, config) = fixture(r#"{"image": "app:1", "privileged": true}"#);
        let error = made(&alloc, &task, &config, &settings).expect_err("refused");
        assert_eq!(error, "Docker privileged mode is disabled on this Nomad agent");
        let allowing = DockerSettings { allow_privileged: true, ..settings.clone() };
        assert!(made(&alloc, &task, &config, &allowing).is_ok());
        let (alloc, task, config) =
            fixture(r#"{"image": "app:1", "cap_add": ["SYS_ADMIN", "cap_net_raw"], "cap_drop": ["CHOWN"]}"#);
        let error = made(&alloc, &task, &config, &settings).expect_err("refused");
        assert!(error.ends_with("NET_RAW, SYS_ADMIN"), "{error}");
        let all = DockerSettings { allow_caps: vec!["ALL".to_string()], ..settings.clone() };
        let (_, body) = made(&alloc, &task, &config, &all).expect("all allowed");
        let host = body.host_config.expect("host");
        assert_eq!(host.cap_add, Some(vec!["SYS_ADMIN".to_string(), "NET_RAW".to_string()]));
        assert_eq!(host.cap_drop, Some(vec!["CHOWN".to_string()]));
        let (alloc, task, config) = fixture(r#"{"image": "app:1", "volumes": ["/etc:/host-etc:ro"]}"#);
        assert!(made(&alloc, &task, &config, &settings).expect_err("refused").contains("volumes are not enabled"));
        let enabled = DockerSettings { volumes_enabled: true, ..settings.clone() };
        let (_, body) = made(&alloc, &task, &config, &enabled).expect("allowed");
        assert!(body.host_config.expect("host").binds.expect("binds").contains(&"/etc:/host-etc:ro".to_string()));
        let (alloc, task, config) = fixture(r#"{"image": "app:1", "volumes": ["local/data:/data", "../../../x:/x"]}"#);
        let error = made(&alloc, &task, &config, &settings).expect_err("escapes");
        assert!(error.contains("leaves the allocation's directory"), "{error}");
        let (alloc, task, config) = fixture(r#"{"image": "app:1", "volumes": ["../alloc/data:/shared"]}"#);
        let (_, body) = made(&alloc, &task, &config, &settings).expect("inside the allocation");
        let binds = body.host_config.expect("host").binds.expect("binds");
        assert!(binds[3].ends_with(&format!("/{}/../alloc/data:/shared", task.name)), "{binds:?}");
    }
}
