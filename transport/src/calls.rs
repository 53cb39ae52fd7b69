//! A client connection's call stream: every call (a registration, a
//! heartbeat, an allocation report, an operator call) on one long-lived
//! bidirectional stream instead of a stream of its own.
//!
//! A stream per call costs each call a stream's state on both sides, a
//! task on the server, and the stream-credit updates the server sends as
//! streams close; on the heartbeat path of 10,000 clients the call stream
//! took the server's CPU per heartbeat from 63 to 42 µs
//! (`docs/transport.md`). On the call stream:
//! 1. The client writes request frames, each with a request id of its own;
//!    it may write the next before the last was answered. One writer task
//!    owns the send half and writes whatever is queued with one write, so
//!    a caller that gives up (a timeout drops its future) never leaves
//!    half a frame on the stream.
//! 2. The server answers each frame on the same stream with a frame
//!    carrying the request's id, in the order the requests came
//!    (`crate::server`); one reader task hands each answer to its caller.
//! 3. A stream that fails (reset, connection lost, a frame that cannot be
//!    read) answers every call waiting on it with an error; the next call
//!    opens a new stream. A call whose caller gave up before its answer
//!    came abandons the stream the same way, and the server drops what it
//!    was serving on it: whatever held that answer up (a server waiting
//!    out an election) would hold every call queued behind it. The calls
//!    waiting on it then fail too, worth repeating
//!    ([`CallError::is_transient`]); an agent has one call out at a time,
//!    so it only ever abandons its own.
//! 4. Allocation watches and services reads, which the server holds for
//!    minutes, keep streams of their own.
//!
//! A server of an earlier build answers one call per stream and then
//! finishes it: a call sent on the stream before the client saw it finish
//! fails, worth repeating, and the next opens a new stream (step 3).
//! Upgrade servers before agents, as with Nomad.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use quinn::{RecvStream, SendStream};
use tokio::sync::{mpsc, oneshot, watch};

use crate::client::CallError;
use crate::frame::{Frame, MAX_PAYLOAD};
use crate::stream::{codes, FrameReader, StreamError};

/// The call stream of one connection (module docs).
#[derive(Debug)]
pub(crate) struct CallStream {
    connection: quinn::Connection,
    /// The stream calls go on now; `None` before the first call. Locked
    /// across the opening of a stream, so one is opened at a time.
    current: tokio::sync::Mutex<Option<Arc<Open>>>,
}

/// An open call stream.
#[derive(Debug)]
struct Open {
    /// Encoded frames for the writer task.
    outbox: mpsc::UnboundedSender<Vec<u8>>,
    /// The callers waiting for an answer, by request id; `None` once the
    /// stream ended (no caller may wait on it any more).
    waiting: Mutex<Option<HashMap<u64, oneshot::Sender<Frame>>>>,
    /// Set when the stream ended; both tasks stop.
    ended: watch::Sender<bool>,
}

impl CallStream {
    /// The call stream of `connection`; opened by the first call.
    pub(crate) fn new(connection: quinn::Connection) -> CallStream {
        CallStream { connection, current: tokio::sync::Mutex::new(None) }
    }

    /// Sends `frame` (its request id unique on this connection) and waits
    /// for the answer with the same id.
    pub(crate) async fn call(&self, frame: &Frame) -> Result<Frame, CallError> {
        let mut bytes = Vec::new();
        frame.encode(&mut bytes).map_err(StreamError::from)?;
        let (answer, answered) = oneshot::channel();
        let open = self.waiting_on(frame.request_id, answer).await?;
        let mut waiting = Waiting { open: &open, request_id: frame.request_id, answered: false };
        if open.outbox.send(bytes).is_err() {
            return Err(self.ended());
        }
        let frame = answered.await.map_err(|_| self.ended())?;
        waiting.answered = true;
        Ok(frame)
    }

