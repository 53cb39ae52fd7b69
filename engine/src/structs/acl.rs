//! ACL tokens and policies, as Nomad has them: a token is an accessor id
//! (public, names it in lists and logs) and a secret id (what a request
//! carries); a `management` token may do anything, a `client` token what
//! its policies grant. A policy grants capabilities in namespaces (named,
//! or matched by a glob) and a level on each of three other areas.
//!
//! The rules' text (Nomad's HCL) is kept as written; the server reads it
//! into [`AclRules`] when the policy is written, so the state holds both and
//! a request is checked without parsing anything.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;

/// What a policy grants on one area. `Deny` in any of a token's policies
/// wins over the others, as in Nomad.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AclLevel {
    /// Nothing granted (the default).
    #[default]
    None,
    /// Reads.
    Read,
    /// Reads and writes.
    Write,
    /// Nothing, whatever another policy grants.
    Deny,
}

impl AclLevel {
    /// Nomad's name of the level (`deny`, `read`, `write`; none is `""`).
    pub fn as_str(self) -> &'static str {
        match self {
            AclLevel::None => "",
            AclLevel::Read => "read",
            AclLevel::Write => "write",
            AclLevel::Deny => "deny",
        }
    }

    /// The level a set of policies grants together.
    pub fn combine(self, other: AclLevel) -> AclLevel {
        if self == AclLevel::Deny || other == AclLevel::Deny {
            AclLevel::Deny
        } else {
            self.max(other)
        }
    }

    /// Whether this level allows `needed` (`Read` or `Write`).
    pub fn allows(self, needed: AclLevel) -> bool {
        self != AclLevel::Deny && self >= needed
    }
}

/// What a policy grants in a namespace: Nomad's capabilities, as a set.
/// `deny` in any of a token's policies for a namespace rule takes every
/// other capability of that rule away, as in Nomad.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Capabilities(u32);

impl Capabilities {
    /// Nothing.
    pub const NONE: Capabilities = Capabilities(0);
    /// Nothing, whatever another policy grants.
    pub const DENY: Capabilities = Capabilities(1);
    /// List the namespace's jobs (and search them).
    pub const LIST_JOBS: Capabilities = Capabilities(1 << 1);
    /// Parse a job file (`/v1/jobs/parse`).
    pub const PARSE_JOB: Capabilities = Capabilities(1 << 2);
    /// Read jobs, evaluations, allocations, deployments, services.
    pub const READ_JOB: Capabilities = Capabilities(1 << 3);
    /// Register, change, stop, plan, revert, evaluate jobs; act on deployments.
    pub const SUBMIT_JOB: Capabilities = Capabilities(1 << 4);
    /// Dispatch a parameterized job.
    pub const DISPATCH_JOB: Capabilities = Capabilities(1 << 5);
    /// Read an allocation's logs.
    pub const READ_LOGS: Capabilities = Capabilities(1 << 6);
    /// Read an allocation's files.
    pub const READ_FS: Capabilities = Capabilities(1 << 7);
    /// Run a command in an allocation's task.
    pub const ALLOC_EXEC: Capabilities = Capabilities(1 << 8);
    /// Run a command in a task without isolation (`raw_exec`).
    pub const ALLOC_NODE_EXEC: Capabilities = Capabilities(1 << 9);
    /// Stop, restart and signal allocations.
    pub const ALLOC_LIFECYCLE: Capabilities = Capabilities(1 << 10);
    /// Change a group's count (`/v1/job/:id/scale`).
    pub const SCALE_JOB: Capabilities = Capabilities(1 << 11);
    /// Read a job's scaling status.
    pub const READ_JOB_SCALING: Capabilities = Capabilities(1 << 12);
    /// List scaling policies.
    pub const LIST_SCALING_POLICIES: Capabilities = Capabilities(1 << 13);
    /// Read a scaling policy.
    pub const READ_SCALING_POLICY: Capabilities = Capabilities(1 << 14);
    /// Nomad's CSI and recommendation capabilities: taken so Nomad's
    /// policies read as written; Drover has no endpoint they gate.
    pub const CSI_LIST_VOLUME: Capabilities = Capabilities(1 << 15);
    #[allow(missing_docs)]
    pub const CSI_READ_VOLUME: Capabilities = Capabilities(1 << 16);
    #[allow(missing_docs)]
    pub const CSI_WRITE_VOLUME: Capabilities = Capabilities(1 << 17);
    #[allow(missing_docs)]
    pub const CSI_MOUNT_VOLUME: Capabilities = Capabilities(1 << 18);
    #[allow(missing_docs)]
    pub const CSI_REGISTER_PLUGIN: Capabilities = Capabilities(1 << 19);
    #[allow(missing_docs)]
    pub const SUBMIT_RECOMMENDATION: Capabilities = Capabilities(1 << 20);
    #[allow(missing_docs)]
    pub const SENTINEL_OVERRIDE: Capabilities = Capabilities(1 << 21);

