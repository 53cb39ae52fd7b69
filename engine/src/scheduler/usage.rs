//! What one plan has changed on the nodes it touches, on top of the
//! snapshot it was planned against: resources in use, host ports taken and
//! freed, and the allocations it stops or evicts. Both schedulers keep one
//! per planning attempt, so that nothing they place collides with the
//! snapshot or with the plan itself.
//!
//! Contract:
//! - Only nodes the plan touched have an entry; every other node reads
//!   straight from the snapshot, so a lookup allocates nothing.
//! - A port is taken on a node when the node reserves it, when the plan
//!   gave it to a placement, or when a live allocation in the snapshot holds
//!   it and the plan did not stop or evict that allocation.
//! - Dynamic ports are drawn from the node's range with the caller's seeded
//!   generator (random probes, then a scan from a random start), so a
//!   seeded run replays and parallel workers rarely pick the same port.

use std::sync::Arc;

use hashbrown::{HashMap, HashSet};
use rand::Rng;
use smallvec::SmallVec;

use super::State;
use crate::structs::{AllocId, AllocatedPort, Allocation, Node, NodeId, Port, Resources, TaskGroup};

/// Random probes for a free dynamic port before scanning the range.
const RANDOM_PROBES: usize = 20;

/// Nomad's metric for a dynamic range without enough free ports.
pub const DYNAMIC_PORTS_EXHAUSTED: &str = "network: dynamic port selection failed";

/// Why a node cannot give a placement its ports
/// ([`PlanUsage::ports_fit`]); the message is Nomad's metric key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PortsRefused {
    /// A static port asked for is held there, or reserved.
    #[error("network: reserved port collision {label}={port}")]
    Collision {
        /// The port's label in the group.
        label: Arc<str>,
        /// The port.
        port: u16,
    },
    /// Too few ports of the node's dynamic range are free.
    #[error("{DYNAMIC_PORTS_EXHAUSTED}")]
    DynamicExhausted,
}

/// The ports one allocation of a group needs.
#[derive(Clone, Debug, Default)]
pub struct PortAsk {
    statics: Vec<Port>,
    dynamics: Vec<Port>,
}

impl PortAsk {
    /// What `group` asks for, or `None` when it needs no ports.
    pub fn of(group: &TaskGroup) -> Option<PortAsk> {
        if !group.asks_for_ports() {
            return None;
        }
        let networks = group.networks.iter();
        let statics = networks.clone().flat_map(|network| network.reserved_ports.iter().cloned()).collect();
        let dynamics = networks.flat_map(|network| network.dynamic_ports.iter().cloned()).collect();
        Some(PortAsk { statics, dynamics })
    }

    /// The static host ports asked for.
    pub fn static_values(&self) -> impl Iterator<Item = u16> + '_ {
        self.statics.iter().map(|port| port.value)
    }

    /// How many ports of the node's dynamic range the ask uses: its dynamic
    /// ports, and its static ports that happen to lie in the range.
    fn dynamic_range_need(&self, node: &Node) -> usize {
        let (low, high) = (node.network.min_dynamic_port, node.network.max_dynamic_port);
        self.dynamics.len() + self.static_values().filter(|port| (low..=high).contains(port)).count()
    }
}

/// Ports a plan took and freed on one node.
#[derive(Clone, Debug, Default)]
struct PortDelta {
    taken: SmallVec<[u16; 8]>,
    freed: SmallVec<[u16; 8]>,
}

/// One plan's changes per node; see the module docs.
#[derive(Clone, Debug, Default)]
pub struct PlanUsage {
    resources: HashMap<NodeId, Resources>,
    ports: HashMap<NodeId, PortDelta>,
    removed: HashSet<AllocId>,
}

impl PlanUsage {
    /// Resources in use on a node: the snapshot's live allocations plus
    /// this plan's placements, minus its stops and evictions.
    pub fn used(&self, state: &dyn State, node_id: NodeId) -> Resources {
        self.resources.get(&node_id).copied().unwrap_or_else(|| state.node_usage(node_id))
    }

    /// Records a placement (or a move to the node): its resources and ports.
    pub fn place(&mut self, state: &dyn State, alloc: &Allocation) {
        let used = self.used(state, alloc.node_id).plus(alloc.resources);
        self.resources.insert(alloc.node_id, used);
        if !alloc.ports.is_empty() {
            self.ports.entry(alloc.node_id).or_default().taken.extend(alloc.port_values());
        }
    }

    /// Records that the plan stops or evicts `alloc`, a live allocation;
    /// false (and nothing changes) if it already did.
    pub fn remove(&mut self, state: &dyn State, alloc: &Allocation) -> bool {
        if !self.removed.insert(alloc.id) {
            return false;
        }
        let used = self.used(state, alloc.node_id).minus(alloc.resources);
        self.resources.insert(alloc.node_id, used);
        if !alloc.ports.is_empty() {
            let delta = self.ports.entry(alloc.node_id).or_default();
            for port in alloc.port_values() {
                // A port this plan gave is given back; one from the snapshot is freed.
                match delta.taken.iter().position(|taken| *taken == port) {
                    Some(position) => {
                        delta.taken.swap_remove(position);
                    }
                    None => delta.freed.push(port),
                }
            }
        }
        true
    }

