//! A store with one node, and the writes garbage collection tests need,
//! each at a chosen time (in hours).

use std::sync::Arc;

use crate::clock::Timestamp;
use crate::state::{ClientAllocUpdate, Command, StateStore};
use crate::structs::{
    Allocation, ClientStatus, Deployment, DeploymentStatus, EvalId, EvalStatus, Evaluation, Job, JobType, Node, NodeId,
    Resources, TriggerReason,
};

/// `hours` after the epoch.
pub fn hours(hours: u64) -> Timestamp {
    Timestamp(hours * 3_600_000_000_000)
}

/// The fixture's node.
pub const NODE: NodeId = NodeId::from_u128(1);

/// A store and the writes of a job's life.
pub struct Fixture {
    /// The store.
    pub store: Arc<StateStore>,
}

impl Fixture {
    /// A store with [`NODE`], ready.
    pub fn new() -> Self {
        let store = Arc::new(StateStore::new());
        let node = Node::new_ready(NODE, "dc1", "general", Resources::new(100_000, 100_000, 0));
        store.apply(Command::UpsertNode { node, evals: vec![] }).expect("node");
        Fixture { store }
    }

    /// Registers a job of `job_type` submitted at `time`, with its pending
    /// eval; returns the job as stored and the eval.
    pub fn register(&self, id: &str, job_type: JobType, time: Timestamp) -> (Arc<Job>, Evaluation) {
        let mut job = Job::new_simple(id, job_type, 1, Resources::new(10, 10, 0));
        job.submit_time = time;
        let eval = Evaluation::for_job(&job, TriggerReason::JobRegister, time);
        let applied = self.store.apply(Command::RegisterJob { job, eval: Some(eval.clone()) }).expect("register");
        (applied.job.expect("stored"), eval)
    }

    /// Places one allocation of `job` for `eval` at `time`.
    pub fn place(&self, job: &Arc<Job>, eval: EvalId, time: Timestamp) -> Allocation {
        let alloc = Allocation::new_placement(job, "group", 0, NODE, eval);
        let plan = Command::ApplyPlanResults {
            eval_id: eval,
            allocs: vec![alloc.clone()],
            evals: vec![],
            deployment: None,
            deployment_updates: vec![],
            time,
        };
        self.store.apply(plan).expect("plan");
        alloc
    }

    /// The allocation's client reports `status` at `time`.
    pub fn report(&self, alloc: &Allocation, status: ClientStatus, time: Timestamp) {
        let update = ClientAllocUpdate::status(alloc, status);
        let command = Command::UpdateAllocsFromClient { updates: vec![update], evals: vec![], time };
        self.store.apply(command).expect("update");
    }

    /// The eval ends with `status` at `time`.
    pub fn finish(&self, eval: &Evaluation, status: EvalStatus, time: Timestamp) {
        let mut done = eval.clone();
        done.status = status;
        done.modify_time = time;
        self.store.apply(Command::UpsertEvals { evals: vec![done] }).expect("eval");
    }

    /// A batch job that ran one allocation to `complete`, everything
    /// written at `time`.
    pub fn finished_batch(&self, id: &str, time: Timestamp) -> (Arc<Job>, Evaluation, Allocation) {
        let (job, eval) = self.register(id, JobType::Batch, time);
        let alloc = self.place(&job, eval.id, time);
        self.report(&alloc, ClientStatus::Complete, time);
        self.finish(&eval, EvalStatus::Complete, time);
        (job, eval, alloc)
    }

    /// A deployment of `job` with `status`, written at `time` by a plan
    /// placing one allocation in it, which is returned.
    pub fn deployment(&self, job: &Arc<Job>, status: DeploymentStatus, time: Timestamp) -> (Deployment, Allocation) {
        let mut deployment = Deployment::new(job, job.priority, time);
        deployment.status = status;
        let mut alloc = Allocation::new_placement(job, "group", 0, NODE, EvalId::from_u128(77));
        alloc.deployment_id = Some(deployment.id);
        let plan = Command::ApplyPlanResults {
            eval_id: EvalId::from_u128(77),
            allocs: vec![alloc.clone()],
            evals: vec![],
            deployment: Some(deployment.clone()),
            deployment_updates: vec![],
            time,
        };
        self.store.apply(plan).expect("plan");
        (deployment, alloc)
    }
}
