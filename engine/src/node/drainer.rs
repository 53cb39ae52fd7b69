//! The node drainer: the leader's eye on every draining node.
//!
//! The schedulers move what a drain moves (the reconciler migrates service
//! allocations within each group's `migrate.max_parallel` and the
//! disruption budget, and everything at the deadline; the system scheduler
//! gives system allocations up last), and a replacement's health verdict
//! brings its job's next eval ([`super::update_batch`]). [`decide`] covers
//! what no allocation change brings, from a snapshot and the time alone;
//! for each draining node:
//! 1. Nothing is left to move (every allocation stopped on its client, but
//!    the system ones a drain with `ignore_system_jobs` leaves): the drain
//!    completes; the node stays ineligible.
//! 2. Its deadline came: an eval for every job with allocations still
//!    there, which now all move.
//! 3. Only system allocations are left: an eval for each of their jobs, so
//!    the system scheduler stops them.
//!
//! [`NodeDrainer`] runs [`decide`] on the server's timer thread when a
//! drain changed or, while any node drains, an allocation did (the router
//! wakes it and says which through [`DrainSignals`]), and when a deadline
//! is due. It lists the draining nodes only when a drain changed (and once
//! as it starts leading), never on other node changes. Everything it
//! decides from is in the replicated state, so the drainer of the next
//! leader takes over where this one stopped; it only remembers which evals
//! it wrote, so as not to write them twice.

use std::sync::Arc;

use hashbrown::HashMap;
use parking_lot::Mutex;

use super::transitions::drain_evals;
use crate::clock::{SharedClock, Timestamp};
use crate::router::DrainSignals;
use crate::state::{Command, Snapshot, Writer};
use crate::structs::{Evaluation, NodeId, TriggerReason};

/// What the drainer writes for one node.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// The drain is complete (step 1).
    Complete,
    /// The deadline came: evals for every job still there (step 2).
    Deadline(Vec<Evaluation>),
    /// Only system allocations are left: evals for their jobs (step 3).
    ReleaseSystem(Vec<Evaluation>),
}

/// What one look at the draining nodes decided.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decisions {
    /// The writes, with the node and its modify index each is for.
    pub actions: Vec<(NodeId, u64, Action)>,
    /// When a drain's deadline is next due.
    pub next_deadline: Option<Timestamp>,
}

/// Decides what to write for the `draining` nodes (module docs).
pub fn decide(snapshot: &Snapshot, draining: &[NodeId], now: Timestamp) -> Decisions {
    let mut decisions = Decisions::default();
    for &node_id in draining {
        let Some(node) = snapshot.node(node_id) else { continue };
        let Some(drain) = &node.drain.strategy else { continue };
        let (mut others, mut system) = (0, Vec::new());
        for alloc in snapshot.allocs_by_node(node_id).filter(|alloc| !alloc.client_terminal()) {
            match alloc.job.job_type.is_system_like() {
                true if drain.ignore_system_jobs => {}
                true => system.push(alloc.job_key()),
                false => others += 1,
            }
        }
        let action = if others == 0 && system.is_empty() {
            Action::Complete
        } else if drain.is_forced(now) {
            Action::Deadline(drain_evals(snapshot, node_id, now))
        } else if others == 0 {
            system.sort_unstable();
            system.dedup();
            let jobs = system.iter().filter_map(|key| snapshot.job(key));
            let evals = jobs.map(|job| {
                let mut eval = Evaluation::for_job(job, TriggerReason::NodeDrain, now);
                eval.node_id = Some(node_id);
                eval
            });
            Action::ReleaseSystem(evals.collect())
        } else {
            let deadline = drain.force_deadline();
            decisions.next_deadline = [decisions.next_deadline, deadline].into_iter().flatten().min();
            continue;
        };
        decisions.actions.push((node_id, node.modify_index, action));
    }
    decisions
}

/// The drainer's runtime on the leader (module docs).
#[derive(Debug)]
pub struct NodeDrainer {
    writer: Writer,
    clock: SharedClock,
    signals: Arc<DrainSignals>,
    seen: Mutex<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    /// The state index last looked at.
    index: u64,
    /// The draining nodes as of the last listing.
    draining: Vec<NodeId>,
    /// When a deadline is next due, as of the last look.
    next_deadline: Option<Timestamp>,
    /// What was written for each node, at which of its modify indexes: an
    /// action is written once per kind and change of its node.
    acted: HashMap<NodeId, (u64, std::mem::Discriminant<Action>)>,
}

impl NodeDrainer {
    /// A drainer writing through `writer`; it lists the draining nodes on
    /// its first run.
    pub fn new(writer: Writer, clock: SharedClock) -> Arc<Self> {
        let signals = Arc::new(DrainSignals::new());
        Arc::new(NodeDrainer { writer, clock, signals, seen: Mutex::new(Seen::default()) })
    }

    /// What the router tells the drainer and reads of it.
    pub fn signals(&self) -> Arc<DrainSignals> {
        self.signals.clone()
    }

    /// Looks at the draining nodes if the state moved or a deadline is
    /// due, writes what [`decide`] says, and returns the next deadline.
    pub fn run(&self) -> Option<Timestamp> {
        let mut seen = self.seen.lock();
        // The flag before the snapshot: a drain written after the swap sets
        // it again, so the next run lists it.
        let changed = self.signals.take_changed();
        let snapshot = self.writer.store().snapshot();
        let now = self.clock.now();
        if changed {
            seen.draining = snapshot.nodes().filter(|node| node.is_draining()).map(|node| node.id).collect();
            self.signals.set_any_draining(!seen.draining.is_empty());
            // A drain that changed is looked at now, whatever the index.
            seen.index = 0;
        }
        let due = seen.next_deadline.is_some_and(|at| at <= now);
        if seen.draining.is_empty() || (snapshot.index() == seen.index && !due) {
            return seen.next_deadline.filter(|_| !seen.draining.is_empty());
        }
        seen.index = snapshot.index();
        let decisions = decide(&snapshot, &seen.draining, now);
        seen.next_deadline = decisions.next_deadline;
        let draining = seen.draining.clone();
        seen.acted.retain(|id, _| draining.contains(id));
        for (node_id, modify_index, action) in decisions.actions {
            let kind = std::mem::discriminant(&action);
            if seen.acted.get(&node_id) == Some(&(modify_index, kind)) {
                continue;
            }
            seen.acted.insert(node_id, (modify_index, kind));
            let command = match action {
                Action::Complete => {
                    tracing::info!(node = %node_id, "node drain complete");
                    Command::complete_drain(node_id, now)
                }
                Action::Deadline(evals) | Action::ReleaseSystem(evals) => Command::UpsertEvals { evals },
            };
            if let Err(error) = self.writer.write(command) {
                // The drain changed meanwhile (an operator ended it): the
                // next look decides again.
                tracing::debug!(node = %node_id, %error, "node drainer write refused");
            }
        }
        seen.next_deadline
    }
}
