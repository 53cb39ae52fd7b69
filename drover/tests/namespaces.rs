//! Namespaces against a real `drover server --dev --acl-enabled` with a
//! real `drover agent --dev`:
//! - isolation, table-driven: two namespaces, `team-a` and `team-b`, each
//!   with a job of the same id, and a token with `write` on one of them
//!   each; every namespaced endpoint is called on `team-a`'s objects with
//!   both tokens, and answers the status the table says (the other team's
//!   token: 403, and nothing changes);
//! - `namespace=*` lists show each token only its own namespace's objects;
//! - capabilities lists and globs grant exactly what they name;
//! - a job in an undeclared namespace is refused, `default` cannot be
//!   deleted, a namespace holding a job cannot either;
//! - `drover namespace apply|list|status|delete`, and `--namespace` on
//!   the other verbs.

mod common;

use common::api::{json_of, send, until};
use common::dev::DevCluster;
use drover::api::client::ApiClient;
use serde_json::{json, Value};

/// A service job `web` in `namespace`, a real process (`raw_exec`, so the
/// client operations reach it), whose one allocation turns healthy at once.
fn web_job(namespace: &str) -> Value {
    json!({"Job": {"ID": "web", "Name": "web", "Namespace": namespace, "Type": "service", "Datacenters": ["dc1"],
        "Update": {"MinHealthyTime": 0, "HealthyDeadline": 60_000_000_000u64, "ProgressDeadline": 120_000_000_000u64},
        "TaskGroups": [{"Name": "web", "Count": 1,
            "Tasks": [{"Name": "web", "Driver": "raw_exec", "KillTimeout": 1_000_000_000u64,
                "Config": {"command": "sleep", "args": ["3600"]},
                "Resources": {"CPU": 100, "MemoryMB": 64}}]}]}})
}

/// The cluster, the management token's client, and a client per team.
struct Teams {
    cluster: DevCluster,
    management: ApiClient,
    management_secret: String,
    a: ApiClient,
    b: ApiClient,
}

fn client(cluster: &DevCluster, secret: &Value) -> ApiClient {
    ApiClient::new(&cluster.http, secret.as_str().map(str::to_string), None).expect("client")
}

/// A token whose one policy has `rules`.
async fn token_with(teams_management: &ApiClient, name: &str, rules: &str) -> Value {
    let policy = json!({"Name": name, "Rules": rules});
    json_of(teams_management, "PUT", &format!("/v1/acl/policy/{name}"), Some(&policy)).await;
    let token = json!({"Name": name, "Type": "client", "Policies": [name]});
    json_of(teams_management, "PUT", "/v1/acl/token", Some(&token)).await
}

async fn teams(name: &str) -> Teams {
    let cluster = DevCluster::start(name, &["--acl-enabled"]).await;
    let bootstrap = json_of(&cluster.api, "PUT", "/v1/acl/bootstrap", None).await;
    let management = client(&cluster, &bootstrap["SecretID"]);
    for team in ["team-a", "team-b"] {
        let namespace = json!({"Name": team, "Description": format!("{team}'s jobs")});
        json_of(&management, "PUT", &format!("/v1/namespace/{team}"), Some(&namespace)).await;
    }
    let a = token_with(&management, "a-write", "namespace \"team-a\" { policy = \"write\" }").await;
    let b = token_with(&management, "b-write", "namespace \"team-b\" { policy = \"write\" }").await;
    let management_secret = bootstrap["SecretID"].as_str().expect("a secret").to_string();
    Teams {
        a: client(&cluster, &a["SecretID"]),
        b: client(&cluster, &b["SecretID"]),
        cluster,
        management,
        management_secret,
    }
}

