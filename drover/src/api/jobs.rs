//! Jobs as the server answers them (Nomad's `api/jobs.go`, `api/tasks.go`):
//! the job with its groups and tasks, its list stub and summary, its scale
//! status, and the answers to job writes. What a client submits is read by
//! `job_spec.rs`, leniently, into the engine's job.
//!
//! Fields Drover does not implement are still sent, with the value Nomad
//! sends for "unset" (`null`, `false`, `""`, `0`), because Nomad's clients
//! dereference them; they are typed `Option<Value>` when Drover never fills
//! them.

use std::collections::BTreeMap;

use engine::structs::ConfigValue;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::format::nanos;
use super::periodic::{DispatchPayload, ParameterizedJob, Periodic};
use super::resources::{NetworkResource, Resources};
use super::{word, WriteMeta};

/// Every sub-path of `/v1/job/<id>` Nomad has; the longest first, so
/// `/periodic/force` is not read as a job id ending in `/periodic`.
pub const JOB_SUFFIXES: [&str; 17] = [
    "/periodic/force",
    "/allocations",
    "/evaluations",
    "/deployments",
    "/deployment",
    "/submission",
    "/evaluate",
    "/dispatch",
    "/versions",
    "/services",
    "/summary",
    "/actions",
    "/revert",
    "/stable",
    "/action",
    "/scale",
    "/plan",
];

/// What follows `/v1/job/` split into the job id and the sub-path of
/// [`JOB_SUFFIXES`] it ends with (`""`: the job itself).
pub fn split_job_path(rest: &str) -> (&str, &'static str) {
    JOB_SUFFIXES.iter().find_map(|suffix| rest.strip_suffix(suffix).map(|id| (id, *suffix))).unwrap_or((rest, ""))
}

/// A job (`GET /v1/job/:id`, and `Allocation.Job`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct Job {
    pub stop: bool,
    pub region: String,
    pub namespace: String,
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "ParentID")]
    pub parent_id: String,
    pub name: String,
    #[serde(rename = "Type")]
    pub job_type: String,
    pub priority: u64,
    pub all_at_once: bool,
    pub datacenters: Vec<String>,
    pub constraints: Vec<Constraint>,
    /// `null` when there are none.
    pub affinities: Option<Vec<Affinity>>,
    /// `null` when there are none.
    pub spreads: Option<Vec<Spread>>,
    pub task_groups: Vec<TaskGroup>,
    /// The job's update block: always `{"Stagger": 0, "MaxParallel": 0}`
    /// (Drover keeps `MaxParallel` per group).
    pub update: Option<UpdateStrategy>,
    pub multiregion: Option<Value>,
    pub periodic: Option<Periodic>,
    pub parameterized_job: Option<ParameterizedJob>,
    pub dispatched: bool,
    /// A dispatched child's payload, snappy-compressed, in base64 (as Nomad).
    pub payload: Option<String>,
    pub dispatch_idempotency_token: String,
    pub meta: Option<BTreeMap<String, String>>,
    pub consul_token: String,
    pub vault_token: String,
    pub vault_namespace: String,
    #[serde(rename = "NomadTokenID")]
    pub nomad_token_id: String,
    /// `pending`, `running` or `dead`.
    pub status: String,
    pub status_description: String,
    pub stable: bool,
    pub version: u64,
    /// When this version was submitted, Unix nanoseconds.
    pub submit_time: u64,
    pub create_index: u64,
    pub modify_index: u64,
    pub job_modify_index: u64,
}

/// A task group (`TaskGroup`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct TaskGroup {
    pub name: String,
    pub count: u64,
    /// `{"MaxParallel": n}`, or `null` without an update block.
    pub update: Option<UpdateStrategy>,
    /// A service group's `migrate` block; `null` for other job types.
    pub migrate: Option<MigrateStrategy>,
    pub constraints: Vec<Constraint>,
    pub scaling: Option<Value>,
    pub restart_policy: RestartPolicy,
    pub tasks: Vec<Task>,
    pub ephemeral_disk: EphemeralDisk,
    pub meta: Option<BTreeMap<String, String>>,
    /// `null` for system and sysbatch jobs.
    pub reschedule_policy: Option<ReschedulePolicy>,
    /// `null` when there are none.
    pub affinities: Option<Vec<Affinity>>,
    /// `null` when there are none.
    pub spreads: Option<Vec<Spread>>,
    /// `null` when there are none.
    pub networks: Option<Vec<NetworkResource>>,
    /// `null` when there are none.
    pub services: Option<Vec<Service>>,
    pub volumes: Option<Value>,
    /// Nanoseconds; `null` when none.
    pub shutdown_delay: Option<u64>,
    /// Nanoseconds.
    pub stop_after_client_disconnect: Option<u64>,
    /// Nanoseconds.
    pub max_client_disconnect: Option<u64>,
    /// Nomad 1.8's form of `MaxClientDisconnect`, present with it.
    pub disconnect: Option<DisconnectStrategy>,
}

