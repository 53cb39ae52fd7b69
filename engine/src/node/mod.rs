//! The node lifecycle: the [`endpoint::NodeEndpoint`] clients call
//! (Register, UpdateStatus, UpdateAlloc, watching their allocations), the
//! [`heartbeat`] timers, the batching of client alloc updates
//! ([`update_batch`]), and the pure decisions of the reconnect protocol
//! ([`transitions`]).

pub mod endpoint;
pub mod heartbeat;
pub mod transitions;
pub mod update_batch;

pub use endpoint::{NodeEndpoint, NodeError, NodeResponse};
