//! `drover operator snapshot save|restore`, `drover operator raft
//! info|list-peers|add-voter|remove-peer` and `drover operator scheduler
//! get-config|set-config|workers`.

use std::path::Path;

use anyhow::{bail, Context, Result};
use replication::RaftInfo;

use super::{fields, print_json, table};
use crate::api::client::ApiClient;
use crate::api::operator::{
    RaftConfiguration, RaftPeerRemoved, RaftVoterAdded, SchedulerConfiguration, SchedulerConfigurationResponse,
    SchedulerSetConfigurationResponse,
};
use std::path::PathBuf;

use clap::Subcommand;

use super::server::{workers, WorkersAction};
use super::{client_command, ApiArgs, Failure};

/// `drover operator snapshot save FILE`: the server takes a snapshot and
/// sends it; it is written to a temporary name, synced and renamed, so
/// FILE is either the whole snapshot or untouched.
pub async fn snapshot_save(api: &ApiClient, file: &Path) -> Result<i32> {
    let answer = api.get("/v1/operator/snapshot").await?;
    if answer.status != 200 {
        bail!("Unexpected response code: {} ({})", answer.status, answer.body.trim());
    }
    let file = file.to_path_buf();
    let bytes = answer.raw;
    let size = bytes.len();
    tokio::task::spawn_blocking({
        let file = file.clone();
        // The state holds every token's secret: the file is the owner's only.
        move || storage::write_atomic(&file, &bytes, 0o600).with_context(|| format!("writing {}", file.display()))
    })
    .await??;
    println!("State file written to {} ({size} bytes, index {})", file.display(), answer.index.unwrap_or(0));
    Ok(0)
}

/// `drover operator raft info` of a running server.
pub async fn raft_info(api: &ApiClient, json_out: bool) -> Result<i32> {
    let info: RaftInfo = api.query("/v1/operator/raft/info").await.context("the server's raft info")?;
    print_raft_info(&info, json_out)?;
    Ok(0)
}

/// Prints `info` as fields (or JSON).
pub fn print_raft_info(info: &RaftInfo, json_out: bool) -> Result<()> {
    if json_out {
        return print_json(info);
    }
    let or_none = |value: Option<u64>| value.map_or_else(|| "none".to_string(), |value| value.to_string());
    let newest = info.snapshots.first();
    let mut pairs = vec![
        ("Log first index", or_none(info.log_first)),
        ("Log last index", or_none(info.log_last)),
        ("Last purged", or_none(info.last_purged.map(|log_id| log_id.index))),
        ("Term", info.term.to_string()),
    ];
    if let Some(applied) = info.last_applied {
        pairs.push(("Last applied", applied.index.to_string()));
    }
    if let Some(index) = info.store_index {
        pairs.push(("Store index", index.to_string()));
    }
    pairs.push(("Last snapshot", newest.map_or_else(|| "none".to_string(), |file| file.path.clone())));
    if let Some(file) = newest {
        pairs.push(("Snapshot raft index", file.index.to_string()));
        pairs.push(("Snapshot size", format!("{} bytes", file.size)));
    }
    pairs.push(("Snapshot store index", or_none(info.snapshot_store_index)));
    if let Some(millis) = info.snapshot_write_millis {
        pairs.push(("Snapshot write time", format!("{millis} ms")));
    }
    pairs.push(("Snapshots kept", info.snapshots.len().to_string()));
    print!("{}", fields(&pairs));
    Ok(())
}

/// `drover operator raft list-peers`: Nomad's table.
pub async fn list_peers(api: &ApiClient) -> Result<i32> {
    let configuration: RaftConfiguration = api.query("/v1/operator/raft/configuration").await?;
    let rows: Vec<Vec<String>> = configuration
        .servers
        .iter()
        .map(|server| {
            let state = if server.leader { "leader" } else { "follower" };
            vec![
                server.node.clone(),
                server.id.clone(),
                server.address.clone(),
                state.to_string(),
                server.voter.to_string(),
                server.raft_protocol.clone(),
            ]
        })
        .collect();
    print!("{}", table(&["Node", "ID", "Address", "State", "Voter", "RaftProtocol"], &rows));
    Ok(0)
}

