//! The engine's [`CommandLog`] on openraft, with group commit.
//!
//! openraft 0.9 makes each `client_write` its own log append and waits for
//! that append's fsync before it takes the next (`RaftCore::append_to_log`),
//! so one write per entry would cost one fsync each. Instead:
//! 1. [`RaftLog::submit`] queues the command and returns at once; the
//!    caller waits for (or awaits) the answer.
//! 2. One proposer task takes everything queued (up to [`MAX_BATCH`]) into
//!    one [`CommandBatch`] and writes it as one raft entry. While that
//!    entry is being made durable, new submissions queue up and become the
//!    next entry: concurrent writers share one fsync.
//! 3. Each submission is answered once its entry was committed (durable)
//!    and applied, with its own command's result. A write the log could
//!    not take is answered with [`StateError::Log`], never acknowledged:
//!    [`LogError::NotLeader`] (with the leader raft knows of) when this
//!    server does not lead or lost the leadership before the entry
//!    committed, [`LogError::Stopped`] when raft has stopped or failed
//!    (openraft's `Fatal`), which no retry here can cure.

use engine::state::{Applied, Command, CommandLog, LeaderHint, LogError, PendingWrite, StateError};
use openraft::error::{ClientWriteError, RaftError};
use tokio::sync::{mpsc, oneshot};

use crate::types::{CommandBatch, ServerNode, TypeConfig};

/// The most commands one raft entry carries.
pub const MAX_BATCH: usize = 1_024;

type Answer = oneshot::Sender<Result<Applied, StateError>>;

/// The engine's command log over openraft (module docs).
#[derive(Debug, Clone)]
pub struct RaftLog {
    queue: mpsc::UnboundedSender<(Command, Answer)>,
}

impl RaftLog {
    /// A log whose proposer runs on `runtime`, writing to `raft`.
    pub fn start(raft: openraft::Raft<TypeConfig>, runtime: &tokio::runtime::Handle) -> RaftLog {
        let (queue, queued) = mpsc::unbounded_channel();
        runtime.spawn(propose(raft, queued));
        RaftLog { queue }
    }
}

impl CommandLog for RaftLog {
    fn submit(&self, command: Command) -> PendingWrite {
        let (answer, answered) = oneshot::channel();
        if self.queue.send((command, answer)).is_err() {
            return PendingWrite::done(Err(StateError::ShuttingDown));
        }
        PendingWrite::waiting(async move { answered.await.unwrap_or(Err(StateError::ShuttingDown)) })
    }
}

/// The proposer (module docs, steps 2 and 3). Ends when every [`RaftLog`]
/// is dropped.
async fn propose(raft: openraft::Raft<TypeConfig>, mut queued: mpsc::UnboundedReceiver<(Command, Answer)>) {
    let mut commands = Vec::new();
    let mut answers = Vec::new();
    while let Some((command, answer)) = queued.recv().await {
        commands.push(std::sync::Arc::new(command));
        answers.push(answer);
        while commands.len() < MAX_BATCH {
            let Ok((command, answer)) = queued.try_recv() else { break };
            commands.push(std::sync::Arc::new(command));
            answers.push(answer);
        }
        let batch = CommandBatch(std::mem::take(&mut commands));
        match raft.client_write(batch).await {
            Ok(written) => {
                for (answer, result) in answers.drain(..).zip(written.data.0) {
                    let _ = answer.send(result);
                }
            }
            Err(error) => {
                tracing::warn!(%error, writes = answers.len(), "the raft log did not take a batch of writes");
                let refused = log_error(error);
                for answer in answers.drain(..) {
                    let _ = answer.send(Err(StateError::Log(refused.clone())));
                }
            }
        }
    }
}

/// What a write the raft log did not take is answered with (module docs,
/// step 3).
pub fn log_error(error: RaftError<u64, ClientWriteError<u64, ServerNode>>) -> LogError {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => {
            let leader = forward.leader_id.map(|id| leader_hint(id, forward.leader_node.as_ref()));
            LogError::NotLeader { leader }
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(refused)) => {
            LogError::Refused { reason: refused.to_string() }
        }
        RaftError::Fatal(fatal) => LogError::Stopped { reason: fatal.to_string() },
    }
}

/// The leader `id` at `node` (if its addresses are known), as a refused
/// write names it.
pub fn leader_hint(id: u64, node: Option<&ServerNode>) -> LeaderHint {
    let (rpc, http) = node.map(|node| (node.rpc.clone(), node.http.clone())).unwrap_or_default();
    LeaderHint { id, rpc, http }
}
