//! Calls from a server to an agent, on the connection the agent opened:
//! the servers reach an agent's allocations (logs, files, restarts,
//! signals, stats, garbage collection) without the agent opening a port.
//!
//! 1. An agent's connection becomes its node's once the node's allocation
//!    watch is authenticated on it (the node's secret); the server keeps
//!    it in its [`AgentConnections`] until the connection ends or the node
//!    moves to a newer one.
//! 2. The server opens a bidirectional stream on that connection, writes
//!    one [`AgentCallRequest`] and finishes its side ([`call`]). An agent
//!    allows a few such streams at once (`settings::MAX_SERVER_CALLS`);
//!    one that allows none (an older agent) leaves the open waiting, and
//!    the call fails after [`OPEN_TIMEOUT`].
//! 3. The agent answers ([`ServerCall`]): one [`AgentReply`], or
//!    [`FileChunk`]s, the first one sent at once (possibly empty, so the
//!    server knows the stream started) and each at most
//!    [`crate::message::MAX_CHUNK`] bytes, until it finishes its side; or
//!    an [`AgentError`], also after chunks. A chunk is written only when
//!    flow control lets it, so a slow reader holds the agent up instead of
//!    making anyone buffer.
//! 4. The caller reads the answer frame by frame ([`AgentAnswer`]); it
//!    goes away by dropping it, which stops the agent's stream, and the
//!    agent, watching for that ([`ServerCall::caller_gone`]), ends its side.
//!
//! A server that does not hold the node's connection relays the call
//! through the one that does (the binary's business, over
//! [`crate::peer`]): [`relay`] copies an answer's bytes to another
//! server as they come, and [`AgentAnswer::over`] reads them there.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use engine::structs::NodeId;
use quinn::{Connection, RecvStream, SendStream};

use crate::frame::{Frame, MAX_PAYLOAD};
use crate::message::{
    AgentCallRequest, AgentError, AgentReply, FileChunk, Kind, Message, MessageError, Refusal, RefusalCode,
};
use crate::peer::PeerSink;
use crate::settings::MAX_REQUEST;
use crate::stream::{codes, write_frame, write_last_frame, FrameReader, StreamError};

/// How long a server waits for an agent to take a call's stream.
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// The agents' connections a server holds, by node (module docs, step 1).
#[derive(Debug, Default)]
pub struct AgentConnections {
    by_node: parking_lot::Mutex<HashMap<NodeId, Held>>,
}

#[derive(Debug)]
struct Held {
    connection: Connection,
    since: Instant,
    /// The node's watches open on it (a watch may be opened again before
    /// the one it replaces has ended).
    watches: usize,
}

impl AgentConnections {
    /// Makes `connection` the node's, for one more watch on it.
    pub(crate) fn hold(&self, node_id: NodeId, connection: &Connection) {
        let mut by_node = self.by_node.lock();
        match by_node.get_mut(&node_id) {
            Some(held) if held.connection.stable_id() == connection.stable_id() => held.watches += 1,
            _ => {
                by_node.insert(node_id, Held { connection: connection.clone(), since: Instant::now(), watches: 1 });
            }
        }
    }

    /// One watch on `connection` ended; the node's connection is forgotten
    /// with its last watch (unless the node moved to another meanwhile).
    pub(crate) fn release(&self, node_id: NodeId, connection: &Connection) {
        let mut by_node = self.by_node.lock();
        let Some(held) = by_node.get_mut(&node_id) else { return };
        if held.connection.stable_id() == connection.stable_id() {
            held.watches -= 1;
            if held.watches == 0 {
                by_node.remove(&node_id);
            }
        }
    }

    /// The node's open connection, and how long it has been the node's.
    pub fn get(&self, node_id: NodeId) -> Option<(Connection, Duration)> {
        let mut by_node = self.by_node.lock();
        let held = by_node.get(&node_id)?;
        if held.connection.close_reason().is_some() {
            by_node.remove(&node_id);
            return None;
        }
        Some((held.connection.clone(), held.since.elapsed()))
    }

