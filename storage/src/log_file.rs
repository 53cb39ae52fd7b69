//! The raft log, its vote and committed position: an append-only,
//! segmented write-ahead log (the design of etcd's WAL and hashicorp's
//! raft-wal), written by one thread with group commit.
//!
//! Contract:
//! 1. Every write (append, vote, committed, truncate, purge) is queued to
//!    the writer thread and done in the order it was queued; its
//!    [`Completion`] is called once it is durable, or failed.
//! 2. Group commit: the writer takes everything queued since its last
//!    batch, encodes it into one buffer and writes it with one write and
//!    one `fdatasync` when any of it must be durable (appends, votes,
//!    truncations, and a purge that deletes segments). When none must (the
//!    committed position, other purges) it answers at once and keeps the
//!    bytes for the next batch that syncs, or for [`LogFile::close`]: a
//!    segment is only ever written after its last write was synced, so a
//!    crash can tear only the last batch (`wal_segment.rs`).
//! 3. Reads see what was answered: a batch's entries, vote and positions
//!    become readable once it is durable and before its completions are
//!    called (the replication layer keeps what it appended readable before
//!    that). Reads take a read lock only to find where entries are, then
//!    read the segment files without it.
//! 4. A failed write, fsync, rotation or segment deletion is fatal (crate
//!    docs): the writer answers that batch and every later write with
//!    [`LogError::Stopped`] and calls the [`FatalHandler`] once.
//! 5. A new log appears whole: its directory is made as `<name>.new`
//!    (owner-only, [`crate::DIR_MODE`]), given its first segment, synced and
//!    renamed into place, so an empty or half-made log is never one this
//!    crate left (the data dir's check relies on it,
//!    [`crate::DataDir::open_log`]).
//! 6. One user at a time: the directory is locked (`flock`) while open; a
//!    second open fails with [`LogError::Open`].
//!
//! Layout: a directory of segment files (format in `wal_segment.rs`). The
//! writer appends to the last one; once it passes 64 MiB the next batch
//! starts a new segment, made as `<name>.tmp` with the vote, committed and
//! purged positions restated, synced, renamed, the directory synced, so
//! every older segment holds nothing but entries the log may still need.
//! A purge records its position, then deletes (oldest first, syncing the
//! directory after each so a crash leaves a contiguous run) every segment
//! before the one holding the first entry left; the entries it purged in
//! a segment it keeps are hidden by the in-memory index. A truncation is a
//! record; replay drops the entries it removed.
//!
//! Opening replays every segment in order, checking each record's
//! checksum and each segment's sequence. A damaged last batch of the last
//! segment is a crash mid-write: the file is cut there (with a warning
//! saying how many bytes) and the log opens. Any other damage (a damaged
//! batch followed by a whole one, damage in an older segment, a missing
//! segment) refuses the open with [`LogError::Open`] naming the file and
//! the offset: cutting there could drop acknowledged writes.
//!
//! Why deferring unsynced writes rather than writing them at once (as the
//! redb log did with `Durability::None`): a write that is not synced before
//! the next one is written makes a crash able to tear two batches, and a
//! whole batch after a torn one would be indistinguishable from
//! corruption. Why no preallocation: the length a write adds is made
//! durable by the same `fdatasync`, and a preallocated, zero-filled tail
//! would have to be told from a torn one on every open.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::ops::{Bound, RangeBounds};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam::channel::{Receiver, Sender};
use parking_lot::RwLock;

use crate::data_dir::{create_private_dir, private_file, tighten};
use crate::wal_segment::{self, Record, HEADER_LEN, RECORD_HEADER_LEN};
use crate::{sync_dir, FatalError, FatalHandler, DIR_MODE, FILE_MODE};

/// A segment past this size is followed by a new one.
const SEGMENT_SIZE: u64 = 64 << 20;

/// Called once a queued write is durable, or failed.
pub type Completion = Box<dyn FnOnce(Result<(), LogError>) + Send>;