/// A task (`Task`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct Task {
    pub name: String,
    pub driver: String,
    pub user: String,
    /// The driver's config, as plain JSON values.
    pub config: BTreeMap<String, ConfigValue>,
    pub env: BTreeMap<String, String>,
    /// `null` when there are none.
    pub services: Option<Vec<Service>>,
    pub vault: Option<Value>,
    /// `null` when there are none.
    pub templates: Option<Vec<Template>>,
    pub constraints: Vec<Constraint>,
    /// `null` when there are none.
    pub affinities: Option<Vec<Affinity>>,
    pub resources: Resources,
    /// The group's policy (Drover has one per group).
    pub restart_policy: RestartPolicy,
    pub dispatch_payload: Option<DispatchPayload>,
    pub lifecycle: Option<Value>,
    pub meta: Option<BTreeMap<String, String>>,
    /// Nanoseconds.
    pub kill_timeout: u64,
    pub log_config: LogConfig,
    pub artifacts: Option<Value>,
    pub leader: bool,
    /// Nanoseconds.
    pub shutdown_delay: u64,
    pub volume_mounts: Option<Value>,
    pub scaling_policies: Option<Value>,
    /// `""`: the task's default, SIGINT.
    pub kill_signal: String,
    pub kind: String,
}

/// A constraint (`Constraint`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct Constraint {
    #[serde(rename = "LTarget")]
    pub l_target: String,
    #[serde(rename = "RTarget")]
    pub r_target: String,
    #[serde(rename = "Operand")]
    pub operand: String,
}

impl From<&engine::structs::Constraint> for Constraint {
    fn from(constraint: &engine::structs::Constraint) -> Self {
        Constraint {
            l_target: constraint.l_target.clone(),
            r_target: constraint.r_target.clone(),
            operand: word(constraint.operand),
        }
    }
}

/// An affinity (`Affinity`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct Affinity {
    #[serde(rename = "LTarget")]
    pub l_target: String,
    #[serde(rename = "RTarget")]
    pub r_target: String,
    #[serde(rename = "Operand")]
    pub operand: String,
    #[serde(rename = "Weight")]
    pub weight: i64,
}

impl From<&engine::structs::Affinity> for Affinity {
    fn from(affinity: &engine::structs::Affinity) -> Self {
        Affinity {
            l_target: affinity.l_target.clone(),
            r_target: affinity.r_target.clone(),
            operand: word(affinity.operand),
            weight: i64::from(affinity.weight),
        }
    }
}

/// A spread (`Spread`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct Spread {
    pub attribute: String,
    pub weight: i64,
    pub spread_target: Vec<SpreadTarget>,
}

/// One value a spread aims at (`SpreadTarget`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct SpreadTarget {
    pub value: String,
    pub percent: u64,
}

impl From<&engine::structs::Spread> for Spread {
    fn from(spread: &engine::structs::Spread) -> Self {
        Spread {
            attribute: spread.attribute.clone(),
            weight: i64::from(spread.weight),
            spread_target: spread
                .targets
                .iter()
                .map(|target| SpreadTarget { value: target.value.clone(), percent: u64::from(target.percent) })
                .collect(),
        }
    }
}

/// `None` for an empty list, as Nomad answers unset lists.
pub fn none_if_empty<T, U: for<'a> From<&'a T>>(list: &[T]) -> Option<Vec<U>> {
    (!list.is_empty()).then(|| list.iter().map(U::from).collect())
}

/// `None` for empty meta, as Nomad answers a job, group or task without any.
pub fn meta_or_none(meta: &BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
    (!meta.is_empty()).then(|| meta.clone())
}

/// `RestartPolicy`: durations in nanoseconds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct RestartPolicy {
    pub attempts: u64,
    pub interval: u64,
    pub delay: u64,
    /// `fail` or `delay`.
    pub mode: String,
}

impl From<&engine::structs::RestartPolicy> for RestartPolicy {
    fn from(policy: &engine::structs::RestartPolicy) -> Self {
        RestartPolicy {
            attempts: u64::from(policy.attempts),
            interval: nanos(policy.interval),
            delay: nanos(policy.delay),
            mode: word(policy.mode),
        }
    }
}

