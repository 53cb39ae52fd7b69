//! A server's data directory: where its files are, who may read them, and
//! whether its raft log is the one it was using.
//!
//! ```text
//! DATA_DIR/                         0700
//! DATA_DIR/raft/                    0700
//! DATA_DIR/raft/log.redb            0600  raft log entries, vote, committed and purged positions
//! DATA_DIR/raft/snapshots/          0700
//! DATA_DIR/raft/snapshots/*.snap    0600  the newest two snapshots (the log reaches back to the older)
//! ```
//!
//! The log holds the management token's secret and every job's, so the
//! directories are 0700 and the files 0600 (as Nomad's are), set when they
//! are created; directories and files an older build made readable are
//! tightened when they are opened.
//!
//! Contract of [`DataDir::open_log`], which a server runs before anything
//! else touches the data dir:
//! 1. A fresh data dir (no log, no snapshot directory) gets a new log.
//!    The log is created before the snapshot directory and appears whole
//!    ([`LogFile::open`]), so a snapshot directory without a log never
//!    comes from a crash during the first start.
//! 2. A data dir that was used (its snapshot directory exists) whose log is
//!    missing, 0 bytes long, or holds no vote, no entry and no position
//!    while snapshots exist, is refused with [`DataDirError`], naming the
//!    log and how to recover on purpose. Starting without the log would
//!    lose every write after the newest snapshot and forget the raft vote
//!    (a server could then vote twice in one term).
//! 3. A refused open changes nothing on disk.

use std::fs::{DirBuilder, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::log_file::{LogError, LogFile};
use crate::FatalHandler;

/// The mode of the data dir's directories: the owner's only.
pub const DIR_MODE: u32 = 0o700;
/// The mode of the log and snapshot files: the owner's only.
pub const FILE_MODE: u32 = 0o600;

/// Why a data dir's raft log was refused (module docs).
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    /// The log is missing from a data dir that was used.
    #[error(
        "the raft log {log} is missing, but this data dir was used ({}). Starting without it would lose every \
         write after the newest snapshot, and the raft vote. {}",
        evidence(used),
        recover(log, used)
    )]
    LogMissing {
        /// Where the log should be.
        log: PathBuf,
        /// What shows the data dir was used: its snapshots, or the snapshot directory.
        used: Vec<PathBuf>,
    },
    /// The log is there but empty.
    #[error(
        "the raft log {log} is empty ({what}), but this data dir was used ({}). Starting from it would lose every \
         write after the newest snapshot, and the raft vote. {}",
        evidence(used),
        recover(log, used)
    )]
    LogEmpty {
        /// The log.
        log: PathBuf,
        /// How it is empty: 0 bytes, or no vote and no entries.
        what: &'static str,
        /// What shows the data dir was used.
        used: Vec<PathBuf>,
    },
    /// The log could not be opened or read.
    #[error(transparent)]
    Log(#[from] LogError),
    /// A directory or file could not be read, created or tightened.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The directory or file.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
}

/// Says what shows a data dir was used.
fn evidence(used: &[PathBuf]) -> String {
    let named: Vec<String> = used.iter().map(|path| path.display().to_string()).collect();
    match used {
        [] => "a log is never created empty, so this one was emptied".to_string(),
        [dir] if !is_snapshot(dir) => format!("{} exists", named[0]),
        _ => format!("it holds the snapshots {}", named.join(", ")),
    }
}

/// Says how to recover on purpose: the log back, the newest snapshot
/// restored, or an empty start.
fn recover(log: &Path, used: &[PathBuf]) -> String {
    let raft_dir = log.parent().unwrap_or(log).display();
    let mut text = "If the log was moved, put it back. ".to_string();
    if let Some(newest) = used.iter().find(|path| path.extension().is_some_and(|extension| extension == "snap")) {
        text += &format!(
            "To start from the newest snapshot on purpose, losing every write after it, stop the server and run \
             `drover operator snapshot restore --data-dir <its data_dir> {}`. ",
            newest.display()
        );
    }
    text + &format!(
        "To start empty on purpose, move {raft_dir} away (a server of a cluster does this rather than restore: \
         remove it with `drover operator raft remove-peer`, then start it empty to join again)."
    )
}

/// Where a server keeps its durable state (module docs).
#[derive(Clone, Debug)]
pub struct DataDir {
    root: PathBuf,
}

impl DataDir {
    /// The layout under `root`.
    pub fn new(root: impl Into<PathBuf>) -> DataDir {
        DataDir { root: root.into() }
    }

