//! Commands: every write to the state, as plain serializable data.
//!
//! A command carries everything its effect depends on, the time included,
//! so applying the same commands in the same order always yields the same
//! state. That is what a write-ahead log, and later Raft, replicate.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::gc::Collection;
use crate::clock::Timestamp;
use crate::structs::{
    AclPolicy, AclToken, AllocHealth, AllocId, Allocation, CheckResult, ClientStatus, Deployment, DeploymentId,
    DeploymentStatusUpdate, DrainStrategy, EvalId, Evaluation, Job, JobKey, Namespace, Node, NodeEligibility, NodeId,
    NodeStatus, PlanResult, SchedulerConfiguration, ServiceRegistration, TaskState, TriggerReason,
};

/// One write to the state store.
// A command is made once per write and moved into the log whole: the size
// of its largest variant (a job with its eval) costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// Register a node or update its information. The status is taken only
    /// when the node is new; a known node keeps its status (the reconnect
    /// protocol, `docs/node-lifecycle.md`).
    UpsertNode {
        /// The node as the client describes it.
        node: Node,
        /// Evals the registration needs (a new ready node: every system job).
        evals: Vec<Evaluation>,
    },
    /// Change a node's status, with the evals the change needs.
    UpdateNodeStatus {
        /// The node.
        node_id: NodeId,
        /// Its new status.
        status: NodeStatus,
        /// Evals created by the change.
        evals: Vec<Evaluation>,
        /// When: the node's `status_updated_at` when its status changes.
        time: Timestamp,
    },
    /// A live (ready or initializing) node missed its heartbeat. The writer
    /// marks it `disconnected` when the storm guard holds it (`release_at`)
    /// or any of its live allocations' groups has `max_client_disconnect`,
    /// else `down`, and records this command's index as its last missed
    /// heartbeat. Refused for a node that is already down or disconnected.
    MissHeartbeat {
        /// The node.
        node_id: NodeId,
        /// Evals for the jobs with allocations on the node.
        evals: Vec<Evaluation>,
        /// When: the node's `status_updated_at`.
        time: Timestamp,
        /// Held by the storm guard: when its allocations' replacements may
        /// be placed ([`crate::structs::NodeHold`]).
        release_at: Option<Timestamp>,
    },
    /// Mark a node eligible or ineligible for new placements.
    UpdateNodeEligibility {
        /// The node.
        node_id: NodeId,
        /// Its new eligibility.
        eligibility: NodeEligibility,
        /// Evals created by the change.
        evals: Vec<Evaluation>,
    },
    /// Start, change or end a node's drain (Nomad's `Node.UpdateDrain`), or
    /// record that it completed. A drain makes the node ineligible; an
    /// operator ending one (`drain: None`) makes it eligible again when
    /// `mark_eligible`; a completed drain (`complete`, the drainer's: the
    /// node holds nothing more to move) leaves it ineligible. The node's
    /// `last` drain record follows. Refused for an unknown node, and a
    /// completion of a node that no longer drains.
    UpdateNodeDrain {
        /// The node.
        node_id: NodeId,
        /// The drain from now on (`None`: it ends).
        drain: Option<DrainStrategy>,
        /// Whether the node becomes eligible as its drain ends.
        mark_eligible: bool,
        /// Whether the drain ends because it completed.
        complete: bool,
        /// What the operator attaches to the drain's record.
        meta: BTreeMap<String, String>,
        /// The ACL token accessor that changed it (empty without ACLs).
        accessor_id: String,
        /// Evals created by the change.
        evals: Vec<Evaluation>,
        /// When.
        time: Timestamp,
    },
    /// Register or update a job, and its eval, atomically.
    RegisterJob {
        /// The job as submitted; version and indexes are set by the store.
        job: Job,
        /// The eval that schedules it (none for a no-op resubmission).
        eval: Option<Evaluation>,
    },
    /// Stop a job, or remove it entirely with `purge`.
    DeregisterJob {
        /// The job.
        job: JobKey,
        /// Remove the job instead of marking it stopped.
        purge: bool,
        /// The eval that stops its allocations.
        eval: Option<Evaluation>,
    },
    /// Create or update evals (status changes, cancellation, follow-ups).
    UpsertEvals {
        /// The evals.
        evals: Vec<Evaluation>,
    },
    /// Client-reported allocation status changes, batched. Each update is
    /// taken or refused on its own (unknown allocation, another node's
    /// allocation, a node that is down or disconnected); refused ones are
    /// listed in [`super::Applied::refused_updates`].
    UpdateAllocsFromClient {
        /// One entry per allocation.
        updates: Vec<ClientAllocUpdate>,
        /// Evals the changes need (failed allocs to reschedule).
        evals: Vec<Evaluation>,
        /// When the server received the updates.
        time: Timestamp,
    },
    /// The committed part of a plan: new and changed allocations (stops
    /// included), and the evals the scheduler created or updated. A changed
    /// allocation keeps the client's status unless the plan marks it `lost`
    /// or `unknown` (a client report between plan and commit is not lost),
    /// and keeps the link to its replacement, which only the store sets.
    /// A new placement on a node that is no longer ready and eligible, or
    /// given a port that the node reserves or a live allocation there holds,
    /// is left out and listed in [`super::Applied::refused_placements`].
    ApplyPlanResults {
        /// The eval whose plan this is.
        eval_id: EvalId,
        /// Allocations to insert or replace.
        allocs: Vec<Allocation>,
        /// Evals to insert or replace.
        evals: Vec<Evaluation>,
        /// The job's deployment as the plan leaves it: created, or with
        /// new desired counts or status (the store keeps its own counters).
        deployment: Option<Deployment>,
        /// Status changes of other deployments.
        deployment_updates: Vec<DeploymentStatusUpdate>,
        /// When the plan was applied.
        time: Timestamp,
    },
    /// Set the operator's scheduler configuration. With `cas_index`, only
    /// if the stored configuration's modify index is that (0: none stored
    /// yet); otherwise refused with [`super::StateError::ConfigIndexMismatch`].
    SetSchedulerConfig {
        /// The configuration; its indexes are set by the store.
        config: SchedulerConfiguration,
        /// Check-and-set: the modify index the write replaces.
        cas_index: Option<u64>,
    },
    /// The first management token; refused with
    /// [`super::StateError::AclBootstrapped`] once one was written.
    AclBootstrap {
        /// The token (its indexes are set by the store).
        token: AclToken,
    },
    /// Create or replace ACL policies, by name.
    UpsertAclPolicies {
        /// The policies (their indexes are set by the store).
        policies: Vec<AclPolicy>,
    },
    /// Delete ACL policies; an unknown name refuses the whole command.
    DeleteAclPolicies {
        /// Their names.
        names: Vec<String>,
    },
    /// Create or replace ACL tokens, by accessor id; a token naming a
    /// policy that does not exist refuses the whole command.
    UpsertAclTokens {
        /// The tokens (their indexes are set by the store).
        tokens: Vec<AclToken>,
    },
    /// Revoke ACL tokens; an unknown accessor id refuses the whole command.
    DeleteAclTokens {
        /// Their accessor ids.
        accessor_ids: Vec<uuid::Uuid>,
    },
    /// Nomad's bootstrap reset: one more management token for an operator
    /// who lost theirs, allowed only when `reset_index` is the index of the
    /// last bootstrap (the operator proves it by writing that index to a
    /// file in a server's data dir); refused with
    /// [`super::StateError::AclBootstrapped`] otherwise. The tokens made
    /// before stay valid. (A new variant at the end: older logs still read.)
    AclBootstrapReset {
        /// The token (its indexes are set by the store).
        token: AclToken,
        /// The index of the bootstrap being reset.
        reset_index: u64,
    },
    /// An operator stops one allocation (Nomad's `alloc stop`): it is
    /// marked desired `stop`, and its job's eval, in the same command,
    /// places a replacement where the job's count asks for one. An
    /// allocation the servers stopped already keeps its description; the
    /// eval is written all the same. Refused for an unknown allocation.
    /// (A new variant at the end: older logs still read.)
    StopAlloc {
        /// The allocation.
        alloc_id: AllocId,
        /// The eval of its job.
        eval: Evaluation,
        /// When it was stopped.
        time: Timestamp,
    },
    /// Clients register services of their allocations (Nomad's
    /// `ServiceRegistration.Upsert`), by id: a new id is created, a known
    /// one replaced (keeping its create index), one that says what the
    /// stored row says is left alone, and when nothing changed the table
    /// index stays. Each registration is taken or left out on its own:
    /// one naming an allocation that is unknown, on another node, of
    /// another job, or stopped or ended is listed in
    /// [`super::Applied::refused_registrations`]. (New variants at the end:
    /// older logs still read.)
    UpsertServiceRegistrations {
        /// The registrations (their indexes are set by the store).
        registrations: Vec<ServiceRegistration>,
    },
    /// Remove one registration (Nomad's `DELETE /v1/service/:name/:id`, and
    /// a client's deregistration); refused with
    /// [`super::StateError::UnknownServiceRegistration`] when the namespace
    /// holds no such id.
    DeleteServiceRegistration {
        /// The namespace of the registration's job.
        namespace: String,
        /// The registration's id.
        id: String,
    },
    /// Remove every registration of these allocations (a client that
    /// stopped them, or a sweep of allocations that are gone); allocations
    /// without registrations are passed over.
    DeleteServiceRegistrationsOfAllocs {
        /// The allocations.
        alloc_ids: Vec<AllocId>,
    },
    /// Mark one kept version of a job stable, or not (Nomad's
    /// `JobStabilityRequest`): the version's entry and, when it is the
    /// job's current version, the job itself, take this command's index
    /// as their modify index; the job's version and spec do not change.
    /// Refused with [`super::StateError::UnknownJobVersion`] for a version
    /// that is not kept.
    SetJobStability {
        /// The job.
        key: JobKey,
        /// The version.
        version: u64,
        /// Whether it is stable.
        stable: bool,
    },
    /// An operator or the deployment watcher changes a deployment's status
    /// (fail, pause, resume), with the eval that acts on it and, for an
    /// automatic revert, the job version registered again. Refused for an
    /// unknown or terminal deployment.
    UpdateDeploymentStatus {
        /// The change.
        update: DeploymentStatusUpdate,
        /// A job to register with it (auto-revert).
        job: Option<Job>,
        /// The eval of the deployment's job.
        eval: Option<Evaluation>,
        /// When.
        time: Timestamp,
    },
    /// Promote a deployment's canaries: of `groups`, or of every group when
    /// empty. Refused for an unknown or terminal deployment, an unknown
    /// group, or a group whose desired canaries are not all healthy.
    PromoteDeployment {
        /// The deployment.
        deployment_id: DeploymentId,
        /// The groups; empty: all.
        groups: Vec<String>,
        /// The eval that rolls on.
        eval: Option<Evaluation>,
        /// When.
        time: Timestamp,
    },
    /// Health verdicts on allocations of a deployment (an operator's, for
    /// `health_check = "manual"`), with the status change they cause and
    /// its revert. Refused whole when an allocation is unknown or not part
    /// of the deployment, or the deployment is unknown or terminal.
    SetAllocHealth {
        /// The deployment.
        deployment_id: DeploymentId,
        /// Allocations now healthy.
        healthy: Vec<AllocId>,
        /// Allocations now unhealthy.
        unhealthy: Vec<AllocId>,
        /// The deployment's status change (failed when any is unhealthy).
        update: Option<DeploymentStatusUpdate>,
        /// A job to register with it (auto-revert).
        job: Option<Job>,
        /// The eval of the deployment's job.
        eval: Option<Evaluation>,
        /// When.
        time: Timestamp,
    },
    /// Delete what garbage collection chose (`state/gc.rs`): each object
    /// only if it is still collectable and unchanged since the snapshot
    /// it was chosen on; the others are passed over.
    GarbageCollect {
        /// What to delete.
        collection: Collection,
    },
    /// An operator deletes evaluations (Nomad's `DELETE /v1/evaluations`),
    /// whatever their status; unknown ids are passed over. Refused with
    /// [`super::StateError::EvalBrokerNotPaused`] unless the stored
    /// scheduler configuration pauses the eval broker.
    DeleteEvals {
        /// The evaluations.
        eval_ids: Vec<EvalId>,
    },
    /// Delete a node (Nomad's node deregister, `PUT /v1/node/:id/purge`):
    /// its live allocations become `lost` and the evals of their jobs, in
    /// the same command, replace them. Refused for an unknown node.
    PurgeNode {
        /// The node.
        node_id: NodeId,
        /// Evals for the jobs with allocations on the node.
        evals: Vec<Evaluation>,
        /// When.
        time: Timestamp,
    },
    /// Launch a periodic job's child (`periodic/`): the child job, its
    /// eval and the parent's launch record, in one command, so a new
    /// leader neither misses nor repeats it. Refused with
    /// [`super::StateError::NotPeriodic`] when the parent is unknown or
    /// not periodic, and, unless `force`, with
    /// [`super::StateError::LaunchedAlready`] when `launch` is not after
    /// the recorded launch. (A new variant at the end: older logs still read.)
    LaunchPeriodicJob {
        /// The parent.
        parent: JobKey,
        /// The child (`<parent>/periodic-<unix seconds of launch>`).
        child: Job,
        /// The child's eval (none when the child is itself periodic).
        eval: Option<Evaluation>,
        /// The launch time recorded for the parent.
        launch: Timestamp,
        /// An operator's force launch: taken whatever the record says.
        force: bool,
    },
    /// Create or replace namespaces, by name (each keeps its create index).
    /// Refused whole with [`super::StateError::InvalidNamespace`] when one
    /// is not a valid namespace. (New variants at the end: older logs
    /// still read.)
    UpsertNamespaces {
        /// The namespaces (their indexes are set by the store).
        namespaces: Vec<Namespace>,
    },
    /// Delete namespaces. Refused whole for `default`
    /// ([`super::StateError::DefaultNamespace`]), a namespace that does not
    /// exist, or one that still holds jobs
    /// ([`super::StateError::NamespaceInUse`]).
    DeleteNamespaces {
        /// Their names.
        names: Vec<String>,
    },
}

