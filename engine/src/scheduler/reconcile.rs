//! The reconciler: a pure diff of what a job wants against the allocations
//! it has. It decides *what* to place, stop and update; the stack decides
//! *where*.
//!
//! Per task group:
//! 1. A stopped or missing job (or a removed group) stops every live allocation.
//! 2. Live allocations are split by the state of their node (Nomad's
//!    `filterByTainted`, see [`taint_of`]): untainted, lost, disconnecting,
//!    unknown, awaiting report, reconnecting.
//!    Allocations on a draining node migrate: a service allocation is
//!    stopped and replaced elsewhere while its group keeps `count -
//!    migrate.max_parallel` available allocations (the same budget an
//!    update draws on), a batch allocation stays until the drain's
//!    deadline, and at the deadline everything moves ([`Reconciler`]'s
//!    `migrate`). The replacement links to the allocation it replaces.
//! 3. Lost allocations are stopped as `lost`; a group with
//!    `stop_after_client_disconnect` keeps a lost allocation's slot empty
//!    for that long after (its client stops it by then), so the two never
//!    run at once; a follow-up eval places the replacement. Disconnecting ones are marked
//!    `unknown` and a follow-up eval is due when their `max_client_disconnect`
//!    runs out. The slots of lost, disconnecting and unknown allocations get
//!    a replacement (linked to them) unless another live allocation holds
//!    the slot, or the group says `replace_on_disconnect = false` (Nomad
//!    1.8's `disconnect { replace = false }`: an `unknown` allocation then
//!    keeps its slot until it reconnects or its window runs out); when several allocations ask for one slot (an original that
//!    went `unknown` and its failed replacement, say), the newest one's
//!    chain goes on. An `unknown` allocation whose node is back but whose client
//!    has not reported it yet is ignored, as Nomad 1.4/1.5 ignores it: it
//!    neither holds its slot against a replacement nor is updated or
//!    stopped; only the client's report decides its reconnect (step 4). Its
//!    node accepts no placement meanwhile (only `ready` nodes do, and an
//!    `initializing` node becomes ready only after the report).
//!    Running allocations on a node the storm guard holds (`node::storm`)
//!    keep their slots, untouched, until the hold's release time (and, in
//!    a group with `stop_after_client_disconnect`, until that long after
//!    the node was held: its client stops them by then), so a node back
//!    before it has nothing to reconnect; then each is marked `unknown`
//!    and gets a replacement, and is stopped as lost only once a
//!    live allocation of its slot runs (a follow-up eval every
//!    [`HOLD_RECHECK`] until then), so no original stops before its
//!    replacement runs.
//! 4. Reconnecting allocations (the servers marked them `unknown`, their
//!    node is back and the client has reported them since) are settled: one
//!    allocation per slot is kept: a replacement that runs a newer job
//!    version, else the one the group's `disconnect { reconcile }` picks
//!    (best score, the default; keep the original; keep the replacement;
//!    longest running), though a running original is never stopped for a
//!    replacement that does not run yet; the others are stopped. A kept original gets an
//!    `AllocState` entry recording the reconnect, so later evals treat it as
//!    settled. (A reconnecting allocation that failed is client-terminal and
//!    handled as a failure; one the servers already stopped is not touched.)
//! 5. Failed allocations are rescheduled per the reschedule policy: now
//!    (replaced, linked to the failed one), later (a follow-up eval at the
//!    delay), or never (attempts used up). The delay counts from the
//!    failure, and the follow-up eval itself always reschedules (Nomad's
//!    rule), however late or early it runs. Complete batch allocations keep
//!    their slot and are never replaced.
//! 6. Slots `0..count` not held are placed; live allocations beyond the
//!    count are stopped, highest index first.
//! 7. Allocations of an older job version are updated in place when only
//!    non-scheduling fields changed, else destructively (stop and replace).
//!    A group without an `update` block replaces them all at once. A group
//!    with one rolls out in a deployment ([`Rollout`]):
//!    - the job's newest deployment is cancelled when the job stopped or a
//!      newer version came; a deployment is created when a group's
//!      allocations need placing or updating for a version none of them
//!      runs yet; every placement (and in-place update) of the eval joins
//!      the active deployment;
//!    - with `canary = N`, N canaries of the new version are placed beside
//!      the old allocations (in the slots of those to replace) and nothing
//!      else is replaced until they are promoted; unpromoted canaries of an
//!      older or failed deployment are stopped; a promoted canary takes its
//!      slot and the old allocation there is stopped;
//!    - old allocations are stopped only while the group's available
//!      allocations (running, and healthy when their deployment asks) stay
//!      at least `count - max_parallel` (the disruption budget the plan
//!      applier enforces too); an unavailable old allocation costs nothing
//!      to replace. So each batch starts as soon as the previous one is
//!      healthy: the clients' health reports bring the next eval. Nothing
//!      more is replaced while the deployment is paused or failed or one of
//!      its allocations is unhealthy; an unhealthy allocation of an active
//!      deployment whose group has a progress deadline is replaced;
//!    - when every group of the deployment has nothing left to do and its
//!      healthy allocations reach the desired total, the deployment is
//!      successful.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use hashbrown::HashMap;

use crate::clock::Timestamp;
use crate::structs::{
    deployment_description, Allocation, ClientStatus, DelayFunction, Deployment, DeploymentGroup, DeploymentId,
    DeploymentStatus, DeploymentStatusUpdate, EvalId, Job, JobKey, JobType, Node, NodeId, NodeStatus,
    ReconcileStrategy, ReschedulePolicy, Task, TaskGroup, UpdateStrategy,
};

/// How often a group with allocations on a held node whose replacements do
/// not run yet is evaluated again (module docs, step 3).
pub const HOLD_RECHECK: Duration = Duration::from_secs(5);

