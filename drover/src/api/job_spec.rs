//! The job a client submits in Nomad's JSON (`{"Job": {...}}`, as the
//! `nomad` CLI and python-nomad send it, and as `hcl.rs` reads a job
//! file), read leniently as Go's decoder reads it, and turned into Drover's
//! job with Nomad's defaults (`docs/nomad-http-api.md`, "Reading a submitted job");
//! every field Drover does not implement is named in a warning. The
//! server's register, `drover job validate` and `drover dev --job` all
//! convert through [`convert_job`], so a file is read the same everywhere.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use engine::structs::{
    Affinity, ConfigValue, Constraint, ConstraintOperand, DelayFunction, DockerConfig, Job, JobType, LogConfig,
    NetworkResource, Port, ReconcileStrategy, ReschedulePolicy, Resources, RestartMode, RestartPolicy, Spread,
    SpreadTarget, Task, TaskGroup, UpdateStrategy, DOCKER,
};
use engine::structs::{HealthCheckMode, HealthPolicy, MigrateStrategy};
use serde::Deserialize;
use serde_json::Value;

use super::periodic::{DispatchPayloadSpec, ParameterizedSpec, PeriodicSpec};
use super::service_spec::{convert_services, ServiceOwner, ServiceSpec};
pub use super::spec::JobSpecError;
use super::spec::{is_set, says_something};
use super::template_spec::{convert_templates, TemplateSpec};
use super::{EveryNamespace, REGION};

/// Nomad's default task resources, for what a task leaves out.
const DEFAULT_CPU: u64 = 100;
const DEFAULT_MEMORY_MB: u64 = 300;
/// Nomad's default ephemeral disk of a group.
const DEFAULT_DISK_MB: u64 = 300;

// ---------------------------------------------------------------------------
// What clients submit. Every field is optional: `null` and absent both mean
// "the default"; unknown fields are ignored (serde's default), as Go's
// decoder does, since clients of newer Nomad versions send fields 1.0 lacks.
// ---------------------------------------------------------------------------

/// `PUT /v1/jobs` and `PUT /v1/job/:id` bodies.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct JobRegisterRequest {
    /// The job.
    pub job: Option<JobSpec>,
    /// Namespace, when the query does not name one.
    pub namespace: Option<String>,
    /// Region (only `global`).
    pub region: Option<String>,
    /// `job run -check-index`: register only if the job's modify index is `job_modify_index`.
    pub enforce_index: Option<bool>,
    /// See `enforce_index`.
    pub job_modify_index: Option<u64>,
}

/// A submitted job (`api.Job`).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct JobSpec {
    pub region: Option<String>,
    pub namespace: Option<String>,
    #[serde(rename = "ID")]
    pub id: Option<String>,
    pub name: Option<String>,
    #[serde(rename = "Type")]
    pub job_type: Option<String>,
    pub priority: Option<i64>,
    pub datacenters: Option<Vec<String>>,
    pub constraints: Option<Vec<ConstraintSpec>>,
    pub task_groups: Option<Vec<TaskGroupSpec>>,
    pub update: Option<UpdateSpec>,
    pub reschedule: Option<RescheduleSpec>,
    pub stop: Option<bool>,
    pub all_at_once: Option<bool>,
    pub meta: Option<BTreeMap<String, String>>,
    pub affinities: Option<Vec<AffinitySpec>>,
    pub spreads: Option<Vec<SpreadSpec>>,
    pub multiregion: Option<Value>,
    pub periodic: Option<PeriodicSpec>,
    pub parameterized_job: Option<ParameterizedSpec>,
    pub dispatched: Option<bool>,
    pub migrate: Option<MigrateSpec>,
    pub payload: Option<Value>,
    #[serde(rename = "UI")]
    pub ui: Option<Value>,
    pub node_pool: Option<String>,
    /// Fields Drover does not know: warned of when set.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A constraint (`api.Constraint`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct ConstraintSpec {
    #[serde(rename = "LTarget")]
    pub l_target: Option<String>,
    #[serde(rename = "RTarget")]
    pub r_target: Option<String>,
    #[serde(rename = "Operand")]
    pub operand: Option<String>,
}

