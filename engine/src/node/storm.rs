//! The storm guard: calm under mass heartbeat loss.
//!
//! When a large share of the nodes stop heartbeating at once, the likely
//! trouble is the servers' or the network's, not the machines' (Nomad
//! users ask for this guard: hashicorp/nomad#5876, #17974, #3840, #10341).
//! Marking them all `down` would stop everything they run and place every
//! replacement at once, on whatever capacity is left; when they come back,
//! their originals are gone. The guard instead:
//! 1. Judges, at each sweep of the heartbeat timers that finds a node
//!    missing (and at every sweep while it is on), the share of the nodes
//!    in trouble, cluster-wide and per datacenter: those that missed within
//!    the last `window` and are still away, those missing now, and those
//!    late now (past their TTL, inside the grace: they miss next unless
//!    heard from), each node once. Counting the late ones sees a storm
//!    while its first nodes miss, not after a share of them was already
//!    marked down.
//! 2. Turns on when that share reaches `cluster_share` of all live nodes,
//!    or `datacenter_share` of a datacenter's (of at least `min_nodes`
//!    nodes each); off when every share falls below half its threshold,
//!    so it does not flap at the edge. A warning and the
//!    `drover.heartbeat.storm_guard*` metrics say when, and why.
//! 3. While on, holds every node that misses: `disconnected` rather than
//!    `down`, with a [`NodeHold`](crate::structs::NodeHold) whose release
//!    times are spaced `1 / release_per_second` apart. The reconciler
//!    (`scheduler::reconcile`, step 3) marks its allocations `unknown`,
//!    places their replacements from the release time on, and stops an
//!    original only once its replacement runs; a node that comes back
//!    settles as any reconnect, never trading a running original for a
//!    replacement that has not started.
//! 4. Holds a node that misses before this server ever heard from it (it
//!    had the failover TTL, `heartbeat` step 2) whatever the share: right
//!    after a leader change its silence is as likely the servers' fault.
//!
//! Sans-IO: the caller gives `now`, the nodes and their datacenters.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use hashbrown::HashMap;
use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::structs::NodeId;

/// Storm guard settings (module docs).
#[derive(Clone, Debug)]
pub struct StormConfig {
    /// Whether the guard runs at all.
    pub enabled: bool,
    /// Share of all live nodes in trouble that turns the guard on.
    pub cluster_share: f64,
    /// Share of one datacenter's live nodes in trouble that turns it on.
    pub datacenter_share: f64,
    /// The fewest nodes a scope (the cluster, a datacenter) needs before
    /// its share is judged: a small cluster's one lost node is not a storm.
    pub min_nodes: usize,
    /// How long a missed heartbeat counts toward the share.
    pub window: Duration,
    /// Held nodes whose replacements are released per second.
    pub release_per_second: f64,
}

impl Default for StormConfig {
    fn default() -> Self {
        StormConfig {
            enabled: true,
            cluster_share: 0.2,
            datacenter_share: 0.3,
            min_nodes: 10,
            window: Duration::from_secs(60),
            release_per_second: 20.0,
        }
    }
}

impl StormConfig {
    /// Refuses settings that make no sense, naming the setting.
    pub fn validate(&self) -> Result<(), String> {
        for (name, share) in [("cluster_share", self.cluster_share), ("datacenter_share", self.datacenter_share)] {
            if !(share > 0.0 && share <= 1.0) {
                return Err(format!("{name} must be above 0 and at most 1, not {share}"));
            }
        }
        if !(self.release_per_second > 0.0 && self.release_per_second.is_finite()) {
            return Err(format!("release_rate must be above 0, not {}", self.release_per_second));
        }
        if self.window.is_zero() {
            return Err("window must be above zero".to_string());
        }
        Ok(())
    }

    fn release_interval(&self) -> Duration {
        Duration::from_secs_f64(1.0 / self.release_per_second)
    }
}

