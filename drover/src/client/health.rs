//! An allocation's health as its agent decides it (Nomad's health
//! tracker): what the deployments of service jobs will wait on, stored on
//! the allocation as `DeploymentStatus.Healthy`. A pure state machine: the
//! allocation runner feeds it its tasks' states, its checks' results and
//! the time, and sleeps until the wake-up it answers.
//!
//! 1. Only service jobs are judged, with their group's settings
//!    ([`engine::structs::HealthPolicy`]); `manual` leaves it to an operator.
//! 2. Unhealthy at once: a task failed, or one ended (a service's tasks
//!    run for good).
//! 3. Healthy once every task has run for `min_healthy_time` without a
//!    restart and, with `health_check = "checks"`, every check that counts
//!    (not `on_update = "ignore"`) of every service has been `success` for
//!    `min_healthy_time` too.
//! 4. Unhealthy when not healthy by `healthy_deadline` after the runner
//!    began watching, with Nomad's reason.
//! 5. The verdict is final.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use engine::structs::{
    Allocation, CheckMode, CheckResult, CheckResultStatus, HealthCheckMode, HealthPolicy, JobType, OnUpdate, TaskState,
    TaskStatus,
};

/// What the tracker makes of the allocation now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not decided: look again at this instant, or on the next change.
    Pending(Instant),
    /// Healthy.
    Healthy,
    /// Unhealthy, for this reason.
    Unhealthy(String),
}

/// The tracker of one allocation (module docs).
#[derive(Clone, Debug)]
pub struct HealthTracker {
    policy: HealthPolicy,
    /// How many checks count toward health.
    counted_checks: usize,
    deadline: Instant,
    /// Since when every task runs, and their restarts then.
    tasks_since: Option<(Instant, u64)>,
    /// Since when every check that counts passes.
    checks_since: Option<Instant>,
    decided: Option<bool>,
}

impl HealthTracker {
    /// A tracker of `alloc` starting at `now`; `None` when nothing is to
    /// be judged (module docs, 1).
    pub fn new(alloc: &Allocation, now: Instant) -> Option<HealthTracker> {
        let group = alloc.job.group(&alloc.task_group)?;
        // An allocation outside a deployment (a drain's replacement, say) is
        // judged by the group's `migrate` settings, as Nomad's.
        let policy = match alloc.deployment_id {
            Some(_) => &group.health,
            None => &group.migrate.health,
        };
        if alloc.job.job_type != JobType::Service || policy.mode == HealthCheckMode::Manual {
            return None;
        }
        let services = group.services.iter().chain(group.tasks.iter().flat_map(|task| task.services.iter()));
        let counted_checks = services
            .filter(|service| service.on_update != OnUpdate::Ignore)
            .flat_map(|service| service.checks.iter())
            .filter(|check| check.on_update != OnUpdate::Ignore)
            .count();
        Some(HealthTracker {
            policy: policy.clone(),
            counted_checks,
            deadline: now + policy.healthy_deadline,
            tasks_since: None,
            checks_since: None,
            decided: None,
        })
    }

    /// The verdict at `now`, with the tasks as `states` and the checks as
    /// `checks` say.
    pub fn observe(
        &mut self,
        now: Instant,
        states: &BTreeMap<String, TaskState>,
        checks: &BTreeMap<String, CheckResult>,
    ) -> Verdict {
        if let Some(healthy) = self.decided {
            return if healthy { Verdict::Healthy } else { Verdict::Unhealthy(String::new()) };
        }
        let verdict = self.judge(now, states, checks);
        match &verdict {
            Verdict::Healthy => self.decided = Some(true),
            Verdict::Unhealthy(_) => self.decided = Some(false),
            Verdict::Pending(_) => {}
        }
        verdict
    }

