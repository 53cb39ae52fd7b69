//! Schedulers: the business logic a worker runs for one evaluation.
//!
//! The contract: a [`Scheduler`] reads a [`State`] (a read-only view of a
//! snapshot) and writes only through a [`Planner`]: it submits plans, and
//! creates, updates and reblocks evaluations. It never touches the state
//! store or the broker directly, so the same code runs in a worker against
//! the plan applier and in the [`testing::Harness`] against an in-memory
//! recorder.

pub mod feasible;
pub mod generic;
pub mod preempt;
pub mod preference;
pub mod rank;
pub mod reconcile;
pub mod stack;
pub mod system;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod usage;
mod util;

#[cfg(test)]
mod deployment_test;
#[cfg(test)]
mod drain_test;
#[cfg(test)]
mod placement_test;
#[cfg(test)]
mod scheduler_test;

use std::sync::Arc;

use crate::clock::Timestamp;
use crate::state::{NodeList, Snapshot, StateError, WaitError};
use crate::structs::{
    Allocation, ComputedClass, Deployment, EvalId, Evaluation, Job, JobKey, JobType, Node, NodeId, Plan, PlanResult,
    PreemptionConfig, Resources, SchedulerConfiguration,
};

/// Scoring strategy for placements: bin-pack (Nomad's default) or spread.
pub use crate::structs::SchedulerAlgorithm as Algorithm;

/// A read-only view of the cluster state at one index.
pub trait State: Send + Sync {
    /// The index of this view.
    fn index(&self) -> u64;
    /// A node by id.
    fn node(&self, id: NodeId) -> Option<Arc<Node>>;
    /// A node by id, borrowed: no reference count taken (the hot path reads
    /// thousands per eval, and workers read the same nodes).
    fn node_ref(&self, id: NodeId) -> Option<&Node>;
    /// Every node, in no particular order.
    fn nodes(&self) -> Vec<Arc<Node>>;
    /// A job by key.
    fn job(&self, key: &JobKey) -> Option<Arc<Job>>;
    /// All allocations of a job, terminal ones included.
    fn allocs_by_job(&self, key: &JobKey) -> Vec<Arc<Allocation>>;
    /// All allocations on a node, terminal ones included.
    fn allocs_by_node(&self, id: NodeId) -> Vec<Arc<Allocation>>;
    /// Ready and eligible nodes, sorted by id (a persistent list: O(1) to take).
    fn schedulable_nodes(&self) -> NodeList;
    /// Every computed class with its nodes, whatever their status, in class order.
    fn class_nodes(&self) -> Vec<(ComputedClass, NodeList)>;
    /// Resources used by the live allocations on a node.
    fn node_usage(&self, id: NodeId) -> Resources;
    /// Whether a live allocation on a node holds a host port.
    fn port_in_use(&self, id: NodeId, port: u16) -> bool;
    /// How many host ports in `low..=high` live allocations on a node hold.
    fn ports_in_use_between(&self, id: NodeId, low: u16, high: u16) -> usize;
    /// The operator's scheduler configuration, if one was written.
    fn scheduler_config(&self) -> Option<SchedulerConfiguration>;
    /// A job's newest deployment.
    fn latest_deployment(&self, key: &JobKey) -> Option<Arc<Deployment>>;
}

impl State for Snapshot {
    fn index(&self) -> u64 {
        Snapshot::index(self)
    }
    fn node(&self, id: NodeId) -> Option<Arc<Node>> {
        Snapshot::node(self, id).cloned()
    }
    fn node_ref(&self, id: NodeId) -> Option<&Node> {
        Snapshot::node(self, id).map(|node| &**node)
    }
    fn nodes(&self) -> Vec<Arc<Node>> {
        Snapshot::nodes(self).cloned().collect()
    }
    fn job(&self, key: &JobKey) -> Option<Arc<Job>> {
        Snapshot::job(self, key).cloned()
    }
    fn allocs_by_job(&self, key: &JobKey) -> Vec<Arc<Allocation>> {
        Snapshot::allocs_by_job(self, key).cloned().collect()
    }
    fn allocs_by_node(&self, id: NodeId) -> Vec<Arc<Allocation>> {
        Snapshot::allocs_by_node(self, id).cloned().collect()
    }
    fn schedulable_nodes(&self) -> NodeList {
        Snapshot::schedulable_nodes(self).clone()
    }
    fn class_nodes(&self) -> Vec<(ComputedClass, NodeList)> {
        Snapshot::class_nodes(self)
    }
    fn node_usage(&self, id: NodeId) -> Resources {
        Snapshot::node_usage(self, id)
    }
    fn port_in_use(&self, id: NodeId, port: u16) -> bool {
        Snapshot::port_in_use(self, id, port)
    }
    fn ports_in_use_between(&self, id: NodeId, low: u16, high: u16) -> usize {
        Snapshot::ports_in_use_between(self, id, low, high)
    }
    fn scheduler_config(&self) -> Option<SchedulerConfiguration> {
        Snapshot::scheduler_config(self)
    }
    fn latest_deployment(&self, key: &JobKey) -> Option<Arc<Deployment>> {
        Snapshot::latest_deployment(self, key).cloned()
    }
}

/// Why a scheduler gave up on an evaluation. The worker nacks it, and
/// backs off by [`SchedulerError::is_retryable`]; shutdown is told apart
/// ([`SchedulerError::ShuttingDown`]) and never counted as a failure.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SchedulerError {
    /// The plan applier did not take the plan.
    #[error("plan not applied: {0}")]
    Plan(PlanError),
    /// Writing an eval failed.
    #[error("eval write failed: {0}")]
    Write(StateError),
    /// The state did not reach the index to re-plan against in time.
    #[error(transparent)]
    Wait(WaitError),
    /// The server is shutting down; the eval goes back to the broker.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The evaluation cannot be processed by this scheduler.
    #[error("invalid evaluation: {0}")]
    InvalidEval(String),
}

