//! The messages of the client↔server protocol.
//!
//! Each message travels as the payload of one [`Frame`] whose `kind` names
//! the message; payloads are postcard (compact, deterministic, not
//! self-describing: the kind says what to decode). The frame's version byte
//! versions the whole set: a new message gets a new kind, a changed one a
//! new protocol version.
//!
//! A call is one bidirectional stream: the client writes one request frame
//! and finishes its side; the server answers with one reply frame (or a
//! [`Refusal`]) and finishes. The allocation watch is the exception: the
//! server keeps its side open and writes an [`AllocChanges`] whenever the
//! node's allocations change (an [`AllocsPush`], the whole list, to an
//! agent of an earlier build, which opened it as [`Kind::WatchAllocs`]).
//!
//! A server's call to an agent goes the other way, on the agent's own
//! connection (`crate::agent_call`): the server writes one
//! [`AgentCallRequest`] and finishes its side; the agent answers with one
//! [`AgentReply`], or a stream of [`FileChunk`]s that ends when the agent
//! finishes its side, or an [`AgentError`] (also in the middle of a stream).

use std::sync::Arc;
use std::time::Duration;

use engine::node::service_reads::{ServiceAnswer, ServiceQuery};
use engine::state::ClientAllocUpdate;
use engine::structs::job_refs::{decoding_jobs, encoding_jobs, JobTable};
use engine::structs::{AllocId, Allocation, Job, Node, NodeId, NodeStatus};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::frame::Frame;

mod agent;

pub use agent::{
    AgentCall, AgentCallRequest, AgentError, AgentErrorCode, AgentReply, AllocUsage, CpuUsage, DiskUsage, FileChunk,
    FileInfo, HostStats, LogStream, LogsCall, Origin, ProcessUsage, ReadCall, MAX_CHUNK,
};

/// What a frame's payload is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// [`RegisterRequest`]: a node registers or updates its information.
    Register = 1,
    /// [`HeartbeatRequest`]: the heartbeat, with the status the node asks for.
    Heartbeat = 2,
    /// [`UpdateAllocsRequest`]: the client's allocation statuses.
    UpdateAllocs = 3,
    /// [`WatchAllocsRequest`]: opens the node's allocation watch, pushed
    /// whole ([`AllocsPush`]): how agents of earlier builds watch.
    WatchAllocs = 4,
    /// [`AgentCallRequest`]: a server's call to an agent, on the agent's
    /// connection. (5 was the agent's question whether a token may read
    /// logs, from before agents served no listener of their own.)
    AgentCall = 6,
    /// [`ReadServicesRequest`]: an agent reads service registrations for
    /// its templates (a blocking query, served from the server's own state).
    ReadServices = 7,
    /// [`DrainSelfRequest`]: an agent drains its own node before it exits
    /// (`drain_on_shutdown`).
    DrainSelf = 8,
    /// [`WatchAllocChangesRequest`]: opens the node's allocation watch,
    /// pushed as changes ([`AllocChanges`]).
    WatchAllocChanges = 9,
    /// [`SubmitJobRequest`]: an operator registers a job.
    SubmitJob = 32,
    /// [`ReportRequest`]: an operator asks for the cluster report.
    Report = 33,
    /// [`NodeReply`]: the answer to a registration or a heartbeat.
    NodeReply = 64,
    /// [`IndexReply`]: the index an update was written at.
    IndexReply = 65,
    /// [`AllocsPush`]: the node's allocations, on its watch.
    AllocsPush = 66,
    /// [`ClusterReport`]: the answer to a report request.
    ClusterReport = 67,
    /// [`AgentReply`]: an agent's answer to a server's call.
    AgentReply = 68,
    /// [`FileChunk`]: a piece of a file an agent streams to a server.
    FileChunk = 69,
    /// [`AgentError`]: why an agent did not (or no longer) answer a call.
    AgentError = 70,
    /// [`ServicesReply`]: the answer to a services read.
    ServicesReply = 71,
    /// [`AllocChanges`]: what changed in the node's allocations, on its watch.
    AllocChanges = 72,
    /// [`Refusal`]: why a call was refused; nothing was written.
    Refusal = 127,
}