    fn judge(
        &mut self,
        now: Instant,
        states: &BTreeMap<String, TaskState>,
        checks: &BTreeMap<String, CheckResult>,
    ) -> Verdict {
        if states.values().any(|state| state.state == TaskStatus::Dead && state.failed) {
            return Verdict::Unhealthy("Unhealthy because of failed task".to_string());
        }
        if states.values().any(|state| state.state == TaskStatus::Dead) {
            return Verdict::Unhealthy("Unhealthy because of dead task".to_string());
        }
        let min = self.policy.min_healthy_time;
        let all_running = !states.is_empty() && states.values().all(|state| state.state == TaskStatus::Running);
        let restarts: u64 = states.values().map(|state| state.restarts).sum();
        self.tasks_since = match self.tasks_since {
            Some((since, seen)) if all_running && seen == restarts => Some((since, seen)),
            _ if all_running => Some((now, restarts)),
            _ => None,
        };
        let tasks_ready = self.tasks_since.map(|(since, _)| since + min);
        let checks_needed = self.policy.mode == HealthCheckMode::Checks && self.counted_checks > 0;
        let checks_ready = if checks_needed {
            let counted: Vec<&CheckResult> =
                checks.values().filter(|check| check.mode == CheckMode::Healthiness).collect();
            let passing = counted.len() >= self.counted_checks
                && counted.iter().all(|check| check.status == CheckResultStatus::Success);
            self.checks_since = if passing { Some(self.checks_since.unwrap_or(now)) } else { None };
            self.checks_since.map(|since| since + min)
        } else {
            tasks_ready
        };
        match (tasks_ready, checks_ready) {
            (Some(tasks), Some(checks)) if tasks <= now && checks <= now => return Verdict::Healthy,
            _ if now >= self.deadline => return Verdict::Unhealthy(self.late_reason(all_running, checks_ready, min)),
            _ => {}
        }
        let wake = [tasks_ready, checks_ready].into_iter().flatten().filter(|at| *at > now).min();
        Verdict::Pending(wake.map_or(self.deadline, |at| at.min(self.deadline)))
    }

