//! Placement preferences of one task group: its affinities (job, group and
//! task level) and spreads (job and group level), and the buckets of nodes
//! the stack walks to find the nodes they prefer.
//!
//! 1. Scores follow Nomad. Affinity: the summed weights of the affinities a
//!    node matches over the sum of all their absolute weights, in [-1, 1].
//!    Spread, per attribute: with targets, `(desired - (used + 1)) / desired`
//!    times the spread's share of the spread weights (a value without a
//!    target gets -1, or the implicit target when the targets leave some
//!    percent); without targets, Nomad's even-spread boost from the
//!    smallest and largest counts; a node without the attribute gets -1.
//!    Each is one more term of the node's mean score ([`super::rank`]),
//!    present only when it is not zero.
//! 2. Both depend only on a node's attribute values: its computed class,
//!    unless a target reads a `unique.` attribute (then its own values). So
//!    once per eval and group the nodes are put in buckets of equal affinity
//!    and equal spread values: whole classes at a time from the state's
//!    class index (one node of each class is read), or node by node when a
//!    target reads a unique attribute. Each bucket is walked in its own
//!    seeded permutation (a random start and a stride coprime to its size).
//! 3. Spread counts per attribute value are the group's live allocations
//!    (existing ones, minus the plan's stops, plus its placements), updated
//!    as the plan grows ([`Preferences::count`]). Scoring a candidate is a
//!    look-up of its bucket's bonus: O(1). Bonuses are refreshed once per
//!    placement, O(buckets x spreads).
//! 4. Nomad scores every node when a group has affinities or spreads, so
//!    that preferred nodes are found. The stack instead walks the buckets
//!    best bound first ([`Preferences::refresh`] orders them, buckets of
//!    equal bound make a tier): the best tier with the whole score limit,
//!    then the next ones while they could still beat the best score found.
//!    A bucket in which no node had room is not walked again in this plan:
//!    placements only fill nodes.

use hashbrown::HashMap;
use rand::Rng;
use smallvec::SmallVec;

use super::feasible::{is_unique_target, resolve_target, Prepared};
use super::rank::Score;
use crate::structs::{AllocMetric, ComputedClass, Job, Node, NodeId, TaskGroup};

/// The value id of a node without the spread attribute.
const MISSING: u32 = u32::MAX;

/// Spread values of one bucket, one per spread.
type Values = SmallVec<[u32; 2]>;

/// What makes nodes equal for one group: the summed weights of the
/// affinities they match, and their value of each spread attribute.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    affinity: i32,
    values: Values,
}

/// Nodes equal for one group's preferences, walked in a seeded permutation.
#[derive(Debug)]
pub struct Bucket {
    /// The nodes, feasible by class (some may since have left the
    /// schedulable set: the walk skips those).
    pub nodes: Vec<NodeId>,
    start: usize,
    stride: usize,
    /// How many nodes the walk has visited so far.
    visited: usize,
    /// No node had room when the whole bucket was last walked.
    pub exhausted: bool,
    /// The affinity component of its nodes' score.
    pub affinity: Option<f64>,
    /// The spread component, as of the last refresh.
    pub spread: Option<f64>,
    /// The best score a node of the bucket could reach (a perfect fit).
    pub bound: f64,
    values: Values,
}

/// One spread attribute's targets and counts.
#[derive(Debug)]
struct SpreadCounts {
    attribute: String,
    /// The spread's share of the group's spread weights.
    weight: f64,
    value_ids: HashMap<String, u32>,
    /// Desired allocations per value id (`None`: no target of its own).
    desired: Vec<Option<f64>>,
    /// What values without a target of their own may have, when targets
    /// leave part of the count (Nomad's implicit `*` target).
    implicit: Option<f64>,
    has_targets: bool,
    /// Live allocations of the group per value id.
    counts: Vec<u32>,
    /// Boost per value id, as of the last refresh.
    boosts: Vec<f64>,
    /// The boost of a node without the attribute.
    missing_boost: f64,
}

impl SpreadCounts {
    fn new(spread: &crate::structs::Spread, weights: f64, count: u32) -> Self {
        let mut counts = SpreadCounts {
            attribute: spread.attribute.clone(),
            weight: f64::from(spread.weight) / weights.max(1.0),
            value_ids: HashMap::new(),
            desired: Vec::new(),
            implicit: None,
            has_targets: !spread.targets.is_empty(),
            counts: Vec::new(),
            boosts: Vec::new(),
            missing_boost: -1.0,
        };
        let mut sum = 0.0;
        for target in &spread.targets {
            let desired = f64::from(target.percent) / 100.0 * f64::from(count);
            let id = counts.value_id(&target.value);
            counts.desired[id as usize] = Some(desired);
            sum += desired;
        }
        if sum > 0.0 && sum < f64::from(count) {
            counts.implicit = Some(f64::from(count) - sum);
        }
        counts
    }

