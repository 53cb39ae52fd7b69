//! `drover event stream`: follows the event stream (`GET
//! /v1/event/stream`), which Nomad's CLI has no command for. One line per
//! event (`Index  Topic  Type  Key`), or with `--json` each frame as the
//! server sent it; heartbeats are not printed. It runs until the server
//! ends the stream (a dropped subscriber exits 1 with the server's reason)
//! or it is interrupted.

use std::io::Write;

use anyhow::{bail, Result};
use clap::Subcommand;

use super::{client_command, ApiArgs, Failure};
use crate::api::client::{query_value, ApiClient};
use crate::api::events::EventFrame;

/// `drover event ...`.
#[derive(Debug, Subcommand)]
pub enum EventCommand {
    /// Prints the cluster's events as they happen.
    Stream {
        /// `Topic` or `Topic:Key` (repeatable): `Job`, `Evaluation`,
        /// `Allocation`, `Deployment`, `Node`, `Service`, `ACLToken`,
        /// `ACLPolicy`, `*`; a key is an object's id, or the job,
        /// deployment or service name it belongs to. None: every topic.
        #[arg(long = "topic")]
        topics: Vec<String>,
        /// Start at this index (0: the oldest event the server keeps).
        #[arg(long, default_value_t = 0)]
        index: u64,
        /// Print each frame as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `command`.
pub fn command(command: EventCommand, api: &ApiArgs) -> Result<(), Failure> {
    match command {
        EventCommand::Stream { topics, index, json } => {
            client_command(api, |client| async move { stream(&client, &topics, index, json).await })
        }
    }
}

/// The request's path and query (the namespace is the client's,
/// `--namespace`).
fn path_of(topics: &[String], index: u64) -> String {
    let mut path = format!("/v1/event/stream?index={index}");
    for topic in topics {
        path.push_str(&format!("&topic={}", query_value(topic)));
    }
    path
}

async fn stream(api: &ApiClient, topics: &[String], index: u64, json: bool) -> Result<i32> {
    let mut stream = api.stream(&path_of(topics, index)).await?.ok().await?;
    let mut out = std::io::stdout().lock();
    while let Some(frame) = stream.next_value::<EventFrame>().await? {
        if let Some(error) = &frame.error {
            bail!("the server ended the stream: {error}");
        }
        if frame.is_heartbeat() {
            continue;
        }
        if json {
            writeln!(out, "{}", serde_json::to_string(&frame)?)?;
        } else {
            for event in &frame.events {
                writeln!(out, "{}  {}  {}  {}", event.index, event.topic, event.event_type, event.key)?;
            }
        }
        out.flush()?;
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_are_sent_as_query_values() {
        assert_eq!(
            path_of(&["Job:web app".to_string(), "Node".to_string()], 7),
            "/v1/event/stream?index=7&topic=Job:web%20app&topic=Node"
        );
    }
}
