//! ACL: the check in front of every endpoint, and Nomad's `/v1/acl/`
//! endpoints (bootstrap, policies, tokens).
//!
//! With `acl.enabled`, a request carries its token's secret in
//! `X-Nomad-Token` (or `Authorization: Bearer`). What each path needs:
//! 1. nothing: `/v1/acl/bootstrap` (done once), `/v1/agent/health`,
//!    `/v1/status/*`, `/v1/regions`, `/v1/metrics` (load balancers and
//!    scrapers carry no token, as with Nomad);
//! 2. a management token: the rest of `/v1/acl/`, `/v1/operator/snapshot`,
//!    `/v1/system/*` (forced garbage collection) and `DELETE
//!    /v1/evaluations` (Nomad's eval delete);
//! 3. otherwise a level on one area ([`AclRules`]): `read` for GET (and
//!    `/v1/search`, `/v1/jobs/parse`: Nomad's `parse-job`, and
//!    `/v1/validate/job`: its `read-job`), `write`
//!    for the rest; nodes need `node`, the agent and
//!    workers `agent`, `/v1/operator/*` `operator`, everything else
//!    (jobs, evaluations, allocations) `namespace "default"`;
//! 4. but for the client operations, which need Nomad's capabilities
//!    whatever the method: an allocation's logs (`read-logs`) and files
//!    (`read-fs`), its restart, signal and stop (`alloc-lifecycle`) and
//!    its garbage collection (`submit-job`) need namespace `write`, which
//!    grants them, and its stats and checks (`read-job`) namespace `read`; a node's
//!    stats need `node` `read`, its garbage collection `node` `write`.
//!
//! 5. the event stream (`/v1/event/stream`), whatever each of its topics
//!    needs, checked by its handler (`events.rs`): `Job`, `Evaluation`,
//!    `Allocation`, `Deployment` and `Service` namespace `read` (Nomad's
//!    `read-job`), `Node` node `read`, the rest (ACL topics, `*`) a
//!    management token.
//!
//! A request without a token gets the policy named `anonymous` if there
//! is one (as in Nomad), nothing otherwise. A refusal is 403 with Nomad's
//! body ("Permission denied", or "ACL token not found"), and is logged
//! with the method, path and the token's accessor id, never its secret.
//!
//! Policies are Nomad's HCL rules, for the areas Drover has:
//! `namespace "default" { policy = "read" }` (or `"*"`), `node { ... }`,
//! `agent { ... }`, `operator { ... }`, each `deny`, `read` or `write`.
//! Anything else (capabilities lists, other blocks) is refused with what
//! it was, never silently ignored. The rules are read when the policy is
//! written; the state keeps both the text and what it grants.

use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use engine::acl_endpoint::{AclEndpoint, AclError, TokenChange};
use engine::structs::{AclLevel, AclPolicy, AclRules, AclState, AclToken, AclTokenType};
use serde_json::Value;
use transport::log_limit::RateLimited;

use super::error::ApiError;
use super::query::{Params, Reply};
use super::ApiState;
use crate::api::acl::{AclPolicyListStub, AclPolicyRequest, AclTokenListStub, AclTokenRequest};

/// The routes of this file.
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/acl/bootstrap", post(bootstrap).put(bootstrap))
        .route("/v1/acl/policies", get(policies))
        .route("/v1/acl/policy/{name}", get(policy).put(put_policy).post(put_policy).delete(delete_policy))
        .route("/v1/acl/tokens", get(tokens))
        .route("/v1/acl/token", post(create_token).put(create_token))
        .route("/v1/acl/token/self", get(token_self))
        .route("/v1/acl/token/{accessor}", get(token).put(update_token).post(update_token).delete(delete_token))
}

/// An area a request needs a level on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Area {
    /// Jobs, evaluations, allocations, deployments, services.
    Namespace,
    /// Nodes.
    Node,
    /// The agent.
    Agent,
    /// The operator endpoints.
    Operator,
}

/// What a request needs (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    /// Nothing: open to all.
    Nothing,
    /// A known token, whatever it grants.
    AnyToken,
    /// A management token.
    Management,
    /// A level on an area.
    Level(Area, AclLevel),
    /// What each requested topic needs, checked by the handler
    /// (`/v1/event/stream`): here only a secret naming no token is refused.
    PerTopic,
}