impl TryFrom<u8> for Kind {
    type Error = MessageError;

    fn try_from(byte: u8) -> Result<Kind, MessageError> {
        Ok(match byte {
            1 => Kind::Register,
            2 => Kind::Heartbeat,
            3 => Kind::UpdateAllocs,
            4 => Kind::WatchAllocs,
            6 => Kind::AgentCall,
            7 => Kind::ReadServices,
            8 => Kind::DrainSelf,
            9 => Kind::WatchAllocChanges,
            32 => Kind::SubmitJob,
            33 => Kind::Report,
            64 => Kind::NodeReply,
            65 => Kind::IndexReply,
            66 => Kind::AllocsPush,
            67 => Kind::ClusterReport,
            68 => Kind::AgentReply,
            69 => Kind::FileChunk,
            70 => Kind::AgentError,
            71 => Kind::ServicesReply,
            72 => Kind::AllocChanges,
            127 => Kind::Refusal,
            other => return Err(MessageError::UnknownKind(other)),
        })
    }
}

/// Why a frame's payload could not be read as the message it should be.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// The frame's kind is not one this build knows.
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    /// The frame is another message than the one expected here.
    #[error("expected a {expected:?} message, got {found:?}")]
    UnexpectedKind {
        /// What this point of the protocol expects.
        expected: Kind,
        /// What arrived.
        found: Kind,
    },
    /// The payload is not a valid message of its kind.
    #[error("malformed {kind:?} message: {reason}")]
    Malformed {
        /// The kind the frame announced.
        kind: Kind,
        /// What postcard found wrong.
        reason: String,
    },
}

/// A message of the protocol: its kind and its payload encoding.
pub trait Message: Sized {
    /// The frame kind that carries it.
    const KIND: Kind;

    /// The payload.
    fn to_payload(&self) -> Vec<u8>;

    /// The message from a payload of its kind.
    fn from_payload(payload: &[u8]) -> Result<Self, MessageError>;

    /// The message framed, pairing it with `request_id`.
    fn to_frame(&self, request_id: u64) -> Frame {
        Frame { kind: Self::KIND as u8, request_id, payload: self.to_payload() }
    }

    /// The message in `frame`; refuses a frame of another kind.
    fn from_frame(frame: &Frame) -> Result<Self, MessageError> {
        let found = Kind::try_from(frame.kind)?;
        if found != Self::KIND {
            return Err(MessageError::UnexpectedKind { expected: Self::KIND, found });
        }
        Self::from_payload(&frame.payload)
    }
}

/// The postcard payload of a plain message.
fn plain_payload<M: Serialize>(message: &M) -> Vec<u8> {
    postcard::to_allocvec(message).expect("a protocol message always encodes")
}

/// A plain message from its postcard payload; refuses trailing bytes.
fn plain_message<M: DeserializeOwned>(kind: Kind, payload: &[u8]) -> Result<M, MessageError> {
    let malformed = |reason: String| MessageError::Malformed { kind, reason };
    let (message, rest) = postcard::take_from_bytes(payload).map_err(|error| malformed(error.to_string()))?;
    if !rest.is_empty() {
        return Err(malformed(format!("{} bytes after the message", rest.len())));
    }
    Ok(message)
}

macro_rules! plain_messages {
    ($($message:ty => $kind:expr),* $(,)?) => {$(
        impl Message for $message {
            const KIND: Kind = $kind;

            fn to_payload(&self) -> Vec<u8> {
                plain_payload(self)
            }

            fn from_payload(payload: &[u8]) -> Result<Self, MessageError> {
                plain_message(Self::KIND, payload)
            }
        }
    )*};
}

