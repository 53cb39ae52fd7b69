//! `drover eval status ID`, `drover eval list` and `drover eval delete`
//! (Nomad's evaluation backlog tools: delete needs the eval broker paused,
//! `PauseEvalBroker` in the scheduler configuration).

use anyhow::{bail, Result};

use clap::Subcommand;

use super::{date, fields, print_json, short, table};
use crate::api::client::ApiClient;
use crate::api::evaluations::{EvalDeleteRequest, EvalDeleteResponse, Evaluation};

use super::{client_command, ApiArgs, Failure};

/// `drover eval status [--monitor] ID`.
pub async fn status(api: &ApiClient, prefix: &str, monitor: bool, json_out: bool) -> Result<i32> {
    let matches: Vec<Evaluation> = api.query(&format!("/v1/evaluations?prefix={prefix}")).await?;
    let id = match matches.as_slice() {
        [] => bail!("No evaluation(s) with prefix or id \"{prefix}\" found"),
        [only] => only.id.clone(),
        _ => bail!("Prefix matched multiple evaluations"),
    };
    if monitor {
        return super::job::monitor(api, &id).await;
    }
    let eval: Evaluation = api.query(&format!("/v1/evaluation/{id}")).await?;
    if json_out {
        print_json(&eval)?;
        return Ok(0);
    }
    let status = eval.status.clone();
    let description = Some(eval.status_description.clone()).filter(|d| !d.is_empty()).unwrap_or(status.clone());
    let failures = eval.failed_tg_allocs.as_ref().is_some_and(|failed| !failed.is_empty());
    let mut pairs = vec![
        ("ID", eval.id.clone()),
        ("Create Time", date(eval.create_time)),
        ("Modify Time", date(eval.modify_time)),
        ("Status", status.clone()),
        ("Status Description", description),
        ("Type", eval.eval_type.clone()),
        ("TriggeredBy", eval.triggered_by.clone()),
        ("Job ID", eval.job_id.clone()),
    ];
    if !eval.node_id.is_empty() {
        pairs.push(("Node ID", eval.node_id.clone()));
    }
    pairs.push(("Priority", eval.priority.to_string()));
    let placement = if status == "blocked" { "N/A - In Progress".to_string() } else { failures.to_string() };
    pairs.push(("Placement Failures", placement));
    print!("{}", fields(&pairs));
    Ok(0)
}

/// `drover eval list [--filter F] [--per-page N] [--page-token T] [--json]`:
/// Nomad's columns, newest first.
pub async fn list(
    api: &ApiClient,
    filter: Option<&str>,
    per_page: Option<u64>,
    token: Option<&str>,
    json_out: bool,
) -> Result<i32> {
    let mut query = Vec::new();
    if let Some(filter) = filter {
        query.push(format!("filter={}", query_escape(filter)));
    }
    if let Some(per_page) = per_page {
        query.push(format!("per_page={per_page}"));
    }
    if let Some(token) = token {
        query.push(format!("next_token={}", query_escape(token)));
    }
    let response = api.get(&format!("/v1/evaluations?{}", query.join("&"))).await?;
    let next = response.next_token.clone();
    let evals: Vec<Evaluation> = response.decode()?;
    if json_out {
        print_json(&evals)?;
        return Ok(0);
    }
    if evals.is_empty() {
        println!("No evals found");
        return Ok(0);
    }
    let header = ["ID", "Priority", "Triggered By", "Job ID", "Namespace", "Node ID", "Status", "Placement Failures"];
    let rows: Vec<Vec<String>> = evals
        .iter()
        .map(|eval| {
            let failures = eval.failed_tg_allocs.as_ref().is_some_and(|failed| !failed.is_empty());
            let node = if eval.node_id.is_empty() { "<none>".to_string() } else { short(&eval.node_id) };
            vec![
                short(&eval.id),
                eval.priority.to_string(),
                eval.triggered_by.clone(),
                eval.job_id.clone(),
                eval.namespace.clone(),
                node,
                eval.status.clone(),
                failures.to_string(),
            ]
        })
        .collect();
    print!("{}", table(&header, &rows));
    if let Some(next) = next {
        println!("\nResults have been paginated. To get the next page run:\n\ndrover eval list --page-token {next}");
    }
    Ok(0)
}

/// `drover eval delete [--filter F] [ID]`: by id (or unique prefix), or
/// every evaluation the filter matches.
pub async fn delete(api: &ApiClient, id: Option<&str>, filter: Option<&str>) -> Result<i32> {
    let request = match (id, filter) {
        (Some(_), Some(_)) => bail!("Either an evaluation ID or a filter may be given, not both"),
        (None, None) => bail!("An evaluation ID or a filter (--filter) is required"),
        (Some(prefix), None) => {
            let matches: Vec<Evaluation> = api.query(&format!("/v1/evaluations?prefix={prefix}")).await?;
            let id = match matches.as_slice() {
                [] => bail!("No evaluation(s) with prefix or id \"{prefix}\" found"),
                [only] => only.id.clone(),
                _ => bail!("Prefix matched multiple evaluations"),
            };
            EvalDeleteRequest { eval_ids: vec![id], filter: String::new() }
        }
        (None, Some(filter)) => EvalDeleteRequest { eval_ids: vec![], filter: filter.to_string() },
    };
    let deleted: EvalDeleteResponse = api.write("DELETE", "/v1/evaluations", &request).await?;
    let noun = if deleted.count == 1 { "evaluation" } else { "evaluations" };
    println!("Successfully deleted {} {noun}", deleted.count);
    Ok(0)
}

/// `text` escaped for a query string.
fn query_escape(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (byte as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

#[derive(Debug, Subcommand)]
pub enum EvalCommand {
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
    /// Evaluations, newest first.
    List {
        /// Only those this expression matches (Nomad's filter language).
        #[arg(long)]
        filter: Option<String>,
        /// At most this many.
        #[arg(long)]
        per_page: Option<u64>,
        /// Start at this page token (printed under the last page).
        #[arg(long)]
        page_token: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete evaluations (the eval broker must be paused:
    /// `PauseEvalBroker` in `/v1/operator/scheduler/configuration`).
    Delete {
        /// An evaluation id or prefix.
        id: Option<String>,
        /// Every evaluation this expression matches.
        #[arg(long)]
        filter: Option<String>,
    },
}

/// Runs `drover eval ...`.
pub fn command(command: EvalCommand, api: &ApiArgs) -> Result<(), Failure> {
    match command {
        EvalCommand::Status { id, monitor, json } => {
            client_command(api, |client| async move { status(&client, &id, monitor, json).await })
        }
        EvalCommand::List { filter, per_page, page_token, json } => client_command(api, |client| async move {
            list(&client, filter.as_deref(), per_page, page_token.as_deref(), json).await
        }),
        EvalCommand::Delete { id, filter } => {
            client_command(api, |client| async move { delete(&client, id.as_deref(), filter.as_deref()).await })
        }
    }
}