fn need(method: &Method, path: &str) -> Need {
    if let Some(needed) = client_operation_need(path) {
        return needed;
    }
    let level = if method == Method::GET || method == Method::HEAD { AclLevel::Read } else { AclLevel::Write };
    let open = ["/v1/agent/health", "/v1/regions", "/v1/metrics", "/v1/acl/bootstrap"];
    if open.contains(&path) || path.starts_with("/v1/status/") {
        Need::Nothing
    } else if path == "/v1/event/stream" {
        Need::PerTopic
    } else if path == "/v1/acl/token/self" {
        Need::AnyToken
    } else if path.starts_with("/v1/acl/") || path == "/v1/operator/snapshot" || path.starts_with("/v1/system/") {
        Need::Management
    } else if path == "/v1/evaluations" && method == Method::DELETE {
        // Nomad's eval delete is an operator's tool of last resort.
        Need::Management
    } else if path.starts_with("/v1/operator/") {
        Need::Level(Area::Operator, level)
    } else if path.starts_with("/v1/agent/") {
        Need::Level(Area::Agent, level)
    } else if path == "/v1/nodes" || path.starts_with("/v1/node/") {
        Need::Level(Area::Node, level)
    } else if path == "/v1/search" || path == "/v1/jobs/parse" || path == "/v1/validate/job" {
        // Nomad's `parse-job` and `read-job`, which its `read` policy grants.
        Need::Level(Area::Namespace, AclLevel::Read)
    } else {
        Need::Level(Area::Namespace, level)
    }
}

/// What a client operation needs, whatever its method (module docs, 4).
fn client_operation_need(path: &str) -> Option<Need> {
    let namespace = |level| Some(Need::Level(Area::Namespace, level));
    if path.starts_with("/v1/client/fs/") {
        return namespace(AclLevel::Write);
    }
    if let Some(rest) = path.strip_prefix("/v1/client/allocation/") {
        return match rest.rsplit_once('/').map(|(_, operation)| operation) {
            Some("stats" | "checks") => namespace(AclLevel::Read),
            _ => namespace(AclLevel::Write),
        };
    }
    match path {
        "/v1/client/stats" => Some(Need::Level(Area::Node, AclLevel::Read)),
        "/v1/client/gc" => Some(Need::Level(Area::Node, AclLevel::Write)),
        _ if path.starts_with("/v1/client/") => namespace(AclLevel::Write),
        _ if path.starts_with("/v1/allocation/") && path.ends_with("/stop") => namespace(AclLevel::Write),
        _ => None,
    }
}

/// Who a request is: its token (none: anonymous).
#[derive(Clone, Debug)]
pub struct Caller(pub Option<AclToken>);

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

/// Decides whether `secret` (none: anonymous) gets `needed` under `acl`:
/// the caller's token (none for anonymous), or why not with who asked.
fn decide(acl: &AclState, secret: Option<&str>, needed: Need) -> Result<Option<AclToken>, (Denied, String)> {
    let token = match secret {
        None => None,
        Some(secret) => match uuid::Uuid::parse_str(secret).ok().and_then(|secret| acl.token_by_secret(&secret)) {
            Some(token) => Some(token.clone()),
            None if needed == Need::Nothing => None,
            None => return Err((Denied::TokenNotFound, "unknown".to_string())),
        },
    };
    if allowed(acl, token.as_ref(), needed) {
        Ok(token)
    } else {
        let accessor = token.as_ref().map_or_else(|| "anonymous".to_string(), |token| token.accessor_id.to_string());
        Err((Denied::PermissionDenied, accessor))
    }
}

/// Whether `token` (none: anonymous) gets `needed` under `acl`.
pub(crate) fn allowed(acl: &AclState, token: Option<&AclToken>, needed: Need) -> bool {
    match (token, needed) {
        (_, Need::Nothing | Need::PerTopic) => true,
        (Some(token), _) if token.token_type == AclTokenType::Management => true,
        (None, Need::AnyToken | Need::Management) | (Some(_), Need::Management) => false,
        (Some(_), Need::AnyToken) => true,
        (token, Need::Level(area, level)) => {
            let rules = match token {
                Some(token) => acl.rules_of(token),
                None => acl.policies.get("anonymous").map(|policy| policy.rules).unwrap_or_default(),
            };
            let granted = match area {
                Area::Namespace => rules.namespace,
                Area::Node => rules.node,
                Area::Agent => rules.agent,
                Area::Operator => rules.operator,
            };
            granted.allows(level)
        }
    }
}

