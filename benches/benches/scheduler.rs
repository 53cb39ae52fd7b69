//! Scheduler benches: one eval, start to submitted plan, on 10,000 ready
//! nodes in 20 classes and 4 datacenters. The planner accepts every plan
//! without writing it, so each iteration schedules against the same state.
//! The placement-feature benches add a rack (`meta.rack`, 10 values) to every
//! node and schedule a job with two spreads (datacenter and rack), two
//! dynamic ports per allocation, or two affinities.

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use engine::clock::Timestamp;
use engine::scheduler::{new_scheduler, Planner, SchedulerConfig, SchedulerError, State};
use engine::state::{Command, StateStore};
use engine::structs::{
    Affinity, ConstraintOperand, Evaluation, Job, JobType, NetworkResource, Node, Plan, PlanResult, Port, Resources,
    Spread, TriggerReason,
};
use engine::testing::node;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Takes every plan whole; keeps the last one so the bench can check it.
#[derive(Default)]
struct AcceptAll {
    last_plan: Option<Plan>,
}

impl Planner for AcceptAll {
    fn submit_plan(&mut self, plan: Plan) -> Result<(PlanResult, Option<Arc<dyn State>>), SchedulerError> {
        let result = PlanResult { alloc_index: 1, ..PlanResult::default() };
        self.last_plan = Some(plan);
        Ok((result, None))
    }
    fn write_eval(&mut self, _eval: Evaluation) -> Result<(), SchedulerError> {
        Ok(())
    }
}

/// A store with `n_nodes` ready nodes and `job` registered; returns it with the job's eval.
fn cluster(n_nodes: usize, job: &Job) -> (StateStore, Evaluation) {
    cluster_of(n_nodes, node, job)
}

/// Node `n` of the fixture with `meta.rack` = `r{n % 10}` (the class already
/// determines it, so the cluster keeps its 20 classes).
fn racked_node(n: usize) -> Node {
    let mut node = node(n);
    node.meta.insert("rack".to_string(), format!("r{}", n % 10));
    node.computed_class = node.compute_class();
    node
}

fn cluster_of(n_nodes: usize, make: fn(usize) -> Node, job: &Job) -> (StateStore, Evaluation) {
    let store = StateStore::new();
    for n in 0..n_nodes {
        store.apply(Command::UpsertNode { node: make(n), evals: vec![] }).expect("node applies");
    }
    let eval = Evaluation::for_job(job, TriggerReason::JobRegister, Timestamp(1));
    let applied = store.apply(Command::RegisterJob { job: job.clone(), eval: Some(eval) }).expect("job applies");
    (store, Evaluation::clone(&applied.evals[0]))
}

fn job(job_type: JobType, count: u32) -> Job {
    let mut job = Job::new_simple("bench", job_type, count, Resources::new(100, 128, 0));
    job.datacenters = (1..=4).map(|dc| format!("dc{dc}")).collect();
    job
}

/// Schedules `eval` once and returns how many allocations the plan places.
fn schedule_once(state: &Arc<dyn State>, eval: &Evaluation, seed: u64) -> usize {
    plan_once(state, eval, seed).map_or(0, |plan| plan.placement_count())
}

/// Schedules `eval` once and returns its plan.
fn plan_once(state: &Arc<dyn State>, eval: &Evaluation, seed: u64) -> Option<Plan> {
    let mut planner = AcceptAll::default();
    let config = SchedulerConfig { seed, now: Timestamp(2), ..SchedulerConfig::default() };
    new_scheduler(eval.eval_type, state.clone(), &mut planner, config).process(eval).expect("scheduled");
    planner.last_plan
}

fn service(c: &mut Criterion) {
    let mut group = c.benchmark_group("scheduler/service");
    for count in [1_000u32, 5_000] {
        let (store, eval) = cluster(10_000, &job(JobType::Service, count));
        let state: Arc<dyn State> = store.snapshot();
        assert_eq!(schedule_once(&state, &eval, 0), count as usize, "the plan places every allocation");
        group.throughput(Throughput::Elements(u64::from(count)));
        let mut seed = 0;
        group.bench_function(BenchmarkId::from_parameter(format!("{count}_allocs_10000_nodes")), |b| {
            b.iter(|| {
                seed += 1;
                schedule_once(&state, &eval, seed)
            })
        });
    }
    group.finish();
}

