//! The scheduler test harness (Nomad's `scheduler/testing.go`): a real state
//! store as the in-memory state, and a planner that applies plans to it
//! whole and records every plan, created eval, eval update and reblock, so
//! tests assert on what a scheduler decided. It can refuse the next plans to
//! exercise the refresh-and-retry path.

use std::sync::Arc;

use super::{new_scheduler, Planner, SchedulerConfig, SchedulerError, State};
use crate::clock::Timestamp;
use crate::state::{Command, StateStore};
use crate::structs::{Allocation, Evaluation, Job, Node, Plan, PlanResult, TriggerReason};

/// In-memory state plus a recording planner.
#[derive(Debug, Default)]
pub struct Harness {
    /// The state the scheduler reads; plans are applied to it.
    pub store: StateStore,
    /// Every plan submitted, in order (refused ones included).
    pub plans: Vec<Plan>,
    /// Evals created (blocked, follow-ups).
    pub created_evals: Vec<Evaluation>,
    /// Eval updates (the processed eval's outcome).
    pub updated_evals: Vec<Evaluation>,
    /// Evals put back in the blocked tracker.
    pub reblocked_evals: Vec<Evaluation>,
    /// How many of the next plans to refuse whole.
    pub refuse_plans: usize,
    /// The scheduler settings for the next `process`.
    pub config: SchedulerConfig,
}

impl Harness {
    /// An empty harness with the clock at `now`.
    pub fn new(now: Timestamp) -> Self {
        Harness { config: SchedulerConfig { now, ..SchedulerConfig::default() }, ..Harness::default() }
    }

    /// Registers nodes.
    pub fn add_nodes(&self, nodes: impl IntoIterator<Item = Node>) {
        for node in nodes {
            self.store.apply(Command::UpsertNode { node, evals: Vec::new() }).expect("harness node applies");
        }
    }

    /// Registers (or updates) a job and returns its stored eval.
    pub fn register(&self, job: &Job) -> Evaluation {
        let eval = Evaluation::for_job(job, TriggerReason::JobRegister, self.config.now);
        let applied =
            self.store.apply(Command::RegisterJob { job: job.clone(), eval: Some(eval) }).expect("harness job applies");
        Evaluation::clone(&applied.evals[0])
    }

    /// Runs the scheduler for `eval` against the current state.
    pub fn process(&mut self, eval: &Evaluation) -> Result<(), SchedulerError> {
        let state: Arc<dyn State> = self.store.snapshot();
        let config = self.config.clone();
        let mut scheduler = new_scheduler(eval.eval_type, state, self, config);
        scheduler.process(eval)
    }

    /// The last plan submitted.
    pub fn last_plan(&self) -> &Plan {
        self.plans.last().expect("a plan was submitted")
    }

    /// The last eval update.
    pub fn last_update(&self) -> &Evaluation {
        self.updated_evals.last().expect("the eval was updated")
    }

    /// Live (non-terminal) allocations of a job.
    pub fn live_allocs(&self, job: &Job) -> Vec<Arc<Allocation>> {
        self.store.snapshot().allocs_by_job(&job.key()).filter(|alloc| !alloc.terminal()).cloned().collect()
    }

    fn refresh_state(&self) -> Arc<dyn State> {
        self.store.snapshot()
    }
}

impl Planner for Harness {
    fn submit_plan(&mut self, plan: Plan) -> Result<(PlanResult, Option<Arc<dyn State>>), SchedulerError> {
        self.plans.push(plan.clone());
        if self.refuse_plans > 0 {
            self.refuse_plans -= 1;
            let result = PlanResult { refresh_index: self.store.latest_index(), ..PlanResult::default() };
            return Ok((result, Some(self.refresh_state())));
        }
        let mut result = PlanResult {
            node_update: plan.node_update,
            node_allocation: plan.node_allocation,
            node_preemptions: plan.node_preemptions,
            refresh_index: 0,
            alloc_index: 0,
            deployment: plan.deployment,
            deployment_updates: plan.deployment_updates,
        };
        let applied = self.store.apply(Command::apply_plan_result(plan.eval_id, &result, self.config.now))?;
        result.alloc_index = applied.index;
        result.refuse_placements(&applied.refused_placements, applied.index);
        let refreshed = (result.refresh_index != 0).then(|| self.refresh_state());
        Ok((result, refreshed))
    }

    fn write_eval(&mut self, eval: Evaluation) -> Result<(), SchedulerError> {
        self.store.apply(Command::UpsertEvals { evals: vec![eval] })?;
        Ok(())
    }

    fn update_eval(&mut self, eval: Evaluation) -> Result<(), SchedulerError> {
        self.updated_evals.push(eval.clone());
        self.write_eval(eval)
    }

    fn create_eval(&mut self, eval: Evaluation) -> Result<(), SchedulerError> {
        self.created_evals.push(eval.clone());
        self.write_eval(eval)
    }

    fn reblock_eval(&mut self, eval: Evaluation) -> Result<(), SchedulerError> {
        self.reblocked_evals.push(eval.clone());
        self.write_eval(eval)
    }
}
