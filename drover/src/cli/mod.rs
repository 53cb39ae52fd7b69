//! The `drover` CLI's commands that talk to a server's HTTP API, printed as
//! Nomad's CLI prints them (aligned tables, the eval monitor), with `--json`
//! on every read. One file per command group: `job.rs`, `node.rs`,
//! `alloc.rs`, `eval.rs`, `server.rs` (members, workers, `status`).
//!
//! The address, token and CA come from `--address`, `--token` and
//! `--ca-cert`, else `DROVER_ADDR`, `DROVER_TOKEN` and `DROVER_CACERT`,
//! else Nomad's `NOMAD_ADDR`, `NOMAD_TOKEN`, `NOMAD_CACERT`; the address
//! defaults to `http://127.0.0.1:4646`.

pub mod acl;
pub mod alloc;
pub mod eval;
pub mod hcl;
pub mod job;
pub mod node;
pub mod operator;
pub mod server;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::Value;

use crate::api_client::ApiClient;

/// How to reach the API: on every command that talks to a server.
#[derive(Clone, Debug, Default, Args)]
pub struct ApiArgs {
    /// The server's HTTP API (`DROVER_ADDR`; default http://127.0.0.1:4646).
    #[arg(long, global = true)]
    pub address: Option<String>,
    /// ACL token (`DROVER_TOKEN`).
    #[arg(long, global = true)]
    pub token: Option<String>,
    /// The cluster CA certificate, for HTTPS (`DROVER_CACERT`).
    #[arg(long, global = true)]
    pub ca_cert: Option<PathBuf>,
}

fn env_or(primary: &str, nomad: &str) -> Option<String> {
    std::env::var(primary).ok().or_else(|| std::env::var(nomad).ok()).filter(|value| !value.is_empty())
}

impl ApiArgs {
    /// The client these settings describe.
    pub fn client(&self) -> Result<ApiClient> {
        let address = self
            .address
            .clone()
            .or_else(|| env_or("DROVER_ADDR", "NOMAD_ADDR"))
            .unwrap_or_else(|| "http://127.0.0.1:4646".to_string());
        let token = self.token.clone().or_else(|| env_or("DROVER_TOKEN", "NOMAD_TOKEN"));
        let ca = self.ca_cert.clone().or_else(|| env_or("DROVER_CACERT", "NOMAD_CACERT").map(PathBuf::from));
        let ca_pem = match &ca {
            Some(path) => Some(std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?),
            None => None,
        };
        ApiClient::new(&address, token, ca_pem.as_deref())
    }
}

/// Runs a CLI command's future on a small runtime of its own.
pub fn run<T>(future: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?.block_on(future)
}

/// Prints rows as Nomad's CLI does (columnize): left-aligned columns two
/// spaces apart, the header first.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|cell| cell.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let mut line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        for (position, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            text.push_str(cell);
            if position < last {
                text.push_str(&" ".repeat(width - cell.chars().count() + 2));
            }
        }
        text.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    text
}

/// `key = value` lines aligned on `=`, as Nomad prints an object's fields.
pub fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(key, _)| key.len()).max().unwrap_or(0);
    pairs.iter().map(|(key, value)| format!("{key:<width$} = {value}\n")).collect()
}

/// A JSON string field, or "".
pub fn text(value: &Value, key: &str) -> String {
    match &value[key] {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The first 8 characters of an id, as Nomad's short ids.
pub fn short(id: &str) -> String {
    id.chars().take(8).collect()
}

/// Unix nanoseconds as `2006-01-02T15:04:05Z`.
pub fn date(nanos: u64) -> String {
    match crate::http::nomad::rfc3339(engine::clock::Timestamp(nanos)) {
        Value::String(text) => format!("{}Z", &text[..19]),
        _ => "-".to_string(),
    }
}

/// How long ago Unix nanoseconds were, as Nomad's `prettyTimeDiff`.
pub fn ago(nanos: u64) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let seconds = now.saturating_sub(nanos) / 1_000_000_000;
    match seconds {
        0..=59 => format!("{seconds}s ago"),
        60..=3599 => format!("{}m{}s ago", seconds / 60, seconds % 60),
        3600..=86_399 => format!("{}h{}m ago", seconds / 3600, seconds / 60 % 60),
        _ => format!("{}d{}h ago", seconds / 86_400, seconds / 3600 % 24),
    }
}

/// Prints `value` as indented JSON (`--json`).
pub fn print_json(value: &Value) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_as_nomad_prints_them() {
        let rows = vec![vec!["example".to_string(), "service".to_string(), "50".to_string()]];
        assert_eq!(table(&["ID", "Type", "Priority"], &rows), "ID       Type     Priority\nexample  service  50\n");
        assert_eq!(fields(&[("ID", "x".into()), ("Status", "ok".into())]), "ID     = x\nStatus = ok\n");
        assert_eq!(date(1_700_000_000_123_456_789), "2023-11-14T22:13:20Z");
    }
}
