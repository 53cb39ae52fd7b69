//! Nomad's `/v1/acl/` endpoints (bootstrap, policies, tokens) and the
//! policies' rules. The check in front of every endpoint is `access.rs`.
//!
//! Policies are Nomad's HCL rules, for the areas Drover has:
//! `namespace "<name or glob>" { policy = "..." capabilities = [...] }`
//! (`policy`: `deny`, `read`, `write` or `scale`; capabilities by Nomad's
//! names, `submit-job`, `read-logs`, ...; the two together grant both),
//! `node { policy = ... }`, `agent { ... }`, `operator { ... }`, each
//! `deny`, `read` or `write`. Anything else (`quota`, `host_volume`,
//! `plugin`, `variables` blocks, an unknown capability) is refused with
//! what it was, never silently ignored. The rules are read when the policy
//! is written; the state keeps both the text and what it grants.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::Router;
use engine::acl_endpoint::{AclEndpoint, AclError, TokenChange};
use engine::structs::{namespace_name_problem, AclLevel, AclPolicy, AclRules, AclToken, AclTokenType, Capabilities};
use serde_json::Value;

use super::access::Caller;
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
        match block.identifier.as_str() {
            "namespace" => {
                let (pattern, capabilities) = namespace_rule(block)?;
                let merged = rules.namespaces.get(&pattern).map_or(capabilities, |had| had.combine(capabilities));
                rules.namespaces.insert(pattern, merged);
            }
            "node" => rules.node = rules.node.combine(area_level(block)?),
            "agent" => rules.agent = rules.agent.combine(area_level(block)?),
            "operator" => rules.operator = rules.operator.combine(area_level(block)?),
            other => {
                return Err(RulesError(format!(
                    "block {other:?} is not supported by Drover (namespace, node, agent, operator)"
                )))
            }
        }
    }
    Ok(rules)
}

/// A `namespace "<name or glob>" { policy, capabilities }` block.
fn namespace_rule(block: &hcl::Block) -> Result<(String, Capabilities), RulesError> {
    let pattern = match block.labels.as_slice() {
        [label] => label.as_str().to_string(),
        _ => return Err(RulesError("a namespace block needs one name: namespace \"default\" { ... }".to_string())),
    };
    let literal = pattern.replace('*', "");
    if !literal.is_empty() {
        if let Some(problem) = namespace_name_problem(&literal) {
            return Err(RulesError(format!("namespace {pattern:?}: {problem} (besides '*')")));
        }
    }
    if let Some(inner) = block.body.blocks().next() {
        return Err(RulesError(format!(
            "namespace {pattern:?}: block {:?} is not supported by Drover (it has no variables or volumes)",
            inner.identifier.as_str()
        )));
    }
    let mut granted = None;
    for attribute in block.body.attributes() {
        let capabilities = match (attribute.key.as_str(), &attribute.expr) {
            ("policy", hcl::Expression::String(policy)) => Capabilities::of_policy(policy).ok_or_else(|| {
                RulesError(format!("namespace {pattern:?}: policy {policy:?} is not deny, read, write or scale"))
            })?,
            ("capabilities", hcl::Expression::Array(names)) => {
                names.iter().try_fold(Capabilities::NONE, |all, name| match name {
                    hcl::Expression::String(name) => Capabilities::named(name)
                        .map(|one| all.combine(one))
                        .ok_or_else(|| RulesError(format!("namespace {pattern:?}: unknown capability {name:?}"))),
                    other => Err(RulesError(format!("namespace {pattern:?}: capability {other} is not a string"))),
                })?
            }
            (key, _) => return Err(RulesError(format!("namespace {pattern:?}: unexpected attribute {key:?}"))),
        };
        granted = Some(granted.map_or(capabilities, |had: Capabilities| had.combine(capabilities)));
    }
    let granted =
        granted.ok_or_else(|| RulesError(format!("namespace {pattern:?}: needs a policy or a capabilities list")))?;
    Ok((pattern, granted))
}

