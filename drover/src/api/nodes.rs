//! Client nodes (Nomad's `api/nodes.go`): the list stub, the full node
//! (never with its secret, with its drain), and the eligibility, drain
//! and evaluate writes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::format::rfc3339;
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
    /// Only with `?resources=true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_resources: Option<NodeResources>,
    /// Only with `?resources=true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved_resources: Option<NodeReservedResources>,
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
    /// An agent's own HTTP address: always empty, as agents serve no
    /// HTTP; Nomad's CLI, finding none, asks the servers for logs and files.
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
    pub drain_strategy: Option<DrainStrategy>,
    pub last_drain: Option<DrainMetadata>,
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
    pub cpu: NodeCpuResources,
    pub memory: MemoryResources,
    pub disk: DiskResources,
    /// The node's address (Nomad's fingerprinted host network).
    pub networks: Vec<NodeNetworkResource>,
    /// Its networks by interface, each address named by its host network
    /// (`default` for the node's own).
    pub node_networks: Vec<NodeNetwork>,
    pub devices: Option<Value>,
    pub min_dynamic_port: u16,
    pub max_dynamic_port: u16,
}

/// A node's CPU (`NodeCpuResources`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct NodeCpuResources {
    /// MHz: the node's total compute.
    pub cpu_shares: u64,
    /// The cores fingerprinted (`cpu.numcores`).
    pub total_cpu_cores: u64,
    /// Always empty: Drover reserves no cores.
    pub reservable_cpu_cores: Vec<u16>,
}

/// The node's address as Nomad's legacy network (`NetworkResource`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct NodeNetworkResource {
    /// Always `host`.
    pub mode: String,
    pub device: String,
    /// The address as a network of one (`10.0.0.5/32`).
    #[serde(rename = "CIDR")]
    pub cidr: String,
    #[serde(rename = "IP")]
    pub ip: String,
    #[serde(rename = "MBits")]
    pub mbits: u64,
}

/// One interface of the node (`NodeNetworkResource`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct NodeNetwork {
    /// Always `host`.
    pub mode: String,
    pub device: String,
    pub mac_address: String,
    pub speed: u64,
    pub addresses: Vec<NodeNetworkAddress>,
}

/// One address of a node's interface (`NodeNetworkAddress`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct NodeNetworkAddress {
    /// `ipv4` or `ipv6`.
    pub family: String,
    /// The host network's name (`default`: the node's own address).
    pub alias: String,
    pub address: String,
    /// Ports held back on it, as Nomad's port list.
    pub reserved_ports: String,
    pub gateway: String,
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

/// The ports a node holds back (`NodeReservedNetworkResources`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct NodeReservedNetworkResources {
    /// Nomad's port list (`"22,80,8000-8100"`).
    pub reserved_host_ports: String,
}

impl NodeResources {
    /// A node's resources and networks.
    pub fn of(node: &engine::structs::Node) -> NodeResources {
        let network = &node.network;
        let family = |ip: &str| if ip.contains(':') { "ipv6" } else { "ipv4" }.to_string();
        let address = |alias: &str, ip: &str, reserved: &engine::structs::PortSet| NodeNetworkAddress {
            family: family(ip),
            alias: alias.to_string(),
            address: ip.to_string(),
            reserved_ports: reserved.list_text(),
            gateway: String::new(),
        };
        let interface = |device: &str, addresses| NodeNetwork {
            mode: "host".to_string(),
            device: device.to_string(),
            mac_address: String::new(),
            speed: 0,
            addresses,
        };
        let mut node_networks =
            vec![interface(&network.device, vec![address("default", &network.ip, &network.reserved_ports)])];
        for (name, host_network) in &network.host_networks {
            let found = address(name, &host_network.ip, &host_network.reserved_ports);
            match node_networks
                .iter_mut()
                .find(|known| *known.device == *host_network.device && !known.device.is_empty())
            {
                Some(known) => known.addresses.push(found),
                None => node_networks.push(interface(&host_network.device, vec![found])),
            }
        }
        let prefix = if network.ip.contains(':') { 128 } else { 32 };
        NodeResources {
            cpu: NodeCpuResources {
                cpu_shares: node.resources.cpu,
                total_cpu_cores: node.attributes.get("cpu.numcores").and_then(|cores| cores.parse().ok()).unwrap_or(0),
                reservable_cpu_cores: Vec::new(),
            },
            memory: MemoryResources { memory_mb: node.resources.memory_mb },
            disk: DiskResources { disk_mb: node.resources.disk_mb },
            networks: vec![NodeNetworkResource {
                mode: "host".to_string(),
                device: network.device.to_string(),
                cidr: format!("{}/{prefix}", network.ip),
                ip: network.ip.to_string(),
                mbits: 0,
            }],
            node_networks,
            devices: None,
            min_dynamic_port: network.min_dynamic_port,
            max_dynamic_port: network.max_dynamic_port,
        }
    }
}