/// Why an allocation is stopped: the descriptions both schedulers record
/// (Nomad's `allocNotNeeded`, `allocLost`, `allocUpdating` and kin).
pub mod stop_reason {
    /// The job was stopped or purged, or the group removed.
    pub const JOB_STOPPED: &str = "alloc not needed as the job or its group was stopped";
    /// Its node is down or gone, or its disconnect window ran out.
    pub const LOST: &str = "alloc is lost since its node is down or its disconnect ran out";
    /// A reconnecting original lost to a replacement running a newer job version.
    pub const REPLACEMENT_NEWER: &str = "alloc not needed: its replacement runs a newer job version";
    /// A reconnecting original lost to its replacement by the group's
    /// `disconnect { reconcile }` strategy.
    pub const REPLACEMENT_KEPT: &str =
        "alloc not needed: its replacement was kept as the group's reconcile strategy says";
    /// An original on a node the storm guard holds, stopped once its
    /// replacement runs.
    pub const HELD_REPLACED: &str = "alloc is lost: its node is held disconnected and its replacement runs";
    /// A replacement stopped because its original reconnected.
    pub const ORIGINAL_RECONNECTED: &str = "alloc not needed as the original allocation reconnected";
    /// A duplicate of a slot another live allocation holds.
    pub const SLOT_TAKEN: &str = "alloc not needed: another allocation holds its slot";
    /// Beyond the group's count.
    pub const SCALED_DOWN: &str = "alloc not needed due to job update";
    /// Replaced by an allocation of the new job version (a destructive update).
    pub const UPDATING: &str = "alloc is being updated due to job update";
    /// Its slot was taken by a promoted canary of the new job version.
    pub const REPLACED_BY_CANARY: &str = "alloc not needed as a promoted canary took its place";
    /// A canary of a deployment that was cancelled or failed.
    pub const CANARY_NOT_NEEDED: &str = "alloc not needed due to job update";
    /// Unhealthy in an active deployment: replaced, and the deployment goes on.
    pub const UNHEALTHY: &str = "alloc is unhealthy and is being replaced";

    /// Whether a stop with this description is a voluntary disruption that
    /// counts against the group's budget.
    pub fn is_voluntary(description: &str) -> bool {
        is_update(description) || description == MIGRATING
    }
    /// Whether a voluntary stop belongs to a rollout (held to the group's
    /// `update.max_parallel`; a migration is held to `migrate.max_parallel`).
    pub fn is_update(description: &str) -> bool {
        description == UPDATING || description == REPLACED_BY_CANARY
    }
    /// Moved off a draining node.
    pub const MIGRATING: &str = "alloc is being migrated";
    /// Moved off a draining node whose deadline came: not held to any budget.
    pub const DRAIN_DEADLINE: &str = "alloc is being migrated: its node's drain deadline was reached";
    /// A system allocation of a drained node, once the node's other
    /// allocations left it (or its deadline came).
    pub const NODE_DRAINED: &str = "alloc not needed as node is tainted";
    /// A system allocation whose node is no longer ready and eligible.
    pub const NODE_INELIGIBLE: &str = "alloc not needed: its node is no longer eligible";
    /// A system allocation whose node no longer meets the job's constraints.
    pub const NODE_INFEASIBLE: &str = "alloc not needed: its node no longer meets the job's constraints";
    /// A duplicate of a system allocation on the same node.
    pub const NODE_TAKEN: &str = "alloc not needed: another allocation holds its node";
}

/// One allocation to place.
#[derive(Clone, Debug)]
pub struct PlaceRequest {
    /// The group.
    pub group: Arc<str>,
    /// The slot.
    pub index: u32,
    /// The allocation this one replaces (lost, rescheduled, updated).
    pub previous: Option<Arc<Allocation>>,
    /// Whether it replaces a failed allocation (its node gets a penalty).
    pub reschedule: bool,
    /// Whether it is a canary of the deployment.
    pub canary: bool,
}

/// One allocation to stop.
#[derive(Clone, Debug)]
pub struct StopRequest {
    /// The allocation.
    pub alloc: Arc<Allocation>,
    /// Why.
    pub description: &'static str,
    /// A client status to record with the stop (`lost` for lost allocations).
    pub client_status: Option<ClientStatus>,
}

/// The reconciler's decisions for one job.
#[derive(Clone, Debug, Default)]
pub struct Reconciled {
    /// Allocations to place.
    pub place: Vec<PlaceRequest>,
    /// Allocations to stop.
    pub stop: Vec<StopRequest>,
    /// Allocations to move to the new job version without restarting.
    pub inplace: Vec<Arc<Allocation>>,
    /// Allocations on disconnected nodes to mark `unknown`.
    pub disconnecting: Vec<Arc<Allocation>>,
    /// Allocations that reconnected and are kept: record the reconnect.
    pub reconnect: Vec<Arc<Allocation>>,
    /// Failed allocations to reschedule later, with when.
    pub delayed_reschedules: Vec<(Arc<Allocation>, Timestamp)>,
    /// When an eval is next due: a disconnect expiry or a stop's silence.
    pub follow_up_at: Option<Timestamp>,
    /// The job's deployment as this eval leaves it, when it was created or changed.
    pub deployment: Option<Deployment>,
    /// Status changes of the job's older deployments (cancelled).
    pub deployment_updates: Vec<DeploymentStatusUpdate>,
    /// The active deployment every placement and in-place update joins.
    pub deployment_id: Option<DeploymentId>,
}

impl Reconciled {
    fn follow_up_no_later_than(&mut self, at: Timestamp) {
        self.follow_up_at = Some(self.follow_up_at.map_or(at, |current| current.min(at)));
    }
}

/// Which set an allocation falls into by the state of its node (module docs, step 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taint {
    /// The node is fine.
    Untainted,
    /// The node is down or gone, or its `unknown` time ran out, or it was
    /// still pending when its node disconnected (it never started).
    Lost,
    /// The node is disconnected and the group tolerates a disconnect: mark
    /// it `unknown`.
    Disconnecting,
    /// Already `unknown` on a disconnected node: wait for it, replace it.
    Unknown,
    /// `unknown`, its node is back but the client has not reported it yet:
    /// ignored until the report; its slot is replaced, not held.
    AwaitingReport,
    /// `unknown`, its node is back and the client reported it: settle it.
    Reconnecting,
    /// Its node missed its heartbeat while the storm guard was on and is
    /// held `disconnected` (`node::storm`): its slot kept until the hold's
    /// release, then marked `unknown` and replaced; stopped only once the
    /// replacement runs.
    Held {
        /// When its node was held.
        since: Timestamp,
        /// When its replacement may be placed.
        release_at: Timestamp,
    },
}

