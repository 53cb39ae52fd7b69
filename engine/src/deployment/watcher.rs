//! The deployment watcher: the leader's eye on every active deployment.
//!
//! [`decide`] is pure: from a snapshot and the time it says what to write.
//! For each running deployment:
//! 1. A group with no progress deadline and an unhealthy allocation fails
//!    the deployment (`Failed due to unhealthy allocations`); with one, the
//!    reconciler replaces the allocation and the deadline decides.
//! 2. A group short of healthy allocations (or of healthy canaries before
//!    promotion) when its `require_progress_by` passes fails it (`Failed
//!    due to progress deadline`). A failure reverts to the latest stable
//!    version when the failing group says `auto_revert` ([`super::failure`]).
//! 3. When every group with canaries says `auto_promote` and all their
//!    desired canaries are placed and healthy, they are promoted.
//! 4. When every group's counters reach its goal, an eval is written once
//!    per change of the deployment, so the scheduler can finish it (an
//!    in-place update changes nothing a client reports again).
//!
//! A paused deployment is only watched for its end. [`DeploymentWatcher`]
//! runs [`decide`] on the server's timer thread whenever the deployments
//! table moved (the router wakes it) or a progress deadline is due. It
//! keeps nothing that a new leader needs: deadlines are in the state, so
//! the watcher of the next leader takes over where this one stopped.

use std::sync::Arc;

use hashbrown::HashMap;
use parking_lot::Mutex;

use super::failure;
use crate::clock::{SharedClock, Timestamp};
use crate::state::{Command, Snapshot, Writer};
use crate::structs::{deployment_description, Deployment, DeploymentId, DeploymentStatus, Evaluation, TriggerReason};

/// What the watcher writes for one deployment.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Fail it (steps 1-2).
    Fail(Box<Command>),
    /// Promote every group's canaries (step 3).
    Promote(Box<Command>),
    /// Ask the scheduler to finish it (step 4).
    Evaluate(Box<Evaluation>),
}

/// What one look at the deployments decided.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decisions {
    /// The writes, with the deployment and its modify index each is for.
    pub actions: Vec<(DeploymentId, u64, Action)>,
    /// When a progress deadline is next due.
    pub next_deadline: Option<Timestamp>,
}

/// Decides what to write for every active deployment (module docs).
pub fn decide(snapshot: &Snapshot, now: Timestamp) -> Decisions {
    let mut decisions = Decisions::default();
    for deployment in snapshot.active_deployments() {
        if deployment.status != DeploymentStatus::Running {
            continue;
        }
        match decide_one(snapshot, deployment, now) {
            Some(action) => decisions.actions.push((deployment.id, deployment.modify_index, action)),
            None => {
                for by in deadlines(deployment) {
                    decisions.next_deadline = Some(decisions.next_deadline.map_or(by, |next| next.min(by)));
                }
            }
        }
    }
    decisions
}

fn decide_one(snapshot: &Snapshot, deployment: &Deployment, now: Timestamp) -> Option<Action> {
    let unhealthy =
        deployment.task_groups.values().find(|group| group.progress_deadline.is_zero() && group.unhealthy_allocs > 0);
    if let Some(group) = unhealthy {
        let description = deployment_description::FAILED_ALLOCATIONS;
        return Some(fail(snapshot, deployment, description, group.auto_revert, now));
    }
    let late = deployment.task_groups.values().find(|group| {
        !group.is_complete() && group.is_short() && group.require_progress_by.is_some_and(|by| by <= now)
    });
    if let Some(group) = late {
        let description = deployment_description::FAILED_PROGRESS_DEADLINE;
        return Some(fail(snapshot, deployment, description, group.auto_revert, now));
    }
    if auto_promotes(snapshot, deployment) {
        let eval = eval_of(snapshot, deployment, now);
        let command = Command::PromoteDeployment { deployment_id: deployment.id, groups: vec![], eval, time: now };
        return Some(Action::Promote(Box::new(command)));
    }
    if deployment.task_groups.values().all(|group| group.is_complete()) {
        return eval_of(snapshot, deployment, now).map(|eval| Action::Evaluate(Box::new(eval)));
    }
    None
}

