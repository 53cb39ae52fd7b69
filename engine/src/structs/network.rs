//! Network ports: what a task group asks for, what a node offers, what an
//! allocation was given, and the environment a task sees them in.
//!
//! Contract:
//! - A group's [`NetworkResource`] asks for static ports (a fixed number,
//!   Nomad's `ReservedPorts`) and dynamic ports (any free number in the
//!   node's dynamic range, Nomad's `DynamicPorts`), each with a label.
//! - A node offers every port but its [`NodeNetwork::reserved_ports`]; dynamic
//!   ones come from `min_dynamic_port..=max_dynamic_port` (Nomad's defaults,
//!   20000-32000).
//! - A port is reached at the node's address, or at the address of the host
//!   network it names ([`Port::host_network`], Nomad's client
//!   `host_network`); a node without that host network cannot run the group.
//!   Ports are accounted per node, not per address: a port taken on one of a
//!   node's addresses is taken on all of them, which is stricter than Nomad
//!   and never lets two allocations share a port.
//! - An [`Allocation`] carries the ports it was given
//!   ([`Allocation::ports`]); no port is held twice on one node by live
//!   allocations (the stack, the plan applier and the state store each check it).
//! - [`port_env`] turns an allocation's ports into task environment variables
//!   under a prefix (`NOMAD_` for Nomad job files).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::Allocation;

/// The environment prefix Nomad job files expect (`NOMAD_PORT_http`, ...).
pub const NOMAD_ENV_PREFIX: &str = "NOMAD_";

/// Nomad's default first dynamic port.
pub const DEFAULT_MIN_DYNAMIC_PORT: u16 = 20_000;

/// Nomad's default last dynamic port.
pub const DEFAULT_MAX_DYNAMIC_PORT: u16 = 32_000;

/// One port a group asks for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Port {
    /// The name tasks know it by (`http` gives `NOMAD_PORT_http`): letters,
    /// digits and `_`, unique within the group.
    pub label: Arc<str>,
    /// The host port: required for a static port, 0 for a dynamic one
    /// (the scheduler picks it).
    #[serde(default)]
    pub value: u16,
    /// The port the task listens on when it differs from the host port
    /// (Nomad's `to`); 0: the host port.
    #[serde(default)]
    pub to: u16,
    /// The node's host network the port is reached on (Nomad's
    /// `host_network`); `None`: the node's own address (Nomad's `default`).
    #[serde(default)]
    pub host_network: Option<Arc<str>>,
}

impl Port {
    /// A port labelled `label` with host port `value` (0: dynamic), on the
    /// node's own address.
    pub fn new(label: &str, value: u16) -> Port {
        Port { label: Arc::from(label), value, to: 0, host_network: None }
    }
}

/// A task group's network (Nomad's group `network` block, host mode): the
/// ports each of its allocations needs on its node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NetworkResource {
    /// Ports with a fixed host number (HCL `port "db" { static = 5432 }`,
    /// Nomad JSON `ReservedPorts`). A node where one is taken or reserved
    /// cannot run the group.
    #[serde(default)]
    pub reserved_ports: Vec<Port>,
    /// Ports the scheduler picks from the node's dynamic range (HCL
    /// `port "http" {}`, Nomad JSON `DynamicPorts`); their `value` is ignored.
    #[serde(default)]
    pub dynamic_ports: Vec<Port>,
}

impl NetworkResource {
    /// Lists what is wrong with the ports of the group at `place`.
    pub(super) fn problems(&self, place: &str, problems: &mut Vec<String>) {
        let mut labels = std::collections::BTreeSet::new();
        let mut statics = std::collections::BTreeSet::new();
        for port in self.reserved_ports.iter().chain(&self.dynamic_ports) {
            if port.label.is_empty() || !port.label.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                problems.push(format!(
                    "{place}: port label {:?} must be letters, digits and '_' (it names environment variables)",
                    port.label
                ));
            }
            if !labels.insert(port.label.clone()) {
                problems.push(format!("{place}: port label {:?} is used more than once", port.label));
            }
        }
        for port in &self.reserved_ports {
            if port.value == 0 {
                problems.push(format!("{place}: static port {:?} needs a value from 1 to 65535", port.label));
            } else if !statics.insert(port.value) {
                problems.push(format!("{place}: static port {} is asked for more than once", port.value));
            }
        }
    }
}

/// A port an allocation was given on its node (Nomad's `AllocatedPortMapping`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AllocatedPort {
    /// The label from the group's network.
    pub label: Arc<str>,
    /// The host port.
    pub value: u16,
    /// The port the task listens on, if it differs (0: `value`).
    pub to: u16,
    /// The node address the port is reached at.
    pub host_ip: Arc<str>,
}

