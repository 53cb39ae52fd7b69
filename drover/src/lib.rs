//! The `drover` agent: the server (the engine behind its QUIC endpoint),
//! the client agent with the `raw_exec` and `mock` drivers (and the task
//! executor process), their configuration, and the
//! `drover` CLI's commands. The binary is `src/main.rs`; loadgen and the
//! tests use the same parts from here.

#![forbid(unsafe_code)]

pub mod agent;
pub mod alloc_dir;
pub mod alloc_runner;
pub mod api_client;
pub mod cli;
pub mod client_fs;
pub mod cluster;
pub mod config;
pub mod executor;
pub mod http;
pub mod identity;
pub mod isolation;
pub mod logging;
pub mod logs;
pub mod mock;
pub mod raw_exec;
pub mod restarts;
pub mod server;
pub mod task_env;
pub mod task_runner;
pub mod timers;
pub mod tls_files;
