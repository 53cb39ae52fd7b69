//! Feasibility: can a node run a task group at all, regardless of room?
//!
//! Checks: the node is ready and eligible, in one of the job's datacenters,
//! has every task's driver, meets every job, group and task constraint, and
//! has every host network the group's ports name. Everything but `unique.`
//! attributes is the same for all nodes of one computed class, so those
//! checks run once per class and are cached; the constraints that read
//! unique attributes, and host networks (the node's network is not part of
//! its class), *escape* the cache and run per node. `distinct_hosts` and `distinct_property` depend on where the job's
//! allocations are, so the stack checks them with its placement context.

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::sync::Arc;

use hashbrown::HashMap;
use regex::Regex;

use crate::structs::{
    set_contains, version_matches, ComputedClass, Constraint, ConstraintOperand, Job, Node, TaskGroup,
};

/// Why a node was filtered, for placement metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Filtered {
    /// Not ready or not eligible.
    NotSchedulable,
    /// Outside the job's datacenters.
    Datacenter,
    /// Missing a task driver.
    MissingDriver(String),
    /// A constraint was not met; the text names it.
    Constraint(String),
    /// A port names a host network the node does not have.
    MissingHostNetwork {
        /// The host network's name.
        network: Arc<str>,
        /// The port's label.
        label: Arc<str>,
    },
}

impl Filtered {
    /// The key this reason is counted under in `constraint_filtered`.
    pub fn metric_key(&self) -> String {
        match self {
            Filtered::NotSchedulable => "node not ready or ineligible".to_string(),
            Filtered::Datacenter => "missing compatible datacenter".to_string(),
            Filtered::MissingDriver(driver) => format!("missing driver \"{driver}\""),
            Filtered::Constraint(text) => text.clone(),
            Filtered::MissingHostNetwork { network, label } => {
                format!("missing host network \"{network}\" for port \"{label}\"")
            }
        }
    }
}

/// A constraint (or an affinity's condition) prepared for repeated checks,
/// its regular expression compiled once.
#[derive(Debug)]
pub(super) struct Prepared {
    constraint: Constraint,
    text: String,
    regex: Option<Regex>,
}

impl Prepared {
    pub(super) fn new(constraint: &Constraint) -> Self {
        let regex = (constraint.operand == ConstraintOperand::Regexp).then(|| Regex::new(&constraint.r_target).ok());
        Prepared {
            text: format!("{} {} {}", constraint.l_target, operand_text(constraint.operand), constraint.r_target)
                .trim()
                .to_string(),
            regex: regex.flatten(),
            constraint: constraint.clone(),
        }
    }

    /// Whether either side reads a `unique.` attribute, which the computed
    /// class does not cover.
    pub(super) fn reads_unique(&self) -> bool {
        is_unique_target(&self.constraint.l_target) || is_unique_target(&self.constraint.r_target)
    }

    pub(super) fn holds(&self, node: &Node) -> bool {
        let left = resolve_target(&self.constraint.l_target, node);
        let right = &self.constraint.r_target;
        match self.constraint.operand {
            ConstraintOperand::Equal => left.as_deref() == Some(right.as_str()),
            ConstraintOperand::NotEqual => left.as_deref() != Some(right.as_str()),
            ConstraintOperand::Less => left.is_some_and(|left| compare(&left, right) == Ordering::Less),
            ConstraintOperand::LessOrEqual => left.is_some_and(|left| compare(&left, right) != Ordering::Greater),
            ConstraintOperand::Greater => left.is_some_and(|left| compare(&left, right) == Ordering::Greater),
            ConstraintOperand::GreaterOrEqual => left.is_some_and(|left| compare(&left, right) != Ordering::Less),
            ConstraintOperand::Regexp => {
                left.zip(self.regex.as_ref()).is_some_and(|(left, regex)| regex.is_match(&left))
            }
            ConstraintOperand::Version => left.is_some_and(|left| version_matches(&left, right)),
            ConstraintOperand::IsSet => left.is_some(),
            ConstraintOperand::IsNotSet => left.is_none(),
            ConstraintOperand::SetContains | ConstraintOperand::SetContainsAll => {
                left.is_some_and(|left| set_contains(&left, right, true))
            }
            ConstraintOperand::SetContainsAny => left.is_some_and(|left| set_contains(&left, right, false)),
            // Placement-dependent: checked by the stack.
            ConstraintOperand::DistinctHosts | ConstraintOperand::DistinctProperty => true,
        }
    }
}