/// A node's ports: its address, what it holds back, and its dynamic range.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeNetwork {
    /// The address tasks' ports are reached at (`NOMAD_IP_<label>`).
    #[serde(default = "default_ip")]
    pub ip: Arc<str>,
    /// The interface `ip` is on, as the agent found it (`""`: not known).
    #[serde(default)]
    pub device: Arc<str>,
    /// Ports no allocation may take (the SSH daemon's, the agent's own,
    /// and those of every host network).
    #[serde(default)]
    pub reserved_ports: PortSet,
    /// The node's named host networks (Nomad's client `host_network`), by
    /// name: where a port that names one is reached.
    #[serde(default)]
    pub host_networks: BTreeMap<Arc<str>, HostNetwork>,
    /// The first port dynamic ports are picked from.
    #[serde(default = "default_min_dynamic_port")]
    pub min_dynamic_port: u16,
    /// The last port dynamic ports are picked from.
    #[serde(default = "default_max_dynamic_port")]
    pub max_dynamic_port: u16,
}

fn default_ip() -> Arc<str> {
    Arc::from("127.0.0.1")
}

fn default_min_dynamic_port() -> u16 {
    DEFAULT_MIN_DYNAMIC_PORT
}

fn default_max_dynamic_port() -> u16 {
    DEFAULT_MAX_DYNAMIC_PORT
}

impl Default for NodeNetwork {
    fn default() -> Self {
        NodeNetwork {
            ip: default_ip(),
            device: Arc::from(""),
            reserved_ports: PortSet::default(),
            host_networks: BTreeMap::new(),
            min_dynamic_port: DEFAULT_MIN_DYNAMIC_PORT,
            max_dynamic_port: DEFAULT_MAX_DYNAMIC_PORT,
        }
    }
}

/// A named network of a node (Nomad's client `host_network` block): the
/// address the agent found for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostNetwork {
    /// The address ports on this network are reached at.
    pub ip: Arc<str>,
    /// The interface the address is on (`""`: not known).
    #[serde(default)]
    pub device: Arc<str>,
    /// The ports this network holds back (also in the node's
    /// [`NodeNetwork::reserved_ports`], since ports are held per node).
    #[serde(default)]
    pub reserved_ports: PortSet,
}

impl NodeNetwork {
    /// The address a port on `host_network` is reached at: the node's own
    /// for none (Nomad's `default`), the named network's otherwise; `None`
    /// when the node has no such network.
    pub fn address_for(&self, host_network: Option<&str>) -> Option<&Arc<str>> {
        match host_network {
            None => Some(&self.ip),
            Some(name) => self.host_networks.get(name).map(|network| &network.ip),
        }
    }

    /// How many ports the dynamic range holds.
    pub fn dynamic_range_len(&self) -> usize {
        usize::from(self.max_dynamic_port.saturating_sub(self.min_dynamic_port)) + 1
    }

    /// Why a node's network is unusable, if it is.
    pub fn problem(&self) -> Option<String> {
        (self.min_dynamic_port == 0 || self.min_dynamic_port > self.max_dynamic_port).then(|| {
            format!("dynamic port range {}-{} is empty or starts at 0", self.min_dynamic_port, self.max_dynamic_port)
        })
    }
}

/// Why a port list (Nomad's `"22,80,8000-8100"`) could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PortListError {
    /// An entry is not a port number from 1 to 65535.
    #[error("{0:?} is not a port number from 1 to 65535")]
    NotAPort(String),
    /// A range ends before it starts.
    #[error("range {0:?} ends before it starts")]
    Backwards(String),
}

/// Port numbers as a sorted multiset behind an `Arc`: cloning one is a
/// reference count, lookups are binary searches, and a change builds a new
/// set (the state store's snapshots share the old one). A port held twice is
/// kept twice, so removing one holder never frees it for the other; live
/// allocations never hold a port twice, and [`PortSet::duplicates`] is how
/// audits check it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "Vec<u16>", into = "Vec<u16>")]
pub struct PortSet(Arc<[u16]>);

impl From<Vec<u16>> for PortSet {
    fn from(mut ports: Vec<u16>) -> Self {
        ports.sort_unstable();
        PortSet(ports.into())
    }
}

impl From<PortSet> for Vec<u16> {
    fn from(set: PortSet) -> Self {
        set.0.to_vec()
    }
}

impl PortSet {
    /// The ports of `iter`.
    pub fn of(iter: impl IntoIterator<Item = u16>) -> PortSet {
        PortSet::from(iter.into_iter().collect::<Vec<_>>())
    }

