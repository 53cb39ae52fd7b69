//! The raft log, its vote and committed position in one redb file, written
//! by one thread with group commit.
//!
//! Contract:
//! 1. Every write (append, vote, committed, truncate, purge) is queued to
//!    the writer thread and done in the order it was queued; its
//!    [`Completion`] is called once it is durable, or failed.
//! 2. Group commit: the writer takes everything queued since its last
//!    commit into one write transaction and commits it with one fsync
//!    (`Durability::Immediate`) when any of it must be durable (appends,
//!    votes, truncations), or without one when none must (purges and the
//!    committed position, made durable by the next commit that syncs).
//! 3. Reads see what was committed; a write is readable once its
//!    completion was called (the replication layer keeps what it appended
//!    readable before that).
//! 4. A failed commit is fatal (crate docs): the writer answers that write
//!    and every later one with [`LogError::Stopped`] and calls the
//!    [`FatalHandler`] once.
//! 5. A new log appears whole: it is made as `log.redb.new` (owner-only,
//!    [`crate::FILE_MODE`]), given its tables, synced and renamed into
//!    place, so a 0-byte or half-made log is never one this crate left
//!    (the data dir's check relies on it, [`crate::DataDir::open_log`]).

use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam::channel::{Receiver, Sender};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::data_dir::{create_private_dir, private_file, tighten};
use crate::{sync_dir, FatalError, FatalHandler, FILE_MODE};

const LOG: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("meta");

/// Called once a queued write is durable, or failed.
pub type Completion = Box<dyn FnOnce(Result<(), LogError>) + Send>;

/// Why the log could not be read or written.
#[derive(Clone, Debug, thiserror::Error)]
pub enum LogError {
    /// The file could not be opened (another process holds it, or it is
    /// not a log).
    #[error("opening the raft log {path}: {reason}")]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A read failed.
    #[error("reading the raft log: {0}")]
    Read(String),
    /// A write failed earlier; the log takes no more (crate docs).
    #[error("the raft log stopped after a failed write: {0}")]
    Stopped(String),
    /// The log was closed.
    #[error("the raft log is closed")]
    Closed,
}

/// The first and last index the log holds, if it holds any entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogRange {
    /// The first index present.
    pub first: u64,
    /// The last index present.
    pub last: u64,
}

/// One queued write.
enum Write {
    Append(Vec<(u64, Vec<u8>)>),
    Meta { key: &'static str, value: Vec<u8>, durable: bool },
    Truncate { from: u64 },
    Purge { upto: u64 },
}

/// The raft log file (module docs).
pub struct LogFile {
    path: PathBuf,
    db: Arc<Database>,
    queue: Option<Sender<(Write, Completion)>>,
    writer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for LogFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogFile").field("path", &self.path).finish_non_exhaustive()
    }
}

