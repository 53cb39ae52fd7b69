//! Jobs, task groups and tasks: what users submit.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;

use super::dispatch::{DispatchPayloadConfig, ParameterizedJobConfig};
#[cfg(doc)]
use super::docker_config::DockerConfig;
use super::docker_config::{docker_port_problems, DOCKER};
use super::duration::{serde_duration, serde_opt_duration};
use super::periodic::PeriodicConfig;
use super::service::group_service_problems;
use super::task_config::{task_settings_problems, ConfigValue, LogConfig, DEFAULT_KILL_SIGNAL};
#[cfg(doc)]
use super::task_config::{RawExecConfig, KILL_SIGNALS};
use super::template::task_template_problems;
use super::{
    spread, Affinity, Constraint, HealthPolicy, JobKey, NetworkResource, Resources, Service, Spread, Template,
};

/// The namespace a job lands in when it names none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// The most allocations one task group may ask for.
pub const MAX_GROUP_COUNT: u32 = 1_000_000;

/// Which scheduler handles a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobType {
    /// Long-running services, rescheduled when they fail.
    Service,
    /// Run-to-completion work.
    Batch,
    /// One allocation on every feasible node, kept there.
    System,
    /// One run to completion on every feasible node.
    Sysbatch,
}

impl JobType {
    /// All job types, in the order the broker keeps its ready queues.
    pub const ALL: [JobType; 4] = [JobType::Service, JobType::Batch, JobType::System, JobType::Sysbatch];

    /// Position in [`JobType::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Lower-case name, as in job specs.
    pub fn as_str(self) -> &'static str {
        match self {
            JobType::Service => "service",
            JobType::Batch => "batch",
            JobType::System => "system",
            JobType::Sysbatch => "sysbatch",
        }
    }

    /// Whether allocations run to completion rather than forever.
    pub fn is_batch_like(self) -> bool {
        matches!(self, JobType::Batch | JobType::Sysbatch)
    }

    /// Whether the job places one allocation per node rather than a count.
    pub fn is_system_like(self) -> bool {
        matches!(self, JobType::System | JobType::Sysbatch)
    }
}

impl fmt::Display for JobType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the delay between reschedule attempts grows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DelayFunction {
    /// The same delay every time.
    Constant,
    /// Doubling delays.
    Exponential,
    /// Delays following the Fibonacci sequence.
    Fibonacci,
}

/// When and how failed allocations are replaced on another node.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReschedulePolicy {
    /// Attempts allowed within `interval` (ignored when `unlimited`).
    pub attempts: u32,
    /// The window in which `attempts` are counted.
    #[serde(with = "serde_duration")]
    pub interval: Duration,
    /// The first delay before a reschedule.
    #[serde(with = "serde_duration")]
    pub delay: Duration,
    /// How the delay grows.
    pub delay_function: DelayFunction,
    /// The longest delay.
    #[serde(with = "serde_duration")]
    pub max_delay: Duration,
    /// Reschedule forever.
    pub unlimited: bool,
}

impl ReschedulePolicy {
    /// Nomad's defaults: services retry forever with exponential backoff;
    /// batch jobs get one more attempt a day. System jobs are not rescheduled.
    pub fn default_for(job_type: JobType) -> Option<ReschedulePolicy> {
        match job_type {
            JobType::Service => Some(ReschedulePolicy {
                attempts: 0,
                interval: Duration::ZERO,
                delay: Duration::from_secs(30),
                delay_function: DelayFunction::Exponential,
                max_delay: Duration::from_secs(3600),
                unlimited: true,
            }),
            JobType::Batch => Some(ReschedulePolicy {
                attempts: 1,
                interval: Duration::from_secs(24 * 3600),
                delay: Duration::from_secs(5),
                delay_function: DelayFunction::Constant,
                max_delay: Duration::ZERO,
                unlimited: false,
            }),
            JobType::System | JobType::Sysbatch => None,
        }
    }

    fn problems(&self, place: &str, problems: &mut Vec<String>) {
        if !self.unlimited && self.attempts > 0 && self.interval.is_zero() {
            problems.push(format!("{place}: reschedule interval must be set when attempts are limited"));
        }
        if self.delay_function != DelayFunction::Constant && self.max_delay < self.delay {
            problems.push(format!(
                "{place}: reschedule max_delay ({:?}) is shorter than delay ({:?})",
                self.max_delay, self.delay
            ));
        }
    }
}

/// What a client does when a task exits on its own node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RestartMode {
    /// Wait out the interval, then restart again.
    Delay,
    /// Give up and mark the allocation failed.
    Fail,
}

/// Restarts in place, on the client, before an allocation is failed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RestartPolicy {
    /// Restarts allowed within `interval`.
    pub attempts: u32,
    /// The window restarts are counted in.
    #[serde(with = "serde_duration")]
    pub interval: Duration,
    /// Delay before each restart.
    #[serde(with = "serde_duration")]
    pub delay: Duration,
    /// What happens when attempts run out.
    pub mode: RestartMode,
}

impl RestartPolicy {
    /// Nomad's rule: the attempts, each after `delay`, must fit in `interval`.
    fn problems(&self, place: &str, problems: &mut Vec<String>) {
        if self.attempts > 0 && self.interval.is_zero() {
            problems.push(format!("{place}: restart interval must be set when attempts are allowed"));
        } else if self.delay.saturating_mul(self.attempts) > self.interval {
            problems.push(format!(
                "{place}: restart interval ({:?}) is shorter than {} attempts of delay {:?}",
                self.interval, self.attempts, self.delay
            ));
        }
    }
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            attempts: 2,
            interval: Duration::from_secs(30 * 60),
            delay: Duration::from_secs(15),
            mode: RestartMode::Fail,
        }
    }
}