impl SchedulerError {
    /// Whether retrying soon may succeed (a conflict, a slow write), as
    /// opposed to a fault that needs a slower backoff.
    pub fn is_retryable(&self) -> bool {
        matches!(self, SchedulerError::Plan(_) | SchedulerError::Write(_) | SchedulerError::Wait(_))
    }
}

impl From<StateError> for SchedulerError {
    fn from(error: StateError) -> Self {
        match error {
            StateError::ShuttingDown => SchedulerError::ShuttingDown,
            other => SchedulerError::Write(other),
        }
    }
}

impl From<PlanError> for SchedulerError {
    fn from(error: PlanError) -> Self {
        match error {
            PlanError::ShuttingDown | PlanError::Write(StateError::ShuttingDown) => SchedulerError::ShuttingDown,
            other => SchedulerError::Plan(other),
        }
    }
}

impl From<WaitError> for SchedulerError {
    fn from(error: WaitError) -> Self {
        match error {
            WaitError::Shutdown { .. } => SchedulerError::ShuttingDown,
            timeout => SchedulerError::Wait(timeout),
        }
    }
}

/// Why a plan was not applied (what a [`Planner`] answers besides a result).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum PlanError {
    /// The eval's broker token is no longer outstanding: the worker's hold
    /// expired and another worker may have the eval.
    #[error("evaluation {0} is no longer held under this plan's token")]
    StaleToken(EvalId),
    /// The plan could not be written.
    #[error("plan could not be written: {0}")]
    Write(StateError),
    /// The plan queue is shutting down.
    #[error("the plan queue is shutting down")]
    ShuttingDown,
}

/// Where a scheduler's decisions go.
pub trait Planner {
    /// Submits a plan. The result says what was committed; when part was
    /// refused it carries a `refresh_index`, and the planner may hand back a
    /// state at least that new to re-plan against.
    fn submit_plan(&mut self, plan: Plan) -> Result<(PlanResult, Option<Arc<dyn State>>), SchedulerError>;
    /// Writes an eval the scheduler created or changed. The three methods
    /// below say why, for planners that tell them apart (the test
    /// [`testing::Harness`] records each kind); a server's planner only writes.
    fn write_eval(&mut self, eval: Evaluation) -> Result<(), SchedulerError>;
    /// Records the eval's outcome (status, metrics, links).
    fn update_eval(&mut self, eval: Evaluation) -> Result<(), SchedulerError> {
        self.write_eval(eval)
    }
    /// Creates a follow-up or blocked eval.
    fn create_eval(&mut self, eval: Evaluation) -> Result<(), SchedulerError> {
        self.write_eval(eval)
    }
    /// Puts an eval that was unblocked, but still cannot place, back in the
    /// blocked tracker.
    fn reblock_eval(&mut self, eval: Evaluation) -> Result<(), SchedulerError> {
        self.write_eval(eval)
    }
}

/// Nodes that other workers are placing on right now: a hint that keeps
/// parallel workers off each other's nodes, so fewer plans conflict. It is
/// only a hint: the plan applier still checks every plan, and a placement
/// that finds room nowhere else ignores the claims.
pub trait NodeClaims: Send + Sync + std::fmt::Debug {
    /// Whether someone other than `claimant` holds `node` in a way a
    /// scheduler reading a snapshot at `snapshot_index` cannot see: still
    /// planning on it, or committed after that snapshot.
    fn claimed_by_other(&self, node: NodeId, claimant: u64, snapshot_index: u64) -> bool;
    /// Claims `node` for `claimant` unless another claimant is still planning on it.
    fn try_claim(&self, node: NodeId, claimant: u64) -> bool;
}

/// Settings shared by every scheduler.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Scoring strategy, unless the operator's configuration in the state
    /// names one (see [`SchedulerConfig::settings`]).
    pub algorithm: Algorithm,
    /// Seed for the node order of one eval; mixed with the eval id, so
    /// parallel workers visit nodes in different orders.
    pub seed: u64,
    /// The time the scheduler takes as now: reschedule delays, follow-up
    /// evals and disconnect expiries are computed from it.
    pub now: Timestamp,
    /// Claims shared with other workers, and this scheduler's claimant id.
    pub claims: Option<(Arc<dyn NodeClaims>, u64)>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig { algorithm: Algorithm::Binpack, seed: 0, now: Timestamp::ZERO, claims: None }
    }
}

impl SchedulerConfig {
    /// The algorithm and preemption settings in force for an eval against
    /// `state`: the operator's stored configuration when there is one, else
    /// this server's algorithm and Nomad's preemption defaults.
    pub fn settings(&self, state: &dyn State) -> (Algorithm, PreemptionConfig) {
        match state.scheduler_config() {
            Some(stored) => (stored.scheduler_algorithm, stored.preemption_config),
            None => (self.algorithm, PreemptionConfig::default()),
        }
    }
}

/// Processes one evaluation.
pub trait Scheduler {
    /// Reconciles the eval's job against `state` and plans the changes.
    fn process(&mut self, eval: &Evaluation) -> Result<(), SchedulerError>;
}

/// The scheduler for an eval type.
pub fn new_scheduler<'a>(
    eval_type: JobType,
    state: Arc<dyn State>,
    planner: &'a mut dyn Planner,
    config: SchedulerConfig,
) -> Box<dyn Scheduler + 'a> {
    match eval_type {
        JobType::Service | JobType::Batch => Box::new(generic::GenericScheduler::new(state, planner, config)),
        JobType::System | JobType::Sysbatch => Box::new(system::SystemScheduler::new(state, planner, config)),
    }
}
