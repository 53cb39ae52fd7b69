//! Allocations (Nomad's `api/allocations.go`): the list stub, the full
//! allocation with its job and resources, and its tasks' states.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::evaluations::AllocationMetric;
use super::format::{rfc3339, rfc3339_or_none};
use super::jobs::Job;
use super::resources::{CpuResources, MemoryResources, NetworkResource, PortMapping, Resources};
use super::{id_or_empty, word};

/// An allocation in lists (`AllocationListStub`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct AllocationListStub {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    pub name: String,
    pub namespace: String,
    #[serde(rename = "NodeID")]
    pub node_id: String,
    pub node_name: String,
    #[serde(rename = "JobID")]
    pub job_id: String,
    pub job_type: String,
    pub job_version: u64,
    pub task_group: String,
    pub desired_status: String,
    pub desired_description: String,
    pub client_status: String,
    pub client_description: String,
    pub desired_transition: DesiredTransition,
    /// Each task's state as its client reported it.
    pub task_states: BTreeMap<String, TaskState>,
    /// Its health once its client decided it; `null` before.
    pub deployment_status: Option<AllocDeploymentStatus>,
    #[serde(rename = "FollowupEvalID")]
    pub followup_eval_id: String,
    /// `null` until it is a replacement.
    pub reschedule_tracker: Option<RescheduleTracker>,
    pub preempted_allocations: Vec<String>,
    pub preempted_by_allocation: String,
    pub create_index: u64,
    pub modify_index: u64,
    /// Unix nanoseconds.
    pub create_time: u64,
    /// Unix nanoseconds.
    pub modify_time: u64,
}

/// A full allocation (`GET /v1/allocation/:id`, `GET /v1/node/:id/allocations`):
/// the stub's fields, its job and its resources in the views Nomad 1.0 fills.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct Allocation {
    #[serde(flatten)]
    pub stub: AllocationListStub,
    pub job: Job,
    pub resources: Resources,
    pub shared_resources: SharedResources,
    pub task_resources: BTreeMap<String, Resources>,
    pub allocated_resources: AllocatedResources,
    pub metrics: AllocationMetric,
    pub alloc_modify_index: u64,
    pub previous_allocation: String,
    pub next_allocation: String,
    #[serde(rename = "DeploymentID")]
    pub deployment_id: String,
}

/// What the servers want of an allocation beyond its desired status
/// (`DesiredTransition`): Drover sets none.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct DesiredTransition {
    pub migrate: Option<bool>,
    pub reschedule: Option<bool>,
    pub force_reschedule: Option<bool>,
}

/// One task's state (`TaskState`); times RFC 3339, `null` when unset.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct TaskState {
    /// `pending`, `running` or `dead`.
    pub state: String,
    pub failed: bool,
    pub restarts: u64,
    pub last_restart: Option<String>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub events: Vec<TaskEvent>,
}

/// One event in a task's life (`TaskEvent`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct TaskEvent {
    #[serde(rename = "Type")]
    pub event_type: String,
    /// Unix nanoseconds.
    pub time: u64,
    pub display_message: String,
    pub message: String,
    pub details: BTreeMap<String, String>,
    pub exit_code: i64,
    pub signal: i64,
    pub fails_task: bool,
}

/// The reschedules that led to an allocation (`RescheduleTracker`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct RescheduleTracker {
    pub events: Vec<RescheduleEvent>,
}

/// One reschedule (`RescheduleEvent`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct RescheduleEvent {
    /// Unix nanoseconds.
    pub reschedule_time: u64,
    #[serde(rename = "PrevAllocID")]
    pub prev_alloc_id: String,
    #[serde(rename = "PrevNodeID")]
    pub prev_node_id: String,
    /// Nanoseconds.
    pub delay: u64,
}

/// `Allocation.SharedResources` (Nomad 1.0's older view): the group's
/// disk, and the network it was given.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct SharedResources {
    #[serde(rename = "DiskMB")]
    pub disk_mb: u64,
    /// `null` when the allocation holds no port.
    #[serde(rename = "Networks")]
    pub networks: Option<Vec<NetworkResource>>,
}

/// `AllocatedResources`: per task, and what the group shares.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct AllocatedResources {
    pub tasks: BTreeMap<String, AllocatedTaskResources>,
    pub task_lifecycles: Option<Value>,
    pub shared: AllocatedSharedResources,
}

/// One task's allocated resources (`AllocatedTaskResources`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct AllocatedTaskResources {
    pub cpu: CpuResources,
    pub memory: MemoryResources,
    pub networks: Option<Value>,
    pub devices: Option<Value>,
}

