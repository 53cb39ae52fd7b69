//! Allocations: one task group of one job placed on one node.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{
    AllocHealth, AllocId, AllocatedPort, CheckResult, DeploymentId, EvalId, Job, JobKey, NodeId, Resources, TaskState,
};
use crate::clock::Timestamp;

/// What the servers want done with an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DesiredStatus {
    /// Keep it running.
    Run,
    /// Stop it.
    Stop,
    /// Stop it to make room (preemption, drain).
    Evict,
}

/// What the client reports of an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientStatus {
    /// Placed; the client has not started it yet.
    Pending,
    /// Running on the client.
    Running,
    /// Finished successfully.
    Complete,
    /// Finished unsuccessfully.
    Failed,
    /// Its node went down; it is gone.
    Lost,
    /// Its node is disconnected; it may still be running.
    Unknown,
}

impl ClientStatus {
    /// Whether the allocation will never run again.
    pub fn is_terminal(self) -> bool {
        matches!(self, ClientStatus::Complete | ClientStatus::Failed | ClientStatus::Lost)
    }
}

/// One entry in an allocation's client-status history. The reconnect
/// protocol reads this history, never client-written timestamps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AllocState {
    /// The client status the allocation moved to.
    pub client_status: ClientStatus,
    /// When the server recorded it.
    pub time: Timestamp,
}

/// One reschedule of a failed allocation, carried forward on its replacement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RescheduleEvent {
    /// When the replacement was placed.
    pub time: Timestamp,
    /// The allocation that failed.
    pub prev_alloc_id: AllocId,
    /// The node it failed on.
    pub prev_node_id: NodeId,
    /// The delay applied before the replacement.
    pub delay_nanos: u64,
}

/// Why placements did not happen; recorded on evaluations so users can see
/// what filtered or exhausted the cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocMetric {
    /// Nodes considered.
    pub nodes_evaluated: u64,
    /// Nodes removed by any filter.
    pub nodes_filtered: u64,
    /// Ready nodes per datacenter.
    pub nodes_available: BTreeMap<String, u64>,
    /// Nodes filtered per node class.
    pub class_filtered: BTreeMap<String, u64>,
    /// Nodes filtered per constraint, keyed by its text.
    pub constraint_filtered: BTreeMap<String, u64>,
    /// Feasible nodes that did not have room.
    pub nodes_exhausted: u64,
    /// Exhausted nodes per node class.
    pub class_exhausted: BTreeMap<String, u64>,
    /// Exhausted nodes per dimension ("cpu", "memory", "disk", and for ports
    /// Nomad's `network: reserved port collision <label>=<port>` and
    /// "network: dynamic port selection failed").
    pub dimension_exhausted: BTreeMap<String, u64>,
    /// Allocations that could not be placed with these metrics.
    pub coalesced_failures: u64,
}