    /// Whether `port` is held.
    pub fn contains(&self, port: u16) -> bool {
        self.0.binary_search(&port).is_ok()
    }

    /// How many held ports lie in `low..=high` (duplicates counted).
    pub fn count_in(&self, low: u16, high: u16) -> usize {
        let start = self.0.partition_point(|port| *port < low);
        let end = self.0.partition_point(|port| *port <= high);
        end.saturating_sub(start)
    }

    /// How many ports are held (duplicates counted).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no port is held.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The held ports in order.
    pub fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        self.0.iter().copied()
    }

    /// This set with `added` held once more and `removed` held once less
    /// (a port not held is ignored).
    pub fn changed(&self, added: &[u16], removed: &[u16]) -> PortSet {
        let mut ports = self.0.to_vec();
        for port in removed {
            if let Ok(position) = ports.binary_search(port) {
                ports.remove(position);
            }
        }
        for port in added {
            let position = ports.partition_point(|held| held < port);
            ports.insert(position, *port);
        }
        PortSet(ports.into())
    }

    /// Reads Nomad's port list: numbers and inclusive ranges separated by
    /// commas (`"22,80,8000-8100"`; blanks around entries are ignored, `""`
    /// is no port); a port listed twice is held once.
    pub fn parse_list(text: &str) -> Result<PortSet, PortListError> {
        let mut ports = Vec::new();
        for entry in text.split(',').map(str::trim).filter(|entry| !entry.is_empty()) {
            let port = |part: &str| {
                part.trim()
                    .parse::<u16>()
                    .ok()
                    .filter(|port| *port > 0)
                    .ok_or_else(|| PortListError::NotAPort(entry.to_string()))
            };
            match entry.split_once('-') {
                Some((low, high)) => {
                    let (low, high) = (port(low)?, port(high)?);
                    if high < low {
                        return Err(PortListError::Backwards(entry.to_string()));
                    }
                    ports.extend(low..=high);
                }
                None => ports.push(port(entry)?),
            }
        }
        ports.sort_unstable();
        ports.dedup();
        Ok(PortSet(ports.into()))
    }

    /// The ports as Nomad writes a port list: ascending, runs of
    /// consecutive ports as ranges (`"22,80,8000-8100"`), each port once.
    pub fn list_text(&self) -> String {
        let mut runs: Vec<(u16, u16)> = Vec::new();
        for port in self.iter() {
            match runs.last_mut() {
                Some((_, high)) if port <= high.saturating_add(1) => *high = (*high).max(port),
                _ => runs.push((port, port)),
            }
        }
        let text: Vec<String> = runs
            .iter()
            .map(|(low, high)| if low == high { low.to_string() } else { format!("{low}-{high}") })
            .collect();
        text.join(",")
    }

    /// Ports held more than once.
    pub fn duplicates(&self) -> Vec<u16> {
        let mut twice: Vec<u16> = self.0.windows(2).filter(|pair| pair[0] == pair[1]).map(|pair| pair[0]).collect();
        twice.dedup();
        twice
    }
}