impl NodeReservedResources {
    /// What a node holds back: its reserved resources and ports.
    pub fn of(node: &engine::structs::Node) -> NodeReservedResources {
        let reserved = node.reserved;
        NodeReservedResources {
            cpu: CpuResources { cpu_shares: reserved.cpu },
            memory: MemoryResources { memory_mb: reserved.memory_mb },
            disk: DiskResources { disk_mb: reserved.disk_mb },
            networks: NodeReservedNetworkResources { reserved_host_ports: node.network.reserved_ports.list_text() },
        }
    }
}

/// The node's drivers, from its `driver.<name>` attributes (their
/// convention is [`engine::structs::Node::has_driver`]'s).
fn drivers(node: &engine::structs::Node) -> BTreeMap<String, DriverInfo> {
    node.attributes
        .iter()
        .filter_map(|(key, value)| {
            let name = key.strip_prefix("driver.").filter(|name| !name.contains('.'))?;
            Some((name.to_string(), driver_info(node, name, value)))
        })
        .collect()
}

/// What the node says of the driver `name`, whose `driver.<name>`
/// attribute is `value`: `0` is detected but unhealthy, `false` not
/// detected; the description is its `driver.<name>.health`, its
/// attributes the other `driver.<name>.*`.
fn driver_info(node: &engine::structs::Node, name: &str, value: &str) -> DriverInfo {
    let detected = value != "false";
    let healthy = detected && value != "0";
    let prefix = format!("driver.{name}.");
    let health_key = format!("{prefix}health");
    let attributes: BTreeMap<String, String> = node
        .attributes
        .range(prefix.clone()..)
        .take_while(|(key, _)| key.starts_with(&prefix))
        .filter(|(key, _)| **key != health_key)
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    let health_description = match node.attributes.get(&health_key) {
        Some(description) => description.clone(),
        None if healthy => "Healthy".to_string(),
        None => String::new(),
    };
    DriverInfo {
        attributes: (!attributes.is_empty()).then_some(attributes),
        detected,
        healthy,
        health_description,
        update_time: None,
    }
}

fn attribute(node: &engine::structs::Node, name: &str) -> String {
    node.attributes.get(name).cloned().unwrap_or_default()
}

impl NodeListStub {
    /// The stub of `node`, with its resources when `resources` (the list's
    /// `?resources=true`).
    pub fn of(node: &engine::structs::Node, resources: bool) -> Self {
        NodeListStub {
            node_resources: resources.then(|| NodeResources::of(node)),
            reserved_resources: resources.then(|| NodeReservedResources::of(node)),
            ..NodeListStub::from(node)
        }
    }
}

/// Nomad's `StatusDescription`: empty, but for a node the storm guard
/// holds (`docs/node-lifecycle.md`), which says so and when its
/// allocations' replacements may be placed.
fn status_description(node: &engine::structs::Node) -> String {
    node.hold.map_or_else(String::new, |hold| {
        format!(
            "held by the storm guard since {} (mass heartbeat loss): not down; its allocations are replaced from {}",
            rfc3339(hold.since),
            rfc3339(hold.release_at)
        )
    })
}

