//! The ACL check in front of every endpoint: what each request needs, and
//! what the caller's token grants.
//!
//! With `acl.enabled`, a request carries its token's secret in
//! `X-Nomad-Token` (or `Authorization: Bearer`). What each path needs
//! (`need`):
//! 1. nothing: `/v1/acl/bootstrap` (done once), `/v1/agent/health`,
//!    `/v1/status/*`, `/v1/regions`, `/v1/metrics` (load balancers and
//!    scrapers carry no token, as with Nomad);
//! 2. a management token: the rest of `/v1/acl/`, writes of namespaces,
//!    `/v1/operator/snapshot`, `/v1/system/*` (forced garbage collection),
//!    `DELETE /v1/evaluations` (Nomad's eval delete), and any path not
//!    named here;
//! 3. a level on an area: nodes (and a client's host stats and garbage
//!    collection) `node`, the agent and workers `agent`, `/v1/operator/*`
//!    `operator`; `read` for GET, `write` for the rest;
//! 4. a namespace capability, as Nomad's endpoints need them: in the
//!    namespace the request names (`?namespace=`, `default` when absent)
//!    for lists and jobs; in the namespace of the object the path names for
//!    an allocation, evaluation or deployment by id and the client
//!    operations on an allocation; in the namespace the body names for a
//!    job's register, plan and validation and a search, checked by their
//!    handlers. With `?namespace=*` a list shows only what the token may
//!    read ([`Access`]);
//! 5. the namespace list and a namespace's read: any caller, shown only the
//!    namespaces its token grants anything in;
//! 6. the event stream (`/v1/event/stream`), whatever each of its topics
//!    needs, checked by its handler (`events.rs`).
//!
//! A request without a token gets the policy named `anonymous` if there
//! is one (as in Nomad), nothing otherwise. A refusal is 403 with Nomad's
//! body ("Permission denied", or "ACL token not found"), and is logged
//! with the method, path and the token's accessor id, never its secret.
//! Every request that passes carries an [`Access`] (everything when ACLs
//! are off) for the handlers' own checks.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use engine::state::Snapshot;
use engine::structs::{
    AclLevel, AclRules, AclState, AclToken, AclTokenType, AllocId, Capabilities, DeploymentId, EvalId,
    DEFAULT_NAMESPACE,
};
use transport::log_limit::RateLimited;

use super::error::ApiError;
use super::ApiState;

/// An area a request needs a level on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Area {
    /// Nodes.
    Node,
    /// The agent.
    Agent,
    /// The operator endpoints.
    Operator,
}

/// An object a path names by id, whose namespace a request is checked in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Object {
    /// An allocation.
    Alloc(String),
    /// An evaluation.
    Eval(String),
    /// A deployment.
    Deployment(String),
}

/// What a request needs (module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    /// Nothing: open to all.
    Nothing,
    /// A known token, whatever it grants.
    AnyToken,
    /// A management token.
    Management,
    /// A level on an area.
    Level(Area, AclLevel),
    /// A capability in the namespace the request names (`*`: the handler
    /// keeps what the token may see).
    InNamespace(Capabilities),
    /// A capability in the namespace of the object the path names (for
    /// one that does not exist, in the request's, and the handler's 404).
    OnObject(Capabilities, Object),
    /// A capability in the namespace the body names, checked by the
    /// handler: here only a secret naming no token is refused.
    InBody(Capabilities),
    /// Anyone; the handler shows only what the token grants something in
    /// (the namespaces).
    Filtered,
    /// What each requested topic needs, checked by the handler
    /// (`/v1/event/stream`): here only a secret naming no token is refused.
    PerTopic,
}

