//! The one seam every write goes through: a [`Writer`] submits a
//! [`Command`] to the log, and the log has the store apply it at its
//! position ([`super::StateStore::apply_at`]). In one process the store is
//! its own log and applies at once; a replicated log (openraft) appends,
//! commits and applies, and answers when the command was applied.
//!
//! A submission answers in both worlds: [`PendingWrite::wait`] blocks a
//! thread (engine threads), `.await` parks no thread (a network server's
//! tasks). The engine starts no runtime for either.
//!
//! A write the log does not take is answered with a [`LogError`], which
//! keeps apart what a caller must act on differently (openraft's
//! `RaftError { APIError, Fatal }`): [`LogError::NotLeader`] (retry on the
//! leader, or here after an election) and [`LogError::Stopped`] (this
//! server takes no more writes; retrying here cannot succeed).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use serde::{Deserialize, Serialize};

use super::{Applied, Command, StateError, StateStore};

/// Where commands are appended to be applied: the store itself in one
/// process, a replicated log in a cluster.
pub trait CommandLog: Send + Sync + std::fmt::Debug {
    /// Submits `command`; the answer comes once it was applied at its log
    /// position, or refused.
    fn submit(&self, command: Command) -> PendingWrite;
}

impl CommandLog for StateStore {
    /// The store as its own log: applied at once, at the next position.
    fn submit(&self, command: Command) -> PendingWrite {
        PendingWrite::done(self.apply(command))
    }
}

/// Why a [`CommandLog`] did not take a write (module docs). Nothing was
/// acknowledged, though a write a leader lost its leadership over may still
/// take effect: every command is safe to repeat.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum LogError {
    /// This server does not lead, so its log takes no writes: retry on the
    /// leader, when one is known, or here after the election.
    #[error("{}", not_leader(.leader.as_ref()))]
    NotLeader {
        /// The leader this server knows of, if any.
        leader: Option<LeaderHint>,
    },
    /// The log has stopped (shut down) or failed (a storage error, a
    /// panic): this server takes no more writes, and retrying here cannot
    /// succeed.
    #[error("the command log has stopped: {reason}")]
    Stopped {
        /// What stopped it, for people.
        reason: String,
    },
    /// The log refused the write for another reason (raft's
    /// membership-change refusals, which a command does not cause).
    #[error("the command log refused the write: {reason}")]
    Refused {
        /// Why, for people.
        reason: String,
    },
}

/// The leader a server that does not lead knows of, as a refused write
/// names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderHint {
    /// Its id in the cluster.
    pub id: u64,
    /// Its client (agent) address, `host:port`; empty when unknown.
    pub rpc: String,
    /// Its HTTP API address, `host:port`; empty when unknown.
    pub http: String,
}

impl std::fmt::Display for LeaderHint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "server {}", self.id)?;
        match (self.rpc.is_empty(), self.http.is_empty()) {
            (true, true) => Ok(()),
            (false, true) => write!(f, " (client address {})", self.rpc),
            (true, false) => write!(f, " (HTTP address {})", self.http),
            (false, false) => write!(f, " (client address {}, HTTP address {})", self.rpc, self.http),
        }
    }
}

/// The message of [`LogError::NotLeader`].
fn not_leader(leader: Option<&LeaderHint>) -> String {
    match leader {
        Some(leader) => format!("this server is not the leader; the leader is {leader}"),
        None => "this server is not the leader, and knows of no leader (an election)".to_string(),
    }
}

type WriteFuture = Pin<Box<dyn Future<Output = Result<Applied, StateError>> + Send>>;

/// A submitted write and its answer, to wait for or await.
pub struct PendingWrite(Pending);

enum Pending {
    Done(Option<Result<Applied, StateError>>),
    Waiting(WriteFuture),
}

impl std::fmt::Debug for PendingWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.0 {
            Pending::Done(_) => "done",
            Pending::Waiting(_) => "waiting",
        };
        f.debug_tuple("PendingWrite").field(&state).finish()
    }
}

impl PendingWrite {
    /// A write answered already.
    pub fn done(result: Result<Applied, StateError>) -> Self {
        PendingWrite(Pending::Done(Some(result)))
    }

    /// A write whose answer `future` resolves to.
    pub fn waiting(future: impl Future<Output = Result<Applied, StateError>> + Send + 'static) -> Self {
        PendingWrite(Pending::Waiting(Box::pin(future)))
    }

    /// Blocks this thread until the write is answered.
    pub fn wait(self) -> Result<Applied, StateError> {
        futures_lite::future::block_on(self)
    }

    /// The answer, taken, if it has come (a store that is its own log
    /// answers at once); else None, and the write is still to wait for.
    pub fn answer_now(&mut self) -> Option<Result<Applied, StateError>> {
        match Pin::new(self).poll(&mut Context::from_waker(std::task::Waker::noop())) {
            Poll::Ready(answer) => Some(answer),
            Poll::Pending => None,
        }
    }
}

impl Future for PendingWrite {
    type Output = Result<Applied, StateError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.0 {
            Pending::Done(result) => Poll::Ready(result.take().unwrap_or(Err(StateError::ShuttingDown))),
            Pending::Waiting(future) => future.as_mut().poll(cx),
        }
    }
}

/// The handle every component writes through; reads go to its store.
#[derive(Clone, Debug)]
pub struct Writer {
    log: Arc<dyn CommandLog>,
    store: Arc<StateStore>,
}

impl Writer {
    /// Writes applied by `store` itself, at once.
    pub fn direct(store: Arc<StateStore>) -> Self {
        Writer { log: store.clone(), store }
    }

    /// Writes appended to `log`, which has `store` apply them.
    pub fn through(log: Arc<dyn CommandLog>, store: Arc<StateStore>) -> Self {
        Writer { log, store }
    }

    /// Submits `command` and blocks until it was applied or refused.
    pub fn write(&self, command: Command) -> Result<Applied, StateError> {
        self.submit(command).wait()
    }

    /// Submits `command`; await or wait for the answer.
    pub fn submit(&self, command: Command) -> PendingWrite {
        let started = std::time::Instant::now();
        match self.log.submit(command) {
            PendingWrite(Pending::Done(result)) => {
                crate::timing::record_since("drover.state.write", started);
                PendingWrite(Pending::Done(result))
            }
            PendingWrite(Pending::Waiting(future)) => PendingWrite::waiting(async move {
                let written = future.await;
                crate::timing::record_since("drover.state.write", started);
                written
            }),
        }
    }

    /// The store the log applies to: read it through snapshots.
    pub fn store(&self) -> &Arc<StateStore> {
        &self.store
    }
}
