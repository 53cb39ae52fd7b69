//! One allocation's life on its client (Nomad's alloc runner): build its
//! directories, run a task runner per task, keep the tasks' states, and
//! tell the agent the allocation's client status whenever it changes.
//!
//! - Client status from the tasks, as Nomad: `failed` when a task died
//!   failed, else `running` when one runs, else `pending` when one waits
//!   (to start, or to restart), else `complete`.
//! - A task that fails stops its siblings (`Sibling Task Failed`).
//! - After every change the runner writes the allocation's state file
//!   (temporary file, fsync, rename): the allocation, each task's state and
//!   its running process (executor pid, task pid and group, both start
//!   times). A restarted agent reads it back ([`restore`]) and re-attaches
//!   instead of starting the tasks again; a task found dead is reported.
//! - The directories are removed when the agent garbage collects the
//!   allocation ([`AllocHandle::destroy`]), after its tasks are stopped.
//! - An operator's restart or signal reaches a task through the
//!   allocation's [`AllocControl`], which also knows its running processes.
//! - Every report carries the allocation's service registrations
//!   (`services.rs`), its checks' latest results and its health once
//!   decided. The checks of what is registered run in a check runner
//!   (`checks.rs`) whose news (a changed status, a `check_restart`) wakes
//!   the runner; the health (`health.rs`) is judged on every change and
//!   at the instants the tracker names, never while the tasks are being
//!   stopped.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use rustix::process::Signal;

use engine::structs::{
    AllocHealth, AllocId, Allocation, CheckResult, ClientStatus, Node, TaskEvent, TaskState, TaskStatus,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

use crate::client::alloc_dir::{write_private, AllocDir};
use crate::client::checks::{self, CheckNews, PlannedCheck};
use crate::client::clock::now;
use crate::client::dispatch_payload;
use crate::client::drivers::{Drivers, HandleState};
use crate::client::health::{HealthTracker, Verdict};
use crate::client::services;
use crate::client::state::AllocEvent;
use crate::client::task_env::{EnvDenylist, TaskEnv};
use crate::client::task_runner::{self, KillReason, NotRunning, TaskCommand, TaskContext, TaskUpdate};

/// What every allocation runner of an agent shares (a runner keeps the
/// context it started with).
#[derive(Clone, Debug)]
pub struct RunnerContext {
    /// The drivers.
    pub drivers: Drivers,
    /// The node the agent is, as registered when the runner started.
    pub node: Node,
    /// The agent's data directory.
    pub data_dir: std::path::PathBuf,
    /// Where allocation events go.
    pub events: mpsc::UnboundedSender<AllocEvent>,
    /// Becomes `true` once the agent has applied the servers' view of its
    /// allocations (after a restart: what they want stopped is stopping).
    pub servers_reached: watch::Receiver<bool>,
    /// The agent's service reads, for templates.
    pub services: crate::client::service_watch::ServiceWatch,
}

/// The state file.
#[derive(Debug, Serialize, Deserialize)]
struct SavedAlloc {
    alloc: Allocation,
    tasks: BTreeMap<String, SavedTask>,
    /// Its health, once decided (not judged again after a restart).
    #[serde(default)]
    health: Option<AllocHealth>,
}

#[derive(Debug, Serialize, Deserialize)]
struct SavedTask {
    state: TaskState,
    handle: Option<HandleState>,
}

/// The agent's hold on a running allocation runner.
#[derive(Debug)]
pub struct AllocHandle {
    kill: watch::Sender<Option<KillReason>>,
    destroy: watch::Sender<bool>,
    dir: AllocDir,
    runner: tokio::task::JoinHandle<()>,
    control: AllocControl,
}

/// An operator's way to an allocation's tasks (module docs).
#[derive(Clone, Debug)]
pub struct AllocControl {
    /// Each task's command queue (a task that does not run drops it).
    tasks: Arc<BTreeMap<String, mpsc::UnboundedSender<TaskCommand>>>,
    /// The processes of the tasks running now.
    running: Arc<parking_lot::Mutex<BTreeMap<String, HandleState>>>,
}

/// Why an operator's command did not reach a task.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// The allocation has no such task.
    #[error("allocation has no task {0:?}")]
    UnknownTask(String),
    /// The task does not run now.
    #[error("task {0:?} is not running")]
    NotRunning(String),
    /// No task of the allocation runs now.
    #[error("no task of the allocation is running")]
    NoneRunning,
}

