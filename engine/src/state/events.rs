//! What each command yields on the event stream (the contract is in
//! `crate::events`).
//!
//! 1. Before a command applies, [`Pending::of`] notes what it may change:
//!    the ids it names, and the event type Nomad gives its raft message
//!    (`JobRegistered`, `PlanResult`, `AllocationUpdated`, ...).
//! 2. After it applied, [`Pending::collect`] reads each of those objects in
//!    the new snapshot and yields an event only for those that changed at
//!    this index (their modify index is the command's): an object the
//!    command named but left alone (a refused client update, an unchanged
//!    resubmission) yields none. The evaluations are those the command
//!    wrote ([`Applied::evals`]).
//! 3. A removal yields an event, carrying the object as it was, only for
//!    nodes, service registrations and ACL tokens and policies (as in
//!    Nomad); a purged job or a collected allocation yields none.
//! 4. Service registrations have their own types whatever wrote them
//!    (`ServiceRegistration`, `ServiceDeregistration`); commands Nomad
//!    gives no event type (job stability, the scheduler configuration,
//!    eval deletion) yield nothing.

use std::sync::Arc;

use super::snapshot::Snapshot;
use super::{Applied, Command};
use crate::events::{Event, EventBatch, Payload};
use crate::structs::{AllocId, DeploymentId, JobKey, NodeId};

const SERVICE_REGISTRATION: &str = "ServiceRegistration";
const SERVICE_DEREGISTRATION: &str = "ServiceDeregistration";

/// What a command may change, noted before it applies (module docs).
#[derive(Debug, Default)]
pub(super) struct Pending {
    event_type: &'static str,
    jobs: Vec<JobKey>,
    deployments: Vec<DeploymentId>,
    allocs: Vec<AllocId>,
    /// Nodes whose allocations the command may change, all of them.
    allocs_of_nodes: Vec<NodeId>,
    nodes: Vec<NodeId>,
    /// Allocations whose service registrations the command may change.
    services_of_allocs: Vec<AllocId>,
    services: Vec<String>,
    acl_tokens: Vec<uuid::Uuid>,
    acl_policies: Vec<String>,
    /// Whether the command's evaluations yield events.
    evals: bool,
}

impl Pending {
    /// What `command` may change (step 1).
    pub(super) fn of(command: &Command) -> Pending {
        let typed = |event_type| Pending { event_type, evals: true, ..Pending::default() };
        match command {
            Command::UpsertNode { node, .. } => Pending { nodes: vec![node.id], ..typed("NodeRegistration") },
            Command::UpdateNodeStatus { node_id, .. } | Command::MissHeartbeat { node_id, .. } => {
                Pending { nodes: vec![*node_id], allocs_of_nodes: vec![*node_id], ..typed("NodeStreamEvent") }
            }
            Command::UpdateNodeEligibility { node_id, .. } => Pending { nodes: vec![*node_id], ..typed("NodeDrain") },
            Command::UpdateNodeDrain { node_id, .. } => {
                Pending { nodes: vec![*node_id], allocs_of_nodes: vec![*node_id], ..typed("NodeDrain") }
            }
            Command::PurgeNode { node_id, .. } => {
                Pending { nodes: vec![*node_id], allocs_of_nodes: vec![*node_id], ..typed("NodeDeregistration") }
            }
            Command::RegisterJob { job, .. } => Pending { jobs: vec![job.key()], ..typed("JobRegistered") },
            // Nomad registers a periodic job's child as any job.
            Command::LaunchPeriodicJob { child, .. } => Pending { jobs: vec![child.key()], ..typed("JobRegistered") },
            Command::DeregisterJob { job, .. } => Pending { jobs: vec![job.clone()], ..typed("JobDeregistered") },
            Command::UpsertEvals { .. } => typed("EvaluationUpdated"),
            Command::UpdateAllocsFromClient { updates, .. } => {
                let allocs: Vec<AllocId> = updates.iter().map(|update| update.alloc_id).collect();
                let services_of_allocs =
                    updates.iter().filter(|update| update.services.is_some()).map(|update| update.alloc_id).collect();
                Pending { allocs, services_of_allocs, ..typed("AllocationUpdated") }
            }
            Command::ApplyPlanResults { allocs, deployment, deployment_updates, .. } => Pending {
                allocs: allocs.iter().map(|alloc| alloc.id).collect(),
                deployments: deployment
                    .iter()
                    .map(|deployment| deployment.id)
                    .chain(deployment_updates.iter().map(|update| update.deployment_id))
                    .collect(),
                ..typed("PlanResult")
            },
            Command::StopAlloc { alloc_id, .. } => {
                Pending { allocs: vec![*alloc_id], ..typed("AllocationUpdateDesiredStatus") }
            }
            Command::UpdateDeploymentStatus { update, job, .. } => Pending {
                deployments: vec![update.deployment_id],
                jobs: job.iter().map(|job| job.key()).collect(),
                ..typed("DeploymentStatusUpdate")
            },
            Command::PromoteDeployment { deployment_id, .. } => {
                Pending { deployments: vec![*deployment_id], ..typed("DeploymentPromotion") }
            }
            Command::SetAllocHealth { deployment_id, healthy, unhealthy, job, .. } => Pending {
                deployments: vec![*deployment_id],
                allocs: healthy.iter().chain(unhealthy).copied().collect(),
                jobs: job.iter().map(|job| job.key()).collect(),
                ..typed("DeploymentAllocHealth")
            },
            Command::UpsertServiceRegistrations { registrations } => Pending {
                services: registrations.iter().map(|registration| registration.id.clone()).collect(),
                ..Pending::default()
            },
            Command::DeleteServiceRegistration { id, .. } => {
                Pending { services: vec![id.clone()], ..Pending::default() }
            }
            Command::DeleteServiceRegistrationsOfAllocs { alloc_ids } => {
                Pending { services_of_allocs: alloc_ids.clone(), ..Pending::default() }
            }
            Command::AclBootstrap { token } | Command::AclBootstrapReset { token, .. } => {
                Pending { acl_tokens: vec![token.accessor_id], ..typed("ACLTokenUpserted") }
            }
            Command::UpsertAclTokens { tokens } => Pending {
                acl_tokens: tokens.iter().map(|token| token.accessor_id).collect(),
                ..typed("ACLTokenUpserted")
            },
            Command::DeleteAclTokens { accessor_ids } => {
                Pending { acl_tokens: accessor_ids.clone(), ..typed("ACLTokenDeleted") }
            }
            Command::UpsertAclPolicies { policies } => Pending {
                acl_policies: policies.iter().map(|policy| policy.name.clone()).collect(),
                ..typed("ACLPolicyUpserted")
            },
            Command::DeleteAclPolicies { names } => {
                Pending { acl_policies: names.clone(), ..typed("ACLPolicyDeleted") }
            }
            Command::GarbageCollect { collection } => {
                Pending { nodes: collection.nodes.clone(), ..typed("NodeDeregistration") }
            }
            // Nomad's stream has no topic for these.
            Command::SetJobStability { .. }
            | Command::SetSchedulerConfig { .. }
            | Command::DeleteEvals { .. }
            | Command::UpsertNamespaces { .. }
            | Command::DeleteNamespaces { .. } => Pending::default(),
        }
    }