plain_messages! {
    RegisterRequest => Kind::Register,
    HeartbeatRequest => Kind::Heartbeat,
    UpdateAllocsRequest => Kind::UpdateAllocs,
    WatchAllocsRequest => Kind::WatchAllocs,
    WatchAllocChangesRequest => Kind::WatchAllocChanges,
    AgentCallRequest => Kind::AgentCall,
    ReadServicesRequest => Kind::ReadServices,
    DrainSelfRequest => Kind::DrainSelf,
    ServicesReply => Kind::ServicesReply,
    AgentReply => Kind::AgentReply,
    FileChunk => Kind::FileChunk,
    AgentError => Kind::AgentError,
    SubmitJobRequest => Kind::SubmitJob,
    ReportRequest => Kind::Report,
    ClusterReport => Kind::ClusterReport,
    NodeReply => Kind::NodeReply,
    IndexReply => Kind::IndexReply,
    Refusal => Kind::Refusal,
}

/// A node registers (or re-registers with new information). The node's
/// `secret_id` becomes the secret every later call must carry; a node that
/// is already registered must present the secret it registered with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RegisterRequest {
    /// The node as the client fingerprinted it.
    pub node: Node,
}

/// The heartbeat. `status` is what the node asks for: `ready` normally,
/// `initializing` while it has not yet resynced its allocations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatRequest {
    /// The node.
    pub node_id: NodeId,
    /// Its secret.
    pub secret_id: Uuid,
    /// The status it asks for.
    pub status: NodeStatus,
}

/// The client's view of some of its allocations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateAllocsRequest {
    /// The node.
    pub node_id: NodeId,
    /// Its secret.
    pub secret_id: Uuid,
    /// One entry per allocation.
    pub updates: Vec<ClientAllocUpdate>,
}

/// An agent drains its own node (its `drain_on_shutdown` block): as an
/// operator's drain, authenticated by the node's secret; answered with
/// the index it was written at.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainSelfRequest {
    /// The node.
    pub node_id: NodeId,
    /// Its secret.
    pub secret_id: Uuid,
    /// Nomad's deadline: negative forces at once, zero is none, else nanoseconds.
    pub deadline_nanos: i64,
    /// Whether system allocations stay.
    pub ignore_system_jobs: bool,
}

/// Opens the node's allocation watch: the server answers at once with the
/// allocations if any changed after `last_index` (or `last_index` is 0),
/// and again after every write that changes them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchAllocsRequest {
    /// The node.
    pub node_id: NodeId,
    /// Its secret.
    pub secret_id: Uuid,
    /// The index of the last push the client applied (0: none).
    pub last_index: u64,
}

/// Opens the node's allocation watch as [`WatchAllocsRequest`] does
/// (the first push once something changed after `last_index`), but each
/// push is an [`AllocChanges`]: the first carries every allocation, the
/// later ones only those that changed since the push before, each with
/// the ids of all.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchAllocChangesRequest(pub WatchAllocsRequest);

/// An agent reads what its tasks' templates ask for: answered once the
/// services table's index passes `min_index` (at once for 0), or after
/// `wait` (at most [`MAX_SERVICES_WAIT`]) with the data as it is. Served
/// from the state of the server the agent is connected to, leader or not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadServicesRequest {
    /// The node.
    pub node_id: NodeId,
    /// Its secret.
    pub secret_id: Uuid,
    /// What to read (at most `engine::node::service_reads::MAX_SERVICE_QUERIES`).
    pub queries: Vec<ServiceQuery>,
    /// The services table's index of the agent's last answer (0: none).
    pub min_index: u64,
    /// How long the server may hold the read before answering unchanged.
    #[serde(with = "nanos")]
    pub wait: Duration,
}

/// The longest a server holds a services read (Nomad's blocking queries
/// wait at most 10 minutes; a shorter hold keeps a stalled call visible).
pub const MAX_SERVICES_WAIT: Duration = Duration::from_secs(300);