impl AllocControl {
    /// The processes of the tasks running now, by task.
    pub fn running(&self) -> BTreeMap<String, HandleState> {
        self.running.lock().clone()
    }

    /// Restarts `task`, or every running task without one (as Nomad's
    /// `alloc restart`); answered once each was killed.
    pub async fn restart(&self, task: Option<&str>) -> Result<(), ControlError> {
        self.each(task, TaskCommand::Restart).await
    }

    /// Sends `signal` (named `name`) to `task`, or to every running task.
    pub async fn signal(&self, task: Option<&str>, signal: Signal, name: &str) -> Result<(), ControlError> {
        self.each(task, |reply| TaskCommand::Signal(signal, name.to_string(), reply)).await
    }

    /// Sends the command `make` makes to `task` or every running task,
    /// and waits for every answer.
    async fn each(
        &self,
        task: Option<&str>,
        make: impl Fn(tokio::sync::oneshot::Sender<Result<(), NotRunning>>) -> TaskCommand,
    ) -> Result<(), ControlError> {
        let names: Vec<String> = match task {
            Some(task) if !self.tasks.contains_key(task) => return Err(ControlError::UnknownTask(task.to_string())),
            Some(task) => vec![task.to_string()],
            None => self.running.lock().keys().cloned().collect(),
        };
        if names.is_empty() {
            return Err(ControlError::NoneRunning);
        }
        let mut answers = Vec::new();
        for name in names {
            let (reply, answer) = tokio::sync::oneshot::channel();
            let sent = self.tasks.get(&name).is_some_and(|queue| queue.send(make(reply)).is_ok());
            if !sent {
                return Err(ControlError::NotRunning(name));
            }
            answers.push((name, answer));
        }
        for (name, answer) in answers {
            if !matches!(answer.await, Ok(Ok(()))) {
                return Err(ControlError::NotRunning(name));
            }
        }
        Ok(())
    }
}

impl AllocHandle {
    /// Stops its tasks (the kill signal, the kill timeout, SIGKILL).
    pub fn stop(&self) {
        set_once(&self.kill, KillReason::Stop);
    }

    /// Stops its tasks, then removes its directories.
    pub fn destroy(&self) {
        self.stop();
        self.destroy.send_replace(true);
    }

    /// The allocation's directories.
    pub fn dir(&self) -> &AllocDir {
        &self.dir
    }

    /// An operator's way to its tasks.
    pub fn control(&self) -> AllocControl {
        self.control.clone()
    }

    /// Leaves the tasks running and forgets them (the agent shuts down;
    /// the next agent re-attaches).
    pub fn detach(self) {
        self.runner.abort();
    }

    /// Waits until the runner has finished, its directories kept unless
    /// [`AllocHandle::destroy`] was called.
    pub async fn finished(self) {
        let AllocHandle { kill, destroy, dir: _, runner, control: _ } = self;
        // The runner waits on this once its tasks are dead; closed, it ends.
        drop(destroy);
        let _ = runner.await;
        drop(kill);
    }
}

/// Starts `alloc`'s tasks; returns the handle and the first task states.
pub fn start(ctx: &Arc<RunnerContext>, alloc: Arc<Allocation>) -> AllocHandle {
    let dir = AllocDir::new(&ctx.data_dir, alloc.id);
    let tasks = group_tasks(&alloc);
    let mut states = BTreeMap::new();
    for task in &tasks {
        let mut state = TaskState::default();
        state.push_event(TaskEvent::new(TaskEvent::RECEIVED, now(), "Task received by client"));
        states.insert(task.name.clone(), (state, None));
    }
    spawn(ctx, alloc, dir, states, Origin::Fresh)
}

