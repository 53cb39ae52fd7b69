//! The `mock` task driver, as Nomad's: it runs nothing, it only pretends.
//! A task's `config.run_for` (a duration such as `"30s"`) says how long it
//! runs; without it, it runs until stopped. `config.exit_code` (default 0)
//! is how it ends. An allocation runs while all its tasks run; when the
//! first one ends the allocation is `complete` (exit code 0) or `failed`.
//! Until a real driver exists, this is the driver agents offer
//! (`driver.mock` in the node's attributes) when it is enabled.

use std::sync::Arc;
use std::time::Duration;

use engine::structs::{AllocId, Allocation, ClientStatus};
use tokio::sync::mpsc;

/// The driver's name, as jobs name it.
pub const DRIVER: &str = "mock";

/// An allocation whose task ended on its own.
#[derive(Debug)]
pub struct TaskEnd {
    /// The allocation.
    pub alloc_id: AllocId,
    /// `complete` or `failed`.
    pub status: ClientStatus,
    /// Why.
    pub description: String,
}

/// Starts `alloc`'s tasks: returns the status to report, its description
/// and the timer that ends the allocation (none when it runs until stopped
/// or could not start). The end is sent on `ended`.
pub fn start(
    alloc: &Arc<Allocation>,
    ended: &mpsc::UnboundedSender<TaskEnd>,
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
        let run_for = match task.config.get("run_for").map(|text| humantime::parse_duration(text)) {
            None => continue,
            Some(Ok(run_for)) => run_for,
            Some(Err(error)) => {
                return (ClientStatus::Failed, format!("task {:?}: run_for: {error}", task.name), None);
            }
        };
        let exit_code = match task.config.get("exit_code").map(|text| text.parse::<i64>()) {
            None => 0,
            Some(Ok(code)) => code,
            Some(Err(error)) => {
                return (ClientStatus::Failed, format!("task {:?}: exit_code: {error}", task.name), None);
            }
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
            let _ = ended.send(TaskEnd { alloc_id, status, description });
        })
        .abort_handle()
    });
    (ClientStatus::Running, "tasks started".to_string(), task)
}