impl Command {
    /// A drain started (or changed) with nothing of an operator's: no
    /// meta, no accessor.
    pub fn drain_node(node_id: NodeId, drain: DrainStrategy, evals: Vec<Evaluation>, time: Timestamp) -> Command {
        Command::UpdateNodeDrain {
            node_id,
            drain: Some(drain),
            mark_eligible: false,
            complete: false,
            meta: BTreeMap::new(),
            accessor_id: String::new(),
            evals,
            time,
        }
    }

    /// The drainer's record that a node's drain completed.
    pub fn complete_drain(node_id: NodeId, time: Timestamp) -> Command {
        Command::UpdateNodeDrain {
            node_id,
            drain: None,
            mark_eligible: false,
            complete: true,
            meta: BTreeMap::new(),
            accessor_id: String::new(),
            evals: Vec::new(),
            time,
        }
    }

    /// The write of what a plan applier committed of a plan: stops and
    /// evictions first, so a replacement in the same plan links to the
    /// stopped version and takes ports the stopped ones held; and one eval
    /// per job whose allocations were evicted, so they are placed again.
    pub fn apply_plan_result(eval_id: EvalId, result: &PlanResult, time: Timestamp) -> Command {
        let allocs = result
            .node_update
            .values()
            .chain(result.node_preemptions.values())
            .chain(result.node_allocation.values())
            .flatten()
            .cloned()
            .collect();
        Command::ApplyPlanResults {
            eval_id,
            allocs,
            evals: preemption_evals(result, time),
            deployment: result.deployment.clone(),
            deployment_updates: result.deployment_updates.clone(),
            time,
        }
    }
}

