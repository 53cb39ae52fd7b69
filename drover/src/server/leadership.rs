//! A server as one of several: its leader services come and go with the
//! raft leadership.
//!
//! [`Leadership`] holds the leader services (the engine's [`Server`]:
//! broker, blocked evals, plan applier, workers, heartbeat timers,
//! reaper) while this server leads. They start after raft's read barrier
//! (see `replication::cluster`) over the store raft applies to; every
//! pending eval goes back into the broker and every live node gets the
//! failover heartbeat TTL, so no node is marked down for the election.
//! They stop as soon as the leadership goes; the store is left to raft.
//! A one-server setup leads from the start and never stops leading.
//!
//! A server of a cluster schedules whether it leads or not: its workers
//! are its own, one pool for its whole life, not the leader services'
//! (see [`scheduling`](super::scheduling)).
//!
//! What a follower cannot serve goes to the leader: client calls through
//! [`ClusterRoute`](super::routing::ClusterRoute), HTTP requests through
//! `http::forward` (see [`leader_calls`](super::leader_calls)).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use engine::clock::SystemClock;
use engine::server::{Server, ServerConfig};
use engine::state::StateStore;
use engine::worker::{WorkerContext, WorkerPool, WorkerStats};
use parking_lot::RwLock;
use replication::Durable;
use transport::peer::Peers;

use super::leader_calls::{leader_peer, LeaderError};
use super::scheduling::{ClusterWork, LeaderServices, RemoteStats};

/// How long a call waits for a leader before it is refused with "no
/// cluster leader", the default of
/// [`ClusterOptions::hold`](crate::server::ClusterOptions::hold). An
/// election or a new leader's read barrier is then a slow answer rather
/// than an error and a retry (Nomad holds RPCs the same way, for 5 s).
/// It is shorter than an agent's heartbeat timeout (3 s), so a held
/// heartbeat is answered or refused before the agent gives up on it.
pub const HOLD: Duration = Duration::from_millis(2500);

/// This server's leader services, while it leads (module docs).
pub struct Leadership {
    config: ServerConfig,
    store: Arc<StateStore>,
    durable: Option<Arc<Durable>>,
    services: RwLock<Option<Arc<Server>>>,
    /// The raft term the leader services run in (set with them).
    term: AtomicU64,
    /// A server of a cluster's scheduling workers (module docs); a server
    /// alone has its leader services' own.
    workers: OnceLock<(WorkerPool, Arc<ClusterWork>)>,
    /// Whether the leader services run, for whoever waits for a change.
    leading: tokio::sync::watch::Sender<bool>,
    /// Times this server became the leader.
    gained: AtomicU64,
    /// Set at shutdown: the services never start again.
    closed: std::sync::atomic::AtomicBool,
    /// How long [`Leadership::settle`] waits for a leader.
    hold: Duration,
}

/// Who serves a call, once the cluster has a leader.
#[derive(Debug)]
pub enum Settled {
    /// This server, with its leader services.
    Leads(Arc<Server>),
    /// Another server (`leader_peer` finds it).
    Follows,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership").field("leading", &self.services.read().is_some()).finish_non_exhaustive()
    }
}

impl Leadership {
    /// A server that leads for good (one server, durable or not).
    pub fn single(server: Server, durable: Option<Arc<Durable>>) -> Arc<Leadership> {
        Arc::new(Leadership {
            config: ServerConfig::default(),
            store: server.store().clone(),
            durable,
            services: RwLock::new(Some(Arc::new(server))),
            term: AtomicU64::new(0),
            workers: OnceLock::new(),
            leading: tokio::sync::watch::Sender::new(true),
            gained: AtomicU64::new(1),
            closed: std::sync::atomic::AtomicBool::new(false),
            hold: Duration::ZERO,
        })
    }

    /// A server of a cluster: follows until raft says it leads. Calls wait
    /// up to `hold` for a leader ([`Leadership::settle`]). Its scheduling
    /// workers start now and call the leader through `peers`, on the
    /// runtime this is called in (module docs).
    pub fn clustered(
        config: ServerConfig,
        durable: Arc<Durable>,
        hold: Duration,
        peers: Arc<Peers>,
    ) -> Arc<Leadership> {
        let workers = config.workers;
        // The workers are the server's own, not the leader services'.
        let services_config = ServerConfig { workers: 0, ..config };
        let leadership = Arc::new(Leadership {
            config: services_config,
            store: durable.store().clone(),
            durable: Some(durable.clone()),
            services: RwLock::new(None),
            term: AtomicU64::new(0),
            workers: OnceLock::new(),
            leading: tokio::sync::watch::Sender::new(false),
            gained: AtomicU64::new(0),
            closed: std::sync::atomic::AtomicBool::new(false),
            hold,
        });
        let config = &leadership.config;
        let services: Arc<dyn LeaderServices> = leadership.clone();
        let runtime = tokio::runtime::Handle::current();
        let work = Arc::new(ClusterWork::new(&services, durable.clone(), peers, runtime));
        let context =
            WorkerContext::new(work.clone(), durable.store().clone(), SystemClock::shared(), config.worker.clone());
        let pool = WorkerPool::start(Arc::new(context), workers, config.worker_types.clone());
        let _ = leadership.workers.set((pool, work));
        let weak = Arc::downgrade(&leadership);
        durable.watch_leadership(Arc::new(move |leads| {
            if let Some(leadership) = weak.upgrade() {
                if leads {
                    leadership.lead();
                } else {
                    leadership.follow();
                }
            }
        }));
        leadership
    }