/// A service group's `migrate` block (Nomad's `MigrateStrategy`, merged
/// from the job's and the group's; Nomad's defaults without one): how its
/// allocations leave a draining node. At most `max_parallel` of the group's
/// allocations are unavailable because of migrations (the disruption budget
/// the plan applier holds), and a replacement counts as available once its
/// client judges it healthy by `health`. Batch and system groups have no
/// such block: their allocations stay until the drain's deadline, system
/// ones until the rest have left.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MigrateStrategy {
    /// How many allocations may migrate at once.
    pub max_parallel: u32,
    /// How a replacement's health is judged.
    pub health: HealthPolicy,
}

impl Default for MigrateStrategy {
    /// Nomad's: one at a time, healthy by its checks for 10 s within 5 min.
    fn default() -> MigrateStrategy {
        MigrateStrategy { max_parallel: 1, health: HealthPolicy::default() }
    }
}

/// A group's `update` block (Nomad's `UpdateStrategy`, merged from the
/// job's and the group's): how a new version rolls out. A group with one
/// gets deployments; its health settings are on [`TaskGroup::health`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct UpdateStrategy {
    /// How many allocations of a group may be replaced at once (at least
    /// 1): the group's disruption budget.
    pub max_parallel: u32,
    /// How many canaries a new version places before the old allocations
    /// are touched; they wait for promotion.
    pub canary: u32,
    /// Revert to the latest stable version when a deployment fails.
    pub auto_revert: bool,
    /// Promote the canaries once all are healthy.
    pub auto_promote: bool,
    /// How long a deployment may go without a newly healthy allocation;
    /// zero: the first unhealthy allocation fails it.
    #[serde(with = "super::duration::serde_duration")]
    pub progress_deadline: Duration,
    /// A system job's pause between batches.
    #[serde(with = "super::duration::serde_duration")]
    pub stagger: Duration,
}

impl UpdateStrategy {
    /// Nomad's default progress deadline.
    pub const DEFAULT_PROGRESS_DEADLINE: Duration = Duration::from_secs(10 * 60);
    /// Nomad's default stagger.
    pub const DEFAULT_STAGGER: Duration = Duration::from_secs(30);

    /// `max_parallel` at a time, everything else Nomad's defaults.
    pub fn rolling(max_parallel: u32) -> UpdateStrategy {
        UpdateStrategy { max_parallel, ..UpdateStrategy::default() }
    }

    fn problems(&self, group: &TaskGroup, place: &str, problems: &mut Vec<String>) {
        if self.max_parallel == 0 {
            problems.push(format!("{place}: update max_parallel must be at least 1"));
        }
        if self.auto_promote && self.canary == 0 {
            problems.push(format!("{place}: update auto_promote needs canary > 0"));
        }
        if !self.progress_deadline.is_zero() && group.health.healthy_deadline >= self.progress_deadline {
            problems.push(format!(
                "{place}: update healthy_deadline ({}) must be less than progress_deadline ({})",
                super::format_duration(group.health.healthy_deadline),
                super::format_duration(self.progress_deadline)
            ));
        }
    }
}

impl Default for UpdateStrategy {
    /// Nomad's `DefaultUpdateStrategy`: one at a time, no canaries, 10m
    /// progress deadline, 30s stagger.
    fn default() -> UpdateStrategy {
        UpdateStrategy {
            max_parallel: 1,
            canary: 0,
            auto_revert: false,
            auto_promote: false,
            progress_deadline: UpdateStrategy::DEFAULT_PROGRESS_DEADLINE,
            stagger: UpdateStrategy::DEFAULT_STAGGER,
        }
    }
}

/// One process a client runs.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Task {
    /// Name, unique within its group.
    pub name: String,
    /// Task driver (`exec`, `docker`, ...); the node must have it.
    pub driver: String,
    /// What the task needs; `resources.memory_mb` is the memory it
    /// reserves (what the scheduler counts).
    pub resources: Resources,
    /// The hard memory limit in MiB where the driver enforces one (Nomad's
    /// `resources { memory_max }`), at least `resources.memory_mb`, which
    /// is then the reservation; 0: none, the reservation is the limit.
    #[serde(default)]
    pub memory_max_mb: u64,
    /// Task-level constraints.
    #[serde(default)]
    pub constraints: Vec<Constraint>,
    /// Driver configuration, opaque to the scheduler; checked at
    /// submission for the drivers Drover knows (`raw_exec`: `command`,
    /// `args`, `work_dir`, see [`RawExecConfig`]; `docker`: see
    /// [`DockerConfig`]). Every string in it, however nested, may use
    /// `${...}` variables (`${NOMAD_PORT_http}`, `${NOMAD_META_owner}`,
    /// `${node.unique.id}`, `${attr.*}`, `${meta.*}`, `${env.NAME}`),
    /// filled in by the client; one it does not know fails
    /// the task, as in Nomad.
    #[serde(default)]
    pub config: BTreeMap<String, ConfigValue>,
    /// Environment variables for the task, on top of the ones the client
    /// sets (`DROVER_*` and Nomad's `NOMAD_*`); values may use `${...}`
    /// (an unknown one stays as written).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Run the task as this user (the agent must be root to switch);
    /// absent: the agent's own user.
    #[serde(default)]
    pub user: Option<String>,
    /// How long a stopping task has after its kill signal before its whole
    /// process group is killed (Nomad's `kill_timeout`, default 5 s).
    #[serde(default = "default_kill_timeout", with = "serde_duration")]
    pub kill_timeout: Duration,
    /// The signal that asks the task to stop (one of [`KILL_SIGNALS`]);
    /// absent: SIGINT, as Nomad.
    #[serde(default)]
    pub kill_signal: Option<String>,
    /// How much of its stdout and stderr the client keeps.
    #[serde(default)]
    pub logs: LogConfig,
    /// Task-level affinities; they count for the whole group's placement.
    #[serde(default)]
    pub affinities: Vec<Affinity>,
    /// The task's own restart policy (Nomad's task `restart` block, its
    /// fields laid over the group's); absent: the group's.
    #[serde(default)]
    pub restart_policy: Option<RestartPolicy>,
    /// Free-form key-value pairs (Nomad's task `meta`): merged over the
    /// group's and the job's, they reach the task as `NOMAD_META_<key>`.
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
    /// The task's services (Nomad's task `service` blocks), registered
    /// while it runs.
    #[serde(default)]
    pub services: Vec<Service>,
    /// How long the task keeps running after its services are
    /// deregistered, before its kill signal (Nomad's `shutdown_delay`).
    #[serde(default, with = "serde_duration")]
    pub shutdown_delay: Duration,
    /// The task's templates (Nomad's `template` blocks), rendered into its
    /// directory before it starts and again when their data changes.
    #[serde(default)]
    pub templates: Vec<Template>,
    /// Where the client writes a dispatched job's payload (Nomad's
    /// `dispatch_payload`), under the task's `local/` directory.
    #[serde(default)]
    pub dispatch_payload: Option<DispatchPayloadConfig>,
}

