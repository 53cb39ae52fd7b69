//! Query parameters, blocking queries and the reply every read carries.
//!
//! A blocking query (`?index=N&wait=D`) runs its read, and while the index
//! of what it read is not above N it waits for the store's index to move
//! past the snapshot it read (an awaited event, no thread and no polling),
//! then reads again; at the deadline it answers with what it has, 200, as
//! Nomad does. The wait defaults to and is capped at 300 s (Nomad's code;
//! its docs say 10 min), plus up to `wait/16` of jitter.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::{FromRequestParts, Query};
use axum::http::request::Parts;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use engine::state::Snapshot;
use engine::structs::DEFAULT_NAMESPACE;
use rand::Rng;
use serde::Serialize;

use super::error::ApiError;
use super::ApiState;
use crate::api::format::{parse_bool, parse_go_duration};

/// The longest (and the default) blocking wait.
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// Refuses with 400 a namespace that does not exist in `snapshot` (and
/// `*`, every namespace, unless on a read, as Nomad).
pub fn known_namespace(snapshot: &Snapshot, namespace: &str, read: bool) -> Result<(), ApiError> {
    match namespace {
        "*" if read => Ok(()),
        "*" => Err(ApiError::BadRequest("namespace \"*\" names every namespace: a write needs one".to_string())),
        _ if snapshot.has_namespace(namespace) => Ok(()),
        _ => Err(ApiError::BadRequest(format!("namespace {namespace:?} does not exist"))),
    }
}

/// The namespace `uri` names in `?namespace=`, if any (empty is none).
pub fn named_namespace(uri: &axum::http::Uri) -> Option<String> {
    let Query(mut params) = Query::<BTreeMap<String, String>>::try_from_uri(uri).ok()?;
    params.remove("namespace").filter(|namespace| !namespace.is_empty())
}

/// The `?namespace=` check in front of every endpoint ([`known_namespace`]),
/// but those of the namespaces themselves.
pub async fn check_namespace(
    axum::extract::State(state): axum::extract::State<ApiState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = request.uri().path();
    // A search is a read sent as a PUT or POST.
    let read = request.method() == axum::http::Method::GET
        || request.method() == axum::http::Method::HEAD
        || path == "/v1/search";
    if !path.starts_with("/v1/namespace") {
        if let Some(namespace) = named_namespace(request.uri()) {
            let snapshot = state.leadership.store().snapshot();
            if let Err(refused) = known_namespace(&snapshot, &namespace, read) {
                return refused.into_response();
            }
        }
    }
    next.run(request).await
}

/// The query parameters the API reads.
#[derive(Clone, Debug, Default)]
pub struct Params(BTreeMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Query(map) = Query::<BTreeMap<String, String>>::from_request_parts(parts, state)
            .await
            .map_err(|error| ApiError::BadRequest(format!("Invalid query: {error}")))?;
        Ok(Params(map))
    }
}

impl Params {
    /// A parameter's raw value.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// `?namespace=`, `default` when absent or empty.
    pub fn namespace(&self) -> &str {
        self.get("namespace").filter(|namespace| !namespace.is_empty()).unwrap_or(DEFAULT_NAMESPACE)
    }

    /// `?prefix=`, empty when absent.
    pub fn prefix(&self) -> &str {
        self.get("prefix").unwrap_or("")
    }

    /// A boolean parameter, read as Go's `strconv.ParseBool` reads it (so
    /// python-nomad's `True`/`False` work); absent is `false`.
    pub fn flag(&self, name: &str) -> Result<bool, ApiError> {
        match self.get(name) {
            None => Ok(false),
            Some(text) => parse_bool(text)
                .ok_or_else(|| ApiError::BadRequest(format!("Failed to parse value of {name:?} ({text:?}) as a bool"))),
        }
    }

    /// The blocking part: `?index=` (0 when absent) and `?wait=`.
    pub fn blocking(&self) -> Result<(u64, Duration), ApiError> {
        let index = match self.get("index") {
            None | Some("") => 0,
            Some(text) => text.parse::<u64>().map_err(|_| ApiError::BadRequest("Invalid index".to_string()))?,
        };
        let wait = match self.get("wait") {
            None | Some("") => MAX_WAIT,
            Some(text) => {
                parse_go_duration(text).ok_or_else(|| ApiError::BadRequest("Invalid wait time".to_string()))?
            }
        };
        let wait = if wait.is_zero() { MAX_WAIT } else { wait.min(MAX_WAIT) };
        Ok((index, wait))
    }

    /// `?per_page=` (Nomad 1.3+): a page size, none when absent or 0.
    pub fn per_page(&self) -> Result<Option<usize>, ApiError> {
        match self.get("per_page") {
            None | Some("") => Ok(None),
            Some(text) => match text.parse::<usize>() {
                Ok(0) => Ok(None),
                Ok(size) => Ok(Some(size)),
                Err(_) => Err(ApiError::BadRequest("Expect a number for `per_page` query string parameter".into())),
            },
        }
    }

    /// `?next_token=`: where the page starts (the `X-Nomad-NextToken` of the last one).
    pub fn next_token(&self) -> Option<&str> {
        self.get("next_token").filter(|token| !token.is_empty())
    }

    /// `?filter=`, parsed ([`super::filter`]); 400 as Nomad's when it does not parse.
    pub fn filter(&self) -> Result<Option<super::filter::Filter>, ApiError> {
        let Some(text) = self.get("filter").filter(|text| !text.trim().is_empty()) else { return Ok(None) };
        super::filter::Filter::parse(text).map(Some).map_err(|error| {
            ApiError::BadRequest(format!(
                "failed to create result paginator: failed to read filter expression: {error}"
            ))
        })
    }

