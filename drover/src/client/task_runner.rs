//! One task's life on its client (Nomad's task runner): start it with the
//! driver, wait for it, apply the group's restart policy when it exits,
//! stop it when asked, and record every step as a task event.
//!
//! 1. Start: `Started`, state `running`; or `Driver Failure`, or `Failed
//!    Validation` for a driver config naming an unknown `${...}`. A task
//!    that cannot run as written (its command does not exist, its config
//!    does not interpolate) is `Not Restarting` and dead, failed; a failure
//!    of the node's side (the executor could not start) counts as a failed
//!    run.
//! 2. Exit: `Terminated` with the exit code, signal and OOM kill; then the
//!    restart tracker decides: `Restarting` (state `pending` for the
//!    delay), done (dead), or `Not Restarting` (dead, failed).
//! 3. Stop (the servers stopped the allocation, or a sibling task failed):
//!    (step 6), `Killing` with the kill timeout, the kill signal to the process
//!    group, SIGKILL after the timeout, `Killed`; dead, not failed.
//! 4. An operator's restart while it runs ([`TaskCommand::Restart`]):
//!    `Restart Signaled`, the kill signal and timeout as in a stop,
//!    `Terminated`, `Restarting` at once, started again; the restart
//!    policy does not count it, as Nomad's does not. An operator's signal
//!    ([`TaskCommand::Signal`]): `Signaling`, and the signal to the task's
//!    own process. Either, asked of a task that does not run now, is
//!    answered [`NotRunning`].
//! 5. A failing check's restart ([`TaskCommand::CheckRestart`]): `Restart
//!    Signaled` with the check's reason, the kill as in a stop, then the
//!    restart policy decides as after a failed run.
//! 6. A stop with a `shutdown_delay` (the task's plus its group's): first
//!    `Waiting for shutdown delay`, which deregisters its services, then
//!    the delay, then the kill.
//! 7. Templates (`template.rs`): rendered before every start; a failure
//!    is `Killing` with `Template failed: <why>` and the task is dead,
//!    failed. While it runs, a changed rendering restarts it as in 4 (with
//!    the reason `Template with change_mode restart re-rendered`), signals
//!    it (`Signaling`), or does nothing, as its `change_mode` says; a
//!    rendering that fails then kills it, failed.
//!
//! Every change is sent to the allocation runner with the task's handle,
//! which it saves for re-attaching.

use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::structs::{Allocation, Task, TaskEvent, TaskState, TaskStatus};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use rustix::process::Signal;
use tokio::sync::{mpsc, oneshot, watch};

use crate::client::alloc_dir::AllocDir;
use crate::client::clock::now;
use crate::client::drivers::executor::ExitRecord;
use crate::client::drivers::{Drivers, HandleState, Reattached, StartError, TaskHandle};
use crate::client::restarts::{Decision, RestartTracker};
use crate::client::service_watch::ServiceWatch;
use crate::client::task_env::TaskEnv;
use crate::client::template::{TaskTemplates, TemplateAction, TemplateError, TemplateSite};

/// Why the tasks of an allocation are being stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KillReason {
    /// The servers stopped the allocation (or the agent is shutting down
    /// in dev mode).
    Stop,
    /// This task of the allocation failed.
    SiblingFailed(String),
}

/// What an operator asks of a running task (module docs, 4).
#[derive(Debug)]
pub enum TaskCommand {
    /// Restart it in place; answered once it was killed.
    Restart(oneshot::Sender<Result<(), NotRunning>>),
    /// Send its process this signal, by name (`SIGUSR1`).
    Signal(Signal, String, oneshot::Sender<Result<(), NotRunning>>),
    /// Its failing check asks for a restart (`check_restart`), for this
    /// reason: it is killed and restarted through its restart policy,
    /// which counts it as a failure. Dropped unless it runs.
    CheckRestart(String),
    /// Record this event (the allocation's health verdict). Dropped
    /// unless it runs.
    Record(TaskEvent),
}

