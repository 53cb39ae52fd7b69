//! Fixtures for tests, benches and simulations (the `testing` feature):
//! clusters and stores of a given size, built through real commands.

pub mod stepped;

use std::sync::Arc;

use crate::clock::Timestamp;
use crate::state::{Command, StateStore};
use crate::structs::{Allocation, EvalId, Job, JobType, Node, NodeId, Resources, ServiceOwner, ServiceRegistration};

/// Node `n` of a test cluster: 20 classes, 4 datacenters, three sizes.
pub fn node(n: usize) -> Node {
    let sizes = [
        Resources::new(4_000, 8_192, 100_000),
        Resources::new(8_000, 16_384, 200_000),
        Resources::new(16_000, 65_536, 500_000),
    ];
    let datacenter = format!("dc{}", n % 4 + 1);
    let class = format!("class-{}", n % 20);
    Node::new_ready(NodeId::from_u128(n as u128 + 1), &datacenter, &class, sizes[n % sizes.len()])
}

/// A registration of `alloc`'s task `web`, service `service_name` on port
/// label `http`, answering on `10.0.0.1:<port>` in `dc1`, tagged `v1`.
pub fn service_registration(alloc: &Allocation, service_name: &str, port: u16) -> ServiceRegistration {
    let mut registration = ServiceRegistration::of_alloc(alloc, "dc1", ServiceOwner::Task("web"), service_name, "http");
    registration.address = "10.0.0.1".into();
    registration.port = port;
    registration.tags = vec!["v1".into()];
    registration
}

/// A store holding `n_nodes` ready nodes and `n_allocs` running
/// allocations of one service job, spread round-robin over the nodes.
/// Returns the store and the ids of the allocations.
pub fn populated_store(n_nodes: usize, n_allocs: usize) -> (Arc<StateStore>, Vec<crate::structs::AllocId>) {
    let store = Arc::new(StateStore::new());
    for n in 0..n_nodes {
        store.apply(Command::UpsertNode { node: node(n), evals: vec![] }).expect("fixture node applies");
    }
    let spec = Job::new_simple("fixture", JobType::Service, n_allocs as u32, Resources::new(10, 16, 0));
    store.apply(Command::RegisterJob { job: spec.clone(), eval: None }).expect("fixture job applies");
    let job = store.snapshot().job(&spec.key()).expect("fixture job stored").clone();
    let mut ids = Vec::with_capacity(n_allocs);
    for chunk_start in (0..n_allocs).step_by(10_000) {
        let chunk_end = (chunk_start + 10_000).min(n_allocs);
        let allocs: Vec<Allocation> = (chunk_start..chunk_end)
            .map(|i| {
                let node_id = NodeId::from_u128((i % n_nodes.max(1)) as u128 + 1);
                Allocation::new_placement(&job, "group", i as u32, node_id, EvalId::from_u128(1))
            })
            .collect();
        ids.extend(allocs.iter().map(|alloc| alloc.id));
        store
            .apply(Command::ApplyPlanResults {
                eval_id: EvalId::from_u128(1),
                allocs,
                evals: vec![],
                deployment: None,
                deployment_updates: vec![],
                time: Timestamp(1),
            })
            .expect("fixture allocs apply");
    }
    (store, ids)
}
