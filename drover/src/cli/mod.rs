//! The `drover` CLI: [`Cli`] parses the command line and [`dispatch`] runs
//! the command. Exit codes: 0 success, 1 a failure while running, 2 a bad
//! configuration or command line ([`Failure`]).
//!
//! The commands that talk to a server's HTTP API print as Nomad's CLI
//! prints (aligned tables, the eval monitor), with `--json` on every read.
//! One file per command group, its clap definitions beside the code that
//! runs them: `job.rs`, `deployment.rs` (with `deployment_monitor.rs`),
//! `node.rs`, `alloc.rs`, `eval.rs`, `event.rs`,
//! `operator.rs`,
//! `acl.rs`, `service.rs`, `server.rs` (members, workers, `status`),
//! `tls.rs`. They
//! reach a server only through `crate::api`. `run/` is the process wiring
//! of `drover server`, `agent`, `dev` and the internal `executor`.
//!
//! The address, token and CA come from `--address`, `--token` and
//! `--ca-cert`, else `DROVER_ADDR`, `DROVER_TOKEN` and `DROVER_CACERT`,
//! else Nomad's `NOMAD_ADDR`, `NOMAD_TOKEN`, `NOMAD_CACERT`; the address
//! defaults to `http://127.0.0.1:4646`.

pub mod acl;
pub mod alloc;
pub mod deployment;
pub mod deployment_monitor;
pub mod eval;
pub mod event;
pub mod job;
pub mod job_parent;
pub mod job_plan;
pub mod namespace;
pub mod node;
pub mod node_drain;
pub mod operator;
pub mod run;
pub mod server;
pub mod service;
pub mod tls;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use serde::Serialize;

use crate::api::client::ApiClient;
use crate::config::ConfigError;
use run::agent::AgentArgs;
use run::dev::DevArgs;
use server::ServerCli;

