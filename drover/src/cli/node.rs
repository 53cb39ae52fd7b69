//! `drover node status [ID]`, `drover node eligibility`, `drover node
//! drain` (`node_drain.rs`) and `drover node evaluate`.

use anyhow::{bail, Result};
use clap::Subcommand;

use super::job::print_allocs;
use super::node_drain::{drain, DrainArgs};
use super::{client_command, ApiArgs, Failure};
use super::{fields, print_json, short, table};
use crate::api::allocations::{Allocation, AllocationListStub};
use crate::api::client::ApiClient;
use crate::api::nodes::{
    Node, NodeEligibilityUpdateResponse, NodeListStub, NodeUpdateEligibilityRequest, NodeWriteResponse,
};

/// The node id a prefix names.
async fn resolve(api: &ApiClient, prefix: &str) -> Result<String> {
    let nodes: Vec<NodeListStub> = api.query(&format!("/v1/nodes?prefix={prefix}")).await?;
    match nodes.as_slice() {
        [] => bail!("No node(s) with prefix \"{prefix}\" found"),
        [only] => Ok(only.id.clone()),
        _ => bail!("Prefix matched multiple nodes"),
    }
}

/// `drover node status [--verbose] [ID]`.
pub async fn status(api: &ApiClient, id: Option<&str>, json_out: bool, verbose: bool) -> Result<i32> {
    let Some(id) = id else {
        let nodes: Vec<NodeListStub> = api.query("/v1/nodes").await?;
        if json_out {
            print_json(&nodes)?;
            return Ok(0);
        }
        let rows: Vec<Vec<String>> = nodes
            .iter()
            .map(|node| {
                let id = if verbose { node.id.clone() } else { short(&node.id) };
                let mut row = vec![id, node.datacenter.clone(), node.name.clone(), node.node_class.clone()];
                if verbose {
                    row.extend([node.address.clone(), node.version.clone()]);
                }
                row.extend([node.drain.to_string(), node.scheduling_eligibility.clone(), node.status.clone()]);
                row
            })
            .collect();
        let mut header = vec!["ID", "DC", "Name", "Class"];
        if verbose {
            header.extend(["Address", "Version"]);
        }
        header.extend(["Drain", "Eligibility", "Status"]);
        if !rows.is_empty() {
            print!("{}", table(&header, &rows));
        }
        return Ok(0);
    };
    let node_id = resolve(api, id).await?;
    let node: Node = api.query(&format!("/v1/node/{node_id}")).await?;
    let allocs: Vec<Allocation> = api.query(&format!("/v1/node/{node_id}/allocations")).await?;
    if json_out {
        print_json(&node)?;
        return Ok(0);
    }
    let drivers: Vec<&str> =
        node.drivers.iter().filter(|(_, driver)| driver.detected).map(|(name, _)| name.as_str()).collect();
    print!(
        "{}",
        fields(&[
            ("ID", node.id.clone()),
            ("Name", node.name.clone()),
            ("Class", node.node_class.clone()),
            ("DC", node.datacenter.clone()),
            ("Drain", node.drain.to_string()),
            ("Eligibility", node.scheduling_eligibility.clone()),
            ("Status", node.status.clone()),
            ("Driver Status", drivers.join(",")),
        ])
    );
    let live: Vec<&Allocation> = allocs
        .iter()
        .filter(|alloc| matches!(alloc.stub.client_status.as_str(), "running" | "pending"))
        .filter(|alloc| alloc.stub.desired_status == "run")
        .collect();
    let used = |of: fn(&crate::api::resources::Resources) -> u64| -> u64 {
        live.iter().map(|alloc| of(&alloc.resources)).sum()
    };
    let total =
        |of: fn(&crate::api::resources::Resources) -> u64| of(&node.resources).saturating_sub(of(&node.reserved));
    println!("\nAllocated Resources");
    let row = vec![
        format!("{}/{} MHz", used(|r| r.cpu), total(|r| r.cpu)),
        format!("{} MiB/{} MiB", used(|r| r.memory_mb), total(|r| r.memory_mb)),
        format!("{} MiB/{} MiB", used(|r| r.disk_mb), total(|r| r.disk_mb)),
    ];
    print!("{}", table(&["CPU", "Memory", "Disk"], &[row]));
    if verbose {
        for (title, map) in [("Attributes", &node.attributes), ("Meta", &node.meta)] {
            let pairs: Vec<(&str, String)> = map.iter().map(|(key, value)| (key.as_str(), value.clone())).collect();
            println!("\n{title}");
            print!("{}", fields(&pairs));
        }
    }
    println!("\nAllocations");
    let stubs: Vec<AllocationListStub> =
        allocs.into_iter().map(|alloc| AllocationListStub { job_version: alloc.job.version, ..alloc.stub }).collect();
    print_allocs(&stubs);
    Ok(0)
}

/// `drover node eligibility --enable|--disable ID`.
pub async fn eligibility(api: &ApiClient, id: &str, eligible: bool) -> Result<i32> {
    let node_id = resolve(api, id).await?;
    let word = if eligible { "eligible" } else { "ineligible" };
    let body = NodeUpdateEligibilityRequest { eligibility: Some(word.to_string()) };
    let _: NodeEligibilityUpdateResponse = api.write("PUT", &format!("/v1/node/{node_id}/eligibility"), &body).await?;
    println!("Node \"{node_id}\" scheduling eligibility set: {word} for scheduling");
    Ok(0)
}

/// `drover node evaluate ID`.
pub async fn evaluate(api: &ApiClient, id: &str) -> Result<i32> {
    let node_id = resolve(api, id).await?;
    let answer: NodeWriteResponse = api.write_empty("PUT", &format!("/v1/node/{node_id}/evaluate")).await?;
    let evals = answer.eval_ids.unwrap_or_default();
    println!("Node {node_id:?} evaluated: {} evaluation(s) created", evals.len());
    for eval in evals {
        println!("  {eval}");
    }
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
        /// Full ids, addresses and versions; a node's attributes and meta.
        #[arg(long)]
        verbose: bool,
    },
    /// Drains a node: moves its allocations elsewhere (paced by each
    /// group's `migrate` block), or ends a drain.
    Drain {
        #[command(flatten)]
        args: DrainArgs,
        /// A node id or prefix.
        id: String,
    },
    /// Evaluates every job on the node and every system job again.
    Evaluate {
        /// A node id or prefix.
        id: String,
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
            NodeCommand::Status { id, json, verbose } => status(&client, id.as_deref(), json, verbose).await,
            NodeCommand::Eligibility { enable, id, .. } => eligibility(&client, &id, enable).await,
            NodeCommand::Drain { args, id } => drain(&client, &resolve(&client, &id).await?, &args).await,
            NodeCommand::Evaluate { id } => evaluate(&client, &id).await,
        }
    })
}
