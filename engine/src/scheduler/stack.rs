//! The placement stack: picks a node for one allocation of a task group.
//!
//! 1. Candidates are the ready, eligible nodes (a sorted list the state
//!    keeps), visited in a permutation drawn from a seed mixed from the eval
//!    id, so parallel workers start in different places; the walk carries on
//!    from one placement to the next.
//! 2. Each candidate is checked for feasibility (cached per computed class),
//!    for `distinct_hosts` / `distinct_property`, then for room: its
//!    allocatable resources against existing allocations plus what this plan
//!    already placed or stopped there. Nothing is ever oversubscribed within
//!    a plan.
//! 3. Up to `limit` nodes that pass are scored ([`super::rank`]); the best wins.
//! 4. Every filtered or exhausted node is counted in the placement metrics.

use std::sync::Arc;

use hashbrown::{HashMap, HashSet};
use rand::{Rng, SeedableRng};

use super::feasible::{resolve_target, FeasibilityChecker};
use super::rank::{anti_affinity_score, combine, fit_score};
use super::{Algorithm, NodeClaims, State};
use crate::state::NodeList;
use crate::structs::{AllocMetric, Allocation, ConstraintOperand, Job, Node, NodeId, Resources, TaskGroup};

/// How many feasible nodes with room to score per placement: ceil(log2(n))
/// with a floor of 2, as Nomad does for services. Scoring is cheap here (a
/// fit check against cached usage), so batch jobs get the same limit rather
/// than Nomad's 2.
pub fn score_limit(n_nodes: usize) -> usize {
    let log2 = usize::BITS - n_nodes.saturating_sub(1).leading_zeros();
    (log2 as usize).max(2)
}

/// A selected node and its score.
#[derive(Clone, Debug)]
pub struct Selection {
    /// The node.
    pub node: Arc<Node>,
    /// Its final score.
    pub score: f64,
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
    usage: HashMap<NodeId, Resources>,
    /// Live allocations of this job per node and group (existing minus
    /// stopped, plus placed by this plan).
    job_allocs: HashMap<(NodeId, Arc<str>), u32>,
    job_allocs_on_node: HashMap<NodeId, u32>,
    checkers: HashMap<Arc<str>, FeasibilityChecker>,
    claims: Option<(Arc<dyn NodeClaims>, u64)>,
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack").field("candidates", &self.candidates.len()).field("limit", &self.limit).finish()
    }
}

fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Stack {
    /// A stack for `job` over the nodes of `state`, in an order drawn from `seed`.
    pub fn new(state: Arc<dyn State>, job: Arc<Job>, algorithm: Algorithm, seed: u64) -> Self {
        let candidates = state.schedulable_nodes();
        let n = candidates.len().max(1);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let start = rng.random_range(0..n);
        let mut stride = rng.random_range(1..n.max(2)).min(n);
        while n > 1 && gcd(stride, n) != 1 {
            stride = stride % (n - 1) + 1;
        }
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
            usage: HashMap::new(),
            job_allocs: HashMap::new(),
            job_allocs_on_node: HashMap::new(),
            checkers: HashMap::new(),
            claims: None,
        };
        stack.count_existing_job_allocs();
        stack
    }

    /// Shares node claims with other workers ([`NodeClaims`]).
    pub fn with_claims(mut self, claims: Option<(Arc<dyn NodeClaims>, u64)>) -> Self {
        self.claims = claims;
        self
    }

    /// The next candidate in this eval's order.
    fn next_candidate(&mut self) -> Option<Arc<Node>> {
        let n = self.candidates.len();
        let position = (self.start + self.visited_total % n * self.stride) % n;
        self.visited_total += 1;
        self.candidates.get(position).and_then(|id| self.state.node(id))
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
    }

    /// The number of candidate nodes (ready, eligible, in the job's datacenters).
    pub fn candidate_count(&self) -> usize {
        self.candidates.len()
    }

    /// Resources in use on a node: existing live allocations plus this plan's changes.
    pub fn used(&mut self, node_id: NodeId) -> Resources {
        if let Some(used) = self.usage.get(&node_id) {
            return *used;
        }
        let used = self.state.node_usage(node_id);
        self.usage.insert(node_id, used);
        used
    }

    /// Records that the plan places `alloc`.
    pub fn note_placed(&mut self, alloc: &Allocation) {
        let used = self.used(alloc.node_id).plus(alloc.resources);
        self.usage.insert(alloc.node_id, used);
        self.count_job_alloc(alloc.node_id, &alloc.task_group, 1);
    }

    /// Records that the plan stops `alloc` (a live allocation).
    pub fn note_stopped(&mut self, alloc: &Allocation) {
        let used = self.used(alloc.node_id).minus(alloc.resources);
        self.usage.insert(alloc.node_id, used);
        if *alloc.job_id == *self.job.id {
            self.count_job_alloc(alloc.node_id, &alloc.task_group, -1);
        }
    }

    /// The feasibility checker of a group (created on first use).
    pub fn checker(&mut self, group: &TaskGroup) -> &mut FeasibilityChecker {
        let job = &self.job;
        self.checkers.entry(Arc::from(group.name.as_str())).or_insert_with(|| FeasibilityChecker::new(job, group))
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

    /// Picks the best node for one allocation of `group` (module docs, steps 1-4).
    /// Nodes claimed by other workers are passed over, unless no other node
    /// has room.
    pub fn select(
        &mut self,
        group: &TaskGroup,
        penalty: &HashSet<NodeId>,
        metrics: &mut AllocMetric,
    ) -> Option<Selection> {
        let mut passed_over = 0;
        let mut best = self.select_pass(group, penalty, metrics, true, &mut passed_over);
        if let (Some(selection), Some((claims, claimant))) = (&best, &self.claims) {
            if !claims.try_claim(selection.node.id, *claimant) {
                // Another worker claimed it between our check and our claim: look again.
                *metrics = AllocMetric::default();
                best = self.select_pass(group, penalty, metrics, true, &mut passed_over);
            }
        }
        if best.is_none() && passed_over > 0 {
            *metrics = AllocMetric::default();
            best = self.select_pass(group, penalty, metrics, false, &mut passed_over);
        }
        if let (Some(selection), Some((claims, claimant))) = (&best, &self.claims) {
            claims.try_claim(selection.node.id, *claimant);
        }
        if best.is_none() {
            metrics.nodes_available = self.available_per_datacenter();
        }
        best
    }

    fn select_pass(
        &mut self,
        group: &TaskGroup,
        penalty: &HashSet<NodeId>,
        metrics: &mut AllocMetric,
        respect_claims: bool,
        passed_over: &mut usize,
    ) -> Option<Selection> {
        let ask = group.resources();
        let group_name: Arc<str> = Arc::from(group.name.as_str());
        let distinct = DistinctRules::of(&self.job, group);
        let mut best: Option<Selection> = None;
        let (mut scored, mut visited) = (0, 0);
        while visited < self.candidates.len() && scored < self.limit {
            visited += 1;
            let Some(node) = self.next_candidate() else { continue };
            let snapshot_index = self.state.index();
            let claimed =
                |(claims, me): &(Arc<dyn NodeClaims>, u64)| claims.claimed_by_other(node.id, *me, snapshot_index);
            if respect_claims && self.claims.as_ref().is_some_and(claimed) {
                *passed_over += 1;
                continue;
            }
            metrics.nodes_evaluated += 1;
            if let Err(filtered) = self.checker(group).check(&node) {
                count_filtered(metrics, &node, filtered.metric_key());
                continue;
            }
            if let Some(rule) = self.distinct_violation(&distinct, &node, &group_name) {
                count_filtered(metrics, &node, rule);
                continue;
            }
            let after = self.used(node.id).plus(ask);
            if let Some(dimension) = node.allocatable().exhausted_dimension(after) {
                metrics.nodes_exhausted += 1;
                *metrics.class_exhausted.entry(node.node_class.to_string()).or_insert(0) += 1;
                *metrics.dimension_exhausted.entry(dimension.to_string()).or_insert(0) += 1;
                continue;
            }
            let collisions = self.job_allocs.get(&(node.id, group_name.clone())).copied().unwrap_or(0);
            let score = combine(
                fit_score(self.algorithm, node.allocatable(), after),
                anti_affinity_score(collisions, group.count),
                penalty.contains(&node.id),
            );
            scored += 1;
            if best.as_ref().is_none_or(|best| score > best.score) {
                best = Some(Selection { node, score });
            }
        }
        best
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
