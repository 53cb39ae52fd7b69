//! The agent's own HTTP listener and its logs endpoint, as a Nomad
//! client serves it:
//!
//! `GET /v1/client/fs/logs/<alloc_id>?task=<t>&type=stdout|stderr&follow=true|false&origin=start|end&offset=N&plain=true`
//!
//! - The stream is the task's log files still kept, oldest first (see
//!   `logs.rs`); `offset` counts bytes from `origin`.
//! - `plain=true` answers the bytes as they are; otherwise as Nomad's
//!   frames, JSON objects one after another: `{"File": "alloc/logs/<t>.stdout.N",
//!   "Offset": <offset in that file after the frame>, "Data": "<base64>"}`.
//! - `follow=true` keeps the answer open and sends what the task writes
//!   next, checking every 250 ms, until the task is dead (and all of it is
//!   sent) or the reader goes away.
//!
//! The address is a flag and config key (`--http-addr`, `client.http_addr`),
//! and the bound address is advertised in the node's attributes as
//! `unique.advertise.http`, so the servers and the CLI find it.
//!
//! Every request is checked by the servers first: the agent sends the
//! caller's token (`X-Nomad-Token` or `Authorization: Bearer`) with the
//! allocation over its QUIC connection, and the server it is connected to
//! answers from its replicated ACL state whether the token has Nomad's
//! `read-logs` on the allocation's namespace (with ACLs off, anyone may).
//! A refused token gets 403; while the agent has no server to ask, 503:
//! logs are never served unchecked.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine as _;
use engine::structs::{AllocId, Allocation, NodeId, TaskState, TaskStatus};
use serde::Deserialize;
use tokio::sync::watch;
use transport::client::{CallError, ClientConnection};
use transport::message::RefusalCode;

use crate::client::alloc_dir::AllocDir;
use crate::client::logs::{self, LogKind, StreamCursor};

/// How often a follower looks for more output.
const FOLLOW_POLL: Duration = Duration::from_millis(250);

/// The most bytes one read of a log answers without `follow`.
const MAX_ANSWER: usize = 64 * 1024 * 1024;

/// How long the servers have to answer a token check.
const ACCESS_TIMEOUT: Duration = Duration::from_secs(10);

/// The allocations whose logs the agent serves.
#[derive(Debug)]
pub struct ClientFs {
    data_dir: PathBuf,
    /// Each allocation's tasks and whether each is dead.
    allocs: parking_lot::Mutex<HashMap<AllocId, BTreeMap<String, bool>>>,
    /// The agent's connection to a server, while it has one: who checks tokens.
    servers: parking_lot::Mutex<Option<ServerLink>>,
}

/// The agent's connection to a server and the node it speaks for.
#[derive(Clone, Debug)]
pub struct ServerLink {
    /// The connection.
    pub connection: ClientConnection,
    /// The node.
    pub node_id: NodeId,
    /// Its secret.
    pub secret_id: uuid::Uuid,
}

impl ClientFs {
    /// An endpoint serving the allocations under `data_dir`.
    pub fn new(data_dir: PathBuf) -> Arc<ClientFs> {
        Arc::new(ClientFs {
            data_dir,
            allocs: parking_lot::Mutex::new(HashMap::new()),
            servers: parking_lot::Mutex::new(None),
        })
    }

    /// The agent's server connection now (`None`: it has none).
    pub fn link(&self, link: Option<ServerLink>) {
        *self.servers.lock() = link;
    }

    /// Asks the servers whether `token` may read `alloc_id`'s logs; the
    /// answer to send when it may not.
    async fn check_access(&self, alloc_id: AllocId, token: Option<String>) -> Result<(), Response> {
        let Some(link) = self.servers.lock().clone() else {
            let why = "the agent is not connected to a server, so it cannot check the ACL token; try again";
            return Err(refuse(StatusCode::SERVICE_UNAVAILABLE, why.to_string()));
        };
        let asked = link.connection.logs_access(link.node_id, link.secret_id, alloc_id, token);
        match tokio::time::timeout(ACCESS_TIMEOUT, asked).await {
            Ok(Ok(_)) => Ok(()),
            // The refusal's message is Nomad's body ("Permission denied", ...).
            Ok(Err(CallError::Refused(refusal))) if refusal.code == RefusalCode::Forbidden => {
                Err(refuse(StatusCode::FORBIDDEN, refusal.message))
            }
            Ok(Err(error)) => Err(refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("checking the ACL token with the servers: {error}"),
            )),
            Err(_) => {
                Err(refuse(StatusCode::SERVICE_UNAVAILABLE, "the servers did not answer the ACL check".to_string()))
            }
        }
    }

    /// Learns an allocation's tasks and which are dead.
    pub fn note(&self, alloc: &Allocation, states: &BTreeMap<String, TaskState>) {
        let tasks = alloc.job.group(&alloc.task_group).map(|group| group.tasks.as_slice()).unwrap_or_default();
        let dead = tasks
            .iter()
            .map(|task| {
                (task.name.clone(), states.get(&task.name).is_some_and(|state| state.state == TaskStatus::Dead))
            })
            .collect();
        self.allocs.lock().insert(alloc.id, dead);
    }

    /// Forgets an allocation (garbage collected).
    pub fn forget(&self, alloc_id: AllocId) {
        self.allocs.lock().remove(&alloc_id);
    }

    /// Whether `task` of `alloc_id` is dead; `None` when unknown.
    fn task_dead(&self, alloc_id: AllocId, task: &str) -> Option<bool> {
        self.allocs.lock().get(&alloc_id)?.get(task).copied()
    }

    /// The routes.
    pub fn router(self: Arc<ClientFs>) -> axum::Router {
        axum::Router::new().route("/v1/client/fs/logs/{alloc_id}", get(logs_handler)).with_state(self)
    }
}

