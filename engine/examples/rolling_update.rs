//! A rolling update in one process: 10,000 nodes, a 1,000-allocation group
//! updated with `max_parallel = 100` in a deployment, against the same
//! update without an `update` block (everything replaced at once, no
//! deployment). Simulated clients report every new allocation running and
//! healthy as soon as they see it, and stopped ones complete, through the
//! node endpoint as agents do.
//!
//! ```sh
//! cargo run --release -p engine --example rolling_update -- [runs]
//! ```
//!
//! Prints, per mode, the median over the runs of: the time from the new
//! version's registration to the rollout's end (deployment successful, or
//! every allocation of the new version running), the plans the applier
//! evaluated and partly refused, the voluntary stops it took out to hold
//! the budget, and the evals workers processed; and checks that no
//! committed state ever had more than `max_parallel` allocations of the
//! group unavailable during the deployment.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::clock::{SharedClock, SystemClock};
use engine::scheduler::reconcile::is_available;
use engine::server::{Server, ServerConfig};
use engine::state::{ClientAllocUpdate, Snapshot};
use engine::structs::{
    AllocHealth, ClientStatus, DeploymentStatus, DesiredStatus, Job, JobType, Node, NodeId, Resources, UpdateStrategy,
};

const NODES: u128 = 10_000;
const COUNT: u32 = 1_000;
const MAX_PARALLEL: u32 = 100;

#[derive(Debug, Clone, Copy)]
struct Run {
    seconds: f64,
    plans: u64,
    partly_refused: u64,
    disruptions_refused: u64,
    evals: u64,
    most_unavailable: usize,
}

fn main() {
    let runs: usize = std::env::args().nth(1).and_then(|text| text.parse().ok()).unwrap_or(5);
    for deployment in [true, false] {
        let mut results: Vec<Run> = (0..runs).map(|_| run(deployment)).collect();
        let label = if deployment { "deployment, max_parallel = 100" } else { "no update block (all at once)" };
        let median = |key: fn(&Run) -> f64, results: &mut Vec<Run>| {
            results.sort_by(|a, b| key(a).total_cmp(&key(b)));
            key(&results[results.len() / 2])
        };
        println!("{label} ({runs} runs, medians):");
        println!("  time to complete      {:>8.3} s", median(|run| run.seconds, &mut results));
        println!("  plans evaluated       {:>8}", median(|run| run.plans as f64, &mut results));
        println!("  plans partly refused  {:>8}", median(|run| run.partly_refused as f64, &mut results));
        println!("  budget stops refused  {:>8}", median(|run| run.disruptions_refused as f64, &mut results));
        println!("  evals processed       {:>8}", median(|run| run.evals as f64, &mut results));
        let worst = results.iter().map(|run| run.most_unavailable).max().unwrap_or(0);
        println!("  most unavailable seen {worst:>8} (of {COUNT})");
    }
}

fn job(deployment: bool, version: &str) -> Job {
    let mut job = Job::new_simple("web", JobType::Service, COUNT, Resources::new(100, 64, 0));
    job.task_groups[0].update = deployment.then(|| UpdateStrategy::rolling(MAX_PARALLEL));
    job.task_groups[0].tasks[0].env.insert("VERSION".into(), version.into());
    job
}