/// What a request of `method` on `path` needs (module docs).
pub(crate) fn need(method: &Method, path: &str) -> Need {
    let reads = method == Method::GET || method == Method::HEAD;
    let level = if reads { AclLevel::Read } else { AclLevel::Write };
    let open = ["/v1/agent/health", "/v1/regions", "/v1/metrics", "/v1/acl/bootstrap"];
    if open.contains(&path) || path.starts_with("/v1/status/") {
        return Need::Nothing;
    }
    if let Some(needed) = client_need(path) {
        return needed;
    }
    if let Some(needed) = job_need(method, path) {
        return needed;
    }
    if let Some(needed) = object_need(path) {
        return needed;
    }
    match path {
        "/v1/event/stream" => Need::PerTopic,
        "/v1/acl/token/self" => Need::AnyToken,
        "/v1/namespaces" => Need::Filtered,
        _ if path.starts_with("/v1/namespace/") => {
            if reads {
                Need::Filtered
            } else {
                Need::Management
            }
        }
        "/v1/evaluations" if method == Method::DELETE => Need::Management,
        "/v1/allocations" | "/v1/evaluations" | "/v1/deployments" | "/v1/services" => {
            Need::InNamespace(Capabilities::READ_JOB)
        }
        _ if path.starts_with("/v1/service/") => {
            let capability = if reads { Capabilities::READ_JOB } else { Capabilities::SUBMIT_JOB };
            Need::InNamespace(capability)
        }
        "/v1/scaling/policies" => Need::InNamespace(Capabilities::LIST_SCALING_POLICIES),
        "/v1/search" => Need::InBody(Capabilities::LIST_JOBS),
        "/v1/jobs/parse" => Need::InNamespace(Capabilities::PARSE_JOB),
        "/v1/validate/job" => Need::InBody(Capabilities::READ_JOB),
        "/v1/nodes" => Need::Level(Area::Node, level),
        _ if path.starts_with("/v1/node/") => Need::Level(Area::Node, level),
        _ if path.starts_with("/v1/operator/snapshot") => Need::Management,
        _ if path.starts_with("/v1/operator/") => Need::Level(Area::Operator, level),
        _ if path.starts_with("/v1/agent/") => Need::Level(Area::Agent, level),
        _ => Need::Management,
    }
}

/// `/v1/jobs` and `/v1/job/<id>[/<what>]`: Nomad's job capabilities.
fn job_need(method: &Method, path: &str) -> Option<Need> {
    let reads = method == Method::GET || method == Method::HEAD;
    if path == "/v1/jobs" {
        return Some(if reads {
            Need::InNamespace(Capabilities::LIST_JOBS)
        } else {
            Need::InBody(Capabilities::SUBMIT_JOB)
        });
    }
    let (_, suffix) = crate::api::jobs::split_job_path(path.strip_prefix("/v1/job/")?);
    let capability = match (suffix, reads) {
        ("" | "/plan", false) if method != Method::DELETE => return Some(Need::InBody(Capabilities::SUBMIT_JOB)),
        ("/scale", true) => Capabilities::READ_JOB_SCALING,
        ("/scale", false) => Capabilities::SCALE_JOB,
        ("/dispatch", _) => Capabilities::DISPATCH_JOB,
        (_, true) => Capabilities::READ_JOB,
        (_, false) => Capabilities::SUBMIT_JOB,
    };
    Some(Need::InNamespace(capability))
}

/// Allocations, evaluations and deployments by id: a capability in the
/// object's namespace.
fn object_need(path: &str) -> Option<Need> {
    let id = |rest: &str| rest.split('/').next().unwrap_or_default().to_string();
    if let Some(rest) = path.strip_prefix("/v1/allocation/") {
        let capability = if rest.ends_with("/stop") { Capabilities::ALLOC_LIFECYCLE } else { Capabilities::READ_JOB };
        return Some(Need::OnObject(capability, Object::Alloc(id(rest))));
    }
    if let Some(rest) = path.strip_prefix("/v1/evaluation/") {
        return Some(Need::OnObject(Capabilities::READ_JOB, Object::Eval(id(rest))));
    }
    let rest = path.strip_prefix("/v1/deployment/")?;
    let (operation, id) = rest.split_once('/').unwrap_or(("", rest));
    let capability = match operation {
        "" | "allocations" => Capabilities::READ_JOB,
        _ => Capabilities::SUBMIT_JOB,
    };
    Some(Need::OnObject(capability, Object::Deployment(id.to_string())))
}

