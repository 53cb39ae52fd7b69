//! The HTTP API of a real `drover server --dev` process on loopback ports it
//! picks, with a real agent (the library's, with the mock driver) over
//! QUIC: every endpoint, blocking queries, prefix matching and the error
//! paths. Waits are on the API's own blocking queries; a watchdog only turns
//! a hang into a failure.

use std::net::SocketAddr;
use std::sync::Arc;

mod common;

use common::bounded;
use drover::api::client::{ApiClient, ApiResponse};
use drover::client::agent::{Agent, AgentSettings, NoObserver};
use engine::structs::{Node, NodeId, Resources};
use serde_json::{json, Value};
use tokio::sync::watch;
use transport::client::ClientEndpoints;
use transport::tls::TlsMaterial;

/// A `drover server --dev` child process, killed when dropped.
struct DevServer {
    child: std::process::Child,
    rpc: SocketAddr,
    api: ApiClient,
    dir: std::path::PathBuf,
}

impl Drop for DevServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn start_server(name: &str) -> DevServer {
    start_server_with(name, &[]).await
}

async fn start_server_with(name: &str, extra: &[&str]) -> DevServer {
    let dir = std::env::temp_dir().join(format!("drover-http-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_drover"))
        .args(["server", "--dev", "--bind", "127.0.0.1", "--port", "0", "--http-port", "0", "--print-address"])
        .args(["--workers", "1", "--data-dir"])
        .arg(&dir)
        .args(extra)
        .args(["--log-level", "warn"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("drover server starts");
    let (rpc, http) = common::printed_addresses(&mut child).await;
    let rpc: SocketAddr = rpc.parse().expect("address");
    let api = ApiClient::new(&format!("http://{http}"), None, None).expect("client");
    DevServer { child, rpc, api, dir }
}

/// An agent with the mock driver, connected to the dev server.
fn start_agent(server: &DevServer, n: u128) -> watch::Sender<bool> {
    let tls_dir = server.dir.join("dev-tls");
    let tls =
        TlsMaterial::from_files(&tls_dir.join("ca.pem"), &tls_dir.join("client.pem"), &tls_dir.join("client-key.pem"))
            .expect("dev client material");
    let mut node = Node::new_ready(NodeId::from_u128(n), "dc1", "", Resources::new(4_000, 4_096, 10_000));
    node.attributes.remove("driver.exec");
    node.attributes.insert("driver.mock".into(), "1".into());
    node.computed_class = node.compute_class();
    let endpoints = Arc::new(ClientEndpoints::bind(1, &tls).expect("client endpoint"));
    let quic = endpoints.own_config().expect("config");
    let agent = Agent::new(node, AgentSettings::new(vec![server.rpc]), endpoints, quic, Arc::new(NoObserver));
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(async move { agent.run(stopped).await });
    stop
}

/// Nomad's CLI JSON for a job: every unset field `null`.
fn cli_job(id: &str, count: u32) -> Value {
    json!({"Job": {"Region": null, "Namespace": null, "ID": id, "Name": id, "Type": "service", "Priority": null,
        "Datacenters": ["dc1"], "Constraints": null, "Affinities": null, "Spreads": null,
        "TaskGroups": [{"Name": "web", "Count": count, "Constraints": null, "Affinities": null,
            "Tasks": [{"Name": "server", "Driver": "mock", "User": "", "Config": {"run_for": "1h"},
                "Resources": {"CPU": 100, "MemoryMB": 64, "DiskMB": null}, "Env": null, "KillTimeout": null,
                "Services": null, "Meta": null}],
            "RestartPolicy": null, "ReschedulePolicy": null, "EphemeralDisk": {"SizeMB": 10},
            "Consul": {"Namespace": "team"}}],
        "Update": null, "Periodic": null, "Meta": null, "Stop": null, "Version": null, "SubmitTime": null},
        "Region": "", "Namespace": "", "SecretID": ""})
}

/// Blocks on `path` (a blocking query from `index`) until `done` holds.
async fn until(api: &ApiClient, path: &str, what: &str, done: impl Fn(&Value) -> bool) -> (Value, u64) {
    bounded(what, async {
        let mut index = 0;
        loop {
            let separator = if path.contains('?') { '&' } else { '?' };
            let answer = api.get(&format!("{path}{separator}index={index}&wait=30s")).await.expect("request");
            let value = answer.json().expect("200 JSON");
            let seen = answer.index.expect("X-Nomad-Index on reads");
            assert!(seen >= 1, "the index is never 0");
            if done(&value) {
                return (value, seen);
            }
            index = seen;
        }
    })
    .await
}

fn status(answer: &ApiResponse) -> u16 {
    answer.status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nomad_api_serves_jobs_evals_allocs_nodes_and_the_agent() {
    transport::install_crypto_provider();
    let server = start_server("api").await;
    let api = &server.api;
    let _agent = start_agent(&server, 7);
    let (nodes, _) = until(api, "/v1/nodes", "the node ready", |nodes| {
        nodes.as_array().is_some_and(|nodes| nodes.iter().any(|node| node["Status"] == "ready"))
    })
    .await;
    let node_id = nodes[0]["ID"].as_str().expect("node id").to_string();

    // Register as the CLI does (PUT, no content type, nulls everywhere).
    let answer = api.request("PUT", "/v1/jobs", Some(&cli_job("web", 2))).await.expect("register");
    let registered = answer.json().expect("registered");
    assert!(answer.index.is_some());
    let eval_id = registered["EvalID"].as_str().expect("eval id").to_string();
    assert_eq!(
        registered["Warnings"], "TaskGroup \"web\": Consul is not implemented by Drover and was ignored",
        "ignored fields are named"
    );
    // The eval is readable at once (the CLI's monitor reads it right away).
    let eval = api.get(&format!("/v1/evaluation/{eval_id}")).await.expect("eval").json().expect("eval json");
    assert_eq!((eval["JobID"].as_str(), eval["TriggeredBy"].as_str()), (Some("web"), Some("job-register")));

    let (allocs, _) = until(api, "/v1/job/web/allocations", "both allocations running", |allocs| {
        allocs
            .as_array()
            .is_some_and(|list| list.len() == 2 && list.iter().all(|alloc| alloc["ClientStatus"] == "running"))
    })
    .await;
    let alloc_id = allocs[0]["ID"].as_str().expect("alloc id").to_string();
    assert_eq!(allocs[0]["NodeID"], node_id.as_str());

    let job = api.get("/v1/job/web").await.expect("job").json().expect("job json");
    assert_eq!(
        (job["Type"].as_str(), job["Priority"].as_u64(), job["Status"].as_str()),
        (Some("service"), Some(50), Some("running"))
    );
    assert_eq!(job["TaskGroups"][0]["Tasks"][0]["Resources"]["MemoryMB"], 64);
    assert_eq!(job["TaskGroups"][0]["RestartPolicy"]["Attempts"], 2, "Nomad's service default");
    assert!(job["SubmitTime"].as_u64().is_some_and(|time| time > 0));
    let summary = api.get("/v1/job/web/summary").await.expect("summary").json().expect("summary json");
    assert_eq!(summary["Summary"]["web"]["Running"], 2);
    // A service job rolls out as a deployment (tests/deployments.rs follows them).
    let deployment = api.get("/v1/job/web/deployment").await.expect("deployment").json().expect("json");
    assert_eq!(
        (deployment["JobID"].as_str(), deployment["JobVersion"].as_u64()),
        (Some("web"), Some(0)),
        "{deployment}"
    );
    let evals = api.get("/v1/job/web/evaluations").await.expect("evals").json().expect("evals json");
    assert!(evals.as_array().is_some_and(|evals| evals.iter().any(|eval| eval["ID"] == eval_id.as_str())));
    let jobs = api.get("/v1/jobs?prefix=we").await.expect("jobs").json().expect("jobs json");
    assert_eq!(jobs[0]["JobSummary"]["Namespace"], "default");
    assert_eq!(api.get("/v1/jobs?prefix=zz").await.expect("jobs").json().expect("jobs json"), json!([]));

    // UUID prefixes: hyphens and case do not matter.
    let upper = alloc_id[..6].to_uppercase();
    let matched = api.get(&format!("/v1/allocations?prefix={upper}")).await.expect("allocs").json().expect("json");
    assert!(matched.as_array().is_some_and(|list| list.iter().any(|alloc| alloc["ID"] == alloc_id.as_str())));
    let alloc = api.get(&format!("/v1/allocation/{alloc_id}")).await.expect("alloc").json().expect("alloc json");
    assert_eq!((alloc["Job"]["Version"].as_u64(), alloc["TaskGroup"].as_str()), (Some(0), Some("web")));
    let by_eval = api.get(&format!("/v1/evaluation/{eval_id}/allocations")).await.expect("by eval");
    assert_eq!(by_eval.json().expect("json").as_array().map(Vec::len), Some(2));
    let node = api.get(&format!("/v1/node/{node_id}")).await.expect("node").json().expect("node json");
    assert_eq!((node["SecretID"].as_str(), node["Resources"]["CPU"].as_u64()), (Some(""), Some(4_000)));
    let on_node = api.get(&format!("/v1/node/{node_id}/allocations")).await.expect("node allocs");
    assert_eq!(on_node.json().expect("json").as_array().map(Vec::len), Some(2));
    let search = api
        .request("PUT", "/v1/search", Some(&json!({"Prefix": &alloc_id[..8], "Context": "all"})))
        .await
        .expect("search")
        .json()
        .expect("search json");
    assert_eq!(search["Matches"]["allocs"], json!([alloc_id.clone()]));

    // Agent, status and the worker API.
    let agent = api.get("/v1/agent/self").await.expect("self").json().expect("self json");
    assert!(agent["stats"]
        .as_object()
        .expect("stats")
        .values()
        .all(|section| { section.as_object().expect("section").values().all(Value::is_string) }));
    let leader = api.get("/v1/status/leader").await.expect("leader").json().expect("leader json");
    assert_eq!(leader, json!(server.rpc.to_string()));
    let members = api.get("/v1/agent/members").await.expect("members").json().expect("members json");
    let member = &members["Members"][0];
    assert_eq!(
        format!("{}:{}", member["Addr"].as_str().expect("addr"), member["Tags"]["port"].as_str().expect("port")),
        server.rpc.to_string()
    );
    assert_eq!(
        api.get("/v1/status/peers").await.expect("peers").json().expect("json"),
        json!([server.rpc.to_string()])
    );
    assert_eq!(api.get("/v1/agent/health").await.expect("health").status, 200);
    let metrics = api.get("/v1/metrics").await.expect("metrics").json().expect("metrics json");
    let gauge =
        |name: &str| metrics["Gauges"].as_array().and_then(|gauges| gauges.iter().find(|g| g["Name"] == name).cloned());
    assert_eq!(gauge("drover.heartbeat.active").expect("heartbeat gauge")["Value"], 1.0);
    assert_eq!(gauge("drover.quic.connections_open").expect("connections gauge")["Value"], 1.0);
    let text = api.get("/v1/metrics?format=prometheus").await.expect("prometheus").body;
    assert!(text.contains("# TYPE drover_broker_total_ready gauge\ndrover_broker_total_ready 0\n"), "{text}");
    assert!(text.contains("drover_broker_ready{scheduler=\"service\"}"), "{text}");
    let config = json!({"num_schedulers": 2, "enabled_schedulers": ["service", "batch", "_core"]});
    let resized = api.request("PUT", "/v1/agent/schedulers/config", Some(&config)).await.expect("config");
    assert_eq!(resized.json().expect("json")["num_schedulers"], 2);
    let workers = api.get("/v1/agent/schedulers").await.expect("workers").json().expect("json");
    assert_eq!(workers["schedulers"].as_array().map(Vec::len), Some(2));
    assert_eq!(workers["schedulers"][0]["enabled_schedulers"], json!(["service", "batch", "_core"]));

    // Scale, eligibility, then stop: the allocations stop.
    let scale = json!({"Count": 3, "Target": {"Group": "web"}, "Message": "more"});
    assert_eq!(status(&api.request("POST", "/v1/job/web/scale", Some(&scale)).await.expect("scale")), 200);
    until(api, "/v1/job/web/allocations", "three running", |allocs| {
        allocs
            .as_array()
            .is_some_and(|list| list.iter().filter(|alloc| alloc["ClientStatus"] == "running").count() == 3)
    })
    .await;
    let ineligible = json!({"Eligibility": "ineligible"});
    let path = format!("/v1/node/{node_id}/eligibility");
    assert_eq!(status(&api.request("PUT", &path, Some(&ineligible)).await.expect("eligibility")), 200);
    let node = api.get(&format!("/v1/node/{node_id}")).await.expect("node").json().expect("json");
    assert_eq!(node["SchedulingEligibility"], "ineligible");
    let stopped = api.request("DELETE", "/v1/job/web?purge=False", None).await.expect("stop").json().expect("json");
    assert!(stopped["EvalID"].as_str().is_some_and(|id| !id.is_empty()));
    until(api, "/v1/job/web/allocations", "every allocation stopped", |allocs| {
        allocs.as_array().is_some_and(|list| list.iter().all(|alloc| alloc["DesiredStatus"] == "stop"))
    })
    .await;
    let job = api.get("/v1/job/web").await.expect("job").json().expect("json");
    assert_eq!(job["Stop"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_queries_wake_on_a_write_and_time_out_with_the_same_index() {
    transport::install_crypto_provider();
    let server = start_server("blocking").await;
    let api = server.api.clone();
    api.request("PUT", "/v1/jobs", Some(&cli_job("blocked", 1))).await.expect("register").json().expect("ok");
    let read = api.get("/v1/job/blocked").await.expect("job");
    let index = read.index.expect("index");

    // A timeout answers 200 with the same index.
    let timed_out = api.get(&format!("/v1/job/blocked?index={index}&wait=50ms")).await.expect("times out");
    assert_eq!((timed_out.status, timed_out.index), (200, Some(index)));

    // A query waiting on the job is woken by a write to it.
    let waiting = {
        let api = api.clone();
        tokio::spawn(async move { api.get(&format!("/v1/job/blocked?index={index}&wait=60s")).await })
    };
    bounded("the query to wait", async {
        loop {
            let agent = api.get("/v1/agent/self").await.expect("self").json().expect("json");
            if agent["stats"]["drover"]["index_waiters"] != "0" {
                break;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    let scale = json!({"Count": 0, "Target": {"Group": "web"}});
    api.request("PUT", "/v1/job/blocked/scale", Some(&scale)).await.expect("scale").json().expect("ok");
    let woken = bounded("the woken query", waiting).await.expect("task").expect("answer");
    assert!(woken.index.expect("index") > index);
    assert_eq!(woken.json().expect("json")["TaskGroups"][0]["Count"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_nomads_codes_and_write_nothing() {
    transport::install_crypto_provider();
    let server = start_server("errors").await;
    let api = &server.api;
    let before = api.get("/v1/jobs").await.expect("jobs").index.expect("index");
    let send = |method: &'static str, path: &'static str, body: &'static str| async move {
        api.send(method, path, hyper::body::Bytes::from(body)).await.expect("answer")
    };
    let malformed = send("PUT", "/v1/jobs", "{\"Job\": {").await;
    assert_eq!(malformed.status, 400, "{}", malformed.body);
    assert!(!malformed.body.contains('\n'));
    assert_eq!(send("PUT", "/v1/jobs", "").await.status, 400);
    assert_eq!(send("PUT", "/v1/jobs", "{}").await.body, "Job must be specified");
    assert_eq!(send("PUT", "/v1/jobs", "{\"Job\": {\"ID\": \"x\", \"Type\": \"daemon\"}}").await.status, 400);
    let invalid = send("PUT", "/v1/jobs", "{\"Job\": {\"ID\": \"x\", \"TaskGroups\": []}}").await;
    assert_eq!(invalid.status, 500, "Nomad answers validation errors with 500");
    assert!(invalid.body.contains("datacenters"), "{}", invalid.body);
    for bad in ["/tmp/x/escaped", "../../x", ".."] {
        let mut job = cli_job("paths", 1);
        job["Job"]["TaskGroups"][0]["Tasks"][0]["Name"] = json!(bad);
        let refused = api.request("PUT", "/v1/jobs", Some(&job)).await.expect("answer");
        assert_eq!(refused.status, 500, "{bad}: {}", refused.body);
        assert!(refused.body.contains("cannot"), "a task name {bad:?} would become a path: {}", refused.body);
    }
    let mismatch = api.request("PUT", "/v1/job/other", Some(&cli_job("web", 1))).await.expect("answer");
    assert_eq!((mismatch.status, mismatch.body.as_str()), (400, "Job ID does not match name"));
    // A job id that ends in a sub-path reaches that sub-path's handler and
    // is never registered (here the plan of job `probe`, whose body names
    // another job); every sub-path Drover lacks says so, naming it.
    let probe = api.request("PUT", "/v1/job/probe/plan", Some(&cli_job("probe/plan", 1))).await.expect("answer");
    assert_eq!((probe.status, probe.body.as_str()), (400, "Job ID does not match"));
    for suffix in ["submission", "actions"] {
        let path = format!("/v1/job/web/{suffix}");
        let answer = api.send("PUT", &path, hyper::body::Bytes::from("{}")).await.expect("answer");
        assert_eq!(answer.status, 501, "{path}: {}", answer.body);
        assert!(answer.body.contains(&format!("/{suffix} is not implemented")), "{path}: {}", answer.body);
    }
    // Dispatch and force launch are served (tests/periodic.rs): of a job
    // that does not exist, Nomad's refusals.
    let dispatch = api.send("PUT", "/v1/job/web/dispatch", hyper::body::Bytes::from("{}")).await.expect("answer");
    assert_eq!((dispatch.status, dispatch.body.as_str()), (500, "parameterized job not found"));
    let force = api.send("PUT", "/v1/job/web/periodic/force", hyper::body::Bytes::new()).await.expect("answer");
    assert_eq!((force.status, force.body.as_str()), (404, "job not found"));
    // The job versions' sub-paths are served (tests/job_versions.rs): a
    // body naming no job is refused, a write to the versions is no method.
    for suffix in ["revert", "stable"] {
        let path = format!("/v1/job/web/{suffix}");
        let answer = api.send("PUT", &path, hyper::body::Bytes::from("{}")).await.expect("answer");
        assert_eq!((answer.status, answer.body.as_str()), (400, "Job ID does not match"), "{path}");
    }
    let versions = api.send("PUT", "/v1/job/web/versions", hyper::body::Bytes::from("{}")).await.expect("answer");
    assert_eq!(versions.status, 405, "{}", versions.body);
    let deployments = api.get("/v1/job/web/deployments").await.expect("answer");
    assert_eq!(deployments.json().expect("json"), json!([]));
    let services = api.get("/v1/job/web/services").await.expect("answer");
    assert_eq!((services.status, services.body.trim()), (404, "job not found"), "as Nomad, for a job it does not know");
    let mut cron = cli_job("cron", 1);
    cron["Job"]["Periodic"] = json!({"Spec": "*/5 * * * *", "SpecType": "cron", "Enabled": true});
    let refused = api.request("PUT", "/v1/jobs", Some(&cron)).await.expect("answer");
    assert_eq!(refused.status, 500, "{}", refused.body);
    assert!(refused.body.contains("Periodic can only be used with \"batch\""), "a periodic service: {}", refused.body);
    let huge = format!("{{\"Job\": {{\"ID\": \"{}\"}}}}", "x".repeat(5 * 1024 * 1024));
    assert_eq!(api.send("PUT", "/v1/jobs", huge.into()).await.expect("answer").status, 413);

    let missing = api.get("/v1/job/nope").await.expect("answer");
    assert_eq!((missing.status, missing.body.as_str()), (404, "job not found"));
    assert_eq!(api.get("/v1/evaluation/not-a-uuid").await.expect("answer").status, 404);
    let unknown = "/v1/allocation/00000000-0000-4000-8000-000000000000";
    assert_eq!(api.get(unknown).await.expect("answer").status, 404);
    assert_eq!(api.get("/v1/node/00000000-0000-4000-8000-000000000000").await.expect("answer").status, 404);
    assert_eq!(api.get("/v1/nothing/here").await.expect("answer").status, 404);
    // A Nomad endpoint Drover does not serve is 501 naming it, never 404.
    let join = send("PUT", "/v1/agent/join?address=10.0.0.1", "").await;
    assert_eq!(join.status, 501);
    assert!(join.body.contains("/v1/agent/join") && join.body.contains("add-voter"), "{}", join.body);
    assert_eq!(send("PUT", "/v1/agent/servers", "").await.status, 501, "a server has no client servers to set");
    let servers = api.get("/v1/agent/servers").await.expect("answer").json().expect("a list");
    assert_eq!(servers.as_array().map(Vec::len), Some(1), "{servers}");
    assert_eq!(api.get("/v1/scaling/policies").await.expect("answer").json().expect("a list"), json!([]));
    assert_eq!(api.get("/v1/jobs?index=x").await.expect("answer").body, "Invalid index");
    assert_eq!(api.get("/v1/jobs?index=1&wait=60").await.expect("answer").body, "Invalid wait time");
    assert_eq!(api.get("/v1/job/nope?purge=maybe").await.expect("answer").status, 404);
    assert_eq!(send("DELETE", "/v1/job/nope?purge=maybe", "").await.status, 400);
    assert_eq!(send("PATCH", "/v1/job/x", "").await.status, 405);
    let no_node = api.get("/v1/client/stats").await.expect("answer");
    assert_eq!(no_node.status, 400, "never an empty 200: {}", no_node.body);
    assert!(no_node.body.contains("node_id"), "{}", no_node.body);
    let unknown_node = api.get("/v1/client/stats?node_id=00000000-0000-4000-8000-000000000000").await.expect("answer");
    assert_eq!(unknown_node.status, 404, "{}", unknown_node.body);
    let acl_off = api.get("/v1/acl/tokens").await.expect("answer");
    assert_eq!((acl_off.status, acl_off.body.as_str()), (400, "ACL support disabled"));
    assert_eq!(send("POST", "/v1/acl/bootstrap", "").await.body, "ACL support disabled");
    let bad_config =
        send("PUT", "/v1/agent/schedulers/config", "{\"num_schedulers\": 1, \"enabled_schedulers\": [\"service\"]}");
    assert_eq!(bad_config.await.body, "Invalid request");

    let after = api.get("/v1/jobs").await.expect("jobs");
    assert_eq!(after.index, Some(before), "nothing was written");
    assert_eq!(after.json().expect("json"), json!([]));
}

/// `acl.enabled`: open paths stay open, everything else needs a token whose
/// policies grant it; bootstrap once; tokens created, used and revoked; a
/// refused write writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_tokens_and_policies_guard_every_endpoint() {
    transport::install_crypto_provider();
    let server = start_server_with("acl", &["--acl-enabled"]).await;
    let anonymous = &server.api;
    let address = format!("http://{}", anonymous_address(&server));
    let as_token = |secret: &str| ApiClient::new(&address, Some(secret.to_string()), None).expect("client");

    let refused = anonymous.get("/v1/jobs").await.expect("answer");
    assert_eq!((refused.status, refused.body.as_str()), (403, "Permission denied"));
    assert_eq!(status(&anonymous.get("/v1/agent/health").await.expect("answer")), 200);
    assert_eq!(status(&anonymous.get("/v1/status/leader").await.expect("answer")), 200);
    assert_eq!(status(&anonymous.get("/v1/metrics").await.expect("answer")), 200);
    let unknown = as_token("00000000-0000-4000-8000-000000000000").get("/v1/jobs").await.expect("answer");
    assert_eq!((unknown.status, unknown.body.as_str()), (403, "ACL token not found"));
    assert_eq!(as_token("not-a-uuid").get("/v1/nodes").await.expect("answer").status, 403);

    let bootstrap = anonymous.request("POST", "/v1/acl/bootstrap", None).await.expect("answer").json().expect("token");
    assert_eq!(bootstrap["Type"], "management");
    let management = as_token(bootstrap["SecretID"].as_str().expect("secret"));
    let again = anonymous.request("POST", "/v1/acl/bootstrap", None).await.expect("answer");
    assert_eq!(again.status, 400);
    assert!(again.body.contains("ACL bootstrap already done"), "{}", again.body);

    // A lost management token: Nomad's reset, the refused bootstrap's
    // reset index written to a file in the server's data dir.
    let reset_index = again.body.rsplit_once("reset index: ").and_then(|(_, rest)| rest.strip_suffix(')'));
    let reset_index: u64 = reset_index.and_then(|index| index.parse().ok()).expect("the refusal names the reset index");
    let reset_file = server.dir.join("server/acl-bootstrap-reset");
    std::fs::write(&reset_file, (reset_index + 1).to_string()).expect("a wrong reset index");
    let wrong = anonymous.request("POST", "/v1/acl/bootstrap", None).await.expect("answer");
    assert_eq!(wrong.status, 400, "{}", wrong.body);
    std::fs::write(&reset_file, format!("{reset_index}\n")).expect("the reset index");
    let reset = anonymous.request("POST", "/v1/acl/bootstrap", None).await.expect("answer");
    assert_eq!(reset.status, 200, "{}", reset.body);
    let second = reset.json().expect("token");
    assert_ne!(second["SecretID"], bootstrap["SecretID"]);
    assert_eq!(
        as_token(second["SecretID"].as_str().expect("secret")).get("/v1/acl/tokens").await.expect("a").status,
        200
    );
    let once = anonymous.request("POST", "/v1/acl/bootstrap", None).await.expect("answer");
    assert_eq!(once.status, 400, "the same reset index works once: {}", once.body);
    std::fs::remove_file(&reset_file).expect("reset file");

    let rules = "namespace \"default\" {\n  policy = \"read\"\n}\nnode {\n  policy = \"read\"\n}\n";
    let policy = json!({"Name": "readonly", "Description": "reads", "Rules": rules});
    assert_eq!(management.request("PUT", "/v1/acl/policy/readonly", Some(&policy)).await.expect("answer").status, 200);
    let writer_rules = json!({"Name": "deployer", "Rules": "namespace \"*\" { policy = \"write\" }"});
    assert_eq!(
        management.request("PUT", "/v1/acl/policy/deployer", Some(&writer_rules)).await.expect("answer").status,
        200
    );
    let bad = json!({"Rules": "namespace \"default\" { capabilities = [\"submit-jobs\"] }"});
    let bad = management.request("PUT", "/v1/acl/policy/bad", Some(&bad)).await.expect("answer");
    assert_eq!(bad.status, 400);
    assert!(bad.body.contains("unknown capability \"submit-jobs\""), "{}", bad.body);

    let create = |policies: Value| {
        let management = &management;
        async move {
            let body = json!({"Name": "ci", "Type": "client", "Policies": policies});
            management.request("POST", "/v1/acl/token", Some(&body)).await.expect("answer")
        }
    };
    let no_such = create(json!(["nope"])).await;
    assert_eq!(no_such.status, 400);
    assert!(no_such.body.contains("nope"), "{}", no_such.body);
    let reader = create(json!(["readonly"])).await.json().expect("token");
    let reader_client = as_token(reader["SecretID"].as_str().expect("secret"));
    let deployer = create(json!(["deployer"])).await.json().expect("token");
    let deployer_client = as_token(deployer["SecretID"].as_str().expect("secret"));

    let before = reader_client.get("/v1/jobs").await.expect("answer");
    assert_eq!(before.status, 200);
    assert_eq!(status(&reader_client.get("/v1/nodes").await.expect("answer")), 200);
    let write = reader_client.request("PUT", "/v1/jobs", Some(&cli_job("web", 1))).await.expect("answer");
    assert_eq!((write.status, write.body.as_str()), (403, "Permission denied"));
    assert_eq!(status(&reader_client.get("/v1/agent/self").await.expect("answer")), 403, "no agent policy");
    assert_eq!(status(&reader_client.get("/v1/acl/tokens").await.expect("answer")), 403);
    assert_eq!(status(&reader_client.get("/v1/operator/snapshot").await.expect("answer")), 403);
    let own = reader_client.get("/v1/acl/token/self").await.expect("answer").json().expect("self");
    assert_eq!(own["AccessorID"], reader["AccessorID"]);

    let written = deployer_client.request("PUT", "/v1/jobs", Some(&cli_job("web", 1))).await.expect("answer");
    assert_eq!(written.status, 200, "{}", written.body);
    let jobs = reader_client.get("/v1/jobs").await.expect("answer").json().expect("jobs");
    assert_eq!(jobs.as_array().map(Vec::len), Some(1), "only the deployer's job: {jobs}");

    let listed = management.get("/v1/acl/tokens").await.expect("answer").json().expect("tokens");
    assert_eq!(listed.as_array().map(Vec::len), Some(4), "both management tokens and two clients");
    assert!(listed.as_array().into_iter().flatten().all(|token| token.get("SecretID").is_none()), "{listed}");

    // Revoked: refused at once.
    let accessor = reader["AccessorID"].as_str().expect("accessor");
    let revoke = management.request("DELETE", &format!("/v1/acl/token/{accessor}"), None).await.expect("answer");
    assert_eq!(revoke.status, 200);
    let after = reader_client.get("/v1/jobs").await.expect("answer");
    assert_eq!((after.status, after.body.as_str()), (403, "ACL token not found"));

    // The CLI with a token.
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_drover"))
        .args(["acl", "token", "list", "--address", &address])
        .env("DROVER_TOKEN", bootstrap["SecretID"].as_str().expect("secret"))
        .output()
        .expect("drover runs");
    let text = String::from_utf8_lossy(&cli.stdout);
    assert!(cli.status.success() && text.starts_with("Name") && text.contains("management"), "{text}");
    let denied = std::process::Command::new(env!("CARGO_BIN_EXE_drover"))
        .args(["job", "status", "--address", &address])
        .env_remove("DROVER_TOKEN")
        .env_remove("NOMAD_TOKEN")
        .output()
        .expect("drover runs");
    assert_eq!(denied.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&denied.stderr).contains("403"), "{}", String::from_utf8_lossy(&denied.stderr));
}

fn anonymous_address(server: &DevServer) -> String {
    server.api.authority()
}

/// The `drover agent --dev` binary (raw_exec and mock) against `server`,
/// its HTTP listener on a port it picks; killed when dropped.
struct AgentProcess(std::process::Child);

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_agent(server: &DevServer) -> AgentProcess {
    let child = common::dev_agent(&server.dir, &server.rpc.to_string(), &server.dir.join("agent"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("drover agent starts");
    AgentProcess(child)
}

/// The secret of a token for a new policy of `rules`, made with the management token.
async fn token_for(management: &ApiClient, name: &str, rules: &str) -> String {
    let policy = json!({"Name": name, "Rules": rules});
    let put = management.request("PUT", &format!("/v1/acl/policy/{name}"), Some(&policy)).await.expect("answer");
    assert_eq!(put.status, 200, "{}", put.body);
    let body = json!({"Name": name, "Type": "client", "Policies": [name]});
    let token = management.request("POST", "/v1/acl/token", Some(&body)).await.expect("answer").json().expect("token");
    token["SecretID"].as_str().expect("secret").to_string()
}

/// A rule for `default` is not escaped by naming another namespace (the
/// query's or the job's: 400 for one that does not exist, 403 for a job's
/// namespace the token has no rule for, as Nomad checks the token first),
/// and the servers serve a task's logs (read by its agent over its
/// connection) only to a token with `read-logs` (namespace `write`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_that_do_not_exist_are_refused_and_task_logs_need_read_logs() {
    transport::install_crypto_provider();
    let server = start_server_with("acl-logs", &["--acl-enabled"]).await;
    let address = format!("http://{}", anonymous_address(&server));
    let bootstrap = server.api.request("POST", "/v1/acl/bootstrap", None).await.expect("answer").json().expect("token");
    let secret = bootstrap["SecretID"].as_str().expect("secret").to_string();
    let management = ApiClient::new(&address, Some(secret), None).expect("client");
    let writer_secret = token_for(&management, "default-writer", "namespace \"default\" { policy = \"write\" }").await;
    let reader_secret = token_for(&management, "default-reader", "namespace \"default\" { policy = \"read\" }").await;
    let writer = ApiClient::new(&address, Some(writer_secret.clone()), None).expect("client");

    for path in ["/v1/jobs?namespace=prod", "/v1/jobs?namespace=..%2Fx"] {
        let refused = writer.request("PUT", path, Some(&cli_job("escape", 1))).await.expect("answer");
        assert_eq!(refused.status, 400, "{path}: {}", refused.body);
        assert!(refused.body.contains("does not exist"), "{}", refused.body);
    }
    let mut in_body = cli_job("escape", 1);
    in_body["Job"]["Namespace"] = json!("prod");
    let refused = writer.request("PUT", "/v1/jobs", Some(&in_body)).await.expect("answer");
    assert_eq!(refused.status, 403, "{}", refused.body);
    let refused = management.request("PUT", "/v1/jobs", Some(&in_body)).await.expect("answer");
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert!(refused.body.contains("nonexistent namespace \"prod\""), "{}", refused.body);
    assert_eq!(writer.get("/v1/jobs?namespace=prod").await.expect("answer").status, 400);
    let refused = writer.request("DELETE", "/v1/job/escape?namespace=*", None).await.expect("answer");
    assert_eq!(refused.status, 400, "a write names one namespace: {}", refused.body);
    let everywhere = writer.get("/v1/jobs?namespace=*").await.expect("answer").json().expect("jobs");
    assert_eq!(everywhere, json!([]), "nothing was written anywhere");

    let _agent = spawn_agent(&server);
    let job = json!({"Job": {"ID": "talker", "Type": "batch", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "talk", "Count": 1, "Tasks": [{"Name": "say", "Driver": "raw_exec",
            "Config": {"command": "sh", "args": ["-c", "echo hello from the task"]},
            "Resources": {"CPU": 100, "MemoryMB": 64}}]}]}});
    let written = writer.request("PUT", "/v1/jobs", Some(&job)).await.expect("answer");
    assert_eq!(written.status, 200, "{}", written.body);
    let (allocs, _) = until(&management, "/v1/job/talker/allocations", "the task complete", |allocs| {
        allocs.as_array().is_some_and(|list| list.iter().any(|alloc| alloc["ClientStatus"] == "complete"))
    })
    .await;
    let alloc = &allocs[0];
    let node = management.get(&format!("/v1/node/{}", alloc["NodeID"].as_str().expect("node"))).await.expect("node");
    let node = node.json().expect("node");
    assert_eq!(node["HTTPAddr"], "", "the agent advertises no listener of its own: logs are the servers'");
    let logs_path = format!("/v1/client/fs/logs/{}?task=say&plain=true", alloc["ID"].as_str().expect("id"));
    let at_server = |token: Option<String>| ApiClient::new(&address, token, None).expect("client");

    let anonymous = at_server(None).get(&logs_path).await.expect("answer");
    assert_eq!((anonymous.status, anonymous.body.as_str()), (403, "Permission denied"));
    let unknown = at_server(Some("00000000-0000-4000-8000-000000000000".into())).get(&logs_path).await.expect("answer");
    assert_eq!((unknown.status, unknown.body.as_str()), (403, "ACL token not found"));
    let read_only = at_server(Some(reader_secret)).get(&logs_path).await.expect("answer");
    assert_eq!(read_only.status, 403, "read does not grant read-logs: {}", read_only.body);
    let allowed = at_server(Some(writer_secret)).get(&logs_path).await.expect("answer");
    assert_eq!((allowed.status, allowed.body.as_str()), (200, "hello from the task\n"));
}

/// `answer` read into `T`, the `api` model's struct for it: written back,
/// it is the JSON the server sent, so the struct names every field the
/// server writes, with Nomad's names and the same `null`s.
fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(what: &str, answer: &ApiResponse) -> T {
    let sent = answer.json().unwrap_or_else(|error| panic!("{what}: {error:#}"));
    let typed: T = answer.decode().unwrap_or_else(|error| panic!("{what}: {error:#}"));
    let again = serde_json::to_value(&typed).expect("serializes");
    assert_eq!(again, sent, "{what}: the api struct does not write back what the server sent");
    typed
}

/// Every answer of the API reads into its struct of `drover::api` and
/// writes back unchanged: the model the CLI reads is the model the server
/// writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_reads_into_its_api_struct_and_back() {
    use drover::api::{acl, agent, allocations, deployments, evaluations, jobs, metrics, nodes, operator, search};

    transport::install_crypto_provider();
    let server = start_server_with("model", &["--acl-enabled"]).await;
    let address = format!("http://{}", anonymous_address(&server));
    let bootstrap = server.api.request("POST", "/v1/acl/bootstrap", None).await.expect("answer");
    let token: acl::AclToken = round_trip("bootstrap", &bootstrap);
    let api = &ApiClient::new(&address, Some(token.secret_id.clone()), None).expect("client");
    let _agent = start_agent(&server, 9);
    let (nodes, _) = until(api, "/v1/nodes", "the node ready", |nodes| {
        nodes.as_array().is_some_and(|nodes| nodes.iter().any(|node| node["Status"] == "ready"))
    })
    .await;
    let node_id = nodes[0]["ID"].as_str().expect("node id").to_string();

    // A job that runs, with the optional parts set, and one that cannot be placed.
    let mut job = cli_job("web", 2);
    job["Job"]["Affinities"] = json!([{"LTarget": "${node.datacenter}", "RTarget": "dc1", "Operand": "="}]);
    job["Job"]["Spreads"] =
        json!([{"Attribute": "${node.datacenter}", "SpreadTarget": [{"Value": "dc1", "Percent": 100}]}]);
    job["Job"]["TaskGroups"][0]["Networks"] = json!([{"DynamicPorts": [{"Label": "http", "To": 8080}]}]);
    job["Job"]["TaskGroups"][0]["MaxClientDisconnect"] = json!(60_000_000_000u64);
    job["Job"]["TaskGroups"][0]["Update"] = json!({"MaxParallel": 1});
    let registered = api.request("PUT", "/v1/jobs", Some(&job)).await.expect("register");
    let registered: jobs::JobRegisterResponse = round_trip("register", &registered);
    let mut stuck = cli_job("stuck", 1);
    stuck["Job"]["Constraints"] = json!([{"LTarget": "${attr.kernel.name}", "RTarget": "plan9", "Operand": "="}]);
    let stuck: jobs::JobRegisterResponse =
        round_trip("register stuck", &api.request("PUT", "/v1/jobs", Some(&stuck)).await.expect("register"));
    until(api, "/v1/job/web/allocations", "both allocations running", |allocs| {
        allocs.as_array().is_some_and(|list| list.len() == 2 && list.iter().all(|a| a["ClientStatus"] == "running"))
    })
    .await;
    until(api, &format!("/v1/evaluation/{}", stuck.eval_id), "the stuck eval done", |eval| {
        eval["Status"] == "complete" || eval["Status"] == "blocked"
    })
    .await;

    let get = |path: String| async move { api.get(&path).await.expect("answer") };
    round_trip::<Vec<jobs::JobListStub>>("jobs", &get("/v1/jobs".into()).await);
    let web: jobs::Job = round_trip("job", &get("/v1/job/web".into()).await);
    assert!(web.task_groups[0].networks.is_some() && web.affinities.is_some() && web.spreads.is_some());
    // A job read back and submitted again (as python users do) carries the
    // fields the servers set; none is news to warn of.
    let again = api.request("PUT", "/v1/job/web", Some(&json!({"Job": web}))).await.expect("register again");
    let again: jobs::JobRegisterResponse = round_trip("register again", &again);
    assert_eq!(again.warnings, "", "a read-back job is no news");
    round_trip::<jobs::JobSummary>("summary", &get("/v1/job/web/summary".into()).await);
    round_trip::<jobs::JobScaleStatusResponse>("scale status", &get("/v1/job/web/scale".into()).await);
    round_trip::<Option<deployments::Deployment>>("deployment", &get("/v1/job/web/deployment".into()).await);
    round_trip::<Vec<deployments::Deployment>>("deployments", &get("/v1/deployments".into()).await);
    let stubs: Vec<allocations::AllocationListStub> =
        round_trip("job allocations", &get("/v1/job/web/allocations".into()).await);
    round_trip::<Vec<evaluations::Evaluation>>("job evaluations", &get("/v1/job/web/evaluations".into()).await);
    round_trip::<Vec<evaluations::Evaluation>>("evaluations", &get("/v1/evaluations".into()).await);
    round_trip::<evaluations::Evaluation>("eval", &get(format!("/v1/evaluation/{}", registered.eval_id)).await);
    let failed: evaluations::Evaluation =
        round_trip("failed eval", &get(format!("/v1/evaluation/{}", stuck.eval_id)).await);
    assert!(failed.failed_tg_allocs.is_some(), "{failed:?}");
    round_trip::<Vec<allocations::AllocationListStub>>(
        "eval allocations",
        &get(format!("/v1/evaluation/{}/allocations", registered.eval_id)).await,
    );
    round_trip::<Vec<allocations::AllocationListStub>>("allocations", &get("/v1/allocations".into()).await);
    let alloc: allocations::Allocation = round_trip("alloc", &get(format!("/v1/allocation/{}", stubs[0].id)).await);
    assert_eq!(alloc.allocated_resources.shared.ports.len(), 1);
    round_trip::<Vec<nodes::NodeListStub>>("nodes", &get("/v1/nodes".into()).await);
    round_trip::<nodes::Node>("node", &get(format!("/v1/node/{node_id}")).await);
    round_trip::<Vec<allocations::Allocation>>(
        "node allocations",
        &get(format!("/v1/node/{node_id}/allocations")).await,
    );
    round_trip::<agent::AgentSelf>("agent self", &get("/v1/agent/self".into()).await);
    round_trip::<agent::ServerMembers>("members", &get("/v1/agent/members".into()).await);
    round_trip::<agent::AgentHealthResponse>("health", &get("/v1/agent/health".into()).await);
    round_trip::<agent::AgentSchedulerWorkersInfo>("workers", &get("/v1/agent/schedulers".into()).await);
    round_trip::<agent::AgentSchedulerWorkerConfigResponse>("config", &get("/v1/agent/schedulers/config".into()).await);
    round_trip::<metrics::MetricsSummary>("metrics", &get("/v1/metrics".into()).await);
    round_trip::<operator::RaftConfiguration>("raft", &get("/v1/operator/raft/configuration".into()).await);
    round_trip::<String>("leader", &get("/v1/status/leader".into()).await);

    let body = search::SearchRequest { prefix: "we".into(), context: "all".into(), namespace: None };
    let found: search::SearchResponse =
        round_trip("search", &api.request("PUT", "/v1/search", Some(&json!(body))).await.expect("answer"));
    assert_eq!(found.matches["jobs"], ["web"]);
    let scale = json!(jobs::ScalingRequest {
        count: Some(3),
        target: Some([("Group".into(), "web".into())].into()),
        message: None
    });
    round_trip::<jobs::JobRegisterResponse>(
        "scale",
        &api.request("POST", "/v1/job/web/scale", Some(&scale)).await.expect("answer"),
    );
    let eligibility = json!(nodes::NodeUpdateEligibilityRequest { eligibility: Some("ineligible".into()) });
    let path = format!("/v1/node/{node_id}/eligibility");
    round_trip::<nodes::NodeEligibilityUpdateResponse>(
        "eligibility",
        &api.request("PUT", &path, Some(&eligibility)).await.expect("answer"),
    );

    let policy = json!(acl::AclPolicyRequest {
        name: None,
        description: Some("reads".into()),
        rules: Some("node { policy = \"read\" }".into())
    });
    round_trip::<()>(
        "policy write",
        &api.request("PUT", "/v1/acl/policy/reader", Some(&policy)).await.expect("answer"),
    );
    round_trip::<Vec<acl::AclPolicyListStub>>("policies", &get("/v1/acl/policies".into()).await);
    round_trip::<acl::AclPolicy>("policy", &get("/v1/acl/policy/reader".into()).await);
    let request = json!(acl::AclTokenRequest {
        name: Some("ci".into()),
        token_type: None,
        policies: Some(vec!["reader".into()])
    });
    let created: acl::AclToken =
        round_trip("token", &api.request("POST", "/v1/acl/token", Some(&request)).await.expect("answer"));
    round_trip::<Vec<acl::AclTokenListStub>>("tokens", &get("/v1/acl/tokens".into()).await);
    round_trip::<acl::AclToken>("token read", &get(format!("/v1/acl/token/{}", created.accessor_id)).await);
    round_trip::<acl::AclToken>("token self", &get("/v1/acl/token/self".into()).await);

    round_trip::<jobs::JobDeregisterResponse>(
        "stop",
        &api.request("DELETE", "/v1/job/web", None).await.expect("answer"),
    );
    round_trip::<jobs::JobDeregisterResponse>(
        "stop nothing",
        &api.request("DELETE", "/v1/job/nothing", None).await.expect("answer"),
    );
}
