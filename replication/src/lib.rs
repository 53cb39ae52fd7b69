//! Drover's durable state on openraft 0.9: the raft type config, the log
//! store over the `storage` crate's write-ahead log, the state machine over the
//! engine's store with snapshot files, the engine's command log with group
//! commit, and a one-voter [`Durable`] server state that opens, recovers
//! and shuts down in order.
//!
//! **Log positions.** openraft's log ids number raft entries; the store's
//! index counts commands. An entry carries a batch of commands (group
//! commit), each taking the store's next index; blank and membership
//! entries take none. Replaying the same raft log from the same snapshot
//! gives the same store index and data on every replica, and a snapshot
//! records both its raft log id and its store index.
//!
//! Opening a data dir (recovery), in order:
//! 1. open the log, refusing a data dir that was used but whose log is
//!    missing or empty ([`storage::DataDir::open_log`]): the log holds
//!    the vote and every write after the newest snapshot;
//! 2. load the newest snapshot that verifies (falling back to the one
//!    before it, whose log is kept), and refuse to start if the log was
//!    purged past every usable snapshot ([`DurableError::NoUsableSnapshot`]);
//! 3. start raft on its own small runtime; initialize a new cluster of
//!    this one voter, or elect it at once;
//! 4. wait until raft leads and has applied every entry of its log (the
//!    log after the snapshot is replayed into the store);
//! 5. rename the snapshots refused in step 2 to `.corrupt`: a start that
//!    is refused, at any step before, leaves them as they were;
//! 6. only then does the server start its leader services over
//!    [`Durable::writer`].
//!
//! Shutting down: the server stops its leader services first, then
//! [`Durable::shutdown`] stops raft (no more applies) and closes the log,
//! and the store is shut last.

#![forbid(unsafe_code)]
// openraft's storage API returns its own `StorageError`, which is large.
#![allow(clippy::result_large_err)]

pub mod cluster;
pub mod command_log;
pub mod log_store;
pub mod network;
pub mod state_machine;
pub mod types;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::state::{StateStore, Writer};
use openraft::{Raft, ServerState, SnapshotPolicy};
use storage::{DataDir, FatalHandler, LogFile, SnapshotDir, SnapshotInfo};

pub use cluster::Membership;
pub use command_log::RaftLog;
pub use log_store::LogStore;
pub use network::{NoNetworkFactory, PeerNetworkFactory};
pub use state_machine::{CurrentSnapshot, Recovery, SnapshotHeader, StateMachine};
pub use types::{LogId, ServerNode, TypeConfig};

/// This server's raft id in a one-voter cluster.
pub const NODE_ID: u64 = 1;

/// How a durable server runs its log.
#[derive(Clone, Debug)]
pub struct DurableConfig {
    /// A snapshot is taken every this many raft entries.
    pub snapshot_every: u64,
}

impl Default for DurableConfig {
    fn default() -> Self {
        DurableConfig { snapshot_every: 20_000 }
    }
}

/// A server of a cluster: who it is, its endpoint to the others, and how
/// the cluster forms if its log has no membership yet ([`cluster`]).
#[derive(Clone, Debug)]
pub struct ClusterSetup {
    /// This server's raft id and addresses.
    pub membership: Arc<Membership>,
    /// Its server-to-server endpoint.
    pub peers: Arc<transport::peer::Peers>,
    /// Form a new cluster once this many servers know each other (0: never
    /// form one, only join one formed already).
    pub bootstrap_expect: usize,
    /// Server-to-server addresses to say hello to while forming.
    pub join: Vec<String>,
}

