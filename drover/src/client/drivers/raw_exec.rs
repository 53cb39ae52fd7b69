//! The `raw_exec` driver, agent side: starts a task's executor (see
//! `executor.rs`), learns the task's pid, waits for the end, stops it, and
//! re-attaches to a running one after the agent restarted.
//!
//! A task runs in its own process group (the group id is the task's pid),
//! under its executor, which is in a group of its own so that neither gets
//! the signals meant for the agent's terminal. Stopping is the agent's:
//! the kill signal to the group, the kill timeout, then SIGKILL to the
//! group; the executor, which sees the main process exit, does the same
//! for what is left and records the exit.
//!
//! The agent waits for an executor it started as its child; for one it
//! re-attached to (no longer its child) it polls a pidfd, checked against
//! the executor's start time so a recycled pid is never taken for it. The
//! exit code comes from the executor's exit record either way.

use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use engine::structs::{Allocation, RawExecConfig, Task};
use rustix::process::{Pid, Signal};
use serde::{Deserialize, Serialize};
use tokio::io::unix::AsyncFd;
use tokio::io::AsyncBufReadExt;

use crate::client::alloc_dir::AllocDir;
use crate::client::drivers::executor::{self, ExitRecord, LaunchSpec};
use crate::client::drivers::isolation::Isolation;
use crate::client::drivers::{Reattached, StartError};
use crate::client::task_env::{EnvDenylist, TaskEnv};

/// What identifies a running task for good: saved in the allocation's
/// state file for re-attaching.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandleState {
    /// The executor's pid.
    pub executor_pid: i32,
    /// The executor's start time (`/proc/<pid>/stat` field 22).
    pub executor_start: u64,
    /// The task's pid, which is also its process group.
    pub task_pid: i32,
    /// The task's start time.
    pub task_start: u64,
}

/// How the agent learns that an executor is gone.
enum Waiter {
    /// One it started: its child.
    Child(tokio::process::Child),
    /// One it re-attached to.
    Pidfd(AsyncFd<OwnedFd>),
    /// It is gone already.
    Gone,
}

/// A running task.
pub struct TaskHandle {
    state: HandleState,
    waiter: Waiter,
    exit_file: PathBuf,
}

impl std::fmt::Debug for TaskHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskHandle").field("state", &self.state).finish_non_exhaustive()
    }
}

/// The driver.
#[derive(Debug)]
pub struct RawExec {
    isolation: Isolation,
    executable: PathBuf,
    env_denylist: EnvDenylist,
}

impl RawExec {
    /// A driver holding tasks to their resources with `isolation`, running
    /// executors from the `drover` binary at `executable`.
    pub fn new(isolation: Isolation, executable: PathBuf) -> RawExec {
        RawExec { isolation, executable, env_denylist: EnvDenylist::default() }
    }

    /// The agent's variables its tasks never inherit.
    pub fn env_denylist(&self) -> &EnvDenylist {
        &self.env_denylist
    }

    /// The agent's variables its tasks never inherit (default: Nomad's list).
    pub fn with_env_denylist(mut self, env_denylist: EnvDenylist) -> RawExec {
        self.env_denylist = env_denylist;
        self
    }

    /// The isolation in force.
    pub fn isolation(&self) -> &Isolation {
        &self.isolation
    }

    /// Starts `task` of `alloc`, with its directories in `dir` (built).
    pub async fn start(
        &self,
        alloc: &Allocation,
        task: &Task,
        dir: &AllocDir,
        env: &TaskEnv,
    ) -> Result<TaskHandle, StartError> {
        let spec = self.launch_spec(alloc, task, dir, env)?;
        let spec_path = dir.task_file(&task.name, "launch.json");
        let exit_file = spec.exit_file.clone();
        let driver = |what: &str, error: std::io::Error| StartError::Driver(format!("{what}: {error}"));
        let _ = std::fs::remove_file(&exit_file);
        let bytes = serde_json::to_vec(&spec).map_err(|error| StartError::Driver(error.to_string()))?;
        crate::client::alloc_dir::write_private(&spec_path, &bytes)
            .map_err(|error| driver("writing the launch spec", error))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(dir.task_file(&task.name, "executor.log"))
            .map_err(|error| driver("opening the executor log", error))?;
        let mut command = tokio::process::Command::new(&self.executable);
        command
            .arg("executor")
            .arg(&spec_path)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(log)
            .process_group(0);
        let mut child = command.spawn().map_err(|error| driver("starting the executor", error))?;
        let executor_pid = child.id().and_then(|pid| Pid::from_raw(pid as i32));
        let stdout = child.stdout.take().ok_or_else(|| StartError::Driver("no executor stdout".to_string()))?;
        let mut line = String::new();
        let read = tokio::io::BufReader::new(stdout).read_line(&mut line).await;
        let line = line.trim();
        let (Some(executor_pid), Some(started)) = (executor_pid, line.strip_prefix("started ")) else {
            let _ = child.wait().await;
            let why = line.strip_prefix("failed ").unwrap_or(line);
            return Err(StartError::Driver(match read {
                Err(error) => format!("reading the executor: {error}"),
                Ok(_) if why.is_empty() => "the executor exited before starting the task".to_string(),
                Ok(_) => why.to_string(),
            }));
        };
        let mut fields = started.split_whitespace().map(str::parse::<u64>);
        let (Some(Ok(task_pid)), Some(Ok(task_start))) = (fields.next(), fields.next()) else {
            return Err(StartError::Driver(format!("the executor said {line:?}")));
        };
        let state = HandleState {
            executor_pid: executor_pid.as_raw_nonzero().get(),
            executor_start: executor::start_time(executor_pid).unwrap_or(0),
            task_pid: task_pid as i32,
            task_start,
        };
        Ok(TaskHandle { state, waiter: Waiter::Child(child), exit_file })
    }