/// Re-attaches to an allocation found in `data_dir` when the agent
/// started: its handle, or `None` when it has no readable state file
/// (its directories are then removed).
pub fn restore(ctx: &Arc<RunnerContext>, alloc_id: AllocId) -> Option<(Arc<Allocation>, AllocHandle)> {
    let dir = AllocDir::new(&ctx.data_dir, alloc_id);
    let saved: SavedAlloc = match std::fs::read(dir.state_file())
        .map_err(|error| error.to_string())
        .and_then(|bytes| serde_json::from_slice(&bytes).map_err(|error| error.to_string()))
    {
        Ok(saved) => saved,
        Err(error) => {
            tracing::warn!(alloc = %alloc_id, %error, "no usable state file; removing the allocation's directories");
            let _ = dir.destroy();
            return None;
        }
    };
    let alloc = Arc::new(saved.alloc);
    let mut states = BTreeMap::new();
    for (name, task) in saved.tasks {
        // Each task runner looks for its own task first.
        states.insert(name, (task.state, task.handle));
    }
    let handle = spawn(ctx, alloc.clone(), dir, states, Origin::Restored(saved.health));
    Some((alloc, handle))
}

fn group_tasks(alloc: &Allocation) -> Vec<engine::structs::Task> {
    alloc.job.group(&alloc.task_group).map(|group| group.tasks.clone()).unwrap_or_default()
}

type Start = BTreeMap<String, (TaskState, Option<HandleState>)>;

/// Where a runner's allocation comes from.
#[derive(Debug)]
enum Origin {
    /// New to this agent.
    Fresh,
    /// Its state file, read after the agent restarted, with its health if
    /// it was decided.
    Restored(Option<AllocHealth>),
}

/// Spawns the runner.
fn spawn(ctx: &Arc<RunnerContext>, alloc: Arc<Allocation>, dir: AllocDir, tasks: Start, origin: Origin) -> AllocHandle {
    let (kill, _) = watch::channel(None);
    let (destroy, destroyed) = watch::channel(false);
    let mut queues = BTreeMap::new();
    let mut commands = BTreeMap::new();
    for task in group_tasks(&alloc) {
        let (queue, received) = mpsc::unbounded_channel();
        queues.insert(task.name.clone(), queue);
        commands.insert(task.name, received);
    }
    let control = AllocControl { tasks: Arc::new(queues), running: Arc::default() };
    let parts = Parts { tasks, origin, commands, control: control.clone() };
    let runner = tokio::spawn(run(ctx.clone(), alloc, dir.clone(), parts, kill.clone(), destroyed));
    AllocHandle { kill, destroy, dir, runner, control }
}

/// What a runner starts with.
struct Parts {
    /// Each task's state and its saved handle, if it was running.
    tasks: Start,
    /// Where the allocation comes from.
    origin: Origin,
    /// Each task's command queue.
    commands: BTreeMap<String, mpsc::UnboundedReceiver<TaskCommand>>,
    /// The tasks' queues and running processes, shared with operators.
    control: AllocControl,
}