/// The ACL check (module docs); a no-op when ACLs are off.
pub async fn authorize(State(state): State<ApiState>, mut request: Request, next: Next) -> Response {
    if !state.acl_enabled {
        return next.run(request).await;
    }
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let needed = need(&method, &path);
    let snapshot = state.leadership.store().snapshot();
    match decide(snapshot.acl(), crate::api::secret_of(request.headers()).as_deref(), needed) {
        Ok(token) => {
            request.extensions_mut().insert(Caller(token));
            next.run(request).await
        }
        Err((denied, accessor)) => {
            if let Some(held_back) = REFUSED.admit() {
                tracing::warn!(%method, %path, %accessor, need = ?needed, held_back, "request refused: {}", denied.message());
            }
            match denied {
                Denied::TokenNotFound => {
                    (axum::http::StatusCode::FORBIDDEN, Denied::TokenNotFound.message()).into_response()
                }
                Denied::PermissionDenied => ApiError::Forbidden.into_response(),
            }
        }
    }
}

/// Runs `call` on the leader's ACL endpoint, on the blocking pool.
async fn on_acl<T: Send + 'static>(
    state: &ApiState,
    call: impl FnOnce(AclEndpoint) -> Result<T, AclError> + Send + 'static,
) -> Result<T, ApiError> {
    let acl = state.leader()?.acl();
    let answer = tokio::task::spawn_blocking(move || call(acl))
        .await
        .map_err(|error| ApiError::Internal(format!("engine call failed: {error}")))?;
    answer.map_err(ApiError::from)
}

/// A token as Nomad answers it, with its secret.
fn token_json(token: &AclToken) -> crate::api::acl::AclToken {
    crate::api::acl::AclToken::from(token)
}

/// Every ACL endpoint answers 400 while ACLs are off, as Nomad's do.
fn enabled(state: &ApiState) -> Result<(), ApiError> {
    if state.acl_enabled {
        Ok(())
    } else {
        Err(ApiError::BadRequest("ACL support disabled".into()))
    }
}

/// `POST /v1/acl/bootstrap`: the management token, once; again only with
/// Nomad's reset: the reset index a refused bootstrap named, written to
/// `<data_dir>/server/acl-bootstrap-reset` on the server that answers.
async fn bootstrap(State(state): State<ApiState>) -> Result<Reply, ApiError> {
    enabled(&state)?;
    let reset_index = reset_index(&state)?;
    let (token, index) = on_acl(&state, move |acl| acl.bootstrap(reset_index)).await?;
    tracing::info!(accessor = %token.accessor_id, "ACL bootstrapped: a management token was made");
    Ok(Reply::json(&token_json(&token), false, Some(index)))
}

