//! openraft's state machine over the engine's [`StateStore`], with
//! snapshots as files (openraft's "persist every snapshot" mode: applying
//! writes nothing to disk; start-up rebuilds from the newest snapshot and
//! the log after it).
//!
//! Contract:
//! 1. Applying an entry applies each command of its batch at the store's
//!    next index (the index rule: the store counts commands, so a raft
//!    entry of k commands moves it by k, a blank or membership entry not at
//!    all), then records the entry's log id as applied. The store's apply
//!    hook (the leader's router) runs after each command.
//! 2. Only this state machine writes to the store, so the store's O(1)
//!    snapshot and the last applied log id, taken together between two
//!    applies ([`StateMachine::get_snapshot_builder`]), describe one point
//!    of the log. The builder encodes that snapshot on a blocking thread
//!    while applying goes on, and writes it as a file (`storage`).
//! 3. A snapshot file's meta is a [`SnapshotHeader`]: the raft position
//!    and membership, and the store index that position corresponds to.
//! 4. Opening loads the newest snapshot that verifies and decodes; each
//!    newer one that does not is refused (no longer listed, left on disk
//!    as it is) and named in the [`Recovery`], and the log (kept from the
//!    older snapshot on) fills in. The server renames the refused files
//!    to `.corrupt` only once it has started (`storage`'s snapshot docs).
//! 5. If the store refuses a command because it is shutting down, the
//!    state machine fails the apply and builds no snapshot from then on:
//!    the store may hold part of a batch that the applied log id does not
//!    cover.

use std::io::SeekFrom;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::state::{Snapshot, StateError, StateStore};
use openraft::storage::{RaftStateMachine, Snapshot as RaftSnapshot};
use openraft::{EntryPayload, RaftSnapshotBuilder, SnapshotMeta, StorageIOError};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use storage::{SnapshotDir, SnapshotInfo};
use tokio::io::AsyncSeekExt;

use crate::types::{BatchResponse, CommandBatch, Entry, LogId, StorageError, StoredMembership, TypeConfig};

/// The meta of a snapshot file (contract, step 3).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotHeader {
    /// The last raft entry the snapshot includes.
    pub last_log_id: Option<LogId>,
    /// The membership as of that entry.
    pub membership: StoredMembership,
    /// openraft's snapshot id.
    pub snapshot_id: String,
    /// The store's index at that entry.
    pub store_index: u64,
}

impl SnapshotHeader {
    fn meta(&self) -> SnapshotMeta<u64, crate::types::ServerNode> {
        SnapshotMeta {
            last_log_id: self.last_log_id,
            last_membership: self.membership.clone(),
            snapshot_id: self.snapshot_id.clone(),
        }
    }

    /// The header of a snapshot file's meta bytes.
    pub fn decode(bytes: &[u8]) -> Result<SnapshotHeader, postcard::Error> {
        postcard::from_bytes(bytes)
    }
}

/// What opening found on disk (contract, step 4).
#[derive(Clone, Debug, Default)]
pub struct Recovery {
    /// The snapshot the state was loaded from, if any.
    pub snapshot: Option<SnapshotInfo>,
    /// Its header.
    pub header: SnapshotHeader,
    /// Newer snapshots that were refused, each with its file and why.
    pub refused: Vec<String>,
    /// How long loading the snapshot took.
    pub load_time: Duration,
}

/// The newest snapshot written or installed, with how long it took.
#[derive(Clone, Debug)]
pub struct CurrentSnapshot {
    /// Its header.
    pub header: SnapshotHeader,
    /// Its file.
    pub info: SnapshotInfo,
    /// How long encoding and writing it took (zero when loaded at start).
    pub write_time: Duration,
}

/// Where the state machine is in the log.
#[derive(Clone, Debug, Default)]
struct Position {
    last_applied: Option<LogId>,
    membership: StoredMembership,
}

#[derive(Debug)]
struct Shared {
    store: Arc<StateStore>,
    snapshots: SnapshotDir,
    position: Mutex<Position>,
    current: Mutex<Option<CurrentSnapshot>>,
    /// Set when an apply failed part-way (contract, step 5).
    broken: AtomicBool,
}

/// The state machine (module docs). Cheap to clone: openraft owns one,
/// the server keeps another to read the store and the current snapshot.
#[derive(Clone, Debug)]
pub struct StateMachine {
    shared: Arc<Shared>,
}