    /// The leader services, while this server leads.
    pub fn leader(&self) -> Option<Arc<Server>> {
        self.services.read().clone()
    }

    /// The leader services and the raft term they run in, while this
    /// server leads (0 for a server alone).
    pub fn leading_term(&self) -> Option<(Arc<Server>, u64)> {
        let services = self.services.read();
        services.clone().map(|server| (server, self.term.load(Ordering::Acquire)))
    }

    /// Runs `f` on this server's scheduling workers: its own pool on a
    /// server of a cluster, the leader services' on a server alone (none
    /// while it does not lead: it is shutting down).
    pub fn with_workers<R>(&self, f: impl FnOnce(&WorkerPool) -> R) -> Option<R> {
        match self.workers.get() {
            Some((pool, _)) => Some(f(pool)),
            None => self.leader().map(|server| f(server.workers())),
        }
    }

    /// What this server's workers did through the leader while following
    /// (zero on a server alone).
    pub fn remote_stats(&self) -> RemoteStats {
        self.workers.get().map(|(_, work)| work.stats()).unwrap_or_default()
    }

    /// This server's workers' counters.
    pub fn worker_stats(&self) -> WorkerStats {
        self.with_workers(WorkerPool::stats).unwrap_or_default()
    }

    /// Watches whether the leader services run (they start after the read
    /// barrier, so `true` means this server takes writes).
    pub fn watch(&self) -> tokio::sync::watch::Receiver<bool> {
        self.leading.subscribe()
    }

    /// Who serves a call: this server once its leader services run, or
    /// the server raft names the leader. During an election, or while
    /// this server passes its read barrier, it waits for either, at most
    /// the hold; then the error says why there is no leader. Once raft has
    /// stopped here, it answers [`LeaderError::Stopped`] at once.
    pub async fn settle(&self) -> Result<Settled, LeaderError> {
        let Some(durable) = &self.durable else {
            return self.leader().map(Settled::Leads).ok_or(LeaderError::NotLeading);
        };
        if durable.has_stopped() {
            return Err(LeaderError::Stopped);
        }
        let settled = || match self.leader() {
            Some(server) => Some(Settled::Leads(server)),
            None => durable.leader().filter(|(id, _)| *id != durable.id()).map(|_| Settled::Follows),
        };
        // Most calls find a leader at once: nothing to subscribe to.
        if let Some(settled) = settled() {
            return Ok(settled);
        }
        // Subscribed before looking again, so no change between is missed.
        let mut leading = self.leading.subscribe();
        let mut metrics = durable.raft().metrics();
        let wait = async {
            loop {
                if let Some(settled) = settled() {
                    return Ok(settled);
                }
                tokio::select! {
                    _ = leading.changed() => {}
                    changed = metrics.changed() => {
                        if changed.is_err() {
                            return Err(LeaderError::Stopped);
                        }
                    }
                }
            }
        };
        match tokio::time::timeout(self.hold, wait).await {
            Ok(settled) => settled,
            Err(_) => Err(leader_peer(durable).err().unwrap_or(LeaderError::NoLeader)),
        }
    }

    /// The store (replicated on every server; reads are served from it).
    pub fn store(&self) -> &Arc<StateStore> {
        &self.store
    }

    /// The durable state, if the server has a data dir.
    pub fn durable(&self) -> Option<&Arc<Durable>> {
        self.durable.as_ref()
    }

    /// Whether this server is one of several.
    pub fn is_clustered(&self) -> bool {
        self.durable.as_ref().is_some_and(|durable| durable.cluster().is_some())
    }

    /// Times this server became the leader.
    pub fn times_led(&self) -> u64 {
        self.gained.load(Ordering::Relaxed)
    }

    /// Starts the leader services (after raft's read barrier).
    fn lead(&self) {
        let Some(durable) = &self.durable else { return };
        let mut services = self.services.write();
        // A server shutting down may still win an election: it does not lead.
        if services.is_some() || self.closed.load(Ordering::Acquire) {
            return;
        }
        let server = Server::start_with(self.config.clone(), SystemClock::shared(), durable.writer());
        let term = durable.metrics().current_term;
        self.term.store(term, Ordering::Release);
        let stats = server.stats();
        tracing::info!(
            term,
            index = stats.index,
            pending_evals = stats.broker.total_ready + stats.broker.total_pending,
            blocked_evals = stats.blocked.total_blocked,
            "leading: leader services started"
        );
        *services = Some(Arc::new(server));
        self.gained.fetch_add(1, Ordering::Relaxed);
        self.leading.send_replace(true);
    }

    /// Stops the leader services for good: how a server shuts down (a
    /// leadership won after this starts nothing).
    pub fn close(&self) {
        self.refuse_leading();
        // The workers first: each finishes or gives back the eval it holds.
        if let Some((pool, _)) = self.workers.get() {
            pool.stop();
        }
        self.follow();
    }

    /// From now on, a leadership won starts nothing (shutting down).
    pub fn refuse_leading(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Stops the leader services, leaving the store to raft. Idempotent.
    pub fn follow(&self) {
        let taken = self.services.write().take();
        self.leading.send_replace(false);
        if let Some(server) = taken {
            server.stop();
            tracing::info!("following: leader services stopped");
        }
    }
}

impl LeaderServices for Leadership {
    fn leader(&self) -> Option<Arc<Server>> {
        Leadership::leader(self)
    }

    fn watch(&self) -> tokio::sync::watch::Receiver<bool> {
        Leadership::watch(self)
    }
}