/// The reset index in the bootstrap reset file, if the server has one.
fn reset_index(state: &ApiState) -> Result<Option<u64>, ApiError> {
    let Some(path) = &state.acl_bootstrap_reset else { return Ok(None) };
    match std::fs::read_to_string(path) {
        Ok(text) => {
            text.trim().parse().map(Some).map_err(|_| {
                ApiError::BadRequest(format!("{}: {:?} is not a reset index", path.display(), text.trim()))
            })
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(ApiError::Internal(format!("reading {}: {error}", path.display()))),
    }
}

/// `GET /v1/acl/policies`.
async fn policies(State(state): State<ApiState>, params: Params) -> Result<Reply, ApiError> {
    enabled(&state)?;
    let snapshot = state.leadership.store().snapshot();
    let list: Vec<AclPolicyListStub> = snapshot.acl().policies.values().map(AclPolicyListStub::from).collect();
    Ok(Reply::json(&list, params.pretty(), Some(snapshot.index())))
}

/// `GET /v1/acl/policy/:name`.
async fn policy(State(state): State<ApiState>, Path(name): Path<String>, params: Params) -> Result<Reply, ApiError> {
    enabled(&state)?;
    let snapshot = state.leadership.store().snapshot();
    let policy = snapshot.acl().policies.get(&name).ok_or_else(|| ApiError::NotFound("ACL policy not found".into()))?;
    Ok(Reply::json(&crate::api::acl::AclPolicy::from(policy), params.pretty(), Some(snapshot.index())))
}

/// `PUT /v1/acl/policy/:name`: creates or replaces it.
async fn put_policy(State(state): State<ApiState>, Path(name): Path<String>, body: Bytes) -> Result<Reply, ApiError> {
    enabled(&state)?;
    let body: AclPolicyRequest =
        serde_json::from_slice(&body).map_err(|error| ApiError::BadRequest(error.to_string()))?;
    if body.name.as_deref().is_some_and(|named| named != name) {
        return Err(ApiError::BadRequest(format!("policy name {:?} does not match the path's {name:?}", body.name)));
    }
    let rules_text = body.rules.unwrap_or_default();
    let rules = parse_rules(&rules_text).map_err(|error| ApiError::BadRequest(error.to_string()))?;
    let policy = AclPolicy {
        name,
        description: body.description.unwrap_or_default(),
        rules_text,
        rules,
        create_index: 0,
        modify_index: 0,
    };
    let index = on_acl(&state, move |acl| acl.upsert_policy(policy)).await?;
    Ok(Reply::json(&Value::Null, false, Some(index)))
}

/// `DELETE /v1/acl/policy/:name`.
async fn delete_policy(State(state): State<ApiState>, Path(name): Path<String>) -> Result<Reply, ApiError> {
    enabled(&state)?;
    let index = on_acl(&state, move |acl| acl.delete_policy(name)).await?;
    Ok(Reply::json(&Value::Null, false, Some(index)))
}

/// `GET /v1/acl/tokens`: without their secrets.
async fn tokens(State(state): State<ApiState>, params: Params) -> Result<Reply, ApiError> {
    enabled(&state)?;
    let snapshot = state.leadership.store().snapshot();
    let list: Vec<AclTokenListStub> = snapshot.acl().tokens.values().map(AclTokenListStub::from).collect();
    Ok(Reply::json(&list, params.pretty(), Some(snapshot.index())))
}

fn token_type(text: Option<&str>) -> Result<AclTokenType, ApiError> {
    match text.unwrap_or("client") {
        "client" => Ok(AclTokenType::Client),
        "management" => Ok(AclTokenType::Management),
        other => Err(ApiError::BadRequest(format!("token type {other:?} is not client or management"))),
    }
}

/// `POST /v1/acl/token`: a new token, answered with its secret.
async fn create_token(State(state): State<ApiState>, body: Bytes) -> Result<Reply, ApiError> {
    enabled(&state)?;
    let body: AclTokenRequest =
        serde_json::from_slice(&body).map_err(|error| ApiError::BadRequest(error.to_string()))?;
    let kind = token_type(body.token_type.as_deref())?;
    let (name, policies) = (body.name.unwrap_or_default(), body.policies.unwrap_or_default());
    let (token, index) = on_acl(&state, move |acl| acl.create_token(name, kind, policies)).await?;
    Ok(Reply::json(&token_json(&token), false, Some(index)))
}

fn accessor(text: &str) -> Result<uuid::Uuid, ApiError> {
    uuid::Uuid::parse_str(text).map_err(|_| ApiError::BadRequest(format!("{text:?} is not a token accessor id")))
}

/// `GET /v1/acl/token/:accessor` (management tokens only: with its secret).
async fn token(State(state): State<ApiState>, Path(id): Path<String>, params: Params) -> Result<Reply, ApiError> {
    enabled(&state)?;
    let id = accessor(&id)?;
    let snapshot = state.leadership.store().snapshot();
    let token = snapshot.acl().tokens.get(&id).ok_or_else(|| ApiError::NotFound("ACL token not found".into()))?;
    Ok(Reply::json(&token_json(token), params.pretty(), Some(snapshot.index())))
}

/// `GET /v1/acl/token/self`: the caller's own token.
async fn token_self(
    State(state): State<ApiState>,
    caller: Option<axum::Extension<Caller>>,
    params: Params,
) -> Result<Reply, ApiError> {
    enabled(&state)?;
    let token = caller.and_then(|axum::Extension(Caller(token))| token).ok_or(ApiError::Forbidden)?;
    Ok(Reply::json(&token_json(&token), params.pretty(), Some(state.leadership.store().latest_index())))
}

/// `POST /v1/acl/token/:accessor`: changes its name, type or policies.
async fn update_token(State(state): State<ApiState>, Path(id): Path<String>, body: Bytes) -> Result<Reply, ApiError> {
    enabled(&state)?;
    let id = accessor(&id)?;
    let body: AclTokenRequest =
        serde_json::from_slice(&body).map_err(|error| ApiError::BadRequest(error.to_string()))?;
    let token_type = body.token_type.as_deref().map(|text| token_type(Some(text))).transpose()?;
    let change = TokenChange { name: body.name, token_type, policies: body.policies };
    let (token, index) = on_acl(&state, move |acl| acl.update_token(id, change)).await?;
    Ok(Reply::json(&token_json(&token), false, Some(index)))
}

/// `DELETE /v1/acl/token/:accessor`: revokes it.
async fn delete_token(State(state): State<ApiState>, Path(id): Path<String>) -> Result<Reply, ApiError> {
    enabled(&state)?;
    let id = accessor(&id)?;
    let index = on_acl(&state, move |acl| acl.delete_token(id)).await?;
    tracing::info!(accessor = %id, "ACL token revoked");
    Ok(Reply::json(&Value::Null, false, Some(index)))
}

/// Why a policy's rules were refused, said for the person who wrote them.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RulesError(String);

/// Reads a policy's HCL rules (module docs).
pub fn parse_rules(text: &str) -> Result<AclRules, RulesError> {
    let body: hcl::Body =
        hcl::from_str(text).map_err(|error| RulesError(format!("the policy's rules are not HCL: {error}")))?;
    let mut rules = AclRules::default();
    if let Some(attribute) = body.attributes().next() {
        return Err(RulesError(format!("unexpected attribute {:?} at the top of the rules", attribute.key.as_str())));
    }
    for block in body.blocks() {
        let area = match block.identifier.as_str() {
            "namespace" => {
                let label = block.labels.first().map(|label| label.as_str().to_string());
                match label.as_deref() {
                    Some("default" | "*") => &mut rules.namespace,
                    Some(other) => {
                        return Err(RulesError(format!(
                            "namespace {other:?}: Drover has one namespace, \"default\" (or \"*\")"
                        )))
                    }
                    None => {
                        return Err(RulesError(
                            "a namespace block needs its name: namespace \"default\" { ... }".to_string(),
                        ))
                    }
                }
            }
            "node" => &mut rules.node,
            "agent" => &mut rules.agent,
            "operator" => &mut rules.operator,
            other => {
                return Err(RulesError(format!(
                    "block {other:?} is not supported by Drover (namespace, node, agent, operator)"
                )))
            }
        };
        let mut level = None;
        for attribute in block.body.attributes() {
            match (attribute.key.as_str(), &attribute.expr) {
                ("policy", hcl::Expression::String(text)) => {
                    level = Some(match text.as_str() {
                        "deny" => AclLevel::Deny,
                        "read" => AclLevel::Read,
                        "write" => AclLevel::Write,
                        other => {
                            return Err(RulesError(format!(
                                "{}: policy {other:?} is not deny, read or write",
                                block.identifier
                            )))
                        }
                    });
                }
                ("capabilities", _) => {
                    return Err(RulesError(format!(
                        "{}: capabilities lists are not supported by Drover; use policy = \"read\" or \"write\"",
                        block.identifier
                    )))
                }
                (key, _) => return Err(RulesError(format!("{}: unexpected attribute {key:?}", block.identifier))),
            }
        }
        let level = level.ok_or_else(|| {
            RulesError(format!("{}: needs policy = \"deny\", \"read\" or \"write\"", block.identifier))
        })?;
        *area = area.combine(level);
    }
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_read_nomads_policy_blocks_and_refuse_what_drover_lacks() {
        let rules = parse_rules(
            "namespace \"default\" {\n  policy = \"write\"\n}\nnode {\n  policy = \"read\"\n}\nagent { policy = \"deny\" }",
        )
        .expect("valid");
        assert_eq!(rules.namespace, AclLevel::Write);
        assert_eq!(rules.node, AclLevel::Read);
        assert_eq!(rules.agent, AclLevel::Deny);
        assert_eq!(rules.operator, AclLevel::None);
        let refused = parse_rules("namespace \"default\" { capabilities = [\"submit-job\"] }").expect_err("refused");
        assert!(refused.to_string().contains("capabilities"), "{refused}");
        assert!(parse_rules("quota { policy = \"read\" }").expect_err("refused").to_string().contains("quota"));
        assert!(parse_rules("namespace \"prod\" { policy = \"read\" }")
            .expect_err("refused")
            .to_string()
            .contains("prod"));
        assert!(parse_rules("node { policy = \"scale\" }").expect_err("refused").to_string().contains("scale"));
        assert!(parse_rules("node {").is_err());
    }

    #[test]
    fn each_path_needs_what_the_module_docs_say() {
        assert_eq!(need(&Method::GET, "/v1/jobs"), Need::Level(Area::Namespace, AclLevel::Read));
        assert_eq!(need(&Method::PUT, "/v1/jobs"), Need::Level(Area::Namespace, AclLevel::Write));
        assert_eq!(need(&Method::DELETE, "/v1/job/web"), Need::Level(Area::Namespace, AclLevel::Write));
        // Job versions: `read-job` to list them, `submit-job` to revert or mark one.
        assert_eq!(need(&Method::GET, "/v1/job/web/versions"), Need::Level(Area::Namespace, AclLevel::Read));
        assert_eq!(need(&Method::POST, "/v1/job/web/revert"), Need::Level(Area::Namespace, AclLevel::Write));
        assert_eq!(need(&Method::PUT, "/v1/job/web/stable"), Need::Level(Area::Namespace, AclLevel::Write));
        assert_eq!(need(&Method::POST, "/v1/search"), Need::Level(Area::Namespace, AclLevel::Read));
        assert_eq!(need(&Method::PUT, "/v1/jobs/parse"), Need::Level(Area::Namespace, AclLevel::Read));
        assert_eq!(need(&Method::GET, "/v1/node/abc"), Need::Level(Area::Node, AclLevel::Read));
        assert_eq!(need(&Method::PUT, "/v1/agent/schedulers/config"), Need::Level(Area::Agent, AclLevel::Write));
        assert_eq!(need(&Method::GET, "/v1/operator/raft/info"), Need::Level(Area::Operator, AclLevel::Read));
        assert_eq!(need(&Method::GET, "/v1/operator/snapshot"), Need::Management);
        assert_eq!(need(&Method::GET, "/v1/acl/tokens"), Need::Management);
        assert_eq!(need(&Method::PUT, "/v1/system/gc"), Need::Management);
        assert_eq!(need(&Method::DELETE, "/v1/evaluations"), Need::Management);
        assert_eq!(need(&Method::GET, "/v1/evaluations"), Need::Level(Area::Namespace, AclLevel::Read));
        assert_eq!(need(&Method::PUT, "/v1/node/abc/purge"), Need::Level(Area::Node, AclLevel::Write));
        assert_eq!(need(&Method::GET, "/v1/acl/token/self"), Need::AnyToken);
        assert_eq!(need(&Method::POST, "/v1/acl/bootstrap"), Need::Nothing);
        assert_eq!(need(&Method::GET, "/v1/status/leader"), Need::Nothing);
        assert_eq!(need(&Method::GET, "/v1/metrics"), Need::Nothing);
    }

    #[test]
    fn client_operations_need_nomads_capabilities_whatever_the_method() {
        let namespace = |level| Need::Level(Area::Namespace, level);
        for path in ["/v1/client/fs/logs/a", "/v1/client/fs/cat/a", "/v1/client/fs/ls/a", "/v1/client/fs/stream/a"] {
            assert_eq!(need(&Method::GET, path), namespace(AclLevel::Write), "{path}: read-logs, read-fs");
        }
        for path in ["/v1/client/allocation/a/restart", "/v1/client/allocation/a/signal", "/v1/allocation/a/stop"] {
            assert_eq!(need(&Method::POST, path), namespace(AclLevel::Write), "{path}: alloc-lifecycle");
        }
        assert_eq!(need(&Method::GET, "/v1/client/allocation/a/gc"), namespace(AclLevel::Write), "submit-job");
        assert_eq!(need(&Method::GET, "/v1/client/allocation/a/stats"), namespace(AclLevel::Read), "read-job");
        assert_eq!(need(&Method::GET, "/v1/client/stats"), Need::Level(Area::Node, AclLevel::Read));
        assert_eq!(need(&Method::GET, "/v1/client/gc"), Need::Level(Area::Node, AclLevel::Write));
        assert_eq!(need(&Method::GET, "/v1/allocation/a"), namespace(AclLevel::Read));
    }
}