/// What the guard has done (in the server's stats and metrics).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StormStats {
    /// Whether it is on now.
    pub on: bool,
    /// How many times it turned on.
    pub activations: u64,
    /// How long it has been on in all, in milliseconds (the current spell included).
    pub held_millis: u64,
    /// Nodes it held (a node held twice counts twice).
    pub nodes_held: u64,
    /// The time between two held nodes' releases, in microseconds.
    pub release_interval_micros: u64,
    /// Why it last turned on (empty: never).
    pub reason: String,
}

/// The guard's state (module docs).
#[derive(Debug)]
pub struct StormGuard {
    config: StormConfig,
    /// Missed heartbeats within the window: when, the node, its datacenter.
    misses: VecDeque<(Timestamp, NodeId, Arc<str>)>,
    on_since: Option<Timestamp>,
    /// When the next held node's replacements may be placed, at the earliest.
    next_release: Timestamp,
    stats: StormStats,
}

/// The nodes one judgement looks at.
#[derive(Debug)]
pub struct Census<'a> {
    /// The nodes missing now, with their datacenters.
    pub missing: Vec<(NodeId, &'a str)>,
    /// The datacenters of the nodes late now (module docs, 1).
    pub late: Vec<&'a str>,
    /// Live (ready or initializing) nodes per datacenter, the missing ones included.
    pub live: HashMap<&'a str, usize>,
}

impl StormGuard {
    /// A guard that is off.
    pub fn new(config: StormConfig) -> Self {
        let release_interval_micros = config.release_interval().as_micros() as u64;
        StormGuard {
            config,
            misses: VecDeque::new(),
            on_since: None,
            next_release: Timestamp::ZERO,
            stats: StormStats { release_interval_micros, ..StormStats::default() },
        }
    }

    /// Whether it is on.
    pub fn is_on(&self) -> bool {
        self.on_since.is_some()
    }

    /// Judges `census` at `now` (module docs, 1-2), records its missing
    /// nodes, and returns whether the guard is on for them. `is_live`
    /// says whether a node that missed within the window is back.
    pub fn judge(&mut self, now: Timestamp, census: &Census<'_>, is_live: impl Fn(NodeId) -> bool) -> bool {
        if !self.config.enabled {
            return false;
        }
        let horizon = Timestamp(now.0.saturating_sub(self.config.window.as_nanos() as u64));
        while self.misses.front().is_some_and(|(at, _, _)| *at < horizon) {
            self.misses.pop_front();
        }
        let verdict = {
            // Each node once: one that missed twice in the window, or came
            // back since, is not two nodes away.
            let away: HashMap<NodeId, &str> = self
                .misses
                .iter()
                .filter(|(_, node_id, _)| !is_live(*node_id))
                .map(|(_, node_id, datacenter)| (*node_id, &**datacenter))
                .collect();
            let mut trouble: HashMap<&str, usize> = HashMap::new();
            let mut population = census.live.clone();
            for datacenter in away.values().copied() {
                *trouble.entry(datacenter).or_default() += 1;
                *population.entry(datacenter).or_default() += 1;
            }
            // The missing and the late ones are live yet: in `live` already.
            for datacenter in census.missing.iter().map(|(_, dc)| *dc).chain(census.late.iter().copied()) {
                *trouble.entry(datacenter).or_default() += 1;
            }
            let scale = if self.is_on() { 0.5 } else { 1.0 };
            self.worst(&trouble, &population, scale)
        };
        match (verdict, self.on_since) {
            (Some(reason), None) => {
                tracing::warn!(
                    "storm guard on: {reason}; nodes that miss their heartbeat are held disconnected, not down, \
                     their replacements released at {}/s, and no original stops before its replacement runs",
                    self.config.release_per_second
                );
                self.on_since = Some(now);
                self.stats.activations += 1;
                self.stats.reason = reason;
            }
            (None, Some(since)) => {
                let held = Duration::from_nanos(now.0.saturating_sub(since.0));
                tracing::warn!(held_for = ?held, "storm guard off: the share of nodes in trouble fell below half its threshold");
                self.stats.held_millis += held.as_millis() as u64;
                self.on_since = None;
            }
            _ => {}
        }
        self.misses.extend(census.missing.iter().map(|(node_id, dc)| (now, *node_id, Arc::from(*dc))));
        self.is_on()
    }

