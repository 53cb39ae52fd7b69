//! Evaluations between their write and their end: the [`broker::EvalBroker`]
//! that hands them to workers, the [`blocked::BlockedEvals`] tracker that
//! parks those that could not place everything, and the
//! [`reaper::EvalReaper`] that writes what the two set aside.

pub mod blocked;
pub mod broker;
pub mod reaper;
pub mod wake;
