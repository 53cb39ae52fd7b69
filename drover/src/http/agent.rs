//! The agent and status endpoints (`/v1/agent/self`, `/v1/agent/members`,
//! `/v1/agent/health`, `/v1/status/leader`, `/v1/status/peers`,
//! `/v1/regions`, `/v1/agent/servers`, `/v1/scaling/policies`: none yet),
//! the worker API (`/v1/agent/schedulers[/config]`, in
//! snake_case as Nomad has it) and `/v1/search`.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::{get, post};
use axum::Router;
use engine::structs::{AclLevel, Capabilities, JobType};
use engine::worker::{WorkerActivity, WorkerPool, WorkerStatus};

use super::access::{Access, Area};
use super::error::ApiError;
use super::query::{blocking, matches_uuid_prefix, Params, Reply};
use super::ApiState;
use crate::api::agent::{
    AgentConfig, AgentHealth, AgentHealthResponse, AgentMember, AgentPorts, AgentSchedulerWorkerConfigRequest,
    AgentSchedulerWorkerConfigResponse, AgentSchedulerWorkerInfo, AgentSchedulerWorkersInfo, AgentSelf,
    AgentServerConfig, AgentVersion, ServerMembers,
};
use crate::api::search::{SearchRequest, SearchResponse};
use crate::api::{WriteMeta, REGION};

/// The routes of this file.
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/agent/self", get(agent_self))
        .route("/v1/agent/members", get(members))
        .route("/v1/agent/health", get(health))
        .route("/v1/status/leader", get(leader))
        .route("/v1/status/peers", get(peers))
        .route("/v1/agent/servers", get(peers).put(set_servers).post(set_servers))
        .route("/v1/scaling/policies", get(scaling_policies))
        .route("/v1/regions", get(regions))
        .route("/v1/agent/schedulers", get(schedulers))
        .route(
            "/v1/agent/schedulers/config",
            get(scheduler_config).put(set_scheduler_config).post(set_scheduler_config),
        )
        .route("/v1/agent/schedulers/pause", post(pause_workers).put(pause_workers))
        .route("/v1/agent/schedulers/resume", post(resume_workers).put(resume_workers))
        .route("/v1/search", post(search).put(search))
}

/// The version every agent reports.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// String pairs, for a member's tags and the agent's stats.
fn strings<const N: usize>(pairs: [(&str, String); N]) -> BTreeMap<String, String> {
    pairs.into_iter().map(|(key, value)| (key.to_string(), value)).collect()
}

/// A member with Nomad's protocol versions.
fn nomad_member(name: String, addr: String, port: u16, status: &str, tags: BTreeMap<String, String>) -> AgentMember {
    AgentMember {
        name,
        addr,
        port,
        status: status.to_string(),
        tags,
        protocol_min: 1,
        protocol_max: 5,
        protocol_cur: 2,
        delegate_min: 2,
        delegate_max: 5,
        delegate_cur: 4,
    }
}

fn member(state: &ApiState) -> AgentMember {
    let agent = &state.agent;
    let ip = agent.rpc_addr.ip().to_string();
    let tags = strings([
        ("role", "nomad".to_string()),
        ("region", agent.region.clone()),
        ("dc", agent.datacenter.clone()),
        ("vsn", "1".to_string()),
        ("mvn", "1".to_string()),
        ("build", VERSION.to_string()),
        ("port", agent.rpc_addr.port().to_string()),
        ("bootstrap", "1".to_string()),
        ("rpc_addr", ip.clone()),
    ]);
    nomad_member(format!("{}.{}", agent.name, agent.region), ip, agent.rpc_addr.port(), "alive", tags)
}