/// Classifies a live allocation by its node at `now`. `node` is `None`
/// when the node no longer exists. Whether it was `unknown` is read from
/// the servers' history ([`Allocation::needs_reconnect`]); how long it may
/// stay so from its own job version (the one its node disconnected under,
/// as the state store decides `down` or `disconnected`).
pub fn taint_of(alloc: &Allocation, node: Option<&Node>, now: Timestamp) -> Taint {
    let Some(node) = node else { return Taint::Lost };
    let window = disconnect_window(alloc);
    let expired = window.and_then(|window| alloc.disconnect_expires_at(window)).is_some_and(|at| at <= now);
    // A held node's running (or already `unknown`) allocations wait; one
    // that never started is lost as on any disconnected node.
    if let (NodeStatus::Disconnected, Some(hold)) = (node.status, node.hold) {
        if alloc.client_status == ClientStatus::Running || alloc.needs_reconnect() {
            return Taint::Held { since: hold.since, release_at: hold.release_at };
        }
    }
    match node.status {
        NodeStatus::Down => Taint::Lost,
        NodeStatus::Disconnected => match window {
            None => Taint::Lost,
            Some(_) if alloc.needs_reconnect() => {
                if expired {
                    Taint::Lost
                } else {
                    Taint::Unknown
                }
            }
            Some(_) if alloc.client_status == ClientStatus::Running => Taint::Disconnecting,
            Some(_) => Taint::Lost,
        },
        NodeStatus::Ready | NodeStatus::Initializing => {
            if !alloc.needs_reconnect() {
                Taint::Untainted
            } else if expired {
                Taint::Lost
            } else if alloc.client_status == ClientStatus::Unknown {
                Taint::AwaitingReport
            } else {
                Taint::Reconnecting
            }
        }
    }
}

/// How long `alloc` may stay `unknown`: its own job version's
/// `max_client_disconnect`.
pub fn disconnect_window(alloc: &Allocation) -> Option<Duration> {
    alloc.job.group(&alloc.task_group).and_then(|group| group.max_client_disconnect)
}

/// Inputs of one reconciliation.
#[derive(Debug)]
pub struct Reconciler<'a> {
    /// The job as stored, `None` when it was purged.
    pub job: Option<&'a Arc<Job>>,
    /// The job's key (known even when the job is gone).
    pub job_key: &'a JobKey,
    /// Every allocation of the job, terminal ones included.
    pub allocs: &'a [Arc<Allocation>],
    /// The nodes those allocations are on (missing: the node is gone).
    pub nodes: &'a HashMap<NodeId, Arc<Node>>,
    /// Now.
    pub now: Timestamp,
    /// The eval being processed: a failed allocation whose follow-up eval
    /// this is is rescheduled now.
    pub eval_id: EvalId,
    /// The job's newest deployment.
    pub deployment: Option<&'a Arc<Deployment>>,
    /// The eval's priority (a deployment created now keeps it).
    pub eval_priority: u8,
}

