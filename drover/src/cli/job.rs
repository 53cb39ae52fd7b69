//! `drover job run|plan|status|stop|scale|history|revert|deployments|dispatch|periodic force|validate`,
//! printed as Nomad's `nomad job ...` (`plan` in `job_plan.rs`; what
//! `status` prints of a periodic or parameterized job in `job_parent.rs`); `job run`
//! and `job revert` follow the deployment of the version they register
//! (`deployment_monitor.rs`).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use clap::Subcommand;
use serde_json::{json, Value};

use super::{ago, date, fields, print_json, short, table};
use super::{client_command, ApiArgs, Failure};
use crate::api::allocations::AllocationListStub;
use crate::api::client::ApiClient;
use crate::api::evaluations::Evaluation;
use crate::api::job_spec::{self, Converted, JobRegisterRequest};
use crate::api::jobs::{
    Job, JobDeregisterResponse, JobListStub, JobRegisterResponse, JobRevertRequest, JobSummary, JobVersionsResponse,
    ScalingRequest,
};
use crate::api::periodic::{JobDispatchRequest, JobDispatchResponse, PeriodicForceResponse};

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

/// Reads a job file as `job run` sends it and converts it into the
/// engine's job as the server does on register (Nomad's defaults, a
/// warning per field Drover ignores), then checks it: what `job validate`
/// and `dev --job` read.
pub fn read_job(path: &Path) -> Result<Converted> {
    let body = read_job_file(path)?;
    let request: JobRegisterRequest =
        serde_json::from_value(body).with_context(|| format!("{}: not a Nomad job", path.display()))?;
    let spec = request.job.ok_or_else(|| anyhow!("{}: Job must be specified", path.display()))?;
    let converted = job_spec::convert_job(spec, None).with_context(|| format!("checking {}", path.display()))?;
    converted.job.validate().with_context(|| format!("checking {}", path.display()))?;
    Ok(converted)
}

/// `drover job validate FILE`: reads the job as the server would and lists
/// every problem in it.
pub fn validate(path: &Path) -> Result<()> {
    let Converted { job, warnings } = read_job(path)?;
    if !warnings.is_empty() {
        println!("Job Warnings:\n{}\n", warnings.join("\n"));
    }
    println!("job {:?} ({}, {} task groups) is valid", job.id, job.job_type, job.task_groups.len());
    Ok(())
}

/// `drover job run FILE`: registers the job, then monitors its eval unless
/// `detach`. The exit code is the monitor's: 2 when placements failed.
/// With `check_index`, the server registers it only if the job's
/// `JobModifyIndex` is that (0: only if there is no such job), as `job
/// plan` printed it.
pub async fn run(api: &ApiClient, path: &Path, detach: bool, check_index: Option<u64>) -> Result<i32> {
    let mut body = read_job_file(path)?;
    if let Some(index) = check_index {
        body["EnforceIndex"] = json!(true);
        body["JobModifyIndex"] = json!(index);
    }
    let registered: JobRegisterResponse = api.write("PUT", "/v1/jobs", &body).await.context("Error submitting job")?;
    if !registered.warnings.is_empty() {
        println!("Job Warnings:\n{}\n", registered.warnings);
    }
    let job_id = body["Job"]["ID"].as_str().unwrap_or_default();
    if registered.eval_id.is_empty() {
        // A periodic or parameterized job runs nothing itself (Nomad's words).
        println!("Job registration successful");
        let job: Job = api.query(&format!("/v1/job/{job_id}")).await?;
        for (_, next) in super::job_parent::status_fields(&job) {
            println!("Approximate next launch time: {next}");
        }
        return Ok(0);
    }
    if detach {
        println!("Job registration successful\nEvaluation ID: {}", registered.eval_id);
        return Ok(0);
    }
    let code = monitor(api, &registered.eval_id).await?;
    super::deployment_monitor::follow_registered(api, job_id, registered.job_modify_index, code).await
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
        let eval: Evaluation = api
            .query(&format!("/v1/evaluation/{eval_id}"))
            .await
            .with_context(|| format!("No evaluation with id \"{eval_id}\" found"))?;
        if !said_job && !eval.job_id.is_empty() {
            println!("    Evaluation triggered by job \"{}\"", eval.job_id);
            said_job = true;
        }
        let path = format!("/v1/evaluation/{eval_id}/allocations?index={index}&wait=1s");
        let (allocs, answered_index) = api.query_indexed::<Vec<AllocationListStub>>(&path).await?;
        index = answered_index.unwrap_or(index);
        for alloc in allocs {
            match seen.get(&alloc.id) {
                None => {
                    let verb = if alloc.create_index < eval.create_index { "modified" } else { "created" };
                    println!(
                        "    Allocation \"{}\" {verb}: node \"{}\", group \"{}\"",
                        short(&alloc.id),
                        short(&alloc.node_id),
                        alloc.task_group
                    );
                }
                Some(old) if *old != alloc.client_status => println!(
                    "    Allocation \"{}\" status changed: \"{old}\" -> \"{}\"",
                    short(&alloc.id),
                    alloc.client_status
                ),
                Some(_) => {}
            }
            seen.insert(alloc.id, alloc.client_status);
        }
        if eval.status != last_status && eval.status != "pending" {
            println!("    Evaluation status changed: \"{last_status}\" -> \"{}\"", eval.status);
            last_status = eval.status.clone();
        }
        if matches!(eval.status.as_str(), "complete" | "failed" | "canceled") {
            return Ok(finished(eval_id, &eval));
        }
    }
}

