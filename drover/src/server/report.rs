//! The cluster report an operator asks for ([`ClusterReport`]), made from
//! one snapshot.
//!
//! Load tests poll it every second, so what every report holds (the
//! progress) is one pass over the nodes, one over the allocations and one
//! over the evals; a node is looked up only for an allocation whose client
//! status is unknown. The audit ([`ReportScope::Full`]) reads every node's
//! allocations again (the invariants are checked on the allocations
//! themselves, not on the state's indexes) and re-encodes the largest plan:
//! it is made only when asked for, at the end of a run.

use std::collections::BTreeMap;
use std::sync::Arc;

use engine::clock::Timestamp;
use engine::scheduler::reconcile::stop_reason;
use engine::state::{Command, Snapshot};
use engine::structs::{Allocation, ClientStatus, DesiredStatus, EvalId, EvalStatus, Job, Node, NodeStatus};
use hdrhistogram::Histogram;
use transport::message::{ClusterAudit, ClusterReport, JobCounts, ReportScope};

/// What [`ClusterReport`] says about the state in `snapshot` at `now`, as
/// much as `scope` asks for (the engine's counters, idleness, memory and
/// the listener's counters are the caller's to add).
pub fn cluster_report(snapshot: &Snapshot, now: Timestamp, scope: ReportScope) -> ClusterReport {
    let mut report = ClusterReport { index: snapshot.index(), ..ClusterReport::default() };
    count_nodes(snapshot, &mut report);
    let per_job = count_allocs(snapshot, &mut report);
    report.jobs = snapshot.jobs().map(|job| job_counts(snapshot, job, &per_job)).collect();
    count_evals(snapshot, now, &mut report);
    if scope == ReportScope::Full {
        report.audit = Some(audit(snapshot));
    }
    report
}

/// Nodes by status.
fn count_nodes(snapshot: &Snapshot, report: &mut ClusterReport) {
    for node in snapshot.nodes() {
        match node.status {
            NodeStatus::Ready => report.nodes_ready += 1,
            NodeStatus::Initializing => report.nodes_initializing += 1,
            NodeStatus::Down => report.nodes_down += 1,
            NodeStatus::Disconnected => report.nodes_disconnected += 1,
        }
    }
}

/// Live and running allocations per job, by namespace and job id.
type PerJob<'a> = hashbrown::HashMap<(&'a str, &'a str), (u64, u64)>;

/// Counts every allocation ([`count_alloc`]) and each job's live and
/// running ones, in one pass.
fn count_allocs<'a>(snapshot: &'a Snapshot, report: &mut ClusterReport) -> PerJob<'a> {
    // Counted per job version first, by the address of the `Job` its
    // allocations share (reading the job's id for each would cost a cache
    // miss or two per allocation), then summed per job.
    let mut per_version: hashbrown::HashMap<*const Job, (&'a Allocation, u64, u64)> = hashbrown::HashMap::new();
    for alloc in snapshot.allocs() {
        count_alloc(snapshot, alloc, report);
        if alloc.terminal() {
            continue;
        }
        let (_, live, running) = per_version.entry(Arc::as_ptr(&alloc.job)).or_insert((alloc, 0, 0));
        *live += 1;
        *running += u64::from(alloc.client_status == ClientStatus::Running);
    }
    let mut per_job = PerJob::new();
    for (alloc, live, running) in per_version.into_values() {
        let counts = per_job.entry((&*alloc.namespace, &*alloc.job_id)).or_default();
        *counts = (counts.0 + live, counts.1 + running);
    }
    per_job
}

/// Counts `alloc` by client status; and if it stopped for a reconnect,
/// holds ports, or is live but unknown on a ready node.
fn count_alloc(snapshot: &Snapshot, alloc: &Allocation, report: &mut ClusterReport) {
    match alloc.client_status {
        ClientStatus::Pending => report.allocs_pending += 1,
        ClientStatus::Running => report.allocs_running += 1,
        ClientStatus::Unknown => report.allocs_unknown += 1,
        ClientStatus::Lost => report.allocs_lost += 1,
        ClientStatus::Complete => report.allocs_complete += 1,
        ClientStatus::Failed => report.allocs_failed += 1,
    }
    if alloc.desired_status == DesiredStatus::Stop && alloc.desired_description == stop_reason::ORIGINAL_RECONNECTED {
        report.replacements_stopped_for_reconnect += 1;
    }
    if alloc.terminal() {
        return;
    }
    if !alloc.ports.is_empty() {
        report.allocs_with_ports += 1;
        report.ports_held += alloc.ports.len() as u64;
    }
    // Its node is looked up only for the few allocations that need it.
    if alloc.client_status == ClientStatus::Unknown && node_is_ready(snapshot, alloc) {
        report.unknown_on_ready_nodes += 1;
    }
}

