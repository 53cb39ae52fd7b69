//! Which objects garbage collection may delete: a pure function of a
//! snapshot, the time and the thresholds (Nomad's `core_sched.go` rules,
//! with wall-clock ages as Nomad 1.9 has them).
//!
//! 1. **Jobs** (`job_gc_threshold`): stopped jobs and batch jobs that are
//!    `dead` (nothing runs; a batch job's evals all ended), submitted
//!    longer than the threshold ago, all of whose evals are collectable
//!    by step 2 with the job's threshold and the batch rule lifted. Their
//!    evals, allocations, versions and deployments go with them. A
//!    service job that was never stopped is never collected.
//! 2. **Evals** (`eval_gc_threshold`, `batch_eval_gc_threshold` for evals
//!    of batch jobs): terminal, last changed longer than the threshold
//!    ago, and every allocation of the eval collectable by step 3. An
//!    eval of a batch job that is still there and not (dead and stopped)
//!    stays, so the job keeps its history; only allocations of an older
//!    incarnation of the job attached to it go.
//! 3. **Allocations** (with their eval's threshold): terminal, not running
//!    on their client, last changed longer than the threshold ago; and
//!    their job gone, stopped or dead, or they were stopped by the
//!    servers, or they did not fail. A failed allocation stays while its
//!    group's reschedule policy may still replace it: never while the
//!    policy is unlimited and it has no replacement, until the policy's
//!    interval passed since its last reschedule otherwise. Allocations
//!    whose eval is gone are judged alone.
//! 4. **Nodes** (`node_gc_threshold`): `down` for longer than the
//!    threshold, with no live allocation.
//! 5. **Deployments** (`deployment_gc_threshold`): not active, last changed
//!    longer than the threshold ago, every allocation of theirs terminal.
//!
//! A forced collection passes thresholds of zero: everything eligible now.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::clock::Timestamp;
use crate::state::{alloc_finished, job_is_dead, Collection, Snapshot};
use crate::structs::{Allocation, DeploymentId, EvalId, Evaluation, Job, JobKey, JobType, NodeStatus};

/// How old each kind of object must be to be collected (Nomad's names
/// and defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcThresholds {
    /// Terminal evals (and their allocations): `eval_gc_threshold`, 1h.
    pub eval: Duration,
    /// Terminal evals of batch jobs: `batch_eval_gc_threshold`, 24h.
    pub batch_eval: Duration,
    /// Dead jobs: `job_gc_threshold`, 4h.
    pub job: Duration,
    /// Down nodes: `node_gc_threshold`, 24h.
    pub node: Duration,
    /// Finished deployments: `deployment_gc_threshold`, 1h.
    pub deployment: Duration,
}

impl Default for GcThresholds {
    fn default() -> Self {
        const HOUR: Duration = Duration::from_secs(3600);
        GcThresholds { eval: HOUR, batch_eval: 24 * HOUR, job: 4 * HOUR, node: 24 * HOUR, deployment: HOUR }
    }
}

impl GcThresholds {
    /// A forced collection's: everything eligible now.
    pub fn force() -> Self {
        GcThresholds {
            eval: Duration::ZERO,
            batch_eval: Duration::ZERO,
            job: Duration::ZERO,
            node: Duration::ZERO,
            deployment: Duration::ZERO,
        }
    }
}

/// What may be deleted from `snapshot` at `now` (module docs); the
/// collection names the snapshot's index.
pub fn select(snapshot: &Snapshot, now: Timestamp, thresholds: &GcThresholds) -> Collection {
    let selector = Selector::new(snapshot, now, thresholds);
    let mut collection = Collection { as_of: snapshot.index(), ..Collection::default() };
    let jobs = selector.jobs();
    let gone: HashSet<&JobKey> = jobs.iter().collect();
    for eval in snapshot.evals().filter(|eval| !gone.contains(&eval.job_key())) {
        selector.eval(eval, &mut collection);
    }
    for alloc in snapshot.allocs().filter(|alloc| !gone.contains(&alloc.job_key())) {
        let orphan = snapshot.eval(alloc.eval_id).is_none();
        if orphan && selector.alloc(alloc, thresholds.eval) {
            collection.allocs.push(alloc.id);
        }
    }
    collection.deployments = selector.deployments(&gone);
    collection.nodes = snapshot
        .nodes()
        // A node the storm guard held and that never came back is collected as a down one.
        .filter(|node| node.status == NodeStatus::Down || node.hold.is_some())
        .filter(|node| older(now, node.status_updated_at, thresholds.node))
        .filter(|node| snapshot.allocs_by_node(node.id).all(|alloc| alloc.terminal()))
        .map(|node| node.id)
        .collect();
    collection.jobs = jobs;
    sort(&mut collection);
    collection
}

/// Whether `time` is at least `threshold` before `now`.
fn older(now: Timestamp, time: Timestamp, threshold: Duration) -> bool {
    now.since(time) >= threshold && time <= now
}

/// Sorted, so the same state always gives the same commands.
fn sort(collection: &mut Collection) {
    collection.evals.sort_unstable();
    collection.allocs.sort_unstable();
    collection.jobs.sort_unstable();
    collection.nodes.sort_unstable();
    collection.deployments.sort_unstable();
}