/// Why the log could not be read or written.
#[derive(Clone, Debug, thiserror::Error)]
pub enum LogError {
    /// The log could not be opened (another process holds it, or it is
    /// not a log, or it is corrupt).
    #[error("opening the raft log {path}: {reason}")]
    Open {
        /// The log's directory.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A read failed.
    #[error("reading the raft log: {0}")]
    Read(String),
    /// A write broke the log's rules (an append that does not follow the
    /// last entry); nothing of it was written and the log goes on.
    #[error("the raft log refused a write: {0}")]
    Refused(String),
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
    Vote(Vec<u8>),
    Committed(Vec<u8>),
    Truncate { from: u64 },
    Purge { upto: u64, purged: Vec<u8> },
}

/// The file operations of the writer that make data durable: behind a
/// trait so a test can make them fail.
pub(crate) trait Disk: Send + Sync {
    /// Writes all of `bytes` at `offset`.
    fn write_all_at(&self, file: &File, bytes: &[u8], offset: u64) -> std::io::Result<()>;
    /// `fdatasync`.
    fn sync_data(&self, file: &File) -> std::io::Result<()>;
}

/// The real disk.
#[derive(Debug)]
pub(crate) struct RealDisk;

impl Disk for RealDisk {
    fn write_all_at(&self, file: &File, bytes: &[u8], offset: u64) -> std::io::Result<()> {
        file.write_all_at(bytes, offset)
    }

    fn sync_data(&self, file: &File) -> std::io::Result<()> {
        file.sync_data()
    }
}

/// How a log is opened: the defaults, or a test's.
pub(crate) struct Options {
    /// A segment past this size is followed by a new one.
    pub segment_size: u64,
    /// The writer's file operations.
    pub disk: Arc<dyn Disk>,
}

impl Default for Options {
    fn default() -> Options {
        Options { segment_size: SEGMENT_SIZE, disk: Arc::new(RealDisk) }
    }
}

/// One segment file, open for reading (and, the last one, writing).
#[derive(Debug)]
struct Segment {
    /// The sequence of its first record (its name).
    first: u64,
    path: PathBuf,
    file: File,
}

/// Where an entry's record is.
#[derive(Clone, Copy, Debug)]
struct Location {
    /// The segment's first sequence.
    segment: u64,
    /// The record's offset in it.
    offset: u64,
    /// The record's payload length.
    len: u32,
}

impl Location {
    fn end(&self) -> u64 {
        self.offset + RECORD_HEADER_LEN as u64 + u64::from(self.len)
    }
}

/// What readers see (module docs, step 3).
#[derive(Debug, Default)]
struct State {
    /// The index of `entries[0]`.
    first_index: u64,
    /// Where each entry is, by index from `first_index` on (contiguous).
    entries: VecDeque<Location>,
    vote: Option<Vec<u8>>,
    committed: Option<Vec<u8>>,
    purged: Option<(u64, Vec<u8>)>,
    /// Every segment, by first sequence.
    segments: BTreeMap<u64, Arc<Segment>>,
}

impl State {
    fn range(&self) -> Option<LogRange> {
        let last = self.first_index + self.entries.len() as u64;
        (!self.entries.is_empty()).then(|| LogRange { first: self.first_index, last: last - 1 })
    }

    /// Adds the entry `index`, which must follow the last one (any index
    /// does when the log holds none).
    fn push(&mut self, index: u64, location: Location) -> Result<(), String> {
        match self.range() {
            Some(range) if index != range.last + 1 => {
                return Err(format!("entry {index} does not follow the last entry, {}", range.last));
            }
            Some(_) => {}
            None => self.first_index = index,
        }
        self.entries.push_back(location);
        Ok(())
    }

    fn truncate(&mut self, from: u64) {
        let keep = from.saturating_sub(self.first_index);
        self.entries.truncate(usize::try_from(keep).unwrap_or(usize::MAX));
    }

    fn purge(&mut self, upto: u64, bytes: Vec<u8>) {
        let drop = (upto + 1).saturating_sub(self.first_index).min(self.entries.len() as u64);
        self.entries.drain(..drop as usize);
        self.first_index += drop;
        self.purged = Some((upto, bytes));
    }

    /// Applies a replayed record.
    fn apply(&mut self, segment: u64, offset: u64, record: &Record<'_>) -> Result<(), String> {
        match *record {
            Record::Entry { index, bytes } => {
                let len = Record::entry_len(bytes) as u32;
                self.push(index, Location { segment, offset, len })?;
            }
            Record::Vote(bytes) => self.vote = Some(bytes.to_vec()),
            Record::Committed(bytes) => self.committed = Some(bytes.to_vec()),
            Record::Purged { upto, bytes } => self.purge(upto, bytes.to_vec()),
            Record::Truncate { from } => self.truncate(from),
            Record::Commit { .. } => {}
        }
        Ok(())
    }
}

/// The raft log (module docs).
pub struct LogFile {
    path: PathBuf,
    state: Arc<RwLock<State>>,
    queue: Option<Sender<(Write, Completion)>>,
    writer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for LogFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogFile").field("path", &self.path).finish_non_exhaustive()
    }
}