/// The task does not run now (it is starting, waiting to restart, or dead).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the task is not running")]
pub struct NotRunning;

impl TaskCommand {
    /// Answers that the task does not run now.
    fn not_running(self) {
        let _ = match self {
            TaskCommand::Restart(reply) | TaskCommand::Signal(_, _, reply) => reply.send(Err(NotRunning)),
            TaskCommand::CheckRestart(_) | TaskCommand::Record(_) => Ok(()),
        };
    }
}

/// A task's state after a change, for its allocation runner.
#[derive(Debug)]
pub struct TaskUpdate {
    /// The task.
    pub task: String,
    /// Its state now.
    pub state: TaskState,
    /// Its running process, if any.
    pub handle: Option<HandleState>,
}

/// What a task runner works with.
#[derive(Debug)]
pub struct TaskContext {
    /// The drivers.
    pub drivers: Drivers,
    /// The allocation.
    pub alloc: Arc<Allocation>,
    /// The task.
    pub task: Task,
    /// The allocation's directories.
    pub dir: AllocDir,
    /// Its variables.
    pub env: TaskEnv,
    /// See [`crate::client::alloc_runner::RunnerContext::servers_reached`].
    pub servers_reached: watch::Receiver<bool>,
    /// The agent's service reads, for the task's templates.
    pub services: ServiceWatch,
}

/// The restart reason of a re-rendered template (Nomad's).
const TEMPLATE_RESTART: &str = "Template with change_mode restart re-rendered";