/// Why durable state could not be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum DurableError {
    /// A file or directory could not be read or created.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The raft log could not be opened (another server holds it?).
    #[error(transparent)]
    Log(#[from] storage::LogError),
    /// The data dir was used but its raft log is missing or empty (module
    /// docs, step 1).
    #[error(transparent)]
    DataDir(#[from] storage::DataDirError),
    /// The log was purged past every snapshot that could be loaded, so the
    /// state before its first entry is nowhere (module docs, step 2).
    #[error(
        "no usable snapshot: the raft log {log} was purged up to index {purged}, so the state up to there can only \
         come from a snapshot, and {}. Nothing was changed. Stop the server and restore a snapshot saved with \
         `drover operator snapshot save`: `drover operator snapshot restore --data-dir <its data_dir> <file>`",
        unusable(refused)
    )]
    NoUsableSnapshot {
        /// The log.
        log: std::path::PathBuf,
        /// The last raft index purged from it.
        purged: u64,
        /// Each snapshot refused, with its file and why.
        refused: Vec<String>,
    },
    /// A snapshot file is not usable.
    #[error(transparent)]
    Snapshot(#[from] storage::SnapshotError),
    /// raft refused its configuration or failed to start.
    #[error("raft: {0}")]
    Raft(String),
    /// The log's servers do not fit how this server was started
    /// (`check_membership`).
    #[error("{0}")]
    Membership(String),
}

