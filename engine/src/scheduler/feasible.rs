//! Feasibility: can a node run a task group at all, regardless of room?
//!
//! Checks: the node is ready and eligible, in one of the job's datacenters,
//! has every task's driver, and meets every job, group and task constraint.
//! Everything but `unique.` attributes is the same for all nodes of one
//! computed class, so those checks run once per class and are cached; the
//! constraints that read unique attributes *escape* the cache and run per
//! node. `distinct_hosts` and `distinct_property` depend on where the job's
//! allocations are, so the stack checks them with its placement context.

use std::cmp::Ordering;
use std::collections::BTreeSet;

use hashbrown::HashMap;
use regex::Regex;

use crate::structs::{ComputedClass, Constraint, ConstraintOperand, Job, Node, TaskGroup};

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
}

impl Filtered {
    /// The key this reason is counted under in `constraint_filtered`.
    pub fn metric_key(&self) -> String {
        match self {
            Filtered::NotSchedulable => "node not ready or ineligible".to_string(),
            Filtered::Datacenter => "missing compatible datacenter".to_string(),
            Filtered::MissingDriver(driver) => format!("missing driver \"{driver}\""),
            Filtered::Constraint(text) => text.clone(),
        }
    }
}

/// A constraint prepared for repeated checks (its regular expression compiled once).
#[derive(Debug)]
struct Prepared {
    constraint: Constraint,
    text: String,
    regex: Option<Regex>,
}

impl Prepared {
    fn new(constraint: &Constraint) -> Self {
        let regex = (constraint.operand == ConstraintOperand::Regexp).then(|| Regex::new(&constraint.r_target).ok());
        Prepared {
            text: format!("{} {} {}", constraint.l_target, operand_text(constraint.operand), constraint.r_target)
                .trim()
                .to_string(),
            regex: regex.flatten(),
            constraint: constraint.clone(),
        }
    }

    fn holds(&self, node: &Node) -> bool {
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
fn is_unique_target(target: &str) -> bool {
    target.contains("unique.")
}

/// Compares numerically when both sides are numbers, else lexically.
fn compare(left: &str, right: &str) -> Ordering {
    match (left.parse::<f64>(), right.parse::<f64>()) {
        (Ok(left), Ok(right)) => left.partial_cmp(&right).unwrap_or(Ordering::Equal),
        _ => left.cmp(right),
    }
}

/// A version: numeric segments, optionally with a pre-release after `-`.
#[derive(Debug, PartialEq, Eq)]
struct Version {
    segments: Vec<u64>,
    prerelease: Option<String>,
}

impl Version {
    fn parse(text: &str) -> Option<Version> {
        let text = text.trim().trim_start_matches('v');
        let (core, prerelease) = match text.split_once('-') {
            Some((core, pre)) => (core, Some(pre.to_string())),
            None => (text, None),
        };
        let core = core.split('+').next()?;
        let segments = core.split('.').map(|part| part.parse().ok()).collect::<Option<Vec<u64>>>()?;
        (!segments.is_empty()).then_some(Version { segments, prerelease })
    }

    fn segment(&self, index: usize) -> u64 {
        self.segments.get(index).copied().unwrap_or(0)
    }

    fn cmp(&self, other: &Version) -> Ordering {
        let width = self.segments.len().max(other.segments.len());
        let core = (0..width).map(|i| self.segment(i).cmp(&other.segment(i))).find(|o| o.is_ne());
        core.unwrap_or_else(|| match (&self.prerelease, &other.prerelease) {
            (None, None) => Ordering::Equal,
            (None, Some(_)) => Ordering::Greater,
            (Some(_), None) => Ordering::Less,
            (Some(ours), Some(theirs)) => ours.cmp(theirs),
        })
    }
}

/// Checks a version against a constraint list such as `">= 1.2, < 2.0"` or
/// `"~> 1.4"`. An unparsable version or constraint does not match.
pub fn version_matches(version: &str, constraints: &str) -> bool {
    let Some(version) = Version::parse(version) else { return false };
    constraints.split(',').all(|clause| version_clause_matches(&version, clause.trim()))
}

fn version_clause_matches(version: &Version, clause: &str) -> bool {
    let operator_len = clause.find(|c: char| c.is_ascii_digit() || c == 'v').unwrap_or(clause.len());
    let (operator, wanted) = clause.split_at(operator_len);
    let Some(wanted) = Version::parse(wanted) else { return false };
    let order = version.cmp(&wanted);
    match operator.trim() {
        "" | "=" | "==" => order == Ordering::Equal,
        "!=" => order != Ordering::Equal,
        ">" => order == Ordering::Greater,
        ">=" => order != Ordering::Less,
        "<" => order == Ordering::Less,
        "<=" => order != Ordering::Greater,
        "~>" => {
            // Pessimistic: at least `wanted`, below the next release of its second-to-last segment.
            let fixed = wanted.segments.len().saturating_sub(1).max(1);
            let prefix_equal = (0..fixed - 1).all(|i| version.segment(i) == wanted.segment(i));
            order != Ordering::Less && prefix_equal && version.segment(fixed - 1) == wanted.segment(fixed - 1)
        }
        _ => false,
    }
}

/// Whether a constraint string is valid syntax for its operand (used by job validation).
pub fn constraint_syntax_problem(constraint: &Constraint) -> Option<String> {
    match constraint.operand {
        ConstraintOperand::Regexp => Regex::new(&constraint.r_target)
            .err()
            .map(|error| format!("invalid regexp {:?}: {error}", constraint.r_target)),
        ConstraintOperand::Version => {
            let valid = constraint.r_target.split(',').all(|clause| {
                let clause = clause.trim();
                let start = clause.find(|c: char| c.is_ascii_digit() || c == 'v').unwrap_or(clause.len());
                let operator = clause[..start].trim();
                ["", "=", "==", "!=", ">", ">=", "<", "<=", "~>"].contains(&operator)
                    && Version::parse(&clause[start..]).is_some()
            });
            (!valid).then(|| format!("invalid version constraint {:?}", constraint.r_target))
        }
        _ => None,
    }
}

/// Checks nodes for one task group of one job, caching by computed class.
#[derive(Debug)]
pub struct FeasibilityChecker {
    datacenters: BTreeSet<String>,
    drivers: Vec<String>,
    by_class: Vec<Prepared>,
    escaped: Vec<Prepared>,
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
        let (escaped, by_class): (Vec<_>, Vec<_>) = constraints
            .map(Prepared::new)
            .partition(|p| is_unique_target(&p.constraint.l_target) || is_unique_target(&p.constraint.r_target));
        let mut drivers: Vec<String> = group.tasks.iter().map(|task| task.driver.clone()).collect();
        drivers.sort();
        drivers.dedup();
        FeasibilityChecker {
            datacenters: job.datacenters.iter().cloned().collect(),
            drivers,
            by_class,
            escaped,
            cache: HashMap::new(),
            class_eligibility: HashMap::new(),
        }
    }

    /// Whether some constraints had to be checked per node.
    pub fn escaped(&self) -> bool {
        !self.escaped.is_empty()
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
        match self.escaped.iter().find(|prepared| !prepared.holds(node)) {
            Some(failed) => Err(Filtered::Constraint(failed.text.clone())),
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
        Some(class_result.and_then(|()| match self.escaped.iter().find(|prepared| !prepared.holds(node)) {
            Some(failed) => Err(Filtered::Constraint(failed.text.clone())),
            None => Ok(()),
        }))
    }

    /// Fills the class cache from one node of each class in `nodes`.
    pub fn warm(&mut self, nodes: &[std::sync::Arc<Node>]) {
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
