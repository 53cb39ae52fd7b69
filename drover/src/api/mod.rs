//! The HTTP API's typed model, shared by the server's handlers (which
//! serialize its answers), the CLI and the API client (which read them
//! back): Nomad's `api` package, one file per resource, every struct
//! serialized with Nomad's field names.
//!
//! - `jobs.rs`: the job as answered, its stub, summary and scale status,
//!   the answers to job writes; `job_spec.rs`: the job as clients submit
//!   it, read leniently and converted into the engine's job with Nomad's
//!   defaults (the server's register, `job validate` and `dev --job` all
//!   use it); `hcl.rs`: Nomad HCL2 job files into that JSON;
//!   `job_diff.rs`: the diff between two versions of a job; `job_plan.rs`:
//!   the answers to `job plan` and `job validate`.
//! - `allocations.rs`, `evaluations.rs`, `deployments.rs`, `nodes.rs`,
//!   `resources.rs`.
//! - `fs.rs` (an allocation's files and streamed frames) and `stats.rs`
//!   (an allocation's and a host's resource usage), the client operations'.
//! - `agent.rs` (agent, members, health, the scheduling workers),
//!   `search.rs`, `operator.rs` (raft), `metrics.rs`, `acl.rs`, `services.rs`
//!   (Nomad-native service discovery).
//! - `client.rs`: the API client; `format.rs`: times and Go durations.
//!
//! Answers are built from the engine's types by `From` impls here where
//! the engine's value is all they need, and by `http/nomad.rs` where they
//! read the state (a job's status, an allocation's node name). Unset
//! fields keep Nomad's "unset" values (`null`, `""`, `0`, `false`)
//! because Nomad's clients dereference them.

pub mod acl;
pub mod agent;
pub mod allocations;
pub mod client;
pub mod deployments;
pub mod evaluations;
pub mod events;
pub mod format;
pub mod fs;
pub mod hcl;
pub mod job_diff;
pub mod job_plan;
pub mod job_spec;
pub mod jobs;
pub mod metrics;
pub mod namespaces;
pub mod nodes;
pub mod operator;
pub mod periodic;
pub mod resources;
pub mod search;
pub mod service_spec;
pub mod services;
pub mod spec;
pub mod stats;
pub mod template_spec;

use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};

/// The region Drover serves (one region).
pub const REGION: &str = "global";

/// A job's namespace, which names one: `*` is refused (whether it exists
/// is the state's to say).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("namespace \"*\" names every namespace: a job needs one")]
pub struct EveryNamespace;

/// What a write's answer carries besides its result (Nomad's
/// `WriteMeta`/`QueryMeta` as the server writes them in the body).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct WriteMeta {
    /// The index the write committed at.
    pub index: u64,
    /// Milliseconds since the leader was last heard from: 0.
    pub last_contact: u64,
    /// Whether a leader is known: true.
    pub known_leader: bool,
}

impl WriteMeta {
    /// The meta of a write at `index`.
    pub fn at(index: u64) -> WriteMeta {
        WriteMeta { index, last_contact: 0, known_leader: true }
    }
}

/// An optional id as Nomad writes it: `""` for none.
pub fn id_or_empty(id: Option<impl std::fmt::Display>) -> String {
    id.map(|id| id.to_string()).unwrap_or_default()
}

/// An engine enum's word, as its serde name is Nomad's (`running`,
/// `service`, `=`, `fail`).
pub fn word(value: impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(word)) => word,
        other => unreachable!("an engine enum serializes to its name, not {other:?}"),
    }
}

/// The node attribute that carried an agent's own HTTP address, read into
/// a node's `HTTPAddr`. Agents no longer serve one, so Nomad's CLI, finding
/// none, reaches the client operations through the servers.
pub const ADVERTISE_ATTRIBUTE: &str = "unique.advertise.http";

/// The secret a request carries, if any.
pub fn secret_of(headers: &HeaderMap) -> Option<String> {
    if let Some(token) = headers.get("x-nomad-token").and_then(|value| value.to_str().ok()) {
        return Some(token.trim().to_string()).filter(|token| !token.is_empty());
    }
    let bearer = headers.get("authorization").and_then(|value| value.to_str().ok())?;
    bearer.strip_prefix("Bearer ").map(|token| token.trim().to_string()).filter(|token| !token.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_comes_from_x_nomad_token_or_a_bearer_header() {
        let mut headers = HeaderMap::new();
        headers.insert("authorization", "Bearer abc".parse().expect("header"));
        assert_eq!(secret_of(&headers).as_deref(), Some("abc"));
        headers.insert("x-nomad-token", "def".parse().expect("header"));
        assert_eq!(secret_of(&headers).as_deref(), Some("def"));
        assert_eq!(secret_of(&HeaderMap::new()), None);
    }
}