/// The answer to a [`ReadServicesRequest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServicesReply {
    /// The services table's index the answers are current at: the next
    /// read's `min_index`.
    pub index: u64,
    /// One answer per query, in the order asked.
    pub answers: Vec<ServiceAnswer>,
}

/// What a node learns from registering or heartbeating.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeReply {
    /// The state index the answer is current at.
    pub index: u64,
    /// The node's status now (the server decides; it may differ from the ask).
    pub status: NodeStatus,
    /// Heartbeat again within this (zero: the node is down and must
    /// register again).
    #[serde(with = "nanos")]
    pub heartbeat_ttl: Duration,
    /// The servers' client addresses, for the client's failover list.
    pub servers: Vec<String>,
}

/// The index an update was written at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexReply {
    /// The state index.
    pub index: u64,
}

/// Why a call was refused. Nothing was written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("refused ({code:?}): {message}")]
pub struct Refusal {
    /// The class of refusal, for the client to act on.
    pub code: RefusalCode,
    /// The server's explanation.
    pub message: String,
}

/// The classes of [`Refusal`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RefusalCode {
    /// No such node: register first.
    UnknownNode,
    /// The call's secret is not the node's.
    WrongSecret,
    /// The node is down or disconnected: heartbeat first.
    NotConnected,
    /// The node asked for a status only servers set.
    StatusNotAllowed,
    /// An update named an allocation not placed on the node.
    NotItsAllocation,
    /// An update named no allocation.
    EmptyUpdate,
    /// The request was not a valid message.
    Malformed,
    /// The server is shutting down: try another server, or this one later.
    ShuttingDown,
    /// An operator call from a connection without an operator certificate.
    Forbidden,
    /// The request is well-formed but makes no sense (an invalid job).
    Invalid,
    /// The server could not serve the call.
    Internal,
    /// The cluster has no leader right now (an election), or the server
    /// lost the leadership while writing: try again shortly; the call may
    /// have taken effect and is safe to repeat. The message names the
    /// leader when the server knows one.
    NoLeader,
    /// The server's raft log has stopped (shut down, or failed on a
    /// storage error): it takes no more writes. Retrying on this server
    /// cannot succeed; another server of the cluster may take the call.
    LogStopped,
}

/// An operator registers (or updates) a job. Only connections presenting
/// an operator certificate may (see [`crate::tls::OPERATOR_NAME`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitJobRequest {
    /// The job.
    pub job: Job,
}

/// An operator asks for the [`ClusterReport`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportRequest {
    /// How much of the report to make.
    pub scope: ReportScope,
}

/// How much of a [`ClusterReport`] the server makes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReportScope {
    /// What a poller watches, cheap enough to ask for every second: one
    /// pass over the nodes, the allocations and the evals, and the
    /// counters. [`ClusterReport::audit`] is `None`.
    #[default]
    Progress,
    /// The progress and the [`ClusterAudit`], which walks every node's
    /// allocations again and re-encodes the largest plan: for the end of a
    /// run, not for polling.
    Full,
}

