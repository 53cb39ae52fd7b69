//! `drover alloc status ID` and `drover alloc logs ID [TASK]`.

use anyhow::{bail, Result};
use clap::Subcommand;

use super::{ago, fields, print_json, table};
use crate::api::allocations::{Allocation, AllocationListStub};
use crate::api::client::ApiClient;
use crate::api::nodes::Node;

use super::{client_command, ApiArgs, Failure};

/// `drover alloc status ID`: the allocation, then its tasks' states and
/// recent events when the agent reports them.
pub async fn status(api: &ApiClient, prefix: &str, json_out: bool) -> Result<i32> {
    let matches: Vec<AllocationListStub> = api.query(&format!("/v1/allocations?prefix={prefix}")).await?;
    let id = match matches.as_slice() {
        [] => bail!("No allocation(s) with prefix or id \"{prefix}\" found"),
        [only] => only.id.clone(),
        _ => {
            println!("Prefix matched multiple allocations");
            return Ok(0);
        }
    };
    let alloc: Allocation = api.query(&format!("/v1/allocation/{id}")).await?;
    if json_out {
        print_json(&alloc)?;
        return Ok(0);
    }
    let stub = &alloc.stub;
    let mut pairs = vec![
        ("ID", stub.id.clone()),
        ("Eval ID", stub.eval_id.clone()),
        ("Name", stub.name.clone()),
        ("Node ID", stub.node_id.clone()),
        ("Node Name", stub.node_name.clone()),
        ("Job ID", stub.job_id.clone()),
        ("Job Version", alloc.job.version.to_string()),
        ("Client Status", stub.client_status.clone()),
        ("Client Description", stub.client_description.clone()),
        ("Desired Status", stub.desired_status.clone()),
        ("Desired Description", stub.desired_description.clone()),
        ("Created", ago(stub.create_time)),
        ("Modified", ago(stub.modify_time)),
    ];
    if !alloc.next_allocation.is_empty() {
        pairs.push(("Replacement Alloc ID", alloc.next_allocation.clone()));
    }
    print!("{}", fields(&pairs));
    for (task, state) in &stub.task_states {
        println!("\nTask \"{task}\" is \"{}\"", state.state);
        let events: Vec<Vec<String>> = state
            .events
            .iter()
            .rev()
            .take(10)
            .map(|event| vec![ago(event.time), event.event_type.clone(), event.display_message.clone()])
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
    let matches: Vec<AllocationListStub> = api.query(&format!("/v1/allocations?prefix={prefix}")).await?;
    let id = match matches.as_slice() {
        [] => bail!("No allocation(s) with prefix or id \"{prefix}\" found"),
        [only] => only.id.clone(),
        _ => bail!("Prefix \"{prefix}\" matched multiple allocations: give more of the id"),
    };
    let alloc: Allocation = api.query(&format!("/v1/allocation/{id}")).await?;
    let tasks: Vec<String> = alloc
        .job
        .task_groups
        .iter()
        .filter(|candidate| candidate.name == alloc.stub.task_group)
        .flat_map(|candidate| candidate.tasks.iter().map(|task| task.name.clone()))
        .collect();
    let task = match (task, tasks.as_slice()) {
        (Some(task), _) if tasks.iter().any(|name| name == task) => task.to_string(),
        (Some(task), _) => bail!("Task \"{task}\" is not in allocation {id}; its tasks: {}", tasks.join(", ")),
        (None, [only]) => only.clone(),
        (None, _) => bail!("Allocation {id} runs several tasks ({}): name one", tasks.join(", ")),
    };
    let node: Node = api.query(&format!("/v1/node/{}", alloc.stub.node_id)).await?;
    let Some(agent) = node.attributes.get(crate::api::ADVERTISE_ATTRIBUTE).filter(|agent| !agent.is_empty()) else {
        bail!("node {} does not advertise an HTTP listener for logs (is raw_exec enabled on it?)", node.name);
    };
    let kind = if stderr { "stderr" } else { "stdout" };
    let path = format!("/v1/client/fs/logs/{id}?task={task}&type={kind}&plain=true&follow={follow}");
    stream_to_stdout(agent, &path).await?;
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