/// The monitor's last lines; 2 when placements failed.
fn finished(eval_id: &str, eval: &Evaluation) -> i32 {
    let status = &eval.status;
    let Some(failed) = eval.failed_tg_allocs.as_ref().filter(|failed| !failed.is_empty()) else {
        println!("==> Evaluation \"{}\" finished with status \"{status}\"", short(eval_id));
        return 0;
    };
    println!(
        "==> Evaluation \"{}\" finished with status \"{status}\" but failed to place all allocations:",
        short(eval_id)
    );
    for (group, metric) in failed {
        let count = metric.coalesced_failures + 1;
        println!("    Task Group \"{group}\" (failed to place {count} allocation(s)):");
        if metric.nodes_evaluated == 0 {
            println!("      * No nodes were eligible for evaluation");
        }
        for (filtered, label) in [(&metric.constraint_filtered, "Constraint"), (&metric.class_filtered, "Class")] {
            for (name, nodes) in filtered {
                println!("      * {label} \"{name}\": {nodes} nodes excluded by filter");
            }
        }
        if metric.nodes_exhausted > 0 {
            println!("      * Resources exhausted on {} nodes", metric.nodes_exhausted);
        }
        for (dimension, nodes) in &metric.dimension_exhausted {
            println!("      * Dimension \"{dimension}\" exhausted on {nodes} nodes");
        }
    }
    if !eval.blocked_eval.is_empty() {
        println!("    Evaluation \"{}\" waiting for additional capacity to place remainder", short(eval_id));
    }
    2
}

