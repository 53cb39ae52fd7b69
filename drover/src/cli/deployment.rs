//! `drover deployment list|status|promote|fail|pause|resume`, as Nomad's
//! `nomad deployment ...` (`command/deployment_*.go`); how a deployment is
//! printed and followed is `deployment_monitor.rs`'s.
//!
//! Short ids are resolved as Nomad resolves them: a full id is read
//! directly, a shorter one (hyphens dropped, cut to an even length) through
//! `/v1/deployments?prefix=`. Promote and resume follow the eval they make,
//! then the deployment to its end (Nomad 1.2+); fail follows its eval.

use anyhow::{bail, Context, Result};
use clap::Subcommand;

use super::deployment_monitor::{follow_to_end, format_deployment, format_list, id_length};
use super::{client_command, print_json, ApiArgs, Failure};
use crate::api::client::ApiClient;
use crate::api::deployments::{
    Deployment, DeploymentFailRequest, DeploymentPauseRequest, DeploymentPromoteRequest, DeploymentUpdateResponse,
};

#[derive(Debug, Subcommand)]
pub enum DeploymentCommand {
    /// Every deployment, newest first.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Full ids.
        #[arg(long)]
        verbose: bool,
    },
    /// One deployment and its groups' progress.
    Status {
        /// A deployment id or prefix.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Full ids.
        #[arg(long)]
        verbose: bool,
    },
    /// Promotes a deployment's canaries (every group's, or `--group`'s),
    /// then follows the deployment.
    Promote {
        /// A deployment id or prefix.
        id: String,
        /// A group whose canaries to promote (repeatable; none: all).
        #[arg(long = "group")]
        groups: Vec<String>,
        /// Do not follow the evaluation and the deployment.
        #[arg(long)]
        detach: bool,
        /// Full ids.
        #[arg(long)]
        verbose: bool,
    },
    /// Marks a deployment failed (reverting the job when a group auto-reverts).
    Fail {
        /// A deployment id or prefix.
        id: String,
        /// Do not follow the evaluation.
        #[arg(long)]
        detach: bool,
        /// Full ids.
        #[arg(long)]
        verbose: bool,
    },
    /// Pauses a deployment: nothing more is placed until it is resumed.
    Pause {
        /// A deployment id or prefix.
        id: String,
        /// Full ids.
        #[arg(long)]
        verbose: bool,
    },
    /// Resumes a paused deployment, then follows it.
    Resume {
        /// A deployment id or prefix.
        id: String,
        /// Do not follow the evaluation and the deployment.
        #[arg(long)]
        detach: bool,
        /// Full ids.
        #[arg(long)]
        verbose: bool,
    },
}

/// Runs `drover deployment ...`.
pub fn command(command: DeploymentCommand, api: &ApiArgs) -> Result<(), Failure> {
    client_command(api, |client| async move {
        match command {
            DeploymentCommand::List { json, verbose } => list(&client, json, verbose).await,
            DeploymentCommand::Status { id, json, verbose } => status(&client, &id, json, verbose).await,
            DeploymentCommand::Promote { id, groups, detach, verbose } => {
                promote(&client, &id, groups, detach, verbose).await
            }
            DeploymentCommand::Fail { id, detach, verbose } => fail(&client, &id, detach, verbose).await,
            DeploymentCommand::Pause { id, verbose } => pause(&client, &id, true, false, verbose).await,
            DeploymentCommand::Resume { id, detach, verbose } => pause(&client, &id, false, detach, verbose).await,
        }
    })
}

/// `drover deployment list`.
async fn list(api: &ApiClient, json_out: bool, verbose: bool) -> Result<i32> {
    let deployments: Vec<Deployment> = api.query("/v1/deployments").await.context("Error retrieving deployments")?;
    if json_out {
        print_json(&deployments)?;
        return Ok(0);
    }
    print!("{}", format_list(&deployments, id_length(verbose)));
    Ok(0)
}

/// `drover deployment status ID`.
async fn status(api: &ApiClient, prefix: &str, json_out: bool, verbose: bool) -> Result<i32> {
    let length = id_length(verbose);
    let Some(deployment) = resolve(api, prefix, length).await? else { return Ok(1) };
    if json_out {
        print_json(&deployment)?;
        return Ok(0);
    }
    print!("{}", format_deployment(&deployment, length));
    Ok(0)
}

