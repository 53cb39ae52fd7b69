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
use crate::eval::broker::EvalBroker;
use crate::job_endpoint::JobEndpoint;
use crate::node::endpoint::NodeEndpoint;
use crate::node::heartbeat::{HeartbeatConfig, Heartbeats};
use crate::plan::apply::evaluate_plan;
use crate::scheduler::{new_scheduler, Planner, SchedulerConfig, SchedulerError, State};
use crate::server::{Core, ServerConfig};
use crate::state::{Command, StateStore};
use crate::structs::{seed_thread_ids, Evaluation, JobType, Plan, PlanResult};

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
    core: Core,
    seed: u64,
    stats: SteppedStats,
}

impl SteppedServer {
    /// A server at time zero whose ids and heartbeat jitter come from `seed`.
    pub fn new(seed: u64, heartbeat: HeartbeatConfig) -> Self {
        seed_thread_ids(seed);
        let clock = ManualClock::new(Timestamp::ZERO.plus(Duration::from_secs(1)));
        let shared: SharedClock = clock.clone();
        let config = ServerConfig { heartbeat, ..ServerConfig::default() };
        let core = Core::new(&config, shared, Arc::new(StateStore::new()), Some(seed));
        core.lead();
        SteppedServer { clock, core, seed, stats: SteppedStats::default() }
    }

    /// The node endpoint (alloc updates written one call at a time).
    pub fn nodes(&self) -> NodeEndpoint {
        NodeEndpoint::new(self.core.writer.clone(), self.clock.clone(), self.core.heartbeats.clone(), None)
    }

    /// The job endpoint.
    pub fn jobs(&self) -> JobEndpoint {
        self.core.jobs()
    }

    /// The state store.
    pub fn store(&self) -> &Arc<StateStore> {
        &self.core.store
    }

    /// The eval broker.
    pub fn broker(&self) -> &Arc<EvalBroker> {
        &self.core.broker
    }

    /// The blocked-evals tracker.
    pub fn blocked(&self) -> &Arc<BlockedEvals> {
        &self.core.blocked
    }

    /// The heartbeat timers.
    pub fn heartbeats(&self) -> &Arc<Heartbeats> {
        &self.core.heartbeats
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
        let run = self.core.run_timers();
        self.core.blocked.unblock_failed();
        self.reap();
        run.missed_heartbeats
    }

    /// Writes cancelable and failed evals, as the reaper thread would.
    fn reap(&self) {
        if let Err(error) = self.core.reaper.reap_all() {
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
        let Ok(Some(held)) = self.core.broker.try_dequeue(&JobType::ALL) else { return false };
        let config = SchedulerConfig { seed: self.seed, now: self.now(), ..SchedulerConfig::default() };
        let state: Arc<dyn State> = self.core.store.snapshot();
        let mut planner = InlinePlanner { server: self };
        let result = new_scheduler(held.eval.eval_type, state, &mut planner, config).process(&held.eval);
        match result {
            Ok(()) => {
                let _ = self.core.broker.ack(held.eval.id, held.token);
                self.stats.evals_processed += 1;
            }
            Err(error) => {
                tracing::warn!(eval = %held.eval.id, %error, "stepped eval failed");
                let _ = self.core.broker.nack(held.eval.id, held.token);
                self.stats.evals_nacked += 1;
            }
        }
        true
    }

    /// Whether no eval is ready, held, waiting or delayed in the broker.
    pub fn broker_is_idle(&self) -> bool {
        let stats = self.core.broker.stats();
        stats.total_ready + stats.total_unacked + stats.total_pending + stats.total_delayed == 0
    }
}

/// The stepped server as the scheduler's [`Planner`]: plans are checked
/// and written at once, like the plan applier does on its thread.
struct InlinePlanner<'a> {
    server: &'a mut SteppedServer,
}

impl Planner for InlinePlanner<'_> {
    fn submit_plan(&mut self, plan: Plan) -> Result<(PlanResult, Option<Arc<dyn State>>), SchedulerError> {
        self.server.stats.plans += 1;
        let snapshot = self.server.core.store.snapshot();
        let (mut result, refused) = evaluate_plan(&plan, &snapshot, &HashMap::new());
        if !refused.is_empty() {
            result.refresh_index = snapshot.index();
        }
        if !result.node_update.is_empty() || !result.node_allocation.is_empty() {
            let command = Command::apply_plan_result(plan.eval_id, &result, self.server.now());
            let applied = self.server.core.writer.write(command)?;
            result.alloc_index = applied.index;
            result.refuse_placements(&applied.refused_placements, applied.index);
        }
        if result.refresh_index == 0 {
            return Ok((result, None));
        }
        self.server.stats.plans_partly_refused += 1;
        let state: Arc<dyn State> = self.server.core.store.snapshot();
        Ok((result, Some(state)))
    }

    fn write_eval(&mut self, eval: Evaluation) -> Result<(), SchedulerError> {
        self.server.core.writer.write(Command::UpsertEvals { evals: vec![eval] })?;
        Ok(())
    }
}