/// A task group (`api.TaskGroup`).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct TaskGroupSpec {
    pub name: Option<String>,
    pub count: Option<i64>,
    pub constraints: Option<Vec<ConstraintSpec>>,
    pub tasks: Option<Vec<TaskSpec>>,
    pub restart_policy: Option<RestartSpec>,
    pub reschedule_policy: Option<RescheduleSpec>,
    pub update: Option<UpdateSpec>,
    pub ephemeral_disk: Option<EphemeralDiskSpec>,
    pub max_client_disconnect: Option<i64>,
    pub stop_after_client_disconnect: Option<i64>,
    pub disconnect: Option<DisconnectSpec>,
    pub meta: Option<BTreeMap<String, String>>,
    pub affinities: Option<Vec<AffinitySpec>>,
    pub spreads: Option<Vec<SpreadSpec>>,
    pub volumes: Option<Value>,
    pub migrate: Option<MigrateSpec>,
    pub networks: Option<Vec<NetworkSpec>>,
    pub services: Option<Vec<ServiceSpec>>,
    pub scaling: Option<Value>,
    pub consul: Option<Value>,
    pub shutdown_delay: Option<i64>,
    pub prevent_reschedule_on_lost: Option<bool>,
    /// Fields Drover does not know: warned of when set.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A task (`api.Task`).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct TaskSpec {
    pub name: Option<String>,
    pub driver: Option<String>,
    pub config: Option<BTreeMap<String, Value>>,
    pub constraints: Option<Vec<ConstraintSpec>>,
    pub resources: Option<ResourcesSpec>,
    pub restart_policy: Option<RestartSpec>,
    pub user: Option<String>,
    pub env: Option<BTreeMap<String, String>>,
    pub meta: Option<BTreeMap<String, String>>,
    pub kill_timeout: Option<i64>,
    pub kill_signal: Option<String>,
    pub log_config: Option<Value>,
    pub affinities: Option<Vec<AffinitySpec>>,
    pub services: Option<Vec<ServiceSpec>>,
    pub vault: Option<Value>,
    pub templates: Option<Vec<TemplateSpec>>,
    pub artifacts: Option<Value>,
    pub lifecycle: Option<Value>,
    pub volume_mounts: Option<Value>,
    pub dispatch_payload: Option<DispatchPayloadSpec>,
    pub scaling_policies: Option<Value>,
    pub leader: Option<bool>,
    #[serde(rename = "CSIPluginConfig")]
    pub csi_plugin_config: Option<Value>,
    pub identity: Option<Value>,
    pub identities: Option<Value>,
    pub consul: Option<Value>,
    pub actions: Option<Value>,
    pub shutdown_delay: Option<i64>,
    pub kind: Option<String>,
    /// Fields Drover does not know: warned of when set.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// An affinity (`api.Affinity`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct AffinitySpec {
    #[serde(rename = "LTarget")]
    pub l_target: Option<String>,
    #[serde(rename = "RTarget")]
    pub r_target: Option<String>,
    #[serde(rename = "Operand")]
    pub operand: Option<String>,
    #[serde(rename = "Weight")]
    pub weight: Option<i64>,
}

/// A spread (`api.Spread`).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct SpreadSpec {
    pub attribute: Option<String>,
    pub weight: Option<i64>,
    pub spread_target: Option<Vec<SpreadTargetSpec>>,
}

/// A spread target (`api.SpreadTarget`).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct SpreadTargetSpec {
    pub value: Option<String>,
    pub percent: Option<i64>,
}

/// A group network (`api.NetworkResource`): Drover keeps its ports.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct NetworkSpec {
    pub mode: Option<String>,
    pub reserved_ports: Option<Vec<PortSpec>>,
    pub dynamic_ports: Option<Vec<PortSpec>>,
    #[serde(rename = "MBits")]
    pub mbits: Option<i64>,
    /// Fields Drover does not know: warned of when set.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A port (`api.Port`).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct PortSpec {
    pub label: Option<String>,
    pub value: Option<i64>,
    pub to: Option<i64>,
    /// The client's host network the port is on; `""` and `"default"`:
    /// the node's own address.
    pub host_network: Option<String>,
    /// Fields Drover does not know: warned of when set.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// Task resources (`api.Resources`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct ResourcesSpec {
    #[serde(rename = "CPU")]
    pub cpu: Option<i64>,
    #[serde(rename = "MemoryMB")]
    pub memory_mb: Option<i64>,
    #[serde(rename = "DiskMB")]
    pub disk_mb: Option<i64>,
    #[serde(rename = "Cores")]
    pub cores: Option<i64>,
    #[serde(rename = "MemoryMaxMB")]
    pub memory_max_mb: Option<i64>,
    #[serde(rename = "Networks")]
    pub networks: Option<Value>,
    #[serde(rename = "Devices")]
    pub devices: Option<Value>,
    /// Fields Drover does not know: warned of when set.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// `RestartPolicy`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct RestartSpec {
    pub attempts: Option<i64>,
    pub interval: Option<i64>,
    pub delay: Option<i64>,
    pub mode: Option<String>,
    /// Fields Drover does not know: warned of when set.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// `Reschedule` / `ReschedulePolicy`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct RescheduleSpec {
    pub attempts: Option<i64>,
    pub interval: Option<i64>,
    pub delay: Option<i64>,
    pub delay_function: Option<String>,
    pub max_delay: Option<i64>,
    pub unlimited: Option<bool>,
    /// Fields Drover does not know: warned of when set.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// `Update`: every field honoured; a group's fields override its job's,
/// and a service job without any gets Nomad's defaults (deployments).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct UpdateSpec {
    pub max_parallel: Option<i64>,
    pub stagger: Option<i64>,
    pub health_check: Option<String>,
    pub min_healthy_time: Option<i64>,
    pub healthy_deadline: Option<i64>,
    pub progress_deadline: Option<i64>,
    pub auto_revert: Option<bool>,
    pub auto_promote: Option<bool>,
    pub canary: Option<i64>,
    /// Fields Drover does not know: warned of when set.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A `migrate` block (`api.MigrateStrategy`).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct MigrateSpec {
    pub max_parallel: Option<i64>,
    pub health_check: Option<String>,
    pub min_healthy_time: Option<i64>,
    pub healthy_deadline: Option<i64>,
    /// Fields Drover does not know: warned of when set.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// `EphemeralDisk`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct EphemeralDiskSpec {
    #[serde(rename = "SizeMB")]
    pub size_mb: Option<i64>,
    pub sticky: Option<bool>,
    pub migrate: Option<bool>,
    /// Fields Drover does not know: warned of when set.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// Nomad 1.8's `Disconnect`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct DisconnectSpec {
    pub lost_after: Option<i64>,
    pub stop_on_client_after: Option<i64>,
    pub replace: Option<bool>,
    pub reconcile: Option<String>,
    /// Fields Drover does not know: warned of when set.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A submitted job turned into Drover's, with Nomad's defaults, and the
