//! `drover job run|status|stop|scale`, printed as Nomad's `nomad job ...`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::{ago, date, fields, print_json, short, table, text};
use crate::api::client::ApiClient;
use std::path::PathBuf;

use clap::Subcommand;
use engine::structs::Job;

use super::{client_command, ApiArgs, Failure};

/// Reads a job file: Nomad HCL2 (`.hcl`, `.nomad`), or Nomad's JSON,
/// `{"Job": {...}}` as `nomad job run -output` writes it, or the bare job
/// object.
pub fn read_job_file(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    if matches!(path.extension().and_then(|ext| ext.to_str()), Some("hcl" | "nomad")) {
        return Ok(crate::api::hcl::job_json(&path.display().to_string(), &text)?);
    }
    let value: Value = serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    Ok(if value.get("Job").is_some() { value } else { json!({ "Job": value }) })
}

/// `drover job run FILE`: registers the job, then monitors its eval unless
/// `detach`. The exit code is the monitor's: 2 when placements failed.
pub async fn run(api: &ApiClient, path: &Path, detach: bool) -> Result<i32> {
    let body = read_job_file(path)?;
    let answer = api.request("PUT", "/v1/jobs", Some(&body)).await?;
    let registered = answer.json().context("Error submitting job")?;
    let warnings = text(&registered, "Warnings");
    if !warnings.is_empty() {
        println!("Job Warnings:\n{warnings}\n");
    }
    let eval_id = text(&registered, "EvalID");
    if detach {
        println!("Job registration successful\nEvaluation ID: {eval_id}");
        return Ok(0);
    }
    monitor(api, &eval_id).await
}

/// Nomad's eval monitor: follows the eval and the allocations it places,
/// printing each change, until the eval ends. Woken by blocking queries.
pub async fn monitor(api: &ApiClient, eval_id: &str) -> Result<i32> {
    println!("==> Monitoring evaluation \"{}\"", short(eval_id));
    let mut last_status = "pending".to_string();
    let mut said_job = false;
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let mut index = 0;
    loop {
        let eval = api.get(&format!("/v1/evaluation/{eval_id}")).await?;
        let eval = eval.json().with_context(|| format!("No evaluation with id \"{eval_id}\" found"))?;
        if !said_job && !text(&eval, "JobID").is_empty() {
            println!("    Evaluation triggered by job \"{}\"", text(&eval, "JobID"));
            said_job = true;
        }
        let allocs = api.get(&format!("/v1/evaluation/{eval_id}/allocations?index={index}&wait=1s")).await?;
        index = allocs.index.unwrap_or(index);
        for alloc in allocs.json()?.as_array().cloned().unwrap_or_default() {
            let id = text(&alloc, "ID");
            let status = text(&alloc, "ClientStatus");
            match seen.get(&id) {
                None => {
                    let verb = if alloc["CreateIndex"].as_u64() < eval["CreateIndex"].as_u64() {
                        "modified"
                    } else {
                        "created"
                    };
                    println!(
                        "    Allocation \"{}\" {verb}: node \"{}\", group \"{}\"",
                        short(&id),
                        short(&text(&alloc, "NodeID")),
                        text(&alloc, "TaskGroup")
                    );
                }
                Some(old) if *old != status => {
                    println!("    Allocation \"{}\" status changed: \"{old}\" -> \"{status}\"", short(&id))
                }
                Some(_) => {}
            }
            seen.insert(id, status);
        }
        let status = text(&eval, "Status");
        if status != last_status && status != "pending" {
            println!("    Evaluation status changed: \"{last_status}\" -> \"{status}\"");
            last_status = status.clone();
        }
        if matches!(status.as_str(), "complete" | "failed" | "canceled") {
            return Ok(finished(eval_id, &status, &eval));
        }
    }
}

