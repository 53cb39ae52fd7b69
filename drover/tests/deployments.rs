//! Deployments through Nomad's HTTP API and the CLI, against a real `drover
//! server --dev` and `drover agent --dev` (the `drover` binary on loopback
//! ports they pick) running raw_exec tasks whose health the agent decides
//! (`min_healthy_time = 1s`): `job run` follows a rolling deployment to
//! `successful` and the version turns stable; a canary waits for
//! promotion, is paused, resumed and promoted; a deployment is failed, and
//! another by an unhealthy verdict sent with python-nomad's key spelling;
//! Nomad's refusals and status codes; the ACL checks.
//!
//! Waits are the API's blocking queries, bounded by a watchdog that only
//! turns a hang into a failure.

mod common;

use common::api::{json_of, send, until};
use common::bounded;
use common::dev::DevCluster;
use drover::api::client::ApiClient;
use serde_json::{json, Value};

const SECOND: u64 = 1_000_000_000;

/// Job `web`: two raw_exec tasks running `sleep <seconds>` (a new value
/// is a new version that replaces them), rolled one at a time, with
/// `canary` canaries.
fn job(seconds: u32, canary: u64) -> Value {
    json!({"Job": {"ID": "web", "Name": "web", "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "web", "Count": 2,
            "Update": {"MaxParallel": 1, "Canary": canary, "MinHealthyTime": SECOND,
                "HealthyDeadline": 30 * SECOND, "ProgressDeadline": 60 * SECOND},
            "Tasks": [{"Name": "server", "Driver": "raw_exec", "KillTimeout": SECOND,
                "Config": {"command": "sleep", "args": [seconds.to_string()]},
                "Resources": {"CPU": 100, "MemoryMB": 64}}]}]}})
}

/// `(status, body)` of a request, for the refusals.
async fn refusal(api: &ApiClient, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    let answer = send(api, method, path, body).await;
    (answer.status, answer.body)
}

/// Blocks until job `web`'s latest deployment satisfies `done`; it.
async fn latest_until(api: &ApiClient, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    until(api, "/v1/job/web/deployment", what, |deployment| !deployment.is_null() && done(deployment)).await
}

/// A cluster whose agent's node is ready.
async fn cluster(name: &str) -> DevCluster {
    let cluster = DevCluster::start(&format!("deployments-{name}"), &[]).await;
    until(&cluster.api, "/v1/nodes", "the node ready", |nodes| {
        nodes.as_array().is_some_and(|nodes| nodes.iter().any(|node| node["Status"] == "ready"))
    })
    .await;
    cluster
}

fn id_of(value: &Value) -> String {
    value["ID"].as_str().expect("an id").to_string()
}

