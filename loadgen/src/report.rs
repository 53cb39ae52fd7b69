//! The loadgen report: printed for people, written as JSON for tooling.

use std::time::Duration;

use drover::server::timers::TimerReading;
use engine::node::storm::StormStats;
use hdrhistogram::Histogram;
use serde::Serialize;
use transport::message::ClusterReport;

/// Eval latency percentiles in milliseconds.
#[derive(Debug, Default, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// Percentiles in milliseconds of a histogram of microseconds.
#[derive(Debug, Default, Serialize)]
pub struct Millis {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Millis {
    pub fn of(histogram: &Histogram<u64>) -> Millis {
        let ms = |micros: u64| micros as f64 / 1000.0;
        Millis {
            p50: ms(histogram.value_at_quantile(0.50)),
            p99: ms(histogram.value_at_quantile(0.99)),
            max: ms(histogram.max()),
        }
    }
}

/// What only a run over the network measures (zero in process).
#[derive(Debug, Default, Serialize)]
pub struct NetworkReport {
    /// Each job's registration round trip while placing (each of the
    /// `--operators` submits its share one after another), and the CPU both
    /// processes used from the first registration until every allocation ran.
    pub job_submit_ms: Millis,
    pub placing_server_cpu_secs: f64,
    pub placing_loadgen_cpu_secs: f64,
    /// Length of the flapping phase.
    pub duration_secs: f64,
    /// Heartbeats answered per second during it.
    pub heartbeats_per_sec: f64,
    /// CPU time the server and this process used during the run (two
    /// cores are shared by both), and the heartbeats answered per second
    /// of the server's CPU: what one dedicated core would carry.
    pub server_cpu_secs: f64,
    pub loadgen_cpu_secs: f64,
    pub heartbeats_per_server_cpu_sec: f64,
    /// Heartbeat round trips during the run; handshakes over the whole
    /// run, start-up included.
    pub heartbeat_rtt_ms: Millis,
    pub handshake_ms: Millis,
    /// Connections re-established (flaps, storms, lost calls).
    pub reconnects: u64,
    /// The most connections made in one second of the run.
    pub reconnects_peak_per_sec: u32,
    /// Heartbeats sent again on their connection after no answer in time.
    pub heartbeat_retries: u64,
    /// Full alloc resyncs the clients sent after being marked away.
    pub resyncs: u64,
    /// Clients dropped on purpose at least once.
    pub flaps: u64,
    /// Clients dropped by the storm.
    pub storm_nodes: u64,
    /// From the storm's return until every node was ready and every job
    /// running at its count.
    pub convergence_after_storm_ms: Option<f64>,
    /// Clients never dropped on purpose that the servers marked away.
    pub wrongly_marked_down: u64,
    /// What the storm guard did (the last leader's).
    pub storm_guard: StormStats,
    /// Allocations clients saw marked unknown.
    pub allocs_unknown: u64,
    /// Allocations marked lost (the end state).
    pub allocs_lost: u64,
    /// Unknown allocations that ran again after their client returned.
    pub allocs_reconnected: u64,
    /// Replacements placed for an unknown allocation and stopped when the
    /// original reconnected.
    pub replacements_placed_then_stopped: u64,
    /// Client connections the server accepted, and open at the end.
    pub connections_accepted: u64,
    pub connections_open: u64,
    pub handshakes_refused: u64,
    /// The server process's resident memory at the end, and its peak.
    pub server_rss_bytes: u64,
    pub server_peak_rss_bytes: u64,
    /// Servers in the cluster.
    pub servers: usize,
    /// Leaders killed (`--kill-leader-every`) and replaced.
    pub leader_elections: u64,
    /// From a leader's SIGKILL until a new leader answered with its leader
    /// services restored.
    pub failover_ms: Option<Failover>,
    /// Calls refused during an election (no leader) or cut off by a killed
    /// server, and made again: the clients' and the operator's.
    pub writes_retried: u64,
}

/// Failover times (milliseconds).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Failover {
    pub p50: f64,
    pub max: f64,
}

