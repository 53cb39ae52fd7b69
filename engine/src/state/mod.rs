//! The state store: one writer applies [`Command`]s in order, each at the
//! next index, and publishes an immutable [`Snapshot`] through `arc-swap`.
//!
//! Contract:
//! 1. [`StateStore::apply`] is the only way state changes. Commands are
//!    applied one at a time (callers on many threads queue on the writer
//!    lock), each at `latest_index() + 1`.
//! 2. A command is applied to a private clone of the newest snapshot and
//!    published only if all of it applied; a command that fails returns an
//!    error, consumes no index and changes nothing.
//! 3. [`StateStore::snapshot`] is O(1) and never waits for the writer. A
//!    snapshot never changes under its reader.
//! 4. [`StateStore::snapshot_min_index`] wakes as soon as the index is
//!    reached (notified by the writer, not polled) and tells a timeout apart
//!    from a shutdown.

mod apply;
mod command;
mod snapshot;
mod table;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::{Condvar, Mutex};

pub use command::{ClientAllocUpdate, Command};
pub use snapshot::{Snapshot, TableIndexes};
pub use table::{Iter as TableIter, Table};

use crate::structs::{AllocId, ComputedClass, EvalId, Evaluation, JobKey, Node, NodeId};

/// Why a command was refused. The state is unchanged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// The command names a node the store does not know.
    #[error("unknown node {0}")]
    UnknownNode(NodeId),
    /// The command names an allocation the store does not know.
    #[error("unknown allocation {0}")]
    UnknownAlloc(AllocId),
    /// The command names a job the store does not know.
    #[error("unknown job {0}")]
    UnknownJob(JobKey),
    /// A client reported an allocation that is placed on another node.
    #[error("allocation {alloc_id} is placed on node {placed_on}, not on the reporting node {reported_by}")]
    AllocOnOtherNode {
        /// The allocation.
        alloc_id: AllocId,
        /// The node that reported it.
        reported_by: NodeId,
        /// The node it is placed on.
        placed_on: NodeId,
    },
    /// A plan placed an allocation on a node the store does not know.
    #[error("plan of eval {eval_id} places an allocation on unknown node {node_id}")]
    PlacementOnUnknownNode {
        /// The eval whose plan it is.
        eval_id: EvalId,
        /// The node.
        node_id: NodeId,
    },
    /// The node is down or disconnected, which the change needs it not to be.
    #[error("node {node_id} is {status:?}")]
    NodeNotConnected {
        /// The node.
        node_id: NodeId,
        /// Its status.
        status: crate::structs::NodeStatus,
    },
    /// The store is shutting down and takes no more writes.
    #[error("the state store is shutting down")]
    ShuttingDown,
}

/// Why [`StateStore::snapshot_min_index`] returned without a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WaitError {
    /// The index was not reached in time.
    #[error("timed out waiting for index {wanted} (reached {reached})")]
    Timeout {
        /// The index waited for.
        wanted: u64,
        /// The index the store had reached.
        reached: u64,
    },
    /// The store shut down while waiting.
    #[error("the state store shut down while waiting for index {wanted}")]
    Shutdown {
        /// The index waited for.
        wanted: u64,
    },
}

/// A node whose free capacity grew: blocked evals of its class may now fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CapacityChange {
    /// The node.
    pub node_id: NodeId,
    /// Its computed class.
    pub computed_class: ComputedClass,
}

impl CapacityChange {
    fn of(node: &Node) -> Self {
        CapacityChange { node_id: node.id, computed_class: node.computed_class }
    }
}

/// What a command did that the rest of the server reacts to.
#[derive(Clone, Debug, Default)]
pub struct Applied {
    /// The index the command was applied at.
    pub index: u64,
    /// Evaluations the command created or updated, as stored.
    pub evals: Vec<Arc<Evaluation>>,
    /// Nodes where capacity appeared (node became ready or eligible, an
    /// allocation stopped or finished).
    pub capacity_changes: Vec<CapacityChange>,
    /// New placements of a plan left out because their node was no longer
    /// ready and eligible when the plan was written.
    pub refused_placements: Vec<AllocId>,
    /// Client alloc updates left out, with why.
    pub refused_updates: Vec<(AllocId, StateError)>,
}

/// The state store. See the module docs for its contract.
#[derive(Debug)]
pub struct StateStore {
    current: ArcSwap<Snapshot>,
    writer: Mutex<()>,
    index_reached: Mutex<()>,
    index_changed: Condvar,
    waiters: AtomicUsize,
    shutting_down: AtomicBool,
}

impl Default for StateStore {
    fn default() -> Self {
        Self::new()
    }
}

impl StateStore {
    /// An empty store at index 0.
    pub fn new() -> Self {
        StateStore {
            current: ArcSwap::from_pointee(Snapshot::default()),
            writer: Mutex::new(()),
            index_reached: Mutex::new(()),
            index_changed: Condvar::new(),
            waiters: AtomicUsize::new(0),
            shutting_down: AtomicBool::new(false),
        }
    }

    /// Applies one command at the next index and publishes the result.
    pub fn apply(&self, command: Command) -> Result<Applied, StateError> {
        let _writer = self.writer.lock();
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(StateError::ShuttingDown);
        }
        let mut next = Snapshot::clone(&self.current.load());
        let index = next.index + 1;
        let mut applied = Applied { index, ..Applied::default() };
        next.apply(index, command, &mut applied)?;
        self.current.store(Arc::new(next));
        self.notify_index();
        Ok(applied)
    }

    fn notify_index(&self) {
        let _guard = self.index_reached.lock();
        self.index_changed.notify_all();
    }

    /// The newest snapshot. O(1); never waits for the writer.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// The index of the newest snapshot.
    pub fn latest_index(&self) -> u64 {
        self.current.load().index
    }

    /// A snapshot at `index` or later, waiting up to `timeout` for the writer
    /// to get there.
    pub fn snapshot_min_index(&self, index: u64, timeout: Duration) -> Result<Arc<Snapshot>, WaitError> {
        let deadline = Instant::now() + timeout;
        let mut guard = self.index_reached.lock();
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let result = self.wait_locked(&mut guard, index, deadline);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        result
    }

    fn wait_locked(
        &self,
        guard: &mut parking_lot::MutexGuard<'_, ()>,
        index: u64,
        deadline: Instant,
    ) -> Result<Arc<Snapshot>, WaitError> {
        loop {
            let snapshot = self.snapshot();
            if snapshot.index >= index {
                return Ok(snapshot);
            }
            if self.shutting_down.load(Ordering::Acquire) {
                return Err(WaitError::Shutdown { wanted: index });
            }
            if self.index_changed.wait_until(guard, deadline).timed_out() {
                let reached = self.latest_index();
                return match reached >= index {
                    true => Ok(self.snapshot()),
                    false => Err(WaitError::Timeout { wanted: index, reached }),
                };
            }
        }
    }

    /// Refuses further writes and wakes every waiter with
    /// [`WaitError::Shutdown`].
    pub fn shutdown(&self) {
        let _writer = self.writer.lock();
        self.shutting_down.store(true, Ordering::Release);
        self.notify_index();
    }

    /// How many threads are waiting in [`StateStore::snapshot_min_index`].
    pub fn waiters(&self) -> usize {
        self.waiters.load(Ordering::SeqCst)
    }

    /// Whether [`StateStore::shutdown`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod store_test;
