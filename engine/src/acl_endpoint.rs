//! The ACL endpoint, transport-free: bootstrap, policies and tokens, as
//! Nomad's `ACL.*` RPCs write them. A token's ids come from the operating
//! system's randomness (a secret must not follow from a seed) and its
//! creation time from the server's clock; its shape is checked before
//! anything is written:
//! - a `client` token names at least one policy, a `management` token none;
//! - a policy's name is letters, digits, `-` and `_`.
//!
//! What the store refuses (a second bootstrap, a policy or token that does
//! not exist) comes back as [`AclError::Write`] and writes nothing.

use crate::clock::SharedClock;
use crate::state::{Command, StateError, Writer};
use crate::structs::{AclPolicy, AclToken, AclTokenType};

/// Why an ACL write was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AclError {
    /// A client token without policies.
    #[error("client token missing policies")]
    ClientTokenWithoutPolicies,
    /// A management token with policies.
    #[error("management token cannot be associated with policies")]
    ManagementTokenWithPolicies,
    /// A policy name outside letters, digits, `-` and `_`.
    #[error("invalid policy name {0:?}: letters, digits, - and _ only")]
    InvalidPolicyName(String),
    /// The store refused the write (or the log did not take it).
    #[error(transparent)]
    Write(#[from] StateError),
}

/// The changes an update makes to a token; `None` keeps what it has.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenChange {
    /// A new name.
    pub name: Option<String>,
    /// A new type.
    pub token_type: Option<AclTokenType>,
    /// New policies.
    pub policies: Option<Vec<String>>,
}

/// The ACL endpoint; see the module docs.
#[derive(Debug, Clone)]
pub struct AclEndpoint {
    writer: Writer,
    clock: SharedClock,
}

impl AclEndpoint {
    /// An endpoint writing through `writer`, its times from `clock`.
    pub fn new(writer: Writer, clock: SharedClock) -> Self {
        AclEndpoint { writer, clock }
    }

    /// Makes the management token, once; again only with Nomad's reset:
    /// `reset_index` is the index a refused bootstrap named. Returns the
    /// token as stored, with the write's index.
    pub fn bootstrap(&self, reset_index: Option<u64>) -> Result<(AclToken, u64), AclError> {
        let token = self.new_token("Bootstrap Token".to_string(), AclTokenType::Management, Vec::new());
        let command = match reset_index {
            Some(reset_index) => Command::AclBootstrapReset { token: token.clone(), reset_index },
            None => Command::AclBootstrap { token: token.clone() },
        };
        let index = self.writer.write(command)?.index;
        Ok((self.stored_token(token), index))
    }

    /// Creates or replaces `policy`; returns the write's index.
    pub fn upsert_policy(&self, policy: AclPolicy) -> Result<u64, AclError> {
        let name = &policy.name;
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return Err(AclError::InvalidPolicyName(name.clone()));
        }
        Ok(self.writer.write(Command::UpsertAclPolicies { policies: vec![policy] })?.index)
    }

    /// Deletes the policy `name`; returns the write's index.
    pub fn delete_policy(&self, name: String) -> Result<u64, AclError> {
        Ok(self.writer.write(Command::DeleteAclPolicies { names: vec![name] })?.index)
    }

    /// Makes a token; returns it as stored (with its secret) and the
    /// write's index.
    pub fn create_token(
        &self,
        name: String,
        token_type: AclTokenType,
        policies: Vec<String>,
    ) -> Result<(AclToken, u64), AclError> {
        self.write_token(self.new_token(name, token_type, policies))
    }

    /// Changes a token's name, type or policies; returns it as stored and
    /// the write's index.
    pub fn update_token(&self, accessor_id: uuid::Uuid, change: TokenChange) -> Result<(AclToken, u64), AclError> {
        let snapshot = self.writer.store().snapshot();
        let mut token =
            snapshot.acl().tokens.get(&accessor_id).cloned().ok_or(StateError::UnknownAclToken(accessor_id))?;
        if let Some(name) = change.name {
            token.name = name;
        }
        if let Some(token_type) = change.token_type {
            token.token_type = token_type;
        }
        if let Some(policies) = change.policies {
            token.policies = policies;
        }
        self.write_token(token)
    }

    /// Revokes a token; returns the write's index.
    pub fn delete_token(&self, accessor_id: uuid::Uuid) -> Result<u64, AclError> {
        Ok(self.writer.write(Command::DeleteAclTokens { accessor_ids: vec![accessor_id] })?.index)
    }

    fn write_token(&self, token: AclToken) -> Result<(AclToken, u64), AclError> {
        match token.token_type {
            AclTokenType::Client if token.policies.is_empty() => return Err(AclError::ClientTokenWithoutPolicies),
            AclTokenType::Management if !token.policies.is_empty() => {
                return Err(AclError::ManagementTokenWithPolicies)
            }
            _ => {}
        }
        let index = self.writer.write(Command::UpsertAclTokens { tokens: vec![token.clone()] })?.index;
        Ok((self.stored_token(token), index))
    }

    fn new_token(&self, name: String, token_type: AclTokenType, policies: Vec<String>) -> AclToken {
        AclToken {
            accessor_id: random_uuid(),
            secret_id: random_uuid(),
            name,
            token_type,
            policies,
            create_time: self.clock.now(),
            create_index: 0,
            modify_index: 0,
        }
    }

    /// The token as the store holds it after its write (with its indexes).
    fn stored_token(&self, written: AclToken) -> AclToken {
        self.writer.store().snapshot().acl().tokens.get(&written.accessor_id).cloned().unwrap_or(written)
    }
}