/// `ReschedulePolicy`: durations in nanoseconds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct ReschedulePolicy {
    pub attempts: u64,
    pub interval: u64,
    pub delay: u64,
    /// `constant`, `exponential` or `fibonacci`.
    pub delay_function: String,
    pub max_delay: u64,
    pub unlimited: bool,
}

impl From<&engine::structs::ReschedulePolicy> for ReschedulePolicy {
    fn from(policy: &engine::structs::ReschedulePolicy) -> Self {
        ReschedulePolicy {
            attempts: u64::from(policy.attempts),
            interval: nanos(policy.interval),
            delay: nanos(policy.delay),
            delay_function: word(policy.delay_function),
            max_delay: nanos(policy.max_delay),
            unlimited: policy.unlimited,
        }
    }
}

/// `UpdateStrategy`: the job's carries `Stagger` and `MaxParallel`, a
/// group's every field (durations in nanoseconds).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct UpdateStrategy {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stagger: Option<u64>,
    pub max_parallel: u64,
    /// `checks`, `task_states` or `manual` (a group's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health_check: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_healthy_time: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub healthy_deadline: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress_deadline: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_revert: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_promote: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub canary: Option<u64>,
}

/// A group's `migrate` block (`MigrateStrategy`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct MigrateStrategy {
    pub max_parallel: u64,
    /// `checks` or `task_states`.
    pub health_check: String,
    /// Nanoseconds.
    pub min_healthy_time: u64,
    /// Nanoseconds.
    pub healthy_deadline: u64,
}

impl MigrateStrategy {
    /// A group's merged block as the server answers it.
    pub fn of(migrate: &engine::structs::MigrateStrategy) -> MigrateStrategy {
        MigrateStrategy {
            max_parallel: u64::from(migrate.max_parallel),
            health_check: migrate.health.mode.as_str().to_string(),
            min_healthy_time: nanos(migrate.health.min_healthy_time),
            healthy_deadline: nanos(migrate.health.healthy_deadline),
        }
    }
}

impl UpdateStrategy {
    /// A group's merged block as the server answers it.
    pub fn of_group(group: &engine::structs::TaskGroup) -> UpdateStrategy {
        let update =
            group.update.clone().unwrap_or(engine::structs::UpdateStrategy { max_parallel: 0, ..Default::default() });
        UpdateStrategy {
            stagger: Some(nanos(update.stagger)),
            max_parallel: u64::from(update.max_parallel),
            health_check: Some(group.health.mode.as_str().to_string()),
            min_healthy_time: Some(nanos(group.health.min_healthy_time)),
            healthy_deadline: Some(nanos(group.health.healthy_deadline)),
            progress_deadline: Some(nanos(update.progress_deadline)),
            auto_revert: Some(update.auto_revert),
            auto_promote: Some(update.auto_promote),
            canary: Some(u64::from(update.canary)),
        }
    }
}

/// `EphemeralDisk`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct EphemeralDisk {
    pub sticky: bool,
    pub migrate: bool,
    #[serde(rename = "SizeMB")]
    pub size_mb: u64,
}

/// `LogConfig`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct LogConfig {
    #[serde(rename = "MaxFiles")]
    pub max_files: u32,
    #[serde(rename = "MaxFileSizeMB")]
    pub max_file_size_mb: u32,
}

/// Nomad 1.8's `Disconnect` block; durations in nanoseconds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct DisconnectStrategy {
    pub lost_after: u64,
    pub replace: bool,
    /// `best_score`, `keep_original`, `keep_replacement` or `longest_running`.
    pub reconcile: String,
    pub stop_on_client_after: Option<u64>,
}

impl Task {
    /// The task as the server answers it, with the restart policy it runs
    /// under (its own, else its group's).
    pub fn new(task: &engine::structs::Task, restart_policy: RestartPolicy) -> Task {
        Task {
            name: task.name.clone(),
            driver: task.driver.clone(),
            user: task.user.clone().unwrap_or_default(),
            config: task.config.clone(),
            env: task.env.clone(),
            constraints: task.constraints.iter().map(Constraint::from).collect(),
            affinities: none_if_empty(&task.affinities),
            resources: Resources::of_task(task),
            restart_policy,
            kill_timeout: nanos(task.kill_timeout),
            log_config: LogConfig { max_files: task.logs.max_files, max_file_size_mb: task.logs.max_file_size_mb },
            kill_signal: task.kill_signal.clone().unwrap_or_default(),
            meta: meta_or_none(&task.meta),
            services: none_if_empty(&task.services),
            templates: none_if_empty(&task.templates),
            shutdown_delay: nanos(task.shutdown_delay),
            dispatch_payload: task.dispatch_payload.as_ref().map(|block| DispatchPayload { file: block.file.clone() }),
            ..Task::default()
        }
    }
}