impl LogFile {
    /// Opens (or creates, module docs step 5) the log in the directory
    /// `path`, replaying it; `fatal` runs if a write fails.
    pub fn open(path: &Path, fatal: FatalHandler) -> Result<LogFile, LogError> {
        LogFile::open_with(path, fatal, Options::default())
    }

    /// [`LogFile::open`] with a test's segment size or disk.
    pub(crate) fn open_with(path: &Path, fatal: FatalHandler, options: Options) -> Result<LogFile, LogError> {
        let open_error = |reason: String| LogError::Open { path: path.to_path_buf(), reason };
        if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
            create_private_dir(parent).map_err(|error| open_error(error.to_string()))?;
        }
        if !path.exists() {
            create_whole(path).map_err(|error| open_error(format!("creating it: {error}")))?;
        }
        // A log an older build made readable to others is tightened.
        tighten(path, DIR_MODE).map_err(|error| open_error(error.to_string()))?;
        let lock = File::open(path).map_err(|error| open_error(error.to_string()))?;
        lock.try_lock().map_err(|error| match error {
            std::fs::TryLockError::WouldBlock => open_error("it is in use (another server holds it open)".into()),
            std::fs::TryLockError::Error(error) => open_error(format!("locking it: {error}")),
        })?;
        let (state, tail) = replay(path).map_err(open_error)?;
        let state = Arc::new(RwLock::new(state));
        let writer = Writer::new(path, state.clone(), tail, lock, options);
        let (queue, queued) = crossbeam::channel::unbounded();
        let writer = std::thread::Builder::new()
            .name("raft-log-writer".into())
            .spawn(move || write_loop(writer, &queued, &fatal))
            .map_err(|error| open_error(error.to_string()))?;
        Ok(LogFile { path: path.to_path_buf(), state, queue: Some(queue), writer: Some(writer) })
    }

    /// The log's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Queues `entries` (index, bytes), which must follow the last entry
    /// (any index when the log holds none); an append that does not is
    /// answered with [`LogError::Refused`].
    pub fn append(&self, entries: Vec<(u64, Vec<u8>)>, done: Completion) {
        self.queue(Write::Append(entries), done);
    }

    /// Queues the vote; `done` once it is durable.
    pub fn save_vote(&self, vote: Vec<u8>, done: Completion) {
        self.queue(Write::Vote(vote), done);
    }

    /// Queues the committed position (durable with the next synced write).
    pub fn save_committed(&self, committed: Vec<u8>, done: Completion) {
        self.queue(Write::Committed(committed), done);
    }

    /// Queues the removal of every entry from `from` on.
    pub fn truncate(&self, from: u64, done: Completion) {
        self.queue(Write::Truncate { from }, done);
    }

    /// Queues the removal of every entry up to `upto`, recording `purged`
    /// (the caller's description of the last purged entry).
    pub fn purge(&self, upto: u64, purged: Vec<u8>, done: Completion) {
        self.queue(Write::Purge { upto, purged }, done);
    }

    fn queue(&self, write: Write, done: Completion) {
        let Some(queue) = &self.queue else { return done(Err(LogError::Closed)) };
        if let Err(crossbeam::channel::SendError((_, done))) = queue.send((write, done)) {
            done(Err(LogError::Closed));
        }
    }

    /// The entries whose index is in `range`, in order.
    pub fn read(&self, range: impl RangeBounds<u64>) -> Result<Vec<(u64, Vec<u8>)>, LogError> {
        let (first, locations, segments) = {
            let state = self.state.read();
            let Some(held) = state.range() else { return Ok(Vec::new()) };
            let start = match range.start_bound() {
                Bound::Included(start) => *start,
                Bound::Excluded(start) => start.saturating_add(1),
                Bound::Unbounded => 0,
            }
            .max(held.first);
            let end = match range.end_bound() {
                Bound::Included(end) => *end,
                Bound::Excluded(0) => return Ok(Vec::new()),
                Bound::Excluded(end) => end - 1,
                Bound::Unbounded => u64::MAX,
            }
            .min(held.last);
            if start > end {
                return Ok(Vec::new());
            }
            let from = (start - held.first) as usize;
            let locations: Vec<Location> = state.entries.range(from..=(end - held.first) as usize).copied().collect();
            let mut segments = BTreeMap::new();
            for location in &locations {
                if let std::collections::btree_map::Entry::Vacant(slot) = segments.entry(location.segment) {
                    slot.insert(
                        state.segments.get(&location.segment).expect("an indexed entry's segment is open").clone(),
                    );
                }
            }
            (start, locations, segments)
        };
        read_entries(first, &locations, &segments)
    }

    /// The first and last index held, if any.
    pub fn range(&self) -> Result<Option<LogRange>, LogError> {
        Ok(self.state.read().range())
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
        Ok(self.state.read().vote.clone())
    }

    /// The saved committed position.
    pub fn committed(&self) -> Result<Option<Vec<u8>>, LogError> {
        Ok(self.state.read().committed.clone())
    }

    /// What the last purge recorded.
    pub fn purged(&self) -> Result<Option<Vec<u8>>, LogError> {
        Ok(self.state.read().purged.as_ref().map(|(_, bytes)| bytes.clone()))
    }

    /// Whether the log holds nothing at all: no entry, no vote, no
    /// committed or purged position (a log just made).
    pub fn is_blank(&self) -> Result<bool, LogError> {
        let state = self.state.read();
        Ok(state.entries.is_empty() && state.vote.is_none() && state.committed.is_none() && state.purged.is_none())
    }

    /// Waits until every queued write is done and the unsynced ones are
    /// synced, then closes the log.
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