/// `GET /v1/agent/self`: `config`, `member` and `stats` (every stats leaf a string).
async fn agent_self(State(state): State<ApiState>, params: Params) -> Reply {
    let agent = &state.agent;
    let leader = state.leadership.leader();
    let stats = leader.as_ref().map(|server| server.stats()).unwrap_or_default();
    let workers = state.leadership.with_workers(|pool| pool.workers().len()).unwrap_or(0);
    let nomad = strings([
        ("server", "true".to_string()),
        ("leader", leader.is_some().to_string()),
        ("leader_addr", leader_rpc(&state)),
        ("bootstrap", "true".to_string()),
        ("known_regions", "1".to_string()),
    ]);
    let drover = strings([
        ("version", VERSION.to_string()),
        ("index", stats.index.to_string()),
        ("broker_ready", stats.broker.total_ready.to_string()),
        ("broker_unacked", stats.broker.total_unacked.to_string()),
        ("blocked_evals", stats.blocked.total_blocked.to_string()),
        ("workers", workers.to_string()),
        ("index_waiters", state.leadership.store().waiters().to_string()),
    ]);
    let runtime = strings([
        ("os", std::env::consts::OS.to_string()),
        ("arch", std::env::consts::ARCH.to_string()),
        ("version", VERSION.to_string()),
        ("cpu_count", std::thread::available_parallelism().map_or(1, usize::from).to_string()),
    ]);
    let body = AgentSelf {
        config: AgentConfig {
            region: agent.region.clone(),
            datacenter: agent.datacenter.clone(),
            node_name: agent.name.clone(),
            version: AgentVersion { version: VERSION.to_string() },
            server: AgentServerConfig { enabled: true },
            ports: AgentPorts { http: agent.http_addr.port(), rpc: agent.rpc_addr.port() },
        },
        member: member(&state),
        stats: [("nomad", nomad), ("drover", drover), ("runtime", runtime)]
            .into_iter()
            .map(|(name, stats)| (name.to_string(), stats))
            .collect(),
    };
    Reply::json(&body, params.pretty(), None)
}

/// `GET /v1/agent/members`: this server alone, or every member of the
/// cluster as its raft membership has it (answered by the leader, which
/// knows how far each server's log is). Besides Nomad's fields, the tags
/// carry Drover's raft view: `raft_id`, `role` (leader, follower or
/// learner), `term`, `last_index` (the leader's own, or how far its log is
/// replicated to the member) and `health`.
async fn members(State(state): State<ApiState>, params: Params) -> Reply {
    let members = match state.leadership.durable().filter(|_| state.leadership.is_clustered()) {
        Some(durable) => cluster_members(&state, durable),
        None => vec![member(&state)],
    };
    let body = ServerMembers {
        server_name: state.agent.name.clone(),
        server_region: state.agent.region.clone(),
        server_dc: state.agent.datacenter.clone(),
        members,
    };
    Reply::json(&body, params.pretty(), None)
}

/// How far behind the leader's log a member may be and still be healthy.
const HEALTHY_LAG: u64 = 1_000;

fn cluster_members(state: &ApiState, durable: &replication::Durable) -> Vec<AgentMember> {
    let metrics = durable.metrics();
    let membership = metrics.membership_config.membership();
    let voters: Vec<u64> = membership.voter_ids().collect();
    let last_index = metrics.last_log_index.unwrap_or(0);
    let replication = metrics.replication.clone().unwrap_or_default();
    let mut members = Vec::new();
    for (id, node) in membership.nodes() {
        let role = match () {
            () if metrics.current_leader == Some(*id) => "leader",
            () if voters.contains(id) => "follower",
            () => "learner",
        };
        let (index, health) = if *id == metrics.id {
            (last_index, "healthy")
        } else {
            match replication.get(id) {
                Some(matched) => {
                    let index = matched.map_or(0, |log_id| log_id.index);
                    (index, if last_index.saturating_sub(index) <= HEALTHY_LAG { "healthy" } else { "lagging" })
                }
                None => (0, "unknown"),
            }
        };
        let rpc: Option<std::net::SocketAddr> = node.rpc.parse().ok();
        let (ip, port) = rpc.map_or((String::new(), 0), |addr| (addr.ip().to_string(), addr.port()));
        let tags = strings([
            ("role", "nomad".to_string()),
            ("region", state.agent.region.clone()),
            ("dc", state.agent.datacenter.clone()),
            ("vsn", "1".to_string()),
            ("mvn", "1".to_string()),
            ("build", VERSION.to_string()),
            ("port", port.to_string()),
            ("rpc_addr", ip.clone()),
            ("raft_id", id.to_string()),
            ("raft_role", role.to_string()),
            ("term", metrics.current_term.to_string()),
            ("last_index", index.to_string()),
            ("health", health.to_string()),
            ("peer_addr", node.peer.clone()),
            ("http_addr", node.http.clone()),
        ]);
        let status = if health == "lagging" { "failed" } else { "alive" };
        members.push(nomad_member(format!("{}.{}", node.name, state.agent.region), ip, port, status, tags));
    }
    members
}

