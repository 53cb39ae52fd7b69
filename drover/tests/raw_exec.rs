//! The `raw_exec` driver with real processes (`sh -c`, `sleep`, the
//! `drover` binary as executor) against a real server over QUIC on
//! loopback: restarts per policy and a reschedule once they run out, a
//! batch task that completes with its logs captured and rotated, a stop
//! that kills a whole process tree, a command that does not exist, and the
//! real `drover agent` binary re-attaching after it was killed.
//!
//! Waits are on the server's state (woken by each write), bounded by a
//! watchdog that only turns a hang into a failure. Two waits poll the file
//! system with a deadline, where nothing else tells: a task's child
//! writing its pid, and a collected allocation's directories going. Logs
//! are read through the server's API, which asks the agent.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::{bounded, server_options, temp_dir, until};
use drover::client::agent::{Agent, AgentSettings, NoObserver, TaskSettings};
use drover::client::drivers::isolation::Isolation;
use drover::client::drivers::raw_exec::RawExec;
use drover::client::drivers::Drivers;
use drover::server::RunningServer;
use engine::state::Snapshot;
use engine::structs::{
    Allocation, ClientStatus, ConfigValue, DelayFunction, Job, JobType, Node, NodeId, ReschedulePolicy, Resources,
    RestartMode, RestartPolicy, TaskEvent, TaskState, TaskStatus, RAW_EXEC,
};
use tokio::sync::watch;
use transport::client::ClientEndpoints;
use transport::tls::TlsMaterial;

/// A server (with its HTTP API, which reaches the agent over the agent's
/// connection) and an in-process agent with the real raw_exec driver.
struct Cluster {
    server: RunningServer,
    data_dir: PathBuf,
    api: drover::api::client::ApiClient,
    stop: watch::Sender<bool>,
    agent: tokio::task::JoinHandle<()>,
}

fn raw_exec_node(n: u128) -> Node {
    let mut node = Node::new_ready(NodeId::from_u128(n), "dc1", "", Resources::new(4_000, 4_096, 10_000));
    node.attributes.remove("driver.exec");
    node.attributes.insert("driver.raw_exec".into(), "1".into());
    node.computed_class = node.compute_class();
    node
}

async fn cluster(name: &str) -> Cluster {
    cluster_keeping(name, 50).await
}

/// A cluster whose agent keeps the directories of `gc_max_allocs` finished allocations.
async fn cluster_keeping(name: &str, gc_max_allocs: usize) -> Cluster {
    transport::install_crypto_provider();
    let (_ca, server_tls, client_tls) = TlsMaterial::dev_pair().expect("dev material");
    let mut options = server_options(0, &server_tls, Duration::from_secs(10));
    options.http = Some(drover::server::HttpOptions {
        bind: "127.0.0.1:0".parse().expect("addr"),
        tls: false,
        verify_clients: false,
        name: "raw-exec-test".into(),
        datacenter: "dc1".into(),
        acl_enabled: false,
        limits: drover::listener::HttpLimits::default(),
    });
    let server = RunningServer::start(options).expect("starts");
    let http = server.http_addr().expect("the HTTP API is served");
    let api = drover::api::client::ApiClient::new(&format!("http://{http}"), None, None).expect("client");
    let data_dir = temp_dir(name);
    let node = raw_exec_node(0x15);
    let (stop, stopped) = watch::channel(false);
    let tasks = TaskSettings {
        drivers: Drivers {
            raw_exec: Some(Arc::new(RawExec::new(Isolation::detect(), PathBuf::from(env!("CARGO_BIN_EXE_drover"))))),
            docker: None,
        },
        data_dir: data_dir.clone(),
        gc_max_allocs,
        stop_tasks_on_shutdown: true,
    };
    let endpoints = Arc::new(ClientEndpoints::bind(1, &client_tls).expect("client endpoint"));
    let quic = endpoints.own_config().expect("config");
    let mut settings = AgentSettings::new(vec![server.local_addr()]);
    settings.call_timeout = Duration::from_secs(5);
    let agent = Agent::new(node.clone(), settings, endpoints, quic, Arc::new(NoObserver)).with_tasks(tasks);
    let agent = tokio::spawn(async move { agent.run(stopped).await });
    Cluster { server, data_dir, api, stop, agent }
}

impl Cluster {
    async fn shut_down(self) {
        let _ = self.stop.send(true);
        bounded("the agent stops its tasks", self.agent).await.expect("agent task");
        self.server.shutdown().await;
        std::fs::remove_dir_all(&self.data_dir).expect("clean up");
    }
}