/// fields it carried that Drover does not implement.
#[derive(Debug)]
pub struct Converted {
    /// The job to register.
    pub job: Job,
    /// One line per field Drover ignored.
    pub warnings: Vec<String>,
}

/// Collects the warnings for fields Drover ignores.
struct Ignored<'a> {
    warnings: &'a mut Vec<String>,
}

impl Ignored<'_> {
    fn check(&mut self, place: &str, field: &str, value: &Option<Value>) {
        if is_set(value) {
            self.warnings.push(format!("{place}{field} is not implemented by Drover and was ignored"));
        }
    }

    /// Warns of every field of `other` (those Drover does not know) that is
    /// set, but for `read_back`: the fields a job read from the API carries
    /// that the servers set (`Status`, `Version`, ...), which a resubmitted
    /// job brings back.
    fn unknown(&mut self, place: &str, other: &BTreeMap<String, Value>, read_back: &[&str]) {
        for (field, value) in other {
            if !read_back.contains(&field.as_str()) && says_something(value) {
                self.warnings.push(format!("{place}{field} is not known to Drover and was ignored"));
            }
        }
    }
}

/// The fields of a job the servers set, which come back when a job read
/// from `GET /v1/job/:id` is submitted again.
const JOB_READ_BACK: [&str; 13] = [
    "ParentID",
    "ConsulToken",
    "VaultToken",
    "VaultNamespace",
    "NomadTokenID",
    "Status",
    "StatusDescription",
    "Stable",
    "Version",
    "SubmitTime",
    "CreateIndex",
    "ModifyIndex",
    "JobModifyIndex",
];

/// Refuses a job that sets `value`: a block whose meaning Drover does not
/// implement yet, and without which the job would run differently rather
/// than merely lack a feature.
fn refuse_if_set(field: &str, value: &Option<Value>, why: &str) -> Result<(), JobSpecError> {
    match is_set(value) {
        true => Err(JobSpecError(format!("{field} is refused: {why}; nothing was registered"))),
        false => Ok(()),
    }
}

/// Converts a submitted job (`namespace` from the query wins over the body's).
pub fn convert_job(api: JobSpec, query_namespace: Option<&str>) -> Result<Converted, JobSpecError> {
    let mut warnings = Vec::new();
    let id = api.id.clone().unwrap_or_default();
    if id.is_empty() {
        return Err(JobSpecError("Job ID hasn't been provided".to_string()));
    }
    if let Some(region) = api.region.as_deref().filter(|region| !region.is_empty() && *region != REGION) {
        return Err(JobSpecError(format!("No path to region {region:?}: Drover serves only {REGION:?}")));
    }
    let job_type = match api.job_type.as_deref().unwrap_or("service") {
        "" | "service" => JobType::Service,
        "batch" => JobType::Batch,
        "system" => JobType::System,
        "sysbatch" => JobType::Sysbatch,
        other => return Err(JobSpecError(format!("Invalid job type {other:?}"))),
    };
    let priority = api.priority.unwrap_or(50);
    let priority = u8::try_from(priority)
        .map_err(|_| JobSpecError(format!("job priority must be between 1 and 100 (got {priority})")))?;
    if let Some(pool) = api.node_pool.as_deref().filter(|pool| !["", "default", "all"].contains(pool)) {
        return Err(JobSpecError(format!(
            "Job.NodePool {pool:?} is refused: Drover has no node pools yet (every node is in \"default\"), and \
             the job would run on nodes outside the pool; nothing was registered"
        )));
    }
    if api.dispatched.unwrap_or(false) {
        return Err(JobSpecError("job can't be submitted with 'Dispatched' set".to_string()));
    }
    let periodic = api.periodic.map(PeriodicSpec::convert);
    let parameterized = api.parameterized_job.map(ParameterizedSpec::convert).transpose()?;
    let mut ignored = Ignored { warnings: &mut warnings };
    let place = "Job.";
    ignored.check(place, "Multiregion", &api.multiregion);
    if let Some(migrate) = &api.migrate {
        ignored.unknown("Job.Migrate.", &migrate.other, &[]);
    }
    ignored.check(place, "Payload", &api.payload);
    ignored.check(place, "UI", &api.ui);
    ignored.unknown(place, &api.other, &JOB_READ_BACK);
    if let Some(update) = &api.update {
        ignored.unknown("Job.Update.", &update.other, &[]);
    }
    if let Some(reschedule) = &api.reschedule {
        ignored.unknown("Job.Reschedule.", &reschedule.other, &[]);
    }
    ignored.check(place, "AllAtOnce", &api.all_at_once.map(Value::Bool));
    let constraints = convert_constraints(api.constraints.unwrap_or_default(), "job")?;
    let job_name = api.name.clone().filter(|name| !name.is_empty()).unwrap_or_else(|| id.clone());
    let mut task_groups = Vec::new();
    for group in api.task_groups.unwrap_or_default() {
        let context = GroupContext {
            job_name: &job_name,
            job_type,
            update: &api.update,
            migrate: &api.migrate,
            reschedule: &api.reschedule,
        };
        task_groups.push(convert_group(group, &context, &mut warnings)?);
    }
    let canary_groups: Vec<&UpdateStrategy> =
        task_groups.iter().filter_map(|group| group.update.as_ref()).filter(|update| update.canary > 0).collect();
    if canary_groups.iter().any(|update| update.auto_promote) && !canary_groups.iter().all(|update| update.auto_promote)
    {
        warnings.push("auto_promote must be true for all groups to enable automatic promotion".to_string());
    }
    let query_namespace = query_namespace.filter(|namespace| !namespace.is_empty());
    let body_namespace = api.namespace.filter(|namespace| !namespace.is_empty());
    for namespace in query_namespace.iter().copied().chain(body_namespace.as_deref()) {
        if namespace == "*" {
            return Err(EveryNamespace.into());
        }
    }
    let namespace = query_namespace
        .map(str::to_string)
        .or(body_namespace)
        .unwrap_or_else(|| engine::structs::DEFAULT_NAMESPACE.to_string());
    let job = Job {
        namespace: Arc::from(namespace),
        id: Arc::from(id.as_str()),
        name: job_name,
        job_type,
        priority,
        datacenters: api.datacenters.unwrap_or_default(),
        constraints,
        affinities: convert_affinities(api.affinities.unwrap_or_default(), "job")?,
        spreads: convert_spreads(api.spreads.unwrap_or_default(), "job")?,
        task_groups,
        stop: api.stop.unwrap_or(false),
        version: 0,
        stable: false,
        create_index: 0,
        modify_index: 0,
        job_modify_index: 0,
        meta: api.meta.unwrap_or_default(),
        submit_time: engine::clock::Timestamp::ZERO,
        periodic,
        parameterized,
        dispatched: false,
        parent_id: String::new(),
        payload: Vec::new(),
        dispatch_idempotency_token: String::new(),
    };
    Ok(Converted { job, warnings })
}