/// The leader's client (RPC) address: this server's when it is alone.
fn leader_rpc(state: &ApiState) -> String {
    match state.leadership.durable().filter(|_| state.leadership.is_clustered()) {
        Some(durable) => durable.leader().map(|(_, node)| node.rpc).unwrap_or_default(),
        None => state.agent.rpc_addr.to_string(),
    }
}

/// `GET /v1/agent/health`.
async fn health(State(state): State<ApiState>, params: Params) -> Result<Reply, ApiError> {
    if state.leadership.store().is_shutting_down() {
        return Err(ApiError::Internal("the server is shutting down".to_string()));
    }
    let body = AgentHealthResponse { server: AgentHealth { ok: true, message: "ok".to_string() } };
    Ok(Reply::json(&body, params.pretty(), None))
}

/// `GET /v1/status/leader`: a JSON string `"ip:port"`, equal to the
/// member's `Addr:Tags.port` so `server members` marks it.
async fn leader(State(state): State<ApiState>, params: Params) -> Reply {
    Reply::json(&leader_rpc(&state), params.pretty(), None)
}

/// `GET /v1/status/peers`: the voters' client addresses.
async fn peers(State(state): State<ApiState>, params: Params) -> Reply {
    let peers = match state.leadership.durable().filter(|_| state.leadership.is_clustered()) {
        Some(durable) => {
            let metrics = durable.metrics();
            let membership = metrics.membership_config.membership();
            let voters: Vec<u64> = membership.voter_ids().collect();
            membership.nodes().filter(|(id, _)| voters.contains(id)).map(|(_, node)| node.rpc.clone()).collect()
        }
        None => vec![state.agent.rpc_addr.to_string()],
    };
    Reply::json(&peers, params.pretty(), None)
}

/// `PUT /v1/agent/servers`: Nomad's sets a client agent's servers; a
/// Drover client agent takes them from its configuration, and this API
/// is a server's. (`GET` answers the servers' RPC addresses, as
/// `/v1/status/peers`.)
async fn set_servers() -> ApiError {
    ApiError::NotImplemented(
        "PUT /v1/agent/servers: this is a server; a Drover client agent takes its servers from --servers or \
         client.servers"
            .to_string(),
    )
}

/// `GET /v1/scaling/policies`: none (Drover has no scaling policies yet).
async fn scaling_policies(params: Params) -> Reply {
    Reply::json(&Vec::<serde_json::Value>::new(), params.pretty(), None)
}

/// `GET /v1/regions`.
async fn regions(params: Params) -> Reply {
    Reply::json(&[REGION], params.pretty(), None)
}

fn status_name(status: WorkerStatus) -> &'static str {
    match status {
        WorkerStatus::Starting => "Starting",
        WorkerStatus::Started => "Started",
        WorkerStatus::Pausing => "Pausing",
        WorkerStatus::Paused => "Paused",
        WorkerStatus::Stopping => "Stopping",
        WorkerStatus::Stopped => "Stopped",
    }
}

fn activity_name(status: WorkerStatus, activity: WorkerActivity) -> &'static str {
    match (status, activity) {
        (WorkerStatus::Paused, _) => "Paused",
        (WorkerStatus::Stopped, _) => "Stopped",
        (_, WorkerActivity::Idle) => "Running",
        (_, WorkerActivity::WaitingToDequeue) => "WaitingToDequeue",
        (_, WorkerActivity::WaitingForIndex) => "WaitingForRaft",
        (_, WorkerActivity::Scheduling) => "Scheduling",
        (_, WorkerActivity::Submitting) => "Submitting",
        (_, WorkerActivity::Backoff) => "Backoff",
    }
}

/// The scheduler names a worker serves, with `_core` (Nomad lists it; its
/// work, the eval reaper, runs on its own in Drover).
fn scheduler_names(types: &[JobType]) -> Vec<String> {
    types.iter().map(|kind| kind.as_str().to_string()).chain(["_core".to_string()]).collect()
}

