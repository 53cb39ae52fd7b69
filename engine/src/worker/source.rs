//! Where a worker's evals come from, and where its plans and eval writes
//! go: [`WorkSource`]. On the leader that is its own broker, plan queue
//! and log ([`LocalWork`]); on a follower of a cluster it is the leader's,
//! over the network (the `drover` server's `ClusterWork`), so every server
//! schedules, as in Nomad.

use std::sync::Arc;
use std::time::Duration;

use crate::eval::broker::{BrokerError, Dequeued, EvalBroker, Token};
use crate::plan::queue::PlanQueue;
use crate::scheduler::PlanError;
use crate::state::{Command, PendingWrite, Writer};
use crate::structs::{EvalId, Evaluation, JobType, Plan, PlanResult};

/// Why a [`WorkSource`] did not do what a worker asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WorkError {
    /// The broker refused it.
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// The broker that handed the eval out could not be reached (its
    /// server lost the leadership, or the network failed); the eval's hold
    /// there ends with its nack timeout, or with that server's broker.
    #[error("the leader's eval broker could not be reached: {0}")]
    Unreachable(String),
}

/// Where a worker's evals come from and where its plans and eval writes go
/// (module docs). Every call blocks the calling worker thread.
pub trait WorkSource: Send + Sync + std::fmt::Debug {
    /// The next eval of `types`, waiting up to `timeout` for one. Only
    /// `Broker(ShuttingDown)` ends the worker: a source that waits for a
    /// leader answers `Ok(None)` instead.
    fn dequeue(&self, types: &[JobType], timeout: Duration) -> Result<Option<Dequeued>, WorkError>;
    /// The eval is done: its hold ends.
    fn ack(&self, eval: EvalId, token: Token) -> Result<(), WorkError>;
    /// The eval failed here: it goes back to the broker.
    fn nack(&self, eval: EvalId, token: Token) -> Result<(), WorkError>;
    /// The worker still works on the eval: its nack timeout starts again.
    fn outstanding_reset(&self, eval: EvalId, token: Token) -> Result<(), WorkError>;
    /// Submits a plan of an eval this source handed out (its token is in
    /// the plan) and waits for the applier's answer.
    fn submit_plan(&self, plan: Plan) -> Result<PlanResult, PlanError>;
    /// Writes evals the scheduler created or changed while it held `held`
    /// under `token`. The answer may come later (a local log's): the
    /// worker acks `held` only once every write it made for it is answered.
    fn submit_evals(&self, held: EvalId, token: Token, evals: Vec<Evaluation>) -> PendingWrite;
}

/// A server's own broker, plan queue and log: the leader's work source.
#[derive(Debug, Clone)]
pub struct LocalWork {
    /// The broker.
    pub broker: Arc<EvalBroker>,
    /// The plan applier's queue.
    pub plan_queue: Arc<PlanQueue>,
    /// The log evals are written to.
    pub writer: Writer,
}

impl WorkSource for LocalWork {
    fn dequeue(&self, types: &[JobType], timeout: Duration) -> Result<Option<Dequeued>, WorkError> {
        Ok(self.broker.dequeue(types, timeout)?)
    }

    fn ack(&self, eval: EvalId, token: Token) -> Result<(), WorkError> {
        Ok(self.broker.ack(eval, token)?)
    }

    fn nack(&self, eval: EvalId, token: Token) -> Result<(), WorkError> {
        Ok(self.broker.nack(eval, token)?)
    }

    fn outstanding_reset(&self, eval: EvalId, token: Token) -> Result<(), WorkError> {
        Ok(self.broker.outstanding_reset(eval, token)?)
    }

    fn submit_plan(&self, plan: Plan) -> Result<PlanResult, PlanError> {
        self.plan_queue.enqueue(plan).wait()
    }

    fn submit_evals(&self, _held: EvalId, _token: Token, evals: Vec<Evaluation>) -> PendingWrite {
        self.writer.submit(Command::UpsertEvals { evals })
    }
}