/// Everything one run measured.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// `in-process` or `quic`.
    pub mode: String,
    /// Whether the server kept its state on disk (`--data-dir`).
    pub durable: bool,
    pub nodes: usize,
    pub jobs: usize,
    pub workers: usize,
    pub node_register_per_sec: f64,
    pub allocs_desired: u64,
    pub allocs_placed: u64,
    pub placement_secs: f64,
    pub placements_per_sec: f64,
    pub eval_latency_ms: Latency,
    /// In process: the workers' time in their schedulers, and the part of
    /// it spent waiting for their plans to be committed (engine timers).
    pub worker_scheduling_secs: f64,
    pub worker_plan_wait_secs: f64,
    /// In process: a plan's commit, submitted to written (`drover.plan.apply`).
    pub plan_commit_ms: Latency,
    pub evals_processed: u64,
    pub evals_nacked: u64,
    pub evals_failed: u64,
    pub evals_canceled: u64,
    /// Follow-up evals waiting for a later time when the report was taken.
    pub evals_waiting: u64,
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
    /// Live allocations holding ports, and the ports they hold.
    pub allocs_with_ports: u64,
    pub ports_held: u64,
    /// Allocations evicted by preemption.
    pub allocs_preempted: u64,
    pub peak_rss_bytes: u64,
    pub network: NetworkReport,
    pub invariant_violations: Vec<String>,
}

impl Report {
    /// Records the run's counters and eval latencies from the (full)
    /// cluster report taken once every allocation was placed.
    pub fn record(&mut self, cluster: &ClusterReport, placed_in: Duration) {
        let audit = cluster.audit.clone().unwrap_or_default();
        let stats = &cluster.engine;
        self.allocs_placed = cluster.jobs.iter().map(|job| job.live).sum();
        self.placement_secs = placed_in.as_secs_f64();
        self.placements_per_sec = self.allocs_placed as f64 / placed_in.as_secs_f64().max(1e-9);
        self.evals_processed = stats.workers.evals_processed;
        self.evals_nacked = stats.workers.evals_nacked;
        self.evals_failed = stats.broker.total_delivery_limit_reached;
        self.evals_canceled = cluster.evals_canceled;
        self.evals_waiting = cluster.evals_waiting;
        // The applier's count: it sees every server's workers' plans.
        self.plans_submitted = stats.plan_applier.plans_evaluated;
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
        self.state_index = cluster.index;
        self.largest_plan_allocs = audit.largest_plan_allocs as usize;
        self.largest_plan_bytes = audit.largest_plan_bytes as usize;
        self.largest_plan_bytes_jobs_inline = audit.largest_plan_bytes_jobs_inline as usize;
        self.allocs_with_ports = cluster.allocs_with_ports;
        self.ports_held = cluster.ports_held;
        self.allocs_preempted = stats.plan_applier.allocs_preempted;
        let [p50, p90, p99, max] = audit.eval_latency_us.map(|micros| micros as f64 / 1000.0);
        self.eval_latency_ms = Latency { p50, p90, p99, max };
    }

    /// Records what the end of a network run says: the server's counters
    /// after the run (plans, nacks, backoff, heartbeats), its memory, and
    /// the allocations lost and replacements stopped.
    pub fn record_end(&mut self, cluster: &ClusterReport) {
        let placed = self.placement_secs;
        let (allocs_placed, placements_per_sec, latency) =
            (self.allocs_placed, self.placements_per_sec, std::mem::take(&mut self.eval_latency_ms));
        self.record(cluster, Duration::from_secs_f64(placed));
        (self.allocs_placed, self.placements_per_sec, self.eval_latency_ms) =
            (allocs_placed, placements_per_sec, latency);
        let net = &mut self.network;
        net.allocs_lost = cluster.allocs_lost;
        net.replacements_placed_then_stopped = cluster.replacements_stopped_for_reconnect;
        net.connections_accepted = cluster.listener.connections_accepted;
        net.connections_open = cluster.listener.connections_open;
        net.handshakes_refused = cluster.listener.handshakes_refused;
        net.server_rss_bytes = cluster.rss_bytes;
        net.server_peak_rss_bytes = cluster.peak_rss_bytes;
        net.storm_guard = cluster.engine.storm_guard.clone();
    }