/// The environment variables that tell a task where its allocation's ports
/// are, with every name under `prefix` (`NOMAD_` for Nomad job files), as
/// Nomad sets them for group ports, per label:
/// `<prefix>PORT_<label>` and `<prefix>ALLOC_PORT_<label>` (the port the task
/// binds: `to` if set, else the host port), `<prefix>HOST_PORT_<label>`,
/// `<prefix>IP_<label>`, `<prefix>HOST_IP_<label>`, `<prefix>ADDR_<label>` and
/// `<prefix>HOST_ADDR_<label>` (`ip:port`, an IPv6 address in brackets).
pub fn port_env(alloc: &Allocation, prefix: &str) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for port in &alloc.ports {
        let host_port = port.value.to_string();
        let bound = if port.to > 0 { port.to.to_string() } else { host_port.clone() };
        let address = if port.host_ip.contains(':') {
            format!("[{}]:{host_port}", port.host_ip)
        } else {
            format!("{}:{host_port}", port.host_ip)
        };
        let label = &port.label;
        env.insert(format!("{prefix}PORT_{label}"), bound.clone());
        env.insert(format!("{prefix}ALLOC_PORT_{label}"), bound);
        env.insert(format!("{prefix}HOST_PORT_{label}"), host_port);
        env.insert(format!("{prefix}IP_{label}"), port.host_ip.to_string());
        env.insert(format!("{prefix}HOST_IP_{label}"), port.host_ip.to_string());
        env.insert(format!("{prefix}ADDR_{label}"), address.clone());
        env.insert(format!("{prefix}HOST_ADDR_{label}"), address);
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structs::{EvalId, Job, JobType, NodeId, Resources};

    #[test]
    fn a_port_set_is_a_sorted_multiset() {
        let set = PortSet::of([22, 20_005, 20_001, 8080]);
        assert!(set.contains(8080) && !set.contains(8081));
        assert_eq!(set.count_in(20_000, 32_000), 2);
        let twice = set.changed(&[8080, 9000], &[22, 23]);
        assert_eq!(twice.iter().collect::<Vec<_>>(), vec![8080, 8080, 9000, 20_001, 20_005]);
        assert_eq!(twice.duplicates(), vec![8080]);
        let once = twice.changed(&[], &[8080]);
        assert!(once.contains(8080), "one holder of a doubly held port is still there");
        assert!(once.duplicates().is_empty());
        assert_eq!(set, set.changed(&[], &[]), "an unchanged set");
    }

    #[test]
    fn ports_reach_tasks_as_nomad_names_them() {
        let job = Arc::new(Job::new_simple("web", JobType::Service, 1, Resources::new(1, 1, 0)));
        let mut alloc = Allocation::new_placement(&job, "group", 0, NodeId::from_u128(1), EvalId::from_u128(1));
        alloc.ports = vec![
            AllocatedPort { label: "http".into(), value: 20_123, to: 0, host_ip: "10.0.0.5".into() },
            AllocatedPort { label: "db".into(), value: 5432, to: 5433, host_ip: "fe80::1".into() },
        ];
        let env = port_env(&alloc, NOMAD_ENV_PREFIX);
        assert_eq!(env["NOMAD_PORT_http"], "20123");
        assert_eq!(env["NOMAD_HOST_PORT_http"], "20123");
        assert_eq!(env["NOMAD_IP_http"], "10.0.0.5");
        assert_eq!(env["NOMAD_ADDR_http"], "10.0.0.5:20123");
        assert_eq!(env["NOMAD_PORT_db"], "5433", "the task binds `to`");
        assert_eq!(env["NOMAD_HOST_PORT_db"], "5432");
        assert_eq!(env["NOMAD_ADDR_db"], "[fe80::1]:5432");
        assert_eq!(env.len(), 14);
        assert!(port_env(&alloc, "DROVER_").contains_key("DROVER_PORT_http"));
    }

    #[test]
    fn a_port_list_reads_and_writes_as_nomad_s() {
        let set = PortSet::parse_list(" 22, 80,8000-8003 ,81,22").expect("valid");
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![22, 80, 81, 8000, 8001, 8002, 8003]);
        assert_eq!(set.list_text(), "22,80-81,8000-8003");
        assert_eq!(PortSet::parse_list("").expect("empty"), PortSet::default());
        assert_eq!(PortSet::default().list_text(), "");
        assert_eq!(PortSet::parse_list("9000-8000"), Err(PortListError::Backwards("9000-8000".into())));
        assert_eq!(PortSet::parse_list("22,http"), Err(PortListError::NotAPort("http".into())));
        assert_eq!(PortSet::parse_list("0"), Err(PortListError::NotAPort("0".into())));
        assert_eq!(PortSet::parse_list("1-70000"), Err(PortListError::NotAPort("1-70000".into())));
        let round = PortSet::parse_list(&set.list_text()).expect("its own text reads back");
        assert_eq!(round, set);
    }

    #[test]
    fn a_port_on_a_host_network_is_reached_at_its_address() {
        let mut network = NodeNetwork { ip: "10.0.0.5".into(), ..NodeNetwork::default() };
        let public =
            HostNetwork { ip: "203.0.113.7".into(), device: "eth1".into(), reserved_ports: PortSet::default() };
        network.host_networks.insert("public".into(), public);
        assert_eq!(network.address_for(None).map(|ip| &**ip), Some("10.0.0.5"));
        assert_eq!(network.address_for(Some("public")).map(|ip| &**ip), Some("203.0.113.7"));
        assert_eq!(network.address_for(Some("private")), None);
    }

    #[test]
    fn bad_ports_are_listed() {
        let network = NetworkResource {
            reserved_ports: vec![Port::new("db", 5432), Port::new("db2", 5432), Port::new("zero", 0)],
            dynamic_ports: vec![Port::new("db", 0), Port::new("my-port", 0)],
        };
        let mut problems = Vec::new();
        network.problems("task group \"g\"", &mut problems);
        let text = problems.join("\n");
        assert!(text.contains("static port 5432 is asked for more than once"), "{text}");
        assert!(text.contains("static port \"zero\" needs a value"), "{text}");
        assert!(text.contains("port label \"db\" is used more than once"), "{text}");
        assert!(text.contains("port label \"my-port\" must be letters"), "{text}");
        assert_eq!(problems.len(), 4, "{text}");
    }
}
