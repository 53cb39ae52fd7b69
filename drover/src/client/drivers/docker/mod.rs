//! The `docker` driver: a task is a container on the machine's Docker
//! Engine, driven through its API over the daemon's Unix socket (bollard).
//!
//! - Start: the image is used when present (unless `force_pull`, or its
//!   tag is `latest`, as Nomad), else pulled within `image_pull_timeout`;
//!   the container is created as Nomad names and labels it
//!   (`<task>-<alloc id>`, `com.hashicorp.nomad.alloc_id`), see
//!   `container.rs`, and started. A container of that name left from
//!   before is adopted when it runs, removed when it does not.
//! - Logs: the container's stdout and stderr are copied into the
//!   allocation's rotated log files (`logs.rs`), so `alloc logs` and
//!   `alloc fs` read them as for raw_exec.
//! - Wait: the daemon's wait, then an inspection for the exit code and the
//!   OOM kill. A daemon that stops answering does not end the task: the
//!   wait is taken up again once it answers. A container that has ended is
//!   removed once its exit and its last logs are recorded.
//! - Stop: the task's `kill_signal`, `kill_timeout`, then SIGKILL; a task
//!   without a `kill_signal` gets Docker's stop (the image's stop signal,
//!   SIGTERM unless it names one), as Nomad.
//! - Re-attach: the container is found again by the id saved in the state
//!   file; one that runs is kept, one that ended is reported and removed,
//!   one that is gone is lost.
//! - Health: every `health_check_interval` the daemon is asked its version;
//!   the answer (or the lack of one) becomes the node's `driver.docker*`
//!   attributes, which the agent re-registers when they change.

mod container;
mod logs;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, InspectContainerOptions, KillContainerOptionsBuilder,
    ListContainersOptionsBuilder, RemoveContainerOptionsBuilder, StopContainerOptionsBuilder,
    WaitContainerOptionsBuilder,
};
use engine::structs::{Allocation, DockerConfig, Task, TaskEvent};
use futures_lite::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::client::alloc_dir::AllocDir;
use crate::client::drivers::executor::ExitRecord;
use crate::client::drivers::{Reattached, StartError};
use crate::client::task_env::TaskEnv;

pub use container::ALLOC_ID_LABEL;

/// The daemon's socket when the configuration names none.
pub const DEFAULT_ENDPOINT: &str = "unix:///var/run/docker.sock";

/// The capabilities a task may have unless the client configures others:
/// Nomad's default `allow_caps`.
pub const DEFAULT_ALLOW_CAPS: [&str; 13] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "FSETID",
    "FOWNER",
    "MKNOD",
    "SETGID",
    "SETUID",
    "SETFCAP",
    "SETPCAP",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
    "KILL",
    "AUDIT_WRITE",
];

/// How a request to the daemon may take before it is given up (a pull and
/// a wait are bounded otherwise).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a health check waits for the daemon's answer.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(5);

/// The client's settings for the driver (`[plugin.docker.config]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DockerSettings {
    /// The daemon: `unix:///path` (default [`DEFAULT_ENDPOINT`], or
    /// `DOCKER_HOST` when it names a Unix socket).
    pub endpoint: String,
    /// Tasks may ask for privileged mode (Nomad's `allow_privileged`).
    pub allow_privileged: bool,
    /// The capabilities a task may end up with (`ALL` allows any).
    pub allow_caps: Vec<String>,
    /// Tasks may bind host paths and use named volumes (Nomad's
    /// `volumes { enabled = true }`); without it only paths inside the
    /// allocation's directory.
    pub volumes_enabled: bool,
    /// How often the daemon's health is checked (Nomad fingerprints every
    /// 30 s).
    pub health_check_interval: Duration,
}

impl Default for DockerSettings {
    fn default() -> DockerSettings {
        let endpoint = std::env::var("DOCKER_HOST")
            .ok()
            .filter(|host| host.starts_with("unix://"))
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        DockerSettings {
            endpoint,
            allow_privileged: false,
            allow_caps: DEFAULT_ALLOW_CAPS.iter().map(|cap| cap.to_string()).collect(),
            volumes_enabled: false,
            health_check_interval: Duration::from_secs(30),
        }
    }
}