/// A server alone that no longer leads is shutting down: its workers are gone.
fn no_workers() -> ApiError {
    ApiError::NoLeader("this server does not lead".to_string())
}

/// `GET /v1/agent/schedulers`: this server's own workers (a follower of a
/// cluster schedules too).
async fn schedulers(State(state): State<ApiState>, params: Params) -> Reply {
    let workers = state.leadership.with_workers(WorkerPool::workers).unwrap_or_default();
    let schedulers = workers
        .iter()
        .map(|worker| AgentSchedulerWorkerInfo {
            id: worker.id.to_string(),
            enabled_schedulers: scheduler_names(&worker.types),
            started: None,
            status: status_name(worker.status).to_string(),
            workload_status: activity_name(worker.status, worker.activity).to_string(),
        })
        .collect();
    Reply::json(&AgentSchedulerWorkersInfo { server_id: server_id(&state), schedulers }, params.pretty(), None)
}

fn server_id(state: &ApiState) -> String {
    format!("{}.{}", state.agent.name, state.agent.region)
}

fn current_config(state: &ApiState) -> AgentSchedulerWorkerConfigResponse {
    let workers = state.leadership.with_workers(WorkerPool::workers).unwrap_or_default();
    let types = workers.first().map(|worker| worker.types.clone()).unwrap_or_default();
    AgentSchedulerWorkerConfigResponse {
        server_id: server_id(state),
        num_schedulers: workers.len() as u64,
        enabled_schedulers: scheduler_names(&types),
    }
}

/// `GET /v1/agent/schedulers/config`.
async fn scheduler_config(State(state): State<ApiState>, params: Params) -> Reply {
    Reply::json(&current_config(&state), params.pretty(), None)
}

/// Resizes the worker pool and retargets it at run time.
async fn set_scheduler_config(State(state): State<ApiState>, params: Params, body: Bytes) -> Result<Reply, ApiError> {
    let request: AgentSchedulerWorkerConfigRequest =
        serde_json::from_slice(&body).map_err(|error| ApiError::BadRequest(format!("Invalid request: {error}")))?;
    let invalid = || ApiError::BadRequest("Invalid request".to_string());
    let count = usize::try_from(request.num_schedulers).map_err(|_| invalid())?;
    if !request.enabled_schedulers.iter().any(|name| name == "_core") {
        return Err(invalid());
    }
    let mut types = Vec::new();
    for name in request.enabled_schedulers.iter().filter(|name| *name != "_core") {
        types.push(JobType::ALL.into_iter().find(|kind| kind.as_str() == name).ok_or_else(invalid)?);
    }
    let leadership = state.leadership.clone();
    let configured = tokio::task::spawn_blocking(move || {
        leadership.with_workers(|workers| {
            if workers.workers().len() != count {
                workers.resize(count);
            }
            let current = workers.workers().first().map(|worker| worker.types.clone());
            if !types.is_empty() && current.as_ref() != Some(&types) {
                workers.set_types(types);
            }
        })
    })
    .await
    .map_err(|error| ApiError::Internal(format!("engine call failed: {error}")))?;
    configured.ok_or_else(no_workers)?;
    Ok(Reply::json(&current_config(&state), params.pretty(), None))
}

/// Which worker a pause or resume names: `?id=N`, or all without it.
fn worker_id(state: &ApiState, params: &Params) -> Result<Option<usize>, ApiError> {
    let Some(text) = params.get("id") else { return Ok(None) };
    let id: usize = text.parse().map_err(|_| ApiError::BadRequest(format!("worker id {text:?} is not a number")))?;
    let known = state.leadership.with_workers(|pool| pool.workers().iter().any(|worker| worker.id == id));
    if !known.ok_or_else(no_workers)? {
        return Err(ApiError::NotFound(format!("no worker {id}")));
    }
    Ok(Some(id))
}

/// `PUT /v1/agent/schedulers/pause[?id=N]` (Drover's): the workers finish
/// the eval they hold and take no other until resumed. Answers the workers.
async fn pause_workers(State(state): State<ApiState>, params: Params) -> Result<Reply, ApiError> {
    let id = worker_id(&state, &params)?;
    state.leadership.with_workers(|pool| pool.pause(id)).ok_or_else(no_workers)?;
    tracing::info!(worker = ?id, "scheduling workers paused");
    Ok(schedulers(State(state), params).await)
}

