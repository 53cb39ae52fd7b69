//! The event stream's events, and the buffer that holds the newest of them
//! (Nomad's event broker, behind `GET /v1/event/stream`).
//!
//! Contract:
//! 1. The state store publishes one [`EventBatch`] per applied command that
//!    changed something a subscriber can see (`state/events.rs` says what
//!    each command yields), in index order, on every server, leader or
//!    not: events come from the applied log, so servers that applied the
//!    same entries hold the same batches. A replica that installs a
//!    snapshot publishes nothing for the indexes it skipped, and nothing
//!    is persisted (as in Nomad: after a restart or a failover the buffer
//!    holds only what this server applied since).
//! 2. The [`EventBroker`] keeps the newest `capacity` batches (Nomad's
//!    `event_buffer_size`, 100 by default; 0 turns events off and the
//!    store then builds none).
//! 3. A [`Subscription`] starts at the first buffered batch whose index is
//!    at least the one it asks for (the oldest buffered batch when that
//!    index is older than the buffer: Nomad's rule), and reads every
//!    batch from there, in order, each once.
//! 4. A subscriber never slows the writer: publishing pushes onto the
//!    ring and wakes the waiting readers. A subscriber that falls so far
//!    behind that the batch it needs next has left the ring gets
//!    [`SubscriptionError::Lagged`], naming the index to resume from, and
//!    reads nothing more: a bounded backlog per subscriber, and a clear
//!    reason to close the stream with.
//! 5. [`EventBroker::close`] (shutdown) ends every subscription with
//!    [`SubscriptionError::Closed`].

mod broker;
#[cfg(test)]
mod broker_test;

use std::sync::Arc;

pub use broker::{EventBroker, Subscription, SubscriptionError, DEFAULT_EVENT_BUFFER};

use crate::structs::{AclPolicy, AclToken, Allocation, Deployment, Evaluation, Job, Node, ServiceRegistration};

/// What an event is about (Nomad's topics, spelled as Nomad spells them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Topic {
    /// A job registered, changed or stopped.
    Job,
    /// An evaluation written.
    Evaluation,
    /// An allocation placed or changed.
    Allocation,
    /// A deployment created or changed.
    Deployment,
    /// A node registered, changed or removed.
    Node,
    /// A service registration written or removed.
    Service,
    /// An ACL token written or removed.
    AclToken,
    /// An ACL policy written or removed.
    AclPolicy,
}

impl Topic {
    /// Every topic.
    pub const ALL: [Topic; 8] = [
        Topic::Job,
        Topic::Evaluation,
        Topic::Allocation,
        Topic::Deployment,
        Topic::Node,
        Topic::Service,
        Topic::AclToken,
        Topic::AclPolicy,
    ];

    /// Nomad's name of the topic (`Job`, `ACLToken`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Topic::Job => "Job",
            Topic::Evaluation => "Evaluation",
            Topic::Allocation => "Allocation",
            Topic::Deployment => "Deployment",
            Topic::Node => "Node",
            Topic::Service => "Service",
            Topic::AclToken => "ACLToken",
            Topic::AclPolicy => "ACLPolicy",
        }
    }

    /// The topic Nomad names `name` (case-sensitive, as in Nomad).
    pub fn parse(name: &str) -> Option<Topic> {
        Topic::ALL.into_iter().find(|topic| topic.as_str() == name)
    }
}

/// The object an event carries, as the state held it at the event's
/// index (as it was last, for a removal).
#[derive(Clone, Debug)]
pub enum Payload {
    /// A job.
    Job(Arc<Job>),
    /// An evaluation.
    Evaluation(Arc<Evaluation>),
    /// An allocation.
    Allocation(Arc<Allocation>),
    /// A deployment.
    Deployment(Arc<Deployment>),
    /// A node.
    Node(Arc<Node>),
    /// A service registration.
    Service(Arc<ServiceRegistration>),
    /// An ACL token.
    AclToken(Arc<AclToken>),
    /// An ACL policy.
    AclPolicy(Arc<AclPolicy>),
}

impl Payload {
    /// The topic of an event carrying this.
    pub fn topic(&self) -> Topic {
        match self {
            Payload::Job(_) => Topic::Job,
            Payload::Evaluation(_) => Topic::Evaluation,
            Payload::Allocation(_) => Topic::Allocation,
            Payload::Deployment(_) => Topic::Deployment,
            Payload::Node(_) => Topic::Node,
            Payload::Service(_) => Topic::Service,
            Payload::AclToken(_) => Topic::AclToken,
            Payload::AclPolicy(_) => Topic::AclPolicy,
        }
    }

    /// The event's key: the object's id (a policy's name).
    pub fn key(&self) -> String {
        match self {
            Payload::Job(job) => job.id.to_string(),
            Payload::Evaluation(eval) => eval.id.to_string(),
            Payload::Allocation(alloc) => alloc.id.to_string(),
            Payload::Deployment(deployment) => deployment.id.to_string(),
            Payload::Node(node) => node.id.to_string(),
            Payload::Service(service) => service.id.clone(),
            Payload::AclToken(token) => token.accessor_id.to_string(),
            Payload::AclPolicy(policy) => policy.name.clone(),
        }
    }

    /// The other keys a subscription may name to get this event (Nomad's
    /// `FilterKeys`): the job of an evaluation, allocation, deployment or
    /// service, an allocation's deployment, a service's name.
    pub fn filter_keys(&self) -> Vec<String> {
        match self {
            Payload::Evaluation(eval) => vec![eval.job_id.to_string()],
            Payload::Allocation(alloc) => {
                let mut keys = vec![alloc.job_id.to_string()];
                keys.extend(alloc.deployment_id.map(|id| id.to_string()));
                keys
            }
            Payload::Deployment(deployment) => vec![deployment.job_id.to_string()],
            Payload::Service(service) => vec![service.job_id.to_string(), service.service_name.clone()],
            Payload::Job(_) | Payload::Node(_) | Payload::AclToken(_) | Payload::AclPolicy(_) => Vec::new(),
        }
    }

    /// The namespace of the object; `None` for nodes and ACL objects,
    /// which belong to none.
    pub fn namespace(&self) -> Option<&str> {
        match self {
            Payload::Job(job) => Some(&job.namespace),
            Payload::Evaluation(eval) => Some(&eval.namespace),
            Payload::Allocation(alloc) => Some(&alloc.namespace),
            Payload::Deployment(deployment) => Some(&deployment.namespace),
            Payload::Service(service) => Some(&service.namespace),
            Payload::Node(_) | Payload::AclToken(_) | Payload::AclPolicy(_) => None,
        }
    }
}

/// One change, as a subscriber sees it.
#[derive(Clone, Debug)]
pub struct Event {
    /// Why (Nomad's `Type`): named after the command that made the change,
    /// the same for every event of a batch (`PlanResult`,
    /// `JobRegistered`, `AllocationUpdated`, ...).
    pub event_type: &'static str,
    /// What changed.
    pub payload: Payload,
}

/// The events of one applied command.
#[derive(Debug)]
pub struct EventBatch {
    /// The command's index (log position).
    pub index: u64,
    /// Its events, in the order the command made them.
    pub events: Vec<Event>,
}