/// What an allocation's tasks share (`AllocatedSharedResources`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[allow(missing_docs)]
pub struct AllocatedSharedResources {
    /// The network the allocation was given: one, with the node's address
    /// and its ports (what `nomad alloc status` prints as its addresses);
    /// `null` when it holds no port.
    #[serde(rename = "Networks")]
    pub networks: Option<Vec<NetworkResource>>,
    #[serde(rename = "DiskMB")]
    pub disk_mb: u64,
    /// The host ports it holds.
    #[serde(rename = "Ports")]
    pub ports: Vec<PortMapping>,
}

impl From<&engine::structs::TaskState> for TaskState {
    fn from(state: &engine::structs::TaskState) -> Self {
        let time = |at: Option<engine::clock::Timestamp>| at.and_then(rfc3339_or_none);
        let events = state
            .events
            .iter()
            .map(|event| TaskEvent {
                event_type: event.event_type.clone(),
                time: event.time.0,
                display_message: event.display_message.clone(),
                message: event.display_message.clone(),
                details: event.details.clone(),
                exit_code: event.exit_code.unwrap_or(0),
                signal: i64::from(event.signal.unwrap_or(0)),
                fails_task: (event.event_type == engine::structs::TaskEvent::NOT_RESTARTING && state.failed)
                    || event.details.get("fails_task").is_some_and(|fails| fails == "true"),
            })
            .collect();
        TaskState {
            state: word(state.state),
            failed: state.failed,
            restarts: state.restarts,
            last_restart: time(state.last_restart),
            started_at: time(state.started_at),
            finished_at: time(state.finished_at),
            events,
        }
    }
}

impl AllocationListStub {
    /// The stub of `alloc`, which runs on the node named `node_name`.
    pub fn new(alloc: &engine::structs::Allocation, node_name: String) -> AllocationListStub {
        let reschedule_tracker = (!alloc.reschedule_events.is_empty()).then(|| RescheduleTracker {
            events: alloc
                .reschedule_events
                .iter()
                .map(|event| RescheduleEvent {
                    reschedule_time: event.time.0,
                    prev_alloc_id: event.prev_alloc_id.to_string(),
                    prev_node_id: event.prev_node_id.to_string(),
                    delay: event.delay_nanos,
                })
                .collect(),
        });
        AllocationListStub {
            id: alloc.id.to_string(),
            eval_id: alloc.eval_id.to_string(),
            name: alloc.name.clone(),
            namespace: alloc.namespace.to_string(),
            node_id: alloc.node_id.to_string(),
            node_name,
            job_id: alloc.job_id.to_string(),
            job_type: word(alloc.job.job_type),
            job_version: alloc.job.version,
            task_group: alloc.task_group.to_string(),
            desired_status: word(alloc.desired_status),
            desired_description: alloc.desired_description.clone(),
            client_status: word(alloc.client_status),
            client_description: alloc.client_description.clone(),
            desired_transition: DesiredTransition::default(),
            task_states: alloc.task_states.iter().map(|(name, state)| (name.clone(), TaskState::from(state))).collect(),
            deployment_status: AllocDeploymentStatus::of(alloc),
            followup_eval_id: id_or_empty(alloc.follow_up_eval_id),
            reschedule_tracker,
            preempted_allocations: alloc.preempted_allocations.iter().map(|id| id.to_string()).collect(),
            preempted_by_allocation: id_or_empty(alloc.preempted_by_allocation),
            create_index: alloc.create_index,
            modify_index: alloc.modify_index,
            create_time: alloc.create_time.0,
            modify_time: alloc.modify_time.0,
        }
    }
}

impl Allocation {
    /// The full allocation: its stub, and `job`, its job as answered.
    pub fn new(alloc: &engine::structs::Allocation, stub: AllocationListStub, job: Job) -> Allocation {
        let tasks = alloc.job.group(&alloc.task_group).map(|group| group.tasks.as_slice()).unwrap_or_default();
        let networks = NetworkResource::allocated(alloc).map(|network| vec![network]);
        Allocation {
            stub,
            job,
            resources: Resources { networks: networks.clone(), ..Resources::from(alloc.resources) },
            shared_resources: SharedResources { disk_mb: alloc.resources.disk_mb, networks: networks.clone() },
            task_resources: tasks.iter().map(|task| (task.name.clone(), Resources::of_task(task))).collect(),
            allocated_resources: AllocatedResources {
                tasks: tasks
                    .iter()
                    .map(|task| {
                        let resources = AllocatedTaskResources {
                            cpu: CpuResources { cpu_shares: task.resources.cpu },
                            memory: MemoryResources { memory_mb: task.resources.memory_mb },
                            networks: None,
                            devices: None,
                        };
                        (task.name.clone(), resources)
                    })
                    .collect(),
                task_lifecycles: None,
                shared: AllocatedSharedResources {
                    networks,
                    disk_mb: alloc.resources.disk_mb,
                    ports: alloc.ports.iter().map(PortMapping::from).collect(),
                },
            },
            metrics: AllocationMetric::default(),
            alloc_modify_index: alloc.modify_index,
            previous_allocation: id_or_empty(alloc.previous_allocation),
            next_allocation: id_or_empty(alloc.next_allocation),
            deployment_id: id_or_empty(alloc.deployment_id),
        }
    }
}

