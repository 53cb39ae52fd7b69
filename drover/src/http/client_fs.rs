//! Nomad's client file endpoints, on any server: an allocation's logs and
//! files, read by its agent and streamed back through the server that
//! holds the agent's connection (`client.rs` has how the call gets there).
//!
//! - `GET /v1/client/fs/logs/:alloc?task=&type=stdout|stderr&follow=&origin=start|end&offset=&plain=`:
//!   the task's log files still kept, oldest first; `offset` counts bytes
//!   from `origin`; with `follow` the answer goes on with what the task
//!   writes until it is dead or the caller goes away.
//! - `GET /v1/client/fs/ls/:alloc?path=/`, `.../stat/:alloc?path=`:
//!   `[AllocFileInfo]` and `AllocFileInfo`.
//! - `GET /v1/client/fs/cat/:alloc?path=`, `.../readat/:alloc?path=&offset=&limit=`:
//!   the file's bytes.
//! - `GET /v1/client/fs/stream/:alloc?path=&offset=&origin=&follow=true`:
//!   the file from `offset`, going on with what is appended.
//!
//! A streamed answer is plain bytes (`plain=true`, `cat`, `readat`) or
//! Nomad's `StreamFrame`s, JSON objects one after another; it is read
//! from the agent a bounded chunk at a time, each only once the caller
//! took the one before. Paths are relative to the allocation's directory;
//! one that leaves it, or reads a task's `secrets/`, is refused.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use transport::agent_call::{AgentAnswer, AgentFrame};
use transport::message::{AgentCall, AgentReply, FileChunk, LogStream, LogsCall, Origin, ReadCall};

use super::client::{alloc_node, call_agent};
use super::error::ApiError;
use super::query::{Params, Reply};
use super::ApiState;
use crate::api::fs::{AllocFileInfo, StreamFrame};

/// The routes of this file.
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/client/fs/logs/{alloc}", get(logs))
        .route("/v1/client/fs/ls/{alloc}", get(list))
        .route("/v1/client/fs/stat/{alloc}", get(stat))
        .route("/v1/client/fs/cat/{alloc}", get(cat))
        .route("/v1/client/fs/readat/{alloc}", get(read_at))
        .route("/v1/client/fs/stream/{alloc}", get(stream))
}

/// `GET /v1/client/fs/logs/:alloc` (module docs).
async fn logs(State(state): State<ApiState>, Path(alloc): Path<String>, params: Params) -> Result<Response, ApiError> {
    let (alloc_id, node_id) = alloc_node(&state, &alloc)?;
    let task = params.get("task").filter(|task| !task.is_empty());
    let task = task.ok_or_else(|| ApiError::BadRequest("must include task name".to_string()))?.to_string();
    let stream = match params.get("type").unwrap_or("stdout") {
        "stdout" => LogStream::Stdout,
        "stderr" => LogStream::Stderr,
        other => return Err(ApiError::BadRequest(format!("type {other:?} is not stdout or stderr"))),
    };
    let call = LogsCall {
        alloc_id,
        task,
        stream,
        origin: origin(&params)?,
        offset: number(&params, "offset")?.unwrap_or(0),
        follow: params.flag("follow")?,
    };
    let shape = if params.flag("plain")? { Shape::Plain } else { Shape::Frames { under: "alloc/logs/".into() } };
    let (first, answer) = call_agent(&state, node_id, AgentCall::Logs(call)).await?;
    streamed(first, answer, shape)
}

/// `GET /v1/client/fs/ls/:alloc?path=` (`/` when absent).
async fn list(State(state): State<ApiState>, Path(alloc): Path<String>, params: Params) -> Result<Reply, ApiError> {
    let (alloc_id, node_id) = alloc_node(&state, &alloc)?;
    let path = params.get("path").filter(|path| !path.is_empty()).unwrap_or("/").to_string();
    match call_agent(&state, node_id, AgentCall::List { alloc_id, path }).await? {
        (AgentFrame::Reply(AgentReply::Files(files)), _) => {
            let files: Vec<AllocFileInfo> = files.iter().map(AllocFileInfo::from).collect();
            Ok(Reply::json(&files, params.pretty(), None))
        }
        (other, _) => Err(unexpected(&other)),
    }
}

/// `GET /v1/client/fs/stat/:alloc?path=`.
async fn stat(State(state): State<ApiState>, Path(alloc): Path<String>, params: Params) -> Result<Reply, ApiError> {
    let (alloc_id, node_id) = alloc_node(&state, &alloc)?;
    let path = required_path(&params)?;
    match call_agent(&state, node_id, AgentCall::Stat { alloc_id, path }).await? {
        (AgentFrame::Reply(AgentReply::File(file)), _) => {
            Ok(Reply::json(&AllocFileInfo::from(&file), params.pretty(), None))
        }
        (other, _) => Err(unexpected(&other)),
    }
}

/// `GET /v1/client/fs/cat/:alloc?path=`: the whole file.
async fn cat(State(state): State<ApiState>, Path(alloc): Path<String>, params: Params) -> Result<Response, ApiError> {
    let (alloc_id, node_id) = alloc_node(&state, &alloc)?;
    let path = required_path(&params)?;
    let read = ReadCall { alloc_id, path, origin: Origin::Start, offset: 0, limit: None, follow: false };
    let (first, answer) = call_agent(&state, node_id, AgentCall::Read(read)).await?;
    streamed(first, answer, Shape::Plain)
}

