//! The placement stack: picks a node for one allocation of a task group.
//!
//! 1. Candidates are the ready, eligible nodes (a sorted list the state
//!    keeps), visited in a permutation drawn from a seed mixed from the eval
//!    id, so parallel workers start in different places; the walk carries on
//!    from one placement to the next.
//! 2. Each candidate is checked for feasibility (cached per computed class),
//!    for `distinct_hosts` / `distinct_property`, then for room: its
//!    allocatable resources and its ports against existing allocations plus
//!    what this plan already placed or stopped there ([`PlanUsage`]). Nothing
//!    is ever oversubscribed, and no port given twice, within a plan.
//! 3. Up to `limit` nodes that pass are scored ([`super::rank`]); the best
//!    wins. A group with affinities or spreads walks its nodes in buckets of
//!    equal preference instead ([`super::preference`]), in tiers of equal
//!    bonus, best first: up to `limit` nodes with room in the best tier
//!    (its buckets in turn), then up to [`NEXT_TIER_BUDGET`] in each next
//!    tier that could still beat the best score, at most `limit` more in all.
//! 4. When nothing has room and the job may preempt, every candidate is
//!    checked for what could be evicted there ([`super::preempt`]); the
//!    cheapest of the first `limit` options wins.
//! 5. The winner's ports are assigned (its static ports, and dynamic ones
//!    drawn with the stack's seeded generator).
//! 6. Every filtered or exhausted node is counted in the placement metrics.

use std::sync::Arc;

use hashbrown::{HashMap, HashSet};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use smallvec::SmallVec;

use super::feasible::{resolve_target, FeasibilityChecker};
use super::preempt::{preemption_for, Preemption};
use super::preference::{coprime_stride, Bucket, Preferences};
use super::rank::{anti_affinity_score, fit_score, Score};
use super::usage::{PlanUsage, PortAsk};
use super::{Algorithm, NodeClaims, State};
use crate::state::NodeList;
use crate::structs::{
    AllocMetric, AllocatedPort, Allocation, ConstraintOperand, Job, Node, NodeId, Resources, TaskGroup,
};

/// How many nodes with room are scored in each tier of buckets after the best one.
pub const NEXT_TIER_BUDGET: usize = 2;

/// How many feasible nodes with room to score per placement: ceil(log2(n))
/// with a floor of 2, as Nomad does for services. Scoring is cheap here (a
/// fit check against cached usage), so batch jobs get the same limit rather
/// than Nomad's 2.
pub fn score_limit(n_nodes: usize) -> usize {
    let log2 = usize::BITS - n_nodes.saturating_sub(1).leading_zeros();
    (log2 as usize).max(2)
}

/// A selected node, its score, the ports it gives, and what it evicts.
#[derive(Clone, Debug)]
pub struct Selection {
    /// The node.
    pub node: Arc<Node>,
    /// Its final score (0 for a node chosen by preemption).
    pub score: f64,
    /// The ports the allocation gets there.
    pub ports: Vec<AllocatedPort>,
    /// Lower-priority allocations to evict there first (already counted as
    /// gone by the stack).
    pub preempted: Vec<Arc<Allocation>>,
}

/// What one placement of a group asks for, prepared once per placement.
struct Ask<'g> {
    group: &'g TaskGroup,
    name: Arc<str>,
    resources: Resources,
    ports: Option<PortAsk>,
    distinct: DistinctRules,
}