/// Whether `alloc`'s node is ready.
fn node_is_ready(snapshot: &Snapshot, alloc: &Allocation) -> bool {
    snapshot.node(alloc.node_id).is_some_and(|node| node.status == NodeStatus::Ready)
}

/// One job's line: the allocations it asks for (a system job: the
/// schedulable nodes that can run it), live and running.
fn job_counts(snapshot: &Snapshot, job: &Job, per_job: &PerJob<'_>) -> JobCounts {
    let desired = if job.job_type.is_system_like() {
        snapshot.nodes().filter(|node| node.is_schedulable() && runs_on(job, node)).count() as u64
    } else {
        job.task_groups.iter().map(|group| u64::from(group.count)).sum()
    };
    let (live, running) = per_job.get(&(&*job.namespace, &*job.id)).copied().unwrap_or_default();
    JobCounts { id: job.id.to_string(), job_type: job.job_type.as_str().to_string(), desired, live, running }
}

/// Whether a system job's datacenters and drivers admit `node` (the
/// report's count of where it should run; constraints are not evaluated).
fn runs_on(job: &Job, node: &Node) -> bool {
    let in_datacenter = job.datacenters.iter().any(|datacenter| **datacenter == *node.datacenter);
    let has_drivers = job.task_groups.iter().flat_map(|group| &group.tasks).all(|task| node.has_driver(&task.driver));
    in_datacenter && has_drivers
}

/// Canceled, pending and waiting evals.
fn count_evals(snapshot: &Snapshot, now: Timestamp, report: &mut ClusterReport) {
    for eval in snapshot.evals() {
        match eval.status {
            EvalStatus::Canceled => report.evals_canceled += 1,
            EvalStatus::Pending if eval.wait_until.is_some_and(|at| at > now) => report.evals_waiting += 1,
            EvalStatus::Pending => report.evals_pending += 1,
            _ => {}
        }
    }
}

/// The audit (module docs).
fn audit(snapshot: &Snapshot) -> ClusterAudit {
    let mut audit = ClusterAudit {
        nodes_oversubscribed: snapshot
            .oversubscribed_nodes()
            .into_iter()
            .map(|(node, used, allocatable)| format!("{node}: {used:?} of {allocatable:?}"))
            .collect(),
        port_collisions: snapshot.port_collisions().into_iter().map(|(node, port)| format!("{node}: {port}")).collect(),
        eval_latency_us: eval_latency(snapshot),
        originals_stopped_unreplaced: originals_stopped_unreplaced(snapshot),
        ..ClusterAudit::default()
    };
    record_largest_plan(snapshot, &mut audit);
    audit
}

/// Originals the servers stopped for their replacement (a node the storm
/// guard held, or a reconnect that kept the replacement) whose slot has no
/// running allocation: each would be an original stopped before its
/// replacement ran, as `job/name`.
fn originals_stopped_unreplaced(snapshot: &Snapshot) -> Vec<String> {
    let running: hashbrown::HashSet<(&str, &str, &str)> = snapshot
        .allocs()
        .filter(|alloc| !alloc.terminal() && alloc.client_status == ClientStatus::Running)
        .map(|alloc| (&*alloc.namespace, &*alloc.job_id, alloc.name.as_str()))
        .collect();
    let for_replacement = [stop_reason::HELD_REPLACED, stop_reason::REPLACEMENT_KEPT];
    snapshot
        .allocs()
        .filter(|alloc| alloc.desired_status == DesiredStatus::Stop)
        .filter(|alloc| for_replacement.contains(&alloc.desired_description.as_str()))
        .filter(|alloc| !running.contains(&(&*alloc.namespace, &*alloc.job_id, alloc.name.as_str())))
        .map(|alloc| format!("{}/{}", alloc.job_id, alloc.name))
        .collect()
}

/// Eval latency percentiles (creation to completion): p50, p90, p99, max.
fn eval_latency(snapshot: &Snapshot) -> [u64; 4] {
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds");
    for eval in snapshot.evals().filter(|eval| eval.status == EvalStatus::Complete) {
        histogram.saturating_record((eval.modify_time.since(eval.create_time).as_micros() as u64).max(1));
    }
    [
        histogram.value_at_quantile(0.50),
        histogram.value_at_quantile(0.90),
        histogram.value_at_quantile(0.99),
        histogram.max(),
    ]
}

/// Rebuilds the command of the eval that placed the most allocations (each
/// allocation keeps the eval that placed it; clients only report) and
/// measures its encoded size.
fn record_largest_plan(snapshot: &Snapshot, audit: &mut ClusterAudit) {
    let mut by_eval: BTreeMap<EvalId, usize> = BTreeMap::new();
    for alloc in snapshot.allocs() {
        *by_eval.entry(alloc.eval_id).or_default() += 1;
    }
    let Some((eval_id, _)) = by_eval.into_iter().max_by_key(|(_, count)| *count) else { return };
    let allocs: Vec<Allocation> =
        snapshot.allocs().filter(|alloc| alloc.eval_id == eval_id).map(|alloc| Allocation::clone(alloc)).collect();
    audit.largest_plan_allocs = allocs.len() as u64;
    let command = Command::ApplyPlanResults {
        eval_id,
        allocs,
        evals: Vec::new(),
        deployment: None,
        deployment_updates: Vec::new(),
        time: Timestamp(1),
    };
    audit.largest_plan_bytes = command.encode().len() as u64;
    audit.largest_plan_bytes_jobs_inline = command.encoded_len_jobs_inline() as u64;
}