impl Reconciler<'_> {
    /// Computes the changes (module docs, steps 1-7).
    pub fn compute(&self) -> Reconciled {
        let mut result = Reconciled::default();
        let mut by_group: BTreeMap<&str, Vec<&Arc<Allocation>>> = BTreeMap::new();
        for alloc in self.allocs {
            by_group.entry(&alloc.task_group).or_default().push(alloc);
        }
        let job = self.job.filter(|job| !job.stop);
        let mut rollout = Rollout::new(self.deployment, job, &mut result);
        for (group_name, allocs) in &by_group {
            match job.and_then(|job| job.group(group_name).map(|group| (job, group))) {
                Some((job, group)) => self.reconcile_group(job, group, allocs, &mut rollout, &mut result),
                None => stop_live(allocs, stop_reason::JOB_STOPPED, &mut result),
            }
        }
        if let Some(job) = job {
            for group in job.task_groups.iter().filter(|group| !by_group.contains_key(group.name.as_str())) {
                self.reconcile_group(job, group, &[], &mut rollout, &mut result);
            }
            rollout.finish(self.eval_priority, self.now, &mut result);
        }
        result
    }

    fn reconcile_group(
        &self,
        job: &Arc<Job>,
        group: &TaskGroup,
        allocs: &[&Arc<Allocation>],
        rollout: &mut Rollout,
        out: &mut Reconciled,
    ) {
        let group_name: Arc<str> = Arc::from(group.name.as_str());
        let mut held: BTreeMap<u32, Vec<&Arc<Allocation>>> = BTreeMap::new();
        let mut replacements: Vec<PlaceRequest> = Vec::new();
        let mut reconnecting: Vec<&Arc<Allocation>> = Vec::new();
        // Slots kept without a replacement: an `unknown` allocation's, and a
        // lost one's while its client may still run it.
        let mut kept: BTreeSet<u32> = BTreeSet::new();
        let mut canaries: Vec<&Arc<Allocation>> = Vec::new();
        let mut migrating: Vec<&Arc<Allocation>> = Vec::new();
        let mut released: Vec<&Arc<Allocation>> = Vec::new();
        let places_before = out.place.len();
        for alloc in allocs.iter().copied() {
            let index = alloc.index().unwrap_or(u32::MAX);
            if alloc.server_terminal() {
                if let Some(until) = silence_wait(group, alloc).filter(|until| *until > self.now) {
                    kept.insert(index);
                    out.follow_up_no_later_than(until);
                }
                continue;
            }
            if alloc.client_terminal() {
                self.reconcile_terminal(job, group, alloc, index, &mut held, &mut replacements, out);
                continue;
            }
            let node = self.nodes.get(&alloc.node_id).map(|node| &**node);
            match taint_of(alloc, node, self.now) {
                Taint::Lost => {
                    out.stop.push(StopRequest {
                        alloc: alloc.clone(),
                        description: stop_reason::LOST,
                        client_status: Some(ClientStatus::Lost),
                    });
                    match group.stop_after_client_disconnect {
                        Some(wait) => {
                            kept.insert(index);
                            out.follow_up_no_later_than(self.now.plus(wait));
                        }
                        None => replacements.push(replacement(&group_name, index, alloc, false)),
                    }
                }
                Taint::Disconnecting => {
                    out.disconnecting.push(alloc.clone());
                    if let Some(window) = disconnect_window(alloc) {
                        out.follow_up_no_later_than(self.now.plus(window));
                    }
                    replace_unknown(group, &group_name, index, alloc, &mut replacements, &mut kept);
                }
                Taint::Unknown | Taint::AwaitingReport => {
                    replace_unknown(group, &group_name, index, alloc, &mut replacements, &mut kept)
                }
                Taint::Reconnecting => reconnecting.push(alloc),
                Taint::Held { since, release_at } => {
                    // Its client stops it on its own that long after it
                    // lost the servers: the replacement waits as long.
                    let release_at = match group.stop_after_client_disconnect {
                        Some(wait) => release_at.max(since.plus(wait)),
                        None => release_at,
                    };
                    if self.now < release_at {
                        kept.insert(index);
                        out.follow_up_no_later_than(release_at);
                        continue;
                    }
                    if alloc.client_status == ClientStatus::Running && !alloc.needs_reconnect() {
                        out.disconnecting.push(alloc.clone());
                    }
                    released.push(alloc);
                }
                Taint::Untainted
                    if node.is_some_and(Node::is_draining) && (!alloc.canary || rollout.keeps_canary(alloc)) =>
                {
                    migrating.push(alloc)
                }
                Taint::Untainted if alloc.canary => match rollout.keeps_canary(alloc) {
                    true => canaries.push(alloc),
                    false => out.stop.push(StopRequest {
                        alloc: alloc.clone(),
                        description: stop_reason::CANARY_NOT_NEEDED,
                        client_status: None,
                    }),
                },
                Taint::Untainted if rollout.replaces_unhealthy(group, alloc) => {
                    out.stop.push(StopRequest {
                        alloc: alloc.clone(),
                        description: stop_reason::UNHEALTHY,
                        client_status: None,
                    });
                    replacements.push(replacement(&group_name, index, alloc, true));
                }
                Taint::Untainted => held.entry(index).or_default().push(alloc),
            }
        }
        self.reconnect(job, group, reconnecting, &mut held, out);
        self.release_held(group, &group_name, released, &held, &mut replacements, &mut kept, out);
        // The disruption budget: how many available allocations this eval
        // may stop voluntarily (module docs, step 7).
        let available = held.values().flatten().chain(&canaries).chain(&migrating).filter(|alloc| is_available(alloc));
        let available = available.count();
        let mut budget = match &group.update {
            Some(update) => available.saturating_sub(group.count.saturating_sub(update.max_parallel) as usize),
            None => usize::MAX,
        };
        self.migrate(job, group, migrating, available, &mut budget, &mut held, &mut replacements, out);
        self.stop_extras(job, group, &mut held, &mut budget, out);
        // A slot gets one replacement, and none while a live allocation (or
        // a failure waiting for its reschedule) holds it. Should several
        // allocations of a slot ask, the newest one's chain goes on: a
        // failed replacement is rescheduled by its own policy, not replaced
        // again on its original's behalf.
        let mut placed: BTreeSet<u32> = held.keys().copied().chain(kept).collect();
        replacements.sort_by_key(|request| {
            (request.index, std::cmp::Reverse(request.previous.as_ref().map(|previous| previous.create_index)))
        });
        for request in replacements {
            if request.index < group.count && placed.insert(request.index) {
                out.place.push(request);
            }
        }
        for index in (0..group.count).filter(|index| !placed.contains(index)) {
            out.place.push(PlaceRequest {
                group: group_name.clone(),
                index,
                previous: None,
                reschedule: false,
                canary: false,
            });
        }
        let placing = out.place.len() > places_before;
        self.update_versions(job, group, &held, &canaries, placing, budget, rollout, out);
    }

    /// Moves allocations off draining nodes (module docs, step 2): a
    /// service allocation is stopped and replaced elsewhere while the group
    /// keeps `count - migrate.max_parallel` available allocations (one that
    /// serves nothing moves freely); a batch allocation stays until the
    /// drain's deadline; at the deadline everything moves. Each available
    /// allocation moved also takes one from the update `budget`: one group,
    /// one budget. What does not move yet keeps its slot.
    #[allow(clippy::too_many_arguments)]
    fn migrate<'b>(
        &self,
        job: &Job,
        group: &TaskGroup,
        migrating: Vec<&'b Arc<Allocation>>,
        available: usize,
        budget: &mut usize,
        held: &mut BTreeMap<u32, Vec<&'b Arc<Allocation>>>,
        replacements: &mut Vec<PlaceRequest>,
        out: &mut Reconciled,
    ) {
        let group_name: Arc<str> = Arc::from(group.name.as_str());
        let mut allowed = available.saturating_sub(group.count.saturating_sub(group.migrate.max_parallel) as usize);
        for alloc in migrating {
            let index = alloc.index().unwrap_or(u32::MAX);
            let drain = self.nodes.get(&alloc.node_id).and_then(|node| node.drain.strategy.as_ref());
            let forced = drain.is_some_and(|drain| drain.is_forced(self.now));
            let description = match forced {
                true => stop_reason::DRAIN_DEADLINE,
                false if job.job_type.is_batch_like() => {
                    held.entry(index).or_default().push(alloc);
                    continue;
                }
                false if is_available(alloc) && allowed == 0 => {
                    held.entry(index).or_default().push(alloc);
                    continue;
                }
                false => stop_reason::MIGRATING,
            };
            if !forced && is_available(alloc) {
                allowed -= 1;
                *budget = budget.saturating_sub(1);
            }
            out.stop.push(StopRequest { alloc: alloc.clone(), description, client_status: None });
            let mut request = replacement(&group_name, index, alloc, false);
            request.canary = alloc.canary;
            replacements.push(request);
        }
    }

    /// The allocations of held nodes whose release came (module docs, step
    /// 3): one whose slot has a running allocation is stopped as lost (its
    /// replacement runs); one whose slot has a live allocation not running
    /// yet waits for it; one whose slot has none gets a replacement. Until
    /// each is settled the group is evaluated again every [`HOLD_RECHECK`].
    #[allow(clippy::too_many_arguments)]
    fn release_held(
        &self,
        group: &TaskGroup,
        group_name: &Arc<str>,
        released: Vec<&Arc<Allocation>>,
        held: &BTreeMap<u32, Vec<&Arc<Allocation>>>,
        replacements: &mut Vec<PlaceRequest>,
        kept: &mut BTreeSet<u32>,
        out: &mut Reconciled,
    ) {
        for original in released {
            let index = original.index().unwrap_or(u32::MAX);
            let slot = held.get(&index).map_or(&[][..], Vec::as_slice);
            if slot.iter().any(|alloc| alloc.client_status == ClientStatus::Running) {
                out.stop.push(StopRequest {
                    alloc: original.clone(),
                    description: stop_reason::HELD_REPLACED,
                    client_status: Some(ClientStatus::Lost),
                });
                continue;
            }
            if slot.is_empty() {
                replace_unknown(group, group_name, index, original, replacements, kept);
            }
            if group.replace_on_disconnect {
                out.follow_up_no_later_than(self.now.plus(HOLD_RECHECK));
            }
        }
    }

    /// Settles reconnecting allocations (module docs, step 4).
    fn reconnect<'b>(
        &self,
        job: &Job,
        group: &TaskGroup,
        reconnecting: Vec<&'b Arc<Allocation>>,
        held: &mut BTreeMap<u32, Vec<&'b Arc<Allocation>>>,
        out: &mut Reconciled,
    ) {
        for original in reconnecting {
            let index = original.index().unwrap_or(u32::MAX);
            let slot = held.entry(index).or_default();
            let (live, finished): (Vec<_>, Vec<_>) = slot.drain(..).partition(|alloc| !alloc.client_terminal());
            let newer = live.iter().copied().find(|other| other.job.version > original.job.version);
            let stale_version = original.job.version < job.version;
            let kept = match newer {
                Some(newer) if stale_version => Some((newer, stop_reason::REPLACEMENT_NEWER)),
                _ => live
                    .first()
                    .copied()
                    .filter(|replacement| runs_if_original_runs(original, replacement))
                    .filter(|replacement| keeps_replacement(group.reconcile, original, replacement))
                    .map(|replacement| (replacement, stop_reason::REPLACEMENT_KEPT)),
            };
            match kept {
                Some((kept, description)) => {
                    out.stop.push(StopRequest { alloc: original.clone(), description, client_status: None });
                    slot.push(kept);
                    for other in live.iter().filter(|other| other.id != kept.id) {
                        slot.push(other);
                    }
                }
                None => {
                    for replacement in &live {
                        out.stop.push(StopRequest {
                            alloc: (*replacement).clone(),
                            description: stop_reason::ORIGINAL_RECONNECTED,
                            client_status: None,
                        });
                    }
                    out.reconnect.push(original.clone());
                    slot.push(original);
                }
            }
            slot.extend(finished);
        }
    }

    /// A client-terminal allocation: a complete batch alloc keeps its slot;
    /// a failed one is rescheduled now, later, or never.
    #[allow(clippy::too_many_arguments)]
    fn reconcile_terminal<'b>(
        &self,
        job: &Job,
        group: &TaskGroup,
        alloc: &'b Arc<Allocation>,
        index: u32,
        held: &mut BTreeMap<u32, Vec<&'b Arc<Allocation>>>,
        replacements: &mut Vec<PlaceRequest>,
        out: &mut Reconciled,
    ) {
        let keeps_slot = alloc.client_status == ClientStatus::Complete && job.job_type.is_batch_like();
        if keeps_slot {
            held.entry(index).or_default().push(alloc);
            return;
        }
        if alloc.client_status != ClientStatus::Failed || alloc.next_allocation.is_some() {
            return;
        }
        let decision = match reschedule_decision(job.reschedule_policy(group).as_ref(), alloc, self.now) {
            // The follow-up eval made for this allocation reschedules it,
            // even if it runs before the computed time (Nomad's rule).
            Reschedule::Later(_) if alloc.follow_up_eval_id == Some(self.eval_id) => Reschedule::Now,
            decision => decision,
        };
        match decision {
            Reschedule::Now => replacements.push(replacement(&Arc::from(group.name.as_str()), index, alloc, true)),
            Reschedule::Later(at) => {
                held.entry(index).or_default().push(alloc);
                if alloc.follow_up_eval_id.is_none() {
                    out.delayed_reschedules.push((alloc.clone(), at));
                }
            }
            Reschedule::Never => {
                held.entry(index).or_default().push(alloc);
            }
        }
    }

    /// Stops live allocations beyond the count (highest index first) and
    /// duplicates of one slot, keeping the oldest live one of the job's
    /// version, else the oldest live one. An older version's allocation
    /// whose slot a promoted canary took is stopped within the disruption
    /// `budget`, else left running for a later eval.
    fn stop_extras(
        &self,
        job: &Job,
        group: &TaskGroup,
        held: &mut BTreeMap<u32, Vec<&Arc<Allocation>>>,
        budget: &mut usize,
        out: &mut Reconciled,
    ) {
        for allocs in held.values_mut() {
            allocs.sort_by_key(|alloc| {
                (alloc.client_terminal(), alloc.job.job_modify_index != job.job_modify_index, alloc.create_index)
            });
            let current = allocs[0].job.job_modify_index == job.job_modify_index && !allocs[0].client_terminal();
            for duplicate in allocs.drain(1..).filter(|alloc| !alloc.client_terminal()) {
                let outdated = current && duplicate.job.job_modify_index != job.job_modify_index;
                let description = if outdated { stop_reason::REPLACED_BY_CANARY } else { stop_reason::SLOT_TAKEN };
                if outdated && is_available(duplicate) {
                    if *budget == 0 {
                        continue;
                    }
                    *budget -= 1;
                }
                out.stop.push(StopRequest { alloc: duplicate.clone(), description, client_status: None });
            }
        }
        let extras: Vec<u32> = held.range(group.count..).map(|(index, _)| *index).rev().collect();
        for index in extras {
            for alloc in held.remove(&index).into_iter().flatten().filter(|alloc| !alloc.client_terminal()) {
                out.stop.push(StopRequest {
                    alloc: alloc.clone(),
                    description: stop_reason::SCALED_DOWN,
                    client_status: None,
                });
            }
        }
    }

    /// Moves allocations of older job versions to the current one (step 7).
    #[allow(clippy::too_many_arguments)]
    fn update_versions(
        &self,
        job: &Arc<Job>,
        group: &TaskGroup,
        held: &BTreeMap<u32, Vec<&Arc<Allocation>>>,
        canaries: &[&Arc<Allocation>],
        placing: bool,
        budget: usize,
        rollout: &mut Rollout,
        out: &mut Reconciled,
    ) {
        let live: Vec<&Arc<Allocation>> =
            held.values().flatten().filter(|alloc| !alloc.client_terminal()).copied().collect();
        let outdated = live.iter().filter(|alloc| alloc.job.job_modify_index != job.job_modify_index);
        let (mut destructive, inplace): (Vec<&Arc<Allocation>>, Vec<&Arc<Allocation>>) = outdated.partition(|alloc| {
            alloc.job.group(group.name.as_str()).is_none_or(|old| needs_destructive_update(&alloc.job, old, job, group))
        });
        // A failed allocation of an older version holding its slot (its
        // reschedule is later or used up) is replaced by the new version,
        // as Nomad does; it serves nothing, so it costs no budget.
        let failed = held.values().flatten().filter(|alloc| {
            alloc.client_status == ClientStatus::Failed
                && alloc.next_allocation.is_none()
                && alloc.job.job_modify_index != job.job_modify_index
        });
        destructive.extend(failed.copied());
        out.inplace.extend(inplace.iter().map(|alloc| (*alloc).clone()));
        let group_name: Arc<str> = Arc::from(group.name.as_str());
        let Some(update) = &group.update else {
            for alloc in &destructive {
                stop_for_update(&group_name, alloc, out);
            }
            return;
        };
        let runs_version = live.iter().chain(canaries).any(|alloc| alloc.job.job_modify_index == job.job_modify_index);
        let needs_deployment = !destructive.is_empty() || !inplace.is_empty() || (placing && !runs_version);
        let Some(state) = rollout.group(job, group, update, needs_deployment) else {
            for alloc in &destructive {
                stop_for_update(&group_name, alloc, out);
            }
            return;
        };
        // Canaries first: placed in the slots of allocations to replace.
        let wants_canaries = update.canary > 0 && !destructive.is_empty() && !state.promoted;
        let mut group_done = !placing && destructive.is_empty();
        if wants_canaries {
            state.desired_canaries = update.canary;
            group_done = false;
            if !rollout.halted() {
                let taken: BTreeSet<u32> = canaries.iter().filter_map(|alloc| alloc.index()).collect();
                let missing = (update.canary as usize).saturating_sub(canaries.len());
                let slots = destructive.iter().filter_map(|alloc| alloc.index()).filter(|index| !taken.contains(index));
                for index in slots.take(missing) {
                    out.place.push(PlaceRequest {
                        group: group_name.clone(),
                        index,
                        previous: None,
                        reschedule: false,
                        canary: true,
                    });
                }
            }
        }
        rollout.note_group(group, group_done);
        let unhealthy = live.iter().chain(canaries).any(|alloc| rollout.is_unhealthy_member(alloc));
        if rollout.halted() || wants_canaries || unhealthy {
            return;
        }
        // Those that serve nothing (not running, or unhealthy) cost
        // nothing; the others only within the budget, running ones whose
        // verdict is still out included.
        let (free, costly): (Vec<&Arc<Allocation>>, Vec<&Arc<Allocation>>) =
            destructive.iter().partition(|alloc| serves_nothing(alloc));
        for alloc in free.into_iter().chain(costly.into_iter().take(budget)) {
            stop_for_update(&group_name, alloc, out);
        }
    }
}

