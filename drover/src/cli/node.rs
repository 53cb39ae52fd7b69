//! `drover node status [ID]` and `drover node eligibility`.

use anyhow::{bail, Result};
use serde_json::{json, Value};

use super::job::print_allocs;
use super::{fields, print_json, short, table, text};
use crate::api::client::ApiClient;
use clap::Subcommand;

use super::{client_command, ApiArgs, Failure};

/// The node id a prefix names.
async fn resolve(api: &ApiClient, prefix: &str) -> Result<String> {
    let nodes = api.get(&format!("/v1/nodes?prefix={prefix}")).await?.json()?;
    match nodes.as_array().map(Vec::as_slice).unwrap_or_default() {
        [] => bail!("No node(s) with prefix \"{prefix}\" found"),
        [only] => Ok(text(only, "ID")),
        _ => bail!("Prefix matched multiple nodes"),
    }
}

/// `drover node status [ID]`.
pub async fn status(api: &ApiClient, id: Option<&str>, json_out: bool) -> Result<i32> {
    let Some(id) = id else {
        let nodes = api.get("/v1/nodes").await?.json()?;
        if json_out {
            print_json(&nodes)?;
            return Ok(0);
        }
        let rows: Vec<Vec<String>> = nodes
            .as_array()
            .into_iter()
            .flatten()
            .map(|node| {
                vec![
                    short(&text(node, "ID")),
                    text(node, "Datacenter"),
                    text(node, "Name"),
                    text(node, "NodeClass"),
                    text(node, "Drain"),
                    text(node, "SchedulingEligibility"),
                    text(node, "Status"),
                ]
            })
            .collect();
        if !rows.is_empty() {
            print!("{}", table(&["ID", "DC", "Name", "Class", "Drain", "Eligibility", "Status"], &rows));
        }
        return Ok(0);
    };
    let node_id = resolve(api, id).await?;
    let node = api.get(&format!("/v1/node/{node_id}")).await?.json()?;
    let allocs = api.get(&format!("/v1/node/{node_id}/allocations")).await?.json()?;
    if json_out {
        print_json(&node)?;
        return Ok(0);
    }
    let drivers: Vec<String> = node["Drivers"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, driver)| driver["Detected"] == true)
        .map(|(name, _)| name.clone())
        .collect();
    print!(
        "{}",
        fields(&[
            ("ID", text(&node, "ID")),
            ("Name", text(&node, "Name")),
            ("Class", text(&node, "NodeClass")),
            ("DC", text(&node, "Datacenter")),
            ("Drain", text(&node, "Drain")),
            ("Eligibility", text(&node, "SchedulingEligibility")),
            ("Status", text(&node, "Status")),
            ("Driver Status", drivers.join(",")),
        ])
    );
    let used = |key: &str| -> u64 {
        allocs
            .as_array()
            .into_iter()
            .flatten()
            .filter(|alloc| alloc["ClientStatus"] == "running" || alloc["ClientStatus"] == "pending")
            .filter(|alloc| alloc["DesiredStatus"] == "run")
            .filter_map(|alloc| alloc["Resources"][key].as_u64())
            .sum()
    };
    let total = |key: &str| node["Resources"][key].as_u64().unwrap_or(0) - node["Reserved"][key].as_u64().unwrap_or(0);
    println!("\nAllocated Resources");
    let row = vec![
        format!("{}/{} MHz", used("CPU"), total("CPU")),
        format!("{} MiB/{} MiB", used("MemoryMB"), total("MemoryMB")),
        format!("{} MiB/{} MiB", used("DiskMB"), total("DiskMB")),
    ];
    print!("{}", table(&["CPU", "Memory", "Disk"], &[row]));
    println!("\nAllocations");
    let stubs = Value::Array(
        allocs
            .as_array()
            .into_iter()
            .flatten()
            .map(|alloc| {
                let mut stub = alloc.clone();
                stub["JobVersion"] = alloc["Job"]["Version"].clone();
                stub
            })
            .collect(),
    );
    print_allocs(&stubs);
    Ok(0)
}

/// `drover node eligibility --enable|--disable ID`.
pub async fn eligibility(api: &ApiClient, id: &str, eligible: bool) -> Result<i32> {
    let node_id = resolve(api, id).await?;
    let word = if eligible { "eligible" } else { "ineligible" };
    let body = json!({"Eligibility": word});
    api.request("PUT", &format!("/v1/node/{node_id}/eligibility"), Some(&body)).await?.json()?;
    println!("Node \"{node_id}\" scheduling eligibility set: {word} for scheduling");
    Ok(0)
}

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// The node list, or one node with its allocations.
    Status {
        /// A node id or prefix.
        id: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Marks a node eligible or ineligible for new placements.
    Eligibility {
        /// Eligible.
        #[arg(long, conflicts_with = "disable", required_unless_present = "disable")]
        enable: bool,
        /// Ineligible.
        #[arg(long)]
        disable: bool,
        /// A node id or prefix.
        id: String,
    },
}

/// Runs `drover node ...`.
pub fn command(command: NodeCommand, api: &ApiArgs) -> Result<(), Failure> {
    client_command(api, |client| async move {
        match command {
            NodeCommand::Status { id, json } => status(&client, id.as_deref(), json).await,
            NodeCommand::Eligibility { enable, id, .. } => eligibility(&client, &id, enable).await,
        }
    })
}
