//! An allocation's health checks, run by its agent (Nomad 1.4+'s checks of
//! `provider = "nomad"` services): `http`, `tcp` and `script`.
//!
//! 1. What is checked follows what is registered ([`plan`]): a service's
//!    checks start when it registers and stop when it deregisters, their
//!    results going with them. A check starts at its `initial_status`
//!    (`passing` is `success`, `warning` and `critical` are `failure`),
//!    else `pending`, and runs at once, then every `interval`, each run
//!    bounded by `timeout`.
//! 2. A run passes or fails ([`Outcome`]): `http` passes on a 2xx answer,
//!    `tcp` when the connection opens, `script` when the command exits 0
//!    (in the task's context: on the host with the task's environment and
//!    directory for `raw_exec`, inside the container for `docker`).
//! 3. The status moves to `success` after `success_before_passing` passes
//!    in a row (at least one) and to `failure` after
//!    `failures_before_critical` failures in a row (at least one)
//!    ([`Tracker`]). Only a change of status is news for the allocation
//!    runner, which reports it to the servers: checks that keep passing
//!    write nothing.
//! 4. `check_restart`: once the check has been failing for `limit` runs in
//!    a row, not counting runs within `grace` of its start, the task is
//!    restarted through its restart policy ([`RestartWatch`]), and the
//!    count starts again.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::structs::{
    Allocation, CheckKind, CheckMode, CheckRestart, CheckResult, CheckResultStatus, CheckStatus, Node, OnUpdate,
    ServiceCheck,
};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, watch};

use crate::client::clock::now;
use crate::client::drivers::docker::Docker;
use crate::client::drivers::HandleState;
use crate::client::services::{endpoint, Registered};
use crate::client::task_env::{EnvDenylist, TaskEnv};

/// How much of a run's output a result keeps.
const MAX_OUTPUT: usize = 4096;

/// One check to run, as planned from a registered service.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedCheck {
    /// Its result before the first run (its id, names and mode set).
    pub initial: CheckResult,
    /// What a run does.
    pub probe: Probe,
    /// Time between runs.
    pub interval: Duration,
    /// How long one run may take.
    pub timeout: Duration,
    /// Passes in a row before `success`.
    pub success_before_passing: u32,
    /// Failures in a row before `failure`.
    pub failures_before_critical: u32,
    /// When its failures restart the task.
    pub restart: Option<CheckRestart>,
    /// The task its failures restart, and a script runs in.
    pub task: String,
}

/// What one run of a check does.
#[derive(Clone, Debug, PartialEq)]
pub enum Probe {
    /// An HTTP request; a 2xx answer passes.
    Http {
        /// `http` or `https`.
        https: bool,
        /// Where to connect.
        address: String,
        /// Its port.
        port: u16,
        /// The request's path (with its query).
        path: String,
        /// The method.
        method: String,
        /// Request headers.
        headers: Vec<(String, String)>,
        /// The body.
        body: String,
        /// Skip verifying an `https` server's certificate.
        skip_verify: bool,
    },
    /// A TCP connection; opening it passes.
    Tcp {
        /// Where to connect.
        address: String,
        /// Its port.
        port: u16,
    },
    /// A command in the task's context; exit 0 passes.
    Script {
        /// The command and its arguments.
        argv: Vec<String>,
        /// The task's process or container.
        handle: HandleState,
        /// The task's environment (raw_exec).
        env: BTreeMap<String, String>,
        /// The task's directory (raw_exec).
        dir: PathBuf,
        /// The task's `user` (raw_exec), whom the command runs as.
        user: Option<String>,
    },
}

/// What one run found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Whether it passed.
    pub passed: bool,
    /// What it said.
    pub output: String,
    /// An `http` check's status code; 0 otherwise.
    pub status_code: u16,
}

/// News for the allocation runner.
#[derive(Clone, Debug, PartialEq)]
pub enum CheckNews {
    /// A check's status changed.
    Changed(CheckResult),
    /// `task`'s failing check asks for its restart (module docs, 4).
    Restart {
        /// The task.
        task: String,
        /// Why: `healthcheck: check "name" unhealthy`.
        reason: String,
    },
}

