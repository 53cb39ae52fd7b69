//! A server's data directory: where its files are, who may read them, and
//! whether its raft log is the one it was using.
//!
//! ```text
//! DATA_DIR/                         0700
//! DATA_DIR/raft/                    0700
//! DATA_DIR/raft/wal/                0700  the raft log: entries, vote, committed and purged positions
//! DATA_DIR/raft/wal/*.wal           0600  its segments, named by their first record's sequence
//! DATA_DIR/raft/snapshots/          0700
//! DATA_DIR/raft/snapshots/*.snap    0600  the newest two snapshots (the log reaches back to the older)
//! DATA_DIR/raft/log.redb.imported   0600  an older build's log, once imported (the operator deletes it)
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
//!    missing, holds no segment, or holds no vote, no entry and no position
//!    while snapshots exist, is refused with [`DataDirError`], naming the
//!    log and how to recover on purpose. Starting without the log would
//!    lose every write after the newest snapshot and forget the raft vote
//!    (a server could then vote twice in one term).
//! 3. A refused open changes nothing on disk.
//! 4. An older build's log (`raft/log.redb`, redb) is imported
//!    ([`DataDir::import_old_log`]): its entries, vote, committed and
//!    purged positions are written to a new log made as `raft/wal.import/`,
//!    synced, renamed to `raft/wal/`, the directory synced; only then is
//!    `log.redb` renamed `log.redb.imported`. A crash in between leaves
//!    either no `wal/` (the import starts over) or both (the rename is
//!    finished on the next open). A 0-byte `log.redb` is refused as an
//!    emptied log, as before.

