//! Drover's scheduler engine: the state store, the eval broker, blocked
//! evals, the schedulers, plan applier, workers and the node lifecycle
//! (heartbeats and the reconnect protocol). The engine opens no socket and
//! starts no runtime; time comes from an injected [`clock::Clock`].
//!
//! Layers, lowest first (nothing imports a layer above it; `LAYERS` in
//! `tests/layers.rs` checks them on the source): `clock`, `sync`, `timing`,
//! `structs`, `state`, `scheduler`, `job_plan`, `eval`, `plan`, `router`,
//! `node`, `worker`, `job_endpoint`, `acl_endpoint`, `operator_endpoint`,
//! `deployment`, `server`, `testing`.
#![forbid(unsafe_code)]

pub mod acl_endpoint;
pub mod clock;
pub mod deployment;
pub mod eval;
pub mod events;
pub mod gc;
pub mod job_endpoint;
pub mod job_plan;
pub mod node;
pub mod operator_endpoint;
pub mod periodic;
pub mod plan;
pub mod router;
pub mod scheduler;
pub mod server;
pub mod state;
pub mod structs;
pub mod sync;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod timing;
pub mod worker;