impl From<&engine::structs::Node> for NodeListStub {
    fn from(node: &engine::structs::Node) -> Self {
        NodeListStub {
            address: node.network.ip.to_string(),
            id: node.id.to_string(),
            datacenter: node.datacenter.to_string(),
            name: node.name.clone(),
            node_class: node.node_class.to_string(),
            version: attribute(node, "nomad.version"),
            drain: node.is_draining(),
            scheduling_eligibility: word(node.eligibility),
            status: word(node.status),
            status_description: status_description(node),
            drivers: drivers(node),
            host_volumes: None,
            node_resources: None,
            reserved_resources: None,
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
            node_resources: NodeResources::of(node),
            reserved_resources: NodeReservedResources::of(node),
            resources: Resources::from(total),
            reserved: Resources::from(reserved),
            links: None,
            meta: node.meta.clone(),
            node_class: node.node_class.to_string(),
            computed_class: node.computed_class.0.to_string(),
            drain: node.is_draining(),
            drain_strategy: node.drain.strategy.as_ref().map(DrainStrategy::from),
            last_drain: node.drain.last.as_ref().map(DrainMetadata::from),
            scheduling_eligibility: word(node.eligibility),
            status: word(node.status),
            status_description: status_description(node),
            // Nomad's are Unix seconds.
            status_updated_at: node.status_updated_at.0 / 1_000_000_000,
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

/// A node's drain as Nomad answers it (`DrainStrategy`, its `DrainSpec`
/// flattened).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct DrainStrategy {
    /// Nanoseconds: negative forces at once, zero is no deadline.
    pub deadline: i64,
    /// Whether system allocations stay.
    pub ignore_system_jobs: bool,
    /// When what remains is stopped (RFC 3339; Go's zero time without a deadline).
    pub force_deadline: String,
    /// When the drain started (RFC 3339).
    pub started_at: String,
}

/// Go's zero `time.Time`, as Nomad writes an unset time in a struct.
const GO_ZERO_TIME: &str = "0001-01-01T00:00:00Z";

impl From<&engine::structs::DrainStrategy> for DrainStrategy {
    fn from(drain: &engine::structs::DrainStrategy) -> Self {
        DrainStrategy {
            deadline: drain.deadline.as_nanos(),
            ignore_system_jobs: drain.ignore_system_jobs,
            force_deadline: drain.force_deadline().map_or_else(|| GO_ZERO_TIME.to_string(), rfc3339),
            started_at: rfc3339(drain.started_at),
        }
    }
}

/// The record of a node's last drain (`DrainMetadata`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct DrainMetadata {
    pub started_at: String,
    pub updated_at: String,
    /// `draining`, `complete` or `canceled`.
    pub status: String,
    #[serde(rename = "AccessorID")]
    pub accessor_id: String,
    pub meta: Option<BTreeMap<String, String>>,
}

impl From<&engine::structs::DrainMetadata> for DrainMetadata {
    fn from(record: &engine::structs::DrainMetadata) -> Self {
        DrainMetadata {
            started_at: rfc3339(record.started_at),
            updated_at: rfc3339(record.updated_at),
            status: record.status.as_str().to_string(),
            accessor_id: record.accessor_id.clone(),
            meta: (!record.meta.is_empty()).then(|| record.meta.clone()),
        }
    }
}

/// `PUT /v1/node/:id/drain` body (`NodeUpdateDrainRequest`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeUpdateDrainRequest {
    /// The node (checked against the path when set).
    #[serde(rename = "NodeID")]
    pub node_id: Option<String>,
    /// The drain (`null`: it ends).
    pub drain_spec: Option<DrainSpec>,
    /// Whether the node becomes eligible as its drain ends.
    pub mark_eligible: bool,
    /// What the operator attaches to the drain's record.
    pub meta: Option<BTreeMap<String, String>>,
}

/// A drain as an operator asks for it (`DrainSpec`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct DrainSpec {
    /// Nanoseconds: negative forces at once, zero is no deadline.
    pub deadline: i64,
    /// Whether system allocations stay.
    pub ignore_system_jobs: bool,
}

