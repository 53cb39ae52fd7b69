//! The domain model: nodes, jobs, allocations, evaluations and plans.
//!
//! Everything here is plain data, serializable with serde, so that it can be
//! carried inside state-store `Command`s, written to a log and sent on the
//! wire. Names follow Nomad's `structs` package so that its documentation maps
//! onto ours.

mod alloc;
mod constraint;
mod duration;
mod eval;
mod ids;
mod job;
pub mod job_refs;
mod node;
mod plan;
mod resources;
mod task_config;
mod task_state;

pub use alloc::{AllocMetric, AllocState, Allocation, ClientStatus, DesiredStatus, RescheduleEvent};
pub use constraint::{constraint_syntax_problem, version_matches, Constraint, ConstraintOperand, Version};
pub use duration::human_duration;
pub use eval::{EvalStatus, Evaluation, TriggerReason};
pub use ids::{seed_thread_ids, AllocId, EvalId, JobKey, NodeId};
pub use job::{
    DelayFunction, Job, JobType, JobValidationError, ReschedulePolicy, RestartMode, RestartPolicy, Task, TaskGroup,
    UpdateStrategy, DEFAULT_NAMESPACE, MAX_GROUP_COUNT,
};
pub use node::{ComputedClass, Node, NodeEligibility, NodeStatus};
pub use plan::{Plan, PlanResult};
pub use resources::Resources;
pub use task_config::{ConfigValue, LogConfig, RawExecConfig, DEFAULT_KILL_SIGNAL, KILL_SIGNALS, MOCK, RAW_EXEC};
pub use task_state::{TaskEvent, TaskState, TaskStatus, MAX_TASK_EVENTS};
