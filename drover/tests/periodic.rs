//! Periodic and parameterized jobs through the real binaries: a real
//! `drover server --dev` and `drover agent --dev`, jobs sent as Nomad's
//! clients send them (an HCL file through `drover job run`, JSON through
//! the HTTP API), raw_exec tasks that print what reached them.
//!
//! - A periodic job registers without an eval, shows its next launch in
//!   `job status` and `job plan`, refuses `evaluate`, and `periodic force`
//!   launches a child at once, which runs to completion.
//! - A dispatch with a payload and meta reaches the task: the payload in
//!   `local/<file>`, the meta as `NOMAD_META_*`; an idempotency token
//!   returns the same child; Nomad's refusals come back in its words.
//!
//! Waits are the API's blocking queries, bounded by a watchdog that only
//! turns a hang into a failure. The scheduling rule itself, with a driven
//! clock, and the launch records across a change of leader are tested in
//! `engine/src/periodic/periodic_test.rs`.

mod common;

use std::process::Output;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use common::api::{alloc_of, is_terminal, json_of, send, until};
use common::dev::DevCluster;
use serde_json::{json, Value};

/// `drover <args>` against the cluster's HTTP API.
fn drover(cluster: &DevCluster, args: &[&str]) -> Output {
    common::drover().args(args).env("DROVER_ADDR", &cluster.http).output().expect("drover runs")
}

fn stdout(output: &Output) -> String {
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success(), "{text}\n{}", String::from_utf8_lossy(&output.stderr));
    text
}

