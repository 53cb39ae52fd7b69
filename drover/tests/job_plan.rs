//! `job plan`, the job diff and `validate/job` through Nomad's HTTP API and
//! the CLI, against a real in-process server (ACLs on) with two mock nodes
//! and its HTTP API on a loopback port: the plan of a new job (all added,
//! placements, exit 1, nothing written), of an unchanged job (exit 0), of a
//! count change and of a destructive change (annotated as Nomad annotates
//! them), of a job that cannot be placed (Drover's per-class account), the
//! plan's refusals, `job run --check-index` refusing a stale index,
//! `versions?diffs=true`, and `validate/job` on a good and a bad job.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::api::{json_of, send};
use common::bounded;
use drover::api::client::ApiClient;
use drover::server::RunningServer;
use engine::state::Snapshot;
use engine::structs::JobKey;
use serde_json::{json, Value};

struct Fixture {
    server: RunningServer,
    http: String,
    api: ApiClient,
    secret: String,
    dir: PathBuf,
}

async fn fixture() -> Fixture {
    let (server, http, secret) = common::acl_server("plan-test").await;
    for n in 1..=2 {
        let mut node = common::mock_node(n);
        node.name = format!("node-{n}");
        server.engine().nodes().register(node).expect("the node registers");
    }
    let api = ApiClient::new(&http, Some(secret.clone()), None).expect("client");
    let dir = common::temp_dir("job-plan");
    Fixture { server, http, api, secret, dir }
}

/// Nomad's JSON for job `web`: group `web` of `count`, a mock task running for `run_for`.
fn job(count: u32, run_for: &str) -> Value {
    json!({"Job": {"ID": "web", "Name": "web", "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "web", "Count": count,
            "Tasks": [{"Name": "server", "Driver": "mock", "Config": {"run_for": run_for},
                "Resources": {"CPU": 100, "MemoryMB": 64}}]}]}})
}

/// The plan of `job` with its diff.
async fn plan(fixture: &Fixture, job: &Value) -> Value {
    let mut body = job.clone();
    body["Diff"] = json!(true);
    json_of(&fixture.api, "PUT", "/v1/job/web/plan", Some(&body)).await
}

/// Registers `job` and waits until `count` of its allocations are live.
async fn register(fixture: &Fixture, job: &Value, count: usize) -> Value {
    let written = json_of(&fixture.api, "PUT", "/v1/jobs", Some(job)).await;
    let key = JobKey { namespace: Arc::from("default"), id: Arc::from("web") };
    let eval_index = written["EvalCreateIndex"].as_u64().expect("an index");
    common::until(&fixture.server, "the job's eval is processed and placed", |snapshot: &Snapshot| {
        let evals_done = snapshot.evals_by_job(&key).all(|eval| eval.status.is_terminal());
        let live = snapshot.allocs_by_job(&key).filter(|alloc| !alloc.terminal()).count();
        snapshot.index() > eval_index && evals_done && live == count
    })
    .await;
    written
}

/// The file `name` holding `job`.
fn file(fixture: &Fixture, name: &str, job: &Value) -> PathBuf {
    let path = fixture.dir.join(name);
    std::fs::write(&path, job.to_string()).expect("a job file");
    path
}

async fn cli(fixture: &Fixture, args: &[&str], path: &Path) -> (i32, String, String) {
    let mut command = common::drover();
    command.args(args).arg(path).env("DROVER_ADDR", &fixture.http).env("DROVER_TOKEN", &fixture.secret);
    let output =
        bounded("the CLI answers", tokio::task::spawn_blocking(move || command.output().expect("drover runs")))
            .await
            .expect("the CLI task");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code().expect("an exit code"), text(&output.stdout), text(&output.stderr))
}

fn group_updates(plan: &Value) -> &Value {
    &plan["Annotations"]["DesiredTGUpdates"]["web"]
}