    /// Whether the plan stops or evicts the allocation.
    pub fn is_removed(&self, alloc_id: AllocId) -> bool {
        self.removed.contains(&alloc_id)
    }

    /// Whether `port` is taken on `node` (module docs).
    pub fn port_taken(&self, state: &dyn State, node: &Node, port: u16) -> bool {
        self.port_taken_evicting(state, node, port, &[])
    }

    /// Whether `port` would be taken on `node` once `evicted` (live
    /// allocations there) were gone too.
    fn port_taken_evicting(&self, state: &dyn State, node: &Node, port: u16, evicted: &[Arc<Allocation>]) -> bool {
        if node.network.reserved_ports.contains(port) || self.taken_by_plan(node.id, port) {
            return true;
        }
        if evicted.iter().any(|alloc| alloc.port_values().any(|held| held == port)) {
            return false;
        }
        let freed = self.ports.get(&node.id).is_some_and(|delta| delta.freed.contains(&port));
        !freed && state.port_in_use(node.id, port)
    }

    /// Whether the plan gave `port` on `node` to one of its own placements.
    pub fn taken_by_plan(&self, node_id: NodeId, port: u16) -> bool {
        self.ports.get(&node_id).is_some_and(|delta| delta.taken.contains(&port))
    }

    /// How many ports of the node's dynamic range are free.
    pub fn free_dynamic_ports(&self, state: &dyn State, node: &Node) -> usize {
        self.free_dynamic_ports_evicting(state, node, &[])
    }

    fn free_dynamic_ports_evicting(&self, state: &dyn State, node: &Node, evicted: &[Arc<Allocation>]) -> usize {
        let (low, high) = (node.network.min_dynamic_port, node.network.max_dynamic_port);
        let in_range = |port: &u16| (low..=high).contains(port);
        let count = |ports: &[u16]| ports.iter().filter(|port| in_range(port)).count();
        let (taken, freed) =
            self.ports.get(&node.id).map_or((0, 0), |delta| (count(&delta.taken), count(&delta.freed)));
        let evicted = evicted.iter().flat_map(|alloc| alloc.port_values()).filter(in_range).count();
        let held = state.ports_in_use_between(node.id, low, high) + node.network.reserved_ports.count_in(low, high);
        (node.network.dynamic_range_len() + freed + evicted).saturating_sub(held + taken)
    }

    /// Whether the node can give `ask` its ports; if not, why (its message
    /// is the metric key, Nomad's words).
    pub fn ports_fit(&self, state: &dyn State, node: &Node, ask: &PortAsk) -> Result<(), PortsRefused> {
        self.ports_fit_evicting(state, node, ask, &[])
    }

    /// [`Self::ports_fit`] once `evicted` (live allocations there) were gone.
    pub fn ports_fit_evicting(
        &self,
        state: &dyn State,
        node: &Node,
        ask: &PortAsk,
        evicted: &[Arc<Allocation>],
    ) -> Result<(), PortsRefused> {
        if let Some(port) = ask.statics.iter().find(|port| self.port_taken_evicting(state, node, port.value, evicted)) {
            return Err(PortsRefused::Collision { label: port.label.clone(), port: port.value });
        }
        if !ask.dynamics.is_empty()
            && self.free_dynamic_ports_evicting(state, node, evicted) < ask.dynamic_range_need(node)
        {
            return Err(PortsRefused::DynamicExhausted);
        }
        Ok(())
    }

    /// The ports for one placement of `ask` on `node`: its static ports and
    /// a free dynamic port per dynamic label, each at the address of its
    /// host network; `None` if the range has too few (check
    /// [`Self::ports_fit`] first) or the node lacks a host network named
    /// (the feasibility check filters such nodes).
    pub fn assign_ports(
        &self,
        state: &dyn State,
        node: &Node,
        ask: &PortAsk,
        rng: &mut impl Rng,
    ) -> Option<Vec<AllocatedPort>> {
        self.assign_ports_evicting(state, node, ask, &[], rng)
    }

    /// [`Self::assign_ports`] once `evicted` (live allocations there) were gone.
    pub fn assign_ports_evicting(
        &self,
        state: &dyn State,
        node: &Node,
        ask: &PortAsk,
        evicted: &[Arc<Allocation>],
        rng: &mut impl Rng,
    ) -> Option<Vec<AllocatedPort>> {
        // A port is reached at the address of its host network; the
        // feasibility check has made sure the node has every one named.
        let given = |port: &Port, value: u16| {
            let host_ip = node.network.address_for(port.host_network.as_deref())?.clone();
            Some(AllocatedPort { label: port.label.clone(), value, to: port.to, host_ip })
        };
        let mut ports: Vec<AllocatedPort> =
            ask.statics.iter().map(|port| given(port, port.value)).collect::<Option<_>>()?;
        let (low, high) = (node.network.min_dynamic_port, node.network.max_dynamic_port);
        for port in &ask.dynamics {
            let free = |value: u16| {
                !ports.iter().any(|given| given.value == value)
                    && !self.port_taken_evicting(state, node, value, evicted)
            };
            let value = free_port_in(low, high, free, rng)?;
            ports.push(given(port, value)?);
        }
        Some(ports)
    }
}

