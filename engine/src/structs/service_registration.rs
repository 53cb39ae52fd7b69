//! A service registration: one instance of a `service` block of a running
//! allocation, as its client registers it with the servers (Nomad 1.3+'s
//! `provider = "nomad"`; `nomad/structs/service_registration.go`).
//!
//! The servers store what the client sends, keyed by [`ServiceRegistration::id`],
//! which names the allocation, the task (or group), the service and its port
//! label, so one allocation re-registering the same service replaces its row
//! and never adds a second. There is no health field: check results stay on
//! the client, as in Nomad.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::alloc::Allocation;
use super::ids::{AllocId, JobKey, NodeId};

/// The prefix of every registration id (Nomad's `_nomad-task-`).
pub const SERVICE_ID_PREFIX: &str = "_nomad-task-";

/// What a `service` block belongs to: a task, or the group itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceOwner<'a> {
    /// A task-level service, of the task with this name.
    Task(&'a str),
    /// A group-level service, of the group with this name.
    Group(&'a str),
}

/// One registered instance of a service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceRegistration {
    /// `_nomad-task-<alloc id>-<task, or group-<group>>-<service name>-<port label>`
    /// (see [`ServiceRegistration::make_id`]).
    pub id: String,
    /// The service's name, interpolated by the client.
    pub service_name: String,
    /// The namespace of the allocation's job.
    pub namespace: Arc<str>,
    /// The node the allocation runs on.
    pub node_id: NodeId,
    /// That node's datacenter.
    pub datacenter: Arc<str>,
    /// The allocation's job.
    pub job_id: Arc<str>,
    /// The allocation.
    pub alloc_id: AllocId,
    /// Tags (an unpromoted canary's `canary_tags` when it has some).
    pub tags: Vec<String>,
    /// The address the service answers on.
    pub address: String,
    /// The port it answers on (0 when the service names no port).
    pub port: u16,
    /// Index at which it was first registered.
    pub create_index: u64,
    /// Index of the last change to it.
    pub modify_index: u64,
}

impl ServiceRegistration {
    /// Nomad's registration id (`MakeAllocServiceID`): the prefix, the
    /// allocation, the task name or `group-<group name>`, the service name
    /// and the port label, joined by dashes.
    pub fn make_id(alloc_id: AllocId, owner: ServiceOwner<'_>, service_name: &str, port_label: &str) -> String {
        let owner = match owner {
            ServiceOwner::Task(task) => task.to_string(),
            ServiceOwner::Group(group) => format!("group-{group}"),
        };
        format!("{SERVICE_ID_PREFIX}{alloc_id}-{owner}-{service_name}-{port_label}")
    }

    /// A registration of `alloc`'s service `service_name` (owned by
    /// `owner`, on port label `port_label`), with its id made, on the
    /// allocation's node in `datacenter`; no tags, no address, port 0, and
    /// indexes the store sets. The client fills in what it resolved.
    pub fn of_alloc(
        alloc: &Allocation,
        datacenter: &str,
        owner: ServiceOwner<'_>,
        service_name: &str,
        port_label: &str,
    ) -> ServiceRegistration {
        ServiceRegistration {
            id: ServiceRegistration::make_id(alloc.id, owner, service_name, port_label),
            service_name: service_name.to_string(),
            namespace: alloc.namespace.clone(),
            node_id: alloc.node_id,
            datacenter: Arc::from(datacenter),
            job_id: alloc.job_id.clone(),
            alloc_id: alloc.id,
            tags: Vec::new(),
            address: String::new(),
            port: 0,
            create_index: 0,
            modify_index: 0,
        }
    }

    /// The key of the job it belongs to.
    pub fn job_key(&self) -> JobKey {
        JobKey { namespace: self.namespace.clone(), id: self.job_id.clone() }
    }

    /// Whether it says the same as `other`, the indexes the store sets aside.
    pub fn same_as(&self, other: &ServiceRegistration) -> bool {
        let ServiceRegistration {
            id,
            service_name,
            namespace,
            node_id,
            datacenter,
            job_id,
            alloc_id,
            tags,
            address,
            port,
            create_index: _,
            modify_index: _,
        } = other;
        self.id == *id
            && self.service_name == *service_name
            && self.namespace == *namespace
            && self.node_id == *node_id
            && self.datacenter == *datacenter
            && self.job_id == *job_id
            && self.alloc_id == *alloc_id
            && self.tags == *tags
            && self.address == *address
            && self.port == *port
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registration() -> ServiceRegistration {
        let alloc_id = AllocId::from_u128(7);
        ServiceRegistration {
            id: ServiceRegistration::make_id(alloc_id, ServiceOwner::Task("server"), "web", "http"),
            service_name: "web".into(),
            namespace: Arc::from("default"),
            node_id: NodeId::from_u128(1),
            datacenter: Arc::from("dc1"),
            job_id: Arc::from("example"),
            alloc_id,
            tags: vec!["v1".into(), "edge".into()],
            address: "10.0.0.5".into(),
            port: 23456,
            create_index: 3,
            modify_index: 9,
        }
    }

    #[test]
    fn ids_are_nomads() {
        let alloc_id: AllocId = "d4afb853-4e30-b796-2aeb-fba3177ed181".parse().expect("a uuid");
        assert_eq!(
            ServiceRegistration::make_id(alloc_id, ServiceOwner::Group("loki"), "loki-http", "loki-http"),
            "_nomad-task-d4afb853-4e30-b796-2aeb-fba3177ed181-group-loki-loki-http-loki-http"
        );
        assert_eq!(
            ServiceRegistration::make_id(alloc_id, ServiceOwner::Task("redis"), "cache", "db"),
            "_nomad-task-d4afb853-4e30-b796-2aeb-fba3177ed181-redis-cache-db"
        );
    }

    #[test]
    fn round_trips_through_json_and_postcard() {
        let registration = registration();
        let json = serde_json::to_string(&registration).expect("json");
        assert_eq!(serde_json::from_str::<ServiceRegistration>(&json).expect("from json"), registration);
        let bytes = postcard::to_allocvec(&registration).expect("postcard");
        assert_eq!(postcard::from_bytes::<ServiceRegistration>(&bytes).expect("from postcard"), registration);
    }

    #[test]
    fn sameness_sets_the_indexes_aside() {
        let registration = registration();
        let mut later = registration.clone();
        later.modify_index = 40;
        later.create_index = 40;
        assert!(registration.same_as(&later));
        later.tags.push("canary".into());
        assert!(!registration.same_as(&later));
        assert_eq!(registration.job_key(), JobKey::new("default", "example"));
    }
}
