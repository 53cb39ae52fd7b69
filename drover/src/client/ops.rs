//! The servers' calls to this agent (`transport::agent_call`), on the
//! connection the agent opened: no port of its own, and no token to
//! check: the servers checked the caller's ACL token before they called
//! (`drover/src/http/acl.rs`), and the connection's mutual TLS says they
//! are the cluster's servers.
//!
//! [`ClientOps`] knows the allocations the agent runs (kept up to date by
//! `agent.rs`) and answers from them: logs and files from the allocation
//! directories (`fs.rs`, `logs.rs`), restarts and signals through each
//! allocation's [`AllocControl`], usage from `/proc` (`stats.rs`), and
//! garbage collection through the client core, which decides what is
//! destroyed ([`GcRequest`]).
//!
//! A stream (logs, a file) is sent a chunk at a time, each at most
//! [`MAX_CHUNK`] bytes and sent only once the caller took the ones before
//! (flow control); the first goes at once, even empty. A followed stream
//! looks for more every [`FOLLOW_POLL`] until its task is dead (logs) or
//! its allocation is gone (files), or the caller goes away.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use engine::structs::{AllocId, Allocation, NodeId, TaskState, TaskStatus};
use tokio::sync::{mpsc, oneshot};
use transport::agent_call::ServerCall;
use transport::client::ClientConnection;
use transport::message::{
    AgentCall, AgentError, AgentErrorCode, AgentReply, AllocUsage, FileChunk, LogStream, LogsCall, Origin, ReadCall,
    MAX_CHUNK,
};

use crate::client::alloc_dir::AllocDir;
use crate::client::alloc_runner::{AllocControl, ControlError};
use crate::client::fs::{error, AllocFs, FileCursor};
use crate::client::logs::{self, LogKind, StreamCursor};
use crate::client::stats::{self, CpuScale};

/// How often a followed stream looks for more.
pub const FOLLOW_POLL: Duration = Duration::from_millis(250);

/// An operator's garbage collection, for the agent's runtime to hand to
/// the client core: `alloc_id`'s directories, or every ended allocation's.
#[derive(Debug)]
pub struct GcRequest {
    /// The allocation (none: every ended one).
    pub alloc_id: Option<AllocId>,
    /// Where the outcome goes.
    pub reply: oneshot::Sender<Result<(), AgentError>>,
}

/// What the agent answers the servers' calls from (module docs).
#[derive(Debug)]
pub struct ClientOps {
    node_id: NodeId,
    /// Where allocations live (none: the agent runs no real tasks).
    data_dir: Option<PathBuf>,
    scale: CpuScale,
    allocs: parking_lot::Mutex<HashMap<AllocId, Held>>,
    gc: mpsc::UnboundedSender<GcRequest>,
}

/// One allocation as the operations see it.
#[derive(Debug, Default)]
struct Held {
    /// Its tasks, and whether each is dead.
    tasks: BTreeMap<String, bool>,
    /// Its runner's controls, while it has a runner.
    control: Option<AllocControl>,
}

impl ClientOps {
    /// The operations of the agent of `node`, its allocations under
    /// `data_dir`; garbage collections go to the receiver returned.
    pub fn new(
        node: &engine::structs::Node,
        data_dir: Option<PathBuf>,
    ) -> (Arc<ClientOps>, mpsc::UnboundedReceiver<GcRequest>) {
        let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
        let scale = CpuScale { mhz_per_core: node.resources.cpu as f64 / cores };
        let (gc, requests) = mpsc::unbounded_channel();
        let ops = ClientOps { node_id: node.id, data_dir, scale, allocs: Default::default(), gc };
        (Arc::new(ops), requests)
    }

    /// Learns an allocation's tasks and which are dead.
    pub fn note(&self, alloc: &Allocation, states: &BTreeMap<String, TaskState>) {
        let tasks = alloc.job.group(&alloc.task_group).map(|group| group.tasks.as_slice()).unwrap_or_default();
        let dead = tasks
            .iter()
            .map(|task| {
                (task.name.clone(), states.get(&task.name).is_some_and(|state| state.state == TaskStatus::Dead))
            })
            .collect();
        self.allocs.lock().entry(alloc.id).or_default().tasks = dead;
    }

    /// Learns an allocation runner's controls.
    pub fn attach(&self, alloc_id: AllocId, control: AllocControl) {
        self.allocs.lock().entry(alloc_id).or_default().control = Some(control);
    }

