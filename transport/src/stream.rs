//! Frames on QUIC streams: reading them out of a receive stream with a
//! payload limit, writing them, and the application error codes a stream or
//! a connection is closed with.

use quinn::{RecvStream, SendStream, VarInt};

use crate::frame::{Frame, FrameError};

/// Application error codes, on stream resets, stops and connection closes.
pub mod codes {
    use quinn::VarInt;

    /// Closed normally.
    pub const DONE: VarInt = VarInt::from_u32(0);
    /// The peer sent bytes that are not a valid frame or message.
    pub const MALFORMED: VarInt = VarInt::from_u32(1);
    /// The server is shutting down.
    pub const SHUTTING_DOWN: VarInt = VarInt::from_u32(2);
    /// The client is going away (an agent stopping, a simulated client dropping).
    pub const CLIENT_LEAVING: VarInt = VarInt::from_u32(3);
}

/// Why a frame could not be read from or written to a stream.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The bytes are not a valid frame.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The stream ended in the middle of a frame.
    #[error("the stream ended {0} bytes into a frame")]
    Truncated(usize),
    /// Reading failed (the peer reset the stream, or the connection is gone).
    #[error("reading: {0}")]
    Read(#[from] quinn::ReadError),
    /// Writing failed (the peer stopped the stream, or the connection is gone).
    #[error("writing: {0}")]
    Write(#[from] quinn::WriteError),
    /// The stream was already finished or reset.
    #[error("the stream is closed")]
    Closed,
}

/// Reads frames from one receive stream, buffering at most one frame of at
/// most `limit` payload bytes.
#[derive(Debug)]
pub struct FrameReader {
    buffer: Vec<u8>,
    limit: usize,
}

/// How much to ask quinn for at once.
const READ_CHUNK: usize = 64 * 1024;

impl FrameReader {
    /// A reader refusing payloads over `limit` bytes.
    pub fn new(limit: usize) -> FrameReader {
        FrameReader { buffer: Vec::new(), limit }
    }

    /// The next frame; `Ok(None)` when the peer finished the stream
    /// cleanly between frames. A malformed or oversized frame is refused
    /// as soon as its header is read, before its payload is buffered.
    pub async fn next(&mut self, recv: &mut RecvStream) -> Result<Option<Frame>, StreamError> {
        loop {
            if !self.buffer.is_empty() {
                if let Some((frame, used)) = Frame::decode_within(&self.buffer, self.limit)? {
                    self.buffer.drain(..used);
                    return Ok(Some(frame));
                }
            }
            match recv.read_chunk(READ_CHUNK, true).await? {
                Some(chunk) => self.buffer.extend_from_slice(&chunk.bytes),
                None if self.buffer.is_empty() => return Ok(None),
                None => return Err(StreamError::Truncated(self.buffer.len())),
            }
        }
    }
}

/// Writes one frame.
pub async fn write_frame(send: &mut SendStream, frame: &Frame) -> Result<(), StreamError> {
    let mut bytes = Vec::new();
    frame.encode(&mut bytes)?;
    send.write_all(&bytes).await?;
    Ok(())
}

/// Writes one frame and finishes the stream.
pub async fn write_last_frame(send: &mut SendStream, frame: &Frame) -> Result<(), StreamError> {
    write_frame(send, frame).await?;
    send.finish().map_err(|_| StreamError::Closed)
}

/// Abandons both halves of a stream with `code`.
pub fn abandon(send: &mut SendStream, recv: &mut RecvStream, code: VarInt) {
    let _ = send.reset(code);
    let _ = recv.stop(code);
}