/// `PUT /v1/agent/schedulers/resume[?id=N]` (Drover's).
async fn resume_workers(State(state): State<ApiState>, params: Params) -> Result<Reply, ApiError> {
    let id = worker_id(&state, &params)?;
    state.leadership.with_workers(|pool| pool.resume(id)).ok_or_else(no_workers)?;
    tracing::info!(worker = ?id, "scheduling workers resumed");
    Ok(schedulers(State(state), params).await)
}

/// At most this many ids per context, as Nomad.
const SEARCH_LIMIT: usize = 20;

/// `PUT /v1/search`: ids starting with a prefix, per context (`jobs`,
/// `evals`, `allocs`, `nodes`; `deployment` always empty), for
/// `nomad status <prefix>`. Of the namespace the body (or the query)
/// names, `*` for all, and only what the caller's token may list: jobs
/// (`list-jobs`), evaluations and allocations (`read-job`), nodes (`node`
/// `read`).
async fn search(
    State(state): State<ApiState>,
    axum::Extension(access): axum::Extension<Access>,
    params: Params,
    body: Bytes,
) -> Result<Reply, ApiError> {
    let request: SearchRequest =
        serde_json::from_slice(&body).map_err(|error| ApiError::BadRequest(error.to_string()))?;
    let contexts = ["jobs", "evals", "allocs", "nodes", "deployment"];
    let wanted: Vec<&str> = match request.context.as_str() {
        "" | "all" => contexts.to_vec(),
        one if contexts.contains(&one) => vec![one],
        other => return Err(ApiError::BadRequest(format!("invalid search context {other:?}"))),
    };
    let namespace =
        request.namespace.clone().filter(|ns| !ns.is_empty()).unwrap_or_else(|| params.namespace().to_string());
    super::query::known_namespace(&state.leadership.store().snapshot(), &namespace, true)?;
    if namespace != "*" {
        access.check(&namespace, Capabilities::LIST_JOBS)?;
    }
    let prefix = request.prefix.clone();
    let nodes_readable = access.level(Area::Node, AclLevel::Read);
    let of = move |object_namespace: &str, capability| {
        (namespace == "*" || namespace == object_namespace) && access.may(object_namespace, capability)
    };
    blocking(
        &state,
        &params,
        |snapshot| Ok(snapshot.index()),
        move |snapshot| {
            let mut matches: BTreeMap<String, Vec<String>> = BTreeMap::new();
            let mut truncations: BTreeMap<String, bool> = BTreeMap::new();
            for context in &wanted {
                let mut ids: Vec<String> = match *context {
                    "jobs" => snapshot
                        .jobs()
                        .filter(|job| job.id.starts_with(&prefix) && of(&job.namespace, Capabilities::LIST_JOBS))
                        .map(|job| job.id.to_string())
                        .collect(),
                    "evals" => snapshot
                        .evals()
                        .filter(|eval| matches_uuid_prefix(&eval.id.0, &prefix))
                        .filter(|eval| of(&eval.namespace, Capabilities::READ_JOB))
                        .map(|eval| eval.id.to_string())
                        .collect(),
                    "allocs" => snapshot
                        .allocs()
                        .filter(|alloc| matches_uuid_prefix(&alloc.id.0, &prefix))
                        .filter(|alloc| of(&alloc.namespace, Capabilities::READ_JOB))
                        .map(|alloc| alloc.id.to_string())
                        .collect(),
                    "nodes" if !nodes_readable => Vec::new(),
                    "nodes" => snapshot
                        .nodes()
                        .filter(|node| matches_uuid_prefix(&node.id.0, &prefix))
                        .map(|node| node.id.to_string())
                        .collect(),
                    _ => Vec::new(),
                };
                ids.sort();
                truncations.insert(context.to_string(), ids.len() > SEARCH_LIMIT);
                ids.truncate(SEARCH_LIMIT);
                matches.insert(context.to_string(), ids);
            }
            Ok(SearchResponse { matches, truncations, meta: WriteMeta::at(snapshot.index()) })
        },
    )
    .await
}
