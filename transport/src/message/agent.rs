//! The messages of a server's calls to an agent, on the agent's own
//! connection (`crate::agent_call` has the protocol): the call, and the
//! agent's reply, chunks of a stream, or error.

use engine::structs::{AllocId, NodeId};
use serde::{Deserialize, Serialize};

/// A server's call to an agent ([`Kind::AgentCall`](super::Kind::AgentCall)),
/// on the connection the agent opened to it: the servers checked the
/// caller's ACL token before they made it, and the agent checks only that
/// it is the node named (a connection carries one node's calls).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentCallRequest {
    /// The node the call is for.
    pub node_id: NodeId,
    /// What is asked.
    pub call: AgentCall,
}

/// What a server asks of an agent. Paths are relative to the
/// allocation's directory (Nomad's: `alloc/logs/web.stdout.0`,
/// `web/local/file`), with or without a leading `/`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AgentCall {
    /// A task's log, as [`FileChunk`]s.
    Logs(LogsCall),
    /// The entries of a directory: [`AgentReply::Files`].
    List {
        /// The allocation.
        alloc_id: AllocId,
        /// The directory.
        path: String,
    },
    /// One file's or directory's information: [`AgentReply::File`].
    Stat {
        /// The allocation.
        alloc_id: AllocId,
        /// The file.
        path: String,
    },
    /// A file's bytes, as [`FileChunk`]s.
    Read(ReadCall),
    /// Restarts a task, or every running task without one, in place: not
    /// counted against the restart policy. [`AgentReply::Done`].
    Restart {
        /// The allocation.
        alloc_id: AllocId,
        /// The task (none: every running task).
        task: Option<String>,
    },
    /// Sends a signal to a task's processes, or to every running task's
    /// without one. [`AgentReply::Done`].
    Signal {
        /// The allocation.
        alloc_id: AllocId,
        /// The task (none: every running task).
        task: Option<String>,
        /// The signal's name as job files write it (`SIGUSR1`).
        signal: String,
    },
    /// The resources an allocation's tasks use now: [`AgentReply::AllocStats`].
    AllocStats {
        /// The allocation.
        alloc_id: AllocId,
    },
    /// Removes a terminal allocation's directories: [`AgentReply::Done`].
    AllocGc {
        /// The allocation.
        alloc_id: AllocId,
    },
    /// The host's resources: [`AgentReply::HostStats`].
    HostStats,
    /// Removes every terminal allocation's directories: [`AgentReply::Done`].
    HostGc,
}

impl AgentCall {
    /// The allocation the call is about, if it is about one.
    pub fn alloc_id(&self) -> Option<AllocId> {
        match self {
            AgentCall::Logs(logs) => Some(logs.alloc_id),
            AgentCall::Read(read) => Some(read.alloc_id),
            AgentCall::List { alloc_id, .. }
            | AgentCall::Stat { alloc_id, .. }
            | AgentCall::Restart { alloc_id, .. }
            | AgentCall::Signal { alloc_id, .. }
            | AgentCall::AllocStats { alloc_id }
            | AgentCall::AllocGc { alloc_id } => Some(*alloc_id),
            AgentCall::HostStats | AgentCall::HostGc => None,
        }
    }
}

/// [`AgentCall::Logs`]: Nomad's `/v1/client/fs/logs/<alloc>`. The stream
/// is the task's log files still kept, oldest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogsCall {
    /// The allocation.
    pub alloc_id: AllocId,
    /// The task.
    pub task: String,
    /// stdout or stderr.
    pub stream: LogStream,
    /// Where `offset` counts from.
    pub origin: Origin,
    /// Bytes from `origin`.
    pub offset: u64,
    /// Go on with what the task writes next, until the task is dead (and
    /// all of it is sent) or the caller goes away.
    pub follow: bool,
}

/// Which of a task's output streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// Where an offset counts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Origin {
    /// The start: the offset is the bytes skipped.
    Start,
    /// The end: the offset is the bytes before it.
    End,
}

/// [`AgentCall::Read`]: Nomad's `cat`, `readat` and `stream`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadCall {
    /// The allocation.
    pub alloc_id: AllocId,
    /// The file.
    pub path: String,
    /// Where `offset` counts from.
    pub origin: Origin,
    /// Bytes from `origin`.
    pub offset: u64,
    /// At most this many bytes (none: to the end).
    pub limit: Option<u64>,
    /// Go on with what is appended, until the caller goes away or the
    /// allocation's directories are removed.
    pub follow: bool,
}

