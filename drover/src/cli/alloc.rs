//! `drover alloc status ID`.

use anyhow::{bail, Result};

use super::{ago, fields, print_json, table, text};
use crate::api_client::ApiClient;

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
