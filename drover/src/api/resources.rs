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
    /// Memory in MiB: a task's reservation.
    #[serde(rename = "MemoryMB")]
    pub memory_mb: u64,
    /// A task's hard memory limit in MiB (`resources { memory_max }`);
    /// 0: none, `MemoryMB` is the limit.
    #[serde(rename = "MemoryMaxMB")]
    pub memory_max_mb: u64,
    /// Disk in MiB.
    #[serde(rename = "DiskMB")]
    pub disk_mb: u64,
    /// Always 0: Drover does not reserve IOPS.
    #[serde(rename = "IOPS")]
    pub iops: u64,
    /// An allocation's: the network it was given (its group's ports), as
    /// Nomad 1.0 still fills this older view; `null` otherwise.
    #[serde(rename = "Networks")]
    pub networks: Option<Vec<NetworkResource>>,
    /// Always null: Drover schedules no devices.
    #[serde(rename = "Devices")]
    pub devices: Option<Value>,
}

impl Resources {
    /// A task's ask: its resources and its hard memory limit.
    pub fn of_task(task: &engine::structs::Task) -> Resources {
        Resources { memory_max_mb: task.memory_max_mb, ..Resources::from(task.resources) }
    }
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

/// A network (`NetworkResource`): what a group asks for (`TaskGroup.Networks`,
/// its dynamic ports' values 0), or what an allocation was given
/// (`AllocatedResources.Shared.Networks`: the node's address and every port's
/// number). Host mode only.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NetworkResource {
    /// Always `host`.
    #[serde(rename = "Mode")]
    pub mode: String,
    /// Always `""`: Drover picks no device.
    #[serde(rename = "Device")]
    pub device: String,
    /// Always `""`.
    #[serde(rename = "CIDR")]
    pub cidr: String,
    /// The node address the ports are reached at; `""` in a group's ask.
    #[serde(rename = "IP")]
    pub ip: String,
    /// Always `null`.
    #[serde(rename = "DNS")]
    pub dns: Option<Value>,
    /// Ports asked for by number.
    #[serde(rename = "ReservedPorts")]
    pub reserved_ports: Vec<Port>,
    /// Ports the scheduler picks.
    #[serde(rename = "DynamicPorts")]
    pub dynamic_ports: Vec<Port>,
    /// Always 0: Drover reserves no bandwidth.
    #[serde(rename = "MBits")]
    pub mbits: u64,
}

impl From<&engine::structs::NetworkResource> for NetworkResource {
    fn from(network: &engine::structs::NetworkResource) -> Self {
        NetworkResource {
            mode: "host".to_string(),
            reserved_ports: network.reserved_ports.iter().map(Port::from).collect(),
            dynamic_ports: network.dynamic_ports.iter().map(Port::from).collect(),
            ..NetworkResource::default()
        }
    }
}

impl NetworkResource {
    /// The network `alloc` was given on its node, as Nomad's scheduler
    /// records its offer: the node's address, the ports its group asked for
    /// by number as `ReservedPorts`, the ones picked for it as
    /// `DynamicPorts`. `None` when it holds no port.
    pub fn allocated(alloc: &engine::structs::Allocation) -> Option<NetworkResource> {
        let first = alloc.ports.first()?;
        let asked = alloc.job.group(&alloc.task_group).and_then(|group| group.networks.first());
        let is_static =
            |label: &str| asked.is_some_and(|asked| asked.reserved_ports.iter().any(|p| &*p.label == label));
        let (reserved, dynamic): (Vec<_>, Vec<_>) = alloc.ports.iter().partition(|port| is_static(&port.label));
        let host_network = |label: &str| {
            let asked = asked?.reserved_ports.iter().chain(&asked?.dynamic_ports).find(|p| &*p.label == label)?;
            asked.host_network.as_deref().map(str::to_string)
        };
        let given = |ports: Vec<&engine::structs::AllocatedPort>| {
            ports
                .into_iter()
                .map(|port| Port {
                    label: port.label.to_string(),
                    value: port.value,
                    to: port.to,
                    host_network: host_network(&port.label).unwrap_or_else(|| DEFAULT_HOST_NETWORK.to_string()),
                })
                .collect()
        };
        Some(NetworkResource {
            mode: "host".to_string(),
            ip: first.host_ip.to_string(),
            reserved_ports: given(reserved),
            dynamic_ports: given(dynamic),
            ..NetworkResource::default()
        })
    }
}

/// A port of a network (`Port`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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

impl Default for Port {
    fn default() -> Self {
        Port { label: String::new(), value: 0, to: 0, host_network: DEFAULT_HOST_NETWORK.to_string() }
    }
}

/// Nomad's name for the network of the node's own address.
pub const DEFAULT_HOST_NETWORK: &str = "default";

impl From<&engine::structs::Port> for Port {
    fn from(port: &engine::structs::Port) -> Self {
        Port {
            label: port.label.to_string(),
            value: port.value,
            to: port.to,
            host_network: port.host_network.as_deref().unwrap_or(DEFAULT_HOST_NETWORK).to_string(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use engine::structs::{AllocatedPort, Allocation, EvalId, Job, JobType, NodeId, Resources as Ask};
    use std::sync::Arc;

    #[test]
    fn an_allocations_network_is_nomads_offer_with_the_nodes_address() {
        let mut job = Job::new_simple("web", JobType::Service, 1, Ask::new(1, 1, 0));
        job.task_groups[0].networks = vec![engine::structs::NetworkResource {
            reserved_ports: vec![engine::structs::Port::new("admin", 9090)],
            dynamic_ports: vec![engine::structs::Port::new("http", 0)],
        }];
        let job = Arc::new(job);
        let mut alloc = Allocation::new_placement(&job, "group", 0, NodeId::from_u128(1), EvalId::from_u128(1));
        assert_eq!(NetworkResource::allocated(&alloc), None, "no port, no network");
        alloc.ports = vec![
            AllocatedPort { label: "admin".into(), value: 9090, to: 0, host_ip: "10.0.0.5".into() },
            AllocatedPort { label: "http".into(), value: 20_123, to: 8080, host_ip: "10.0.0.5".into() },
        ];
        let network = NetworkResource::allocated(&alloc).expect("a network");
        let json = serde_json::to_value(&network).expect("json");
        assert_eq!(
            json,
            serde_json::json!({"Mode": "host", "Device": "", "CIDR": "", "IP": "10.0.0.5", "DNS": null, "MBits": 0,
                "ReservedPorts": [{"Label": "admin", "Value": 9090, "To": 0, "HostNetwork": "default"}],
                "DynamicPorts": [{"Label": "http", "Value": 20123, "To": 8080, "HostNetwork": "default"}]})
        );
    }
}