/// The cluster as a server sees it: what load tests wait on, check their
/// invariants against, and report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterReport {
    /// The state index it is current at.
    pub index: u64,
    /// Whether the server has nothing to do (no eval ready, in flight or
    /// waiting to be retried, no plan queued).
    pub idle: bool,
    /// Nodes by status: ready, initializing, down, disconnected.
    pub nodes_ready: u64,
    /// See `nodes_ready`.
    pub nodes_initializing: u64,
    /// See `nodes_ready`.
    pub nodes_down: u64,
    /// See `nodes_ready`.
    pub nodes_disconnected: u64,
    /// Live allocations that hold ports, and the ports they hold.
    pub allocs_with_ports: u64,
    /// See `allocs_with_ports`.
    pub ports_held: u64,
    /// Jobs: id, type, allocations asked for (system jobs: the ready
    /// nodes that can run them), live (not terminal) and running.
    pub jobs: Vec<JobCounts>,
    /// Allocations by client status, terminal ones included.
    pub allocs_pending: u64,
    /// See `allocs_pending`.
    pub allocs_running: u64,
    /// See `allocs_pending`.
    pub allocs_unknown: u64,
    /// See `allocs_pending`.
    pub allocs_lost: u64,
    /// See `allocs_pending`.
    pub allocs_complete: u64,
    /// See `allocs_pending`.
    pub allocs_failed: u64,
    /// Replacements stopped because the allocation they replaced reconnected.
    pub replacements_stopped_for_reconnect: u64,
    /// Live allocations whose client status is unknown although their
    /// node is ready and has reported since it returned.
    pub unknown_on_ready_nodes: u64,
    /// Evals canceled (superseded before they ran).
    pub evals_canceled: u64,
    /// Evals not yet finished that are due.
    pub evals_pending: u64,
    /// Follow-up evals waiting for a later time (a disconnect expiry, a
    /// reschedule delay): scheduled work, not work left undone.
    pub evals_waiting: u64,
    /// The engine's counters.
    pub engine: engine::server::ServerStats,
    /// The client listener's counters.
    pub listener: ListenerStats,
    /// The server process's resident memory now and at its peak.
    pub rss_bytes: u64,
    /// See `rss_bytes`.
    pub peak_rss_bytes: u64,
    /// CPU time the server process has used so far (user and system), in
    /// milliseconds: two reports bracket what a phase cost the server.
    pub cpu_millis: u64,
    /// The client address of the server that made the report: the
    /// leader (a follower forwards the call to it).
    pub leader: String,
    /// The audit, in a report of [`ReportScope::Full`] only.
    pub audit: Option<ClusterAudit>,
}

/// What a full [`ClusterReport`] adds: the invariant audits, which read the
/// allocations themselves rather than trust the state's indexes, and the
/// figures of a run that cost as much.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterAudit {
    /// Nodes whose allocations ask for more than they have.
    pub nodes_oversubscribed: Vec<String>,
    /// Ports held twice on one node by live allocations, or held although
    /// the node reserves them, as `node: port`.
    pub port_collisions: Vec<String>,
    /// Originals stopped for their replacement (storm guard, reconnect)
    /// whose slot has no running allocation, as `job/name`: none should be.
    pub originals_stopped_unreplaced: Vec<String>,
    /// Eval latency (creation to completion) of completed evals, in
    /// microseconds: p50, p90, p99, max.
    pub eval_latency_us: [u64; 4],
    /// The plan that placed the most allocations: how many, and its size
    /// in the log format with each job once and with jobs inline.
    pub largest_plan_allocs: u64,
    /// See `largest_plan_allocs`.
    pub largest_plan_bytes: u64,
    /// See `largest_plan_allocs`.
    pub largest_plan_bytes_jobs_inline: u64,
}

/// A reading of a client listener's counters, in a [`ClusterReport`] (the
/// listener, `crate::server`, fills it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenerStats {
    /// Connections whose handshake completed.
    pub connections_accepted: u64,
    /// Connections open now.
    pub connections_open: u64,
    /// Connection attempts refused because too many handshakes were in
    /// progress (`crate::settings::MAX_HANDSHAKES`).
    pub handshakes_refused: u64,
    /// Handshakes that failed (a bad certificate, a timeout).
    pub handshakes_failed: u64,
    /// Calls served (refused ones included).
    pub calls: u64,
    /// Calls refused.
    pub refusals: u64,
    /// Calls refused for a wrong secret.
    pub wrong_secrets: u64,
    /// Streams closed for a malformed, oversized or unknown frame.
    pub malformed: u64,
    /// Allocation pushes sent on watches.
    pub pushes: u64,
}

