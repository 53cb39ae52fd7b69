//! Affinities: soft constraints. A node that matches one scores higher
//! (positive weight) or lower (negative weight) when the scheduler ranks
//! nodes; it never filters a node. Checking that one is well formed is job
//! validation's business, here; scoring is the scheduler's (`scheduler::preference`).

use serde::{Deserialize, Serialize};

use super::{constraint_syntax_problem, Constraint, ConstraintOperand};

/// A preference for nodes where `l_target operand r_target` holds (Nomad's
/// `affinity` block, JSON `Affinities`), at job, group or task level.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Affinity {
    /// Left side: an interpolated attribute such as `${node.class}` or `${meta.rack}`.
    #[serde(default)]
    pub l_target: String,
    /// Right side: a literal, a regular expression or a version constraint.
    #[serde(default)]
    pub r_target: String,
    /// The comparison: any constraint operand but `distinct_hosts` and
    /// `distinct_property`, which depend on placements, not on the node.
    pub operand: ConstraintOperand,
    /// From -100 to 100, not 0: how strongly matching nodes are preferred
    /// (negative: avoided). Nomad's default is 50.
    #[serde(default = "default_weight")]
    pub weight: i8,
}

fn default_weight() -> i8 {
    50
}

impl Affinity {
    /// An affinity `l_target operand r_target` of `weight`.
    pub fn new(l_target: &str, operand: ConstraintOperand, r_target: &str, weight: i8) -> Affinity {
        Affinity { l_target: l_target.to_string(), r_target: r_target.to_string(), operand, weight }
    }

    /// The condition a node must meet to match, as a constraint.
    pub fn condition(&self) -> Constraint {
        Constraint { l_target: self.l_target.clone(), r_target: self.r_target.clone(), operand: self.operand }
    }

    pub(super) fn problems(&self, place: &str, problems: &mut Vec<String>) {
        let text = format!("affinity {:?} {:?} {:?}", self.l_target, self.operand, self.r_target);
        if matches!(self.operand, ConstraintOperand::DistinctHosts | ConstraintOperand::DistinctProperty) {
            problems.push(format!("{place}: {text}: {:?} is not an affinity operand", self.operand));
            return;
        }
        if !(-100..=100).contains(&self.weight) || self.weight == 0 {
            problems.push(format!("{place}: {text}: weight {} must be from -100 to 100 and not 0", self.weight));
        }
        if self.l_target.trim().is_empty() {
            problems.push(format!("{place}: {text} needs a left target (l_target)"));
        }
        let needs_right = !matches!(self.operand, ConstraintOperand::IsSet | ConstraintOperand::IsNotSet);
        if needs_right && self.r_target.trim().is_empty() {
            problems.push(format!("{place}: {text} needs a right target (r_target)"));
        }
        if let Some(problem) = constraint_syntax_problem(&self.condition()) {
            problems.push(format!("{place}: {text}: {problem}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(affinity: &Affinity) -> Vec<String> {
        let mut problems = Vec::new();
        affinity.problems("job", &mut problems);
        problems
    }

    #[test]
    fn weights_operands_and_targets_are_checked() {
        assert!(problems(&Affinity::new("${node.class}", ConstraintOperand::Equal, "web", 50)).is_empty());
        assert!(problems(&Affinity::new("${meta.gpu}", ConstraintOperand::IsSet, "", -100)).is_empty());
        let zero = problems(&Affinity::new("${node.class}", ConstraintOperand::Equal, "web", 0));
        assert!(zero[0].contains("weight 0 must be from -100 to 100 and not 0"), "{zero:?}");
        let big = problems(&Affinity::new("${node.class}", ConstraintOperand::Equal, "web", 101));
        assert!(big[0].contains("weight 101"), "{big:?}");
        let distinct = problems(&Affinity::new("${meta.rack}", ConstraintOperand::DistinctProperty, "", 10));
        assert!(distinct[0].contains("is not an affinity operand"), "{distinct:?}");
        let regexp = problems(&Affinity::new("${node.class}", ConstraintOperand::Regexp, "(web", 10));
        assert!(regexp[0].contains("invalid regexp"), "{regexp:?}");
        let empty = problems(&Affinity::new("", ConstraintOperand::Equal, "", 10));
        assert_eq!(empty.len(), 2, "{empty:?}");
    }

    #[test]
    fn the_weight_defaults_to_nomads() {
        let affinity: Affinity =
            serde_json::from_str(r#"{"l_target": "${node.class}", "operand": "=", "r_target": "web"}"#).expect("reads");
        assert_eq!(affinity.weight, 50);
    }
}