/// `GET /v1/client/fs/readat/:alloc?path=&offset=&limit=`: `limit` bytes
/// from `offset`, both required.
async fn read_at(
    State(state): State<ApiState>,
    Path(alloc): Path<String>,
    params: Params,
) -> Result<Response, ApiError> {
    let (alloc_id, node_id) = alloc_node(&state, &alloc)?;
    let path = required_path(&params)?;
    let offset = number(&params, "offset")?.ok_or_else(|| ApiError::BadRequest("must provide an offset".into()))?;
    let limit = number(&params, "limit")?.ok_or_else(|| ApiError::BadRequest("must provide a limit".into()))?;
    let read = ReadCall { alloc_id, path, origin: Origin::Start, offset, limit: Some(limit), follow: false };
    let (first, answer) = call_agent(&state, node_id, AgentCall::Read(read)).await?;
    streamed(first, answer, Shape::Plain)
}

/// `GET /v1/client/fs/stream/:alloc?path=&offset=&origin=&follow=`
/// (`follow` is true unless it says otherwise, as in Nomad).
async fn stream(
    State(state): State<ApiState>,
    Path(alloc): Path<String>,
    params: Params,
) -> Result<Response, ApiError> {
    let (alloc_id, node_id) = alloc_node(&state, &alloc)?;
    let path = required_path(&params)?;
    let follow = match params.get("follow") {
        None | Some("") => true,
        Some(_) => params.flag("follow")?,
    };
    let offset = number(&params, "offset")?.unwrap_or(0);
    let read = ReadCall { alloc_id, path: path.clone(), origin: origin(&params)?, offset, limit: None, follow };
    let (first, answer) = call_agent(&state, node_id, AgentCall::Read(read)).await?;
    streamed(first, answer, Shape::Frames { under: String::new() })
}

/// `?path=`, required.
fn required_path(params: &Params) -> Result<String, ApiError> {
    let path = params.get("path").filter(|path| !path.is_empty());
    Ok(path.ok_or_else(|| ApiError::BadRequest("must provide a file path".to_string()))?.to_string())
}

/// `?origin=`: `start` (the default) or `end`.
fn origin(params: &Params) -> Result<Origin, ApiError> {
    match params.get("origin").unwrap_or("start") {
        "start" | "" => Ok(Origin::Start),
        "end" => Ok(Origin::End),
        other => Err(ApiError::BadRequest(format!("origin {other:?} is not start or end"))),
    }
}

/// A whole number parameter, if present.
fn number(params: &Params, name: &str) -> Result<Option<u64>, ApiError> {
    match params.get(name).filter(|text| !text.is_empty()) {
        None => Ok(None),
        Some(text) => text.parse().map(Some).map_err(|_| ApiError::BadRequest(format!("invalid {name} {text:?}"))),
    }
}

/// How a streamed answer is written.
enum Shape {
    /// The bytes as they are.
    Plain,
    /// Nomad's frames, their `File` the chunk's file under this prefix.
    Frames { under: String },
}

impl Shape {
    /// The bytes a chunk goes out as (none for an empty one).
    fn render(&self, chunk: FileChunk) -> Vec<u8> {
        match self {
            Shape::Plain => chunk.data,
            Shape::Frames { .. } if chunk.data.is_empty() => Vec::new(),
            Shape::Frames { under } => {
                let frame = StreamFrame::of(format!("{under}{}", chunk.file), chunk.offset, &chunk.data);
                serde_json::to_vec(&frame).expect("a frame serializes")
            }
        }
    }

    fn content_type(&self) -> &'static str {
        match self {
            Shape::Plain => "text/plain; charset=utf-8",
            Shape::Frames { .. } => "application/json",
        }
    }
}

/// The answer of a streaming call as the response body, read from the
/// agent one chunk at a time as the caller takes them (module docs). An
/// error from the agent in the middle ends the body as failed.
fn streamed(first: AgentFrame, answer: AgentAnswer, shape: Shape) -> Result<Response, ApiError> {
    let first = match first {
        AgentFrame::Chunk(chunk) => chunk,
        other => return Err(unexpected(&other)),
    };
    let content_type = shape.content_type();
    let start = (Some(first), answer, shape, false);
    let body = futures_lite::stream::unfold(start, |(mut pending, mut answer, shape, ended)| async move {
        if ended {
            return None;
        }
        loop {
            let chunk = match pending.take() {
                Some(chunk) => chunk,
                None => match answer.next().await {
                    Ok(Some(AgentFrame::Chunk(chunk))) => chunk,
                    Ok(Some(AgentFrame::Reply(_))) | Ok(None) => return None,
                    Err(error) => {
                        let failed = std::io::Error::other(error.to_string());
                        return Some((Err(failed), (None, answer, shape, true)));
                    }
                },
            };
            let bytes = shape.render(chunk);
            if !bytes.is_empty() {
                return Some((Ok::<_, std::io::Error>(bytes), (None, answer, shape, false)));
            }
        }
    });
    Ok(([(header::CONTENT_TYPE, content_type)], Body::from_stream(body)).into_response())
}

/// An agent's answer that is not the one its call has.
fn unexpected(frame: &AgentFrame) -> ApiError {
    ApiError::Internal(format!("the agent answered with an unexpected frame: {frame:?}"))
}
