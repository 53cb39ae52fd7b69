//! Garbage collection and the evaluation backlog tools, through Nomad's
//! HTTP API:
//! - against the real `drover server --dev` and `drover agent --dev`: a
//!   batch job runs to completion, nothing is purged by hand, `PUT
//!   /v1/system/gc` (POST: 405) deletes the job, its evals and its
//!   allocations; `PUT /v1/node/:id/purge` answers as Nomad's;
//! - against an in-process server with ACLs on: `DELETE /v1/evaluations`
//!   is refused while the eval broker runs and accepted once
//!   `PauseEvalBroker` is set through `/v1/operator/scheduler/configuration`;
//!   the list's `filter`, `per_page` and `next_token`; `drover eval
//!   list|delete`; the system endpoints need a management token.

mod common;

use common::api::{json_of, send, until};
use common::bounded;
use common::dev::DevCluster;
use drover::api::client::ApiClient;
use serde_json::{json, Value};

fn batch_job(id: &str) -> Value {
    json!({"Job": {"ID": id, "Name": id, "Type": "batch", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "work", "Count": 1,
            "Tasks": [{"Name": "work", "Driver": "mock", "Config": {"run_for": "10ms"},
                "Resources": {"CPU": 100, "MemoryMB": 64}}]}]}})
}

fn service_job(id: &str) -> Value {
    json!({"Job": {"ID": id, "Name": id, "Type": "service", "Datacenters": ["nowhere"],
        "TaskGroups": [{"Name": "web", "Count": 1,
            "Tasks": [{"Name": "web", "Driver": "mock", "Config": {"run_for": "1h"},
                "Resources": {"CPU": 100, "MemoryMB": 64}}]}]}})
}