    /// Every capability by Nomad's name.
    pub const NAMED: [(&'static str, Capabilities); 22] = [
        ("deny", Capabilities::DENY),
        ("list-jobs", Capabilities::LIST_JOBS),
        ("parse-job", Capabilities::PARSE_JOB),
        ("read-job", Capabilities::READ_JOB),
        ("submit-job", Capabilities::SUBMIT_JOB),
        ("dispatch-job", Capabilities::DISPATCH_JOB),
        ("read-logs", Capabilities::READ_LOGS),
        ("read-fs", Capabilities::READ_FS),
        ("alloc-exec", Capabilities::ALLOC_EXEC),
        ("alloc-node-exec", Capabilities::ALLOC_NODE_EXEC),
        ("alloc-lifecycle", Capabilities::ALLOC_LIFECYCLE),
        ("scale-job", Capabilities::SCALE_JOB),
        ("read-job-scaling", Capabilities::READ_JOB_SCALING),
        ("list-scaling-policies", Capabilities::LIST_SCALING_POLICIES),
        ("read-scaling-policy", Capabilities::READ_SCALING_POLICY),
        ("csi-list-volume", Capabilities::CSI_LIST_VOLUME),
        ("csi-read-volume", Capabilities::CSI_READ_VOLUME),
        ("csi-write-volume", Capabilities::CSI_WRITE_VOLUME),
        ("csi-mount-volume", Capabilities::CSI_MOUNT_VOLUME),
        ("csi-register-plugin", Capabilities::CSI_REGISTER_PLUGIN),
        ("submit-recommendation", Capabilities::SUBMIT_RECOMMENDATION),
        ("sentinel-override", Capabilities::SENTINEL_OVERRIDE),
    ];

    /// The capability Nomad names `name`.
    pub fn named(name: &str) -> Option<Capabilities> {
        Capabilities::NAMED.iter().find(|(known, _)| *known == name).map(|(_, capability)| *capability)
    }

    /// What Nomad's `policy = "..."` of a namespace rule grants: `deny`,
    /// `read`, `write` or `scale`.
    pub fn of_policy(policy: &str) -> Option<Capabilities> {
        let read = Capabilities::LIST_JOBS
            | Capabilities::PARSE_JOB
            | Capabilities::READ_JOB
            | Capabilities::CSI_LIST_VOLUME
            | Capabilities::CSI_READ_VOLUME
            | Capabilities::READ_JOB_SCALING
            | Capabilities::LIST_SCALING_POLICIES
            | Capabilities::READ_SCALING_POLICY;
        let scale = Capabilities::LIST_SCALING_POLICIES
            | Capabilities::READ_SCALING_POLICY
            | Capabilities::READ_JOB_SCALING
            | Capabilities::SCALE_JOB;
        let write = read
            | Capabilities::SCALE_JOB
            | Capabilities::SUBMIT_JOB
            | Capabilities::DISPATCH_JOB
            | Capabilities::READ_LOGS
            | Capabilities::READ_FS
            | Capabilities::ALLOC_EXEC
            | Capabilities::ALLOC_LIFECYCLE
            | Capabilities::CSI_MOUNT_VOLUME
            | Capabilities::CSI_WRITE_VOLUME
            | Capabilities::SUBMIT_RECOMMENDATION;
        match policy {
            "deny" => Some(Capabilities::DENY),
            "read" => Some(read),
            "write" => Some(write),
            "scale" => Some(scale),
            _ => None,
        }
    }

    /// The set with `other`'s capabilities too; with `deny` in either,
    /// only `deny`.
    pub fn combine(self, other: Capabilities) -> Capabilities {
        if self.is_deny() || other.is_deny() {
            Capabilities::DENY
        } else {
            Capabilities(self.0 | other.0)
        }
    }

    /// Whether this is `deny`.
    pub fn is_deny(self) -> bool {
        self.0 & Capabilities::DENY.0 != 0
    }

    /// Whether it grants `capability` (every one of a union).
    pub fn allows(self, capability: Capabilities) -> bool {
        !self.is_deny() && self.0 & capability.0 == capability.0
    }

    /// Whether it grants anything at all (Nomad's `AllowNamespace`).
    pub fn any(self) -> bool {
        !self.is_deny() && self.0 != 0
    }

    /// Nomad's names of the capabilities granted, in its order.
    pub fn names(self) -> Vec<&'static str> {
        Capabilities::NAMED.iter().filter(|(_, one)| self.0 & one.0 != 0).map(|(name, _)| *name).collect()
    }
}

