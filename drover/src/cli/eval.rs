//! `drover eval status ID`.

use anyhow::{bail, Result};

use clap::Subcommand;

use super::{date, fields, print_json};
use crate::api::client::ApiClient;
use crate::api::evaluations::Evaluation;

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
}

/// Runs `drover eval ...`.
pub fn command(command: EvalCommand, api: &ApiArgs) -> Result<(), Failure> {
    let EvalCommand::Status { id, monitor, json } = command;
    client_command(api, |client| async move { status(&client, &id, monitor, json).await })
}