/// The driver.
pub struct Docker {
    settings: DockerSettings,
    /// The client, once a version was agreed with the daemon (the first
    /// time it answered).
    client: parking_lot::Mutex<Option<bollard::Docker>>,
    /// The node's `driver.docker*` attributes as of the last check.
    attributes: watch::Sender<BTreeMap<String, String>>,
}

impl std::fmt::Debug for Docker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Docker").field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// What identifies a task's container for good.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandleState {
    /// The container's id.
    #[serde(rename = "container_id")]
    pub id: String,
    /// The host pid of its init process (for resource usage).
    #[serde(rename = "container_pid")]
    pub pid: i32,
}

/// A running container.
pub struct TaskHandle {
    state: HandleState,
    docker: Arc<Docker>,
    /// The copy of its logs: ends once the container's streams close.
    logs: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for TaskHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskHandle").field("state", &self.state).finish_non_exhaustive()
    }
}

impl Docker {
    /// The driver for `settings`, its health checked once before this
    /// returns (so the node registers with what it found) and then every
    /// `health_check_interval` until the agent exits.
    pub async fn connect(settings: DockerSettings) -> Result<Arc<Docker>, String> {
        let path = settings
            .endpoint
            .strip_prefix("unix://")
            .ok_or_else(|| format!("endpoint {:?}: only unix:// sockets are supported", settings.endpoint))?
            .to_string();
        if path.is_empty() {
            return Err(format!("endpoint {:?} names no socket", settings.endpoint));
        }
        let (attributes, _) = watch::channel(BTreeMap::new());
        let docker = Arc::new(Docker { settings, client: parking_lot::Mutex::new(None), attributes });
        let mut reached = docker.check_health(&path, false).await;
        let weak = Arc::downgrade(&docker);
        let interval = docker.settings.health_check_interval;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let Some(docker) = weak.upgrade() else { return };
                reached = docker.check_health(&path, reached).await;
            }
        });
        Ok(docker)
    }

    /// The node's `driver.docker*` attributes, kept current.
    pub fn attributes(&self) -> watch::Receiver<BTreeMap<String, String>> {
        self.attributes.subscribe()
    }

    /// Asks the daemon its version (agreeing on an API version the first
    /// time) and publishes the attributes; returns whether it has ever
    /// answered.
    async fn check_health(&self, path: &str, reached_before: bool) -> bool {
        let found = tokio::time::timeout(HEALTH_TIMEOUT, self.probe(path))
            .await
            .unwrap_or_else(|_| Err(format!("no answer in {}s", HEALTH_TIMEOUT.as_secs())));
        let attributes = match found {
            Ok(attributes) => attributes,
            Err(error) if reached_before => {
                tracing::warn!(%error, "docker driver unhealthy: the daemon does not answer");
                BTreeMap::from([
                    ("driver.docker".to_string(), "0".to_string()),
                    // The same words whatever the error (it is logged):
                    // the attribute is part of the node's class.
                    ("driver.docker.health".to_string(), "Failed to connect to docker daemon".to_string()),
                ])
            }
            Err(error) => {
                tracing::debug!(%error, "docker driver not detected");
                BTreeMap::new()
            }
        };
        let healthy = attributes.get("driver.docker").is_some_and(|value| value == "1");
        self.attributes.send_if_modified(|current| {
            if *current == attributes {
                return false;
            }
            if healthy {
                tracing::info!(version = ?attributes.get("driver.docker.version"), "docker driver healthy");
            }
            *current = attributes;
            true
        });
        reached_before || healthy
    }

    async fn probe(&self, path: &str) -> Result<BTreeMap<String, String>, String> {
        let agreed = self.client.lock().clone();
        let client = match agreed {
            Some(client) => client,
            None => {
                let fresh =
                    bollard::Docker::connect_with_unix(path, REQUEST_TIMEOUT.as_secs(), bollard::API_DEFAULT_VERSION)
                        .map_err(|error| error.to_string())?;
                let agreed = fresh.negotiate_version().await.map_err(|error| error.to_string())?;
                *self.client.lock() = Some(agreed.clone());
                agreed
            }
        };
        let version = client.version().await.map_err(|error| error.to_string())?;
        let mut attributes = BTreeMap::from([
            ("driver.docker".to_string(), "1".to_string()),
            ("driver.docker.health".to_string(), "Healthy".to_string()),
            ("driver.docker.version".to_string(), version.version.unwrap_or_default()),
            ("driver.docker.os_type".to_string(), version.os.unwrap_or_else(|| "linux".to_string())),
        ]);
        if self.settings.allow_privileged {
            attributes.insert("driver.docker.privileged.enabled".to_string(), "1".to_string());
        }
        if self.settings.volumes_enabled {
            attributes.insert("driver.docker.volumes.enabled".to_string(), "1".to_string());
        }
        if let Ok(bridge) =
            client.inspect_network("bridge", None::<bollard::query_parameters::InspectNetworkOptions>).await
        {
            let gateway = bridge.ipam.and_then(|ipam| ipam.config).into_iter().flatten().find_map(|cfg| cfg.gateway);
            if let Some(gateway) = gateway {
                attributes.insert("driver.docker.bridge_ip".to_string(), gateway);
            }
        }
        Ok(attributes)
    }

    /// The client, or why the daemon cannot be used now.
    fn client(&self) -> Result<bollard::Docker, StartError> {
        self.client.lock().clone().ok_or_else(|| {
            StartError::Driver(format!("the docker daemon at {} has not answered yet", self.settings.endpoint))
        })
    }

    /// Runs `argv` inside container `id` (a script check); its exit code
    /// and output (stdout and stderr as they came).
    pub async fn exec(&self, id: &str, argv: Vec<String>) -> Result<(i64, String), String> {
        use bollard::exec::{CreateExecOptions, StartExecResults};
        let client = self.client().map_err(|error| error.to_string())?;
        let options = CreateExecOptions {
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            cmd: Some(argv),
            ..Default::default()
        };
        let exec = client.create_exec(id, options).await.map_err(|error| format!("docker exec in {id}: {error}"))?;
        const KEPT: usize = 4096;
        let mut kept = Vec::new();
        let started =
            client.start_exec(&exec.id, None).await.map_err(|error| format!("docker exec in {id}: {error}"))?;
        if let StartExecResults::Attached { mut output, .. } = started {
            // Kept up to 4 KiB (a check's output); the rest is read and dropped.
            while let Some(Ok(piece)) = output.next().await {
                let bytes = piece.as_ref();
                kept.extend_from_slice(&bytes[..bytes.len().min(KEPT.saturating_sub(kept.len()))]);
            }
        }
        let text = String::from_utf8_lossy(&kept).into_owned();
        let inspected = client.inspect_exec(&exec.id).await.map_err(|error| format!("docker exec in {id}: {error}"))?;
        Ok((inspected.exit_code.unwrap_or(-1), text))
    }

    /// Starts `task` of `alloc` in a container.
    pub async fn start(
        self: &Arc<Self>,
        alloc: &Allocation,
        task: &Task,
        dir: &AllocDir,
        env: &TaskEnv,
        events: &mut Vec<TaskEvent>,
    ) -> Result<TaskHandle, StartError> {
        crate::client::alloc_dir::check_name(&task.name).map_err(|error| StartError::Unrunnable(error.to_string()))?;
        let inside = env.in_container(&BTreeMap::new());
        let interpolation_env = inside.process_env(task, std::iter::empty(), &Default::default());
        let config = inside.interpolate_config(&task.config, &interpolation_env)?;
        let config =
            DockerConfig::from_config(&config).map_err(|problems| StartError::Unrunnable(problems.join("; ")))?;
        for (key, why) in &config.ignored {
            tracing::warn!(alloc = %alloc.id, task = %task.name, "config.{key} {why}: ignored");
        }
        let inside = env.in_container(&config.port_map);
        let process_env = inside.process_env(task, std::iter::empty(), &Default::default());
        let spec = container::Spec { alloc, task, dir, config: &config, env: &process_env, settings: &self.settings };
        let (name, body) = container::build(&spec).map_err(StartError::Unrunnable)?;
        let client = self.client()?;
        self.ensure_image(&client, &config, events).await?;
        let id = self.create(&client, &name, alloc, body).await?;
        let inspected = match client.inspect_container(&id, None::<InspectContainerOptions>).await {
            Ok(found) if found.state.as_ref().and_then(|state| state.running) == Some(true) => found,
            _ => {
                if let Err(error) = client.start_container(&id, None).await {
                    let _ = remove(&client, &id).await;
                    return Err(StartError::Driver(format!("failed to start container {name}: {}", message(&error))));
                }
                client
                    .inspect_container(&id, None::<InspectContainerOptions>)
                    .await
                    .map_err(|error| StartError::Driver(format!("inspecting container {name}: {}", message(&error))))?
            }
        };
        let pid = inspected.state.and_then(|state| state.pid).unwrap_or(0);
        let state = HandleState { id, pid: i32::try_from(pid).unwrap_or(0) };
        let logs = logs::follow(client, state.id.clone(), dir, &task.name, task.logs);
        Ok(TaskHandle { state, docker: self.clone(), logs: Some(logs) })
    }

    /// Makes sure the image is there: pulled when absent, forced, or
    /// tagged `latest`.
    async fn ensure_image(
        &self,
        client: &bollard::Docker,
        config: &DockerConfig,
        events: &mut Vec<TaskEvent>,
    ) -> Result<(), StartError> {
        let (repo, tag) = config.image_reference();
        let reference = container::image(config);
        if !config.force_pull && tag != "latest" && client.inspect_image(&reference).await.is_ok() {
            return Ok(());
        }
        let downloading = TaskEvent::new(TaskEvent::DRIVER, crate::client::clock::now(), "Downloading image")
            .with_detail("image", reference.clone());
        events.push(downloading);
        let credentials = config.auth.as_ref().map(|auth| bollard::auth::DockerCredentials {
            username: Some(auth.username.clone()).filter(|text| !text.is_empty()),
            password: Some(auth.password.clone()).filter(|text| !text.is_empty()),
            email: Some(auth.email.clone()).filter(|text| !text.is_empty()),
            serveraddress: Some(auth.server_address.clone()).filter(|text| !text.is_empty()),
            ..Default::default()
        });
        // A digest (`app@sha256:...`) is pulled as it is, with no tag.
        let options = match tag.as_str() {
            "" => CreateImageOptionsBuilder::new().from_image(&repo).build(),
            tag => CreateImageOptionsBuilder::new().from_image(&repo).tag(tag).build(),
        };
        let pull = async {
            let mut progress = std::pin::pin!(client.create_image(Some(options), None, credentials));
            while let Some(step) = progress.next().await {
                step.map_err(|error| message(&error))?;
            }
            Ok::<(), String>(())
        };
        match tokio::time::timeout(config.image_pull_timeout, pull).await {
            Ok(Ok(())) => Ok(()),
            // A registry may come back: the restart policy decides, as
            // Nomad's (an image that does not exist fails once it gives up).
            Ok(Err(error)) => Err(StartError::Driver(format!("Failed to pull `{reference}`: {error}"))),
            Err(_) => Err(StartError::Driver(format!(
                "Failed to pull `{reference}`: no image after the image_pull_timeout of {}",
                engine::structs::format_duration(config.image_pull_timeout)
            ))),
        }
    }

    /// Creates the container; one of the same name left from before is
    /// adopted when it runs this allocation's task, else removed first.
    async fn create(
        &self,
        client: &bollard::Docker,
        name: &str,
        alloc: &Allocation,
        body: bollard::models::ContainerCreateBody,
    ) -> Result<String, StartError> {
        let options = || CreateContainerOptionsBuilder::new().name(name).build();
        match client.create_container(Some(options()), body.clone()).await {
            Ok(created) => return Ok(created.id),
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 409, .. }) => {}
            Err(error) => {
                return Err(StartError::Driver(format!("failed to create container {name}: {}", message(&error))))
            }
        }
        let existing = client
            .inspect_container(name, None::<InspectContainerOptions>)
            .await
            .map_err(|error| StartError::Driver(format!("inspecting container {name}: {}", message(&error))))?;
        let ours = existing
            .config
            .as_ref()
            .and_then(|config| config.labels.as_ref())
            .and_then(|labels| labels.get(ALLOC_ID_LABEL))
            .is_some_and(|label| *label == alloc.id.to_string());
        let running = existing.state.as_ref().and_then(|state| state.running) == Some(true);
        let id = existing.id.unwrap_or_else(|| name.to_string());
        if ours && running {
            tracing::info!(container = %id, "adopted the running container of the task");
            return Ok(id);
        }
        remove(client, &id)
            .await
            .map_err(|error| StartError::Driver(format!("removing the old container {name}: {error}")))?;
        client
            .create_container(Some(options()), body)
            .await
            .map(|created| created.id)
            .map_err(|error| StartError::Driver(format!("failed to create container {name}: {}", message(&error))))
    }

    /// Finds a task's container after the agent restarted.
    pub async fn reattach(self: &Arc<Self>, state: HandleState, dir: &AllocDir, task: &Task) -> Reattached {
        let client = match self.client() {
            Ok(client) => client,
            Err(error) => {
                tracing::warn!(container = %state.id, %error, "cannot look for the task's container");
                return Reattached::Lost;
            }
        };
        match client.inspect_container(&state.id, None::<InspectContainerOptions>).await {
            Ok(found) if found.state.as_ref().and_then(|state| state.running) == Some(true) => {
                let logs = logs::follow(client, state.id.clone(), dir, &task.name, task.logs);
                Reattached::Running(super::TaskHandle::Container(TaskHandle {
                    state,
                    docker: self.clone(),
                    logs: Some(logs),
                }))
            }
            Ok(found) => {
                // Ended while the agent was away: its last logs, its exit,
                // then it goes.
                let _ = logs::follow(client.clone(), state.id.clone(), dir, &task.name, task.logs).await;
                let record = exit_record(found.state.as_ref());
                if let Err(error) = remove(&client, &state.id).await {
                    tracing::warn!(container = %state.id, %error, "removing the ended container");
                }
                Reattached::Exited(record)
            }
            Err(error) => {
                tracing::warn!(container = %state.id, error = %message(&error), "the task's container is gone");
                Reattached::Lost
            }
        }
    }

    /// Removes every container of `alloc` (its directories are being
    /// garbage collected): what a task left behind, never a second copy.
    pub async fn remove_alloc_containers(&self, alloc: &str) {
        let Ok(client) = self.client() else { return };
        let filters = HashMap::from([("label", vec![format!("{ALLOC_ID_LABEL}={alloc}")])]);
        let options = ListContainersOptionsBuilder::new().all(true).filters(&filters).build();
        let Ok(found) = client.list_containers(Some(options)).await else { return };
        for container in found {
            if let Some(id) = container.id {
                if let Err(error) = remove(&client, &id).await {
                    tracing::warn!(container = %id, %error, "removing a container of a collected allocation");
                }
            }
        }
    }
}

