//! ACL tokens and policies, as Nomad has them: a token is an accessor id
//! (public, names it in lists and logs) and a secret id (what a request
//! carries); a `management` token may do anything, a `client` token what
//! its policies grant. A policy grants a level on each of four areas.
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

/// The areas a request may need, each with the level its policies grant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AclRules {
    /// Jobs, evaluations, allocations, search (Nomad's `namespace "default"`).
    pub namespace: AclLevel,
    /// Nodes.
    pub node: AclLevel,
    /// The agent: its self-description, members, the workers.
    pub agent: AclLevel,
    /// The operator endpoints (raft, scheduler configuration).
    pub operator: AclLevel,
}

impl AclRules {
    /// What `self` and `other` grant together.
    pub fn combine(self, other: AclRules) -> AclRules {
        AclRules {
            namespace: self.namespace.combine(other.namespace),
            node: self.node.combine(other.node),
            agent: self.agent.combine(other.agent),
            operator: self.operator.combine(other.operator),
        }
    }
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
            .fold(AclRules::default(), |rules, policy| rules.combine(policy.rules))
    }
}