/// What a group's conversion needs of its job.
struct GroupContext<'a> {
    job_name: &'a str,
    job_type: JobType,
    update: &'a Option<UpdateSpec>,
    migrate: &'a Option<MigrateSpec>,
    reschedule: &'a Option<RescheduleSpec>,
}

fn convert_group(
    api: TaskGroupSpec,
    job: &GroupContext<'_>,
    warnings: &mut Vec<String>,
) -> Result<TaskGroup, JobSpecError> {
    let (job_type, job_update, job_reschedule) = (job.job_type, job.update, job.reschedule);
    let name = api.name.unwrap_or_default();
    let place = format!("TaskGroup {name:?}: ");
    let mut ignored = Ignored { warnings };
    for (field, value) in [
        ("Volumes", &api.volumes),
        ("Scaling", &api.scaling),
        ("Consul", &api.consul),
        ("PreventRescheduleOnLost", &api.prevent_reschedule_on_lost.map(Value::Bool)),
    ] {
        ignored.check(&place, field, value);
    }
    ignored.unknown(&place, &api.other, &[]);
    let nested = [
        ("Update.", api.update.as_ref().map(|spec| &spec.other)),
        ("RestartPolicy.", api.restart_policy.as_ref().map(|spec| &spec.other)),
        ("ReschedulePolicy.", api.reschedule_policy.as_ref().map(|spec| &spec.other)),
        ("EphemeralDisk.", api.ephemeral_disk.as_ref().map(|spec| &spec.other)),
        ("Disconnect.", api.disconnect.as_ref().map(|spec| &spec.other)),
    ];
    for (field, other) in nested {
        if let Some(other) = other {
            ignored.unknown(&format!("{place}{field}"), other, &[]);
        }
    }
    for network in api.networks.iter().flatten() {
        ignored.check(&place, "Networks.MBits", &network.mbits.map(Value::from));
        ignored.unknown(&format!("{place}Networks."), &network.other, &[]);
        for port in network.reserved_ports.iter().chain(&network.dynamic_ports).flatten() {
            ignored.unknown(
                &format!("{place}Networks port {:?}: ", port.label.as_deref().unwrap_or("")),
                &port.other,
                &[],
            );
        }
    }
    if let Some(disk) = &api.ephemeral_disk {
        ignored.check(&place, "EphemeralDisk.Sticky", &disk.sticky.map(Value::Bool));
        ignored.check(&place, "EphemeralDisk.Migrate", &disk.migrate.map(Value::Bool));
    }
    let count = api.count.unwrap_or(1);
    let count = u32::try_from(count).map_err(|_| JobSpecError(format!("{place}Count {count} is invalid")))?;
    let disk_mb = api.ephemeral_disk.as_ref().and_then(|disk| disk.size_mb).unwrap_or(DEFAULT_DISK_MB as i64);
    let restart = restart_policy(api.restart_policy.as_ref(), default_restart_policy(job_type), &place)?;
    let mut tasks = Vec::new();
    for (position, task) in api.tasks.unwrap_or_default().into_iter().enumerate() {
        // The group's ephemeral disk is one reservation: it goes on its first task.
        let disk = if position == 0 { non_negative(disk_mb, &place, "EphemeralDisk.SizeMB")? } else { 0 };
        let task_owner = TaskOwner { job_name: job.job_name, group: &name, place: &place };
        tasks.push(convert_task(task, disk, &restart, &task_owner, ignored.warnings)?);
    }
    let owner = ServiceOwner { job: job.job_name, group: &name, task: None, place: &place };
    let services = convert_services(api.services, &owner, ignored.warnings)?;
    let update = update_strategy(api.update.as_ref(), job_update.as_ref(), job_type, count, &place, ignored.warnings)?;
    let reschedule = match job_type.is_system_like() {
        true => None,
        false => reschedule_policy(api.reschedule_policy.as_ref().or(job_reschedule.as_ref()), job_type)?,
    };
    let disconnect = api.disconnect.unwrap_or_default();
    let reconcile = match disconnect.reconcile.as_deref() {
        None | Some("") => ReconcileStrategy::default(),
        Some(name) => ReconcileStrategy::parse(name).ok_or_else(|| {
            JobSpecError(format!(
                "{place}Disconnect.Reconcile {name:?} is not one of best_score, keep_original, keep_replacement, \
                 longest_running"
            ))
        })?,
    };
    let lost_after = disconnect.lost_after.or(api.max_client_disconnect);
    let stop_after = disconnect.stop_on_client_after.or(api.stop_after_client_disconnect);
    Ok(TaskGroup {
        name,
        count,
        constraints: convert_constraints(api.constraints.unwrap_or_default(), "group")?,
        affinities: convert_affinities(api.affinities.unwrap_or_default(), "group")?,
        spreads: convert_spreads(api.spreads.unwrap_or_default(), "group")?,
        networks: convert_networks(api.networks.unwrap_or_default(), &place)?,
        tasks,
        reschedule_policy: reschedule,
        restart_policy: restart,
        update,
        max_client_disconnect: lost_after.map(nanos).transpose()?,
        stop_after_client_disconnect: stop_after.map(nanos).transpose()?,
        replace_on_disconnect: disconnect.replace.unwrap_or(true),
        reconcile,
        meta: api.meta.unwrap_or_default(),
        services,
        shutdown_delay: api.shutdown_delay.map(nanos).transpose()?.unwrap_or_default(),
        health: health_policy(api.update.as_ref(), job_update.as_ref(), &place)?,
        migrate: migrate_strategy(api.migrate.as_ref(), job.migrate.as_ref(), job_type, &place, ignored.warnings)?,
    })
}