fn default_kill_timeout() -> Duration {
    Duration::from_secs(5)
}

impl Task {
    /// A task named `name` run by `driver`, with Nomad's defaults for the rest.
    pub fn new(name: &str, driver: &str, resources: Resources) -> Task {
        Task {
            name: name.to_string(),
            driver: driver.to_string(),
            resources,
            memory_max_mb: 0,
            constraints: Vec::new(),
            config: BTreeMap::new(),
            env: BTreeMap::new(),
            user: None,
            kill_timeout: default_kill_timeout(),
            kill_signal: None,
            logs: LogConfig::default(),
            affinities: Vec::new(),
            restart_policy: None,
            meta: BTreeMap::new(),
            services: Vec::new(),
            shutdown_delay: Duration::ZERO,
            templates: Vec::new(),
            dispatch_payload: None,
        }
    }

    /// The restart policy the client applies: the task's own, else its group's.
    pub fn effective_restart_policy<'a>(&'a self, group: &'a TaskGroup) -> &'a RestartPolicy {
        self.restart_policy.as_ref().unwrap_or(&group.restart_policy)
    }

    /// The signal that asks it to stop.
    pub fn kill_signal(&self) -> &str {
        self.kill_signal.as_deref().unwrap_or(DEFAULT_KILL_SIGNAL)
    }
}

/// A set of tasks placed together on one node, `count` times.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TaskGroup {
    /// Name, unique within the job.
    pub name: String,
    /// How many allocations to run (system jobs: 0 or 1 per node).
    pub count: u32,
    /// Group-level constraints.
    #[serde(default)]
    pub constraints: Vec<Constraint>,
    /// Group-level affinities, scored together with the job's and the tasks'.
    #[serde(default)]
    pub affinities: Vec<Affinity>,
    /// Group-level spreads, scored together with the job's (an attribute
    /// may be spread over at one level only).
    #[serde(default)]
    pub spreads: Vec<Spread>,
    /// The ports each allocation needs on its node: at most one network
    /// (Nomad JSON `Networks`).
    #[serde(default)]
    pub networks: Vec<NetworkResource>,
    /// The tasks.
    pub tasks: Vec<Task>,
    /// Reschedule policy; the job type's default when absent.
    #[serde(default)]
    pub reschedule_policy: Option<ReschedulePolicy>,
    /// Client-side restart policy.
    #[serde(default)]
    pub restart_policy: RestartPolicy,
    /// Rolling update settings.
    #[serde(default)]
    pub update: Option<UpdateStrategy>,
    /// How long allocations may stay `unknown` on a disconnected node before
    /// they are treated as lost.
    #[serde(default, with = "serde_opt_duration")]
    pub max_client_disconnect: Option<Duration>,
    /// The client stops the allocations itself after this long without the servers.
    #[serde(default, with = "serde_opt_duration")]
    pub stop_after_client_disconnect: Option<Duration>,
    /// Whether an allocation marked `unknown` (within its
    /// `max_client_disconnect`) is replaced elsewhere meanwhile: Nomad 1.8's
    /// `disconnect { replace }`, true by default as there. When false it
    /// keeps its slot until it reconnects or its window runs out.
    #[serde(default = "replace_on_disconnect_default")]
    pub replace_on_disconnect: bool,
    /// Which allocation of a slot is kept when an `unknown` one reconnects
    /// and its replacement runs (Nomad 1.8's `disconnect { reconcile }`).
    #[serde(default)]
    pub reconcile: ReconcileStrategy,
    /// Free-form key-value pairs (Nomad's group `meta`), for its tasks.
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
    /// The group's services (Nomad's group `service` blocks), registered
    /// while an allocation runs.
    #[serde(default)]
    pub services: Vec<Service>,
    /// How long an allocation's tasks keep running after the group's
    /// services are deregistered, before they are killed (Nomad's group
    /// `shutdown_delay`).
    #[serde(default, with = "serde_duration")]
    pub shutdown_delay: Duration,
    /// How its allocations' health is decided (from its `update` block).
    #[serde(default)]
    pub health: HealthPolicy,
    /// How its allocations leave a draining node (service groups).
    #[serde(default)]
    pub migrate: MigrateStrategy,
}

/// Which of two allocations of one slot is kept when the original comes
/// back from a disconnect while its replacement runs (Nomad's
/// `disconnect { reconcile }`). Either way, a replacement that runs a newer
/// job version than the original wins.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReconcileStrategy {
    /// The one placed on the better-scoring node (Nomad's default); the
    /// original when the scores are equal.
    #[default]
    BestScore,
    /// Always the original.
    KeepOriginal,
    /// Always the replacement.
    KeepReplacement,
    /// The one whose tasks have run longest (the earliest task start); the
    /// original when neither has started or both started together.
    LongestRunning,
}