impl TaskGroup {
    /// The group as the server answers it; `reschedule_policy` is the
    /// job's effective one for it (`Job::reschedule_policy`).
    pub fn new(
        group: &engine::structs::TaskGroup,
        reschedule_policy: Option<&engine::structs::ReschedulePolicy>,
    ) -> TaskGroup {
        let restart_policy = RestartPolicy::from(&group.restart_policy);
        TaskGroup {
            name: group.name.clone(),
            count: u64::from(group.count),
            // Always present, `MaxParallel` 0 without deployments, so a
            // job read back registers the same job.
            update: Some(UpdateStrategy::of_group(group)),
            constraints: group.constraints.iter().map(Constraint::from).collect(),
            tasks: group
                .tasks
                .iter()
                .map(|task| Task::new(task, RestartPolicy::from(task.effective_restart_policy(group))))
                .collect(),
            restart_policy,
            ephemeral_disk: EphemeralDisk {
                size_mb: group.tasks.iter().map(|task| task.resources.disk_mb).sum(),
                ..EphemeralDisk::default()
            },
            reschedule_policy: reschedule_policy.map(ReschedulePolicy::from),
            affinities: none_if_empty(&group.affinities),
            spreads: none_if_empty(&group.spreads),
            networks: none_if_empty(&group.networks),
            stop_after_client_disconnect: group.stop_after_client_disconnect.map(nanos),
            max_client_disconnect: group.max_client_disconnect.map(nanos),
            disconnect: (group.max_client_disconnect.is_some() || group.stop_after_client_disconnect.is_some()).then(
                || DisconnectStrategy {
                    lost_after: group.max_client_disconnect.map_or(0, nanos),
                    replace: group.replace_on_disconnect,
                    reconcile: group.reconcile.as_str().to_string(),
                    stop_on_client_after: group.stop_after_client_disconnect.map(nanos),
                },
            ),
            meta: meta_or_none(&group.meta),
            services: none_if_empty(&group.services),
            shutdown_delay: (!group.shutdown_delay.is_zero()).then(|| nanos(group.shutdown_delay)),
            ..TaskGroup::default()
        }
    }
}

/// A service of a group or a task (`Service`), as submitted with Nomad's
/// defaults filled in; the service's `CheckRestart` is laid into each
/// check's, so the service's own is `null`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct Service {
    pub name: String,
    pub tags: Option<Vec<String>>,
    pub canary_tags: Option<Vec<String>>,
    pub enable_tag_override: bool,
    pub port_label: String,
    /// `auto`, `host`, `alloc` or `driver`.
    pub address_mode: String,
    pub address: String,
    pub checks: Option<Vec<ServiceCheck>>,
    pub check_restart: Option<CheckRestart>,
    pub connect: Option<Value>,
    pub meta: Option<BTreeMap<String, String>>,
    pub canary_meta: Option<BTreeMap<String, String>>,
    pub task_name: String,
    /// `require_healthy`, `ignore_warnings` or `ignore`.
    pub on_update: String,
    /// `nomad` or `consul`.
    pub provider: String,
}

impl From<&engine::structs::Service> for Service {
    fn from(service: &engine::structs::Service) -> Self {
        Service {
            name: service.name.clone(),
            tags: (!service.tags.is_empty()).then(|| service.tags.clone()),
            canary_tags: (!service.canary_tags.is_empty()).then(|| service.canary_tags.clone()),
            port_label: service.port_label.clone(),
            address_mode: service.address_mode.as_str().to_string(),
            address: service.address.clone().unwrap_or_default(),
            checks: none_if_empty(&service.checks),
            meta: meta_or_none(&service.meta),
            task_name: service.task_name.clone().unwrap_or_default(),
            on_update: service.on_update.as_str().to_string(),
            provider: service.provider.as_str().to_string(),
            ..Service::default()
        }
    }
}