/// The checks of `alloc`'s services `registered` now
/// ([`crate::client::services::registered`]), with its tasks' variables in
/// `envs` and their processes in `handles` (module docs, 1). A check's
/// initial result is stamped when its runner takes it up.
pub fn plan(
    alloc: &Allocation,
    node: &Node,
    registered: &[Registered<'_>],
    envs: &BTreeMap<String, TaskEnv>,
    handles: &BTreeMap<String, HandleState>,
    denylist: &EnvDenylist,
) -> Vec<PlannedCheck> {
    let mut out = Vec::new();
    for found in registered {
        let service = found.service;
        for check in &service.checks {
            let task = check.task_name.clone().unwrap_or_else(|| found.task.to_string());
            let probe = match check.kind {
                CheckKind::Script => {
                    let Some(handle) = handles.get(&task) else { continue };
                    let env = envs.get(&task).unwrap_or(found.env);
                    let task_def = alloc
                        .job
                        .group(&alloc.task_group)
                        .and_then(|group| group.tasks.iter().find(|candidate| candidate.name == task));
                    script_probe(check, env, task_def, handle, denylist)
                }
                CheckKind::Http | CheckKind::Tcp => {
                    let label = check.port_label.as_deref().map(|label| found.env.interpolate(label));
                    let mode = check.address_mode.unwrap_or(service.address_mode);
                    let (address, port) = match (&label, mode) {
                        // Without a port of its own the check reaches the
                        // service where it is registered.
                        (None, _) => (found.registration.address.clone(), found.registration.port),
                        (Some(label), mode) => endpoint(alloc, node, label, mode, None),
                    };
                    network_probe(check, found.env, address, port)
                }
            };
            let mode = if check.on_update == OnUpdate::Ignore || service.on_update == OnUpdate::Ignore {
                CheckMode::Readiness
            } else {
                CheckMode::Healthiness
            };
            let status = match check.initial_status {
                Some(CheckStatus::Passing) => CheckResultStatus::Success,
                Some(CheckStatus::Warning | CheckStatus::Critical) => CheckResultStatus::Failure,
                None => CheckResultStatus::Pending,
            };
            let owner_task = if found.group_service { String::new() } else { found.task.to_string() };
            let initial = CheckResult {
                id: CheckResult::make_id(alloc.id, &found.registration.id, &check.name),
                check: check.name.clone(),
                group: format!("{}.{}", alloc.job_id, alloc.task_group),
                task: owner_task,
                service: found.registration.service_name.clone(),
                mode,
                status,
                output: String::new(),
                status_code: 0,
                timestamp: engine::clock::Timestamp::ZERO,
            };
            out.push(PlannedCheck {
                initial,
                probe,
                interval: check.interval,
                timeout: check.timeout,
                success_before_passing: check.success_before_passing,
                failures_before_critical: check.failures_before_critical,
                restart: check.check_restart.clone(),
                task,
            });
        }
    }
    out
}

fn network_probe(check: &ServiceCheck, env: &TaskEnv, address: String, port: u16) -> Probe {
    match check.kind {
        CheckKind::Http => {
            let headers = check
                .header
                .iter()
                .flat_map(|(name, values)| values.iter().map(move |value| (name.clone(), env.interpolate(value))))
                .collect();
            let method = if check.method.is_empty() { "GET".to_string() } else { check.method.clone() };
            let path = env.interpolate(&check.path);
            Probe::Http {
                https: check.protocol == "https",
                address,
                port,
                path: if path.starts_with('/') { path } else { format!("/{path}") },
                method,
                headers,
                body: env.interpolate(&check.body),
                skip_verify: check.tls_skip_verify,
            }
        }
        _ => Probe::Tcp { address, port },
    }
}

fn script_probe(
    check: &ServiceCheck,
    env: &TaskEnv,
    task: Option<&engine::structs::Task>,
    handle: &HandleState,
    denylist: &EnvDenylist,
) -> Probe {
    let mut argv = vec![env.interpolate(&check.command)];
    argv.extend(check.args.iter().map(|arg| env.interpolate(arg)));
    let (env, dir) = match task {
        Some(task) => {
            // What the task itself gets: the agent's variables less the denylist.
            let env = env.process_env(task, std::env::vars(), denylist);
            let dir = env.get("NOMAD_TASK_DIR").map(PathBuf::from).unwrap_or_default();
            (env, dir.parent().map(PathBuf::from).unwrap_or(dir))
        }
        None => (BTreeMap::new(), PathBuf::new()),
    };
    let user = task.and_then(|task| task.user.clone());
    Probe::Script { argv, handle: handle.clone(), env, dir, user }
}

/// A check's status from its runs (module docs, 3).
#[derive(Clone, Debug)]
pub struct Tracker {
    status: CheckResultStatus,
    passes: u32,
    failures: u32,
    success_before_passing: u32,
    failures_before_critical: u32,
}

impl Tracker {
    /// A tracker starting at `status`.
    pub fn new(status: CheckResultStatus, success_before_passing: u32, failures_before_critical: u32) -> Tracker {
        Tracker { status, passes: 0, failures: 0, success_before_passing, failures_before_critical }
    }

    /// Counts a run; the new status when it changed.
    pub fn record(&mut self, passed: bool) -> Option<CheckResultStatus> {
        let next = if passed {
            self.failures = 0;
            self.passes = self.passes.saturating_add(1);
            (self.passes >= self.success_before_passing.max(1)).then_some(CheckResultStatus::Success)
        } else {
            self.passes = 0;
            self.failures = self.failures.saturating_add(1);
            (self.failures >= self.failures_before_critical.max(1)).then_some(CheckResultStatus::Failure)
        };
        match next {
            Some(status) if status != self.status => {
                self.status = status;
                Some(status)
            }
            _ => None,
        }
    }

    /// The status now.
    pub fn status(&self) -> CheckResultStatus {
        self.status
    }
}

/// When failing checks restart their task (module docs, 4).
#[derive(Clone, Debug)]
pub struct RestartWatch {
    policy: CheckRestart,
    started: Instant,
    unhealthy: u32,
}

impl RestartWatch {
    /// A watch of a check started at `started`.
    pub fn new(policy: CheckRestart, started: Instant) -> RestartWatch {
        RestartWatch { policy, started, unhealthy: 0 }
    }

    /// Counts a run at `now` whose check has `status`; whether to restart.
    pub fn record(&mut self, status: CheckResultStatus, now: Instant) -> bool {
        if self.policy.limit == 0 || now < self.started + self.policy.grace {
            return false;
        }
        if status != CheckResultStatus::Failure {
            self.unhealthy = 0;
            return false;
        }
        self.unhealthy += 1;
        if self.unhealthy >= self.policy.limit {
            self.unhealthy = 0;
            return true;
        }
        false
    }
}

/// Runs the checks `plans` holds (replaced as services come and go) until
/// `plans` closes; news goes to `news`.
pub async fn run(
    mut plans: watch::Receiver<Vec<PlannedCheck>>,
    news: mpsc::UnboundedSender<CheckNews>,
    docker: Option<Arc<Docker>>,
) {
    // Dropped with this runner, the set aborts every check it still runs.
    let mut tasks = tokio::task::JoinSet::new();
    let mut running: BTreeMap<String, (PlannedCheck, tokio::task::AbortHandle)> = BTreeMap::new();
    loop {
        let planned: BTreeMap<String, PlannedCheck> =
            plans.borrow_and_update().iter().map(|check| (check.initial.id.clone(), check.clone())).collect();
        running.retain(|id, (check, task)| {
            let keep = planned.get(id).is_some_and(|now| now.probe == check.probe && now.interval == check.interval);
            if !keep {
                task.abort();
            }
            keep
        });
        for (id, check) in planned {
            if let std::collections::btree_map::Entry::Vacant(slot) = running.entry(id) {
                let task = tasks.spawn(run_one(check.clone(), news.clone(), docker.clone()));
                slot.insert((check, task));
            }
        }
        loop {
            tokio::select! {
                changed = plans.changed() => match changed {
                    Ok(()) => break,
                    Err(_) => return,
                },
                // Reaps ended checks so the set does not grow.
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        }
    }
}

/// Runs one check until aborted.
async fn run_one(check: PlannedCheck, news: mpsc::UnboundedSender<CheckNews>, docker: Option<Arc<Docker>>) {
    let mut tracker = Tracker::new(check.initial.status, check.success_before_passing, check.failures_before_critical);
    let mut restart = check.restart.clone().map(|policy| RestartWatch::new(policy, Instant::now()));
    let mut ticks = tokio::time::interval(check.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let outcome = match tokio::time::timeout(check.timeout, probe(&check.probe, docker.as_deref())).await {
            Ok(outcome) => outcome,
            Err(_) => Outcome { passed: false, output: format!("timed out after {:?}", check.timeout), status_code: 0 },
        };
        if let Some(status) = tracker.record(outcome.passed) {
            let output: String = outcome.output.chars().take(MAX_OUTPUT).collect();
            let result = CheckResult {
                status,
                output,
                status_code: outcome.status_code,
                timestamp: now(),
                ..check.initial.clone()
            };
            if news.send(CheckNews::Changed(result)).is_err() {
                return;
            }
        }
        if restart.as_mut().is_some_and(|watch| watch.record(tracker.status(), Instant::now())) {
            let reason = format!("healthcheck: check {:?} unhealthy", check.initial.check);
            if news.send(CheckNews::Restart { task: check.task.clone(), reason }).is_err() {
                return;
            }
        }
    }
}

/// One run of `probe`.
pub async fn probe(probe: &Probe, docker: Option<&Docker>) -> Outcome {
    let failed = |output: String| Outcome { passed: false, output, status_code: 0 };
    match probe {
        Probe::Tcp { address, port } => match tokio::net::TcpStream::connect((address.as_str(), *port)).await {
            Ok(_) => Outcome { passed: true, output: format!("nomad: tcp ok: {address}:{port}"), status_code: 0 },
            Err(error) => failed(format!("nomad: tcp {address}:{port}: {error}")),
        },
        Probe::Http { .. } => match http(probe).await {
            Ok((status_code, body)) => Outcome {
                passed: (200..300).contains(&status_code),
                output: format!("nomad: http {status_code}: {body}"),
                status_code,
            },
            Err(error) => failed(format!("nomad: {error}")),
        },
        Probe::Script { argv, handle, env, dir, user } => {
            match script(argv, handle, env, dir, user.as_deref(), docker).await {
                Ok((code, output)) => Outcome { passed: code == 0, output, status_code: 0 },
                Err(error) => failed(error),
            }
        }
    }
}

/// Sends an `http` check's request; its status code and body.
async fn http(probe: &Probe) -> Result<(u16, String), String> {
    let Probe::Http { https, address, port, path, method, headers, body, skip_verify } = probe else {
        return Err("not an http check".to_string());
    };
    let stream = tokio::net::TcpStream::connect((address.as_str(), *port))
        .await
        .map_err(|error| format!("http {address}:{port}: {error}"))?;
    let host = if address.contains(':') { format!("[{address}]:{port}") } else { format!("{address}:{port}") };
    let mut request = hyper::Request::builder().method(method.as_str()).uri(path.as_str()).header("host", &host);
    for (name, value) in headers {
        request = request.header(name.as_str(), value.as_str());
    }
    let request = request
        .body(Full::new(Bytes::from(body.clone())))
        .map_err(|error| format!("http request to {host}{path}: {error}"))?;
    if *https {
        let tls = tls_config(*skip_verify)?;
        let name = rustls::pki_types::ServerName::try_from(address.clone())
            .map_err(|error| format!("https {address}: {error}"))?;
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(name, stream)
            .await
            .map_err(|error| format!("https {host}: {error}"))?;
        exchange(TokioIo::new(stream), request).await
    } else {
        exchange(TokioIo::new(stream), request).await
    }
}

async fn exchange<IO>(io: IO, request: hyper::Request<Full<Bytes>>) -> Result<(u16, String), String>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(io).await.map_err(|error| format!("http: {error}"))?;
    let driving = tokio::spawn(connection);
    let answer = async {
        let response = sender.send_request(request).await.map_err(|error| format!("http: {error}"))?;
        let status = response.status().as_u16();
        // Read up to MAX_OUTPUT: a service may answer without end.
        let mut body = response.into_body();
        let mut shown = Vec::new();
        while shown.len() < MAX_OUTPUT {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        shown.extend_from_slice(&data[..data.len().min(MAX_OUTPUT - shown.len())]);
                    }
                }
                Some(Err(error)) => return Err(format!("http body: {error}")),
                None => break,
            }
        }
        Ok((status, String::from_utf8_lossy(&shown).into_owned()))
    }
    .await;
    driving.abort();
    answer
}

