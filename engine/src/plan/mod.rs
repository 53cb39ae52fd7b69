//! Plans between a worker and the state: the [`queue::PlanQueue`] they wait
//! in and the serialized [`apply::PlanApplier`], the only place plans become
//! state.

pub mod apply;
pub mod queue;
