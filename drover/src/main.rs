//! The `drover` binary. Today it checks job specs (`drover job validate`);
//! the scheduling pipeline runs in process (see `loadgen`), and `drover
//! server` and `drover agent` come with the network transport.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use engine::structs::Job;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Drover: a cluster workload scheduler.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Top,
}

#[derive(Debug, Subcommand)]
enum Top {
    /// Work with job specs.
    Job {
        #[command(subcommand)]
        command: JobCommand,
    },
}

#[derive(Debug, Subcommand)]
enum JobCommand {
    /// Reads a JSON job spec and lists every problem in it.
    Validate {
        /// Path to the job spec (JSON).
        path: PathBuf,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Top::Job { command: JobCommand::Validate { path } } => validate(&path),
    }
}

fn validate(path: &PathBuf) -> Result<()> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let job: Job = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    job.validate()?;
    println!("job {:?} ({}, {} task groups) is valid", job.id, job.job_type, job.task_groups.len());
    Ok(())
}