fn operand_text(operand: ConstraintOperand) -> &'static str {
    match operand {
        ConstraintOperand::Equal => "=",
        ConstraintOperand::NotEqual => "!=",
        ConstraintOperand::Less => "<",
        ConstraintOperand::LessOrEqual => "<=",
        ConstraintOperand::Greater => ">",
        ConstraintOperand::GreaterOrEqual => ">=",
        ConstraintOperand::Regexp => "regexp",
        ConstraintOperand::Version => "version",
        ConstraintOperand::IsSet => "is_set",
        ConstraintOperand::IsNotSet => "is_not_set",
        ConstraintOperand::DistinctHosts => "distinct_hosts",
        ConstraintOperand::DistinctProperty => "distinct_property",
        ConstraintOperand::SetContains => "set_contains",
        ConstraintOperand::SetContainsAny => "set_contains_any",
        ConstraintOperand::SetContainsAll => "set_contains_all",
    }
}

/// Resolves `${attr.X}`, `${meta.X}`, `${node.datacenter}`, `${node.class}`,
/// `${node.unique.id}`, `${node.unique.name}`; anything else is a literal.
pub fn resolve_target(target: &str, node: &Node) -> Option<String> {
    let Some(inner) = target.strip_prefix("${").and_then(|rest| rest.strip_suffix('}')) else {
        return Some(target.to_string());
    };
    if let Some(key) = inner.strip_prefix("attr.") {
        return node.attributes.get(key).cloned();
    }
    if let Some(key) = inner.strip_prefix("meta.") {
        return node.meta.get(key).cloned();
    }
    match inner {
        "node.datacenter" => Some(node.datacenter.to_string()),
        "node.class" => Some(node.node_class.to_string()),
        "node.unique.id" => Some(node.id.to_string()),
        "node.unique.name" => Some(node.name.clone()),
        _ => None,
    }
}

/// Whether a target reads something unique to a node, so class caching cannot decide it.
pub(super) fn is_unique_target(target: &str) -> bool {
    target.contains("unique.")
}

/// Compares numerically when both sides are numbers, else lexically.
fn compare(left: &str, right: &str) -> Ordering {
    match (left.parse::<f64>(), right.parse::<f64>()) {
        (Ok(left), Ok(right)) => left.partial_cmp(&right).unwrap_or(Ordering::Equal),
        _ => left.cmp(right),
    }
}

/// Checks nodes for one task group of one job, caching by computed class.
#[derive(Debug)]
pub struct FeasibilityChecker {
    datacenters: BTreeSet<String>,
    drivers: Vec<String>,
    by_class: Vec<Prepared>,
    escaped: Vec<Prepared>,
    /// The group's ports that name a host network: (network, label).
    host_networks: Vec<(Arc<str>, Arc<str>)>,
    cache: HashMap<ComputedClass, Result<(), Filtered>>,
    /// Per computed class seen: whether it was feasible (for blocked evals).
    pub class_eligibility: HashMap<ComputedClass, bool>,
}

