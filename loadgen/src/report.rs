//! The loadgen report: printed for people, written as JSON for tooling.

use std::time::Duration;

use engine::broker::BrokerStats;
use engine::state::Snapshot;
use engine::structs::EvalStatus;
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
    pub job_register_per_sec: f64,
    pub evals_created: usize,
    pub evals_processed: u64,
    pub evals_canceled: usize,
    pub evals_nacked: u64,
    pub evals_failed: u64,
    pub evals_per_sec: f64,
    pub eval_latency_ms: Latency,
    pub state_index: u64,
    pub peak_rss_bytes: u64,
    pub invariant_violations: Vec<String>,
}

impl Report {
    /// Records the eval phase: counts, rate and latency (creation → ack).
    pub fn record_evals(&mut self, stats: &BrokerStats, acked: u64, elapsed: Duration, latency: &Histogram<u64>) {
        self.evals_processed = acked;
        self.evals_nacked = stats.total_nack_timeouts;
        self.evals_failed = stats.total_delivery_limit_reached;
        self.evals_per_sec = acked as f64 / elapsed.as_secs_f64().max(1e-9);
        let ms = |micros: u64| micros as f64 / 1000.0;
        self.eval_latency_ms = Latency {
            p50: ms(latency.value_at_quantile(0.50)),
            p90: ms(latency.value_at_quantile(0.90)),
            p99: ms(latency.value_at_quantile(0.99)),
            max: ms(latency.max()),
        };
    }

    /// Checks the end state: every eval ended exactly once, the broker is empty.
    pub fn check_invariants(&mut self, snapshot: &Snapshot, stats: &BrokerStats) {
        self.state_index = snapshot.index();
        if snapshot.node_count() != self.nodes {
            self.invariant_violations.push(format!(
                "{} nodes stored, {} registered",
                snapshot.node_count(),
                self.nodes
            ));
        }
        let open: Vec<_> = snapshot.evals().filter(|eval| !eval.status.is_terminal()).map(|eval| eval.id).collect();
        if !open.is_empty() {
            self.invariant_violations.push(format!("{} evals are not terminal, e.g. {}", open.len(), open[0]));
        }
        let complete = snapshot.evals().filter(|eval| eval.status == EvalStatus::Complete).count() as u64;
        if complete != self.evals_processed {
            self.invariant_violations.push(format!("{complete} evals complete but {} acked", self.evals_processed));
        }
        if complete as usize + self.evals_canceled != self.evals_created {
            self.invariant_violations.push(format!(
                "{} complete + {} canceled != {} created",
                complete, self.evals_canceled, self.evals_created
            ));
        }
        let left = stats.total_ready + stats.total_unacked + stats.total_pending + stats.total_cancelable;
        if left != 0 {
            self.invariant_violations.push(format!("the broker still holds {left} evals: {stats:?}"));
        }
    }

    /// Prints the report for people.
    pub fn print(&self) {
        println!("loadgen report (in-process: state store, eval broker, reaper; no scheduler yet)");
        println!("  nodes                  {}", self.nodes);
        println!("  node registrations/s   {:.0}", self.node_register_per_sec);
        println!("  jobs                   {}", self.jobs);
        println!("  job registrations/s    {:.0}", self.job_register_per_sec);
        println!("  workers                {}", self.workers);
        println!("  evals created          {}", self.evals_created);
        println!("  evals processed        {} (acked, written complete)", self.evals_processed);
        println!("  evals canceled         {} (superseded, written by the reaper)", self.evals_canceled);
        println!("  evals nacked / failed  {} / {}", self.evals_nacked, self.evals_failed);
        println!("  evals/s                {:.0}", self.evals_per_sec);
        let latency = &self.eval_latency_ms;
        println!(
            "  eval latency ms        p50 {:.2}  p90 {:.2}  p99 {:.2}  max {:.2}",
            latency.p50, latency.p90, latency.p99, latency.max
        );
        println!("  state index            {}", self.state_index);
        println!("  peak RSS               {:.1} MiB", self.peak_rss_bytes as f64 / (1024.0 * 1024.0));
        if self.invariant_violations.is_empty() {
            println!("  invariants             all held");
        } else {
            for violation in &self.invariant_violations {
                println!("  INVARIANT VIOLATED     {violation}");
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