/// Runs the task until it is dead. `restored` is the task's handle saved
/// before the agent restarted, if it was running: it is looked for first.
pub async fn run(
    ctx: TaskContext,
    mut state: TaskState,
    restored: Option<HandleState>,
    updates: mpsc::UnboundedSender<TaskUpdate>,
    mut kill: watch::Receiver<Option<KillReason>>,
    mut commands: mpsc::UnboundedReceiver<TaskCommand>,
) {
    let publish = |state: &TaskState, handle: Option<HandleState>| {
        let _ = updates.send(TaskUpdate { task: ctx.task.name.clone(), state: state.clone(), handle });
    };
    let batch = ctx.alloc.job.job_type.is_batch_like();
    let policy = ctx
        .alloc
        .job
        .group(&ctx.alloc.task_group)
        .map(|group| ctx.task.effective_restart_policy(group).clone())
        .unwrap_or_default();
    let mut tracker = RestartTracker::new(policy, batch);
    let mut rng = SmallRng::from_os_rng();
    let mut templates = templates_of(&ctx);
    let restored = match restored {
        Some(saved) => Some(ctx.drivers.reattach(saved, &ctx.dir, &ctx.task).await),
        None => None,
    };
    match &restored {
        Some(Reattached::Running(handle)) => {
            tracing::info!(alloc = %ctx.alloc.id, task = %ctx.task.name, handle = ?handle.state(), "re-attached to a running task")
        }
        Some(_) => {
            tracing::warn!(alloc = %ctx.alloc.id, task = %ctx.task.name, "task found dead after the agent restarted")
        }
        None => {}
    }
    let mut handle = match restored {
        Some(Reattached::Running(handle)) => {
            state.push_event(TaskEvent::new(TaskEvent::REATTACHED, now(), "Agent restarted; task still running"));
            publish(&state, Some(handle.state()));
            Some(handle)
        }
        Some(found) => {
            let record = match found {
                Reattached::Exited(record) => Some(record),
                _ => None,
            };
            terminated(&mut state, record.as_ref());
            publish(&state, None);
            // As Nomad: restart it in place by its restart policy, but only
            // once the servers' view is applied, so a task they stopped
            // meanwhile is not started again.
            let mut reached = ctx.servers_reached.clone();
            tokio::select! {
                _ = reached.wait_for(|reached| *reached) => {}
                Ok(()) = kill.changed() => {}
            }
            if kill.borrow().is_some() {
                finish(&mut state, false, None);
                publish(&state, None);
                return;
            }
            let success = record.as_ref().is_some_and(ExitRecord::success);
            let mut waits = Waits { kill: &mut kill, commands: &mut commands };
            if !restart_or_end(&ctx, &mut state, &mut tracker, success, &mut rng, &publish, &mut waits).await {
                return;
            }
            None
        }
        None => None,
    };
    loop {
        if kill.borrow().is_some() && handle.is_none() {
            finish(&mut state, false, None);
            publish(&state, None);
            return;
        }
        let mut running = match handle.take() {
            Some(running) => running,
            None => match render_templates(&ctx, &mut templates, &mut state, &mut kill, &mut commands).await {
                None => {
                    publish(&state, None);
                    return;
                }
                Some(env) => match start(&ctx, &env, &mut state).await {
                    Ok(running) => {
                        publish(&state, Some(running.state()));
                        running
                    }
                    Err(StartError::Unrunnable(_) | StartError::InvalidConfig(_)) => {
                        finish(&mut state, true, Some("Error was unrecoverable"));
                        publish(&state, None);
                        return;
                    }
                    Err(StartError::Driver(_)) => {
                        let mut waits = Waits { kill: &mut kill, commands: &mut commands };
                        if restart_or_end(&ctx, &mut state, &mut tracker, false, &mut rng, &publish, &mut waits).await {
                            continue;
                        }
                        return;
                    }
                },
            },
        };
        let record = loop {
            tokio::select! {
                record = running.wait() => break Some((record, false)),
                Ok(()) = kill.changed() => {
                    let reason = kill.borrow().clone();
                    stop(&ctx, &mut state, &mut running, reason, &publish).await;
                    publish(&state, None);
                    return;
                }
                Some(command) = commands.recv() => match command {
                    TaskCommand::Signal(signal, name, reply) => {
                        signal_task(&mut state, &mut running, signal, name).await;
                        publish(&state, Some(running.state()));
                        let _ = reply.send(Ok(()));
                    }
                    TaskCommand::Restart(reply) => {
                        restart_in_place(&ctx, &mut state, &mut running, &publish, "User requested restart").await;
                        publish(&state, None);
                        let _ = reply.send(Ok(()));
                        break None;
                    }
                    TaskCommand::CheckRestart(reason) => {
                        let record = kill_to_restart(&ctx, &mut state, &mut running, &publish, &reason).await;
                        break Some((record, true));
                    }
                    TaskCommand::Record(event) => {
                        state.push_event(event);
                        publish(&state, Some(running.state()));
                    }
                },
                change = templates.changed(), if !templates.is_empty() => match change {
                    Ok(TemplateAction::Restart) => {
                        restart_in_place(&ctx, &mut state, &mut running, &publish, TEMPLATE_RESTART).await;
                        publish(&state, None);
                        break None;
                    }
                    Ok(TemplateAction::Signal(names)) => {
                        for name in names {
                            if let Some(signal) = crate::client::drivers::raw_exec::signal(&name) {
                                signal_task(&mut state, &mut running, signal, name).await;
                            }
                        }
                        publish(&state, Some(running.state()));
                    }
                    Err(error) => {
                        template_failed(&mut state, &error);
                        publish(&state, Some(running.state()));
                        running.stop(ctx.task.kill_signal.as_deref(), ctx.task.kill_timeout).await;
                        state.push_event(TaskEvent::new(TaskEvent::KILLED, now(), "Task killed: a template failed"));
                        finish(&mut state, true, None);
                        publish(&state, None);
                        return;
                    }
                },
            }
        };
        let Some((record, check_failed)) = record else { continue };
        terminated(&mut state, record.as_ref());
        let success = !check_failed && record.as_ref().is_some_and(ExitRecord::success);
        let mut waits = Waits { kill: &mut kill, commands: &mut commands };
        if !restart_or_end(&ctx, &mut state, &mut tracker, success, &mut rng, &publish, &mut waits).await {
            return;
        }
    }
}