/// One job in a [`ClusterReport`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobCounts {
    /// The job's id.
    pub id: String,
    /// service, batch, system or sysbatch.
    pub job_type: String,
    /// Allocations it asks for.
    pub desired: u64,
    /// Allocations not terminal.
    pub live: u64,
    /// Allocations running on their client.
    pub running: u64,
}

/// The node's allocations as of `index`. Each job version is carried once
/// and shared again by the allocations that refer to it, as in the command
/// log (`engine::structs::job_refs`).
#[derive(Clone, Debug, PartialEq)]
pub struct AllocsPush {
    /// The state index the list is current at; the client's next
    /// `last_index`.
    pub index: u64,
    /// Every allocation placed on the node.
    pub allocs: Vec<Arc<Allocation>>,
}

impl Message for AllocsPush {
    const KIND: Kind = Kind::AllocsPush;

    fn to_payload(&self) -> Vec<u8> {
        let index = postcard::to_allocvec(&self.index).expect("an index encodes");
        extend_with_allocs(index, &self.allocs)
    }

    fn from_payload(payload: &[u8]) -> Result<Self, MessageError> {
        let malformed = |reason: String| MessageError::Malformed { kind: Kind::AllocsPush, reason };
        let (index, rest): (u64, _) = postcard::take_from_bytes(payload).map_err(|e| malformed(e.to_string()))?;
        let allocs = allocs_to_end(rest).map_err(malformed)?;
        Ok(AllocsPush { index, allocs })
    }
}

/// What changed in the node's allocations as of `index`: each allocation
/// stored anew after the last index pushed on the watch's stream (every
/// one in a stream's first push, resumed or not), and the ids of every
/// allocation on the node, so the agent drops the ones no longer listed.
/// Those left out are as the agent last saw them, so it holds what an [`AllocsPush`]
/// would have said, for a fraction of the bytes: a placement is sent once,
/// not again with every later push to its node.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocChanges {
    /// The state index the changes are current at; the client's next
    /// `last_index`.
    pub index: u64,
    /// Every allocation on the node, by id.
    pub listed: Vec<AllocId>,
    /// The allocations that changed, each of them listed.
    pub allocs: Vec<Arc<Allocation>>,
}

impl Message for AllocChanges {
    const KIND: Kind = Kind::AllocChanges;

    fn to_payload(&self) -> Vec<u8> {
        let head = postcard::to_allocvec(&(self.index, &self.listed)).expect("an index and ids encode");
        extend_with_allocs(head, &self.allocs)
    }

    fn from_payload(payload: &[u8]) -> Result<Self, MessageError> {
        let malformed = |reason: String| MessageError::Malformed { kind: Kind::AllocChanges, reason };
        let ((index, listed), rest): ((u64, Vec<AllocId>), _) =
            postcard::take_from_bytes(payload).map_err(|e| malformed(e.to_string()))?;
        let allocs = allocs_to_end(rest).map_err(malformed)?;
        let ids: std::collections::HashSet<&AllocId> = listed.iter().collect();
        if let Some(alloc) = allocs.iter().find(|alloc| !ids.contains(&alloc.id)) {
            return Err(malformed(format!("allocation {} changed but is not listed", alloc.id)));
        }
        Ok(AllocChanges { index, listed, allocs })
    }
}

/// `bytes` followed by `allocs`, each job version once (a table of jobs,
/// then the allocations referring to it).
fn extend_with_allocs(bytes: Vec<u8>, allocs: &[Arc<Allocation>]) -> Vec<u8> {
    let table = JobTable::of(allocs.iter().map(|alloc| &alloc.job));
    let bytes = postcard::to_extend(table.jobs(), bytes).expect("a job always encodes");
    encoding_jobs(table, || postcard::to_extend(allocs, bytes)).expect("every job is in the table")
}