/// A periodic job that would launch only on New Year's Day.
const PERIODIC_JOB: &str = r#"
job "nightly" {
  datacenters = ["dc1"]
  type = "batch"
  periodic {
    crons            = ["0 0 1 1 *"]
    prohibit_overlap = true
  }
  group "report" {
    task "report" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo launched"]
      }
      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_periodic_job_waits_for_its_schedule_and_periodic_force_launches_it_at_once() {
    let cluster = DevCluster::start("periodic-force", &[]).await;
    let file = cluster.dir.join("nightly.hcl");
    std::fs::write(&file, PERIODIC_JOB).expect("job file");
    let run = stdout(&drover(&cluster, &["job", "run", file.to_str().expect("path")]));
    assert!(run.contains("Job registration successful"), "{run}");
    assert!(run.contains("Approximate next launch time: "), "{run}");
    let evals = json_of(&cluster.api, "GET", "/v1/job/nightly/evaluations", None).await;
    assert_eq!(evals, json!([]), "registering a periodic job writes no eval");

    let job = json_of(&cluster.api, "GET", "/v1/job/nightly", None).await;
    assert_eq!(job["Status"], "running");
    assert_eq!(job["Periodic"]["Spec"], "0 0 1 1 *");
    assert_eq!(job["Periodic"]["ProhibitOverlap"], true);
    let status = stdout(&drover(&cluster, &["job", "status", "nightly"]));
    assert!(status.contains("Periodic             = true"), "{status}");
    assert!(status.contains("Next Periodic Launch = "), "{status}");
    assert!(status.contains("-01-01T00:00:00Z"), "the next New Year's Day: {status}");
    let stubs = json_of(&cluster.api, "GET", "/v1/jobs", None).await;
    assert_eq!(stubs[0]["Periodic"], true, "{stubs}");

    let plan = json!({"Job": {"ID": "nightly", "Type": "batch", "Datacenters": ["dc1"],
        "Periodic": {"Spec": "0 0 1 1 *"},
        "TaskGroups": [{"Name": "report", "Tasks": [{"Name": "report", "Driver": "raw_exec",
            "Config": {"command": "/bin/true"}}]}]}});
    let planned = json_of(&cluster.api, "PUT", "/v1/job/nightly/plan", Some(&plan)).await;
    let next = planned["NextPeriodicLaunch"].as_str().expect("a time");
    assert!(next.ends_with("-01-01T00:00:00Z"), "{planned}");

    let evaluate = send(&cluster.api, "PUT", "/v1/job/nightly/evaluate", None).await;
    assert_eq!((evaluate.status, evaluate.body.as_str()), (500, "can't evaluate periodic job"));

    let forced = json_of(&cluster.api, "POST", "/v1/job/nightly/periodic/force", None).await;
    assert!(!forced["EvalID"].as_str().expect("an eval id").is_empty(), "{forced}");
    assert!(forced["EvalCreateIndex"].as_u64() > Some(0) && forced["Index"] == forced["EvalCreateIndex"], "{forced}");
    let children = until(&cluster.api, "/v1/jobs?prefix=nightly/periodic-", "the launched child", |jobs| {
        jobs.as_array().is_some_and(|jobs| jobs.len() == 1 && jobs[0]["Status"] == "dead")
    })
    .await;
    let child = children[0]["ID"].as_str().expect("an id").to_string();
    assert_eq!(children[0]["ParentID"], "nightly");
    let alloc = alloc_of(&cluster.api, &child, "the child's allocation", is_terminal).await;
    assert_eq!(alloc["ClientStatus"], "complete", "{alloc}");
    let summary = json_of(&cluster.api, "GET", "/v1/job/nightly/summary", None).await;
    assert_eq!(summary["Children"], json!({"Pending": 0, "Running": 0, "Dead": 1}), "{summary}");

    let forced = stdout(&drover(&cluster, &["job", "periodic", "force", "nightly", "--detach"]));
    assert!(forced.contains("Force periodic successful"), "{forced}");
    let status = stdout(&drover(&cluster, &["job", "status", "nightly"]));
    assert!(status.contains("Previously Launched Jobs"), "{status}");
    assert!(status.contains(&child), "{status}");
    let refused = send(&cluster.api, "POST", &format!("/v1/job/{child}/periodic/force"), None).await;
    assert_eq!((refused.status, refused.body.as_str()), (500, "can't force launch non-periodic job"));
}

/// A parameterized job whose task prints its payload and its dispatch's meta.
fn parameterized_job() -> Value {
    json!({"Job": {"ID": "work", "Type": "batch", "Datacenters": ["dc1"],
        "Meta": {"tier": "parent"},
        "ParameterizedJob": {"Payload": "required", "MetaRequired": ["owner"], "MetaOptional": ["tier"]},
        "TaskGroups": [{"Name": "work", "Tasks": [{"Name": "work", "Driver": "raw_exec",
            "DispatchPayload": {"File": "input/data.txt"},
            "Config": {"command": "/bin/sh", "args": ["-c",
                "cat \"$NOMAD_TASK_DIR/input/data.txt\"; echo; echo \"owner=$NOMAD_META_owner tier=$NOMAD_META_tier\""]},
            "Resources": {"CPU": 50, "MemoryMB": 32}}]}]}})
}

/// `task`'s stdout, read through the server from the agent that ran it.
async fn stdout_of(cluster: &DevCluster, alloc: &Value, task: &str) -> String {
    let path = format!("/v1/client/fs/logs/{}?task={task}&type=stdout&plain=true", alloc["ID"].as_str().expect("id"));
    let answer = cluster.api.get(&path).await.expect("answer");
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dispatch_delivers_its_payload_and_meta_to_the_task() {
    let cluster = DevCluster::start("dispatch", &[]).await;
    let registered = json_of(&cluster.api, "PUT", "/v1/jobs", Some(&parameterized_job())).await;
    assert_eq!(registered["EvalID"], "", "registering a parameterized job writes no eval");

    let input = cluster.dir.join("input.txt");
    std::fs::write(&input, "the payload").expect("input file");
    let input = input.to_str().expect("path");
    let args = ["job", "dispatch", "--detach", "--meta", "owner=alice", "--idempotency-token", "once", "work", input];
    let dispatched = stdout(&drover(&cluster, &args));
    let child = dispatched
        .lines()
        .find_map(|line| line.strip_prefix("Dispatched Job ID = "))
        .unwrap_or_else(|| panic!("the child's id: {dispatched}"))
        .trim()
        .to_string();
    assert!(child.starts_with("work/dispatch-"), "{child}");
    let alloc = alloc_of(&cluster.api, &child, "the dispatched task ran", is_terminal).await;
    assert_eq!(alloc["ClientStatus"], "complete", "{alloc}");
    let printed = stdout_of(&cluster, &alloc, "work").await;
    assert_eq!(printed, "the payload\nowner=alice tier=parent\n");

    let job = json_of(&cluster.api, "GET", &format!("/v1/job/{child}"), None).await;
    assert_eq!((job["Dispatched"].as_bool(), job["ParentID"].as_str()), (Some(true), Some("work")), "{job}");
    let stored = BASE64.decode(job["Payload"].as_str().expect("a payload")).expect("base64");
    assert_ne!(stored, b"the payload", "stored snappy-compressed, as Nomad");
    assert_eq!(job["Meta"], json!({"owner": "alice", "tier": "parent"}));

    let again = json!({"Payload": BASE64.encode("other"), "Meta": {"owner": "bob"}});
    let path = "/v1/job/work/dispatch?idempotency_token=once";
    let repeated = json_of(&cluster.api, "POST", path, Some(&again)).await;
    assert_eq!(repeated["DispatchedJobID"], child.as_str(), "the same token, the same child");

    let refusals = [
        (json!({"Meta": {"owner": "x"}}), "Payload is not provided but required by parameterized job"),
        (
            json!({"Payload": BASE64.encode(vec![b'x'; 16 * 1024 + 1]), "Meta": {"owner": "x"}}),
            "Payload exceeds maximum size; 16385 > 16384",
        ),
        (json!({"Payload": BASE64.encode("x")}), "Dispatch did not provide required meta keys: [\"owner\"]"),
        (
            json!({"Payload": BASE64.encode("x"), "Meta": {"owner": "x", "color": "red"}}),
            "Dispatch request included unpermitted metadata keys: [\"color\"]",
        ),
    ];
    for (body, message) in refusals {
        let answer = send(&cluster.api, "PUT", "/v1/job/work/dispatch", Some(&body)).await;
        assert_eq!((answer.status, answer.body.as_str()), (500, message));
    }
    let unknown = send(&cluster.api, "PUT", "/v1/job/nope/dispatch", Some(&json!({}))).await;
    assert_eq!((unknown.status, unknown.body.as_str()), (500, "parameterized job not found"));
    let of_child = send(&cluster.api, "PUT", &format!("/v1/job/{child}/dispatch"), Some(&json!({}))).await;
    assert_eq!(of_child.body, format!("Specified job {child:?} is not a parameterized job"));

    let summary = json_of(&cluster.api, "GET", "/v1/job/work/summary", None).await;
    assert_eq!(summary["Children"], json!({"Pending": 0, "Running": 0, "Dead": 1}), "{summary}");
    let status = stdout(&drover(&cluster, &["job", "status", "work"]));
    assert!(status.contains("Parameterized = true"), "{status}");
    assert!(status.contains("Dispatched Jobs") && status.contains(&child), "{status}");
}
