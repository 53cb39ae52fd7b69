//! An allocation's service registrations as its agent makes them (Nomad's
//! service hooks), from its job's `service` blocks and its tasks' states.
//! A pure function of both: the allocation runner reports the result with
//! every change of its tasks, and the servers replace what they stored.
//!
//! 1. A task's service is registered while that task runs and is not being
//!    stopped (from its `Killing` or `Restart Signaled` event, published
//!    before the kill, it is deregistered first, as Nomad's); a group's
//!    while any task of the allocation is so.
//! 2. Its name, tags and `address` are interpolated with the task's
//!    variables (a group service's with those of the task it names, else
//!    of the group's first task that has them); an unknown `${...}` stays
//!    as written.
//! 3. The address is `address` when given, else the host address of the
//!    allocated port, else the node's. The port is the allocated host port
//!    of the label (`to` with `address_mode` `alloc` or `driver`, the port
//!    the task binds), or the number written in place of a label.

use engine::structs::{
    AddressMode, Allocation, Node, Service, ServiceOwner, ServiceRegistration, TaskEvent, TaskState, TaskStatus,
};

use std::collections::BTreeMap;

use crate::client::task_env::TaskEnv;

/// A registered service: its registration, its block, and the variables
/// it was interpolated with (those of its task).
#[derive(Debug)]
pub struct Registered<'a> {
    /// What the servers get.
    pub registration: ServiceRegistration,
    /// The `service` block.
    pub service: &'a Service,
    /// The task it belongs to: its own, or the one a group service names
    /// (else the group's first task with variables).
    pub task: &'a str,
    /// That task's variables.
    pub env: &'a TaskEnv,
    /// Whether it is a group's service.
    pub group_service: bool,
}

/// The registrations `alloc` has now on `node`, its tasks being as
/// `states` says, with each task's variables in `envs` (the allocation
/// runner's, made once).
pub fn registrations(
    alloc: &Allocation,
    node: &Node,
    envs: &BTreeMap<String, TaskEnv>,
    states: &BTreeMap<String, TaskState>,
) -> Vec<ServiceRegistration> {
    registered(alloc, node, envs, states).into_iter().map(|registered| registered.registration).collect()
}

/// The services `alloc` has registered now, with what made each
/// (module docs, step 1).
pub fn registered<'a>(
    alloc: &'a Allocation,
    node: &Node,
    envs: &'a BTreeMap<String, TaskEnv>,
    states: &BTreeMap<String, TaskState>,
) -> Vec<Registered<'a>> {
    let Some(group) = alloc.job.group(&alloc.task_group) else { return Vec::new() };
    let running = |task: &str| states.get(task).is_some_and(serving);
    let mut out = Vec::new();
    if group.tasks.iter().any(|task| running(&task.name)) {
        for service in &group.services {
            let named = service.task_name.as_deref().and_then(|name| envs.get_key_value(name));
            let found = named.or_else(|| group.tasks.iter().find_map(|task| envs.get_key_value(&task.name)));
            if let Some((task, env)) = found {
                let registration = registration(alloc, node, service, ServiceOwner::Group(&group.name), env);
                out.push(Registered { registration, service, task, env, group_service: true });
            }
        }
    }
    for task in group.tasks.iter().filter(|task| running(&task.name)) {
        let Some(env) = envs.get(&task.name) else { continue };
        for service in &task.services {
            let registration = registration(alloc, node, service, ServiceOwner::Task(&task.name), env);
            out.push(Registered { registration, service, task: &task.name, env, group_service: false });
        }
    }
    out
}

/// Whether a task's services are registered (module docs, step 1).
fn serving(state: &TaskState) -> bool {
    let stopping = state.events.last().is_some_and(|event| {
        matches!(
            event.event_type.as_str(),
            TaskEvent::KILLING
                | TaskEvent::RESTART_SIGNALED
                | TaskEvent::SIBLING_FAILED
                | TaskEvent::WAITING_SHUTDOWN_DELAY
        )
    });
    state.state == TaskStatus::Running && !stopping
}

/// One service's registration (module docs, steps 2 and 3).
fn registration(
    alloc: &Allocation,
    node: &Node,
    service: &Service,
    owner: ServiceOwner<'_>,
    env: &TaskEnv,
) -> ServiceRegistration {
    let name = env.interpolate(&service.name);
    let label = env.interpolate(&service.port_label);
    let mut registration = ServiceRegistration::of_alloc(alloc, &node.datacenter, owner, &name, &label);
    registration.tags = service.tags.iter().map(|tag| env.interpolate(tag)).collect();
    let fixed = service.address.as_ref().map(|address| env.interpolate(address));
    (registration.address, registration.port) = endpoint(alloc, node, &label, service.address_mode, fixed);
    registration
}

