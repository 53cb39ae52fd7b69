//! Scheduler benches: one eval, start to submitted plan, on 10,000 ready
//! nodes in 20 classes. The planner accepts every plan without writing it,
//! so each iteration schedules against the same state.

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use engine::clock::Timestamp;
use engine::scheduler::{new_scheduler, Planner, SchedulerConfig, SchedulerError, State};
use engine::state::{Command, StateStore};
use engine::structs::{Evaluation, Job, JobType, Plan, PlanResult, Resources, TriggerReason};
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
        let result = PlanResult {
            node_allocation: Default::default(),
            node_update: Default::default(),
            refresh_index: 0,
            alloc_index: 1,
        };
        self.last_plan = Some(plan);
        Ok((result, None))
    }
    fn write_eval(&mut self, _eval: Evaluation) -> Result<(), SchedulerError> {
        Ok(())
    }
}

/// A store with `n_nodes` ready nodes and `job` registered; returns it with the job's eval.
fn cluster(n_nodes: usize, job: &Job) -> (StateStore, Evaluation) {
    let store = StateStore::new();
    for n in 0..n_nodes {
        store.apply(Command::UpsertNode { node: node(n), evals: vec![] }).expect("node applies");
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
    let mut planner = AcceptAll::default();
    let config = SchedulerConfig { seed, now: Timestamp(2), ..SchedulerConfig::default() };
    new_scheduler(eval.eval_type, state.clone(), &mut planner, config).process(eval).expect("scheduled");
    planner.last_plan.map_or(0, |plan| plan.placement_count())
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

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = service, system
}
criterion_main!(benches);