    /// Checks the end state: no node oversubscribed, no port used twice on
    /// a node, every job at its desired count, every eval finished, no
    /// allocation left unknown on a node that is back, every node ready.
    pub fn check_invariants(&mut self, cluster: &ClusterReport) {
        let Some(audit) = &cluster.audit else {
            self.invariant_violations.push("the server's report has no audit to check (not a full report)".into());
            return;
        };
        for node in &audit.nodes_oversubscribed {
            self.invariant_violations.push(format!("node oversubscribed: {node}"));
        }
        for collision in &audit.port_collisions {
            self.invariant_violations.push(format!("port used twice on a node (or reserved): {collision}"));
        }
        for alloc in &audit.originals_stopped_unreplaced {
            self.invariant_violations.push(format!("original stopped with no replacement running: {alloc}"));
        }
        for job in &cluster.jobs {
            if job.live != job.desired {
                self.invariant_violations
                    .push(format!("job {} has {} live allocations, wants {}", job.id, job.live, job.desired));
            }
        }
        if cluster.evals_pending > 0 {
            self.invariant_violations.push(format!("{} evals still pending", cluster.evals_pending));
        }
        if cluster.unknown_on_ready_nodes > 0 {
            self.invariant_violations
                .push(format!("{} allocations unknown on nodes that are back", cluster.unknown_on_ready_nodes));
        }
        let not_ready = cluster.nodes_initializing + cluster.nodes_down + cluster.nodes_disconnected;
        if not_ready > 0 {
            self.invariant_violations.push(format!("{not_ready} nodes not ready at the end"));
        }
        if self.network.wrongly_marked_down > 0 {
            self.invariant_violations.push(format!(
                "{} clients that never dropped were marked away by the servers",
                self.network.wrongly_marked_down
            ));
        }
    }

    /// Records the engine's timers (in process, where they were recorded).
    pub fn record_timers(&mut self, timers: &[TimerReading]) {
        let sum = |name: &str| timers.iter().filter(|timer| timer.name == name).map(|timer| timer.sum).sum::<f64>();
        self.worker_scheduling_secs = sum("drover.worker.invoke_scheduler") / 1_000.0;
        self.worker_plan_wait_secs = sum("drover.worker.submit_plan") / 1_000.0;
        if let Some(commit) = timers.iter().find(|timer| timer.name == "drover.plan.apply") {
            self.plan_commit_ms = Latency { p50: commit.p50, p90: commit.p90, p99: commit.p99, max: commit.max };
        }
    }