/// The client operations, whatever the method (Nomad's capabilities).
fn client_need(path: &str) -> Option<Need> {
    let on_alloc = |capability, id: &str| {
        let id = id.split('/').next().unwrap_or_default().to_string();
        Some(Need::OnObject(capability, Object::Alloc(id)))
    };
    if let Some(rest) = path.strip_prefix("/v1/client/fs/") {
        let (operation, alloc) = rest.split_once('/').unwrap_or((rest, ""));
        let capability = if operation == "logs" { Capabilities::READ_LOGS } else { Capabilities::READ_FS };
        return on_alloc(capability, alloc);
    }
    if let Some(rest) = path.strip_prefix("/v1/client/allocation/") {
        let capability = match rest.rsplit_once('/').map(|(_, operation)| operation) {
            Some("stats" | "checks") => Capabilities::READ_JOB,
            Some("exec") => Capabilities::ALLOC_EXEC,
            Some("gc") => Capabilities::SUBMIT_JOB,
            _ => Capabilities::ALLOC_LIFECYCLE,
        };
        return on_alloc(capability, rest);
    }
    match path {
        "/v1/client/stats" => Some(Need::Level(Area::Node, AclLevel::Read)),
        "/v1/client/gc" => Some(Need::Level(Area::Node, AclLevel::Write)),
        _ if path.starts_with("/v1/client/") => Some(Need::Management),
        _ => None,
    }
}

/// Who a request is: its token (none: anonymous).
#[derive(Clone, Debug)]
pub struct Caller(pub Option<AclToken>);

/// What the caller's token grants, for a handler's own checks: a job's
/// namespace from its body, or what a `*` list may show.
#[derive(Clone, Debug)]
pub struct Access(Option<Arc<AclRules>>);

impl Access {
    /// Everything: ACLs are off, or a management token.
    pub fn everything() -> Access {
        Access(None)
    }

    /// What `token` (none: anonymous) is granted under `acl`.
    pub fn of(acl: &AclState, token: Option<&AclToken>) -> Access {
        match token {
            Some(token) if token.token_type == AclTokenType::Management => Access::everything(),
            Some(token) => Access(Some(Arc::new(acl.rules_of(token)))),
            None => Access(Some(Arc::new(
                acl.policies.get("anonymous").map(|policy| policy.rules.clone()).unwrap_or_default(),
            ))),
        }
    }

    /// Whether it grants `capability` in `namespace`.
    pub fn may(&self, namespace: &str, capability: Capabilities) -> bool {
        self.0.as_ref().is_none_or(|rules| rules.in_namespace(namespace).allows(capability))
    }

    /// [`Access::may`], or 403.
    pub fn check(&self, namespace: &str, capability: Capabilities) -> Result<(), ApiError> {
        if self.may(namespace, capability) {
            Ok(())
        } else {
            Err(ApiError::Forbidden)
        }
    }

    /// Whether it grants anything in `namespace` (Nomad's `AllowNamespace`).
    pub fn any_in(&self, namespace: &str) -> bool {
        self.0.as_ref().is_none_or(|rules| rules.in_namespace(namespace).any())
    }

    /// Whether it grants `level` on `area`.
    pub fn level(&self, area: Area, level: AclLevel) -> bool {
        self.0.as_ref().is_none_or(|rules| {
            match area {
                Area::Node => rules.node,
                Area::Agent => rules.agent,
                Area::Operator => rules.operator,
            }
            .allows(level)
        })
    }

    /// Whether it is everything.
    pub fn is_everything(&self) -> bool {
        self.0.is_none()
    }

    /// What a list of objects needing `capability` shows for a request
    /// naming `namespace` (`*`: every namespace).
    pub fn scope(&self, namespace: &str, capability: Capabilities) -> Scope {
        Scope { namespace: namespace.to_string(), capability, access: self.clone() }
    }
}

