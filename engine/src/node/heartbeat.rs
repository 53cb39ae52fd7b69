//! Heartbeat timers: when each live node must be heard from again.
//!
//! 1. Every `ready` or `initializing` node has one deadline. A heartbeat
//!    ([`HeartbeatTimers::reset`]) hands the node a TTL of
//!    `max(min_heartbeat_ttl, n_nodes / max_heartbeats_per_second)` plus
//!    random jitter of up to that TTL, so the cluster as a whole stays under
//!    the heartbeat rate and nodes that registered together drift apart. The
//!    server waits TTL + `heartbeat_grace` before giving up on it.
//! 2. After a server (re)start every known live node gets the longer
//!    `failover_heartbeat_ttl` ([`HeartbeatTimers::initialize`]), so clients
//!    that were heartbeating a previous leader are not all marked down
//!    before they find the new one.
//! 3. Any other call a node makes (an allocation update) is a sign of life
//!    too ([`HeartbeatTimers::extend`]): the node's deadline moves to at
//!    least `now + TTL before jitter + heartbeat_grace`, never earlier. An
//!    agent has one call out at a time, so a heartbeat that comes due while
//!    its allocation update waits on a slow write (a durable server's
//!    fsync) goes out late; the update it waits on says the node is alive.
//! 4. [`HeartbeatTimers::expire`] returns the nodes whose deadline passed
//!    and forgets them; [`Heartbeats::expire`] writes one
//!    [`Command::MissHeartbeat`] per node, which marks it `down` or
//!    `disconnected` and creates evals for the jobs with allocations there.
//!    A sweep submits all its commands before it waits on any (a durable
//!    log writes them in one batch), and leaves out a node a heartbeat gave
//!    a deadline again since it expired.
//! 5. Before it writes, the sweep asks the storm guard ([`super::storm`])
//!    whether a large share of the nodes is in trouble; while it is, or
//!    for a node not heard from since the failover TTL (2), the node is
//!    held `disconnected` with a release time for its replacements
//!    instead of marked `down`.
//!
//! The timers are a hashed timing wheel: a reset is O(1) (two hash lookups
//! and a swap-remove), whatever the number of nodes; no thread or task per
//! node. The core takes `now` from its caller and is driven step by step in
//! tests; [`Heartbeats`] is the thread-safe form the server uses.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use event_listener::{Event, Listener};
use hashbrown::{HashMap, HashSet};
use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::storm::{Census, StormConfig, StormGuard, StormStats};
use super::transitions::node_evals;
use crate::clock::{SharedClock, Timestamp};
use crate::state::{Command, PendingWrite, Snapshot, StateError, Writer};
use crate::structs::{Evaluation, JobKey, Node, NodeId, NodeStatus};

/// Width of one wheel slot. Expiry is noticed within one slot of the deadline.
const TICK: Duration = Duration::from_millis(50);
/// Slots in the wheel (204.8 s per turn); later deadlines wait for a later turn.
const SLOTS: usize = 4096;

/// Heartbeat settings (all four of Nomad's).
#[derive(Clone, Debug)]
pub struct HeartbeatConfig {
    /// The shortest TTL handed to a node.
    pub min_heartbeat_ttl: Duration,
    /// The cluster-wide heartbeat rate the TTL is scaled to.
    pub max_heartbeats_per_second: f64,
    /// Extra time the server waits past a node's TTL.
    pub heartbeat_grace: Duration,
    /// The TTL every known node gets when a server starts leading.
    pub failover_heartbeat_ttl: Duration,
    /// The storm guard (module docs, 5).
    pub storm: StormConfig,
}

impl Default for HeartbeatConfig {
    /// Nomad's TTL floor, grace and failover TTL; a rate 20 times Nomad's 50/s,
    /// since heartbeats are cheap here (10 s TTLs up to 10,000 nodes, 100 s at 100,000).
    fn default() -> Self {
        HeartbeatConfig {
            min_heartbeat_ttl: Duration::from_secs(10),
            max_heartbeats_per_second: 1_000.0,
            heartbeat_grace: Duration::from_secs(10),
            failover_heartbeat_ttl: Duration::from_secs(5 * 60),
            storm: StormConfig::default(),
        }
    }
}

/// Heartbeat counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatStats {
    /// Nodes with a deadline.
    pub active_timers: usize,
    /// Heartbeats taken (timer resets).
    pub resets: u64,
    /// Deadlines that passed.
    pub expirations: u64,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    deadline: Timestamp,
    slot: u32,
    position: u32,
}