impl ReconcileStrategy {
    /// Every strategy by Nomad's name.
    pub const ALL: [ReconcileStrategy; 4] = [
        ReconcileStrategy::BestScore,
        ReconcileStrategy::KeepOriginal,
        ReconcileStrategy::KeepReplacement,
        ReconcileStrategy::LongestRunning,
    ];

    /// Nomad's name (`best_score`, `keep_original`, `keep_replacement`, `longest_running`).
    pub fn as_str(self) -> &'static str {
        match self {
            ReconcileStrategy::BestScore => "best_score",
            ReconcileStrategy::KeepOriginal => "keep_original",
            ReconcileStrategy::KeepReplacement => "keep_replacement",
            ReconcileStrategy::LongestRunning => "longest_running",
        }
    }

    /// The strategy of Nomad's name, if it is one.
    pub fn parse(name: &str) -> Option<ReconcileStrategy> {
        ReconcileStrategy::ALL.into_iter().find(|strategy| strategy.as_str() == name)
    }
}

fn replace_on_disconnect_default() -> bool {
    true
}

impl TaskGroup {
    /// What one allocation of this group needs: the sum over its tasks.
    pub fn resources(&self) -> Resources {
        self.tasks.iter().fold(Resources::default(), |sum, task| sum.plus(task.resources))
    }

    /// Whether an allocation of this group needs ports on its node.
    pub fn asks_for_ports(&self) -> bool {
        self.networks.iter().any(|network| !network.reserved_ports.is_empty() || !network.dynamic_ports.is_empty())
    }
}

/// A job: what a user wants run.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Job {
    /// Namespace.
    #[serde(default = "default_namespace")]
    pub namespace: Arc<str>,
    /// Id, unique in the namespace.
    pub id: Arc<str>,
    /// Display name; the id when empty.
    #[serde(default)]
    pub name: String,
    /// Which scheduler handles it.
    #[serde(rename = "type")]
    pub job_type: JobType,
    /// 1 (lowest) to 100.
    #[serde(default = "default_priority")]
    pub priority: u8,
    /// Datacenters it may run in.
    pub datacenters: Vec<String>,
    /// Job-level constraints.
    #[serde(default)]
    pub constraints: Vec<Constraint>,
    /// Job-level affinities: preferred (or, with a negative weight, avoided)
    /// nodes for every group (Nomad JSON `Affinities`).
    #[serde(default)]
    pub affinities: Vec<Affinity>,
    /// Job-level spreads: every group's allocations shared out over the
    /// values of a node attribute (Nomad JSON `Spreads`).
    #[serde(default)]
    pub spreads: Vec<Spread>,
    /// Task groups.
    pub task_groups: Vec<TaskGroup>,
    /// The user asked for the job to stop.
    #[serde(default)]
    pub stop: bool,
    /// Version, bumped by the state store when the spec changes.
    #[serde(default)]
    pub version: u64,
    /// This version ran well (Nomad's `Stable`): set by
    /// `Command::SetJobStability`, false on every new version, and ignored
    /// when comparing specs.
    #[serde(default)]
    pub stable: bool,
    /// Index at which the job was first registered.
    #[serde(default)]
    pub create_index: u64,
    /// Index of the last write to the job (spec or status).
    #[serde(default)]
    pub modify_index: u64,
    /// Index of the last change to the spec.
    #[serde(default)]
    pub job_modify_index: u64,
    /// Free-form key-value pairs (Nomad's job `meta`), for every task.
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
    /// When this version was submitted (Nomad's `SubmitTime`), set by the
    /// job endpoint; a resubmission of the same spec keeps the stored one,
    /// and comparing specs ignores it. Job GC counts its threshold from here.
    #[serde(default)]
    pub submit_time: Timestamp,
    /// Its `periodic` block: children are launched on its schedule
    /// (`periodic/`); registering it runs nothing itself.
    #[serde(default)]
    pub periodic: Option<PeriodicConfig>,
    /// Its `parameterized` block: children are dispatched (`dispatch.rs`);
    /// registering it runs nothing itself. A dispatched child keeps it.
    #[serde(default)]
    pub parameterized: Option<ParameterizedJobConfig>,
    /// A child made by a dispatch (Nomad's `Dispatched`); never submitted.
    #[serde(default)]
    pub dispatched: bool,
    /// The periodic or parameterized job this one was launched from
    /// (Nomad's `ParentID`); empty for a job a user submitted.
    #[serde(default)]
    pub parent_id: String,
    /// A dispatched child's payload, snappy-compressed (Nomad's `Payload`).
    #[serde(default)]
    pub payload: Vec<u8>,
    /// The idempotency token of the dispatch that made it.
    #[serde(default)]
    pub dispatch_idempotency_token: String,
}

fn default_namespace() -> Arc<str> {
    Arc::from(DEFAULT_NAMESPACE)
}

fn default_priority() -> u8 {
    50
}

/// Why a submitted job was refused; lists every problem found, each naming
/// where it is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("job {job:?} is invalid: {}", problems.join("; "))]
pub struct JobValidationError {
    /// The job id as submitted.
    pub job: String,
    /// One line per problem.
    pub problems: Vec<String>,
}

/// A meta entry reaches its tasks' environment (`NOMAD_META_<key>`), which
/// cannot carry a NUL character.
fn meta_problems(meta: &BTreeMap<String, String>, place: &str, problems: &mut Vec<String>) {
    for (key, value) in meta {
        if key.contains('\0') || value.contains('\0') {
            problems.push(format!("{place}: meta {key:?} contains NUL"));
        }
    }
}

