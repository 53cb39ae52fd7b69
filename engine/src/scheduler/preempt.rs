//! Preemption: which lower-priority allocations on one node to evict so
//! that a placement fits there (the rules of Nomad's
//! `scheduler/preemption.go`, in Drover's terms).
//!
//! 1. Candidates are the node's live allocations (not already stopped or
//!    evicted by this plan) of jobs at least [`PRIORITY_DELTA`] below the
//!    placing job's priority; that also keeps a job from preempting itself.
//! 2. The holder of a static port the placement needs must go; if it cannot
//!    (its priority is too close, or the node reserves the port, or this
//!    plan gave it away), preemption cannot help on this node.
//! 3. Lowest priority first: within one priority, the allocation closest in
//!    size to what is still missing (Nomad's resource distance) goes next,
//!    until the placement fits.
//! 4. A last pass keeps only what is needed: the choices of step 3, lowest
//!    priority first and, within a priority, the largest first, are taken
//!    back until the placement fits (Nomad's superset filter, ordered by
//!    priority so that no higher priority is evicted than needed).
//! 5. Options on different nodes compare by net priority (Nomad's: the
//!    highest priority evicted plus the sum of priorities over it), then by
//!    how many allocations go.
//!
//! Dynamic ports are not a reason to preempt: a node whose dynamic range is
//! full stays out. Nomad's `migrate.max_parallel` penalty has no Drover
//! counterpart (there is no migrate block).

use std::sync::Arc;

use super::usage::{live_allocs_on, PlanUsage, PortAsk};
use super::State;
use crate::structs::{Allocation, Node, Resources};

/// How far below the placing job's priority an allocation's job must be to
/// be evicted (Nomad's rule).
pub const PRIORITY_DELTA: u8 = 10;

/// What to evict on one node.
#[derive(Clone, Debug)]
pub struct Preemption {
    /// The allocations to evict.
    pub allocs: Vec<Arc<Allocation>>,
    /// Nomad's net priority of the set (lower is a cheaper eviction).
    pub net_priority: f64,
}

impl Preemption {
    /// Whether this option evicts less than `other` (step 5).
    pub fn cheaper_than(&self, other: &Preemption) -> bool {
        (self.net_priority, self.allocs.len()) < (other.net_priority, other.allocs.len())
    }
}

/// The allocations to evict on `node` so that an allocation of `ask`
/// (and `ports`) for a job of `priority` fits, or `None` when evicting what
/// may be evicted is not enough (module docs).
pub fn preemption_for(
    state: &dyn State,
    usage: &PlanUsage,
    node: &Node,
    ask: Resources,
    ports: Option<&PortAsk>,
    priority: u8,
) -> Option<Preemption> {
    let live = live_allocs_on(state, usage, node.id);
    let evictable = |alloc: &Allocation| alloc.job.priority.saturating_add(PRIORITY_DELTA) <= priority;
    let mut chosen = port_holders(state, usage, node, ports, &live, &evictable)?;
    if ports.is_some_and(|ports| usage.ports_fit_evicting(state, node, ports, &chosen).is_err()) {
        return None; // The dynamic range is full: not a reason to preempt.
    }
    let available = node.allocatable().minus(usage.used(state, node.id));
    let freed = |allocs: &[Arc<Allocation>]| allocs.iter().fold(available, |sum, alloc| sum.plus(alloc.resources));
    let mut candidates: Vec<Arc<Allocation>> =
        live.into_iter().filter(|alloc| evictable(alloc) && !chosen.iter().any(|held| held.id == alloc.id)).collect();
    candidates.sort_by_key(|alloc| (alloc.job.priority, alloc.id));
    let mandatory = chosen.len();
    while !freed(&chosen).covers(ask) {
        let lowest = candidates.first()?.job.priority;
        let missing = ask.minus(freed(&chosen));
        let same_priority = candidates.iter().take_while(|alloc| alloc.job.priority == lowest);
        let closest = same_priority
            .enumerate()
            .min_by(|(_, a), (_, b)| distance(missing, a.resources).total_cmp(&distance(missing, b.resources)))
            .map(|(position, _)| position)?;
        chosen.push(candidates.remove(closest));
    }
    let mut picked = chosen.split_off(mandatory);
    picked.sort_by(|a, b| {
        a.job.priority.cmp(&b.job.priority).then(distance(ask, b.resources).total_cmp(&distance(ask, a.resources)))
    });
    for alloc in picked {
        if freed(&chosen).covers(ask) {
            break;
        }
        chosen.push(alloc);
    }
    Some(Preemption { net_priority: net_priority(&chosen), allocs: chosen })
}