/// A destructive update: the old allocation stops, a new one takes its slot.
fn stop_for_update(group: &Arc<str>, alloc: &Arc<Allocation>, out: &mut Reconciled) {
    out.stop.push(StopRequest { alloc: alloc.clone(), description: stop_reason::UPDATING, client_status: None });
    out.place.push(replacement(group, alloc.index().unwrap_or(0), alloc, false));
}

/// Whether replacing an allocation disrupts nothing: it is not running,
/// or its client found it unhealthy.
fn serves_nothing(alloc: &Allocation) -> bool {
    alloc.client_status != ClientStatus::Running || alloc.health.as_ref().is_some_and(|health| !health.healthy)
}

/// Whether an allocation serves: live, running, and healthy when a
/// verdict is awaited: its deployment's, or a service replacement's
/// (placed outside a deployment, it proves itself by its group's `migrate`
/// settings). Any other allocation needs none. What the disruption budget
/// counts.
pub fn is_available(alloc: &Allocation) -> bool {
    if alloc.terminal() || alloc.client_status != ClientStatus::Running {
        return false;
    }
    match &alloc.health {
        Some(health) => health.healthy,
        None => {
            let proves_itself = alloc.previous_allocation.is_some() && alloc.job.job_type == JobType::Service;
            alloc.deployment_id.is_none() && !proves_itself
        }
    }
}