async fn run(
    ctx: Arc<RunnerContext>,
    alloc: Arc<Allocation>,
    dir: AllocDir,
    parts: Parts,
    kill: watch::Sender<Option<KillReason>>,
    mut destroyed: watch::Receiver<bool>,
) {
    let Parts { tasks, origin, mut commands, control } = parts;
    let fresh = matches!(origin, Origin::Fresh);
    let mut saved: BTreeMap<String, SavedTask> = BTreeMap::new();
    // Each task's variables, made once: its runner's, and its services'.
    let mut envs: BTreeMap<String, TaskEnv> = BTreeMap::new();
    let (updates_tx, mut updates) = mpsc::unbounded_channel();
    let built = dir.build(group_tasks(&alloc).iter().map(|task| task.name.as_str()));
    for (name, (mut state, found)) in tasks {
        let Some(task) = group_tasks(&alloc).into_iter().find(|task| task.name == name) else { continue };
        let runnable = state.state != TaskStatus::Dead;
        let setup = match &built {
            Err(error) => Err(format!("building the task directory: {error}")),
            Ok(()) if runnable => dispatch_payload::write_payload(&dir, &alloc, &task),
            Ok(()) => Ok(()),
        };
        if let Err(error) = setup {
            state.push_event(TaskEvent::new(TaskEvent::SETUP_FAILURE, now(), error));
            state.state = TaskStatus::Dead;
            state.failed = true;
        } else if runnable {
            if fresh {
                state.push_event(TaskEvent::new(TaskEvent::TASK_SETUP, now(), "Building Task Directory"));
            }
            let env = TaskEnv::new(&alloc, &task, &ctx.node, &dir);
            envs.insert(name.clone(), env.clone());
            let task_ctx = TaskContext {
                drivers: ctx.drivers.clone(),
                alloc: alloc.clone(),
                task,
                dir: dir.clone(),
                env,
                servers_reached: ctx.servers_reached.clone(),
                services: ctx.services.clone(),
            };
            let start_state = state.clone();
            let (_, unused) = mpsc::unbounded_channel();
            let queue = commands.remove(&name).unwrap_or(unused);
            let updates = updates_tx.clone();
            tokio::spawn(task_runner::run(task_ctx, start_state, found, updates, kill.subscribe(), queue));
        }
        saved.insert(name, SavedTask { state, handle: None });
    }
    drop(updates_tx);
    // The queues of tasks that do not run are dropped: commands to them
    // are answered "not running".
    drop(commands);
    let (plans, planned) = watch::channel(Vec::new());
    let (news_tx, mut news) = mpsc::unbounded_channel();
    let checks = tokio::spawn(checks::run(planned, news_tx, ctx.drivers.docker.clone()));
    let mut watched = Watched {
        ctx: ctx.clone(),
        alloc: alloc.clone(),
        dir: dir.clone(),
        envs,
        tasks: saved,
        plans,
        checks: BTreeMap::new(),
        saved_bytes: None,
        health: match origin {
            Origin::Restored(Some(decided)) => Health::Decided(decided),
            _ => HealthTracker::new(&alloc, Instant::now()).map_or(Health::NotJudged, Health::Watching),
        },
        control: control.clone(),
    };
    let stopping = kill.borrow().is_some();
    let mut wake = watched.report(stopping).await;
    loop {
        tokio::select! {
            update = updates.recv() => {
                let Some(TaskUpdate { task, state, handle }) = update else { break };
                if state.state == TaskStatus::Dead && state.failed {
                    set_once(&kill, KillReason::SiblingFailed(task.clone()));
                }
                match handle.clone().filter(|_| state.state == TaskStatus::Running) {
                    Some(handle) => control.running.lock().insert(task.clone(), handle),
                    None => control.running.lock().remove(&task),
                };
                watched.tasks.insert(task, SavedTask { state, handle });
            }
            Some(news) = news.recv() => match news {
                CheckNews::Changed(result) => {
                    match watched.checks.get_mut(&result.id) {
                        Some(stored) if stored.status != result.status => *stored = result,
                        _ => continue,
                    }
                }
                CheckNews::Restart { task, reason } => {
                    if let Some(queue) = control.tasks.get(&task) {
                        let _ = queue.send(TaskCommand::CheckRestart(reason));
                    }
                    continue;
                }
            },
            () = sleep_until(wake) => {}
        }
        let stopping = kill.borrow().is_some();
        wake = watched.report(stopping).await;
    }
    checks.abort();
    // Every task is dead. Removed directories wait for the agent's word.
    if destroyed.wait_for(|destroy| *destroy).await.is_ok() {
        if let Err(error) = dir.destroy() {
            tracing::warn!(alloc = %alloc.id, %error, "removing the allocation's directories");
        }
        if let Some(docker) = &ctx.drivers.docker {
            docker.remove_alloc_containers(&alloc.id.to_string()).await;
        }
    }
}