/// An agent's answer to a call that is not a stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum AgentReply {
    /// Done.
    Done,
    /// A directory's entries.
    Files(Vec<FileInfo>),
    /// One file's information.
    File(FileInfo),
    /// An allocation's resource usage.
    AllocStats(AllocUsage),
    /// The host's.
    HostStats(HostStats),
}

/// A file or directory, as Nomad's `AllocFileInfo` describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInfo {
    /// Its name (the last part of its path).
    pub name: String,
    /// Whether it is a directory.
    pub is_dir: bool,
    /// Its size in bytes.
    pub size: u64,
    /// Its permission bits and type (`st_mode`).
    pub mode: u32,
    /// When it was last modified, in Unix nanoseconds.
    pub mod_time: i64,
}

/// The most data one [`FileChunk`] carries: a stream is sent in pieces a
/// slow reader can hold up without any side buffering more.
pub const MAX_CHUNK: usize = 64 * 1024;

/// A piece of a file ([`Kind::FileChunk`](super::Kind::FileChunk)), at most
/// [`MAX_CHUNK`] bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChunk {
    /// The file it is from (a log: its current file, `web.stdout.3`).
    pub file: String,
    /// The offset in that file after the chunk.
    pub offset: u64,
    /// The bytes.
    pub data: Vec<u8>,
}

/// Why an agent did not answer a call
/// ([`Kind::AgentError`](super::Kind::AgentError)); nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct AgentError {
    /// The class of error, for the servers' HTTP status.
    pub code: AgentErrorCode,
    /// The agent's explanation.
    pub message: String,
}

/// The classes of [`AgentError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AgentErrorCode {
    /// The agent does not hold the allocation (any more).
    UnknownAlloc,
    /// No such task, file or directory.
    NotFound,
    /// The request makes no sense: a path leaving the allocation's
    /// directory, a signal that does not exist, a directory to read.
    Invalid,
    /// A secret the agent does not hand out (a task's `secrets/`).
    Forbidden,
    /// The task is not running, or the allocation not terminal.
    WrongState,
    /// The agent could not do it (an I/O error).
    Internal,
}

/// The resources an allocation's tasks use, by task (running ones only).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AllocUsage {
    /// Each running task's.
    pub tasks: std::collections::BTreeMap<String, ProcessUsage>,
    /// When it was read, in Unix nanoseconds.
    pub timestamp: i64,
}

/// What a task's processes use, read from `/proc`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessUsage {
    /// Resident memory, bytes.
    pub rss_bytes: u64,
    /// Swapped out, bytes.
    pub swap_bytes: u64,
    /// Share of one core spent in user mode since the processes started, percent.
    pub user_percent: f64,
    /// Share of one core spent in the kernel, percent.
    pub system_percent: f64,
    /// Both, percent.
    pub percent: f64,
    /// The same in MHz of the node's CPU (Nomad's `TotalTicks`).
    pub total_ticks: f64,
    /// The processes counted.
    pub pids: u32,
}

/// The host's resources, as Nomad's `HostStats` reports them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostStats {
    /// Memory, bytes.
    pub memory_total: u64,
    /// See `memory_total`.
    pub memory_available: u64,
    /// See `memory_total`.
    pub memory_used: u64,
    /// See `memory_total`.
    pub memory_free: u64,
    /// Each core's share of time since boot, by mode.
    pub cpus: Vec<CpuUsage>,
    /// The file system of the agent's data dir.
    pub disks: Vec<DiskUsage>,
    /// Seconds since boot.
    pub uptime: u64,
    /// The CPU used since boot, in MHz (Nomad's `CPUTicksConsumed`).
    pub cpu_ticks_consumed: f64,
    /// When it was read, in Unix nanoseconds.
    pub timestamp: i64,
}

/// One core's time by mode, percent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuUsage {
    /// Its name (`cpu0`).
    pub cpu: String,
    /// User mode.
    pub user: f64,
    /// Kernel mode.
    pub system: f64,
    /// Idle.
    pub idle: f64,
}

/// A file system's use.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DiskUsage {
    /// The device.
    pub device: String,
    /// Where it is mounted (the data dir).
    pub mountpoint: String,
    /// Bytes.
    pub size: u64,
    /// See `size`.
    pub used: u64,
    /// See `size`.
    pub available: u64,
    /// `used` of `size`, percent.
    pub used_percent: f64,
    /// Inodes used, percent.
    pub inodes_used_percent: f64,
}