impl StateMachine {
    /// Loads the newest usable snapshot in `snapshots` (contract, step 4).
    pub fn open(snapshots: SnapshotDir) -> std::io::Result<(StateMachine, Recovery)> {
        let started = Instant::now();
        let mut recovery = Recovery::default();
        let mut state = None;
        for info in snapshots.list()? {
            match load(&info) {
                Ok((header, snapshot)) => {
                    state = Some((info, header, snapshot));
                    break;
                }
                Err(why) => {
                    tracing::error!(snapshot = %info.path.display(), %why, "refusing a snapshot; falling back to the one before it and the longer log");
                    snapshots.refuse(&info);
                    recovery.refused.push(why.to_string());
                }
            }
        }
        let (store, position, current) = match state {
            Some((info, header, snapshot)) => {
                let position = Position { last_applied: header.last_log_id, membership: header.membership.clone() };
                recovery.snapshot = Some(info.clone());
                recovery.header = header.clone();
                let current = CurrentSnapshot { header, info, write_time: Duration::ZERO };
                (StateStore::restored(snapshot), position, Some(current))
            }
            None => (StateStore::new(), Position::default(), None),
        };
        recovery.load_time = started.elapsed();
        let shared = Shared {
            store: Arc::new(store),
            snapshots,
            position: Mutex::new(position),
            current: Mutex::new(current),
            broken: AtomicBool::new(false),
        };
        Ok((StateMachine { shared: Arc::new(shared) }, recovery))
    }

    /// The store it applies to.
    pub fn store(&self) -> &Arc<StateStore> {
        &self.shared.store
    }

    /// The newest snapshot on disk, if any.
    pub fn current_snapshot(&self) -> Option<CurrentSnapshot> {
        self.shared.current.lock().clone()
    }

    /// The last applied raft entry.
    pub fn last_applied(&self) -> Option<LogId> {
        self.shared.position.lock().last_applied
    }

    /// The snapshot directory.
    pub fn snapshots(&self) -> &SnapshotDir {
        &self.shared.snapshots
    }

    /// Applies one batch's commands (contract, steps 1 and 5).
    fn apply_batch(&self, log_id: LogId, batch: CommandBatch) -> Result<BatchResponse, StorageError> {
        let store = &self.shared.store;
        let mut results = Vec::with_capacity(batch.0.len());
        for command in batch.0 {
            let command = Arc::unwrap_or_clone(command);
            match store.apply_at(store.latest_index() + 1, command) {
                Err(StateError::ShuttingDown) => {
                    self.shared.broken.store(true, Ordering::Release);
                    return Err(StorageIOError::apply(log_id, &StateError::ShuttingDown).into());
                }
                result => results.push(result),
            }
        }
        Ok(BatchResponse(results))
    }
}

/// Why a snapshot file was not loaded; the message names the file.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read, or did not verify (its checksum, its format).
    #[error(transparent)]
    File(#[from] storage::SnapshotError),
    /// Its header did not decode.
    #[error("snapshot {path}: its header: {source}")]
    Header {
        /// The file.
        path: PathBuf,
        /// What postcard found wrong.
        source: postcard::Error,
    },
    /// Its body did not decode.
    #[error("snapshot {path}: its body: {source}")]
    Body {
        /// The file.
        path: PathBuf,
        /// What the engine's decoder found wrong.
        source: engine::state::PersistError,
    },
    /// Its body and its header name different store indexes.
    #[error("snapshot {path}: its body is at index {body} but its header says {header}")]
    IndexMismatch {
        /// The file.
        path: PathBuf,
        /// The body's store index.
        body: u64,
        /// The header's.
        header: u64,
    },
}

/// Verifies and decodes one snapshot file.
fn load(info: &SnapshotInfo) -> Result<(SnapshotHeader, Snapshot), LoadError> {
    let mut verified = storage::verify(info)?;
    let path = || info.path.clone();
    let header = SnapshotHeader::decode(&verified.meta).map_err(|source| LoadError::Header { path: path(), source })?;
    let snapshot = Snapshot::decode(verified.body()).map_err(|source| LoadError::Body { path: path(), source })?;
    if snapshot.index() != header.store_index {
        return Err(LoadError::IndexMismatch { path: path(), body: snapshot.index(), header: header.store_index });
    }
    Ok((header, snapshot))
}