/// A hashed timing wheel of node deadlines; see the module docs.
#[derive(Debug)]
struct TimerWheel {
    slots: Vec<Vec<NodeId>>,
    entries: HashMap<NodeId, Entry>,
    /// The last tick whose slot was swept.
    swept_tick: u64,
}

impl TimerWheel {
    fn new(now: Timestamp) -> Self {
        TimerWheel { slots: vec![Vec::new(); SLOTS], entries: HashMap::new(), swept_tick: tick_of(now) }
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    fn deadline(&self, node_id: NodeId) -> Option<Timestamp> {
        self.entries.get(&node_id).map(|entry| entry.deadline)
    }

    fn set(&mut self, node_id: NodeId, deadline: Timestamp) {
        self.remove(node_id);
        // A deadline already past is swept at the next tick.
        let tick = tick_of(deadline).max(self.swept_tick + 1);
        let slot = (tick % SLOTS as u64) as usize;
        let position = self.slots[slot].len() as u32;
        self.slots[slot].push(node_id);
        self.entries.insert(node_id, Entry { deadline, slot: slot as u32, position });
    }

    fn remove(&mut self, node_id: NodeId) -> bool {
        let Some(entry) = self.entries.remove(&node_id) else { return false };
        let slot = &mut self.slots[entry.slot as usize];
        slot.swap_remove(entry.position as usize);
        if let Some(moved) = slot.get(entry.position as usize) {
            self.entries.get_mut(moved).expect("every slot member has an entry").position = entry.position;
        }
        true
    }

    /// The nodes whose deadline is after `now` and at or before `by`.
    fn due_by(&self, now: Timestamp, by: Timestamp) -> Vec<NodeId> {
        let ticks = (tick_of(by).saturating_sub(self.swept_tick) as usize).min(SLOTS) as u64;
        (1..=ticks)
            .flat_map(|step| &self.slots[((self.swept_tick + step) % SLOTS as u64) as usize])
            .filter(|node_id| {
                self.entries.get(*node_id).is_some_and(|entry| entry.deadline > now && entry.deadline <= by)
            })
            .copied()
            .collect()
    }

    /// Removes and returns the nodes whose deadline is at or before `now`.
    fn expire(&mut self, now: Timestamp) -> Vec<NodeId> {
        let now_tick = tick_of(now);
        let turns = (now_tick.saturating_sub(self.swept_tick) as usize).min(SLOTS);
        let (mut expired, mut carried) = (Vec::new(), Vec::new());
        for step in 1..=turns as u64 {
            let slot = ((self.swept_tick + step) % SLOTS as u64) as usize;
            self.sweep(slot, now, &mut expired, &mut carried);
        }
        self.swept_tick = self.swept_tick.max(now_tick);
        // Deadlines later in the tick just swept move to the next one.
        for (node_id, deadline) in carried {
            self.set(node_id, deadline);
        }
        expired
    }

    /// The start of the first tick after the last sweep whose slot holds a
    /// deadline: nothing expires before it (it may still hold only later
    /// turns' deadlines, so waking then can be early, never late).
    fn next_deadline(&self) -> Option<Timestamp> {
        (1..=SLOTS as u64)
            .map(|step| self.swept_tick + step)
            .find(|tick| !self.slots[(tick % SLOTS as u64) as usize].is_empty())
            .map(|tick| Timestamp(tick * TICK.as_nanos() as u64))
    }

    fn sweep(
        &mut self,
        slot: usize,
        now: Timestamp,
        expired: &mut Vec<NodeId>,
        carried: &mut Vec<(NodeId, Timestamp)>,
    ) {
        let members = std::mem::take(&mut self.slots[slot]);
        let mut kept = Vec::with_capacity(members.len());
        for node_id in members {
            let entry = self.entries.get_mut(&node_id).expect("every slot member has an entry");
            if entry.deadline <= now {
                self.entries.remove(&node_id);
                expired.push(node_id);
            } else if tick_of(entry.deadline) <= tick_of(now) {
                let deadline = entry.deadline;
                self.entries.remove(&node_id);
                carried.push((node_id, deadline));
            } else {
                entry.position = kept.len() as u32;
                kept.push(node_id);
            }
        }
        self.slots[slot] = kept;
    }
}

fn tick_of(at: Timestamp) -> u64 {
    at.0 / TICK.as_nanos() as u64
}

/// The deterministic heartbeat timers (module docs, steps 1-4).
#[derive(Debug)]
pub struct HeartbeatTimers {
    config: HeartbeatConfig,
    wheel: TimerWheel,
    rng: SmallRng,
    resets: u64,
    expirations: u64,
    /// Nodes on the failover TTL, not heard from since (module docs, 5).
    unheard: HashSet<NodeId>,
    /// Nodes whose missed heartbeat is being written.
    marking: HashSet<NodeId>,
    guard: StormGuard,
}

impl HeartbeatTimers {
    /// Empty timers; `seed` drives the jitter.
    pub fn new(config: HeartbeatConfig, now: Timestamp, seed: u64) -> Self {
        HeartbeatTimers {
            guard: StormGuard::new(config.storm.clone()),
            config,
            wheel: TimerWheel::new(now),
            rng: SmallRng::seed_from_u64(seed),
            resets: 0,
            expirations: 0,
            unheard: HashSet::new(),
            marking: HashSet::new(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &HeartbeatConfig {
        &self.config
    }

    /// Takes a heartbeat from `node_id` at `now`: returns the TTL the node
    /// is handed; the server gives up at `now + ttl + heartbeat_grace`.
    pub fn reset(&mut self, node_id: NodeId, now: Timestamp) -> Duration {
        self.reset_until(node_id, now).0
    }

    /// [`HeartbeatTimers::reset`], also returning the new deadline.
    #[inline]
    fn reset_until(&mut self, node_id: NodeId, now: Timestamp) -> (Duration, Timestamp) {
        let base = self.base_ttl(self.wheel.len() + usize::from(self.wheel.deadline(node_id).is_none()));
        let ttl = base + base.mul_f64(self.rng.random::<f64>());
        let deadline = now.plus(ttl + self.config.heartbeat_grace);
        self.wheel.set(node_id, deadline);
        self.resets += 1;
        self.heard(node_id);
        (ttl, deadline)
    }

    /// [`HeartbeatTimers::reset`], unless the node's missed heartbeat is
    /// being written (`None`).
    #[inline]
    fn reset_unless_marking(&mut self, node_id: NodeId, now: Timestamp) -> Option<(Duration, Timestamp)> {
        if !self.marking.is_empty() && self.marking.contains(&node_id) {
            return None;
        }
        Some(self.reset_until(node_id, now))
    }

    /// Whether a node whose deadline passed is to be marked: not when it
    /// was heard from since (it has a deadline again); if so, its missed
    /// heartbeat is being written until [`Heartbeats::end_marking`].
    fn begin_marking(&mut self, node_id: NodeId) -> bool {
        let marking = self.wheel.deadline(node_id).is_none();
        if marking {
            self.marking.insert(node_id);
        }
        marking
    }

    /// `node_id` was heard from: it is no longer on the failover TTL.
    #[inline]
    fn heard(&mut self, node_id: NodeId) {
        if !self.unheard.is_empty() {
            self.unheard.remove(&node_id);
        }
    }

    /// Takes another call from `node_id` at `now` as a sign of life (module
    /// docs, 3): its deadline becomes at least `now` + the TTL before
    /// jitter + the grace, and never earlier; the new deadline, if it
    /// moved. A node without a deadline (down, or never heard from) is left
    /// alone: only a heartbeat starts one.
    pub fn extend(&mut self, node_id: NodeId, now: Timestamp) -> Option<Timestamp> {
        let current = self.wheel.deadline(node_id)?;
        self.heard(node_id);
        let at_least = now.plus(self.base_ttl(self.wheel.len()) + self.config.heartbeat_grace);
        (at_least > current).then(|| {
            self.wheel.set(node_id, at_least);
            at_least
        })
    }

    /// The TTL before jitter for a cluster of `n_nodes` live nodes.
    pub fn base_ttl(&self, n_nodes: usize) -> Duration {
        let scaled = Duration::from_secs_f64(n_nodes as f64 / self.config.max_heartbeats_per_second);
        scaled.max(self.config.min_heartbeat_ttl)
    }

    /// Gives every live node of `snapshot` the failover TTL (step 2).
    pub fn initialize(&mut self, snapshot: &Snapshot, now: Timestamp) {
        let deadline = now.plus(self.config.failover_heartbeat_ttl);
        for node in snapshot.nodes().filter(|node| !node.status.is_terminal_for_scheduling()) {
            self.wheel.set(node.id, deadline);
            self.unheard.insert(node.id);
        }
    }

    /// Forgets a node's deadline (it went down, or was removed).
    pub fn remove(&mut self, node_id: NodeId) {
        self.wheel.remove(node_id);
        self.unheard.remove(&node_id);
    }

    /// When the server gives up on `node_id`, if it has a deadline.
    pub fn deadline(&self, node_id: NodeId) -> Option<Timestamp> {
        self.wheel.deadline(node_id)
    }

    /// When the next deadline may pass: the timer thread sleeps until then.
    pub fn next_deadline(&self) -> Option<Timestamp> {
        self.wheel.next_deadline()
    }

    /// The nodes whose deadline passed by `now`, forgotten.
    pub fn expire(&mut self, now: Timestamp) -> Vec<NodeId> {
        let expired = self.wheel.expire(now);
        self.expirations += expired.len() as u64;
        expired
    }

    /// Counters.
    pub fn stats(&self) -> HeartbeatStats {
        HeartbeatStats { active_timers: self.wheel.len(), resets: self.resets, expirations: self.expirations }
    }

    /// The nodes late at `now`: past their TTL, inside the grace (`storm` module docs, 1).
    pub fn late(&self, now: Timestamp) -> Vec<NodeId> {
        self.wheel.due_by(now, now.plus(self.config.heartbeat_grace))
    }

    /// The storm guard's judgement of `census` at `now` (`is_live`: whether
    /// a node is back): whether it is on (module docs, 5).
    pub fn judge(&mut self, now: Timestamp, census: &Census<'_>, is_live: impl Fn(NodeId) -> bool) -> bool {
        self.guard.judge(now, census, is_live)
    }

    /// The release time of `node_id`, about to be marked at `now`, when it
    /// is to be held: the guard is on (`storm_on`), or the node was never
    /// heard from since the failover TTL (module docs, 5).
    fn hold(&mut self, node_id: NodeId, storm_on: bool, now: Timestamp) -> Option<Timestamp> {
        let unheard = self.unheard.remove(&node_id) && self.config.storm.enabled;
        (storm_on || unheard).then(|| self.guard.hold(now))
    }

    /// Whether the storm guard is on.
    pub fn storm_guard_on(&self) -> bool {
        self.guard.is_on()
    }

    /// The storm guard's counters at `now`.
    pub fn storm_stats(&self, now: Timestamp) -> StormStats {
        self.guard.stats(now)
    }
}

/// The server's heartbeat timers, shared by the node endpoint (resets) and
/// the server's timer thread (expiry).
#[derive(Debug)]
pub struct Heartbeats {
    timers: Mutex<HeartbeatTimers>,
    clock: SharedClock,
    /// Notified when a node's missed heartbeat is written.
    marked: Event,
}

impl Heartbeats {
    /// Timers on `clock`.
    pub fn new(config: HeartbeatConfig, clock: SharedClock) -> Arc<Self> {
        Self::seeded(config, clock, rand::rng().random())
    }

    /// Timers with a fixed jitter seed, for simulations.
    pub fn seeded(config: HeartbeatConfig, clock: SharedClock, seed: u64) -> Arc<Self> {
        let timers = Mutex::new(HeartbeatTimers::new(config, clock.now(), seed));
        Arc::new(Heartbeats { timers, clock, marked: Event::new() })
    }

    /// Takes a heartbeat now; returns the node's TTL.
    #[inline]
    pub fn reset(&self, node_id: NodeId) -> Duration {
        let (ttl, deadline) = self.timers.lock().reset_until(node_id, self.clock.now());
        self.clock.deadline_set(deadline);
        ttl
    }

    /// When the next deadline may pass (see [`HeartbeatTimers::next_deadline`]).
    pub fn next_deadline(&self) -> Option<Timestamp> {
        self.timers.lock().next_deadline()
    }

    /// Forgets a node's deadline.
    pub fn remove(&self, node_id: NodeId) {
        self.timers.lock().remove(node_id);
    }

    /// When the server gives up on `node_id`.
    pub fn deadline(&self, node_id: NodeId) -> Option<Timestamp> {
        self.timers.lock().deadline(node_id)
    }

    /// Gives every live node the failover TTL (module docs, step 2).
    pub fn initialize(&self, snapshot: &Snapshot) {
        let mut timers = self.timers.lock();
        timers.initialize(snapshot, self.clock.now());
        if let Some(next) = timers.next_deadline() {
            self.clock.deadline_set(next);
        }
    }

    /// Counters.
    pub fn stats(&self) -> HeartbeatStats {
        self.timers.lock().stats()
    }

    /// [`HeartbeatTimers::extend`] now.
    pub fn extend(&self, node_id: NodeId) {
        if let Some(deadline) = self.timers.lock().extend(node_id, self.clock.now()) {
            self.clock.deadline_set(deadline);
        }
    }

    /// The storm guard's counters.
    pub fn storm_stats(&self) -> StormStats {
        self.timers.lock().storm_stats(self.clock.now())
    }

    /// Marks every node whose deadline passed as having missed its
    /// heartbeat (module docs, step 4); returns how many were marked.
    pub fn expire(&self, writer: &Writer) -> usize {
        let (expired, judging) = {
            let mut timers = self.timers.lock();
            let expired = timers.expire(self.clock.now());
            let judging = timers.config.storm.enabled && (!expired.is_empty() || timers.storm_guard_on());
            (expired, judging)
        };
        let storm_on = judging && self.judge(&writer.store().snapshot(), &expired);
        self.miss(writer, expired, storm_on)
    }

    /// The storm guard's judgement with the nodes `expired` now (module
    /// docs, 5): whether it is on. The census is counted from `snapshot`
    /// and the timers' late nodes, outside the timers' lock.
    fn judge(&self, snapshot: &Snapshot, expired: &[NodeId]) -> bool {
        let now = self.clock.now();
        let late = self.timers.lock().late(now);
        let datacenter = |node_id: NodeId| snapshot.node(node_id).map(|node| &*node.datacenter);
        let mut census = Census {
            missing: expired.iter().filter_map(|id| Some((*id, datacenter(*id)?))).collect(),
            late: late.iter().filter_map(|id| datacenter(*id)).collect(),
            live: HashMap::new(),
        };
        let live = |node: &Node| matches!(node.status, NodeStatus::Ready | NodeStatus::Initializing);
        for node in snapshot.nodes().filter(|node| live(node)) {
            *census.live.entry(&*node.datacenter).or_default() += 1;
        }
        let is_live = |node_id: NodeId| snapshot.node(node_id).is_some_and(|node| live(node));
        self.timers.lock().judge(now, &census, is_live)
    }

    /// Writes the missed heartbeats of `expired`, one command each, all
    /// submitted before any is waited on: a durable log writes them
    /// together (one batch, one fsync), not one fsync after another, so a
    /// sweep of many nodes takes about as long as one write. The evals are
    /// computed before the writes; a job placed on a node in between gets
    /// its eval right after, and none can be placed once the node has left
    /// (the store refuses it). A node heard from since its deadline passed
    /// (a heartbeat gave it a deadline again) was answered as live, and is
    /// not marked; a heartbeat that comes while the node's command is
    /// being written waits for it ([`Heartbeats::reset_unless_marking`]),
    /// so it is never answered as live and then marked. While the storm
    /// guard is on (`storm_on`), or for a node never heard from since the
    /// failover TTL, a node is held, with its release time. Returns how
    /// many were marked.
    fn miss(&self, writer: &Writer, expired: Vec<NodeId>, storm_on: bool) -> usize {
        if expired.is_empty() {
            return 0;
        }
        let now = self.clock.now();
        let snapshot = writer.store().snapshot();
        let submitted: Vec<(NodeId, BTreeSet<JobKey>, PendingWrite)> = expired
            .into_iter()
            .filter_map(|node_id| {
                let mut timers = self.timers.lock();
                if !timers.begin_marking(node_id) {
                    tracing::debug!(%node_id, "a node heard from after its deadline passed is not marked");
                    return None;
                }
                Some((node_id, timers.hold(node_id, storm_on, now)))
            })
            .map(|(node_id, release_at)| {
                let evals = node_evals(&snapshot, node_id, now);
                let covered = evals.iter().map(Evaluation::job_key).collect();
                let command = Command::MissHeartbeat { node_id, evals, time: now, release_at };
                (node_id, covered, writer.submit(command))
            })
            .collect();
        submitted
            .into_iter()
            .filter_map(|(node_id, covered, pending)| match self.end_marking(node_id, pending.wait()) {
                Ok(applied) => {
                    self.late_evals(writer, node_id, &covered, now);
                    tracing::debug!(%node_id, index = applied.index, "node missed its heartbeat");
                    Some(node_id)
                }
                // It left or was removed since its deadline was set: nothing to do.
                Err(StateError::NodeNotConnected { .. } | StateError::UnknownNode(_)) => None,
                Err(error) => {
                    tracing::warn!(%node_id, %error, "could not mark a node that missed its heartbeat");
                    None
                }
            })
            .count()
    }

    /// The write of `node_id`'s missed heartbeat is done (`outcome`): a
    /// heartbeat waiting for it goes on.
    fn end_marking<T>(&self, node_id: NodeId, outcome: T) -> T {
        self.timers.lock().marking.remove(&node_id);
        self.marked.notify(usize::MAX);
        outcome
    }

    /// [`Heartbeats::reset`], unless a missed heartbeat of the node is
    /// being written (`None`): the caller waits for it
    /// ([`Heartbeats::wait_marked`]) and reads the node again, so a
    /// heartbeat never answers `ready` for a node about to be marked.
    #[inline]
    pub fn reset_unless_marking(&self, node_id: NodeId) -> Option<Duration> {
        let (ttl, deadline) = self.timers.lock().reset_unless_marking(node_id, self.clock.now())?;
        self.clock.deadline_set(deadline);
        Some(ttl)
    }

    /// Blocks until no missed heartbeat of `node_id` is being written.
    pub fn wait_marked(&self, node_id: NodeId) {
        while self.timers.lock().marking.contains(&node_id) {
            let listener = self.marked.listen();
            if !self.timers.lock().marking.contains(&node_id) {
                return;
            }
            listener.wait();
        }
    }

    /// [`Heartbeats::wait_marked`], awaited.
    pub async fn marked(&self, node_id: NodeId) {
        while self.timers.lock().marking.contains(&node_id) {
            let listener = self.marked.listen();
            if !self.timers.lock().marking.contains(&node_id) {
                return;
            }
            listener.await;
        }
    }

    /// Evals for the jobs placed on a marked node after its evals were
    /// computed (`covered`: the jobs that had one).
    fn late_evals(&self, writer: &Writer, node_id: NodeId, covered: &BTreeSet<JobKey>, now: Timestamp) {
        let late: Vec<Evaluation> = node_evals(&writer.store().snapshot(), node_id, now)
            .into_iter()
            .filter(|eval| !covered.contains(&eval.job_key()))
            .collect();
        if !late.is_empty() {
            if let Err(error) = writer.write(Command::UpsertEvals { evals: late }) {
                tracing::warn!(%node_id, %error, "could not create evals for a node that missed its heartbeat");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::state::{Command, StateStore};
    use crate::testing::{node, HeldLog};

    const SECOND: Duration = Duration::from_secs(1);

    fn timers() -> HeartbeatTimers {
        HeartbeatTimers::new(HeartbeatConfig::default(), Timestamp::ZERO, 7)
    }

    #[test]
    fn a_node_expires_after_its_ttl_and_grace_and_not_before() {
        let mut timers = timers();
        let node_id = NodeId::from_u128(1);
        let ttl = timers.reset(node_id, Timestamp::ZERO);
        assert!(ttl >= 10 * SECOND && ttl < 20 * SECOND, "jitter stays within one TTL: {ttl:?}");
        let deadline = Timestamp::ZERO.plus(ttl + 10 * SECOND);
        assert!(timers.expire(Timestamp(deadline.0 - 1)).is_empty());
        assert_eq!(timers.expire(deadline.plus(TICK)), vec![node_id]);
        assert!(timers.expire(deadline.plus(100 * SECOND)).is_empty(), "expired once");
        assert_eq!(timers.stats(), HeartbeatStats { active_timers: 0, resets: 1, expirations: 1 });
    }

    #[test]
    fn a_heartbeat_moves_the_deadline() {
        let mut timers = timers();
        let node_id = NodeId::from_u128(1);
        timers.reset(node_id, Timestamp::ZERO);
        let later = Timestamp::ZERO.plus(15 * SECOND);
        timers.reset(node_id, later);
        assert!(timers.expire(later.plus(19 * SECOND)).is_empty());
        assert_eq!(timers.expire(later.plus(31 * SECOND)), vec![node_id]);
    }

    #[test]
    fn another_call_extends_a_deadline_but_never_shortens_or_starts_one() {
        let mut timers = timers();
        let (node_id, unheard) = (NodeId::from_u128(1), NodeId::from_u128(2));
        let ttl = timers.reset(node_id, Timestamp::ZERO);
        let deadline = Timestamp::ZERO.plus(ttl + 10 * SECOND);
        assert_eq!(timers.extend(node_id, Timestamp::ZERO), None, "no later than the heartbeat's");
        assert_eq!(timers.deadline(node_id), Some(deadline));
        // An allocation update just before the deadline: a heartbeat stuck
        // behind it still has a TTL and the grace to arrive.
        let late = Timestamp(deadline.0 - 1);
        let extended = timers.extend(node_id, late).expect("later than the heartbeat's");
        assert_eq!(extended, late.plus(timers.base_ttl(1) + 10 * SECOND));
        assert!(timers.expire(deadline.plus(TICK)).is_empty());
        assert_eq!(timers.expire(extended.plus(TICK)), vec![node_id]);
        assert_eq!(timers.extend(unheard, Timestamp::ZERO), None, "only a heartbeat starts a deadline");
        assert_eq!(timers.extend(node_id, extended.plus(SECOND)), None, "an expired node is not revived");
    }

    #[test]
    fn removed_and_far_deadlines_survive_many_turns_of_the_wheel() {
        let mut timers = timers();
        let (gone, far) = (NodeId::from_u128(1), NodeId::from_u128(2));
        timers.reset(gone, Timestamp::ZERO);
        timers.remove(gone);
        timers.wheel.set(far, Timestamp::ZERO.plus(1_000 * SECOND));
        let mut at = Timestamp::ZERO;
        for _ in 0..99 {
            at = at.plus(10 * SECOND);
            assert!(timers.expire(at).is_empty());
        }
        assert_eq!(timers.expire(Timestamp::ZERO.plus(1_000 * SECOND)), vec![far]);
    }

    #[test]
    fn the_ttl_scales_with_the_cluster_to_keep_the_heartbeat_rate() {
        let timers = timers();
        assert_eq!(timers.base_ttl(100), 10 * SECOND);
        assert_eq!(timers.base_ttl(100_000), 100 * SECOND);
    }

    #[test]
    fn heartbeats_of_ten_thousand_nodes_spread_across_the_ttl() {
        let mut timers = timers();
        let ttls: Vec<Duration> =
            (0..10_000u128).map(|n| timers.reset(NodeId::from_u128(n), Timestamp::ZERO)).collect();
        let base = timers.base_ttl(10_000);
        // Ten buckets over [base, 2 base): jitter puts roughly a tenth in each.
        let mut buckets = [0usize; 10];
        for ttl in &ttls {
            assert!(*ttl >= base && *ttl < base * 2, "{ttl:?} outside [{base:?}, {:?})", base * 2);
            buckets[((ttl.as_secs_f64() / base.as_secs_f64() - 1.0) * 10.0) as usize] += 1;
        }
        for (bucket, count) in buckets.iter().enumerate() {
            assert!((800..1_200).contains(count), "bucket {bucket} holds {count} of 10,000: {buckets:?}");
        }
        // The expiries come in the same spread: about a tenth of the cluster
        // in each second of the TTL, never a stampede.
        let mut per_second: BTreeMap<u64, usize> = BTreeMap::new();
        let mut at = Timestamp::ZERO;
        while timers.stats().active_timers > 0 {
            at = at.plus(SECOND);
            *per_second.entry(at.0 / SECOND.as_nanos() as u64).or_default() += timers.expire(at).len();
        }
        assert_eq!(timers.stats().expirations, 10_000);
        let busy = per_second.values().filter(|count| **count > 0).count();
        assert!(busy >= 10, "{per_second:?}");
        assert!(per_second.values().all(|count| *count <= 1_200), "{per_second:?}");
    }

    #[test]
    fn failover_gives_every_live_node_the_long_ttl() {
        let store = StateStore::new();
        for n in 0..3 {
            store.apply(Command::UpsertNode { node: node(n), evals: vec![] }).expect("node");
        }
        let down = node(0).id;
        store
            .apply(Command::UpdateNodeStatus {
                node_id: down,
                status: NodeStatus::Down,
                evals: vec![],
                time: Timestamp::ZERO,
            })
            .expect("down");
        let mut timers = timers();
        timers.initialize(&store.snapshot(), Timestamp::ZERO);
        assert_eq!(timers.stats().active_timers, 2, "a down node has no deadline");
        assert!(timers.expire(Timestamp::ZERO.plus(299 * SECOND)).is_empty());
        assert_eq!(timers.expire(Timestamp::ZERO.plus(300 * SECOND)).len(), 2);
    }

    #[test]
    fn a_node_heard_from_after_its_deadline_passed_is_not_marked() {
        use crate::clock::Clock;
        let clock = crate::clock::ManualClock::new(Timestamp::ZERO);
        let store = Arc::new(StateStore::new());
        let writer = Writer::direct(store.clone());
        for n in 0..2 {
            store.apply(Command::UpsertNode { node: node(n), evals: vec![] }).expect("node");
        }
        let heartbeats = Heartbeats::seeded(HeartbeatConfig::default(), clock.clone(), 7);
        let (late, silent) = (node(0).id, node(1).id);
        heartbeats.reset(late);
        heartbeats.reset(silent);
        clock.advance(100 * SECOND);
        // The sweep takes both off the wheel; before it writes the first
        // node's miss, the other one's late heartbeat arrives (answered live).
        let expired = heartbeats.timers.lock().expire(clock.now());
        assert_eq!(expired.len(), 2);
        heartbeats.reset(late);
        assert_eq!(heartbeats.miss(&writer, expired, false), 1);
        let snapshot = store.snapshot();
        assert_eq!(snapshot.node(late).expect("late").status, NodeStatus::Ready);
        assert_ne!(snapshot.node(silent).expect("silent").status, NodeStatus::Ready);
    }

    #[test]
    fn a_sweep_submits_every_miss_before_it_waits_on_any() {
        let clock = crate::clock::ManualClock::new(Timestamp::ZERO);
        let store = Arc::new(StateStore::new());
        for n in 0..3 {
            store.apply(Command::UpsertNode { node: node(n), evals: vec![] }).expect("node");
        }
        let log = HeldLog::new(store.clone());
        let writer = Writer::through(log.clone(), store.clone());
        let heartbeats = Heartbeats::seeded(HeartbeatConfig::default(), clock.clone(), 7);
        for n in 0..3 {
            heartbeats.reset(node(n).id);
        }
        clock.advance(100 * SECOND);
        let sweep = std::thread::spawn({
            let heartbeats = heartbeats.clone();
            move || heartbeats.expire(&writer)
        });
        // A sweep that waits on one miss before it submits the next never
        // gets all three in the log.
        log.wait_until("the sweep waited on a miss before submitting the others", |held| held.len() == 3);
        // All three are in the log together while none is written yet:
        // one batch for a durable log, not three fsyncs one after another.
        assert!(store.snapshot().nodes().all(|node| node.status == NodeStatus::Ready));
        assert_eq!(log.write_held(), 3);
        assert_eq!(sweep.join().expect("the sweep"), 3);
        assert!(store.snapshot().nodes().all(|node| node.status != NodeStatus::Ready));
    }

    #[test]
    fn a_heartbeat_while_its_nodes_miss_is_written_waits_for_it() {
        let clock = crate::clock::ManualClock::new(Timestamp::ZERO);
        let store = Arc::new(StateStore::new());
        store.apply(Command::UpsertNode { node: node(0), evals: vec![] }).expect("node");
        let node_id = node(0).id;
        let log = HeldLog::new(store.clone());
        let writer = Writer::through(log.clone(), store.clone());
        let heartbeats = Heartbeats::seeded(HeartbeatConfig::default(), clock.clone(), 7);
        heartbeats.reset(node_id);
        clock.advance(100 * SECOND);
        let sweep = std::thread::spawn({
            let heartbeats = heartbeats.clone();
            move || heartbeats.expire(&writer)
        });
        log.wait_until("the sweep never submitted the miss", |held| !held.is_empty());
        // The miss is in the log, not yet written: a heartbeat now is not
        // answered (the node still reads ready, and would be marked after).
        assert_eq!(heartbeats.reset_unless_marking(node_id), None);
        let waiting = std::thread::spawn({
            let heartbeats = heartbeats.clone();
            move || heartbeats.wait_marked(node_id)
        });
        assert_eq!(log.write_held(), 1);
        assert_eq!(sweep.join().expect("the sweep"), 1);
        waiting.join().expect("the heartbeat goes on once the miss is written");
        // Read again, the node is down: the endpoint answers that, not ready.
        assert_eq!(store.snapshot().node(node_id).expect("node").status, NodeStatus::Down);
        assert!(heartbeats.reset_unless_marking(node_id).is_some());
    }
}