/// The diff's field `name` of group `web`.
fn group_field<'a>(plan: &'a Value, name: &str) -> &'a Value {
    let fields = plan["Diff"]["TaskGroups"][0]["Fields"].as_array().expect("fields");
    fields.iter().find(|field| field["Name"] == name).unwrap_or_else(|| panic!("field {name}: {fields:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_diffs_and_validation_as_nomad_answers_them() {
    let fixture = fixture().await;
    let api = &fixture.api;

    // A new job: everything added, two placements, nothing written.
    let index_before = fixture.server.leadership().store().latest_index();
    let new = plan(&fixture, &job(2, "1h")).await;
    assert_eq!(new["Diff"]["Type"], "Added");
    assert_eq!(new["Diff"]["TaskGroups"][0]["Type"], "Added");
    assert_eq!(new["Diff"]["TaskGroups"][0]["Tasks"][0]["Annotations"], json!(["forces create"]));
    assert_eq!(new["Diff"]["TaskGroups"][0]["Updates"], json!({"create": 2}));
    assert_eq!(group_updates(&new)["Place"], 2);
    assert_eq!(new["Annotations"]["PreemptedAllocs"], Value::Null);
    assert_eq!((new["JobModifyIndex"].as_u64(), &new["FailedTGAllocs"]), (Some(0), &Value::Null));
    assert_eq!(new["NextPeriodicLaunch"], "0001-01-01T00:00:00Z");
    assert_eq!(fixture.server.leadership().store().latest_index(), index_before, "a plan writes nothing");
    assert_eq!(send(api, "GET", "/v1/job/web", None).await.status, 404);
    let (code, out, err) = cli(&fixture, &["job", "plan"], &file(&fixture, "new.json", &job(2, "1h"))).await;
    assert_eq!(code, 1, "changes: exit 1\n{out}{err}");
    assert!(out.starts_with("+ Job: \"web\"\n+ Task Group: \"web\" (2 create)\n"), "{out}");
    assert!(out.contains("Scheduler dry-run:\n- All tasks successfully allocated."), "{out}");
    assert!(out.contains("Job Modify Index: 0\n"), "{out}");

    // Unchanged: nothing created or destroyed, exit 0.
    let written = register(&fixture, &job(2, "1h"), 2).await;
    let modify_index = written["JobModifyIndex"].as_u64().expect("an index");
    let same = plan(&fixture, &job(2, "1h")).await;
    assert_eq!((same["Diff"]["Type"].as_str(), same["JobModifyIndex"].as_u64()), (Some("None"), Some(modify_index)));
    assert_eq!((group_updates(&same)["Ignore"].as_u64(), group_updates(&same)["Place"].as_u64()), (Some(2), Some(0)));
    let unchanged = file(&fixture, "same.json", &job(2, "1h"));
    let (code, out, _) = cli(&fixture, &["job", "plan"], &unchanged).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("Job: \"web\"\nTask Group: \"web\" (2 ignore)\n  Task: \"server\"\n"), "{out}");
    assert!(out.contains(&format!("drover job run --check-index {modify_index} ")), "{out}");

    // A count change: one placement, the two kept moved in place.
    let scaled = plan(&fixture, &job(3, "1h")).await;
    let count = group_field(&scaled, "Count");
    assert_eq!(
        (count["Type"].as_str(), count["Old"].as_str(), count["New"].as_str()),
        (Some("Edited"), Some("2"), Some("3"))
    );
    assert_eq!(count["Annotations"], json!(["forces create"]));
    assert_eq!(scaled["Diff"]["TaskGroups"][0]["Updates"], json!({"create": 1, "in-place update": 2}));
    let (code, out, _) = cli(&fixture, &["job", "plan"], &file(&fixture, "scaled.json", &job(3, "1h"))).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("+/- Task Group: \"web\" (1 create, 2 in-place update)\n"), "{out}");
    assert!(out.contains("+/- Count: \"2\" => \"3\" (forces create)"), "{out}");

    // A destructive change, the task's config. No agent runs the old
    // allocations here: they serve nothing, so the disruption budget lets
    // both be replaced at once (running ones would go one at a time, by
    // Nomad's default `max_parallel = 1`).
    let changed = plan(&fixture, &job(2, "2h")).await;
    let updates = group_updates(&changed);
    assert_eq!((updates["DestructiveUpdate"].as_u64(), updates["Ignore"].as_u64()), (Some(2), Some(0)), "{updates}");
    assert_eq!(updates["Stop"], 0, "the old ones are not stops");
    assert_eq!(changed["Diff"]["TaskGroups"][0]["Updates"], json!({"create/destroy update": 2}));
    let task = &changed["Diff"]["TaskGroups"][0]["Tasks"][0];
    assert_eq!(
        (task["Type"].as_str(), &task["Annotations"]),
        (Some("Edited"), &json!(["forces create/destroy update"]))
    );
    let config = task["Objects"].as_array().expect("objects").iter().find(|o| o["Name"] == "Config").expect("Config");
    assert_eq!(
        config["Fields"][0],
        json!({"Type": "Edited", "Name": "run_for", "Old": "1h", "New": "2h", "Annotations": null})
    );
    let (code, out, _) = cli(&fixture, &["job", "plan"], &file(&fixture, "changed.json", &job(2, "2h"))).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("  +/- Task: \"server\" (forces create/destroy update)\n"), "{out}");

    // A job that cannot be placed: Nomad's metric and Drover's classes.
    let mut huge = job(1, "1h");
    huge["Job"]["TaskGroups"][0]["Tasks"][0]["Resources"]["MemoryMB"] = json!(1_000_000);
    let failed = plan(&fixture, &huge).await;
    let metric = &failed["FailedTGAllocs"]["web"];
    assert_eq!(metric["DimensionExhausted"]["memory"], 2, "{metric}");
    let classes = metric["DroverFilteredClasses"].as_array().expect("Drover's classes");
    assert_eq!(classes.len(), 1, "two nodes of one class: {classes:?}");
    assert_eq!((classes[0]["Reason"].as_str(), classes[0]["Exhausted"].as_bool()), (Some("memory"), Some(true)));
    assert_eq!(classes[0]["Nodes"], 2);
    let names: Vec<&str> =
        classes[0]["ExampleNodes"].as_array().expect("examples").iter().filter_map(|n| n["Name"].as_str()).collect();
    assert_eq!(names, vec!["node-1", "node-2"]);
    assert!(failed["CreatedEvals"].as_array().is_some_and(|evals| evals[0]["Status"] == "blocked"), "{failed}");
    let (code, out, _) = cli(&fixture, &["job", "plan"], &file(&fixture, "huge.json", &huge)).await;
    assert_eq!(code, 1, "a placement asked for is a change: {out}");
    assert!(
        out.contains(
            "- WARNING: Failed to place all allocations.\n  Task Group \"web\" (failed to place 1 allocation):"
        ),
        "{out}"
    );
    assert!(out.contains("* Drover: node class \"\" (computed "), "{out}");

    // The plan's refusals, Nomad's words.
    let refused = |body: Value, path: &'static str| async move { send(api, "PUT", path, Some(&body)).await };
    let no_job = refused(json!({"Diff": true}), "/v1/job/web/plan").await;
    assert_eq!((no_job.status, no_job.body.as_str()), (400, "Job must be specified"));
    let other = refused(job(1, "1h"), "/v1/job/other/plan").await;
    assert_eq!((other.status, other.body.as_str()), (400, "Job ID does not match"));
    let no_id = refused(json!({"job": {"Name": "web"}}), "/v1/job/web/plan").await;
    assert_eq!((no_id.status, no_id.body.as_str()), (400, "Job must specify a valid ID"), "keys in any case");

    // `job run --check-index`: a stale index is refused, the current one registers.
    let (code, _, err) = cli(&fixture, &["job", "run", "--detach", "--check-index", "1"], &unchanged).await;
    assert_ne!(code, 0);
    assert!(
        err.contains(&format!(
            "Enforcing job modify index 1: job exists with conflicting job modify index: {modify_index}"
        )),
        "{err}"
    );
    let scaled_file = file(&fixture, "scaled-run.json", &job(3, "1h"));
    let index = modify_index.to_string();
    let (code, out, err) = cli(&fixture, &["job", "run", "--detach", "--check-index", &index], &scaled_file).await;
    assert_eq!(code, 0, "{out}{err}");

    // The versions' diffs: Diffs[0] is from version 0 to version 1.
    let versions = json_of(api, "GET", "/v1/job/web/versions?diffs=true", None).await;
    let diffs = versions["Diffs"].as_array().expect("diffs");
    assert_eq!(diffs.len(), 1);
    let fields = diffs[0]["TaskGroups"][0]["Fields"].as_array().expect("fields");
    let count = fields.iter().find(|field| field["Name"] == "Count").expect("Count");
    assert_eq!((count["Old"].as_str(), count["New"].as_str()), (Some("2"), Some("3")));

    // validate/job: 200 either way, the problems listed.
    let good = json_of(api, "PUT", "/v1/validate/job", Some(&job(1, "1h"))).await;
    assert_eq!(good, json!({"DriverConfigValidated": true, "ValidationErrors": [], "Error": "", "Warnings": ""}));
    let bad = json_of(api, "POST", "/v1/validate/job", Some(&json!({"Job": {"ID": "x", "TaskGroups": []}}))).await;
    let errors = bad["ValidationErrors"].as_array().expect("errors");
    assert!(!errors.is_empty() && bad["Error"].as_str().is_some_and(|error| error.contains("datacenters")), "{bad}");
    let empty = send(api, "PUT", "/v1/validate/job", Some(&json!({}))).await;
    assert_eq!((empty.status, empty.body.as_str()), (400, "Job must be specified"));
}