fn fail(snapshot: &Snapshot, deployment: &Deployment, description: &str, revert: bool, now: Timestamp) -> Action {
    let failed = failure(snapshot, deployment, description, revert, now);
    let command =
        Command::UpdateDeploymentStatus { update: failed.update, job: failed.job, eval: failed.eval, time: now };
    Action::Fail(Box::new(command))
}

/// Step 3: canaries waiting, every group with canaries auto-promotes, and
/// all of them are placed and healthy.
fn auto_promotes(snapshot: &Snapshot, deployment: &Deployment) -> bool {
    let mut waiting = deployment.task_groups.values().filter(|group| group.awaits_promotion()).peekable();
    waiting.peek().is_some()
        && waiting.all(|group| {
            let healthy = group.placed_canaries.iter().filter(|alloc_id| {
                snapshot.alloc(**alloc_id).is_some_and(|alloc| {
                    !alloc.terminal() && alloc.health.as_ref().is_some_and(|health| health.healthy)
                })
            });
            group.auto_promote && healthy.count() as u32 >= group.desired_canaries
        })
}

/// The progress deadlines of the groups still short.
fn deadlines(deployment: &Deployment) -> impl Iterator<Item = Timestamp> + '_ {
    deployment.task_groups.values().filter(|group| !group.is_complete()).filter_map(|group| group.require_progress_by)
}

fn eval_of(snapshot: &Snapshot, deployment: &Deployment, now: Timestamp) -> Option<Evaluation> {
    snapshot.job(&deployment.job_key()).map(|job| Evaluation::for_job(job, TriggerReason::DeploymentWatcher, now))
}

/// The watcher's runtime on the leader (module docs).
#[derive(Debug)]
pub struct DeploymentWatcher {
    writer: Writer,
    clock: SharedClock,
    seen: Mutex<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    /// The deployments table index last looked at.
    index: u64,
    /// When a progress deadline is next due, as of that look.
    next_deadline: Option<Timestamp>,
    /// The modify index each deployment was last acted on at: an action
    /// is written once per change of its deployment.
    acted: HashMap<DeploymentId, u64>,
}

impl DeploymentWatcher {
    /// A watcher writing through `writer`.
    pub fn new(writer: Writer, clock: SharedClock) -> Arc<Self> {
        Arc::new(DeploymentWatcher { writer, clock, seen: Mutex::new(Seen::default()) })
    }

    /// Looks at the deployments if the table moved or a deadline is due,
    /// writes what [`decide`] says, and returns the next deadline.
    pub fn run(&self) -> Option<Timestamp> {
        let mut seen = self.seen.lock();
        let snapshot = self.writer.store().snapshot();
        let now = self.clock.now();
        let index = snapshot.table_indexes().deployments;
        let due = seen.next_deadline.is_some_and(|at| at <= now);
        if index == seen.index && !due {
            return seen.next_deadline;
        }
        let decisions = decide(&snapshot, now);
        seen.index = index;
        seen.next_deadline = decisions.next_deadline;
        seen.acted.retain(|id, _| snapshot.deployment(*id).is_some_and(|deployment| deployment.is_active()));
        for (id, modify_index, action) in decisions.actions {
            if seen.acted.get(&id) == Some(&modify_index) {
                continue;
            }
            seen.acted.insert(id, modify_index);
            let command = match action {
                Action::Fail(command) | Action::Promote(command) => *command,
                Action::Evaluate(eval) => Command::UpsertEvals { evals: vec![*eval] },
            };
            if let Err(error) = self.writer.write(command) {
                // The deployment moved on meanwhile (an operator failed it,
                // a newer version cancelled it): the next look decides again.
                tracing::debug!(deployment = %id, %error, "deployment watcher write refused");
            }
        }
        seen.next_deadline
    }
}
