//! Answers the other servers' calls: raft's, forwarded client calls and
//! forwarded HTTP requests.

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use replication::Durable;
use serde::{Deserialize, Serialize};
use transport::peer::{PeerAnswer, PeerHandler};
use transport::server::ClientListener;

/// The kinds of server-to-server calls Drover makes besides raft's
/// (`replication::network::kinds` has 1-5).
pub mod kinds {
    /// A client's call a follower forwards: one byte (1: the client has an
    /// operator certificate), then its request frame.
    pub const CLIENT_CALL: u8 = 10;
    /// An HTTP API request a follower forwards.
    pub const HTTP: u8 = 11;
}

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
}

impl PeerHandler for PeerService {
    fn call(&self, kind: u8, request: Vec<u8>) -> PeerAnswer {
        let durable = self.durable.get().cloned();
        let listener = self.listener.get().cloned();
        let http = self.http.get().cloned();
        Box::pin(async move {
            let starting = || "this server is starting".to_string();
            match kind {
                kinds::CLIENT_CALL => {
                    let listener = listener.ok_or_else(starting)?;
                    let (operator, frame) = request.split_first().ok_or("an empty forwarded call")?;
                    Ok(listener.serve_forwarded(frame, *operator == 1).await)
                }
                kinds::HTTP => serve_forwarded(http.ok_or_else(starting)?, &request).await,
                _ => match durable.ok_or_else(starting)?.serve_peer(kind, &request).await {
                    Some(answer) => answer,
                    None => Err(format!("unknown call kind {kind}")),
                },
            }
        })
    }
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
async fn serve_forwarded(router: axum::Router, request: &[u8]) -> Result<Vec<u8>, String> {
    use tower::ServiceExt;
    let forwarded: ForwardedRequest =
        postcard::from_bytes(request).map_err(|error| format!("a malformed forwarded request: {error}"))?;
    let mut builder = axum::http::Request::builder().method(forwarded.method.as_str()).uri(forwarded.uri.as_str());
    for (name, value) in &forwarded.headers {
        builder = builder.header(name.as_str(), value.as_slice());
    }
    let request = builder.body(Body::from(forwarded.body)).map_err(|error| error.to_string())?;
    let Ok(response) = router.oneshot(request).await;
    let (parts, body) = response.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.map_err(|error| error.to_string())?;
    let answer = ForwardedResponse {
        status: parts.status.as_u16(),
        headers: parts.headers.iter().map(|(name, value)| (name.to_string(), value.as_bytes().to_vec())).collect(),
        body: body.to_vec(),
    };
    postcard::to_allocvec(&answer).map_err(|error| error.to_string())
}
