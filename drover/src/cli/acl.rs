//! `drover acl bootstrap`, `drover acl policy ...` and `drover acl token ...`,
//! printed as Nomad prints them.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Subcommand;

use super::{client_command, ApiArgs, Failure};
use super::{fields, print_json, table};
use crate::api::acl::{AclPolicyListStub, AclPolicyRequest, AclToken, AclTokenListStub, AclTokenRequest};
use crate::api::client::ApiClient;

fn print_token(token: &AclToken) {
    let policies = if token.policies.is_empty() { "n/a".to_string() } else { token.policies.join(", ") };
    print!(
        "{}",
        fields(&[
            ("Accessor ID", token.accessor_id.clone()),
            ("Secret ID", token.secret_id.clone()),
            ("Name", token.name.clone()),
            ("Type", token.token_type.clone()),
            ("Global", token.global.to_string()),
            ("Create Time", token.create_time.clone()),
            ("Expiry Time", "<none>".to_string()),
            ("Create Index", token.create_index.to_string()),
            ("Modify Index", token.modify_index.to_string()),
            ("Policies", policies),
            ("Roles", "n/a".to_string()),
        ])
    );
}

/// A token as fields, or JSON.
fn show_token(token: &AclToken, json_out: bool) -> Result<i32> {
    if json_out {
        print_json(token)?;
    } else {
        print_token(token);
    }
    Ok(0)
}

/// `rows` as a table under `header`, or `list` as JSON.
fn show_list<T: serde::Serialize>(list: &[T], json_out: bool, header: &[&str], rows: Vec<Vec<String>>) -> Result<i32> {
    if json_out {
        print_json(&list)?;
        return Ok(0);
    }
    print!("{}", table(header, &rows));
    Ok(0)
}

/// `drover acl bootstrap`: the management token, once.
pub async fn bootstrap(api: &ApiClient, json_out: bool) -> Result<i32> {
    show_token(&api.write_empty("POST", "/v1/acl/bootstrap").await?, json_out)
}

/// `drover acl policy apply [--description D] NAME FILE`.
pub async fn policy_apply(api: &ApiClient, name: &str, description: Option<&str>, file: &Path) -> Result<i32> {
    let rules = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let body = AclPolicyRequest {
        name: Some(name.to_string()),
        description: Some(description.unwrap_or_default().to_string()),
        rules: Some(rules),
    };
    api.write::<()>("PUT", &format!("/v1/acl/policy/{name}"), &body).await?;
    println!("Successfully wrote {name:?} ACL policy!");
    Ok(0)
}

/// `drover acl policy list`.
pub async fn policy_list(api: &ApiClient, json_out: bool) -> Result<i32> {
    let list: Vec<AclPolicyListStub> = api.query("/v1/acl/policies").await?;
    let rows = list.iter().map(|policy| vec![policy.name.clone(), policy.description.clone()]).collect();
    show_list(&list, json_out, &["Name", "Description"], rows)
}

/// `drover acl policy delete NAME`.
pub async fn policy_delete(api: &ApiClient, name: &str) -> Result<i32> {
    api.write_empty::<()>("DELETE", &format!("/v1/acl/policy/{name}")).await?;
    println!("Successfully deleted {name:?} ACL policy!");
    Ok(0)
}

/// `drover acl token create [--name N] [--type T] [--policy P]...`.
pub async fn token_create(api: &ApiClient, name: &str, kind: &str, policies: &[String], json_out: bool) -> Result<i32> {
    let body = AclTokenRequest {
        name: Some(name.to_string()),
        token_type: Some(kind.to_string()),
        policies: Some(policies.to_vec()),
    };
    show_token(&api.write("POST", "/v1/acl/token", &body).await?, json_out)
}

/// `drover acl token list`.
pub async fn token_list(api: &ApiClient, json_out: bool) -> Result<i32> {
    let list: Vec<AclTokenListStub> = api.query("/v1/acl/tokens").await?;
    let rows = list
        .iter()
        .map(|token| {
            vec![token.name.clone(), token.token_type.clone(), token.global.to_string(), token.accessor_id.clone()]
        })
        .collect();
    show_list(&list, json_out, &["Name", "Type", "Global", "Accessor ID"], rows)
}

/// `drover acl token self`: the token this command runs with.
pub async fn token_self(api: &ApiClient, json_out: bool) -> Result<i32> {
    show_token(&api.query("/v1/acl/token/self").await?, json_out)
}

/// `drover acl token delete ACCESSOR`: revokes it.
pub async fn token_delete(api: &ApiClient, accessor: &str) -> Result<i32> {
    api.write_empty::<()>("DELETE", &format!("/v1/acl/token/{accessor}")).await?;
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
