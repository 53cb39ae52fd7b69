//! The loadgen report: printed for people, written as JSON for tooling.

use std::collections::BTreeMap;
use std::time::Duration;

use engine::clock::Timestamp;
use engine::server::ServerStats;
use engine::state::{Command, Snapshot};
use engine::structs::{Allocation, EvalId, EvalStatus, Job};
use hdrhistogram::Histogram;
use serde::Serialize;

/// Eval latency percentiles in milliseconds.
#[derive(Debug, Default, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// Everything one run measured.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub nodes: usize,
    pub jobs: usize,
    pub workers: usize,
    pub node_register_per_sec: f64,
    pub allocs_desired: u64,
    pub allocs_placed: u64,
    pub placement_secs: f64,
    pub placements_per_sec: f64,
    pub eval_latency_ms: Latency,
    pub evals_processed: u64,
    pub evals_nacked: u64,
    pub evals_failed: u64,
    pub evals_canceled: u64,
    pub plans_submitted: u64,
    pub plans_partially_rejected: u64,
    pub plan_rejection_rate: f64,
    pub backoff_count: u64,
    pub backoff_ms_total: u64,
    pub blocked_evals: usize,
    pub heartbeats: u64,
    pub heartbeat_expirations: u64,
    pub alloc_update_batches: u64,
    pub alloc_updates: u64,
    pub largest_alloc_update_batch: u64,
    pub state_index: u64,
    /// The plan that placed the most allocations, as its command carries it
    /// in the log format, and as it would with every allocation's job inline.
    pub largest_plan_allocs: usize,
    pub largest_plan_bytes: usize,
    pub largest_plan_bytes_jobs_inline: usize,
    pub peak_rss_bytes: u64,
    pub invariant_violations: Vec<String>,
}

impl Report {
    /// Records the run's counters and the eval latencies (creation → completion).
    pub fn record(&mut self, snapshot: &Snapshot, stats: &ServerStats, placed_in: Duration) {
        self.allocs_placed = snapshot.allocs().filter(|alloc| !alloc.terminal()).count() as u64;
        self.placement_secs = placed_in.as_secs_f64();
        self.placements_per_sec = self.allocs_placed as f64 / placed_in.as_secs_f64().max(1e-9);
        self.evals_processed = stats.workers.evals_processed;
        self.evals_nacked = stats.workers.evals_nacked;
        self.evals_failed = stats.broker.total_delivery_limit_reached;
        self.evals_canceled = snapshot.evals().filter(|eval| eval.status == EvalStatus::Canceled).count() as u64;
        self.plans_submitted = stats.workers.plans_submitted;
        self.plans_partially_rejected = stats.plan_applier.plans_partially_refused;
        self.plan_rejection_rate = self.plans_partially_rejected as f64 / (self.plans_submitted.max(1)) as f64;
        self.backoff_count = stats.workers.backoff_count;
        self.backoff_ms_total = stats.workers.backoff_ms_total;
        self.blocked_evals = stats.blocked.total_blocked;
        self.heartbeats = stats.heartbeats.resets;
        self.heartbeat_expirations = stats.heartbeats.expirations;
        self.alloc_update_batches = stats.alloc_updates.batches;
        self.alloc_updates = stats.alloc_updates.updates;
        self.largest_alloc_update_batch = stats.alloc_updates.largest_batch;
        self.state_index = snapshot.index();
        self.record_largest_plan(snapshot);
        let mut histogram = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds");
        for eval in snapshot.evals().filter(|eval| eval.status == EvalStatus::Complete) {
            histogram.saturating_record((eval.modify_time.since(eval.create_time).as_micros() as u64).max(1));
        }
        let ms = |micros: u64| micros as f64 / 1000.0;
        self.eval_latency_ms = Latency {
            p50: ms(histogram.value_at_quantile(0.50)),
            p90: ms(histogram.value_at_quantile(0.90)),
            p99: ms(histogram.value_at_quantile(0.99)),
            max: ms(histogram.max()),
        };
    }