use std::fs::{DirBuilder, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::log_file::{LogError, LogFile};
use crate::{redb_import, sync_dir, FatalHandler};

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
        /// How it is empty: no segments (or an older build's 0-byte file), or no vote and no entries.
        what: &'static str,
        /// What shows the data dir was used.
        used: Vec<PathBuf>,
    },
    /// The log could not be opened or read.
    #[error(transparent)]
    Log(#[from] LogError),
    /// An older build's log could not be imported (module docs, step 4).
    #[error(
        "importing the raft log {log} of an older build: {reason}. Nothing was changed: {log} is as it was, and \
         the import runs again on the next start"
    )]
    Import {
        /// The old log.
        log: PathBuf,
        /// Why.
        reason: String,
    },
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

    /// The raft log's directory.
    pub fn log_path(&self) -> PathBuf {
        self.root.join("raft").join("wal")
    }

    /// Where an older build kept the raft log, in redb (module docs, step 4).
    pub fn old_log_path(&self) -> PathBuf {
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
    /// refuses the log of a used data dir that is missing or empty; imports
    /// an older build's log (contract, steps 1-4).
    pub fn open_log(&self, fatal: FatalHandler) -> Result<LogFile, DataDirError> {
        let log_path = self.log_path();
        let old_log = self.old_log_path();
        let used = self.used()?;
        match has_segments(&log_path) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => match std::fs::metadata(&old_log) {
                Ok(metadata) if metadata.len() == 0 => {
                    // A log is created whole (step 1): an empty file is one that was emptied.
                    return Err(DataDirError::LogEmpty { log: old_log, what: "0 bytes", used });
                }
                Ok(_) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                    if !used.is_empty() {
                        return Err(DataDirError::LogMissing { log: log_path, used });
                    }
                }
                Err(source) => return Err(DataDirError::Io { what: "reading", path: old_log, source }),
            },
            Err(source) => return Err(DataDirError::Io { what: "listing", path: log_path, source }),
            // A log is created whole (step 1): one without segments was emptied.
            Ok(false) => return Err(DataDirError::LogEmpty { log: log_path, what: "no segments", used }),
            Ok(true) => {}
        }
        self.create_dirs().map_err(|source| DataDirError::Io { what: "creating", path: self.root.clone(), source })?;
        self.import_old_log()?;
        let log = LogFile::open(&log_path, fatal)?;
        let snapshots: Vec<PathBuf> = used.into_iter().filter(|path| is_snapshot(path)).collect();
        if !snapshots.is_empty() && log.is_blank()? {
            return Err(DataDirError::LogEmpty { log: log_path, what: "no vote and no entries", used: snapshots });
        }
        Ok(log)
    }

    /// Imports an older build's log when there is no log yet, or finishes
    /// an import a crash interrupted (contract, step 4); says whether it
    /// imported one. `open_log` runs it; a restore runs it before opening
    /// the log directly.
    pub fn import_old_log(&self) -> Result<bool, DataDirError> {
        let old_log = self.old_log_path();
        let raft_dir = self.root.join("raft");
        let io = |what: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| DataDirError::Io { what, path, source }
        };
        let old_len = match std::fs::metadata(&old_log) {
            Ok(metadata) => metadata.len(),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(source) => return Err(DataDirError::Io { what: "reading", path: old_log, source }),
        };
        if self.log_path().exists() {
            tracing::warn!(old = %old_log.display(), "finishing an import of the raft log that a crash interrupted");
            self.set_old_log_aside()?;
            return Ok(false);
        }
        if old_len == 0 {
            // Refused by `open_log` (step 4); a restore starts a new log beside it.
            return Ok(false);
        }
        let import_error = |reason: String| DataDirError::Import { log: old_log.clone(), reason };
        let old = redb_import::read(&old_log).map_err(|error| import_error(format!("reading it: {error}")))?;
        let importing = raft_dir.join("wal.import");
        match std::fs::remove_dir_all(&importing) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                return Err(io("removing an earlier import's", &importing)(error));
            }
            _ => {}
        }
        write_imported(&importing, &old)
            .map_err(|error| import_error(format!("writing {}: {error}", importing.display())))?;
        std::fs::rename(&importing, self.log_path()).map_err(io("renaming", &importing))?;
        sync_dir(&raft_dir).map_err(io("syncing", &raft_dir))?;
        self.set_old_log_aside()?;
        let range =
            old.entries.first().zip(old.entries.last()).map(|((first, _), (last, _))| format!("{first}..={last}"));
        tracing::info!(
            from = %old_log.display(),
            to = %self.log_path().display(),
            entries = old.entries.len(),
            range = range.as_deref().unwrap_or("none"),
            vote = old.vote.is_some(),
            committed = old.committed.is_some(),
            purged = old.purged.is_some(),
            "imported an older build's raft log; the old file is kept as log.redb.imported for the operator to delete"
        );
        Ok(true)
    }

    /// Renames an imported `log.redb` to `log.redb.imported` (step 4).
    fn set_old_log_aside(&self) -> Result<(), DataDirError> {
        let old_log = self.old_log_path();
        let aside = old_log.with_extension("redb.imported");
        std::fs::rename(&old_log, &aside).map_err(|source| DataDirError::Io {
            what: "renaming",
            path: old_log,
            source,
        })?;
        let raft_dir = self.root.join("raft");
        sync_dir(&raft_dir).map_err(|source| DataDirError::Io { what: "syncing", path: raft_dir, source })
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

/// Writes an old log's content into a new log at `path` and closes it
/// (synced): the purge first (up to the entry before the first, or 0 when
/// there is none; the storage crate cannot read the caller's description
/// of it), then the entries, the vote and the committed position.
fn write_imported(path: &Path, old: &redb_import::OldLog) -> Result<(), LogError> {
    let ignore: FatalHandler = std::sync::Arc::new(|_: &crate::FatalError| {});
    let log = LogFile::open(path, ignore)?;
    let wait = |write: &dyn Fn(crate::Completion)| -> Result<(), LogError> {
        let (done, result) = std::sync::mpsc::channel();
        write(Box::new(move |outcome| {
            let _ = done.send(outcome);
        }));
        result.recv().unwrap_or(Err(LogError::Closed))
    };
    if let Some(purged) = &old.purged {
        let upto = old.entries.first().map_or(0, |(first, _)| first.saturating_sub(1));
        wait(&|done| log.purge(upto, purged.clone(), done))?;
    }
    for chunk in old.entries.chunks(4_096) {
        wait(&|done| log.append(chunk.to_vec(), done))?;
    }
    if let Some(vote) = &old.vote {
        wait(&|done| log.save_vote(vote.clone(), done))?;
    }
    if let Some(committed) = &old.committed {
        wait(&|done| log.save_committed(committed.clone(), done))?;
    }
    // Closing syncs what waited for a sync (the log's docs, step 2).
    log.close();
    sync_dir(path).map_err(|error| LogError::Stopped(error.to_string()))
}

/// Whether the log directory `path` holds a segment that is not 0 bytes.
fn has_segments(path: &Path) -> std::io::Result<bool> {
    for entry in std::fs::read_dir(path)? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_string_lossy().ends_with(".wal") && entry.metadata()?.len() > 0 {
            return Ok(true);
        }
    }
    Ok(false)
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

    /// The log's segment files.
    fn segments(dir: &DataDir) -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> =
            std::fs::read_dir(dir.log_path()).expect("lists").map(|entry| entry.expect("entry").path()).collect();
        found.sort();
        found
    }

    /// Runs a write and waits for it.
    fn wait(write: impl FnOnce(crate::Completion)) {
        let (done, answer) = std::sync::mpsc::channel();
        write(Box::new(move |result| done.send(result).expect("test alive")));
        answer.recv().expect("answered").expect("durable");
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
        assert_eq!(mode(&dir.log_path()), 0o700);
        for segment in segments(&dir) {
            assert_eq!(mode(&segment), 0o600, "{}", segment.display());
        }
        assert_eq!(mode(dir.root()), 0o700);
        assert_eq!(mode(&dir.root().join("raft")), 0o700);
        let names: Vec<_> = std::fs::read_dir(dir.root().join("raft")).expect("lists").flatten().collect();
        assert_eq!(names.len(), 1, "only the log, no temporary left: {names:?}");
        dir.open_log(ignore_fatal()).expect("reopens").close();
    }

    #[test]
    fn a_missing_log_of_a_used_data_dir_is_refused_naming_it_and_nothing_changes() {
        let (_temp, dir, snapshot) = used_dir();
        std::fs::remove_dir_all(dir.log_path()).expect("deletes the log");
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
        std::fs::remove_dir_all(dir.log_path()).expect("deletes the log");
        let error = dir.open_log(ignore_fatal()).expect_err("refused").to_string();
        assert!(error.contains(&format!("{} exists", dir.snapshot_dir().display())), "{error}");
        assert!(!dir.log_path().exists(), "no log was made");
    }

    #[test]
    fn an_emptied_log_is_refused() {
        let (_temp, dir, snapshot) = used_dir();
        for segment in segments(&dir) {
            std::fs::remove_file(segment).expect("empties the log");
        }
        let before = files(dir.root());
        let error = dir.open_log(ignore_fatal()).expect_err("refused");
        let message = error.to_string();
        assert!(matches!(error, DataDirError::LogEmpty { what: "no segments", .. }), "{message}");
        assert!(
            message.contains(&format!("the raft log {} is empty (no segments)", dir.log_path().display())),
            "{message}"
        );
        assert!(message.contains(&snapshot.display().to_string()), "{message}");
        assert_eq!(files(dir.root()), before, "left as it was");
        assert!(dir.log_path().is_dir());
    }

    #[test]
    fn a_blank_log_beside_snapshots_is_refused() {
        let (_temp, dir, _snapshot) = used_dir();
        std::fs::remove_dir_all(dir.log_path()).expect("deletes the log");
        // What an older build left after starting over a deleted log.
        LogFile::open(&dir.log_path(), ignore_fatal()).expect("a new blank log").close();
        let error = dir.open_log(ignore_fatal()).expect_err("refused");
        assert!(matches!(error, DataDirError::LogEmpty { what: "no vote and no entries", .. }), "{error}");
    }

    #[test]
    fn directories_and_a_log_an_older_build_left_readable_are_tightened() {
        let (_temp, dir, snapshot) = used_dir();
        let segment = segments(&dir).pop().expect("a segment");
        for (path, loose) in [
            (dir.root().to_path_buf(), 0o755),
            (dir.log_path(), 0o755),
            (segment.clone(), 0o644),
            (snapshot.clone(), 0o644),
        ] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(loose)).expect("loosens");
        }
        dir.open_log(ignore_fatal()).expect("opens").close();
        SnapshotDir::open(&dir.snapshot_dir(), ignore_fatal()).expect("opens");
        assert_eq!(mode(dir.root()), 0o700);
        assert_eq!(mode(&dir.log_path()), 0o700);
        assert_eq!(mode(&segment), 0o600);
        assert_eq!(mode(&snapshot), 0o600);
        assert_eq!(mode(&dir.snapshot_dir()), 0o700);
    }

    /// A data dir an older build used: its log in redb, and a snapshot.
    fn old_data_dir() -> (tempfile::TempDir, DataDir, redb_import::OldLog) {
        let (temp, dir, _snapshot) = used_dir();
        std::fs::remove_dir_all(dir.log_path()).expect("no new log yet");
        let old = redb_import::OldLog {
            entries: (500..=620).map(|index| (index, format!("entry {index}").into_bytes())).collect(),
            vote: Some(b"vote 7".to_vec()),
            committed: Some(b"committed 610".to_vec()),
            purged: Some(b"purged 499".to_vec()),
        };
        redb_import::write(&dir.old_log_path(), &old).expect("an old log");
        (temp, dir, old)
    }

    #[test]
    fn an_older_builds_redb_log_is_imported_whole_and_set_aside() {
        let (_temp, dir, old) = old_data_dir();
        let log = dir.open_log(ignore_fatal()).expect("imports and opens");
        assert_eq!(log.read(..).expect("reads"), old.entries);
        assert_eq!(log.vote().expect("reads"), old.vote);
        assert_eq!(log.committed().expect("reads"), old.committed);
        assert_eq!(log.purged().expect("reads"), old.purged);
        wait(|done| log.append(vec![(621, b"after".to_vec())], done));
        log.close();

        let raft = dir.root().join("raft");
        assert!(!dir.old_log_path().exists(), "the old log is set aside");
        assert!(raft.join("log.redb.imported").exists(), "and kept for the operator");
        assert!(!raft.join("wal.import").exists(), "no temporary left");
        assert_eq!(mode(&dir.log_path()), 0o700);
        let log = dir.open_log(ignore_fatal()).expect("reopens without importing again");
        assert_eq!(log.range().expect("reads"), Some(crate::LogRange { first: 500, last: 621 }));
        assert_eq!(log.vote().expect("reads"), old.vote);
    }

    #[test]
    fn an_import_a_crash_interrupted_is_finished_or_started_over() {
        let (_temp, dir, old) = old_data_dir();
        // A crash during the import's writing left a half-made log.
        std::fs::create_dir_all(dir.root().join("raft").join("wal.import")).expect("a leftover");
        assert!(dir.import_old_log().expect("imports"));
        // A crash after the new log was in place but before the old one was set aside.
        std::fs::rename(dir.root().join("raft").join("log.redb.imported"), dir.old_log_path()).expect("undoes");
        assert!(!dir.import_old_log().expect("finishes"), "not imported twice");
        assert!(!dir.old_log_path().exists());
        let log = dir.open_log(ignore_fatal()).expect("opens");
        assert_eq!(log.read(..).expect("reads"), old.entries);
    }

    #[test]
    fn an_older_builds_emptied_log_is_refused() {
        let (_temp, dir, _old) = old_data_dir();
        std::fs::write(dir.old_log_path(), b"").expect("empties it");
        let error = dir.open_log(ignore_fatal()).expect_err("refused");
        assert!(matches!(error, DataDirError::LogEmpty { what: "0 bytes", .. }), "{error}");
        assert!(error.to_string().contains(&dir.old_log_path().display().to_string()), "{error}");
        assert!(!dir.log_path().exists(), "no log was made");
    }
}