    fn value_id(&mut self, value: &str) -> u32 {
        if let Some(id) = self.value_ids.get(value) {
            return *id;
        }
        let id = self.counts.len() as u32;
        self.value_ids.insert(value.to_string(), id);
        self.counts.push(0);
        self.desired.push(None);
        self.boosts.push(0.0);
        id
    }

    /// Recomputes every value's boost from the counts (module docs, step 1).
    fn refresh(&mut self) {
        if self.has_targets {
            let mut lowest: f64 = -1.0;
            for id in 0..self.counts.len() {
                let boost = match self.desired[id].or(self.implicit) {
                    None => -1.0,
                    Some(0.0) => 0.0, // Set below, once the lowest is known.
                    Some(desired) => (desired - (f64::from(self.counts[id]) + 1.0)) / desired * self.weight,
                };
                lowest = lowest.min(boost);
                self.boosts[id] = boost;
            }
            for id in 0..self.counts.len() {
                if self.desired[id].or(self.implicit) == Some(0.0) {
                    self.boosts[id] = lowest;
                }
            }
        } else {
            let placed = self.counts.iter().copied().filter(|count| *count > 0);
            let min = placed.clone().min().unwrap_or(0);
            let max = placed.max().unwrap_or(0);
            for id in 0..self.counts.len() {
                self.boosts[id] = even_spread_boost(self.counts[id], min, max);
            }
        }
    }

    fn boost(&self, value: u32) -> f64 {
        match value {
            MISSING => self.missing_boost,
            id => self.boosts[id as usize],
        }
    }
}

/// Nomad's boost for an even spread: positive for values below the
/// smallest count of the values in use, negative for those above it;
/// `min` is the smallest non-zero count (0: nothing placed yet).
impl Bucket {
    /// The next node of the bucket's permutation.
    pub fn next_node(&mut self) -> NodeId {
        let n = self.nodes.len();
        let position = (self.start + self.visited % n * self.stride) % n;
        self.visited += 1;
        self.nodes[position]
    }

    fn shuffle(&mut self, rng: &mut impl Rng) {
        let n = self.nodes.len().max(1);
        self.start = rng.random_range(0..n);
        self.stride = coprime_stride(n, rng);
    }
}

/// A stride in `1..=n` coprime to `n`, drawn from `rng`: stepping by it
/// from any start visits all `n` positions once.
pub fn coprime_stride(n: usize, rng: &mut impl Rng) -> usize {
    let gcd = |mut a: usize, mut b: usize| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    let mut stride = rng.random_range(1..n.max(2)).min(n.max(1));
    while n > 1 && gcd(stride, n) != 1 {
        stride = stride % (n - 1) + 1;
    }
    stride
}

fn even_spread_boost(current: u32, min: u32, max: u32) -> f64 {
    if max == 0 {
        return 0.0;
    }
    if current != min {
        return (f64::from(min) - f64::from(current)) / f64::from(min);
    }
    if min == max {
        return -1.0;
    }
    f64::from(max - min) / f64::from(min)
}

/// One group's affinities and spreads, and its buckets; see the module docs.
#[derive(Debug)]
pub struct Preferences {
    affinities: Vec<(Prepared, i32)>,
    affinity_weights: f64,
    spreads: Vec<SpreadCounts>,
    /// Some target reads a `unique.` attribute: keys are per node.
    per_node: bool,
    class_buckets: HashMap<ComputedClass, usize>,
    key_buckets: HashMap<Key, usize>,
    /// The buckets.
    pub buckets: Vec<Bucket>,
    /// Bucket indexes, best bound first, as of the last refresh.
    pub order: Vec<usize>,
    /// Candidates left out of every bucket because their class cannot run
    /// the group: added to the metrics of a placement that fails.
    pub prefiltered: AllocMetric,
}

