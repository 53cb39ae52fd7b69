//! Drover's durable files: the raft log, its vote and committed position
//! in a segmented write-ahead log ([`LogFile`]), checksummed snapshot files ([`SnapshotDir`]), and
//! [`write_atomic`] for the small files the other crates keep (identities,
//! certificates, the agent's records). Every fsync goes through here but
//! one: `replication` syncs a snapshot it receives from the leader before
//! [`SnapshotDir::import`] takes it in. It knows bytes and log
//! positions, not commands and not openraft; the `replication` crate puts
//! openraft on top and the engine encodes what goes in.
//!
//! A server's data directory ([`DataDir`]): owner-only directories and
//! files, and a log that must be there once the data dir was used.
//!
//! ```text
//! DATA_DIR/raft/wal/*.wal           raft log entries, vote, committed and purged positions
//! DATA_DIR/raft/snapshots/*.snap    the newest two snapshots (the log reaches back to the older)
//! ```
//!
//! **A failed fsync is fatal.** After an fsync error the kernel may have
//! dropped the dirty pages it could not write, so nothing written since the
//! last good sync can be trusted: the store stops taking writes, answers
//! every waiting one with an error, and calls its [`FatalHandler`], which in
//! a server ends the process ([`exit_on_fatal`]). Restarting recovers from
//! the last snapshot and the log, as after a crash.

#![forbid(unsafe_code)]

mod data_dir;
mod log_file;
mod redb_import;
mod snapshot_file;
mod wal_segment;

use std::path::Path;
use std::sync::Arc;

pub use data_dir::{create_private_dir, tighten, DataDir, DataDirError, DIR_MODE, FILE_MODE};
pub use log_file::{Completion, LogError, LogFile, LogRange};
pub use snapshot_file::{verify, SnapshotDir, SnapshotError, SnapshotInfo, VerifiedSnapshot, KEEP};

/// The exit code of a server stopped by a storage failure (BSD's EX_IOERR).
pub const EXIT_STORAGE_FAILURE: i32 = 74;

/// A write to disk that failed; nothing after it can be trusted.
#[derive(Debug, thiserror::Error)]
#[error("{what} failed: {source}")]
pub struct FatalError {
    /// What was being made durable.
    pub what: String,
    /// Why it failed.
    pub source: std::io::Error,
}

/// What a store does after a [`FatalError`], once it stopped taking writes.
pub type FatalHandler = Arc<dyn Fn(&FatalError) + Send + Sync>;

/// The handler a server runs with: says what failed, on the log and on
/// stderr, and ends the process with [`EXIT_STORAGE_FAILURE`].
pub fn exit_on_fatal() -> FatalHandler {
    Arc::new(|error: &FatalError| {
        let message = format!(
            "FATAL: {error}. Stopping now: after a failed write or fsync the log and snapshots on disk cannot be \
             trusted to hold what was acknowledged since the last good sync. Fix the disk, then restart: the \
             server recovers from its last snapshot and the log."
        );
        tracing::error!("{message}");
        eprintln!("{message}");
        std::process::exit(EXIT_STORAGE_FAILURE);
    })
}

/// Makes `path`'s entry in its directory durable: after a create, rename
/// or delete, the directory itself must be synced.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Writes `bytes` to `path` with `mode` so that a crash leaves the old
/// file or the new one, never a torn one: a temporary file beside it
/// (`<path>.tmp`, created with `mode`), fsync, rename, fsync of the
/// directory. The one way Drover replaces a small file (an agent's state
/// and exit records, its identity, a server's raft id, a saved snapshot).
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = std::path::PathBuf::from(temporary);
    let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(&temporary)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)?;
    sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_atomic_write_replaces_the_file_whole_with_its_mode_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("drover-storage-atomic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("state.json");
        write_atomic(&path, b"first", 0o600).expect("written");
        write_atomic(&path, b"second", 0o600).expect("replaced");
        assert_eq!(std::fs::read(&path).expect("read"), b"second");
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).expect("exists").permissions());
        assert_eq!(mode & 0o777, 0o600);
        let names: Vec<_> =
            std::fs::read_dir(&dir).expect("dir").map(|entry| entry.expect("entry").file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("state.json")], "no temporary is left");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
