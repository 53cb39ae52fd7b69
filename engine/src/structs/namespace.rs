//! Namespaces, as Nomad has them: a name that scopes jobs and everything
//! of theirs (evaluations, allocations, deployments, service
//! registrations), with a description and free metadata. `default` always
//! exists and cannot be deleted; a job names a namespace that exists.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::DEFAULT_NAMESPACE;

/// The longest namespace name (Nomad's).
pub const MAX_NAMESPACE_NAME_LEN: usize = 128;

/// The longest description (Nomad's).
pub const MAX_NAMESPACE_DESCRIPTION_LEN: usize = 256;

/// A namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespace {
    /// Its name: letters, digits and `-`, 1 to 128 of them.
    pub name: String,
    /// Free text.
    pub description: String,
    /// Free key-value metadata.
    pub meta: BTreeMap<String, String>,
    /// When it was created (set by the store; 0 for an implicit `default`).
    pub create_index: u64,
    /// When it last changed (set by the store).
    pub modify_index: u64,
}

impl Namespace {
    /// `default` as it is before an operator writes it.
    pub fn implicit_default() -> Namespace {
        Namespace {
            name: DEFAULT_NAMESPACE.to_string(),
            description: "Default shared namespace".to_string(),
            ..Namespace::default()
        }
    }

    /// Why this namespace cannot be written, if it cannot.
    pub fn problem(&self) -> Option<String> {
        if let Some(problem) = namespace_name_problem(&self.name) {
            return Some(problem);
        }
        if self.description.chars().count() > MAX_NAMESPACE_DESCRIPTION_LEN {
            return Some(format!("description longer than {MAX_NAMESPACE_DESCRIPTION_LEN} characters"));
        }
        None
    }
}

/// Why `name` is not a namespace name (Nomad's rule: `^[a-zA-Z0-9-]{1,128}$`,
/// so a name never becomes a path or a glob), if it is not.
pub fn namespace_name_problem(name: &str) -> Option<String> {
    if name.is_empty() || name.len() > MAX_NAMESPACE_NAME_LEN {
        return Some(format!("namespace name {name:?} must be 1 to {MAX_NAMESPACE_NAME_LEN} characters"));
    }
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Some(format!("namespace name {name:?} may hold only letters, digits and '-'"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_nomads_letters_digits_and_dashes() {
        assert_eq!(namespace_name_problem("team-a"), None);
        assert_eq!(namespace_name_problem("Prod2"), None);
        for bad in ["", "a b", "../etc", "a/b", "*", "a.b", &"x".repeat(129)] {
            assert!(namespace_name_problem(bad).is_some(), "{bad:?}");
        }
        let long = Namespace { name: "a".into(), description: "d".repeat(257), ..Namespace::default() };
        assert!(long.problem().expect("refused").contains("description"));
    }
}
