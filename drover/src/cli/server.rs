//! `drover server members`, `drover operator scheduler workers` and
//! `drover status [PREFIX]`.

use anyhow::{bail, Result};
use serde_json::json;

use super::{print_json, table, text};
use crate::api::client::ApiClient;
use clap::{Args, Subcommand};

use super::run::server::ServerArgs;
use super::{client_command, ApiArgs, Failure};

/// `drover server members`.
pub async fn members(api: &ApiClient, json_out: bool) -> Result<i32> {
    let members = api.get("/v1/agent/members").await?.json()?;
    let leader = api.get("/v1/status/leader").await?.json()?;
    if json_out {
        print_json(&members)?;
        return Ok(0);
    }
    let leader = leader.as_str().unwrap_or_default().to_string();
    // A cluster's members carry Drover's raft view too (Nomad shows none).
    let clustered =
        members["Members"].as_array().into_iter().flatten().any(|member| member["Tags"]["raft_role"].is_string());
    let rows: Vec<Vec<String>> = members["Members"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|member| {
            let tags = &member["Tags"];
            let address = format!("{}:{}", text(member, "Addr"), text(tags, "port"));
            let mut row = vec![
                text(member, "Name"),
                text(member, "Addr"),
                text(member, "Port"),
                text(member, "Status"),
                (address == leader).to_string(),
                text(member, "ProtocolCur"),
                text(tags, "build"),
                text(tags, "dc"),
                text(tags, "region"),
            ];
            if clustered {
                row.extend(["raft_role", "term", "last_index", "health"].map(|tag| text(tags, tag)));
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
        let config = api.get("/v1/agent/schedulers/config").await?.json()?;
        let body = json!({"num_schedulers": count, "enabled_schedulers": config["enabled_schedulers"]});
        api.request("PUT", "/v1/agent/schedulers/config", Some(&body)).await?.json()?;
    }
    let one = |id: Option<usize>| id.map_or_else(String::new, |id| format!("?id={id}"));
    match action {
        WorkersAction::Pause(id) => {
            api.request("PUT", &format!("/v1/agent/schedulers/pause{}", one(id)), None).await?.json()?;
        }
        WorkersAction::Resume(id) => {
            api.request("PUT", &format!("/v1/agent/schedulers/resume{}", one(id)), None).await?.json()?;
        }
        WorkersAction::List | WorkersAction::Set(_) => {}
    }
    let workers = api.get("/v1/agent/schedulers").await?.json()?;
    if json_out {
        print_json(&workers)?;
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = workers["schedulers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|worker| {
            let types: Vec<String> = worker["enabled_schedulers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|name| name.as_str().map(str::to_string))
                .collect();
            vec![text(worker, "id"), text(worker, "status"), text(worker, "workload_status"), types.join(",")]
        })
        .collect();
    print!("{}", table(&["ID", "Status", "Workload Status", "Schedulers"], &rows));
    Ok(0)
}

/// `drover status [PREFIX]`: the job list, or whatever the prefix names.
pub async fn status(api: &ApiClient, prefix: Option<&str>, json_out: bool) -> Result<i32> {
    let Some(prefix) = prefix else { return super::job::status(api, None, json_out).await };
    let found = api.request("PUT", "/v1/search", Some(&json!({"Prefix": prefix, "Context": "all"}))).await?.json()?;
    let matches = found["Matches"].as_object().cloned().unwrap_or_default();
    let hits: Vec<(String, String)> = matches
        .iter()
        .flat_map(|(context, ids)| {
            ids.as_array().into_iter().flatten().filter_map(|id| Some((context.clone(), id.as_str()?.to_string())))
        })
        .collect();
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
        "nodes" => super::node::status(api, Some(&id), json_out).await,
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