/// `team`'s `web` running and its deployment successful; its allocation,
/// evaluation and deployment ids.
async fn running(api: &ApiClient, team: &str) -> (String, String, String) {
    let path = format!("/v1/job/web/allocations?namespace={team}");
    let allocs = until(api, &path, "web runs", |allocs| {
        allocs.as_array().is_some_and(|allocs| allocs.iter().any(|alloc| alloc["ClientStatus"] == "running"))
    })
    .await;
    let alloc = allocs[0]["ID"].as_str().expect("an id").to_string();
    let eval = allocs[0]["EvalID"].as_str().expect("an eval").to_string();
    let deployment = until(api, &format!("/v1/job/web/deployment?namespace={team}"), "the deployment succeeds", |d| {
        d["Status"] == "successful"
    })
    .await;
    (alloc, eval, deployment["ID"].as_str().expect("an id").to_string())
}

/// One row: a request on `team-a`'s objects, and the status each token gets.
struct Row {
    method: &'static str,
    path: String,
    body: Option<Value>,
    /// What `team-a`'s token gets.
    own: u16,
    /// What `team-b`'s token gets.
    other: u16,
}

fn row(method: &'static str, path: impl Into<String>, body: Option<Value>, own: u16) -> Row {
    Row { method, path: path.into(), body, own, other: 403 }
}

