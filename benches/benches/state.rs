//! State store benches: snapshot cost and the cost of a one-row write on a
//! large store (no whole-table copies).

use benches::rss_mib;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use engine::clock::Timestamp;
use engine::state::{ClientAllocUpdate, Command};
use engine::structs::ClientStatus;
use engine::testing::populated_store;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn snapshot(c: &mut Criterion) {
    let before = rss_mib();
    let (store, ids) = populated_store(10_000, 1_000_000);
    eprintln!(
        "store of 10,000 nodes and 1,000,000 allocs: RSS {:.0} MiB (process {:.0} MiB before building it)",
        rss_mib() - before,
        before
    );
    assert_eq!(store.snapshot().alloc_count(), 1_000_000, "the store holds the allocations");
    assert_eq!(ids.len(), 1_000_000);
    let mut group = c.benchmark_group("state/snapshot");
    group.bench_function(BenchmarkId::from_parameter("10000_nodes_1000000_allocs"), |b| b.iter(|| store.snapshot()));
    group.finish();
}

fn commit_one_alloc_update(c: &mut Criterion) {
    let mut group = c.benchmark_group("state/commit_one_alloc_update");
    for (label, n_allocs) in [("10000_nodes_1000_allocs", 1_000), ("10000_nodes_1000000_allocs", 1_000_000)] {
        let (store, ids) = populated_store(10_000, n_allocs);
        let snapshot = store.snapshot();
        let mut next = 0usize;
        group.bench_function(BenchmarkId::from_parameter(label), |b| {
            b.iter(|| {
                let alloc_id = ids[next % ids.len()];
                next = next.wrapping_add(7_919);
                let node_id = snapshot.alloc(alloc_id).expect("fixture alloc").node_id;
                store
                    .apply(Command::UpdateAllocsFromClient {
                        updates: vec![ClientAllocUpdate {
                            alloc_id,
                            node_id,
                            client_status: ClientStatus::Running,
                            client_description: String::new(),
                            services: None,
                            checks: None,
                            health: None,
                            task_states: Default::default(),
                        }],
                        evals: vec![],
                        time: Timestamp(2),
                    })
                    .expect("update applies")
            })
        });
        let running = store.snapshot().allocs().filter(|alloc| alloc.client_status == ClientStatus::Running).count();
        assert!(running > 0, "the updates landed");
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = snapshot, commit_one_alloc_update
}
criterion_main!(benches);