/// Placement state for one job in one eval; see the module docs.
pub struct Stack {
    state: Arc<dyn State>,
    job: Arc<Job>,
    /// Ready, eligible nodes sorted by id, visited in a seeded order: from a
    /// random start with a random stride coprime to their number, which is a
    /// permutation without copying or shuffling 10,000 entries per eval.
    candidates: NodeList,
    start: usize,
    stride: usize,
    visited_total: usize,
    limit: usize,
    algorithm: Algorithm,
    usage: PlanUsage,
    /// Live allocations of this job per node and group (existing minus
    /// stopped, plus placed by this plan).
    job_allocs: HashMap<(NodeId, Arc<str>), u32>,
    job_allocs_on_node: HashMap<NodeId, u32>,
    checkers: HashMap<Arc<str>, FeasibilityChecker>,
    /// Per group with affinities or spreads: its buckets and counts.
    preferences: HashMap<Arc<str>, Preferences>,
    claims: Option<(Arc<dyn NodeClaims>, u64)>,
    preemption: bool,
    rng: SmallRng,
}

impl Selection {
    /// A selection of the node `id` of `state` with `score`, nothing evicted yet.
    fn of(state: &dyn State, id: NodeId, score: f64) -> Option<Selection> {
        Some(Selection { node: state.node(id)?, score, ports: Vec::new(), preempted: Vec::new() })
    }
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack").field("candidates", &self.candidates.len()).field("limit", &self.limit).finish()
    }
}

impl Stack {
    /// A stack for `job` over the nodes of `state`, in an order drawn from `seed`.
    pub fn new(state: Arc<dyn State>, job: Arc<Job>, algorithm: Algorithm, seed: u64) -> Self {
        let candidates = state.schedulable_nodes();
        let n = candidates.len().max(1);
        let mut rng = SmallRng::seed_from_u64(seed);
        let start = rng.random_range(0..n);
        let stride = coprime_stride(n, &mut rng);
        let limit = score_limit(candidates.len());
        let mut stack = Stack {
            state,
            job,
            candidates,
            start,
            stride,
            visited_total: 0,
            limit,
            algorithm,
            usage: PlanUsage::default(),
            job_allocs: HashMap::new(),
            job_allocs_on_node: HashMap::new(),
            checkers: HashMap::new(),
            preferences: HashMap::new(),
            claims: None,
            preemption: false,
            rng,
        };
        stack.count_existing_job_allocs();
        stack
    }

    /// Shares node claims with other workers ([`NodeClaims`]).
    pub fn with_claims(mut self, claims: Option<(Arc<dyn NodeClaims>, u64)>) -> Self {
        self.claims = claims;
        self
    }

    /// Lets placements that find no room evict lower-priority allocations.
    pub fn with_preemption(mut self, preemption: bool) -> Self {
        self.preemption = preemption;
        self
    }

    /// The next candidate in this eval's order.
    fn next_candidate(&mut self) -> Option<Arc<Node>> {
        self.next_candidate_id().and_then(|id| self.state.node(id))
    }

    /// The id of the next candidate in this eval's order.
    fn next_candidate_id(&mut self) -> Option<NodeId> {
        let n = self.candidates.len();
        let position = (self.start + self.visited_total % n * self.stride) % n;
        self.visited_total += 1;
        self.candidates.get(position)
    }

    fn count_existing_job_allocs(&mut self) {
        for alloc in self.state.allocs_by_job(&self.job.key()) {
            if !alloc.terminal() {
                self.count_job_alloc(alloc.node_id, &alloc.task_group, 1);
            }
        }
    }

    fn count_job_alloc(&mut self, node_id: NodeId, group: &Arc<str>, delta: i32) {
        let entry = self.job_allocs.entry((node_id, group.clone())).or_insert(0);
        *entry = entry.saturating_add_signed(delta);
        let total = self.job_allocs_on_node.entry(node_id).or_insert(0);
        *total = total.saturating_add_signed(delta);
        if let Some(preferences) = self.preferences.get_mut(group) {
            if let Some(node) = self.state.node(node_id) {
                preferences.count(&node, delta);
            }
        }
    }

    /// The number of candidate nodes (ready, eligible, in the job's datacenters).
    pub fn candidate_count(&self) -> usize {
        self.candidates.len()
    }

    /// Resources in use on a node: existing live allocations plus this plan's changes.
    pub fn used(&self, node_id: NodeId) -> Resources {
        self.usage.used(&*self.state, node_id)
    }

