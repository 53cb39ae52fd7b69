//! The plan applier: the only place where plans become state.
//!
//! 1. One applier thread takes plans from the [`PlanQueue`] in order and
//!    checks that the eval's broker token is still outstanding (a worker
//!    whose hold expired must not write).
//! 2. It checks every node of the plan against the newest snapshot plus the
//!    plans still being committed before it (an optimistic overlay, up to
//!    [`MAX_IN_FLIGHT`] plans), so plan N+1 is verified while plan N is
//!    still being written: the node exists;
//!    for new placements it is ready and eligible; everything live on it
//!    after the plan (its stops and evictions gone) fits its allocatable
//!    resources; and no port is held twice or held although the node
//!    reserves it, so concurrent plans never share a port. A node that
//!    fails is refused whole (its stops and evictions too), as in Nomad.
//!    Plans touching many nodes are checked in parallel with rayon.
//! 3. What fits is committed as one [`Command::ApplyPlanResults`] by a
//!    committer thread, with an eval for every job whose allocations it
//!    evicts; the worker gets a [`PlanResult`] with the index it was
//!    applied at and, when anything was refused, a `refresh_index` (after
//!    every plan before it) to re-plan against. A partly refused plan is a
//!    result, not an error. The committer submits each plan as it comes,
//!    while the plans before it are still being written, and answers them
//!    in order; a durable log takes the plans submitted during one fsync
//!    into its next entry, so they share the next fsync.
//!    Before committing, every task group's disruption budget is held
//!    ([`super::budget`]): voluntary stops beyond it are taken out with
//!    their replacements, and the worker re-plans as for a refused node.
//! 4. The rejection tracker counts refusals per node; a node refused more
//!    than `rejection_threshold` times within `rejection_window` is marked
//!    ineligible, at most `max_marked_per_window` nodes per window.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use crossbeam::channel::{self, Receiver, Sender, TryRecvError};
use hashbrown::HashMap;
use parking_lot::Mutex;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::clock::{SharedClock, Timestamp};
use crate::eval::broker::{EvalBroker, Token};
use crate::plan::budget::hold_budget;
use crate::plan::queue::{PendingPlan, PlanError, PlanQueue};
use crate::state::{Applied, Command, PendingWrite, Snapshot, StateError, Writer};
use crate::structs::{Allocation, Node, NodeEligibility, NodeId, Plan, PlanResult, Resources};

/// Plans touching more nodes than this are checked in parallel.
const PARALLEL_CHECK_NODES: usize = 64;

/// Plans committed but not yet acknowledged at most (step 2): enough that
/// a durable log's fsync carries many plans, few enough that the overlay a
/// plan is checked against stays small.
pub const MAX_IN_FLIGHT: usize = 16;

/// Plan applier settings.
#[derive(Clone, Debug)]
pub struct PlanApplierConfig {
    /// Refusals of one node within the window before it is marked ineligible.
    pub rejection_threshold: usize,
    /// The window refusals are counted in.
    pub rejection_window: Duration,
    /// Most nodes marked ineligible per window.
    pub max_marked_per_window: usize,
}

impl Default for PlanApplierConfig {
    fn default() -> Self {
        PlanApplierConfig {
            rejection_threshold: 100,
            rejection_window: Duration::from_secs(5 * 60),
            max_marked_per_window: 5,
        }
    }
}

/// Counters of the plan applier.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanApplierStats {
    /// Plans taken from the queue.
    pub plans_evaluated: u64,
    /// Plans of which part was refused.
    pub plans_partially_refused: u64,
    /// Plans refused for a stale token.
    pub plans_stale: u64,
    /// Node refusals.
    pub node_rejections: u64,
    /// Nodes the rejection tracker marked ineligible.
    pub nodes_marked_ineligible: u64,
    /// Allocations evicted by committed plans (preemption).
    #[serde(default)]
    pub allocs_preempted: u64,
    /// Voluntary stops taken out of plans to hold groups' disruption budgets.
    #[serde(default)]
    pub disruptions_refused: u64,
}

