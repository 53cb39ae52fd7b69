//! Answers the other servers' calls: raft's, forwarded client calls,
//! forwarded HTTP requests, calls to the agents whose connections this
//! server holds (`agents.rs`), and the scheduling calls of followers'
//! workers (`scheduling.rs`).

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use engine::structs::NodeId;
use replication::Durable;
use serde::{Deserialize, Serialize};
use transport::message::{AgentCallRequest, Message};
use transport::peer::{PeerAnswer, PeerHandler, PeerRefusal, PeerSink, PeerStreaming};
use transport::server::ClientListener;

use super::kinds;
use super::leadership::Leadership;

/// Answers the other servers' calls (module docs). Its parts are set once
/// they exist: the endpoint is bound before raft starts.
#[derive(Debug, Default)]
pub struct PeerService {
    /// raft, hellos and joins.
    pub durable: OnceLock<Arc<Durable>>,
    /// Forwarded client calls.
    pub listener: OnceLock<Arc<ClientListener>>,
    /// Forwarded HTTP requests.
    pub http: OnceLock<axum::Router>,
    /// Followers' scheduling calls.
    pub leadership: OnceLock<Arc<Leadership>>,
}

impl PeerHandler for PeerService {
    fn call(&self, kind: u8, request: Vec<u8>) -> PeerAnswer {
        let durable = self.durable.get().cloned();
        let listener = self.listener.get().cloned();
        let http = self.http.get().cloned();
        let leadership = self.leadership.get().cloned();
        Box::pin(async move {
            match kind {
                kinds::CLIENT_CALL => {
                    let listener = listener.ok_or(PeerServiceError::Starting)?;
                    let (operator, frame) = request.split_first().ok_or(PeerServiceError::EmptyCall)?;
                    Ok(listener.serve_forwarded(frame, *operator == 1).await)
                }
                kinds::SCHEDULING => {
                    let leadership = leadership.ok_or(PeerServiceError::Starting)?;
                    Ok(super::scheduling::serve(leadership.leading_term(), &request).await?)
                }
                kinds::HTTP => Ok(serve_forwarded(http.ok_or(PeerServiceError::Starting)?, &request).await?),
                kinds::NODE_CONNECTION => {
                    Ok(node_connection(listener.ok_or(PeerServiceError::Starting)?.as_ref(), &request))
                }
                _ => match durable.ok_or(PeerServiceError::Starting)?.serve_peer(kind, &request).await {
                    Some(answer) => Ok(answer?),
                    None => Err(PeerRefusal::from(PeerServiceError::UnknownKind(kind))),
                },
            }
        })
    }

    fn streams(&self, kind: u8) -> bool {
        kind == kinds::AGENT_CALL
    }

    fn stream(&self, _kind: u8, request: Vec<u8>, sink: PeerSink) -> PeerStreaming {
        let listener = self.listener.get().cloned();
        Box::pin(async move {
            match listener {
                Some(listener) => relay_call(&listener, &request, sink).await,
                None => sink.refuse(&PeerServiceError::Starting.to_string()).await,
            }
        })
    }
}

/// Why this server did not answer another server's call (sent back as the
/// refusal's reason).
#[derive(Debug, thiserror::Error)]
pub enum PeerServiceError {
    /// The part of the server that answers this kind of call is not set
    /// up yet (the endpoint is bound before raft starts).
    #[error("this server is starting")]
    Starting,
    /// A forwarded client call without even its operator byte.
    #[error("an empty forwarded call")]
    EmptyCall,
    /// A kind of call this server does not know.
    #[error("unknown call kind {0}")]
    UnknownKind(u8),
    /// A forwarded HTTP request that did not decode.
    #[error("a malformed forwarded request: {0}")]
    Malformed(postcard::Error),
    /// A forwarded HTTP request that is not a valid request.
    #[error("a forwarded request that is not valid HTTP: {0}")]
    Request(axum::http::Error),
    /// The answer's body could not be read.
    #[error("reading the answer to a forwarded request: {0}")]
    Body(axum::Error),
}

/// An HTTP request a follower forwards, as it travels.
#[derive(Debug, Serialize, Deserialize)]
pub struct ForwardedRequest {
    /// GET, PUT, ...
    pub method: String,
    /// The path and query.
    pub uri: String,
    /// Name and value of each header.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body.
    pub body: Vec<u8>,
}

/// The leader's answer to a [`ForwardedRequest`].
#[derive(Debug, Serialize, Deserialize)]
pub struct ForwardedResponse {
    /// The status code.
    pub status: u16,
    /// Name and value of each header.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body.
    pub body: Vec<u8>,
}

/// Serves a forwarded HTTP request with this server's API (the leader's
/// side of `http::forward`).
async fn serve_forwarded(router: axum::Router, request: &[u8]) -> Result<Vec<u8>, PeerServiceError> {
    use tower::ServiceExt;
    let forwarded: ForwardedRequest = postcard::from_bytes(request).map_err(PeerServiceError::Malformed)?;
    let mut builder = axum::http::Request::builder().method(forwarded.method.as_str()).uri(forwarded.uri.as_str());
    for (name, value) in &forwarded.headers {
        builder = builder.header(name.as_str(), value.as_slice());
    }
    let request = builder.body(Body::from(forwarded.body)).map_err(PeerServiceError::Request)?;
    let Ok(response) = router.oneshot(request).await;
    let (parts, body) = response.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.map_err(PeerServiceError::Body)?;
    let answer = ForwardedResponse {
        status: parts.status.as_u16(),
        headers: parts.headers.iter().map(|(name, value)| (name.to_string(), value.as_bytes().to_vec())).collect(),
        body: body.to_vec(),
    };
    Ok(postcard::to_allocvec(&answer).expect("a forwarded response encodes"))
}

/// Answers [`kinds::NODE_CONNECTION`]: how long `listener` has held the
/// node's connection, in big-endian milliseconds, or nothing.
pub fn node_connection(listener: &ClientListener, request: &[u8]) -> Vec<u8> {
    let Ok(id) = uuid::Uuid::from_slice(request) else { return Vec::new() };
    match listener.agents().get(NodeId(id)) {
        Some((_, age)) => u64::try_from(age.as_millis()).unwrap_or(u64::MAX).to_be_bytes().to_vec(),
        None => Vec::new(),
    }
}

/// Serves [`kinds::AGENT_CALL`]: makes the call another server sent (an
/// encoded [`AgentCallRequest`] frame) on this server's own connection to
/// the node, and relays the answer as it comes.
pub async fn relay_call(listener: &ClientListener, request: &[u8], sink: PeerSink) {
    let limit = transport::settings::MAX_REQUEST;
    let decoded = match transport::frame::Frame::decode_within(request, limit) {
        Ok(Some((frame, _))) => AgentCallRequest::from_frame(&frame).map_err(|error| error.to_string()),
        Ok(None) => Err("a truncated frame".to_string()),
        Err(error) => Err(error.to_string()),
    };
    let request = match decoded {
        Ok(request) => request,
        Err(error) => return sink.refuse(&format!("a malformed agent call: {error}")).await,
    };
    match listener.call_agent(request.node_id, &request).await {
        Some(Ok(answer)) => transport::agent_call::relay(answer, sink).await,
        Some(Err(error)) => sink.refuse(&error.to_string()).await,
        None => sink.refuse(&format!("this server holds no connection to node {}", request.node_id)).await,
    }
}