/// A task group of a job, placed on a node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Allocation {
    /// Identity.
    pub id: AllocId,
    /// Namespace of the job.
    pub namespace: Arc<str>,
    /// The job's id.
    pub job_id: Arc<str>,
    /// The job version it was placed for. Encoded once per command or
    /// snapshot, not once per allocation (see [`super::job_refs`]).
    #[serde(with = "super::job_refs::shared_job")]
    pub job: Arc<Job>,
    /// Which group of the job.
    pub task_group: Arc<str>,
    /// `job.group[index]`: the slot this allocation fills.
    pub name: String,
    /// The node it is placed on.
    pub node_id: NodeId,
    /// The evaluation that placed or last changed it.
    pub eval_id: EvalId,
    /// What it reserves on the node.
    pub resources: Resources,
    /// The ports it was given on the node, static and dynamic (Nomad's
    /// `AllocatedResources.Shared.Ports`); [`super::port_env`] turns them
    /// into the task environment.
    #[serde(default)]
    pub ports: Vec<AllocatedPort>,
    /// Its node's final score when the scheduler placed it (0 for a node
    /// chosen by preemption or by a system scheduler), which
    /// `disconnect { reconcile = "best_score" }` compares.
    #[serde(default)]
    pub score: f64,
    /// What the servers want.
    pub desired_status: DesiredStatus,
    /// Why the servers want it.
    pub desired_description: String,
    /// What the client reports.
    pub client_status: ClientStatus,
    /// The client's explanation.
    pub client_description: String,
    /// Each task's state as its client last reported it, by task name.
    #[serde(default)]
    pub task_states: BTreeMap<String, TaskState>,
    /// Each check's latest result as its client reported it, by check id.
    #[serde(default)]
    pub checks: BTreeMap<String, CheckResult>,
    /// Its health as its client decided it (Nomad's `DeploymentStatus`);
    /// absent until decided.
    #[serde(default)]
    pub health: Option<AllocHealth>,
    /// The deployment it was placed in (or moved to by an in-place update).
    #[serde(default)]
    pub deployment_id: Option<DeploymentId>,
    /// Whether it is a canary of its deployment not yet promoted.
    #[serde(default)]
    pub canary: bool,
    /// History of client-status transitions recorded by the servers.
    pub alloc_states: Vec<AllocState>,
    /// The allocation this one replaces.
    pub previous_allocation: Option<AllocId>,
    /// The allocation that replaced this one.
    pub next_allocation: Option<AllocId>,
    /// Reschedules that led to this allocation.
    pub reschedule_events: Vec<RescheduleEvent>,
    /// Eval that will reschedule this allocation after a delay.
    pub follow_up_eval_id: Option<EvalId>,
    /// Allocations evicted to make room for this one.
    #[serde(default)]
    pub preempted_allocations: Vec<AllocId>,
    /// The allocation this one was evicted for (desired status `evict`).
    #[serde(default)]
    pub preempted_by_allocation: Option<AllocId>,
    /// Index at which it was created.
    pub create_index: u64,
    /// Index of the last change to it.
    pub modify_index: u64,
    /// When it was created.
    pub create_time: Timestamp,
    /// When it last changed.
    pub modify_time: Timestamp,
    /// When the servers took the client's latest change of its client
    /// status: for a failed allocation, when it failed. Plans that touch
    /// the allocation later (to record a follow-up eval, say) move
    /// `modify_time`, never this, so a reschedule delay counts from the failure.
    pub client_status_time: Timestamp,
}

impl Allocation {
    /// The desired description of an allocation an operator stopped
    /// (Nomad's, whose `alloc stop` migrates it).
    pub const STOPPED_BY_OPERATOR: &'static str = "alloc is being migrated";

    /// The job's namespaced key.
    pub fn job_key(&self) -> JobKey {
        JobKey { namespace: self.namespace.clone(), id: self.job_id.clone() }
    }

    /// Whether the servers want it stopped.
    pub fn server_terminal(&self) -> bool {
        matches!(self.desired_status, DesiredStatus::Stop | DesiredStatus::Evict)
    }

    /// Whether the client reports it will not run again.
    pub fn client_terminal(&self) -> bool {
        self.client_status.is_terminal()
    }

    /// Whether it no longer uses resources on its node: stopped by the
    /// servers or finished on the client.
    pub fn terminal(&self) -> bool {
        self.server_terminal() || self.client_terminal()
    }