/// The TLS settings of an `https` check: the system's roots, or none
/// checked with `tls_skip_verify`.
fn tls_config(skip_verify: bool) -> Result<Arc<rustls::ClientConfig>, String> {
    let builder = rustls::ClientConfig::builder();
    let config = if skip_verify {
        builder.dangerous().with_custom_certificate_verifier(Arc::new(NoVerify::new())).with_no_client_auth()
    } else {
        builder.with_root_certificates(system_roots()?).with_no_client_auth()
    };
    Ok(Arc::new(config))
}

/// The system's trusted roots, read once (Debian's and Red Hat's bundles).
fn system_roots() -> Result<Arc<rustls::RootCertStore>, String> {
    use rustls::pki_types::pem::PemObject;
    static ROOTS: std::sync::OnceLock<Result<Arc<rustls::RootCertStore>, String>> = std::sync::OnceLock::new();
    const BUNDLES: [&str; 2] = ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"];
    ROOTS
        .get_or_init(|| {
            let bundle = BUNDLES
                .into_iter()
                .find(|path| std::path::Path::new(path).exists())
                .ok_or_else(|| format!("https: no system certificate bundle ({})", BUNDLES.join(", ")))?;
            let certs = rustls::pki_types::CertificateDer::pem_file_iter(bundle)
                .map_err(|error| format!("https: reading the system's certificates ({bundle}): {error}"))?;
            let mut roots = rustls::RootCertStore::empty();
            for cert in certs.flatten() {
                let _ = roots.add(cert);
            }
            Ok(Arc::new(roots))
        })
        .clone()
}

