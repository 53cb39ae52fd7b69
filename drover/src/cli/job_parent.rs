//! The part of `drover job status` (and `job run`) that a periodic or
//! parameterized job prints, as Nomad's CLI: the next launch, computed
//! locally from the spec as Nomad's CLI does, and instead of its
//! allocations, its parameters and its children. (`job dispatch` and
//! `job periodic force` are in `job.rs`.)

use anyhow::Result;
use engine::clock::Timestamp;
use engine::structs::PeriodicConfig;

use super::{date, fields, table};
use crate::api::client::ApiClient;
use crate::api::jobs::{Job, JobListStub, JobSummary};

/// The next launch of a periodic job after `now`, from its spec (Nomad's
/// CLI computes it locally).
pub fn next_launch(job: &Job, now: Timestamp) -> Option<Timestamp> {
    let periodic = job.periodic.as_ref().filter(|periodic| periodic.enabled && !job.stop)?;
    let mut specs = periodic.specs.clone().unwrap_or_default();
    if specs.is_empty() {
        specs.push(periodic.spec.clone());
    }
    let config = PeriodicConfig {
        enabled: periodic.enabled,
        specs,
        spec_type: periodic.spec_type.clone(),
        prohibit_overlap: periodic.prohibit_overlap,
        time_zone: periodic.time_zone.clone(),
    };
    config.next_launch(now).ok().flatten()
}

/// The lines `job status` adds for a periodic or parameterized job after
/// `Parameterized` (`Next Periodic Launch`).
pub fn status_fields(job: &Job) -> Vec<(&'static str, String)> {
    let now = Timestamp(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_nanos() as u64),
    );
    match (&job.periodic, next_launch(job, now)) {
        (Some(_), Some(next)) => {
            let seconds = next.since(now).as_secs();
            vec![("Next Periodic Launch", format!("{} ({}s from now)", date(next.0), seconds))]
        }
        (Some(_), None) => vec![("Next Periodic Launch", "none".to_string())],
        _ => Vec::new(),
    }
}

/// What `job status` prints for a periodic or parameterized job instead
/// of its allocations: its parameters, its children's summary and list.
pub async fn print_children(api: &ApiClient, job: &Job, summary: &JobSummary) -> Result<()> {
    if let Some(parameterized) = &job.parameterized_job {
        let keys = |keys: &Option<Vec<String>>| match keys.as_deref() {
            None | Some([]) => "<none>".to_string(),
            Some(keys) => keys.join(", "),
        };
        println!("\nParameterized Job");
        print!(
            "{}",
            fields(&[
                ("Payload", parameterized.payload.clone()),
                ("Required Metadata", keys(&parameterized.meta_required)),
                ("Optional Metadata", keys(&parameterized.meta_optional)),
            ])
        );
    }
    let (title, list_title, prefix) = match job.parameterized_job {
        Some(_) => ("Parameterized Job Summary", "Dispatched Jobs", "dispatch-"),
        None => ("Children Job Summary", "Previously Launched Jobs", "periodic-"),
    };
    let children = &summary.children;
    println!("\n{title}");
    let counts = vec![vec![children.pending.to_string(), children.running.to_string(), children.dead.to_string()]];
    print!("{}", table(&["Pending", "Running", "Dead"], &counts));
    let listed: Vec<JobListStub> = api.query(&format!("/v1/jobs?prefix={}/{prefix}", job.id)).await?;
    let rows: Vec<Vec<String>> = listed
        .iter()
        .filter(|child| child.parent_id == job.id)
        .map(|child| vec![child.id.clone(), child.status.clone()])
        .collect();
    println!("\n{list_title}");
    if rows.is_empty() {
        println!("No {} found", list_title.to_lowercase());
    } else {
        print!("{}", table(&["ID", "Status"], &rows));
    }
    Ok(())
}
