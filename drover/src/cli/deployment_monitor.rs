//! How deployments are shown and followed, as Nomad's CLI does it
//! (`command/deployment_status.go`'s `formatDeployment` and monitor,
//! `job_status.go`'s `Latest Deployment`): for `drover deployment ...`,
//! `job deployments`, `job status`, and the end of `job run` and `job
//! revert`, which follow the deployment of the version they registered.
//!
//! The monitor follows a deployment with blocking queries on
//! `/v1/deployment/<id>` until it ends; on a terminal it redraws one block
//! in place (Nomad 1.2+), otherwise it prints a line per change, then the
//! final block.

use std::io::{IsTerminal, Write};

use anyhow::{Context, Result};

use super::{date, fields, print_json, short, table};
use crate::api::client::ApiClient;
use crate::api::deployments::Deployment;

/// How long one blocking query of the monitor waits before asking again.
const MONITOR_WAIT: &str = "30s";

/// How many characters of an id to print: Nomad's short ids, or full ones
/// with `--verbose`.
pub fn id_length(verbose: bool) -> usize {
    if verbose {
        36
    } else {
        8
    }
}

/// The first `length` characters of an id.
pub fn limit(id: &str, length: usize) -> String {
    id.chars().take(length).collect()
}

/// `drover job deployments [--latest] [--all] JOB` (Nomad's `job
/// deployments`), `job_id` resolved already.
pub async fn job_deployments(
    api: &ApiClient,
    job_id: &str,
    latest: bool,
    all: bool,
    json_out: bool,
    verbose: bool,
) -> Result<i32> {
    let length = id_length(verbose);
    if latest {
        let deployment: Option<Deployment> =
            api.query(&format!("/v1/job/{job_id}/deployment")).await.context("Error retrieving deployments")?;
        if json_out {
            print_json(&deployment)?;
            return Ok(0);
        }
        match deployment {
            Some(deployment) => print!("{}", format_deployment(&deployment, length)),
            None => println!("No deployment found"),
        }
        return Ok(0);
    }
    let deployments: Vec<Deployment> =
        api.query(&format!("/v1/job/{job_id}/deployments?all={all}")).await.context("Error retrieving deployments")?;
    if json_out {
        print_json(&deployments)?;
        return Ok(0);
    }
    print!("{}", format_list(&deployments, length));
    Ok(0)
}

/// `job status`'s `Latest Deployment` section, when the job has one.
pub async fn print_latest(api: &ApiClient, job_id: &str) -> Result<()> {
    let latest: Option<Deployment> = api.query(&format!("/v1/job/{job_id}/deployment")).await?;
    if let Some(deployment) = latest {
        println!("\nLatest Deployment");
        let pairs = [
            ("ID", short(&deployment.id)),
            ("Status", deployment.status.clone()),
            ("Description", deployment.status_description.clone()),
        ];
        print!("{}", fields(&pairs));
        print!("{}", format_deployed(&deployment));
    }
    Ok(())
}

/// What `job run` and `job revert` do once their eval ended: follow the
/// deployment of the version they registered (the job's newest whose
/// `JobSpecModifyIndex` is `job_modify_index`), if there is one, to its
/// end. The exit code: 1 unless it ends `successful`, else the eval
/// monitor's `code`.
pub async fn follow_registered(api: &ApiClient, job_id: &str, job_modify_index: u64, code: i32) -> Result<i32> {
    let deployments: Vec<Deployment> = api.query(&format!("/v1/job/{job_id}/deployments")).await?;
    let ours = deployments.iter().find(|deployment| deployment.job_spec_modify_index == job_modify_index);
    match ours {
        Some(deployment) => follow_to_end(api, &deployment.id, 8, code).await,
        None => Ok(code),
    }
}

