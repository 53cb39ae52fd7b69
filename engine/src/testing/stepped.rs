//! A stepped server for simulations and interleaving tests (the `testing`
//! feature): the real state store, eval broker, blocked-evals tracker,
//! router, heartbeat timers, node and job endpoints and schedulers, driven
//! by one thread on a manual clock, with the eval reaper's batches run
//! inline. No worker, applier or reaper thread: an eval
//! runs when the test says so, and its plan is checked by the plan
//! applier's own [`evaluate_plan`] and written by the store, inline.
//!
//! With [`crate::structs::seed_thread_ids`] the whole run is a function of
//! its seed: same ids, same order, same placements.

use std::sync::Arc;
use std::time::Duration;

use hashbrown::HashMap;

use crate::clock::{Clock, ManualClock, SharedClock, Timestamp};
use crate::eval::blocked::BlockedEvals;
use crate::eval::broker::{BrokerConfig, EvalBroker};
use crate::eval::reaper::{EvalReaper, ReaperConfig};
use crate::job_endpoint::JobEndpoint;
use crate::node::endpoint::NodeEndpoint;
use crate::node::heartbeat::{HeartbeatConfig, Heartbeats};
use crate::plan::apply::evaluate_plan;
use crate::router::Router;
use crate::scheduler::{new_scheduler, Planner, SchedulerConfig, SchedulerError, State};
use crate::state::{Command, StateStore};
use crate::structs::{seed_thread_ids, EvalId, EvalStatus, Evaluation, JobType, Plan, PlanResult};

/// Counters of a stepped run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SteppedStats {
    /// Evals run and acked.
    pub evals_processed: u64,
    /// Evals that ended in a scheduler error and were nacked.
    pub evals_nacked: u64,
    /// Plans submitted.
    pub plans: u64,
    /// Plans of which part was refused.
    pub plans_partly_refused: u64,
}

/// The stepped server; see the module docs.
#[derive(Debug)]
pub struct SteppedServer {
    clock: Arc<ManualClock>,
    store: Arc<StateStore>,
    broker: Arc<EvalBroker>,
    blocked: Arc<BlockedEvals>,
    router: Router,
    heartbeats: Arc<Heartbeats>,
    reaper: EvalReaper,
    seed: u64,
    stats: SteppedStats,
}

impl SteppedServer {
    /// A server at time zero whose ids and heartbeat jitter come from `seed`.
    pub fn new(seed: u64, heartbeat: HeartbeatConfig) -> Self {
        seed_thread_ids(seed);
        let clock = ManualClock::new(Timestamp::ZERO.plus(Duration::from_secs(1)));
        let shared: SharedClock = clock.clone();
        let store = Arc::new(StateStore::new());
        let broker = Arc::new(EvalBroker::new(BrokerConfig::default(), shared.clone()));
        let blocked = Arc::new(BlockedEvals::new(broker.clone(), shared.clone()));
        let router = Router::new(store.clone(), broker.clone(), blocked.clone());
        let heartbeats = Heartbeats::seeded(heartbeat, shared.clone(), seed);
        let reaper = EvalReaper::new(ReaperConfig::default(), broker.clone(), blocked.clone(), store.clone(), shared);
        let stats = SteppedStats::default();
        SteppedServer { clock, store, broker, blocked, router, heartbeats, reaper, seed, stats }
    }

    /// The node endpoint (alloc updates written one call at a time).
    pub fn nodes(&self) -> NodeEndpoint {
        NodeEndpoint::new(self.router.clone(), self.clock.clone(), self.heartbeats.clone(), None)
    }

    /// The job endpoint.
    pub fn jobs(&self) -> JobEndpoint {
        JobEndpoint::new(self.router.clone(), self.clock.clone())
    }

    /// The state store.
    pub fn store(&self) -> &Arc<StateStore> {
        &self.store
    }

    /// The eval broker.
    pub fn broker(&self) -> &Arc<EvalBroker> {
        &self.broker
    }

    /// The blocked-evals tracker.
    pub fn blocked(&self) -> &Arc<BlockedEvals> {
        &self.blocked
    }

    /// The heartbeat timers.
    pub fn heartbeats(&self) -> &Arc<Heartbeats> {
        &self.heartbeats
    }

    /// Now.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Counters.
    pub fn stats(&self) -> SteppedStats {
        self.stats
    }