/// A version 4 (random) UUID, from the operating system's randomness.
fn random_uuid() -> uuid::Uuid {
    uuid::Builder::from_random_bytes(rand::random()).into_uuid()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::clock::{ManualClock, Timestamp};
    use crate::state::StateStore;
    use crate::structs::AclRules;

    fn endpoint() -> (AclEndpoint, Arc<ManualClock>) {
        let clock = ManualClock::new(Timestamp(7_000_000_000));
        let store = Arc::new(StateStore::new());
        (AclEndpoint::new(Writer::direct(store), clock.clone()), clock)
    }

    fn policy(name: &str) -> AclPolicy {
        AclPolicy {
            name: name.to_string(),
            description: String::new(),
            rules_text: String::new(),
            rules: AclRules::default(),
            create_index: 0,
            modify_index: 0,
        }
    }

    #[test]
    fn bootstrap_makes_one_management_token_with_the_clock_time() {
        let (acl, _clock) = endpoint();
        let (token, index) = acl.bootstrap(None).expect("first bootstrap");
        assert_eq!(token.token_type, AclTokenType::Management);
        assert_eq!(token.create_time, Timestamp(7_000_000_000), "the engine's clock, not the system's");
        assert_eq!((token.create_index, token.modify_index), (index, index), "as stored");
        let refused = acl.bootstrap(None).expect_err("only once");
        assert_eq!(refused, AclError::Write(StateError::AclBootstrapped(index)));
        let (again, _) = acl.bootstrap(Some(index)).expect("with the reset index");
        assert_ne!(again.secret_id, token.secret_id);
    }

    #[test]
    fn a_token_is_checked_before_it_is_written() {
        let (acl, _clock) = endpoint();
        let client = acl.create_token("ci".into(), AclTokenType::Client, Vec::new());
        assert_eq!(client.expect_err("no policies"), AclError::ClientTokenWithoutPolicies);
        let management = acl.create_token("ops".into(), AclTokenType::Management, vec!["read".into()]);
        assert_eq!(management.expect_err("policies"), AclError::ManagementTokenWithPolicies);
        let unknown = acl.create_token("ci".into(), AclTokenType::Client, vec!["nope".into()]);
        assert_eq!(unknown.expect_err("no such policy"), AclError::Write(StateError::UnknownAclPolicy("nope".into())));
        assert!(acl.writer.store().snapshot().acl().tokens.is_empty(), "nothing written");
    }

    #[test]
    fn tokens_are_created_updated_and_revoked() {
        let (acl, clock) = endpoint();
        acl.upsert_policy(policy("readers")).expect("a policy");
        let (token, created) = acl.create_token("ci".into(), AclTokenType::Client, vec!["readers".into()]).expect("ok");
        clock.advance(std::time::Duration::from_secs(5));
        let change = TokenChange { name: Some("deploy".into()), ..TokenChange::default() };
        let (updated, index) = acl.update_token(token.accessor_id, change).expect("renamed");
        assert_eq!((updated.name.as_str(), updated.create_time), ("deploy", token.create_time));
        assert_eq!((updated.create_index, updated.modify_index), (created, index));
        acl.delete_token(token.accessor_id).expect("revoked");
        let gone = acl.update_token(token.accessor_id, TokenChange::default()).expect_err("revoked");
        assert_eq!(gone, AclError::Write(StateError::UnknownAclToken(token.accessor_id)));
    }

    #[test]
    fn a_policy_name_is_letters_digits_dashes_and_underscores() {
        let (acl, _clock) = endpoint();
        assert_eq!(acl.upsert_policy(policy("../etc")), Err(AclError::InvalidPolicyName("../etc".into())));
        assert_eq!(acl.upsert_policy(policy("")), Err(AclError::InvalidPolicyName(String::new())));
        let index = acl.upsert_policy(policy("ops_2-a")).expect("fine");
        assert_eq!(acl.delete_policy("ops_2-a".into()), Ok(index + 1));
    }
}
