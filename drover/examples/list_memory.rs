//! What a filtered list costs in memory: 100,000 allocations in the
//! state (on 1,000 nodes), `GET /v1/allocations?filter=Name matches
//! "group.1234[0-9].$"` (10 of them) answered two ways, each
//! measured as the heap's peak above what the state holds (a counting
//! allocator, `peak_alloc`) and its time, medians of 5:
//!
//! 1. the paginator every list uses (`http/paging.rs`): candidates as
//!    references into the snapshot, each answered, matched and dropped
//!    unless it matches;
//! 2. what the lists did before it: every allocation's answer built
//!    first, then filtered.
//!
//! ```sh
//! cargo run --release -p drover --example list_memory
//! ```

use std::sync::Arc;
use std::time::Instant;

use drover::http::filter::Filter;
use drover::http::nomad;
use drover::http::paging::{NewestFirst, PageQuery};
use engine::state::Snapshot;
use engine::structs::Allocation;
use peak_alloc::PeakAlloc;

#[global_allocator]
static HEAP: PeakAlloc = PeakAlloc;

const NODES: usize = 1_000;
const ALLOCS: usize = 100_000;
const RUNS: usize = 5;

/// The heap's peak above its level at the start of `run`, in bytes, the
/// time it took, and what it answered.
fn measured<T>(run: impl FnOnce() -> T) -> (usize, std::time::Duration, T) {
    let before = HEAP.current_usage();
    HEAP.reset_peak_usage();
    let started = Instant::now();
    let answer = run();
    (HEAP.peak_usage().saturating_sub(before), started.elapsed(), answer)
}

fn paginated(snapshot: &Snapshot, filter: &Filter) -> usize {
    let query = PageQuery::new(None, None, Some(filter.clone()));
    let candidates: Vec<&Arc<Allocation>> = snapshot.allocs().collect();
    let key = |alloc: &&Arc<Allocation>| NewestFirst::of(alloc.create_index, alloc.id.0);
    let (page, _) = query.page(candidates, key, |alloc| nomad::alloc_stub(alloc, snapshot)).expect("a page");
    page.len()
}

fn whole_list_first(snapshot: &Snapshot, filter: &Filter) -> usize {
    let mut allocs: Vec<&Arc<Allocation>> = snapshot.allocs().collect();
    allocs.sort_by_key(|alloc| NewestFirst::of(alloc.create_index, alloc.id.0));
    let answers: Vec<_> = allocs.iter().map(|alloc| nomad::alloc_stub(alloc, snapshot)).collect();
    let matching = answers.into_iter().filter(|answer| filter.matches(&serde_json::to_value(answer).expect("json")));
    matching.count()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let (store, _) = engine::testing::populated_store(NODES, ALLOCS);
    let snapshot = store.snapshot();
    // Names are `fixture.group[<index>]`: indexes 12340 to 12349.
    let filter = Filter::parse(r#"Name matches "group.1234[0-9].$""#).expect("a filter");
    println!("{} allocations in the state; GET /v1/allocations?filter=Name matches ...", snapshot.alloc_count());
    type Way = fn(&Snapshot, &Filter) -> usize;
    let ways: [(&str, Way); 2] =
        [("paginator (this change)", paginated), ("whole list first (before)", whole_list_first)];
    for (name, way) in ways {
        let (mut peaks, mut times) = (Vec::new(), Vec::new());
        for _ in 0..RUNS {
            let (peak, took, answered) = measured(|| way(&snapshot, &filter));
            assert_eq!(answered, 10, "{name}: the ten allocations the filter names");
            peaks.push(peak as f64 / 1024.0 / 1024.0);
            times.push(took.as_secs_f64() * 1000.0);
        }
        println!("{name:<28} peak heap {:>7.2} MiB   time {:>7.1} ms", median(peaks), median(times));
    }
}