/// Why asking a server who it is ([`Durable::hello`]) failed.
#[derive(Debug, thiserror::Error)]
pub enum HelloError {
    /// This server runs alone: it has no server-to-server endpoint.
    #[error("this server is not one of a cluster")]
    NotClustered,
    /// The address does not resolve.
    #[error(transparent)]
    Resolve(#[from] network::ResolveError),
    /// The call got no answer, or a refusal.
    #[error(transparent)]
    Call(#[from] transport::peer::PeerError),
    /// The answer was not a hello.
    #[error("{addr} answered a malformed hello: {source}")]
    Malformed {
        /// The server asked.
        addr: String,
        /// What postcard found wrong.
        source: postcard::Error,
    },
}

/// Says why no snapshot could be used.
fn unusable(refused: &[String]) -> String {
    match refused {
        [] => "the data dir holds no snapshot".to_string(),
        _ => format!("every snapshot is unusable: {}", refused.join("; ")),
    }
}

fn io_error(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> DurableError {
    let what = what.into();
    move |source| DurableError::Io { what, source }
}

/// The raft position and the files, for `drover operator raft info`.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct RaftInfo {
    /// The first and last raft index the log holds.
    pub log_first: Option<u64>,
    /// See `log_first`.
    pub log_last: Option<u64>,
    /// The last raft entry purged from the log (it is in a snapshot).
    pub last_purged: Option<LogId>,
    /// The last raft entry applied to the store (running servers only).
    pub last_applied: Option<LogId>,
    /// The store's index (running servers only).
    pub store_index: Option<u64>,
    /// The current term.
    pub term: u64,
    /// The snapshots on disk, newest first: raft index, store index (from
    /// the newest's header), path and size.
    pub snapshots: Vec<SnapshotFile>,
    /// The newest snapshot's store index.
    pub snapshot_store_index: Option<u64>,
    /// How long writing the newest snapshot took, if this server wrote it.
    pub snapshot_write_millis: Option<u64>,
}

/// One snapshot file in a [`RaftInfo`].
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct SnapshotFile {
    /// The raft index it ends at.
    pub index: u64,
    /// The file.
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
}

impl From<&SnapshotInfo> for SnapshotFile {
    fn from(info: &SnapshotInfo) -> Self {
        SnapshotFile { index: info.index, path: info.path.display().to_string(), size: info.size }
    }
}

/// A server's durable state: raft over the log and the snapshots in its
/// data dir, applying to one store (module docs).
pub struct Durable {
    runtime: parking_lot::Mutex<Option<tokio::runtime::Runtime>>,
    handle: tokio::runtime::Handle,
    raft: Raft<TypeConfig>,
    machine: StateMachine,
    /// Taken at shutdown, so the log file closes (raft's own copies end
    /// with its runtime).
    log: parking_lot::Mutex<Option<LogStore>>,
    command_log: Arc<RaftLog>,
    recovery: Recovery,
    replay: (u64, Duration),
    cluster: Option<ClusterSetup>,
}

impl Durable {
    /// Opens the data dir and recovers (module docs, steps 1-5). `fatal`
    /// runs if a write to disk fails.
    pub fn open(dir: &DataDir, config: &DurableConfig, fatal: FatalHandler) -> Result<Durable, DurableError> {
        Durable::open_with(dir, config, fatal, None)
    }

    /// Opens the data dir of a server of a cluster: recovers what its own
    /// log has committed and starts raft, without waiting to lead (the
    /// cluster elects; [`cluster::watch_leadership`] says when this server
    /// leads). A log without a membership forms the cluster first.
    pub fn open_cluster(
        dir: &DataDir,
        config: &DurableConfig,
        fatal: FatalHandler,
        cluster: ClusterSetup,
    ) -> Result<Durable, DurableError> {
        Durable::open_with(dir, config, fatal, Some(cluster))
    }

    fn open_with(
        dir: &DataDir,
        config: &DurableConfig,
        fatal: FatalHandler,
        cluster: Option<ClusterSetup>,
    ) -> Result<Durable, DurableError> {
        // The log first: a fresh data dir gets its snapshot directory only
        // after its log (storage's data dir docs).
        let log = LogStore::new(dir.open_log(fatal.clone())?);
        let snapshots = SnapshotDir::open(&dir.snapshot_dir(), fatal)
            .map_err(io_error(format!("opening {}", dir.snapshot_dir().display())))?;
        let (machine, recovery) =
            StateMachine::open(snapshots).map_err(io_error(format!("reading {}", dir.snapshot_dir().display())))?;
        check_log_follows_snapshot(log.file(), &machine, &recovery)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("raft")
            .enable_all()
            .build()
            .map_err(io_error("starting the raft runtime"))?;
        let raft_config = raft_config(config)?;
        let started = Instant::now();
        let from_index = machine.last_applied().map_or(0, |log_id| log_id.index);
        let raft_started = match &cluster {
            None => block_on(runtime.spawn(start_raft(raft_config, log.clone(), machine.clone()))),
            Some(cluster) => {
                block_on(runtime.spawn(start_clustered(raft_config, log.clone(), machine.clone(), cluster.clone())))
            }
        };
        let raft = match raft_started {
            Ok(raft) => raft,
            Err(error) => {
                // Dropping a runtime on an async worker thread is not allowed.
                runtime.shutdown_background();
                return Err(error);
            }
        };
        let replayed = machine.last_applied().map_or(0, |log_id| log_id.index).saturating_sub(from_index);
        if let Err(error) = machine.snapshots().set_aside_refused() {
            runtime.shutdown_background();
            return Err(DurableError::Io { what: "renaming the refused snapshots to .corrupt".into(), source: error });
        }
        let command_log = Arc::new(RaftLog::start(raft.clone(), runtime.handle()));
        runtime.spawn(purge_behind_older_snapshot(raft.clone(), machine.clone()));
        Ok(Durable {
            handle: runtime.handle().clone(),
            runtime: parking_lot::Mutex::new(Some(runtime)),
            raft,
            machine,
            log: parking_lot::Mutex::new(Some(log)),
            command_log,
            recovery,
            replay: (replayed, started.elapsed()),
            cluster,
        })
    }

    /// The raft of this server (for the server-to-server calls and the
    /// leadership watch).
    pub fn raft(&self) -> &Raft<TypeConfig> {
        &self.raft
    }

    /// This server's place in its cluster, if it is in one.
    pub fn cluster(&self) -> Option<&ClusterSetup> {
        self.cluster.as_ref()
    }

    /// This server's raft id.
    pub fn id(&self) -> u64 {
        self.cluster.as_ref().map_or(NODE_ID, |cluster| cluster.membership.id)
    }

    /// The leader this server knows of: its id and addresses. None while
    /// that leader is not in the membership this server has: a server of
    /// a cluster just formed can hear from its first leader before the
    /// entry naming the members, and a leader whose address is unknown
    /// cannot be called (a call waits for the entry instead).
    pub fn leader(&self) -> Option<(u64, ServerNode)> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let leader = metrics.current_leader?;
        let node = metrics.membership_config.nodes().find(|(id, _)| **id == leader).map(|(_, node)| node.clone())?;
        Some((leader, node))
    }

    /// Whether raft has stopped on this server (shut down, or failed): it
    /// takes no part in the cluster any more, and its log no writes.
    pub fn has_stopped(&self) -> bool {
        self.raft.metrics().borrow().running_state.is_err()
    }

    /// Whether this server is the raft leader now.
    pub fn is_leader(&self) -> bool {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        metrics.state == ServerState::Leader && metrics.current_leader == Some(self.id())
    }

    /// Runs `on_change` as leadership comes and goes
    /// ([`cluster::watch_leadership`]); a one-voter server leads from
    /// the start.
    pub fn watch_leadership(&self, on_change: Arc<dyn Fn(bool) + Send + Sync>) {
        self.handle.spawn(cluster::watch_leadership(self.raft.clone(), self.id(), on_change));
    }

    /// Answers a call another server made on the server-to-server endpoint
    /// (raft's RPCs, hellos and joins); `None` when `kind` is not one of
    /// these.
    pub async fn serve_peer(&self, kind: u8, request: &[u8]) -> Option<Result<Vec<u8>, network::ServeError>> {
        match kind {
            network::kinds::HELLO => {
                let membership = &self.cluster.as_ref()?.membership;
                Some(cluster::answer_hello(membership, &self.raft, request))
            }
            network::kinds::JOIN => Some(cluster::answer_join(&self.raft, request).await),
            _ => network::serve(&self.raft, kind, request).await,
        }
    }

    /// Asks the server at server-to-server address `addr` who it is.
    pub async fn hello(&self, addr: &str) -> Result<(u64, ServerNode), HelloError> {
        let cluster = self.cluster.as_ref().ok_or(HelloError::NotClustered)?;
        let target = network::resolve(addr)?;
        let hello = postcard::to_allocvec(&cluster.membership.hello(&self.raft)).expect("a hello encodes");
        let answer = cluster.peers.call(target, network::kinds::HELLO, &hello, Duration::from_secs(5)).await?;
        let theirs: cluster::Hello =
            postcard::from_bytes(&answer).map_err(|source| HelloError::Malformed { addr: addr.to_string(), source })?;
        Ok((theirs.id, theirs.node))
    }

    /// Adds server `id` at `node` as a voter (leader only).
    pub fn add_voter(&self, id: u64, node: ServerNode) -> Result<(), cluster::AddError> {
        let raft = self.raft.clone();
        self.run(async move { cluster::add_voter(&raft, id, node).await })
            .unwrap_or_else(|_| Err(cluster::AddError::Stopped(Box::new(openraft::error::Fatal::Stopped))))
    }

    /// Removes server `id` from the cluster (leader only).
    pub fn remove_peer(&self, id: u64) -> Result<(), cluster::AddError> {
        let raft = self.raft.clone();
        self.run(async move { cluster::remove_peer(&raft, id).await })
            .unwrap_or_else(|_| Err(cluster::AddError::Stopped(Box::new(openraft::error::Fatal::Stopped))))
    }

    /// raft's view now: role, term, log, leader, members, replication.
    pub fn metrics(&self) -> openraft::RaftMetrics<u64, ServerNode> {
        self.raft.metrics().borrow().clone()
    }

    /// The write path through the log: give it to the leader services.
    pub fn writer(&self) -> Writer {
        Writer::through(self.command_log.clone(), self.machine.store().clone())
    }

    /// The store raft applies to.
    pub fn store(&self) -> &Arc<StateStore> {
        self.machine.store()
    }

    /// What opening found: the snapshot loaded and any refused.
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// Raft entries replayed from the log at start, and how long start-up
    /// (raft start, election and replay) took.
    pub fn replayed(&self) -> (u64, Duration) {
        self.replay
    }

    /// The newest snapshot on disk.
    pub fn current_snapshot(&self) -> Option<CurrentSnapshot> {
        self.machine.current_snapshot()
    }

    /// Takes a snapshot now and waits until it is on disk.
    pub fn snapshot_now(&self) -> Result<CurrentSnapshot, DurableError> {
        let raft = self.raft.clone();
        let wanted = self.machine.last_applied().map_or(0, |log_id| log_id.index);
        self.run(async move {
            let raft_error = |error: &dyn std::fmt::Display| DurableError::Raft(error.to_string());
            loop {
                let before = raft.metrics().borrow().snapshot;
                if before.is_some_and(|log_id| log_id.index >= wanted) {
                    return Ok::<(), DurableError>(());
                }
                // raft ignores the trigger while it builds a snapshot: wait for
                // that one, then ask again if it stops short of `wanted`.
                raft.trigger().snapshot().await.map_err(|error| raft_error(&error))?;
                raft.wait(None)
                    .metrics(|metrics| metrics.snapshot != before, "a snapshot taken")
                    .await
                    .map_err(|error| raft_error(&error))?;
            }
        })??;
        self.machine.current_snapshot().ok_or_else(|| DurableError::Raft("no snapshot after taking one".into()))
    }

    /// Runs `task` on the raft runtime and blocks this thread for its
    /// result (any thread, in a runtime or not); after [`Durable::shutdown`]
    /// it is refused.
    fn run<T: Send + 'static>(
        &self,
        task: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Result<T, DurableError> {
        if self.runtime.lock().is_none() {
            return Err(DurableError::Raft("raft has shut down".into()));
        }
        match futures_lite::future::block_on(self.handle.spawn(task)) {
            Ok(value) => Ok(value),
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(_) => Err(DurableError::Raft("raft has shut down".into())),
        }
    }

    /// The raft position and the files.
    pub fn info(&self) -> Result<RaftInfo, DurableError> {
        let metrics = self.raft.metrics().borrow().clone();
        let mut info = {
            let log = self.log.lock();
            let log = log.as_ref().ok_or_else(|| DurableError::Raft("raft has shut down".into()))?;
            files_info(log.file(), self.machine.snapshots())?
        };
        info.last_applied = metrics.last_applied;
        info.store_index = Some(self.store().latest_index());
        info.term = metrics.current_term;
        if let Some(current) = self.machine.current_snapshot() {
            info.snapshot_store_index = Some(current.header.store_index);
            info.snapshot_write_millis =
                (!current.write_time.is_zero()).then_some(current.write_time.as_millis() as u64);
        }
        Ok(info)
    }

    /// Stops raft (nothing more is applied) and closes the log. Stop the
    /// leader services before, shut the store after. Idempotent.
    /// Must not run on an async runtime's worker thread (it blocks).
    pub fn shutdown(&self) {
        let raft = self.raft.clone();
        let _ = self.run(async move { raft.shutdown().await });
        if let Some(runtime) = self.runtime.lock().take() {
            runtime.shutdown_timeout(Duration::from_secs(5));
        }
        self.log.lock().take();
    }
}

/// Refuses to start when the log was purged past the loaded snapshot (or
/// there is none): raft could not replay the entries in between (module
/// docs, step 2).
fn check_log_follows_snapshot(log: &LogFile, machine: &StateMachine, recovery: &Recovery) -> Result<(), DurableError> {
    let purged: Option<LogId> = log.purged()?.and_then(|bytes| postcard::from_bytes(&bytes).ok());
    let Some(purged) = purged else { return Ok(()) };
    let applied = machine.last_applied().map_or(0, |log_id| log_id.index);
    if applied >= purged.index {
        return Ok(());
    }
    Err(DurableError::NoUsableSnapshot {
        log: log.path().to_path_buf(),
        purged: purged.index,
        refused: recovery.refused.clone(),
    })
}

/// Blocks this thread until a task on the raft runtime ends; a panic in
/// the task is raised here.
fn block_on<T>(task: tokio::task::JoinHandle<T>) -> T {
    match futures_lite::future::block_on(task) {
        Ok(value) => value,
        Err(error) => std::panic::resume_unwind(error.into_panic()),
    }
}

impl Drop for Durable {
    /// A durable state dropped without [`Durable::shutdown`] (a failed
    /// start, a panic) still ends its runtime, without blocking: dropping a
    /// runtime on an async worker thread is not allowed.
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.get_mut().take() {
            runtime.shutdown_background();
        }
    }
}