/// The group's `migrate` block: each field its own, else its job's, else
/// Nomad's default (service groups only: other job types refuse one).
fn migrate_strategy(
    group: Option<&MigrateSpec>,
    job: Option<&MigrateSpec>,
    job_type: JobType,
    place: &str,
    warnings: &mut Vec<String>,
) -> Result<MigrateStrategy, JobSpecError> {
    if job_type != JobType::Service {
        return match group.or(job) {
            Some(_) => Err(JobSpecError(format!("Job type {:?} does not allow migrate block", job_type.as_str()))),
            None => Ok(MigrateStrategy::default()),
        };
    }
    if let Some(group) = group {
        Ignored { warnings }.unknown(&format!("{place}Migrate."), &group.other, &[]);
    }
    let defaults = MigrateStrategy::default();
    let pick = |field: fn(&MigrateSpec) -> Option<i64>| group.and_then(field).or_else(|| job.and_then(field));
    let max_parallel = match pick(|migrate| migrate.max_parallel) {
        None => defaults.max_parallel,
        Some(value) => u32::try_from(value)
            .map_err(|_| JobSpecError(format!("{place}Migrate.MaxParallel must be 0 or more, not {value}")))?,
    };
    let check =
        group.and_then(|migrate| migrate.health_check.clone()).or_else(|| job.and_then(|m| m.health_check.clone()));
    let mode = match check.as_deref() {
        None | Some("") => defaults.health.mode,
        Some(name) => match HealthCheckMode::parse(name) {
            Some(mode) if mode != HealthCheckMode::Manual => mode,
            _ => {
                return Err(JobSpecError(format!(
                    "{place}Migrate.HealthCheck {name:?} is not one of checks or task_states"
                )))
            }
        },
    };
    let health = HealthPolicy {
        mode,
        min_healthy_time: match pick(|migrate| migrate.min_healthy_time) {
            Some(value) => nanos(value)?,
            None => defaults.health.min_healthy_time,
        },
        healthy_deadline: match pick(|migrate| migrate.healthy_deadline).filter(|nanos| *nanos != 0) {
            Some(value) => nanos(value)?,
            None => defaults.health.healthy_deadline,
        },
    };
    if health.min_healthy_time >= health.healthy_deadline {
        return Err(JobSpecError(format!(
            "{place}Migrate: MinHealthyTime ({}) must be less than HealthyDeadline ({})",
            engine::structs::format_duration(health.min_healthy_time),
            engine::structs::format_duration(health.healthy_deadline)
        )));
    }
    Ok(MigrateStrategy { max_parallel, health })
}

/// The group's `update` block: each field its own, else its job's, else
/// Nomad's default; a service job with neither gets every default (so
/// deployments), and `MaxParallel = 0` means none (replace at once).
fn update_strategy(
    group: Option<&UpdateSpec>,
    job: Option<&UpdateSpec>,
    job_type: JobType,
    count: u32,
    place: &str,
    warnings: &mut Vec<String>,
) -> Result<Option<UpdateStrategy>, JobSpecError> {
    if group.is_none() && job.is_none() && job_type != JobType::Service {
        return Ok(None);
    }
    let pick = |field: fn(&UpdateSpec) -> Option<i64>| group.and_then(field).or_else(|| job.and_then(field));
    let flag = |field: fn(&UpdateSpec) -> Option<bool>| group.and_then(field).or_else(|| job.and_then(field));
    let whole = |name: &str, value: Option<i64>, default: u32| match value {
        None => Ok(default),
        Some(value) => u32::try_from(value)
            .map_err(|_| JobSpecError(format!("{place}Update.{name} must be a whole number, not {value}"))),
    };
    let defaults = UpdateStrategy::default();
    let max_parallel = whole("MaxParallel", pick(|update| update.max_parallel), defaults.max_parallel)?;
    if max_parallel == 0 {
        return Ok(None);
    }
    let progress_deadline = match pick(|update| update.progress_deadline) {
        None => defaults.progress_deadline,
        Some(value) => nanos(value)?,
    };
    let stagger = match pick(|update| update.stagger).filter(|nanos| *nanos != 0) {
        None => defaults.stagger,
        Some(value) => nanos(value)?,
    };
    let strategy = UpdateStrategy {
        max_parallel,
        canary: whole("Canary", pick(|update| update.canary), 0)?,
        auto_revert: flag(|update| update.auto_revert).unwrap_or(false),
        auto_promote: flag(|update| update.auto_promote).unwrap_or(false),
        progress_deadline,
        stagger,
    };
    if max_parallel > count && count > 0 && !job_type.is_system_like() {
        warnings.push(format!(
            "{place}Update max parallel count is greater than task group count ({max_parallel} > {count}). A \
             destructive change would result in the simultaneous replacement of all allocations."
        ));
    }
    Ok(Some(strategy))
}

