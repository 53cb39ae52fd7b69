//! The state tables' data structure, measured against the obvious
//! well-kept alternative: Drover's `Table` (a 16-way persistent trie over
//! hashbrown buckets) and `imbl::HashMap` (a HAMT), each holding 1,000,000
//! rows of 300 bytes keyed by allocation id. Reads (what schedulers do) and
//! a one-row write on a fresh clone (what the writer does per command), and
//! the memory each holds, printed on stderr.
//!
//! `cargo bench -p benches --bench table_choice`

use std::hint::black_box;
use std::sync::Arc;

use benches::rss_mib;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use engine::state::Table;
use engine::structs::AllocId;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ROWS: usize = 1_000_000;

type Row = Arc<[u8; 300]>;

fn key(n: usize) -> AllocId {
    AllocId::from_u128((n as u128).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835))
}

fn table_choice(c: &mut Criterion) {
    let before = rss_mib();
    let mut table: Table<AllocId, Row> = Table::with_depth(4);
    for n in 0..ROWS {
        table.insert(key(n), Arc::new([n as u8; 300]));
    }
    let after_table = rss_mib();
    let mut imbl_map: imbl::HashMap<AllocId, Row> = imbl::HashMap::new();
    for n in 0..ROWS {
        imbl_map.insert(key(n), Arc::new([n as u8; 300]));
    }
    let after_imbl = rss_mib();
    eprintln!(
        "1,000,000 rows of 300 bytes: Table +{:.0} MiB, imbl::HashMap (imbl 7) +{:.0} MiB",
        after_table - before,
        after_imbl - after_table
    );
    assert_eq!((table.len(), imbl_map.len()), (ROWS, ROWS), "both hold every row");

    let mut group = c.benchmark_group("state/table_choice/get_1000000_rows");
    let mut next = 0usize;
    group.bench_function(BenchmarkId::from_parameter("table"), |b| {
        b.iter(|| {
            next = (next + 7_919) % ROWS;
            black_box(table.get(&key(next)).expect("present")[0])
        })
    });
    group.bench_function(BenchmarkId::from_parameter("imbl"), |b| {
        b.iter(|| {
            next = (next + 7_919) % ROWS;
            black_box(imbl_map.get(&key(next)).expect("present")[0])
        })
    });
    group.finish();

    let mut group = c.benchmark_group("state/table_choice/clone_and_write_one_1000000_rows");
    group.bench_function(BenchmarkId::from_parameter("table"), |b| {
        b.iter(|| {
            next = (next + 7_919) % ROWS;
            let mut copy = table.clone();
            copy.insert(key(next), Arc::new([1; 300]));
            black_box(copy.len())
        })
    });
    group.bench_function(BenchmarkId::from_parameter("imbl"), |b| {
        b.iter(|| {
            next = (next + 7_919) % ROWS;
            let mut copy = imbl_map.clone();
            copy.insert(key(next), Arc::new([1; 300]));
            black_box(copy.len())
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(50);
    targets = table_choice
}
criterion_main!(benches);
