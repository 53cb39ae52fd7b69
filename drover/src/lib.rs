//! The `drover` agent: the server (the engine behind its QUIC endpoint),
//! the client agent with the `mock` driver, their configuration, and the
//! `drover` CLI's commands. The binary is `src/main.rs`; loadgen and the
//! tests use the same parts from here.

#![forbid(unsafe_code)]

pub mod agent;
pub mod api_client;
pub mod cli;
pub mod config;
pub mod http;
pub mod identity;
pub mod logging;
pub mod mock;
pub mod server;
pub mod tls_files;
