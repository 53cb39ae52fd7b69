//! What follows a write: the hooks Nomad's FSM runs after applying a log
//! entry, as the state store's [`ApplyHook`]. The server installs it while
//! it leads, so it runs after every applied command, whoever wrote it:
//! 1. pending evals go to the broker (delayed ones wait there; one a worker
//!    still holds is enqueued again when that worker acks);
//! 2. blocked evals go to the blocked tracker;
//! 3. a complete eval that placed everything untracks its job's blocked eval;
//! 4. capacity changes unblock evals of the node's class and system evals
//!    waiting on the node.

use std::sync::Arc;

use crate::eval::blocked::BlockedEvals;
use crate::eval::broker::EvalBroker;
use crate::state::{Applied, ApplyHook};
use crate::structs::{EvalStatus, Evaluation};

/// Routes what each applied command did; see the module docs.
#[derive(Debug, Clone)]
pub struct Router {
    broker: Arc<EvalBroker>,
    blocked: Arc<BlockedEvals>,
}

impl Router {
    /// A router into the given broker and blocked tracker.
    pub fn new(broker: Arc<EvalBroker>, blocked: Arc<BlockedEvals>) -> Self {
        Router { broker, blocked }
    }

    /// Routes an applied command's evals and capacity changes.
    pub fn route(&self, applied: &Applied) {
        for eval in &applied.evals {
            self.route_eval(eval);
        }
        for change in &applied.capacity_changes {
            self.blocked.unblock(change.computed_class, applied.index);
            self.blocked.unblock_node(change.node_id, applied.index);
        }
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

impl ApplyHook for Router {
    fn after_apply(&self, applied: &Applied) {
        self.route(applied);
    }
}