#[derive(Debug, Default)]
struct Counters {
    plans_evaluated: AtomicU64,
    plans_partially_refused: AtomicU64,
    plans_stale: AtomicU64,
    node_rejections: AtomicU64,
    nodes_marked_ineligible: AtomicU64,
    allocs_preempted: AtomicU64,
    disruptions_refused: AtomicU64,
}

/// Which nodes of a plan fit; computed against a snapshot and an overlay.
pub fn evaluate_plan(
    plan: &Plan,
    snapshot: &Snapshot,
    overlay: &HashMap<NodeId, Vec<Allocation>>,
) -> (PlanResult, Vec<NodeId>) {
    evaluate_plan_over(plan, snapshot, &[overlay])
}

/// Which nodes of a plan fit against a snapshot and the overlays of the
/// plans in flight, oldest first.
pub fn evaluate_plan_over(
    plan: &Plan,
    snapshot: &Snapshot,
    overlays: &[&HashMap<NodeId, Vec<Allocation>>],
) -> (PlanResult, Vec<NodeId>) {
    let mut node_ids: Vec<NodeId> = plan
        .node_allocation
        .keys()
        .chain(plan.node_update.keys())
        .chain(plan.node_preemptions.keys())
        .copied()
        .collect();
    node_ids.sort_unstable();
    node_ids.dedup();
    let check = |node_id: &NodeId| (*node_id, node_fits(plan, snapshot, overlays, *node_id));
    let verdicts: Vec<(NodeId, bool)> = if node_ids.len() > PARALLEL_CHECK_NODES {
        node_ids.par_iter().map(check).collect()
    } else {
        node_ids.iter().map(check).collect()
    };
    let mut result = PlanResult {
        deployment: plan.deployment.clone(),
        deployment_updates: plan.deployment_updates.clone(),
        ..PlanResult::default()
    };
    let mut refused = Vec::new();
    for (node_id, fits) in verdicts {
        if !fits {
            refused.push(node_id);
            continue;
        }
        if let Some(stops) = plan.node_update.get(&node_id) {
            result.node_update.insert(node_id, stops.clone());
        }
        if let Some(allocs) = plan.node_allocation.get(&node_id) {
            result.node_allocation.insert(node_id, allocs.clone());
        }
        if let Some(evicted) = plan.node_preemptions.get(&node_id) {
            result.node_preemptions.insert(node_id, evicted.clone());
        }
    }
    (result, refused)
}

/// Step 2 for one node.
fn node_fits(
    plan: &Plan,
    snapshot: &Snapshot,
    overlays: &[&HashMap<NodeId, Vec<Allocation>>],
    node_id: NodeId,
) -> bool {
    let allocs = plan.node_allocation.get(&node_id).map(Vec::as_slice).unwrap_or_default();
    if allocs.is_empty() {
        return true; // Only stops: always allowed.
    }
    let Some(node) = snapshot.node(node_id) else { return false };
    let places_new = allocs.iter().any(|alloc| snapshot.alloc(alloc.id).is_none());
    if places_new && !node.is_schedulable() {
        return false;
    }
    // Start from the node's usage and ports and adjust for what the overlay
    // and the plan change: O(allocations in the plan), not O(allocations on
    // the node).
    let empty: &[Allocation] = &[];
    let in_flight = overlays.iter().map(|overlay| overlay.get(&node_id).map_or(empty, Vec::as_slice));
    let layers = in_flight.chain([
        plan.node_update.get(&node_id).map_or(empty, Vec::as_slice),
        plan.node_preemptions.get(&node_id).map_or(empty, Vec::as_slice),
        allocs,
    ]);
    let live = |alloc: &Allocation| !alloc.terminal();
    let mut latest: HashMap<_, &Allocation> = HashMap::new();
    let (mut added, mut removed) = (Resources::default(), Resources::default());
    // Net change of holders per port: +1 per live holder after, -1 per live holder before.
    let mut port_holders: HashMap<u16, i32> = HashMap::new();
    for alloc in layers.into_iter().flatten() {
        let previous = latest.get(&alloc.id).copied().or_else(|| snapshot.alloc(alloc.id).map(|old| &**old));
        if let Some(previous) = previous.filter(|previous| live(previous)) {
            removed = removed.plus(previous.resources);
            for port in previous.port_values() {
                *port_holders.entry(port).or_insert(0) -= 1;
            }
        }
        if live(alloc) {
            added = added.plus(alloc.resources);
            for port in alloc.port_values() {
                *port_holders.entry(port).or_insert(0) += 1;
            }
        }
        latest.insert(alloc.id, alloc);
    }
    let used = snapshot.node_usage(node_id).plus(added).minus(removed);
    node.allocatable().covers(used) && ports_fit(snapshot, node, &port_holders)
}