impl LogFile {
    /// Opens (or creates, module docs step 5) the log at `path`; `fatal`
    /// runs if a write fails.
    pub fn open(path: &Path, fatal: FatalHandler) -> Result<LogFile, LogError> {
        let open_error = |reason: String| LogError::Open { path: path.to_path_buf(), reason };
        if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
            create_private_dir(parent).map_err(|error| open_error(error.to_string()))?;
        }
        if !path.exists() {
            create_whole(path).map_err(|error| open_error(error.to_string()))?;
        }
        // A log an older build made readable to others is tightened.
        tighten(path, FILE_MODE).map_err(|error| open_error(error.to_string()))?;
        let db = Database::create(path).map_err(|error| open_error(error.to_string()))?;
        LogFile::start(path, db, fatal)
    }

    /// Starts the writer over an opened database.
    fn start(path: &Path, db: Database, fatal: FatalHandler) -> Result<LogFile, LogError> {
        let open_error = |reason: String| LogError::Open { path: path.to_path_buf(), reason };
        let init = || -> Result<(), redb::Error> {
            let txn = db.begin_write()?;
            txn.open_table(LOG)?;
            txn.open_table(META)?;
            txn.commit()?;
            Ok(())
        };
        init().map_err(|error| open_error(error.to_string()))?;
        let db = Arc::new(db);
        let (queue, queued) = crossbeam::channel::unbounded();
        let writer = {
            let db = db.clone();
            let path = path.to_path_buf();
            std::thread::Builder::new()
                .name("raft-log-writer".into())
                .spawn(move || write_loop(&db, &path, &queued, &fatal))
                .map_err(|error| open_error(error.to_string()))?
        };
        Ok(LogFile { path: path.to_path_buf(), db, queue: Some(queue), writer: Some(writer) })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Queues `entries` (index, bytes), which must follow the last entry.
    pub fn append(&self, entries: Vec<(u64, Vec<u8>)>, done: Completion) {
        self.queue(Write::Append(entries), done);
    }

    /// Queues the vote; `done` once it is durable.
    pub fn save_vote(&self, vote: Vec<u8>, done: Completion) {
        self.queue(Write::Meta { key: "vote", value: vote, durable: true }, done);
    }

    /// Queues the committed position (durable with the next synced write).
    pub fn save_committed(&self, committed: Vec<u8>, done: Completion) {
        self.queue(Write::Meta { key: "committed", value: committed, durable: false }, done);
    }

    /// Queues the removal of every entry from `from` on.
    pub fn truncate(&self, from: u64, done: Completion) {
        self.queue(Write::Truncate { from }, done);
    }

    /// Queues the removal of every entry up to `upto`, recording `purged`
    /// (the caller's description of the last purged entry).
    pub fn purge(&self, upto: u64, purged: Vec<u8>, done: Completion) {
        let (first, then) = completion_pair(done);
        self.queue(Write::Meta { key: "purged", value: purged, durable: false }, first);
        self.queue(Write::Purge { upto }, then);
    }

    fn queue(&self, write: Write, done: Completion) {
        let Some(queue) = &self.queue else { return done(Err(LogError::Closed)) };
        if let Err(crossbeam::channel::SendError((_, done))) = queue.send((write, done)) {
            done(Err(LogError::Closed));
        }
    }

    /// The entries whose index is in `range`, in order.
    pub fn read(&self, range: impl RangeBounds<u64>) -> Result<Vec<(u64, Vec<u8>)>, LogError> {
        let read = || -> Result<Vec<(u64, Vec<u8>)>, redb::Error> {
            let txn = self.db.begin_read()?;
            let table = txn.open_table(LOG)?;
            let mut entries = Vec::new();
            for row in table.range(range)? {
                let (index, bytes) = row?;
                entries.push((index.value(), bytes.value().to_vec()));
            }
            Ok(entries)
        };
        read().map_err(|error| LogError::Read(error.to_string()))
    }

    /// The first and last index held, if any.
    pub fn range(&self) -> Result<Option<LogRange>, LogError> {
        let read = || -> Result<Option<LogRange>, redb::Error> {
            let txn = self.db.begin_read()?;
            let table = txn.open_table(LOG)?;
            let first = table.first()?.map(|(index, _)| index.value());
            let last = table.last()?.map(|(index, _)| index.value());
            Ok(first.zip(last).map(|(first, last)| LogRange { first, last }))
        };
        read().map_err(|error| LogError::Read(error.to_string()))
    }

    /// The last entry, if any.
    pub fn last(&self) -> Result<Option<(u64, Vec<u8>)>, LogError> {
        match self.range()? {
            Some(range) => Ok(self.read(range.last..=range.last)?.pop()),
            None => Ok(None),
        }
    }

    /// The saved vote.
    pub fn vote(&self) -> Result<Option<Vec<u8>>, LogError> {
        self.meta("vote")
    }

    /// The saved committed position.
    pub fn committed(&self) -> Result<Option<Vec<u8>>, LogError> {
        self.meta("committed")
    }

    /// What the last purge recorded.
    pub fn purged(&self) -> Result<Option<Vec<u8>>, LogError> {
        self.meta("purged")
    }

    /// Whether the log holds nothing at all: no entry, no vote, no
    /// committed or purged position (a log just made).
    pub fn is_blank(&self) -> Result<bool, LogError> {
        let read = || -> Result<bool, redb::Error> {
            let txn = self.db.begin_read()?;
            Ok(txn.open_table(LOG)?.is_empty()? && txn.open_table(META)?.is_empty()?)
        };
        read().map_err(|error| LogError::Read(error.to_string()))
    }

    fn meta(&self, key: &str) -> Result<Option<Vec<u8>>, LogError> {
        let read = || -> Result<Option<Vec<u8>>, redb::Error> {
            let txn = self.db.begin_read()?;
            let table = txn.open_table(META)?;
            Ok(table.get(key)?.map(|value| value.value().to_vec()))
        };
        read().map_err(|error| LogError::Read(error.to_string()))
    }

    /// Waits until every queued write is done, then closes the file.
    pub fn close(mut self) {
        self.stop_writer();
    }

    fn stop_writer(&mut self) {
        self.queue.take();
        if let Some(writer) = self.writer.take() {
            // Dropped by a completion on the writer thread itself, it cannot
            // wait for itself: it ends once it has answered its queue.
            if writer.thread().id() != std::thread::current().id() {
                let _ = writer.join();
            }
        }
    }
}