/// Sleeps until `at`; forever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Sets the kill reason unless one is set: the first reason stands.
fn set_once(kill: &watch::Sender<Option<KillReason>>, why: KillReason) {
    kill.send_if_modified(|reason| {
        if reason.is_some() {
            return false;
        }
        *reason = Some(why);
        true
    });
}

/// An allocation's health as its runner follows it.
#[derive(Debug)]
enum Health {
    /// Not judged (not a service job, or `health_check = "manual"`).
    NotJudged,
    /// Being judged.
    Watching(HealthTracker),
    /// Decided.
    Decided(AllocHealth),
}

/// What a runner follows of its allocation, and reports.
struct Watched {
    ctx: Arc<RunnerContext>,
    alloc: Arc<Allocation>,
    dir: AllocDir,
    /// Each task's variables, made once.
    envs: BTreeMap<String, TaskEnv>,
    /// Each task's state and running process.
    tasks: BTreeMap<String, SavedTask>,
    /// The checks to run, for the check runner.
    plans: watch::Sender<Vec<PlannedCheck>>,
    /// Each planned check's latest result.
    checks: BTreeMap<String, CheckResult>,
    /// What the state file holds, as last written.
    saved_bytes: Option<Vec<u8>>,
    health: Health,
    control: AllocControl,
}

impl Watched {
    /// Brings the checks and the health up to date, saves the state file
    /// and tells the agent; when to look again at the health. `stopping`:
    /// the allocation's tasks are being stopped, which judges nothing.
    async fn report(&mut self, stopping: bool) -> Option<Instant> {
        let states: BTreeMap<String, TaskState> =
            self.tasks.iter().map(|(name, task)| (name.clone(), task.state.clone())).collect();
        let handles: BTreeMap<String, HandleState> =
            self.tasks.iter().filter_map(|(name, task)| Some((name.clone(), task.handle.clone()?))).collect();
        let (registrations, planned) = {
            let registered = services::registered(&self.alloc, &self.ctx.node, &self.envs, &states);
            let no_denylist = EnvDenylist::default();
            let raw_exec = self.ctx.drivers.raw_exec.as_ref();
            let denylist = raw_exec.map_or(&no_denylist, |driver| driver.env_denylist());
            let planned = checks::plan(&self.alloc, &self.ctx.node, &registered, &self.envs, &handles, denylist);
            (registered.into_iter().map(|found| found.registration).collect(), planned)
        };
        self.plan_checks(planned);
        // While its tasks are being stopped only a failure is judged: a
        // task that failed on its own makes the allocation unhealthy (what
        // a deployment waits for); one the stop ended says nothing.
        let failed = states.values().any(|state| state.state == TaskStatus::Dead && state.failed);
        let wake = match (stopping, failed) {
            (false, _) => self.judge(&states),
            (true, true) => self.judge(&states).and(None),
            (true, false) => None,
        };
        let (status, description) = client_status(&states);
        let decided = match &self.health {
            Health::Decided(health) => Some(health.clone()),
            _ => None,
        };
        let saved = SavedAlloc {
            alloc: Allocation::clone(&self.alloc),
            tasks: self
                .tasks
                .iter()
                .map(|(name, task)| {
                    (name.clone(), SavedTask { state: task.state.clone(), handle: task.handle.clone() })
                })
                .collect(),
            health: decided.clone(),
        };
        self.save(&saved).await;
        let _ = self.ctx.events.send(AllocEvent {
            alloc_id: self.alloc.id,
            status,
            description,
            task_states: states,
            services: Some(registrations),
            checks: Some(self.checks.clone()),
            health: decided,
        });
        wake
    }