    /// The data directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The raft log's redb file.
    pub fn log_path(&self) -> PathBuf {
        self.root.join("raft").join("log.redb")
    }

    /// The snapshot directory.
    pub fn snapshot_dir(&self) -> PathBuf {
        self.root.join("raft").join("snapshots")
    }

    /// Creates the data dir and its raft directory, owner-only (module docs).
    pub fn create_dirs(&self) -> std::io::Result<()> {
        create_private_dir(&self.root)?;
        create_private_dir(&self.root.join("raft"))
    }

    /// Opens the log of a data dir, or makes one for a fresh data dir;
    /// refuses the log of a used data dir that is missing or empty
    /// (contract, steps 1-3).
    pub fn open_log(&self, fatal: FatalHandler) -> Result<LogFile, DataDirError> {
        let log_path = self.log_path();
        let used = self.used()?;
        match std::fs::metadata(&log_path) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                if !used.is_empty() {
                    return Err(DataDirError::LogMissing { log: log_path, used });
                }
            }
            Err(source) => return Err(DataDirError::Io { what: "reading", path: log_path, source }),
            Ok(metadata) if metadata.len() == 0 => {
                // A log is created whole (step 1): an empty file is one that was emptied.
                return Err(DataDirError::LogEmpty { log: log_path, what: "0 bytes", used });
            }
            Ok(_) => {}
        }
        self.create_dirs().map_err(|source| DataDirError::Io { what: "creating", path: self.root.clone(), source })?;
        let log = LogFile::open(&log_path, fatal)?;
        let snapshots: Vec<PathBuf> = used.into_iter().filter(|path| is_snapshot(path)).collect();
        if !snapshots.is_empty() && log.is_blank()? {
            return Err(DataDirError::LogEmpty { log: log_path, what: "no vote and no entries", used: snapshots });
        }
        Ok(log)
    }

    /// What shows this data dir was used: its snapshot files, or else the
    /// snapshot directory itself (made only after the log, step 1).
    fn used(&self) -> Result<Vec<PathBuf>, DataDirError> {
        let dir = self.snapshot_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(DataDirError::Io { what: "listing", path: dir, source }),
        };
        let listing = |source| DataDirError::Io { what: "listing", path: dir.clone(), source };
        let mut snapshots = Vec::new();
        for entry in entries {
            let path = entry.map_err(listing)?.path();
            if is_snapshot(&path) {
                snapshots.push(path);
            }
        }
        // Newest first: snapshot files are named by their index.
        snapshots.sort_by(|a, b| b.cmp(a));
        Ok(if snapshots.is_empty() { vec![dir] } else { snapshots })
    }
}

/// A snapshot file, or one set aside as corrupt: either proves a log was kept.
fn is_snapshot(path: &Path) -> bool {
    let name = path.file_name().map(|name| name.to_string_lossy()).unwrap_or_default();
    name.ends_with(".snap") || name.ends_with(".snap.corrupt")
}

/// Creates `dir` (and its parents) owner-only, and tightens it if an older
/// build made it readable to others.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir)?;
    tighten(dir, DIR_MODE)
}