/// Reads the entries at `locations` (the first is `first`), one read for
/// each run of records lying next to each other in one segment, and checks
/// each record.
fn read_entries(
    first: u64,
    locations: &[Location],
    segments: &BTreeMap<u64, Arc<Segment>>,
) -> Result<Vec<(u64, Vec<u8>)>, LogError> {
    let mut entries = Vec::with_capacity(locations.len());
    let mut run_start = 0;
    while run_start < locations.len() {
        let mut run_end = run_start + 1;
        while run_end < locations.len()
            && locations[run_end].segment == locations[run_start].segment
            && locations[run_end].offset == locations[run_end - 1].end()
        {
            run_end += 1;
        }
        let run = &locations[run_start..run_end];
        let segment = &segments[&run[0].segment];
        let start = run[0].offset;
        let mut bytes = vec![0; (run[run.len() - 1].end() - start) as usize];
        let read_error = |why: String| LogError::Read(format!("{} at byte {start}: {why}", segment.path.display()));
        segment.file.read_exact_at(&mut bytes, start).map_err(|error| read_error(error.to_string()))?;
        for (at, location) in run.iter().enumerate() {
            let index = first + (run_start + at) as u64;
            let pos = (location.offset - start) as usize;
            match wal_segment::record_at(&bytes, pos) {
                Ok((Record::Entry { index: found, bytes }, _)) if found == index => {
                    entries.push((index, bytes.to_vec()))
                }
                Ok(_) => return Err(read_error(format!("the record of entry {index} is not that entry"))),
                Err(bad) => return Err(read_error(format!("entry {index}: {bad}"))),
            }
        }
        run_start = run_end;
    }
    Ok(entries)
}

/// Makes a new log at `path` whole (module docs, step 5).
fn create_whole(path: &Path) -> std::io::Result<()> {
    let mut new = path.as_os_str().to_owned();
    new.push(".new");
    let new = PathBuf::from(new);
    // What a crash during an earlier creation left.
    match std::fs::remove_dir_all(&new) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    create_private_dir(&new)?;
    let segment = private_file().write(true).create_new(true).open(new.join(wal_segment::segment_name(0)))?;
    segment.write_all_at(&wal_segment::header(0), 0)?;
    segment.sync_data()?;
    sync_dir(&new)?;
    std::fs::rename(&new, path)?;
    sync_dir(path.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new(".")))
}

/// Where the writer goes on: the last segment, its length and the next
/// record's sequence.
struct Tail {
    segment: Arc<Segment>,
    len: u64,
    next_sequence: u64,
}