impl std::ops::BitOr for Capabilities {
    type Output = Capabilities;

    fn bitor(self, other: Capabilities) -> Capabilities {
        Capabilities(self.0 | other.0)
    }
}

/// What a token's policies grant: capabilities per namespace rule (a name,
/// or a glob with `*`), and a level on each other area.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AclRules {
    /// Namespace rules by the name or glob they were written for.
    pub namespaces: BTreeMap<String, Capabilities>,
    /// Nodes.
    pub node: AclLevel,
    /// The agent: its self-description, members, the workers.
    pub agent: AclLevel,
    /// The operator endpoints (raft, scheduler configuration).
    pub operator: AclLevel,
}

impl AclRules {
    /// What `self` and `other` grant together: rules for the same name or
    /// glob are merged (`deny` wins), as Nomad merges them.
    pub fn combine(mut self, other: &AclRules) -> AclRules {
        for (pattern, capabilities) in &other.namespaces {
            let merged = self.namespaces.get(pattern).map_or(*capabilities, |mine| mine.combine(*capabilities));
            self.namespaces.insert(pattern.clone(), merged);
        }
        self.node = self.node.combine(other.node);
        self.agent = self.agent.combine(other.agent);
        self.operator = self.operator.combine(other.operator);
        self
    }

    /// What the rules grant in `namespace`: the rule written for its name
    /// if there is one, else the closest glob that matches it (the one whose
    /// `*`s stand for the fewest characters; the first in name order of
    /// equally close ones), else nothing. Nomad's rule.
    pub fn in_namespace(&self, namespace: &str) -> Capabilities {
        if let Some(exact) = self.namespaces.get(namespace) {
            return *exact;
        }
        self.namespaces
            .iter()
            .filter(|(pattern, _)| pattern.contains('*') && glob_matches(pattern, namespace))
            .min_by_key(|(pattern, _)| namespace.len() - pattern.replace('*', "").len())
            .map_or(Capabilities::NONE, |(_, capabilities)| *capabilities)
    }
}

/// Whether `text` matches `pattern`, where each `*` stands for any run of
/// characters (none included).
pub fn glob_matches(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = text.strip_prefix(first) else { return false };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else { return rest.is_empty() };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// A named policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclPolicy {
    /// Its name (what tokens list).
    pub name: String,
    /// Free text.
    pub description: String,
    /// The rules as the operator wrote them (Nomad's HCL).
    pub rules_text: String,
    /// What they grant.
    pub rules: AclRules,
    /// When it was created (set by the store).
    pub create_index: u64,
    /// When it last changed (set by the store).
    pub modify_index: u64,
}

/// A token's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AclTokenType {
    /// May do anything.
    Management,
    /// May do what its policies grant.
    Client,
}

impl AclTokenType {
    /// Nomad's name (`management`, `client`).
    pub fn as_str(self) -> &'static str {
        match self {
            AclTokenType::Management => "management",
            AclTokenType::Client => "client",
        }
    }
}

/// A token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclToken {
    /// The public id.
    pub accessor_id: uuid::Uuid,
    /// The secret a request carries.
    pub secret_id: uuid::Uuid,
    /// Free text.
    pub name: String,
    /// Its kind.
    pub token_type: AclTokenType,
    /// The policies it has (client tokens).
    pub policies: Vec<String>,
    /// When it was made.
    pub create_time: Timestamp,
    /// When it was created (set by the store).
    pub create_index: u64,
    /// When it last changed (set by the store).
    pub modify_index: u64,
}