/// The job's deployment as one eval sees and changes it (module docs,
/// step 7): which one is current, whether it may progress, and what the
/// eval decided for each of its groups.
#[derive(Debug)]
pub struct Rollout {
    /// The deployment of the job's version (a working copy), if any.
    current: Option<Deployment>,
    /// The stored one it was copied from (`None`: created by this eval).
    stored: Option<Arc<Deployment>>,
    /// Whether every group of the deployment has nothing left to do.
    all_done: bool,
}

impl Rollout {
    /// Settles which deployment is current: the newest one if it rolls out
    /// the job's version and has not succeeded; an active older one is
    /// cancelled (a stopped job's too).
    fn new(latest: Option<&Arc<Deployment>>, job: Option<&Arc<Job>>, out: &mut Reconciled) -> Rollout {
        let mut rollout = Rollout { current: None, stored: None, all_done: true };
        let Some(latest) = latest else { return rollout };
        match job {
            Some(job) if latest.is_for(job) && latest.status == DeploymentStatus::Successful => {}
            Some(job) if latest.is_for(job) => {
                rollout.current = Some(Deployment::clone(latest));
                rollout.stored = Some(latest.clone());
            }
            _ if latest.is_active() => {
                let description = match job {
                    None => deployment_description::STOPPED_JOB,
                    Some(_) => deployment_description::NEWER_JOB,
                };
                out.deployment_updates.push(DeploymentStatusUpdate {
                    deployment_id: latest.id,
                    status: DeploymentStatus::Cancelled,
                    status_description: description.to_string(),
                });
            }
            _ => {}
        }
        rollout
    }

