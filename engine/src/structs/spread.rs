//! Spreads: how a job's allocations should be shared out over the values of
//! a node attribute (datacenters, racks), evenly or by target percentages.
//! Like affinities they only score nodes, never filter them. Validation is
//! here; the bookkeeping and scoring are the scheduler's (`scheduler::preference`).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// The share of a group's allocations wanted on nodes whose attribute is `value`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SpreadTarget {
    /// An attribute value (`dc1`, `r7`).
    pub value: String,
    /// Percent of the group's count, 0 to 100.
    pub percent: u8,
}

/// Spread a group's allocations over the values of `attribute` (Nomad's
/// `spread` block, JSON `Spreads`), at job or group level. Without targets
/// the values share evenly; with targets, each value wants its percentage
/// and values not named share what the targets leave (or get none when the
/// targets sum to 100).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Spread {
    /// An interpolated node attribute: `${node.datacenter}`, `${meta.rack}`, ...
    pub attribute: String,
    /// From 1 to 100: how much this spread counts against the job's other
    /// spreads. Nomad's default is 50.
    #[serde(default = "default_weight")]
    pub weight: u8,
    /// Target percentages; empty for an even spread.
    #[serde(default)]
    pub targets: Vec<SpreadTarget>,
}

fn default_weight() -> u8 {
    50
}

impl Spread {
    /// An even spread over `attribute`.
    pub fn even(attribute: &str, weight: u8) -> Spread {
        Spread { attribute: attribute.to_string(), weight, targets: Vec::new() }
    }

    /// A spread over `attribute` with target percentages.
    pub fn with_targets(attribute: &str, weight: u8, targets: &[(&str, u8)]) -> Spread {
        let targets = targets
            .iter()
            .map(|(value, percent)| SpreadTarget { value: value.to_string(), percent: *percent })
            .collect();
        Spread { attribute: attribute.to_string(), weight, targets }
    }

    pub(super) fn problems(&self, place: &str, problems: &mut Vec<String>) {
        let text = format!("spread over {:?}", self.attribute);
        if self.attribute.trim().is_empty() {
            problems.push(format!("{place}: a spread has no attribute"));
        }
        if !(1..=100).contains(&self.weight) {
            problems.push(format!("{place}: {text}: weight {} must be from 1 to 100", self.weight));
        }
        let mut values = BTreeSet::new();
        let mut sum = 0u32;
        for target in &self.targets {
            if !values.insert(target.value.as_str()) {
                problems.push(format!("{place}: {text}: target {:?} is listed more than once", target.value));
            }
            if target.percent > 100 {
                problems.push(format!("{place}: {text}: target {:?} asks for {}%", target.value, target.percent));
            }
            sum += u32::from(target.percent);
        }
        if sum > 100 {
            problems.push(format!("{place}: {text}: target percentages add up to {sum}%, more than 100%"));
        }
    }
}

/// Lists spreads that repeat an attribute at one level, or that a group
/// repeats from its job (`job_attributes`).
pub(super) fn duplicate_problems(
    spreads: &[Spread],
    job_attributes: &BTreeSet<&str>,
    place: &str,
    problems: &mut Vec<String>,
) {
    let mut seen = BTreeSet::new();
    for spread in spreads {
        if !seen.insert(spread.attribute.as_str()) {
            problems.push(format!("{place}: more than one spread over {:?}", spread.attribute));
        } else if job_attributes.contains(spread.attribute.as_str()) {
            problems.push(format!("{place}: spread over {:?} is also defined for the whole job", spread.attribute));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_and_targets_are_checked() {
        let mut problems = Vec::new();
        Spread::with_targets("${node.datacenter}", 50, &[("dc1", 70), ("dc2", 30)]).problems("job", &mut problems);
        Spread::even("${meta.rack}", 100).problems("job", &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        Spread::with_targets("${node.datacenter}", 0, &[("dc1", 80), ("dc1", 30)]).problems("job", &mut problems);
        Spread::even("", 10).problems("job", &mut problems);
        let text = problems.join("\n");
        assert!(text.contains("weight 0 must be from 1 to 100"), "{text}");
        assert!(text.contains("target \"dc1\" is listed more than once"), "{text}");
        assert!(text.contains("add up to 110%"), "{text}");
        assert!(text.contains("a spread has no attribute"), "{text}");
        assert_eq!(problems.len(), 4, "{text}");
    }

    #[test]
    fn an_attribute_is_spread_over_once() {
        let job_level = BTreeSet::from(["${node.datacenter}"]);
        let mut problems = Vec::new();
        let spreads = [Spread::even("${meta.rack}", 50), Spread::even("${meta.rack}", 50)];
        duplicate_problems(&spreads, &job_level, "task group \"g\"", &mut problems);
        duplicate_problems(&[Spread::even("${node.datacenter}", 50)], &job_level, "task group \"g\"", &mut problems);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[1].contains("also defined for the whole job"), "{problems:?}");
    }
}
