//! What follows a write: the hooks Nomad's FSM runs after applying a log
//! entry. Every write that may create evaluations or free capacity goes
//! through [`Router::apply`]:
//! 1. pending evals go to the broker (delayed ones wait there);
//! 2. blocked evals go to the blocked tracker;
//! 3. a complete eval that placed everything untracks its job's blocked eval;
//! 4. capacity changes unblock evals of the node's class and system evals
//!    waiting on the node.

use std::sync::Arc;

use crate::eval::blocked::BlockedEvals;
use crate::eval::broker::EvalBroker;
use crate::state::{Applied, Command, StateError, StateStore};
use crate::structs::{EvalId, EvalStatus, Evaluation};

/// Applies commands and routes their effects; see the module docs.
#[derive(Debug, Clone)]
pub struct Router {
    store: Arc<StateStore>,
    broker: Arc<EvalBroker>,
    blocked: Arc<BlockedEvals>,
}

impl Router {
    /// A router over the given store, broker and blocked tracker.
    pub fn new(store: Arc<StateStore>, broker: Arc<EvalBroker>, blocked: Arc<BlockedEvals>) -> Self {
        Router { store, broker, blocked }
    }

    /// The store.
    pub fn store(&self) -> &Arc<StateStore> {
        &self.store
    }

    /// Applies `command` and routes everything it did.
    pub fn apply(&self, command: Command) -> Result<Applied, StateError> {
        let applied = self.store.apply(command)?;
        self.route(&applied, None);
        Ok(applied)
    }

    /// Routes an applied command's evals and capacity changes. The eval
    /// `held` (one a worker still holds in the broker) is left for the
    /// worker to route after its ack, or the broker would drop it as a
    /// duplicate of the held one.
    pub fn route(&self, applied: &Applied, held: Option<EvalId>) {
        for eval in applied.evals.iter().filter(|eval| Some(eval.id) != held) {
            self.route_eval(eval);
        }
        for change in &applied.capacity_changes {
            self.blocked.unblock(change.computed_class, applied.index);
            self.blocked.unblock_node(change.node_id, applied.index);
        }
    }

    /// Writes an eval created or updated while `held` is held by a worker,
    /// and routes it, leaving `held` to the worker (see [`Router::route`]).
    /// Returns `held` as stored when this write included it, so the worker
    /// can route a reblock after its ack.
    pub fn write_held_eval(&self, eval: Evaluation, held: EvalId) -> Result<Option<Arc<Evaluation>>, StateError> {
        let applied = self.store.apply(Command::UpsertEvals { evals: vec![eval] })?;
        self.route(&applied, Some(held));
        Ok(applied.evals.iter().find(|eval| eval.id == held).cloned())
    }

    /// Routes one stored eval (steps 1-3).
    pub fn route_eval(&self, eval: &Arc<Evaluation>) {
        match eval.status {
            EvalStatus::Pending => self.broker.enqueue(eval.clone()),
            EvalStatus::Blocked => self.blocked.block(eval.clone()),
            EvalStatus::Complete if eval.failed_tg_allocs.is_empty() && eval.blocked_eval.is_none() => {
                self.blocked.untrack(&eval.job_key());
            }
            EvalStatus::Complete | EvalStatus::Failed | EvalStatus::Canceled => {}
        }
    }
}
