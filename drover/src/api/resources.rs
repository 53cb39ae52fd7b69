//! Resources (Nomad's `api/resources.go`): what a task asks for, a group's
//! ports, and the views of CPU, memory and disk that nodes and allocations
//! carry.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `Resources`: a task's ask, an allocation's or a node's total.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Resources {
    /// CPU shares in MHz.
    #[serde(rename = "CPU")]
    pub cpu: u64,
    /// Memory in MiB.
    #[serde(rename = "MemoryMB")]
    pub memory_mb: u64,
    /// Disk in MiB.
    #[serde(rename = "DiskMB")]
    pub disk_mb: u64,
    /// Always 0: Drover does not reserve IOPS.
    #[serde(rename = "IOPS")]
    pub iops: u64,
    /// Always null: ports are the group's (`TaskGroup.Networks`).
    #[serde(rename = "Networks")]
    pub networks: Option<Value>,
    /// Always null: Drover schedules no devices.
    #[serde(rename = "Devices")]
    pub devices: Option<Value>,
}

impl From<engine::structs::Resources> for Resources {
    fn from(resources: engine::structs::Resources) -> Self {
        Resources {
            cpu: resources.cpu,
            memory_mb: resources.memory_mb,
            disk_mb: resources.disk_mb,
            ..Resources::default()
        }
    }
}

/// A group's network (`NetworkResource`): host mode, its ports.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct NetworkResource {
    /// Always `host`.
    pub mode: String,
    /// Ports asked for by number.
    pub reserved_ports: Vec<Port>,
    /// Ports the scheduler picks.
    pub dynamic_ports: Vec<Port>,
}

impl From<&engine::structs::NetworkResource> for NetworkResource {
    fn from(network: &engine::structs::NetworkResource) -> Self {
        NetworkResource {
            mode: "host".to_string(),
            reserved_ports: network.reserved_ports.iter().map(Port::from).collect(),
            dynamic_ports: network.dynamic_ports.iter().map(Port::from).collect(),
        }
    }
}

/// A port of a group's network (`Port`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct Port {
    /// The label tasks know it by.
    pub label: String,
    /// The host port (0: dynamic, not yet picked).
    pub value: u16,
    /// The port the task listens on (0: `value`).
    pub to: u16,
    /// The client host network it is on (`default`: the node's address).
    pub host_network: String,
}

impl From<&engine::structs::Port> for Port {
    fn from(port: &engine::structs::Port) -> Self {
        Port {
            label: port.label.to_string(),
            value: port.value,
            to: port.to,
            host_network: port.host_network.as_deref().unwrap_or("default").to_string(),
        }
    }
}

/// A port an allocation holds on its node (`PortMapping`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct PortMapping {
    /// The label from the group's network.
    pub label: String,
    /// The host port.
    pub value: u16,
    /// The port the task listens on (0: `value`).
    pub to: u16,
    /// The node address the port is reached at.
    #[serde(rename = "HostIP")]
    pub host_ip: String,
}

impl From<&engine::structs::AllocatedPort> for PortMapping {
    fn from(port: &engine::structs::AllocatedPort) -> Self {
        PortMapping { label: port.label.to_string(), value: port.value, to: port.to, host_ip: port.host_ip.to_string() }
    }
}

/// CPU as nodes and allocations carry it (`NodeCpuResources`,
/// `AllocatedCpuResources`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct CpuResources {
    /// MHz.
    pub cpu_shares: u64,
}

/// Memory as nodes and allocations carry it (`NodeMemoryResources`,
/// `AllocatedMemoryResources`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MemoryResources {
    /// MiB.
    #[serde(rename = "MemoryMB")]
    pub memory_mb: u64,
}

/// Disk as nodes carry it (`NodeDiskResources`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DiskResources {
    /// MiB.
    #[serde(rename = "DiskMB")]
    pub disk_mb: u64,
}
