//! The `mock` task driver, as Nomad's: it runs nothing, it only pretends.
//! A task's `config.run_for` (a duration such as `"30s"`) says how long it
//! runs; without it, it runs until stopped. `config.exit_code` (default 0)
//! is how it ends. An allocation runs while all its tasks run; when the
//! first one ends the allocation is `complete` (exit code 0) or `failed`.
//! This is the light path that loadgen's thousands of agents use: no task
//! runner, no restart policy, no task states, and no timer at all for an
//! allocation that runs until stopped.

use std::time::Duration;

use engine::structs::{Allocation, ClientStatus, ConfigValue};

/// The driver's name, as jobs name it.
pub const DRIVER: &str = engine::structs::MOCK;

/// How an allocation's mock tasks end by themselves: its shortest task's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MockEnd {
    /// After this long.
    pub after: Duration,
    /// With this exit code.
    pub exit_code: i64,
}

impl MockEnd {
    /// The allocation's status and its description once it has ended.
    pub fn outcome(&self) -> (ClientStatus, String) {
        match self.exit_code {
            0 => (ClientStatus::Complete, "task exited with code 0".to_string()),
            code => (ClientStatus::Failed, format!("task exited with code {code}")),
        }
    }
}

/// Reads `alloc`'s tasks: how it ends (`None`: it runs until stopped), or
/// why it cannot run. Pure: the client core decides with it.
pub fn plan(alloc: &Allocation) -> Result<Option<MockEnd>, String> {
    let Some(group) = alloc.job.task_groups.iter().find(|group| *group.name == *alloc.task_group) else {
        return Err(format!("task group {:?} is not in the job", alloc.task_group));
    };
    let mut shortest: Option<MockEnd> = None;
    for task in &group.tasks {
        if task.driver != DRIVER {
            return Err(format!("task {:?}: driver {:?} is not available", task.name, task.driver));
        }
        let text = |key: &str| task.config.get(key).map(|value| value.as_text().ok_or(value));
        let after = match text("run_for") {
            None => continue,
            Some(Ok(text)) => {
                humantime::parse_duration(&text).map_err(|error| format!("task {:?}: run_for: {error}", task.name))?
            }
            Some(Err(value)) => return Err(not_scalar(&task.name, "run_for", value)),
        };
        let exit_code = match text("exit_code") {
            None => 0,
            Some(Ok(text)) => {
                text.parse::<i64>().map_err(|error| format!("task {:?}: exit_code: {error}", task.name))?
            }
            Some(Err(value)) => return Err(not_scalar(&task.name, "exit_code", value)),
        };
        if shortest.is_none_or(|known| after < known.after) {
            shortest = Some(MockEnd { after, exit_code });
        }
    }
    Ok(shortest)
}

/// The timer that ends a started allocation: calls `ended` with its
/// outcome after `end.after`, unless aborted first.
pub fn end_after(end: MockEnd, ended: impl FnOnce(ClientStatus, String) + Send + 'static) -> tokio::task::AbortHandle {
    tokio::spawn(async move {
        tokio::time::sleep(end.after).await;
        let (status, description) = end.outcome();
        ended(status, description);
    })
    .abort_handle()
}

/// The light path's health verdict: a service allocation is healthy as it
/// starts (its tasks run at once and it has no checks to pass, so
/// `min_healthy_time` is not waited on), unless its deployment leaves
/// health to an operator (`health_check = "manual"`). Other job types need
/// no verdict.
pub fn health(alloc: &Allocation, now: engine::clock::Timestamp) -> Option<engine::structs::AllocHealth> {
    let group = alloc.job.group(&alloc.task_group)?;
    let manual = alloc.deployment_id.is_some() && group.health.mode == engine::structs::HealthCheckMode::Manual;
    if alloc.job.job_type != engine::structs::JobType::Service || manual {
        return None;
    }
    Some(engine::structs::AllocHealth { healthy: true, timestamp: now, modify_index: 0 })
}

fn not_scalar(task: &str, key: &str, value: &ConfigValue) -> String {
    format!("task {task:?}: {key} must be a string or number, not {}", value.kind())
}