/// Follows deployment `id` to its end (module docs); 1 unless it ends
/// `successful`, else `code`.
pub async fn follow_to_end(api: &ApiClient, id: &str, length: usize, code: i32) -> Result<i32> {
    println!("==> Monitoring deployment \"{}\"", limit(id, length));
    let terminal = std::io::stdout().is_terminal();
    let mut shown = Shown::default();
    let mut index = 0;
    let deployment = loop {
        let path = format!("/v1/deployment/{id}?index={index}&wait={MONITOR_WAIT}");
        let (deployment, answered): (Deployment, _) =
            api.query_indexed(&path).await.context("Error fetching deployment")?;
        index = answered.unwrap_or(index);
        if terminal {
            shown.redraw(&format!("\n{}\n{}", date(now_nanos()), format_deployment(&deployment, length)));
        } else {
            shown.line_if_changed(&deployment, length);
        }
        if !matches!(deployment.status.as_str(), "running" | "paused" | "pending" | "initializing") {
            break deployment;
        }
    };
    if !terminal {
        print!("\n{}", format_deployment(&deployment, length));
    }
    let successful = deployment.status == "successful";
    let mark = if successful { "✓" } else { "!" };
    println!("\n  {mark} Deployment \"{}\" {}", limit(id, length), deployment.status);
    Ok(if successful { code } else { 1 })
}

/// What the monitor printed last.
#[derive(Debug, Default)]
struct Shown {
    /// The lines of the block drawn on the terminal.
    lines: usize,
    /// The progress line printed last (off a terminal).
    last: String,
}

impl Shown {
    /// Draws `block` over the one drawn before (cursor up, clear below).
    fn redraw(&mut self, block: &str) {
        let mut out = std::io::stdout().lock();
        if self.lines > 0 {
            let _ = write!(out, "\x1b[{}A\x1b[J", self.lines);
        }
        let _ = write!(out, "{block}");
        let _ = out.flush();
        self.lines = block.matches('\n').count();
    }

    /// Prints the deployment's progress as one line if it changed.
    fn line_if_changed(&mut self, deployment: &Deployment, length: usize) {
        let groups: Vec<String> = deployment
            .task_groups
            .iter()
            .map(|(name, group)| {
                format!(
                    "{name}: {} placed, {} healthy, {} unhealthy of {}",
                    group.placed_allocs, group.healthy_allocs, group.unhealthy_allocs, group.desired_total
                )
            })
            .collect();
        let line = format!(
            "Deployment \"{}\" {}: {} ({})",
            limit(&deployment.id, length),
            deployment.status,
            deployment.status_description,
            groups.join("; ")
        );
        if line != self.last {
            println!("    {}: {line}", date(now_nanos()));
            self.last = line;
        }
    }
}

fn now_nanos() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_nanos() as u64)
}

/// Nomad's `formatDeployments`: the list table, or `No deployments found`.
pub fn format_list(deployments: &[Deployment], length: usize) -> String {
    if deployments.is_empty() {
        return "No deployments found\n".to_string();
    }
    let rows: Vec<Vec<String>> = deployments
        .iter()
        .map(|deployment| {
            vec![
                limit(&deployment.id, length),
                deployment.job_id.clone(),
                deployment.job_version.to_string(),
                deployment.status.clone(),
                deployment.status_description.clone(),
            ]
        })
        .collect();
    table(&["ID", "Job ID", "Job Version", "Status", "Description"], &rows)
}

/// Nomad's `formatDeployment`: the deployment's fields, then `Deployed`.
pub fn format_deployment(deployment: &Deployment, length: usize) -> String {
    let pairs = [
        ("ID", limit(&deployment.id, length)),
        ("Job ID", deployment.job_id.clone()),
        ("Job Version", deployment.job_version.to_string()),
        ("Status", deployment.status.clone()),
        ("Description", deployment.status_description.clone()),
    ];
    format!("{}{}", fields(&pairs), format_deployed(deployment))
}