/// The allocations [`extend_with_allocs`] wrote, which must end `bytes`.
fn allocs_to_end(bytes: &[u8]) -> Result<Vec<Arc<Allocation>>, String> {
    let (jobs, rest): (Vec<Job>, _) = postcard::take_from_bytes(bytes).map_err(|e| e.to_string())?;
    let jobs = jobs.into_iter().map(Arc::new).collect();
    let (allocs, rest): (Vec<Arc<Allocation>>, _) =
        decoding_jobs(jobs, || postcard::take_from_bytes(rest)).map_err(|e| e.to_string())?;
    if !rest.is_empty() {
        return Err(format!("{} bytes after the message", rest.len()));
    }
    Ok(allocs)
}

/// Any message of the protocol, read by its frame's kind: what a decoder
/// that does not know what to expect (a fuzzer, a capture reader) uses.
#[derive(Clone, Debug, PartialEq)]
pub enum AnyMessage {
    /// [`Kind::Register`].
    Register(RegisterRequest),
    /// [`Kind::Heartbeat`].
    Heartbeat(HeartbeatRequest),
    /// [`Kind::UpdateAllocs`].
    UpdateAllocs(UpdateAllocsRequest),
    /// [`Kind::WatchAllocs`].
    WatchAllocs(WatchAllocsRequest),
    /// [`Kind::WatchAllocChanges`].
    WatchAllocChanges(WatchAllocChangesRequest),
    /// [`Kind::AgentCall`].
    AgentCall(AgentCallRequest),
    /// [`Kind::ReadServices`].
    ReadServices(ReadServicesRequest),
    /// [`Kind::DrainSelf`].
    DrainSelf(DrainSelfRequest),
    /// [`Kind::ServicesReply`].
    ServicesReply(ServicesReply),
    /// [`Kind::SubmitJob`].
    SubmitJob(SubmitJobRequest),
    /// [`Kind::Report`].
    Report(ReportRequest),
    /// [`Kind::ClusterReport`] (boxed: the largest message by far).
    ClusterReport(Box<ClusterReport>),
    /// [`Kind::NodeReply`].
    NodeReply(NodeReply),
    /// [`Kind::IndexReply`].
    IndexReply(IndexReply),
    /// [`Kind::AllocsPush`].
    AllocsPush(AllocsPush),
    /// [`Kind::AllocChanges`].
    AllocChanges(AllocChanges),
    /// [`Kind::AgentReply`].
    AgentReply(AgentReply),
    /// [`Kind::FileChunk`].
    FileChunk(FileChunk),
    /// [`Kind::AgentError`].
    AgentError(AgentError),
    /// [`Kind::Refusal`].
    Refusal(Refusal),
}

impl AnyMessage {
    /// The message in `frame`, whatever its kind.
    pub fn from_frame(frame: &Frame) -> Result<AnyMessage, MessageError> {
        let payload = &frame.payload;
        Ok(match Kind::try_from(frame.kind)? {
            Kind::Register => AnyMessage::Register(RegisterRequest::from_payload(payload)?),
            Kind::Heartbeat => AnyMessage::Heartbeat(HeartbeatRequest::from_payload(payload)?),
            Kind::UpdateAllocs => AnyMessage::UpdateAllocs(UpdateAllocsRequest::from_payload(payload)?),
            Kind::WatchAllocs => AnyMessage::WatchAllocs(WatchAllocsRequest::from_payload(payload)?),
            Kind::WatchAllocChanges => AnyMessage::WatchAllocChanges(WatchAllocChangesRequest::from_payload(payload)?),
            Kind::AgentCall => AnyMessage::AgentCall(AgentCallRequest::from_payload(payload)?),
            Kind::ReadServices => AnyMessage::ReadServices(ReadServicesRequest::from_payload(payload)?),
            Kind::DrainSelf => AnyMessage::DrainSelf(DrainSelfRequest::from_payload(payload)?),
            Kind::ServicesReply => AnyMessage::ServicesReply(ServicesReply::from_payload(payload)?),
            Kind::AgentReply => AnyMessage::AgentReply(AgentReply::from_payload(payload)?),
            Kind::FileChunk => AnyMessage::FileChunk(FileChunk::from_payload(payload)?),
            Kind::AgentError => AnyMessage::AgentError(AgentError::from_payload(payload)?),
            Kind::SubmitJob => AnyMessage::SubmitJob(SubmitJobRequest::from_payload(payload)?),
            Kind::Report => AnyMessage::Report(ReportRequest::from_payload(payload)?),
            Kind::ClusterReport => AnyMessage::ClusterReport(Box::new(ClusterReport::from_payload(payload)?)),
            Kind::NodeReply => AnyMessage::NodeReply(NodeReply::from_payload(payload)?),
            Kind::IndexReply => AnyMessage::IndexReply(IndexReply::from_payload(payload)?),
            Kind::AllocsPush => AnyMessage::AllocsPush(AllocsPush::from_payload(payload)?),
            Kind::AllocChanges => AnyMessage::AllocChanges(AllocChanges::from_payload(payload)?),
            Kind::Refusal => AnyMessage::Refusal(Refusal::from_payload(payload)?),
        })
    }