    /// The host ports it holds on its node while it is live.
    pub fn port_values(&self) -> impl Iterator<Item = u16> + '_ {
        self.ports.iter().map(|port| port.value)
    }

    /// The last client status the servers recorded in the history.
    pub fn last_recorded_client_status(&self) -> Option<ClientStatus> {
        self.alloc_states.last().map(|state| state.client_status)
    }

    /// Sets the client status as a server decision (`unknown` on a
    /// disconnect, `lost`, the status it reconnected with) and appends it to
    /// the history. Client reports go through [`Allocation::set_client_status`].
    pub fn record_client_status(&mut self, status: ClientStatus, time: Timestamp) {
        self.alloc_states.push(AllocState { client_status: status, time });
        self.client_status = status;
    }

    /// Takes a status the client reported at `time`. The history is the
    /// servers' record and is not touched: a client that reports `running`
    /// after a disconnect still needs the reconciler to settle its reconnect.
    pub fn set_client_status(&mut self, status: ClientStatus, description: &str, time: Timestamp) {
        if self.client_status != status {
            self.client_status_time = time;
        }
        self.client_status = status;
        description.clone_into(&mut self.client_description);
    }

    /// Whether the servers marked it `unknown` and have not yet settled its
    /// return: the last client-status entry of the history is `unknown`
    /// (decided from the history, never from client timestamps).
    pub fn needs_reconnect(&self) -> bool {
        self.last_recorded_client_status() == Some(ClientStatus::Unknown)
    }

    /// When its `unknown` mark runs out after `max_client_disconnect`, if it
    /// is marked `unknown`.
    pub fn disconnect_expires_at(&self, max_client_disconnect: std::time::Duration) -> Option<Timestamp> {
        let last = self.alloc_states.last().filter(|state| state.client_status == ClientStatus::Unknown)?;
        Some(last.time.plus(max_client_disconnect))
    }

    /// The slot index from the name (`job.group[7]` → 7).
    pub fn index(&self) -> Option<u32> {
        let open = self.name.rfind('[')?;
        self.name[open + 1..].strip_suffix(']')?.parse().ok()
    }

    /// A new pending allocation of `group` of `job` on `node_id`.
    pub fn new_placement(job: &Arc<Job>, group: &str, index: u32, node_id: NodeId, eval_id: EvalId) -> Allocation {
        let resources = job.group(group).map(|group| group.resources()).unwrap_or_default();
        Allocation {
            id: AllocId::new_random(),
            namespace: job.namespace.clone(),
            job_id: job.id.clone(),
            job: job.clone(),
            task_group: Arc::from(group),
            name: format!("{}.{}[{}]", job.id, group, index),
            node_id,
            eval_id,
            resources,
            ports: Vec::new(),
            score: 0.0,
            desired_status: DesiredStatus::Run,
            desired_description: String::new(),
            client_status: ClientStatus::Pending,
            client_description: String::new(),
            task_states: BTreeMap::new(),
            checks: BTreeMap::new(),
            health: None,
            deployment_id: None,
            canary: false,
            alloc_states: Vec::new(),
            previous_allocation: None,
            next_allocation: None,
            reschedule_events: Vec::new(),
            follow_up_eval_id: None,
            preempted_allocations: Vec::new(),
            preempted_by_allocation: None,
            create_index: 0,
            modify_index: 0,
            create_time: Timestamp::ZERO,
            modify_time: Timestamp::ZERO,
            client_status_time: Timestamp::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structs::JobType;

    #[test]
    fn only_server_decisions_enter_the_history() {
        let job = Arc::new(Job::new_simple("web", JobType::Service, 1, Resources::new(1, 1, 0)));
        let mut alloc = Allocation::new_placement(&job, "group", 4, NodeId::from_u128(1), EvalId::from_u128(1));
        alloc.set_client_status(ClientStatus::Running, "started", Timestamp(2));
        assert_eq!(alloc.client_status_time, Timestamp(2));
        assert!(alloc.alloc_states.is_empty());
        alloc.record_client_status(ClientStatus::Unknown, Timestamp(3));
        assert!(alloc.needs_reconnect());
        assert_eq!(alloc.disconnect_expires_at(std::time::Duration::from_nanos(10)), Some(Timestamp(13)));
        alloc.set_client_status(ClientStatus::Running, "back", Timestamp(5));
        assert_eq!(alloc.client_status_time, Timestamp(5));
        alloc.set_client_status(ClientStatus::Running, "still running", Timestamp(6));
        assert_eq!(alloc.client_status_time, Timestamp(5), "a repeated report is not a change");
        assert!(alloc.needs_reconnect(), "a client report does not settle a reconnect");
        alloc.record_client_status(ClientStatus::Running, Timestamp(4));
        assert!(!alloc.needs_reconnect());
        assert_eq!(alloc.disconnect_expires_at(std::time::Duration::from_nanos(10)), None);
        assert_eq!(alloc.index(), Some(4));
        assert!(!alloc.terminal());
        alloc.desired_status = DesiredStatus::Stop;
        assert!(alloc.terminal());
    }
}
