//! `GET /v1/event/stream`: Nomad's event stream (1.0+), read from this
//! server's event buffer (`engine::events`), whichever server it is:
//! every server applies the same log and keeps the same events, so a
//! follower serves it itself instead of relaying it to the leader.
//!
//! 1. The request names its topics (`topic=Job:web`, `topic=Node`, a bare
//!    topic meaning every key, `topic=*:<id>` every topic; none: all of
//!    them), where to start (`index`, inclusive; 0: the oldest kept) and
//!    a namespace (`namespace`, `default` when absent; `*`: all). A key
//!    matches an event's key or one of its filter keys (its job, its
//!    deployment, a service's name).
//! 2. Each topic is checked against the caller's token before anything is
//!    streamed; a refusal is 403. `Job`, `Evaluation`, `Allocation`,
//!    `Deployment` and `Service` need `read-job` in the namespace named
//!    (with `*`, each event is sent only if the token may read its
//!    namespace), `Node` needs node `read`, the ACL topics and `*` a
//!    management token. An unknown topic is refused with 400 instead of
//!    never matching.
//! 3. The first line is `{}`; then one line per index with matching
//!    events; `{}` again after 30 s without one. An event that two of the
//!    requested keys match is sent once (Nomad sends it twice).
//! 4. The body is produced only as fast as the client reads it. A
//!    subscriber that falls a whole buffer behind gets a last line
//!    `{"Error": ...}` naming the index to resume from, and the stream
//!    ends; so does the stream of a token that was deleted or lost what
//!    its topics need, and every stream when the server shuts down.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use engine::events::{Event as EngineEvent, EventBatch, Payload, Subscription, Topic};
use engine::state::Snapshot;
use engine::structs::{AclLevel, Capabilities, DEFAULT_NAMESPACE};
use serde_json::{json, Value};

use super::access::{allowed, Access, Area, Caller, Need};
use super::error::ApiError;
use super::{nomad, ApiState};
use crate::api::events::{Event, EventFrame};
use crate::api::{acl as api_acl, allocations, deployments, evaluations, jobs, nodes, services};

/// A `{}` line is sent after this long without another.
const HEARTBEAT: Duration = Duration::from_secs(30);

/// The routes of this file.
pub fn routes() -> Router<ApiState> {
    Router::new().route("/v1/event/stream", get(stream))
}

/// What a subscriber asked for (module docs, 1).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Wanted {
    /// Each requested topic (`None`: `*`) with its key (`*`: every key).
    topics: Vec<(Option<Topic>, String)>,
    index: u64,
    namespace: String,
}

impl Wanted {
    fn parse(pairs: &[(String, String)]) -> Result<Wanted, ApiError> {
        let mut wanted = Wanted { topics: Vec::new(), index: 0, namespace: DEFAULT_NAMESPACE.to_string() };
        for (name, value) in pairs {
            match name.as_str() {
                "index" => {
                    wanted.index = value
                        .parse()
                        .map_err(|error| ApiError::BadRequest(format!("Unable to parse index: {error}")))?;
                }
                "topic" => wanted.topics.push(parse_topic(value)?),
                "namespace" if !value.is_empty() => wanted.namespace = value.clone(),
                _ => {}
            }
        }
        if wanted.topics.is_empty() {
            wanted.topics.push((None, "*".to_string()));
        }
        Ok(wanted)
    }

    /// What each requested topic needs of the caller's token.
    fn needs(&self) -> impl Iterator<Item = Need> + '_ {
        self.topics.iter().map(|(topic, _)| match topic {
            Some(Topic::Job | Topic::Evaluation | Topic::Allocation | Topic::Deployment | Topic::Service) => {
                Need::InNamespace(Capabilities::READ_JOB)
            }
            Some(Topic::Node) => Need::Level(Area::Node, AclLevel::Read),
            Some(Topic::AclToken | Topic::AclPolicy) | None => Need::Management,
        })
    }

    /// Whether `payload` is something this subscriber asked for.
    fn wants(&self, payload: &Payload) -> bool {
        if payload.namespace().is_some_and(|namespace| self.namespace != "*" && self.namespace != namespace) {
            return false;
        }
        let topic = payload.topic();
        let of_topic = |wanted: &Option<Topic>| wanted.is_none_or(|wanted| wanted == topic);
        if self.topics.iter().any(|(wanted, key)| of_topic(wanted) && key == "*") {
            return true;
        }
        let (key, filter_keys) = (payload.key(), payload.filter_keys());
        self.topics
            .iter()
            .any(|(wanted, wanted_key)| of_topic(wanted) && (*wanted_key == key || filter_keys.contains(wanted_key)))
    }
}