/// The monitor's last lines; 2 when placements failed.
fn finished(eval_id: &str, status: &str, eval: &Value) -> i32 {
    let failed = eval["FailedTGAllocs"].as_object().filter(|failed| !failed.is_empty());
    let Some(failed) = failed else {
        println!("==> Evaluation \"{}\" finished with status \"{status}\"", short(eval_id));
        return 0;
    };
    println!(
        "==> Evaluation \"{}\" finished with status \"{status}\" but failed to place all allocations:",
        short(eval_id)
    );
    for (group, metric) in failed {
        let count = metric["CoalescedFailures"].as_u64().unwrap_or(0) + 1;
        println!("    Task Group \"{group}\" (failed to place {count} allocation(s)):");
        if metric["NodesEvaluated"].as_u64() == Some(0) {
            println!("      * No nodes were eligible for evaluation");
        }
        for (key, label) in [("ConstraintFiltered", "Constraint"), ("ClassFiltered", "Class")] {
            for (name, nodes) in metric[key].as_object().into_iter().flatten() {
                println!("      * {label} \"{name}\": {nodes} nodes excluded by filter");
            }
        }
        if let Some(exhausted) = metric["NodesExhausted"].as_u64().filter(|n| *n > 0) {
            println!("      * Resources exhausted on {exhausted} nodes");
        }
        for (dimension, nodes) in metric["DimensionExhausted"].as_object().into_iter().flatten() {
            println!("      * Dimension \"{dimension}\" exhausted on {nodes} nodes");
        }
    }
    if !text(eval, "BlockedEval").is_empty() {
        println!("    Evaluation \"{}\" waiting for additional capacity to place remainder", short(eval_id));
    }
    2
}

/// `drover job status [ID]`.
pub async fn status(api: &ApiClient, id: Option<&str>, json_out: bool) -> Result<i32> {
    let Some(id) = id else {
        let jobs = api.get("/v1/jobs").await?.json()?;
        if json_out {
            print_json(&jobs)?;
            return Ok(0);
        }
        let list = jobs.as_array().cloned().unwrap_or_default();
        if list.is_empty() {
            println!("No running jobs");
            return Ok(0);
        }
        let rows: Vec<Vec<String>> = list
            .iter()
            .map(|job| {
                let stopped = if job["Stop"] == true { " (stopped)" } else { "" };
                vec![
                    text(job, "ID"),
                    text(job, "Type"),
                    text(job, "Priority"),
                    format!("{}{stopped}", text(job, "Status")),
                    date(job["SubmitTime"].as_u64().unwrap_or(0)),
                ]
            })
            .collect();
        print!("{}", table(&["ID", "Type", "Priority", "Status", "Submit Date"], &rows));
        return Ok(0);
    };
    let job_id = resolve(api, id).await?;
    let job = api.get(&format!("/v1/job/{job_id}")).await?.json()?;
    let allocs = api.get(&format!("/v1/job/{job_id}/allocations")).await?.json()?;
    let summary = api.get(&format!("/v1/job/{job_id}/summary")).await?.json()?;
    if json_out {
        print_json(&job)?;
        return Ok(0);
    }
    let stopped = if job["Stop"] == true { " (stopped)" } else { "" };
    let datacenters: Vec<String> =
        job["Datacenters"].as_array().into_iter().flatten().filter_map(|dc| dc.as_str().map(str::to_string)).collect();
    print!(
        "{}",
        fields(&[
            ("ID", text(&job, "ID")),
            ("Name", text(&job, "Name")),
            ("Submit Date", date(job["SubmitTime"].as_u64().unwrap_or(0))),
            ("Type", text(&job, "Type")),
            ("Priority", text(&job, "Priority")),
            ("Datacenters", datacenters.join(",")),
            ("Namespace", text(&job, "Namespace")),
            ("Status", format!("{}{stopped}", text(&job, "Status"))),
            ("Periodic", "false".to_string()),
            ("Parameterized", "false".to_string()),
        ])
    );
    println!("\nSummary");
    let counts: Vec<Vec<String>> = summary["Summary"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(group, c)| {
            let mut row = vec![group.clone()];
            row.extend(["Queued", "Starting", "Running", "Failed", "Complete", "Lost"].map(|key| text(c, key)));
            row
        })
        .collect();
    print!("{}", table(&["Task Group", "Queued", "Starting", "Running", "Failed", "Complete", "Lost"], &counts));
    println!("\nAllocations");
    print_allocs(&allocs);
    Ok(0)
}