    /// Moves the clock and runs every timer that came due: delayed and
    /// timed-out evals, missed heartbeats, retries of evals blocked after
    /// plan failures, the reaper's batches. Returns the nodes marked as
    /// having missed a heartbeat.
    pub fn advance(&self, by: Duration) -> usize {
        self.clock.advance(by);
        self.broker.process_timers();
        self.blocked.unblock_failed();
        let missed = self.heartbeats.expire(&self.router);
        self.reap();
        missed
    }

    /// Writes cancelable and failed evals, as the reaper thread would.
    fn reap(&self) {
        if let Err(error) = self.reaper.reap_all() {
            tracing::warn!(%error, "stepped reaper could not write");
        }
    }

    /// Runs ready evals until none is left; returns how many ran.
    pub fn run_evals(&mut self) -> usize {
        let mut ran = 0;
        while self.run_one_eval() {
            ran += 1;
        }
        self.reap();
        ran
    }

    /// Runs the next ready eval, if there is one.
    pub fn run_one_eval(&mut self) -> bool {
        let Ok(Some(held)) = self.broker.try_dequeue(&JobType::ALL) else { return false };
        let config = SchedulerConfig { seed: self.seed, now: self.now(), ..SchedulerConfig::default() };
        let state: Arc<dyn State> = self.store.snapshot();
        let mut planner = InlinePlanner { server: self, eval_id: held.eval.id, reblocked: None };
        let result = new_scheduler(held.eval.eval_type, state, &mut planner, config).process(&held.eval);
        let reblocked = planner.reblocked.take();
        match result {
            Ok(()) => {
                let _ = self.broker.ack(held.eval.id, held.token);
                if let Some(eval) = reblocked {
                    self.router.route_eval(&eval);
                }
                self.stats.evals_processed += 1;
            }
            Err(error) => {
                tracing::warn!(eval = %held.eval.id, %error, "stepped eval failed");
                let _ = self.broker.nack(held.eval.id, held.token);
                self.stats.evals_nacked += 1;
            }
        }
        true
    }

    /// Whether no eval is ready, held, waiting or delayed in the broker.
    pub fn broker_is_idle(&self) -> bool {
        let stats = self.broker.stats();
        stats.total_ready + stats.total_unacked + stats.total_pending + stats.total_delayed == 0
    }
}

/// The stepped server as the scheduler's [`Planner`]: plans are checked
/// and written at once, like the plan applier does on its thread.
struct InlinePlanner<'a> {
    server: &'a mut SteppedServer,
    eval_id: EvalId,
    reblocked: Option<Arc<Evaluation>>,
}

impl InlinePlanner<'_> {
    fn write_eval(&mut self, eval: Evaluation) -> Result<(), SchedulerError> {
        let own = self
            .server
            .router
            .write_held_eval(eval, self.eval_id)
            .map_err(|error| SchedulerError::Planner(error.to_string()))?;
        if let Some(own) = own {
            self.reblocked = Some(own).filter(|eval| eval.status == EvalStatus::Blocked);
        }
        Ok(())
    }
}

impl Planner for InlinePlanner<'_> {
    fn submit_plan(&mut self, plan: Plan) -> Result<(PlanResult, Option<Arc<dyn State>>), SchedulerError> {
        self.server.stats.plans += 1;
        let snapshot = self.server.store.snapshot();
        let (mut result, refused) = evaluate_plan(&plan, &snapshot, &HashMap::new());
        if !refused.is_empty() {
            result.refresh_index = snapshot.index();
        }
        if !result.node_update.is_empty() || !result.node_allocation.is_empty() {
            let command = Command::apply_plan_result(plan.eval_id, &result, self.server.now());
            let applied =
                self.server.store.apply(command).map_err(|error| SchedulerError::Planner(error.to_string()))?;
            self.server.router.route(&applied, None);
            result.alloc_index = applied.index;
            result.refuse_placements(&applied.refused_placements, applied.index);
        }
        if result.refresh_index == 0 {
            return Ok((result, None));
        }
        self.server.stats.plans_partly_refused += 1;
        let state: Arc<dyn State> = self.server.store.snapshot();
        Ok((result, Some(state)))
    }

    fn update_eval(&mut self, eval: Evaluation) -> Result<(), SchedulerError> {
        self.write_eval(eval)
    }

    fn create_eval(&mut self, eval: Evaluation) -> Result<(), SchedulerError> {
        self.write_eval(eval)
    }

    fn reblock_eval(&mut self, eval: Evaluation) -> Result<(), SchedulerError> {
        self.write_eval(eval)
    }
}
