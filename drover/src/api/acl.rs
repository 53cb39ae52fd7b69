//! ACL tokens and policies (Nomad's `api/acl.go`): the answers, with and
//! without the secret or the rules, and the bodies of their writes.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::format::rfc3339;

/// A token with its secret (`ACLToken`): bootstrap, create, update, read,
/// self.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct AclToken {
    #[serde(rename = "AccessorID")]
    pub accessor_id: String,
    #[serde(rename = "SecretID")]
    pub secret_id: String,
    pub name: String,
    /// `client` or `management`.
    #[serde(rename = "Type")]
    pub token_type: String,
    pub policies: Vec<String>,
    /// Always `null`: Drover has no roles.
    pub roles: Option<Value>,
    /// Always true: one region.
    pub global: bool,
    /// RFC 3339.
    pub create_time: String,
    /// Always `null`: tokens do not expire.
    pub expiration_time: Option<String>,
    pub create_index: u64,
    pub modify_index: u64,
}

/// A token in `GET /v1/acl/tokens`, without its secret (`ACLTokenListStub`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct AclTokenListStub {
    #[serde(rename = "AccessorID")]
    pub accessor_id: String,
    pub name: String,
    #[serde(rename = "Type")]
    pub token_type: String,
    pub policies: Vec<String>,
    pub roles: Option<Value>,
    pub global: bool,
    pub create_time: String,
    pub expiration_time: Option<String>,
    pub create_index: u64,
    pub modify_index: u64,
}

impl From<&engine::structs::AclToken> for AclToken {
    fn from(token: &engine::structs::AclToken) -> Self {
        let stub = AclTokenListStub::from(token);
        AclToken {
            accessor_id: stub.accessor_id,
            secret_id: token.secret_id.to_string(),
            name: stub.name,
            token_type: stub.token_type,
            policies: stub.policies,
            roles: stub.roles,
            global: stub.global,
            create_time: stub.create_time,
            expiration_time: stub.expiration_time,
            create_index: stub.create_index,
            modify_index: stub.modify_index,
        }
    }
}

impl From<&engine::structs::AclToken> for AclTokenListStub {
    fn from(token: &engine::structs::AclToken) -> Self {
        AclTokenListStub {
            accessor_id: token.accessor_id.to_string(),
            name: token.name.clone(),
            token_type: token.token_type.as_str().to_string(),
            policies: token.policies.clone(),
            roles: None,
            global: true,
            create_time: rfc3339(token.create_time),
            expiration_time: None,
            create_index: token.create_index,
            modify_index: token.modify_index,
        }
    }
}

/// A policy with its rules (`ACLPolicy`, `GET /v1/acl/policy/:name`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct AclPolicy {
    pub name: String,
    pub description: String,
    /// Nomad's HCL rules, as written.
    pub rules: String,
    pub create_index: u64,
    pub modify_index: u64,
}

/// A policy in `GET /v1/acl/policies` (`ACLPolicyListStub`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct AclPolicyListStub {
    pub name: String,
    pub description: String,
    pub create_index: u64,
    pub modify_index: u64,
}

impl From<&engine::structs::AclPolicy> for AclPolicy {
    fn from(policy: &engine::structs::AclPolicy) -> Self {
        AclPolicy {
            name: policy.name.clone(),
            description: policy.description.clone(),
            rules: policy.rules_text.clone(),
            create_index: policy.create_index,
            modify_index: policy.modify_index,
        }
    }
}

impl From<&engine::structs::AclPolicy> for AclPolicyListStub {
    fn from(policy: &engine::structs::AclPolicy) -> Self {
        AclPolicyListStub {
            name: policy.name.clone(),
            description: policy.description.clone(),
            create_index: policy.create_index,
            modify_index: policy.modify_index,
        }
    }
}

/// `PUT /v1/acl/policy/:name` body: what is absent is empty.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AclPolicyRequest {
    /// Must be the path's name when given.
    pub name: Option<String>,
    /// What it is for.
    pub description: Option<String>,
    /// Nomad's HCL rules.
    pub rules: Option<String>,
}

/// `POST /v1/acl/token[/:accessor]` body: on an update, what is absent is
/// kept.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AclTokenRequest {
    /// Its name.
    pub name: Option<String>,
    /// `client` (the default on create) or `management`.
    #[serde(rename = "Type")]
    pub token_type: Option<String>,
    /// The policies of a client token.
    pub policies: Option<Vec<String>>,
}