    /// Forgets an allocation (garbage collected).
    pub fn forget(&self, alloc_id: AllocId) {
        self.allocs.lock().remove(&alloc_id);
    }

    /// Answers the calls the server makes on `connection` until it ends.
    pub async fn serve(self: Arc<ClientOps>, connection: ClientConnection) {
        while let Ok(call) = connection.accept_call().await {
            let ops = self.clone();
            tokio::spawn(async move { ops.answer(call).await });
        }
    }

    /// Answers one call.
    async fn answer(&self, mut call: ServerCall) {
        let Some(request) = call.request().await else { return };
        if request.node_id != self.node_id {
            let message = format!("this agent is node {}, not {}", self.node_id, request.node_id);
            return call.fail(&error(AgentErrorCode::Invalid, message)).await;
        }
        let alloc_id = request.call.alloc_id();
        let replied = match request.call {
            AgentCall::Logs(logs) => return self.stream_logs(call, logs).await,
            AgentCall::Read(read) => return self.stream_file(call, read).await,
            AgentCall::List { alloc_id, path } => {
                self.files(alloc_id).and_then(|fs| fs.list(&path)).map(AgentReply::Files)
            }
            AgentCall::Stat { alloc_id, path } => {
                self.files(alloc_id).and_then(|fs| fs.stat(&path)).map(AgentReply::File)
            }
            AgentCall::Restart { alloc_id, task } => {
                let control = self.control(alloc_id);
                match control {
                    Ok(control) => control.restart(task.as_deref()).await.map_err(control_error),
                    Err(refused) => Err(refused),
                }
                .map(|()| AgentReply::Done)
            }
            AgentCall::Signal { alloc_id, task, signal } => self.signal(alloc_id, task, &signal).await,
            AgentCall::AllocStats { alloc_id } => self.alloc_stats(alloc_id),
            AgentCall::AllocGc { alloc_id } => self.collect(Some(alloc_id)).await,
            AgentCall::HostStats => {
                let dir = self.data_dir.clone().unwrap_or_else(|| PathBuf::from("/"));
                Ok(AgentReply::HostStats(stats::host_stats(&dir, self.scale)))
            }
            AgentCall::HostGc => self.collect(None).await,
        };
        match replied {
            Ok(reply) => call.reply(&reply).await,
            Err(refused) => {
                tracing::debug!(alloc = ?alloc_id, %refused, "refused a server's call");
                call.fail(&refused).await
            }
        }
    }

    /// The allocation's files; "unknown" for one the agent does not hold.
    fn files(&self, alloc_id: AllocId) -> Result<AllocFs, AgentError> {
        let unknown = || error(AgentErrorCode::UnknownAlloc, format!("Unknown allocation \"{alloc_id}\""));
        let data_dir = self.data_dir.as_ref().ok_or_else(unknown)?;
        if !self.allocs.lock().contains_key(&alloc_id) {
            return Err(unknown());
        }
        AllocFs::open(AllocDir::new(data_dir, alloc_id).root()).map_err(|_| unknown())
    }

    /// The allocation's runner controls.
    fn control(&self, alloc_id: AllocId) -> Result<AllocControl, AgentError> {
        let allocs = self.allocs.lock();
        let held = allocs
            .get(&alloc_id)
            .ok_or_else(|| error(AgentErrorCode::UnknownAlloc, format!("Unknown allocation \"{alloc_id}\"")))?;
        held.control
            .clone()
            .ok_or_else(|| error(AgentErrorCode::WrongState, format!("allocation {alloc_id} runs no tasks here")))
    }

    /// Whether `task` of `alloc_id` is dead; `None` when either is unknown.
    fn task_dead(&self, alloc_id: AllocId, task: &str) -> Option<bool> {
        self.allocs.lock().get(&alloc_id)?.tasks.get(task).copied()
    }

    async fn signal(&self, alloc_id: AllocId, task: Option<String>, name: &str) -> Result<AgentReply, AgentError> {
        let Some(signal) = crate::client::drivers::raw_exec::signal(name) else {
            return Err(error(AgentErrorCode::Invalid, format!("invalid signal {name:?}")));
        };
        let control = self.control(alloc_id)?;
        control.signal(task.as_deref(), signal, name).await.map_err(control_error)?;
        Ok(AgentReply::Done)
    }