    /// Records that the plan places `alloc`.
    pub fn note_placed(&mut self, alloc: &Allocation) {
        self.usage.place(&*self.state, alloc);
        self.count_job_alloc(alloc.node_id, &alloc.task_group, 1);
    }

    /// Records that the plan stops (or evicts) `alloc`, a live allocation.
    pub fn note_stopped(&mut self, alloc: &Allocation) {
        if self.usage.remove(&*self.state, alloc) && *alloc.job_id == *self.job.id {
            self.count_job_alloc(alloc.node_id, &alloc.task_group, -1);
        }
    }

    /// The feasibility checker of a group (created on first use).
    pub fn checker(&mut self, group: &TaskGroup) -> &mut FeasibilityChecker {
        let job = &self.job;
        self.checkers.entry_ref(group.name.as_str()).or_insert_with(|| FeasibilityChecker::new(job, group))
    }

    /// Whether any group's constraints escaped class checking (or depend on placement).
    pub fn escaped(&self) -> bool {
        let distinct =
            |operand| matches!(operand, ConstraintOperand::DistinctHosts | ConstraintOperand::DistinctProperty);
        self.checkers.values().any(FeasibilityChecker::escaped)
            || self.job.constraints.iter().any(|c| distinct(c.operand))
            || self.job.task_groups.iter().flat_map(|g| &g.constraints).any(|c| distinct(c.operand))
    }

    /// Class eligibility merged over every group checked so far.
    pub fn class_eligibility(&self) -> std::collections::BTreeMap<crate::structs::ComputedClass, bool> {
        let mut merged = std::collections::BTreeMap::new();
        for checker in self.checkers.values() {
            for (class, eligible) in &checker.class_eligibility {
                let entry = merged.entry(*class).or_insert(false);
                *entry |= *eligible;
            }
        }
        merged
    }

    /// Picks the best node for one allocation of `group` (module docs, steps 1-6).
    /// Nodes claimed by other workers are passed over, unless no other node
    /// has room.
    pub fn select(
        &mut self,
        group: &TaskGroup,
        penalty: &HashSet<NodeId>,
        metrics: &mut AllocMetric,
    ) -> Option<Selection> {
        let ask = Ask {
            group,
            name: Arc::from(group.name.as_str()),
            resources: group.resources(),
            ports: PortAsk::of(group),
            distinct: DistinctRules::of(&self.job, group),
        };
        let mut passed_over = 0;
        let mut best = self.select_pass(&ask, penalty, metrics, true, &mut passed_over);
        if let (Some(selection), Some((claims, claimant))) = (&best, &self.claims) {
            if !claims.try_claim(selection.node.id, *claimant) {
                // Another worker claimed it between our check and our claim: look again.
                *metrics = AllocMetric::default();
                best = self.select_pass(&ask, penalty, metrics, true, &mut passed_over);
            }
        }
        if best.is_none() && passed_over > 0 {
            *metrics = AllocMetric::default();
            best = self.select_pass(&ask, penalty, metrics, false, &mut passed_over);
        }
        if best.is_none() && self.preemption {
            best = self.select_preempting(&ask);
        }
        if let (Some(selection), Some((claims, claimant))) = (&best, &self.claims) {
            claims.try_claim(selection.node.id, *claimant);
        }
        match best {
            Some(selection) => self.finish_selection(selection, &ask, metrics),
            None => {
                metrics.nodes_available = self.available_per_datacenter();
                None
            }
        }
    }

    /// Step 5: counts the evictions as gone and gives the ports.
    fn finish_selection(
        &mut self,
        mut selection: Selection,
        ask: &Ask<'_>,
        metrics: &mut AllocMetric,
    ) -> Option<Selection> {
        for evicted in &selection.preempted {
            self.note_stopped(evicted);
        }
        if let Some(ports) = &ask.ports {
            match self.usage.assign_ports(&*self.state, &selection.node, ports, &mut self.rng) {
                Some(given) => selection.ports = given,
                None => {
                    count_exhausted(metrics, &selection.node, super::usage::DYNAMIC_PORTS_EXHAUSTED);
                    return None;
                }
            }
        }
        Some(selection)
    }

