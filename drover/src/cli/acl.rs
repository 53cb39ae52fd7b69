//! `drover acl bootstrap`, `drover acl policy ...` and `drover acl token ...`,
//! printed as Nomad prints them.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::{fields, print_json, table, text};
use crate::api::client::ApiClient;
use clap::Subcommand;

use super::{client_command, ApiArgs, Failure};

fn print_token(token: &Value) {
    let policies = token["Policies"].as_array().filter(|list| !list.is_empty()).map_or_else(
        || "n/a".to_string(),
        |list| list.iter().map(|policy| policy.as_str().unwrap_or_default()).collect::<Vec<_>>().join(", "),
    );
    print!(
        "{}",
        fields(&[
            ("Accessor ID", text(token, "AccessorID")),
            ("Secret ID", text(token, "SecretID")),
            ("Name", text(token, "Name")),
            ("Type", text(token, "Type")),
            ("Global", text(token, "Global")),
            ("Create Time", text(token, "CreateTime")),
            ("Expiry Time", "<none>".to_string()),
            ("Create Index", text(token, "CreateIndex")),
            ("Modify Index", text(token, "ModifyIndex")),
            ("Policies", policies),
            ("Roles", "n/a".to_string()),
        ])
    );
}

/// A token as fields, or JSON.
fn show_token(token: &Value, json_out: bool) -> Result<i32> {
    if json_out {
        print_json(token)?;
    } else {
        print_token(token);
    }
    Ok(0)
}

/// A list as a table of `columns` (header, JSON key), or JSON.
fn show_list(list: &Value, json_out: bool, columns: &[(&str, &str)]) -> Result<i32> {
    if json_out {
        print_json(list)?;
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = list
        .as_array()
        .into_iter()
        .flatten()
        .map(|item| columns.iter().map(|(_, key)| text(item, key)).collect())
        .collect();
    let header: Vec<&str> = columns.iter().map(|(header, _)| *header).collect();
    print!("{}", table(&header, &rows));
    Ok(0)
}

/// `drover acl bootstrap`: the management token, once.
pub async fn bootstrap(api: &ApiClient, json_out: bool) -> Result<i32> {
    show_token(&api.request("POST", "/v1/acl/bootstrap", None).await?.json()?, json_out)
}

/// `drover acl policy apply [--description D] NAME FILE`.
pub async fn policy_apply(api: &ApiClient, name: &str, description: Option<&str>, file: &Path) -> Result<i32> {
    let rules = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let body = json!({"Name": name, "Description": description.unwrap_or_default(), "Rules": rules});
    api.request("PUT", &format!("/v1/acl/policy/{name}"), Some(&body)).await?.json()?;
    println!("Successfully wrote {name:?} ACL policy!");
    Ok(0)
}

/// `drover acl policy list`.
pub async fn policy_list(api: &ApiClient, json_out: bool) -> Result<i32> {
    let list = api.get("/v1/acl/policies").await?.json()?;
    show_list(&list, json_out, &[("Name", "Name"), ("Description", "Description")])
}

/// `drover acl policy delete NAME`.
pub async fn policy_delete(api: &ApiClient, name: &str) -> Result<i32> {
    api.request("DELETE", &format!("/v1/acl/policy/{name}"), None).await?.json()?;
    println!("Successfully deleted {name:?} ACL policy!");
    Ok(0)
}

/// `drover acl token create [--name N] [--type T] [--policy P]...`.
pub async fn token_create(api: &ApiClient, name: &str, kind: &str, policies: &[String], json_out: bool) -> Result<i32> {
    let body = json!({"Name": name, "Type": kind, "Policies": policies});
    show_token(&api.request("POST", "/v1/acl/token", Some(&body)).await?.json()?, json_out)
}

/// `drover acl token list`.
pub async fn token_list(api: &ApiClient, json_out: bool) -> Result<i32> {
    let list = api.get("/v1/acl/tokens").await?.json()?;
    let columns = [("Name", "Name"), ("Type", "Type"), ("Global", "Global"), ("Accessor ID", "AccessorID")];
    show_list(&list, json_out, &columns)
}

/// `drover acl token self`: the token this command runs with.
pub async fn token_self(api: &ApiClient, json_out: bool) -> Result<i32> {
    show_token(&api.get("/v1/acl/token/self").await?.json()?, json_out)
}

/// `drover acl token delete ACCESSOR`: revokes it.
pub async fn token_delete(api: &ApiClient, accessor: &str) -> Result<i32> {
    api.request("DELETE", &format!("/v1/acl/token/{accessor}"), None).await?.json()?;
    println!("Token {accessor} successfully deleted");
    Ok(0)
}

#[derive(Debug, Subcommand)]
pub enum AclCommand {
    /// Makes the first management token (once per cluster) and prints it.
    Bootstrap {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Policies: apply, list, delete.
    Policy {
        #[command(subcommand)]
        command: AclPolicyCommand,
    },
    /// Tokens: create, list, self, delete.
    Token {
        #[command(subcommand)]
        command: AclTokenCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum AclPolicyCommand {
    /// Creates or replaces a policy from a file of Nomad's HCL rules.
    Apply {
        /// What it is for.
        #[arg(long)]
        description: Option<String>,
        /// The policy's name.
        name: String,
        /// The rules file.
        file: PathBuf,
    },
    /// Lists the policies.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Deletes a policy.
    Delete {
        /// The policy's name.
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum AclTokenCommand {
    /// Makes a token and prints it, secret included.
    Create {
        /// What it is for.
        #[arg(long, default_value = "")]
        name: String,
        /// `client` (what its policies grant) or `management` (anything).
        #[arg(long = "type", default_value = "client")]
        kind: String,
        /// A policy it has (repeat for more).
        #[arg(long = "policy")]
        policies: Vec<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Lists the tokens (without their secrets).
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The token this command runs with.
    #[command(name = "self")]
    Own {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Revokes a token.
    Delete {
        /// Its accessor id.
        accessor: String,
    },
}

/// Runs `drover acl ...`.
pub fn command(command: AclCommand, api: &ApiArgs) -> Result<(), Failure> {
    client_command(api, |client| async move {
        match command {
            AclCommand::Bootstrap { json } => bootstrap(&client, json).await,
            AclCommand::Policy { command: AclPolicyCommand::Apply { description, name, file } } => {
                policy_apply(&client, &name, description.as_deref(), &file).await
            }
            AclCommand::Policy { command: AclPolicyCommand::List { json } } => policy_list(&client, json).await,
            AclCommand::Policy { command: AclPolicyCommand::Delete { name } } => policy_delete(&client, &name).await,
            AclCommand::Token { command: AclTokenCommand::Create { name, kind, policies, json } } => {
                token_create(&client, &name, &kind, &policies, json).await
            }
            AclCommand::Token { command: AclTokenCommand::List { json } } => token_list(&client, json).await,
            AclCommand::Token { command: AclTokenCommand::Own { json } } => token_self(&client, json).await,
            AclCommand::Token { command: AclTokenCommand::Delete { accessor } } => {
                token_delete(&client, &accessor).await
            }
        }
    })
}
