//! The event stream's lines (`GET /v1/event/stream`), as Nomad writes
//! them: newline-delimited JSON, `{}` as a heartbeat, else the events of
//! one index.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One line of the stream: `{}` (the first line, and a heartbeat), the
/// events of one index, or, last, why the server ended the stream.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct EventFrame {
    /// The index whose events these are (absent in a heartbeat).
    #[serde(skip_serializing_if = "is_zero")]
    pub index: u64,
    /// The events (absent in a heartbeat).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<Event>,
    /// Why the server ended the stream (Drover's last line when it drops a
    /// subscriber; Nomad ends the stream without one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl EventFrame {
    /// Whether this is a heartbeat (`{}`).
    pub fn is_heartbeat(&self) -> bool {
        *self == EventFrame::default()
    }
}

fn is_zero(index: &u64) -> bool {
    *index == 0
}

/// One change (Nomad's `Event`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct Event {
    /// `Job`, `Evaluation`, `Allocation`, `Deployment`, `Node`, `Service`,
    /// `ACLToken` or `ACLPolicy`.
    pub topic: String,
    /// Why: named after the write that made the change (`JobRegistered`,
    /// `PlanResult`, `AllocationUpdated`, ...).
    #[serde(rename = "Type")]
    pub event_type: String,
    /// The object's id (a policy's name).
    pub key: String,
    /// The object's namespace (`""` for nodes and ACL objects).
    pub namespace: String,
    /// Other keys a subscription may name to get it: the job, a
    /// deployment, a service's name (`null` when none).
    pub filter_keys: Option<Vec<String>>,
    /// The index of the write.
    pub index: u64,
    /// `{"<Topic's object>": object}`: `Job`, `Evaluation`, `Allocation`
    /// (without its `Job`), `Deployment`, `Node`, `Service`, `ACLToken`
    /// (without its secret), `ACLPolicy`.
    pub payload: Value,
}