/// Why `name` cannot be a group or task name, or `None`:
/// clients build directories, log files and cgroups from task names (and
/// may from the others), so each must stay one path component (Nomad
/// refuses slashes and NUL characters in task names).
pub fn path_name_problem(name: &str) -> Option<&'static str> {
    if name.contains('/') || name.contains('\\') {
        Some("cannot include slashes")
    } else if name.contains('\0') {
        Some("cannot include null characters")
    } else if name == "." || name == ".." {
        Some("cannot be \".\" or \"..\"")
    } else {
        None
    }
}

impl Job {
    /// A child of this job (a periodic launch, a dispatch) named `id`: a
    /// copy that records its parent, new as a job is (version 0, no
    /// indexes, not stable), submitted at `now`.
    pub fn child(&self, id: &str, now: Timestamp) -> Job {
        let mut child = self.clone();
        child.id = Arc::from(id);
        child.name = id.to_string();
        child.parent_id = self.id.to_string();
        child.version = 0;
        child.stable = false;
        child.create_index = 0;
        child.modify_index = 0;
        child.job_modify_index = 0;
        child.submit_time = now;
        child
    }

    /// The job's namespaced key.
    pub fn key(&self) -> JobKey {
        JobKey { namespace: self.namespace.clone(), id: self.id.clone() }
    }

    /// Whether it has a `periodic` block (Nomad's `IsPeriodic`).
    pub fn is_periodic(&self) -> bool {
        self.periodic.is_some()
    }

    /// Whether its schedule launches children now (Nomad's
    /// `IsPeriodicActive`): periodic, enabled, not stopped, and not a
    /// parameterized template (its dispatched children are the periodic ones).
    pub fn is_periodic_active(&self) -> bool {
        self.periodic.as_ref().is_some_and(|periodic| periodic.enabled) && !self.stop && !self.is_parameterized()
    }

    /// Whether it is a parameterized template, not a dispatched child
    /// (Nomad's `IsParameterized`).
    pub fn is_parameterized(&self) -> bool {
        self.parameterized.is_some() && !self.dispatched
    }

    /// Whether a register or a deregister writes an eval for it: not for
    /// the periodic and parameterized parents, which run nothing themselves.
    pub fn is_scheduled_directly(&self) -> bool {
        !self.is_periodic() && !self.is_parameterized()
    }

    /// The parent's key of a launched or dispatched child.
    pub fn parent_key(&self) -> Option<JobKey> {
        (!self.parent_id.is_empty())
            .then(|| JobKey { namespace: self.namespace.clone(), id: Arc::from(self.parent_id.as_str()) })
    }

    /// The group named `name`.
    pub fn group(&self, name: &str) -> Option<&TaskGroup> {
        self.task_groups.iter().find(|group| group.name == name)
    }

    /// The meta a task sees (Nomad's `CombinedTaskMeta`): the job's, then
    /// its group's, then its own, the innermost winning a key.
    pub fn combined_task_meta(&self, group: &str, task: &str) -> BTreeMap<String, String> {
        let mut meta = self.meta.clone();
        if let Some(group) = self.group(group) {
            meta.extend(group.meta.iter().map(|(key, value)| (key.clone(), value.clone())));
            if let Some(task) = group.tasks.iter().find(|candidate| candidate.name == task) {
                meta.extend(task.meta.iter().map(|(key, value)| (key.clone(), value.clone())));
            }
        }
        meta
    }

    /// The reschedule policy in force for a group: its own, else the job type's default.
    pub fn reschedule_policy(&self, group: &TaskGroup) -> Option<ReschedulePolicy> {
        if self.job_type.is_system_like() {
            return None;
        }
        group.reschedule_policy.clone().or_else(|| ReschedulePolicy::default_for(self.job_type))
    }

    /// Checks a user-submitted job and lists every problem with where it is.
    pub fn validate(&self) -> Result<(), JobValidationError> {
        let mut problems = Vec::new();
        self.job_problems(&mut problems);
        let mut group_names = BTreeSet::new();
        for group in &self.task_groups {
            if !group_names.insert(group.name.as_str()) {
                problems.push(format!("task group {:?} is defined more than once", group.name));
            }
            self.group_problems(group, &mut problems);
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(JobValidationError { job: self.id.to_string(), problems })
        }
    }

    fn job_problems(&self, problems: &mut Vec<String>) {
        if self.id.trim().is_empty() {
            problems.push("job id is empty".to_string());
        } else if self.id.len() > 128 || self.id.chars().any(|c| c.is_whitespace() || c.is_control()) {
            problems.push(format!("job id {:?} must be at most 128 characters without spaces", self.id));
        }
        if matches!(&*self.id, "." | "..") {
            // Slashes stay allowed: Nomad's dispatched and periodic children are `parent/...`.
            problems.push(format!("job id {:?} cannot be \".\" or \"..\"", self.id));
        }
        // Whether it exists is the state's to say (the job endpoint and the store).
        if let Some(problem) = super::namespace_name_problem(&self.namespace) {
            problems.push(problem);
        }
        if !(1..=100).contains(&self.priority) {
            problems.push(format!("priority {} is outside 1..=100", self.priority));
        }
        if self.datacenters.is_empty() {
            problems.push("no datacenters: name at least one".to_string());
        }
        if self.datacenters.iter().any(|dc| dc.trim().is_empty()) {
            problems.push("a datacenter name is empty".to_string());
        }
        if self.task_groups.is_empty() {
            problems.push("no task groups: define at least one".to_string());
        }
        for constraint in &self.constraints {
            constraint.problems("job", problems);
        }
        for affinity in &self.affinities {
            affinity.problems("job", problems);
        }
        for spread in &self.spreads {
            spread.problems("job", problems);
        }
        spread::duplicate_problems(&self.spreads, &BTreeSet::new(), "job", problems);
        meta_problems(&self.meta, "job", problems);
        if let Some(periodic) = &self.periodic {
            if !self.job_type.is_batch_like() {
                problems.push("Periodic can only be used with \"batch\" or \"sysbatch\" scheduler".to_string());
            }
            periodic.problems(problems);
        }
        if let Some(parameterized) = &self.parameterized {
            if !self.job_type.is_batch_like() {
                problems
                    .push("Parameterized job can only be used with \"batch\" or \"sysbatch\" scheduler".to_string());
            }
            parameterized.problems(problems);
        }
    }