/// The address and port of port label `label` (interpolated) in
/// `address_mode`, or `fixed` as the address when given (module docs,
/// step 3); a check's too.
pub fn endpoint(
    alloc: &Allocation,
    node: &Node,
    label: &str,
    mode: AddressMode,
    fixed: Option<String>,
) -> (String, u16) {
    let allocated = alloc.ports.iter().find(|port| *port.label == *label);
    let port = match (allocated, mode) {
        (Some(port), AddressMode::Alloc | AddressMode::Driver) if port.to > 0 => port.to,
        (Some(port), _) => port.value,
        (None, _) => label.parse().unwrap_or(0),
    };
    let address = match (fixed, allocated) {
        (Some(address), _) => address,
        (None, Some(port)) => port.host_ip.to_string(),
        (None, None) => node.network.ip.to_string(),
    };
    (address, port)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::alloc_dir::AllocDir;
    use engine::structs::{AllocatedPort, EvalId, Job, JobType, NodeId, Resources};
    use std::path::Path;
    use std::sync::Arc;

    fn fixture() -> (Allocation, Node) {
        let mut job = Job::new_simple("shop", JobType::Service, 1, Resources::new(100, 64, 0));
        let group = &mut job.task_groups[0];
        group.services.push(Service::new("shop-lb", "http"));
        group.tasks[0].services.push(Service {
            tags: vec!["dc=${node.datacenter}".into()],
            ..Service::new("${NOMAD_TASK_NAME}-api", "http")
        });
        group.tasks[0].services.push(Service { address: Some("10.9.9.9".into()), ..Service::new("metrics", "9100") });
        let job = Arc::new(job);
        let group = job.task_groups[0].name.clone();
        let mut alloc = Allocation::new_placement(&job, &group, 0, NodeId::from_u128(7), EvalId::from_u128(1));
        alloc.ports =
            vec![AllocatedPort { label: Arc::from("http"), value: 23456, to: 8080, host_ip: Arc::from("10.0.0.5") }];
        let node = Node::new_ready(NodeId::from_u128(7), "dc1", "", Resources::new(1000, 1000, 1000));
        (alloc, node)
    }

    #[test]
    fn running_tasks_register_their_services_and_the_groups() {
        let (alloc, node) = fixture();
        let dir = AllocDir::new(Path::new("/data"), alloc.id);
        let task = alloc.job.task_groups[0].tasks[0].name.clone();
        let envs =
            BTreeMap::from([(task.clone(), TaskEnv::new(&alloc, &alloc.job.task_groups[0].tasks[0], &node, &dir))]);
        let mut states = BTreeMap::from([(task.clone(), TaskState::default())]);
        assert!(registrations(&alloc, &node, &envs, &states).is_empty(), "nothing runs yet");
        states.get_mut(&task).expect("the task").state = TaskStatus::Running;
        let found = registrations(&alloc, &node, &envs, &states);
        let by_name: BTreeMap<&str, &ServiceRegistration> =
            found.iter().map(|registration| (registration.service_name.as_str(), registration)).collect();
        assert_eq!(by_name.len(), 3, "{found:#?}");
        let lb = by_name["shop-lb"];
        assert_eq!((lb.address.as_str(), lb.port), ("10.0.0.5", 23456), "the allocated host port");
        assert_eq!(lb.id, format!("_nomad-task-{}-group-{}-shop-lb-http", alloc.id, alloc.task_group));
        let api = by_name[format!("{task}-api").as_str()];
        assert_eq!(api.tags, vec!["dc=dc1".to_string()], "interpolated");
        let metrics = by_name["metrics"];
        assert_eq!((metrics.address.as_str(), metrics.port), ("10.9.9.9", 9100), "address and a number as port");
        let killing = TaskEvent::new(TaskEvent::KILLING, engine::clock::Timestamp(1), "Sent SIGINT");
        states.get_mut(&task).expect("the task").push_event(killing);
        assert!(registrations(&alloc, &node, &envs, &states).is_empty(), "a task being stopped has none");
        states.get_mut(&task).expect("the task").state = TaskStatus::Dead;
        assert!(registrations(&alloc, &node, &envs, &states).is_empty(), "a dead task has none");
    }
}