/// A job of one `raw_exec` task running `sh -c script`.
fn sh_job(id: &str, job_type: JobType, script: &str) -> Job {
    let mut job = Job::new_simple(id, job_type, 1, Resources::new(100, 64, 0));
    let task = &mut job.task_groups[0].tasks[0];
    task.driver = RAW_EXEC.into();
    task.config = BTreeMap::from([
        ("command".to_string(), ConfigValue::from("sh")),
        ("args".to_string(), ConfigValue::List(vec!["-c".into(), script.into()])),
    ]);
    job
}

fn allocs_of<'a>(snapshot: &'a Snapshot, job: &'a str) -> impl Iterator<Item = &'a Arc<Allocation>> + 'a {
    snapshot.allocs().filter(move |alloc| &*alloc.job_id == job)
}

/// The one allocation of `job` satisfying `holds`, once there is one.
async fn alloc_where(cluster: &Cluster, job: &str, what: &str, holds: impl Fn(&Allocation) -> bool) -> Arc<Allocation> {
    let snapshot = until(&cluster.server, what, |s| allocs_of(s, job).any(|alloc| holds(alloc))).await;
    let found = allocs_of(&snapshot, job).find(|alloc| holds(alloc)).expect("found").clone();
    found
}

fn task_state(alloc: &Allocation) -> &TaskState {
    alloc.task_states.get("task").expect("the task's state is reported")
}

fn event_types(state: &TaskState) -> Vec<&str> {
    state.events.iter().map(|event| event.event_type.as_str()).collect()
}

/// Whether `pid` runs (a zombie does not).
fn pid_alive(pid: i32) -> bool {
    rustix::process::Pid::from_raw(pid).is_some_and(drover::client::drivers::executor::is_running)
}

fn started_pid(state: &TaskState) -> i32 {
    let started = state.events.iter().rev().find(|event| event.event_type == TaskEvent::STARTED).expect("started");
    started.details["pid"].parse().expect("a pid")
}