    /// Whether `?pretty` asks for indented JSON (any value but `0`).
    pub fn pretty(&self) -> bool {
        self.get("pretty").is_some_and(|value| value != "0")
    }
}

/// Whether a UUID-keyed object's id starts with `prefix`, as Nomad
/// matches them: hyphens ignored, case ignored. Nomad refuses odd-length
/// or non-hex prefixes with a 500; Drover matches them as plain prefixes of
/// the hex digits, so they simply match what they can.
pub fn matches_uuid_prefix(id: &uuid::Uuid, prefix: &str) -> bool {
    let wanted: String = prefix.chars().filter(|c| *c != '-').map(|c| c.to_ascii_lowercase()).collect();
    let mut buffer = uuid::Uuid::encode_buffer();
    id.simple().encode_lower(&mut buffer).starts_with(&wanted)
}

/// Parses a full UUID from a path, or answers 404 `<what> not found` (Nomad
/// answers a malformed one with a 500; neither client tells them apart).
pub fn exact_uuid(text: &str, what: &str) -> Result<uuid::Uuid, ApiError> {
    uuid::Uuid::parse_str(text).map_err(|_| ApiError::NotFound(format!("{what} not found")))
}

/// A JSON answer with the read headers.
#[derive(Debug)]
pub struct Reply {
    body: Vec<u8>,
    index: Option<u64>,
    next_token: Option<String>,
}

impl Reply {
    /// `value` as JSON, indented with `pretty`; `index` is what the read
    /// saw (sent as at least 1), none for answers Nomad sends without the
    /// query headers (agent and status endpoints).
    pub fn json(value: &impl Serialize, pretty: bool, index: Option<u64>) -> Reply {
        let body = if pretty { serde_json::to_vec_pretty(value) } else { serde_json::to_vec(value) };
        Reply { body: body.expect("API values serialize to JSON"), index, next_token: None }
    }

    /// With `X-Nomad-NextToken`: where the next page starts (none: this is the last).
    pub fn with_next_token(mut self, next_token: Option<String>) -> Reply {
        self.next_token = next_token;
        self
    }
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        let mut response = ([("content-type", "application/json")], self.body).into_response();
        if let Some(index) = self.index {
            let headers = response.headers_mut();
            headers.insert("x-nomad-index", HeaderValue::from(index.max(1)));
            headers.insert("x-nomad-knownleader", HeaderValue::from_static("true"));
            headers.insert("x-nomad-lastcontact", HeaderValue::from_static("0"));
        }
        if let Some(token) = self.next_token.and_then(|token| HeaderValue::from_str(&token).ok()) {
            response.headers_mut().insert("x-nomad-nexttoken", token);
        }
        response
    }
}

/// Answers `answer` of the newest snapshot, as a blocking query when
/// `params` asks for one: until `index` (the index of what the answer
/// reads, cheap to find) passes the query's, the query waits and holds
/// nothing but its wait, so 10,000 waiting queries on a large list cost
/// their connections, not 10,000 copies of the list. See the module docs.
pub async fn blocking<T: Serialize>(
    state: &ApiState,
    params: &Params,
    index: impl Fn(&Snapshot) -> Result<u64, ApiError>,
    answer: impl Fn(&Snapshot) -> Result<T, ApiError>,
) -> Result<Reply, ApiError> {
    let reply = |snapshot: &Snapshot| -> Result<Reply, ApiError> {
        Ok(Reply::json(&answer(snapshot)?, params.pretty(), Some(index(snapshot)?)))
    };
    blocking_reply(state, params, &index, reply).await
}

/// [`blocking`], with the whole reply made by `reply` (a page with its
/// next token).
pub async fn blocking_reply(
    state: &ApiState,
    params: &Params,
    index: impl Fn(&Snapshot) -> Result<u64, ApiError>,
    reply: impl Fn(&Snapshot) -> Result<Reply, ApiError>,
) -> Result<Reply, ApiError> {
    let (min_index, wait) = params.blocking()?;
    let jitter = wait.mul_f64(rand::rng().random::<f64>() / 16.0);
    let deadline = tokio::time::Instant::now() + wait + jitter;
    let store = state.leadership.store();
    loop {
        let snapshot = store.snapshot();
        if min_index == 0 || index(&snapshot)? > min_index {
            return reply(&snapshot);
        }
        match tokio::time::timeout_at(deadline, store.wait_for_index(snapshot.index() + 1)).await {
            Ok(Ok(_)) => continue,
            // The deadline, or a store shutting down: answer with what is there.
            Ok(Err(_)) | Err(_) => return reply(&store.snapshot()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booleans_read_as_go_reads_them() {
        for yes in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_bool(yes), Some(true));
        }
        for no in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_bool(no), Some(false));
        }
        assert_eq!(parse_bool("yes"), None);
    }

    #[test]
    fn uuid_prefixes_ignore_hyphens_and_case() {
        let id = uuid::Uuid::parse_str("5a8b2c3d-1234-4e5f-8a9b-0c1d2e3f4a5b").expect("uuid");
        for prefix in ["", "5a", "5A8B", "5a8b2c3d-12", "5a8b2c3d12", "5a8b2"] {
            assert!(matches_uuid_prefix(&id, prefix), "{prefix}");
        }
        for prefix in ["5b", "zz", "5a8b2c3d-13"] {
            assert!(!matches_uuid_prefix(&id, prefix), "{prefix}");
        }
    }
}