/// The `Allocations` table of `job status` and `node status`.
pub fn print_allocs(allocs: &Value) {
    let list = allocs.as_array().cloned().unwrap_or_default();
    if list.is_empty() {
        println!("No allocations placed");
        return;
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|alloc| {
            vec![
                short(&text(alloc, "ID")),
                short(&text(alloc, "NodeID")),
                text(alloc, "TaskGroup"),
                text(alloc, "JobVersion"),
                text(alloc, "DesiredStatus"),
                text(alloc, "ClientStatus"),
                ago(alloc["CreateTime"].as_u64().unwrap_or(0)),
                ago(alloc["ModifyTime"].as_u64().unwrap_or(0)),
            ]
        })
        .collect();
    let header = ["ID", "Node ID", "Task Group", "Version", "Desired", "Status", "Created", "Modified"];
    print!("{}", table(&header, &rows));
}

/// The job id a prefix names, as Nomad resolves it.
async fn resolve(api: &ApiClient, prefix: &str) -> Result<String> {
    let jobs = api.get(&format!("/v1/jobs?prefix={prefix}")).await?.json()?;
    let list = jobs.as_array().cloned().unwrap_or_default();
    match list.as_slice() {
        [] => bail!("No job(s) with prefix or id \"{prefix}\" found"),
        [only] => Ok(text(only, "ID")),
        [first, ..] if text(first, "ID") == prefix => Ok(prefix.to_string()),
        _ => bail!("Prefix matched multiple jobs"),
    }
}

/// `drover job stop [--purge] ID`.
pub async fn stop(api: &ApiClient, id: &str, purge: bool, detach: bool) -> Result<i32> {
    let job_id = resolve(api, id).await?;
    let answer = api.request("DELETE", &format!("/v1/job/{job_id}?purge={purge}"), None).await?;
    let stopped = answer.json().context("Error deregistering job")?;
    let eval_id = text(&stopped, "EvalID");
    if eval_id.is_empty() {
        return Ok(0);
    }
    if detach {
        println!("{eval_id}");
        return Ok(0);
    }
    monitor(api, &eval_id).await
}

/// `drover job scale ID [GROUP] COUNT`.
pub async fn scale(api: &ApiClient, id: &str, group: Option<&str>, count: u32, detach: bool) -> Result<i32> {
    let job = api.get(&format!("/v1/job/{id}")).await?.json()?;
    let group = match group {
        Some(group) => group.to_string(),
        None => match job["TaskGroups"].as_array().map(Vec::as_slice) {
            Some([only]) => text(only, "Name"),
            _ => bail!("Job {id:?} has several task groups: name the one to scale"),
        },
    };
    let body = json!({"Count": count, "Target": {"Group": group}});
    let scaled = api.request("POST", &format!("/v1/job/{id}/scale"), Some(&body)).await?.json()?;
    let eval_id = text(&scaled, "EvalID");
    if detach {
        println!("Job scale successful\nEvaluation ID: {eval_id}");
        return Ok(0);
    }
    monitor(api, &eval_id).await
}

#[derive(Debug, Subcommand)]
pub enum JobCommand {
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

/// Runs `drover job ...`.
pub fn command(command: JobCommand, api: &ApiArgs) -> Result<(), Failure> {
    if let JobCommand::Validate { path } = &command {
        return validate(path).map_err(Failure::Run);
    }
    client_command(api, |client| async move {
        match command {
            JobCommand::Run { path, detach } => run(&client, &path, detach).await,
            JobCommand::Status { id, json } => status(&client, id.as_deref(), json).await,
            JobCommand::Stop { id, purge, detach } => stop(&client, &id, purge, detach).await,
            JobCommand::Scale { id, group_and_count, detach } => {
                let (group, count) = match group_and_count.as_slice() {
                    [count] => (None, count),
                    [group, count] => (Some(group.as_str()), count),
                    _ => anyhow::bail!("usage: drover job scale ID [GROUP] COUNT"),
                };
                let count: u32 = count.parse().map_err(|_| anyhow::anyhow!("count {count:?} is not a number"))?;
                scale(&client, &id, group, count, detach).await
            }
            JobCommand::Validate { path } => validate(&path).map(|()| 0),
        }
    })
}

pub fn read_job(path: &Path) -> Result<Job> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let job: Job = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    job.validate().with_context(|| format!("checking {}", path.display()))?;
    Ok(job)
}

pub fn validate(path: &Path) -> Result<()> {
    let job = read_job(path)?;
    println!("job {:?} ({}, {} task groups) is valid", job.id, job.job_type, job.task_groups.len());
    Ok(())
}