/// Every token and policy, and whether the cluster was bootstrapped. Small
/// (tokens are counted in hundreds), so a write copies it whole.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclState {
    /// Tokens by accessor id.
    pub tokens: BTreeMap<uuid::Uuid, AclToken>,
    /// Accessor ids by secret id.
    pub by_secret: BTreeMap<uuid::Uuid, uuid::Uuid>,
    /// Policies by name.
    pub policies: BTreeMap<String, AclPolicy>,
    /// The index of the bootstrap, once done (it is done once).
    pub bootstrap_index: Option<u64>,
}

impl AclState {
    /// The token whose secret is `secret`.
    pub fn token_by_secret(&self, secret: &uuid::Uuid) -> Option<&AclToken> {
        self.by_secret.get(secret).and_then(|accessor| self.tokens.get(accessor))
    }

    /// What `token`'s policies grant together (policies since deleted
    /// grant nothing).
    pub fn rules_of(&self, token: &AclToken) -> AclRules {
        token
            .policies
            .iter()
            .filter_map(|name| self.policies.get(name))
            .fold(AclRules::default(), |rules, policy| rules.combine(&policy.rules))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_nomads_do() {
        assert!(glob_matches("*", ""));
        assert!(glob_matches("*", "prod"));
        assert!(glob_matches("prod-*", "prod-web"));
        assert!(glob_matches("prod-*", "prod-"));
        assert!(!glob_matches("prod-*", "dev-web"));
        assert!(glob_matches("*-web", "prod-web"));
        assert!(glob_matches("p*d*b", "prod-web"));
        assert!(!glob_matches("a*a", "a"));
        assert!(glob_matches("a*a", "aa"));
        assert!(!glob_matches("prod", "prod-web"));
    }

    #[test]
    fn the_exact_rule_wins_then_the_closest_glob() {
        let read = Capabilities::of_policy("read").expect("read");
        let write = Capabilities::of_policy("write").expect("write");
        let rules = AclRules {
            namespaces: [
                ("*".to_string(), read),
                ("prod-*".to_string(), write),
                ("prod-db".to_string(), Capabilities::DENY),
            ]
            .into_iter()
            .collect(),
            ..AclRules::default()
        };
        assert_eq!(rules.in_namespace("prod-db"), Capabilities::DENY);
        assert_eq!(rules.in_namespace("prod-web"), write, "prod-* is closer than *");
        assert_eq!(rules.in_namespace("dev"), read);
        assert!(!rules.in_namespace("prod-db").allows(Capabilities::READ_JOB));
        assert!(AclRules::default().in_namespace("default") == Capabilities::NONE);
    }

    #[test]
    fn policies_expand_and_merge_with_deny_winning() {
        let read = Capabilities::of_policy("read").expect("read");
        assert!(read.allows(Capabilities::LIST_JOBS | Capabilities::READ_JOB));
        assert!(!read.allows(Capabilities::SUBMIT_JOB));
        let write = Capabilities::of_policy("write").expect("write");
        assert!(write.allows(Capabilities::SUBMIT_JOB | Capabilities::READ_LOGS | Capabilities::ALLOC_EXEC));
        assert!(!write.allows(Capabilities::ALLOC_NODE_EXEC), "Nomad grants alloc-node-exec only by name");
        let scale = Capabilities::of_policy("scale").expect("scale");
        assert!(scale.allows(Capabilities::SCALE_JOB) && !scale.allows(Capabilities::READ_JOB));
        assert_eq!(Capabilities::of_policy("list"), None);
        let one = AclRules {
            namespaces: [("web".to_string(), read)].into_iter().collect(),
            node: AclLevel::Read,
            ..AclRules::default()
        };
        let other = AclRules {
            namespaces: [("web".to_string(), Capabilities::SUBMIT_JOB)].into_iter().collect(),
            ..AclRules::default()
        };
        let both = one.clone().combine(&other);
        assert!(both.in_namespace("web").allows(Capabilities::SUBMIT_JOB | Capabilities::READ_JOB));
        assert_eq!(both.node, AclLevel::Read);
        let denied = AclRules {
            namespaces: [("web".to_string(), Capabilities::DENY)].into_iter().collect(),
            ..AclRules::default()
        };
        assert!(!one.combine(&denied).in_namespace("web").any());
        assert_eq!(Capabilities::named("alloc-lifecycle"), Some(Capabilities::ALLOC_LIFECYCLE));
        assert_eq!(Capabilities::named("submit-jobs"), None);
        assert_eq!((Capabilities::READ_JOB | Capabilities::DENY).names(), ["deny", "read-job"]);
    }
}