impl FeasibilityChecker {
    /// A checker for `group` of `job`.
    pub fn new(job: &Job, group: &TaskGroup) -> Self {
        let constraints = job
            .constraints
            .iter()
            .chain(&group.constraints)
            .chain(group.tasks.iter().flat_map(|task| &task.constraints))
            .filter(|constraint| {
                !matches!(constraint.operand, ConstraintOperand::DistinctHosts | ConstraintOperand::DistinctProperty)
            });
        let (escaped, by_class): (Vec<_>, Vec<_>) = constraints.map(Prepared::new).partition(Prepared::reads_unique);
        let mut drivers: Vec<String> = group.tasks.iter().map(|task| task.driver.clone()).collect();
        drivers.sort();
        drivers.dedup();
        let host_networks = group
            .networks
            .iter()
            .flat_map(|network| network.reserved_ports.iter().chain(&network.dynamic_ports))
            .filter_map(|port| Some((port.host_network.clone()?, port.label.clone())))
            .collect();
        FeasibilityChecker {
            datacenters: job.datacenters.iter().cloned().collect(),
            drivers,
            by_class,
            escaped,
            host_networks,
            cache: HashMap::new(),
            class_eligibility: HashMap::new(),
        }
    }

    /// Whether some checks run per node (constraints on unique
    /// attributes, host networks), so a blocked eval of the group cannot
    /// wait on computed classes alone.
    pub fn escaped(&self) -> bool {
        !self.escaped.is_empty() || !self.host_networks.is_empty()
    }

    /// Checks one node.
    pub fn check(&mut self, node: &Node) -> Result<(), Filtered> {
        if !node.is_schedulable() {
            return Err(Filtered::NotSchedulable);
        }
        let class_result = match self.cache.get(&node.computed_class) {
            Some(result) => result.clone(),
            None => {
                let result = self.check_class(node);
                self.class_eligibility.insert(node.computed_class, result.is_ok());
                self.cache.insert(node.computed_class, result.clone());
                result
            }
        };
        class_result?;
        self.check_node(node)
    }

    /// The per-node part of a check: constraints on unique attributes,
    /// then host networks.
    fn check_node(&self, node: &Node) -> Result<(), Filtered> {
        if let Some(failed) = self.escaped.iter().find(|prepared| !prepared.holds(node)) {
            return Err(Filtered::Constraint(failed.text.clone()));
        }
        match self.host_networks.iter().find(|(network, _)| node.network.address_for(Some(network)).is_none()) {
            Some((network, label)) => {
                Err(Filtered::MissingHostNetwork { network: network.clone(), label: label.clone() })
            }
            None => Ok(()),
        }
    }

    /// Checks one node against a class result already cached (by [`Self::check`]
    /// on a node of its class); usable from many threads at once.
    pub fn check_cached(&self, node: &Node) -> Option<Result<(), Filtered>> {
        if !node.is_schedulable() {
            return Some(Err(Filtered::NotSchedulable));
        }
        let class_result = self.cache.get(&node.computed_class)?.clone();
        Some(class_result.and_then(|()| self.check_node(node)))
    }

    /// The class part of [`Self::check`] alone (cached): whether nodes of
    /// `node`'s class can run the group, leaving out its status and the
    /// constraints that read unique attributes.
    pub fn check_class_of(&mut self, node: &Node) -> Result<(), Filtered> {
        if let Some(result) = self.cache.get(&node.computed_class) {
            return result.clone();
        }
        let result = self.check_class(node);
        self.class_eligibility.insert(node.computed_class, result.is_ok());
        self.cache.insert(node.computed_class, result.clone());
        result
    }

    /// Fills the class cache from one node of each class in `nodes`.
    pub fn warm(&mut self, nodes: &[Arc<Node>]) {
        for node in nodes {
            if node.is_schedulable() && !self.cache.contains_key(&node.computed_class) {
                let result = self.check_class(node);
                self.class_eligibility.insert(node.computed_class, result.is_ok());
                self.cache.insert(node.computed_class, result);
            }
        }
    }

    fn check_class(&self, node: &Node) -> Result<(), Filtered> {
        if !self.datacenters.contains(&*node.datacenter) {
            return Err(Filtered::Datacenter);
        }
        if let Some(driver) = self.drivers.iter().find(|driver| !node.has_driver(driver)) {
            return Err(Filtered::MissingDriver(driver.clone()));
        }
        match self.by_class.iter().find(|prepared| !prepared.holds(node)) {
            Some(failed) => Err(Filtered::Constraint(failed.text.clone())),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
#[path = "feasible_test.rs"]
mod feasible_test;
