//! The process wiring of `drover server`, `agent` and `dev` (one file
//! each) and of the internal `drover executor`: flags and the TOML file
//! merged into the options of `crate::server` and `crate::client`, the
//! logs, the TLS files, the runtime.

pub mod agent;
pub mod dev;
pub mod server;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use transport::tls::TlsMaterial;

use super::Failure;
use crate::config::{ConfigError, FileConfig};

/// Options both agents share.
#[derive(Debug, Args)]
pub struct Common {
    /// The configuration file (TOML; see `docs/running.md`).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Dev mode: a throwaway CA in memory (server) or the mock driver and
    /// a temporary data dir (agent). Never in production.
    #[arg(long)]
    pub dev: bool,
    /// The cluster CA certificate.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// This agent's certificate.
    #[arg(long)]
    pub cert_file: Option<PathBuf>,
    /// This agent's key.
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// error, warn, info, debug or trace.
    #[arg(long)]
    pub log_level: Option<String>,
    /// Logs as JSON lines.
    #[arg(long)]
    pub log_json: bool,
    /// Where the agent keeps its state.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

/// `drover executor <launch.json>` or `drover executor --gate <data limit|-> <command> <args...>`.
pub fn executor(args: Vec<std::ffi::OsString>) -> ExitCode {
    let code = match args.split_first() {
        Some((flag, [limit, command, task_args @ ..])) if flag == "--gate" => {
            let task_args: Vec<String> = task_args.iter().map(|arg| arg.to_string_lossy().into_owned()).collect();
            let limit = limit.to_str().and_then(|text| text.parse::<u64>().ok());
            crate::client::drivers::executor::gate(limit, Path::new(command), &task_args)
        }
        Some((spec, [])) => crate::client::drivers::executor::run(Path::new(spec)),
        _ => {
            eprintln!("drover executor is run by the agent, one per task");
            2
        }
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

pub fn config_error(key: &str, message: impl Into<String>) -> Failure {
    Failure::Config(ConfigError::Value { key: key.to_string(), message: message.into() }.into())
}

/// The file config, or the defaults.
pub fn file_config(common: &Common) -> Result<FileConfig, Failure> {
    match &common.config {
        Some(path) => Ok(FileConfig::load(path)?),
        None => Ok(FileConfig::default()),
    }
}

pub fn init_logs(common: &Common, file: &FileConfig) -> Result<(), Failure> {
    let level = common.log_level.clone().or(file.log_level.clone()).unwrap_or_else(|| "info".to_string());
    crate::logging::init(&level, common.log_json || file.log_json.unwrap_or(false))?;
    Ok(())
}

/// The TLS files from flags or the file; all three are needed.
pub fn tls_files(common: &Common, file: &FileConfig) -> Result<TlsMaterial, Failure> {
    let pick = |flag: &Option<PathBuf>, key: &Option<PathBuf>, name: &str| {
        flag.clone().or(key.clone()).ok_or_else(|| {
            config_error(&format!("tls.{name}"), "required (or --dev for a throwaway CA; see `drover tls --help`)")
        })
    };
    let ca = pick(&common.ca_file, &file.tls.ca_file, "ca_file")?;
    let cert = pick(&common.cert_file, &file.tls.cert_file, "cert_file")?;
    let key = pick(&common.key_file, &file.tls.key_file, "key_file")?;
    TlsMaterial::from_files(&ca, &cert, &key).map_err(|error| Failure::Config(error.into()))
}

/// Raises the soft open-files limit to the hard one: a server holds a
/// descriptor per HTTP connection and task log, and distributions often
/// start processes with a soft limit of 1,024. Says what it is either way.
pub fn raise_open_files_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    let raised = Rlimit { current: limit.maximum, maximum: limit.maximum };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => {
            tracing::info!(open_files = ?limit.maximum, "open files limit (RLIMIT_NOFILE) raised to the hard limit")
        }
        Err(error) => tracing::warn!(%error, open_files = ?limit.current, "could not raise the open files limit"),
    }
}

pub fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?)
}

/// A fresh private (0700) directory under the system's temporary one, for
/// a dev process that was given no data dir; removed when the guard drops
/// (a clean exit, or a failed start).
pub fn dev_temp_dir(prefix: &str) -> Result<tempfile::TempDir, Failure> {
    Ok(tempfile::Builder::new().prefix(prefix).tempdir().context("creating a temporary directory")?)
}