    /// The first scope whose share of trouble reaches `scale` times its
    /// threshold, described.
    fn worst(&self, trouble: &HashMap<&str, usize>, population: &HashMap<&str, usize>, scale: f64) -> Option<String> {
        let total: usize = population.values().sum();
        let troubled: usize = trouble.values().sum();
        let share = |part: usize, whole: usize| part as f64 / whole.max(1) as f64;
        if total >= self.config.min_nodes && share(troubled, total) >= self.config.cluster_share * scale {
            return Some(format!(
                "{troubled} of {total} nodes ({:.0}%) missed or are late on their heartbeats within {:?} \
                 (threshold {:.0}% of the cluster)",
                share(troubled, total) * 100.0,
                self.config.window,
                self.config.cluster_share * 100.0
            ));
        }
        let mut datacenters: Vec<(&&str, &usize)> = population.iter().collect();
        datacenters.sort();
        datacenters.into_iter().find_map(|(datacenter, &whole)| {
            let part = trouble.get(datacenter).copied().unwrap_or(0);
            (whole >= self.config.min_nodes && share(part, whole) >= self.config.datacenter_share * scale).then(|| {
                format!(
                    "{part} of {whole} nodes ({:.0}%) of datacenter {datacenter} missed or are late on their \
                     heartbeats within {:?} (threshold {:.0}% of a datacenter)",
                    share(part, whole) * 100.0,
                    self.config.window,
                    self.config.datacenter_share * 100.0
                )
            })
        })
    }

    /// Holds one more node at `now`: when its replacements may be placed
    /// (module docs, 3).
    pub fn hold(&mut self, now: Timestamp) -> Timestamp {
        let release_at = self.next_release.max(now);
        self.next_release = release_at.plus(self.config.release_interval());
        self.stats.nodes_held += 1;
        release_at
    }

    /// Counters at `now`.
    pub fn stats(&self, now: Timestamp) -> StormStats {
        let mut stats = self.stats.clone();
        stats.on = self.is_on();
        if let Some(since) = self.on_since {
            stats.held_millis += Duration::from_nanos(now.0.saturating_sub(since.0)).as_millis() as u64;
        }
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: u64) -> Timestamp {
        Timestamp::ZERO.plus(Duration::from_secs(seconds))
    }

