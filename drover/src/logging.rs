//! Structured logs with `tracing`: human-readable lines on stderr, or JSON
//! lines with `log_json`. `DROVER_LOG` (an `EnvFilter` directive) overrides
//! the level for finer control.

use tracing_subscriber::EnvFilter;

/// Installs the process's subscriber. `level` is error, warn, info, debug or trace.
pub fn init(level: &str, json: bool) -> Result<(), crate::config::ConfigError> {
    let filter = match std::env::var("DROVER_LOG") {
        Ok(directive) => EnvFilter::try_new(&directive),
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
