//! Plans between a worker and the state: the [`queue::PlanQueue`] they wait
//! in and the serialized [`apply::PlanApplier`], the only place plans become
//! state, which also holds every task group's disruption budget
//! ([`budget`]).

pub mod apply;
pub mod budget;
pub mod queue;
