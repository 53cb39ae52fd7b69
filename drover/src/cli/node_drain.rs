//! `drover node drain` as Nomad's CLI has it (`command/node_drain.go` and
//! `api/nodes.go`'s `MonitorDrain`): sets or ends a node's drain, then,
//! unless `--detach`, follows it: the node (until its drain ends) and its
//! allocations (until none runs), each with blocking queries, printing a
//! timestamped line per change.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use tokio::sync::mpsc;

use super::date;
use crate::api::allocations::Allocation;
use crate::api::client::ApiClient;
use crate::api::format::parse_go_duration;
use crate::api::nodes::{DrainSpec, Node, NodeUpdateDrainRequest, NodeWriteResponse};

/// How long one blocking query of the monitor waits before asking again.
const MONITOR_WAIT: &str = "30s";

/// What `drover node drain` is asked: Nomad's flags.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct DrainArgs {
    /// Start (or change) the drain.
    #[arg(long)]
    pub enable: bool,
    /// End the drain; the node becomes eligible again unless --keep-ineligible.
    #[arg(long)]
    pub disable: bool,
    /// How long allocations may take to move before what remains is stopped (default 1h).
    #[arg(long)]
    pub deadline: Option<String>,
    /// Stop everything at once.
    #[arg(long)]
    pub force: bool,
    /// No deadline: batch allocations may run to their end.
    #[arg(long)]
    pub no_deadline: bool,
    /// Leave system allocations on the node.
    #[arg(long)]
    pub ignore_system: bool,
    /// With --disable: keep the node ineligible.
    #[arg(long)]
    pub keep_ineligible: bool,
    /// Return once the drain is set instead of following it.
    #[arg(long)]
    pub detach: bool,
    /// Follow a drain already under way.
    #[arg(long)]
    pub monitor: bool,
    /// Do not ask for confirmation (Drover never asks).
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// `key=value` attached to the drain's record; may be repeated.
    #[arg(long)]
    pub meta: Vec<String>,
}

/// `drover node drain ...`, `node_id` resolved already.
pub async fn drain(api: &ApiClient, node_id: &str, args: &DrainArgs) -> Result<i32> {
    if args.monitor {
        if args.enable || args.disable || args.detach {
            bail!("The -monitor flag cannot be used with the '-enable' or '-disable' or '-detach' flags");
        }
        return monitor(api, node_id, args.ignore_system).await;
    }
    if args.enable == args.disable {
        bail!("Either the '-enable' or '-disable' flag must be set, unless using '-monitor'");
    }
    if args.disable && (args.deadline.is_some() || args.force || args.no_deadline || args.ignore_system) {
        bail!("-disable can't be combined with flags configuring drain strategy");
    }
    let deadline = match (&args.deadline, args.force, args.no_deadline) {
        (Some(_), true, _) | (Some(_), _, true) => bail!("-deadline can't be combined with -force or -no-deadline"),
        (_, true, true) => bail!("-force and -no-deadline are mutually exclusive"),
        (Some(text), false, false) => {
            let deadline = parse_go_duration(text).with_context(|| format!("Failed to parse deadline {text:?}"))?;
            if deadline.is_zero() {
                bail!("A deadline of zero seconds is not allowed: use -no-deadline for none");
            }
            i64::try_from(deadline.as_nanos()).context("deadline too long")?
        }
        (None, true, false) => -1_000_000_000,
        (None, false, true) => 0,
        (None, false, false) => 3600 * 1_000_000_000,
    };
    let meta = args
        .meta
        .iter()
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) => Ok((key.to_string(), value.to_string())),
            None => bail!("Error parsing meta {pair:?}: expected key=value"),
        })
        .collect::<Result<BTreeMap<String, String>>>()?;
    let request = NodeUpdateDrainRequest {
        node_id: Some(node_id.to_string()),
        drain_spec: args.enable.then_some(DrainSpec { deadline, ignore_system_jobs: args.ignore_system }),
        mark_eligible: args.disable && !args.keep_ineligible,
        meta: (!meta.is_empty()).then_some(meta),
    };
    let _: NodeWriteResponse = api
        .write("PUT", &format!("/v1/node/{node_id}/drain"), &request)
        .await
        .context("Error updating drain specification")?;
    if args.disable {
        println!("Node {node_id:?} drain strategy unset");
        return Ok(0);
    }
    println!("Node {node_id:?} drain strategy set");
    if args.detach {
        return Ok(0);
    }
    monitor(api, node_id, args.ignore_system).await
}

