//! The domain model: nodes, jobs, allocations, evaluations and plans;
//! the placement preferences jobs carry (affinities, spreads), their
//! network ports, services and templates, the cluster's scheduler configuration, and
//! the service registrations clients make for their allocations.
//!
//! Everything here is plain data, serializable with serde, so that it can be
//! carried inside state-store `Command`s, written to a log and sent on the
//! wire. Names follow Nomad's `structs` package so that its documentation maps
//! onto ours.

mod acl;
mod affinity;
mod alloc;
mod constraint;
mod deployment;
mod dispatch;
mod docker_config;
mod duration;
mod eval;
mod health;
mod ids;
mod job;
pub mod job_refs;
mod namespace;
mod network;
mod node;
mod periodic;
mod plan;
mod resources;
mod scheduler_config;
mod service;
mod service_registration;
mod spread;
mod task_config;
mod task_state;
mod template;

pub use acl::{glob_matches, AclLevel, AclPolicy, AclRules, AclState, AclToken, AclTokenType, Capabilities};
pub use affinity::Affinity;
pub use alloc::{AllocMetric, AllocState, Allocation, ClientStatus, DesiredStatus, RescheduleEvent};
pub use constraint::{
    constraint_syntax_problem, set_contains, version_matches, Constraint, ConstraintOperand, Version,
};
pub use deployment::{deployment_description, Deployment, DeploymentGroup, DeploymentStatus, DeploymentStatusUpdate};
pub use dispatch::{
    compress_payload, decompress_payload, derive_dispatched, dispatched_id, DispatchCheckError, DispatchPayloadConfig,
    ParameterizedJobConfig, PayloadRule, DISPATCH_PAYLOAD_SIZE_LIMIT,
};
pub use docker_config::{
    DockerAuth, DockerConfig, DockerLogging, DockerMount, MountKind, DEFAULT_IMAGE_PULL_TIMEOUT, DOCKER,
};
pub use duration::{format_duration, human_duration, DurationError};
pub use eval::{EvalStatus, Evaluation, TriggerReason};
pub use health::{AllocHealth, CheckMode, CheckResult, CheckResultStatus, HealthCheckMode, HealthPolicy};
pub use ids::{seed_thread_ids, AllocId, DeploymentId, EvalId, JobKey, NodeId};
pub use job::{
    DelayFunction, Job, JobType, JobValidationError, MigrateStrategy, ReconcileStrategy, ReschedulePolicy, RestartMode,
    RestartPolicy, Task, TaskGroup, UpdateStrategy, DEFAULT_NAMESPACE, MAX_GROUP_COUNT,
};
pub use namespace::{namespace_name_problem, Namespace, MAX_NAMESPACE_DESCRIPTION_LEN, MAX_NAMESPACE_NAME_LEN};
pub use network::{
    port_env, AllocatedPort, HostNetwork, NetworkResource, NodeNetwork, Port, PortListError, PortSet,
    DEFAULT_MAX_DYNAMIC_PORT, DEFAULT_MIN_DYNAMIC_PORT, NOMAD_ENV_PREFIX,
};
pub use node::{
    ComputedClass, DrainDeadline, DrainMetadata, DrainStatus, DrainStrategy, Node, NodeDrain, NodeEligibility,
    NodeHold, NodeStatus,
};
pub use periodic::{PeriodicConfig, PeriodicError, DEFAULT_TIME_ZONE, SPEC_TYPE_CRON};
pub use plan::{Plan, PlanResult};
pub use resources::Resources;
pub use scheduler_config::{PreemptionConfig, SchedulerAlgorithm, SchedulerConfiguration};
pub use service::{
    service_name_problem, AddressMode, CheckKind, CheckRestart, CheckStatus, OnUpdate, Service, ServiceCheck,
    ServiceProvider, CHECK_METHODS, MAX_SERVICE_NAME_LEN, MIN_CHECK_INTERVAL,
};
pub use service_registration::{ServiceOwner, ServiceRegistration, SERVICE_ID_PREFIX};
pub use spread::{Spread, SpreadTarget};
pub use task_config::{ConfigValue, LogConfig, RawExecConfig, DEFAULT_KILL_SIGNAL, KILL_SIGNALS, MOCK, RAW_EXEC};
pub use task_state::{TaskEvent, TaskState, TaskStatus, MAX_TASK_EVENTS};
pub use template::{
    climbs_out, destination_problem, parse_perms, ChangeMode, Template, DEFAULT_TEMPLATE_PERMS, DEFAULT_TEMPLATE_SPLAY,
};