impl Preferences {
    /// The preferences of `group` of `job`, or `None` if it has none.
    pub fn of(job: &Job, group: &TaskGroup) -> Option<Preferences> {
        let affinities: Vec<(Prepared, i32)> = job
            .affinities
            .iter()
            .chain(&group.affinities)
            .chain(group.tasks.iter().flat_map(|task| &task.affinities))
            .map(|affinity| (Prepared::new(&affinity.condition()), i32::from(affinity.weight)))
            .collect();
        let spreads: Vec<&crate::structs::Spread> = group.spreads.iter().chain(&job.spreads).collect();
        if affinities.is_empty() && spreads.is_empty() {
            return None;
        }
        let weights: f64 = spreads.iter().map(|spread| f64::from(spread.weight)).sum();
        let per_node = affinities.iter().any(|(prepared, _)| prepared.reads_unique())
            || spreads.iter().any(|spread| is_unique_target(&spread.attribute));
        Some(Preferences {
            affinity_weights: affinities.iter().map(|(_, weight)| f64::from(weight.unsigned_abs())).sum(),
            affinities,
            spreads: spreads.into_iter().map(|spread| SpreadCounts::new(spread, weights, group.count)).collect(),
            per_node,
            class_buckets: HashMap::new(),
            key_buckets: HashMap::new(),
            buckets: Vec::new(),
            order: Vec::new(),
            prefiltered: AllocMetric::default(),
        })
    }

    /// Whether nodes must be bucketed one by one (a target reads a
    /// `unique.` attribute) rather than by class.
    pub fn per_node(&self) -> bool {
        self.per_node
    }

    /// Puts the nodes `ids` of the class of `representative` (one of them,
    /// feasible by class) in their bucket.
    pub fn add_class(&mut self, representative: &Node, ids: impl Iterator<Item = NodeId>) {
        let bucket = self.bucket_for(representative);
        self.class_buckets.insert(representative.computed_class, bucket);
        self.buckets[bucket].nodes.extend(ids);
    }

    /// Puts one node (feasible) in its bucket.
    pub fn add_node(&mut self, node: &Node) {
        let bucket = self.bucket_for(node);
        self.buckets[bucket].nodes.push(node.id);
    }

    /// Draws every bucket's walk order from `rng`; call once the buckets are filled.
    pub fn shuffle(&mut self, rng: &mut impl Rng) {
        for bucket in &mut self.buckets {
            bucket.shuffle(rng);
        }
    }

    fn bucket_for(&mut self, node: &Node) -> usize {
        let key = self.key_of(node);
        if let Some(bucket) = self.key_buckets.get(&key) {
            return *bucket;
        }
        let affinity = (key.affinity != 0).then(|| f64::from(key.affinity) / self.affinity_weights);
        self.buckets.push(Bucket {
            nodes: Vec::new(),
            start: 0,
            stride: 1,
            visited: 0,
            exhausted: false,
            affinity,
            spread: None,
            bound: 1.0,
            values: key.values.clone(),
        });
        self.key_buckets.insert(key, self.buckets.len() - 1);
        self.buckets.len() - 1
    }

    fn key_of(&mut self, node: &Node) -> Key {
        let affinity =
            self.affinities.iter().filter(|(prepared, _)| prepared.holds(node)).map(|(_, weight)| weight).sum();
        let values = self.spread_values(node);
        Key { affinity, values }
    }

    fn spread_values(&mut self, node: &Node) -> Values {
        self.spreads
            .iter_mut()
            .map(|spread| resolve_target(&spread.attribute, node).map_or(MISSING, |value| spread.value_id(&value)))
            .collect()
    }

    /// Adds `delta` live allocations of the group on `node` to the spread counts.
    pub fn count(&mut self, node: &Node, delta: i32) {
        if self.spreads.is_empty() {
            return;
        }
        let values = match self.class_buckets.get(&node.computed_class) {
            Some(bucket) if !self.per_node => self.buckets[*bucket].values.clone(),
            _ => self.spread_values(node),
        };
        for (spread, value) in self.spreads.iter_mut().zip(values) {
            if value != MISSING {
                let count = &mut spread.counts[value as usize];
                *count = count.saturating_add_signed(delta);
            }
        }
    }

    /// Recomputes the spread components and bounds of every bucket, and
    /// orders them best bound first (ties keep the eval's node order).
    pub fn refresh(&mut self) {
        for spread in &mut self.spreads {
            spread.refresh();
        }
        for bucket in &mut self.buckets {
            let spread: f64 = self.spreads.iter().zip(&bucket.values).map(|(spread, value)| spread.boost(*value)).sum();
            bucket.spread = (!self.spreads.is_empty() && spread != 0.0).then_some(spread);
            let perfect = Score { fit: 1.0, affinity: bucket.affinity, spread: bucket.spread, ..Score::default() };
            bucket.bound = perfect.combined();
        }
        if self.order.len() != self.buckets.len() {
            self.order = (0..self.buckets.len()).collect();
        }
        let buckets = &self.buckets;
        self.order.sort_by(|a, b| buckets[*b].bound.total_cmp(&buckets[*a].bound).then(a.cmp(b)));
    }

