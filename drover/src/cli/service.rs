//! `drover service list|info|delete`: Nomad 1.3+'s `nomad service`
//! commands, printed as they print.

use anyhow::Result;
use clap::Subcommand;

use super::{client_command, fields, print_json, short, table, ApiArgs, Failure};
use crate::api::client::ApiClient;
use crate::api::services::{ServiceRegistration, ServiceRegistrationListStub};

/// What Nomad prints when there is nothing to list.
const NONE_FOUND: &str = "No service registrations found";

/// Tags as Nomad prints them: `[a,b]`.
fn tags(tags: &[String]) -> String {
    format!("[{}]", tags.join(","))
}

/// `drover service list`: `Service Name  Tags`, one row per service.
pub async fn list(api: &ApiClient, json_out: bool) -> Result<i32> {
    let namespaces: Vec<ServiceRegistrationListStub> = api.query("/v1/services").await?;
    if json_out {
        print_json(&namespaces)?;
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = namespaces
        .iter()
        .flat_map(|namespace| &namespace.services)
        .map(|service| vec![service.service_name.clone(), tags(&service.tags)])
        .collect();
    if rows.is_empty() {
        println!("{NONE_FOUND}");
    } else {
        print!("{}", table(&["Service Name", "Tags"], &rows));
    }
    Ok(0)
}

/// `drover service info [--verbose] NAME`: `Job ID  Address  Tags  Node ID
/// Alloc ID`, or with `--verbose` every field of each registration.
pub async fn info(api: &ApiClient, name: &str, verbose: bool, json_out: bool) -> Result<i32> {
    let registrations: Vec<ServiceRegistration> = api.query(&format!("/v1/service/{name}")).await?;
    if json_out {
        print_json(&registrations)?;
        return Ok(0);
    }
    if registrations.is_empty() {
        println!("{NONE_FOUND}");
        return Ok(0);
    }
    let address = |registration: &ServiceRegistration| format!("{}:{}", registration.address, registration.port);
    if verbose {
        let blocks: Vec<String> = registrations
            .iter()
            .map(|registration| {
                fields(&[
                    ("ID", registration.id.clone()),
                    ("Service Name", registration.service_name.clone()),
                    ("Namespace", registration.namespace.clone()),
                    ("Job ID", registration.job_id.clone()),
                    ("Alloc ID", registration.alloc_id.clone()),
                    ("Node ID", registration.node_id.clone()),
                    ("Datacenter", registration.datacenter.clone()),
                    ("Address", address(registration)),
                    ("Tags", tags(&registration.tags)),
                ])
            })
            .collect();
        print!("{}", blocks.join("\n"));
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = registrations
        .iter()
        .map(|registration| {
            vec![
                registration.job_id.clone(),
                address(registration),
                tags(&registration.tags),
                short(&registration.node_id),
                short(&registration.alloc_id),
            ]
        })
        .collect();
    print!("{}", table(&["Job ID", "Address", "Tags", "Node ID", "Alloc ID"], &rows));
    Ok(0)
}

/// `drover service delete NAME ID`.
pub async fn delete(api: &ApiClient, name: &str, id: &str) -> Result<i32> {
    api.write_empty::<()>("DELETE", &format!("/v1/service/{name}/{id}")).await?;
    println!("Successfully deleted service registration");
    Ok(0)
}

/// The `drover service` commands.
#[derive(Debug, Subcommand)]
pub enum ServiceCommand {
    /// The registered services, with their tags.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The registrations of one service.
    Info {
        /// The service's name.
        name: String,
        /// Every field of each registration.
        #[arg(long)]
        verbose: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Removes one registration.
    Delete {
        /// The service's name.
        name: String,
        /// The registration's id.
        id: String,
    },
}

/// Runs `drover service ...`.
pub fn command(command: ServiceCommand, api: &ApiArgs) -> Result<(), Failure> {
    client_command(api, |client| async move {
        match command {
            ServiceCommand::List { json } => list(&client, json).await,
            ServiceCommand::Info { name, verbose, json } => info(&client, &name, verbose, json).await,
            ServiceCommand::Delete { name, id } => delete(&client, &name, &id).await,
        }
    })
}