/// Replays the log in `dir` (module docs): what readers see, and the tail.
fn replay(dir: &Path) -> Result<(State, Tail), String> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|error| format!("listing it: {error}"))? {
        let entry = entry.map_err(|error| format!("listing it: {error}"))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(first) = wal_segment::parse_segment_name(&name) {
            names.push(first);
        } else if name.ends_with(".wal.tmp") {
            // A segment a crash left half made (module docs): never renamed, never used.
            std::fs::remove_file(entry.path()).map_err(|error| format!("removing {name}: {error}"))?;
        }
    }
    names.sort_unstable();
    let Some(&last_name) = names.last() else { return Err("it holds no segment".into()) };
    let mut state = State::default();
    let mut expected: Option<u64> = None;
    let mut tail = None;
    for first in names {
        let path = dir.join(wal_segment::segment_name(first));
        let name = path.display().to_string();
        if let Some(expected) = expected.filter(|expected| *expected != first) {
            return Err(format!(
                "{name} follows a segment whose records end before sequence {expected}: a segment is missing or \
                 was cut short"
            ));
        }
        tighten(&path, FILE_MODE).map_err(|error| format!("{name}: {error}"))?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|error| format!("{name}: {error}"))?;
        let bytes = std::fs::read(&path).map_err(|error| format!("reading {name}: {error}"))?;
        let is_last = first == last_name;
        let scanned = wal_segment::scan(&bytes, first, is_last).map_err(|corrupt| {
            format!(
                "{name} is corrupt at byte {}: {}. A write once synced is damaged, so the log is refused rather \
                 than cut there (acknowledged writes would be lost)",
                corrupt.offset, corrupt.why
            )
        })?;
        for (offset, record) in &scanned.records {
            state.apply(first, *offset, record).map_err(|why| format!("{name} at byte {offset}: {why}"))?;
        }
        if scanned.torn > 0 {
            tracing::warn!(
                segment = %name,
                at = scanned.end,
                cut = scanned.torn,
                "the raft log's last write was torn by a crash (it was never acknowledged): cutting {} bytes at byte {}",
                scanned.torn,
                scanned.end
            );
            file.set_len(scanned.end).map_err(|error| format!("cutting {name}: {error}"))?;
            file.sync_all().map_err(|error| format!("cutting {name}: {error}"))?;
        }
        expected = Some(first + scanned.count);
        let segment = Arc::new(Segment { first, path, file });
        state.segments.insert(first, segment.clone());
        tail = Some(Tail { segment, len: scanned.end, next_sequence: first + scanned.count });
    }
    Ok((state, tail.expect("there is a last segment")))
}

/// What a batch changes in what readers see, once it is durable.
enum Effect {
    Entries { first: u64, locations: Vec<Location> },
    Vote(Vec<u8>),
    Committed(Vec<u8>),
    Truncate { from: u64 },
    Purge { upto: u64, purged: Vec<u8> },
}

/// The writer thread's side (module docs, steps 1, 2 and 4).
struct Writer {
    dir: PathBuf,
    state: Arc<RwLock<State>>,
    disk: Arc<dyn Disk>,
    segment_size: u64,
    /// The segment written to.
    active: Arc<Segment>,
    /// Its length on disk.
    active_len: u64,
    /// The sequence of the first record not yet written.
    next_sequence: u64,
    /// Encoded records not yet written, to go at `active_len`.
    buffer: Vec<u8>,
    /// How many records `buffer` holds.
    buffered_records: u64,
    /// The range the log will hold once every encoded write is done.
    range: Option<LogRange>,
    /// Held while the log is open (module docs, step 6).
    _lock: File,
}

impl Writer {
    fn new(dir: &Path, state: Arc<RwLock<State>>, tail: Tail, lock: File, options: Options) -> Writer {
        let range = state.read().range();
        Writer {
            dir: dir.to_path_buf(),
            state,
            disk: options.disk,
            segment_size: options.segment_size,
            active: tail.segment,
            active_len: tail.len,
            next_sequence: tail.next_sequence,
            buffer: Vec::new(),
            buffered_records: 0,
            range,
            _lock: lock,
        }
    }