    fn alloc_stats(&self, alloc_id: AllocId) -> Result<AgentReply, AgentError> {
        let control = self.control(alloc_id)?;
        let tasks = control
            .running()
            .into_iter()
            .filter_map(|(task, handle)| Some((task, stats::group_usage(handle.pid(), self.scale)?)))
            .collect();
        let timestamp = i64::try_from(crate::client::clock::now().0).unwrap_or(i64::MAX);
        Ok(AgentReply::AllocStats(AllocUsage { tasks, timestamp }))
    }

    /// Asks the client core to collect, and waits for its answer.
    async fn collect(&self, alloc_id: Option<AllocId>) -> Result<AgentReply, AgentError> {
        let (reply, answer) = oneshot::channel();
        let stopped = || error(AgentErrorCode::Internal, "the agent is stopping");
        self.gc.send(GcRequest { alloc_id, reply }).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?.map(|()| AgentReply::Done)
    }

    /// Streams a task's log (module docs).
    async fn stream_logs(&self, mut call: ServerCall, logs: LogsCall) {
        let LogsCall { alloc_id, task, stream, origin, offset, follow } = logs;
        let opened = self.files(alloc_id).and_then(|_| match (self.task_dead(alloc_id, &task), &self.data_dir) {
            (Some(_), Some(data_dir)) => Ok(data_dir),
            _ => Err(error(AgentErrorCode::NotFound, format!("allocation {alloc_id} has no task {task:?}"))),
        });
        let data_dir = match opened {
            Ok(data_dir) => data_dir,
            Err(refused) => return call.fail(&refused).await,
        };
        let kind = match stream {
            LogStream::Stdout => LogKind::Stdout,
            LogStream::Stderr => LogKind::Stderr,
        };
        let logs_dir = AllocDir::new(data_dir, alloc_id).logs_dir();
        let mut cursor = StreamCursor::new(&logs_dir, &logs::prefix(&task, kind), offset, origin == Origin::End);
        let mut first = true;
        loop {
            // Whether the task is dead is read before reading, so nothing
            // written just before it died is missed.
            let dead = self.task_dead(alloc_id, &task).unwrap_or(true);
            let data = match cursor.read_more(MAX_CHUNK) {
                Ok(data) => data,
                Err(source) => {
                    return call.fail(&error(AgentErrorCode::Internal, format!("reading the log: {source}"))).await
                }
            };
            if !data.is_empty() || first {
                first = false;
                let (file, offset) = cursor.position().unwrap_or_default();
                if call.chunk(&FileChunk { file, offset, data }).await.is_err() {
                    return;
                }
                continue;
            }
            if !follow || dead || !self.wait_for_more(&mut call).await {
                return call.finish();
            }
        }
    }

    /// Streams a file (module docs).
    async fn stream_file(&self, mut call: ServerCall, read: ReadCall) {
        let ReadCall { alloc_id, path, origin, offset, limit, follow } = read;
        let opened = self
            .files(alloc_id)
            .and_then(|fs| fs.readable(&path))
            .and_then(|found| FileCursor::open(found, offset, origin == Origin::End, limit));
        let mut cursor = match opened {
            Ok(cursor) => cursor,
            Err(refused) => return call.fail(&refused).await,
        };
        let mut first = true;
        loop {
            let data = match cursor.read_more(MAX_CHUNK) {
                Ok(data) => data,
                Err(source) => {
                    return call.fail(&error(AgentErrorCode::Internal, format!("reading {path:?}: {source}"))).await
                }
            };
            if !data.is_empty() || first {
                first = false;
                let chunk = FileChunk { file: path.clone(), offset: cursor.offset(), data };
                if call.chunk(&chunk).await.is_err() {
                    return;
                }
                continue;
            }
            let held = self.allocs.lock().contains_key(&alloc_id);
            if !follow || cursor.done() || !held || !self.wait_for_more(&mut call).await {
                return call.finish();
            }
        }
    }

    /// Waits [`FOLLOW_POLL`] before a followed stream looks again; `false`
    /// when the caller went away meanwhile.
    async fn wait_for_more(&self, call: &mut ServerCall) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(FOLLOW_POLL) => true,
            _ = call.caller_gone() => false,
        }
    }
}

/// How a refused restart or signal is answered.
fn control_error(refused: ControlError) -> AgentError {
    let code = match refused {
        ControlError::UnknownTask(_) => AgentErrorCode::NotFound,
        ControlError::NotRunning(_) | ControlError::NoneRunning => AgentErrorCode::WrongState,
    };
    error(code, refused.to_string())
}