impl std::fmt::Debug for Durable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Durable").field("log", &self.log).field("recovery", &self.recovery).finish_non_exhaustive()
    }
}

/// The raft settings, written for a loaded 2-core machine:
/// - heartbeats every 250 ms. openraft 0.9 has a follower that knows a
///   leader stand for election only once the leader's lease
///   (`election_timeout_max`) and then its own election timeout (drawn
///   once from `election_timeout_min..max`) have passed without a
///   heartbeat: 2.0-2.5 s here. A dead leader was replaced in 2.1-3.6 s
///   over 27 kills under the 10,000-agent load, inside the 5 s failover
///   target with room for a loaded machine
///   (`docs/high-availability.md`). openraft's defaults (50 ms,
///   150-300 ms) call elections whenever a busy machine delays a
///   heartbeat by a few hundred milliseconds; 1-2 s timeouts waited 3-4 s
///   before a vote and measured 3.2-5.3 s over 9 kills, 1.5-3 s measured
///   5.5 s.
/// - installing a snapshot may take 30 s (its last chunk installs the
///   whole state);
/// - at most 64 entries per AppendEntries (an entry carries up to 1,024
///   commands, some of them big plans).
fn raft_config(config: &DurableConfig) -> Result<Arc<openraft::Config>, DurableError> {
    let raft_config = openraft::Config {
        cluster_name: "drover".to_string(),
        heartbeat_interval: 250,
        election_timeout_min: 750,
        election_timeout_max: 1_250,
        install_snapshot_timeout: 30_000,
        max_payload_entries: 64,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every.max(1)),
        replication_lag_threshold: config.snapshot_every.max(1) * 2,
        // Purging follows the older kept snapshot ([`purge_behind_older_snapshot`]).
        max_in_snapshot_log_to_keep: u64::MAX,
        ..openraft::Config::default()
    };
    Ok(Arc::new(raft_config.validate().map_err(|error| DurableError::Raft(error.to_string()))?))
}