    /// Finds a task the agent started before it restarted (whether or not
    /// the driver is enabled now).
    pub fn reattach(state: HandleState, dir: &AllocDir, task: &str) -> Reattached {
        let exit_file = dir.task_file(task, "exit.json");
        if let Some(pid) = Pid::from_raw(state.executor_pid) {
            if let Ok(pidfd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) {
                // The pidfd pins the process: if its start time matches now,
                // it is our executor and stays so. A zombie (its parent, now
                // init, has not reaped it yet) has exited.
                if executor::start_time(pid) == Some(state.executor_start) && executor::is_running(pid) {
                    // `new` is deprecated because a `T: AsRawFd` may hand
                    // out an fd it does not own or may close; an `OwnedFd`
                    // owns its fd and closes it only when the `AsyncFd`
                    // (deregistered first) drops it, so this use is sound.
                    #[allow(deprecated)]
                    let registered = AsyncFd::new(pidfd);
                    if let Ok(fd) = registered {
                        return Reattached::Running(super::TaskHandle::Process(TaskHandle {
                            state,
                            waiter: Waiter::Pidfd(fd),
                            exit_file,
                        }));
                    }
                }
            }
        }
        match read_exit(&exit_file) {
            Some(record) => Reattached::Exited(record),
            None => {
                kill_orphaned_group(&state);
                Reattached::Lost
            }
        }
    }

    fn launch_spec(
        &self,
        alloc: &Allocation,
        task: &Task,
        dir: &AllocDir,
        env: &TaskEnv,
    ) -> Result<LaunchSpec, StartError> {
        crate::client::alloc_dir::check_name(&task.name).map_err(|error| StartError::Unrunnable(error.to_string()))?;
        let process_env = env.process_env(task, std::env::vars(), &self.env_denylist);
        // Every string of the config goes through the one interpolation
        // before anything in it is read.
        let config = env.interpolate_config(&task.config, &process_env)?;
        let config =
            RawExecConfig::from_config(&config).map_err(|problems| StartError::Unrunnable(problems.join("; ")))?;
        let task_root = dir.task_dir(&task.name);
        let path_var = process_env.get("PATH").map(String::as_str);
        let command = resolve_command(&config.command, &task_root, &dir.task_local_dir(&task.name), path_var)?;
        let work_dir = match config.work_dir {
            Some(work_dir) => task_root.join(work_dir),
            None => dir.task_local_dir(&task.name),
        };
        let user = match &task.user {
            None => None,
            Some(user) => {
                let ids = executor::lookup_user(user).map_err(|error| StartError::Unrunnable(error.to_string()))?;
                let own = rustix::process::geteuid().as_raw();
                if own != 0 && own != ids.0 {
                    return Err(StartError::Unrunnable(format!(
                        "running as user {user:?} needs the agent to run as root"
                    )));
                }
                Some(ids)
            }
        };
        // The hard limit: `memory_max` where the job sets one, else the reservation.
        let memory_limit_mb = task.memory_max_mb.max(task.resources.memory_mb);
        let limits = self
            .isolation
            .for_task(&format!("{}.{}", alloc.id, task.name), memory_limit_mb, task.resources.cpu)
            .map_err(|error| StartError::Driver(format!("setting up resource limits: {error}")))?;
        let kill_signal = signal(task.kill_signal())
            .ok_or_else(|| StartError::Unrunnable(format!("unknown kill signal {:?}", task.kill_signal())))?;
        Ok(LaunchSpec {
            task: task.name.clone(),
            command,
            args: config.args,
            env: process_env.into_iter().collect(),
            work_dir,
            user,
            memory_limit_bytes: limits.memory_limit_bytes,
            cgroup: limits.cgroup,
            logs_dir: dir.logs_dir(),
            log_max_files: task.logs.max_files,
            log_max_file_bytes: u64::from(task.logs.max_file_size_mb) * 1024 * 1024,
            kill_signal: kill_signal.as_raw(),
            kill_timeout: task.kill_timeout,
            exit_file: dir.task_file(&task.name, "exit.json"),
        })
    }
}

impl TaskHandle {
    /// What identifies the task.
    pub fn state(&self) -> HandleState {
        self.state
    }

