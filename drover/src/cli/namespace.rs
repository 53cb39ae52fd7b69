//! `drover namespace list|status|apply|delete`, printed as Nomad prints
//! them.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use clap::Subcommand;

use super::{client_command, fields, print_json, table, ApiArgs, Failure};
use crate::api::client::ApiClient;
use crate::api::namespaces::{Namespace, NamespaceRequest};

/// `drover namespace ...`.
#[derive(Debug, Subcommand)]
pub enum NamespaceCommand {
    /// Lists the namespaces the token may see.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Shows one namespace.
    Status {
        /// Its name.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Creates or updates a namespace: by name, or from a specification
    /// file (Nomad's HCL or JSON: `name`, `description`, `meta { ... }`).
    Apply {
        /// What it is for (with a name).
        #[arg(long)]
        description: Option<String>,
        /// A name, or the path of a specification file.
        name_or_file: String,
    },
    /// Deletes a namespace (it must hold no jobs).
    Delete {
        /// Its name.
        name: String,
    },
}

/// Runs `command`.
pub fn command(command: NamespaceCommand, api: &ApiArgs) -> Result<(), Failure> {
    client_command(api, |client| async move {
        match command {
            NamespaceCommand::List { json } => list(&client, json).await,
            NamespaceCommand::Status { name, json } => status(&client, &name, json).await,
            NamespaceCommand::Apply { description, name_or_file } => apply(&client, &name_or_file, description).await,
            NamespaceCommand::Delete { name } => delete(&client, &name).await,
        }
    })
}

/// `drover namespace list`.
async fn list(api: &ApiClient, json: bool) -> Result<i32> {
    let namespaces: Vec<Namespace> = api.query("/v1/namespaces").await?;
    if json {
        print_json(&namespaces)?;
        return Ok(0);
    }
    let rows: Vec<Vec<String>> =
        namespaces.iter().map(|namespace| vec![namespace.name.clone(), namespace.description.clone()]).collect();
    print!("{}", table(&["Name", "Description"], &rows));
    Ok(0)
}

/// `drover namespace status NAME`.
async fn status(api: &ApiClient, name: &str, json: bool) -> Result<i32> {
    let answer = api.get(&format!("/v1/namespace/{}", crate::api::client::query_value(name))).await?;
    if answer.status == 404 {
        bail!("Namespace {name:?} matched no namespaces");
    }
    let namespace: Namespace = answer.decode()?;
    if json {
        print_json(&namespace)?;
        return Ok(0);
    }
    print!(
        "{}",
        fields(&[
            ("Name", namespace.name.clone()),
            ("Description", namespace.description.clone()),
            ("Quota", "<none>".to_string()),
        ])
    );
    if let Some(meta) = namespace.meta.as_ref().filter(|meta| !meta.is_empty()) {
        let pairs: Vec<(&str, String)> = meta.iter().map(|(key, value)| (key.as_str(), value.clone())).collect();
        print!("\nMetadata\n{}", fields(&pairs));
    }
    Ok(0)
}

/// `drover namespace apply [--description D] NAME|FILE`.
async fn apply(api: &ApiClient, name_or_file: &str, description: Option<String>) -> Result<i32> {
    let path = Path::new(name_or_file);
    let request = if path.is_file() {
        if description.is_some() {
            bail!("--description is for a namespace named on the command line; write it in {}", path.display());
        }
        read_spec(path)?
    } else {
        // Nomad keeps what is not given: the description of an existing one.
        let existing = api.get(&format!("/v1/namespace/{}", crate::api::client::query_value(name_or_file))).await?;
        let kept = match existing.status {
            200 => existing.decode::<Namespace>()?,
            _ => Namespace::default(),
        };
        NamespaceRequest {
            name: Some(name_or_file.to_string()),
            description: Some(description.unwrap_or(kept.description)),
            meta: kept.meta,
            ..NamespaceRequest::default()
        }
    };
    let name = request.name.clone().unwrap_or_default();
    api.write::<serde_json::Value>(
        "PUT",
        &format!("/v1/namespace/{}", crate::api::client::query_value(&name)),
        &request,
    )
    .await?;
    println!("Successfully applied namespace {name:?}!");
    Ok(0)
}

/// A specification file: Nomad's HCL (`name = ...`, `description = ...`,
/// `meta { ... }`) or its JSON.
fn read_spec(path: &Path) -> Result<NamespaceRequest> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    if path.extension().is_some_and(|extension| extension == "json") {
        return serde_json::from_str(&text).with_context(|| format!("{} is not a namespace", path.display()));
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Spec {
        name: String,
        #[serde(default)]
        description: String,
        #[serde(default)]
        meta: BTreeMap<String, String>,
    }
    let spec: Spec = hcl::from_str(&text).with_context(|| {
        format!(
            "{}: not a namespace specification (name, description, meta; Drover has no quota or capabilities)",
            path.display()
        )
    })?;
    Ok(NamespaceRequest {
        name: Some(spec.name),
        description: Some(spec.description),
        meta: Some(spec.meta),
        ..NamespaceRequest::default()
    })
}

/// `drover namespace delete NAME`.
async fn delete(api: &ApiClient, name: &str) -> Result<i32> {
    api.write_empty::<serde_json::Value>("DELETE", &format!("/v1/namespace/{}", crate::api::client::query_value(name)))
        .await?;
    println!("Successfully deleted namespace {name:?}!");
    Ok(0)
}