/// The `policy` of a `node`, `agent` or `operator` block.
fn area_level(block: &hcl::Block) -> Result<AclLevel, RulesError> {
    let area = block.identifier.as_str();
    let mut level = None;
    for attribute in block.body.attributes() {
        match (attribute.key.as_str(), &attribute.expr) {
            ("policy", hcl::Expression::String(text)) => {
                level = Some(match text.as_str() {
                    "deny" => AclLevel::Deny,
                    "read" => AclLevel::Read,
                    "write" => AclLevel::Write,
                    other => return Err(RulesError(format!("{area}: policy {other:?} is not deny, read or write"))),
                });
            }
            (key, _) => return Err(RulesError(format!("{area}: unexpected attribute {key:?}"))),
        }
    }
    level.ok_or_else(|| RulesError(format!("{area}: needs policy = \"deny\", \"read\" or \"write\"")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_read_nomads_policy_blocks() {
        let rules = parse_rules(
            "namespace \"default\" {\n  policy = \"write\"\n}\nnode {\n  policy = \"read\"\n}\nagent { policy = \"deny\" }",
        )
        .expect("valid");
        assert!(rules.in_namespace("default").allows(Capabilities::SUBMIT_JOB));
        assert_eq!(rules.node, AclLevel::Read);
        assert_eq!(rules.agent, AclLevel::Deny);
        assert_eq!(rules.operator, AclLevel::None);
        assert!(!rules.in_namespace("prod").any(), "a rule for default grants nothing in prod");
    }

    #[test]
    fn namespace_rules_take_globs_and_capabilities_lists() {
        let rules = parse_rules(
            r#"
            namespace "team-*" { policy = "read" }
            namespace "team-a" {
              policy       = "read"
              capabilities = ["submit-job", "alloc-lifecycle"]
            }
            namespace "ops" { capabilities = ["read-logs"] }
            namespace "secret" { policy = "deny" }
            namespace "secret" { capabilities = ["read-job"] }
            "#,
        )
        .expect("valid");
        let team_a = rules.in_namespace("team-a");
        assert!(team_a.allows(Capabilities::SUBMIT_JOB | Capabilities::ALLOC_LIFECYCLE | Capabilities::READ_JOB));
        assert!(!team_a.allows(Capabilities::READ_LOGS));
        assert!(rules.in_namespace("team-b").allows(Capabilities::LIST_JOBS));
        assert!(!rules.in_namespace("team-b").allows(Capabilities::SUBMIT_JOB));
        let ops = rules.in_namespace("ops");
        assert!(ops.allows(Capabilities::READ_LOGS) && !ops.allows(Capabilities::READ_JOB));
        assert!(!rules.in_namespace("secret").any(), "deny in one block of a name wins over the other");
        assert!(!rules.in_namespace("default").any());
    }

    #[test]
    fn rules_refuse_what_drover_lacks_or_does_not_know() {
        let refused = |text: &str, word: &str| {
            let error = parse_rules(text).expect_err(text).to_string();
            assert!(error.contains(word), "{text}: {error}");
        };
        refused("namespace \"default\" { capabilities = [\"submit-jobs\"] }", "submit-jobs");
        refused("namespace \"default\" { policy = \"list\" }", "list");
        refused("namespace \"a/b\" { policy = \"read\" }", "a/b");
        refused("namespace { policy = \"read\" }", "one name");
        refused("namespace \"x\" { }", "needs a policy");
        refused("namespace \"x\" { variables { path \"*\" { capabilities = [\"read\"] } } }", "variables");
        refused("quota { policy = \"read\" }", "quota");
        refused("node { policy = \"scale\" }", "scale");
        refused("node { capabilities = [\"read\"] }", "capabilities");
        assert!(parse_rules("node {").is_err());
    }
}
