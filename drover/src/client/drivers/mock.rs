//! The `mock` task driver, as Nomad's: it runs nothing, it only pretends.
//! A task's `config.run_for` (a duration such as `"30s"`) says how long it
//! runs; without it, it runs until stopped. `config.exit_code` (default 0)
//! is how it ends. An allocation runs while all its tasks run; when the
//! first one ends the allocation is `complete` (exit code 0) or `failed`.
//! This is the light path that loadgen's thousands of agents use: no task
//! runner, no restart policy, no task states, and no timer at all for an
//! allocation that runs until stopped.

use std::sync::Arc;
use std::time::Duration;

use engine::structs::{Allocation, ClientStatus, ConfigValue};
use tokio::sync::mpsc;

use crate::client::alloc_runner::AllocEvent;

/// The driver's name, as jobs name it.
pub const DRIVER: &str = engine::structs::MOCK;

/// Starts `alloc`'s tasks: returns the status to report, its description
/// and the timer that ends the allocation (none when it runs until stopped
/// or could not start). The end is sent on `ended`.
pub fn start(
    alloc: &Arc<Allocation>,
    ended: &mpsc::UnboundedSender<AllocEvent>,
) -> (ClientStatus, String, Option<tokio::task::AbortHandle>) {
    let Some(group) = alloc.job.task_groups.iter().find(|group| *group.name == *alloc.task_group) else {
        return (ClientStatus::Failed, format!("task group {:?} is not in the job", alloc.task_group), None);
    };
    let mut shortest: Option<(Duration, i64)> = None;
    for task in &group.tasks {
        if task.driver != DRIVER {
            return (
                ClientStatus::Failed,
                format!("task {:?}: driver {:?} is not available", task.name, task.driver),
                None,
            );
        }
        let text = |key: &str| task.config.get(key).map(|value| value.as_text().ok_or(value));
        let run_for = match text("run_for") {
            None => continue,
            Some(Ok(text)) => match humantime::parse_duration(&text) {
                Ok(run_for) => run_for,
                Err(error) => return (ClientStatus::Failed, format!("task {:?}: run_for: {error}", task.name), None),
            },
            Some(Err(value)) => return not_scalar(&task.name, "run_for", value),
        };
        let exit_code = match text("exit_code") {
            None => 0,
            Some(Ok(text)) => match text.parse::<i64>() {
                Ok(code) => code,
                Err(error) => return (ClientStatus::Failed, format!("task {:?}: exit_code: {error}", task.name), None),
            },
            Some(Err(value)) => return not_scalar(&task.name, "exit_code", value),
        };
        if shortest.is_none_or(|(known, _)| run_for < known) {
            shortest = Some((run_for, exit_code));
        }
    }
    let task = shortest.map(|(run_for, exit_code)| {
        let ended = ended.clone();
        let alloc_id = alloc.id;
        tokio::spawn(async move {
            tokio::time::sleep(run_for).await;
            let (status, description) = match exit_code {
                0 => (ClientStatus::Complete, "task exited with code 0".to_string()),
                code => (ClientStatus::Failed, format!("task exited with code {code}")),
            };
            let _ = ended.send(AllocEvent { alloc_id, status, description, task_states: Default::default() });
        })
        .abort_handle()
    });
    (ClientStatus::Running, "tasks started".to_string(), task)
}

fn not_scalar(task: &str, key: &str, value: &ConfigValue) -> (ClientStatus, String, Option<tokio::task::AbortHandle>) {
    (ClientStatus::Failed, format!("task {task:?}: {key} must be a string or number, not {}", value.kind()), None)
}