/// Starts raft, becomes the leader of its one-voter cluster and waits until
/// the whole log is applied (module docs, steps 2 and 3).
async fn start_raft(
    config: Arc<openraft::Config>,
    log: LogStore,
    machine: StateMachine,
) -> Result<Raft<TypeConfig>, DurableError> {
    let raft_error = |error: &dyn std::fmt::Display| DurableError::Raft(error.to_string());
    let raft = Raft::new(NODE_ID, config, NoNetworkFactory, log, machine).await.map_err(|error| raft_error(&error))?;
    if raft.is_initialized().await.map_err(|error| raft_error(&error))? {
        check_membership(&raft, NODE_ID, false).await?;
        raft.trigger().elect().await.map_err(|error| raft_error(&error))?;
    } else {
        let members = BTreeMap::from([(NODE_ID, ServerNode::default())]);
        raft.initialize(members).await.map_err(|error| raft_error(&error))?;
    }
    raft.wait(None)
        .metrics(
            |metrics| {
                metrics.state == ServerState::Leader
                    && metrics.last_applied.map(|log_id| log_id.index) == metrics.last_log_index
            },
            "leading with the whole log applied",
        )
        .await
        .map_err(|error| raft_error(&error))?;
    Ok(raft)
}

/// Starts raft as a server of a cluster: forms it if the log has no
/// membership ([`cluster::form`], in the background), else lets raft elect.
async fn start_clustered(
    config: Arc<openraft::Config>,
    log: LogStore,
    machine: StateMachine,
    cluster: ClusterSetup,
) -> Result<Raft<TypeConfig>, DurableError> {
    let raft_error = |error: &dyn std::fmt::Display| DurableError::Raft(error.to_string());
    let network = PeerNetworkFactory::new(cluster.peers.clone());
    let id = cluster.membership.id;
    let raft = Raft::new(id, config, network, log, machine).await.map_err(|error| raft_error(&error))?;
    if raft.is_initialized().await.map_err(|error| raft_error(&error))? {
        check_membership(&raft, id, true).await?;
    } else {
        if cluster.bootstrap_expect == 1 {
            let members = BTreeMap::from([(id, cluster.membership.node.clone())]);
            raft.initialize(members).await.map_err(|error| raft_error(&error))?;
        } else {
            tokio::spawn(cluster::form(
                raft.clone(),
                cluster.membership.clone(),
                cluster.peers.clone(),
                cluster.bootstrap_expect,
                cluster.join.clone(),
            ));
        }
    }
    Ok(raft)
}

