//! The node lifecycle: the [`endpoint::NodeEndpoint`] clients call
//! (Register, UpdateStatus, UpdateAlloc, watching their allocations), the
//! [`heartbeat`] timers, the batching of client alloc updates
//! ([`update_batch`]), the pure decisions of the reconnect protocol
//! ([`transitions`]), what agents read of the services table for
//! their templates ([`service_reads`]), the leader's follow-up of
//! draining nodes ([`drainer`]), and the guard that holds nodes
//! `disconnected` under mass heartbeat loss ([`storm`]).

pub mod drainer;
pub mod endpoint;
pub mod heartbeat;
pub mod service_reads;
pub mod storm;
pub mod transitions;
pub mod update_batch;

pub use endpoint::{NodeEndpoint, NodeError, NodeResponse};