/// The `Deployed` table (Nomad's `formatDeploymentGroups`), after a blank
/// line; nothing when no group takes part. `Auto Revert`, `Promoted` and
/// `Canaries`, and `Progress Deadline` are columns only when some group
/// uses them.
fn format_deployed(deployment: &Deployment) -> String {
    let groups = &deployment.task_groups;
    if groups.is_empty() {
        return String::new();
    }
    let auto_revert = groups.values().any(|group| group.auto_revert);
    let canaries = groups.values().any(|group| group.desired_canaries > 0);
    let deadline = groups.values().any(|group| group.progress_deadline != 0);
    let mut header = vec!["Task Group"];
    header.extend(auto_revert.then_some("Auto Revert"));
    header.extend(canaries.then_some("Promoted"));
    header.push("Desired");
    header.extend(canaries.then_some("Canaries"));
    header.extend(["Placed", "Healthy", "Unhealthy"]);
    header.extend(deadline.then_some("Progress Deadline"));
    let rows: Vec<Vec<String>> = groups
        .iter()
        .map(|(name, group)| {
            let mut row = vec![name.clone()];
            row.extend(auto_revert.then(|| group.auto_revert.to_string()));
            let promoted = if group.desired_canaries > 0 { group.promoted.to_string() } else { "N/A".to_string() };
            row.extend(canaries.then_some(promoted));
            row.push(group.desired_total.to_string());
            row.extend(canaries.then(|| group.desired_canaries.to_string()));
            row.extend([group.placed_allocs, group.healthy_allocs, group.unhealthy_allocs].map(|n| n.to_string()));
            row.extend(deadline.then(|| progress_deadline(&group.require_progress_by, group.progress_unset())));
            row
        })
        .collect();
    format!("\nDeployed\n{}", table(&header, &rows))
}

/// A group's `RequireProgressBy` as the CLI shows dates, `N/A` when unset.
fn progress_deadline(require_progress_by: &str, unset: bool) -> String {
    match humantime::parse_rfc3339(require_progress_by) {
        Ok(time) if !unset => humantime::format_rfc3339_seconds(time).to_string(),
        _ => "N/A".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::deployments::DeploymentState;

    fn deployment(groups: Vec<(&str, DeploymentState)>) -> Deployment {
        Deployment {
            id: "5a8b2c3d-1234-4e5f-8a9b-0c1d2e3f4a5b".to_string(),
            job_id: "web".to_string(),
            job_version: 1,
            status: "running".to_string(),
            status_description: "Deployment is running".to_string(),
            task_groups: groups.into_iter().map(|(name, state)| (name.to_string(), state)).collect(),
            ..Deployment::default()
        }
    }

    #[test]
    fn a_deployment_prints_as_nomad_prints_it() {
        let web = DeploymentState {
            desired_total: 2,
            placed_allocs: 1,
            progress_deadline: 600_000_000_000,
            require_progress_by: "2023-11-14T22:13:20.123456789Z".to_string(),
            ..DeploymentState::default()
        };
        let printed = format_deployment(&deployment(vec![("web", web)]), 8);
        let expected = "ID          = 5a8b2c3d\nJob ID      = web\nJob Version = 1\nStatus      = running\n\
            Description = Deployment is running\n\nDeployed\n\
            Task Group  Desired  Placed  Healthy  Unhealthy  Progress Deadline\n\
            web         2        1       0        0          2023-11-14T22:13:20Z\n";
        assert_eq!(printed, expected);
    }

    #[test]
    fn canary_and_auto_revert_columns_appear_only_when_a_group_uses_them() {
        let canary = DeploymentState { desired_canaries: 1, desired_total: 2, auto_revert: true, ..Default::default() };
        let plain = DeploymentState { desired_total: 1, ..Default::default() };
        let printed = format_deployed(&deployment(vec![("api", canary), ("web", plain)]));
        let lines: Vec<Vec<&str>> = printed.lines().map(|line| line.split_whitespace().collect()).collect();
        assert_eq!(lines[1], ["Deployed"]);
        assert_eq!(
            lines[2],
            ["Task", "Group", "Auto", "Revert", "Promoted", "Desired", "Canaries", "Placed", "Healthy", "Unhealthy"]
        );
        assert_eq!(lines[3], ["api", "true", "false", "2", "1", "0", "0", "0"]);
        assert_eq!(lines[4], ["web", "false", "N/A", "1", "0", "0", "0", "0"]);
        assert_eq!(format_list(&[], 8), "No deployments found\n");
    }
}