/// Refuses a log whose servers do not fit how this server was started,
/// rather than wait forever for an election it cannot win: a cluster's log
/// on a server started alone, and a lone server's log on a server of a
/// cluster (raft id `id`). raft stops before the error is returned. A log
/// of a cluster that does not name this server only gets a warning: the
/// server may be being added (its log stops short of the entry adding it).
async fn check_membership(raft: &Raft<TypeConfig>, id: u64, clustered: bool) -> Result<(), DurableError> {
    let membership = raft
        .with_raft_state(|state| state.membership_state.effective().membership().clone())
        .await
        .map_err(|error| DurableError::Raft(error.to_string()))?;
    let alone = membership.voter_ids().eq([NODE_ID]);
    let label = |(server, node): (&u64, &ServerNode)| match node.name.as_str() {
        "" => server.to_string(),
        name => format!("{name} ({server})"),
    };
    let servers: Vec<String> = membership.nodes().map(label).collect();
    let refusal = match (clustered, alone) {
        (false, true) => return Ok(()),
        (true, _) if membership.nodes().any(|(server, _)| *server == id) => return Ok(()),
        (false, false) => format!(
            "this data dir holds the raft log of a cluster of {} servers ({}): start this server with its \
             cluster's settings (bootstrap_expect or join)",
            servers.len(),
            servers.join(", ")
        ),
        (true, true) => "this data dir holds the state of a server run alone (no bootstrap_expect or join): \
             a server of a cluster cannot start on it; start it with an empty data dir"
            .to_string(),
        // A server being added has the log before the entry that adds it:
        // it waits for the leader. One removed from its cluster waits forever.
        (true, false) => {
            tracing::warn!(
                id,
                servers = %servers.join(", "),
                "this server is not among the servers its own log names: a server being added waits for the \
                 leader; one removed from its cluster waits forever (start it with an empty data dir and join \
                 to add it again)"
            );
            return Ok(());
        }
    };
    let _ = raft.shutdown().await;
    Err(DurableError::Membership(refusal))
}