    /// The events of the command noted, applied at `applied.index` on
    /// `before` giving `after` (steps 2-4).
    pub(super) fn collect(self, before: &Snapshot, after: &Snapshot, applied: &Applied) -> EventBatch {
        let index = applied.index;
        let mut events = Vec::new();
        let mut push = |event_type: &'static str, payload: Payload| events.push(Event { event_type, payload });
        let event_type = self.event_type;
        for key in &self.jobs {
            if let Some(job) = after.job(key).filter(|job| job.modify_index == index) {
                push(event_type, Payload::Job(job.clone()));
            }
        }
        if self.evals {
            for eval in applied.evals.iter().filter(|eval| eval.modify_index == index) {
                push(event_type, Payload::Evaluation(eval.clone()));
            }
        }
        for id in &self.deployments {
            if let Some(deployment) = after.deployment(*id).filter(|deployment| deployment.modify_index == index) {
                push(event_type, Payload::Deployment(deployment.clone()));
            }
        }
        for id in &self.allocs {
            if let Some(alloc) = after.alloc(*id).filter(|alloc| alloc.modify_index == index) {
                push(event_type, Payload::Allocation(alloc.clone()));
            }
        }
        for node_id in &self.allocs_of_nodes {
            for alloc in after.allocs_by_node(*node_id).filter(|alloc| alloc.modify_index == index) {
                push(event_type, Payload::Allocation(alloc.clone()));
            }
        }
        for node_id in &self.nodes {
            match after.node(*node_id) {
                Some(node) if node.modify_index == index => push(event_type, Payload::Node(node.clone())),
                Some(_) => {}
                None => {
                    if let Some(node) = before.node(*node_id) {
                        push("NodeDeregistration", Payload::Node(node.clone()));
                    }
                }
            }
        }
        for alloc_id in &self.services_of_allocs {
            for registration in after.service_registrations_by_alloc(*alloc_id) {
                if registration.modify_index == index {
                    push(SERVICE_REGISTRATION, Payload::Service(registration.clone()));
                }
            }
            for registration in before.service_registrations_by_alloc(*alloc_id) {
                if after.service_registration(&registration.id).is_none() {
                    push(SERVICE_DEREGISTRATION, Payload::Service(registration.clone()));
                }
            }
        }
        for id in &self.services {
            match after.service_registration(id) {
                Some(registration) if registration.modify_index == index => {
                    push(SERVICE_REGISTRATION, Payload::Service(registration.clone()));
                }
                Some(_) => {}
                None => {
                    if let Some(registration) = before.service_registration(id) {
                        push(SERVICE_DEREGISTRATION, Payload::Service(registration.clone()));
                    }
                }
            }
        }
        for accessor_id in &self.acl_tokens {
            match (after.acl().tokens.get(accessor_id), before.acl().tokens.get(accessor_id)) {
                (Some(token), _) if token.modify_index == index => {
                    push(event_type, Payload::AclToken(Arc::new(token.clone())))
                }
                (None, Some(token)) => push(event_type, Payload::AclToken(Arc::new(token.clone()))),
                _ => {}
            }
        }
        for name in &self.acl_policies {
            match (after.acl().policies.get(name), before.acl().policies.get(name)) {
                (Some(policy), _) if policy.modify_index == index => {
                    push(event_type, Payload::AclPolicy(Arc::new(policy.clone())))
                }
                (None, Some(policy)) => push(event_type, Payload::AclPolicy(Arc::new(policy.clone()))),
                _ => {}
            }
        }
        EventBatch { index, events }
    }
}
