//! Client nodes (Nomad's `api/nodes.go`): the list stub, the full node
//! (never with its secret), and the eligibility write.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::resources::{CpuResources, DiskResources, MemoryResources, Resources};
use super::{word, WriteMeta, ADVERTISE_ATTRIBUTE};

/// A node in `GET /v1/nodes` (`NodeListStub`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct NodeListStub {
    pub address: String,
    #[serde(rename = "ID")]
    pub id: String,
    pub datacenter: String,
    pub name: String,
    pub node_class: String,
    pub version: String,
    pub drain: bool,
    /// `eligible` or `ineligible`.
    pub scheduling_eligibility: String,
    pub status: String,
    pub status_description: String,
    /// Driver name to what the node reported of it.
    pub drivers: BTreeMap<String, DriverInfo>,
    pub host_volumes: Option<Value>,
    pub create_index: u64,
    pub modify_index: u64,
}

/// A full node (`GET /v1/node/:id`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct Node {
    #[serde(rename = "ID")]
    pub id: String,
    /// Always `""`: a node's secret is never answered.
    #[serde(rename = "SecretID")]
    pub secret_id: String,
    pub datacenter: String,
    pub name: String,
    /// The agent's own HTTP listener (task logs), when it has one.
    #[serde(rename = "HTTPAddr")]
    pub http_addr: String,
    #[serde(rename = "TLSEnabled")]
    pub tls_enabled: bool,
    pub attributes: BTreeMap<String, String>,
    pub node_resources: NodeResources,
    pub reserved_resources: NodeReservedResources,
    pub resources: Resources,
    pub reserved: Resources,
    pub links: Option<Value>,
    pub meta: BTreeMap<String, String>,
    pub node_class: String,
    pub computed_class: String,
    pub drain: bool,
    pub drain_strategy: Option<Value>,
    pub scheduling_eligibility: String,
    pub status: String,
    pub status_description: String,
    pub status_updated_at: u64,
    /// Always empty: Drover records no node events.
    pub events: Vec<Value>,
    pub drivers: BTreeMap<String, DriverInfo>,
    pub host_volumes: Option<Value>,
    #[serde(rename = "CSIControllerPlugins")]
    pub csi_controller_plugins: Option<Value>,
    #[serde(rename = "CSINodePlugins")]
    pub csi_node_plugins: Option<Value>,
    pub create_index: u64,
    pub modify_index: u64,
}

/// What a node reported of a driver (`DriverInfo`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct DriverInfo {
    pub attributes: Option<BTreeMap<String, String>>,
    pub detected: bool,
    pub healthy: bool,
    pub health_description: String,
    pub update_time: Option<String>,
}

/// A node's total resources (`NodeResources`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct NodeResources {
    pub cpu: CpuResources,
    pub memory: MemoryResources,
    pub disk: DiskResources,
    pub networks: Option<Value>,
    pub node_networks: Option<Value>,
    pub devices: Option<Value>,
}

/// What a node holds back (`NodeReservedResources`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct NodeReservedResources {
    pub cpu: CpuResources,
    pub memory: MemoryResources,
    pub disk: DiskResources,
    pub networks: NodeReservedNetworkResources,
}

/// The ports a node holds back (`NodeReservedNetworkResources`): Drover
/// keeps them in the node's network, so `""` here.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct NodeReservedNetworkResources {
    pub reserved_host_ports: String,
}

/// The node's drivers, from its `driver.<name>` attributes.
fn drivers(node: &engine::structs::Node) -> BTreeMap<String, DriverInfo> {
    node.attributes
        .iter()
        .filter_map(|(key, value)| {
            let name = key.strip_prefix("driver.").filter(|name| !name.contains('.'))?;
            let detected = value != "0" && value != "false";
            let info = DriverInfo { detected, healthy: detected, ..DriverInfo::default() };
            Some((name.to_string(), info))
        })
        .collect()
}

fn attribute(node: &engine::structs::Node, name: &str) -> String {
    node.attributes.get(name).cloned().unwrap_or_default()
}

impl From<&engine::structs::Node> for NodeListStub {
    fn from(node: &engine::structs::Node) -> Self {
        NodeListStub {
            address: attribute(node, "unique.network.ip-address"),
            id: node.id.to_string(),
            datacenter: node.datacenter.to_string(),
            name: node.name.clone(),
            node_class: node.node_class.to_string(),
            version: attribute(node, "drover.version"),
            drain: false,
            scheduling_eligibility: word(node.eligibility),
            status: word(node.status),
            status_description: String::new(),
            drivers: drivers(node),
            host_volumes: None,
            create_index: node.create_index,
            modify_index: node.modify_index,
        }
    }
}

impl From<&engine::structs::Node> for Node {
    fn from(node: &engine::structs::Node) -> Self {
        let (total, reserved) = (node.resources, node.reserved);
        Node {
            id: node.id.to_string(),
            secret_id: String::new(),
            datacenter: node.datacenter.to_string(),
            name: node.name.clone(),
            http_addr: attribute(node, ADVERTISE_ATTRIBUTE),
            tls_enabled: false,
            attributes: node.attributes.clone(),
            node_resources: NodeResources {
                cpu: CpuResources { cpu_shares: total.cpu },
                memory: MemoryResources { memory_mb: total.memory_mb },
                disk: DiskResources { disk_mb: total.disk_mb },
                ..NodeResources::default()
            },
            reserved_resources: NodeReservedResources {
                cpu: CpuResources { cpu_shares: reserved.cpu },
                memory: MemoryResources { memory_mb: reserved.memory_mb },
                disk: DiskResources { disk_mb: reserved.disk_mb },
                networks: NodeReservedNetworkResources::default(),
            },
            resources: Resources::from(total),
            reserved: Resources::from(reserved),
            links: None,
            meta: node.meta.clone(),
            node_class: node.node_class.to_string(),
            computed_class: node.computed_class.0.to_string(),
            drain: false,
            drain_strategy: None,
            scheduling_eligibility: word(node.eligibility),
            status: word(node.status),
            status_description: String::new(),
            status_updated_at: 0,
            events: Vec::new(),
            drivers: drivers(node),
            host_volumes: None,
            csi_controller_plugins: None,
            csi_node_plugins: None,
            create_index: node.create_index,
            modify_index: node.modify_index,
        }
    }
}

/// `PUT /v1/node/:id/eligibility` body (`NodeUpdateEligibilityRequest`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeUpdateEligibilityRequest {
    /// `eligible` or `ineligible`.
    pub eligibility: Option<String>,
}

/// The answer to an eligibility write (`NodeEligibilityUpdateResponse`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct NodeEligibilityUpdateResponse {
    /// Always empty: marking a node creates no eval in Drover.
    #[serde(rename = "EvalIDs")]
    pub eval_ids: Vec<String>,
    pub eval_create_index: u64,
    pub node_modify_index: u64,
    #[serde(flatten)]
    pub meta: WriteMeta,
}
