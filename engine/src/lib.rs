//! Drover's scheduler engine: the state store, the eval broker, blocked
//! evals, and (as they land) the schedulers, plan applier, workers and node
//! lifecycle. The engine opens no socket; time comes from an injected
//! [`clock::Clock`].
#![forbid(unsafe_code)]

pub mod blocked;
pub mod broker;
pub mod clock;
pub mod job_endpoint;
pub mod node_endpoint;
pub mod plan_apply;
pub mod plan_queue;
pub mod reaper;
pub mod router;
pub mod scheduler;
pub mod server;
pub mod state;
pub mod structs;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod worker;
