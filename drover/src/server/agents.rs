//! Calls to agents from any server, as Nomad's `findNodeConnAndForward`:
//! an agent keeps one connection, to one server, and the servers reach its
//! allocations (logs, files, restarts, signals, stats, garbage collection)
//! through that connection (`transport::agent_call`).
//!
//! 1. This server asks itself and every other server (a
//!    [`kinds::NODE_CONNECTION`] call each, at once) whether it holds the
//!    node's connection and since when.
//! 2. The one that holds it most recently takes the call (an agent that
//!    moved leaves a connection behind until its idle timeout): this
//!    server calls the agent itself, or sends the call to that server
//!    ([`kinds::AGENT_CALL`]), which makes it and relays the answer as it
//!    comes; a server relays only its own connections, never further.
//! 3. Nobody holds it: "No path to node", as Nomad answers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use engine::structs::NodeId;
use replication::Durable;
use transport::agent_call::{AgentAnswer, AgentCallError};
use transport::message::{AgentCall, AgentCallRequest, Message};
use transport::peer::{PeerError, Peers};
use transport::server::ClientListener;

use super::kinds;

/// How long another server may take to say whether it holds a node's
/// connection.
const ASK_TIMEOUT: Duration = Duration::from_secs(3);

/// How long the first frame of an agent's answer may take: a restart
/// waits for the task's kill timeout; the rest answer at once (a stream
/// with its first, possibly empty, chunk).
fn first_frame_limit(call: &AgentCall) -> Duration {
    match call {
        AgentCall::Restart { .. } => Duration::from_secs(5 * 60),
        _ => Duration::from_secs(30),
    }
}

/// Why a call to an agent got no answer.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// No server holds the node's connection (Nomad's "No path to node").
    #[error("No path to node {0}: it is not connected to any server")]
    NoPath(NodeId),
    /// The server that holds it could not be reached, or refused.
    #[error("calling the agent through the server at {server}: {error}")]
    Relay {
        /// That server's server-to-server address.
        server: SocketAddr,
        /// What went wrong.
        error: PeerError,
    },
    /// The call itself failed (the agent's own error included).
    #[error(transparent)]
    Call(#[from] AgentCallError),
}

/// Where calls to agents go from this server (module docs).
#[derive(Clone, Debug)]
pub struct AgentRoute {
    listener: Arc<ClientListener>,
    /// The other servers, on a server of a cluster.
    cluster: Option<(Arc<Peers>, Arc<Durable>)>,
}

impl AgentRoute {
    /// Calls from a server with this client listener and, in a cluster,
    /// this server-to-server endpoint and raft membership.
    pub fn new(listener: Arc<ClientListener>, peers: Option<Arc<Peers>>, durable: Option<Arc<Durable>>) -> AgentRoute {
        let cluster = peers.zip(durable);
        AgentRoute { listener, cluster }
    }

    /// Makes `call` on the node's agent, wherever its connection is; the
    /// answer once its first frame came (returned with it).
    pub async fn call(
        &self,
        node_id: NodeId,
        call: AgentCall,
    ) -> Result<(transport::agent_call::AgentFrame, AgentAnswer), RouteError> {
        let limit = first_frame_limit(&call);
        let request = AgentCallRequest { node_id, call };
        let here = self.listener.agents().get(node_id).map(|(_, age)| age);
        let there = self.peer_holding(node_id).await;
        let mut answer = match (here, there) {
            (Some(here), Some((server, there))) if there < here => self.relay(server, &request, limit).await?,
            (Some(_), _) => match self.listener.call_agent(node_id, &request).await {
                Some(answer) => answer?,
                None => return Err(RouteError::NoPath(node_id)),
            },
            (None, Some((server, _))) => self.relay(server, &request, limit).await?,
            (None, None) => return Err(RouteError::NoPath(node_id)),
        };
        let first = answer.first(limit).await?;
        Ok((first, answer))
    }

    /// The other server that holds the node's connection most recently,
    /// and since how long.
    async fn peer_holding(&self, node_id: NodeId) -> Option<(SocketAddr, Duration)> {
        let (peers, durable) = self.cluster.as_ref()?;
        let mut asking = tokio::task::JoinSet::new();
        for addr in other_servers(durable) {
            let peers = peers.clone();
            asking.spawn(async move {
                let answer = peers.call(addr, kinds::NODE_CONNECTION, node_id.0.as_bytes(), ASK_TIMEOUT).await;
                match answer.as_deref().map(<[u8; 8]>::try_from) {
                    Ok(Ok(millis)) => Some((addr, Duration::from_millis(u64::from_be_bytes(millis)))),
                    Ok(Err(_)) => None,
                    Err(error) => {
                        tracing::debug!(%addr, %error, "could not ask a server for a node's connection");
                        None
                    }
                }
            });
        }
        let mut youngest: Option<(SocketAddr, Duration)> = None;
        while let Some(asked) = asking.join_next().await {
            if let Ok(Some((addr, age))) = asked {
                if youngest.is_none_or(|(_, best)| age < best) {
                    youngest = Some((addr, age));
                }
            }
        }
        youngest
    }

    /// Sends the call to the server at `server`, which relays the answer.
    async fn relay(
        &self,
        server: SocketAddr,
        request: &AgentCallRequest,
        limit: Duration,
    ) -> Result<AgentAnswer, RouteError> {
        let (peers, _) = self.cluster.as_ref().expect("only a server of a cluster relays");
        let mut bytes = Vec::new();
        request.to_frame(0).encode(&mut bytes).expect("a call is far below the frame limit");
        let recv = peers
            .call_stream(server, kinds::AGENT_CALL, &bytes, limit)
            .await
            .map_err(|error| RouteError::Relay { server, error })?;
        Ok(AgentAnswer::over(recv))
    }
}

/// The server-to-server addresses of the cluster's other servers.
fn other_servers(durable: &Durable) -> Vec<SocketAddr> {
    let metrics = durable.metrics();
    metrics
        .membership_config
        .nodes()
        .filter(|(id, _)| **id != durable.id())
        .filter_map(|(_, node)| replication::network::resolve(&node.peer).ok())
        .collect()
}
