//! The client agent: it registers its node, heartbeats, watches its
//! allocations and runs them with its task drivers.
//!
//! - `state/`: the client core (`ClientState`): what to connect, call,
//!   start, stop, report and resync, as events in and actions out; no I/O,
//!   no clock. `mod.rs` has the session protocol, `allocs.rs` the
//!   allocation rules. The agent, loadgen's clients and the simulation run it.
//! - `agent.rs`: the agent, the runtime around that core: QUIC calls, the
//!   allocation watch, the runners, the clock.
//! - `alloc_runner.rs`, `task_runner.rs`, `restarts.rs`: an allocation's
//!   tasks, their lifecycle and restart policy.
//! - `alloc_dir.rs`, `task_env.rs`, `logs.rs`: an allocation's directory,
//!   a task's environment, its log files; `services.rs` its service
//!   registrations, `checks.rs` their checks, `health.rs` the
//!   allocation's health from its tasks and checks; `template.rs` its
//!   templates (with `template_funcs.rs`), rendered from what
//!   `service_watch.rs` reads; `dispatch_payload.rs` writes a dispatched
//!   job's payload into the task's directory.
//! - `ops.rs`: the servers' calls on the agent's connection (logs, files,
//!   restarts, signals, stats, garbage collection); `fs.rs` reads the
//!   allocation directories for them, `stats.rs` the host's `/proc`.
//! - `identity.rs`: the node's persistent id and secret; `clock.rs` the
//!   wall clock of task events and stats.
//! - `fingerprint.rs`: what the host is (address, CPU, memory, OS, kernel,
//!   storage), read from the host as Nomad's attributes.
//! - `drivers/`: the task drivers.

pub mod agent;
pub mod alloc_dir;
pub mod alloc_runner;
pub mod beneath;
pub mod checks;
pub mod clock;
pub mod dispatch_payload;
pub mod drivers;
pub mod fingerprint;
pub mod fs;
pub mod health;
pub mod identity;
pub mod logs;
pub mod ops;
pub mod restarts;
pub mod service_watch;
pub mod services;
pub mod state;
pub mod stats;
pub mod task_env;
pub mod task_runner;
pub mod template;
