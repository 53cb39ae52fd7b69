//! openraft's log storage over the `storage` crate's write-ahead [`LogFile`].
//!
//! Contract (openraft's, `RaftLogStorage`):
//! 1. An appended entry is readable when `append` returns: it sits in an
//!    in-memory tail until the writer thread made it durable, and the
//!    flush callback is called only then (one fsync for every write
//!    queued meanwhile; see the `storage` crate).
//! 2. The vote is durable before `save_vote` returns; truncations are too;
//!    the committed position and purges ride on the next synced write.
//!    `save_committed` does not wait for the writer thread at all (a stale
//!    committed position only means recovery replays a little more of the
//!    log); the store remembers the value, so `read_committed` sees it.
//! 3. Entries are postcard-encoded openraft entries whose payload is a
//!    [`crate::types::CommandBatch`] in the engine's log format.
//! 4. Reads through the store itself are openraft's applies (and its
//!    start-up scan): a durable entry read that way leaves the tail, moved
//!    rather than copied, so the state machine gets the commands without a
//!    copy or a decode. Readers for replication copy.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{StorageIOError, Vote};
use parking_lot::Mutex;
use storage::{Completion, LogError, LogFile};

use crate::types::{Entry, LogId, StorageError, TypeConfig};

/// How many durable entries the tail keeps when nothing reads them.
const TAIL_LIMIT: usize = 4_096;

/// The raft log store (module docs). Cheap to clone.
#[derive(Clone, Debug)]
pub struct LogStore {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    file: LogFile,
    /// Appended entries not yet read by an apply (contract, steps 1 and 4).
    tail: Mutex<BTreeMap<u64, Entry>>,
    /// The highest index known durable, plus one (0: none). Shared with
    /// the append completions on their own, never with the whole store: a
    /// completion runs on the log's writer thread, and if it held the last
    /// reference to the log file, dropping it there would leave the file
    /// open after [`crate::Durable::shutdown`].
    durable_end: Arc<AtomicU64>,
    /// The committed position last saved, before the file has it (step 2).
    committed: Mutex<Option<Option<LogId>>>,
}

impl LogStore {
    /// The store over an opened log file.
    pub fn new(file: LogFile) -> LogStore {
        LogStore {
            shared: Arc::new(Shared {
                file,
                tail: Mutex::new(BTreeMap::new()),
                durable_end: Arc::new(AtomicU64::new(0)),
                committed: Mutex::new(None),
            }),
        }
    }

    /// The log file (its range, for `raft info`).
    pub fn file(&self) -> &LogFile {
        &self.shared.file
    }

    /// Entries in `range`: the tail's, and the file's for any index the
    /// tail does not hold (every entry is in one or the other). `take`
    /// moves durable entries out of the tail.
    fn entries(&self, range: impl RangeBounds<u64> + Clone, take: bool) -> Result<Vec<Entry>, StorageError> {
        let durable_end = self.shared.durable_end.load(Ordering::Acquire);
        let mut found = BTreeMap::new();
        {
            let mut tail = self.shared.tail.lock();
            let indexes: Vec<u64> = tail.range(range.clone()).map(|(index, _)| *index).collect();
            for index in indexes {
                let entry = if take && index < durable_end { tail.remove(&index) } else { tail.get(&index).cloned() };
                found.extend(entry.map(|entry| (index, entry)));
            }
        }
        if !covers(&found, &range) {
            for (index, bytes) in self.shared.file.read(range).map_err(read_error)? {
                if let std::collections::btree_map::Entry::Vacant(slot) = found.entry(index) {
                    slot.insert(decode(&bytes)?);
                }
            }
        }
        Ok(found.into_values().collect())
    }

    /// Runs a write and waits for its completion.
    async fn wait(&self, write: impl FnOnce(&LogFile, Completion)) -> Result<(), LogError> {
        let (done, outcome) = tokio::sync::oneshot::channel();
        write(
            &self.shared.file,
            Box::new(move |result| {
                let _ = done.send(result);
            }),
        );
        outcome.await.unwrap_or(Err(LogError::Closed))
    }
}

