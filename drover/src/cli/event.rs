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
use crate::api::client::ApiClient;
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
        /// The namespace (`*`: all).
        #[arg(long, default_value = "default")]
        namespace: String,
        /// Print each frame as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `command`.
pub fn command(command: EventCommand, api: &ApiArgs) -> Result<(), Failure> {
    match command {
        EventCommand::Stream { topics, index, namespace, json } => {
            client_command(api, |client| async move { stream(&client, &topics, index, &namespace, json).await })
        }
    }
}

/// The request's path and query.
fn path_of(topics: &[String], index: u64, namespace: &str) -> String {
    let mut path = format!("/v1/event/stream?index={index}&namespace={}", encode(namespace));
    for topic in topics {
        path.push_str(&format!("&topic={}", encode(topic)));
    }
    path
}

/// Percent-encodes what a query value may not hold as it is.
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b':' | b'*' => {
                char::from(byte).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

async fn stream(api: &ApiClient, topics: &[String], index: u64, namespace: &str, json: bool) -> Result<i32> {
    let mut stream = api.stream(&path_of(topics, index, namespace)).await?.ok().await?;
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
    fn topics_and_namespace_are_sent_as_query_values() {
        assert_eq!(
            path_of(&["Job:web app".to_string(), "Node".to_string()], 7, "*"),
            "/v1/event/stream?index=7&namespace=*&topic=Job:web%20app&topic=Node"
        );
    }
}
