//! Nomad-native service discovery (Nomad 1.3+'s `api/services.go`): the
//! service names of each namespace, and the registrations of a service,
//! job or allocation.

use serde::{Deserialize, Serialize};

/// One namespace's services (an entry of `GET /v1/services`,
/// `ServiceRegistrationListStub`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ServiceRegistrationListStub {
    /// The namespace.
    pub namespace: String,
    /// Its services, sorted by name.
    pub services: Vec<ServiceRegistrationStub>,
}

/// A service name and the union of its instances' tags
/// (`ServiceRegistrationStub`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ServiceRegistrationStub {
    /// The service's name.
    pub service_name: String,
    /// Every tag any instance carries, sorted, once each.
    pub tags: Vec<String>,
}

/// One registered instance of a service (`ServiceRegistration`), as
/// `GET /v1/service/<name>`, `/v1/job/<id>/services` and
/// `/v1/allocation/<id>/services` answer it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServiceRegistration {
    /// `_nomad-task-<alloc>-<task or group-<group>>-<service>-<port label>`.
    #[serde(rename = "ID")]
    pub id: String,
    /// The service's name.
    #[serde(rename = "ServiceName")]
    pub service_name: String,
    /// The namespace of the allocation's job.
    #[serde(rename = "Namespace")]
    pub namespace: String,
    /// The node the allocation runs on.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// That node's datacenter.
    #[serde(rename = "Datacenter")]
    pub datacenter: String,
    /// The allocation's job.
    #[serde(rename = "JobID")]
    pub job_id: String,
    /// The allocation.
    #[serde(rename = "AllocID")]
    pub alloc_id: String,
    /// Its tags (`[]` when none, never `null`).
    #[serde(rename = "Tags")]
    pub tags: Vec<String>,
    /// The address the service answers on.
    #[serde(rename = "Address")]
    pub address: String,
    /// The port it answers on.
    #[serde(rename = "Port")]
    pub port: u16,
    /// Index at which it was first registered.
    #[serde(rename = "CreateIndex")]
    pub create_index: u64,
    /// Index of its last change.
    #[serde(rename = "ModifyIndex")]
    pub modify_index: u64,
}

impl From<&engine::structs::ServiceRegistration> for ServiceRegistration {
    fn from(registration: &engine::structs::ServiceRegistration) -> Self {
        ServiceRegistration {
            id: registration.id.clone(),
            service_name: registration.service_name.clone(),
            namespace: registration.namespace.to_string(),
            node_id: registration.node_id.to_string(),
            datacenter: registration.datacenter.to_string(),
            job_id: registration.job_id.to_string(),
            alloc_id: registration.alloc_id.to_string(),
            tags: registration.tags.clone(),
            address: registration.address.clone(),
            port: registration.port,
            create_index: registration.create_index,
            modify_index: registration.modify_index,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use engine::structs::{AllocId, NodeId, ServiceOwner};

    use super::*;

    #[test]
    fn registrations_serialize_with_nomads_field_names_in_its_order() {
        let alloc_id = AllocId::from_u128(7);
        let registration = engine::structs::ServiceRegistration {
            id: engine::structs::ServiceRegistration::make_id(alloc_id, ServiceOwner::Task("server"), "web", "http"),
            service_name: "web".into(),
            namespace: Arc::from("default"),
            node_id: NodeId::from_u128(1),
            datacenter: Arc::from("dc1"),
            job_id: Arc::from("example"),
            alloc_id,
            tags: vec![],
            address: "10.0.0.5".into(),
            port: 23456,
            create_index: 3,
            modify_index: 9,
        };
        let text = serde_json::to_string(&ServiceRegistration::from(&registration)).expect("json");
        let json: serde_json::Value = serde_json::from_str(&text).expect("parses");
        let mut keys: Vec<&str> = json.as_object().expect("an object").keys().map(String::as_str).collect();
        keys.sort_by_key(|key| text.find(&format!("\"{key}\":")).expect("the key is in the text"));
        let nomads = [
            "ID",
            "ServiceName",
            "Namespace",
            "NodeID",
            "Datacenter",
            "JobID",
            "AllocID",
            "Tags",
            "Address",
            "Port",
            "CreateIndex",
            "ModifyIndex",
        ];
        assert_eq!(keys, nomads);
        assert_eq!(json["Tags"], serde_json::json!([]));
        assert_eq!(json["AllocID"], alloc_id.to_string());
        assert_eq!(json["Port"], 23456);
    }
}
