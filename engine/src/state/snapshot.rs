//! Immutable views of the state at one index.
//!
//! A [`Snapshot`] never changes once published: the store's writer builds
//! the next one from a clone (O(1): every table is persistent) and publishes
//! it whole. Readers keep whatever snapshot they loaded for as long as they
//! like.

use std::sync::Arc;

use imbl::{OrdSet, Vector};
use serde::{Deserialize, Serialize};

use super::periodic::PeriodicLaunch;
use super::services::{ServiceDump, ServiceTables};
use super::table::Table;
use crate::structs::{
    AclState, AllocId, Allocation, ComputedClass, Deployment, DeploymentId, EvalId, Evaluation, Job, JobKey, Namespace,
    Node, NodeId, PortSet, Resources, SchedulerConfiguration, DEFAULT_NAMESPACE,
};

/// The state at one index.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub(super) index: u64,
    pub(super) nodes: Table<NodeId, Arc<Node>>,
    pub(super) jobs: Table<JobKey, Arc<Job>>,
    /// The kept versions of each job, newest first (`job_versions.rs`).
    pub(super) job_versions: Table<JobKey, Vector<Arc<Job>>>,
    pub(super) allocs: Table<AllocId, Arc<Allocation>>,
    pub(super) evals: Table<EvalId, Arc<Evaluation>>,
    pub(super) allocs_by_node: Table<NodeId, Vector<AllocId>>,
    pub(super) allocs_by_job: Table<JobKey, Vector<AllocId>>,
    pub(super) evals_by_job: Table<JobKey, Vector<EvalId>>,
    pub(super) nodes_by_class: Table<ComputedClass, Vector<NodeId>>,
    /// Ready and eligible nodes, sorted by id; changes only when that set does.
    pub(super) schedulable: NodeList,
    /// Resources used by live allocations, per node.
    pub(super) node_usage: Table<NodeId, Resources>,
    /// Host ports held by live allocations, per node (only nodes where some are).
    pub(super) node_ports: Table<NodeId, PortSet>,
    /// The operator's scheduler configuration; `None` until one is written.
    pub(super) scheduler_config: Option<SchedulerConfiguration>,
    /// ACL tokens and policies (small: a write copies them).
    pub(super) acl: Arc<AclState>,
    /// The namespaces written (small: a write copies them); `default`
    /// exists without being written.
    pub(super) namespaces: Arc<std::collections::BTreeMap<String, Namespace>>,
    /// Service registrations and their lookups.
    pub(super) services: ServiceTables,
    /// Deployments (`deployments.rs`), each job's in creation order, and
    /// the ids of those still running or paused.
    pub(super) deployments: Table<DeploymentId, Arc<Deployment>>,
    pub(super) deployments_by_job: Table<JobKey, Vector<DeploymentId>>,
    pub(super) active_deployments: OrdSet<DeploymentId>,
    /// The last launch of each periodic job (`periodic.rs`).
    pub(super) periodic_launches: Table<JobKey, PeriodicLaunch>,
    pub(super) table_indexes: TableIndexes,
}

/// Node ids sorted by id, as a persistent vector: O(1) to clone, O(log n)
/// to change one. The persistent vector (imbl's) stays behind this type, so
/// the scheduler's `State` contract does not change with it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeList(Vector<NodeId>);

impl NodeList {
    /// How many nodes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The node at `position`.
    pub fn get(&self, position: usize) -> Option<NodeId> {
        self.0.get(position).copied()
    }

    /// The nodes in id order.
    pub fn iter(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.0.iter().copied()
    }

    /// Adds `node_id` in order; false if it was there.
    pub(super) fn insert(&mut self, node_id: NodeId) -> bool {
        match self.0.binary_search(&node_id) {
            Ok(_) => false,
            Err(position) => {
                self.0.insert(position, node_id);
                true
            }
        }
    }

    /// Removes `node_id`; false if it was not there.
    pub(super) fn remove(&mut self, node_id: NodeId) -> bool {
        match self.0.binary_search(&node_id) {
            Ok(position) => {
                self.0.remove(position);
                true
            }
            Err(_) => false,
        }
    }
}

/// The index of the last write to each table; blocking queries wait on these.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableIndexes {
    /// Last write to nodes.
    pub nodes: u64,
    /// Last write to jobs.
    pub jobs: u64,
    /// Last write to allocations.
    pub allocs: u64,
    /// Last write to evaluations.
    pub evals: u64,
    /// Last write to service registrations.
    pub services: u64,
    /// Last write to deployments.
    #[serde(default)]
    pub deployments: u64,
    /// Last write to namespaces.
    #[serde(default)]
    pub namespaces: u64,
}