    /// Registers `answer` for `request_id` on the live stream, opening one
    /// if there is none or the last one ended.
    async fn waiting_on(&self, request_id: u64, answer: oneshot::Sender<Frame>) -> Result<Arc<Open>, CallError> {
        let mut current = self.current.lock().await;
        if let Some(open) = current.as_ref() {
            if let Some(waiting) = open.waiting.lock().as_mut() {
                waiting.insert(request_id, answer);
                return Ok(open.clone());
            }
        }
        let open = self.open().await?;
        *current = Some(open.clone());
        match open.waiting.lock().as_mut() {
            Some(waiting) => waiting.insert(request_id, answer),
            // It failed as it opened.
            None => return Err(self.ended()),
        };
        Ok(open)
    }

    /// Opens a stream and starts its writer and reader.
    async fn open(&self) -> Result<Arc<Open>, CallError> {
        let (send, recv) = self.connection.open_bi().await?;
        let (outbox, queued) = mpsc::unbounded_channel();
        let (ended, _) = watch::channel(false);
        let open = Arc::new(Open { outbox, waiting: Mutex::new(Some(HashMap::new())), ended });
        tokio::spawn(write_calls(send, queued, EndOnDrop(open.clone())));
        tokio::spawn(read_answers(recv, EndOnDrop(open.clone())));
        Ok(open)
    }

    /// The error for a call whose stream ended before its answer: the
    /// connection's when it is gone, otherwise one worth retrying.
    fn ended(&self) -> CallError {
        match self.connection.close_reason() {
            Some(reason) => CallError::Connection(reason),
            None => CallError::NoAnswer,
        }
    }
}

impl Drop for CallStream {
    /// The stream's tasks hold the connection open; the last handle of
    /// the connection gone, they stop.
    fn drop(&mut self) {
        if let Some(open) = self.current.get_mut() {
            open.end();
        }
    }
}

/// A caller waiting on a stream: if it gives up before its answer came,
/// the stream is abandoned (module docs, step 3).
struct Waiting<'a> {
    open: &'a Arc<Open>,
    request_id: u64,
    answered: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let gave_up =
            self.open.waiting.lock().as_mut().is_some_and(|waiting| waiting.remove(&self.request_id).is_some());
        if gave_up {
            self.open.end();
        }
    }
}

impl Open {
    /// Ends the stream: no caller may wait on it any more (the taken map
    /// is the one sign of that callers look at), those waiting get an
    /// error (their answer's sender dropped), both tasks stop.
    fn end(&self) {
        self.waiting.lock().take();
        self.ended.send_replace(true);
    }
}

/// A task's hold on its stream: however the task ends (finished, or
/// dropped with its runtime), the stream ends with it, so no caller waits
/// on a stream nobody serves.
struct EndOnDrop(Arc<Open>);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// The writer task (step 1): everything queued, in one write.
async fn write_calls(mut send: SendStream, mut queued: mpsc::UnboundedReceiver<Vec<u8>>, open: EndOnDrop) {
    let mut ended = open.0.ended.subscribe();
    let mut batch = Vec::new();
    loop {
        let first = tokio::select! {
            first = queued.recv() => first,
            _ = ended.wait_for(|ended| *ended) => None,
        };
        let Some(first) = first else { break };
        batch.clear();
        batch.extend_from_slice(&first);
        while let Ok(more) = queued.try_recv() {
            batch.extend_from_slice(&more);
        }
        let written = tokio::select! {
            written = send.write_all(&batch) => written.is_ok(),
            _ = ended.wait_for(|ended| *ended) => false,
        };
        if !written {
            break;
        }
    }
    // The server needs nothing more of this stream once it ended.
    let _ = send.reset(codes::DONE);
}

/// The reader task (step 2).
async fn read_answers(mut recv: RecvStream, open: EndOnDrop) {
    let mut ended = open.0.ended.subscribe();
    let mut reader = FrameReader::new(MAX_PAYLOAD);
    loop {
        let next = tokio::select! {
            next = reader.next(&mut recv) => next,
            _ = ended.wait_for(|ended| *ended) => break,
        };
        let Ok(Some(frame)) = next else { break };
        let answer = open.0.waiting.lock().as_mut().and_then(|waiting| waiting.remove(&frame.request_id));
        if let Some(answer) = answer {
            let _ = answer.send(frame);
        }
    }
    let _ = recv.stop(codes::DONE);
}

#[cfg(test)]
#[path = "calls_test.rs"]
mod tests;