/// A template of a task (`Template`), as submitted with Nomad's defaults
/// filled in; `Splay` in nanoseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct Template {
    pub source_path: String,
    pub dest_path: String,
    pub embedded_tmpl: String,
    /// `restart`, `signal` or `noop`.
    pub change_mode: String,
    pub change_signal: String,
    pub splay: u64,
    pub perms: String,
    pub once: bool,
    pub left_delim: String,
    pub right_delim: String,
    pub envvars: bool,
    pub err_missing_key: bool,
}

impl From<&engine::structs::Template> for Template {
    fn from(template: &engine::structs::Template) -> Self {
        Template {
            source_path: template.source.clone().unwrap_or_default(),
            dest_path: template.destination.clone(),
            embedded_tmpl: template.data.clone(),
            change_mode: template.change_mode.as_str().to_string(),
            change_signal: template.change_signal.clone().unwrap_or_default(),
            splay: nanos(template.splay),
            perms: template.perms.clone(),
            once: template.once,
            left_delim: template.left_delimiter.clone(),
            right_delim: template.right_delimiter.clone(),
            envvars: template.envvars,
            err_missing_key: template.error_on_missing_key,
        }
    }
}

/// A check of a service (`ServiceCheck`); durations in nanoseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct ServiceCheck {
    pub name: String,
    /// `http`, `tcp` or `script`.
    #[serde(rename = "Type")]
    pub kind: String,
    pub command: String,
    pub args: Option<Vec<String>>,
    pub path: String,
    pub protocol: String,
    pub port_label: String,
    pub address_mode: String,
    pub interval: u64,
    pub timeout: u64,
    /// `passing`, `warning`, `critical` or `""`.
    pub initial_status: String,
    #[serde(rename = "TLSSkipVerify")]
    pub tls_skip_verify: bool,
    pub header: Option<BTreeMap<String, Vec<String>>>,
    pub method: String,
    pub body: String,
    pub check_restart: Option<CheckRestart>,
    pub task_name: String,
    pub success_before_passing: u64,
    pub failures_before_critical: u64,
    pub on_update: String,
}

impl From<&engine::structs::ServiceCheck> for ServiceCheck {
    fn from(check: &engine::structs::ServiceCheck) -> Self {
        ServiceCheck {
            name: check.name.clone(),
            kind: check.kind.as_str().to_string(),
            command: check.command.clone(),
            args: (!check.args.is_empty()).then(|| check.args.clone()),
            path: check.path.clone(),
            protocol: check.protocol.clone(),
            port_label: check.port_label.clone().unwrap_or_default(),
            address_mode: check.address_mode.map(|mode| mode.as_str().to_string()).unwrap_or_default(),
            interval: nanos(check.interval),
            timeout: nanos(check.timeout),
            initial_status: check.initial_status.map(|status| status.as_str().to_string()).unwrap_or_default(),
            tls_skip_verify: check.tls_skip_verify,
            header: (!check.header.is_empty()).then(|| check.header.clone()),
            method: check.method.clone(),
            body: check.body.clone(),
            check_restart: check.check_restart.as_ref().map(CheckRestart::from),
            task_name: check.task_name.clone().unwrap_or_default(),
            success_before_passing: u64::from(check.success_before_passing),
            failures_before_critical: u64::from(check.failures_before_critical),
            on_update: check.on_update.as_str().to_string(),
        }
    }
}

/// `CheckRestart`; `Grace` in nanoseconds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct CheckRestart {
    pub limit: u64,
    pub grace: u64,
    pub ignore_warnings: bool,
}

impl From<&engine::structs::CheckRestart> for CheckRestart {
    fn from(restart: &engine::structs::CheckRestart) -> Self {
        CheckRestart {
            limit: u64::from(restart.limit),
            grace: nanos(restart.grace),
            ignore_warnings: restart.ignore_warnings,
        }
    }
}

/// A job in `GET /v1/jobs` (`JobListStub`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct JobListStub {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "ParentID")]
    pub parent_id: String,
    pub name: String,
    pub namespace: String,
    pub datacenters: Vec<String>,
    pub multiregion: Option<Value>,
    #[serde(rename = "Type")]
    pub job_type: String,
    pub priority: u64,
    pub periodic: bool,
    pub parameterized_job: bool,
    pub stop: bool,
    pub status: String,
    pub status_description: String,
    pub job_summary: JobSummary,
    pub create_index: u64,
    pub modify_index: u64,
    pub job_modify_index: u64,
    /// Unix nanoseconds.
    pub submit_time: u64,
}

/// `GET /v1/job/:id/summary`, and in every list stub (`JobSummary`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct JobSummary {
    #[serde(rename = "JobID")]
    pub job_id: String,
    pub namespace: String,
    /// Per task group.
    pub summary: BTreeMap<String, TaskGroupSummary>,
    pub children: JobChildrenSummary,
    pub create_index: u64,
    pub modify_index: u64,
}