/// One eval per job with evicted allocations in `result`, in job order.
fn preemption_evals(result: &PlanResult, time: Timestamp) -> Vec<Evaluation> {
    let mut jobs: Vec<&Allocation> = result.node_preemptions.values().flatten().collect();
    jobs.sort_by(|a, b| (&a.namespace, &a.job_id).cmp(&(&b.namespace, &b.job_id)));
    jobs.dedup_by(|a, b| a.namespace == b.namespace && a.job_id == b.job_id);
    jobs.into_iter().map(|alloc| Evaluation::for_job(&alloc.job, TriggerReason::Preemption, time)).collect()
}

/// What a client reports about one of its allocations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientAllocUpdate {
    /// The allocation.
    pub alloc_id: AllocId,
    /// The node reporting it; must be the node it is placed on.
    pub node_id: NodeId,
    /// Its status on the client.
    pub client_status: ClientStatus,
    /// The client's explanation.
    pub client_description: String,
    /// Every task's state, by name; replaces the allocation's when not
    /// empty (a client that runs no tasks, such as the mock driver's
    /// light path, sends none and leaves them as they are).
    #[serde(default)]
    pub task_states: BTreeMap<String, TaskState>,
    /// The allocation's service registrations as the client has them now
    /// (those of its running tasks), replacing the stored ones; `None`
    /// leaves them as they are (the mock driver's light path). A client
    /// that runs real tasks sends them with every report; reports are
    /// applied in the order they came, so the newest list stands.
    #[serde(default)]
    pub services: Option<Vec<ServiceRegistration>>,
    /// Every check's latest result, replacing the stored ones; `None`
    /// leaves them as they are. Sent only when a status changed.
    #[serde(default)]
    pub checks: Option<BTreeMap<String, CheckResult>>,
    /// The allocation's health, once its client decided it; `None` leaves
    /// the stored verdict as it is.
    #[serde(default)]
    pub health: Option<AllocHealth>,
}

impl ClientAllocUpdate {
    /// A plain report of `alloc` at `client_status`: nothing about its
    /// tasks, services, checks or health (what the mock driver's light
    /// path and simulated clients send).
    pub fn status(alloc: &Allocation, client_status: ClientStatus) -> ClientAllocUpdate {
        ClientAllocUpdate {
            alloc_id: alloc.id,
            node_id: alloc.node_id,
            client_status,
            client_description: String::new(),
            task_states: BTreeMap::new(),
            services: None,
            checks: None,
            health: None,
        }
    }
}