/// `drover job status [ID]`.
pub async fn status(api: &ApiClient, id: Option<&str>, json_out: bool) -> Result<i32> {
    let Some(id) = id else {
        let jobs: Vec<JobListStub> = api.query("/v1/jobs").await?;
        if json_out {
            print_json(&jobs)?;
            return Ok(0);
        }
        if jobs.is_empty() {
            println!("No running jobs");
            return Ok(0);
        }
        let rows: Vec<Vec<String>> = jobs
            .iter()
            .map(|job| {
                let stopped = if job.stop { " (stopped)" } else { "" };
                vec![
                    job.id.clone(),
                    job.job_type.clone(),
                    job.priority.to_string(),
                    format!("{}{stopped}", job.status),
                    date(job.submit_time),
                ]
            })
            .collect();
        print!("{}", table(&["ID", "Type", "Priority", "Status", "Submit Date"], &rows));
        return Ok(0);
    };
    let job_id = resolve(api, id).await?;
    let job: Job = api.query(&format!("/v1/job/{job_id}")).await?;
    let allocs: Vec<AllocationListStub> = api.query(&format!("/v1/job/{job_id}/allocations")).await?;
    let summary: JobSummary = api.query(&format!("/v1/job/{job_id}/summary")).await?;
    if json_out {
        print_json(&job)?;
        return Ok(0);
    }
    let stopped = if job.stop { " (stopped)" } else { "" };
    let mut lines = vec![
        ("ID", job.id.clone()),
        ("Name", job.name.clone()),
        ("Submit Date", date(job.submit_time)),
        ("Type", job.job_type.clone()),
        ("Priority", job.priority.to_string()),
        ("Datacenters", job.datacenters.join(",")),
        ("Namespace", job.namespace.clone()),
        ("Status", format!("{}{stopped}", job.status)),
        ("Periodic", job.periodic.is_some().to_string()),
        ("Parameterized", (job.parameterized_job.is_some() && !job.dispatched).to_string()),
    ];
    lines.extend(super::job_parent::status_fields(&job));
    print!("{}", fields(&lines));
    if job.periodic.is_some() || (job.parameterized_job.is_some() && !job.dispatched) {
        super::job_parent::print_children(api, &job, &summary).await?;
        return Ok(0);
    }
    println!("\nSummary");
    let counts: Vec<Vec<String>> = summary
        .summary
        .iter()
        .map(|(group, c)| {
            let mut row = vec![group.clone()];
            row.extend([c.queued, c.starting, c.running, c.failed, c.complete, c.lost].map(|n| n.to_string()));
            row
        })
        .collect();
    print!("{}", table(&["Task Group", "Queued", "Starting", "Running", "Failed", "Complete", "Lost"], &counts));
    super::deployment_monitor::print_latest(api, &job_id).await?;
    println!("\nAllocations");
    print_allocs(&allocs);
    Ok(0)
}

/// The `Allocations` table of `job status` and `node status`.
pub fn print_allocs(allocs: &[AllocationListStub]) {
    if allocs.is_empty() {
        println!("No allocations placed");
        return;
    }
    let rows: Vec<Vec<String>> = allocs
        .iter()
        .map(|alloc| {
            vec![
                short(&alloc.id),
                short(&alloc.node_id),
                alloc.task_group.clone(),
                alloc.job_version.to_string(),
                alloc.desired_status.clone(),
                alloc.client_status.clone(),
                ago(alloc.create_time),
                ago(alloc.modify_time),
            ]
        })
        .collect();
    let header = ["ID", "Node ID", "Task Group", "Version", "Desired", "Status", "Created", "Modified"];
    print!("{}", table(&header, &rows));
}

/// The job id a prefix names, as Nomad resolves it.
pub(super) async fn resolve(api: &ApiClient, prefix: &str) -> Result<String> {
    let jobs: Vec<JobListStub> = api.query(&format!("/v1/jobs?prefix={prefix}")).await?;
    match jobs.as_slice() {
        [] => bail!("No job(s) with prefix or id \"{prefix}\" found"),
        [only] => Ok(only.id.clone()),
        [first, ..] if first.id == prefix => Ok(prefix.to_string()),
        _ => bail!("Prefix matched multiple jobs"),
    }
}

/// `drover job stop [--purge] ID`.
pub async fn stop(api: &ApiClient, id: &str, purge: bool, detach: bool) -> Result<i32> {
    let job_id = resolve(api, id).await?;
    let stopped: JobDeregisterResponse = api
        .write_empty("DELETE", &format!("/v1/job/{job_id}?purge={purge}"))
        .await
        .context("Error deregistering job")?;
    if stopped.eval_id.is_empty() {
        return Ok(0);
    }
    if detach {
        println!("{}", stopped.eval_id);
        return Ok(0);
    }
    monitor(api, &stopped.eval_id).await
}

