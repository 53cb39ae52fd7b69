//! Blocked evaluations: evals that could not place everything for lack of
//! capacity, parked until capacity appears where they could use it.
//!
//! Contract:
//! 1. [`BlockedEvals::block`] parks an eval by the computed node classes it
//!    was checked against (`class_eligibility`), or as *escaped* when its
//!    constraints could not be decided per class. System-job evals that name
//!    a node are parked per node.
//! 2. At most one blocked eval per job: a newer one replaces an older one,
//!    and whichever is older is reported as a duplicate to be canceled
//!    ([`BlockedEvals::take_duplicates`]).
//! 3. [`BlockedEvals::unblock`] on a capacity change of a class enqueues, in
//!    the broker, every eval that was eligible for that class or had not seen
//!    it, and every escaped eval. [`BlockedEvals::unblock_node`] does the same
//!    for system evals parked on that node.
//! 4. An eval blocked on a snapshot older than a capacity change it could use
//!    missed that unblock, so it is enqueued at once instead of parked.
//! 5. Unblock indexes older than the prune threshold are forgotten
//!    ([`BlockedEvals::prune`]), so memory stays bounded on a busy cluster.

use std::sync::Arc;
use std::time::Duration;

use hashbrown::HashMap;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::clock::{SharedClock, Timestamp};
use crate::eval::broker::EvalBroker;
use crate::structs::{ComputedClass, EvalId, Evaluation, JobKey, NodeId, TriggerReason};

/// How often evals blocked after plan failures are retried (the server's
/// timer thread calls [`BlockedEvals::unblock_failed`]).
pub const FAILED_RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// Counters of the blocked-evals tracker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockedStats {
    /// Evals parked, all kinds.
    pub total_blocked: usize,
    /// Of those, escaped evals (unblocked by any capacity change).
    pub total_escaped: usize,
    /// Of those, system evals parked per node.
    pub total_system: usize,
    /// Evals unblocked, ever.
    pub total_unblocked: u64,
    /// Duplicates waiting to be canceled.
    pub pending_duplicates: usize,
}

#[derive(Debug, Default)]
struct Inner {
    /// Class-checked evals by id.
    captured: HashMap<EvalId, Arc<Evaluation>>,
    /// Escaped evals by id.
    escaped: HashMap<EvalId, Arc<Evaluation>>,
    /// System evals by the node they wait on, then by job.
    system: HashMap<NodeId, HashMap<JobKey, Arc<Evaluation>>>,
    /// The one blocked (non-system) eval of each job.
    by_job: HashMap<JobKey, EvalId>,
    /// The last capacity change per class: its index and when it happened.
    class_unblocks: HashMap<ComputedClass, (u64, Timestamp)>,
    /// The last capacity change per node, for system evals.
    node_unblocks: HashMap<NodeId, (u64, Timestamp)>,
    duplicates: Vec<Arc<Evaluation>>,
    unblocked: u64,
    /// When evals blocked after plan failures were last retried.
    failed_retried_at: Timestamp,
}

impl Inner {
    fn system_count(&self) -> usize {
        self.system.values().map(HashMap::len).sum()
    }

    /// Whether a capacity change after the eval's snapshot could help it.
    fn missed_unblock(&self, eval: &Evaluation) -> bool {
        if let (true, Some(node_id)) = (eval.eval_type.is_system_like(), eval.node_id) {
            return self.node_unblocks.get(&node_id).is_some_and(|(index, _)| *index > eval.snapshot_index);
        }
        self.class_unblocks.iter().any(|(class, (index, _))| {
            *index > eval.snapshot_index
                && (eval.escaped_computed_class || eval.class_eligibility.get(class) != Some(&false))
        })
    }

    /// Removes the job's blocked eval from the maps, returning it.
    fn remove_job(&mut self, job: &JobKey) -> Option<Arc<Evaluation>> {
        let id = self.by_job.remove(job)?;
        self.captured.remove(&id).or_else(|| self.escaped.remove(&id))
    }

    /// Removes parked evals by id and counts them as unblocked.
    fn take_parked(&mut self, ids: &[EvalId]) -> Vec<Arc<Evaluation>> {
        let released: Vec<_> =
            ids.iter().filter_map(|id| self.captured.remove(id).or_else(|| self.escaped.remove(id))).collect();
        for eval in &released {
            self.by_job.remove(&eval.job_key());
        }
        self.unblocked += released.len() as u64;
        released
    }

