//! Client nodes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{NodeId, NodeNetwork, Resources};
use crate::clock::Timestamp;

/// A node's lifecycle status (`docs/node-lifecycle.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeStatus {
    /// Registered or reconnecting; not yet trusted with new work.
    Initializing,
    /// Heartbeating and accepting allocations.
    Ready,
    /// Missed its heartbeat; its allocations are lost.
    Down,
    /// Missed its heartbeat while running allocations that tolerate a
    /// disconnect; its allocations are unknown until it returns.
    Disconnected,
}

impl NodeStatus {
    /// Whether the node is gone for scheduling purposes.
    pub fn is_terminal_for_scheduling(self) -> bool {
        matches!(self, NodeStatus::Down | NodeStatus::Disconnected)
    }
}

/// Whether the scheduler may place new work on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeEligibility {
    /// New allocations may be placed.
    Eligible,
    /// No new allocations (drained, or marked by the plan rejection tracker).
    Ineligible,
}

/// A hash of everything about a node that feasibility checks read, so that
/// nodes of one class are checked once and blocked evals can be unblocked by
/// class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ComputedClass(pub u64);

/// A client machine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// The node's identity.
    pub id: NodeId,
    /// Shared secret the client presents on every call.
    pub secret_id: Uuid,
    /// Human-readable name.
    pub name: String,
    /// Datacenter the node runs in.
    pub datacenter: Arc<str>,
    /// Operator-assigned class (may be empty).
    pub node_class: Arc<str>,
    /// Fingerprinted attributes (`kernel.name`, `driver.docker`, ...).
    pub attributes: BTreeMap<String, String>,
    /// Operator-supplied metadata.
    pub meta: BTreeMap<String, String>,
    /// Total resources of the machine.
    pub resources: Resources,
    /// Resources held back for the OS and the client itself.
    pub reserved: Resources,
    /// Its address, reserved ports and dynamic port range; Nomad's defaults
    /// (no reserved ports, 20000-32000) when a registration leaves it out.
    /// Not part of the computed class: ports are accounted per node.
    #[serde(default)]
    pub network: NodeNetwork,
    /// Lifecycle status.
    pub status: NodeStatus,
    /// Scheduling eligibility.
    pub eligibility: NodeEligibility,
    /// Hash of the scheduling-relevant fields; see [`Node::compute_class`].
    pub computed_class: ComputedClass,
    /// Raft index at which the node last missed its heartbeat (0: never).
    pub last_missed_heartbeat_index: u64,
    /// Index of the node's last accepted client alloc update (0: never).
    pub last_alloc_update_index: u64,
    /// Index at which the node was created.
    pub create_index: u64,
    /// Index at which the node last changed.
    pub modify_index: u64,
    /// Its drain: the one under way and the last one's record.
    #[serde(default)]
    pub drain: NodeDrain,
    /// When its status last changed, or when it registered (Nomad's
    /// `StatusUpdatedAt`), set by the store from the command's time: node
    /// GC counts its threshold from here.
    #[serde(default)]
    pub status_updated_at: Timestamp,
    /// Index of the last command that deleted allocations of the node
    /// (garbage collection; 0: never): the node's allocation watch answers
    /// then too, so its client learns they are gone.
    #[serde(default)]
    pub allocs_removed_index: u64,
    /// The storm guard's hold (`node::storm`): set when the node missed
    /// its heartbeat while a large share of the cluster did, and held
    /// `disconnected` instead of `down`; cleared by its next status change.
    #[serde(default)]
    pub hold: Option<NodeHold>,
}

/// A node the storm guard holds `disconnected` (`node::storm`): its
/// allocations keep their slots until `release_at`, when their
/// replacements may be placed; an original is stopped only once its
/// replacement runs, or settled against it when the node comes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeHold {
    /// When the node missed its heartbeat and was held.
    pub since: Timestamp,
    /// When its allocations' replacements may be placed: the guard spaces
    /// the nodes it holds by its release rate.
    pub release_at: Timestamp,
}

