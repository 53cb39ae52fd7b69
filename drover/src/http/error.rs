//! API errors: a status code and a one-line plain-text body, as Nomad
//! answers (its clients print the body; python-nomad picks its exception
//! class by the code).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use engine::acl_endpoint::AclError;
use engine::job_endpoint::JobError;
use engine::state::{LogError, StateError};

/// Why a request was not served.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Malformed JSON, a bad parameter, a body that makes no sense (400).
    #[error("{0}")]
    BadRequest(String),
    /// No such object (404).
    #[error("{0}")]
    NotFound(String),
    /// A missing or wrong ACL token, or one without the needed policy (403).
    #[error("Permission denied")]
    Forbidden,
    /// The method is not one the path takes (405).
    #[error("Invalid method")]
    MethodNotAllowed,
    /// A path of Nomad's API that Drover does not serve yet (501); the
    /// message names it.
    #[error("{0}")]
    NotImplemented(String),
    /// The server could not do it (500): a job that fails validation (as in
    /// Nomad, whose register answers validation errors with 500), or the
    /// server shutting down.
    #[error("{0}")]
    Internal(String),
    /// No server leads now (an election), or the leader could not be
    /// reached (500, as Nomad's "No cluster leader"); safe to retry.
    #[error("No cluster leader: {0}")]
    NoLeader(String),
    /// This server lost the leadership while writing; the message names
    /// the leader if it knows one (500); safe to retry there.
    #[error("{0}")]
    NotLeader(String),
    /// raft's log has stopped on this server (shut down, or failed): it
    /// takes no more writes (500); retrying on this server cannot succeed.
    #[error("The raft log has stopped on this server: {0}")]
    LogStopped(String),
}

impl ApiError {
    fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Forbidden => StatusCode::FORBIDDEN,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            ApiError::Internal(_) | ApiError::NoLeader(_) | ApiError::NotLeader(_) | ApiError::LogStopped(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.to_string().replace('\n', " ");
        (self.status(), [("content-type", "text/plain; charset=utf-8")], body).into_response()
    }
}

impl From<JobError> for ApiError {
    fn from(error: JobError) -> Self {
        match error {
            JobError::UnknownJob(_) => ApiError::NotFound("job not found".to_string()),
            JobError::UnknownAlloc(_) | JobError::State(StateError::UnknownAlloc(_)) => {
                ApiError::NotFound("alloc not found".to_string())
            }
            JobError::UnknownGroup { .. }
            | JobError::UnknownNamespace { .. }
            | JobError::State(StateError::UnknownNamespace(_)) => ApiError::BadRequest(error.to_string()),
            JobError::State(error @ (StateError::ShuttingDown | StateError::Log(_))) => error.into(),
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl From<StateError> for ApiError {
    fn from(error: StateError) -> Self {
        match error {
            StateError::ShuttingDown => ApiError::Internal("the server is shutting down".to_string()),
            StateError::Log(LogError::NotLeader { leader }) => {
                ApiError::NotLeader(LogError::NotLeader { leader }.to_string())
            }
            StateError::Log(LogError::Stopped { reason }) => ApiError::LogStopped(reason),
            StateError::EvalBrokerNotPaused
            | StateError::NodeDraining(_)
            | StateError::InvalidNamespace(_)
            | StateError::DefaultNamespace
            | StateError::NamespaceInUse { .. } => ApiError::BadRequest(error.to_string()),
            StateError::UnknownNamespace(_) => ApiError::NotFound(error.to_string()),
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl From<AclError> for ApiError {
    fn from(error: AclError) -> Self {
        match error {
            AclError::Write(StateError::UnknownAclToken(_)) => ApiError::NotFound(error.to_string()),
            AclError::Write(
                StateError::AclBootstrapped(_) | StateError::UnknownAclPolicy(_) | StateError::DuplicateAclSecret(_),
            ) => ApiError::BadRequest(error.to_string()),
            AclError::Write(other) => other.into(),
            refused => ApiError::BadRequest(refused.to_string()),
        }
    }
}

/// Nomad's endpoints Drover does not serve yet, by path prefix, each with
/// what to use instead: answered 501 naming the path, never 404 (which
/// would read as "no such object").
const NOT_IMPLEMENTED: [(&str, &str); 16] = [
    ("/v1/agent/join", "servers form a cluster with --join and `drover operator raft add-voter`"),
    ("/v1/agent/force-leave", "remove a server with `drover operator raft remove-peer`"),
    ("/v1/agent/monitor", "read the server's log where it writes it"),
    ("/v1/agent/keyring", "Drover has no gossip keyring: servers and agents use mutual TLS"),
    ("/v1/agent/pprof", "profile a server with `loadgen --flamegraph` or perf"),
    ("/v1/agent/host", "no host data is served"),
    ("/v1/volume", "no host or CSI volumes"),
    ("/v1/plugin", "no CSI plugins"),
    ("/v1/node/pool", "no node pools"),
    ("/v1/var", "no variables"),
    ("/v1/acl/role", "no ACL roles: tokens carry policies"),
    ("/v1/acl/auth-method", "no SSO auth methods"),
    ("/v1/acl/binding-rule", "no SSO auth methods"),
    ("/v1/operator/autopilot", "raft membership is managed with `drover operator raft`"),
    ("/v1/operator/keyring", "no workload identity keyring"),
    ("/v1/quota", "no quotas (Nomad Enterprise)"),
];

/// An unknown path under the API: 404 with an empty body, as Nomad; a
/// Nomad endpoint Drover does not serve yet is 501 naming it.
pub async fn unknown_path(uri: axum::http::Uri) -> Response {
    let path = uri.path();
    match NOT_IMPLEMENTED.iter().find(|(prefix, _)| path.starts_with(prefix)) {
        Some((_, instead)) => {
            ApiError::NotImplemented(format!("{path}: Drover does not serve this Nomad endpoint ({instead})"))
                .into_response()
        }
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// A register's (or a plan's) refusal: validation errors as Nomad's
/// multierror (500), anything else as [`ApiError::from`] maps it.
pub fn register_error(error: JobError) -> ApiError {
    match error {
        JobError::Invalid(invalid) => {
            ApiError::Internal(format!("{} error(s) occurred: {}", invalid.problems.len(), invalid.problems.join("; ")))
        }
        other => ApiError::from(other),
    }
}