/// An allocation's health (`AllocDeploymentStatus`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct AllocDeploymentStatus {
    /// Healthy or not; `null` while undecided.
    pub healthy: Option<bool>,
    /// When its client decided (RFC 3339).
    pub timestamp: String,
    /// Whether it is a canary of its deployment, not yet promoted.
    pub canary: bool,
    /// The index at which the verdict was stored.
    pub modify_index: u64,
}

impl AllocDeploymentStatus {
    /// An allocation's status in its deployment: `None` (Nomad's `null`)
    /// until its health is decided or it is placed as a canary; a canary
    /// without a verdict has `"Healthy": null` and Go's zero time.
    pub fn of(alloc: &engine::structs::Allocation) -> Option<AllocDeploymentStatus> {
        if alloc.health.is_none() && !alloc.canary {
            return None;
        }
        let health = alloc.health.as_ref();
        Some(AllocDeploymentStatus {
            healthy: health.map(|health| health.healthy),
            timestamp: health.map_or_else(|| super::deployments::ZERO_TIME.to_string(), |h| rfc3339(h.timestamp)),
            canary: alloc.canary,
            modify_index: health.map_or(0, |health| health.modify_index),
        })
    }
}

/// One check's latest result (`GET /v1/client/allocation/:id/checks`,
/// Nomad's `CheckQueryResult`), in an object keyed by its `ID`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct CheckQueryResult {
    /// The check's id.
    #[serde(rename = "ID")]
    pub id: String,
    /// The check's name.
    pub check: String,
    /// `<job>.<group>`.
    pub group: String,
    /// `healthiness` or `readiness`.
    pub mode: String,
    /// What its last status-setting run said.
    pub output: String,
    /// The service's name.
    pub service: String,
    /// `success`, `failure` or `pending`.
    pub status: String,
    /// An `http` check's status code; left out otherwise, as Nomad.
    #[serde(skip_serializing_if = "is_zero")]
    pub status_code: u16,
    /// The task of a task's service; left out for a group's, as Nomad.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub task: String,
    /// When the status was set: Unix seconds.
    pub timestamp: i64,
}

fn is_zero(code: &u16) -> bool {
    *code == 0
}

impl From<&engine::structs::CheckResult> for CheckQueryResult {
    fn from(result: &engine::structs::CheckResult) -> CheckQueryResult {
        CheckQueryResult {
            id: result.id.clone(),
            check: result.check.clone(),
            group: result.group.clone(),
            mode: match result.mode {
                engine::structs::CheckMode::Healthiness => "healthiness",
                engine::structs::CheckMode::Readiness => "readiness",
            }
            .to_string(),
            output: result.output.clone(),
            service: result.service.clone(),
            status: result.status.as_str().to_string(),
            status_code: result.status_code,
            task: result.task.clone(),
            timestamp: i64::try_from(result.timestamp.0 / 1_000_000_000).unwrap_or(i64::MAX),
        }
    }
}

/// `PUT /v1/allocation/:id/stop`'s answer (`AllocStopResponse`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct AllocStopResponse {
    /// The eval that places its replacement.
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    /// The index of the write.
    pub index: u64,
}

/// `PUT /v1/client/allocation/:id/restart`'s body (`AllocRestartRequest`);
/// none restarts every running task.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct AllocRestartRequest {
    /// The task (none or empty: every running task).
    pub task_name: Option<String>,
    /// Every task, Nomad's flag; the same as no task here.
    pub all_tasks: Option<bool>,
}

/// `PUT /v1/client/allocation/:id/signal`'s body (`AllocSignalRequest`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct AllocSignalRequest {
    /// The task (none or empty: every running task; python-nomad sends `null`).
    pub task: Option<String>,
    /// The signal (`SIGUSR1`; `USR1` is read the same).
    pub signal: Option<String>,
}

/// What a client operation answers that has nothing to say
/// (`GenericResponse`): `{"Index": 0}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct GenericResponse {
    /// Always 0: the agent wrote no state.
    pub index: u64,
}