/// A port in `low..=high` for which `free` holds: random probes first, then
/// a scan from a random start.
fn free_port_in(low: u16, high: u16, free: impl Fn(u16) -> bool, rng: &mut impl Rng) -> Option<u16> {
    if let Some(port) = (0..RANDOM_PROBES).map(|_| rng.random_range(low..=high)).find(|port| free(*port)) {
        return Some(port);
    }
    let len = u32::from(high - low) + 1;
    let start = rng.random_range(0..len);
    (0..len).map(|i| low + ((start + i) % len) as u16).find(|port| free(*port))
}

/// A node's live allocations in the snapshot that the plan has not
/// stopped or evicted.
pub fn live_allocs_on(state: &dyn State, usage: &PlanUsage, node_id: NodeId) -> Vec<Arc<Allocation>> {
    let mut allocs = state.allocs_by_node(node_id);
    allocs.retain(|alloc| !alloc.terminal() && !usage.is_removed(alloc.id));
    allocs
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;
    use crate::state::{Command, StateStore};
    use crate::structs::{EvalId, Job, JobType, NetworkResource, NodeNetwork, PortSet};

    fn node_with_range(min: u16, max: u16) -> Node {
        let mut node = Node::new_ready(NodeId::from_u128(1), "dc1", "", Resources::new(1000, 1000, 0));
        node.network = NodeNetwork {
            reserved_ports: PortSet::of([22, min]),
            min_dynamic_port: min,
            max_dynamic_port: max,
            ..NodeNetwork::default()
        };
        node
    }

    fn group_asking(statics: &[u16], dynamics: usize) -> TaskGroup {
        let mut job = Job::new_simple("web", JobType::Service, 1, Resources::new(1, 1, 0));
        job.task_groups[0].networks = vec![NetworkResource {
            reserved_ports: statics.iter().map(|port| Port::new(&format!("s{port}"), *port)).collect(),
            dynamic_ports: (0..dynamics).map(|i| Port::new(&format!("d{i}"), 0)).collect(),
        }];
        job.task_groups.remove(0)
    }

    #[test]
    fn the_plan_takes_frees_and_reserves_ports() {
        let store = StateStore::new();
        let node = node_with_range(20_000, 20_004);
        store.apply(Command::UpsertNode { node: node.clone(), evals: vec![] }).expect("node");
        let state = store.snapshot();
        let mut usage = PlanUsage::default();
        let ask = PortAsk::of(&group_asking(&[8080], 2)).expect("asks");
        assert_eq!(usage.free_dynamic_ports(&*state, &node), 4, "five in range, one reserved");
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let job = Arc::new(Job::new_simple("web", JobType::Service, 2, Resources::new(1, 1, 0)));
        let mut first = Allocation::new_placement(&job, "group", 0, node.id, EvalId::from_u128(1));
        first.ports = usage.assign_ports(&*state, &node, &ask, &mut rng).expect("room");
        let values: Vec<u16> = first.port_values().collect();
        assert_eq!(values[0], 8080);
        assert!(values[1..].iter().all(|port| (20_001..=20_004).contains(port)) && values[1] != values[2]);
        usage.place(&*state, &first);
        assert!(usage.port_taken(&*state, &node, 8080) && usage.port_taken(&*state, &node, 22));
        let refused = usage.ports_fit(&*state, &node, &ask).expect_err("8080 is taken");
        assert_eq!(refused.to_string(), "network: reserved port collision s8080=8080");
        let dynamic_only = PortAsk::of(&group_asking(&[], 2)).expect("asks");
        assert_eq!(usage.ports_fit(&*state, &node, &dynamic_only), Ok(()), "two of four left");
        let mut second = Allocation::new_placement(&job, "group", 1, node.id, EvalId::from_u128(1));
        second.ports = usage.assign_ports(&*state, &node, &dynamic_only, &mut rng).expect("room");
        usage.place(&*state, &second);
        assert_eq!(usage.free_dynamic_ports(&*state, &node), 0);
        assert_eq!(usage.ports_fit(&*state, &node, &dynamic_only), Err(PortsRefused::DynamicExhausted));
        assert!(usage.remove(&*state, &first) && !usage.remove(&*state, &first), "removed once");
        assert!(!usage.port_taken(&*state, &node, 8080));
        assert_eq!(usage.free_dynamic_ports(&*state, &node), 2);
        assert_eq!(usage.used(&*state, node.id), Resources::new(1, 1, 0));
    }
}