/// One group's allocations by status (`TaskGroupSummary`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct TaskGroupSummary {
    pub queued: u64,
    pub complete: u64,
    pub failed: u64,
    pub running: u64,
    pub starting: u64,
    pub lost: u64,
    pub unknown: u64,
}

/// A periodic or parameterized job's children by status (`JobChildrenSummary`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct JobChildrenSummary {
    pub pending: u64,
    pub running: u64,
    pub dead: u64,
}

/// `GET /v1/job/:id/scale` (`JobScaleStatusResponse`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct JobScaleStatusResponse {
    #[serde(rename = "JobID")]
    pub job_id: String,
    pub namespace: String,
    pub job_create_index: u64,
    pub job_modify_index: u64,
    pub job_stopped: bool,
    pub task_groups: BTreeMap<String, TaskGroupScaleStatus>,
}

/// One group's scale status (`TaskGroupScaleStatus`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct TaskGroupScaleStatus {
    pub desired: u64,
    pub placed: u64,
    pub running: u64,
    pub healthy: u64,
    pub unhealthy: u64,
    /// Always `null`: Drover records no scaling events.
    pub events: Option<Value>,
}

/// `PUT /v1/job/:id/scale` body (`ScalingRequest`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ScalingRequest {
    /// The group's new count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<i64>,
    /// `{"Group": name}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<BTreeMap<String, String>>,
    /// Why, for the log.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `PUT|POST /v1/jobs/parse` body (`JobsParseRequest`): a job file's text,
/// answered with the job in Nomad's JSON.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct JobsParseRequest {
    /// The job file (HCL2).
    #[serde(rename = "JobHCL")]
    pub job_hcl: String,
    /// Read the file as HCL1 (Drover reads HCL2 only).
    #[serde(rename = "HCLv1")]
    pub hcl_v1: bool,
    /// Values for the file's `variable`s (Drover's reader takes none).
    pub variables: String,
    /// Fill in every default (Drover answers the job as written).
    pub canonicalize: bool,
}

/// The answer to a job register, scale or evaluate (`JobRegisterResponse`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct JobRegisterResponse {
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    pub eval_create_index: u64,
    pub job_modify_index: u64,
    /// The fields Drover ignored, one per line.
    pub warnings: String,
    #[serde(flatten)]
    pub meta: WriteMeta,
}

/// The answer to a job stop (`JobDeregisterResponse`); `EvalID` is empty
/// when there was no such job.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct JobDeregisterResponse {
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    pub eval_create_index: u64,
    pub job_modify_index: u64,
    #[serde(rename = "VolumeEvalID")]
    pub volume_eval_id: String,
    pub volume_eval_index: u64,
    #[serde(flatten)]
    pub meta: WriteMeta,
}

/// `GET /v1/job/:id/versions` (`JobVersionsResponse`): the kept versions,
/// newest first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct JobVersionsResponse {
    /// Each kept version, as `GET /v1/job/:id` answers a job.
    pub versions: Vec<Job>,
    /// With `?diffs=true`, the diff from each version to the one before it
    /// in the list (`Diffs[i]`: from `Versions[i+1]` to `Versions[i]`);
    /// else `null`.
    pub diffs: Option<Vec<super::job_diff::JobDiff>>,
    /// The read's meta (Nomad's `QueryMeta`: the same three fields).
    #[serde(flatten)]
    pub meta: WriteMeta,
}

/// `PUT|POST /v1/job/:id/revert` body (`JobRevertRequest`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct JobRevertRequest {
    /// The job; must be the path's.
    #[serde(rename = "JobID")]
    pub job_id: String,
    /// The kept version to register again.
    pub job_version: u64,
    /// Revert only if the job is at this version now.
    pub enforce_prior_version: Option<u64>,
}

/// `PUT|POST /v1/job/:id/stable` body (`JobStabilityRequest`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct JobStabilityRequest {
    /// The job; must be the path's.
    #[serde(rename = "JobID")]
    pub job_id: String,
    /// The kept version to mark.
    pub job_version: u64,
    /// Whether it is stable.
    pub stable: bool,
}

/// The answer to `/v1/job/:id/stable` (`JobStabilityResponse`: Nomad's
/// server answers its write meta only, `{"Index": n}`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct JobStabilityResponse {
    /// The index of the write.
    pub index: u64,
}