/// What a task waits on besides its process: a stop, and an operator's
/// commands, answered [`NotRunning`] while it does not run.
struct Waits<'a> {
    kill: &'a mut watch::Receiver<Option<KillReason>>,
    commands: &'a mut mpsc::UnboundedReceiver<TaskCommand>,
}

/// The task's templates, rendered with its variables (not the agent's).
fn templates_of(ctx: &TaskContext) -> TaskTemplates {
    let site = TemplateSite {
        task_dir: ctx.dir.task_dir(&ctx.task.name),
        host_sources: ctx.task.driver == engine::structs::RAW_EXEC,
    };
    let vars = ctx.env.process_env(&ctx.task, std::iter::empty(), &Default::default());
    TaskTemplates::new(ctx.task.templates.clone(), site, vars, &ctx.alloc.namespace, ctx.services.clone())
}

/// Renders the templates before a start (module docs, 7): the variables
/// to start with, or `None` when the task is done (a template failed, or
/// a stop came while waiting for service data), its state set.
async fn render_templates(
    ctx: &TaskContext,
    templates: &mut TaskTemplates,
    state: &mut TaskState,
    kill: &mut watch::Receiver<Option<KillReason>>,
    commands: &mut mpsc::UnboundedReceiver<TaskCommand>,
) -> Option<TaskEnv> {
    if templates.is_empty() {
        return Some(ctx.env.clone());
    }
    let rendering = templates.render_for_start();
    tokio::pin!(rendering);
    let rendered = loop {
        tokio::select! {
            rendered = &mut rendering => break rendered,
            Ok(()) = kill.changed() => {
                finish(state, false, None);
                return None;
            }
            // Not started yet: an operator's command (or a check's restart
            // from the last run) is answered at once, never held.
            Some(command) = commands.recv() => command.not_running(),
        }
    };
    match rendered {
        Ok(vars) => Some(ctx.env.with_template_vars(vars)),
        Err(error) => {
            tracing::warn!(alloc = %ctx.alloc.id, task = %ctx.task.name, %error, "template failed");
            template_failed(state, &error);
            finish(state, true, None);
            None
        }
    }
}

/// Records Nomad's event for a failed template.
fn template_failed(state: &mut TaskState, error: &TemplateError) {
    let message = format!("Template failed: {error}");
    let event = TaskEvent::new(TaskEvent::KILLING, now(), message.clone())
        .with_detail("kill_reason", message)
        .with_detail("fails_task", "true");
    state.push_event(event);
}

/// Sends `signal` (named `name`) to the task's process: `Signaling`.
async fn signal_task(state: &mut TaskState, running: &mut TaskHandle, signal: Signal, name: String) {
    let event = TaskEvent::new(TaskEvent::SIGNALING, now(), format!("Task being sent signal {name}"));
    running.signal(signal, &name).await;
    state.push_event(event.with_detail("signal", name));
}

/// A restart in place (module docs, 4 and 7): the task is killed as in a
/// stop and marked to start again at once, for `reason`.
async fn restart_in_place(
    ctx: &TaskContext,
    state: &mut TaskState,
    running: &mut TaskHandle,
    publish: &impl Fn(&TaskState, Option<HandleState>),
    reason: &str,
) {
    let record = kill_to_restart(ctx, state, running, publish, reason).await;
    terminated(state, record.as_ref());
    let event = TaskEvent::new(TaskEvent::RESTARTING, now(), format!("Restarting in {}", show(Duration::ZERO)))
        .with_detail("restart_reason", reason)
        .with_detail("start_delay", "0");
    state.push_event(event);
    state.state = TaskStatus::Pending;
    state.restarts += 1;
    state.last_restart = Some(now());
}