impl Default for Snapshot {
    fn default() -> Self {
        Snapshot {
            index: 0,
            nodes: Table::with_depth(3),
            jobs: Table::with_depth(3),
            job_versions: Table::with_depth(3),
            allocs: Table::with_depth(4),
            evals: Table::with_depth(4),
            allocs_by_node: Table::with_depth(3),
            allocs_by_job: Table::with_depth(3),
            evals_by_job: Table::with_depth(3),
            nodes_by_class: Table::with_depth(1),
            schedulable: NodeList::default(),
            node_usage: Table::with_depth(3),
            node_ports: Table::with_depth(3),
            scheduler_config: None,
            acl: Arc::default(),
            namespaces: Arc::default(),
            services: ServiceTables::default(),
            deployments: Table::with_depth(3),
            deployments_by_job: Table::with_depth(3),
            active_deployments: OrdSet::new(),
            periodic_launches: Table::with_depth(1),
            table_indexes: TableIndexes::default(),
        }
    }
}

impl Snapshot {
    /// The index of the last command in this snapshot.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// Per-table indexes.
    pub fn table_indexes(&self) -> TableIndexes {
        self.table_indexes
    }

    /// A node by id.
    pub fn node(&self, id: NodeId) -> Option<&Arc<Node>> {
        self.nodes.get(&id)
    }

    /// Every node.
    pub fn nodes(&self) -> impl Iterator<Item = &Arc<Node>> + '_ {
        self.nodes.values()
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Ready and eligible nodes, sorted by id. O(1) to take.
    pub fn schedulable_nodes(&self) -> &NodeList {
        &self.schedulable
    }

    /// Resources used by the live allocations on a node.
    pub fn node_usage(&self, node: NodeId) -> Resources {
        self.node_usage.get(&node).copied().unwrap_or_default()
    }

    /// Host ports held by live allocations on a node (reserved ports are on the node).
    pub fn node_ports(&self, node: NodeId) -> Option<&PortSet> {
        self.node_ports.get(&node)
    }

    /// Whether a live allocation on `node` holds `port`.
    pub fn port_in_use(&self, node: NodeId, port: u16) -> bool {
        self.node_ports.get(&node).is_some_and(|ports| ports.contains(port))
    }

    /// How many ports in `low..=high` live allocations on `node` hold.
    pub fn ports_in_use_between(&self, node: NodeId, low: u16, high: u16) -> usize {
        self.node_ports.get(&node).map_or(0, |ports| ports.count_in(low, high))
    }

    /// The operator's scheduler configuration, if one was written.
    pub fn scheduler_config(&self) -> Option<SchedulerConfiguration> {
        self.scheduler_config
    }

    /// The ACL tokens and policies.
    pub fn acl(&self) -> &AclState {
        &self.acl
    }

    /// The namespace `name`, if it exists (`default` always does).
    pub fn namespace(&self, name: &str) -> Option<Namespace> {
        match self.namespaces.get(name) {
            Some(namespace) => Some(namespace.clone()),
            None if name == DEFAULT_NAMESPACE => Some(Namespace::implicit_default()),
            None => None,
        }
    }

    /// Whether the namespace `name` exists.
    pub fn has_namespace(&self, name: &str) -> bool {
        name == DEFAULT_NAMESPACE || self.namespaces.contains_key(name)
    }

    /// Every namespace, `default` included, by name.
    pub fn namespaces(&self) -> Vec<Namespace> {
        let mut all: Vec<Namespace> = self.namespaces.values().cloned().collect();
        if !self.namespaces.contains_key(DEFAULT_NAMESPACE) {
            let at = all.partition_point(|namespace| namespace.name.as_str() < DEFAULT_NAMESPACE);
            all.insert(at, Namespace::implicit_default());
        }
        all
    }

    /// Ports held twice on one node, or held although the node reserves
    /// them, as `(node, port)`. An audit for tests and load checks: it reads
    /// the allocations themselves (O(allocations)), not the port index.
    pub fn port_collisions(&self) -> Vec<(NodeId, u16)> {
        let mut collisions = Vec::new();
        for node in self.nodes() {
            let held =
                self.allocs_by_node(node.id).filter(|alloc| !alloc.terminal()).flat_map(|alloc| alloc.port_values());
            let held = PortSet::of(held);
            collisions.extend(held.duplicates().into_iter().map(|port| (node.id, port)));
            let reserved = held.iter().filter(|port| node.network.reserved_ports.contains(*port));
            collisions.extend(reserved.map(|port| (node.id, port)));
        }
        collisions.sort_unstable();
        collisions.dedup();
        collisions
    }