    fn select_pass(
        &mut self,
        ask: &Ask<'_>,
        penalty: &HashSet<NodeId>,
        metrics: &mut AllocMetric,
        respect_claims: bool,
        passed_over: &mut usize,
    ) -> Option<Selection> {
        if !self.preferences.contains_key(&ask.name) {
            if let Some(preferences) = self.bucketed(ask.group) {
                self.preferences.insert(ask.name.clone(), preferences);
            }
        }
        match self.preferences.remove(&ask.name) {
            Some(mut preferences) => {
                let best = self.walk_buckets(&mut preferences, ask, penalty, metrics, respect_claims, passed_over);
                if best.is_none() {
                    merge_metrics(metrics, &preferences.prefiltered);
                }
                self.preferences.insert(ask.name.clone(), preferences);
                best
            }
            None => self.walk(ask, penalty, metrics, respect_claims, passed_over),
        }
    }

    /// The plain walk (step 3): up to `limit` scored nodes in this eval's order.
    fn walk(
        &mut self,
        ask: &Ask<'_>,
        penalty: &HashSet<NodeId>,
        metrics: &mut AllocMetric,
        respect_claims: bool,
        passed_over: &mut usize,
    ) -> Option<Selection> {
        // Nodes are read by reference from a handle on the state, so a
        // candidate costs no reference count; only the winner is kept.
        let state = self.state.clone();
        let mut best: Option<(f64, &Node)> = None;
        let (mut scored, mut visited) = (0, 0);
        while visited < self.candidates.len() && scored < self.limit {
            visited += 1;
            let Some(node) = self.next_candidate_id().and_then(|id| state.node_ref(id)) else { continue };
            if respect_claims && self.claimed_by_other(node) {
                *passed_over += 1;
                continue;
            }
            let Some(score) = self.consider(node, ask, (None, None), penalty, metrics) else { continue };
            scored += 1;
            if best.is_none_or(|(best, _)| score > best) {
                best = Some((score, node));
            }
        }
        best.and_then(|(score, node)| Selection::of(&*state, node.id, score))
    }

    /// The group's preferences with its buckets filled, or `None` if it
    /// has none: whole classes from the state's class index (the class
    /// checked on one of its nodes), or node by node when a preference reads
    /// a unique attribute. Classes that cannot run the group are counted
    /// for the metrics of a placement that fails.
    fn bucketed(&mut self, group: &TaskGroup) -> Option<Preferences> {
        let mut preferences = Preferences::of(&self.job, group)?;
        if preferences.per_node() {
            for _ in 0..self.candidates.len() {
                let Some(node) = self.next_candidate() else { continue };
                match self.checker(group).check(&node) {
                    Ok(()) => preferences.add_node(&node),
                    Err(filtered) => prefilter(&mut preferences.prefiltered, &node, 1, filtered.metric_key()),
                }
            }
        } else {
            for (_, ids) in self.state.class_nodes() {
                let Some(representative) = ids.get(0).and_then(|id| self.state.node(id)) else { continue };
                match self.checker(group).check_class_of(&representative) {
                    Ok(()) => preferences.add_class(&representative, ids.iter()),
                    Err(filtered) => {
                        prefilter(&mut preferences.prefiltered, &representative, ids.len(), filtered.metric_key())
                    }
                }
            }
        }
        preferences.shuffle(&mut self.rng);
        let group_name: Arc<str> = Arc::from(group.name.as_str());
        let live = self.job_allocs.iter().filter(|((_, name), count)| *name == group_name && **count > 0);
        for ((node_id, _), count) in live {
            if let Some(node) = self.state.node(*node_id) {
                preferences.count(&node, *count as i32);
            }
        }
        Some(preferences)
    }

