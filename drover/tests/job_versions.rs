//! Job versions through Nomad's HTTP API and the CLI, against a real
//! in-process server (ACLs on) with its HTTP API on a loopback port: three
//! versions registered, read newest first; a revert to version 0 writes a
//! version 3 equal to it, with an eval; a version marked stable, a
//! blocking query on the versions woken by that write; Nomad's refusals
//! and status codes; the ACL checks; `drover job history|revert`.

mod common;

use common::api::{json_of, send};
use common::bounded;
use drover::api::client::ApiClient;
use drover::server::RunningServer;
use serde_json::{json, Value};

/// A server with ACLs on and the management token's client and secret.
struct Fixture {
    _server: RunningServer,
    http: String,
    management: ApiClient,
    secret: String,
}

async fn fixture() -> Fixture {
    let (server, http, secret) = common::acl_server("versions-test").await;
    let management = ApiClient::new(&http, Some(secret.clone()), None).expect("client");
    Fixture { _server: server, http, management, secret }
}

/// Nomad's JSON for job `web`, one group of `count`.
fn job(count: u32) -> Value {
    json!({"Job": {"ID": "web", "Name": "web", "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "web", "Count": count,
            "Tasks": [{"Name": "server", "Driver": "mock", "Config": {"run_for": "1h"},
                "Resources": {"CPU": 100, "MemoryMB": 64}}]}]}})
}