/// The answer to a drain write (`NodeDrainUpdateResponse`) and to a node
/// evaluation (`NodeUpdateResponse`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct NodeWriteResponse {
    #[serde(rename = "EvalIDs")]
    pub eval_ids: Option<Vec<String>>,
    pub eval_create_index: u64,
    pub node_modify_index: u64,
    #[serde(flatten)]
    pub meta: WriteMeta,
}

/// `PUT /v1/node/:id/eligibility` body (`NodeUpdateEligibilityRequest`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NodeUpdateEligibilityRequest {
    /// `eligible` or `ineligible`.
    pub eligibility: Option<String>,
}

/// The answer to an eligibility write (`NodeEligibilityUpdateResponse`)
/// and to a purge (`NodeUpdateResponse`, the same fields).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct NodeEligibilityUpdateResponse {
    /// The evals the write created: a purge's, one per job with
    /// allocations on the node; always empty for an eligibility change.
    #[serde(rename = "EvalIDs")]
    pub eval_ids: Vec<String>,
    pub eval_create_index: u64,
    pub node_modify_index: u64,
    #[serde(flatten)]
    pub meta: WriteMeta,
}

#[cfg(test)]
mod tests {
    use engine::structs::{NodeId, Resources};

    use super::*;

    #[test]
    fn drivers_show_their_health_and_their_own_attributes() {
        let mut node = engine::structs::Node::new_ready(NodeId::from_u128(1), "dc1", "", Resources::new(1000, 1024, 0));
        let refused = "Failed to connect to docker daemon: connection refused";
        for (key, value) in [
            ("driver.docker", "0"),
            ("driver.docker.health", refused),
            ("driver.docker.version", "27.1"),
            ("driver.dockerd", "1"),
            ("driver.rkt", "false"),
        ] {
            node.attributes.insert(key.to_string(), value.to_string());
        }
        let drivers = drivers(&node);
        let docker = DriverInfo {
            attributes: Some(BTreeMap::from([("driver.docker.version".to_string(), "27.1".to_string())])),
            detected: true,
            healthy: false,
            health_description: refused.to_string(),
            update_time: None,
        };
        assert_eq!(drivers.get("docker"), Some(&docker), "its health is no attribute; dockerd's are not its");
        let exec = DriverInfo {
            detected: true,
            healthy: true,
            health_description: "Healthy".to_string(),
            ..Default::default()
        };
        assert_eq!(drivers.get("exec"), Some(&exec));
        assert_eq!(drivers.get("dockerd").map(|info| info.healthy), Some(true));
        assert_eq!(drivers.get("rkt").map(|info| (info.detected, info.healthy)), Some((false, false)));
        assert_eq!(drivers.len(), 4);
        // Healthy again: what its health check said.
        node.attributes.insert("driver.docker".to_string(), "1".to_string());
        node.attributes.insert("driver.docker.health".to_string(), "Healthy".to_string());
        let docker = &super::drivers(&node)["docker"];
        assert_eq!((docker.detected, docker.healthy, docker.health_description.as_str()), (true, true, "Healthy"));
    }

    #[test]
    fn a_held_node_says_so_in_its_status_description() {
        use engine::clock::Timestamp;
        let mut node = engine::structs::Node::new_ready(NodeId::from_u128(1), "dc1", "", Resources::new(1000, 1024, 0));
        assert_eq!(Node::from(&node).status_description, "");
        node.status = engine::structs::NodeStatus::Disconnected;
        node.hold = Some(engine::structs::NodeHold { since: Timestamp(0), release_at: Timestamp(2_000_000_000) });
        let stub = NodeListStub::from(&node);
        assert_eq!(stub.status, "disconnected");
        assert!(stub.status_description.starts_with("held by the storm guard since 1970-01-01T00:00:00"));
        assert!(
            stub.status_description.ends_with("replaced from 1970-01-01T00:00:02.000000000Z"),
            "{}",
            stub.status_description
        );
    }
}
