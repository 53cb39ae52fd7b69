//! Structured logs with `tracing`: human-readable lines on stderr, or JSON
//! lines with `log_json`. `DROVER_LOG` (an `EnvFilter` directive) overrides
//! the level for finer control.

use tracing_subscriber::EnvFilter;

/// Installs the process's subscriber. `level` is error, warn, info, debug or trace.
pub fn init(level: &str, json: bool) -> Result<(), crate::config::ConfigError> {
    let filter = match std::env::var("DROVER_LOG") {
        Ok(directive) => EnvFilter::try_new(&directive),
        // openraft narrates every vote and replication step at info, and
        // logs every failed call to a peer that is down as an error, four
        // times a second. Drover logs the leadership changes and raft's
        // fatal errors itself; `DROVER_LOG=openraft=info` shows them all.
        Err(_) if matches!(level, "info" | "warn") => EnvFilter::try_new(format!("{level},openraft=off")),
        Err(_) => EnvFilter::try_new(level),
    }
    .map_err(|error| crate::config::ConfigError::Value {
        key: "log_level".to_string(),
        message: format!("{level:?}: {error}"),
    })?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let installed = if json { builder.json().try_init() } else { builder.try_init() };
    // A second init in one process (tests) keeps the first subscriber.
    drop(installed);
    Ok(())
}