/// What a list shows: objects of the namespace it names (`*`: all) that
/// the caller's token grants its capability in.
#[derive(Clone, Debug)]
pub struct Scope {
    namespace: String,
    capability: Capabilities,
    access: Access,
}

impl Scope {
    /// Whether an object in `namespace` is shown.
    pub fn admits(&self, namespace: &str) -> bool {
        (self.namespace == "*" || self.namespace == namespace) && self.access.may(namespace, self.capability)
    }
}

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denied {
    /// The secret names no token (Nomad's "ACL token not found").
    TokenNotFound,
    /// The token (or the anonymous policy) does not grant what is needed.
    PermissionDenied,
}

impl Denied {
    /// Nomad's answer body.
    pub fn message(self) -> &'static str {
        match self {
            Denied::TokenNotFound => "ACL token not found",
            Denied::PermissionDenied => "Permission denied",
        }
    }
}

/// Refused requests are logged at most this often (unauthenticated
/// traffic can cause them at will).
static REFUSED: RateLimited = RateLimited::new(std::time::Duration::from_secs(10));

/// The token `secret` names (none: anonymous), or why not.
fn token_of(acl: &AclState, secret: Option<&str>, needed: &Need) -> Result<Option<AclToken>, Denied> {
    let Some(secret) = secret else { return Ok(None) };
    match uuid::Uuid::parse_str(secret).ok().and_then(|secret| acl.token_by_secret(&secret)) {
        Some(token) => Ok(Some(token.clone())),
        None if *needed == Need::Nothing => Ok(None),
        None => Err(Denied::TokenNotFound),
    }
}

/// Whether `access` (of `token`, none: anonymous) gets `needed`, for a
/// request naming `namespace` on `snapshot`.
pub(crate) fn allowed(
    access: &Access,
    token: Option<&AclToken>,
    needed: &Need,
    namespace: &str,
    snapshot: &Snapshot,
) -> bool {
    match needed {
        Need::Nothing | Need::PerTopic | Need::InBody(_) | Need::Filtered => true,
        Need::AnyToken => token.is_some(),
        Need::Management => access.is_everything(),
        Need::Level(area, level) => access.level(*area, *level),
        Need::InNamespace(_) if namespace == "*" => true,
        Need::InNamespace(capability) => access.may(namespace, *capability),
        Need::OnObject(capability, object) => match object_namespace(snapshot, object) {
            Some(namespace) => access.may(&namespace, *capability),
            // As Nomad: checked in the request's namespace, then not found.
            None => namespace == "*" || access.may(namespace, *capability),
        },
    }
}

/// The namespace of `object`, if it exists.
fn object_namespace(snapshot: &Snapshot, object: &Object) -> Option<String> {
    let uuid = |text: &str| uuid::Uuid::parse_str(text).ok();
    match object {
        Object::Alloc(id) => snapshot.alloc(AllocId(uuid(id)?)).map(|alloc| alloc.namespace.to_string()),
        Object::Eval(id) => snapshot.eval(EvalId(uuid(id)?)).map(|eval| eval.namespace.to_string()),
        Object::Deployment(id) => {
            snapshot.deployment(DeploymentId(uuid(id)?)).map(|deployment| deployment.namespace.to_string())
        }
    }
}

/// The namespace a request names: `?namespace=`, `default` when absent.
fn request_namespace(request: &Request) -> String {
    super::query::named_namespace(request.uri()).unwrap_or_else(|| DEFAULT_NAMESPACE.to_string())
}