impl TaskHandle {
    /// What identifies the container.
    pub fn state(&self) -> HandleState {
        self.state.clone()
    }

    /// Waits until the container has ended, its logs copied; then removes
    /// it. How it ended, or `None` when the daemon no longer knows it.
    pub async fn wait(&mut self) -> Option<ExitRecord> {
        let id = self.state.id.clone();
        let mut pause = Duration::from_millis(250);
        let record = loop {
            let Ok(client) = self.docker.client() else {
                tokio::time::sleep(pause).await;
                continue;
            };
            let options = WaitContainerOptionsBuilder::new().condition("not-running").build();
            let waited = std::pin::pin!(client.wait_container(&id, Some(options))).next().await;
            match client.inspect_container(&id, None::<InspectContainerOptions>).await {
                Ok(found) if found.state.as_ref().and_then(|state| state.running) != Some(true) => {
                    break Some(exit_record(found.state.as_ref()));
                }
                Ok(_) => {}
                Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => break None,
                Err(error) => {
                    tracing::debug!(container = %id, error = %message(&error), ?waited, "waiting for the container: the daemon did not answer; trying again");
                }
            }
            // The daemon went away mid-wait: the container may well still
            // run. Ask again, less often the longer it is away.
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
        };
        if let Some(logs) = self.logs.take() {
            let _ = logs.await;
        }
        if let Ok(client) = self.docker.client() {
            if let Err(error) = remove(&client, &id).await {
                tracing::warn!(container = %id, %error, "removing the ended container");
            }
        }
        record
    }

