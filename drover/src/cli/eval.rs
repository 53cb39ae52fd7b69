//! `drover eval status ID`.

use anyhow::{bail, Result};

use super::{date, fields, print_json, text};
use crate::api::client::ApiClient;
use clap::Subcommand;

use super::{client_command, ApiArgs, Failure};

/// `drover eval status [--monitor] ID`.
pub async fn status(api: &ApiClient, prefix: &str, monitor: bool, json_out: bool) -> Result<i32> {
    let matches = api.get(&format!("/v1/evaluations?prefix={prefix}")).await?.json()?;
    let id = match matches.as_array().map(Vec::as_slice).unwrap_or_default() {
        [] => bail!("No evaluation(s) with prefix or id \"{prefix}\" found"),
        [only] => text(only, "ID"),
        _ => bail!("Prefix matched multiple evaluations"),
    };
    if monitor {
        return super::job::monitor(api, &id).await;
    }
    let eval = api.get(&format!("/v1/evaluation/{id}")).await?.json()?;
    if json_out {
        print_json(&eval)?;
        return Ok(0);
    }
    let status = text(&eval, "Status");
    let description = Some(text(&eval, "StatusDescription")).filter(|d| !d.is_empty()).unwrap_or(status.clone());
    let failures = eval["FailedTGAllocs"].as_object().is_some_and(|failed| !failed.is_empty());
    let mut pairs = vec![
        ("ID", text(&eval, "ID")),
        ("Create Time", date(eval["CreateTime"].as_u64().unwrap_or(0))),
        ("Modify Time", date(eval["ModifyTime"].as_u64().unwrap_or(0))),
        ("Status", status.clone()),
        ("Status Description", description),
        ("Type", text(&eval, "Type")),
        ("TriggeredBy", text(&eval, "TriggeredBy")),
        ("Job ID", text(&eval, "JobID")),
    ];
    if !text(&eval, "NodeID").is_empty() {
        pairs.push(("Node ID", text(&eval, "NodeID")));
    }
    pairs.push(("Priority", text(&eval, "Priority")));
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
