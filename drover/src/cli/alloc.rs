//! `drover alloc status|logs|fs|restart|signal|stop`: the allocation as
//! the servers have it, and its agent's logs, files, restarts and signals
//! through the servers' client endpoints (any server: it reaches the
//! agent over the agent's own connection).

use anyhow::{bail, Context, Result};
use clap::Subcommand;

use super::{ago, fields, print_json, table};
use std::collections::BTreeMap;

use crate::api::allocations::{
    AllocRestartRequest, AllocSignalRequest, AllocStopResponse, Allocation, AllocationListStub, CheckQueryResult,
    GenericResponse,
};
use crate::api::client::ApiClient;
use crate::api::fs::AllocFileInfo;

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
    if let Some(health) = &stub.deployment_status {
        let word = match health.healthy {
            Some(true) => "healthy",
            Some(false) => "unhealthy",
            None => "unset",
        };
        pairs.push(("Deployment Health", word.to_string()));
    }
    print!("{}", fields(&pairs));
    let checks: BTreeMap<String, CheckQueryResult> = api.query(&format!("/v1/client/allocation/{id}/checks")).await?;
    if !checks.is_empty() {
        let mut rows: Vec<Vec<String>> = checks
            .values()
            .map(|check| {
                let task = if check.task.is_empty() { "(group)".to_string() } else { check.task.clone() };
                vec![check.service.clone(), task, check.check.clone(), check.mode.clone(), check.status.clone()]
            })
            .collect();
        rows.sort();
        println!("\nNomad Service Checks:");
        print!("{}", table(&["Service", "Task", "Name", "Mode", "Status"], &rows));
    }
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

/// The one allocation `prefix` names, in full.
async fn find_alloc(api: &ApiClient, prefix: &str) -> Result<Allocation> {
    let matches: Vec<AllocationListStub> = api.query(&format!("/v1/allocations?prefix={prefix}")).await?;
    let id = match matches.as_slice() {
        [] => bail!("No allocation(s) with prefix or id \"{prefix}\" found"),
        [only] => only.id.clone(),
        _ => bail!("Prefix \"{prefix}\" matched multiple allocations: give more of the id"),
    };
    api.query(&format!("/v1/allocation/{id}")).await
}

/// The allocation's task named `task`, or its only task.
fn pick_task(alloc: &Allocation, task: Option<&str>) -> Result<String> {
    let tasks: Vec<String> = alloc
        .job
        .task_groups
        .iter()
        .filter(|candidate| candidate.name == alloc.stub.task_group)
        .flat_map(|candidate| candidate.tasks.iter().map(|task| task.name.clone()))
        .collect();
    let id = &alloc.stub.id;
    Ok(match (task, tasks.as_slice()) {
        (Some(task), _) if tasks.iter().any(|name| name == task) => task.to_string(),
        (Some(task), _) => bail!("Task \"{task}\" is not in allocation {id}; its tasks: {}", tasks.join(", ")),
        (None, [only]) => only.clone(),
        (None, _) => bail!("Allocation {id} runs several tasks ({}): name one", tasks.join(", ")),
    })
}

/// Roughly how many bytes a line of log takes (Nomad's `bytesToLines`):
/// `-n` lines are asked for as this many bytes each from the end.
const BYTES_PER_LINE: u64 = 120;

/// How `alloc logs` reads.
#[derive(Clone, Copy, Debug)]
pub struct LogsOptions {
    /// stderr instead of stdout.
    pub stderr: bool,
    /// Keep streaming until the task is dead.
    pub follow: bool,
    /// From the end: the last `lines` lines (10 with `--tail` alone).
    pub lines: Option<u64>,
}