impl Drop for LogFile {
    fn drop(&mut self) {
        self.stop_writer();
    }
}

/// Makes a new log at `path` whole (module docs, step 5).
fn create_whole(path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let new = path.with_extension("redb.new");
    // What a crash during an earlier creation left.
    match std::fs::remove_file(&new) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error.into()),
        _ => {}
    }
    private_file().write(true).create_new(true).open(&new)?;
    let db = Database::create(&new)?;
    let txn = db.begin_write()?;
    txn.open_table(LOG)?;
    txn.open_table(META)?;
    txn.commit()?;
    drop(db);
    std::fs::rename(&new, path)?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))?;
    Ok(())
}

/// Two completions of which `done` is called once both were, with the
/// first error if any.
fn completion_pair(done: Completion) -> (Completion, Completion) {
    let (first_done, first_result) = std::sync::mpsc::channel();
    let first: Completion = Box::new(move |result| {
        let _ = first_done.send(result);
    });
    let then: Completion = Box::new(move |result| {
        let first = first_result.recv().unwrap_or(Err(LogError::Closed));
        done(first.and(result));
    });
    (first, then)
}

/// The writer thread (module docs, steps 1, 2 and 4).
fn write_loop(db: &Database, path: &Path, queued: &Receiver<(Write, Completion)>, fatal: &FatalHandler) {
    let mut stopped: Option<String> = None;
    while let Ok(first) = queued.recv() {
        let mut group = vec![first];
        group.extend(queued.try_iter());
        if let Some(why) = &stopped {
            group.into_iter().for_each(|(_, done)| done(Err(LogError::Stopped(why.clone()))));
            continue;
        }
        let durable = group.iter().any(|(write, _)| needs_sync(write));
        match commit(db, group.iter().map(|(write, _)| write), durable) {
            Ok(()) => group.into_iter().for_each(|(_, done)| done(Ok(()))),
            Err(error) => {
                let what = format!("writing the raft log {}", path.display());
                let why = format!("{what}: {error}");
                tracing::error!(%why, "the raft log stops taking writes");
                group.into_iter().for_each(|(_, done)| done(Err(LogError::Stopped(why.clone()))));
                stopped = Some(why);
                fatal(&FatalError { what, source: std::io::Error::other(error.to_string()) });
            }
        }
    }
}

fn needs_sync(write: &Write) -> bool {
    match write {
        Write::Append(_) | Write::Truncate { .. } => true,
        Write::Meta { durable, .. } => *durable,
        Write::Purge { .. } => false,
    }
}