/// `drover deployment promote [--group G]... ID`: Nomad's `PromoteAll`
/// without groups, `PromoteGroups` with them; then the eval and the
/// deployment are followed unless `detach`.
async fn promote(api: &ApiClient, prefix: &str, groups: Vec<String>, detach: bool, verbose: bool) -> Result<i32> {
    let length = id_length(verbose);
    let Some(deployment) = resolve(api, prefix, length).await? else { return Ok(1) };
    let body = DeploymentPromoteRequest {
        deployment_id: Some(deployment.id.clone()),
        all: groups.is_empty(),
        groups: (!groups.is_empty()).then_some(groups),
    };
    let path = format!("/v1/deployment/promote/{}", deployment.id);
    let promoted: DeploymentUpdateResponse =
        api.write("PUT", &path, &body).await.context("Error promoting deployment")?;
    if detach || promoted.eval_id.is_empty() {
        return Ok(0);
    }
    let code = super::job::monitor(api, &promoted.eval_id).await?;
    follow_to_end(api, &deployment.id, length, code).await
}

/// `drover deployment fail ID`.
async fn fail(api: &ApiClient, prefix: &str, detach: bool, verbose: bool) -> Result<i32> {
    let length = id_length(verbose);
    let Some(deployment) = resolve(api, prefix, length).await? else { return Ok(1) };
    let body = DeploymentFailRequest { deployment_id: Some(deployment.id.clone()) };
    let path = format!("/v1/deployment/fail/{}", deployment.id);
    let failed: DeploymentUpdateResponse = api.write("PUT", &path, &body).await.context("Error failing deployment")?;
    match failed.reverted_job_version {
        None => println!("Deployment \"{}\" failed", deployment.id),
        Some(version) => {
            println!("Deployment \"{}\" failed. Auto-reverted to job version {version}.", deployment.id)
        }
    }
    if detach || failed.eval_id.is_empty() {
        return Ok(0);
    }
    println!();
    super::job::monitor(api, &failed.eval_id).await
}

/// `drover deployment pause ID` and `drover deployment resume ID` (which
/// then follows the eval and the deployment unless `detach`).
async fn pause(api: &ApiClient, prefix: &str, pause: bool, detach: bool, verbose: bool) -> Result<i32> {
    let length = id_length(verbose);
    let Some(deployment) = resolve(api, prefix, length).await? else { return Ok(1) };
    let body = DeploymentPauseRequest { deployment_id: Some(deployment.id.clone()), pause };
    let path = format!("/v1/deployment/pause/{}", deployment.id);
    let what = if pause { "Error pausing deployment" } else { "Error resuming deployment" };
    let written: DeploymentUpdateResponse = api.write("PUT", &path, &body).await.context(what)?;
    println!("Deployment \"{}\" {}", deployment.id, if pause { "paused" } else { "resumed" });
    if pause || detach || written.eval_id.is_empty() {
        return Ok(0);
    }
    println!();
    let code = super::job::monitor(api, &written.eval_id).await?;
    follow_to_end(api, &deployment.id, length, code).await
}

/// The deployment a prefix names, as Nomad's `getDeployment` finds it;
/// `None` (after printing the candidates) when it names several.
async fn resolve(api: &ApiClient, prefix: &str, length: usize) -> Result<Option<Deployment>> {
    if prefix.len() == 36 {
        let found = api.query(&format!("/v1/deployment/{prefix}")).await.context("Error retrieving deployment")?;
        return Ok(Some(found));
    }
    let mut wanted: String = prefix.chars().filter(|c| *c != '-').collect();
    if wanted.len() == 1 {
        bail!("Error retrieving deployment: Identifier must contain at least two characters.");
    }
    if wanted.len() % 2 == 1 {
        // Ids are hex bytes: Nomad drops a trailing half byte.
        wanted.pop();
    }
    let matches: Vec<Deployment> =
        api.query(&format!("/v1/deployments?prefix={wanted}")).await.context("Error retrieving deployment")?;
    match matches.len() {
        0 => bail!("Error retrieving deployment: Deployment ID {wanted:?} matched no deployments"),
        1 => Ok(matches.into_iter().next()),
        _ => {
            eprint!("Prefix matched multiple deployments\n\n{}", format_list(&matches, length));
            Ok(None)
        }
    }
}