/// Whether `found` holds every index of a bounded `range`.
fn covers(found: &BTreeMap<u64, Entry>, range: &impl RangeBounds<u64>) -> bool {
    use std::ops::Bound::{Excluded, Included, Unbounded};
    let start = match range.start_bound() {
        Included(start) => *start,
        Excluded(start) => start + 1,
        Unbounded => return false,
    };
    let end = match range.end_bound() {
        Included(end) => end + 1,
        Excluded(end) => *end,
        Unbounded => return false,
    };
    end <= start || found.len() as u64 == end - start
}

fn read_error(error: LogError) -> StorageError {
    StorageIOError::read_logs(&error).into()
}

fn write_error(error: LogError) -> StorageError {
    StorageIOError::write_logs(&error).into()
}

fn decode(bytes: &[u8]) -> Result<Entry, StorageError> {
    postcard::from_bytes(bytes).map_err(|error| StorageIOError::read_logs(&error).into())
}

fn encode<T: serde::Serialize>(value: &T) -> Vec<u8> {
    postcard::to_allocvec(value).expect("raft state always encodes")
}

fn decode_meta<T: serde::de::DeserializeOwned>(bytes: Option<Vec<u8>>) -> Result<Option<T>, StorageError> {
    bytes
        .map(|bytes| postcard::from_bytes(&bytes).map_err(|error| StorageIOError::read_logs(&error).into()))
        .transpose()
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        self.entries(range, true)
    }
}

/// A reader for replication: copies, never moves (module docs, step 4).
#[derive(Clone, Debug)]
pub struct LogReader(LogStore);

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        self.0.entries(range, false)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id: Option<LogId> = decode_meta(self.shared.file.purged().map_err(read_error)?)?;
        let in_tail = self.shared.tail.lock().values().next_back().map(|entry| entry.log_id);
        let last_log_id = match in_tail {
            Some(log_id) => Some(log_id),
            None => match self.shared.file.last().map_err(read_error)? {
                Some((_, bytes)) => Some(decode(&bytes)?.log_id),
                None => last_purged_log_id,
            },
        };
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> LogReader {
        LogReader(self.clone())
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError> {
        let bytes = encode(vote);
        self.wait(|file, done| file.save_vote(bytes, done))
            .await
            .map_err(|error| StorageIOError::write_vote(&error).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError> {
        decode_meta(self.shared.file.vote().map_err(|error| StorageIOError::read_vote(&error))?)
    }

    /// Queues the committed position without waiting for it (contract,
    /// step 2). A failed write stops the log and the server (the fatal
    /// handler), as every write does.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        *self.shared.committed.lock() = Some(committed);
        self.shared.file.save_committed(encode(&committed), Box::new(|_| {}));
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        if let Some(saved) = *self.shared.committed.lock() {
            return Ok(saved);
        }
        Ok(decode_meta::<Option<LogId>>(self.shared.file.committed().map_err(read_error)?)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut encoded = Vec::new();
        {
            let mut tail = self.shared.tail.lock();
            for entry in entries {
                let index = entry.log_id.index;
                encoded.push((index, encode(&entry)));
                tail.insert(index, entry);
            }
            let durable_end = self.shared.durable_end.load(Ordering::Acquire);
            while tail.len() > TAIL_LIMIT && tail.keys().next().is_some_and(|first| *first < durable_end) {
                tail.pop_first();
            }
        }
        let Some(last) = encoded.last().map(|(index, _)| *index) else {
            callback.log_io_completed(Ok(()));
            return Ok(());
        };
        let durable_end = self.shared.durable_end.clone();
        self.shared.file.append(
            encoded,
            Box::new(move |result| {
                if result.is_ok() {
                    durable_end.fetch_max(last + 1, Ordering::AcqRel);
                }
                callback.log_io_completed(result.map_err(std::io::Error::other));
            }),
        );
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let from = log_id.index;
        drop(self.shared.tail.lock().split_off(&from));
        self.shared.durable_end.fetch_min(from, Ordering::AcqRel);
        self.wait(|file, done| file.truncate(from, done)).await.map_err(write_error)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let upto = log_id.index;
        {
            let mut tail = self.shared.tail.lock();
            let kept = tail.split_off(&(upto + 1));
            *tail = kept;
        }
        let purged = encode(&log_id);
        self.wait(|file, done| file.purge(upto, purged, done)).await.map_err(write_error)
    }
}
