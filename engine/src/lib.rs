//! Drover's scheduler engine: the state store, the eval broker, blocked
//! evals, the schedulers, plan applier, workers and the node lifecycle
//! (heartbeats and the reconnect protocol). The engine opens no socket; time comes from an injected
//! [`clock::Clock`].
#![forbid(unsafe_code)]

pub mod blocked;
pub mod broker;
pub mod clock;
pub mod heartbeat;
pub mod job_endpoint;
pub mod node_endpoint;
pub mod plan_apply;
pub mod plan_queue;
pub mod reaper;
pub mod router;
pub mod scheduler;
pub mod server;
pub mod state;
#[cfg(any(test, feature = "testing"))]
pub mod stepped;
pub mod structs;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod update_batch;
pub mod worker;