/// `drover job scale ID [GROUP] COUNT`.
pub async fn scale(api: &ApiClient, id: &str, group: Option<&str>, count: u32, detach: bool) -> Result<i32> {
    let job: Job = api.query(&format!("/v1/job/{id}")).await?;
    let group = match group {
        Some(group) => group.to_string(),
        None => match job.task_groups.as_slice() {
            [only] => only.name.clone(),
            _ => bail!("Job {id:?} has several task groups: name the one to scale"),
        },
    };
    let body = ScalingRequest {
        count: Some(i64::from(count)),
        target: Some(BTreeMap::from([("Group".to_string(), group)])),
        message: None,
    };
    let scaled: JobRegisterResponse = api.write("POST", &format!("/v1/job/{id}/scale"), &body).await?;
    if detach {
        println!("Job scale successful\nEvaluation ID: {}", scaled.eval_id);
        return Ok(0);
    }
    monitor(api, &scaled.eval_id).await
}

/// `drover job history ID`: each kept version, newest first, as Nomad's
/// `job history` prints them without `-p` (Drover computes no diffs yet,
/// so `-p` is not offered).
pub async fn history(api: &ApiClient, id: &str, json_out: bool) -> Result<i32> {
    let job_id = resolve(api, id).await?;
    let answer: JobVersionsResponse =
        api.query(&format!("/v1/job/{job_id}/versions")).await.context("Error retrieving job versions")?;
    if json_out {
        print_json(&answer.versions)?;
        return Ok(0);
    }
    let blocks: Vec<String> = answer
        .versions
        .iter()
        .map(|job| {
            fields(&[
                ("Version", job.version.to_string()),
                ("Stable", job.stable.to_string()),
                ("Submit Date", date(job.submit_time)),
            ])
        })
        .collect();
    print!("{}", blocks.join("\n"));
    Ok(0)
}

/// `drover job revert ID VERSION`: registers the kept version again as
/// the job's next version, then monitors its eval unless `detach`.
pub async fn revert(api: &ApiClient, id: &str, version: u64, detach: bool) -> Result<i32> {
    let job_id = resolve(api, id).await?;
    let body = JobRevertRequest { job_id: job_id.clone(), job_version: version, enforce_prior_version: None };
    let reverted: JobRegisterResponse =
        api.write("POST", &format!("/v1/job/{job_id}/revert"), &body).await.context("Error reverting job")?;
    if detach {
        println!("Evaluation ID: {}", reverted.eval_id);
        return Ok(0);
    }
    let code = monitor(api, &reverted.eval_id).await?;
    super::deployment_monitor::follow_registered(api, &job_id, reverted.job_modify_index, code).await
}