/// A node's drain (Nomad's `DrainStrategy` and `LastDrain`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeDrain {
    /// The drain under way, if any.
    pub strategy: Option<DrainStrategy>,
    /// The record of the last drain, kept after it ended.
    pub last: Option<DrainMetadata>,
}

/// How a node drains (Nomad's `DrainStrategy`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainStrategy {
    /// How long allocations may take to migrate before what remains is
    /// stopped.
    pub deadline: DrainDeadline,
    /// Whether system allocations stay on the node.
    pub ignore_system_jobs: bool,
    /// When the drain started (kept when it is updated).
    pub started_at: Timestamp,
}

impl DrainStrategy {
    /// When whatever remains on the node is stopped (Nomad's
    /// `ForceDeadline`): at once for a forced drain, never without a deadline.
    pub fn force_deadline(&self) -> Option<Timestamp> {
        match self.deadline {
            DrainDeadline::Force => Some(self.started_at),
            DrainDeadline::None => None,
            DrainDeadline::After(after) => Some(self.started_at.plus(after)),
        }
    }

    /// Whether the deadline has come at `now`: everything left is stopped.
    pub fn is_forced(&self, now: Timestamp) -> bool {
        self.force_deadline().is_some_and(|deadline| deadline <= now)
    }
}

/// A drain's deadline, as Nomad encodes it in one signed duration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DrainDeadline {
    /// Negative: stop everything at once (`-force`).
    Force,
    /// Zero: no deadline; batch allocations may run to their end (`-no-deadline`).
    None,
    /// Positive: migrate gracefully, stop what remains after this long.
    After(#[serde(with = "super::duration::serde_duration")] Duration),
}

impl DrainDeadline {
    /// From Nomad's nanoseconds.
    pub fn from_nanos(nanos: i64) -> DrainDeadline {
        match nanos {
            ..0 => DrainDeadline::Force,
            0 => DrainDeadline::None,
            nanos => DrainDeadline::After(Duration::from_nanos(nanos as u64)),
        }
    }

    /// As Nomad's nanoseconds (-1 s for a forced drain, as its CLI sends).
    pub fn as_nanos(self) -> i64 {
        match self {
            DrainDeadline::Force => -1_000_000_000,
            DrainDeadline::None => 0,
            DrainDeadline::After(after) => i64::try_from(after.as_nanos()).unwrap_or(i64::MAX),
        }
    }
}

/// The record of a node's last drain (Nomad's `LastDrain`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainMetadata {
    /// When it started.
    pub started_at: Timestamp,
    /// When it last changed.
    pub updated_at: Timestamp,
    /// Where it stands.
    pub status: DrainStatus,
    /// The ACL token accessor that set it (empty without ACLs).
    pub accessor_id: String,
    /// What the operator attached to it.
    pub meta: BTreeMap<String, String>,
}

/// Where a drain stands (Nomad's `DrainStatus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DrainStatus {
    /// Under way.
    Draining,
    /// Every allocation left the node (or the deadline stopped them).
    Complete,
    /// Disabled by an operator before it completed.
    Canceled,
}

impl DrainStatus {
    /// Nomad's word.
    pub fn as_str(self) -> &'static str {
        match self {
            DrainStatus::Draining => "draining",
            DrainStatus::Complete => "complete",
            DrainStatus::Canceled => "canceled",
        }
    }
}

impl Node {
    /// Whether the node is draining.
    pub fn is_draining(&self) -> bool {
        self.drain.strategy.is_some()
    }

    /// Resources the scheduler may hand out: total minus reserved.
    pub fn allocatable(&self) -> Resources {
        self.resources.minus(self.reserved)
    }

    /// Whether new allocations may be placed here.
    pub fn is_schedulable(&self) -> bool {
        self.status == NodeStatus::Ready && self.eligibility == NodeEligibility::Eligible
    }