/// Writes `writes` in one transaction; one fsync if `durable`.
fn commit<'a>(db: &Database, writes: impl Iterator<Item = &'a Write>, durable: bool) -> Result<(), redb::Error> {
    let mut txn = db.begin_write()?;
    txn.set_durability(if durable { Durability::Immediate } else { Durability::None })?;
    {
        let mut log = txn.open_table(LOG)?;
        let mut meta = txn.open_table(META)?;
        for write in writes {
            match write {
                Write::Append(entries) => {
                    for (index, bytes) in entries {
                        log.insert(*index, bytes.as_slice())?;
                    }
                }
                Write::Meta { key, value, .. } => {
                    meta.insert(*key, value.as_slice())?;
                }
                Write::Truncate { from } => log.retain_in(*from.., |_, _| false)?,
                Write::Purge { upto } => log.retain_in(..=*upto, |_, _| false)?,
            }
        }
    }
    txn.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use super::*;

    fn ignore_fatal() -> FatalHandler {
        Arc::new(|_: &FatalError| {})
    }

    /// Runs a write and waits for its completion.
    fn wait(write: impl FnOnce(Completion)) -> Result<(), LogError> {
        let (done, result) = std::sync::mpsc::channel();
        write(Box::new(move |outcome| {
            let _ = done.send(outcome);
        }));
        result.recv().expect("every write is answered")
    }

    fn entries(range: std::ops::RangeInclusive<u64>) -> Vec<(u64, Vec<u8>)> {
        range.map(|index| (index, index.to_le_bytes().to_vec())).collect()
    }

    #[test]
    fn writes_survive_a_reopen_and_reads_see_them_in_order() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("log.redb");
        let log = LogFile::open(&path, ignore_fatal()).expect("opens");
        wait(|done| log.append(entries(1..=10), done)).expect("appends");
        wait(|done| log.save_vote(b"vote".to_vec(), done)).expect("vote");
        wait(|done| log.truncate(8, done)).expect("truncates");
        wait(|done| log.purge(3, b"3".to_vec(), done)).expect("purges");
        wait(|done| log.save_committed(b"7".to_vec(), done)).expect("committed");
        // The last two writes needed no fsync; an append after them makes them durable.
        wait(|done| log.append(entries(8..=9), done)).expect("appends");
        log.close();

        let log = LogFile::open(&path, ignore_fatal()).expect("reopens");
        assert_eq!(log.range().expect("reads"), Some(LogRange { first: 4, last: 9 }));
        assert_eq!(log.read(5..7).expect("reads"), entries(5..=6));
        assert_eq!(log.last().expect("reads"), Some((9, 9u64.to_le_bytes().to_vec())));
        assert_eq!(log.vote().expect("reads"), Some(b"vote".to_vec()));
        assert_eq!(log.committed().expect("reads"), Some(b"7".to_vec()));
        assert_eq!(log.purged().expect("reads"), Some(b"3".to_vec()));
    }

    #[test]
    fn concurrent_appends_are_all_answered_in_order() {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = LogFile::open(&dir.path().join("log.redb"), ignore_fatal()).expect("opens");
        let (done, answers) = std::sync::mpsc::channel();
        for index in 1..=200u64 {
            let done = done.clone();
            log.append(entries(index..=index), Box::new(move |result| done.send((index, result)).expect("test alive")));
        }
        let answered: Vec<u64> = (0..200)
            .map(|_| answers.recv().expect("answered"))
            .map(|(index, result)| {
                result.expect("durable");
                index
            })
            .collect();
        assert_eq!(answered, (1..=200).collect::<Vec<_>>(), "answered in the order queued");
        assert_eq!(log.range().expect("reads"), Some(LogRange { first: 1, last: 200 }));
    }

    #[test]
    fn a_second_process_cannot_open_a_log_in_use() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("log.redb");
        let _log = LogFile::open(&path, ignore_fatal()).expect("opens");
        let error = LogFile::open(&path, ignore_fatal()).expect_err("in use");
        assert!(error.to_string().contains("log.redb"), "{error}");
    }

    #[test]
    fn a_write_after_close_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut log = LogFile::open(&dir.path().join("log.redb"), ignore_fatal()).expect("opens");
        log.stop_writer();
        assert!(matches!(wait(|done| log.append(entries(1..=1), done)), Err(LogError::Closed)));
    }

    /// Memory whose fsync fails once told to.
    #[derive(Debug)]
    struct FailingSync {
        inner: redb::backends::InMemoryBackend,
        fail: Arc<AtomicBool>,
    }

    impl redb::StorageBackend for FailingSync {
        fn len(&self) -> Result<u64, std::io::Error> {
            self.inner.len()
        }

        fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
            self.inner.read(offset, out)
        }

        fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
            self.inner.set_len(len)
        }

        fn sync_data(&self) -> Result<(), std::io::Error> {
            if self.fail.load(Ordering::SeqCst) {
                return Err(std::io::Error::other("injected fsync failure"));
            }
            self.inner.sync_data()
        }

        fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
            self.inner.write(offset, data)
        }
    }

    #[test]
    fn a_failed_fsync_stops_the_log_and_calls_the_fatal_handler_once() {
        let fail = Arc::new(AtomicBool::new(false));
        let backend = FailingSync { inner: redb::backends::InMemoryBackend::new(), fail: fail.clone() };
        let db = Database::builder().create_with_backend(backend).expect("an in-memory database");
        let fatal_calls = Arc::new(AtomicUsize::new(0));
        let handler: FatalHandler = {
            let fatal_calls = fatal_calls.clone();
            Arc::new(move |error: &FatalError| {
                assert!(error.to_string().contains("injected fsync failure"), "{error}");
                fatal_calls.fetch_add(1, Ordering::SeqCst);
            })
        };
        let log = LogFile::start(Path::new("memory"), db, handler).expect("starts");
        wait(|done| log.append(entries(1..=2), done)).expect("durable while fsync works");

        fail.store(true, Ordering::SeqCst);
        let failed = wait(|done| log.append(entries(3..=3), done));
        assert!(matches!(failed, Err(LogError::Stopped(_))), "{failed:?}");
        fail.store(false, Ordering::SeqCst);
        let later = wait(|done| log.append(entries(3..=3), done));
        assert!(matches!(later, Err(LogError::Stopped(_))), "no write is taken after a failed fsync: {later:?}");
        assert!(matches!(wait(|done| log.save_vote(vec![1], done)), Err(LogError::Stopped(_))));
        assert_eq!(fatal_calls.load(Ordering::SeqCst), 1);
        assert_eq!(log.range().expect("reads"), Some(LogRange { first: 1, last: 2 }), "the failed append is not there");
    }
}
