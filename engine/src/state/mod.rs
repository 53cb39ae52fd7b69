//! The state store: the replicated state machine. It applies [`Command`]s
//! in log order and publishes an immutable [`Snapshot`] through `arc-swap`.
//!
//! Contract:
//! 1. [`StateStore::apply_at`] is the only place state changes, and every
//!    write reaches it through one seam, a [`Writer`]: in one process the
//!    store is its own log ([`StateStore::apply`] takes the next position);
//!    with a replicated log, the log applies each committed entry.
//! 2. **The index rule.** Every command occupies one log position, and the
//!    state's index is the position of the last command applied: a command
//!    the state refuses (an unknown node, say) still takes its position and
//!    moves the index, but changes nothing else and is answered with its
//!    error. So a replica that applied the same log has the same index and
//!    the same data, and `latest_index()` equals the number of commands
//!    submitted to a store that is its own log. Objects record the index of
//!    the command that created or changed them, and the per-table indexes
//!    ([`TableIndexes`]) move only when a command changed that table.
//! 3. A command is applied to a private clone of the newest snapshot and
//!    published whole, or not at all. Applying reads no clock, no random
//!    number and no process-seeded iteration order: everything it depends
//!    on is in the command.
//! 4. After every command, before the next one applies, the store wakes the
//!    waiters of its index and the watchers of every node whose allocations
//!    it changed (only those), then runs the [`ApplyHook`] if one is set
//!    (the leader's router: evals to the broker or the blocked tracker,
//!    unblocking on new capacity). Everything that follows a write happens
//!    there, whoever submitted the write. Before the hook, on every server,
//!    the command's events go to the event stream's buffer
//!    ([`StateStore::events`], `events.rs`).
//! 5. [`StateStore::snapshot`] is O(1) and never waits for the writer. A
//!    snapshot never changes under its reader.
//! 6. Waiting for an index or for a node's allocations to change blocks a
//!    thread only in the blocking forms; the async forms
//!    ([`StateStore::wait_for_index`], [`NodeWatch`]) park no thread and
//!    need no runtime. Every wait ends: with what it waited for, at its
//!    deadline, or with [`WaitError::Shutdown`].

mod apply;
mod codec;
mod command;
mod deployments;
mod events;
mod gc;
mod job_versions;
mod periodic;
mod persist;
mod services;
mod snapshot;
mod table;
mod watch;
mod writer;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, ArcSwapOption};
use event_listener::Event;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

pub use apply::same_spec;
pub use codec::{CodecError, FORMAT_VERSION};
pub use command::{ClientAllocUpdate, Command};
pub use gc::{alloc_finished, job_is_dead, Collected, Collection, NODE_PURGED};
pub use job_versions::JOB_TRACKED_VERSIONS;
pub use periodic::PeriodicLaunch;
pub use persist::{PersistError, MAX_RECORD, SNAPSHOT_FORMAT_VERSION};
pub use services::{ServiceDump, ServiceListing};
pub use snapshot::{NodeList, Snapshot, StateDump, TableIndexes};
pub use table::{Iter as TableIter, Table};
pub use watch::{wait_until, wait_until_async, NodeWatch};
pub use writer::{CommandLog, LeaderHint, LogError, PendingWrite, Writer};

use watch::NodeWatches;

use crate::events::EventBroker;
use crate::structs::{AllocId, ComputedClass, EvalId, Evaluation, Job, JobKey, Node, NodeId};

