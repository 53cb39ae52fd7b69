//! Namespaces (Nomad's `api/namespace.go`): the answer, and the body of a
//! write.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A namespace as Nomad answers it (`Namespace`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct Namespace {
    /// Its name.
    pub name: String,
    /// Free text.
    pub description: String,
    /// Always `""`: Drover has no resource quotas.
    pub quota: String,
    /// Always `null`: every driver and network mode is allowed.
    pub capabilities: Option<Value>,
    /// Always `null`: Drover has no node pools.
    pub node_pool_configuration: Option<Value>,
    /// Free key-value metadata (`null` when none).
    pub meta: Option<BTreeMap<String, String>>,
    /// When it was created.
    pub create_index: u64,
    /// When it last changed.
    pub modify_index: u64,
}

impl From<&engine::structs::Namespace> for Namespace {
    fn from(namespace: &engine::structs::Namespace) -> Self {
        Namespace {
            name: namespace.name.clone(),
            description: namespace.description.clone(),
            quota: String::new(),
            capabilities: None,
            node_pool_configuration: None,
            meta: (!namespace.meta.is_empty()).then(|| namespace.meta.clone()),
            create_index: namespace.create_index,
            modify_index: namespace.modify_index,
        }
    }
}

/// `PUT /v1/namespace/:name` body: Nomad's `Namespace`. What Drover has no
/// part for (a quota, driver or network-mode capabilities, node pool,
/// Vault or Consul configuration) is refused when it says anything.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct NamespaceRequest {
    /// Must be the path's name when given.
    pub name: Option<String>,
    /// What it is for.
    pub description: Option<String>,
    /// Free key-value metadata.
    pub meta: Option<BTreeMap<String, String>>,
    /// Refused when set: no resource quotas.
    pub quota: Option<String>,
    /// Refused when it says anything.
    pub capabilities: Option<Value>,
    /// Refused when it says anything.
    pub node_pool_configuration: Option<Value>,
    /// Refused when it says anything.
    pub vault_configuration: Option<Value>,
    /// Refused when it says anything.
    pub consul_configuration: Option<Value>,
    /// Ignored: set by the server.
    pub create_index: Option<u64>,
    /// Ignored: set by the server.
    pub modify_index: Option<u64>,
}

impl NamespaceRequest {
    /// What it asks for that Drover has no part for, named as Nomad names it.
    pub fn unsupported(&self) -> Option<&'static str> {
        use super::spec::says_something;
        let set = |value: &Option<Value>| value.as_ref().is_some_and(says_something);
        if self.quota.as_deref().is_some_and(|quota| !quota.is_empty()) {
            Some("Quota (Drover has no resource quotas)")
        } else if self.capabilities.as_ref().is_some_and(capabilities_say_something) {
            Some("Capabilities (Drover allows every task driver and network mode in every namespace)")
        } else if set(&self.node_pool_configuration) {
            Some("NodePoolConfiguration (Drover has no node pools)")
        } else if set(&self.vault_configuration) {
            Some("VaultConfiguration (Drover has no Vault integration)")
        } else if set(&self.consul_configuration) {
            Some("ConsulConfiguration (Drover has no Consul integration)")
        } else {
            None
        }
    }
}

/// Whether a `Capabilities` object names any driver or network mode (the
/// CLI sends it with empty lists).
fn capabilities_say_something(value: &Value) -> bool {
    match value {
        Value::Object(fields) => fields.values().any(super::spec::says_something),
        other => super::spec::says_something(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_drover_lacks_is_named_and_empty_blocks_pass() {
        let empty: NamespaceRequest = serde_json::from_str(
            r#"{"Name":"a","Quota":"","Capabilities":{"EnabledTaskDrivers":[],"DisabledTaskDrivers":null},"Meta":null}"#,
        )
        .expect("json");
        assert_eq!(empty.unsupported(), None);
        let quota: NamespaceRequest = serde_json::from_str(r#"{"Quota":"small"}"#).expect("json");
        assert!(quota.unsupported().expect("refused").starts_with("Quota"));
        let drivers: NamespaceRequest =
            serde_json::from_str(r#"{"Capabilities":{"DisabledTaskDrivers":["raw_exec"]}}"#).expect("json");
        assert!(drivers.unsupported().expect("refused").starts_with("Capabilities"));
    }
}
