//! The `drover` binary: parses the command line and runs the command
//! (`drover::cli`).
//!
//! `drover executor ...` is internal: the agent runs each `raw_exec` task
//! under one (see `client/drivers/executor.rs`); it is not parsed by clap,
//! so a task's arguments pass through untouched.

use std::process::ExitCode;

use clap::Parser;
use drover::cli::{self, Cli};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let mut raw_args = std::env::args_os().skip(1);
    if raw_args.next().is_some_and(|first| first == "executor") {
        return cli::run::executor(raw_args.collect());
    }
    transport::install_crypto_provider();
    cli::exit_code(cli::dispatch(Cli::parse()))
}