/// The kill of a restart (an operator's, a template's or a check's):
/// `Restart Signaled` with `reason`, said before the kill so its services
/// are deregistered first, then the kill signal and timeout as in a stop.
async fn kill_to_restart(
    ctx: &TaskContext,
    state: &mut TaskState,
    running: &mut TaskHandle,
    publish: &impl Fn(&TaskState, Option<HandleState>),
    reason: &str,
) -> Option<ExitRecord> {
    state.push_event(TaskEvent::new(TaskEvent::RESTART_SIGNALED, now(), reason).with_detail("restart_reason", reason));
    publish(state, Some(running.state()));
    tracing::info!(alloc = %ctx.alloc.id, task = %ctx.task.name, "restarting task: {reason}");
    let (record, _) = running.stop(ctx.task.kill_signal.as_deref(), ctx.task.kill_timeout).await;
    record
}

/// Starts the task with the variables `env`; records `Started` or `Driver Failure`.
async fn start(ctx: &TaskContext, env: &TaskEnv, state: &mut TaskState) -> Result<TaskHandle, StartError> {
    let mut events = Vec::new();
    let started = ctx.drivers.start(&ctx.alloc, &ctx.task, &ctx.dir, env, &mut events).await;
    for event in events {
        state.push_event(event);
    }
    match started {
        Ok(handle) => {
            state.state = TaskStatus::Running;
            state.started_at = Some(now());
            state.finished_at = None;
            let (key, value) = handle.started_detail();
            let event = TaskEvent::new(TaskEvent::STARTED, now(), "Task started by client").with_detail(key, value);
            state.push_event(event);
            Ok(handle)
        }
        Err(error) => {
            let message = error.to_string();
            let event = match &error {
                StartError::InvalidConfig(_) => TaskEvent::new(TaskEvent::FAILED_VALIDATION, now(), message.clone())
                    .with_detail("validation_error", message),
                _ => TaskEvent::new(TaskEvent::DRIVER_FAILURE, now(), message.clone())
                    .with_detail("driver_error", message),
            };
            state.push_event(event);
            Err(error)
        }
    }
}

/// Asks the tracker; records the decision. Returns whether to start the
/// task again (after the delay, unless a stop came meanwhile).
async fn restart_or_end(
    ctx: &TaskContext,
    state: &mut TaskState,
    tracker: &mut RestartTracker,
    success: bool,
    rng: &mut SmallRng,
    publish: &impl Fn(&TaskState, Option<HandleState>),
    waits: &mut Waits<'_>,
) -> bool {
    match tracker.exited(success, Instant::now(), rng) {
        Decision::Done => {
            finish(state, false, None);
            publish(state, None);
            false
        }
        Decision::Fail { reason } => {
            finish(state, true, Some(&reason));
            publish(state, None);
            false
        }
        Decision::Restart { delay, reason } => {
            let event = TaskEvent::new(TaskEvent::RESTARTING, now(), format!("Restarting in {}", show(delay)))
                .with_detail("restart_reason", reason)
                .with_detail("start_delay", delay.as_nanos().to_string());
            state.push_event(event);
            state.state = TaskStatus::Pending;
            state.restarts += 1;
            state.last_restart = Some(now());
            publish(state, None);
            tracing::info!(alloc = %ctx.alloc.id, task = %ctx.task.name, delay = %show(delay), "restarting task");
            let sleep = tokio::time::sleep(delay);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    _ = &mut sleep => return true,
                    Ok(()) = waits.kill.changed() => {
                        finish(state, false, None);
                        publish(state, None);
                        return false;
                    }
                    Some(command) = waits.commands.recv() => command.not_running(),
                }
            }
        }
    }
}