    /// Does one group of writes; answers each write's own refusal in the
    /// returned results, or fails as a whole.
    fn commit(&mut self, writes: &[Write]) -> std::io::Result<Vec<Result<(), LogError>>> {
        if self.buffer.is_empty() && self.active_len >= self.segment_size {
            self.rotate()?;
        }
        let mut effects = Vec::new();
        let mut results = Vec::with_capacity(writes.len());
        let mut durable = false;
        let mut purged = false;
        for write in writes {
            let result = self.encode(write, &mut effects);
            durable |= result.is_ok() && !matches!(write, Write::Committed(_) | Write::Purge { .. });
            purged |= result.is_ok() && matches!(write, Write::Purge { .. });
            results.push(result);
        }
        if durable {
            self.write_out()?;
        }
        self.publish(effects);
        if purged {
            self.delete_purged_segments()?;
        }
        Ok(results)
    }

    /// Encodes one write into the buffer and says what it changes.
    fn encode(&mut self, write: &Write, effects: &mut Vec<Effect>) -> Result<(), LogError> {
        match write {
            Write::Append(entries) => {
                let Some(first) = entries.first().map(|(index, _)| *index) else { return Ok(()) };
                self.check_follows(entries)?;
                let mut locations = Vec::with_capacity(entries.len());
                for (index, bytes) in entries {
                    let offset = self.active_len + self.buffer.len() as u64;
                    let len = u32::try_from(Record::entry_len(bytes)).expect("checked by check_follows");
                    self.put(Record::Entry { index: *index, bytes });
                    locations.push(Location { segment: self.active.first, offset, len });
                }
                let last = first + entries.len() as u64 - 1;
                self.range = Some(LogRange { first: self.range.map_or(first, |range| range.first), last });
                effects.push(Effect::Entries { first, locations });
            }
            Write::Vote(vote) => {
                self.put(Record::Vote(vote));
                effects.push(Effect::Vote(vote.clone()));
            }
            Write::Committed(committed) => {
                self.put(Record::Committed(committed));
                effects.push(Effect::Committed(committed.clone()));
            }
            Write::Truncate { from } => {
                self.put(Record::Truncate { from: *from });
                self.range = self
                    .range
                    .filter(|range| range.first < *from)
                    .map(|range| LogRange { first: range.first, last: range.last.min(from - 1) });
                effects.push(Effect::Truncate { from: *from });
            }
            Write::Purge { upto, purged } => {
                self.put(Record::Purged { upto: *upto, bytes: purged });
                self.range = self
                    .range
                    .filter(|range| range.last > *upto)
                    .map(|range| LogRange { first: range.first.max(upto + 1), last: range.last });
                effects.push(Effect::Purge { upto: *upto, purged: purged.clone() });
            }
        }
        Ok(())
    }

    /// Refuses entries that do not follow the last one, or each other, or
    /// do not fit a record, before any of them is encoded.
    fn check_follows(&self, entries: &[(u64, Vec<u8>)]) -> Result<(), LogError> {
        let mut expected = self.range.map(|range| range.last + 1);
        for (index, bytes) in entries {
            if u32::try_from(Record::entry_len(bytes)).is_err() {
                return Err(LogError::Refused(format!("entry {index} is larger than a record holds (4 GiB)")));
            }
            if expected.is_some_and(|expected| expected != *index) {
                let after =
                    self.range.map_or("the entry before it".to_string(), |range| format!("entry {}", range.last));
                return Err(LogError::Refused(format!("entry {index} does not follow {after}")));
            }
            expected = Some(index + 1);
        }
        Ok(())
    }

    fn put(&mut self, record: Record<'_>) {
        record.encode(&mut self.buffer);
        self.buffered_records += 1;
    }

    /// Ends the buffered batch with its commit, writes it with one write
    /// and syncs it with one `fdatasync` (module docs, step 2).
    fn write_out(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let batch_len = self.buffer.len() as u64;
        self.put(Record::Commit { batch_len });
        self.disk.write_all_at(&self.active.file, &self.buffer, self.active_len)?;
        self.disk.sync_data(&self.active.file)?;
        self.active_len += self.buffer.len() as u64;
        self.next_sequence += self.buffered_records;
        self.buffer.clear();
        self.buffered_records = 0;
        Ok(())
    }

    /// Makes a batch's changes visible to readers.
    fn publish(&self, effects: Vec<Effect>) {
        if effects.is_empty() {
            return;
        }
        let mut state = self.state.write();
        for effect in effects {
            match effect {
                Effect::Entries { first, locations } => {
                    for (at, location) in locations.into_iter().enumerate() {
                        state.push(first + at as u64, location).expect("the writer checked the entries follow");
                    }
                }
                Effect::Vote(vote) => state.vote = Some(vote),
                Effect::Committed(committed) => state.committed = Some(committed),
                Effect::Truncate { from } => state.truncate(from),
                Effect::Purge { upto, purged } => state.purge(upto, purged),
            }
        }
    }