/// One pass's lookups: each eval's allocations, found in one walk.
struct Selector<'a> {
    snapshot: &'a Snapshot,
    now: Timestamp,
    thresholds: &'a GcThresholds,
    allocs_by_eval: HashMap<EvalId, Vec<&'a Allocation>>,
    /// The jobs that are `dead`, found once: asking per allocation would
    /// walk a big job's allocations once for each of them.
    dead: HashSet<JobKey>,
}

impl<'a> Selector<'a> {
    fn new(snapshot: &'a Snapshot, now: Timestamp, thresholds: &'a GcThresholds) -> Self {
        let mut allocs_by_eval: HashMap<EvalId, Vec<&Allocation>> = HashMap::new();
        for alloc in snapshot.allocs() {
            allocs_by_eval.entry(alloc.eval_id).or_default().push(alloc);
        }
        let dead = snapshot.jobs().filter(|job| job_is_dead(snapshot, job)).map(|job| job.key()).collect();
        Selector { snapshot, now, thresholds, allocs_by_eval, dead }
    }

    fn is_dead(&self, job: &Job) -> bool {
        self.dead.contains(&job.key())
    }

    /// Step 1.
    fn jobs(&self) -> Vec<JobKey> {
        let threshold = self.thresholds.job;
        let collectable = |job: &Job| {
            (job.stop || job.job_type == JobType::Batch)
                && older(self.now, job.submit_time, threshold)
                && self.is_dead(job)
                && self.snapshot.evals_by_job(&job.key()).all(|eval| self.eval_with_allocs(eval, threshold))
        };
        self.snapshot.jobs().filter(|job| collectable(job)).map(|job| job.key()).collect()
    }

    /// Step 2, for an eval of a job that stays.
    fn eval(&self, eval: &Evaluation, collection: &mut Collection) {
        let threshold = match eval.eval_type {
            JobType::Batch => self.thresholds.batch_eval,
            _ => self.thresholds.eval,
        };
        if !eval.status.is_terminal() || !older(self.now, eval.modify_time, threshold) {
            return;
        }
        let allocs = self.allocs_by_eval.get(&eval.id).map_or(&[][..], Vec::as_slice);
        let job = self.snapshot.job(&eval.job_key());
        if eval.eval_type == JobType::Batch {
            if let Some(job) = job.filter(|job| !(job.stop && self.is_dead(job))) {
                // The job keeps its history: only an older incarnation's allocations go.
                let older_incarnation = allocs.iter().filter(|alloc| alloc.job.create_index < job.create_index);
                let collectable = older_incarnation.filter(|alloc| self.alloc(alloc, threshold));
                collection.allocs.extend(collectable.map(|alloc| alloc.id));
                return;
            }
        }
        let collectable: Vec<_> = allocs.iter().filter(|alloc| self.alloc(alloc, threshold)).collect();
        if collectable.len() == allocs.len() {
            collection.evals.push(eval.id);
        }
        collection.allocs.extend(collectable.into_iter().map(|alloc| alloc.id));
    }

    /// Step 2 for a job being collected: whether the eval and all its
    /// allocations may go.
    fn eval_with_allocs(&self, eval: &Evaluation, threshold: Duration) -> bool {
        if !eval.status.is_terminal() || !older(self.now, eval.modify_time, threshold) {
            return false;
        }
        let allocs = self.allocs_by_eval.get(&eval.id).map_or(&[][..], Vec::as_slice);
        allocs.iter().all(|alloc| self.alloc(alloc, threshold))
    }

    /// Step 3.
    fn alloc(&self, alloc: &Allocation, threshold: Duration) -> bool {
        if !alloc_finished(alloc) || !older(self.now, alloc.modify_time, threshold) {
            return false;
        }
        let Some(job) = self.snapshot.job(&alloc.job_key()) else { return true };
        if job.stop || self.is_dead(job) || alloc.server_terminal() {
            return true;
        }
        if alloc.client_status != crate::structs::ClientStatus::Failed {
            return true;
        }
        self.failed_alloc_replaced(alloc, job)
    }

    /// Step 3 for a failed allocation of a live job: whether its reschedule
    /// policy is done with it.
    fn failed_alloc_replaced(&self, alloc: &Allocation, job: &Job) -> bool {
        let policy = job.group(&alloc.task_group).and_then(|group| job.reschedule_policy(group));
        let Some(policy) = policy.filter(|policy| policy.unlimited || policy.attempts > 0) else { return true };
        if alloc.next_allocation.is_some() {
            return true;
        }
        if policy.unlimited {
            return false;
        }
        match alloc.reschedule_events.last() {
            None => false,
            Some(last) => self.now.since(last.time) > policy.interval,
        }
    }

    /// Step 5, for deployments of jobs that stay.
    fn deployments(&self, gone: &HashSet<&JobKey>) -> Vec<DeploymentId> {
        let mut live: HashSet<DeploymentId> = HashSet::new();
        for alloc in self.snapshot.allocs().filter(|alloc| !alloc.terminal()) {
            live.extend(alloc.deployment_id);
        }
        self.snapshot
            .deployments()
            .filter(|deployment| !deployment.is_active() && !gone.contains(&deployment.job_key()))
            .filter(|deployment| older(self.now, deployment.modify_time, self.thresholds.deployment))
            .filter(|deployment| !live.contains(&deployment.id))
            .map(|deployment| deployment.id)
            .collect()
    }
}

#[cfg(test)]
#[path = "select_test.rs"]
mod select_test;