    /// Where the tier that starts at `start` in [`Self::order`] ends: the
    /// buckets after it with the same bound (to rounding) are in it.
    pub fn tier_end(&self, start: usize) -> usize {
        let bound = self.buckets[self.order[start]].bound;
        let same = self.order[start..].iter().take_while(|index| (self.buckets[**index].bound - bound).abs() < 1e-9);
        start + same.count()
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;
    use crate::structs::{Affinity, ConstraintOperand, JobType, Resources, Spread};

    fn node(n: u128, datacenter: &str, class: &str) -> Node {
        Node::new_ready(NodeId::from_u128(n), datacenter, class, Resources::new(1000, 1000, 0))
    }

    #[test]
    fn the_even_spread_boost_is_nomads() {
        assert_eq!(even_spread_boost(0, 0, 0), 0.0, "nothing placed yet");
        assert_eq!(even_spread_boost(0, 1, 1), 1.0, "a value not yet used");
        assert_eq!(even_spread_boost(1, 1, 1), -1.0, "already even");
        assert_eq!(even_spread_boost(2, 1, 2), -1.0, "above the smallest");
        assert_eq!(even_spread_boost(1, 1, 2), 1.0, "the smallest of uneven values");
    }

    #[test]
    fn buckets_group_nodes_by_affinity_and_spread_value() {
        let mut job = Job::new_simple("web", JobType::Service, 10, Resources::new(1, 1, 0));
        job.affinities.push(Affinity::new("${node.class}", ConstraintOperand::Equal, "fast", 50));
        job.task_groups[0].spreads.push(Spread::with_targets("${node.datacenter}", 50, &[("dc1", 70), ("dc2", 30)]));
        let mut preferences = Preferences::of(&job, &job.task_groups[0]).expect("has preferences");
        for (n, (dc, class)) in [("dc1", "fast"), ("dc1", "slow"), ("dc2", "fast"), ("dc1", "fast"), ("dc3", "slow")]
            .into_iter()
            .enumerate()
        {
            preferences.add_node(&node(n as u128 + 1, dc, class));
        }
        preferences.shuffle(&mut rand::rngs::SmallRng::seed_from_u64(3));
        assert_eq!(preferences.buckets.len(), 4);
        preferences.refresh();
        let best = &preferences.buckets[preferences.order[0]];
        assert_eq!(best.nodes.len(), 2, "dc1 and fast: affinity 1, spread (7 - 1) / 7");
        assert_eq!(best.affinity, Some(1.0));
        assert!((best.spread.expect("a spread score") - 6.0 / 7.0).abs() < 1e-9);
        let worst = &preferences.buckets[*preferences.order.last().expect("buckets")];
        assert_eq!(worst.spread, Some(-1.0), "dc3 has no target and the targets leave nothing");
        for _ in 0..7 {
            preferences.count(&node(9, "dc1", "fast"), 1);
        }
        preferences.refresh();
        let best = &preferences.buckets[preferences.order[0]];
        assert_eq!(best.nodes, vec![NodeId::from_u128(3)], "dc1 is at its target: dc2 now leads");
        let mut ones = preferences.buckets.remove(preferences.order[0]);
        assert_eq!((ones.next_node(), ones.next_node()), (NodeId::from_u128(3), NodeId::from_u128(3)));
    }

    #[test]
    fn a_bucket_walk_visits_every_node_once_per_round() {
        let mut job = Job::new_simple("web", JobType::Service, 1, Resources::new(1, 1, 0));
        job.spreads.push(Spread::even("${node.datacenter}", 50));
        let mut preferences = Preferences::of(&job, &job.task_groups[0]).expect("has preferences");
        let representative = node(1, "dc1", "c");
        preferences.add_class(&representative, (1..=12).map(NodeId::from_u128));
        preferences.shuffle(&mut rand::rngs::SmallRng::seed_from_u64(9));
        let bucket = &mut preferences.buckets[0];
        let mut seen: Vec<NodeId> = (0..12).map(|_| bucket.next_node()).collect();
        seen.sort_unstable();
        assert_eq!(seen, (1..=12).map(NodeId::from_u128).collect::<Vec<_>>());
    }

    #[test]
    fn a_group_without_affinities_or_spreads_has_no_preferences() {
        let job = Job::new_simple("web", JobType::Service, 1, Resources::new(1, 1, 0));
        assert!(Preferences::of(&job, &job.task_groups[0]).is_none());
    }
}