    /// Why the allocation is unhealthy at its deadline (Nomad's words).
    fn late_reason(&self, all_running: bool, checks_ready: Option<Instant>, min: Duration) -> String {
        if !all_running {
            "Task not running by deadline".to_string()
        } else if checks_ready.is_none() {
            "Services not healthy by deadline".to_string()
        } else {
            format!("Task not running for min_healthy_time of {} by deadline", engine::structs::format_duration(min))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::structs::{CheckKind, EvalId, Job, NodeId, Resources, Service, ServiceCheck};
    use std::sync::Arc;

    /// An allocation of a deployment, judged by its `update` block's settings.
    fn alloc(with_check: bool) -> Allocation {
        let mut job = Job::new_simple("web", JobType::Service, 1, Resources::new(100, 64, 0));
        let group = &mut job.task_groups[0];
        group.health.min_healthy_time = Duration::from_secs(10);
        group.health.healthy_deadline = Duration::from_secs(60);
        if with_check {
            let mut service = Service::new("web", "http");
            service.checks.push(ServiceCheck::new(
                "alive",
                CheckKind::Tcp,
                Duration::from_secs(1),
                Duration::from_secs(1),
            ));
            group.tasks[0].services.push(service);
        }
        let job = Arc::new(job);
        let mut alloc = Allocation::new_placement(&job, "group", 0, NodeId::from_u128(1), EvalId::from_u128(1));
        alloc.deployment_id = Some(engine::structs::DeploymentId::from_u128(1));
        alloc
    }

    #[test]
    fn outside_a_deployment_the_migrate_block_decides() {
        let start = Instant::now();
        let at = |secs| start + Duration::from_secs(secs);
        let mut alloc = alloc(false);
        alloc.deployment_id = None;
        let mut job = Job::clone(&alloc.job);
        job.task_groups[0].migrate.health.min_healthy_time = Duration::from_secs(2);
        job.task_groups[0].health.mode = HealthCheckMode::Manual;
        alloc.job = Arc::new(job);
        let mut tracker = HealthTracker::new(&alloc, start).expect("a drain's replacement is judged");
        assert_eq!(tracker.observe(at(1), &tasks(TaskStatus::Running, 0), &BTreeMap::new()), Verdict::Pending(at(3)));
        assert_eq!(tracker.observe(at(3), &tasks(TaskStatus::Running, 0), &BTreeMap::new()), Verdict::Healthy);
    }

    fn tasks(status: TaskStatus, restarts: u64) -> BTreeMap<String, TaskState> {
        BTreeMap::from([("task".to_string(), TaskState { state: status, restarts, ..TaskState::default() })])
    }

    fn check(status: CheckResultStatus) -> BTreeMap<String, CheckResult> {
        let result = CheckResult {
            id: "c".into(),
            check: "alive".into(),
            group: "web.group".into(),
            task: "task".into(),
            service: "web".into(),
            mode: CheckMode::Healthiness,
            status,
            output: String::new(),
            status_code: 0,
            timestamp: engine::clock::Timestamp(0),
        };
        BTreeMap::from([("c".to_string(), result)])
    }

    #[test]
    fn tasks_and_checks_must_hold_for_the_min_healthy_time() {
        let start = Instant::now();
        let at = |secs| start + Duration::from_secs(secs);
        let mut tracker = HealthTracker::new(&alloc(true), start).expect("a service job is judged");
        let running = tasks(TaskStatus::Running, 0);
        assert_eq!(tracker.observe(at(1), &running, &check(CheckResultStatus::Pending)), Verdict::Pending(at(11)));
        assert_eq!(tracker.observe(at(3), &running, &check(CheckResultStatus::Success)), Verdict::Pending(at(11)));
        assert_eq!(tracker.observe(at(11), &running, &check(CheckResultStatus::Success)), Verdict::Pending(at(13)));
        // A failing check starts the checks' wait again.
        assert_eq!(tracker.observe(at(12), &running, &check(CheckResultStatus::Failure)), Verdict::Pending(at(60)));
        assert_eq!(tracker.observe(at(14), &running, &check(CheckResultStatus::Success)), Verdict::Pending(at(24)));
        assert_eq!(tracker.observe(at(24), &running, &check(CheckResultStatus::Success)), Verdict::Healthy);
        assert_eq!(tracker.observe(at(25), &tasks(TaskStatus::Dead, 0), &BTreeMap::new()), Verdict::Healthy, "final");
    }

    #[test]
    fn a_restart_starts_the_wait_again_and_the_deadline_decides() {
        let start = Instant::now();
        let at = |secs| start + Duration::from_secs(secs);
        let mut tracker = HealthTracker::new(&alloc(false), start).expect("judged");
        assert_eq!(tracker.observe(at(1), &tasks(TaskStatus::Running, 0), &BTreeMap::new()), Verdict::Pending(at(11)));
        assert_eq!(tracker.observe(at(5), &tasks(TaskStatus::Running, 1), &BTreeMap::new()), Verdict::Pending(at(15)));
        assert_eq!(tracker.observe(at(9), &tasks(TaskStatus::Pending, 2), &BTreeMap::new()), Verdict::Pending(at(60)));
        assert_eq!(
            tracker.observe(at(60), &tasks(TaskStatus::Pending, 2), &BTreeMap::new()),
            Verdict::Unhealthy("Task not running by deadline".into())
        );
    }

    #[test]
    fn a_failed_task_is_unhealthy_at_once_and_batch_jobs_are_not_judged() {
        let start = Instant::now();
        let mut tracker = HealthTracker::new(&alloc(false), start).expect("judged");
        let mut failed = tasks(TaskStatus::Dead, 0);
        failed.get_mut("task").expect("the task").failed = true;
        assert_eq!(
            tracker.observe(start, &failed, &BTreeMap::new()),
            Verdict::Unhealthy("Unhealthy because of failed task".into())
        );
        let mut batch = alloc(false);
        Arc::make_mut(&mut batch.job).job_type = JobType::Batch;
        assert!(HealthTracker::new(&batch, start).is_none());
    }
}