    /// The message framed again.
    pub fn to_frame(&self, request_id: u64) -> Frame {
        match self {
            AnyMessage::Register(message) => message.to_frame(request_id),
            AnyMessage::Heartbeat(message) => message.to_frame(request_id),
            AnyMessage::UpdateAllocs(message) => message.to_frame(request_id),
            AnyMessage::WatchAllocs(message) => message.to_frame(request_id),
            AnyMessage::WatchAllocChanges(message) => message.to_frame(request_id),
            AnyMessage::AgentCall(message) => message.to_frame(request_id),
            AnyMessage::ReadServices(message) => message.to_frame(request_id),
            AnyMessage::DrainSelf(message) => message.to_frame(request_id),
            AnyMessage::ServicesReply(message) => message.to_frame(request_id),
            AnyMessage::AgentReply(message) => message.to_frame(request_id),
            AnyMessage::FileChunk(message) => message.to_frame(request_id),
            AnyMessage::AgentError(message) => message.to_frame(request_id),
            AnyMessage::SubmitJob(message) => message.to_frame(request_id),
            AnyMessage::Report(message) => message.to_frame(request_id),
            AnyMessage::ClusterReport(message) => message.to_frame(request_id),
            AnyMessage::NodeReply(message) => message.to_frame(request_id),
            AnyMessage::IndexReply(message) => message.to_frame(request_id),
            AnyMessage::AllocsPush(message) => message.to_frame(request_id),
            AnyMessage::AllocChanges(message) => message.to_frame(request_id),
            AnyMessage::Refusal(message) => message.to_frame(request_id),
        }
    }
}

/// Feeds `bytes` through the decoder as a server reads a stream: frames
/// (with the request limit) and the message in each. Every message that
/// decodes must encode back to a frame that decodes to the same message.
/// The fuzz target and the decoder test call this; it panics only on a
/// broken round trip, never on bad input.
pub fn decode_all(bytes: &[u8]) -> usize {
    let mut offset = 0;
    let mut decoded = 0;
    while offset < bytes.len() {
        let Ok(Some((frame, used))) = Frame::decode_within(&bytes[offset..], crate::settings::MAX_REQUEST) else {
            break;
        };
        offset += used;
        if let Ok(message) = AnyMessage::from_frame(&frame) {
            // Compared as bytes: a float field may hold a NaN.
            let encoded = message.to_frame(frame.request_id);
            let again = AnyMessage::from_frame(&encoded).expect("a re-encoded message decodes");
            assert_eq!(again.to_frame(frame.request_id), encoded, "a message survives a round trip");
            decoded += 1;
        }
    }
    decoded
}

/// Durations as whole nanoseconds, as in the engine's log format.
mod nanos {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        serializer.serialize_u64(nanos)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_nanos(u64::deserialize(deserializer)?))
    }
}

#[cfg(test)]
#[path = "message_test.rs"]
mod message_test;