#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// Reads a job file (Nomad's HCL or JSON, as `job run` takes) as the
    /// server would, and lists every problem in it.
    Validate {
        /// The job file.
        path: PathBuf,
    },
    /// Registers a job from a file of Nomad's job HCL or JSON and follows
    /// its evaluation (exit 2 when placements failed).
    Run {
        /// The job file.
        path: PathBuf,
        /// Do not follow the evaluation.
        #[arg(long)]
        detach: bool,
        /// Register only if the job's modify index is this (0: only a new
        /// job), as `job plan` prints it.
        #[arg(long)]
        check_index: Option<u64>,
    },
    /// What registering a job file would do, decided by the scheduler and
    /// written nowhere: the diff from the stored job and the placements
    /// (exit 0: no allocation created or destroyed, 1: some, 255: error).
    Plan {
        /// The job file.
        path: PathBuf,
        /// Print the diff from the stored job.
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
        diff: bool,
        /// Print unchanged fields too.
        #[arg(long)]
        verbose: bool,
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
    /// The job's kept versions, newest first (version, stable, submit date).
    History {
        /// A job id or prefix.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Registers a kept version of a job again, as its next version, and
    /// follows its evaluation.
    Revert {
        /// A job id or prefix.
        id: String,
        /// The version to revert to.
        version: u64,
        /// Do not follow the evaluation.
        #[arg(long)]
        detach: bool,
    },
    /// The job's deployments, newest first (`--latest`: its newest, in full).
    Deployments {
        /// A job id or prefix.
        id: String,
        /// Only the newest deployment, with its groups' progress.
        #[arg(long)]
        latest: bool,
        /// Also the deployments of earlier jobs of the same id (purged).
        #[arg(long)]
        all: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Full ids.
        #[arg(long)]
        verbose: bool,
    },
    /// Dispatches a parameterized job: a child job with the payload read
    /// from INPUT (`-`: standard input) and the meta given, then follows
    /// its evaluation.
    Dispatch {
        /// A parameterized job's id or prefix.
        id: String,
        /// The payload file, or `-` for standard input.
        input: Option<PathBuf>,
        /// A meta key and value, `key=value` (repeatable).
        #[arg(long = "meta")]
        meta: Vec<String>,
        /// A repeated dispatch with the same token returns the job it made.
        #[arg(long)]
        idempotency_token: Option<String>,
        /// Do not follow the evaluation.
        #[arg(long)]
        detach: bool,
    },
    /// Periodic jobs: `periodic force JOB` launches one now.
    Periodic {
        #[command(subcommand)]
        command: PeriodicCommand,
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

/// `drover job dispatch`: dispatches a parameterized job with `meta`
/// (`k=v` each) and the payload read from `input` (`-`: standard input),
/// then monitors the child's eval unless `detach`.
pub async fn dispatch(
    api: &ApiClient,
    id: &str,
    input: Option<&Path>,
    meta: &[String],
    idempotency_token: Option<&str>,
    detach: bool,
) -> Result<i32> {
    let job_id = resolve(api, id).await?;
    let payload = match input {
        None => Vec::new(),
        Some(path) if path == Path::new("-") => {
            let mut bytes = Vec::new();
            std::io::stdin().read_to_end(&mut bytes).context("Error reading input data")?;
            bytes
        }
        Some(path) => std::fs::read(path).with_context(|| format!("Error reading input data {}", path.display()))?,
    };
    let mut pairs = BTreeMap::new();
    for pair in meta {
        let Some((key, value)) = pair.split_once('=') else {
            bail!("Error parsing meta value: {pair:?} is not key=value");
        };
        pairs.insert(key.to_string(), value.to_string());
    }
    let request = JobDispatchRequest {
        job_id: job_id.clone(),
        payload: (!payload.is_empty()).then(|| BASE64.encode(&payload)),
        meta: Some(pairs),
        ..JobDispatchRequest::default()
    };
    let mut path = format!("/v1/job/{job_id}/dispatch");
    if let Some(token) = idempotency_token.filter(|token| !token.is_empty()) {
        path.push_str(&format!("?idempotency_token={token}"));
    }
    let dispatched: JobDispatchResponse = api.write("PUT", &path, &request).await.context("Failed to dispatch job")?;
    let mut lines = vec![("Dispatched Job ID", dispatched.dispatched_job_id.clone())];
    if !dispatched.eval_id.is_empty() {
        lines.push(("Evaluation ID", short(&dispatched.eval_id)));
    }
    print!("{}", fields(&lines));
    if detach || dispatched.eval_id.is_empty() {
        return Ok(0);
    }
    println!();
    monitor(api, &dispatched.eval_id).await
}

/// `drover job periodic force JOB`: launches the periodic job's child now
/// and monitors its eval unless `detach`.
pub async fn periodic_force(api: &ApiClient, id: &str, detach: bool) -> Result<i32> {
    let job_id = resolve(api, id).await?;
    let forced: PeriodicForceResponse = api
        .write_empty("PUT", &format!("/v1/job/{job_id}/periodic/force"))
        .await
        .context("Error forcing periodic job")?;
    if detach || forced.eval_id.is_empty() {
        println!("Force periodic successful");
        if !forced.eval_id.is_empty() {
            println!("Evaluation ID: {}", forced.eval_id);
        }
        return Ok(0);
    }
    monitor(api, &forced.eval_id).await
}

/// `drover job periodic ...`.
#[derive(Debug, Subcommand)]
pub enum PeriodicCommand {
    /// Launches the periodic job's child now, whatever its schedule and
    /// `prohibit_overlap`, and follows its evaluation.
    Force {
        /// A periodic job's id or prefix.
        id: String,
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
            JobCommand::Run { path, detach, check_index } => run(&client, &path, detach, check_index).await,
            JobCommand::Plan { path, diff, verbose } => {
                super::job_plan::plan(&client, &path, read_job_file(&path), diff, verbose).await
            }
            JobCommand::Status { id, json } => status(&client, id.as_deref(), json).await,
            JobCommand::Stop { id, purge, detach } => stop(&client, &id, purge, detach).await,
            JobCommand::History { id, json } => history(&client, &id, json).await,
            JobCommand::Revert { id, version, detach } => revert(&client, &id, version, detach).await,
            JobCommand::Deployments { id, latest, all, json, verbose } => {
                let job_id = resolve(&client, &id).await?;
                super::deployment_monitor::job_deployments(&client, &job_id, latest, all, json, verbose).await
            }
            JobCommand::Scale { id, group_and_count, detach } => {
                let (group, count) = match group_and_count.as_slice() {
                    [count] => (None, count),
                    [group, count] => (Some(group.as_str()), count),
                    _ => anyhow::bail!("usage: drover job scale ID [GROUP] COUNT"),
                };
                let count: u32 = count.parse().map_err(|_| anyhow::anyhow!("count {count:?} is not a number"))?;
                scale(&client, &id, group, count, detach).await
            }
            JobCommand::Dispatch { id, input, meta, idempotency_token, detach } => {
                let token = idempotency_token.as_deref();
                dispatch(&client, &id, input.as_deref(), &meta, token, detach).await
            }
            JobCommand::Periodic { command: PeriodicCommand::Force { id, detach } } => {
                periodic_force(&client, &id, detach).await
            }
            JobCommand::Validate { path } => validate(&path).map(|()| 0),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("job file");
        path
    }

    #[test]
    fn a_job_file_reads_as_the_server_reads_it_whatever_its_form() {
        let dir = tempfile::tempdir().expect("dir");
        let bare = r#"{"ID": "web", "Datacenters": ["dc1"], "TaskGroups": [{"Name": "web", "Tasks":
            [{"Name": "server", "Driver": "mock", "Config": {"run_for": "1h"}, "Resources": {"CPU": 100}}]}]}"#;
        let wrapped = format!("{{\"Job\": {bare}}}");
        let hcl = "job \"web\" {\n  datacenters = [\"dc1\"]\n  group \"web\" {\n    task \"server\" {\n      driver = \"mock\"\n      config { run_for = \"1h\" }\n      resources { cpu = 100 }\n    }\n  }\n}\n";
        let jobs: Vec<Converted> = [("bare.json", bare), ("wrapped.json", wrapped.as_str()), ("web.hcl", hcl)]
            .into_iter()
            .map(|(name, text)| read_job(&file(&dir, name, text)).expect(name))
            .collect();
        assert_eq!(jobs[0].job, jobs[1].job);
        assert_eq!(jobs[0].job, jobs[2].job);
        let job = &jobs[0].job;
        assert_eq!((&*job.id, job.priority), ("web", 50), "Nomad's defaults");
        assert_eq!(job.task_groups[0].tasks[0].resources.memory_mb, 300, "Nomad's default memory");
    }

    #[test]
    fn a_job_file_is_refused_with_what_is_wrong() {
        let dir = tempfile::tempdir().expect("dir");
        let refused = |name: &str, text: &str| format!("{:#}", read_job(&file(&dir, name, text)).expect_err(name));
        let engine_form = r#"{"id": "web", "datacenters": ["dc1"], "task_groups": []}"#;
        assert!(refused("engine.json", engine_form).contains("Job ID hasn't been provided"));
        let bad_type = r#"{"Job": {"ID": "web", "Type": "daemon"}}"#;
        assert!(refused("type.json", bad_type).contains("daemon"));
        let no_datacenters = r#"{"Job": {"ID": "web", "TaskGroups": [{"Name": "web", "Tasks":
            [{"Name": "server", "Driver": "mock"}]}]}}"#;
        assert!(refused("dc.json", no_datacenters).contains("no datacenters"));
        let hcl = refused("bad.hcl", "job \"web\" {\n  vault {}\n}\n");
        assert!(hcl.contains("bad.hcl:2"), "{hcl}");
    }
}