/// `(Version, Stable, Count)` of each version, as `/versions` lists them.
fn listed(versions: &Value) -> Vec<(u64, bool, u64)> {
    let versions = versions["Versions"].as_array().expect("a list");
    let row = |job: &Value| {
        let count = job["TaskGroups"][0]["Count"].as_u64().expect("a count");
        (job["Version"].as_u64().expect("a version"), job["Stable"].as_bool().expect("stable"), count)
    };
    versions.iter().map(row).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_revert_and_stable_as_nomad_answers_them() {
    let fixture = fixture().await;
    let api = &fixture.management;
    for count in 1..=3 {
        json_of(api, "PUT", "/v1/jobs", Some(&job(count))).await;
    }
    let answer = send(api, "GET", "/v1/job/web/versions", None).await;
    let versions = answer.json().expect("JSON");
    assert_eq!(listed(&versions), vec![(2, false, 3), (1, false, 2), (0, false, 1)], "newest first");
    assert_eq!(versions["Diffs"], Value::Null);
    let jobs_index = answer.index.expect("X-Nomad-Index");
    assert_eq!(versions["Index"], jobs_index, "the body's meta is the read's");
    let current = json_of(api, "GET", "/v1/job/web", None).await;
    assert_eq!(versions["Versions"][0]["JobModifyIndex"], current["JobModifyIndex"], "the newest is the job");

    // Diffs (tests/job_plan.rs checks their content): one per pair, newest first.
    let diffs = json_of(api, "GET", "/v1/job/web/versions?diffs=true", None).await;
    assert_eq!(diffs["Diffs"].as_array().map(Vec::len), Some(2), "{diffs}");
    assert_eq!(send(api, "GET", "/v1/job/web/versions?diffs=maybe", None).await.status, 500, "as Nomad");
    assert_eq!(listed(&json_of(api, "GET", "/v1/job/web/versions?diffs=false", None).await).len(), 3);
    let unknown = send(api, "GET", "/v1/job/nope/versions", None).await;
    assert_eq!((unknown.status, unknown.body.as_str()), (404, "job versions not found"));

    // Revert to version 0: version 3 with version 0's spec, and its eval.
    let revert = json!({"JobID": "web", "JobVersion": 0, "EnforcePriorVersion": 2});
    let reverted = json_of(api, "POST", "/v1/job/web/revert", Some(&revert)).await;
    let eval_id = reverted["EvalID"].as_str().expect("an eval id");
    let eval = json_of(api, "GET", &format!("/v1/evaluation/{eval_id}"), None).await;
    assert_eq!((eval["JobID"].as_str(), eval["TriggeredBy"].as_str()), (Some("web"), Some("job-register")));
    assert_eq!(reverted["EvalCreateIndex"], reverted["Index"]);
    assert_eq!(reverted["JobModifyIndex"], reverted["Index"]);
    let versions = json_of(api, "GET", "/v1/job/web/versions", None).await;
    assert_eq!(listed(&versions), vec![(3, false, 1), (2, false, 3), (1, false, 2), (0, false, 1)]);
    assert_eq!(versions["Versions"][0]["TaskGroups"], versions["Versions"][3]["TaskGroups"], "v3 is v0's spec");

    // Nomad's refusals: RPC errors are 500 with its words; a body naming another job is 400.
    let refusals = [
        (json!({"JobID": "web", "JobVersion": 3}), 500, "can't revert to current version"),
        (json!({"JobID": "web", "JobVersion": 9}), 500, "job \"web\" in namespace \"default\" at version 9 not found"),
        (
            json!({"JobID": "web", "JobVersion": 0, "EnforcePriorVersion": 1}),
            500,
            "Current job has version 3; enforcing version 1",
        ),
        (json!({"JobID": "api", "JobVersion": 0}), 400, "Job ID does not match"),
    ];
    for (body, status, message) in refusals {
        let refused = send(api, "PUT", "/v1/job/web/revert", Some(&body)).await;
        assert_eq!((refused.status, refused.body.as_str()), (status, message), "{body}");
    }
    let no_job = send(api, "PUT", "/v1/job/nope/revert", Some(&json!({"JobID": "nope", "JobVersion": 0}))).await;
    assert_eq!((no_job.status, no_job.body.as_str()), (500, "job \"nope\" not found"));
    assert_eq!(send(api, "PUT", "/v1/job/web/revert", None).await.status, 400, "no body");
    assert_eq!(json_of(api, "GET", "/v1/job/web", None).await["Version"], 3, "nothing refused was written");

    // Stable: a blocking query on the versions wakes on the write.
    let watcher = ApiClient::new(&fixture.http, Some(fixture.secret.clone()), None).expect("client");
    let index = send(api, "GET", "/v1/job/web/versions", None).await.index.expect("index");
    let blocked = tokio::spawn(async move {
        watcher.get(&format!("/v1/job/web/versions?index={index}&wait=60s")).await.expect("an answer")
    });
    let marked =
        json_of(api, "PUT", "/v1/job/web/stable", Some(&json!({"JobID": "web", "JobVersion": 1, "Stable": true})))
            .await;
    let stable_index = marked["Index"].as_u64().expect("the write's index");
    assert!(stable_index > index);
    let woken = bounded("the blocking query wakes", blocked).await.expect("the query's task");
    assert_eq!(woken.index, Some(stable_index));
    assert_eq!(listed(&woken.json().expect("JSON"))[2], (1, true, 2), "version 1 is stable");
    json_of(api, "POST", "/v1/job/web/stable", Some(&json!({"JobID": "web", "JobVersion": 3, "Stable": true}))).await;
    assert_eq!(json_of(api, "GET", "/v1/job/web", None).await["Stable"], true, "the current version, on the job too");
    let unknown =
        send(api, "PUT", "/v1/job/web/stable", Some(&json!({"JobID": "web", "JobVersion": 7, "Stable": true}))).await;
    assert_eq!(
        (unknown.status, unknown.body.as_str()),
        (500, "job \"web\" in namespace \"default\" at version 7 not found")
    );
    let other = send(api, "PUT", "/v1/job/web/stable", Some(&json!({"JobID": "api", "JobVersion": 3}))).await;
    assert_eq!((other.status, other.body.as_str()), (400, "Job ID does not match"));

    // A reader reads the versions but may neither revert nor mark; no token, nothing.
    let policy = json!({"Name": "readers", "Rules": "namespace \"default\" { policy = \"read\" }"});
    assert_eq!(send(api, "PUT", "/v1/acl/policy/readers", Some(&policy)).await.status, 200);
    let token =
        json_of(api, "POST", "/v1/acl/token", Some(&json!({"Name": "r", "Type": "client", "Policies": ["readers"]})))
            .await;
    let reader =
        ApiClient::new(&fixture.http, Some(token["SecretID"].as_str().expect("secret").into()), None).expect("client");
    assert_eq!(send(&reader, "GET", "/v1/job/web/versions", None).await.status, 200);
    let revert = json!({"JobID": "web", "JobVersion": 1});
    let refused = send(&reader, "POST", "/v1/job/web/revert", Some(&revert)).await;
    assert_eq!((refused.status, refused.body.as_str()), (403, "Permission denied"));
    let mark = json!({"JobID": "web", "JobVersion": 1, "Stable": false});
    assert_eq!(send(&reader, "PUT", "/v1/job/web/stable", Some(&mark)).await.status, 403);
    let anonymous = ApiClient::new(&fixture.http, None, None).expect("client");
    assert_eq!(send(&anonymous, "GET", "/v1/job/web/versions", None).await.status, 403);
    assert_eq!(listed(&json_of(api, "GET", "/v1/job/web/versions", None).await)[2], (1, true, 2), "unchanged");

    // The CLI: history lists the versions newest first; revert writes version 4.
    let history = cli(&fixture, &["job", "history", "web"]).await;
    assert!(history.status.success(), "{}", String::from_utf8_lossy(&history.stderr));
    let text = String::from_utf8_lossy(&history.stdout).into_owned();
    let versions: Vec<&str> = text.lines().filter_map(|line| line.strip_prefix("Version     = ")).collect();
    assert_eq!(versions, vec!["3", "2", "1", "0"], "{text}");
    assert!(text.starts_with("Version     = 3\nStable      = true\nSubmit Date = "), "{text}");
    let reverted = cli(&fixture, &["job", "revert", "--detach", "web", "1"]).await;
    assert!(reverted.status.success(), "{}", String::from_utf8_lossy(&reverted.stderr));
    assert!(String::from_utf8_lossy(&reverted.stdout).starts_with("Evaluation ID: "));
    let job = json_of(api, "GET", "/v1/job/web", None).await;
    assert_eq!((job["Version"].as_u64(), job["TaskGroups"][0]["Count"].as_u64()), (Some(4), Some(2)));
    let refused = cli(&fixture, &["job", "revert", "web", "4"]).await;
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("can't revert to current version"));
}

async fn cli(fixture: &Fixture, args: &[&str]) -> std::process::Output {
    let mut command = common::drover();
    command.args(args).env("DROVER_ADDR", &fixture.http).env("DROVER_TOKEN", &fixture.secret);
    bounded("the CLI answers", tokio::task::spawn_blocking(move || command.output().expect("drover runs")))
        .await
        .expect("the CLI task")
}
