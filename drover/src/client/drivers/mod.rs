//! The task drivers, one file (or folder) each: `raw_exec` (a process on
//! the host, run by an executor process so tasks outlive an agent restart;
//! `executor.rs` and `isolation.rs` are its parts), `docker` (a container
//! on the machine's Docker Engine, through its API) and `mock` (Nomad's
//! `mock_driver`, for tests and load).
//!
//! The task runner sees one interface, [`Drivers`]: start a task with the
//! driver its job names, wait for it, signal it, stop it, and find it again
//! after the agent restarted from the [`HandleState`] saved in the
//! allocation's state file.

pub mod docker;
pub mod executor;
pub mod isolation;
pub mod mock;
pub mod raw_exec;

use std::sync::Arc;
use std::time::Duration;

use engine::structs::{Allocation, Task, TaskEvent, DOCKER, RAW_EXEC};
use rustix::process::Signal;
use serde::{Deserialize, Serialize};

use crate::client::alloc_dir::AllocDir;
use crate::client::drivers::docker::Docker;
use crate::client::drivers::executor::ExitRecord;
use crate::client::drivers::raw_exec::RawExec;
use crate::client::task_env::{ConfigError, TaskEnv};

/// The drivers an agent runs real tasks with: those it offers.
#[derive(Clone, Debug, Default)]
pub struct Drivers {
    /// `raw_exec`, when enabled.
    pub raw_exec: Option<Arc<RawExec>>,
    /// `docker`, unless disabled (it runs whenever its daemon answers).
    pub docker: Option<Arc<Docker>>,
}

/// Why a task could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The task's settings cannot work on this node (its command does not
    /// exist, its user is unknown, its image names nothing): starting it
    /// again would fail the same way.
    #[error("{0}")]
    Unrunnable(String),
    /// The driver or the node failed (a full disk, a fork that failed, a
    /// daemon that did not answer).
    #[error("{0}")]
    Driver(String),
    /// The driver config cannot be read as written: a `${...}` in it names
    /// no variable (Nomad's `Failed Validation`; never restarted).
    #[error("{0}")]
    InvalidConfig(#[from] ConfigError),
}

/// What identifies a running task for good, saved in the allocation's
/// state file for re-attaching. Untagged: a state file written before
/// there was more than one driver reads as a process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum HandleState {
    /// A `raw_exec` task: its executor and process.
    Process(raw_exec::HandleState),
    /// A `docker` task: its container.
    Container(docker::HandleState),
}

impl HandleState {
    /// The host pid of the task's main process (a container's init), for
    /// resource usage; 0 when unknown.
    pub fn pid(&self) -> i32 {
        match self {
            HandleState::Process(process) => process.task_pid,
            HandleState::Container(container) => container.pid,
        }
    }
}

/// A running task.
#[derive(Debug)]
pub enum TaskHandle {
    /// A process.
    Process(raw_exec::TaskHandle),
    /// A container.
    Container(docker::TaskHandle),
}

/// What re-attaching found.
#[derive(Debug)]
pub enum Reattached {
    /// The task still runs (boxed: a handle is far larger than a record).
    Running(Box<TaskHandle>),
    /// It ended while the agent was away; this is how.
    Exited(ExitRecord),
    /// It is gone without a record (its executor was killed, its container
    /// removed): the task is lost and its exit code unknown.
    Lost,
}

impl Drivers {
    /// Starts `task` of `alloc` with the driver it names, its directories
    /// in `dir` (built); what the driver did on the way (an image pulled)
    /// goes to `events`.
    pub async fn start(
        &self,
        alloc: &Allocation,
        task: &Task,
        dir: &AllocDir,
        env: &TaskEnv,
        events: &mut Vec<TaskEvent>,
    ) -> Result<TaskHandle, StartError> {
        match task.driver.as_str() {
            RAW_EXEC => {
                let driver = self.raw_exec.as_ref().ok_or_else(|| not_offered(RAW_EXEC))?;
                Ok(TaskHandle::Process(driver.start(alloc, task, dir, env).await?))
            }
            DOCKER => {
                let driver = self.docker.as_ref().ok_or_else(|| not_offered(DOCKER))?;
                Ok(TaskHandle::Container(driver.start(alloc, task, dir, env, events).await?))
            }
            other => Err(not_offered(other)),
        }
    }

    /// Finds a task the agent started before it restarted.
    pub async fn reattach(&self, state: HandleState, dir: &AllocDir, task: &Task) -> Reattached {
        match state {
            // Found even when the agent restarted without raw_exec: the
            // task's executor may still run, and would record its end.
            HandleState::Process(process) => RawExec::reattach(process, dir, &task.name),
            HandleState::Container(container) => match &self.docker {
                Some(driver) => driver.reattach(container, dir, task).await,
                None => {
                    tracing::warn!(task = %task.name, container = %container.id, "the docker driver is disabled: the task's container is not looked for");
                    Reattached::Lost
                }
            },
        }
    }
}

fn not_offered(driver: &str) -> StartError {
    StartError::Unrunnable(format!("the {driver} driver is not enabled on this node"))
}

impl TaskHandle {
    /// What identifies the task.
    pub fn state(&self) -> HandleState {
        match self {
            TaskHandle::Process(process) => HandleState::Process(process.state()),
            TaskHandle::Container(container) => HandleState::Container(container.state()),
        }
    }

    /// A detail for the `Started` event: the process's pid or the
    /// container's id.
    pub fn started_detail(&self) -> (&'static str, String) {
        match self {
            TaskHandle::Process(process) => ("pid", process.state().task_pid.to_string()),
            TaskHandle::Container(container) => ("container_id", container.state().id),
        }
    }

    /// Waits until the task has ended; how it ended, or `None` when that
    /// is unknown.
    pub async fn wait(&mut self) -> Option<ExitRecord> {
        match self {
            TaskHandle::Process(process) => process.wait().await,
            TaskHandle::Container(container) => container.wait().await,
        }
    }

    /// Sends `signal` (named `name`, `SIGUSR1`) to the task's own process.
    pub async fn signal(&self, signal: Signal, name: &str) {
        match self {
            TaskHandle::Process(process) => process.signal(signal),
            TaskHandle::Container(container) => container.signal(name).await,
        }
    }

    /// Stops the task: `kill_signal` (the task's, if it names one), then
    /// after `timeout` SIGKILL. Returns how it ended and whether it had to
    /// be killed.
    pub async fn stop(&mut self, kill_signal: Option<&str>, timeout: Duration) -> (Option<ExitRecord>, bool) {
        match self {
            TaskHandle::Process(process) => {
                let signal = kill_signal.and_then(raw_exec::signal).unwrap_or(Signal::INT);
                process.stop(signal, timeout).await
            }
            TaskHandle::Container(container) => container.stop(kill_signal, timeout).await,
        }
    }
}