/// A verifier that accepts any certificate (`tls_skip_verify`), still
/// checking the handshake's signatures.
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl NoVerify {
    fn new() -> NoVerify {
        let provider = rustls::crypto::CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
        NoVerify(provider)
    }
}

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Up to [`MAX_OUTPUT`] bytes of `stream`, as text; the rest is read and
/// dropped, so the command never blocks on a full pipe.
async fn read_capped(stream: Option<impl tokio::io::AsyncRead + Unpin>) -> String {
    use tokio::io::AsyncReadExt;
    let Some(mut stream) = stream else { return String::new() };
    let mut kept = Vec::new();
    let mut buffer = [0u8; 8192];
    while let Ok(read) = stream.read(&mut buffer).await {
        if read == 0 {
            break;
        }
        let room = MAX_OUTPUT.saturating_sub(kept.len());
        kept.extend_from_slice(&buffer[..read.min(room)]);
    }
    String::from_utf8_lossy(&kept).into_owned()
}

/// Runs a script check's command in the task's context; its exit code
/// and output (stdout, then stderr).
async fn script(
    argv: &[String],
    handle: &HandleState,
    env: &BTreeMap<String, String>,
    dir: &std::path::Path,
    user: Option<&str>,
    docker: Option<&Docker>,
) -> Result<(i64, String), String> {
    let Some((command, args)) = argv.split_first() else { return Err("the script check has no command".into()) };
    match handle {
        HandleState::Container(container) => {
            let docker =
                docker.ok_or("the docker driver is disabled: the script cannot run in the task's container")?;
            docker.exec(&container.id, argv.to_vec()).await
        }
        HandleState::Process(_) => {
            let mut process = tokio::process::Command::new(command);
            process
                .args(args)
                .env_clear()
                .envs(env)
                .current_dir(dir)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                // Dropped at the check's timeout: the command is killed.
                .kill_on_drop(true);
            if let Some(user) = user {
                // As the task runs: its user, not the agent's.
                let (uid, gid) =
                    crate::client::drivers::executor::lookup_user(user).map_err(|error| error.to_string())?;
                process.uid(uid).gid(gid);
            }
            let mut child = process.spawn().map_err(|error| format!("running {command:?}: {error}"))?;
            let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
            let (mut text, errors) = tokio::join!(read_capped(stdout), read_capped(stderr));
            let status = child.wait().await.map_err(|error| format!("waiting for {command:?}: {error}"))?;
            text.push_str(&errors);
            Ok((status.code().map_or(-1, i64::from), text))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::alloc_dir::AllocDir;
    use engine::structs::{
        AllocatedPort, CheckKind, EvalId, Job, JobType, NodeId, Resources, Service, ServiceCheck, TaskState, TaskStatus,
    };
    use std::path::Path;

    #[test]
    fn the_status_moves_after_enough_runs_in_a_row() {
        let mut tracker = Tracker::new(CheckResultStatus::Pending, 2, 3);
        assert_eq!(tracker.record(true), None, "one pass of two");
        assert_eq!(tracker.record(false), None, "a failure resets the passes");
        assert_eq!(tracker.record(true), None);
        assert_eq!(tracker.record(true), Some(CheckResultStatus::Success));
        assert_eq!(tracker.record(true), None, "no news while it keeps passing");
        assert_eq!((tracker.record(false), tracker.record(false)), (None, None));
        assert_eq!(tracker.record(false), Some(CheckResultStatus::Failure), "the third failure in a row");
        let mut eager = Tracker::new(CheckResultStatus::Success, 0, 0);
        assert_eq!(eager.record(false), Some(CheckResultStatus::Failure), "0 means one run");
    }

    #[test]
    fn check_restart_counts_failing_runs_after_its_grace() {
        let start = Instant::now();
        let policy = CheckRestart { limit: 2, grace: Duration::from_secs(5), ignore_warnings: false };
        let mut watch = RestartWatch::new(policy, start);
        let at = |secs| start + Duration::from_secs(secs);
        assert!(!watch.record(CheckResultStatus::Failure, at(1)) && !watch.record(CheckResultStatus::Failure, at(2)));
        assert!(!watch.record(CheckResultStatus::Failure, at(6)), "the first counted failure");
        assert!(!watch.record(CheckResultStatus::Success, at(7)), "a pass resets the count");
        assert!(!watch.record(CheckResultStatus::Failure, at(8)));
        assert!(watch.record(CheckResultStatus::Failure, at(9)), "the limit");
        assert!(!watch.record(CheckResultStatus::Failure, at(10)), "counting starts again");
    }

    fn plan_of(
        alloc: &Allocation,
        node: &Node,
        envs: &BTreeMap<String, TaskEnv>,
        states: &BTreeMap<String, TaskState>,
    ) -> Vec<PlannedCheck> {
        let registered = crate::client::services::registered(alloc, node, envs, states);
        plan(alloc, node, &registered, envs, &BTreeMap::new(), &EnvDenylist::default())
    }

    #[test]
    fn checks_follow_the_registered_services_and_reach_their_ports() {
        let mut job = Job::new_simple("shop", JobType::Service, 1, Resources::new(100, 64, 0));
        let group = &mut job.task_groups[0];
        let mut web = Service::new("web", "http");
        let mut http = ServiceCheck::new("root", CheckKind::Http, Duration::from_secs(1), Duration::from_secs(1));
        http.path = "health?from=${NOMAD_TASK_NAME}".into();
        let mut admin = ServiceCheck::new("admin", CheckKind::Tcp, Duration::from_secs(1), Duration::from_secs(1));
        admin.port_label = Some("admin".into());
        web.checks = vec![http, admin];
        group.services.push(web);
        let job = Arc::new(job);
        let mut alloc = Allocation::new_placement(&job, "group", 0, NodeId::from_u128(7), EvalId::from_u128(1));
        let port = |label: &str, value| AllocatedPort {
            label: Arc::from(label),
            value,
            to: 0,
            host_ip: Arc::from("10.0.0.5"),
        };
        alloc.ports = vec![port("http", 23456), port("admin", 23457)];
        let node = Node::new_ready(NodeId::from_u128(7), "dc1", "", Resources::new(1000, 1000, 1000));
        let dir = AllocDir::new(Path::new("/data"), alloc.id);
        let envs = BTreeMap::from([(
            "task".to_string(),
            TaskEnv::new(&alloc, &alloc.job.task_groups[0].tasks[0], &node, &dir),
        )]);
        let mut states = BTreeMap::from([("task".to_string(), TaskState::default())]);
        assert!(plan_of(&alloc, &node, &envs, &states).is_empty(), "nothing registered");
        states.get_mut("task").expect("the task").state = TaskStatus::Running;
        let planned = plan_of(&alloc, &node, &envs, &states);
        let [root, admin] = &planned[..] else { panic!("two checks: {planned:#?}") };
        let Probe::Http { address, port, path, method, .. } = &root.probe else { panic!("{root:?}") };
        assert_eq!(
            (address.as_str(), *port, path.as_str(), method.as_str()),
            ("10.0.0.5", 23456, "/health?from=task", "GET")
        );
        assert_eq!(admin.probe, Probe::Tcp { address: "10.0.0.5".into(), port: 23457 }, "its own port");
        assert_eq!((root.initial.status, root.initial.task.as_str()), (CheckResultStatus::Pending, ""), "a group's");
        assert_ne!(root.initial.id, admin.initial.id);
        assert_eq!(plan_of(&alloc, &node, &envs, &states)[0].initial.id, root.initial.id, "stable ids");
    }
}