fn snapshot_error(header: &SnapshotHeader, error: impl std::fmt::Display) -> StorageError {
    let signature = header.meta().signature();
    StorageIOError::write_snapshot(Some(signature), &std::io::Error::other(error.to_string())).into()
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let position = self.shared.position.lock().clone();
        Ok((position.last_applied, position.membership))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<BatchResponse>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut responses = Vec::new();
        for entry in entries {
            let response = match entry.payload {
                EntryPayload::Blank => BatchResponse::default(),
                EntryPayload::Normal(batch) => self.apply_batch(entry.log_id, batch)?,
                EntryPayload::Membership(membership) => {
                    self.shared.position.lock().membership = StoredMembership::new(Some(entry.log_id), membership);
                    BatchResponse::default()
                }
            };
            self.shared.position.lock().last_applied = Some(entry.log_id);
            responses.push(response);
        }
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        let position = self.shared.position.lock().clone();
        SnapshotBuilder { machine: self.clone(), state: self.shared.store.snapshot(), position }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<tokio::fs::File>, StorageError> {
        let path = self.shared.snapshots.path().join("receiving.snap.tmp");
        // openraft writes the chunks into it; installing reads it back.
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(storage::FILE_MODE)
            .open(&path)
            .await
            .map_err(|error| StorageIOError::write_snapshot(None, &error))?;
        Ok(Box::new(file))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, crate::types::ServerNode>,
        mut snapshot: Box<tokio::fs::File>,
    ) -> Result<(), StorageError> {
        let header = SnapshotHeader {
            last_log_id: meta.last_log_id,
            membership: meta.last_membership.clone(),
            snapshot_id: meta.snapshot_id.clone(),
            store_index: 0,
        };
        let received = self.shared.snapshots.path().join(format!("received-{}.snap.tmp", std::process::id()));
        let copy = async {
            snapshot.seek(SeekFrom::Start(0)).await?;
            let mut out = tokio::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(storage::FILE_MODE)
                .open(&received)
                .await?;
            tokio::io::copy(&mut *snapshot, &mut out).await?;
            out.sync_all().await
        };
        copy.await.map_err(|error| snapshot_error(&header, error))?;
        let machine = self.clone();
        let index = meta.last_log_id.map_or(0, |log_id| log_id.index);
        let installed = tokio::task::spawn_blocking(move || -> Result<CurrentSnapshot, LoadError> {
            let info = machine.shared.snapshots.import(&received, index)?;
            let _ = std::fs::remove_file(&received);
            let (header, state) = load(&info)?;
            machine.shared.store.install(state);
            Ok(CurrentSnapshot { header, info, write_time: Duration::ZERO })
        });
        let current = installed
            .await
            .map_err(|error| snapshot_error(&header, error))?
            .map_err(|error| snapshot_error(&header, error))?;
        *self.shared.position.lock() =
            Position { last_applied: current.header.last_log_id, membership: current.header.membership.clone() };
        *self.shared.current.lock() = Some(current);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<RaftSnapshot<TypeConfig>>, StorageError> {
        let Some(current) = self.current_snapshot() else { return Ok(None) };
        let file =
            tokio::fs::File::open(&current.info.path).await.map_err(|error| snapshot_error(&current.header, error))?;
        Ok(Some(RaftSnapshot { meta: current.header.meta(), snapshot: Box::new(file) }))
    }
}

/// Builds one snapshot from the store's snapshot taken with its position
/// (contract, step 2).
#[derive(Debug)]
pub struct SnapshotBuilder {
    machine: StateMachine,
    state: Arc<Snapshot>,
    position: Position,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<RaftSnapshot<TypeConfig>, StorageError> {
        let last = self.position.last_applied;
        let header = SnapshotHeader {
            last_log_id: last,
            membership: self.position.membership.clone(),
            snapshot_id: match last {
                Some(log_id) => format!("{}-{}-{}", log_id.leader_id.term, log_id.index, self.state.index()),
                None => format!("empty-{}", self.state.index()),
            },
            store_index: self.state.index(),
        };
        if self.machine.shared.broken.load(Ordering::Acquire) {
            return Err(snapshot_error(&header, "the store stopped part-way through an entry"));
        }
        let started = Instant::now();
        let meta = postcard::to_allocvec(&header).expect("a header always encodes");
        let (machine, state) = (self.machine.clone(), self.state.clone());
        let index = last.map_or(0, |log_id| log_id.index);
        let written =
            tokio::task::spawn_blocking(move || machine.shared.snapshots.write(index, &meta, |out| state.encode(out)));
        let info = written
            .await
            .map_err(|error| snapshot_error(&header, error))?
            .map_err(|error| snapshot_error(&header, error))?;
        let current = CurrentSnapshot { header: header.clone(), info, write_time: started.elapsed() };
        tracing::info!(
            index = current.info.index,
            store_index = header.store_index,
            bytes = current.info.size,
            took = ?current.write_time,
            "snapshot written"
        );
        let file = tokio::fs::File::open(&current.info.path).await.map_err(|error| snapshot_error(&header, error))?;
        *self.machine.shared.current.lock() = Some(current);
        Ok(RaftSnapshot { meta: header.meta(), snapshot: Box::new(file) })
    }
}