/// `drover operator raft add-voter ADDRESS`.
pub async fn add_voter(api: &ApiClient, address: &str) -> Result<i32> {
    let path = format!("/v1/operator/raft/peer?address={address}");
    let added: RaftVoterAdded = api.write_empty("PUT", &path).await?;
    println!("Added server {} ({}) as a voter", added.node, added.added);
    Ok(0)
}

/// `drover operator raft remove-peer -peer-id ID`.
pub async fn remove_peer(api: &ApiClient, id: &str) -> Result<i32> {
    let removed: RaftPeerRemoved = api.write_empty("DELETE", &format!("/v1/operator/raft/peer?id={id}")).await?;
    println!("Removed peer with id {:?}", removed.removed);
    Ok(0)
}

#[derive(Debug, Subcommand)]
pub enum OperatorCommand {
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
pub enum SnapshotCommand {
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
pub enum RaftCommand {
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
pub enum SchedulerCommand {
    /// The cluster's scheduler configuration (Nomad's `operator scheduler
    /// get-config`).
    GetConfig {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Changes the scheduler configuration: what is not given stays as it
    /// is (Nomad's `operator scheduler set-config`).
    SetConfig(SetConfigArgs),
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

/// What `drover operator scheduler set-config` changes.
#[derive(Debug, Default, clap::Args)]
pub struct SetConfigArgs {
    /// `binpack` or `spread`.
    #[arg(long)]
    pub scheduler_algorithm: Option<String>,
    /// Whether the eval broker hands out nothing.
    #[arg(long)]
    pub pause_eval_broker: Option<bool>,
    /// Whether service jobs may preempt lower-priority allocations.
    #[arg(long)]
    pub preempt_service_scheduler: Option<bool>,
    /// Whether batch jobs may preempt.
    #[arg(long)]
    pub preempt_batch_scheduler: Option<bool>,
    /// Whether system jobs may preempt.
    #[arg(long)]
    pub preempt_system_scheduler: Option<bool>,
    /// Whether sysbatch jobs may preempt.
    #[arg(long)]
    pub preempt_sysbatch_scheduler: Option<bool>,
    /// Write only if the configuration's modify index is this (check-and-set).
    #[arg(long)]
    pub check_index: Option<u64>,
}

impl SetConfigArgs {
    /// `config` with what was given changed.
    fn apply(&self, config: &mut SchedulerConfiguration) {
        let flags = [
            (self.pause_eval_broker, &mut config.pause_eval_broker),
            (self.preempt_service_scheduler, &mut config.preemption_config.service_scheduler_enabled),
            (self.preempt_batch_scheduler, &mut config.preemption_config.batch_scheduler_enabled),
            (self.preempt_system_scheduler, &mut config.preemption_config.system_scheduler_enabled),
            (self.preempt_sysbatch_scheduler, &mut config.preemption_config.sysbatch_scheduler_enabled),
        ];
        for (given, field) in flags {
            if let Some(value) = given {
                *field = value;
            }
        }
        if let Some(algorithm) = &self.scheduler_algorithm {
            config.scheduler_algorithm = algorithm.clone();
        }
    }
}

/// `drover operator scheduler get-config`: Nomad's fields.
pub async fn get_config(api: &ApiClient, json_out: bool) -> Result<i32> {
    let answer: SchedulerConfigurationResponse = api.query("/v1/operator/scheduler/configuration").await?;
    if json_out {
        print_json(&answer.scheduler_config)?;
        return Ok(0);
    }
    let config = &answer.scheduler_config;
    let preemption = &config.preemption_config;
    print!(
        "{}\n{}",
        fields(&[
            ("Scheduler Algorithm", config.scheduler_algorithm.clone()),
            ("Pause Eval Broker", config.pause_eval_broker.to_string()),
        ]),
        fields(&[
            ("Preemption Service Scheduler", preemption.service_scheduler_enabled.to_string()),
            ("Preemption Batch Scheduler", preemption.batch_scheduler_enabled.to_string()),
            ("Preemption System Scheduler", preemption.system_scheduler_enabled.to_string()),
            ("Preemption SysBatch Scheduler", preemption.sysbatch_scheduler_enabled.to_string()),
        ])
    );
    Ok(0)
}

/// `drover operator scheduler set-config`: reads the configuration,
/// changes what was given, writes it back (with `?cas=` when
/// `--check-index` is given); exit 1 when the check-and-set was refused.
pub async fn set_config(api: &ApiClient, change: &SetConfigArgs) -> Result<i32> {
    let answer: SchedulerConfigurationResponse = api.query("/v1/operator/scheduler/configuration").await?;
    let mut config = answer.scheduler_config;
    change.apply(&mut config);
    let path = match change.check_index {
        Some(index) => format!("/v1/operator/scheduler/configuration?cas={index}"),
        None => "/v1/operator/scheduler/configuration".to_string(),
    };
    let written: SchedulerSetConfigurationResponse = api.write("PUT", &path, &config).await?;
    if written.updated {
        println!("Scheduler configuration updated!");
        Ok(0)
    } else {
        println!("Scheduler configuration could not be atomically updated, please try again");
        Ok(1)
    }
}

pub fn snapshot(command: SnapshotCommand, api: &ApiArgs) -> Result<(), Failure> {
    match command {
        SnapshotCommand::Save { file } => {
            client_command(api, |client| async move { snapshot_save(&client, &file).await })
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

/// Runs `drover operator ...`.
pub fn command(command: OperatorCommand, api: &ApiArgs) -> Result<(), Failure> {
    match command {
        OperatorCommand::Snapshot { command } => snapshot(command, api),
        OperatorCommand::Raft { command } => raft(command, api),
        OperatorCommand::Scheduler { command: SchedulerCommand::GetConfig { json } } => {
            client_command(api, |client| async move { get_config(&client, json).await })
        }
        OperatorCommand::Scheduler { command: SchedulerCommand::SetConfig(change) } => {
            client_command(api, |client| async move { set_config(&client, &change).await })
        }
        OperatorCommand::Scheduler { command: SchedulerCommand::Workers { action, count, json } } => {
            let action = match (action.as_deref(), count) {
                (None, _) => WorkersAction::List,
                (Some("set"), Some(count)) => WorkersAction::Set(count),
                (Some("pause"), id) => WorkersAction::Pause(id),
                (Some("resume"), id) => WorkersAction::Resume(id),
                _ => {
                    return Err(Failure::Config(anyhow::anyhow!(
                        "usage: drover operator scheduler workers [set N | pause [ID] | resume [ID]]"
                    )))
                }
            };
            client_command(api, |client| async move { workers(&client, action, json).await })
        }
    }
}

fn raft(command: RaftCommand, api: &ApiArgs) -> Result<(), Failure> {
    match command {
        RaftCommand::ListPeers => client_command(api, |client| async move { list_peers(&client).await }),
        RaftCommand::AddVoter { peer_address } => {
            client_command(api, |client| async move { add_voter(&client, &peer_address).await })
        }
        RaftCommand::RemovePeer { id } => client_command(api, |client| async move { remove_peer(&client, &id).await }),
        RaftCommand::Info { data_dir: Some(dir), json } => {
            let dir = storage::DataDir::new(dir.join("server"));
            let info = replication::offline_info(&dir)
                .map_err(|error| Failure::Run(anyhow::anyhow!("reading {}: {error}", dir.root().display())))?;
            print_raft_info(&info, json).map_err(Failure::Run)
        }
        RaftCommand::Info { data_dir: None, json } => {
            client_command(api, |client| async move { raft_info(&client, json).await })
        }
    }
}