    /// Waits until the task and its executor are gone; how it ended, or
    /// `None` when the executor left no record.
    pub async fn wait(&mut self) -> Option<ExitRecord> {
        match &mut self.waiter {
            Waiter::Child(child) => {
                let _ = child.wait().await;
            }
            Waiter::Pidfd(fd) => {
                if let Ok(mut ready) = fd.readable().await {
                    ready.retain_ready();
                }
            }
            Waiter::Gone => {}
        }
        self.waiter = Waiter::Gone;
        let record = read_exit(&self.exit_file);
        if record.is_none() {
            kill_orphaned_group(&self.state);
        }
        record
    }

    /// Sends `signal` to the task's own process (an operator's signal, as
    /// Nomad's executor sends it), not to the processes it started.
    pub fn signal(&self, signal: Signal) {
        if let Some(pid) = Pid::from_raw(self.state.task_pid) {
            let _ = rustix::process::kill_process(pid, signal);
        }
    }

    /// Sends `signal` to the task's process group.
    pub fn signal_group(&self, signal: Signal) {
        if let Some(group) = Pid::from_raw(self.state.task_pid) {
            let _ = rustix::process::kill_process_group(group, signal);
        }
    }

    /// Stops the task: `signal` to its group, `timeout`, then SIGKILL to
    /// the group. Returns how it ended and whether it had to be killed.
    pub async fn stop(&mut self, signal: Signal, timeout: Duration) -> (Option<ExitRecord>, bool) {
        self.signal_group(signal);
        if let Ok(record) = tokio::time::timeout(timeout, self.wait()).await {
            return (record, false);
        }
        self.signal_group(Signal::KILL);
        (self.wait().await, true)
    }
}

/// Kills what is left of a task whose executor is gone without a record
/// (killed, or crashed): its processes may still run, re-parented, and
/// starting the task again would leave two copies. The group is the
/// task's when its leader still runs with the task's start time, or when
/// no process has the leader's pid (Linux does not reuse a pid while it is
/// still a process group's id); a pid that runs another process now means
/// the group emptied long ago.
fn kill_orphaned_group(state: &HandleState) {
    let Some(group) = Pid::from_raw(state.task_pid) else { return };
    let ours = match executor::start_time(group) {
        Some(started) => started == state.task_start,
        None => true,
    };
    if !ours || rustix::process::kill_process_group(group, Signal::KILL).is_err() {
        return;
    }
    tracing::warn!(task_pid = state.task_pid, "the task's executor is gone: killed what was left of the task");
}

fn read_exit(path: &Path) -> Option<ExitRecord> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// The signal named as in job files (`SIGTERM`).
pub fn signal(name: &str) -> Option<Signal> {
    Some(match name {
        "SIGHUP" => Signal::HUP,
        "SIGINT" => Signal::INT,
        "SIGQUIT" => Signal::QUIT,
        "SIGKILL" => Signal::KILL,
        "SIGUSR1" => Signal::USR1,
        "SIGUSR2" => Signal::USR2,
        "SIGTERM" => Signal::TERM,
        "SIGCONT" => Signal::CONT,
        "SIGSTOP" => Signal::STOP,
        "SIGWINCH" => Signal::WINCH,
        _ => return None,
    })
}

/// The program to run: a path with a `/` is taken from the task directory
/// when relative; a bare name is looked for in the task's `local/`, then
/// in `PATH`, as Nomad's executor does.
fn resolve_command(
    command: &str,
    task_root: &Path,
    local: &Path,
    path_var: Option<&str>,
) -> Result<PathBuf, StartError> {
    let candidates: Vec<PathBuf> = if command.contains('/') {
        vec![task_root.join(command)]
    } else {
        std::iter::once(local.join(command))
            .chain(
                path_var.unwrap_or("").split(':').filter(|dir| !dir.is_empty()).map(|dir| Path::new(dir).join(command)),
            )
            .collect()
    };
    candidates.into_iter().find(|path| is_executable(path)).ok_or_else(|| {
        StartError::Unrunnable(format!(
            "executable file not found: {command:?} (looked in the task directory{})",
            if command.contains('/') { "" } else { " and PATH" }
        ))
    })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_signal_a_job_may_name_is_known() {
        for name in engine::structs::KILL_SIGNALS {
            assert!(signal(name).is_some(), "{name}");
        }
        assert_eq!(signal("SIGINT"), Some(Signal::INT));
    }

    #[test]
    fn commands_resolve_like_nomads_executor() {
        let root = Path::new("/nonexistent-task");
        let found = resolve_command("sh", root, &root.join("local"), Some("/usr/bin:/bin")).expect("sh is on PATH");
        assert!(found.ends_with("sh"), "{}", found.display());
        let missing = resolve_command("no-such-binary-drover", root, &root.join("local"), Some("/bin"))
            .expect_err("missing")
            .to_string();
        assert!(missing.contains("executable file not found: \"no-such-binary-drover\""), "{missing}");
        assert!(resolve_command("/bin/sh", root, root, None).is_ok(), "absolute paths are kept");
    }
}
