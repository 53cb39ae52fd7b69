//! The one builder of `drover agent` command lines with TLS flags, shared
//! by the tests (through `common`) and `examples/task_latency.rs`
//! (through `#[path]`).

use std::path::{Path, PathBuf};

/// `<bin> agent` against `servers`, with the CA, certificate and key in
/// `tls`, keeping its data in `data_dir`.
pub fn agent_command_of(bin: &Path, servers: &str, tls: &[PathBuf; 3], data_dir: &Path) -> std::process::Command {
    let mut command = std::process::Command::new(bin);
    command.args(["agent", "--servers", servers]);
    for (flag, file) in ["--ca-file", "--cert-file", "--key-file"].into_iter().zip(tls) {
        command.arg(flag).arg(file);
    }
    command.arg("--data-dir").arg(data_dir);
    command
}