    /// The bucketed walk (step 3): buckets of equal bound make a tier,
    /// walked in turn; the best tier with room is scored up to `limit`
    /// nodes, each next tier up to [`NEXT_TIER_BUDGET`] while it could still
    /// beat the best score so far, `limit` more in all.
    fn walk_buckets(
        &mut self,
        preferences: &mut Preferences,
        ask: &Ask<'_>,
        penalty: &HashSet<NodeId>,
        metrics: &mut AllocMetric,
        respect_claims: bool,
        passed_over: &mut usize,
    ) -> Option<Selection> {
        preferences.refresh();
        let mut best: Option<(f64, NodeId)> = None;
        let mut budget: Option<usize> = None; // Nodes left to score past the best tier.
        let mut tier_start = 0;
        while tier_start < preferences.order.len() {
            let tier_end = preferences.tier_end(tier_start);
            let bound = preferences.buckets[preferences.order[tier_start]].bound;
            if best.is_some_and(|(best, _)| best >= bound) || budget == Some(0) {
                break;
            }
            let allowed = budget.map_or(self.limit, |left| left.min(NEXT_TIER_BUDGET));
            let tier = &preferences.order[tier_start..tier_end];
            let scored = self.walk_tier(
                &mut preferences.buckets,
                tier,
                allowed,
                ask,
                penalty,
                metrics,
                respect_claims,
                passed_over,
                &mut best,
            );
            // The first tier with room is the best one; the budget for the next starts after it.
            budget = match budget {
                None if scored == 0 => None,
                None => Some(self.limit),
                Some(left) => Some(left - scored),
            };
            tier_start = tier_end;
        }
        best.and_then(|(score, id)| Selection::of(&*self.state, id, score))
    }

    /// Scores up to `allowed` nodes with room from the buckets of one tier,
    /// taking them in turn; marks a bucket exhausted when a whole round of it
    /// found no room. Returns how many were scored.
    #[allow(clippy::too_many_arguments)]
    fn walk_tier(
        &mut self,
        buckets: &mut [Bucket],
        tier: &[usize],
        allowed: usize,
        ask: &Ask<'_>,
        penalty: &HashSet<NodeId>,
        metrics: &mut AllocMetric,
        respect_claims: bool,
        passed_over: &mut usize,
        best: &mut Option<(f64, NodeId)>,
    ) -> usize {
        let state = self.state.clone();
        // Per bucket of the tier: nodes visited, scored and passed over in this walk.
        let mut walked: SmallVec<[(usize, usize, usize); 8]> = tier.iter().map(|_| (0, 0, 0)).collect();
        let mut scored = 0;
        let mut open =
            tier.iter().filter(|index| !buckets[**index].exhausted && !buckets[**index].nodes.is_empty()).count();
        let mut turn = 0;
        while scored < allowed && open > 0 {
            let (slot, index) = (turn % tier.len(), tier[turn % tier.len()]);
            turn += 1;
            let bucket = &mut buckets[index];
            if bucket.exhausted || walked[slot].0 == bucket.nodes.len() {
                continue;
            }
            let id = bucket.next_node();
            walked[slot].0 += 1;
            let done = walked[slot].0 == bucket.nodes.len();
            let bonus = (bucket.affinity, bucket.spread);
            if let Some(node) = state.node_ref(id).filter(|node| node.is_schedulable()) {
                if respect_claims && self.claimed_by_other(node) {
                    walked[slot].2 += 1;
                } else if let Some(score) = self.consider(node, ask, bonus, penalty, metrics) {
                    walked[slot].1 += 1;
                    scored += 1;
                    if best.is_none_or(|(best, _)| score > best) {
                        *best = Some((score, node.id));
                    }
                }
            }
            if done {
                open -= 1;
                let (_, bucket_scored, bucket_passed) = walked[slot];
                buckets[index].exhausted = bucket_scored == 0 && bucket_passed == 0;
            }
        }
        *passed_over += walked.iter().map(|(_, _, passed)| passed).sum::<usize>();
        scored
    }

