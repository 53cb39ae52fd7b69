//! `drover alloc status ID` and `drover alloc logs ID [TASK]`.

use anyhow::{bail, Result};

use super::{ago, fields, print_json, table, text};
use crate::api::client::ApiClient;
use clap::Subcommand;

use super::{client_command, ApiArgs, Failure};

/// `drover alloc status ID`: the allocation, then its tasks' states and
/// recent events when the agent reports them.
pub async fn status(api: &ApiClient, prefix: &str, json_out: bool) -> Result<i32> {
    let matches = api.get(&format!("/v1/allocations?prefix={prefix}")).await?.json()?;
    let id = match matches.as_array().map(Vec::as_slice).unwrap_or_default() {
        [] => bail!("No allocation(s) with prefix or id \"{prefix}\" found"),
        [only] => text(only, "ID"),
        _ => {
            println!("Prefix matched multiple allocations");
            return Ok(0);
        }
    };
    let alloc = api.get(&format!("/v1/allocation/{id}")).await?.json()?;
    if json_out {
        print_json(&alloc)?;
        return Ok(0);
    }
    let mut pairs = vec![
        ("ID", text(&alloc, "ID")),
        ("Eval ID", text(&alloc, "EvalID")),
        ("Name", text(&alloc, "Name")),
        ("Node ID", text(&alloc, "NodeID")),
        ("Node Name", text(&alloc, "NodeName")),
        ("Job ID", text(&alloc, "JobID")),
        ("Job Version", text(&alloc["Job"], "Version")),
        ("Client Status", text(&alloc, "ClientStatus")),
        ("Client Description", text(&alloc, "ClientDescription")),
        ("Desired Status", text(&alloc, "DesiredStatus")),
        ("Desired Description", text(&alloc, "DesiredDescription")),
        ("Created", ago(alloc["CreateTime"].as_u64().unwrap_or(0))),
        ("Modified", ago(alloc["ModifyTime"].as_u64().unwrap_or(0))),
    ];
    if !text(&alloc, "NextAllocation").is_empty() {
        pairs.push(("Replacement Alloc ID", text(&alloc, "NextAllocation")));
    }
    print!("{}", fields(&pairs));
    for (task, state) in alloc["TaskStates"].as_object().into_iter().flatten() {
        println!("\nTask \"{task}\" is \"{}\"", text(state, "State"));
        let events: Vec<Vec<String>> = state["Events"]
            .as_array()
            .into_iter()
            .flatten()
            .rev()
            .take(10)
            .map(|event| {
                vec![ago(event["Time"].as_u64().unwrap_or(0)), text(event, "Type"), text(event, "DisplayMessage")]
            })
            .collect();
        println!("Recent Events:");
        print!("{}", table(&["Time", "Type", "Description"], &events));
    }
    Ok(0)
}

/// `drover alloc logs [-f] [--stderr] ID [TASK]`: a task's log, read from
/// the agent that runs it (its HTTP listener, advertised in the node's
/// `unique.advertise.http` attribute), streamed to stdout as it comes;
/// with `-f` it follows until the task is dead or the reader stops.
pub async fn logs(api: &ApiClient, prefix: &str, task: Option<&str>, stderr: bool, follow: bool) -> Result<i32> {
    let matches = api.get(&format!("/v1/allocations?prefix={prefix}")).await?.json()?;
    let id = match matches.as_array().map(Vec::as_slice).unwrap_or_default() {
        [] => bail!("No allocation(s) with prefix or id \"{prefix}\" found"),
        [only] => text(only, "ID"),
        _ => bail!("Prefix \"{prefix}\" matched multiple allocations: give more of the id"),
    };
    let alloc = api.get(&format!("/v1/allocation/{id}")).await?.json()?;
    let group = text(&alloc, "TaskGroup");
    let tasks: Vec<String> = alloc["Job"]["TaskGroups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|candidate| text(candidate, "Name") == group)
        .flat_map(|candidate| candidate["Tasks"].as_array().cloned().unwrap_or_default())
        .map(|candidate| text(&candidate, "Name"))
        .collect();
    let task = match (task, tasks.as_slice()) {
        (Some(task), _) if tasks.iter().any(|name| name == task) => task.to_string(),
        (Some(task), _) => bail!("Task \"{task}\" is not in allocation {id}; its tasks: {}", tasks.join(", ")),
        (None, [only]) => only.clone(),
        (None, _) => bail!("Allocation {id} runs several tasks ({}): name one", tasks.join(", ")),
    };
    let node = api.get(&format!("/v1/node/{}", text(&alloc, "NodeID"))).await?.json()?;
    let agent = text(&node["Attributes"], crate::api::ADVERTISE_ATTRIBUTE);
    if agent.is_empty() {
        bail!("node {} does not advertise an HTTP listener for logs (is raw_exec enabled on it?)", text(&node, "Name"));
    }
    let kind = if stderr { "stderr" } else { "stdout" };
    let path = format!("/v1/client/fs/logs/{id}?task={task}&type={kind}&plain=true&follow={follow}");
    stream_to_stdout(&agent, &path).await?;
    Ok(0)
}

/// GETs `path` from the agent at `addr` (plain HTTP, as agents serve
/// logs) and copies the body to stdout frame by frame.
async fn stream_to_stdout(addr: &str, path: &str) -> Result<()> {
    use std::io::Write;

    use anyhow::Context;
    use http_body_util::{BodyExt, Empty};
    use hyper::body::Bytes;

    let stream =
        tokio::net::TcpStream::connect(addr).await.with_context(|| format!("connecting to the agent at {addr}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    let driving = tokio::spawn(connection);
    let request = hyper::Request::get(path).header("host", addr).body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let mut body = response.into_body();
    if !status.is_success() {
        let text = body.collect().await?.to_bytes();
        bail!("the agent answered {status}: {}", String::from_utf8_lossy(&text).trim());
    }
    let mut out = std::io::stdout();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            out.write_all(&data)?;
            out.flush()?;
        }
    }
    driving.abort();
    Ok(())
}

#[derive(Debug, Subcommand)]
pub enum AllocCommand {
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

/// Runs `drover alloc ...`.
pub fn command(command: AllocCommand, api: &ApiArgs) -> Result<(), Failure> {
    client_command(api, |client| async move {
        match command {
            AllocCommand::Status { id, json } => status(&client, &id, json).await,
            AllocCommand::Logs { id, task, follow, stderr } => {
                logs(&client, &id, task.as_deref(), stderr, follow).await
            }
        }
    })
}