/// Each time a snapshot is taken, purges the log up to the older of the
/// two snapshots kept, so recovery can fall back to it (module docs).
async fn purge_behind_older_snapshot(raft: Raft<TypeConfig>, machine: StateMachine) {
    let mut metrics = raft.metrics();
    let mut seen = metrics.borrow().snapshot;
    while metrics.changed().await.is_ok() {
        let snapshot = metrics.borrow().snapshot;
        if snapshot == seen {
            continue;
        }
        seen = snapshot;
        let older = machine.snapshots().list().ok().and_then(|kept| kept.get(1).map(|info| info.index));
        if let Some(older) = older {
            if raft.trigger().purge_log(older).await.is_err() {
                return;
            }
        }
    }
}

/// What the log file and the snapshot directory hold.
fn files_info(log: &LogFile, snapshots: &SnapshotDir) -> Result<RaftInfo, DurableError> {
    let range = log.range()?;
    let last_purged = log.purged()?.and_then(|bytes| postcard::from_bytes(&bytes).ok());
    let listed = snapshots.list().map_err(io_error(format!("listing {}", snapshots.path().display())))?;
    Ok(RaftInfo {
        log_first: range.map(|range| range.first),
        log_last: range.map(|range| range.last),
        last_purged,
        snapshots: listed.iter().map(SnapshotFile::from).collect(),
        ..RaftInfo::default()
    })
}

