//! The client endpoint's route on a server of a cluster: node calls are
//! served by the leader services when this server leads, forwarded to the
//! leader otherwise ([`kinds::CLIENT_CALL`]), and answered once this
//! server's own state has caught up with the write, so the client's next
//! call here (its allocation watch) sees it.

use std::sync::Arc;
use std::time::Duration;

use engine::node::endpoint::NodeEndpoint;
use replication::Durable;
use transport::frame::Frame;
use transport::message::{AnyMessage, Refusal, RefusalCode};
use transport::peer::Peers;
use transport::server::{HoldAnswer, Route, RouteAnswer};

use super::kinds;
use super::leader_calls::{leader_peer, while_it_leads, LeaderError};
use super::leadership::{Leadership, Settled};

/// How long a forwarded client call may take.
const CLIENT_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a follower waits for its state to catch up with a forwarded
/// write before answering anyway.
const CATCH_UP: Duration = Duration::from_secs(5);

/// The client endpoint's route on a server of a cluster (module docs).
#[derive(Debug)]
pub struct ClusterRoute {
    leadership: Arc<Leadership>,
    durable: Arc<Durable>,
    peers: Arc<Peers>,
}

impl ClusterRoute {
    /// The route of a server with these leader services, state and endpoint.
    pub fn new(leadership: Arc<Leadership>, durable: Arc<Durable>, peers: Arc<Peers>) -> ClusterRoute {
        ClusterRoute { leadership, durable, peers }
    }
}

impl Route for ClusterRoute {
    fn leading(&self) -> Option<NodeEndpoint> {
        self.leadership.leader().map(|server| server.nodes())
    }

    fn forward(&self, request: Vec<u8>, operator: bool) -> RouteAnswer {
        let durable = self.durable.clone();
        let peers = self.peers.clone();
        let store = self.leadership.store().clone();
        Box::pin(async move {
            let (leader, addr) = leader_peer(&durable).map_err(refusal)?;
            let mut call = Vec::with_capacity(request.len() + 1);
            call.push(u8::from(operator));
            call.extend_from_slice(&request);
            let forwarded = peers.call(addr, kinds::CLIENT_CALL, &call, CLIENT_CALL_TIMEOUT);
            let answer = while_it_leads(&durable, leader, forwarded).await.map_err(refusal)?;
            if let Some(index) = written_index(&answer) {
                let _ = tokio::time::timeout(CATCH_UP, store.wait_for_index(index)).await;
            }
            Ok(answer)
        })
    }

    fn hold(&self) -> HoldAnswer {
        let leadership = self.leadership.clone();
        Box::pin(async move {
            match leadership.settle().await {
                Ok(Settled::Leads(server)) => Ok(Some(server.nodes())),
                Ok(Settled::Follows) => Ok(None),
                Err(error) => Err(refusal(error)),
            }
        })
    }

    fn servers(&self) -> Vec<String> {
        client_addresses(&self.durable)
    }
}

/// A client's call that no leader serves: "no leader", to retry, unless
/// raft has stopped on this server (module docs of `leadership`).
fn refusal(error: LeaderError) -> Refusal {
    let code = match error {
        LeaderError::Stopped => RefusalCode::LogStopped,
        _ => RefusalCode::NoLeader,
    };
    Refusal { code, message: error.to_string() }
}

/// The index a forwarded write's reply names, if it is a write's reply.
fn written_index(reply: &[u8]) -> Option<u64> {
    let (frame, _) = Frame::decode_within(reply, transport::frame::MAX_PAYLOAD).ok()??;
    match AnyMessage::from_frame(&frame).ok()? {
        AnyMessage::NodeReply(reply) => Some(reply.index),
        AnyMessage::IndexReply(reply) => Some(reply.index),
        _ => None,
    }
}

/// The client addresses of the cluster's servers, the leader's first.
pub fn client_addresses(durable: &Durable) -> Vec<String> {
    let metrics = durable.metrics();
    let mut servers: Vec<(bool, String)> = metrics
        .membership_config
        .nodes()
        .map(|(id, node)| (metrics.current_leader != Some(*id), node.rpc.clone()))
        .collect();
    servers.sort();
    servers.into_iter().map(|(_, rpc)| rpc).collect()
}