    /// Whether the node has the named task driver, detected and healthy:
    /// only then may the scheduler place the driver's tasks here.
    ///
    /// A driver's attributes, as a client sends them and the HTTP API's
    /// `Drivers` shows them:
    /// - `driver.<name>`: `1` when the driver is detected and healthy; `0`
    ///   when it is detected but unhealthy (the docker daemon stopped
    ///   answering), which counts as absent here, as `false` does. No such
    ///   attribute: the driver was not detected.
    /// - `driver.<name>.health`: what the driver's last health check said
    ///   (`Healthy`, `Failed to connect to docker daemon: ...`).
    /// - `driver.<name>.<anything else>`: what the driver fingerprinted
    ///   (`driver.docker.version`).
    ///
    /// A client replaces all of a driver's attributes at once
    /// ([`Node::set_driver_attributes`]).
    pub fn has_driver(&self, driver: &str) -> bool {
        let key = format!("driver.{driver}");
        self.attributes.get(&key).is_some_and(|value| value != "0" && value != "false")
    }

    /// Replaces every attribute of the named driver (`driver.<name>` and
    /// `driver.<name>.*`, see [`Node::has_driver`]) with those in
    /// `attributes`; any other in it is not the driver's and is left out.
    /// Returns whether the node changed.
    pub fn set_driver_attributes(&mut self, driver: &str, attributes: &BTreeMap<String, String>) -> bool {
        let owned = |key: &String| is_driver_attribute(key, driver);
        let wanted: BTreeMap<String, String> =
            attributes.iter().filter(|(key, _)| owned(key)).map(|(key, value)| (key.clone(), value.clone())).collect();
        if self.attributes.iter().filter(|(key, _)| owned(key)).eq(wanted.iter()) {
            return false;
        }
        self.attributes.retain(|key, _| !owned(key));
        self.attributes.extend(wanted);
        true
    }

    /// Hashes datacenter, class, attributes and meta, leaving out the
    /// `unique.` ones (hostnames, addresses) that would give every node a
    /// class of its own, as Nomad does. The hash is XXH3-64 over a
    /// length-prefixed encoding: a specified algorithm, so a class computed
    /// by the state store's apply is the same in every build and process
    /// (std's `DefaultHasher` promises neither), and replaying a log yields
    /// the same classes.
    pub fn compute_class(&self) -> ComputedClass {
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let mut field = |bytes: &[u8]| {
            hasher.update(&(bytes.len() as u64).to_le_bytes());
            hasher.update(bytes);
        };
        field(self.datacenter.as_bytes());
        field(self.node_class.as_bytes());
        for (key, value) in self.attributes.iter().chain(self.meta.iter()) {
            if !key.starts_with("unique.") {
                field(key.as_bytes());
                field(value.as_bytes());
            }
        }
        ComputedClass(hasher.digest())
    }

    /// A ready, eligible node with the given shape; the basis of test and load fixtures.
    pub fn new_ready(id: NodeId, datacenter: &str, node_class: &str, resources: Resources) -> Node {
        let mut node = Node {
            id,
            secret_id: Uuid::from_u128(id.0.as_u128().rotate_left(64)),
            name: format!("node-{}", &id.0.simple().to_string()[20..]),
            datacenter: Arc::from(datacenter),
            node_class: Arc::from(node_class),
            attributes: BTreeMap::from([
                ("kernel.name".to_string(), "linux".to_string()),
                ("driver.exec".to_string(), "1".to_string()),
            ]),
            meta: BTreeMap::new(),
            resources,
            reserved: Resources::default(),
            network: NodeNetwork::default(),
            status: NodeStatus::Ready,
            eligibility: NodeEligibility::Eligible,
            computed_class: ComputedClass::default(),
            last_missed_heartbeat_index: 0,
            last_alloc_update_index: 0,
            create_index: 0,
            modify_index: 0,
            drain: NodeDrain::default(),
            status_updated_at: Timestamp::ZERO,
            allocs_removed_index: 0,
            hold: None,
        };
        node.computed_class = node.compute_class();
        node
    }
}