    /// Whether nothing may be placed or replaced for the deployment's sake:
    /// it is paused, or it ended without success.
    fn halted(&self) -> bool {
        self.current.as_ref().is_some_and(|current| !matches!(current.status, DeploymentStatus::Running))
    }

    /// Whether a canary stays: it belongs to the current deployment and
    /// that one has not failed or been cancelled.
    fn keeps_canary(&self, alloc: &Allocation) -> bool {
        self.current.as_ref().is_some_and(|current| alloc.deployment_id == Some(current.id) && current.is_active())
    }

    /// Whether an allocation of the active deployment turned unhealthy.
    fn is_unhealthy_member(&self, alloc: &Allocation) -> bool {
        let member = self.current.as_ref().is_some_and(|current| alloc.deployment_id == Some(current.id));
        member && alloc.health.as_ref().is_some_and(|health| !health.healthy)
    }

    /// Whether an unhealthy allocation is replaced: its group has a
    /// progress deadline and the deployment is running (with none, the
    /// deployment fails instead).
    fn replaces_unhealthy(&self, group: &TaskGroup, alloc: &Allocation) -> bool {
        let running = self.current.as_ref().is_some_and(|current| current.status == DeploymentStatus::Running);
        let deadline = group.update.as_ref().is_some_and(|update| !update.progress_deadline.is_zero());
        running && deadline && !alloc.client_terminal() && self.is_unhealthy_member(alloc)
    }

    /// The group's state in the current deployment, creating the
    /// deployment when none is current and the group needs one.
    fn group(
        &mut self,
        job: &Job,
        group: &TaskGroup,
        update: &UpdateStrategy,
        needs_deployment: bool,
    ) -> Option<&mut DeploymentGroup> {
        if self.current.is_none() && needs_deployment {
            // Priority and time are set by `finish`.
            self.current = Some(Deployment::new(job, 0, Timestamp::ZERO));
        }
        let current = self.current.as_mut()?;
        let state = current.task_groups.entry(group.name.clone()).or_insert_with(|| DeploymentGroup {
            auto_revert: update.auto_revert,
            auto_promote: update.auto_promote,
            progress_deadline: update.progress_deadline,
            ..DeploymentGroup::default()
        });
        state.desired_total = group.count;
        Some(state)
    }

    /// Notes whether a group of the deployment has nothing left to do.
    fn note_group(&mut self, group: &TaskGroup, done: bool) {
        let complete = self
            .current
            .as_ref()
            .and_then(|current| current.task_groups.get(&group.name))
            .is_some_and(|state| state.is_complete());
        self.all_done &= done && complete;
    }

    /// Puts the deployment in the result when the eval created or changed
    /// it, marking it successful when every group is done.
    fn finish(self, eval_priority: u8, now: Timestamp, out: &mut Reconciled) {
        let Some(mut current) = self.current else { return };
        if current.is_active() {
            out.deployment_id = Some(current.id);
        }
        if current.status == DeploymentStatus::Running {
            let needs_promotion = current.task_groups.values().filter(|group| group.awaits_promotion());
            let (mut any, mut manual) = (false, false);
            for group in needs_promotion {
                any = true;
                manual |= !group.auto_promote;
            }
            current.status_description = match (any, manual) {
                (true, true) => deployment_description::RUNNING_NEEDS_PROMOTION,
                (true, false) => deployment_description::RUNNING_AUTO_PROMOTION,
                (false, _) => deployment_description::RUNNING,
            }
            .to_string();
            if self.all_done && self.stored.is_some() {
                current.status = DeploymentStatus::Successful;
                current.status_description = deployment_description::SUCCESSFUL.to_string();
                out.deployment_id = None;
            }
        }
        match &self.stored {
            None => {
                current.eval_priority = eval_priority;
                current.create_time = now;
                current.modify_time = now;
                out.deployment = Some(current);
            }
            Some(stored) if **stored != current => out.deployment = Some(current),
            Some(_) => {}
        }
    }
}

fn replacement(group: &Arc<str>, index: u32, previous: &Arc<Allocation>, reschedule: bool) -> PlaceRequest {
    PlaceRequest { group: group.clone(), index, previous: Some(previous.clone()), reschedule, canary: false }
}

