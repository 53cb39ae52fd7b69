//! Drover's addition to a plan's failed placements: for a task group that
//! could not place everything, each computed node class whose nodes were
//! filtered or had no room, why, how many nodes, and a few of them.
//!
//! Nomad's `AllocMetric` counts filtered nodes per user-given node class
//! and per constraint separately, so it cannot say which constraint ruled
//! out which class. This account is computed after the dry run, off the
//! scheduler's path (a plan pays for it, a worker never does), by checking
//! every node of every class with the scheduler's own
//! [`FeasibilityChecker`] and, for the nodes that pass, the room the dry
//! run's plan leaves them:
//! 1. A node that fails a check is counted under that check's reason
//!    (`Filtered::metric_key`: the constraint, driver, datacenter, host
//!    network, or "node not ready or ineligible").
//! 2. A node that passes but cannot fit the group's resources next to its
//!    live allocations, plus the plan's placements and minus its stops and
//!    evictions there, is counted as exhausted on that dimension.
//! 3. Nodes that pass both are not listed: what kept the group off them
//!    depends on the placement (`distinct_hosts`, `distinct_property`,
//!    ports), which the Nomad metric's `ConstraintFiltered` and
//!    `DimensionExhausted` name.

use std::collections::BTreeMap;

use crate::scheduler::feasible::FeasibilityChecker;
use crate::scheduler::State;
use crate::structs::{ComputedClass, Job, Node, NodeId, Plan, Resources, TaskGroup};

/// How many nodes of a class an entry names.
pub const MAX_EXAMPLES: usize = 3;

/// The nodes of one computed class kept out for one reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FilteredClass {
    /// The computed class.
    pub computed_class: ComputedClass,
    /// The node class its nodes were given (`""` when none).
    pub node_class: String,
    /// Why: a check's reason, or the exhausted resource dimension.
    pub reason: String,
    /// Whether the nodes were feasible but had no room (else filtered).
    pub exhausted: bool,
    /// How many nodes of the class.
    pub nodes: u64,
    /// Up to [`MAX_EXAMPLES`] of them: id and name.
    pub examples: Vec<(NodeId, String)>,
}

/// The classes that kept `group` of `job` off their nodes in `state`,
/// `plan` applied; see the module docs. Ordered by class, then reason.
pub fn filtered_classes(state: &dyn State, job: &Job, group: &TaskGroup, plan: Option<&Plan>) -> Vec<FilteredClass> {
    let mut checker = FeasibilityChecker::new(job, group);
    let ask = group.resources();
    let mut found: BTreeMap<(ComputedClass, String, bool), FilteredClass> = BTreeMap::new();
    for (class, nodes) in state.class_nodes() {
        for node in nodes.iter().filter_map(|id| state.node_ref(id)) {
            let (reason, exhausted) = match checker.check(node) {
                Err(filtered) => (filtered.metric_key(), false),
                Ok(()) => match exhausted_dimension(state, node, ask, plan) {
                    Some(dimension) => (dimension.to_string(), true),
                    None => continue,
                },
            };
            let entry = found.entry((class, reason.clone(), exhausted)).or_insert_with(|| FilteredClass {
                computed_class: class,
                node_class: node.node_class.to_string(),
                reason,
                exhausted,
                nodes: 0,
                examples: Vec::new(),
            });
            entry.nodes += 1;
            if entry.examples.len() < MAX_EXAMPLES {
                entry.examples.push((node.id, node.name.clone()));
            }
        }
    }
    found.into_values().collect()
}

/// The dimension `node` lacks for `ask` once `plan` is applied there.
fn exhausted_dimension(state: &dyn State, node: &Node, ask: Resources, plan: Option<&Plan>) -> Option<&'static str> {
    let mut used = state.node_usage(node.id);
    if let Some(plan) = plan {
        let on_node: Vec<_> = state.allocs_by_node(node.id);
        let live_here = |id| on_node.iter().any(|alloc| alloc.id == id && !alloc.terminal());
        for placed in plan.node_allocation.get(&node.id).into_iter().flatten() {
            if !live_here(placed.id) {
                used = used.plus(placed.resources);
            }
        }
        let freed = plan.node_update.get(&node.id).into_iter().chain(plan.node_preemptions.get(&node.id)).flatten();
        for stopped in freed.filter(|alloc| live_here(alloc.id)) {
            used = used.minus(stopped.resources);
        }
    }
    node.allocatable().exhausted_dimension(used.plus(ask))
}