    fn group_problems(&self, group: &TaskGroup, problems: &mut Vec<String>) {
        let place = format!("task group {:?}", group.name);
        if group.name.trim().is_empty() {
            problems.push("a task group has no name".to_string());
        } else if let Some(why) = path_name_problem(&group.name) {
            problems.push(format!("{place}: the name {why}"));
        }
        if group.count > MAX_GROUP_COUNT {
            problems.push(format!("{place}: count {} is above the limit of {MAX_GROUP_COUNT}", group.count));
        }
        if self.job_type.is_system_like() && group.count > 1 {
            problems.push(format!(
                "{place}: {} jobs run one allocation per node, so count must be 0 or 1 (got {})",
                self.job_type, group.count
            ));
        }
        if self.job_type.is_system_like() && group.reschedule_policy.is_some() {
            problems.push(format!("{place}: {} jobs are not rescheduled; remove reschedule_policy", self.job_type));
        }
        if group.max_client_disconnect.is_some() && group.stop_after_client_disconnect.is_some() {
            problems
                .push(format!("{place}: max_client_disconnect and stop_after_client_disconnect cannot both be set"));
        }
        if let Some(update) = &group.update {
            if self.job_type == JobType::Batch {
                problems.push(format!("{place}: job type {:?} does not allow update block", self.job_type.as_str()));
            }
            update.problems(group, &place, problems);
        }
        if let Some(policy) = &group.reschedule_policy {
            policy.problems(&place, problems);
        }
        group.restart_policy.problems(&place, problems);
        for task in &group.tasks {
            if let Some(policy) = &task.restart_policy {
                policy.problems(&format!("{place}, task {:?}", task.name), problems);
            }
        }
        meta_problems(&group.meta, &place, problems);
        for constraint in &group.constraints {
            constraint.problems(&place, problems);
        }
        self.preference_problems(group, &place, problems);
        self.task_problems(group, &place, problems);
        group_service_problems(group, &place, problems);
    }

    /// Affinities, spreads and ports of a group.
    fn preference_problems(&self, group: &TaskGroup, place: &str, problems: &mut Vec<String>) {
        for affinity in &group.affinities {
            affinity.problems(place, problems);
        }
        for spread in &group.spreads {
            spread.problems(place, problems);
        }
        let job_attributes = self.spreads.iter().map(|spread| spread.attribute.as_str()).collect();
        spread::duplicate_problems(&group.spreads, &job_attributes, place, problems);
        if group.networks.len() > 1 {
            problems.push(format!("{place}: {} networks: a group has at most one", group.networks.len()));
        }
        for network in &group.networks {
            network.problems(place, problems);
        }
    }

    fn task_problems(&self, group: &TaskGroup, place: &str, problems: &mut Vec<String>) {
        if group.tasks.is_empty() {
            problems.push(format!("{place}: no tasks: define at least one"));
        }
        let mut task_names = BTreeSet::new();
        for task in &group.tasks {
            let task_place = format!("{place}, task {:?}", task.name);
            if task.name.trim().is_empty() {
                problems.push(format!("{place}: a task has no name"));
            } else if !task_names.insert(task.name.as_str()) {
                problems.push(format!("{place}: task {:?} is defined more than once", task.name));
            } else if let Some(why) = path_name_problem(&task.name) {
                problems.push(format!("{task_place}: the name {why}"));
            }
            if task.driver.trim().is_empty() {
                problems.push(format!("{task_place}: no driver"));
            }
            if task.resources.cpu == 0 {
                problems.push(format!("{task_place}: cpu must be at least 1 MHz"));
            }
            if task.resources.memory_mb == 0 {
                problems.push(format!("{task_place}: memory must be at least 1 MiB"));
            }
            if task.memory_max_mb != 0 && task.memory_max_mb < task.resources.memory_mb {
                problems.push(format!(
                    "{task_place}: memory_max ({} MiB) cannot be less than memory ({} MiB)",
                    task.memory_max_mb, task.resources.memory_mb
                ));
            }
            for constraint in &task.constraints {
                constraint.problems(&task_place, problems);
            }
            for affinity in &task.affinities {
                affinity.problems(&task_place, problems);
            }
            task_settings_problems(task, &task_place, problems);
            if task.driver == DOCKER {
                docker_port_problems(task, group, &task_place, problems);
            }
            meta_problems(&task.meta, &task_place, problems);
            task_template_problems(task, &task_place, problems);
            if let Some(problem) = task.dispatch_payload.as_ref().and_then(DispatchPayloadConfig::problem) {
                problems.push(format!("{task_place}: {problem}"));
            }
        }
    }