    /// Sends the signal named `name` (`SIGUSR1`) to the container's main
    /// process.
    pub async fn signal(&self, name: &str) {
        let Ok(client) = self.docker.client() else { return };
        let options = KillContainerOptionsBuilder::new().signal(name).build();
        if let Err(error) = client.kill_container(&self.state.id, Some(options)).await {
            tracing::warn!(container = %self.state.id, signal = name, error = %message(&error), "signalling the container");
        }
    }

    /// Stops the container: `kill_signal`, `timeout`, then SIGKILL (or
    /// Docker's stop, which is the same with the image's stop signal, when
    /// the task names none). How it ended, and whether it had to be killed.
    pub async fn stop(&mut self, kill_signal: Option<&str>, timeout: Duration) -> (Option<ExitRecord>, bool) {
        let began = Instant::now();
        match (kill_signal, self.docker.client()) {
            (Some(signal), Ok(_)) => {
                self.signal(signal).await;
                match tokio::time::timeout(timeout, self.wait()).await {
                    Ok(record) => return (record, false),
                    Err(_) => self.signal("SIGKILL").await,
                }
            }
            (None, Ok(client)) => {
                let seconds = i32::try_from(timeout.as_secs_f64().ceil() as i64).unwrap_or(i32::MAX);
                let options = StopContainerOptionsBuilder::new().t(seconds).build();
                let _ = client.stop_container(&self.state.id, Some(options)).await;
            }
            (_, Err(error)) => tracing::warn!(container = %self.state.id, %error, "cannot stop the container now"),
        }
        let record = self.wait().await;
        (record, began.elapsed() >= timeout)
    }
}

/// How a container ended, from its inspected state. Docker gives no
/// signal, but its runtime reports a main process killed by signal N as
/// exit code 128 + N, which is read back as the signal (Nomad reports 0).
fn exit_record(state: Option<&bollard::models::ContainerState>) -> ExitRecord {
    let exit_code = state.and_then(|state| state.exit_code).and_then(|code| i32::try_from(code).ok());
    let oom_killed = state.and_then(|state| state.oom_killed).unwrap_or(false);
    let signal = exit_code.filter(|code| (129..=128 + 64).contains(code)).map(|code| code - 128);
    ExitRecord { exit_code, signal, oom_killed }
}

/// Removes a container, its anonymous volumes with it; one already gone
/// is not an error.
async fn remove(client: &bollard::Docker, id: &str) -> Result<(), String> {
    let options = RemoveContainerOptionsBuilder::new().force(true).v(true).build();
    match client.remove_container(id, Some(options)).await {
        Ok(()) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(()),
        Err(error) => Err(message(&error)),
    }
}

/// The daemon's own message for a failed request, or the error.
fn message(error: &bollard::errors::Error) -> String {
    match error {
        bollard::errors::Error::DockerResponseServerError { message, .. } => message.clone(),
        other => other.to_string(),
    }
}