/// The group's health settings: its `Update`'s, else the job's, else
/// Nomad's defaults, field by field.
fn health_policy(
    group: Option<&UpdateSpec>,
    job: Option<&UpdateSpec>,
    place: &str,
) -> Result<HealthPolicy, JobSpecError> {
    let defaults = HealthPolicy::default();
    let pick = |field: fn(&UpdateSpec) -> Option<i64>| group.and_then(field).or_else(|| job.and_then(field));
    // 0 is Go's zero value, which a job read back carries: not set.
    let duration = |value: Option<i64>, default: Duration| match value.filter(|nanos| *nanos != 0) {
        Some(value) => nanos(value),
        None => Ok(default),
    };
    let check = group
        .and_then(|update| update.health_check.clone())
        .or_else(|| job.and_then(|update| update.health_check.clone()));
    let mode = match check.as_deref() {
        None | Some("") => defaults.mode,
        Some(name) => HealthCheckMode::parse(name).ok_or_else(|| {
            JobSpecError(format!("{place}Update.HealthCheck {name:?} is not one of checks, task_states or manual"))
        })?,
    };
    let policy = HealthPolicy {
        mode,
        // Zero is a valid minimum (healthy as soon as running), not "unset".
        min_healthy_time: match pick(|update| update.min_healthy_time) {
            Some(value) => nanos(value)?,
            None => defaults.min_healthy_time,
        },
        healthy_deadline: duration(pick(|update| update.healthy_deadline), defaults.healthy_deadline)?,
    };
    if policy.min_healthy_time >= policy.healthy_deadline {
        return Err(JobSpecError(format!(
            "{place}Update: MinHealthyTime ({}) must be less than HealthyDeadline ({})",
            engine::structs::format_duration(policy.min_healthy_time),
            engine::structs::format_duration(policy.healthy_deadline)
        )));
    }
    Ok(policy)
}

/// Where a task is: its job's and group's names, and the group's place in messages.
struct TaskOwner<'a> {
    job_name: &'a str,
    group: &'a str,
    place: &'a str,
}

fn convert_task(
    api: TaskSpec,
    disk_mb: u64,
    group_restart: &RestartPolicy,
    owner: &TaskOwner<'_>,
    warnings: &mut Vec<String>,
) -> Result<Task, JobSpecError> {
    let name = api.name.unwrap_or_default();
    let place = format!("{}Task {name:?}: ", owner.place);
    let mut ignored = Ignored { warnings };
    for (field, value) in [
        ("Vault", &api.vault),
        ("Artifacts", &api.artifacts),
        ("VolumeMounts", &api.volume_mounts),
        ("ScalingPolicies", &api.scaling_policies),
        ("Leader", &api.leader.map(Value::Bool)),
        ("CSIPluginConfig", &api.csi_plugin_config),
        ("Identity", &api.identity),
        ("Identities", &api.identities),
        ("Consul", &api.consul),
        ("Actions", &api.actions),
        ("Kind", &api.kind.clone().map(Value::String)),
    ] {
        ignored.check(&place, field, value);
    }
    ignored.unknown(&place, &api.other, &[]);
    if let Some(restart) = &api.restart_policy {
        ignored.unknown(&format!("{place}RestartPolicy."), &restart.other, &[]);
    }
    refuse_if_set(
        &format!("{place}Lifecycle"),
        &api.lifecycle,
        "Drover does not order a group's tasks yet (prestart, poststart and poststop hooks, sidecars), and \
         without it every task would start at once",
    )?;
    let resources = api.resources.unwrap_or_default();
    ignored.check(&place, "Resources.Networks", &resources.networks);
    ignored.check(&place, "Resources.Devices", &resources.devices);
    ignored.check(&place, "Resources.Cores", &resources.cores.map(Value::from));
    ignored.unknown(&format!("{place}Resources."), &resources.other, &[]);
    let cpu = non_negative(resources.cpu.unwrap_or(DEFAULT_CPU as i64), &place, "Resources.CPU")?;
    let memory = non_negative(resources.memory_mb.unwrap_or(DEFAULT_MEMORY_MB as i64), &place, "Resources.MemoryMB")?;
    // 0 (Go's zero value, as a job read back carries it) is no limit.
    let memory_max = non_negative(resources.memory_max_mb.unwrap_or(0), &place, "Resources.MemoryMaxMB")?;
    if memory_max != 0 && memory_max < memory {
        return Err(JobSpecError(format!(
            "{place}Resources: MemoryMaxMB value ({memory_max}) cannot be less than MemoryMB value ({memory})"
        )));
    }
    let mut config = BTreeMap::new();
    for (key, value) in api.config.unwrap_or_default() {
        if value.is_null() {
            continue;
        }
        let value =
            ConfigValue::deserialize(value).map_err(|error| JobSpecError(format!("{place}Config.{key}: {error}")))?;
        config.insert(key, value);
    }
    let mut task = Task::new(&name, &api.driver.unwrap_or_default(), Resources::new(cpu, memory, disk_mb));
    task.memory_max_mb = memory_max;
    if task.driver == DOCKER {
        warn_ignored_docker_keys(&config, &place, ignored.warnings);
    }
    task.constraints = convert_constraints(api.constraints.unwrap_or_default(), "task")?;
    task.affinities = convert_affinities(api.affinities.unwrap_or_default(), "task")?;
    task.config = config;
    task.env = api.env.unwrap_or_default();
    task.meta = api.meta.unwrap_or_default();
    let service_owner = ServiceOwner { job: owner.job_name, group: owner.group, task: Some(&name), place: &place };
    task.services = convert_services(api.services, &service_owner, ignored.warnings)?;
    task.templates = convert_templates(api.templates, &place, ignored.warnings)?;
    task.user = api.user.filter(|user| !user.is_empty());
    task.dispatch_payload = api.dispatch_payload.map(DispatchPayloadSpec::convert);
    if let Some(restart) = &api.restart_policy {
        // The group's own (as a job read back carries it on every task) is no policy of the task's.
        let policy = restart_policy(Some(restart), group_restart.clone(), &place)?;
        task.restart_policy = Some(policy).filter(|policy| policy != group_restart);
    }
    task.kill_signal = api.kill_signal.filter(|signal| !signal.is_empty());
    task.shutdown_delay = api.shutdown_delay.map(nanos).transpose()?.unwrap_or_default();
    if let Some(timeout) = api.kill_timeout {
        task.kill_timeout = nanos(timeout)?;
    }
    if let Some(logs) = api.log_config.filter(|logs| !logs.is_null()) {
        let field = |name: &str, default: u32| -> Result<u32, JobSpecError> {
            match logs.get(name) {
                None | Some(Value::Null) => Ok(default),
                Some(value) => value.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| {
                    JobSpecError(format!("{place}LogConfig.{name} must be a whole number (got {value})"))
                }),
            }
        };
        task.logs = LogConfig {
            max_files: field("MaxFiles", task.logs.max_files)?,
            max_file_size_mb: field("MaxFileSizeMB", task.logs.max_file_size_mb)?,
        };
    }
    Ok(task)
}