/// `drover alloc logs [-f] [--stderr] [--tail] [-n N] ID [TASK]`: a task's
/// log, read by the servers from the agent that runs it, streamed to
/// stdout as it comes; with `-f` until the task is dead or the reader stops.
pub async fn logs(api: &ApiClient, prefix: &str, task: Option<&str>, options: LogsOptions) -> Result<i32> {
    use std::io::Write;

    let alloc = find_alloc(api, prefix).await?;
    let task = pick_task(&alloc, task)?;
    let kind = if options.stderr { "stderr" } else { "stdout" };
    let tail = match options.lines {
        Some(lines) => format!("&origin=end&offset={}", lines * BYTES_PER_LINE),
        None => String::new(),
    };
    let path = format!("/v1/client/fs/logs/{}?task={task}&type={kind}&follow={}{tail}", alloc.stub.id, options.follow);
    let mut stream = api.stream(&path).await?.ok().await?;
    let mut out = std::io::stdout();
    let mut first = true;
    while let Some(frame) = stream.next_frame().await? {
        let mut data = frame.bytes().context("a frame's data is not base64")?;
        // The first frame holds the tail asked for: its last lines only.
        if first {
            if let Some(lines) = options.lines {
                data = last_lines(&data, lines);
            }
        }
        first = false;
        out.write_all(&data)?;
        out.flush()?;
    }
    Ok(0)
}

/// The last `lines` lines of `data` (a last line without its newline counts).
fn last_lines(data: &[u8], lines: u64) -> Vec<u8> {
    let body = data.strip_suffix(b"\n").unwrap_or(data);
    let mut start = body.len();
    for _ in 0..lines {
        match body[..start].iter().rposition(|byte| *byte == b'\n') {
            Some(at) => start = at,
            None => return data.to_vec(),
        }
    }
    data[start + 1..].to_vec()
}

/// `drover alloc fs [--stat] [-f] ID [PATH]`: a directory of the
/// allocation listed, or a file printed (followed with `-f`), as Nomad's.
pub async fn fs(api: &ApiClient, prefix: &str, path: Option<&str>, stat_only: bool, follow: bool) -> Result<i32> {
    use std::io::Write;

    let alloc = find_alloc(api, prefix).await?;
    let id = &alloc.stub.id;
    let path = path.unwrap_or("/");
    let query = url_encode(path);
    let file: AllocFileInfo = api.query(&format!("/v1/client/fs/stat/{id}?path={query}")).await?;
    if stat_only || file.is_dir {
        let files = match file.is_dir && !stat_only {
            true => api.query(&format!("/v1/client/fs/ls/{id}?path={query}")).await?,
            false => vec![file],
        };
        let rows: Vec<Vec<String>> = files
            .iter()
            .map(|file| {
                let name = if file.is_dir { format!("{}/", file.name) } else { file.name.clone() };
                vec![file.file_mode.clone(), file.size.to_string(), file.mod_time.clone(), name]
            })
            .collect();
        print!("{}", table(&["Mode", "Size", "Modified Time", "Name"], &rows));
        return Ok(0);
    }
    let mut out = std::io::stdout();
    if follow {
        let mut stream = api.stream(&format!("/v1/client/fs/stream/{id}?path={query}&follow=true")).await?.ok().await?;
        while let Some(frame) = stream.next_frame().await? {
            out.write_all(&frame.bytes().context("a frame's data is not base64")?)?;
            out.flush()?;
        }
        return Ok(0);
    }
    let mut stream = api.stream(&format!("/v1/client/fs/cat/{id}?path={query}")).await?.ok().await?;
    while let Some(data) = stream.next().await? {
        out.write_all(&data)?;
    }
    out.flush()?;
    Ok(0)
}