    /// Deletes every segment before the one holding the first entry left
    /// (all but the active one when none is), once the purge is durable.
    fn delete_purged_segments(&mut self) -> std::io::Result<()> {
        let keep_from = {
            let state = self.state.read();
            state.entries.front().map_or(self.active.first, |location| location.segment)
        };
        let deletable: Vec<Arc<Segment>> =
            self.state.read().segments.range(..keep_from).map(|(_, segment)| segment.clone()).collect();
        if deletable.is_empty() {
            return Ok(());
        }
        self.write_out()?;
        for segment in deletable {
            std::fs::remove_file(&segment.path)?;
            // Oldest first, each deletion durable before the next: a crash
            // leaves a contiguous run of segments (module docs).
            sync_dir(&self.dir)?;
            self.state.write().segments.remove(&segment.first);
        }
        Ok(())
    }

    /// Starts a new segment restating the vote, committed and purged
    /// positions (module docs).
    fn rotate(&mut self) -> std::io::Result<()> {
        let first = self.next_sequence;
        let name = wal_segment::segment_name(first);
        let path = self.dir.join(&name);
        let temporary = self.dir.join(format!("{name}.tmp"));
        let mut bytes = wal_segment::header(first).to_vec();
        let mut records = 0;
        {
            let state = self.state.read();
            let mut put = |record: Record<'_>| {
                record.encode(&mut bytes);
                records += 1;
            };
            if let Some(vote) = &state.vote {
                put(Record::Vote(vote));
            }
            if let Some(committed) = &state.committed {
                put(Record::Committed(committed));
            }
            if let Some((upto, purged)) = &state.purged {
                put(Record::Purged { upto: *upto, bytes: purged });
            }
        }
        if records > 0 {
            let batch_len = bytes.len() as u64 - HEADER_LEN;
            Record::Commit { batch_len }.encode(&mut bytes);
            records += 1;
        }
        let file = private_file().read(true).write(true).create(true).truncate(true).open(&temporary)?;
        self.disk.write_all_at(&file, &bytes, 0)?;
        self.disk.sync_data(&file)?;
        std::fs::rename(&temporary, &path)?;
        sync_dir(&self.dir)?;
        let segment = Arc::new(Segment { first, path, file });
        self.state.write().segments.insert(first, segment.clone());
        self.active = segment;
        self.active_len = bytes.len() as u64;
        self.next_sequence = first + records;
        Ok(())
    }
}

/// The writer thread (module docs, steps 1, 2 and 4).
fn write_loop(mut writer: Writer, queued: &Receiver<(Write, Completion)>, fatal: &FatalHandler) {
    let mut stopped: Option<String> = None;
    while let Ok(first) = queued.recv() {
        let mut group = vec![first];
        group.extend(queued.try_iter());
        if let Some(why) = &stopped {
            group.into_iter().for_each(|(_, done)| done(Err(LogError::Stopped(why.clone()))));
            continue;
        }
        let (writes, completions): (Vec<Write>, Vec<Completion>) = group.into_iter().unzip();
        match writer.commit(&writes) {
            Ok(results) => completions.into_iter().zip(results).for_each(|(done, result)| done(result)),
            Err(error) => {
                let why = stop(&writer.dir, error, fatal);
                completions.into_iter().for_each(|done| done(Err(LogError::Stopped(why.clone()))));
                stopped = Some(why);
            }
        }
    }
    // Closed: what waited for a sync is made durable now (module docs, step 2).
    if stopped.is_none() {
        if let Err(error) = writer.write_out() {
            stop(&writer.dir, error, fatal);
        }
    }
}

/// Says why the log stops and calls the fatal handler (module docs, step 4).
fn stop(dir: &Path, error: std::io::Error, fatal: &FatalHandler) -> String {
    let what = format!("writing the raft log {}", dir.display());
    let why = format!("{what}: {error}");
    tracing::error!(%why, "the raft log stops taking writes");
    fatal(&FatalError { what, source: error });
    why
}

#[cfg(test)]
mod log_file_test;