    /// Parked evals that were blocked after plan failures.
    fn failed_ids(&self) -> Vec<EvalId> {
        self.captured
            .values()
            .chain(self.escaped.values())
            .filter(|eval| eval.triggered_by == TriggerReason::MaxPlanAttempts)
            .map(|eval| eval.id)
            .collect()
    }

    fn park(&mut self, eval: Arc<Evaluation>) {
        self.by_job.insert(eval.job_key(), eval.id);
        if eval.escaped_computed_class {
            self.escaped.insert(eval.id, eval);
        } else {
            self.captured.insert(eval.id, eval);
        }
    }
}

/// The blocked-evals tracker; see the module docs.
#[derive(Debug)]
pub struct BlockedEvals {
    inner: Mutex<Inner>,
    broker: Arc<EvalBroker>,
    clock: SharedClock,
}

impl BlockedEvals {
    /// A tracker that releases evals into `broker`.
    pub fn new(broker: Arc<EvalBroker>, clock: SharedClock) -> Self {
        BlockedEvals { inner: Mutex::new(Inner::default()), broker, clock }
    }

    /// Parks a blocked eval (contract steps 1, 2 and 4).
    pub fn block(&self, eval: Arc<Evaluation>) {
        if eval.triggered_by == TriggerReason::MaxPlanAttempts {
            self.clock.deadline_set(self.clock.now().plus(FAILED_RETRY_INTERVAL));
        }
        let release = {
            let mut inner = self.inner.lock();
            if let (true, Some(node_id)) = (eval.eval_type.is_system_like(), eval.node_id) {
                self.block_system(&mut inner, eval, node_id)
            } else {
                self.block_job(&mut inner, eval)
            }
        };
        if let Some(eval) = release {
            self.broker.enqueue(eval);
        }
    }

    /// Parks a job-level eval; returns it when it must run at once.
    fn block_job(&self, inner: &mut Inner, eval: Arc<Evaluation>) -> Option<Arc<Evaluation>> {
        let job = eval.job_key();
        if let Some(existing) = inner.remove_job(&job) {
            if newer(&existing, &eval) {
                inner.park(existing);
                inner.duplicates.push(eval);
                return None;
            }
            inner.duplicates.push(existing);
        }
        if inner.missed_unblock(&eval) {
            inner.unblocked += 1;
            return Some(eval);
        }
        inner.park(eval);
        None
    }

    /// Parks a system eval on its node; returns it when it must run at once.
    fn block_system(&self, inner: &mut Inner, eval: Arc<Evaluation>, node_id: NodeId) -> Option<Arc<Evaluation>> {
        if inner.missed_unblock(&eval) {
            inner.unblocked += 1;
            return Some(eval);
        }
        let on_node = inner.system.entry(node_id).or_default();
        match on_node.get(&eval.job_key()) {
            Some(existing) if newer(existing, &eval) => inner.duplicates.push(eval),
            _ => {
                if let Some(older) = on_node.insert(eval.job_key(), eval) {
                    inner.duplicates.push(older);
                }
            }
        }
        None
    }

    /// A node of `class` gained capacity at `index`: releases the evals that
    /// could use it (contract step 3). Returns how many were released.
    pub fn unblock(&self, class: ComputedClass, index: u64) -> usize {
        let released = {
            let mut inner = self.inner.lock();
            inner.class_unblocks.insert(class, (index, self.clock.now()));
            let ids: Vec<EvalId> = inner
                .escaped
                .keys()
                .copied()
                .chain(
                    inner
                        .captured
                        .values()
                        .filter(|eval| eval.class_eligibility.get(&class) != Some(&false))
                        .map(|eval| eval.id),
                )
                .collect();
            inner.take_parked(&ids)
        };
        let count = released.len();
        self.broker.enqueue_all(released);
        count
    }