/// CPU time (user and system) this process has used, in milliseconds, from
/// /proc (whose clock ticks are USER_HZ, 100 per second on Linux).
pub fn process_cpu_millis() -> u64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return 0 };
    // Fields after the command name (which may hold spaces, so split after
    // its closing parenthesis): utime and stime are the 12th and 13th.
    let Some((_, fields)) = stat.rsplit_once(')') else { return 0 };
    let mut fields = fields.split_whitespace().skip(11);
    let mut tick = || fields.next().and_then(|ticks| ticks.parse::<u64>().ok()).unwrap_or(0);
    (tick() + tick()) * 10
}

/// This process's resident memory now and at its peak, from /proc.
pub fn process_memory() -> (u64, u64) {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return (0, 0) };
    let field = |name: &str| {
        status
            .lines()
            .find(|line| line.starts_with(name))
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|kib| kib.parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[cfg(test)]
mod tests {
    use engine::state::{ClientAllocUpdate, StateStore};
    use engine::structs::{EvalId, JobType, NodeId, Resources};

    use super::*;

    fn node(n: u128) -> Node {
        Node::new_ready(NodeId::from_u128(n), "dc1", "c", Resources::new(4_000, 8_192, 0))
    }

    /// Places `count` allocations of `job` (as the store holds it) on `node`.
    fn place(store: &StateStore, job: &str, count: u32, node: NodeId, eval: u128) -> Vec<Allocation> {
        let job = store.snapshot().jobs().find(|stored| &*stored.id == job).expect("registered").clone();
        let allocs: Vec<_> =
            (0..count).map(|i| Allocation::new_placement(&job, "group", i, node, EvalId::from_u128(eval))).collect();
        let command = Command::ApplyPlanResults {
            deployment: None,
            deployment_updates: Vec::new(),
            eval_id: EvalId::from_u128(eval),
            allocs: allocs.clone(),
            evals: vec![],
            time: Timestamp(eval as u64),
        };
        store.apply(command).expect("placed");
        allocs
    }

    /// A job's allocations are summed over its versions; the progress is
    /// the full report without its audit.
    #[test]
    fn a_job_counts_the_allocations_of_every_version_and_progress_is_full_without_the_audit() {
        let store = StateStore::new();
        store.apply(Command::UpsertNode { node: node(1), evals: vec![] }).expect("node");
        let mut web = Job::new_simple("web", JobType::Service, 3, Resources::new(100, 64, 0));
        store.apply(Command::RegisterJob { job: web.clone(), eval: None }).expect("registered");
        let first = place(&store, "web", 2, NodeId::from_u128(1), 1);
        web.task_groups[0].count = 4;
        store.apply(Command::RegisterJob { job: web, eval: None }).expect("a new version");
        place(&store, "web", 1, NodeId::from_u128(1), 2);
        let running = ClientAllocUpdate {
            alloc_id: first[0].id,
            node_id: NodeId::from_u128(1),
            client_status: ClientStatus::Running,
            client_description: String::new(),
            services: None,
            checks: None,
            health: None,
            task_states: Default::default(),
        };
        store
            .apply(Command::UpdateAllocsFromClient { updates: vec![running], evals: vec![], time: Timestamp(3) })
            .expect("reported");

        let snapshot = store.snapshot();
        let versions: std::collections::HashSet<_> = snapshot.allocs().map(|alloc| Arc::as_ptr(&alloc.job)).collect();
        assert_eq!(versions.len(), 2, "the allocations share one job per version");
        let progress = cluster_report(&snapshot, Timestamp(4), ReportScope::Progress);
        let web = JobCounts { id: "web".into(), job_type: "service".into(), desired: 4, live: 3, running: 1 };
        assert_eq!(progress.jobs, [web]);
        assert_eq!((progress.allocs_pending, progress.allocs_running, progress.nodes_ready), (2, 1, 1));
        assert_eq!(progress.audit, None);

        let mut full = cluster_report(&snapshot, Timestamp(4), ReportScope::Full);
        let audit = full.audit.take().expect("a full report has its audit");
        assert_eq!(full, progress);
        assert!(audit.nodes_oversubscribed.is_empty() && audit.port_collisions.is_empty(), "{audit:?}");
        assert_eq!(audit.largest_plan_allocs, 2);
    }
}