    /// Writes the state file unless it would hold what it holds already
    /// (a check's news changes nothing in it).
    async fn save(&mut self, saved: &SavedAlloc) {
        let bytes = match serde_json::to_vec(saved) {
            Ok(bytes) => bytes,
            Err(error) => {
                tracing::warn!(alloc = %self.alloc.id, %error, "encoding the allocation's state file");
                return;
            }
        };
        if self.saved_bytes.as_deref() == Some(bytes.as_slice()) {
            return;
        }
        let path = self.dir.state_file();
        let to_write = bytes.clone();
        let written = tokio::task::spawn_blocking(move || write_private(&path, &to_write)).await;
        match written {
            Ok(Ok(())) => self.saved_bytes = Some(bytes),
            Ok(Err(error)) => {
                tracing::warn!(alloc = %self.alloc.id, %error, "writing the allocation's state file; a restarted agent cannot re-attach")
            }
            Err(_) => {}
        }
    }

    /// Takes up the checks `planned` for what is registered now: a new
    /// check starts at its initial result, stamped now, and a gone one
    /// takes its result with it.
    fn plan_checks(&mut self, planned: Vec<PlannedCheck>) {
        self.checks.retain(|id, _| planned.iter().any(|check| check.initial.id == *id));
        for check in &planned {
            self.checks
                .entry(check.initial.id.clone())
                .or_insert_with(|| CheckResult { timestamp: now(), ..check.initial.clone() });
        }
        self.plans.send_if_modified(|plans| {
            let changed = *plans != planned;
            if changed {
                *plans = planned;
            }
            changed
        });
    }

    /// Judges the health; when to look again.
    fn judge(&mut self, states: &BTreeMap<String, TaskState>) -> Option<Instant> {
        let Health::Watching(tracker) = &mut self.health else { return None };
        let (healthy, reason) = match tracker.observe(Instant::now(), states, &self.checks) {
            Verdict::Pending(wake) => return Some(wake),
            Verdict::Healthy => (true, None),
            Verdict::Unhealthy(reason) => (false, Some(reason)),
        };
        tracing::info!(alloc = %self.alloc.id, healthy, ?reason, "allocation health decided");
        if let Some(reason) = reason {
            for queue in self.control.tasks.values() {
                let event = TaskEvent::new(TaskEvent::ALLOC_UNHEALTHY, now(), reason.clone());
                let _ = queue.send(TaskCommand::Record(event));
            }
        }
        self.health = Health::Decided(AllocHealth { healthy, timestamp: now(), modify_index: 0 });
        None
    }
}

/// The allocation's client status from its tasks' states, as Nomad's.
pub fn client_status(states: &BTreeMap<String, TaskState>) -> (ClientStatus, String) {
    let any = |check: &dyn Fn(&TaskState) -> bool| states.values().any(check);
    if any(&|state| state.state == TaskStatus::Dead && state.failed) {
        (ClientStatus::Failed, "Failed tasks".to_string())
    } else if any(&|state| state.state == TaskStatus::Running) {
        (ClientStatus::Running, "Tasks are running".to_string())
    } else if any(&|state| state.state == TaskStatus::Pending) {
        (ClientStatus::Pending, "No tasks have started".to_string())
    } else {
        (ClientStatus::Complete, "All tasks have completed".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allocation_follows_its_tasks() {
        let state = |status, failed| TaskState { state: status, failed, ..TaskState::default() };
        let mut states = BTreeMap::from([("a".to_string(), state(TaskStatus::Pending, false))]);
        assert_eq!(client_status(&states).0, ClientStatus::Pending);
        states.insert("b".to_string(), state(TaskStatus::Running, false));
        assert_eq!(client_status(&states).0, ClientStatus::Running);
        states.insert("a".to_string(), state(TaskStatus::Dead, false));
        states.insert("b".to_string(), state(TaskStatus::Dead, false));
        assert_eq!(client_status(&states).0, ClientStatus::Complete);
        states.insert("b".to_string(), state(TaskStatus::Dead, true));
        assert_eq!(client_status(&states), (ClientStatus::Failed, "Failed tasks".to_string()));
    }
}