    /// Node `node_id` gained capacity at `index`: releases the system evals
    /// parked on it. Returns how many were released.
    pub fn unblock_node(&self, node_id: NodeId, index: u64) -> usize {
        let released: Vec<_> = {
            let mut inner = self.inner.lock();
            inner.node_unblocks.insert(node_id, (index, self.clock.now()));
            let released: Vec<_> =
                inner.system.remove(&node_id).into_iter().flat_map(|jobs| jobs.into_values()).collect();
            inner.unblocked += released.len() as u64;
            released
        };
        let count = released.len();
        self.broker.enqueue_all(released);
        count
    }

    /// Releases the evals blocked because their plans kept being refused
    /// (`max-plan-attempts`): no capacity change may ever come for them on a
    /// quiet cluster, so the server retries them on a timer, as Nomad does.
    pub fn unblock_failed(&self) -> usize {
        let released: Vec<_> = {
            let mut inner = self.inner.lock();
            inner.failed_retried_at = self.clock.now();
            let failed: Vec<EvalId> = inner.failed_ids();
            inner.take_parked(&failed)
        };
        let count = released.len();
        self.broker.enqueue_all(released);
        count
    }

    /// When evals blocked after plan failures are next retried
    /// ([`FAILED_RETRY_INTERVAL`] after the last retry), if any is parked.
    pub fn next_deadline(&self) -> Option<Timestamp> {
        let inner = self.inner.lock();
        (!inner.failed_ids().is_empty()).then(|| inner.failed_retried_at.plus(FAILED_RETRY_INTERVAL))
    }

    /// Stops tracking every blocked eval of `job` (job deregistered, or an
    /// eval of it placed everything). The dropped evals are returned and also
    /// queued as duplicates, so the reaper writes them as canceled.
    pub fn untrack(&self, job: &JobKey) -> Vec<Arc<Evaluation>> {
        let mut inner = self.inner.lock();
        let mut dropped: Vec<_> = inner.remove_job(job).into_iter().collect();
        for jobs in inner.system.values_mut() {
            dropped.extend(jobs.remove(job));
        }
        inner.system.retain(|_, jobs| !jobs.is_empty());
        inner.duplicates.extend(dropped.iter().cloned());
        dropped
    }

    /// Stops tracking `eval`, which was deleted from the state: unlike
    /// [`BlockedEvals::untrack`], nothing is queued to be written canceled.
    pub fn forget_deleted(&self, eval: &Evaluation) {
        let key = eval.job_key();
        let mut inner = self.inner.lock();
        if inner.by_job.get(&key) == Some(&eval.id) {
            inner.remove_job(&key);
        }
        for jobs in inner.system.values_mut() {
            jobs.retain(|_, blocked| blocked.id != eval.id);
        }
        inner.system.retain(|_, jobs| !jobs.is_empty());
    }

    /// The job's blocked eval, if any.
    pub fn blocked_eval_of(&self, job: &JobKey) -> Option<Arc<Evaluation>> {
        let inner = self.inner.lock();
        let id = inner.by_job.get(job)?;
        inner.captured.get(id).or_else(|| inner.escaped.get(id)).cloned()
    }

    /// Takes the duplicate blocked evals, to be written as canceled.
    pub fn take_duplicates(&self) -> Vec<Arc<Evaluation>> {
        std::mem::take(&mut self.inner.lock().duplicates)
    }

    /// Forgets unblock indexes recorded more than `older_than` ago (contract step 5).
    pub fn prune(&self, older_than: Duration) {
        let cutoff = Timestamp(self.clock.now().0.saturating_sub(older_than.as_nanos() as u64));
        let mut inner = self.inner.lock();
        inner.class_unblocks.retain(|_, (_, at)| *at >= cutoff);
        inner.node_unblocks.retain(|_, (_, at)| *at >= cutoff);
    }

    /// The tracker's counters.
    pub fn stats(&self) -> BlockedStats {
        let inner = self.inner.lock();
        let total_system = inner.system_count();
        BlockedStats {
            total_blocked: inner.captured.len() + inner.escaped.len() + total_system,
            total_escaped: inner.escaped.len(),
            total_system,
            total_unblocked: inner.unblocked,
            pending_duplicates: inner.duplicates.len(),
        }
    }
}

/// Whether `existing` is newer than `candidate`, by creation index (the
/// order the state store assigned them).
fn newer(existing: &Evaluation, candidate: &Evaluation) -> bool {
    existing.create_index > candidate.create_index
}

#[cfg(test)]
#[path = "blocked_test.rs"]
mod blocked_test;