/// Why a command was refused. The state is unchanged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
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
    /// The command names a version of a job that is not kept (Nomad's words).
    #[error("job {:?} in namespace {:?} at version {version} not found", job.id, job.namespace)]
    UnknownJobVersion {
        /// The job.
        job: JobKey,
        /// The version asked for.
        version: u64,
    },
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
    /// A draining node cannot be made eligible (Nomad's words).
    #[error("can not set node's scheduling eligibility to eligible while it is draining")]
    NodeDraining(NodeId),
    /// A drain completion for a node that no longer drains.
    #[error("node {0} is not draining")]
    NodeNotDraining(NodeId),
    /// The store is shutting down and takes no more writes.
    #[error("the state store is shutting down")]
    ShuttingDown,
    /// A check-and-set write of the scheduler configuration named another
    /// modify index than the stored one.
    #[error("scheduler configuration is at modify index {stored}, not {expected}")]
    ConfigIndexMismatch {
        /// The index the write expected.
        expected: u64,
        /// The stored configuration's modify index (0: none stored).
        stored: u64,
    },
    /// The ACL system was bootstrapped already, at this index (Nomad's
    /// reset index: see [`Command::AclBootstrapReset`]).
    #[error("ACL bootstrap already done (reset index: {0})")]
    AclBootstrapped(u64),
    /// A token names a policy that does not exist.
    #[error("ACL policy {0:?} not found")]
    UnknownAclPolicy(String),
    /// No token has this accessor id.
    #[error("ACL token {0} not found")]
    UnknownAclToken(uuid::Uuid),
    /// Two tokens would share a secret.
    #[error("ACL token {0}: its secret is another token's")]
    DuplicateAclSecret(uuid::Uuid),
    /// The command names a namespace that does not exist (a job's, or one
    /// to delete).
    #[error("namespace {0:?} does not exist")]
    UnknownNamespace(String),
    /// A namespace that cannot be written, and why.
    #[error("{0}")]
    InvalidNamespace(String),
    /// `default` cannot be deleted (Nomad's words).
    #[error("default namespace can not be deleted")]
    DefaultNamespace,
    /// A namespace to delete still holds jobs.
    #[error("namespace {name:?} has {jobs} jobs; stop and purge them first (`drover job stop -purge`)")]
    NamespaceInUse {
        /// The namespace.
        name: String,
        /// How many jobs it holds.
        jobs: usize,
    },
    /// The command log did not take the write (this server does not lead,
    /// or the log stopped); it was not acknowledged.
    #[error(transparent)]
    Log(#[from] LogError),
    /// A log position at or before one already applied.
    #[error("log position {index} is not after the last applied position {last}")]
    StaleIndex {
        /// The position offered.
        index: u64,
        /// The last position applied.
        last: u64,
    },
    /// No service registration has this id in this namespace.
    #[error("service registration {id} not found in namespace {namespace}")]
    UnknownServiceRegistration {
        /// The namespace asked.
        namespace: String,
        /// The id asked.
        id: String,
    },
    /// A service registration names an allocation of another job, or in
    /// another namespace.
    #[error("service registration {id} names job {job} but allocation {alloc_id} belongs to another")]
    ServiceRegistrationMismatch {
        /// The registration.
        id: String,
        /// The job it names.
        job: JobKey,
        /// The allocation it names.
        alloc_id: AllocId,
    },
    /// A service registration names an allocation the servers stopped or
    /// its client ended: nothing there answers any more.
    #[error("allocation {0} is stopped or ended; its services are not registered")]
    AllocNotLive(AllocId),
    /// No deployment has this id.
    #[error("deployment {0} not found")]
    UnknownDeployment(crate::structs::DeploymentId),
    /// A deployment that ended cannot change (Nomad's words).
    #[error("can't {action} terminal deployment")]
    DeploymentTerminal {
        /// The deployment.
        deployment_id: crate::structs::DeploymentId,
        /// What was asked.
        action: String,
    },
    /// A promotion named a group that is not part of the deployment.
    #[error("deployment {deployment_id} has no task group {group:?}")]
    UnknownDeploymentGroup {
        /// The deployment.
        deployment_id: crate::structs::DeploymentId,
        /// The group named.
        group: String,
    },
    /// A promotion of a group whose canaries are not all healthy yet.
    #[error("Task group {group:?} has {healthy}/{desired} healthy allocations")]
    CanariesNotHealthy {
        /// The group.
        group: String,
        /// Its healthy canaries.
        healthy: u32,
        /// The canaries it wants.
        desired: u32,
    },
    /// A health verdict for an allocation of another deployment.
    #[error("alloc \"{alloc_id}\" is not part of deployment \"{deployment_id}\"")]
    AllocNotInDeployment {
        /// The allocation.
        alloc_id: AllocId,
        /// The deployment named.
        deployment_id: crate::structs::DeploymentId,
    },
    /// Evaluations may be deleted by hand only while the eval broker is
    /// paused (Nomad's words).
    #[error("eval broker is enabled; eval broker must be paused to delete evals")]
    EvalBrokerNotPaused,
    /// A client reported an allocation live again after it had ended on
    /// the client: its ports and resources may be another's by now.
    #[error("allocation {alloc_id} already ended ({status:?}); a client cannot report it live again")]
    AllocEnded {
        /// The allocation.
        alloc_id: AllocId,
        /// The client status it ended with.
        status: crate::structs::ClientStatus,
    },
    /// A periodic launch names a job that is not periodic (Nomad's words).
    #[error("can't force launch non-periodic job")]
    NotPeriodic(JobKey),
    /// A scheduled periodic launch at or before the one recorded: another
    /// leader launched it already (`periodic.rs`).
    #[error("job {job} was launched at {recorded:?} already, not before {launch:?}")]
    LaunchedAlready {
        /// The parent job.
        job: JobKey,
        /// The launch asked for.
        launch: crate::clock::Timestamp,
        /// The launch recorded.
        recorded: crate::clock::Timestamp,
    },
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Applied {
    /// The index (log position) the command was applied at.
    pub index: u64,
    /// Evaluations the command created or updated, as stored.
    pub evals: Vec<Arc<Evaluation>>,
    /// Nodes where capacity appeared (node became ready or eligible, an
    /// allocation stopped or finished).
    pub capacity_changes: Vec<CapacityChange>,
    /// Nodes whose allocations the command created, changed or deleted:
    /// their agents' watches are woken, no others (unless
    /// `reported_by_clients`).
    pub touched_nodes: Vec<NodeId>,
    /// New placements of a plan left out because their node was no longer
    /// ready and eligible when the plan was written.
    pub refused_placements: Vec<AllocId>,
    /// Client alloc updates left out, with why.
    pub refused_updates: Vec<(AllocId, StateError)>,
    /// Service registrations left out, by id, with why.
    #[serde(default)]
    pub refused_registrations: Vec<(String, StateError)>,
    /// The job a job write left stored (`RegisterJob`, `DeregisterJob`
    /// without purge), with its version and indexes as applied.
    #[serde(default)]
    pub job: Option<Arc<Job>>,
    /// Whether the command changed a deployment (the watcher looks again).
    #[serde(default)]
    pub deployments_changed: bool,
    /// Whether the command only took clients' reports of their own
    /// allocations: then the nodes' watches are not woken, since each
    /// agent knows what it reported (Nomad's watch reads
    /// `AllocModifyIndex`, which client updates leave alone). Each server's
    /// store sets it as it applies, so it is not encoded.
    #[serde(skip)]
    pub reported_by_clients: bool,
    /// Whether the command started, changed or ended a node's drain (the
    /// drainer lists the draining nodes again).
    #[serde(default)]
    pub drains_changed: bool,
    /// Evaluations the command deleted (garbage collection, an operator's
    /// delete), as they were stored.
    #[serde(default)]
    pub deleted_evals: Vec<Arc<Evaluation>>,
    /// How many objects the command deleted, by kind.
    #[serde(default)]
    pub collected: Collected,
    /// The `pause_eval_broker` of the scheduler configuration the command
    /// wrote, if it wrote one (the leader pauses or resumes its broker).
    #[serde(default)]
    pub pause_eval_broker: Option<bool>,
}

impl Applied {
    fn touch(&mut self, node_id: NodeId) {
        if !self.touched_nodes.contains(&node_id) {
            self.touched_nodes.push(node_id);
        }
    }
}

/// What follows every applied command (contract, step 4): on the leader,
/// the router that hands evals to the broker and the blocked tracker.
pub trait ApplyHook: Send + Sync + std::fmt::Debug {
    /// Runs after `applied` was published, before the next command applies.
    fn after_apply(&self, applied: &Applied);
}

/// The state store. See the module docs for its contract.
#[derive(Debug)]
pub struct StateStore {
    current: ArcSwap<Snapshot>,
    writer: Mutex<()>,
    hook: ArcSwapOption<Box<dyn ApplyHook>>,
    /// Notified on every new index and on shutdown.
    index_changed: Event,
    nodes: NodeWatches,
    waiters: AtomicUsize,
    shutting_down: AtomicBool,
    /// The newest event batches (`crate::events`), fed by every command.
    events: Arc<EventBroker>,
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
            hook: ArcSwapOption::empty(),
            index_changed: Event::new(),
            nodes: NodeWatches::default(),
            waiters: AtomicUsize::new(0),
            shutting_down: AtomicBool::new(false),
            events: Arc::new(EventBroker::default()),
        }
    }

    /// A store holding `snapshot`, at its index: what recovery starts from.
    pub fn restored(snapshot: Snapshot) -> Self {
        let store = StateStore::new();
        store.current.store(Arc::new(snapshot));
        store
    }

    /// Replaces the whole state with `snapshot` (a replica catching up from
    /// its leader's snapshot): published at once, every index waiter and
    /// every node watch woken, the apply hook not run.
    pub fn install(&self, snapshot: Snapshot) {
        let _writer = self.writer.lock();
        self.current.store(Arc::new(snapshot));
        self.index_changed.notify(usize::MAX);
        self.nodes.notify_all();
    }

    /// Sets (or, with `None`, removes) what runs after every applied command.
    pub fn set_hook(&self, hook: Option<Box<dyn ApplyHook>>) {
        let _writer = self.writer.lock();
        self.hook.store(hook.map(Arc::new));
    }

    /// Applies `command` at the next log position: the store as its own
    /// log. Replicated logs call [`StateStore::apply_at`] instead.
    pub fn apply(&self, command: Command) -> Result<Applied, StateError> {
        let _writer = self.writer.lock();
        let index = self.latest_index() + 1;
        self.apply_locked(index, command)
    }

    /// Applies `command` at log position `index`, which must follow the
    /// last one applied (contract, steps 1-4). A refused command still
    /// takes `index` (the index rule) and returns its error.
    pub fn apply_at(&self, index: u64, command: Command) -> Result<Applied, StateError> {
        let _writer = self.writer.lock();
        let last = self.latest_index();
        if index <= last {
            return Err(StateError::StaleIndex { index, last });
        }
        self.apply_locked(index, command)
    }

    /// Moves the index to `index` without a command: a log position that
    /// carries none (a replicated log's own entries).
    pub fn advance_to(&self, index: u64) -> Result<(), StateError> {
        let _writer = self.writer.lock();
        let last = self.latest_index();
        if index <= last {
            return Err(StateError::StaleIndex { index, last });
        }
        self.publish_unchanged(index);
        Ok(())
    }

    fn apply_locked(&self, index: u64, command: Command) -> Result<Applied, StateError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(StateError::ShuttingDown);
        }
        let current = self.current.load_full();
        let mut next = Snapshot::clone(&current);
        let mut applied = Applied { index, ..Applied::default() };
        let pending_events = self.events.is_enabled().then(|| events::Pending::of(&command));
        if let Err(error) = next.apply(index, command, &mut applied) {
            self.publish_unchanged(index);
            return Err(error);
        }
        let events = pending_events.map(|pending| pending.collect(&current, &next, &applied));
        self.current.store(Arc::new(next));
        self.index_changed.notify(usize::MAX);
        if !applied.reported_by_clients {
            self.nodes.notify(&applied.touched_nodes);
        }
        if let Some(events) = events {
            self.events.publish(events);
        }
        if let Some(hook) = self.hook.load().as_ref() {
            hook.after_apply(&applied);
        }
        Ok(applied)
    }

    /// Publishes the current data at `index` (a refused command's position).
    fn publish_unchanged(&self, index: u64) {
        let mut next = Snapshot::clone(&self.current.load());
        next.index = index;
        self.current.store(Arc::new(next));
        self.index_changed.notify(usize::MAX);
    }

    /// The newest snapshot. O(1); never waits for the writer.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// The index of the newest snapshot.
    pub fn latest_index(&self) -> u64 {
        self.current.load().index
    }

    /// A snapshot at `index` or later, blocking this thread up to `timeout`
    /// for the writer to get there.
    pub fn snapshot_min_index(&self, index: u64, timeout: Duration) -> Result<Arc<Snapshot>, WaitError> {
        let _waiting = Waiting::count(&self.waiters);
        let deadline = Instant::now() + timeout;
        match wait_until(|| self.index_changed.listen(), deadline, || self.reached(index))? {
            Some(reached) => Ok(reached),
            None => self.reached(index)?.ok_or(WaitError::Timeout { wanted: index, reached: self.latest_index() }),
        }
    }

    /// A snapshot at `index` or later, awaited: no thread waits. Callers
    /// bound the wait themselves (a runtime's timeout); shutdown ends it.
    pub async fn wait_for_index(&self, index: u64) -> Result<Arc<Snapshot>, WaitError> {
        let _waiting = Waiting::count(&self.waiters);
        wait_until_async(|| self.index_changed.listen(), || self.reached(index)).await
    }

    /// The newest snapshot if it reached `index`; an error once shut down.
    fn reached(&self, index: u64) -> Result<Option<Arc<Snapshot>>, WaitError> {
        let snapshot = self.snapshot();
        if snapshot.index >= index {
            return Ok(Some(snapshot));
        }
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(WaitError::Shutdown { wanted: index });
        }
        Ok(None)
    }

    /// A watch on one node's allocations: it wakes only when a command
    /// changes an allocation on that node (contract, step 4).
    pub fn watch_node(&self, node_id: NodeId) -> NodeWatch {
        self.nodes.watch(node_id)
    }

    /// Refuses further writes and wakes every waiter with
    /// [`WaitError::Shutdown`].
    pub fn shutdown(&self) {
        let _writer = self.writer.lock();
        self.shutting_down.store(true, Ordering::Release);
        self.index_changed.notify(usize::MAX);
        self.nodes.notify_all();
        self.events.close();
    }

    /// The event stream's buffer: a batch per applied command that changed
    /// something a subscriber sees (`crate::events`).
    pub fn events(&self) -> &Arc<EventBroker> {
        &self.events
    }

    /// Whether [`StateStore::shutdown`] was called.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// How many callers are waiting for an index right now.
    pub fn waiters(&self) -> usize {
        self.waiters.load(Ordering::SeqCst)
    }
}

/// Counts a waiter for as long as it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn count(waiters: &'a AtomicUsize) -> Self {
        waiters.fetch_add(1, Ordering::SeqCst);
        Waiting(waiters)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod events_test;
#[cfg(test)]
mod gc_test;
#[cfg(test)]
mod namespaces_test;
#[cfg(test)]
mod replay_test;
#[cfg(test)]
mod services_test;
#[cfg(test)]
mod store_test;
