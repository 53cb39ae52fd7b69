//! Frames: the unit carried on a stream.
//!
//! Layout (big-endian): magic `b"DRV"`, version (1 byte), kind (1 byte),
//! request id (8 bytes), payload length (4 bytes), payload. A decoder reads
//! from a growing buffer and tells "need more bytes" apart from "this stream
//! is broken", so a malformed frame is refused with a clear error before its
//! payload is buffered.

/// The bytes every frame starts with.
pub const MAGIC: [u8; 3] = *b"DRV";
/// The protocol version this build speaks. 2: the refusal for a stopped
/// log, the report's scope and audit. 3: jobs and allocations carry what
/// issue 24 added (meta, task restart policies, reconcile strategies, port
/// host networks, placement scores). 4: a task carries its `memory_max_mb`.
/// 5: groups and tasks carry their services and checks. 6: tasks carry
/// their shutdown delay and templates, allocations and their updates
/// check results and health; an agent reads services for its templates
/// (`ReadServices`).
pub const VERSION: u8 = 6;
/// Bytes before the payload.
pub const HEADER_LEN: usize = 3 + 1 + 1 + 8 + 4;
/// The largest payload a peer may send (8 MiB).
pub const MAX_PAYLOAD: usize = 8 * 1024 * 1024;

/// One framed message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// What the payload is; interpreted by the layer above.
    pub kind: u8,
    /// Pairs a response with its request.
    pub request_id: u64,
    /// The message body.
    pub payload: Vec<u8>,
}

/// Why bytes could not be read as a frame.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The stream does not start with the Drover magic.
    #[error("not a drover frame: bad magic {0:02x?}")]
    BadMagic([u8; 3]),
    /// The peer speaks another protocol version.
    #[error("unsupported protocol version {found} (this build speaks {VERSION})")]
    UnsupportedVersion {
        /// The version in the frame.
        found: u8,
    },
    /// The payload is larger than the reader accepts.
    #[error("frame payload of {length} bytes exceeds the limit of {limit}")]
    TooLarge {
        /// The announced length.
        length: usize,
        /// The reader's limit.
        limit: usize,
    },
    /// The payload to encode is larger than [`MAX_PAYLOAD`].
    #[error("cannot send a payload of {length} bytes: the limit is {MAX_PAYLOAD}")]
    PayloadTooLarge {
        /// The payload's length.
        length: usize,
    },
}

impl Frame {
    /// Appends the encoded frame to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        if self.payload.len() > MAX_PAYLOAD {
            return Err(FrameError::PayloadTooLarge { length: self.payload.len() });
        }
        out.reserve(HEADER_LEN + self.payload.len());
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.push(self.kind);
        out.extend_from_slice(&self.request_id.to_be_bytes());
        out.extend_from_slice(&(self.payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.payload);
        Ok(())
    }

    /// Reads one frame from the front of `buf`. `Ok(None)`: not enough bytes
    /// yet; `Ok(Some((frame, used)))`: a frame and how many bytes it took.
    pub fn decode(buf: &[u8]) -> Result<Option<(Frame, usize)>, FrameError> {
        Frame::decode_within(buf, MAX_PAYLOAD)
    }

    /// [`Frame::decode`] with a smaller payload limit: a server reads
    /// client requests with the limit of the largest request, so a peer
    /// cannot make it buffer more.
    pub fn decode_within(buf: &[u8], limit: usize) -> Result<Option<(Frame, usize)>, FrameError> {
        let magic_len = buf.len().min(MAGIC.len());
        if buf[..magic_len] != MAGIC[..magic_len] {
            let mut found = [0u8; 3];
            found[..magic_len].copy_from_slice(&buf[..magic_len]);
            return Err(FrameError::BadMagic(found));
        }
        if buf.len() > 3 && buf[3] != VERSION {
            return Err(FrameError::UnsupportedVersion { found: buf[3] });
        }
        if buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let length = u32::from_be_bytes([buf[13], buf[14], buf[15], buf[16]]) as usize;
        if length > limit.min(MAX_PAYLOAD) {
            return Err(FrameError::TooLarge { length, limit: limit.min(MAX_PAYLOAD) });
        }
        if buf.len() < HEADER_LEN + length {
            return Ok(None);
        }
        let mut request_id = [0u8; 8];
        request_id.copy_from_slice(&buf[5..13]);
        let frame = Frame {
            kind: buf[4],
            request_id: u64::from_be_bytes(request_id),
            payload: buf[HEADER_LEN..HEADER_LEN + length].to_vec(),
        };
        Ok(Some((frame, HEADER_LEN + length)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encoded(frame: &Frame) -> Vec<u8> {
        let mut out = Vec::new();
        frame.encode(&mut out).expect("small payload");
        out
    }

    #[test]
    fn a_partial_frame_asks_for_more_bytes() {
        let bytes = encoded(&Frame { kind: 2, request_id: 9, payload: b"hello".to_vec() });
        for cut in 0..bytes.len() {
            assert_eq!(Frame::decode(&bytes[..cut]), Ok(None), "cut at {cut}");
        }
        assert_eq!(Frame::decode(&bytes).expect("whole").map(|(_, used)| used), Some(bytes.len()));
    }

    #[test]
    fn malformed_frames_are_refused_with_the_reason() {
        assert_eq!(Frame::decode(b"HTTP/1.1"), Err(FrameError::BadMagic(*b"HTT")));
        assert_eq!(Frame::decode(b"DRV\x07"), Err(FrameError::UnsupportedVersion { found: 7 }));
        let mut huge = encoded(&Frame { kind: 1, request_id: 1, payload: vec![] });
        huge[13..17].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(Frame::decode(&huge), Err(FrameError::TooLarge { length: u32::MAX as usize, limit: MAX_PAYLOAD }));
        let too_big = Frame { kind: 1, request_id: 1, payload: vec![0; MAX_PAYLOAD + 1] };
        assert_eq!(too_big.encode(&mut Vec::new()), Err(FrameError::PayloadTooLarge { length: MAX_PAYLOAD + 1 }));
    }

    proptest! {
        #[test]
        fn frames_round_trip_back_to_back(frames in proptest::collection::vec(
            (any::<u8>(), any::<u64>(), proptest::collection::vec(any::<u8>(), 0..300)), 1..8)
        ) {
            let frames: Vec<Frame> = frames.into_iter()
                .map(|(kind, request_id, payload)| Frame { kind, request_id, payload }).collect();
            let mut stream = Vec::new();
            for frame in &frames {
                frame.encode(&mut stream).expect("small payload");
            }
            let mut offset = 0;
            for frame in &frames {
                let (decoded, used) = Frame::decode(&stream[offset..]).expect("valid").expect("complete");
                prop_assert_eq!(&decoded, frame);
                offset += used;
            }
            prop_assert_eq!(offset, stream.len());
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Frame::decode(&bytes);
        }
    }
}