    /// Nodes whose live allocations need more than they can give, each with
    /// what is in use and what is allocatable. An audit for tests and load
    /// checks: it sums the allocations themselves (O(allocations)) rather than
    /// trusting the `node_usage` index.
    pub fn oversubscribed_nodes(&self) -> Vec<(NodeId, Resources, Resources)> {
        self.nodes()
            .filter_map(|node| {
                let used = self
                    .allocs_by_node(node.id)
                    .filter(|alloc| !alloc.terminal())
                    .fold(Resources::default(), |sum, alloc| sum.plus(alloc.resources));
                (!node.allocatable().covers(used)).then(|| (node.id, used, node.allocatable()))
            })
            .collect()
    }

    /// Nodes of one computed class.
    pub fn nodes_by_class(&self, class: ComputedClass) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes_by_class.get(&class).into_iter().flat_map(|ids| ids.iter().copied())
    }

    /// Every computed class with its nodes (whatever their status), in class
    /// order; each list is O(1) to take.
    pub fn class_nodes(&self) -> Vec<(ComputedClass, NodeList)> {
        let mut classes: Vec<(ComputedClass, NodeList)> =
            self.nodes_by_class.iter().map(|(class, ids)| (*class, NodeList(ids.clone()))).collect();
        classes.sort_unstable_by_key(|(class, _)| *class);
        classes
    }

    /// A job by key.
    pub fn job(&self, key: &JobKey) -> Option<&Arc<Job>> {
        self.jobs.get(key)
    }

    /// Every job.
    pub fn jobs(&self) -> impl Iterator<Item = &Arc<Job>> + '_ {
        self.jobs.values()
    }

    /// An allocation by id.
    pub fn alloc(&self, id: AllocId) -> Option<&Arc<Allocation>> {
        self.allocs.get(&id)
    }

    /// Number of allocations.
    pub fn alloc_count(&self) -> usize {
        self.allocs.len()
    }

    /// Every allocation.
    pub fn allocs(&self) -> impl Iterator<Item = &Arc<Allocation>> + '_ {
        self.allocs.values()
    }

    /// Allocations placed on a node, terminal ones included.
    pub fn allocs_by_node(&self, node: NodeId) -> impl Iterator<Item = &Arc<Allocation>> + '_ {
        let ids = self.allocs_by_node.get(&node);
        ids.into_iter().flat_map(|ids| ids.iter()).filter_map(|id| self.allocs.get(id))
    }

    /// Allocations of a job, terminal ones included.
    pub fn allocs_by_job(&self, job: &JobKey) -> impl Iterator<Item = &Arc<Allocation>> + '_ {
        let ids = self.allocs_by_job.get(job);
        ids.into_iter().flat_map(|ids| ids.iter()).filter_map(|id| self.allocs.get(id))
    }

    /// An evaluation by id.
    pub fn eval(&self, id: EvalId) -> Option<&Arc<Evaluation>> {
        self.evals.get(&id)
    }

    /// Every evaluation.
    pub fn evals(&self) -> impl Iterator<Item = &Arc<Evaluation>> + '_ {
        self.evals.values()
    }

    /// Evaluations of a job.
    pub fn evals_by_job(&self, job: &JobKey) -> impl Iterator<Item = &Arc<Evaluation>> + '_ {
        let ids = self.evals_by_job.get(job);
        ids.into_iter().flat_map(|ids| ids.iter()).filter_map(|id| self.evals.get(id))
    }
}