/// The status `api` gets for `row`, and the start of the body.
async fn status_of(api: &ApiClient, row: &Row) -> (u16, String) {
    if row.method == "STREAM" {
        return (api.stream(&row.path).await.expect("connects").status, String::new());
    }
    let answer = send(api, row.method, &row.path, row.body.as_ref()).await;
    (answer.status, answer.body.chars().take(160).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_for_one_namespace_can_neither_read_nor_write_another() {
    let teams = teams("namespaces-isolation").await;
    json_of(&teams.a, "PUT", "/v1/jobs", Some(&web_job("team-a"))).await;
    json_of(&teams.b, "PUT", "/v1/jobs", Some(&web_job("team-b"))).await;
    let (alloc, eval, deployment) = running(&teams.a, "team-a").await;
    running(&teams.b, "team-b").await;

    let ns = "namespace=team-a";
    let plan = json!({"Job": web_job("team-a")["Job"].clone(), "Diff": true});
    let search = json!({"Prefix": "", "Context": "all", "Namespace": "team-a"});
    let hcl = json!({"JobHCL": "job \"x\" {\n group \"g\" {\n task \"t\" {\n driver = \"mock\"\n }\n }\n}"});
    let rows = vec![
        // Jobs.
        row("GET", format!("/v1/jobs?{ns}"), None, 200),
        row("GET", format!("/v1/job/web?{ns}"), None, 200),
        row("GET", format!("/v1/job/web/allocations?{ns}"), None, 200),
        row("GET", format!("/v1/job/web/evaluations?{ns}"), None, 200),
        row("GET", format!("/v1/job/web/deployments?{ns}"), None, 200),
        row("GET", format!("/v1/job/web/deployment?{ns}"), None, 200),
        row("GET", format!("/v1/job/web/summary?{ns}"), None, 200),
        row("GET", format!("/v1/job/web/versions?{ns}"), None, 200),
        row("GET", format!("/v1/job/web/services?{ns}"), None, 200),
        row("GET", format!("/v1/job/web/scale?{ns}"), None, 200),
        row("PUT", format!("/v1/job/web/plan?{ns}"), Some(plan.clone()), 200),
        row("PUT", "/v1/job/web/plan", Some(plan), 200),
        row("PUT", format!("/v1/job/web?{ns}"), Some(web_job("team-a")), 200),
        row("PUT", "/v1/jobs", Some(web_job("team-a")), 200),
        row("PUT", format!("/v1/validate/job?{ns}"), Some(web_job("team-a")), 200),
        row("PUT", format!("/v1/jobs/parse?{ns}"), Some(hcl), 200),
        row("PUT", "/v1/search", Some(search), 200),
        row(
            "PUT",
            format!("/v1/job/web/stable?{ns}"),
            Some(json!({"JobID": "web", "JobVersion": 0, "Stable": true})),
            200,
        ),
        row("PUT", format!("/v1/job/web/revert?{ns}"), Some(json!({"JobVersion": 0})), 400),
        row("PUT", format!("/v1/job/web/evaluate?{ns}"), Some(json!({})), 200),
        // Nomad answers these refusals 500 too.
        row("PUT", format!("/v1/job/web/dispatch?{ns}"), Some(json!({})), 500),
        row("PUT", format!("/v1/job/web/periodic/force?{ns}"), None, 500),
        row("PUT", format!("/v1/job/web/scale?{ns}"), Some(json!({"Count": 1, "Target": {"Group": "web"}})), 200),
        // Allocations, evaluations, deployments.
        row("GET", format!("/v1/allocations?{ns}"), None, 200),
        row("GET", format!("/v1/allocation/{alloc}"), None, 200),
        row("GET", format!("/v1/allocation/{alloc}/services"), None, 200),
        row("GET", format!("/v1/allocation/{alloc}/checks"), None, 200),
        row("GET", format!("/v1/evaluations?{ns}"), None, 200),
        row("GET", format!("/v1/evaluation/{eval}"), None, 200),
        row("GET", format!("/v1/evaluation/{eval}/allocations"), None, 200),
        row("GET", format!("/v1/deployments?{ns}"), None, 200),
        row("GET", format!("/v1/deployment/{deployment}"), None, 200),
        row("GET", format!("/v1/deployment/allocations/{deployment}"), None, 200),
        row("PUT", format!("/v1/deployment/pause/{deployment}"), Some(json!({"Pause": true})), 400),
        row("PUT", format!("/v1/deployment/promote/{deployment}"), Some(json!({"All": true})), 400),
        row("PUT", format!("/v1/deployment/fail/{deployment}"), None, 500),
        row(
            "PUT",
            format!("/v1/deployment/allocation-health/{deployment}"),
            Some(json!({"HealthyAllocationIDs": [alloc]})),
            400,
        ),
        // Services.
        row("GET", format!("/v1/services?{ns}"), None, 200),
        row("GET", format!("/v1/service/web?{ns}"), None, 200),
        row("DELETE", format!("/v1/service/web/_nomad-task-none?{ns}"), None, 404),
        // The client operations on the allocation.
        row("GET", format!("/v1/client/allocation/{alloc}/stats"), None, 200),
        row("GET", format!("/v1/client/allocation/{alloc}/checks"), None, 200),
        row("GET", format!("/v1/client/fs/ls/{alloc}?path=/"), None, 200),
        row("GET", format!("/v1/client/fs/stat/{alloc}?path=/"), None, 200),
        row("GET", format!("/v1/client/fs/logs/{alloc}?task=web&type=stdout&plain=true"), None, 200),
        // A signal `sleep` ignores: the task still runs for the restart below
        // (SIGHUP ended it, and the restart raced the agent noticing).
        row("PUT", format!("/v1/client/allocation/{alloc}/signal"), Some(json!({"Signal": "SIGWINCH"})), 200),
        row("PUT", format!("/v1/client/allocation/{alloc}/restart"), Some(json!({})), 200),
        // The rest.
        row("STREAM", format!("/v1/event/stream?topic=Job&{ns}"), None, 200),
        row("GET", "/v1/namespace/team-a", None, 200),
        row("GET", format!("/v1/scaling/policies?{ns}"), None, 200),
        // Last, what ends the job.
        row("PUT", format!("/v1/allocation/{alloc}/stop"), None, 200),
        row("DELETE", format!("/v1/job/web?{ns}"), None, 200),
    ];

    let before = json_of(&teams.management, "GET", "/v1/job/web?namespace=team-a", None).await;
    let mut wrong = Vec::new();
    for row in &rows {
        let (got, body) = status_of(&teams.b, row).await;
        if got != row.other {
            wrong.push(format!("team-b: {} {} answered {got}, not {}: {body}", row.method, row.path, row.other));
        }
    }
    let after = json_of(&teams.management, "GET", "/v1/job/web?namespace=team-a", None).await;
    assert_eq!(before["ModifyIndex"], after["ModifyIndex"], "team-b's refused requests changed team-a's job");
    for row in &rows {
        let (got, body) = status_of(&teams.a, row).await;
        if got != row.own {
            wrong.push(format!("team-a: {} {} answered {got}, not {}: {body}", row.method, row.path, row.own));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} requests answered otherwise:\n{}",
        wrong.len(),
        rows.len() * 2,
        wrong.join("\n")
    );
    let b_job = json_of(&teams.b, "GET", "/v1/job/web?namespace=team-b", None).await;
    assert_eq!(b_job["Stop"], false, "team-a's stop of its own web left team-b's alone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_of_every_namespace_show_each_token_its_own() {
    let teams = teams("namespaces-lists").await;
    json_of(&teams.a, "PUT", "/v1/jobs", Some(&web_job("team-a"))).await;
    json_of(&teams.b, "PUT", "/v1/jobs", Some(&web_job("team-b"))).await;
    running(&teams.a, "team-a").await;
    running(&teams.b, "team-b").await;
    for path in ["/v1/jobs", "/v1/allocations", "/v1/evaluations", "/v1/deployments"] {
        let every = json_of(&teams.management, "GET", &format!("{path}?namespace=*"), None).await;
        let namespaces = |list: &Value| -> Vec<String> {
            let mut names: Vec<String> = list
                .as_array()
                .expect("a list")
                .iter()
                .map(|item| item["Namespace"].as_str().expect("a namespace").to_string())
                .collect();
            names.sort();
            names.dedup();
            names
        };
        assert_eq!(namespaces(&every), ["team-a", "team-b"], "{path}: management sees both");
        let a = json_of(&teams.a, "GET", &format!("{path}?namespace=*"), None).await;
        assert_eq!(namespaces(&a), ["team-a"], "{path}: team-a sees its own");
        let b = json_of(&teams.b, "GET", &format!("{path}?namespace=*"), None).await;
        assert_eq!(namespaces(&b), ["team-b"], "{path}: team-b sees its own");
    }
    let search = json!({"Prefix": "", "Context": "all", "Namespace": "*"});
    let found = json_of(&teams.a, "PUT", "/v1/search", Some(&search)).await;
    let allocs = json_of(&teams.a, "GET", "/v1/allocations?namespace=team-a", None).await;
    let own: Vec<&str> = allocs.as_array().expect("a list").iter().filter_map(|alloc| alloc["ID"].as_str()).collect();
    let matched: Vec<&str> =
        found["Matches"]["allocs"].as_array().expect("allocs").iter().filter_map(Value::as_str).collect();
    assert_eq!(matched, own, "a search of every namespace finds team-a's allocation only");
    assert_eq!(found["Matches"]["nodes"], json!([]), "nodes need node read");

    let names = |list: Value| -> Vec<String> {
        list.as_array().expect("a list").iter().map(|ns| ns["Name"].as_str().expect("a name").to_string()).collect()
    };
    assert_eq!(names(json_of(&teams.management, "GET", "/v1/namespaces", None).await), ["default", "team-a", "team-b"]);
    assert_eq!(names(json_of(&teams.a, "GET", "/v1/namespaces", None).await), ["team-a"]);
    assert_eq!(send(&teams.a, "GET", "/v1/namespace/default", None).await.status, 403);
    assert_eq!(send(&teams.a, "PUT", "/v1/namespace/team-a", Some(&json!({"Description": "mine"}))).await.status, 403);
    assert_eq!(send(&teams.a, "DELETE", "/v1/namespace/team-b", None).await.status, 403);

    // The event stream of every namespace carries only what the token may read.
    let mut stream = teams.a.stream("/v1/event/stream?topic=Job&namespace=*&index=1").await.expect("connects");
    assert_eq!(stream.status, 200);
    let frames = common::bounded("team-a's job events", async {
        let mut namespaces = Vec::new();
        while !namespaces.iter().any(|ns: &String| ns == "team-a") {
            let frame =
                stream.next_value::<drover::api::events::EventFrame>().await.expect("a frame").expect("goes on");
            namespaces.extend(frame.events.iter().map(|event| event.namespace.clone()));
        }
        namespaces
    })
    .await;
    assert!(frames.iter().all(|ns| ns == "team-a"), "{frames:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_lists_and_globs_grant_what_they_name() {
    let teams = teams("namespaces-capabilities").await;
    json_of(&teams.management, "PUT", "/v1/jobs", Some(&web_job("team-a"))).await;
    let (alloc, _, _) = running(&teams.management, "team-a").await;
    let reader = token_with(
        &teams.management,
        "team-reader",
        "namespace \"team-*\" { capabilities = [\"list-jobs\", \"read-job\"] }\nnamespace \"team-b\" { policy = \"deny\" }",
    )
    .await;
    let reader = client(&teams.cluster, &reader["SecretID"]);
    assert_eq!(send(&reader, "GET", "/v1/jobs?namespace=team-a", None).await.status, 200);
    assert_eq!(send(&reader, "GET", "/v1/job/web?namespace=team-a", None).await.status, 200);
    assert_eq!(send(&reader, "GET", "/v1/jobs?namespace=team-b", None).await.status, 403, "deny wins over the glob");
    assert_eq!(send(&reader, "GET", "/v1/jobs?namespace=default", None).await.status, 403, "default is not team-*");
    assert_eq!(send(&reader, "PUT", "/v1/jobs", Some(&web_job("team-a"))).await.status, 403, "no submit-job");
    let logs = format!("/v1/client/fs/logs/{alloc}?task=web&type=stdout&plain=true");
    assert_eq!(send(&reader, "GET", &logs, None).await.status, 403, "no read-logs");
    let logger = token_with(&teams.management, "logs", "namespace \"team-a\" { capabilities = [\"read-logs\"] }").await;
    let logger = client(&teams.cluster, &logger["SecretID"]);
    assert_eq!(send(&logger, "GET", &logs, None).await.status, 200, "read-logs alone reads logs");
    assert_eq!(send(&logger, "GET", "/v1/job/web?namespace=team-a", None).await.status, 403, "and nothing else");

    let unknown = json!({"Name": "typo", "Rules": "namespace \"team-a\" { capabilities = [\"submit-jobs\"] }"});
    let refused = send(&teams.management, "PUT", "/v1/acl/policy/typo", Some(&unknown)).await;
    assert_eq!(refused.status, 400);
    assert!(refused.body.contains("submit-jobs"), "{}", refused.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undeclared_namespaces_are_refused_and_used_ones_kept() {
    let teams = teams("namespaces-lifecycle").await;
    let management = &teams.management;
    let refused = send(management, "PUT", "/v1/jobs", Some(&web_job("team-c"))).await;
    assert_eq!(refused.status, 400);
    assert!(refused.body.contains("nonexistent namespace \"team-c\""), "{}", refused.body);
    let typo = send(management, "GET", "/v1/jobs?namespace=team-c", None).await;
    assert_eq!((typo.status, typo.body.trim()), (400, "namespace \"team-c\" does not exist"));
    let default = send(management, "DELETE", "/v1/namespace/default", None).await;
    assert_eq!((default.status, default.body.trim()), (400, "default namespace can not be deleted"));
    assert_eq!(send(management, "DELETE", "/v1/namespace/team-c", None).await.status, 404);
    let bad = send(management, "PUT", "/v1/namespace/a.b", Some(&json!({}))).await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    let quota = send(management, "PUT", "/v1/namespace/team-q", Some(&json!({"Quota": "small"}))).await;
    assert_eq!(quota.status, 400);
    assert!(quota.body.contains("Quota"), "{}", quota.body);

    json_of(management, "PUT", "/v1/jobs", Some(&web_job("team-a"))).await;
    let in_use = send(management, "DELETE", "/v1/namespace/team-a", None).await;
    assert_eq!(in_use.status, 400);
    assert!(in_use.body.contains("has 1 jobs"), "{}", in_use.body);
    json_of(management, "DELETE", "/v1/job/web?namespace=team-a&purge=true", None).await;
    json_of(management, "DELETE", "/v1/namespace/team-a", None).await;
    assert_eq!(send(management, "GET", "/v1/namespace/team-a", None).await.status, 404);
}

/// `args` and `--token SECRET`.
fn with_token<'a>(args: &[&'a str], secret: &'a str) -> Vec<&'a str> {
    args.iter().copied().chain(["--token", secret]).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_namespace_verbs_and_the_namespace_flag() {
    let teams = teams("namespaces-cli").await;
    let cluster = &teams.cluster;
    let secret = teams.management_secret.as_str();
    assert_eq!(
        cluster
            .cli_ok(&with_token(&["namespace", "apply", "--description", "the ops team", "ops"], secret))
            .await
            .trim(),
        "Successfully applied namespace \"ops\"!"
    );
    let spec = cluster.dir.join("batch.hcl");
    std::fs::write(&spec, "name = \"batch\"\ndescription = \"batch work\"\nmeta {\n  owner = \"data\"\n}\n")
        .expect("spec");
    cluster.cli_ok(&with_token(&["namespace", "apply", spec.to_str().expect("a path")], secret)).await;
    let list = cluster.cli_ok(&with_token(&["namespace", "list"], secret)).await;
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines[0].split_whitespace().collect::<Vec<_>>(), ["Name", "Description"]);
    let names: Vec<&str> = lines[1..].iter().filter_map(|line| line.split_whitespace().next()).collect();
    assert_eq!(names, ["batch", "default", "ops", "team-a", "team-b"]);
    let status = cluster.cli_ok(&with_token(&["namespace", "status", "batch"], secret)).await;
    assert!(status.contains("Name        = batch\nDescription = batch work\nQuota       = <none>\n"), "{status}");
    assert!(status.contains("Metadata\nowner = data"), "{status}");

    let job = cluster.dir.join("web.hcl");
    std::fs::write(
        &job,
        "job \"web\" {\n  datacenters = [\"dc1\"]\n  group \"web\" {\n    task \"web\" {\n      driver = \"mock\"\n      config {\n        run_for = \"1h\"\n      }\n    }\n  }\n}\n",
    )
    .expect("job file");
    cluster
        .cli_ok(&with_token(&["job", "run", "--detach", "--namespace", "ops", job.to_str().expect("a path")], secret))
        .await;
    let ops = json_of(&teams.management, "GET", "/v1/job/web?namespace=ops", None).await;
    assert_eq!(ops["Namespace"], "ops");
    assert_eq!(send(&teams.management, "GET", "/v1/job/web", None).await.status, 404, "not in default");
    let status = cluster.cli_ok(&with_token(&["job", "status", "--namespace", "ops", "web"], secret)).await;
    assert!(status.contains("Namespace     = ops"), "{status}");
    let refused = cluster.cli(&with_token(&["namespace", "delete", "ops"], secret)).await;
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("has 1 jobs"), "{refused:?}");
    assert_eq!(
        cluster.cli_ok(&with_token(&["namespace", "delete", "batch"], secret)).await.trim(),
        "Successfully deleted namespace \"batch\"!"
    );
    let missing = cluster.cli(&with_token(&["namespace", "status", "batch"], secret)).await;
    assert!(!missing.status.success());
}
