//! Fixtures for tests, benches and simulations (the `testing` feature):
//! clusters and stores of a given size, built through real commands.

pub mod stepped;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::clock::Timestamp;
use crate::state::{Applied, Command, CommandLog, PendingWrite, StateError, StateStore};
use crate::structs::{Allocation, EvalId, Job, JobType, Node, NodeId, Resources, ServiceOwner, ServiceRegistration};
use crate::sync::Reply;

/// Where a held command's answer goes.
type Answer = Arc<Reply<Result<Applied, StateError>>>;

/// A command log that holds every command until the test writes it, as a
/// durable log holds writes until their fsync: a test sees which writes
/// were submitted together, and what waited for what.
#[derive(Debug)]
pub struct HeldLog {
    store: Arc<StateStore>,
    held: Mutex<Vec<(Command, Answer)>>,
    arrived: Condvar,
    /// Set when a wait failed: every write is refused from then on, so
    /// the test's threads end and the test fails instead of hanging.
    failed: AtomicBool,
}

impl HeldLog {
    /// A log that writes to `store` when told to.
    pub fn new(store: Arc<StateStore>) -> Arc<HeldLog> {
        Arc::new(HeldLog {
            store,
            held: Mutex::new(Vec::new()),
            arrived: Condvar::new(),
            failed: AtomicBool::new(false),
        })
    }

    /// Waits until the commands held, oldest first, are `enough`. A
    /// watchdog, not a wait for time: after 10 s without them it refuses
    /// every write, held or to come (so the threads waiting for them end),
    /// and panics with `why`, what it means that they never came.
    pub fn wait_until(&self, why: &str, mut enough: impl FnMut(&[&Command]) -> bool) {
        let mut held = self.held.lock();
        while !enough(&held.iter().map(|(command, _)| command).collect::<Vec<_>>()) {
            if self.arrived.wait_for(&mut held, Duration::from_secs(10)).timed_out() {
                self.failed.store(true, Ordering::SeqCst);
                for (_, answer) in held.drain(..) {
                    answer.set(Err(StateError::ShuttingDown));
                }
                panic!("{why}");
            }
        }
    }

    /// Writes every command held, in order, and answers each; how many.
    pub fn write_held(&self) -> usize {
        let held = std::mem::take(&mut *self.held.lock());
        let written = held.len();
        for (command, answer) in held {
            answer.set(self.store.apply(command));
        }
        written
    }
}

impl CommandLog for HeldLog {
    fn submit(&self, command: Command) -> PendingWrite {
        let answer = Arc::new(Reply::new());
        let mut held = self.held.lock();
        if self.failed.load(Ordering::SeqCst) {
            return PendingWrite::done(Err(StateError::ShuttingDown));
        }
        held.push((command, answer.clone()));
        drop(held);
        self.arrived.notify_all();
        PendingWrite::waiting(async move { answer.take().await.unwrap_or(Err(StateError::ShuttingDown)) })
    }
}

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