fn ids(list: &Value) -> Vec<String> {
    list.as_array().expect("a list").iter().map(|item| item["ID"].as_str().expect("an id").to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_batch_job_is_collected_by_a_forced_gc() {
    let cluster = DevCluster::start("gc-batch", &[]).await;
    let api = &cluster.api;
    until(api, "/v1/nodes", "the agent registers", |nodes| nodes.as_array().is_some_and(|list| list.len() == 1)).await;
    json_of(api, "PUT", "/v1/jobs", Some(&batch_job("report"))).await;
    // Dead: its allocation completed and its evals ended.
    let allocs = until(api, "/v1/job/report/allocations", "the allocation completes", |allocs| {
        allocs.as_array().is_some_and(|list| !list.is_empty() && list.iter().all(|a| a["ClientStatus"] == "complete"))
    })
    .await;
    let alloc_id = allocs[0]["ID"].as_str().expect("an id").to_string();
    let evals = until(api, "/v1/job/report/evaluations", "its evals end", |evals| {
        evals.as_array().is_some_and(|list| !list.is_empty() && list.iter().all(|eval| eval["Status"] == "complete"))
    })
    .await;
    assert_eq!(json_of(api, "GET", "/v1/job/report", None).await["Status"], "dead");

    let post = send(api, "POST", "/v1/system/gc", None).await;
    assert_eq!(post.status, 405, "PUT only, as Nomad 1.0");
    let gc = send(api, "PUT", "/v1/system/gc", None).await;
    assert_eq!((gc.status, gc.body.as_str()), (200, ""));
    assert_eq!(send(api, "GET", "/v1/job/report", None).await.status, 404, "the job is gone");
    for eval in ids(&evals) {
        assert_eq!(send(api, "GET", &format!("/v1/evaluation/{eval}"), None).await.status, 404, "eval {eval}");
    }
    assert_eq!(send(api, "GET", &format!("/v1/allocation/{alloc_id}"), None).await.status, 404);
    let left = json_of(api, "GET", "/v1/evaluations?filter=JobID%20%3D%3D%20%22report%22", None).await;
    assert_eq!(left, json!([]));
    let summaries = send(api, "PUT", "/v1/system/reconcile/summaries", None).await;
    assert_eq!((summaries.status, summaries.body.as_str()), (200, ""));

    // Node purge answers as Nomad's node deregister; nothing ran there any more.
    let nodes = json_of(api, "GET", "/v1/nodes", None).await;
    let node = nodes[0]["ID"].as_str().expect("an id");
    let purged = json_of(api, "PUT", &format!("/v1/node/{node}/purge"), None).await;
    assert_eq!(purged["EvalIDs"], json!([]), "{purged}");
    assert!(
        purged["NodeModifyIndex"].as_u64().is_some_and(|index| index > 0)
            && purged["Index"] == purged["NodeModifyIndex"]
    );
    let unknown = send(api, "PUT", "/v1/node/00000000-0000-0000-0000-000000000000/purge", None).await;
    assert_eq!(unknown.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evals_are_deleted_only_while_the_broker_is_paused() {
    let (_server, http, secret) = common::acl_server("gc-evals").await;
    let api = ApiClient::new(&http, Some(secret.clone()), None).expect("client");
    let anonymous = ApiClient::new(&http, None, None).expect("client");
    assert_eq!(send(&anonymous, "PUT", "/v1/system/gc", None).await.status, 403, "management only");
    for id in ["web-a", "web-b", "other"] {
        json_of(&api, "PUT", "/v1/jobs", Some(&service_job(id))).await;
    }
    // No node in `nowhere`: each job's eval completes, leaving a blocked one.
    until(&api, "/v1/evaluations", "three blocked evals", |evals| {
        evals.as_array().is_some_and(|list| list.iter().filter(|eval| eval["Status"] == "blocked").count() == 3)
    })
    .await;

    // The list's filter and pages.
    let blocked_web = "/v1/evaluations?filter=Status%20%3D%3D%20%22blocked%22%20and%20JobID%20contains%20%22web%22";
    let web = json_of(&api, "GET", blocked_web, None).await;
    assert_eq!(web.as_array().map(Vec::len), Some(2), "{web}");
    let (mut paged, mut pages, mut token) = (Vec::new(), 0, None::<String>);
    loop {
        let next = token.as_ref().map(|token| format!("&next_token={token}")).unwrap_or_default();
        let page = send(&api, "GET", &format!("/v1/evaluations?per_page=4{next}"), None).await;
        paged.extend(ids(&page.json().expect("JSON")));
        pages += 1;
        token = page.next_token.clone();
        if token.is_none() {
            break;
        }
    }
    let all = ids(&json_of(&api, "GET", "/v1/evaluations", None).await);
    assert_eq!((paged, pages), (all, 2), "six evals: a page of four, then the last two");
    assert_eq!(send(&api, "GET", "/v1/evaluations?filter=JobID%20%3D", None).await.status, 400);

    // Refused while the broker runs, with Nomad's message.
    let delete = json!({"EvalIDs": [web[0]["ID"]]});
    let refused = send(&api, "DELETE", "/v1/evaluations", Some(&delete)).await;
    assert_eq!(refused.status, 400);
    assert_eq!(refused.body.trim(), "eval broker is enabled; eval broker must be paused to delete evals");
    assert_eq!(send(&anonymous, "DELETE", "/v1/evaluations", Some(&delete)).await.status, 403);

    let paused = json!({"SchedulerAlgorithm": "binpack", "PauseEvalBroker": true,
        "PreemptionConfig": {"SystemSchedulerEnabled": true}});
    let written = json_of(&api, "PUT", "/v1/operator/scheduler/configuration", Some(&paused)).await;
    assert_eq!(written["Updated"], true);
    let config = json_of(&api, "GET", "/v1/operator/scheduler/configuration", None).await;
    assert_eq!(config["SchedulerConfig"]["PauseEvalBroker"], true, "{config}");

    let deleted = json_of(&api, "DELETE", "/v1/evaluations", Some(&delete)).await;
    assert_eq!(deleted["Count"], 1);
    let gone = web[0]["ID"].as_str().expect("an id");
    assert_eq!(send(&api, "GET", &format!("/v1/evaluation/{gone}"), None).await.status, 404);

    // The CLI: list with a filter, delete by filter.
    let listed = cli(&http, &secret, &["eval", "list", "--filter", r#"JobID == "other""#]).await;
    assert!(listed.contains("other") && !listed.contains("web-"), "{listed}");
    let out = cli(&http, &secret, &["eval", "delete", "--filter", r#"JobID contains "web""#]).await;
    assert!(out.contains("Successfully deleted 3 evaluations"), "{out}");
    let left = json_of(&api, "GET", "/v1/evaluations", None).await;
    assert_eq!(left.as_array().map(Vec::len), Some(2), "only `other`'s two: {left}");

    let resumed = json!({"SchedulerAlgorithm": "binpack", "PauseEvalBroker": false});
    json_of(&api, "PUT", "/v1/operator/scheduler/configuration", Some(&resumed)).await;
    let refused = send(&api, "DELETE", "/v1/evaluations", Some(&json!({"Filter": "JobID == \"other\""}))).await;
    assert_eq!(refused.status, 400, "running again");
}

/// The CLI's stdout, once it succeeded.
async fn cli(http: &str, secret: &str, args: &[&str]) -> String {
    let mut command = common::drover();
    command.args(args).env("DROVER_ADDR", http).env("DROVER_TOKEN", secret);
    let output = bounded("the CLI answers", tokio::task::spawn_blocking(move || command.output().expect("runs")))
        .await
        .expect("the CLI task");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{args:?}: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    stdout
}