/// Warns of every key of a docker task's config that Drover does not read:
/// Nomad's keys it does not implement, and keys no docker driver has (the
/// config's problems are `Job::validate`'s to refuse).
fn warn_ignored_docker_keys(config: &BTreeMap<String, ConfigValue>, place: &str, warnings: &mut Vec<String>) {
    let (_problems, ignored) = DockerConfig::submission_problems(config);
    for (key, why) in ignored {
        warnings.push(format!("{place}config.{key} {why} and was ignored"));
    }
}

fn non_negative(value: i64, place: &str, field: &str) -> Result<u64, JobSpecError> {
    u64::try_from(value).map_err(|_| JobSpecError(format!("{place}{field} must not be negative (got {value})")))
}

/// Integer nanoseconds, as Nomad's JSON carries durations.
fn nanos(value: i64) -> Result<Duration, JobSpecError> {
    u64::try_from(value)
        .map(Duration::from_nanos)
        .map_err(|_| JobSpecError(format!("a duration must not be negative (got {value} ns)")))
}

/// A constraint or affinity operand by Nomad's name.
fn operand(text: &str, level: &str, what: &str) -> Result<ConstraintOperand, JobSpecError> {
    Ok(match text {
        "=" | "==" | "is" => ConstraintOperand::Equal,
        "!=" | "not" => ConstraintOperand::NotEqual,
        "<" => ConstraintOperand::Less,
        "<=" => ConstraintOperand::LessOrEqual,
        ">" => ConstraintOperand::Greater,
        ">=" => ConstraintOperand::GreaterOrEqual,
        "regexp" => ConstraintOperand::Regexp,
        "version" | "semver" => ConstraintOperand::Version,
        "is_set" => ConstraintOperand::IsSet,
        "is_not_set" => ConstraintOperand::IsNotSet,
        "distinct_hosts" => ConstraintOperand::DistinctHosts,
        "distinct_property" => ConstraintOperand::DistinctProperty,
        "set_contains" => ConstraintOperand::SetContains,
        "set_contains_any" => ConstraintOperand::SetContainsAny,
        "set_contains_all" => ConstraintOperand::SetContainsAll,
        "" => return Err(JobSpecError(format!("{level} {what}: Missing {what} operand"))),
        other => return Err(JobSpecError(format!("{level} {what}: operand {other:?} is not supported by Drover"))),
    })
}

fn convert_constraints(constraints: Vec<ConstraintSpec>, level: &str) -> Result<Vec<Constraint>, JobSpecError> {
    constraints
        .into_iter()
        .map(|constraint| {
            Ok(Constraint {
                operand: operand(constraint.operand.as_deref().unwrap_or(""), level, "constraint")?,
                l_target: constraint.l_target.unwrap_or_default(),
                r_target: constraint.r_target.unwrap_or_default(),
            })
        })
        .collect()
}

fn convert_affinities(affinities: Vec<AffinitySpec>, level: &str) -> Result<Vec<Affinity>, JobSpecError> {
    affinities
        .into_iter()
        .map(|affinity| {
            let weight = affinity.weight.unwrap_or(50);
            Ok(Affinity {
                operand: operand(affinity.operand.as_deref().unwrap_or("="), level, "affinity")?,
                l_target: affinity.l_target.unwrap_or_default(),
                r_target: affinity.r_target.unwrap_or_default(),
                weight: i8::try_from(weight)
                    .map_err(|_| JobSpecError(format!("{level} affinity: weight {weight} is out of range")))?,
            })
        })
        .collect()
}