    /// A job of one group with one task of the given size; the basis of test
    /// and load fixtures.
    pub fn new_simple(id: &str, job_type: JobType, count: u32, resources: Resources) -> Job {
        Job {
            namespace: default_namespace(),
            id: Arc::from(id),
            name: id.to_string(),
            job_type,
            priority: default_priority(),
            datacenters: vec!["dc1".to_string()],
            constraints: Vec::new(),
            affinities: Vec::new(),
            spreads: Vec::new(),
            task_groups: vec![TaskGroup {
                name: "group".to_string(),
                count,
                constraints: Vec::new(),
                affinities: Vec::new(),
                spreads: Vec::new(),
                networks: Vec::new(),
                tasks: vec![Task::new("task", "exec", resources)],
                reschedule_policy: None,
                restart_policy: RestartPolicy::default(),
                update: None,
                max_client_disconnect: None,
                stop_after_client_disconnect: None,
                replace_on_disconnect: true,
                reconcile: ReconcileStrategy::default(),
                meta: BTreeMap::new(),
                services: Vec::new(),
                shutdown_delay: Duration::ZERO,
                health: HealthPolicy::default(),
                migrate: MigrateStrategy::default(),
            }],
            stop: false,
            version: 0,
            stable: false,
            create_index: 0,
            modify_index: 0,
            job_modify_index: 0,
            meta: BTreeMap::new(),
            submit_time: Timestamp::ZERO,
            periodic: None,
            parameterized: None,
            dispatched: false,
            parent_id: String::new(),
            payload: Vec::new(),
            dispatch_idempotency_token: String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structs::ConstraintOperand;

    fn valid_job() -> Job {
        Job::new_simple("web", JobType::Service, 3, Resources::new(100, 128, 0))
    }

    #[test]
    fn a_valid_job_passes() {
        assert_eq!(valid_job().validate(), Ok(()));
    }

    #[test]
    fn a_docker_task_publishes_only_its_groups_ports() {
        let mut job = valid_job();
        job.task_groups[0].networks = vec![NetworkResource {
            reserved_ports: Vec::new(),
            dynamic_ports: vec![crate::structs::Port::new("http", 0)],
        }];
        let task = &mut job.task_groups[0].tasks[0];
        task.driver = DOCKER.to_string();
        task.config =
            serde_json::from_str(r#"{"image": "web", "ports": ["http", "${NOMAD_META_port}"]}"#).expect("config");
        assert_eq!(job.validate(), Ok(()), "a label holding ${{ is the client's to check");
        let ports = ConfigValue::List(vec!["http".into(), "admin".into()]);
        job.task_groups[0].tasks[0].config.insert("ports".to_string(), ports);
        job.task_groups[0].tasks[0].config.insert("privileged".to_string(), "yes".into());
        let error = job.validate().expect_err("an unknown port and a bad bool");
        assert_eq!(
            error.problems,
            [
                "task group \"group\", task \"task\": config.privileged must be true or false, not \"yes\"",
                "task group \"group\", task \"task\": config.ports: Port \"admin\" not found, check network stanza",
            ]
        );
    }

    #[test]
    fn memory_max_is_at_least_the_reservation() {
        let mut job = valid_job();
        job.task_groups[0].tasks[0].memory_max_mb = 512;
        assert_eq!(job.validate(), Ok(()));
        job.task_groups[0].tasks[0].memory_max_mb = 64;
        let text = job.validate().expect_err("below memory").to_string();
        assert!(text.contains("memory_max (64 MiB) cannot be less than memory (128 MiB)"), "{text}");
    }

    #[test]
    fn names_that_would_become_paths_are_refused() {
        for bad in ["/tmp/x/escaped", "../../x", "..", ".", "a\\b", "nul\0"] {
            let mut job = valid_job();
            job.task_groups[0].tasks[0].name = bad.to_string();
            let text = job.validate().expect_err("a path-like task name").to_string();
            assert!(text.contains("task") && text.contains("cannot"), "{bad:?}: {text}");
            let mut job = valid_job();
            job.task_groups[0].name = bad.to_string();
            assert!(job.validate().is_err(), "group {bad:?}");
        }
        let mut job = valid_job();
        job.id = "..".into();
        assert!(job.validate().is_err());
        job.id = "parent/dispatch-1".into();
        assert_eq!(job.validate(), Ok(()), "Nomad's child job ids keep their slash");
        let mut job = valid_job();
        job.task_groups[0].tasks[0].name = "web.v2-x_y".to_string();
        assert_eq!(job.validate(), Ok(()));
    }

    #[test]
    fn every_problem_is_listed_with_its_place() {
        let mut job = valid_job();
        job.priority = 0;
        job.datacenters.clear();
        job.task_groups[0].tasks[0].resources.cpu = 0;
        job.task_groups[0].constraints.push(Constraint::new("${attr.kernel.name}", ConstraintOperand::Equal, ""));
        let error = job.validate().expect_err("four problems");
        assert_eq!(error.problems.len(), 4, "{error}");
        let text = error.to_string();
        assert!(text.contains("priority 0 is outside 1..=100"), "{text}");
        assert!(text.contains("no datacenters"), "{text}");
        assert!(text.contains("task group \"group\", task \"task\": cpu must be at least 1 MHz"), "{text}");
        assert!(text.contains("needs a right target"), "{text}");
    }

    #[test]
    fn malformed_regexp_and_version_constraints_are_refused() {
        let mut job = valid_job();
        job.constraints.push(Constraint::new("${attr.kernel.name}", ConstraintOperand::Regexp, "(linux"));
        job.constraints.push(Constraint::new("${attr.kernel.version}", ConstraintOperand::Version, "at least 5"));
        let text = job.validate().expect_err("two problems").to_string();
        assert!(text.contains("invalid regexp"), "{text}");
        assert!(text.contains("invalid version constraint"), "{text}");
    }

    #[test]
    fn system_jobs_take_count_zero_or_one() {
        let job = Job::new_simple("agent", JobType::System, 2, Resources::new(10, 10, 0));
        let error = job.validate().expect_err("count 2");
        assert!(error.to_string().contains("count must be 0 or 1"), "{error}");
    }

    #[test]
    fn duplicate_groups_and_disconnect_settings_are_refused() {
        let mut job = valid_job();
        job.task_groups.push(job.task_groups[0].clone());
        job.task_groups[0].max_client_disconnect = Some(Duration::from_secs(60));
        job.task_groups[0].stop_after_client_disconnect = Some(Duration::from_secs(60));
        let text = job.validate().expect_err("two problems").to_string();
        assert!(text.contains("defined more than once"), "{text}");
        assert!(text.contains("cannot both be set"), "{text}");
    }

    #[test]
    fn job_specs_read_from_json_with_defaults_and_human_durations() {
        let spec = r#"{
            "id": "api", "type": "service", "datacenters": ["dc1"],
            "task_groups": [{
                "name": "api", "count": 2, "max_client_disconnect": "5m",
                "tasks": [{"name": "server", "driver": "exec",
                           "resources": {"cpu": 500, "memory_mb": 256, "disk_mb": 0}}]
            }]
        }"#;
        let job: Job = serde_json::from_str(spec).expect("a valid spec");
        assert_eq!(&*job.namespace, DEFAULT_NAMESPACE);
        assert_eq!(job.priority, 50);
        assert_eq!(job.task_groups[0].max_client_disconnect, Some(Duration::from_secs(300)));
        assert!(job.task_groups[0].replace_on_disconnect, "Nomad's default: replace");
        assert_eq!(job.task_groups[0].resources(), Resources::new(500, 256, 0));
        assert_eq!(job.validate(), Ok(()));
        let again: Job = serde_json::from_str(&serde_json::to_string(&job).expect("serializes")).expect("reads back");
        assert_eq!(again, job);
    }

    #[test]
    fn affinities_spreads_and_ports_are_validated_with_their_place() {
        use crate::structs::{Affinity, NetworkResource, Port, Spread};
        let mut job = valid_job();
        job.affinities.push(Affinity::new("${node.class}", ConstraintOperand::Equal, "web", 0));
        job.spreads.push(Spread::even("${node.datacenter}", 50));
        let group = &mut job.task_groups[0];
        group.spreads.push(Spread::with_targets("${node.datacenter}", 50, &[("dc1", 90), ("dc2", 20)]));
        group.networks = vec![NetworkResource::default(), NetworkResource::default()];
        group.networks[0].reserved_ports.push(Port::new("http", 8080));
        group.networks[0].dynamic_ports.push(Port::new("http", 0));
        group.tasks[0].affinities.push(Affinity::new("${meta.rack}", ConstraintOperand::DistinctHosts, "", 10));
        let error = job.validate().expect_err("six problems");
        let text = error.to_string();
        assert!(text.contains("job: affinity \"${node.class}\" Equal \"web\": weight 0"), "{text}");
        assert!(
            text.contains(
                "task group \"group\": spread over \"${node.datacenter}\": target percentages add up to 110%"
            ),
            "{text}"
        );
        assert!(text.contains("also defined for the whole job"), "{text}");
        assert!(text.contains("2 networks: a group has at most one"), "{text}");
        assert!(text.contains("port label \"http\" is used more than once"), "{text}");
        assert!(text.contains("task \"task\": affinity"), "{text}");
        assert_eq!(error.problems.len(), 6, "{text}");
    }

    #[test]
    fn placement_preferences_read_from_json() {
        let spec = r#"{
            "id": "api", "type": "service", "datacenters": ["dc1", "dc2"],
            "affinities": [{"l_target": "${node.class}", "operand": "=", "r_target": "fast", "weight": -30}],
            "spreads": [{"attribute": "${node.datacenter}", "targets": [{"value": "dc1", "percent": 70}]}],
            "task_groups": [{
                "name": "api", "count": 2,
                "networks": [{"reserved_ports": [{"label": "db", "value": 5432}], "dynamic_ports": [{"label": "http", "to": 8080}]}],
                "tasks": [{"name": "server", "driver": "exec", "resources": {"cpu": 500, "memory_mb": 256, "disk_mb": 0}}]
            }]
        }"#;
        let job: Job = serde_json::from_str(spec).expect("a valid spec");
        assert_eq!(job.validate(), Ok(()));
        assert_eq!(job.affinities[0].weight, -30);
        assert_eq!(job.spreads[0].weight, 50, "Nomad's default weight");
        assert_eq!(job.task_groups[0].networks[0].dynamic_ports[0].to, 8080);
        assert!(job.task_groups[0].asks_for_ports());
    }

    #[test]
    fn task_meta_is_the_jobs_then_the_groups_then_the_tasks() {
        let mut job = valid_job();
        let entries = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect()
        };
        job.meta = entries(&[("owner", "job"), ("tier", "job"), ("only_job", "j")]);
        job.task_groups[0].meta = entries(&[("tier", "group"), ("rack", "group")]);
        job.task_groups[0].tasks[0].meta = entries(&[("rack", "task")]);
        let merged = job.combined_task_meta("group", "task");
        assert_eq!(merged, entries(&[("owner", "job"), ("tier", "group"), ("only_job", "j"), ("rack", "task")]));
        assert_eq!(job.combined_task_meta("group", "other")["rack"], "group", "another task sees the group's");
        assert_eq!(job.combined_task_meta("nope", "task"), job.meta, "an unknown group: the job's alone");
        assert_eq!(job.validate(), Ok(()));
        job.task_groups[0].tasks[0].meta.insert("bad".to_string(), "a\0b".to_string());
        let text = job.validate().expect_err("NUL").to_string();
        assert!(text.contains("task \"task\": meta \"bad\" contains NUL"), "{text}");
    }

    #[test]
    fn reschedule_policy_defaults_by_type() {
        let job = valid_job();
        assert!(job.reschedule_policy(&job.task_groups[0]).expect("service default").unlimited);
        let system = Job::new_simple("sys", JobType::System, 1, Resources::new(1, 1, 0));
        assert_eq!(system.reschedule_policy(&system.task_groups[0]), None);
    }
}