/// What the monitor's two followers report.
enum Seen {
    /// The node's drain ended (it completed or was ended), or the node went down.
    NodeDone(String),
    /// A line about an allocation.
    Alloc(String),
    /// No allocation of the drain runs on the node any more.
    AllocsDone,
}

/// Follows a node's drain until it ended and its allocations stopped
/// (module docs); system allocations are not waited for with `ignore_system`.
async fn monitor(api: &ApiClient, node_id: &str, ignore_system: bool) -> Result<i32> {
    println!("{}: Ctrl-C to stop monitoring: will not cancel the node drain", date_now());
    let (sender, mut seen) = mpsc::unbounded_channel();
    let node = follow_node(api.clone(), node_id.to_string(), sender.clone());
    let allocs = follow_allocs(api.clone(), node_id.to_string(), ignore_system, sender);
    let followers = async {
        let (node, allocs) = tokio::join!(node, allocs);
        node.and(allocs)
    };
    let printer = async {
        while let Some(event) = seen.recv().await {
            let line = match event {
                Seen::NodeDone(line) | Seen::Alloc(line) => line,
                Seen::AllocsDone => format!("All allocations on node {node_id:?} have stopped"),
            };
            println!("{}: {line}", date_now());
        }
    };
    let (followed, ()) = tokio::join!(followers, printer);
    followed?;
    Ok(0)
}

/// Blocks on the node until its drain ends.
async fn follow_node(api: ApiClient, node_id: String, seen: mpsc::UnboundedSender<Seen>) -> Result<()> {
    let mut index = 0;
    loop {
        let (node, at): (Node, _) =
            api.query_indexed(&format!("/v1/node/{node_id}?index={index}&wait={MONITOR_WAIT}")).await?;
        if node.status == "down" {
            let _ = seen.send(Seen::NodeDone(format!("Node {node_id:?} down")));
            return Ok(());
        }
        if node.drain_strategy.is_none() {
            let _ = seen.send(Seen::NodeDone(format!("Drain complete for node {node_id}")));
            return Ok(());
        }
        index = at.unwrap_or(index);
    }
}

/// Blocks on the node's allocations, reporting their changes, until none
/// of them runs.
async fn follow_allocs(
    api: ApiClient,
    node_id: String,
    ignore_system: bool,
    seen: mpsc::UnboundedSender<Seen>,
) -> Result<()> {
    let mut index = 0;
    let mut known: BTreeMap<String, (String, String)> = BTreeMap::new();
    loop {
        let (allocs, at): (Vec<Allocation>, _) =
            api.query_indexed(&format!("/v1/node/{node_id}/allocations?index={index}&wait={MONITOR_WAIT}")).await?;
        let mut running = 0;
        for alloc in &allocs {
            let stub = &alloc.stub;
            let short: String = stub.id.chars().take(8).collect();
            let system = matches!(alloc.job.job_type.as_str(), "system" | "sysbatch");
            if let Some((desired, client)) = known.get(&stub.id) {
                if *desired == "run" && stub.desired_status == "stop" {
                    let what =
                        if stub.desired_description.contains("migrated") { "marked for migration" } else { "draining" };
                    let _ = seen.send(Seen::Alloc(format!("Alloc {short:?} {what}")));
                }
                if *client != stub.client_status {
                    let line = format!("Alloc {short:?} status {client} -> {}", stub.client_status);
                    let _ = seen.send(Seen::Alloc(line));
                }
            }
            known.insert(stub.id.clone(), (stub.desired_status.clone(), stub.client_status.clone()));
            let live = matches!(stub.client_status.as_str(), "pending" | "running");
            if live && !(system && ignore_system) {
                running += 1;
            }
        }
        if running == 0 {
            let _ = seen.send(Seen::AllocsDone);
            return Ok(());
        }
        index = at.unwrap_or(index);
    }
}

fn date_now() -> String {
    date(engine::clock::SystemClock::shared().now().0)
}