fn system(c: &mut Criterion) {
    let mut group = c.benchmark_group("scheduler/system");
    let (store, eval) = cluster(10_000, &job(JobType::System, 1));
    let state: Arc<dyn State> = store.snapshot();
    assert_eq!(schedule_once(&state, &eval, 0), 10_000, "one allocation per node");
    group.bench_function(BenchmarkId::from_parameter("10000_nodes"), |b| b.iter(|| schedule_once(&state, &eval, 0)));
    group.finish();
}

/// A service job of 1,000 allocations with the placement feature `with`.
fn featured_job(with: fn(&mut Job)) -> Job {
    let mut job = job(JobType::Service, 1_000);
    with(&mut job);
    job
}

fn spread_over_datacenters_and_racks(job: &mut Job) {
    job.spreads.push(Spread::even("${node.datacenter}", 50));
    job.task_groups[0].spreads.push(Spread::even("${meta.rack}", 50));
}

fn two_dynamic_ports(job: &mut Job) {
    job.task_groups[0].networks = vec![NetworkResource {
        reserved_ports: vec![],
        dynamic_ports: vec![Port::new("http", 0), Port::new("admin", 0)],
    }];
}

fn two_affinities(job: &mut Job) {
    job.affinities.push(Affinity::new("${meta.rack}", ConstraintOperand::Equal, "r3", 50));
    job.task_groups[0].affinities.push(Affinity::new("${node.class}", ConstraintOperand::Equal, "class-13", -30));
}

/// Live placements per value of `of(node)`.
fn placed_per(state: &Arc<dyn State>, plan: &Plan, of: impl Fn(&Node) -> String) -> Vec<usize> {
    let mut counts = std::collections::BTreeMap::new();
    for (node_id, allocs) in &plan.node_allocation {
        let node = state.node(*node_id).expect("a placed node");
        *counts.entry(of(&node)).or_insert(0) += allocs.len();
    }
    counts.into_values().collect()
}

/// Checks that a featured plan did what its feature asks before timing it.
fn check_feature(name: &str, state: &Arc<dyn State>, plan: &Plan) {
    assert_eq!(plan.placement_count(), 1_000, "{name}: the plan places every allocation");
    match name {
        "service_spread" => {
            let by_dc = placed_per(state, plan, |node| node.datacenter.to_string());
            let by_rack = placed_per(state, plan, |node| node.meta["rack"].clone());
            assert!(by_dc.iter().all(|count| count.abs_diff(250) <= 1), "even over datacenters: {by_dc:?}");
            assert!(by_rack.iter().all(|count| count.abs_diff(100) <= 1), "even over racks: {by_rack:?}");
        }
        "service_ports" => {
            for (node_id, allocs) in &plan.node_allocation {
                let mut ports: Vec<u16> = allocs.iter().flat_map(|alloc| alloc.port_values()).collect();
                assert_eq!(ports.len(), 2 * allocs.len(), "two ports each");
                ports.sort_unstable();
                ports.dedup();
                assert_eq!(ports.len(), 2 * allocs.len(), "no port twice on {node_id}");
            }
        }
        "service_affinity" => {
            let preferred = placed_per(state, plan, |node| (node.meta["rack"] == "r3").to_string());
            assert_eq!(preferred, vec![1_000], "every allocation on the preferred rack");
        }
        other => unreachable!("{other}"),
    }
}

fn placement_features(c: &mut Criterion) {
    type Feature = (&'static str, fn(&mut Job));
    let features: [Feature; 3] = [
        ("service_spread", spread_over_datacenters_and_racks),
        ("service_ports", two_dynamic_ports),
        ("service_affinity", two_affinities),
    ];
    for (name, with) in features {
        let mut group = c.benchmark_group(format!("scheduler/{name}"));
        let (store, eval) = cluster_of(10_000, racked_node, &featured_job(with));
        let state: Arc<dyn State> = store.snapshot();
        check_feature(name, &state, &plan_once(&state, &eval, 0).expect("a plan"));
        group.throughput(Throughput::Elements(1_000));
        let mut seed = 0;
        group.bench_function(BenchmarkId::from_parameter("1000_allocs_10000_nodes"), |b| {
            b.iter(|| {
                seed += 1;
                schedule_once(&state, &eval, seed)
            })
        });
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = service, system, placement_features
}
criterion_main!(benches);