fn run(deployment: bool) -> Run {
    let clock: SharedClock = Arc::new(SystemClock::new());
    // The simulated clients report allocations but send no heartbeats: TTLs
    // longer than the run keep their nodes ready.
    let mut config = ServerConfig::default();
    config.heartbeat.min_heartbeat_ttl = Duration::from_secs(3600);
    config.heartbeat.failover_heartbeat_ttl = Duration::from_secs(3600);
    let server = Server::start(config, clock);
    let nodes = server.nodes();
    for i in 1..=NODES {
        let node =
            Node::new_ready(NodeId::from_u128(i), "dc1", &format!("c{}", i % 4), Resources::new(4000, 8192, 100_000));
        nodes.register(node).expect("node registers");
    }
    let v1 = job(deployment, "1");
    server.jobs().register(v1.clone()).expect("v1 registers");
    settle(&server, &v1, deployment, &mut 0);
    let before = server.stats();
    let started = Instant::now();
    let written = server.jobs().register(job(deployment, "2")).expect("v2 registers");
    let mut most_unavailable = 0;
    settle(&server, &v1, deployment, &mut most_unavailable);
    let seconds = started.elapsed().as_secs_f64();
    let after = server.stats();
    assert!(written.version == 1);
    server.shutdown();
    Run {
        seconds,
        plans: after.plan_applier.plans_evaluated - before.plan_applier.plans_evaluated,
        partly_refused: after.plan_applier.plans_partially_refused - before.plan_applier.plans_partially_refused,
        disruptions_refused: after.plan_applier.disruptions_refused - before.plan_applier.disruptions_refused,
        evals: after.workers.evals_processed - before.workers.evals_processed,
        most_unavailable,
    }
}

/// Plays the clients until the job's current version is rolled out: new
/// allocations are reported running and healthy, stopped ones complete.
/// Tracks the most allocations of the group unavailable at once.
fn settle(server: &Server, job: &Job, deployment: bool, most_unavailable: &mut usize) {
    let nodes = server.nodes();
    let mut index = 0;
    loop {
        let snapshot = server.store().snapshot_min_index(index + 1, Duration::from_secs(60)).expect("the state moves");
        index = snapshot.index();
        let current = snapshot.job(&job.key()).expect("job").job_modify_index;
        let unavailable = COUNT as usize
            - snapshot.allocs_by_job(&job.key()).filter(|alloc| is_available(alloc)).count().min(COUNT as usize);
        *most_unavailable = (*most_unavailable).max(unavailable);
        if done(&snapshot, job, current, deployment) {
            return;
        }
        // One thread speaks for every client: submit all, then wait, so
        // the reports of one moment share a batch as real agents' would.
        let pending: Vec<_> = reports(&snapshot, job)
            .into_iter()
            .map(|(node_id, updates)| nodes.submit_allocs(node_id, updates).expect("reports are taken"))
            .collect();
        for report in pending {
            report.wait().expect("reports are written");
        }
    }
}

fn done(snapshot: &Snapshot, job: &Job, current: u64, deployment: bool) -> bool {
    if deployment {
        let latest = snapshot.latest_deployment(&job.key());
        return latest.is_some_and(|latest| {
            latest.job_spec_modify_index == current && latest.status == DeploymentStatus::Successful
        });
    }
    let live: Vec<_> = snapshot.allocs_by_job(&job.key()).filter(|alloc| !alloc.terminal()).collect();
    live.len() == COUNT as usize
        && live
            .iter()
            .all(|alloc| alloc.job.job_modify_index == current && alloc.client_status == ClientStatus::Running)
}

/// What the clients report now, per node.
fn reports(snapshot: &Snapshot, job: &Job) -> BTreeMap<NodeId, Vec<ClientAllocUpdate>> {
    let mut by_node: BTreeMap<NodeId, Vec<ClientAllocUpdate>> = BTreeMap::new();
    let now = engine::clock::Timestamp(0);
    for alloc in snapshot.allocs_by_job(&job.key()) {
        let (status, health) = match (alloc.desired_status, alloc.client_status) {
            (DesiredStatus::Run, ClientStatus::Pending) => {
                (ClientStatus::Running, Some(AllocHealth { healthy: true, timestamp: now, modify_index: 0 }))
            }
            (DesiredStatus::Stop, ClientStatus::Running | ClientStatus::Pending) => (ClientStatus::Complete, None),
            _ => continue,
        };
        by_node
            .entry(alloc.node_id)
            .or_default()
            .push(ClientAllocUpdate { health, ..ClientAllocUpdate::status(alloc, status) });
    }
    by_node
}
