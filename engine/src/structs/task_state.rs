//! What a client tells the servers about each task of an allocation:
//! Nomad's `TaskState` (`State`, `Failed`, `Restarts`, `LastRestart`,
//! `StartedAt`, `FinishedAt`, `Events`) and `TaskEvent` (`Type`, `Time`,
//! `DisplayMessage`, `ExitCode`, `Signal`, `Details`), with Nomad's event
//! type names so its documentation and tooling read them.
//!
//! Contract: the client owns these. Each update that carries task states
//! replaces the allocation's whole map (the client sends every task), and
//! the servers only store and show them: scheduling reads the allocation's
//! client status, never its task states. Times are the client's wall clock.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;

/// The most events kept per task, newest last (Nomad keeps 10).
pub const MAX_TASK_EVENTS: usize = 10;

/// Where a task is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskStatus {
    /// Not started yet, or waiting to restart.
    Pending,
    /// Its process runs.
    Running,
    /// Finished for good: see `failed`.
    Dead,
}

/// One task's state on its client.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TaskState {
    /// Pending, running or dead.
    pub state: TaskStatus,
    /// Dead and failed (exited non-zero with no restart left, could not
    /// start, was found dead when its agent restarted).
    pub failed: bool,
    /// Restarts so far.
    pub restarts: u64,
    /// When it was last restarted.
    pub last_restart: Option<Timestamp>,
    /// When it last started.
    pub started_at: Option<Timestamp>,
    /// When it died for good.
    pub finished_at: Option<Timestamp>,
    /// The last [`MAX_TASK_EVENTS`] events, oldest first.
    pub events: Vec<TaskEvent>,
}

impl Default for TaskState {
    fn default() -> TaskState {
        TaskState {
            state: TaskStatus::Pending,
            failed: false,
            restarts: 0,
            last_restart: None,
            started_at: None,
            finished_at: None,
            events: Vec::new(),
        }
    }
}

impl TaskState {
    /// Appends `event`, dropping the oldest beyond [`MAX_TASK_EVENTS`].
    pub fn push_event(&mut self, event: TaskEvent) {
        self.events.push(event);
        if self.events.len() > MAX_TASK_EVENTS {
            let excess = self.events.len() - MAX_TASK_EVENTS;
            self.events.drain(..excess);
        }
    }
}

/// Something that happened to a task.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TaskEvent {
    /// Nomad's event type: one of the `TaskEvent::*` constants.
    pub event_type: String,
    /// When, on the client.
    pub time: Timestamp,
    /// A sentence for people (`Exit Code: 3`, `Restarting in 1.1s`).
    pub display_message: String,
    /// The exit code, when the event is an exit and it is known.
    pub exit_code: Option<i64>,
    /// The signal that ended the process, when one did.
    pub signal: Option<i32>,
    /// Further facts by name (`restart_reason`, `start_delay`,
    /// `kill_timeout`, `oom_killed`, `driver_error`), as Nomad's `Details`.
    pub details: BTreeMap<String, String>,
}

impl TaskEvent {
    /// The client received the task.
    pub const RECEIVED: &'static str = "Received";
    /// Its directories were built.
    pub const TASK_SETUP: &'static str = "Task Setup";
    /// Its process started.
    pub const STARTED: &'static str = "Started";
    /// Its process exited.
    pub const TERMINATED: &'static str = "Terminated";
    /// It will be started again after a delay.
    pub const RESTARTING: &'static str = "Restarting";
    /// Its restart policy gave up (or it must not restart).
    pub const NOT_RESTARTING: &'static str = "Not Restarting";
    /// The driver could not start it.
    pub const DRIVER_FAILURE: &'static str = "Driver Failure";
    /// Its driver config could not be read (an unknown `${...}` in it):
    /// the task fails without a restart.
    pub const FAILED_VALIDATION: &'static str = "Failed Validation";
    /// Its directories or environment could not be prepared.
    pub const SETUP_FAILURE: &'static str = "Setup Failure";
    /// A stop began: the kill signal was sent.
    pub const KILLING: &'static str = "Killing";
    /// It was stopped.
    pub const KILLED: &'static str = "Killed";
    /// Another task of its allocation failed, so it was stopped.
    pub const SIBLING_FAILED: &'static str = "Sibling Task Failed";
    /// Its agent restarted and found it still running (Drover's own; Nomad
    /// logs this instead of recording an event).
    pub const REATTACHED: &'static str = "Reattached";
    /// A restart was asked for: by an operator (`alloc restart`), or by
    /// its failing checks (`check_restart`).
    pub const RESTART_SIGNALED: &'static str = "Restart Signaled";
    /// Its services are deregistered; it is killed after its `shutdown_delay`.
    pub const WAITING_SHUTDOWN_DELAY: &'static str = "Waiting for shutdown delay";
    /// Its allocation was found unhealthy (the reason is the message).
    pub const ALLOC_UNHEALTHY: &'static str = "Alloc Unhealthy";
    /// An operator sent it a signal (`alloc signal`).
    pub const SIGNALING: &'static str = "Signaling";
    /// Its driver says what it is doing (`Downloading image`).
    pub const DRIVER: &'static str = "Driver";

    /// An event of `event_type` at `time` saying `message`.
    pub fn new(event_type: &str, time: Timestamp, message: impl Into<String>) -> TaskEvent {
        TaskEvent {
            event_type: event_type.to_string(),
            time,
            display_message: message.into(),
            exit_code: None,
            signal: None,
            details: BTreeMap::new(),
        }
    }

    /// The event with `key` = `value` in its details.
    pub fn with_detail(mut self, key: &str, value: impl Into<String>) -> TaskEvent {
        self.details.insert(key.to_string(), value.into());
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_last_events_are_kept() {
        let mut state = TaskState::default();
        for at in 0..15u64 {
            state.push_event(TaskEvent::new(TaskEvent::STARTED, Timestamp(at), "Task started by client"));
        }
        assert_eq!(state.events.len(), MAX_TASK_EVENTS);
        assert_eq!(state.events[0].time, Timestamp(5));
        let bytes = postcard::to_stdvec(&state).expect("encodes");
        assert_eq!(postcard::from_bytes::<TaskState>(&bytes).expect("decodes"), state);
    }
}