fn convert_spreads(spreads: Vec<SpreadSpec>, level: &str) -> Result<Vec<Spread>, JobSpecError> {
    let percent = |value: i64| {
        u8::try_from(value).map_err(|_| JobSpecError(format!("{level} spread: percent {value} is out of range")))
    };
    spreads
        .into_iter()
        .map(|spread| {
            let weight = spread.weight.unwrap_or(50);
            let targets = spread
                .spread_target
                .unwrap_or_default()
                .into_iter()
                .map(|target| {
                    Ok(SpreadTarget {
                        value: target.value.unwrap_or_default(),
                        percent: percent(target.percent.unwrap_or(0))?,
                    })
                })
                .collect::<Result<_, JobSpecError>>()?;
            Ok(Spread {
                attribute: spread.attribute.unwrap_or_default(),
                weight: u8::try_from(weight)
                    .map_err(|_| JobSpecError(format!("{level} spread: weight {weight} is out of range")))?,
                targets,
            })
        })
        .collect()
}

fn convert_networks(networks: Vec<NetworkSpec>, place: &str) -> Result<Vec<NetworkResource>, JobSpecError> {
    let ports = |ports: Option<Vec<PortSpec>>| -> Result<Vec<Port>, JobSpecError> {
        ports
            .unwrap_or_default()
            .into_iter()
            .map(|port| {
                let number = |value: Option<i64>, field: &str| {
                    u16::try_from(value.unwrap_or(0))
                        .map_err(|_| JobSpecError(format!("{place}port {field} {value:?} is not a port number")))
                };
                let host_network = port.host_network.filter(|name| !name.is_empty() && name != "default");
                Ok(Port {
                    label: Arc::from(port.label.unwrap_or_default().as_str()),
                    value: number(port.value, "Value")?,
                    to: number(port.to, "To")?,
                    host_network: host_network.map(|name| Arc::from(name.as_str())),
                })
            })
            .collect()
    };
    networks
        .into_iter()
        .map(|network| {
            if network.mode.as_deref().is_some_and(|mode| !mode.is_empty() && mode != "host") {
                return Err(JobSpecError(format!(
                    "{place}network mode {:?} is not supported by Drover (host only)",
                    network.mode.unwrap_or_default()
                )));
            }
            Ok(NetworkResource {
                reserved_ports: ports(network.reserved_ports)?,
                dynamic_ports: ports(network.dynamic_ports)?,
            })
        })
        .collect()
}

/// Nomad's default restart policy of a job type.
fn default_restart_policy(job_type: JobType) -> RestartPolicy {
    let mut policy = RestartPolicy::default();
    if job_type.is_batch_like() {
        policy.attempts = 3;
        policy.interval = Duration::from_secs(24 * 3600);
    }
    policy
}

/// The user's fields over `base` (the type's default for a group, the
/// group's policy for a task, as Nomad merges them).
fn restart_policy(api: Option<&RestartSpec>, base: RestartPolicy, place: &str) -> Result<RestartPolicy, JobSpecError> {
    let mut policy = base;
    let Some(api) = api else { return Ok(policy) };
    if let Some(attempts) = api.attempts {
        policy.attempts = u32::try_from(attempts)
            .map_err(|_| JobSpecError(format!("{place}RestartPolicy.Attempts {attempts} is invalid")))?;
    }
    if let Some(interval) = api.interval {
        policy.interval = nanos(interval)?;
    }
    if let Some(delay) = api.delay {
        policy.delay = nanos(delay)?;
    }
    policy.mode = match api.mode.as_deref() {
        None | Some("") => policy.mode,
        Some("fail") => RestartMode::Fail,
        Some("delay") => RestartMode::Delay,
        Some(other) => return Err(JobSpecError(format!("{place}RestartPolicy.Mode {other:?} is not fail or delay"))),
    };
    Ok(policy)
}

/// The group's reschedule policy: the user's fields over the type's defaults.
fn reschedule_policy(
    api: Option<&RescheduleSpec>,
    job_type: JobType,
) -> Result<Option<ReschedulePolicy>, JobSpecError> {
    let Some(api) = api else { return Ok(None) };
    let Some(mut policy) = ReschedulePolicy::default_for(job_type) else { return Ok(None) };
    if let Some(attempts) = api.attempts {
        policy.attempts = u32::try_from(attempts)
            .map_err(|_| JobSpecError(format!("ReschedulePolicy.Attempts {attempts} is invalid")))?;
    }
    if let Some(interval) = api.interval {
        policy.interval = nanos(interval)?;
    }
    if let Some(delay) = api.delay {
        policy.delay = nanos(delay)?;
    }
    if let Some(max_delay) = api.max_delay {
        policy.max_delay = nanos(max_delay)?;
    }
    if let Some(unlimited) = api.unlimited {
        policy.unlimited = unlimited;
    }
    policy.delay_function = match api.delay_function.as_deref() {
        None | Some("") => policy.delay_function,
        Some("constant") => DelayFunction::Constant,
        Some("exponential") => DelayFunction::Exponential,
        Some("fibonacci") => DelayFunction::Fibonacci,
        Some(other) => return Err(JobSpecError(format!("ReschedulePolicy.DelayFunction {other:?} is not known"))),
    };
    Ok(Some(policy))
}

#[cfg(test)]
#[path = "job_spec_test.rs"]
mod job_spec_test;