/// Serves `fs` on `addr` within `limits` (the API's listener, plain
/// HTTP) until `stop` is set; returns the bound address. Call within a
/// tokio runtime.
pub fn serve(
    fs: Arc<ClientFs>,
    addr: SocketAddr,
    limits: crate::listener::HttpLimits,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let server = crate::listener::HttpServer::start(addr, None, fs.router(), limits)?;
    let bound = server.local_addr();
    let task = tokio::spawn(async move {
        let _ = stop.wait_for(|stop| *stop).await;
        server.shutdown().await;
    });
    Ok((bound, task))
}

/// The query of a logs call.
#[derive(Debug, Deserialize)]
struct LogsQuery {
    task: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    follow: Option<bool>,
    origin: Option<String>,
    offset: Option<u64>,
    plain: Option<bool>,
}

fn refuse(status: StatusCode, message: String) -> Response {
    (status, message).into_response()
}

async fn logs_handler(
    State(fs): State<Arc<ClientFs>>,
    Path(alloc_id): Path<String>,
    Query(query): Query<LogsQuery>,
    headers: HeaderMap,
) -> Response {
    let Ok(alloc_id) = alloc_id.parse::<uuid::Uuid>().map(AllocId) else {
        return refuse(StatusCode::BAD_REQUEST, format!("{alloc_id:?} is not an allocation id"));
    };
    if let Err(refused) = fs.check_access(alloc_id, crate::api::secret_of(&headers)).await {
        return refused;
    }
    let Some(task) = query.task.filter(|task| !task.is_empty()) else {
        return refuse(StatusCode::BAD_REQUEST, "must include task name".to_string());
    };
    let kind = match query.kind.as_deref().unwrap_or("stdout") {
        "stdout" => LogKind::Stdout,
        "stderr" => LogKind::Stderr,
        other => return refuse(StatusCode::BAD_REQUEST, format!("type {other:?} is not stdout or stderr")),
    };
    let from_end = match query.origin.as_deref().unwrap_or("start") {
        "start" => false,
        "end" => true,
        other => return refuse(StatusCode::BAD_REQUEST, format!("origin {other:?} is not start or end")),
    };
    match fs.task_dead(alloc_id, &task) {
        None if !fs.allocs.lock().contains_key(&alloc_id) => {
            return refuse(StatusCode::NOT_FOUND, format!("unknown allocation {alloc_id}"));
        }
        None => return refuse(StatusCode::NOT_FOUND, format!("allocation {alloc_id} has no task {task:?}")),
        Some(_) => {}
    }
    let logs_dir = AllocDir::new(&fs.data_dir, alloc_id).logs_dir();
    let prefix = logs::prefix(&task, kind);
    let mut cursor = StreamCursor::new(&logs_dir, &prefix, query.offset.unwrap_or(0), from_end);
    let plain = query.plain.unwrap_or(false);
    let content_type = if plain { "text/plain; charset=utf-8" } else { "application/json" };
    if !query.follow.unwrap_or(false) {
        return match cursor.read_more(MAX_ANSWER) {
            Ok(bytes) => ([(header::CONTENT_TYPE, content_type)], frame(&cursor, bytes, plain)).into_response(),
            Err(error) => refuse(StatusCode::INTERNAL_SERVER_ERROR, format!("reading the logs: {error}")),
        };
    }
    let stream = futures_lite::stream::unfold((fs, cursor, false), move |(fs, mut cursor, ended)| {
        let task = task.clone();
        async move {
            if ended {
                return None;
            }
            loop {
                // Read whether the task is dead before reading, so nothing
                // written just before it died is missed.
                let dead = fs.task_dead(alloc_id, &task).unwrap_or(true);
                match cursor.read_more(64 * 1024) {
                    Err(error) => return Some((Err(error), (fs, cursor, true))),
                    Ok(bytes) if !bytes.is_empty() => {
                        let framed = frame(&cursor, bytes, plain);
                        return Some((Ok(framed), (fs, cursor, false)));
                    }
                    Ok(_) if dead => return None,
                    Ok(_) => tokio::time::sleep(FOLLOW_POLL).await,
                }
            }
        }
    });
    ([(header::CONTENT_TYPE, content_type)], Body::from_stream(stream)).into_response()
}

/// The bytes as they go out: plain, or one of Nomad's frames.
fn frame(cursor: &StreamCursor, bytes: Vec<u8>, plain: bool) -> Vec<u8> {
    if plain || bytes.is_empty() {
        return bytes;
    }
    let (file, offset) = cursor.position().unwrap_or_default();
    let frame = serde_json::json!({
        "File": format!("alloc/logs/{file}"),
        "Offset": offset,
        "Data": base64::engine::general_purpose::STANDARD.encode(&bytes),
    });
    frame.to_string().into_bytes()
}