/// Whether every port whose holders the plan changes ends with at most one
/// holder, and none on a port the node reserves.
fn ports_fit(snapshot: &Snapshot, node: &Node, port_holders: &HashMap<u16, i32>) -> bool {
    port_holders.iter().filter(|(_, change)| **change > 0).all(|(port, change)| {
        let before = i32::from(snapshot.port_in_use(node.id, *port));
        before + change <= 1 && !node.network.reserved_ports.contains(*port)
    })
}

/// The plan being committed: its allocations per node (the overlay) and its completion signal.
type InFlight = (HashMap<NodeId, Vec<Allocation>>, Receiver<()>);

/// A plan being written by the committer.
struct Commit {
    pending: PendingPlan,
    result: PlanResult,
    command: Command,
    done: Sender<()>,
}

/// A plan submitted to the log, waiting for its write.
struct Written {
    started: std::time::Instant,
    pending: PendingPlan,
    result: PlanResult,
    done: Sender<()>,
}

/// Wakes the committer thread (its writes' waker).
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Counts refusals per node and marks repeat offenders ineligible (step 4).
#[derive(Debug)]
struct RejectionTracker {
    config: PlanApplierConfig,
    refusals: HashMap<NodeId, VecDeque<Timestamp>>,
    marked: VecDeque<Timestamp>,
}

impl RejectionTracker {
    /// Records refusals; returns the nodes to mark ineligible now.
    fn record(&mut self, nodes: &[NodeId], now: Timestamp) -> Vec<NodeId> {
        let window_start = Timestamp(now.0.saturating_sub(self.config.rejection_window.as_nanos() as u64));
        while self.marked.front().is_some_and(|at| *at < window_start) {
            self.marked.pop_front();
        }
        let mut to_mark = Vec::new();
        for node_id in nodes {
            let times = self.refusals.entry(*node_id).or_default();
            times.push_back(now);
            while times.front().is_some_and(|at| *at < window_start) {
                times.pop_front();
            }
            if times.len() > self.config.rejection_threshold && self.marked.len() < self.config.max_marked_per_window {
                times.clear();
                self.marked.push_back(now);
                to_mark.push(*node_id);
            }
        }
        to_mark
    }
}

/// The running plan applier; stop it with [`PlanApplierHandle::stop`].
pub struct PlanApplierHandle {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for PlanApplierHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanApplierHandle").field("threads", &self.threads.len()).finish()
    }
}

impl PlanApplierHandle {
    /// The applier's counters.
    pub fn stats(&self) -> PlanApplierStats {
        let c = &self.counters;
        PlanApplierStats {
            plans_evaluated: c.plans_evaluated.load(Ordering::Relaxed),
            plans_partially_refused: c.plans_partially_refused.load(Ordering::Relaxed),
            plans_stale: c.plans_stale.load(Ordering::Relaxed),
            node_rejections: c.node_rejections.load(Ordering::Relaxed),
            nodes_marked_ineligible: c.nodes_marked_ineligible.load(Ordering::Relaxed),
            allocs_preempted: c.allocs_preempted.load(Ordering::Relaxed),
            disruptions_refused: c.disruptions_refused.load(Ordering::Relaxed),
        }
    }

    /// Stops the applier after the plan in hand and joins its threads.
    pub fn stop(mut self) {
        self.join();
    }