/// A path as a query value.
fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => (byte as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// `drover alloc restart ID [TASK]`: the task, or every running task,
/// restarted in place by its agent.
pub async fn restart(api: &ApiClient, prefix: &str, task: Option<&str>) -> Result<i32> {
    let alloc = find_alloc(api, prefix).await?;
    let task = task.map(|task| pick_task(&alloc, Some(task))).transpose()?;
    let body = AllocRestartRequest { task_name: task, all_tasks: None };
    let _: GenericResponse =
        api.write("PUT", &format!("/v1/client/allocation/{}/restart", alloc.stub.id), &body).await?;
    Ok(0)
}

/// `drover alloc signal [-s SIGNAL] ID [TASK]`: the signal (SIGKILL by
/// default, as Nomad's) to the task, or to every running task.
pub async fn signal(api: &ApiClient, prefix: &str, task: Option<&str>, signal: &str) -> Result<i32> {
    let alloc = find_alloc(api, prefix).await?;
    let task = task.map(|task| pick_task(&alloc, Some(task))).transpose()?;
    let body = AllocSignalRequest { task, signal: Some(signal.to_string()) };
    let _: GenericResponse =
        api.write("PUT", &format!("/v1/client/allocation/{}/signal", alloc.stub.id), &body).await?;
    Ok(0)
}

/// `drover alloc stop [--detach] ID`: the allocation stopped, and its
/// replacement (if the job asks for one) placed; the eval is monitored
/// unless `--detach`.
pub async fn stop(api: &ApiClient, prefix: &str, detach: bool) -> Result<i32> {
    let alloc = find_alloc(api, prefix).await?;
    let answer: AllocStopResponse = api.write_empty("PUT", &format!("/v1/allocation/{}/stop", alloc.stub.id)).await?;
    if detach {
        println!("{}", answer.eval_id);
        return Ok(0);
    }
    super::job::monitor(api, &answer.eval_id).await
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
    /// A task's stdout (or stderr), read through the servers from the
    /// agent that runs it.
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
        /// From the end: the last lines (10 unless `-n` says).
        #[arg(long)]
        tail: bool,
        /// The last this many lines (implies `--tail`).
        #[arg(short = 'n')]
        lines: Option<u64>,
    },
    /// A directory of the allocation listed, or a file printed.
    Fs {
        /// An allocation id or prefix.
        id: String,
        /// A path in the allocation's directory (`/` by default).
        path: Option<String>,
        /// Show the file's information, not its content.
        #[arg(long)]
        stat: bool,
        /// Keep printing what is appended to the file.
        #[arg(short = 'f', long)]
        follow: bool,
    },
    /// Restarts a task, or every running task, in place.
    Restart {
        /// An allocation id or prefix.
        id: String,
        /// The task (every running task when none is named).
        task: Option<String>,
    },
    /// Sends a signal to a task, or to every running task.
    Signal {
        /// The signal (SIGKILL by default, as Nomad's).
        #[arg(short = 's', long, default_value = "SIGKILL")]
        signal: String,
        /// An allocation id or prefix.
        id: String,
        /// The task (every running task when none is named).
        task: Option<String>,
    },
    /// Stops the allocation; its job places a replacement if its count
    /// asks for one.
    Stop {
        /// An allocation id or prefix.
        id: String,
        /// Print the eval's id instead of monitoring it.
        #[arg(long)]
        detach: bool,
    },
}

/// Runs `drover alloc ...`.
pub fn command(command: AllocCommand, api: &ApiArgs) -> Result<(), Failure> {
    client_command(api, |client| async move {
        match command {
            AllocCommand::Status { id, json } => status(&client, &id, json).await,
            AllocCommand::Logs { id, task, follow, stderr, tail, lines } => {
                let lines = lines.or(tail.then_some(10));
                logs(&client, &id, task.as_deref(), LogsOptions { stderr, follow, lines }).await
            }
            AllocCommand::Fs { id, path, stat, follow } => fs(&client, &id, path.as_deref(), stat, follow).await,
            AllocCommand::Restart { id, task } => restart(&client, &id, task.as_deref()).await,
            AllocCommand::Signal { signal: name, id, task } => signal(&client, &id, task.as_deref(), &name).await,
            AllocCommand::Stop { id, detach } => stop(&client, &id, detach).await,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_keeps_the_last_lines() {
        assert_eq!(last_lines(b"a\nb\nc\n", 2), b"b\nc\n");
        assert_eq!(last_lines(b"a\nb\nc", 2), b"b\nc");
        assert_eq!(last_lines(b"a\nb\n", 5), b"a\nb\n");
        assert_eq!(url_encode("/web/local/a b"), "/web/local/a%20b");
    }
}
