//! The openraft type config and what a log entry carries: a batch of
//! engine commands, each in the engine's log format (jobs once per command).

use std::sync::Arc;

use engine::state::{Applied, Command, StateError};
use serde::de::{Error as _, SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

openraft::declare_raft_types!(
    /// Drover's raft: entries carry command batches, snapshots are files.
    pub TypeConfig:
        D = CommandBatch,
        R = BatchResponse,
        NodeId = u64,
        Node = ServerNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A raft log id of this config.
pub type LogId = openraft::LogId<u64>;
/// A raft entry of this config.
pub type Entry = openraft::Entry<TypeConfig>;
/// The membership as stored with a log id.
pub type StoredMembership = openraft::StoredMembership<u64, ServerNode>;

/// A server of the cluster as the raft membership records it: its name
/// and where the other servers, the clients and operators reach it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerNode {
    /// Its name (`drover server members`).
    pub name: String,
    /// Its server-to-server endpoint (raft, forwarding), `host:port`.
    pub peer: String,
    /// Its client endpoint (agents), `host:port`.
    pub rpc: String,
    /// Its HTTP API, `host:port`.
    pub http: String,
}

impl std::fmt::Display for ServerNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (peer {})", self.name, self.peer)
    }
}
/// openraft's storage error of this config.
pub type StorageError = openraft::StorageError<u64>;

/// The commands of one raft entry, in the order they apply. Submissions
/// that arrive while the previous entry is being made durable share the
/// next entry (group commit; see [`crate::command_log`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CommandBatch(pub Vec<Arc<Command>>);

impl Serialize for CommandBatch {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for command in &self.0 {
            seq.serialize_element(&Encoded(command))?;
        }
        seq.end()
    }
}

/// One command in the engine's log format, as a byte string.
struct Encoded<'a>(&'a Command);

impl Serialize for Encoded<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0.encode())
    }
}

impl<'de> Deserialize<'de> for CommandBatch {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_seq(BatchVisitor)
    }
}

struct BatchVisitor;

impl<'de> Visitor<'de> for BatchVisitor {
    type Value = CommandBatch;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("a sequence of encoded commands")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<CommandBatch, A::Error> {
        let mut commands = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(Decoded(command)) = seq.next_element()? {
            commands.push(Arc::new(command));
        }
        Ok(CommandBatch(commands))
    }
}

/// A command decoded from its byte string.
struct Decoded(Command);

impl<'de> Deserialize<'de> for Decoded {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct BytesVisitor;
        impl Visitor<'_> for BytesVisitor {
            type Value = Decoded;

            fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                formatter.write_str("an encoded command")
            }

            fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<Decoded, E> {
                Command::decode(bytes).map(Decoded).map_err(E::custom)
            }
        }
        deserializer.deserialize_bytes(BytesVisitor).map_err(|error| D::Error::custom(error.to_string()))
    }
}

/// What applying an entry answered: one result per command of its batch
/// (none for blank and membership entries).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BatchResponse(pub Vec<Result<Applied, StateError>>);

#[cfg(test)]
mod tests {
    use engine::structs::{Node, NodeId, Resources};

    use super::*;

    #[test]
    fn an_entry_round_trips_with_its_commands_in_the_log_format() {
        let node = Node::new_ready(NodeId::from_u128(1), "dc1", "c", Resources::new(1, 1, 0));
        let batch = CommandBatch(vec![
            Arc::new(Command::UpsertNode { node, evals: vec![] }),
            Arc::new(Command::UpsertEvals { evals: vec![] }),
        ]);
        let entry = Entry { payload: openraft::EntryPayload::Normal(batch.clone()), ..Entry::default() };
        let bytes = postcard::to_allocvec(&entry).expect("encodes");
        let decoded: Entry = postcard::from_bytes(&bytes).expect("decodes");
        assert_eq!(decoded.payload, openraft::EntryPayload::Normal(batch));
        assert!(postcard::from_bytes::<Entry>(&bytes[..bytes.len() - 3]).is_err(), "a cut entry is refused");
    }
}