/// `Topic:Key` or `Topic` (every key).
fn parse_topic(text: &str) -> Result<(Option<Topic>, String), ApiError> {
    let mut parts = text.split(':');
    let name = parts.next().unwrap_or_default();
    let key = parts.next().unwrap_or("*");
    if parts.next().is_some() || name.is_empty() || key.is_empty() {
        return Err(ApiError::BadRequest(format!(
            "Invalid topic query: error parsing topics: Invalid key value pair for topic, topic: {text}"
        )));
    }
    if name == "*" {
        return Ok((None, key.to_string()));
    }
    let topic = Topic::parse(name).ok_or_else(|| {
        let known: Vec<&str> = Topic::ALL.iter().map(|topic| topic.as_str()).collect();
        ApiError::BadRequest(format!(
            "Invalid topic query: unknown topic {name:?} (topics are case-sensitive: {} or *)",
            known.join(", ")
        ))
    })?;
    Ok((Some(topic), key.to_string()))
}

/// `GET /v1/event/stream` (module docs).
async fn stream(
    State(state): State<ApiState>,
    caller: Option<axum::Extension<Caller>>,
    Query(pairs): Query<Vec<(String, String)>>,
) -> Result<Response, ApiError> {
    let wanted = Wanted::parse(&pairs)?;
    let events = state.leadership.store().events().clone();
    if !events.is_enabled() {
        return Err(ApiError::BadRequest("the event stream is off on this server (event_buffer_size = 0)".to_string()));
    }
    let accessor = caller.and_then(|axum::Extension(Caller(token))| token).map(|token| token.accessor_id);
    let mut reader = Reader {
        subscription: events.subscribe(wanted.index),
        state,
        wanted,
        accessor,
        access: Access::everything(),
        started: false,
        ended: false,
        last_sent: tokio::time::Instant::now(),
    };
    if let Some(refused) = reader.refusal() {
        return Err(refused);
    }
    let lines = futures_lite::stream::unfold(reader, |mut reader| async move {
        let line = reader.next_line().await?;
        Some((Ok::<_, Infallible>(line), reader))
    });
    let headers = [(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-cache")];
    Ok((headers, Body::from_stream(lines)).into_response())
}

/// One subscriber's stream.
struct Reader {
    state: ApiState,
    subscription: Subscription,
    wanted: Wanted,
    /// The caller's token (none: anonymous, or ACLs off).
    accessor: Option<uuid::Uuid>,
    /// What it grants, as of the last [`Reader::refusal`].
    access: Access,
    started: bool,
    ended: bool,
    /// When the last line was sent: a heartbeat is due `HEARTBEAT` after.
    last_sent: tokio::time::Instant,
}

impl Reader {
    /// Why the caller may not read what it asked for, as the state's ACLs
    /// stand now; `None` when it may (or ACLs are off). Takes what the
    /// token grants now for the events that follow.
    fn refusal(&mut self) -> Option<ApiError> {
        if !self.state.acl_enabled {
            return None;
        }
        let snapshot = self.state.leadership.store().snapshot();
        let acl = snapshot.acl();
        let token = match self.accessor {
            Some(accessor) => match acl.tokens.get(&accessor) {
                Some(token) => Some(token),
                None => return Some(ApiError::Forbidden),
            },
            None => None,
        };
        self.access = Access::of(acl, token);
        let namespace = &self.wanted.namespace;
        let permitted = self.wanted.needs().all(|needed| allowed(&self.access, token, &needed, namespace, &snapshot));
        (!permitted).then_some(ApiError::Forbidden)
    }

    /// The next line to send; `None` once the stream ended.
    async fn next_line(&mut self) -> Option<Bytes> {
        let line = self.next_frame().await;
        self.last_sent = tokio::time::Instant::now();
        line
    }

    async fn next_frame(&mut self) -> Option<Bytes> {
        if !self.started {
            self.started = true;
            return Some(line(&EventFrame::default()));
        }
        if self.ended {
            return None;
        }
        loop {
            // Batches that match nothing do not put the heartbeat off.
            let batch = match tokio::time::timeout_at(self.last_sent + HEARTBEAT, self.subscription.next()).await {
                Err(_quiet) => return Some(line(&EventFrame::default())),
                Ok(Err(ended)) => return Some(self.end(ended.to_string())),
                Ok(Ok(batch)) => batch,
            };
            let acl_changed =
                batch.events.iter().any(|event| matches!(event.payload.topic(), Topic::AclToken | Topic::AclPolicy));
            if acl_changed && self.refusal().is_some() {
                return Some(self.end(
                    "the stream's ACL token was deleted or no longer grants its topics; subscribe again".to_string(),
                ));
            }
            if let Some(frame) = self.frame(&batch) {
                return Some(line(&frame));
            }
        }
    }

    /// The last line, saying why the stream ends.
    fn end(&mut self, why: String) -> Bytes {
        self.ended = true;
        tracing::info!(last_index = self.subscription.last_read(), "an event stream ended: {why}");
        line(&EventFrame { error: Some(why), ..EventFrame::default() })
    }

    /// The events of `batch` this subscriber asked for, if any.
    fn frame(&self, batch: &EventBatch) -> Option<EventFrame> {
        let readable = |payload: &Payload| {
            payload.namespace().is_none_or(|namespace| self.access.may(namespace, Capabilities::READ_JOB))
        };
        let mut wanted = batch
            .events
            .iter()
            .filter(|event| self.wanted.wants(&event.payload) && readable(&event.payload))
            .peekable();
        wanted.peek()?;
        let snapshot = self.state.leadership.store().snapshot();
        let events = wanted.map(|event| event_json(event, batch.index, &snapshot)).collect();
        Some(EventFrame { index: batch.index, events, error: None })
    }
}

fn line(frame: &EventFrame) -> Bytes {
    let mut text = serde_json::to_vec(frame).expect("an event frame serializes");
    text.push(b'\n');
    Bytes::from(text)
}

/// An event as Nomad writes it; objects that name others (a job's
/// summary, an allocation's node) are read in `snapshot`.
fn event_json(event: &EngineEvent, index: u64, snapshot: &Snapshot) -> Event {
    let payload = &event.payload;
    let filter_keys = payload.filter_keys();
    Event {
        topic: payload.topic().as_str().to_string(),
        event_type: event.event_type.to_string(),
        key: payload.key(),
        namespace: payload.namespace().unwrap_or_default().to_string(),
        filter_keys: (!filter_keys.is_empty()).then_some(filter_keys),
        index,
        payload: payload_json(payload, snapshot),
    }
}

fn payload_json(payload: &Payload, snapshot: &Snapshot) -> Value {
    match payload {
        Payload::Job(job) => json!({ "Job": value_of(&nomad::job(job, snapshot)) }),
        Payload::Evaluation(eval) => json!({ "Evaluation": value_of(&evaluations::Evaluation::from(&**eval)) }),
        Payload::Allocation(alloc) => {
            // As Nomad's: without the job, which the Job topic carries.
            let stub = nomad::alloc_stub(alloc, snapshot);
            let mut object = value_of(&allocations::Allocation::new(alloc, stub, jobs::Job::default()));
            object["Job"] = Value::Null;
            json!({ "Allocation": object })
        }
        Payload::Deployment(deployment) => {
            json!({ "Deployment": value_of(&deployments::Deployment::from(&**deployment)) })
        }
        Payload::Node(node) => json!({ "Node": value_of(&nodes::Node::from(&**node)) }),
        Payload::Service(service) => json!({ "Service": value_of(&services::ServiceRegistration::from(&**service)) }),
        Payload::AclToken(token) => {
            let token = api_acl::AclToken { secret_id: String::new(), ..api_acl::AclToken::from(&**token) };
            json!({ "ACLToken": value_of(&token) })
        }
        Payload::AclPolicy(policy) => json!({ "ACLPolicy": value_of(&api_acl::AclPolicy::from(&**policy)) }),
    }
}

fn value_of(object: &impl serde::Serialize) -> Value {
    serde_json::to_value(object).expect("an API object serializes")
}