/// An `unknown` allocation's slot: replaced elsewhere, or kept for it when
/// its group says `replace_on_disconnect = false`.
fn replace_unknown(
    group: &TaskGroup,
    group_name: &Arc<str>,
    index: u32,
    alloc: &Arc<Allocation>,
    replacements: &mut Vec<PlaceRequest>,
    kept: &mut BTreeSet<u32>,
) {
    if group.replace_on_disconnect {
        replacements.push(replacement(group_name, index, alloc, false));
    } else {
        kept.insert(index);
    }
}

/// Whether `replacement` runs, or `original` does not: a running original
/// is never stopped for a replacement that has not started (module docs,
/// step 4).
fn runs_if_original_runs(original: &Allocation, replacement: &Allocation) -> bool {
    original.client_status != ClientStatus::Running || replacement.client_status == ClientStatus::Running
}

/// Whether a slot keeps `replacement` over its reconnecting `original`
/// (both of one job version, or the replacement's older) by `strategy`.
fn keeps_replacement(strategy: ReconcileStrategy, original: &Allocation, replacement: &Allocation) -> bool {
    match strategy {
        ReconcileStrategy::KeepOriginal => false,
        ReconcileStrategy::KeepReplacement => true,
        ReconcileStrategy::BestScore => replacement.score > original.score,
        ReconcileStrategy::LongestRunning => match (first_start(original), first_start(replacement)) {
            (Some(original), Some(replacement)) => replacement < original,
            (None, Some(_)) => true,
            _ => false,
        },
    }
}

/// When the allocation's first task started, if one has.
fn first_start(alloc: &Allocation) -> Option<Timestamp> {
    alloc.task_states.values().filter_map(|state| state.started_at).min()
}

fn stop_live(allocs: &[&Arc<Allocation>], description: &'static str, out: &mut Reconciled) {
    for alloc in allocs.iter().filter(|alloc| !alloc.terminal()) {
        out.stop.push(StopRequest { alloc: (*alloc).clone(), description, client_status: None });
    }
}

/// Whether moving from group `old` of `old_job` to `new` of `new_job` needs
/// new allocations: anything the scheduler or the client's tasks depend on
/// changed, placement preferences and ports included (as in Nomad), and
/// the job's and group's metadata, which the tasks see as `NOMAD_META_*`.
/// Count, restart and reschedule policies and update settings change in
/// place.
pub fn needs_destructive_update(old_job: &Job, old: &TaskGroup, new_job: &Job, new: &TaskGroup) -> bool {
    tasks_differ(&old.tasks, &new.tasks)
        || old_job.meta != new_job.meta
        || old.meta != new.meta
        || old.constraints != new.constraints
        || old.affinities != new.affinities
        || old.spreads != new.spreads
        || old.networks != new.networks
        || old_job.affinities != new_job.affinities
        || old_job.spreads != new_job.spreads
        || old.max_client_disconnect != new.max_client_disconnect
        || old.stop_after_client_disconnect != new.stop_after_client_disconnect
}

/// Until when a lost allocation keeps its slot empty: its group's client
/// stops it after `stop_after_client_disconnect` without the servers, so its
/// replacement waits that long from when it was marked lost and never runs
/// beside it (Nomad's rule). `None` for any other allocation.
fn silence_wait(group: &TaskGroup, alloc: &Allocation) -> Option<Timestamp> {
    let wait = group.stop_after_client_disconnect?;
    if alloc.client_status != ClientStatus::Lost {
        return None;
    }
    let lost = alloc.alloc_states.iter().rev().find(|state| state.client_status == ClientStatus::Lost)?;
    Some(lost.time.plus(wait))
}

/// Whether the tasks differ in anything but their restart policies.
fn tasks_differ(old: &[Task], new: &[Task]) -> bool {
    let without_restart = |task: &Task| Task { restart_policy: None, ..task.clone() };
    old != new && (old.len() != new.len() || old.iter().zip(new).any(|(a, b)| without_restart(a) != without_restart(b)))
}

/// When a failed allocation should be replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reschedule {
    /// Its delay has passed.
    Now,
    /// At this time.
    Later(Timestamp),
    /// Its attempts are used up (or the job type is not rescheduled).
    Never,
}

/// Applies a reschedule policy to a failed allocation. The failure time is
/// when the servers took its `failed` report ([`Allocation::client_status_time`]);
/// earlier reschedules are carried on it.
pub fn reschedule_decision(policy: Option<&ReschedulePolicy>, alloc: &Allocation, now: Timestamp) -> Reschedule {
    let Some(policy) = policy else { return Reschedule::Never };
    if !policy.unlimited {
        let window_start = Timestamp(now.0.saturating_sub(policy.interval.as_nanos() as u64));
        let recent = alloc.reschedule_events.iter().filter(|event| event.time >= window_start).count();
        if recent >= policy.attempts as usize {
            return Reschedule::Never;
        }
    }
    let at = alloc.client_status_time.plus(reschedule_delay(policy, alloc));
    if at <= now {
        Reschedule::Now
    } else {
        Reschedule::Later(at)
    }
}

/// The delay before the next reschedule of `alloc`: the policy's delay
/// grown by its delay function over earlier attempts, capped at `max_delay`.
pub fn reschedule_delay(policy: &ReschedulePolicy, alloc: &Allocation) -> Duration {
    let attempts = alloc.reschedule_events.len() as u32;
    let delay = match policy.delay_function {
        DelayFunction::Constant => return policy.delay,
        DelayFunction::Exponential => policy.delay.saturating_mul(2u32.saturating_pow(attempts)),
        DelayFunction::Fibonacci => {
            let (mut previous, mut current) = (policy.delay, policy.delay);
            for _ in 1..attempts {
                (previous, current) = (current, previous.saturating_add(current));
            }
            current
        }
    };
    if policy.max_delay.is_zero() {
        delay
    } else {
        delay.min(policy.max_delay)
    }
}

#[cfg(test)]
#[path = "reconcile_test.rs"]
mod reconcile_test;