/// Drover: a cluster workload scheduler.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Top,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Top {
    /// Runs a server: the scheduler behind its QUIC endpoint (UDP 4647) and
    /// its HTTP API (TCP 4646); `drover server members` lists the servers.
    Server(ServerCli),
    /// Runs a client agent: registers this machine as a node and runs what
    /// the servers place on it.
    Agent(AgentArgs),
    /// A server and a client agent in one process, in memory, with a
    /// throwaway CA and the raw_exec and mock drivers: the quickest way to
    /// try Drover.
    Dev(DevArgs),
    /// Makes the cluster's CA and certificates.
    Tls {
        #[command(subcommand)]
        command: tls::TlsCommand,
    },
    /// Works with jobs: run, plan, status, stop, scale, dispatch, periodic force, validate.
    Job {
        #[command(subcommand)]
        command: job::JobCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Deployments: list, status, promote, fail, pause, resume.
    Deployment {
        #[command(subcommand)]
        command: deployment::DeploymentCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Client nodes: status, eligibility.
    Node {
        #[command(subcommand)]
        command: node::NodeCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Allocations: status, logs, fs, restart, signal, stop.
    Alloc {
        #[command(subcommand)]
        command: alloc::AllocCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Evaluations: status.
    Eval {
        #[command(subcommand)]
        command: eval::EvalCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// The event stream: every change to the cluster as it happens.
    Event {
        #[command(subcommand)]
        command: event::EventCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Cluster operations: the scheduling workers.
    Operator {
        #[command(subcommand)]
        command: operator::OperatorCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Nomad-native service discovery: list, info, delete.
    Service {
        #[command(subcommand)]
        command: service::ServiceCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Namespaces: list, status, apply, delete.
    Namespace {
        #[command(subcommand)]
        command: namespace::NamespaceCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// ACL tokens and policies (with `acl.enabled` on the servers).
    Acl {
        #[command(subcommand)]
        command: acl::AclCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// The job list, or the status of whatever a prefix names.
    Status {
        /// A job id, or an allocation, evaluation or node id prefix.
        prefix: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
}

/// A failure and the exit code it gets.
#[derive(Debug)]
pub enum Failure {
    /// A bad configuration or command line: exit code 2.
    Config(anyhow::Error),
    /// A failure while running: exit code 1.
    Run(anyhow::Error),
    /// A CLI command that ran and asks for this exit code (the eval
    /// monitor's 2 when placements failed).
    Exit(u8),
}

/// Runs a CLI command against the HTTP API; its answer is the exit code.
pub fn client_command<F, Fut>(api: &ApiArgs, command: F) -> Result<(), Failure>
where
    F: FnOnce(ApiClient) -> Fut,
    Fut: std::future::Future<Output = Result<i32>>,
{
    let client = api.client().map_err(Failure::Config)?;
    match run(command(client)) {
        Ok(0) => Ok(()),
        Ok(code) => Err(Failure::Exit(u8::try_from(code).unwrap_or(1))),
        Err(error) => Err(Failure::Run(error)),
    }
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(error: E) -> Self {
        let error = error.into();
        if error.downcast_ref::<ConfigError>().is_some() {
            Failure::Config(error)
        } else {
            Failure::Run(error)
        }
    }
}

/// Runs the command `cli` names.
pub fn dispatch(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Top::Server(server) => server::command(server),
        Top::Agent(args) => run::agent::run(args),
        Top::Dev(args) => run::dev::run(args),
        Top::Tls { command } => tls::command(command).map_err(Failure::Run),
        Top::Job { command, api } => job::command(command, &api),
        Top::Deployment { command, api } => deployment::command(command, &api),
        Top::Node { command, api } => node::command(command, &api),
        Top::Alloc { command, api } => alloc::command(command, &api),
        Top::Eval { command, api } => eval::command(command, &api),
        Top::Event { command, api } => event::command(command, &api),
        Top::Operator { command, api } => operator::command(command, &api),
        Top::Acl { command, api } => acl::command(command, &api),
        Top::Namespace { command, api } => namespace::command(command, &api),
        Top::Service { command, api } => service::command(command, &api),
        Top::Status { prefix, json, api } => {
            client_command(&api, |client| async move { server::status(&client, prefix.as_deref(), json).await })
        }
    }
}

/// The exit code of a command's outcome, its error printed.
pub fn exit_code(outcome: Result<(), Failure>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Exit(code)) => ExitCode::from(code),
        Err(Failure::Config(error)) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
        Err(Failure::Run(error)) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// How to reach the API: on every command that talks to a server.
#[derive(Clone, Debug, Default, Args)]
pub struct ApiArgs {
    /// The server's HTTP API (`DROVER_ADDR`; default http://127.0.0.1:4646).
    #[arg(long, global = true)]
    pub address: Option<String>,
    /// ACL token (`DROVER_TOKEN`).
    #[arg(long, global = true)]
    pub token: Option<String>,
    /// The cluster CA certificate, for HTTPS (`DROVER_CACERT`).
    #[arg(long, global = true)]
    pub ca_cert: Option<PathBuf>,
    /// The namespace requests name (`DROVER_NAMESPACE` or
    /// `NOMAD_NAMESPACE`; none: `default`; `*` on a list: all).
    #[arg(long, global = true)]
    pub namespace: Option<String>,
}

fn env_or(primary: &str, nomad: &str) -> Option<String> {
    std::env::var(primary).ok().or_else(|| std::env::var(nomad).ok()).filter(|value| !value.is_empty())
}

impl ApiArgs {
    /// The client these settings describe.
    pub fn client(&self) -> Result<ApiClient> {
        let address = self
            .address
            .clone()
            .or_else(|| env_or("DROVER_ADDR", "NOMAD_ADDR"))
            .unwrap_or_else(|| "http://127.0.0.1:4646".to_string());
        let token = self.token.clone().or_else(|| env_or("DROVER_TOKEN", "NOMAD_TOKEN"));
        let ca = self.ca_cert.clone().or_else(|| env_or("DROVER_CACERT", "NOMAD_CACERT").map(PathBuf::from));
        let ca_pem = match &ca {
            Some(path) => Some(std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?),
            None => None,
        };
        let namespace = self.namespace.clone().or_else(|| env_or("DROVER_NAMESPACE", "NOMAD_NAMESPACE"));
        Ok(ApiClient::new(&address, token, ca_pem.as_deref())?.with_namespace(namespace))
    }
}

/// Runs a CLI command's future on a small runtime of its own.
pub fn run<T>(future: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?.block_on(future)
}

/// Prints rows as Nomad's CLI does (columnize): left-aligned columns two
/// spaces apart, the header first.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|cell| cell.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let mut line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        for (position, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            text.push_str(cell);
            if position < last {
                text.push_str(&" ".repeat(width - cell.chars().count() + 2));
            }
        }
        text.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    text
}

/// `key = value` lines aligned on `=`, as Nomad prints an object's fields.
pub fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(key, _)| key.len()).max().unwrap_or(0);
    pairs.iter().map(|(key, value)| format!("{key:<width$} = {value}\n")).collect()
}

/// The first 8 characters of an id, as Nomad's short ids.
pub fn short(id: &str) -> String {
    id.chars().take(8).collect()
}

/// Unix nanoseconds as `2006-01-02T15:04:05Z`.
pub fn date(nanos: u64) -> String {
    match nanos {
        0 => "-".to_string(),
        _ => crate::api::format::date(engine::clock::Timestamp(nanos)),
    }
}

/// How long ago Unix nanoseconds were, as Nomad's `prettyTimeDiff`.
pub fn ago(nanos: u64) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let seconds = now.saturating_sub(nanos) / 1_000_000_000;
    match seconds {
        0..=59 => format!("{seconds}s ago"),
        60..=3599 => format!("{}m{}s ago", seconds / 60, seconds % 60),
        3600..=86_399 => format!("{}h{}m ago", seconds / 3600, seconds / 60 % 60),
        _ => format!("{}d{}h ago", seconds / 86_400, seconds / 3600 % 24),
    }
}

/// Prints `value` as indented JSON (`--json`).
pub fn print_json(value: &impl Serialize) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_as_nomad_prints_them() {
        let rows = vec![vec!["example".to_string(), "service".to_string(), "50".to_string()]];
        assert_eq!(table(&["ID", "Type", "Priority"], &rows), "ID       Type     Priority\nexample  service  50\n");
        assert_eq!(fields(&[("ID", "x".into()), ("Status", "ok".into())]), "ID     = x\nStatus = ok\n");
        assert_eq!(date(1_700_000_000_123_456_789), "2023-11-14T22:13:20Z");
    }
}
