//! Nomad's namespace endpoints: `GET /v1/namespaces[?prefix=]`, `GET|PUT|
//! POST|DELETE /v1/namespace/:name`, and `PUT|POST /v1/namespace` with the
//! name in the body (python-nomad's create).
//!
//! `default` always exists (written or not) and cannot be deleted; a
//! namespace that still holds jobs cannot be deleted either. Reads show
//! only the namespaces the caller's token grants something in (`403` for
//! one it grants nothing in), writes need a management token (`access.rs`).
//! Both block as every read (`?index=`, on the namespaces' table index).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::Method;
use axum::routing::{any, get};
use axum::{Extension, Router};
use engine::state::{Command, Snapshot, StateError};
use engine::structs::Namespace;
use serde_json::Value;

use super::access::Access;
use super::error::ApiError;
use super::query::{blocking, Params, Reply};
use super::{on_engine, ApiState};
use crate::api::namespaces::{self as api, NamespaceRequest};

/// The routes of this file.
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/namespaces", get(list))
        .route("/v1/namespace", any(named_by_body))
        .route("/v1/namespace/", any(named_by_body))
        .route("/v1/namespace/{name}", any(namespace))
}

/// The namespaces' table index (1 before any write: `default` is there).
fn namespaces_index(snapshot: &Snapshot) -> Result<u64, ApiError> {
    Ok(snapshot.table_indexes().namespaces.max(1))
}

/// `GET /v1/namespaces[?prefix=]`: by name.
async fn list(
    State(state): State<ApiState>,
    Extension(access): Extension<Access>,
    params: Params,
) -> Result<Reply, ApiError> {
    let prefix = params.prefix().to_string();
    blocking(&state, &params, namespaces_index, |snapshot| {
        let shown = snapshot
            .namespaces()
            .into_iter()
            .filter(|namespace| namespace.name.starts_with(&prefix) && access.any_in(&namespace.name));
        Ok(shown.map(|namespace| api::Namespace::from(&namespace)).collect::<Vec<_>>())
    })
    .await
}

/// `/v1/namespace` without a name: a write names it in its body.
async fn named_by_body(State(state): State<ApiState>, method: Method, body: Bytes) -> Result<Reply, ApiError> {
    if method != Method::PUT && method != Method::POST {
        return Err(ApiError::BadRequest("missing namespace name".to_string()));
    }
    let request = read_request(&body)?;
    let name = request.name.clone().filter(|name| !name.is_empty());
    let name = name.ok_or_else(|| ApiError::BadRequest("missing namespace name".to_string()))?;
    write(&state, name, request).await
}

fn read_request(body: &Bytes) -> Result<NamespaceRequest, ApiError> {
    if body.is_empty() {
        return Ok(NamespaceRequest::default());
    }
    serde_json::from_slice(body).map_err(|error| ApiError::BadRequest(format!("Invalid namespace: {error}")))
}

/// `/v1/namespace/:name`: read, write or delete.
async fn namespace(
    State(state): State<ApiState>,
    Extension(access): Extension<Access>,
    method: Method,
    Path(name): Path<String>,
    params: Params,
    body: Bytes,
) -> Result<Reply, ApiError> {
    match method {
        Method::GET | Method::HEAD => read(&state, &access, &params, name).await,
        Method::PUT | Method::POST => write(&state, name, read_request(&body)?).await,
        Method::DELETE => delete(&state, name).await,
        _ => Err(ApiError::MethodNotAllowed),
    }
}

/// `GET /v1/namespace/:name`: 404 `namespace not found`; 403 for one the
/// caller's token grants nothing in.
async fn read(state: &ApiState, access: &Access, params: &Params, name: String) -> Result<Reply, ApiError> {
    if !access.any_in(&name) {
        return Err(ApiError::Forbidden);
    }
    let find = |snapshot: &Snapshot| -> Result<Namespace, ApiError> {
        snapshot.namespace(&name).ok_or_else(|| ApiError::NotFound("namespace not found".to_string()))
    };
    blocking(
        state,
        params,
        |snapshot| Ok(find(snapshot)?.modify_index.max(1)),
        |snapshot| Ok(api::Namespace::from(&find(snapshot)?)),
    )
    .await
}

/// `PUT|POST /v1/namespace/:name`: creates or replaces it (the body's name,
/// when given, must be the path's).
async fn write(state: &ApiState, name: String, request: NamespaceRequest) -> Result<Reply, ApiError> {
    if let Some(named) = request.name.as_deref().filter(|named| !named.is_empty() && *named != name) {
        return Err(ApiError::BadRequest(format!("namespace name {named:?} does not match the path's {name:?}")));
    }
    if let Some(unsupported) = request.unsupported() {
        return Err(ApiError::BadRequest(format!("namespace {name:?}: {unsupported} is not supported by Drover")));
    }
    let namespace = Namespace {
        name,
        description: request.description.unwrap_or_default(),
        meta: request.meta.unwrap_or_default(),
        create_index: 0,
        modify_index: 0,
    };
    if let Some(problem) = namespace.problem() {
        return Err(ApiError::BadRequest(problem));
    }
    let index = write_command(state, Command::UpsertNamespaces { namespaces: vec![namespace] }).await?;
    Ok(Reply::json(&Value::Null, false, Some(index)))
}

/// `DELETE /v1/namespace/:name`: 400 for `default` and for a namespace
/// that holds jobs, 404 for one that does not exist.
async fn delete(state: &ApiState, name: String) -> Result<Reply, ApiError> {
    let index = write_command(state, Command::DeleteNamespaces { names: vec![name] }).await?;
    Ok(Reply::json(&Value::Null, false, Some(index)))
}

/// Writes `command` through the leader; its index.
async fn write_command(state: &ApiState, command: Command) -> Result<u64, ApiError> {
    let leader = state.leader()?;
    let written: Result<_, StateError> = on_engine(move || leader.writer().write(command)).await?;
    Ok(written?.index)
}