/// Whether `key` is one of the attributes of the driver `driver`.
fn is_driver_attribute(key: &str, driver: &str) -> bool {
    let rest = key.strip_prefix("driver.").and_then(|rest| rest.strip_prefix(driver));
    rest.is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn computed_class_ignores_unique_attributes() {
        let mut first = Node::new_ready(NodeId::from_u128(1), "dc1", "web", Resources::new(1000, 1024, 1024));
        let mut second = Node::new_ready(NodeId::from_u128(2), "dc1", "web", Resources::new(1000, 1024, 1024));
        first.attributes.insert("unique.hostname".into(), "a".into());
        second.attributes.insert("unique.hostname".into(), "b".into());
        assert_eq!(first.compute_class(), second.compute_class());
        second.node_class = Arc::from("db");
        assert_ne!(first.compute_class(), second.compute_class());
    }

    #[test]
    fn the_computed_class_is_the_same_in_every_build() {
        let mut node = Node::new_ready(NodeId::from_u128(1), "dc1", "web", Resources::new(1000, 1024, 1024));
        node.attributes = BTreeMap::from([("kernel.name".to_string(), "linux".to_string())]);
        node.meta = BTreeMap::from([("rack".to_string(), "r1".to_string())]);
        // A recorded value: a change of algorithm or encoding must fail here,
        // since classes are stored and a replayed log must compute the same.
        assert_eq!(node.compute_class(), ComputedClass(GOLDEN_CLASS));
        // Field boundaries count: moving a byte from one field to the next is another class.
        let mut shifted = node.clone();
        shifted.datacenter = Arc::from("dc1w");
        shifted.node_class = Arc::from("eb");
        assert_ne!(shifted.compute_class(), node.compute_class());
    }

    /// `compute_class` of the node in `the_computed_class_is_the_same_in_every_build`:
    /// XXH3-64 of its length-prefixed fields, as the reference implementation
    /// (the `xxhash` package for Python) computes it too.
    const GOLDEN_CLASS: u64 = 13_379_448_245_864_038_449;

    #[test]
    fn allocatable_subtracts_reserved() {
        let mut node = Node::new_ready(NodeId::from_u128(1), "dc1", "", Resources::new(1000, 1024, 1024));
        node.reserved = Resources::new(100, 24, 24);
        assert_eq!(node.allocatable(), Resources::new(900, 1000, 1000));
        assert!(node.has_driver("exec"));
        assert!(!node.has_driver("docker"));
    }

    #[test]
    fn a_drivers_attributes_are_replaced_as_a_whole_and_no_others() {
        let mut node = Node::new_ready(NodeId::from_u128(1), "dc1", "", Resources::new(1000, 1024, 1024));
        let set = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect()
        };
        let healthy =
            set(&[("driver.docker", "1"), ("driver.docker.version", "27.1"), ("driver.docker.health", "Healthy")]);
        assert!(node.set_driver_attributes("docker", &healthy));
        assert!(node.has_driver("docker"));
        assert!(!node.set_driver_attributes("docker", &healthy), "the same set changes nothing");
        // Unhealthy: the version is no longer known, and a key not the driver's is not taken.
        let failed = set(&[
            ("driver.docker", "0"),
            ("driver.docker.health", "Failed to connect to docker daemon: refused"),
            ("driver.dockerd", "1"),
            ("kernel.name", "plan9"),
        ]);
        assert!(node.set_driver_attributes("docker", &failed));
        assert!(!node.has_driver("docker"));
        let expected = set(&[
            ("driver.docker", "0"),
            ("driver.docker.health", "Failed to connect to docker daemon: refused"),
            ("driver.exec", "1"),
            ("kernel.name", "linux"),
        ]);
        assert_eq!(node.attributes, expected, "other drivers and attributes stay");
        assert!(node.set_driver_attributes("docker", &BTreeMap::new()));
        assert_eq!(node.attributes, set(&[("driver.exec", "1"), ("kernel.name", "linux")]), "not detected: gone");
    }
}