/// The holders of the static ports `ports` needs (step 2); `None` if one
/// cannot be evicted or a needed port cannot be freed by evicting.
fn port_holders(
    state: &dyn State,
    usage: &PlanUsage,
    node: &Node,
    ports: Option<&PortAsk>,
    live: &[Arc<Allocation>],
    evictable: &dyn Fn(&Allocation) -> bool,
) -> Option<Vec<Arc<Allocation>>> {
    let mut holders: Vec<Arc<Allocation>> = Vec::new();
    for port in ports.into_iter().flat_map(PortAsk::static_values) {
        if !usage.port_taken(state, node, port) {
            continue;
        }
        if node.network.reserved_ports.contains(port) || usage.taken_by_plan(node.id, port) {
            return None;
        }
        let holder = live.iter().find(|alloc| alloc.port_values().any(|held| held == port))?;
        if !evictable(holder) {
            return None;
        }
        if !holders.iter().any(|held| held.id == holder.id) {
            holders.push(holder.clone());
        }
    }
    Some(holders)
}

/// Nomad's resource distance between what is asked and what an allocation
/// frees: the Euclidean length of the per-dimension shortfall or excess,
/// each relative to the ask (dimensions not asked for are left out).
pub fn distance(ask: Resources, freed: Resources) -> f64 {
    let coordinate = |asked: u64, given: u64| {
        if asked == 0 {
            0.0
        } else {
            (asked as f64 - given as f64) / asked as f64
        }
    };
    let cpu = coordinate(ask.cpu, freed.cpu);
    let memory = coordinate(ask.memory_mb, freed.memory_mb);
    let disk = coordinate(ask.disk_mb, freed.disk_mb);
    (cpu * cpu + memory * memory + disk * disk).sqrt()
}