    fn join(&mut self) {
        self.stop.store(true, Ordering::Release);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for PlanApplierHandle {
    fn drop(&mut self) {
        self.join();
    }
}

/// The plan applier; see the module docs.
#[derive(Debug)]
pub struct PlanApplier {
    writer: Writer,
    queue: Arc<PlanQueue>,
    broker: Arc<EvalBroker>,
    clock: SharedClock,
    tracker: Mutex<RejectionTracker>,
    counters: Arc<Counters>,
}

impl PlanApplier {
    /// Starts the applier and committer threads.
    pub fn start(
        config: PlanApplierConfig,
        writer: Writer,
        queue: Arc<PlanQueue>,
        broker: Arc<EvalBroker>,
        clock: SharedClock,
    ) -> PlanApplierHandle {
        let counters = Arc::new(Counters::default());
        let applier = Arc::new(PlanApplier {
            writer,
            queue,
            broker,
            clock,
            tracker: Mutex::new(RejectionTracker { config, refusals: HashMap::new(), marked: VecDeque::new() }),
            counters: counters.clone(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let (commits, to_commit) = channel::bounded::<Commit>(MAX_IN_FLIGHT);
        let committer = {
            let applier = applier.clone();
            std::thread::Builder::new()
                .name("plan-committer".into())
                .spawn(move || applier.commit_loop(to_commit))
                .expect("spawning the plan committer")
        };
        let evaluator = {
            let stop = stop.clone();
            let committer_thread = committer.thread().clone();
            std::thread::Builder::new()
                .name("plan-applier".into())
                .spawn(move || applier.evaluate_loop(&stop, commits, &committer_thread))
                .expect("spawning the plan applier")
        };
        PlanApplierHandle { stop, threads: vec![evaluator, committer], counters }
    }

    fn evaluate_loop(&self, stop: &AtomicBool, commits: Sender<Commit>, committer: &Thread) {
        // The plans being committed, oldest first, for the overlay, with
        // their completion signals.
        let mut in_flight: VecDeque<InFlight> = VecDeque::new();
        while !stop.load(Ordering::Acquire) {
            let Some(mut pending) = self.queue.dequeue(Duration::from_millis(50)) else { continue };
            self.counters.plans_evaluated.fetch_add(1, Ordering::Relaxed);
            if self.broker.outstanding(pending.plan.eval_id) != Some(Token(pending.plan.eval_token)) {
                self.counters.plans_stale.fetch_add(1, Ordering::Relaxed);
                let eval_id = pending.plan.eval_id;
                pending.respond(Err(PlanError::StaleToken(eval_id)));
                continue;
            }
            // A finished plan is in the newest snapshot: it leaves the overlay.
            while in_flight.front().is_some_and(|(_, done)| !matches!(done.try_recv(), Err(TryRecvError::Empty))) {
                in_flight.pop_front();
            }
            let snapshot = self.writer.store().snapshot();
            let overlays: Vec<_> = in_flight.iter().map(|(overlay, _)| overlay).collect();
            let started = std::time::Instant::now();
            let (mut result, refused) = evaluate_plan_over(&pending.plan, &snapshot, &overlays);
            let over_budget = hold_budget(&pending.plan, &snapshot, &overlays, &mut result);
            crate::timing::record_since("drover.plan.evaluate", started);
            if over_budget > 0 {
                self.counters.disruptions_refused.fetch_add(over_budget as u64, Ordering::Relaxed);
            }
            if !refused.is_empty() || over_budget > 0 {
                // The worker re-plans from a state that holds every plan before this one.
                for (_, done) in in_flight.drain(..) {
                    let _ = done.recv();
                }
                result.refresh_index = self.writer.store().latest_index();
                self.note_refusals(&refused);
            }
            if result.is_empty() {
                pending.respond(Ok(result));
                continue;
            }
            if in_flight.len() >= MAX_IN_FLIGHT {
                if let Some((_, done)) = in_flight.pop_front() {
                    let _ = done.recv();
                }
            }
            // The result holds what is committed; the plan's own copies of
            // its allocations (a system job's are thousands) go before the
            // overlay and the command copy them again.
            let eval_id = pending.plan.eval_id;
            pending.plan = Plan { eval_id, ..Plan::default() };
            let (done, finished) = channel::bounded(1);
            let overlay = overlay_of(&result);
            let command = Command::apply_plan_result(eval_id, &result, self.clock.now());
            if commits.send(Commit { pending, result, command, done }).is_err() {
                return;
            }
            committer.unpark();
            in_flight.push_back((overlay, finished));
        }
        for (_, done) in in_flight {
            let _ = done.recv();
        }
    }

    /// Step 3: submits each plan as it arrives, while the plans before it
    /// are still being written, and answers each in order once it is
    /// written. A replicated log takes every submission queued while its
    /// last entry is being made durable into its next entry, so plans that
    /// arrive together share an fsync; and no plan waits for the whole
    /// cycle (append, fsync, apply) of the one before it.
    fn commit_loop(&self, to_commit: Receiver<Commit>) {
        // The writes are futures; this thread is their executor, woken
        // (unparked) by a finished write or by the evaluator's next plan.
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut context = Context::from_waker(&waker);
        let mut writing: VecDeque<(PendingWrite, Written)> = VecDeque::new();
        loop {
            // Answer, in order, the plans written; a store that is its own
            // log has written each by the time it was submitted.
            while let Some((write, _)) = writing.front_mut() {
                let Poll::Ready(written) = Pin::new(write).poll(&mut context) else { break };
                let (_, plan) = writing.pop_front().expect("the front write is there");
                self.answer(plan, written);
            }
            let arrived = if writing.is_empty() {
                to_commit.recv().map_err(|_| TryRecvError::Disconnected)
            } else {
                to_commit.try_recv()
            };
            match arrived {
                Ok(commit) => writing.push_back(self.submit(commit)),
                // The oldest write is not answered and no plan came: wait for either.
                Err(TryRecvError::Empty) => std::thread::park(),
                Err(TryRecvError::Disconnected) => break,
            }
        }
        for (write, plan) in writing {
            self.answer(plan, write.wait());
        }
    }

    /// Submits a plan's command to the log.
    fn submit(&self, Commit { pending, result, command, done }: Commit) -> (PendingWrite, Written) {
        let started = std::time::Instant::now();
        (self.writer.submit(command), Written { started, pending, result, done })
    }

    /// Answers the worker of a plan written (or refused by the log).
    fn answer(&self, Written { started, pending, mut result, done }: Written, written: Result<Applied, StateError>) {
        crate::timing::record_since("drover.plan.apply", started);
        match written {
            Ok(applied) => {
                result.alloc_index = applied.index;
                // A worker on another server re-plans against its own
                // store: it must hold this plan's placements too, or
                // they would be placed again (Nomad's refresh rule).
                if result.refresh_index != 0 {
                    result.refresh_index = result.refresh_index.max(applied.index);
                }
                result.refuse_placements(&applied.refused_placements, applied.index);
                let evicted = result.node_preemptions.values().map(Vec::len).sum::<usize>();
                self.counters.allocs_preempted.fetch_add(evicted as u64, Ordering::Relaxed);
                pending.respond(Ok(result));
            }
            Err(error) => pending.respond(Err(PlanError::Write(error))),
        }
        let _ = done.send(());
    }

    fn note_refusals(&self, refused: &[NodeId]) {
        self.counters.plans_partially_refused.fetch_add(1, Ordering::Relaxed);
        self.counters.node_rejections.fetch_add(refused.len() as u64, Ordering::Relaxed);
        let to_mark = self.tracker.lock().record(refused, self.clock.now());
        for node_id in to_mark {
            let command =
                Command::UpdateNodeEligibility { node_id, eligibility: NodeEligibility::Ineligible, evals: vec![] };
            match self.writer.write(command) {
                Ok(_) => {
                    self.counters.nodes_marked_ineligible.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%node_id, "node marked ineligible after repeated plan rejections");
                }
                Err(error) => tracing::warn!(%node_id, %error, "could not mark node ineligible"),
            }
        }
    }
}

/// The allocations a result writes, per node: the overlay for the next plan.
fn overlay_of(result: &PlanResult) -> HashMap<NodeId, Vec<Allocation>> {
    let mut overlay: HashMap<NodeId, Vec<Allocation>> = HashMap::new();
    let changed = result.node_update.iter().chain(result.node_preemptions.iter()).chain(result.node_allocation.iter());
    for (node_id, allocs) in changed {
        overlay.entry(*node_id).or_default().extend(allocs.iter().cloned());
    }
    overlay
}

#[cfg(test)]
#[path = "apply_test.rs"]
mod apply_test;