/// Sets `path`'s mode to `mode` if it allows more.
pub fn tighten(path: &Path, mode: u32) -> std::io::Result<()> {
    let current = std::fs::metadata(path)?.permissions().mode() & 0o777;
    if current & !mode != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// Options that create a file owner-only ([`FILE_MODE`]).
pub(crate) fn private_file() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.mode(FILE_MODE);
    options
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{FatalError, SnapshotDir};

    fn ignore_fatal() -> FatalHandler {
        Arc::new(|_: &FatalError| {})
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).expect("exists").permissions().mode() & 0o777
    }

    /// A data dir that was used: a log with a vote, and one snapshot.
    fn used_dir() -> (tempfile::TempDir, DataDir, PathBuf) {
        let temp = tempfile::tempdir().expect("temp dir");
        let dir = DataDir::new(temp.path().join("server"));
        let log = dir.open_log(ignore_fatal()).expect("a fresh data dir opens");
        let (done, answer) = std::sync::mpsc::channel();
        log.save_vote(b"vote".to_vec(), Box::new(move |result| done.send(result).expect("test alive")));
        answer.recv().expect("answered").expect("durable");
        log.close();
        let snapshots = SnapshotDir::open(&dir.snapshot_dir(), ignore_fatal()).expect("opens");
        let snapshot = snapshots.write(499, b"meta", |out| out.write_all(b"body")).expect("writes").path;
        (temp, dir, snapshot)
    }

    /// Every file under `root` with its bytes.
    fn files(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
        let mut found = Vec::new();
        let mut dirs = vec![root.to_path_buf()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("lists") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    dirs.push(path);
                } else {
                    let bytes = std::fs::read(&path).expect("reads");
                    found.push((path, bytes));
                }
            }
        }
        found.sort();
        found
    }

    #[test]
    fn a_fresh_data_dir_gets_an_owner_only_log_and_reopens() {
        let temp = tempfile::tempdir().expect("temp dir");
        let dir = DataDir::new(temp.path().join("server"));
        dir.open_log(ignore_fatal()).expect("a fresh data dir opens").close();
        assert_eq!(mode(&dir.log_path()), 0o600);
        assert_eq!(mode(dir.root()), 0o700);
        assert_eq!(mode(&dir.root().join("raft")), 0o700);
        let names: Vec<_> = std::fs::read_dir(dir.root().join("raft")).expect("lists").flatten().collect();
        assert_eq!(names.len(), 1, "only the log, no temporary left: {names:?}");
        dir.open_log(ignore_fatal()).expect("reopens").close();
    }

    #[test]
    fn a_missing_log_of_a_used_data_dir_is_refused_naming_it_and_nothing_changes() {
        let (_temp, dir, snapshot) = used_dir();
        std::fs::remove_file(dir.log_path()).expect("deletes the log");
        let before = files(dir.root());
        let error = dir.open_log(ignore_fatal()).expect_err("refused");
        assert!(matches!(error, DataDirError::LogMissing { .. }), "{error:?}");
        let message = error.to_string();
        for needle in [&dir.log_path().display().to_string(), &snapshot.display().to_string()] {
            assert!(message.contains(needle.as_str()), "names {needle}: {message}");
        }
        assert!(message.contains("is missing") && message.contains("drover operator snapshot restore"), "{message}");
        assert_eq!(files(dir.root()), before, "a refused open changes nothing");
    }

    #[test]
    fn a_missing_log_is_refused_when_only_the_snapshot_directory_shows_use() {
        let (_temp, dir, snapshot) = used_dir();
        std::fs::remove_file(snapshot).expect("no snapshot yet");
        std::fs::remove_file(dir.log_path()).expect("deletes the log");
        let error = dir.open_log(ignore_fatal()).expect_err("refused").to_string();
        assert!(error.contains(&format!("{} exists", dir.snapshot_dir().display())), "{error}");
        assert!(!dir.log_path().exists(), "no log was made");
    }

    #[test]
    fn an_emptied_log_is_refused() {
        let (_temp, dir, snapshot) = used_dir();
        std::fs::write(dir.log_path(), b"").expect("truncates the log");
        let error = dir.open_log(ignore_fatal()).expect_err("refused");
        let message = error.to_string();
        assert!(matches!(error, DataDirError::LogEmpty { what: "0 bytes", .. }), "{message}");
        assert!(message.contains(&dir.log_path().display().to_string()), "{message}");
        assert!(message.contains(&snapshot.display().to_string()), "{message}");
        assert_eq!(std::fs::metadata(dir.log_path()).expect("still there").len(), 0, "left as it was");
    }

    #[test]
    fn a_blank_log_beside_snapshots_is_refused() {
        let (_temp, dir, _snapshot) = used_dir();
        std::fs::remove_file(dir.log_path()).expect("deletes the log");
        // What an older build left after starting over a deleted log.
        LogFile::open(&dir.log_path(), ignore_fatal()).expect("a new blank log").close();
        let error = dir.open_log(ignore_fatal()).expect_err("refused");
        assert!(matches!(error, DataDirError::LogEmpty { what: "no vote and no entries", .. }), "{error}");
    }

    #[test]
    fn directories_and_a_log_an_older_build_left_readable_are_tightened() {
        let (_temp, dir, snapshot) = used_dir();
        for (path, loose) in [(dir.root().to_path_buf(), 0o755), (dir.log_path(), 0o644), (snapshot.clone(), 0o644)] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(loose)).expect("loosens");
        }
        dir.open_log(ignore_fatal()).expect("opens").close();
        SnapshotDir::open(&dir.snapshot_dir(), ignore_fatal()).expect("opens");
        assert_eq!(mode(dir.root()), 0o700);
        assert_eq!(mode(&dir.log_path()), 0o600);
        assert_eq!(mode(&snapshot), 0o600);
        assert_eq!(mode(&dir.snapshot_dir()), 0o700);
    }
}