    /// `missing` new nodes missing now (ids from `next`), `late` late, of
    /// `live`, all in the first datacenter.
    fn census<'a>(next: &mut u128, missing: usize, late: usize, live: &[(&'a str, usize)]) -> Census<'a> {
        let dc = live[0].0;
        let missing = (0..missing)
            .map(|_| {
                *next += 1;
                (NodeId::from_u128(*next), dc)
            })
            .collect();
        Census { missing, late: vec![dc; late], live: live.iter().copied().collect() }
    }

    /// No node that missed came back.
    fn away(_: NodeId) -> bool {
        false
    }

    #[test]
    fn a_few_misses_leave_the_guard_off() {
        let (mut guard, mut next) = (StormGuard::new(StormConfig::default()), 0);
        for second in 0..100 {
            assert!(!guard.judge(at(second), &census(&mut next, 1, 1, &[("dc1", 1_000)]), away), "second {second}");
        }
        assert_eq!(guard.stats(at(100)).activations, 0);
    }

    #[test]
    fn late_nodes_turn_it_on_at_the_first_miss_of_a_storm() {
        let (mut guard, mut next) = (StormGuard::new(StormConfig::default()), 0);
        // 1 missing now, 250 late of 1,000: a quarter in trouble.
        assert!(guard.judge(at(10), &census(&mut next, 1, 250, &[("dc1", 1_000)]), away));
        let stats = guard.stats(at(12));
        assert_eq!((stats.on, stats.activations, stats.held_millis), (true, 1, 2_000));
        assert!(stats.reason.contains("251 of 1000 nodes"), "{}", stats.reason);
    }

    #[test]
    fn misses_accumulate_over_the_window_and_age_out_of_it() {
        let (mut guard, mut next) = (StormGuard::new(StormConfig::default()), 0);
        // Ten nodes of 1,000 miss each second: the missed ones leave the live count.
        let live = |second: u64| [("dc1", 1_000 - 10 * second as usize)];
        for second in 0..19 {
            assert!(!guard.judge(at(second), &census(&mut next, 10, 0, &live(second)), away), "second {second}");
        }
        assert!(guard.judge(at(19), &census(&mut next, 10, 0, &live(19)), away), "200 of 1,000 within the window");
        // Nothing new: it stays on while the window holds 100 or more (half the threshold) ...
        assert!(guard.judge(at(60), &census(&mut next, 0, 0, &[("dc1", 800)]), away));
        // ... and goes off once they age out.
        assert!(!guard.judge(at(75), &census(&mut next, 0, 0, &[("dc1", 800)]), away));
        let stats = guard.stats(at(100));
        assert_eq!((stats.on, stats.activations, stats.held_millis), (false, 1, 56_000));
    }

    #[test]
    fn nodes_that_came_back_are_not_in_trouble() {
        let (mut guard, mut next) = (StormGuard::new(StormConfig::default()), 0);
        // 150 of 1,000 miss (15%), come back, and another 150 miss: never
        // 20% away at once.
        assert!(!guard.judge(at(0), &census(&mut next, 150, 0, &[("dc1", 1_000)]), away));
        let back = |node_id: NodeId| node_id <= NodeId::from_u128(150);
        assert!(!guard.judge(at(1), &census(&mut next, 150, 0, &[("dc1", 1_000)]), back));
        // Had the first 150 stayed away, it is 300 of 1,150.
        let mut again = (StormGuard::new(StormConfig::default()), 0);
        assert!(!again.0.judge(at(0), &census(&mut again.1, 150, 0, &[("dc1", 1_000)]), away));
        assert!(again.0.judge(at(1), &census(&mut again.1, 150, 0, &[("dc1", 1_000)]), away));
    }

    #[test]
    fn one_datacenter_in_trouble_is_enough() {
        let (mut guard, mut next) = (StormGuard::new(StormConfig::default()), 0);
        let live = [("dc1", 100), ("dc2", 900)];
        // 31 of dc1's 100: 3% of the cluster, 31% of the datacenter.
        assert!(guard.judge(at(0), &census(&mut next, 1, 30, &live), away));
        assert!(guard.stats(at(0)).reason.contains("datacenter dc1"), "{}", guard.stats(at(0)).reason);
    }

    #[test]
    fn a_small_cluster_is_not_judged_and_a_disabled_guard_never_turns_on() {
        let (mut guard, mut next) = (StormGuard::new(StormConfig::default()), 0);
        assert!(!guard.judge(at(0), &census(&mut next, 3, 0, &[("dc1", 5)]), away), "5 nodes are under min_nodes");
        let mut disabled = StormGuard::new(StormConfig { enabled: false, ..StormConfig::default() });
        assert!(!disabled.judge(at(0), &census(&mut next, 900, 0, &[("dc1", 1_000)]), away));
    }

    #[test]
    fn held_nodes_are_released_at_the_configured_rate() {
        let mut guard = StormGuard::new(StormConfig { release_per_second: 4.0, ..StormConfig::default() });
        let releases: Vec<Timestamp> = (0..5).map(|_| guard.hold(at(10))).collect();
        let quarter = Duration::from_millis(250);
        let expected: Vec<Timestamp> = (0..5).map(|n| at(10).plus(quarter * n)).collect();
        assert_eq!(releases, expected);
        // A node held after the queue ran dry is released at once.
        assert_eq!(guard.hold(at(20)), at(20));
        assert_eq!(guard.stats(at(20)).nodes_held, 6);
    }

    #[test]
    fn settings_that_make_no_sense_are_refused() {
        for config in [
            StormConfig { cluster_share: 0.0, ..StormConfig::default() },
            StormConfig { datacenter_share: 1.5, ..StormConfig::default() },
            StormConfig { release_per_second: 0.0, ..StormConfig::default() },
            StormConfig { window: Duration::ZERO, ..StormConfig::default() },
        ] {
            assert!(config.validate().is_err(), "{config:?}");
        }
        assert_eq!(StormConfig::default().validate(), Ok(()));
    }
}