/// Everything a snapshot holds, in one canonical order (by id), so two
/// replicas, or a store and its replay, can be compared whole. Tables are
/// sorted; the derived indexes keep their own (insertion) order, which a
/// replay of the same commands reproduces.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StateDump {
    /// The index.
    pub index: u64,
    /// The per-table indexes.
    pub table_indexes: TableIndexes,
    /// Nodes by id.
    pub nodes: Vec<Node>,
    /// Jobs by key.
    pub jobs: Vec<Job>,
    /// The kept versions of each job, newest first.
    pub job_versions: Vec<(JobKey, Vec<Job>)>,
    /// Allocations by id.
    pub allocs: Vec<Allocation>,
    /// Evaluations by id.
    pub evals: Vec<Evaluation>,
    /// Allocation ids per node.
    pub allocs_by_node: Vec<(NodeId, Vec<AllocId>)>,
    /// Allocation ids per job.
    pub allocs_by_job: Vec<(JobKey, Vec<AllocId>)>,
    /// Eval ids per job.
    pub evals_by_job: Vec<(JobKey, Vec<EvalId>)>,
    /// Node ids per computed class.
    pub nodes_by_class: Vec<(ComputedClass, Vec<NodeId>)>,
    /// Schedulable nodes, as kept.
    pub schedulable: Vec<NodeId>,
    /// Usage per node.
    pub node_usage: Vec<(NodeId, Resources)>,
    /// Ports held per node.
    pub node_ports: Vec<(NodeId, Vec<u16>)>,
    /// The scheduler configuration.
    pub scheduler_config: Option<SchedulerConfiguration>,
    /// ACL tokens and policies.
    pub acl: AclState,
    /// The namespaces written, by name.
    pub namespaces: Vec<Namespace>,
    /// Service registrations and their lookups.
    pub services: ServiceDump,
    /// Deployments by id.
    pub deployments: Vec<Deployment>,
    /// Each job's deployments in creation order.
    pub deployments_by_job: Vec<(JobKey, Vec<DeploymentId>)>,
    /// Periodic launch records by job.
    pub periodic_launches: Vec<PeriodicLaunch>,
}

impl Snapshot {
    /// The whole state in canonical order (see [`StateDump`]).
    pub fn dump(&self) -> StateDump {
        fn sorted<K, V: Clone, W>(table: &Table<K, V>, map: impl Fn(&V) -> W) -> Vec<(K, W)>
        where
            K: Ord + Clone + std::hash::Hash + Eq,
        {
            let mut rows: Vec<(K, W)> = table.iter().map(|(key, value)| (key.clone(), map(value))).collect();
            rows.sort_by(|a, b| a.0.cmp(&b.0));
            rows
        }
        StateDump {
            index: self.index,
            table_indexes: self.table_indexes,
            nodes: sorted(&self.nodes, |node| Node::clone(node)).into_iter().map(|(_, node)| node).collect(),
            jobs: sorted(&self.jobs, |job| Job::clone(job)).into_iter().map(|(_, job)| job).collect(),
            job_versions: sorted(&self.job_versions, |versions| versions.iter().map(|job| Job::clone(job)).collect()),
            allocs: sorted(&self.allocs, |alloc| Allocation::clone(alloc))
                .into_iter()
                .map(|(_, alloc)| alloc)
                .collect(),
            evals: sorted(&self.evals, |eval| Evaluation::clone(eval)).into_iter().map(|(_, eval)| eval).collect(),
            allocs_by_node: sorted(&self.allocs_by_node, |ids| ids.iter().copied().collect()),
            allocs_by_job: sorted(&self.allocs_by_job, |ids| ids.iter().copied().collect()),
            evals_by_job: sorted(&self.evals_by_job, |ids| ids.iter().copied().collect()),
            nodes_by_class: sorted(&self.nodes_by_class, |ids| ids.iter().copied().collect()),
            schedulable: self.schedulable.iter().collect(),
            node_usage: sorted(&self.node_usage, |usage| *usage),
            node_ports: sorted(&self.node_ports, |ports| ports.iter().collect()),
            scheduler_config: self.scheduler_config,
            acl: AclState::clone(&self.acl),
            namespaces: self.namespaces.values().cloned().collect(),
            services: self.services.dump(),
            deployments: sorted(&self.deployments, |deployment| Deployment::clone(deployment))
                .into_iter()
                .map(|(_, deployment)| deployment)
                .collect(),
            deployments_by_job: sorted(&self.deployments_by_job, |ids| ids.iter().copied().collect()),
            periodic_launches: sorted(&self.periodic_launches, PeriodicLaunch::clone)
                .into_iter()
                .map(|(_, launch)| launch)
                .collect(),
        }
    }
}

/// Adds `value` to the list under `key`.
pub(super) fn index_add<K, T>(index: &mut Table<K, Vector<T>>, key: K, value: T)
where
    K: std::hash::Hash + Eq + Clone,
    T: Clone + PartialEq,
{
    let mut list = index.get(&key).cloned().unwrap_or_default();
    list.push_back(value);
    index.insert(key, list);
}

/// Removes `value` from the list under `key`, dropping the key when the list empties.
pub(super) fn index_remove<K, T>(index: &mut Table<K, Vector<T>>, key: &K, value: &T)
where
    K: std::hash::Hash + Eq + Clone,
    T: Clone + PartialEq,
{
    let Some(mut list) = index.get(key).cloned() else {
        return;
    };
    if let Some(position) = list.index_of(value) {
        list.remove(position);
    }
    if list.is_empty() {
        index.remove(key);
    } else {
        index.insert(key.clone(), list);
    }
}