/// `GET path` on the server's API, which asks the agent: status and body.
async fn http_get(cluster: &Cluster, path: &str) -> (u16, Vec<u8>) {
    let answer = cluster.api.get(path).await.expect("answered");
    (answer.status, answer.raw.to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_task_is_restarted_per_policy_then_fails_and_is_rescheduled() {
    let cluster = cluster("restarts").await;
    let mut job = sh_job("flaky", JobType::Service, "echo attempt; exit 3");
    let group = &mut job.task_groups[0];
    group.restart_policy = RestartPolicy {
        attempts: 2,
        interval: Duration::from_secs(600),
        delay: Duration::from_millis(50),
        mode: RestartMode::Fail,
    };
    group.reschedule_policy = Some(ReschedulePolicy {
        attempts: 1,
        interval: Duration::from_secs(3600),
        delay: Duration::ZERO,
        delay_function: DelayFunction::Constant,
        max_delay: Duration::ZERO,
        unlimited: false,
    });
    cluster.server.engine().jobs().register(job).expect("registers");

    let failed = alloc_where(&cluster, "flaky", "the first allocation failed", |alloc| {
        alloc.previous_allocation.is_none() && alloc.client_status == ClientStatus::Failed
    })
    .await;
    let state = task_state(&failed);
    assert_eq!((state.state, state.failed, state.restarts), (TaskStatus::Dead, true, 2), "{state:?}");
    let types = event_types(state);
    assert_eq!(types.iter().filter(|kind| **kind == TaskEvent::STARTED).count(), 3, "{types:?}");
    assert_eq!(types.iter().filter(|kind| **kind == TaskEvent::RESTARTING).count(), 2, "{types:?}");
    assert_eq!(types.last(), Some(&TaskEvent::NOT_RESTARTING), "{types:?}");
    let exits: Vec<Option<i64>> = state
        .events
        .iter()
        .filter(|event| event.event_type == TaskEvent::TERMINATED)
        .map(|event| event.exit_code)
        .collect();
    assert_eq!(exits, vec![Some(3); 3]);
    let last = state.events.last().expect("an event");
    assert!(last.display_message.contains("Exceeded allowed attempts 2"), "{last:?}");

    // Only now do the servers step in: the reschedule policy places a replacement.
    let replacement = alloc_where(&cluster, "flaky", "a replacement placed by the reschedule policy", |alloc| {
        alloc.previous_allocation == Some(failed.id)
    })
    .await;
    assert_ne!(replacement.id, failed.id);
    cluster.server.engine().jobs().deregister(&job_key("flaky"), false).expect("stops");
    cluster.shut_down().await;
}

fn job_key(id: &str) -> engine::structs::JobKey {
    engine::structs::JobKey { namespace: Arc::from(engine::structs::DEFAULT_NAMESPACE), id: Arc::from(id) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_task_completes_and_its_logs_are_captured_and_rotated() {
    let cluster = cluster("batch").await;
    // 2.5 MiB on stderr in files of 1 MiB, two kept.
    let script = "echo \"hello from $DROVER_TASK_NAME of $NOMAD_JOB_ID\"; head -c 2621440 /dev/zero | tr '\\0' x >&2; printf tail >&2";
    let mut job = sh_job("report", JobType::Batch, script);
    job.task_groups[0].tasks[0].logs = engine::structs::LogConfig { max_files: 2, max_file_size_mb: 1 };
    cluster.server.engine().jobs().register(job).expect("registers");

    let done = alloc_where(&cluster, "report", "the batch allocation complete", |alloc| {
        alloc.client_status == ClientStatus::Complete
    })
    .await;
    let state = task_state(&done);
    assert_eq!((state.state, state.failed, state.restarts), (TaskStatus::Dead, false, 0), "{state:?}");
    let exit = state.events.iter().find(|event| event.event_type == TaskEvent::TERMINATED).expect("terminated");
    assert_eq!(exit.exit_code, Some(0));
    assert!(state.started_at.is_some() && state.finished_at >= state.started_at);

    let logs = cluster.data_dir.join("alloc").join(done.id.to_string()).join("alloc").join("logs");
    assert_eq!(std::fs::read_to_string(logs.join("task.stdout.0")).expect("stdout"), "hello from task of report\n");
    let mut kept: Vec<String> = std::fs::read_dir(&logs)
        .expect("logs dir")
        .map(|entry| entry.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("task.stderr."))
        .collect();
    kept.sort();
    assert_eq!(kept, ["task.stderr.1", "task.stderr.2"], "rotated at 1 MiB, the oldest removed");
    assert_eq!(std::fs::metadata(logs.join("task.stderr.1")).expect("kept").len(), 1 << 20);
    assert_eq!(std::fs::metadata(logs.join("task.stderr.2")).expect("kept").len(), (512 << 10) + 4);

    // The servers serve them, read by the agent, as Nomad's do.
    let path = format!("/v1/client/fs/logs/{}?task=task&type=stderr&origin=end&offset=6&plain=true", done.id);
    let (status, body) = http_get(&cluster, &path).await;
    assert_eq!((status, body.as_slice()), (200, b"xxtail".as_slice()));
    let path = format!("/v1/client/fs/logs/{}?task=task&type=stdout", done.id);
    let (status, body) = http_get(&cluster, &path).await;
    let frame: serde_json::Value = serde_json::from_slice(&body).expect("a frame");
    assert_eq!((status, frame["File"].as_str()), (200, Some("alloc/logs/task.stdout.0")));
    let (status, body) = http_get(&cluster, &format!("/v1/client/fs/logs/{}?task=nope", done.id)).await;
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&body));
    cluster.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_a_job_kills_its_whole_process_tree_after_the_kill_timeout() {
    let cluster = cluster("stop").await;
    // The child ignores SIGTERM (and so does the sleep it runs); the
    // parent shell waits for it.
    let script = "sh -c 'trap \"\" TERM; echo $$ > \"$DROVER_ALLOC_DIR/child.pid\"; exec sleep 1000' & wait";
    let mut job = sh_job("stubborn", JobType::Service, script);
    let task = &mut job.task_groups[0].tasks[0];
    task.kill_signal = Some("SIGTERM".to_string());
    task.kill_timeout = Duration::from_millis(500);
    cluster.server.engine().jobs().register(job).expect("registers");

    let running =
        alloc_where(&cluster, "stubborn", "the task running", |alloc| alloc.client_status == ClientStatus::Running)
            .await;
    let leader = started_pid(task_state(&running));
    let pid_file = cluster.data_dir.join("alloc").join(running.id.to_string()).join("alloc").join("child.pid");
    let child: i32 = bounded("the child writes its pid", async {
        loop {
            if let Some(pid) = std::fs::read_to_string(&pid_file).ok().and_then(|text| text.trim().parse().ok()) {
                return pid;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(pid_alive(leader) && pid_alive(child));

    cluster.server.engine().jobs().deregister(&job_key("stubborn"), false).expect("stops");
    let stopped = alloc_where(&cluster, "stubborn", "the allocation stopped", |alloc| {
        alloc.id == running.id && alloc.client_status == ClientStatus::Complete
    })
    .await;
    let state = task_state(&stopped);
    let types = event_types(state);
    assert!(types.ends_with(&[TaskEvent::KILLING, TaskEvent::KILLED]), "{types:?}");
    assert_eq!(state.events.last().expect("killed").display_message, "Task killed after its kill timeout");
    assert!(!state.failed);
    assert!(!pid_alive(child), "the child that ignored SIGTERM was killed");
    assert!(!pid_alive(leader));
    let group = rustix::process::Pid::from_raw(leader).expect("pid");
    assert!(rustix::process::test_kill_process_group(group).is_err(), "no process of the group is left");
    cluster.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_command_does_not_exist_fails_with_a_clear_event() {
    let cluster = cluster("missing").await;
    let mut job = sh_job("typo", JobType::Batch, "");
    job.task_groups[0].tasks[0].config =
        BTreeMap::from([("command".to_string(), ConfigValue::from("drover-test-no-such-command"))]);
    cluster.server.engine().jobs().register(job).expect("registers");
    let failed =
        alloc_where(&cluster, "typo", "the allocation failed", |alloc| alloc.client_status == ClientStatus::Failed)
            .await;
    let state = task_state(&failed);
    assert_eq!((state.state, state.failed, state.restarts), (TaskStatus::Dead, true, 0));
    let failure =
        state.events.iter().find(|event| event.event_type == TaskEvent::DRIVER_FAILURE).expect("driver failure");
    assert!(
        failure.display_message.contains("executable file not found: \"drover-test-no-such-command\""),
        "{failure:?}"
    );
    assert_eq!(state.events.last().expect("event").display_message, "Error was unrecoverable");
    cluster.server.engine().jobs().deregister(&job_key("typo"), false).expect("stops");
    cluster.shut_down().await;
}

/// A real agent process, killed when dropped (a failed test too).
struct AgentChild(std::process::Child);

impl std::ops::Deref for AgentChild {
    type Target = std::process::Child;

    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for AgentChild {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for AgentChild {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The real `drover agent` binary, against `server`, with its TLS files in
/// `dir`, and credentials in its environment that no task may inherit.
fn spawn_agent(dir: &Path, server: SocketAddr) -> AgentChild {
    let files = ["ca.pem", "client.pem", "client-key.pem"].map(|name| dir.join(name));
    let child = common::agent_command(&server.to_string(), &files, &dir.join("data"))
        .env("AWS_SECRET_ACCESS_KEY", "agent-secret")
        .env("VAULT_TOKEN", "agent-vault-token")
        .env("INHERITED_BY_TASKS", "harmless")
        .args(["--raw-exec", "--log-level", "debug"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("agent-{}.log", rand_suffix()))).expect("log file"))
        .spawn()
        .expect("drover agent starts");
    AgentChild(child)
}

/// Kills whatever a test's real agent left behind in `data_dir` (a non-dev
/// agent leaves its tasks running when it stops, on purpose): every
/// executor and task group its state files name. Run when the test ends,
/// however it ends.
struct LeftTasks(PathBuf);

impl Drop for LeftTasks {
    fn drop(&mut self) {
        let Ok(allocs) = std::fs::read_dir(self.0.join("client/allocs")) else { return };
        for alloc in allocs.flatten() {
            let Ok(bytes) = std::fs::read(alloc.path().join("state.json")) else { continue };
            let Ok(saved) = serde_json::from_slice::<serde_json::Value>(&bytes) else { continue };
            for task in saved["tasks"].as_object().into_iter().flat_map(|tasks| tasks.values()) {
                let pid = |key: &str| rustix::process::Pid::from_raw(task["handle"][key].as_i64()? as i32);
                if let Some(executor) = pid("executor_pid") {
                    let _ = rustix::process::kill_process(executor, rustix::process::Signal::KILL);
                }
                if let Some(group) = pid("task_pid") {
                    let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
                }
            }
        }
    }
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_nanos() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restart_reattaches_to_a_running_task_and_restarts_a_lost_one_in_place() {
    transport::install_crypto_provider();
    let dir = temp_dir("reattach");
    let (_ca, server_tls, client_tls) = TlsMaterial::dev_pair().expect("dev material");
    for (name, text) in [
        ("ca.pem", &client_tls.ca_pem),
        ("client.pem", &client_tls.identity.cert_pem),
        ("client-key.pem", &client_tls.identity.key_pem),
    ] {
        std::fs::write(dir.join(name), text).expect("tls file");
    }
    let server = RunningServer::start(server_options(0, &server_tls, Duration::from_secs(30))).expect("starts");
    let _left = LeftTasks(dir.join("data"));
    let mut agent = spawn_agent(&dir, server.local_addr());
    let script = "env > \"$DROVER_ALLOC_DIR/env\"; echo started >> \"$DROVER_ALLOC_DIR/starts\"; exec sleep 1000";
    server.engine().jobs().register(sh_job("steady", JobType::Service, script)).expect("registers");
    let mut doomed_job = sh_job("doomed", JobType::Service, "exec sleep 1000");
    doomed_job.task_groups[0].restart_policy.delay = Duration::from_millis(50);
    server.engine().jobs().register(doomed_job).expect("registers");
    let running = |job: &'static str| {
        move |s: &Snapshot| {
            allocs_of(s, job).any(|a| a.task_states.get("task").is_some_and(|t| t.state == TaskStatus::Running))
        }
    };
    let before = until(&server, "both tasks running", |s| running("steady")(s) && running("doomed")(s)).await;
    let steady = allocs_of(&before, "steady").next().expect("placed").clone();
    let doomed = allocs_of(&before, "doomed").next().expect("placed").clone();
    let steady_pid = started_pid(task_state(&steady));
    let alloc_dir = dir.join("data/alloc").join(steady.id.to_string());
    let env = std::fs::read_to_string(alloc_dir.join("alloc/env")).expect("the task's environment");
    assert!(env.contains("INHERITED_BY_TASKS=harmless"), "the agent's environment is inherited:\n{env}");
    assert!(!env.contains("agent-secret") && !env.contains("agent-vault-token"), "credentials leaked:\n{env}");
    let client_dir = dir.join("data/client/allocs").join(steady.id.to_string());
    let launch = std::fs::read_to_string(client_dir.join("task.launch.json")).expect("launch spec");
    assert!(!launch.contains("agent-secret"), "{launch}");
    for (path, mode) in [(client_dir.clone(), 0o700), (client_dir.join("task.launch.json"), 0o600)] {
        let found = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).expect("exists").permissions());
        assert_eq!(found & 0o777, mode, "{}", path.display());
    }

    // The agent dies; meanwhile the other task and its executor die too,
    // leaving no exit record.
    agent.kill().expect("SIGKILL the agent");
    agent.wait().expect("reaped");
    let state_file = dir.join("data/client/allocs").join(doomed.id.to_string()).join("state.json");
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&state_file).expect("state file")).expect("json");
    let handle = &saved["tasks"]["task"]["handle"];
    for (key, group) in [("executor_pid", false), ("task_pid", true)] {
        let pid = rustix::process::Pid::from_raw(handle[key].as_i64().expect("pid") as i32).expect("pid");
        let killed = if group {
            rustix::process::kill_process_group(pid, rustix::process::Signal::KILL)
        } else {
            rustix::process::kill_process(pid, rustix::process::Signal::KILL)
        };
        killed.expect("kill");
    }

    let mut agent = spawn_agent(&dir, server.local_addr());
    let after = until(&server, "the running task re-attached and the lost one restarted", |s| {
        let reattached = s
            .alloc(steady.id)
            .is_some_and(|a| task_state(a).events.iter().any(|event| event.event_type == TaskEvent::REATTACHED));
        let restarted = s.alloc(doomed.id).is_some_and(|a| {
            let state = task_state(a);
            a.client_status == ClientStatus::Running && state.restarts == 1 && state.state == TaskStatus::Running
        });
        reattached && restarted
    })
    .await;
    let steady_now = after.alloc(steady.id).expect("kept");
    assert_eq!(steady_now.client_status, ClientStatus::Running);
    let state = task_state(steady_now);
    assert_eq!(event_types(state).iter().filter(|kind| **kind == TaskEvent::STARTED).count(), 1, "not started twice");
    assert_eq!(started_pid(state), steady_pid);
    assert!(pid_alive(steady_pid), "the same process runs on");
    assert_eq!(std::fs::read_to_string(alloc_dir.join("alloc/starts")).expect("starts"), "started\n");
    // As Nomad: the task that died while the agent was away is restarted
    // in place by its restart policy, in the same allocation.
    let lost = task_state(after.alloc(doomed.id).expect("kept"));
    assert!(!lost.failed, "{lost:?}");
    let types = event_types(lost);
    assert_eq!(types.iter().filter(|kind| **kind == TaskEvent::STARTED).count(), 2, "{types:?}");
    assert!(types.contains(&TaskEvent::RESTARTING), "{types:?}");
    let exit = lost.events.iter().rev().find(|event| event.event_type == TaskEvent::TERMINATED).expect("terminated");
    assert_eq!(exit.exit_code, None, "unknown: nothing recorded it");
    assert!(pid_alive(started_pid(lost)));

    // The re-attached task is still the agent's to stop.
    server.engine().jobs().deregister(&job_key("steady"), false).expect("stops");
    until(&server, "the re-attached task stopped", |s| {
        s.alloc(steady.id).is_some_and(|a| a.client_status == ClientStatus::Complete)
    })
    .await;
    assert!(!pid_alive(steady_pid));
    server.engine().jobs().deregister(&job_key("doomed"), false).expect("stops");
    until(&server, "the restarted task stopped", |s| {
        s.alloc(doomed.id).is_some_and(|a| a.client_status == ClientStatus::Complete)
    })
    .await;
    let _ = std::process::Command::new("kill").args(["-TERM", &agent.id().to_string()]).status();
    bounded("the agent exits", tokio::task::spawn_blocking(move || agent.wait())).await.expect("waiter").expect("exit");
    server.shutdown().await;
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// The processes now running (not zombies) whose command line holds `marker`.
fn processes_with(marker: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).contains(marker) && pid_alive(*pid)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_executor_leaves_exactly_one_copy_of_its_task() {
    let cluster = cluster("executor-killed").await;
    let marker = format!("drover-test-one-copy-{}", rand_suffix());
    let mut job = sh_job("single", JobType::Service, &format!("exec sh -c 'sleep 1000; : {marker}'"));
    job.task_groups[0].restart_policy.delay = Duration::from_millis(50);
    cluster.server.engine().jobs().register(job).expect("registers");
    let running = alloc_where(&cluster, "single", "the task running", |alloc| {
        alloc.task_states.get("task").is_some_and(|state| state.state == TaskStatus::Running)
    })
    .await;
    let first = processes_with(&marker);
    assert_eq!(first.len(), 1, "one copy runs: {first:?}");

    let state_file = cluster.data_dir.join("client/allocs").join(running.id.to_string()).join("state.json");
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&state_file).expect("state file")).expect("json");
    let executor = saved["tasks"]["task"]["handle"]["executor_pid"].as_i64().expect("executor pid") as i32;
    let executor = rustix::process::Pid::from_raw(executor).expect("pid");
    rustix::process::kill_process(executor, rustix::process::Signal::KILL).expect("kill -9 the executor");

    let restarted = alloc_where(&cluster, "single", "the task restarted", |alloc| {
        alloc.task_states.get("task").is_some_and(|state| state.restarts == 1 && state.state == TaskStatus::Running)
    })
    .await;
    let now = processes_with(&marker);
    assert_eq!(now.len(), 1, "exactly one copy after the restart: {now:?}");
    assert!(!now.contains(&first[0]), "the orphaned copy was killed, a new one started");
    assert_eq!(restarted.id, running.id, "restarted in place");

    cluster.server.engine().jobs().deregister(&job_key("single"), false).expect("stops");
    alloc_where(&cluster, "single", "the job stopped", |alloc| alloc.client_status == ClientStatus::Complete).await;
    assert_eq!(processes_with(&marker), Vec::<i32>::new(), "nothing left after the stop");
    cluster.shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_allocation_beyond_gc_max_allocs_loses_its_directories() {
    let cluster = cluster_keeping("gc", 0).await;
    cluster.server.engine().jobs().register(sh_job("brief", JobType::Batch, "echo done")).expect("registers");
    let done = alloc_where(&cluster, "brief", "the batch allocation complete", |alloc| {
        alloc.client_status == ClientStatus::Complete
    })
    .await;
    let alloc_dir = cluster.data_dir.join("alloc").join(done.id.to_string());
    let client_dir = cluster.data_dir.join("client/allocs").join(done.id.to_string());
    // Nothing announces the removal; look until the deadline.
    bounded("the allocation's directories removed", async {
        while alloc_dir.exists() || client_dir.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let (status, _) = http_get(&cluster, &format!("/v1/client/fs/logs/{}?task=task", done.id)).await;
    assert_eq!(status, 404, "its logs are gone with it");
    cluster.shut_down().await;
}