    /// Rebuilds the command of the eval that placed the most allocations
    /// (each allocation keeps the eval that placed it; clients only report)
    /// and measures its encoded size.
    fn record_largest_plan(&mut self, snapshot: &Snapshot) {
        let mut by_eval: BTreeMap<EvalId, usize> = BTreeMap::new();
        for alloc in snapshot.allocs() {
            *by_eval.entry(alloc.eval_id).or_default() += 1;
        }
        let Some((eval_id, _)) = by_eval.into_iter().max_by_key(|(_, count)| *count) else { return };
        let allocs: Vec<Allocation> =
            snapshot.allocs().filter(|alloc| alloc.eval_id == eval_id).map(|alloc| Allocation::clone(alloc)).collect();
        self.largest_plan_allocs = allocs.len();
        let command = Command::ApplyPlanResults { eval_id, allocs, evals: Vec::new(), time: Timestamp(1) };
        self.largest_plan_bytes = command.encode().len();
        self.largest_plan_bytes_jobs_inline = command.encoded_len_jobs_inline();
    }

    /// Checks the end state: no node oversubscribed, every job at its
    /// desired count, every eval finished.
    pub fn check_invariants(&mut self, snapshot: &Snapshot, jobs: &[Job], n_nodes: usize) {
        for (node, used, allocatable) in snapshot.oversubscribed_nodes() {
            self.invariant_violations.push(format!("node {node} oversubscribed: {used:?} of {allocatable:?}"));
        }
        for job in jobs {
            let desired = if job.job_type.is_system_like() { n_nodes } else { job.task_groups[0].count as usize };
            let running = snapshot.allocs_by_job(&job.key()).filter(|alloc| !alloc.terminal()).count();
            if running != desired {
                self.invariant_violations
                    .push(format!("job {} has {running} live allocations, wants {desired}", job.id));
            }
        }
        let open = snapshot.evals().filter(|eval| matches!(eval.status, EvalStatus::Pending)).count();
        if open > 0 {
            self.invariant_violations.push(format!("{open} evals still pending"));
        }
    }

    /// Prints the report for people.
    pub fn print(&self) {
        println!("loadgen report (in-process server)");
        println!("  nodes / jobs / workers     {} / {} / {}", self.nodes, self.jobs, self.workers);
        println!("  node registrations/s       {:.0}", self.node_register_per_sec);
        println!("  allocations placed         {} of {}", self.allocs_placed, self.allocs_desired);
        println!("  placement time             {:.2} s", self.placement_secs);
        println!("  placements/s               {:.0}", self.placements_per_sec);
        let l = &self.eval_latency_ms;
        println!("  eval latency ms            p50 {:.1}  p90 {:.1}  p99 {:.1}  max {:.1}", l.p50, l.p90, l.p99, l.max);
        println!("  evals processed            {}", self.evals_processed);
        println!("  evals nacked / failed      {} / {}", self.evals_nacked, self.evals_failed);
        println!("  evals canceled             {}", self.evals_canceled);
        println!("  plans submitted            {}", self.plans_submitted);
        println!(
            "  plans partially rejected   {} ({:.2}%)",
            self.plans_partially_rejected,
            self.plan_rejection_rate * 100.0
        );
        println!("  worker backoffs            {} ({} ms)", self.backoff_count, self.backoff_ms_total);
        println!("  blocked evals              {}", self.blocked_evals);
        println!("  heartbeats / missed        {} / {}", self.heartbeats, self.heartbeat_expirations);
        println!(
            "  client alloc updates       {} in {} batches (largest {})",
            self.alloc_updates, self.alloc_update_batches, self.largest_alloc_update_batch
        );
        println!("  state index                {}", self.state_index);
        println!(
            "  largest plan               {} allocations, {} bytes encoded ({} with jobs inline)",
            self.largest_plan_allocs, self.largest_plan_bytes, self.largest_plan_bytes_jobs_inline
        );
        println!("  peak RSS                   {:.1} MiB", self.peak_rss_bytes as f64 / (1024.0 * 1024.0));
        if self.invariant_violations.is_empty() {
            println!("  invariants                 all held");
        } else {
            for violation in &self.invariant_violations {
                println!("  INVARIANT VIOLATED         {violation}");
            }
        }
    }
}

/// The process's peak resident set size (VmHWM), 0 where /proc is missing.
pub fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}