/// The words of each line, for tables whose widths do not matter.
fn words(text: &str) -> Vec<Vec<&str>> {
    text.lines().map(|line| line.split_whitespace().collect()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_run_follows_a_rolling_deployment_to_success_and_the_version_turns_stable() {
    let cluster = cluster("rolling").await;
    let api = &cluster.api;
    let file = cluster.dir.join("web.json");
    std::fs::write(&file, job(600, 0).to_string()).expect("job file");

    let run = cluster.cli_ok(&["job", "run", file.to_str().expect("path")]).await;
    assert!(run.contains("finished with status \"complete\""), "{run}");
    let monitoring = run.lines().find_map(|line| line.strip_prefix("==> Monitoring deployment \""));
    let short = monitoring.and_then(|rest| rest.strip_suffix('"')).unwrap_or_else(|| panic!("{run}")).to_string();
    assert!(run.contains(&format!("Deployment \"{short}\" successful")), "{run}");
    assert!(run.contains("web         2        2       2        0"), "the last block's Deployed table: {run}");

    let deployment = json_of(api, "GET", "/v1/job/web/deployment", None).await;
    let id = id_of(&deployment);
    assert!(id.starts_with(&short), "{id}");
    assert_eq!((deployment["Status"].as_str(), deployment["JobVersion"].as_u64()), (Some("successful"), Some(0)));
    assert_eq!(deployment["StatusDescription"], "Deployment completed successfully");
    assert_eq!((deployment["JobID"].as_str(), deployment["Namespace"].as_str()), (Some("web"), Some("default")));
    assert_eq!(deployment["IsMultiregion"], false);
    let group = &deployment["TaskGroups"]["web"];
    let counts = ["DesiredTotal", "PlacedAllocs", "HealthyAllocs", "UnhealthyAllocs", "DesiredCanaries"]
        .map(|field| group[field].as_u64().unwrap_or_else(|| panic!("{field}: {group}")));
    assert_eq!(counts, [2, 2, 2, 0, 0], "{group}");
    assert_eq!(group["ProgressDeadline"], 60 * SECOND, "nanoseconds");
    assert!(group["RequireProgressBy"].as_str().is_some_and(|at| at.contains('T') && at.ends_with('Z')), "{group}");
    assert_eq!((&group["PlacedCanaries"], &group["Promoted"]), (&Value::Null, &json!(false)));

    // The same object everywhere it is listed; prefixes as Nomad matches them.
    let answer = send(api, "GET", &format!("/v1/deployment/{id}"), None).await;
    assert_eq!(answer.json().expect("JSON"), deployment);
    assert_eq!(answer.index, deployment["ModifyIndex"].as_u64(), "blocks on the deployment's index");
    assert_eq!(json_of(api, "GET", "/v1/deployments", None).await, json!([deployment]));
    let prefix = format!("/v1/deployments?prefix={}", id[..4].to_uppercase());
    assert_eq!(json_of(api, "GET", &prefix, None).await, json!([deployment]));
    let other = if id.starts_with('0') { "1" } else { "0" };
    assert_eq!(json_of(api, "GET", &format!("/v1/deployments?prefix={other}"), None).await, json!([]));
    assert_eq!(json_of(api, "GET", "/v1/job/web/deployments", None).await, json!([deployment]));
    assert_eq!(json_of(api, "GET", "/v1/job/web/deployments?all=true", None).await, json!([deployment]));
    assert_eq!(json_of(api, "GET", "/v1/job/nope/deployment", None).await, Value::Null);
    assert_eq!(json_of(api, "GET", "/v1/job/nope/deployments", None).await, json!([]));

    // Its allocations: healthy, in the deployment, as `/v1/allocations` lists them.
    let allocs = json_of(api, "GET", &format!("/v1/deployment/allocations/{id}"), None).await;
    let allocs = allocs.as_array().expect("a list");
    assert_eq!(allocs.len(), 2);
    for stub in allocs {
        let health = &stub["DeploymentStatus"];
        assert_eq!((&health["Healthy"], &health["Canary"]), (&json!(true), &json!(false)), "{stub}");
        assert!(health["ModifyIndex"].as_u64().is_some_and(|index| index > 0), "{health}");
        let full = json_of(api, "GET", &format!("/v1/allocation/{}", id_of(stub)), None).await;
        assert_eq!(full["DeploymentID"], id.as_str());
        let listed = json_of(api, "GET", &format!("/v1/allocations?prefix={}", id_of(stub)), None).await;
        assert_eq!(&listed[0], stub, "the stub `/v1/allocations` answers");
    }
    let unknown = "00000000-0000-4000-8000-000000000000";
    assert_eq!(json_of(api, "GET", &format!("/v1/deployment/allocations/{unknown}"), None).await, json!([]));

    let versions = json_of(api, "GET", "/v1/job/web/versions", None).await;
    assert_eq!(
        (versions["Versions"][0]["Version"].as_u64(), &versions["Versions"][0]["Stable"]),
        (Some(0), &json!(true))
    );
    let summary = json_of(api, "GET", "/v1/job/web/summary", None).await;
    assert_eq!(summary["Summary"]["web"]["Running"], 2, "{summary}");

    // The CLI's views.
    let listed = cluster.cli_ok(&["deployment", "list"]).await;
    assert_eq!(
        words(&listed),
        vec![
            vec!["ID", "Job", "ID", "Job", "Version", "Status", "Description"],
            vec![short.as_str(), "web", "0", "successful", "Deployment", "completed", "successfully"],
        ],
        "{listed}"
    );
    let status = cluster.cli_ok(&["deployment", "status", &id[..6]]).await;
    let expected_head = format!(
        "ID          = {short}\nJob ID      = web\nJob Version = 0\nStatus      = successful\n\
         Description = Deployment completed successfully\n\nDeployed\n"
    );
    assert!(status.starts_with(&expected_head), "{status}");
    let table = words(&status);
    assert_eq!(
        table[7],
        ["Task", "Group", "Desired", "Placed", "Healthy", "Unhealthy", "Progress", "Deadline"],
        "{status}"
    );
    assert_eq!(table[8][..5], ["web", "2", "2", "2", "0"], "{status}");
    let full = cluster.cli_ok(&["deployment", "status", "--verbose", &id]).await;
    assert!(full.starts_with(&format!("ID          = {id}\n")), "{full}");
    let as_json: Value = serde_json::from_str(&cluster.cli_ok(&["deployment", "status", "--json", &id]).await)
        .expect("--json prints JSON");
    assert_eq!(as_json, deployment);
    let job_status = cluster.cli_ok(&["job", "status", "web"]).await;
    let latest = format!(
        "\nLatest Deployment\nID          = {short}\nStatus      = successful\n\
         Description = Deployment completed successfully\n\nDeployed\n"
    );
    assert!(job_status.contains(&latest), "{job_status}");
    assert!(job_status.find(&latest) < job_status.find("\nAllocations\n"), "before the allocations: {job_status}");
    let latest = cluster.cli_ok(&["job", "deployments", "--latest", "web"]).await;
    assert!(latest.starts_with(&format!("ID          = {short}\nJob ID      = web\n")), "{latest}");
    let listed = cluster.cli_ok(&["job", "deployments", "web"]).await;
    assert_eq!(words(&listed)[1][..4], [short.as_str(), "web", "0", "successful"], "{listed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canaries_wait_for_promotion_and_operators_pause_resume_promote_and_fail() {
    let cluster = cluster("canary").await;
    let api = &cluster.api;
    json_of(api, "PUT", "/v1/jobs", Some(&job(600, 1))).await;
    let first = latest_until(api, "version 0 deployed", |d| d["Status"] == "successful").await;
    assert_eq!(first["JobVersion"], 0, "the first version has nothing to canary against: {first}");

    // Version 1 places one canary and waits for an operator.
    json_of(api, "PUT", "/v1/jobs", Some(&job(601, 1))).await;
    let waiting = latest_until(api, "the canary healthy, awaiting promotion", |d| {
        d["JobVersion"] == 1 && d["TaskGroups"]["web"]["HealthyAllocs"] == 1
    })
    .await;
    assert_eq!(waiting["Status"], "running");
    assert_eq!(waiting["StatusDescription"], "Deployment is running but requires manual promotion");
    let id = id_of(&waiting);
    let group = &waiting["TaskGroups"]["web"];
    assert_eq!((group["DesiredCanaries"].as_u64(), &group["Promoted"]), (Some(1), &json!(false)), "{group}");
    let canary = group["PlacedCanaries"][0].as_str().expect("a canary").to_string();
    let stub = json_of(api, "GET", &format!("/v1/deployment/allocations/{id}"), None).await;
    assert_eq!(stub.as_array().map(Vec::len), Some(1), "only the canary so far: {stub}");
    assert_eq!((id_of(&stub[0]), &stub[0]["DeploymentStatus"]["Canary"]), (canary.clone(), &json!(true)));
    let status = cluster.cli_ok(&["deployment", "status", &id]).await;
    let table = words(&status);
    assert_eq!(table[7][..5], ["Task", "Group", "Promoted", "Desired", "Canaries"], "{status}");
    assert_eq!(table[8][..3], ["web", "false", "2"], "{status}");

    // Bodies are checked before anything is written; the method too.
    let promote = format!("/v1/deployment/promote/{id}");
    assert_eq!(refusal(api, "PUT", &promote, None).await, (400, "Request body is empty".into()));
    assert_eq!(refusal(api, "PUT", &promote, Some(&json!({"All": true}))).await.1, "DeploymentID must be specified");
    let other = json!({"DeploymentID": "00000000-0000-4000-8000-000000000000", "All": true});
    assert_eq!(refusal(api, "PUT", &promote, Some(&other)).await, (400, "Deployment ID does not match".into()));
    assert_eq!(send(api, "GET", &promote, None).await.status, 405);
    let nope = json!({"DeploymentID": id, "Groups": ["nope"]});
    assert_eq!(refusal(api, "PUT", &promote, Some(&nope)).await.0, 500, "an unknown group");

    // Pause (keys in any case, as Go reads them), woken blocking query; resume with the CLI.
    let index = waiting["ModifyIndex"].as_u64().expect("an index");
    let watcher = api.clone();
    let path = format!("/v1/deployment/{id}?index={index}&wait=60s");
    let blocked = tokio::spawn(async move { watcher.get(&path).await.expect("an answer") });
    let paused =
        json_of(api, "POST", &format!("/v1/deployment/pause/{id}"), Some(&json!({"deploymentid": id, "pause": true})))
            .await;
    assert_eq!(paused["EvalID"], "", "a pause makes no eval: {paused}");
    assert!(paused["Index"].as_u64().is_some_and(|at| at > index), "{paused}");
    let woken = bounded("the blocking query wakes", blocked).await.expect("the query's task");
    let woken = woken.json().expect("JSON");
    assert_eq!(
        (woken["Status"].as_str(), woken["StatusDescription"].as_str()),
        (Some("paused"), Some("Deployment is paused"))
    );
    let resumed = cluster.cli_ok(&["deployment", "resume", "--detach", &id[..8]]).await;
    assert_eq!(resumed, format!("Deployment \"{id}\" resumed\n"));
    let running = json_of(api, "GET", &format!("/v1/deployment/{id}"), None).await;
    assert_eq!(running["StatusDescription"], "Deployment is running but requires manual promotion");

    // Health verdicts: none, an allocation of another deployment, no allocation at all.
    let health = format!("/v1/deployment/allocation-health/{id}");
    let empty = json!({"DeploymentID": id, "HealthyAllocationIDs": []});
    assert_eq!(
        refusal(api, "PUT", &health, Some(&empty)).await,
        (500, "must specify at least one healthy/unhealthy allocation ID".into())
    );
    let older = json_of(api, "GET", &format!("/v1/deployment/allocations/{}", id_of(&first)), None).await;
    let older = id_of(&older[0]);
    let foreign = json!({"DeploymentID": id, "HealthyAllocationIDs": [older]});
    assert_eq!(
        refusal(api, "PUT", &health, Some(&foreign)).await,
        (500, format!("alloc \"{older}\" is not part of deployment \"{id}\""))
    );
    let bogus = json!({"DeploymentID": id, "HealthyAllocationIDs": ["nope"]});
    assert_eq!(refusal(api, "PUT", &health, Some(&bogus)).await, (500, "unknown alloc \"nope\"".into()));
    assert_eq!(refusal(api, "PUT", &health, Some(&json!({"HealthyAllocationIDs": [canary]}))).await.0, 400);

    // The CLI promotes and follows the deployment to its end; the version turns stable.
    let promoted = cluster.cli_ok(&["deployment", "promote", &id[..8]]).await;
    assert!(promoted.contains(&format!("Deployment \"{}\" successful", &id[..8])), "{promoted}");
    let done = json_of(api, "GET", &format!("/v1/deployment/{id}"), None).await;
    assert_eq!((done["Status"].as_str(), &done["TaskGroups"]["web"]["Promoted"]), (Some("successful"), &json!(true)));
    let versions = json_of(api, "GET", "/v1/job/web/versions", None).await;
    assert_eq!(
        (versions["Versions"][0]["Version"].as_u64(), &versions["Versions"][0]["Stable"]),
        (Some(1), &json!(true))
    );
    let promoted_canary = json_of(api, "GET", &format!("/v1/allocation/{canary}"), None).await;
    assert_eq!(promoted_canary["DeploymentStatus"]["Canary"], false, "no longer a canary once promoted");
    assert_eq!(promoted_canary["DeploymentStatus"]["Healthy"], true);

    // A deployment that ended changes no more: Nomad's RPC errors, 500.
    let terminal = [
        ("fail", json!({"DeploymentID": id}), "can't fail terminal deployment"),
        ("pause", json!({"DeploymentID": id, "Pause": true}), "can't pause terminal deployment"),
        ("pause", json!({"DeploymentID": id, "Pause": false}), "can't resume terminal deployment"),
        ("promote", json!({"DeploymentID": id, "All": true}), "can't promote terminal deployment"),
    ];
    for (verb, body, message) in terminal {
        let path = format!("/v1/deployment/{verb}/{id}");
        assert_eq!(refusal(api, "POST", &path, Some(&body)).await, (500, message.to_string()), "{verb} {body}");
    }

    // Unknown deployments: 404 on reads, Nomad's RPC error (500) on writes.
    let unknown = "00000000-0000-4000-8000-000000000000";
    let not_found = (404, "deployment not found".to_string());
    assert_eq!(refusal(api, "GET", &format!("/v1/deployment/{unknown}"), None).await, not_found);
    assert_eq!(refusal(api, "GET", "/v1/deployment/not-an-id", None).await, not_found);
    let path = format!("/v1/deployment/fail/{unknown}");
    assert_eq!(refusal(api, "PUT", &path, None).await, (500, "deployment not found".into()));
    let body = json!({"DeploymentID": unknown, "Pause": true});
    let path = format!("/v1/deployment/pause/{unknown}");
    assert_eq!(refusal(api, "PUT", &path, Some(&body)).await, (500, "deployment not found".into()));
    let missing = cluster.cli(&["deployment", "status", "0000"]).await;
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("matched no deployments"), "{missing:?}");

    // Version 2 is failed by the operator with the CLI.
    json_of(api, "PUT", "/v1/jobs", Some(&job(602, 1))).await;
    let second = latest_until(api, "version 2's canary placed", |d| {
        d["JobVersion"] == 2 && d["TaskGroups"]["web"]["PlacedAllocs"] == 1
    })
    .await;
    let second_id = id_of(&second);
    let failed = cluster.cli_ok(&["deployment", "fail", "--detach", &second_id[..8]]).await;
    assert_eq!(failed, format!("Deployment \"{second_id}\" failed\n"));
    let failed = json_of(api, "GET", &format!("/v1/deployment/{second_id}"), None).await;
    assert_eq!(
        (failed["Status"].as_str(), failed["StatusDescription"].as_str()),
        (Some("failed"), Some("Deployment marked as failed"))
    );

    // Version 3's canary is marked unhealthy with python-nomad's spelling of the key.
    json_of(api, "PUT", "/v1/jobs", Some(&job(603, 1))).await;
    let third = latest_until(api, "version 3's canary placed", |d| {
        d["JobVersion"] == 3 && d["TaskGroups"]["web"]["PlacedCanaries"].as_array().is_some_and(|c| !c.is_empty())
    })
    .await;
    let third_id = id_of(&third);
    let third_canary = third["TaskGroups"]["web"]["PlacedCanaries"][0].clone();
    let verdict = json!({"DeploymentID": third_id, "UnHealthyAllocationIDs": [third_canary]});
    let answer = json_of(api, "POST", &format!("/v1/deployment/allocation-health/{third_id}"), Some(&verdict)).await;
    assert_eq!(answer["RevertedJobVersion"], Value::Null, "no group auto-reverts");
    let failed = json_of(api, "GET", &format!("/v1/deployment/{third_id}"), None).await;
    assert_eq!(
        (failed["Status"].as_str(), failed["StatusDescription"].as_str()),
        (Some("failed"), Some("Failed due to unhealthy allocations"))
    );
    let marked = json_of(api, "GET", &format!("/v1/allocation/{}", third_canary.as_str().expect("an id")), None).await;
    assert_eq!(marked["DeploymentStatus"]["Healthy"], false);

    // Newest first, everywhere.
    let listed: Vec<String> =
        json_of(api, "GET", "/v1/deployments", None).await.as_array().expect("a list").iter().map(id_of).collect();
    assert_eq!(listed[..3], [third_id.clone(), second_id.clone(), id.clone()]);
    let of_job: Vec<String> = json_of(api, "GET", "/v1/job/web/deployments", None)
        .await
        .as_array()
        .expect("a list")
        .iter()
        .map(id_of)
        .collect();
    assert_eq!(of_job, listed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_reads_need_read_and_writes_need_write_in_the_namespace() {
    let (_server, http, secret) = common::acl_server("deployments-acl").await;
    let management = ApiClient::new(&http, Some(secret), None).expect("client");
    let policy = json!({"Name": "readers", "Rules": "namespace \"default\" { policy = \"read\" }"});
    assert_eq!(send(&management, "PUT", "/v1/acl/policy/readers", Some(&policy)).await.status, 200);
    let token = json!({"Name": "r", "Type": "client", "Policies": ["readers"]});
    let token = json_of(&management, "POST", "/v1/acl/token", Some(&token)).await;
    let reader = ApiClient::new(&http, Some(token["SecretID"].as_str().expect("secret").into()), None).expect("client");
    let anonymous = ApiClient::new(&http, None, None).expect("client");
    let unknown = "00000000-0000-4000-8000-000000000000";

    for path in ["/v1/deployments".to_string(), "/v1/job/web/deployments".to_string()] {
        assert_eq!(json_of(&reader, "GET", &path, None).await, json!([]), "{path}");
        assert_eq!(send(&anonymous, "GET", &path, None).await.status, 403, "{path}");
    }
    assert_eq!(json_of(&reader, "GET", "/v1/job/web/deployment", None).await, Value::Null);
    assert_eq!(send(&reader, "GET", &format!("/v1/deployment/{unknown}"), None).await.status, 404);
    let writes = [
        ("fail", json!({"DeploymentID": unknown})),
        ("pause", json!({"DeploymentID": unknown, "Pause": true})),
        ("promote", json!({"DeploymentID": unknown, "All": true})),
        ("allocation-health", json!({"DeploymentID": unknown, "HealthyAllocationIDs": [unknown]})),
    ];
    for (verb, body) in writes {
        let path = format!("/v1/deployment/{verb}/{unknown}");
        assert_eq!(refusal(&reader, "PUT", &path, Some(&body)).await, (403, "Permission denied".into()), "{verb}");
        assert_eq!(refusal(&management, "PUT", &path, Some(&body)).await, (500, "deployment not found".into()));
    }
}
