//! `drover acl bootstrap`, `drover acl policy ...` and `drover acl token ...`,
//! printed as Nomad prints them.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::{fields, print_json, table, text};
use crate::api_client::ApiClient;

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