/// Records the `Terminated` event of an exit.
fn terminated(state: &mut TaskState, record: Option<&ExitRecord>) {
    let mut event = match record {
        Some(record) => {
            let mut message =
                format!("Exit Code: {}", record.exit_code.map_or("unknown".to_string(), |c| c.to_string()));
            if let Some(signal) = record.signal {
                message.push_str(&format!(", Signal: {signal}"));
            }
            if record.oom_killed {
                message.push_str(", OOM Killed");
            }
            let mut event = TaskEvent::new(TaskEvent::TERMINATED, now(), message);
            event.exit_code = record.exit_code.map(i64::from);
            event.signal = record.signal;
            event.with_detail("oom_killed", record.oom_killed.to_string())
        }
        None => TaskEvent::new(
            TaskEvent::TERMINATED,
            now(),
            "Exit Code: unknown (the task's executor is gone without recording its exit)",
        ),
    };
    if record.is_none() {
        event = event.with_detail("exit_code", "unknown");
    }
    state.push_event(event);
}

/// Marks the task dead; `Not Restarting` with `reason` when given.
fn finish(state: &mut TaskState, failed: bool, reason: Option<&str>) {
    if let Some(reason) = reason {
        state.push_event(TaskEvent::new(TaskEvent::NOT_RESTARTING, now(), reason.to_string()));
    }
    state.state = TaskStatus::Dead;
    state.failed = failed;
    state.finished_at = Some(now());
}

/// The stop sequence: `Killing`, the kill signal, the timeout, SIGKILL, `Killed`.
async fn stop(
    ctx: &TaskContext,
    state: &mut TaskState,
    running: &mut TaskHandle,
    reason: Option<KillReason>,
    publish: &impl Fn(&TaskState, Option<HandleState>),
) {
    if let Some(KillReason::SiblingFailed(sibling)) = &reason {
        let event = TaskEvent::new(TaskEvent::SIBLING_FAILED, now(), format!("Task's sibling {sibling:?} failed"));
        state.push_event(event);
    }
    shutdown_delay(ctx, state, running, publish).await;
    let timeout = ctx.task.kill_timeout;
    let signal = match (&ctx.task.kill_signal, &*running) {
        // Docker's stop sends the image's stop signal (SIGTERM unless it
        // names one), as Nomad's docker driver without a kill_signal.
        (None, TaskHandle::Container(_)) => "the image's stop signal",
        _ => ctx.task.kill_signal(),
    };
    let event = TaskEvent::new(
        TaskEvent::KILLING,
        now(),
        format!("Sent {signal}; waiting {} before force killing", show(timeout)),
    )
    .with_detail("kill_timeout", timeout.as_nanos().to_string());
    state.push_event(event);
    // Said before the kill, so its services are deregistered first.
    publish(state, Some(running.state()));
    let (_, forced) = running.stop(ctx.task.kill_signal.as_deref(), timeout).await;
    let message = if forced { "Task killed after its kill timeout" } else { "Task successfully killed" };
    state.push_event(TaskEvent::new(TaskEvent::KILLED, now(), message));
    finish(state, false, None);
}

/// Waits the task's and its group's `shutdown_delay` with its services
/// deregistered (`Waiting for shutdown delay`), before its kill.
async fn shutdown_delay(
    ctx: &TaskContext,
    state: &mut TaskState,
    running: &TaskHandle,
    publish: &impl Fn(&TaskState, Option<HandleState>),
) {
    let group = ctx.alloc.job.group(&ctx.alloc.task_group).map_or(Duration::ZERO, |group| group.shutdown_delay);
    let delay = group + ctx.task.shutdown_delay;
    if delay.is_zero() {
        return;
    }
    let message = format!("Waiting for shutdown_delay of {} before killing the task.", show(delay));
    state.push_event(TaskEvent::new(TaskEvent::WAITING_SHUTDOWN_DELAY, now(), message));
    publish(state, Some(running.state()));
    tokio::time::sleep(delay).await;
}

/// A duration as people read it (`1.25s`).
fn show(duration: Duration) -> String {
    format!("{:.3?}", duration)
}