    fn claimed_by_other(&self, node: &Node) -> bool {
        let snapshot_index = self.state.index();
        self.claims.as_ref().is_some_and(|(claims, me)| claims.claimed_by_other(node.id, *me, snapshot_index))
    }

    /// Step 2 for one candidate, and its score (with the preference bonus
    /// of its bucket) if it passes.
    fn consider(
        &mut self,
        node: &Node,
        ask: &Ask<'_>,
        (affinity, spread): (Option<f64>, Option<f64>),
        penalty: &HashSet<NodeId>,
        metrics: &mut AllocMetric,
    ) -> Option<f64> {
        metrics.nodes_evaluated += 1;
        if let Err(filtered) = self.checker(ask.group).check(node) {
            count_filtered(metrics, node, filtered.metric_key());
            return None;
        }
        if let Some(rule) = self.distinct_violation(&ask.distinct, node, &ask.name) {
            count_filtered(metrics, node, rule);
            return None;
        }
        let after = self.used(node.id).plus(ask.resources);
        if let Some(dimension) = node.allocatable().exhausted_dimension(after) {
            count_exhausted(metrics, node, dimension);
            return None;
        }
        if let Some(ports) = &ask.ports {
            if let Err(refused) = self.usage.ports_fit(&*self.state, node, ports) {
                count_exhausted(metrics, node, &refused.to_string());
                return None;
            }
        }
        let collisions = self.job_allocs.get(&(node.id, ask.name.clone())).copied().unwrap_or(0);
        let score = Score {
            fit: fit_score(self.algorithm, node.allocatable(), after),
            anti_affinity: anti_affinity_score(collisions, ask.group.count),
            penalized: penalty.contains(&node.id),
            affinity,
            spread,
        };
        Some(score.combined())
    }

    /// Step 4: the cheapest eviction among the first `limit` candidates
    /// where one makes room; ties go to the first found.
    fn select_preempting(&mut self, ask: &Ask<'_>) -> Option<Selection> {
        let mut best: Option<(Arc<Node>, Preemption)> = None;
        let mut found = 0;
        for _ in 0..self.candidates.len() {
            let Some(node) = self.next_candidate() else { continue };
            if self.checker(ask.group).check(&node).is_err()
                || self.distinct_violation(&ask.distinct, &node, &ask.name).is_some()
            {
                continue;
            }
            let state = &*self.state;
            let Some(option) =
                preemption_for(state, &self.usage, &node, ask.resources, ask.ports.as_ref(), self.job.priority)
            else {
                continue;
            };
            if best.as_ref().is_none_or(|(_, cheapest)| option.cheaper_than(cheapest)) {
                best = Some((node, option));
            }
            found += 1;
            if found == self.limit {
                break;
            }
        }
        best.map(|(node, option)| Selection { node, score: 0.0, ports: Vec::new(), preempted: option.allocs })
    }

    /// Schedulable nodes per datacenter, for the metrics of a failed placement.
    fn available_per_datacenter(&self) -> std::collections::BTreeMap<String, u64> {
        let mut available = std::collections::BTreeMap::new();
        for node in self.candidates.iter().filter_map(|id| self.state.node(id)) {
            *available.entry(node.datacenter.to_string()).or_insert(0) += 1;
        }
        available
    }

    fn distinct_violation(&self, rules: &DistinctRules, node: &Node, group: &Arc<str>) -> Option<String> {
        if rules.hosts_job && self.job_allocs_on_node.get(&node.id).copied().unwrap_or(0) > 0 {
            return Some("distinct_hosts".to_string());
        }
        if rules.hosts_group && self.job_allocs.get(&(node.id, group.clone())).copied().unwrap_or(0) > 0 {
            return Some("distinct_hosts".to_string());
        }
        for (target, limit, group_only) in &rules.properties {
            // A node without the property cannot be counted against the limit, so it is not used (as in Nomad).
            let Some(value) = resolve_target(target, node) else {
                return Some(format!("distinct_property {target}: missing property"));
            };
            let count = self.property_count(target, &value, group_only.then_some(group));
            if count >= *limit {
                return Some(format!("distinct_property {target}"));
            }
        }
        None
    }

