//! The kinds of server-to-server calls Drover makes besides raft's
//! (`replication::network::kinds` has 1-5): the first byte of each call on
//! the server-to-server endpoint, answered by `peer.rs`.

/// A client's call a follower forwards: one byte (1: the client has an
/// operator certificate), then its request frame.
pub const CLIENT_CALL: u8 = 10;
/// An HTTP API request a follower forwards.
pub const HTTP: u8 = 11;
/// Does this server hold a node's connection? The node id's 16 bytes;
/// the answer is how long it has, in big-endian milliseconds, or empty.
pub const NODE_CONNECTION: u8 = 12;
/// A call to an agent whose connection this server holds, streamed:
/// its encoded request frame; the answer is the agent's, relayed.
pub const AGENT_CALL: u8 = 13;
/// A follower's worker's call on the leader's broker or plan applier:
/// an encoded `scheduling::SchedulingCall`.
pub const SCHEDULING: u8 = 14;