/// The ACL check (module docs); with ACLs off, every request gets
/// [`Access::everything`].
pub async fn authorize(State(state): State<ApiState>, mut request: Request, next: Next) -> Response {
    if !state.acl_enabled {
        request.extensions_mut().insert(Access::everything());
        return next.run(request).await;
    }
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let needed = need(&method, &path);
    let snapshot = state.leadership.store().snapshot();
    let acl = snapshot.acl();
    let denied = match token_of(acl, crate::api::secret_of(request.headers()).as_deref(), &needed) {
        Ok(token) => {
            let access = Access::of(acl, token.as_ref());
            if allowed(&access, token.as_ref(), &needed, &request_namespace(&request), &snapshot) {
                request.extensions_mut().insert(Caller(token));
                request.extensions_mut().insert(access);
                return next.run(request).await;
            }
            let accessor = token.map_or_else(|| "anonymous".to_string(), |token| token.accessor_id.to_string());
            (Denied::PermissionDenied, accessor)
        }
        Err(denied) => (denied, "unknown".to_string()),
    };
    let (denied, accessor) = denied;
    if let Some(held_back) = REFUSED.admit() {
        tracing::warn!(%method, %path, %accessor, need = ?needed, held_back, "request refused: {}", denied.message());
    }
    match denied {
        Denied::TokenNotFound => (axum::http::StatusCode::FORBIDDEN, Denied::TokenNotFound.message()).into_response(),
        Denied::PermissionDenied => ApiError::Forbidden.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_namespace(capability: Capabilities) -> Need {
        Need::InNamespace(capability)
    }

    #[test]
    fn each_path_needs_what_the_module_docs_say() {
        assert_eq!(need(&Method::GET, "/v1/jobs"), in_namespace(Capabilities::LIST_JOBS));
        assert_eq!(need(&Method::PUT, "/v1/jobs"), Need::InBody(Capabilities::SUBMIT_JOB));
        assert_eq!(need(&Method::POST, "/v1/job/web"), Need::InBody(Capabilities::SUBMIT_JOB));
        assert_eq!(need(&Method::POST, "/v1/job/web/plan"), Need::InBody(Capabilities::SUBMIT_JOB));
        assert_eq!(need(&Method::DELETE, "/v1/job/web"), in_namespace(Capabilities::SUBMIT_JOB));
        assert_eq!(need(&Method::GET, "/v1/job/web"), in_namespace(Capabilities::READ_JOB));
        assert_eq!(need(&Method::GET, "/v1/job/web/versions"), in_namespace(Capabilities::READ_JOB));
        assert_eq!(need(&Method::POST, "/v1/job/web/revert"), in_namespace(Capabilities::SUBMIT_JOB));
        assert_eq!(need(&Method::PUT, "/v1/job/web/stable"), in_namespace(Capabilities::SUBMIT_JOB));
        assert_eq!(need(&Method::PUT, "/v1/job/web/dispatch"), in_namespace(Capabilities::DISPATCH_JOB));
        assert_eq!(need(&Method::GET, "/v1/job/web/scale"), in_namespace(Capabilities::READ_JOB_SCALING));
        assert_eq!(need(&Method::POST, "/v1/job/web/scale"), in_namespace(Capabilities::SCALE_JOB));
        assert_eq!(need(&Method::POST, "/v1/job/web/periodic/force"), in_namespace(Capabilities::SUBMIT_JOB));
        assert_eq!(need(&Method::POST, "/v1/search"), Need::InBody(Capabilities::LIST_JOBS));
        assert_eq!(need(&Method::PUT, "/v1/jobs/parse"), in_namespace(Capabilities::PARSE_JOB));
        assert_eq!(need(&Method::PUT, "/v1/validate/job"), Need::InBody(Capabilities::READ_JOB));
        assert_eq!(need(&Method::GET, "/v1/node/abc"), Need::Level(Area::Node, AclLevel::Read));
        assert_eq!(need(&Method::PUT, "/v1/agent/schedulers/config"), Need::Level(Area::Agent, AclLevel::Write));
        assert_eq!(need(&Method::GET, "/v1/operator/raft/info"), Need::Level(Area::Operator, AclLevel::Read));
        assert_eq!(need(&Method::GET, "/v1/operator/snapshot"), Need::Management);
        assert_eq!(need(&Method::GET, "/v1/acl/tokens"), Need::Management);
        assert_eq!(need(&Method::PUT, "/v1/system/gc"), Need::Management);
        assert_eq!(need(&Method::DELETE, "/v1/evaluations"), Need::Management);
        assert_eq!(need(&Method::GET, "/v1/evaluations"), in_namespace(Capabilities::READ_JOB));
        assert_eq!(need(&Method::PUT, "/v1/node/abc/purge"), Need::Level(Area::Node, AclLevel::Write));
        assert_eq!(need(&Method::GET, "/v1/acl/token/self"), Need::AnyToken);
        assert_eq!(need(&Method::POST, "/v1/acl/bootstrap"), Need::Nothing);
        assert_eq!(need(&Method::GET, "/v1/status/leader"), Need::Nothing);
        assert_eq!(need(&Method::GET, "/v1/metrics"), Need::Nothing);
        assert_eq!(need(&Method::GET, "/v1/namespaces"), Need::Filtered);
        assert_eq!(need(&Method::GET, "/v1/namespace/web"), Need::Filtered);
        assert_eq!(need(&Method::PUT, "/v1/namespace/web"), Need::Management);
        assert_eq!(need(&Method::DELETE, "/v1/namespace/web"), Need::Management);
        assert_eq!(need(&Method::GET, "/v1/services"), in_namespace(Capabilities::READ_JOB));
        assert_eq!(need(&Method::DELETE, "/v1/service/web/id"), in_namespace(Capabilities::SUBMIT_JOB));
        assert_eq!(need(&Method::GET, "/v1/volumes"), Need::Management, "a path not named needs management");
    }

    #[test]
    fn objects_by_id_are_checked_in_their_namespace() {
        let on = |capability, object| Need::OnObject(capability, object);
        let alloc = || Object::Alloc("a".to_string());
        assert_eq!(need(&Method::GET, "/v1/allocation/a"), on(Capabilities::READ_JOB, alloc()));
        assert_eq!(need(&Method::GET, "/v1/allocation/a/checks"), on(Capabilities::READ_JOB, alloc()));
        assert_eq!(need(&Method::POST, "/v1/allocation/a/stop"), on(Capabilities::ALLOC_LIFECYCLE, alloc()));
        assert_eq!(need(&Method::GET, "/v1/client/fs/logs/a"), on(Capabilities::READ_LOGS, alloc()));
        assert_eq!(need(&Method::GET, "/v1/client/fs/cat/a"), on(Capabilities::READ_FS, alloc()));
        assert_eq!(need(&Method::GET, "/v1/client/fs/stream/a"), on(Capabilities::READ_FS, alloc()));
        assert_eq!(need(&Method::POST, "/v1/client/allocation/a/restart"), on(Capabilities::ALLOC_LIFECYCLE, alloc()));
        assert_eq!(need(&Method::POST, "/v1/client/allocation/a/signal"), on(Capabilities::ALLOC_LIFECYCLE, alloc()));
        assert_eq!(need(&Method::GET, "/v1/client/allocation/a/gc"), on(Capabilities::SUBMIT_JOB, alloc()));
        assert_eq!(need(&Method::GET, "/v1/client/allocation/a/stats"), on(Capabilities::READ_JOB, alloc()));
        assert_eq!(need(&Method::GET, "/v1/client/stats"), Need::Level(Area::Node, AclLevel::Read));
        assert_eq!(need(&Method::GET, "/v1/client/gc"), Need::Level(Area::Node, AclLevel::Write));
        let eval = Object::Eval("e".to_string());
        assert_eq!(need(&Method::GET, "/v1/evaluation/e/allocations"), on(Capabilities::READ_JOB, eval));
        let deployment = || Object::Deployment("d".to_string());
        assert_eq!(need(&Method::GET, "/v1/deployment/d"), on(Capabilities::READ_JOB, deployment()));
        assert_eq!(need(&Method::GET, "/v1/deployment/allocations/d"), on(Capabilities::READ_JOB, deployment()));
        assert_eq!(need(&Method::POST, "/v1/deployment/promote/d"), on(Capabilities::SUBMIT_JOB, deployment()));
    }
}