    /// Live allocations of the job (or one group) on nodes whose `target` is `value`.
    fn property_count(&self, target: &str, value: &str, group: Option<&Arc<str>>) -> u32 {
        self.job_allocs
            .iter()
            .filter(|((_, alloc_group), count)| **count > 0 && group.is_none_or(|group| group == alloc_group))
            .filter(|((node_id, _), _)| {
                self.state.node(*node_id).and_then(|node| resolve_target(target, &node)).as_deref() == Some(value)
            })
            .map(|(_, count)| *count)
            .sum()
    }
}

fn count_filtered(metrics: &mut AllocMetric, node: &Node, reason: String) {
    metrics.nodes_filtered += 1;
    *metrics.class_filtered.entry(node.node_class.to_string()).or_insert(0) += 1;
    *metrics.constraint_filtered.entry(reason).or_insert(0) += 1;
}

/// Counts `nodes` nodes like `node` as evaluated and filtered for `reason`.
fn prefilter(metrics: &mut AllocMetric, node: &Node, nodes: usize, reason: String) {
    metrics.nodes_evaluated += nodes as u64;
    metrics.nodes_filtered += nodes as u64;
    *metrics.class_filtered.entry(node.node_class.to_string()).or_insert(0) += nodes as u64;
    *metrics.constraint_filtered.entry(reason).or_insert(0) += nodes as u64;
}

fn count_exhausted(metrics: &mut AllocMetric, node: &Node, dimension: &str) {
    metrics.nodes_exhausted += 1;
    *metrics.class_exhausted.entry(node.node_class.to_string()).or_insert(0) += 1;
    *metrics.dimension_exhausted.entry(dimension.to_string()).or_insert(0) += 1;
}

/// Adds the counts of `from` to `into`.
fn merge_metrics(into: &mut AllocMetric, from: &AllocMetric) {
    into.nodes_evaluated += from.nodes_evaluated;
    into.nodes_filtered += from.nodes_filtered;
    into.nodes_exhausted += from.nodes_exhausted;
    let maps = [
        (&mut into.class_filtered, &from.class_filtered),
        (&mut into.constraint_filtered, &from.constraint_filtered),
        (&mut into.class_exhausted, &from.class_exhausted),
        (&mut into.dimension_exhausted, &from.dimension_exhausted),
    ];
    for (into, from) in maps {
        for (key, count) in from {
            *into.entry(key.clone()).or_insert(0) += count;
        }
    }
}

/// The placement-dependent constraints of a job and group.
struct DistinctRules {
    hosts_job: bool,
    hosts_group: bool,
    /// (target, limit per value, whether it counts only this group)
    properties: Vec<(String, u32, bool)>,
}

impl DistinctRules {
    fn of(job: &Job, group: &TaskGroup) -> Self {
        let hosts = |constraints: &[crate::structs::Constraint]| {
            constraints.iter().any(|c| c.operand == ConstraintOperand::DistinctHosts)
        };
        let properties = |constraints: &[crate::structs::Constraint], group_only: bool| {
            constraints
                .iter()
                .filter(|c| c.operand == ConstraintOperand::DistinctProperty)
                .map(|c| (c.l_target.clone(), c.r_target.parse().unwrap_or(1).max(1), group_only))
                .collect::<Vec<_>>()
        };
        DistinctRules {
            hosts_job: hosts(&job.constraints),
            hosts_group: hosts(&group.constraints),
            properties: properties(&job.constraints, false)
                .into_iter()
                .chain(properties(&group.constraints, true))
                .collect(),
        }
    }
}
