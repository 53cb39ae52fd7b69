//! What a filtered list costs in memory: 100,010 allocations in the
//! state (1,000 jobs of 100 on 1,000 nodes, and one job `needle` of 10),
//! `GET /v1/allocations?filter=JobID == "needle"` answered two ways, each
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
use engine::clock::Timestamp;
use engine::state::{Command, Snapshot, StateStore};
use engine::structs::{Allocation, EvalId, Job, JobType, Node, NodeId, Resources};
use peak_alloc::PeakAlloc;

#[global_allocator]
static HEAP: PeakAlloc = PeakAlloc;

const NODES: u128 = 1_000;
const JOBS: usize = 1_000;
const PER_JOB: u32 = 100;
const RUNS: usize = 5;

fn place(store: &StateStore, id: &str, count: u32, first_node: u128) {
    let job = Job::new_simple(id, JobType::Service, count, Resources::new(10, 10, 0));
    store.apply(Command::RegisterJob { job: job.clone(), eval: None }).expect("registered");
    let stored = store.snapshot().job(&job.key()).expect("stored").clone();
    let allocs = (0..count)
        .map(|index| {
            let node = NodeId::from_u128(1 + (first_node + u128::from(index)) % NODES);
            Allocation::new_placement(&stored, "group", index, node, EvalId::from_u128(1))
        })
        .collect();
    let plan = Command::ApplyPlanResults {
        eval_id: EvalId::from_u128(1),
        allocs,
        evals: vec![],
        deployment: None,
        deployment_updates: vec![],
        time: Timestamp(1),
    };
    store.apply(plan).expect("placed");
}

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
    let store = StateStore::new();
    for n in 1..=NODES {
        let node = Node::new_ready(NodeId::from_u128(n), "dc1", "general", Resources::new(100_000, 100_000, 100_000));
        store.apply(Command::UpsertNode { node, evals: vec![] }).expect("node");
    }
    for job in 0..JOBS {
        place(&store, &format!("job-{job}"), PER_JOB, job as u128);
    }
    place(&store, "needle", 10, 0);
    let snapshot = store.snapshot();
    let filter = Filter::parse("JobID == \"needle\"").expect("a filter");
    println!("{} allocations in the state; GET /v1/allocations?filter=JobID == \"needle\"", snapshot.alloc_count());
    type Way = fn(&Snapshot, &Filter) -> usize;
    let ways: [(&str, Way); 2] =
        [("paginator (this change)", paginated), ("whole list first (before)", whole_list_first)];
    for (name, way) in ways {
        let (mut peaks, mut times) = (Vec::new(), Vec::new());
        for _ in 0..RUNS {
            let (peak, took, answered) = measured(|| way(&snapshot, &filter));
            assert_eq!(answered, 10, "{name}: the needle's allocations");
            peaks.push(peak as f64 / 1024.0 / 1024.0);
            times.push(took.as_secs_f64() * 1000.0);
        }
        println!("{name:<28} peak heap {:>7.2} MiB   time {:>7.1} ms", median(peaks), median(times));
    }
}
