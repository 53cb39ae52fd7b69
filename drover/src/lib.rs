//! The `drover` agent: the server (the engine behind its QUIC endpoint and
//! the HTTP API), the client agent with its task drivers, the typed API
//! model and client the CLI shares with the server, and the CLI with the
//! process wiring of `server`, `agent` and `dev`. The binary is
//! `src/main.rs`; loadgen and the tests use the same parts from here.
//!
//! Layers, lowest first (`tests/layers.rs` checks them on the source):
//! - `config`, `logging`, `tls_files`, `listener`: what every process uses.
//! - `api`: the HTTP API's typed model, its formats, the job file reader
//!   and the API client.
//! - `client`: the client agent; it imports nothing from `server`, `http`
//!   or `cli`.
//! - `server` and `http`: the server process and its HTTP API.
//! - `cli`: the commands; they reach a server only through `api`, and only
//!   `cli/run/` (the process wiring) imports `server` and `client`.

#![forbid(unsafe_code)]

pub mod api;
pub mod cli;
pub mod client;
pub mod config;
pub mod http;
pub mod listener;
pub mod logging;
pub mod server;
pub mod tls_files;