/// [`RaftInfo`] of a stopped server's data dir (its log must not be open).
pub fn offline_info(dir: &DataDir) -> Result<RaftInfo, DurableError> {
    let ignore: FatalHandler = Arc::new(|_: &storage::FatalError| {});
    let log = dir.open_log(ignore.clone())?;
    let snapshots = SnapshotDir::open(&dir.snapshot_dir(), ignore)
        .map_err(io_error(format!("opening {}", dir.snapshot_dir().display())))?;
    let mut info = files_info(&log, &snapshots)?;
    if let Some(newest) = snapshots.list().ok().and_then(|list| list.into_iter().next()) {
        let header = storage::verify(&newest).ok().and_then(|verified| SnapshotHeader::decode(&verified.meta).ok());
        info.snapshot_store_index = header.as_ref().map(|header| header.store_index);
        info.term = header.and_then(|header| header.last_log_id).map_or(0, |log_id| log_id.leader_id.term);
    }
    if let Some(vote) = log.vote()?.and_then(|bytes| postcard::from_bytes::<openraft::Vote<u64>>(&bytes).ok()) {
        info.term = info.term.max(vote.leader_id().term);
    }
    Ok(info)
}

/// Restores a stopped server's data dir from a snapshot file (a backup
/// made with `drover operator snapshot save`): the file becomes the only
/// snapshot and the log is emptied behind it, so the server starts with
/// exactly that state. The vote is kept, its term raised to the
/// snapshot's if lower.
pub fn restore(dir: &DataDir, file: &std::path::Path) -> Result<SnapshotHeader, DurableError> {
    let outside = SnapshotInfo { path: file.to_path_buf(), index: 0, size: 0 };
    let header = {
        let verified = storage::verify(&outside)?;
        SnapshotHeader::decode(&verified.meta).map_err(|error| storage::SnapshotError::Corrupt {
            path: file.to_path_buf(),
            reason: format!("its header: {error}"),
        })?
    };
    let fatal = storage::exit_on_fatal();
    dir.create_dirs().map_err(io_error(format!("creating {}", dir.root().display())))?;
    // Not `open_log`: restoring is how an operator recovers a data dir whose
    // log is missing or empty, on purpose. An older build's log is imported
    // first, so its vote is kept.
    dir.import_old_log()?;
    let log = LogFile::open(&dir.log_path(), fatal.clone())?;
    let snapshots = SnapshotDir::open(&dir.snapshot_dir(), fatal)
        .map_err(io_error(format!("opening {}", dir.snapshot_dir().display())))?;
    let index = header.last_log_id.map_or(0, |log_id| log_id.index);
    let imported = snapshots.import(file, index)?;
    for older in snapshots.list().map_err(io_error("listing snapshots"))? {
        if older.path != imported.path {
            std::fs::remove_file(&older.path).map_err(io_error(format!("removing {}", older.path.display())))?;
        }
    }
    let wait = |write: &dyn Fn(storage::Completion)| -> Result<(), storage::LogError> {
        let (done, result) = std::sync::mpsc::channel();
        write(Box::new(move |outcome| {
            let _ = done.send(outcome);
        }));
        result.recv().unwrap_or(Err(storage::LogError::Closed))
    };
    wait(&|done| log.truncate(0, done))?;
    let purged = postcard::to_allocvec(&header.last_log_id.unwrap_or_default()).expect("a log id encodes");
    if let Some(last) = header.last_log_id {
        wait(&|done| log.purge(last.index, purged.clone(), done))?;
        let committed = postcard::to_allocvec(&Some(last)).expect("a log id encodes");
        wait(&|done| log.save_committed(committed.clone(), done))?;
        let vote: Option<openraft::Vote<u64>> = log.vote()?.and_then(|bytes| postcard::from_bytes(&bytes).ok());
        let term = last.leader_id.term;
        if vote.is_none_or(|vote| vote.leader_id().term < term) {
            let raised = postcard::to_allocvec(&openraft::Vote::new_committed(term, NODE_ID)).expect("a vote encodes");
            wait(&|done| log.save_vote(raised.clone(), done))?;
        }
    }
    log.close();
    Ok(header)
}
