//! `drover server members`, `drover operator scheduler workers` and
//! `drover status [PREFIX]`.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};

use super::{print_json, table};
use crate::api::agent::{
    AgentSchedulerWorkerConfigRequest, AgentSchedulerWorkerConfigResponse, AgentSchedulerWorkersInfo, ServerMembers,
};
use crate::api::client::ApiClient;
use crate::api::search::{SearchRequest, SearchResponse};

use super::run::server::ServerArgs;
use super::{client_command, ApiArgs, Failure};

/// `drover server members`.
pub async fn members(api: &ApiClient, json_out: bool) -> Result<i32> {
    let members: ServerMembers = api.query("/v1/agent/members").await?;
    let leader: String = api.query("/v1/status/leader").await?;
    if json_out {
        print_json(&members)?;
        return Ok(0);
    }
    // A cluster's members carry Drover's raft view too (Nomad shows none).
    let clustered = members.members.iter().any(|member| member.tags.contains_key("raft_role"));
    let rows: Vec<Vec<String>> = members
        .members
        .iter()
        .map(|member| {
            let tag = |name: &str| member.tags.get(name).cloned().unwrap_or_default();
            let address = format!("{}:{}", member.addr, tag("port"));
            let mut row = vec![
                member.name.clone(),
                member.addr.clone(),
                member.port.to_string(),
                member.status.clone(),
                (address == leader).to_string(),
                member.protocol_cur.to_string(),
                tag("build"),
                tag("dc"),
                tag("region"),
            ];
            if clustered {
                row.extend(["raft_role", "term", "last_index", "health"].map(tag));
            }
            row
        })
        .collect();
    let mut header = vec!["Name", "Address", "Port", "Status", "Leader", "Protocol", "Build", "Datacenter", "Region"];
    if clustered {
        header.extend(["Raft Role", "Term", "Last Index", "Health"]);
    }
    print!("{}", table(&header, &rows));
    Ok(0)
}

/// What `drover operator scheduler workers` does.
#[derive(Clone, Copy, Debug)]
pub enum WorkersAction {
    /// List them.
    List,
    /// Run `n` workers.
    Set(usize),
    /// Pause one worker, or all.
    Pause(Option<usize>),
    /// Resume one worker, or all.
    Resume(Option<usize>),
}

/// `drover operator scheduler workers [set N | pause [ID] | resume [ID]]`.
pub async fn workers(api: &ApiClient, action: WorkersAction, json_out: bool) -> Result<i32> {
    if let WorkersAction::Set(count) = action {
        let config: AgentSchedulerWorkerConfigResponse = api.query("/v1/agent/schedulers/config").await?;
        let body = AgentSchedulerWorkerConfigRequest {
            num_schedulers: i64::try_from(count)?,
            enabled_schedulers: config.enabled_schedulers,
        };
        let _: AgentSchedulerWorkerConfigResponse = api.write("PUT", "/v1/agent/schedulers/config", &body).await?;
    }
    let one = |id: Option<usize>| id.map_or_else(String::new, |id| format!("?id={id}"));
    match action {
        WorkersAction::Pause(id) => {
            let path = format!("/v1/agent/schedulers/pause{}", one(id));
            let _: AgentSchedulerWorkersInfo = api.write_empty("PUT", &path).await?;
        }
        WorkersAction::Resume(id) => {
            let path = format!("/v1/agent/schedulers/resume{}", one(id));
            let _: AgentSchedulerWorkersInfo = api.write_empty("PUT", &path).await?;
        }
        WorkersAction::List | WorkersAction::Set(_) => {}
    }
    let workers: AgentSchedulerWorkersInfo = api.query("/v1/agent/schedulers").await?;
    if json_out {
        print_json(&workers)?;
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = workers
        .schedulers
        .iter()
        .map(|worker| {
            vec![
                worker.id.clone(),
                worker.status.clone(),
                worker.workload_status.clone(),
                worker.enabled_schedulers.join(","),
            ]
        })
        .collect();
    print!("{}", table(&["ID", "Status", "Workload Status", "Schedulers"], &rows));
    Ok(0)
}

/// `drover status [PREFIX]`: the job list, or whatever the prefix names.
pub async fn status(api: &ApiClient, prefix: Option<&str>, json_out: bool) -> Result<i32> {
    let Some(prefix) = prefix else { return super::job::status(api, None, json_out).await };
    let request = SearchRequest { prefix: prefix.to_string(), context: "all".to_string(), namespace: None };
    let found: SearchResponse = api.write("PUT", "/v1/search", &request).await?;
    let hits: Vec<(String, String)> =
        found.matches.iter().flat_map(|(context, ids)| ids.iter().map(|id| (context.clone(), id.clone()))).collect();
    let exact: Vec<&(String, String)> = hits.iter().filter(|(_, id)| id == prefix).collect();
    let (context, id) = match (exact.as_slice(), hits.as_slice()) {
        ([one], _) => (*one).clone(),
        ([], [one]) => one.clone(),
        ([], []) => bail!("No matches found for {prefix:?}"),
        _ => bail!("Prefix {prefix:?} matched more than one object: be more specific"),
    };
    match context.as_str() {
        "jobs" => super::job::status(api, Some(&id), json_out).await,
        "allocs" => super::alloc::status(api, &id, json_out).await,
        "evals" => super::eval::status(api, &id, false, json_out).await,
        "nodes" => super::node::status(api, Some(&id), json_out, false).await,
        other => bail!("no status command for {other}"),
    }
}

/// `drover server`: run one, or `members`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ServerCli {
    #[command(subcommand)]
    pub command: Option<ServerCommand>,
    #[command(flatten)]
    pub args: ServerArgs,
}

#[derive(Debug, Subcommand)]
pub enum ServerCommand {
    /// Lists the servers, as `nomad server members`.
    Members {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
}

/// Runs `drover server` (a server, in this process) or `drover server members`.
pub fn command(server: ServerCli) -> Result<(), Failure> {
    match server.command {
        None => super::run::server::run(server.args),
        Some(ServerCommand::Members { json, api }) => {
            client_command(&api, |client| async move { members(&client, json).await })
        }
    }
}