    /// Prints the report for people.
    pub fn print(&self) {
        let state = if self.durable { "durable state" } else { "state in memory" };
        println!("loadgen report ({} server, {state})", self.mode);
        println!("  nodes / jobs / workers     {} / {} / {}", self.nodes, self.jobs, self.workers);
        println!("  node registrations/s       {:.0}", self.node_register_per_sec);
        println!("  allocations placed         {} of {}", self.allocs_placed, self.allocs_desired);
        println!("  placement time             {:.2} s", self.placement_secs);
        println!("  placements/s               {:.0}", self.placements_per_sec);
        let l = &self.eval_latency_ms;
        println!("  eval latency ms            p50 {:.1}  p90 {:.1}  p99 {:.1}  max {:.1}", l.p50, l.p90, l.p99, l.max);
        if self.mode == "in-process" {
            println!(
                "  worker time                {:.2} s scheduling, {:.2} s of it waiting for plans",
                self.worker_scheduling_secs, self.worker_plan_wait_secs
            );
            let c = &self.plan_commit_ms;
            println!(
                "  plan commit ms             p50 {:.2}  p90 {:.2}  p99 {:.2}  max {:.2}",
                c.p50, c.p90, c.p99, c.max
            );
        }
        println!("  evals processed            {}", self.evals_processed);
        println!("  evals nacked / failed      {} / {}", self.evals_nacked, self.evals_failed);
        println!("  evals canceled / waiting   {} / {}", self.evals_canceled, self.evals_waiting);
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
        println!("  allocations with ports     {} ({} ports)", self.allocs_with_ports, self.ports_held);
        println!("  allocations preempted      {}", self.allocs_preempted);
        println!("  peak RSS                   {:.1} MiB", mib(self.peak_rss_bytes));
        if self.mode == "quic" {
            let n = &self.network;
            let j = &n.job_submit_ms;
            println!("  job registration ms        p50 {:.2}  p99 {:.2}  max {:.2}", j.p50, j.p99, j.max);
            println!(
                "  CPU while placing          server {:.1} s, loadgen {:.1} s",
                n.placing_server_cpu_secs, n.placing_loadgen_cpu_secs
            );
            println!("  run (flapping) time        {:.1} s", n.duration_secs);
            println!("  heartbeats/s               {:.0}", n.heartbeats_per_sec);
            println!(
                "  CPU during the run         server {:.1} s, loadgen {:.1} s ({:.0} heartbeats per server CPU second)",
                n.server_cpu_secs, n.loadgen_cpu_secs, n.heartbeats_per_server_cpu_sec
            );
            let (h, s) = (&n.heartbeat_rtt_ms, &n.handshake_ms);
            println!("  heartbeat RTT ms           p50 {:.2}  p99 {:.2}  max {:.2}", h.p50, h.p99, h.max);
            println!("  handshake ms               p50 {:.2}  p99 {:.2}  max {:.2}", s.p50, s.p99, s.max);
            println!("  flapped clients / storm    {} / {}", n.flaps, n.storm_nodes);
            println!(
                "  reconnects / resyncs       {} / {} (at most {} in one second)",
                n.reconnects, n.resyncs, n.reconnects_peak_per_sec
            );
            println!("  heartbeats retried         {}", n.heartbeat_retries);
            match n.convergence_after_storm_ms {
                Some(ms) => println!("  convergence after storm    {ms:.0} ms"),
                None if n.storm_nodes > 0 => println!("  convergence after storm    NOT REACHED"),
                None => {}
            }
            println!("  wrongly marked away        {}", n.wrongly_marked_down);
            let g = &n.storm_guard;
            if g.activations > 0 {
                println!(
                    "  storm guard                on {} time(s), held {:.1} s, {} nodes held, \
                     replacements released one node per {:.0} ms{}",
                    g.activations,
                    g.held_millis as f64 / 1000.0,
                    g.nodes_held,
                    g.release_interval_micros as f64 / 1000.0,
                    if g.on { " (still on)" } else { "" }
                );
                println!("  storm guard's reason       {}", g.reason);
            }
            if n.servers > 1 {
                println!("  servers                    {}", n.servers);
                println!("  (engine counters, server CPU and RSS are the last leader's, since it took over)");
                println!("  leader elections (kills)   {}", n.leader_elections);
                if let Some(failover) = n.failover_ms {
                    println!("  failover ms                p50 {:.0}  max {:.0}", failover.p50, failover.max);
                }
                println!("  writes retried             {}", n.writes_retried);
            }
            println!(
                "  allocs unknown / lost / reconnected   {} / {} / {}",
                n.allocs_unknown, n.allocs_lost, n.allocs_reconnected
            );
            println!("  replacements placed then stopped      {}", n.replacements_placed_then_stopped);
            println!(
                "  connections accepted / open / refused {} / {} / {}",
                n.connections_accepted, n.connections_open, n.handshakes_refused
            );
            println!(
                "  server RSS                 {:.1} MiB (peak {:.1} MiB)",
                mib(n.server_rss_bytes),
                mib(n.server_peak_rss_bytes)
            );
        }
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

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
