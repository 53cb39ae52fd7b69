//! The `drover` binary: `drover server`, `drover agent`, `drover dev`,
//! `drover tls ...` and `drover job validate`. Exit codes: 0 success, 1 a
//! failure while running, 2 a bad configuration or command line.
//!
//! `drover executor ...` is internal: the agent runs each `raw_exec` task
//! under one (see `executor.rs`); it is not parsed by clap, so a task's
//! arguments pass through untouched.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use drover::agent::{Agent, AgentSettings, NoObserver, TaskSettings};
use drover::cli::{self, ApiArgs};
use drover::client_fs::ClientFs;
use drover::config::{ConfigError, FileConfig};
use drover::server::{ClusterOptions, DurableOptions, HttpOptions, RunningServer, ServerOptions};
use drover::task_env::EnvDenylist;
use engine::server::ServerConfig;
use engine::structs::{Job, JobType, Node, NodeEligibility, NodeStatus, Resources};
use tokio::sync::watch;
use transport::client::ClientEndpoints;
use transport::tls::{Role, TlsMaterial};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Drover: a cluster workload scheduler.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Top,
}

#[derive(Debug, Subcommand)]
enum Top {
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
        command: TlsCommand,
    },
    /// Works with jobs: run, status, stop, scale, validate.
    Job {
        #[command(subcommand)]
        command: JobCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Client nodes: status, eligibility.
    Node {
        #[command(subcommand)]
        command: NodeCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Allocations: status, logs.
    Alloc {
        #[command(subcommand)]
        command: AllocCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Evaluations: status.
    Eval {
        #[command(subcommand)]
        command: EvalCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Cluster operations: the scheduling workers.
    Operator {
        #[command(subcommand)]
        command: OperatorCommand,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// ACL tokens and policies (with `acl.enabled` on the servers).
    Acl {
        #[command(subcommand)]
        command: AclCommand,
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

/// `drover server`: run one, or `members`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
struct ServerCli {
    #[command(subcommand)]
    command: Option<ServerCommand>,
    #[command(flatten)]
    args: ServerArgs,
}

#[derive(Debug, Subcommand)]
enum ServerCommand {
    /// Lists the servers, as `nomad server members`.
    Members {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
}

#[derive(Debug, Subcommand)]
enum NodeCommand {
    /// The node list, or one node with its allocations.
    Status {
        /// A node id or prefix.
        id: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Marks a node eligible or ineligible for new placements.
    Eligibility {
        /// Eligible.
        #[arg(long, conflicts_with = "disable", required_unless_present = "disable")]
        enable: bool,
        /// Ineligible.
        #[arg(long)]
        disable: bool,
        /// A node id or prefix.
        id: String,
    },
}

#[derive(Debug, Subcommand)]
enum AllocCommand {
    /// One allocation, its tasks and their recent events.
    Status {
        /// An allocation id or prefix.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// A task's stdout (or stderr), read from the agent that runs it.
    Logs {
        /// An allocation id or prefix.
        id: String,
        /// The task (optional when the allocation runs one).
        task: Option<String>,
        /// Keep streaming what the task writes until it is dead.
        #[arg(short = 'f', long)]
        follow: bool,
        /// stderr instead of stdout.
        #[arg(long)]
        stderr: bool,
    },
}

#[derive(Debug, Subcommand)]
enum EvalCommand {
    /// One evaluation.
    Status {
        /// An evaluation id or prefix.
        id: String,
        /// Follow it as `job run` does.
        #[arg(long)]
        monitor: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum OperatorCommand {
    /// The scheduler.
    Scheduler {
        #[command(subcommand)]
        command: SchedulerCommand,
    },
    /// Snapshots of the whole state: save one from a running server,
    /// restore one into a stopped server's data dir.
    Snapshot {
        #[command(subcommand)]
        command: SnapshotCommand,
    },
    /// The raft log.
    Raft {
        #[command(subcommand)]
        command: RaftCommand,
    },
}

#[derive(Debug, Subcommand)]
enum AclCommand {
    /// Makes the first management token (once per cluster) and prints it.
    Bootstrap {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Policies: apply, list, delete.
    Policy {
        #[command(subcommand)]
        command: AclPolicyCommand,
    },
    /// Tokens: create, list, self, delete.
    Token {
        #[command(subcommand)]
        command: AclTokenCommand,
    },
}

#[derive(Debug, Subcommand)]
enum AclPolicyCommand {
    /// Creates or replaces a policy from a file of Nomad's HCL rules.
    Apply {
        /// What it is for.
        #[arg(long)]
        description: Option<String>,
        /// The policy's name.
        name: String,
        /// The rules file.
        file: PathBuf,
    },
    /// Lists the policies.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Deletes a policy.
    Delete {
        /// The policy's name.
        name: String,
    },
}

#[derive(Debug, Subcommand)]
enum AclTokenCommand {
    /// Makes a token and prints it, secret included.
    Create {
        /// What it is for.
        #[arg(long, default_value = "")]
        name: String,
        /// `client` (what its policies grant) or `management` (anything).
        #[arg(long = "type", default_value = "client")]
        kind: String,
        /// A policy it has (repeat for more).
        #[arg(long = "policy")]
        policies: Vec<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Lists the tokens (without their secrets).
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The token this command runs with.
    #[command(name = "self")]
    Own {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Revokes a token.
    Delete {
        /// Its accessor id.
        accessor: String,
    },
}

#[derive(Debug, Subcommand)]
enum SnapshotCommand {
    /// Saves a snapshot of a running server's state to FILE (a backup).
    Save {
        /// Where to write it.
        file: PathBuf,
    },
    /// Makes FILE the state of a stopped server: its data dir then holds
    /// that snapshot and an empty log behind it.
    Restore {
        /// The stopped server's data dir (its `data_dir`, as given to
        /// `drover server`).
        #[arg(long)]
        data_dir: PathBuf,
        /// A snapshot saved with `drover operator snapshot save`.
        file: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum RaftCommand {
    /// The log's range, the last snapshot and its size: of a running
    /// server, or of a stopped one's data dir with --data-dir.
    Info {
        /// Read a stopped server's data dir instead of asking the server.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The cluster's servers: raft id, address, whether each votes and leads.
    ListPeers,
    /// Adds the server at ADDRESS (its server-to-server host:port, 4648)
    /// as a voter, once it has caught up.
    AddVoter {
        /// host:port of the new server's server-to-server endpoint.
        #[arg(value_name = "ADDRESS")]
        peer_address: String,
    },
    /// Removes a server from the cluster by its raft id (list-peers).
    RemovePeer {
        /// Its raft id.
        #[arg(long = "peer-id")]
        id: String,
    },
}

#[derive(Debug, Subcommand)]
enum SchedulerCommand {
    /// Lists the scheduling workers, sets how many run (`set N`), or
    /// pauses or resumes them (`pause [ID]`, `resume [ID]`: one, or all).
    Workers {
        /// `set`, `pause` or `resume`.
        action: Option<String>,
        /// How many workers with `set`; a worker's id with `pause` or `resume`.
        count: Option<usize>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Options both agents share.
#[derive(Debug, Args)]
struct Common {
    /// The configuration file (TOML; see the README).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Dev mode: a throwaway CA in memory (server) or the mock driver and
    /// a temporary data dir (agent). Never in production.
    #[arg(long)]
    dev: bool,
    /// The cluster CA certificate.
    #[arg(long)]
    ca_file: Option<PathBuf>,
    /// This agent's certificate.
    #[arg(long)]
    cert_file: Option<PathBuf>,
    /// This agent's key.
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// error, warn, info, debug or trace.
    #[arg(long)]
    log_level: Option<String>,
    /// Logs as JSON lines.
    #[arg(long)]
    log_json: bool,
    /// Where the agent keeps its state.
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct ServerArgs {
    #[command(flatten)]
    common: Common,
    /// Address to bind the client endpoint to.
    #[arg(long)]
    bind: Option<IpAddr>,
    /// UDP port of the client endpoint (0: any free port).
    #[arg(long)]
    port: Option<u16>,
    /// The address clients are told to use.
    #[arg(long)]
    advertise: Option<String>,
    /// Scheduling workers.
    #[arg(long)]
    workers: Option<usize>,
    /// Scheduler types to serve, comma-separated.
    #[arg(long, value_delimiter = ',')]
    schedulers: Option<Vec<String>>,
    /// Shortest heartbeat TTL (e.g. 10s).
    #[arg(long, value_parser = humantime::parse_duration)]
    min_heartbeat_ttl: Option<Duration>,
    /// Extra time past a node's TTL before it is given up on.
    #[arg(long, value_parser = humantime::parse_duration)]
    heartbeat_grace: Option<Duration>,
    /// Cluster-wide heartbeat rate the TTL is scaled to.
    #[arg(long)]
    max_heartbeats_per_second: Option<f64>,
    /// Print the bound addresses as `listening <addr>` (and `http <addr>`)
    /// on stdout once ready (for scripts, tests and loadgen).
    #[arg(long)]
    print_address: bool,
    /// TCP port of the HTTP API (Nomad's 4646; 0: any free port).
    #[arg(long)]
    http_port: Option<u16>,
    /// Address the HTTP API binds (default: the client endpoint's).
    #[arg(long)]
    http_bind: Option<IpAddr>,
    /// Serve no HTTP API.
    #[arg(long)]
    no_http: bool,
    /// Raft entries between snapshots of the state (default 20000).
    #[arg(long)]
    snapshot_every: Option<u64>,
    /// Every HTTP API request needs an ACL token (`acl.enabled`).
    #[arg(long)]
    acl_enabled: bool,
    /// Form a cluster of this many servers (with --join); a server given
    /// --bootstrap-expect or --join is one of a cluster.
    #[arg(long)]
    bootstrap_expect: Option<usize>,
    /// Server-to-server addresses (host:port) of other servers, comma-separated.
    #[arg(long, value_delimiter = ',')]
    join: Option<Vec<String>>,
    /// UDP port of the server-to-server endpoint (raft, forwarding; 4648; 0: any free port).
    #[arg(long)]
    peer_port: Option<u16>,
    /// This server's name (default: the host name).
    #[arg(long)]
    name: Option<String>,
}

#[derive(Debug, Args)]
struct AgentArgs {
    #[command(flatten)]
    common: Common,
    /// Servers to connect to (host:port), comma-separated.
    #[arg(long, value_delimiter = ',')]
    servers: Option<Vec<String>>,
    /// Node name.
    #[arg(long)]
    name: Option<String>,
    /// Datacenter.
    #[arg(long)]
    datacenter: Option<String>,
    /// Node class.
    #[arg(long)]
    node_class: Option<String>,
    /// Offer the mock driver (on with --dev).
    #[arg(long)]
    mock_driver: bool,
    /// Offer the raw_exec driver: tasks run as processes of this machine,
    /// without isolation (on with --dev).
    #[arg(long)]
    raw_exec: bool,
    /// Address of the agent's HTTP listener (task logs), with raw_exec
    /// (default 127.0.0.1:4646; port 0: any free port).
    #[arg(long)]
    http_addr: Option<String>,
}

#[derive(Debug, Args)]
struct DevArgs {
    /// UDP port of the server's client endpoint (0: any free port).
    #[arg(long, default_value_t = 4647)]
    port: u16,
    /// TCP port of the HTTP API, plain HTTP in dev mode (0: any free port).
    #[arg(long, default_value_t = 4646)]
    http_port: u16,
    /// Print the bound addresses as `listening <addr>` and `http <addr>`
    /// on stdout once ready.
    #[arg(long)]
    print_address: bool,
    /// Keep the server's state here (durable across restarts) instead of
    /// in memory; the agent's allocation directories go here too.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Job specs (JSON) to register once the agent is up.
    #[arg(long)]
    job: Vec<PathBuf>,
    /// Address of the dev agent's own HTTP listener (task logs,
    /// `/v1/client/fs/logs`), apart from the API's.
    #[arg(long, default_value = "127.0.0.1:0")]
    agent_http_addr: String,
    /// error, warn, info, debug or trace.
    #[arg(long, default_value = "info")]
    log_level: String,
}

#[derive(Debug, Subcommand)]
enum TlsCommand {
    /// Makes the cluster CA.
    Ca {
        #[command(subcommand)]
        command: TlsCaCommand,
    },
    /// Makes a certificate signed by the cluster CA.
    Cert {
        #[command(subcommand)]
        command: TlsCertCommand,
    },
}

#[derive(Debug, Subcommand)]
enum TlsCaCommand {
    /// Writes drover-agent-ca.pem and drover-agent-ca-key.pem.
    Create {
        /// Where to write.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum TlsCertCommand {
    /// Writes global-{server,client,cli}-drover.pem and its key.
    Create {
        /// A server certificate.
        #[arg(long, conflicts_with_all = ["client", "cli"], required_unless_present_any = ["client", "cli"])]
        server: bool,
        /// A client (agent) certificate.
        #[arg(long, conflicts_with = "cli")]
        client: bool,
        /// An operator certificate: a client certificate that may also
        /// register jobs and read the cluster report (loadgen --server).
        #[arg(long)]
        cli: bool,
        /// The CA certificate.
        #[arg(long, default_value = "drover-agent-ca.pem")]
        ca: PathBuf,
        /// The CA key.
        #[arg(long, default_value = "drover-agent-ca-key.pem")]
        key: PathBuf,
        /// Extra DNS names or IP addresses for the certificate.
        #[arg(long = "additional-dnsname")]
        names: Vec<String>,
        /// Where to write.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum JobCommand {
    /// Reads a JSON job spec and lists every problem in it.
    Validate {
        /// Path to the job spec (JSON).
        path: PathBuf,
    },
    /// Registers a job from a file of Nomad's job JSON and follows its
    /// evaluation (exit 2 when placements failed).
    Run {
        /// The job file.
        path: PathBuf,
        /// Do not follow the evaluation.
        #[arg(long)]
        detach: bool,
    },
    /// The job list, or one job with its summary and allocations.
    Status {
        /// A job id or prefix.
        id: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stops a job (removes it with --purge).
    Stop {
        /// A job id or prefix.
        id: String,
        /// Remove the job, not only stop it.
        #[arg(long)]
        purge: bool,
        /// Do not follow the evaluation.
        #[arg(long)]
        detach: bool,
    },
    /// Sets how many allocations a task group runs.
    Scale {
        /// The job id.
        id: String,
        /// The group (optional when the job has one) and the count.
        #[arg(num_args = 1..=2, required = true)]
        group_and_count: Vec<String>,
        /// Do not follow the evaluation.
        #[arg(long)]
        detach: bool,
    },
}

/// A failure and the exit code it gets.
enum Failure {
    Config(anyhow::Error),
    Run(anyhow::Error),
    /// A CLI command that ran and asks for this exit code (the eval
    /// monitor's 2 when placements failed).
    Exit(u8),
}

/// Runs a CLI command against the HTTP API; its answer is the exit code.
fn client_command<F, Fut>(api: &ApiArgs, command: F) -> Result<(), Failure>
where
    F: FnOnce(drover::api_client::ApiClient) -> Fut,
    Fut: std::future::Future<Output = Result<i32>>,
{
    let client = api.client().map_err(Failure::Config)?;
    match cli::run(command(client)) {
        Ok(0) => Ok(()),
        Ok(code) => Err(Failure::Exit(u8::try_from(code).unwrap_or(1))),
        Err(error) => Err(Failure::Run(error)),
    }
}

fn snapshot_command(command: SnapshotCommand, api: &ApiArgs) -> Result<(), Failure> {
    match command {
        SnapshotCommand::Save { file } => {
            client_command(api, |client| async move { cli::operator::snapshot_save(&client, &file).await })
        }
        SnapshotCommand::Restore { data_dir, file } => {
            let dir = storage::DataDir::new(data_dir.join("server"));
            let header = replication::restore(&dir, &file).map_err(|error| {
                anyhow::anyhow!("restoring {} into {}: {error}", file.display(), dir.root().display())
            })?;
            println!(
                "Restored {} into {}: store index {}; start the server to serve it",
                file.display(),
                dir.root().display(),
                header.store_index
            );
            Ok(())
        }
    }
}

fn job_command(command: JobCommand, api: &ApiArgs) -> Result<(), Failure> {
    client_command(api, |client| async move {
        match command {
            JobCommand::Run { path, detach } => cli::job::run(&client, &path, detach).await,
            JobCommand::Status { id, json } => cli::job::status(&client, id.as_deref(), json).await,
            JobCommand::Stop { id, purge, detach } => cli::job::stop(&client, &id, purge, detach).await,
            JobCommand::Scale { id, group_and_count, detach } => {
                let (group, count) = match group_and_count.as_slice() {
                    [count] => (None, count),
                    [group, count] => (Some(group.as_str()), count),
                    _ => anyhow::bail!("usage: drover job scale ID [GROUP] COUNT"),
                };
                let count: u32 = count.parse().map_err(|_| anyhow::anyhow!("count {count:?} is not a number"))?;
                cli::job::scale(&client, &id, group, count, detach).await
            }
            JobCommand::Validate { path } => validate(&path).map(|()| 0),
        }
    })
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

fn main() -> ExitCode {
    let mut raw_args = std::env::args_os().skip(1);
    if raw_args.next().is_some_and(|first| first == "executor") {
        return executor(raw_args.collect());
    }
    transport::install_crypto_provider();
    let outcome = match Cli::parse().command {
        Top::Server(ServerCli { command: None, args }) => server(args),
        Top::Server(ServerCli { command: Some(ServerCommand::Members { json, api }), .. }) => {
            client_command(&api, |client| async move { cli::server::members(&client, json).await })
        }
        Top::Agent(args) => agent(args),
        Top::Dev(args) => dev(args),
        Top::Tls { command } => tls(command).map_err(Failure::Run),
        Top::Job { command: JobCommand::Validate { path }, .. } => validate(&path).map_err(Failure::Run),
        Top::Job { command, api } => job_command(command, &api),
        Top::Node { command, api } => client_command(&api, |client| async move {
            match command {
                NodeCommand::Status { id, json } => cli::node::status(&client, id.as_deref(), json).await,
                NodeCommand::Eligibility { enable, id, .. } => cli::node::eligibility(&client, &id, enable).await,
            }
        }),
        Top::Alloc { command: AllocCommand::Status { id, json }, api } => {
            client_command(&api, |client| async move { cli::alloc::status(&client, &id, json).await })
        }
        Top::Alloc { command: AllocCommand::Logs { id, task, follow, stderr }, api } => {
            client_command(&api, |client| async move {
                cli::alloc::logs(&client, &id, task.as_deref(), stderr, follow).await
            })
        }
        Top::Eval { command: EvalCommand::Status { id, monitor, json }, api } => {
            client_command(&api, |client| async move { cli::eval::status(&client, &id, monitor, json).await })
        }
        Top::Operator { command: OperatorCommand::Snapshot { command }, api } => snapshot_command(command, &api),
        Top::Operator { command: OperatorCommand::Raft { command: RaftCommand::ListPeers }, api } => {
            client_command(&api, |client| async move { cli::operator::list_peers(&client).await })
        }
        Top::Operator { command: OperatorCommand::Raft { command: RaftCommand::AddVoter { peer_address } }, api } => {
            client_command(&api, |client| async move { cli::operator::add_voter(&client, &peer_address).await })
        }
        Top::Operator { command: OperatorCommand::Raft { command: RaftCommand::RemovePeer { id } }, api } => {
            client_command(&api, |client| async move { cli::operator::remove_peer(&client, &id).await })
        }
        Top::Operator { command: OperatorCommand::Raft { command: RaftCommand::Info { data_dir, json } }, api } => {
            match data_dir {
                Some(dir) => {
                    let dir = storage::DataDir::new(dir.join("server"));
                    match replication::offline_info(&dir) {
                        Ok(info) => cli::operator::print_raft_info(&info, json).map_err(Failure::Run),
                        Err(error) => Err(Failure::Run(anyhow::anyhow!("reading {}: {error}", dir.root().display()))),
                    }
                }
                None => client_command(&api, |client| async move { cli::operator::raft_info(&client, json).await }),
            }
        }
        Top::Operator { command: OperatorCommand::Scheduler { command }, api } => {
            let SchedulerCommand::Workers { action, count, json } = command;
            let action = match (action.as_deref(), count) {
                (None, _) => Ok(cli::server::WorkersAction::List),
                (Some("set"), Some(count)) => Ok(cli::server::WorkersAction::Set(count)),
                (Some("pause"), id) => Ok(cli::server::WorkersAction::Pause(id)),
                (Some("resume"), id) => Ok(cli::server::WorkersAction::Resume(id)),
                _ => Err(Failure::Config(anyhow::anyhow!(
                    "usage: drover operator scheduler workers [set N | pause [ID] | resume [ID]]"
                ))),
            };
            action.and_then(|action| {
                client_command(&api, |client| async move { cli::server::workers(&client, action, json).await })
            })
        }
        Top::Acl { command, api } => client_command(&api, |client| async move {
            match command {
                AclCommand::Bootstrap { json } => cli::acl::bootstrap(&client, json).await,
                AclCommand::Policy { command: AclPolicyCommand::Apply { description, name, file } } => {
                    cli::acl::policy_apply(&client, &name, description.as_deref(), &file).await
                }
                AclCommand::Policy { command: AclPolicyCommand::List { json } } => {
                    cli::acl::policy_list(&client, json).await
                }
                AclCommand::Policy { command: AclPolicyCommand::Delete { name } } => {
                    cli::acl::policy_delete(&client, &name).await
                }
                AclCommand::Token { command: AclTokenCommand::Create { name, kind, policies, json } } => {
                    cli::acl::token_create(&client, &name, &kind, &policies, json).await
                }
                AclCommand::Token { command: AclTokenCommand::List { json } } => {
                    cli::acl::token_list(&client, json).await
                }
                AclCommand::Token { command: AclTokenCommand::Own { json } } => {
                    cli::acl::token_self(&client, json).await
                }
                AclCommand::Token { command: AclTokenCommand::Delete { accessor } } => {
                    cli::acl::token_delete(&client, &accessor).await
                }
            }
        }),
        Top::Status { prefix, json, api } => {
            client_command(&api, |client| async move { cli::server::status(&client, prefix.as_deref(), json).await })
        }
    };
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

/// `drover executor <launch.json>` or `drover executor --gate <data limit|-> <command> <args...>`.
fn executor(args: Vec<std::ffi::OsString>) -> ExitCode {
    let code = match args.split_first() {
        Some((flag, [limit, command, task_args @ ..])) if flag == "--gate" => {
            let task_args: Vec<String> = task_args.iter().map(|arg| arg.to_string_lossy().into_owned()).collect();
            let limit = limit.to_str().and_then(|text| text.parse::<u64>().ok());
            drover::executor::gate(limit, Path::new(command), &task_args)
        }
        Some((spec, [])) => drover::executor::run(Path::new(spec)),
        _ => {
            eprintln!("drover executor is run by the agent, one per task");
            2
        }
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn config_error(key: &str, message: impl Into<String>) -> Failure {
    Failure::Config(ConfigError::Value { key: key.to_string(), message: message.into() }.into())
}

/// The file config, or the defaults.
fn file_config(common: &Common) -> Result<FileConfig, Failure> {
    match &common.config {
        Some(path) => Ok(FileConfig::load(path)?),
        None => Ok(FileConfig::default()),
    }
}

fn init_logs(common: &Common, file: &FileConfig) -> Result<(), Failure> {
    let level = common.log_level.clone().or(file.log_level.clone()).unwrap_or_else(|| "info".to_string());
    drover::logging::init(&level, common.log_json || file.log_json.unwrap_or(false))?;
    Ok(())
}

/// The TLS files from flags or the file; all three are needed.
fn tls_files(common: &Common, file: &FileConfig) -> Result<TlsMaterial, Failure> {
    let pick = |flag: &Option<PathBuf>, key: &Option<PathBuf>, name: &str| {
        flag.clone().or(key.clone()).ok_or_else(|| {
            config_error(&format!("tls.{name}"), "required (or --dev for a throwaway CA; see `drover tls --help`)")
        })
    };
    let ca = pick(&common.ca_file, &file.tls.ca_file, "ca_file")?;
    let cert = pick(&common.cert_file, &file.tls.cert_file, "cert_file")?;
    let key = pick(&common.key_file, &file.tls.key_file, "key_file")?;
    TlsMaterial::from_files(&ca, &cert, &key).map_err(|error| Failure::Config(error.into()))
}

/// Raises the soft open-files limit to the hard one: a server holds a
/// descriptor per HTTP connection and task log, and distributions often
/// start processes with a soft limit of 1,024. Says what it is either way.
fn raise_open_files_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    let raised = Rlimit { current: limit.maximum, maximum: limit.maximum };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => {
            tracing::info!(open_files = ?limit.maximum, "open files limit (RLIMIT_NOFILE) raised to the hard limit")
        }
        Err(error) => tracing::warn!(%error, open_files = ?limit.current, "could not raise the open files limit"),
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?)
}

/// The engine settings from the file and the flags.
fn engine_config(args: &ServerArgs, file: &FileConfig) -> Result<ServerConfig, Failure> {
    let mut config = ServerConfig::default();
    if let Some(workers) = args.workers.or(file.server.workers) {
        if workers == 0 {
            return Err(config_error("server.workers", "must be at least 1"));
        }
        config.workers = workers;
    }
    if let Some(names) = args.schedulers.clone().or(file.server.enabled_schedulers.clone()) {
        let mut types = Vec::new();
        for name in names {
            let found = JobType::ALL.into_iter().find(|kind| kind.as_str() == name.trim());
            types.push(found.ok_or_else(|| {
                config_error(
                    "server.enabled_schedulers",
                    format!("{name:?} is not one of service, batch, system, sysbatch"),
                )
            })?);
        }
        if types.is_empty() {
            return Err(config_error("server.enabled_schedulers", "must name at least one scheduler"));
        }
        config.worker_types = types;
    }
    if let Some(ttl) = args.min_heartbeat_ttl.or(file.server.min_heartbeat_ttl) {
        if ttl.is_zero() {
            return Err(config_error("server.min_heartbeat_ttl", "must be above zero"));
        }
        config.heartbeat.min_heartbeat_ttl = ttl;
    }
    if let Some(grace) = args.heartbeat_grace.or(file.server.heartbeat_grace) {
        config.heartbeat.heartbeat_grace = grace;
    }
    if let Some(rate) = args.max_heartbeats_per_second.or(file.server.max_heartbeats_per_second) {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(config_error("server.max_heartbeats_per_second", "must be a positive number"));
        }
        config.heartbeat.max_heartbeats_per_second = rate;
    }
    Ok(config)
}

fn server(args: ServerArgs) -> Result<(), Failure> {
    let file = file_config(&args.common)?;
    init_logs(&args.common, &file)?;
    raise_open_files_limit();
    let engine = engine_config(&args, &file)?;
    let bind_ip = match (args.bind, &file.server.bind_addr) {
        (Some(ip), _) => ip,
        (None, Some(text)) => {
            text.parse().map_err(|_| config_error("server.bind_addr", format!("{text:?} is not an IP address")))?
        }
        (None, None) => IpAddr::from([0, 0, 0, 0]),
    };
    let bind = SocketAddr::new(bind_ip, args.port.or(file.server.port).unwrap_or(4647));
    // A dev server without a data dir writes its client files to a
    // temporary directory that goes when it exits.
    let (tls, _dev_tls_dir) = if args.common.dev {
        dev_server_tls(args.common.data_dir.as_deref())?
    } else {
        (tls_files(&args.common, &file)?, None)
    };
    let http = if args.no_http {
        None
    } else {
        let http_ip = match (args.http_bind, &file.server.http_bind_addr) {
            (Some(ip), _) => ip,
            (None, Some(text)) => text
                .parse()
                .map_err(|_| config_error("server.http_bind_addr", format!("{text:?} is not an IP address")))?,
            (None, None) => bind_ip,
        };
        Some(HttpOptions {
            bind: SocketAddr::new(http_ip, args.http_port.or(file.server.http_port).unwrap_or(4646)),
            tls: !args.common.dev,
            verify_clients: file.server.verify_https_client.unwrap_or(false),
            name: server_name(&args, &file),
            datacenter: file.server.datacenter.clone().unwrap_or_else(|| "dc1".to_string()),
            acl_enabled: args.acl_enabled || file.acl.enabled.unwrap_or(false),
            limits: file.limits.http(),
        })
    };
    let durable = match args.common.data_dir.clone().or(file.data_dir.clone()) {
        Some(dir) => {
            let snapshot_every = args.snapshot_every.or(file.server.snapshot_every).unwrap_or(20_000);
            if snapshot_every == 0 {
                return Err(config_error("server.snapshot_every", "must be at least 1"));
            }
            Some(DurableOptions::under(&dir, replication::DurableConfig { snapshot_every }))
        }
        None if args.common.dev => {
            tracing::warn!("DEV MODE without a data dir: the state is kept in memory and lost when the server stops");
            None
        }
        None => {
            return Err(config_error(
                "data_dir",
                "required for a server: it holds the raft log and snapshots (or --dev to keep the state in memory)",
            ))
        }
    };
    let advertise = args.advertise.clone().or(file.server.advertise.clone());
    let cluster = cluster_options(&args, &file, bind_ip, advertise.as_deref())?;
    if cluster.is_some() && durable.is_none() {
        return Err(config_error("data_dir", "required for a server of a cluster: raft keeps its log there"));
    }
    let options = ServerOptions { bind, advertise, engine, tls, http, durable, cluster };
    drover::server::run_until_signal(options, args.print_address).map_err(Failure::Run)
}

fn server_name(args: &ServerArgs, file: &FileConfig) -> String {
    args.name.clone().or(file.name.clone()).unwrap_or_else(hostname)
}

/// The cluster a server is one of, if it was given `bootstrap_expect` or
/// `join`.
fn cluster_options(
    args: &ServerArgs,
    file: &FileConfig,
    bind_ip: IpAddr,
    advertise: Option<&str>,
) -> Result<Option<ClusterOptions>, Failure> {
    let bootstrap_expect = args.bootstrap_expect.or(file.server.bootstrap_expect);
    let join = args.join.clone().or(file.server.join.clone()).unwrap_or_default();
    if bootstrap_expect.is_none() && join.is_empty() {
        return Ok(None);
    }
    if bootstrap_expect == Some(0) {
        return Err(config_error("server.bootstrap_expect", "must be at least 1"));
    }
    let peer_port = args.peer_port.or(file.server.peer_port).unwrap_or(4648);
    let advertise_peer = match advertise {
        Some(addr) => match addr.rsplit_once(':') {
            Some((host, _)) => Some(format!("{host}:{peer_port}")),
            None => return Err(config_error("server.advertise", format!("{addr:?} is not host:port"))),
        },
        None => None,
    };
    Ok(Some(ClusterOptions {
        name: server_name(args, file),
        peer_bind: SocketAddr::new(bind_ip, peer_port),
        advertise_peer,
        // --join alone joins a cluster formed already; it never forms one.
        bootstrap_expect: bootstrap_expect.unwrap_or(0),
        join,
        hold: drover::cluster::HOLD,
    }))
}

/// `--dev` on a server: a throwaway CA in memory. Agents need a client
/// certificate of that CA, so it is written (the key readable by its owner
/// only) to `<data_dir>/dev-tls`, or without a data dir to a temporary
/// directory that is removed when the returned guard drops, and the log
/// names it, loudly.
fn dev_server_tls(data_dir: Option<&Path>) -> Result<(TlsMaterial, Option<tempfile::TempDir>), Failure> {
    let (_ca, server, client) = TlsMaterial::dev_pair()?;
    let (dir, temporary) = match data_dir {
        Some(dir) => (dir.join("dev-tls"), None),
        None => {
            let temporary = dev_temp_dir("drover-dev-tls-")?;
            (temporary.path().to_path_buf(), Some(temporary))
        }
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let files = [
        ("ca.pem", &client.ca_pem),
        ("client.pem", &client.identity.cert_pem),
        ("client-key.pem", &client.identity.key_pem),
    ];
    for (name, text) in files {
        let path = dir.join(name);
        if name.ends_with("-key.pem") {
            drover::tls_files::replace_key(&path, text)?;
        } else {
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        }
    }
    tracing::warn!(
        dir = %dir.display(),
        "DEV MODE: this server uses a throwaway CA generated in memory; it is NOT SECURE and lasts only as long as \
         this process. Agents connect with --ca-file {0}/ca.pem --cert-file {0}/client.pem --key-file {0}/client-key.pem",
        dir.display()
    );
    Ok((server, temporary))
}

/// A fresh private (0700) directory under the system's temporary one, for
/// a dev process that was given no data dir; removed when the guard drops
/// (a clean exit, or a failed start).
fn dev_temp_dir(prefix: &str) -> Result<tempfile::TempDir, Failure> {
    Ok(tempfile::Builder::new().prefix(prefix).tempdir().context("creating a temporary directory")?)
}

/// The node this machine is, from the file and the flags.
fn local_node(
    args: &AgentArgs,
    file: &FileConfig,
    identity: drover::identity::Identity,
    (mock, raw_exec): (bool, bool),
) -> Node {
    let client = &file.client;
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as u64;
    let resources = Resources::new(
        client.cpu_mhz.unwrap_or(cores * 2_000),
        client.memory_mb.unwrap_or_else(machine_memory_mb),
        client.disk_mb.unwrap_or(100_000),
    );
    let datacenter = args.datacenter.clone().or(client.datacenter.clone()).unwrap_or_else(|| "dc1".to_string());
    let class = args.node_class.clone().or(client.node_class.clone()).unwrap_or_default();
    let mut node = Node::new_ready(identity.node_id, &datacenter, &class, resources);
    node.secret_id = identity.secret_id;
    node.name = args.name.clone().or(client.name.clone()).unwrap_or_else(hostname);
    node.attributes.remove("driver.exec");
    node.attributes.insert("unique.hostname".to_string(), hostname());
    if mock {
        node.attributes.insert(format!("driver.{}", drover::mock::DRIVER), "1".to_string());
    }
    if raw_exec {
        node.attributes.insert(format!("driver.{}", engine::structs::RAW_EXEC), "1".to_string());
    }
    node.meta = client.meta.clone().unwrap_or_default();
    node.status = NodeStatus::Initializing;
    node.eligibility = NodeEligibility::Eligible;
    node.computed_class = node.compute_class();
    node
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_or_else(|_| "localhost".to_string(), |name| name.trim().to_string())
}

/// MemTotal from /proc/meminfo, in MiB (4 GiB if unreadable).
fn machine_memory_mb() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|line| line.starts_with("MemTotal:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(4_096, |kib| kib / 1024)
}

fn agent(args: AgentArgs) -> Result<(), Failure> {
    let file = file_config(&args.common)?;
    init_logs(&args.common, &file)?;
    raise_open_files_limit();
    let tls = tls_files(&args.common, &file)?;
    let servers_text =
        args.servers.clone().or(file.client.servers.clone()).unwrap_or_else(|| vec!["127.0.0.1:4647".to_string()]);
    let mut servers = Vec::new();
    for text in &servers_text {
        let addr = std::net::ToSocketAddrs::to_socket_addrs(text.as_str())
            .ok()
            .and_then(|mut addrs| addrs.next())
            .ok_or_else(|| config_error("client.servers", format!("{text:?} is not a host:port")))?;
        servers.push(addr);
    }
    // A dev agent without a data dir keeps its allocations in a temporary
    // directory that goes when it exits (its tasks are stopped first).
    let mut _dev_data_dir = None;
    let data_dir = match (&args.common.data_dir, &file.data_dir, args.common.dev) {
        (Some(dir), _, _) | (None, Some(dir), _) => dir.clone(),
        (None, None, true) => _dev_data_dir.insert(dev_temp_dir("drover-dev-agent-")?).path().to_path_buf(),
        (None, None, false) => return Err(config_error("data_dir", "required for an agent (or --dev)")),
    };
    let identity = drover::identity::load_or_create(&data_dir).context("the node identity")?;
    let data_dir = std::fs::canonicalize(&data_dir).with_context(|| format!("the data dir {}", data_dir.display()))?;
    let mock = args.mock_driver || args.common.dev || file.client.mock_driver.unwrap_or(false);
    let raw_exec = args.raw_exec || args.common.dev || file.client.raw_exec.unwrap_or(false);
    let http_addr =
        args.http_addr.clone().or(file.client.http_addr.clone()).unwrap_or_else(|| "127.0.0.1:4646".to_string());
    let http_addr: SocketAddr =
        http_addr.parse().map_err(|_| config_error("client.http_addr", format!("{http_addr:?} is not an ip:port")))?;
    let gc_max_allocs = file.client.gc_max_allocs.unwrap_or(50);
    let mut node = local_node(&args, &file, identity, (mock, raw_exec));
    let runtime = runtime()?;
    runtime.block_on(async move {
        let mut signals = drover::server::ShutdownSignals::catch()?;
        let endpoints = Arc::new(ClientEndpoints::bind(1, &tls)?);
        let quic = endpoints.own_config()?;
        let (stop, stopped) = watch::channel(false);
        let env_denylist = file.client.env_denylist.clone().map(EnvDenylist::new).unwrap_or_default();
        let client_side = ClientSide {
            data_dir,
            http_addr,
            gc_max_allocs,
            env_denylist,
            limits: file.limits.http(),
            stop_tasks_on_shutdown: args.common.dev,
        };
        let tasks = client_side.start(raw_exec, &mut node, stopped.clone()).await?;
        tracing::info!(node = %node.id, name = %node.name, servers = ?servers, mock_driver = mock, raw_exec, "drover agent starting");
        let mut agent = Agent::new(node, AgentSettings::new(servers), endpoints.clone(), quic, Arc::new(NoObserver));
        if let Some(tasks) = tasks {
            agent = agent.with_tasks(tasks);
        }
        let running = tokio::spawn(async move { agent.run(stopped).await });
        let signal = signals.recv().await;
        tracing::info!(signal, "agent stopping");
        let _ = stop.send(true);
        let _ = running.await;
        endpoints.close().await;
        Ok::<(), Failure>(())
    })
}

/// The client side of an agent that runs real tasks.
struct ClientSide {
    data_dir: PathBuf,
    http_addr: SocketAddr,
    gc_max_allocs: usize,
    env_denylist: EnvDenylist,
    limits: drover::http::HttpLimits,
    stop_tasks_on_shutdown: bool,
}

impl ClientSide {
    /// With raw_exec: finds the isolation, opens the HTTP listener (until
    /// `stop`) and advertises it in `node`'s attributes.
    async fn start(
        self,
        raw_exec: bool,
        node: &mut Node,
        stop: watch::Receiver<bool>,
    ) -> Result<Option<TaskSettings>, Failure> {
        if !raw_exec {
            return Ok(None);
        }
        let isolation = drover::isolation::Isolation::detect();
        tracing::info!(isolation = %isolation.describe(), "raw_exec driver enabled: tasks run without isolation");
        let client_fs = ClientFs::new(self.data_dir.clone());
        let (bound, _listener) = drover::client_fs::serve(client_fs.clone(), self.http_addr, self.limits, stop)
            .with_context(|| format!("binding the agent's HTTP listener on {}", self.http_addr))?;
        tracing::info!(addr = %bound, "agent HTTP listener (task logs: /v1/client/fs/logs/<alloc_id>)");
        node.attributes.insert(drover::client_fs::ADVERTISE_ATTRIBUTE.to_string(), bound.to_string());
        node.computed_class = node.compute_class();
        let executable = std::env::current_exe().context("finding the drover binary for task executors")?;
        Ok(Some(TaskSettings {
            driver: Arc::new(
                drover::raw_exec::RawExec::new(isolation, executable).with_env_denylist(self.env_denylist),
            ),
            data_dir: self.data_dir,
            gc_max_allocs: self.gc_max_allocs,
            stop_tasks_on_shutdown: self.stop_tasks_on_shutdown,
            client_fs: Some(client_fs),
        }))
    }
}

fn dev(args: DevArgs) -> Result<(), Failure> {
    drover::logging::init(&args.log_level, false)?;
    raise_open_files_limit();
    let jobs = args.job.iter().map(|path| read_job(path)).collect::<Result<Vec<_>>>()?;
    let http_addr: SocketAddr = args
        .agent_http_addr
        .parse()
        .map_err(|_| config_error("--agent-http-addr", format!("{:?} is not an ip:port", args.agent_http_addr)))?;
    let (_ca, server_tls, client_tls) = TlsMaterial::dev_pair()?;
    match &args.data_dir {
        Some(dir) => tracing::warn!(
            data_dir = %dir.display(),
            "DEV MODE: server and agent in one process, durable state in the data dir, a throwaway CA; NOT for production"
        ),
        None => tracing::warn!(
            "DEV MODE: server and agent in one process, state in memory, a throwaway CA; NOT for production"
        ),
    }
    let runtime = runtime()?;
    runtime.block_on(async move {
        let mut signals = drover::server::ShutdownSignals::catch()?;
        let options = ServerOptions {
            bind: SocketAddr::from(([127, 0, 0, 1], args.port)),
            advertise: None,
            engine: ServerConfig::default(),
            tls: server_tls,
            http: Some(HttpOptions {
                bind: SocketAddr::from(([127, 0, 0, 1], args.http_port)),
                tls: false,
                verify_clients: false,
                name: hostname(),
                datacenter: "dc1".to_string(),
                acl_enabled: false,
                limits: drover::http::HttpLimits::default(),
            }),
            durable: args
                .data_dir
                .as_deref()
                .map(|dir| DurableOptions::under(dir, replication::DurableConfig::default())),
            cluster: None,
        };
        let running = RunningServer::start(options)?;
        let addr = running.local_addr();
        tracing::info!(%addr, "dev server listening");
        if let Some(http) = running.http_addr() {
            tracing::info!("HTTP API at http://{http} (try: curl http://{http}/v1/nodes)");
            if args.print_address {
                let lines = format!("listening {addr}\nhttp {http}\n");
                let _ = std::io::Write::write_all(&mut std::io::stdout(), lines.as_bytes());
            }
        }
        let endpoints = Arc::new(ClientEndpoints::bind(1, &client_tls)?);
        // With a data dir the node keeps its identity across restarts, as
        // the server keeps its state.
        let identity = match &args.data_dir {
            Some(dir) => drover::identity::load_or_create(dir).context("the node identity")?,
            None => drover::identity::Identity {
                node_id: engine::structs::NodeId::from_rng(&mut rand::rng()),
                secret_id: uuid::Builder::from_random_bytes(rand::random()).into_uuid(),
            },
        };
        let agent_args = AgentArgs {
            common: Common {
                config: None,
                dev: true,
                ca_file: None,
                cert_file: None,
                key_file: None,
                log_level: None,
                log_json: false,
                data_dir: None,
            },
            servers: None,
            name: None,
            datacenter: None,
            node_class: None,
            mock_driver: true,
            raw_exec: true,
            http_addr: None,
        };
        let mut node = local_node(&agent_args, &FileConfig::default(), identity, (true, true));
        let (stop, stopped) = watch::channel(false);
        let mut _dev_data_dir = None;
        let data_dir = match &args.data_dir {
            Some(dir) => dir.clone(),
            None => _dev_data_dir.insert(dev_temp_dir("drover-dev-agent-")?).path().to_path_buf(),
        };
        std::fs::create_dir_all(&data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
        tracing::info!(data_dir = %data_dir.display(), "dev agent data dir (allocation directories and logs)");
        let client_side = ClientSide {
            data_dir,
            http_addr,
            gc_max_allocs: 50,
            env_denylist: EnvDenylist::default(),
            limits: drover::http::HttpLimits::default(),
            stop_tasks_on_shutdown: true,
        };
        let tasks = client_side.start(true, &mut node, stopped.clone()).await?;
        let mut agent = Agent::new(
            node,
            AgentSettings::new(vec![addr]),
            endpoints.clone(),
            endpoints.own_config()?,
            Arc::new(NoObserver),
        );
        if let Some(tasks) = tasks {
            agent = agent.with_tasks(tasks);
        }
        let running_agent = tokio::spawn(async move { agent.run(stopped).await });
        for job in jobs {
            let id = job.id.clone();
            match running.engine().jobs().register(job) {
                Ok(_) => tracing::info!(job = %id, "registered"),
                Err(error) => tracing::error!(job = %id, %error, "job refused"),
            }
        }
        let signal = signals.recv().await;
        tracing::info!(signal, "dev agent stopping");
        let _ = stop.send(true);
        let _ = running_agent.await;
        endpoints.close().await;
        running.shutdown().await;
        Ok::<(), Failure>(())
    })
}

fn tls(command: TlsCommand) -> Result<()> {
    let written = match command {
        TlsCommand::Ca { command: TlsCaCommand::Create { dir } } => drover::tls_files::create_ca(&dir)?,
        TlsCommand::Cert { command: TlsCertCommand::Create { server, client: _, cli, ca, key, names, dir } } => {
            let role = match (server, cli) {
                (true, _) => Role::Server,
                (false, true) => Role::Operator,
                (false, false) => Role::Client,
            };
            drover::tls_files::create_cert(&dir, role, &ca, &key, &names)?
        }
    };
    for path in written {
        println!("==> Created {}", path.display());
    }
    Ok(())
}

fn read_job(path: &Path) -> Result<Job> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let job: Job = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    job.validate().with_context(|| format!("checking {}", path.display()))?;
    Ok(job)
}

fn validate(path: &Path) -> Result<()> {
    let job = read_job(path)?;
    println!("job {:?} ({}, {} task groups) is valid", job.id, job.job_type, job.task_groups.len());
    Ok(())
}
