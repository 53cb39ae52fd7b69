//! Heartbeat benches: the cost of one heartbeat (`update_status` of a ready
//! node that stays ready) on a server with 100,000 registered nodes. The
//! target is 200,000 heartbeats/s on one core, so that the transport, not
//! the engine, limits the heartbeat rate. Registering the nodes is not timed.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use engine::clock::SystemClock;
use engine::server::{Server, ServerConfig};
use engine::structs::{NodeId, NodeStatus};
use engine::testing::node;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const N_NODES: usize = 100_000;

fn update_status(c: &mut Criterion) {
    let server = Server::start(ServerConfig { workers: 1, ..ServerConfig::default() }, SystemClock::shared());
    let nodes = server.nodes();
    let ids: Vec<NodeId> = (0..N_NODES)
        .map(|n| {
            let node = node(n);
            nodes.register(node.clone()).expect("node registers");
            node.id
        })
        .collect();
    let before = server.heartbeats().stats();
    assert_eq!(before.active_timers, N_NODES, "every node has a deadline");
    // The workload does its work (checked before timing, so a filtered run checks it too).
    assert_eq!(nodes.update_status(ids[0], NodeStatus::Ready).expect("heartbeat").status, NodeStatus::Ready);
    assert!(server.heartbeats().stats().resets > before.resets, "a heartbeat resets its node's timer");

    let mut group = c.benchmark_group("heartbeat/update_status");
    group.throughput(Throughput::Elements(1));
    let mut next = 0;
    group.bench_function(BenchmarkId::from_parameter("100000_nodes"), |b| {
        b.iter(|| {
            next = (next + 1) % N_NODES;
            nodes.update_status(ids[next], NodeStatus::Ready).expect("heartbeat")
        })
    });
    group.finish();
    let after = server.heartbeats().stats();
    assert_eq!(after.expirations, 0, "no node was missed while heartbeating: {after:?}");
    server.shutdown();
}

criterion_group!(benches, update_status);
criterion_main!(benches);
