//! Constraints: what a job, group or task asks of a node, and the syntax of
//! their right sides (regular expressions, version constraints such as
//! `">= 1.2, < 2.0"` or `"~> 1.4"`). Evaluating a constraint against a node
//! is the scheduler's business (`scheduler::feasible`); checking that one
//! is well formed is job validation's, here.

use std::cmp::Ordering;

use regex::Regex;
use serde::{Deserialize, Serialize};

/// How a constraint compares its left and right sides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ConstraintOperand {
    /// Equal strings.
    #[serde(rename = "=")]
    Equal,
    /// Different strings (a missing attribute counts as different).
    #[serde(rename = "!=")]
    NotEqual,
    /// Less than: numerically when both sides are numbers, else lexically.
    #[serde(rename = "<")]
    Less,
    /// Less than or equal.
    #[serde(rename = "<=")]
    LessOrEqual,
    /// Greater than.
    #[serde(rename = ">")]
    Greater,
    /// Greater than or equal.
    #[serde(rename = ">=")]
    GreaterOrEqual,
    /// The left side matches the regular expression on the right.
    #[serde(rename = "regexp")]
    Regexp,
    /// The left side is a version satisfying the constraint on the right (">= 1.2, < 2").
    #[serde(rename = "version")]
    Version,
    /// The attribute exists.
    #[serde(rename = "is_set")]
    IsSet,
    /// The attribute does not exist.
    #[serde(rename = "is_not_set")]
    IsNotSet,
    /// No two allocations of the job (or group) on one node.
    #[serde(rename = "distinct_hosts")]
    DistinctHosts,
    /// At most `r_target` (default 1) allocations per value of the property.
    #[serde(rename = "distinct_property")]
    DistinctProperty,
    /// The left side, a comma-separated set, holds every member of the
    /// comma-separated right side (Nomad's `set_contains`).
    #[serde(rename = "set_contains")]
    SetContains,
    /// The left set holds at least one member of the right set.
    #[serde(rename = "set_contains_any")]
    SetContainsAny,
    /// The left set holds every member of the right set (the same test as
    /// `set_contains`, under Nomad's other name).
    #[serde(rename = "set_contains_all")]
    SetContainsAll,
}

impl ConstraintOperand {
    fn needs_left_target(self) -> bool {
        !matches!(self, ConstraintOperand::DistinctHosts)
    }

    fn needs_right_target(self) -> bool {
        !matches!(
            self,
            ConstraintOperand::IsSet
                | ConstraintOperand::IsNotSet
                | ConstraintOperand::DistinctHosts
                | ConstraintOperand::DistinctProperty
        )
    }
}

/// A condition a node must meet to run a job, group or task.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Constraint {
    /// Left side: an interpolated attribute such as `${attr.kernel.name}` or `${meta.rack}`.
    #[serde(default)]
    pub l_target: String,
    /// Right side: a literal, a regular expression or a version constraint.
    #[serde(default)]
    pub r_target: String,
    /// The comparison.
    pub operand: ConstraintOperand,
}

impl Constraint {
    /// A constraint `l_target operand r_target`.
    pub fn new(l_target: &str, operand: ConstraintOperand, r_target: &str) -> Self {
        Constraint { l_target: l_target.to_string(), r_target: r_target.to_string(), operand }
    }

    pub(super) fn problems(&self, place: &str, problems: &mut Vec<String>) {
        if self.operand.needs_left_target() && self.l_target.trim().is_empty() {
            problems.push(format!("{place}: constraint {:?} needs a left target (l_target)", self.operand));
        }
        if self.operand.needs_right_target() && self.r_target.trim().is_empty() {
            problems.push(format!("{place}: constraint {:?} needs a right target (r_target)", self.operand));
        }
        if let Some(problem) = constraint_syntax_problem(self) {
            problems.push(format!("{place}: {problem}"));
        }
        if self.operand == ConstraintOperand::DistinctProperty && !self.r_target.is_empty() {
            match self.r_target.parse::<u32>() {
                Ok(0) | Err(_) => problems.push(format!(
                    "{place}: distinct_property limit {:?} must be a whole number of at least 1",
                    self.r_target
                )),
                Ok(_) => {}
            }
        }
    }
}

/// A version: numeric segments, optionally with a pre-release after `-`.
#[derive(Debug, PartialEq, Eq)]
pub struct Version {
    segments: Vec<u64>,
    prerelease: Option<String>,
}

impl Version {
    /// Parses `1.2.3`, `v1.2`, `1.2.3-beta` (a build suffix after `+` is ignored).
    pub fn parse(text: &str) -> Option<Version> {
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
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Version {
    /// Segment by segment (missing ones count as 0); a release sorts after its pre-releases.
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

/// Whether the comma-separated set `left` holds every (`all`) or at least
/// one member of the comma-separated set `right`; members are trimmed, as
/// Nomad trims them.
pub fn set_contains(left: &str, right: &str, all: bool) -> bool {
    let members: std::collections::HashSet<&str> = left.split(',').map(str::trim).collect();
    let mut wanted = right.split(',').map(str::trim);
    match all {
        true => wanted.all(|member| members.contains(member)),
        false => wanted.any(|member| members.contains(member)),
    }
}

/// Whether a constraint's right side is valid syntax for its operand (used by job validation).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_constraints() {
        assert!(version_matches("1.2.3", ">= 1.2, < 2.0"));
        assert!(version_matches("1.4.9", "~> 1.4"));
        assert!(!version_matches("1.5.0", "~> 1.4.0"));
        assert!(version_matches("1.4.7", "~> 1.4.0"));
        assert!(!version_matches("2.0.0-beta", ">= 2.0.0"), "a pre-release is before its release");
        assert!(!version_matches("not-a-version", ">= 1"));
        assert!(constraint_syntax_problem(&Constraint::new("x", ConstraintOperand::Version, ">= one")).is_some());
        assert!(constraint_syntax_problem(&Constraint::new("x", ConstraintOperand::Regexp, "(unclosed")).is_some());
        assert!(constraint_syntax_problem(&Constraint::new("x", ConstraintOperand::Version, ">= 1.2, < 2")).is_none());
    }

    #[test]
    fn sets_contain_all_or_any_member_trimmed() {
        assert!(set_contains("a, b,c", "c,a", true));
        assert!(!set_contains("a,b", "a,z", true));
        assert!(set_contains("a,b", "z, b", false));
        assert!(!set_contains("a,b", "y,z", false));
        assert!(!set_contains("ab", "a", true), "members, not substrings");
    }

    #[test]
    fn versions_order_by_segment_then_release_after_pre_release() {
        let parse = |text: &str| Version::parse(text).expect("a version");
        assert!(parse("1.10") > parse("1.9"));
        assert_eq!(parse("1.2").cmp(&parse("1.2.0")), Ordering::Equal);
        assert!(parse("2.0.0-rc1") < parse("2.0.0"));
        assert!(Version::parse("").is_none() && Version::parse("x.1").is_none());
    }
}