/// Nomad's net priority of an eviction set: its highest priority plus the
/// sum of its priorities over that highest, so that many low-priority
/// evictions cost more than one.
pub fn net_priority(allocs: &[Arc<Allocation>]) -> f64 {
    let max = allocs.iter().map(|alloc| f64::from(alloc.job.priority)).fold(0.0, f64::max);
    if max == 0.0 {
        return 0.0;
    }
    let sum: f64 = allocs.iter().map(|alloc| f64::from(alloc.job.priority)).sum();
    max + sum / max
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Timestamp;
    use crate::state::{Command, StateStore};
    use crate::structs::{AllocatedPort, EvalId, Job, JobType, NetworkResource, NodeId, Port, TaskGroup};

    /// A node of 1000 MHz holding allocations of (job priority, cpu, static port).
    fn node_with(allocs: &[(u8, u64, Option<u16>)]) -> (StateStore, Node) {
        let store = StateStore::new();
        let node = Node::new_ready(NodeId::from_u128(1), "dc1", "", Resources::new(1000, 1000, 0));
        store.apply(Command::UpsertNode { node: node.clone(), evals: vec![] }).expect("node");
        for (i, (priority, cpu, port)) in allocs.iter().enumerate() {
            let mut spec = Job::new_simple(&format!("job-{i}"), JobType::Service, 1, Resources::new(*cpu, 10, 0));
            spec.priority = *priority;
            store.apply(Command::RegisterJob { job: spec.clone(), eval: None }).expect("job");
            let job = store.snapshot().job(&spec.key()).expect("stored").clone();
            let mut alloc = Allocation::new_placement(&job, "group", 0, node.id, EvalId::from_u128(1));
            alloc.ports = port
                .iter()
                .map(|value| AllocatedPort { label: "p".into(), value: *value, to: 0, host_ip: "127.0.0.1".into() })
                .collect();
            let allocs = vec![alloc];
            let command = Command::ApplyPlanResults {
                deployment: None,
                deployment_updates: Vec::new(),
                eval_id: EvalId::from_u128(1),
                allocs,
                evals: vec![],
                time: Timestamp(1),
            };
            store.apply(command).expect("alloc");
        }
        (store, node)
    }

    fn evicted(preemption: &Preemption) -> Vec<(u8, u64)> {
        let mut evicted: Vec<(u8, u64)> =
            preemption.allocs.iter().map(|alloc| (alloc.job.priority, alloc.resources.cpu)).collect();
        evicted.sort_unstable();
        evicted
    }

    fn static_port(port: u16) -> PortAsk {
        let group = TaskGroup {
            networks: vec![NetworkResource { reserved_ports: vec![Port::new("http", port)], dynamic_ports: vec![] }],
            ..Job::new_simple("x", JobType::System, 1, Resources::new(1, 1, 0)).task_groups.remove(0)
        };
        PortAsk::of(&group).expect("a port")
    }

    #[test]
    fn the_lowest_priorities_go_first_and_no_more_than_needed() {
        // 900 MHz used: 300 at priority 20, 300 at 30, 200 and 100 at 40.
        let (store, node) = node_with(&[(20, 300, None), (30, 300, None), (40, 200, None), (40, 100, None)]);
        let (state, usage) = (store.snapshot(), PlanUsage::default());
        let preempt =
            |cpu, priority| preemption_for(&*state, &usage, &node, Resources::new(cpu, 10, 0), None, priority);
        assert_eq!(evicted(&preempt(350, 100).expect("room")), vec![(20, 300)], "100 free + 300 of the lowest");
        assert_eq!(evicted(&preempt(700, 100).expect("room")), vec![(20, 300), (30, 300)], "priority 40 is kept");
        assert!(preempt(350, 30).is_some(), "30 evicts 20: a delta of 10");
        assert!(preempt(350, 29).is_none(), "29 does not evict 20: a delta of 9");
        assert!(preempt(700, 35).is_none(), "35 may only evict the 300 MHz at 20: not enough");
        assert!(preempt(1001, 100).is_none(), "more than the node has");
    }

    #[test]
    fn within_a_priority_the_closest_fit_goes() {
        let (store, node) = node_with(&[(40, 200, None), (40, 100, None), (40, 500, None)]);
        let state = store.snapshot();
        let preemption =
            preemption_for(&*state, &PlanUsage::default(), &node, Resources::new(300, 10, 0), None, 90).expect("room");
        assert_eq!(evicted(&preemption), vec![(40, 100)], "200 free, 100 missing: the 100 MHz allocation");
        assert_eq!(preemption.net_priority, 41.0, "Nomad's net priority: max + sum / max");
    }

    #[test]
    fn the_holder_of_a_needed_static_port_must_go_if_it_may() {
        let (store, node) = node_with(&[(20, 100, Some(8080)), (95, 100, Some(9090)), (20, 100, None)]);
        let (state, usage) = (store.snapshot(), PlanUsage::default());
        let ask = Resources::new(100, 10, 0);
        let preemption = preemption_for(&*state, &usage, &node, ask, Some(&static_port(8080)), 100).expect("room");
        assert_eq!(preemption.allocs.len(), 1);
        assert_eq!(preemption.allocs[0].port_values().collect::<Vec<_>>(), vec![8080], "the holder, nothing else");
        assert!(preemption_for(&*state, &usage, &node, ask, Some(&static_port(9090)), 100).is_none(), "95 stays");
        assert!(distance(ask, Resources::new(100, 10, 0)) < distance(ask, Resources::new(400, 10, 0)));
    }
}