    /// How many nodes' connections are held.
    pub fn len(&self) -> usize {
        self.by_node.lock().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why a call to an agent got no (more) answer.
#[derive(Debug, thiserror::Error)]
pub enum AgentCallError {
    /// The connection is gone.
    #[error("the agent's connection: {0}")]
    Connection(#[from] quinn::ConnectionError),
    /// The agent did not take the call's stream in time (it has too many
    /// calls in flight, or is too old to take any).
    #[error("the agent did not take the call within {0:?}")]
    NotTaken(Duration),
    /// The call's stream failed.
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// The answer was not a valid message.
    #[error(transparent)]
    Message(#[from] MessageError),
    /// The agent answered with an error.
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// The call was refused before the agent saw it (malformed).
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The stream ended without an answer.
    #[error("the agent closed the call without an answer")]
    NoAnswer,
    /// No answer came within the caller's limit.
    #[error("the agent did not answer within {0:?}")]
    TimedOut(Duration),
}

/// Calls the agent on `connection` (module docs, step 2); the answer is
/// read from what this returns.
pub async fn call(connection: &Connection, request: &AgentCallRequest) -> Result<AgentAnswer, AgentCallError> {
    let opened = tokio::time::timeout(OPEN_TIMEOUT, connection.open_bi()).await;
    let (mut send, recv) = opened.map_err(|_| AgentCallError::NotTaken(OPEN_TIMEOUT))??;
    write_last_frame(&mut send, &request.to_frame(0)).await?;
    Ok(AgentAnswer::over(recv))
}

/// One frame of an agent's answer.
#[derive(Clone, Debug, PartialEq)]
pub enum AgentFrame {
    /// The answer of a call that is not a stream.
    Reply(AgentReply),
    /// The next piece of a stream.
    Chunk(FileChunk),
}

/// An agent's answer as it comes (module docs, step 4).
#[derive(Debug)]
pub struct AgentAnswer {
    recv: RecvStream,
    reader: FrameReader,
}

impl AgentAnswer {
    /// The answer on `recv`: the agent's stream, or another server's
    /// relay of it.
    pub fn over(recv: RecvStream) -> AgentAnswer {
        AgentAnswer { recv, reader: FrameReader::new(MAX_PAYLOAD) }
    }

    /// The next frame; `Ok(None)` when the agent ended the answer. An
    /// [`AgentError`] is an `Err`.
    pub async fn next(&mut self) -> Result<Option<AgentFrame>, AgentCallError> {
        let Some(frame) = self.reader.next(&mut self.recv).await? else { return Ok(None) };
        Ok(Some(read_frame(&frame)?))
    }

    /// The first frame, which must come within `limit`; the rest of a
    /// stream may take any time.
    pub async fn first(&mut self, limit: Duration) -> Result<AgentFrame, AgentCallError> {
        match tokio::time::timeout(limit, self.next()).await {
            Ok(Ok(Some(frame))) => Ok(frame),
            Ok(Ok(None)) => Err(AgentCallError::NoAnswer),
            Ok(Err(error)) => Err(error),
            Err(_) => Err(AgentCallError::TimedOut(limit)),
        }
    }
}

/// An answer frame read by its kind.
fn read_frame(frame: &Frame) -> Result<AgentFrame, AgentCallError> {
    match Kind::try_from(frame.kind)? {
        Kind::AgentReply => Ok(AgentFrame::Reply(AgentReply::from_frame(frame)?)),
        Kind::FileChunk => Ok(AgentFrame::Chunk(FileChunk::from_frame(frame)?)),
        Kind::AgentError => Err(AgentCallError::Agent(AgentError::from_frame(frame)?)),
        Kind::Refusal => Err(AgentCallError::Refused(Refusal::from_frame(frame)?)),
        found => Err(AgentCallError::Message(MessageError::UnexpectedKind { expected: Kind::AgentReply, found })),
    }
}

/// Relays an agent's answer, whose stream is `from` and not yet read, to
/// the server that asked through `to` (module docs): the bytes as they
/// come, until the agent ends (the relay ends too), fails (the relay
/// fails) or the asking server stops reading (the agent's stream is
/// stopped).
pub async fn relay(answer: AgentAnswer, mut to: PeerSink) {
    let AgentAnswer { mut recv, reader: _ } = answer;
    loop {
        let chunk = tokio::select! {
            chunk = recv.read_chunk(crate::message::MAX_CHUNK * 2, true) => chunk,
            _ = to.stopped() => {
                let _ = recv.stop(codes::DONE);
                return;
            }
        };
        match chunk {
            Ok(Some(chunk)) => {
                if to.write(&chunk.bytes).await.is_err() {
                    let _ = recv.stop(codes::DONE);
                    return;
                }
            }
            Ok(None) => return to.finish().await,
            Err(error) => {
                tracing::debug!(%error, "an agent's answer failed while relayed");
                return to.abandon();
            }
        }
    }
}

/// A server's call, as its agent takes it (module docs, step 3).
#[derive(Debug)]
pub struct ServerCall {
    send: SendStream,
    recv: RecvStream,
}

impl ServerCall {
    /// A call on a stream the server opened.
    pub(crate) fn new(send: SendStream, recv: RecvStream) -> ServerCall {
        ServerCall { send, recv }
    }

    /// The request; `None` when it could not be read (a malformed one is
    /// refused on the stream, which ends).
    pub async fn request(&mut self) -> Option<AgentCallRequest> {
        let frame = match FrameReader::new(MAX_REQUEST).next(&mut self.recv).await {
            Ok(Some(frame)) => frame,
            Ok(None) => return None,
            Err(StreamError::Read(error)) => {
                tracing::debug!(%error, "a server's call ended before its request");
                return None;
            }
            Err(error) => return self.refuse_malformed(0, &error.to_string()).await,
        };
        match AgentCallRequest::from_frame(&frame) {
            Ok(request) => Some(request),
            Err(error) => self.refuse_malformed(frame.request_id, &error.to_string()).await,
        }
    }

    async fn refuse_malformed(&mut self, request_id: u64, why: &str) -> Option<AgentCallRequest> {
        tracing::warn!(why, "refused a malformed call from a server");
        let _ = self.recv.stop(codes::MALFORMED);
        let refusal = Refusal { code: RefusalCode::Malformed, message: why.to_string() };
        let _ = write_last_frame(&mut self.send, &refusal.to_frame(request_id)).await;
        None
    }

    /// Answers with `reply` and ends the call.
    pub async fn reply(mut self, reply: &AgentReply) {
        if let Err(error) = write_last_frame(&mut self.send, &reply.to_frame(0)).await {
            tracing::debug!(%error, "could not answer a server's call");
        }
    }

    /// Answers with `error` (also after chunks) and ends the call.
    pub async fn fail(mut self, error: &AgentError) {
        let _ = write_last_frame(&mut self.send, &error.to_frame(0)).await;
    }

    /// Sends the next piece of a stream, once flow control lets it; an
    /// error when the caller went away.
    pub async fn chunk(&mut self, chunk: &FileChunk) -> Result<(), StreamError> {
        write_frame(&mut self.send, &chunk.to_frame(0)).await
    }

    /// Ends a stream.
    pub fn finish(mut self) {
        let _ = self.send.finish();
    }

    /// Resolves once the caller went away (it stopped the stream, or the
    /// connection is gone).
    pub async fn caller_gone(&mut self) {
        let _ = self.send.stopped().await;
    }
}
