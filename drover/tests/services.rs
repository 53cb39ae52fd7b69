//! Nomad-native service discovery's HTTP API and CLI against a real
//! in-process server (ACLs on) with its HTTP API on a loopback port. No
//! agent registers services yet, so the test writes registrations of the
//! server's real allocations through the engine's writer, as an agent's
//! registration will: every endpoint's JSON shape against Nomad's
//! documented one, the tag filter, a blocking query woken by a new
//! registration, delete (an unknown id changing nothing), namespaces, the
//! ACL checks, and `drover service list|info|delete`.

use std::sync::Arc;

mod common;

use common::{bounded, mock_node, service_job, until};
use drover::api::client::{ApiClient, ApiResponse};
use drover::server::RunningServer;
use engine::state::Command;
use engine::structs::{Allocation, JobKey, ServiceOwner, ServiceRegistration};
use serde_json::{json, Value};

/// A server with ACLs on, a node, jobs `web` (two allocations) and `db`
/// (one), and the management token's client.
struct Fixture {
    server: RunningServer,
    http: String,
    management: ApiClient,
    management_secret: String,
    web: Vec<Arc<Allocation>>,
    db: Arc<Allocation>,
}

async fn fixture() -> Fixture {
    let (server, http, secret) = common::acl_server("services-test").await;
    let management = ApiClient::new(&http, Some(secret.clone()), None).expect("client");

    server.engine().nodes().register(mock_node(1)).expect("the node registers");
    server.engine().jobs().register(service_job("web", 2)).expect("web registers");
    server.engine().jobs().register(service_job("db", 1)).expect("db registers");
    let placed = until(&server, "web's two and db's one allocations", |snapshot| {
        snapshot.allocs_by_job(&JobKey::new("default", "web")).count() == 2
            && snapshot.allocs_by_job(&JobKey::new("default", "db")).count() == 1
    })
    .await;
    let mut web: Vec<Arc<Allocation>> = placed.allocs_by_job(&JobKey::new("default", "web")).cloned().collect();
    web.sort_by_key(|alloc| alloc.id);
    let db = placed.allocs_by_job(&JobKey::new("default", "db")).next().expect("db's allocation").clone();
    Fixture { server, http, management, management_secret: secret, web, db }
}

/// A registration of `alloc`'s task service `name` on port label `label`.
fn registration(alloc: &Allocation, name: &str, label: &str, tags: &[&str], port: u16) -> ServiceRegistration {
    let task = alloc.job.task_groups[0].tasks[0].name.clone();
    let mut registration = ServiceRegistration::of_alloc(alloc, "dc1", ServiceOwner::Task(&task), name, label);
    registration.tags = tags.iter().map(|tag| tag.to_string()).collect();
    registration.address = "10.0.0.5".into();
    registration.port = port;
    registration
}

impl Fixture {
    /// Writes `registrations` through the engine's writer, as an agent's
    /// registration does; the index it was written at.
    fn register(&self, registrations: Vec<ServiceRegistration>) -> u64 {
        let writer = self.server.engine();
        let applied = tokio::task::block_in_place(|| {
            writer.writer().write(Command::UpsertServiceRegistrations { registrations })
        })
        .expect("written");
        assert!(applied.refused_registrations.is_empty(), "{:?}", applied.refused_registrations);
        applied.index
    }

    fn services_index(&self) -> u64 {
        self.server.engine().store().snapshot().table_indexes().services
    }

    fn client(&self, secret: Option<String>) -> ApiClient {
        ApiClient::new(&self.http, secret, None).expect("client")
    }
}

async fn get(api: &ApiClient, path: &str) -> ApiResponse {
    api.get(path).await.expect("an answer")
}

/// The 200 JSON answer of `path`.
async fn json_of(api: &ApiClient, path: &str) -> Value {
    get(api, path).await.json().unwrap_or_else(|error| panic!("{path}: {error:#}"))
}

/// Nomad's `ServiceRegistration` fields, in its order.
const REGISTRATION_FIELDS: [&str; 12] = [
    "ID",
    "ServiceName",
    "Namespace",
    "NodeID",
    "Datacenter",
    "JobID",
    "AllocID",
    "Tags",
    "Address",
    "Port",
    "CreateIndex",
    "ModifyIndex",
];

/// Checks that every object of the list `body` has exactly Nomad's
/// registration fields, in Nomad's order, with Nomad's types.
fn assert_registration_shape(body: &str) {
    let list: Value = serde_json::from_str(body).expect("JSON");
    for entry in list.as_array().expect("a list") {
        let object = entry.as_object().expect("an object");
        let mut keys: Vec<&String> = object.keys().collect();
        keys.sort();
        let mut wanted: Vec<&str> = REGISTRATION_FIELDS.to_vec();
        wanted.sort();
        assert_eq!(keys, wanted, "{entry}");
        for field in ["ID", "ServiceName", "Namespace", "NodeID", "Datacenter", "JobID", "AllocID", "Address"] {
            assert!(entry[field].is_string(), "{field} of {entry}");
        }
        assert!(entry["Tags"].as_array().is_some_and(|tags| tags.iter().all(Value::is_string)), "{entry}");
        for field in ["Port", "CreateIndex", "ModifyIndex"] {
            assert!(entry[field].is_u64(), "{field} of {entry}");
        }
    }
    // Nomad's order: each object's fields appear in REGISTRATION_FIELDS order.
    if let Some(first) = body.find('{') {
        let end = body[first..].find('}').expect("an object ends") + first;
        let object = &body[first..end];
        let positions: Vec<usize> = REGISTRATION_FIELDS
            .iter()
            .map(|field| object.find(&format!("\"{field}\":")).expect("the field is there"))
            .collect();
        assert!(positions.windows(2).all(|pair| pair[0] < pair[1]), "{object}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_services_api_answers_as_nomad_does() {
    let fixture = fixture().await;
    let api = &fixture.management;
    let (web0, web1, db) = (&fixture.web[0], &fixture.web[1], &fixture.db);

    // Nothing registered: `[]`, never `null`, and an index of at least 1.
    let empty = get(api, "/v1/services").await;
    assert_eq!((empty.status, empty.body.as_str()), (200, "[]"));
    assert!(empty.index.is_some_and(|index| index >= 1));
    assert_eq!(json_of(api, "/v1/service/web").await, json!([]));

    let written = fixture.register(vec![
        registration(web0, "web", "http", &["edge", "a"], 8080),
        registration(web1, "web", "http", &["b"], 8081),
        registration(db, "db", "pg", &[], 5432),
    ]);

    // The list: per namespace, names sorted, tags the sorted union.
    let listed = get(api, "/v1/services").await;
    assert_eq!(listed.index, Some(written));
    let listed_json: Value = listed.json().expect("a list");
    let wanted = json!([{"Namespace": "default", "Services": [
        {"ServiceName": "db", "Tags": []},
        {"ServiceName": "web", "Tags": ["a", "b", "edge"]},
    ]}]);
    assert_eq!(listed_json, wanted);
    assert!(listed.body.find("\"Namespace\"") < listed.body.find("\"Services\""), "{}", listed.body);
    assert!(listed.body.find("\"ServiceName\"") < listed.body.find("\"Tags\""), "{}", listed.body);
    assert_eq!(json_of(api, "/v1/services?namespace=*").await, wanted);
    assert_eq!(json_of(api, "/v1/services?namespace=default").await, wanted);
    let other = get(api, "/v1/services?namespace=other").await;
    assert_eq!(other.status, 400, "{}", other.body);

    // One service: every instance, sorted by id, Nomad's fields.
    let web = get(api, "/v1/service/web").await;
    assert_eq!(web.index, Some(written));
    assert_registration_shape(&web.body);
    let web_json = web.json().expect("a list");
    let mut ids = vec![
        ServiceRegistration::make_id(web0.id, ServiceOwner::Task("task"), "web", "http"),
        ServiceRegistration::make_id(web1.id, ServiceOwner::Task("task"), "web", "http"),
    ];
    ids.sort();
    let answered: Vec<&str> =
        web_json.as_array().expect("a list").iter().map(|r| r["ID"].as_str().expect("id")).collect();
    assert_eq!(answered, ids);
    let first =
        web_json.as_array().expect("a list").iter().find(|r| r["AllocID"] == web0.id.to_string()).expect("web0");
    assert_eq!(first["ServiceName"], "web");
    assert_eq!(first["Namespace"], "default");
    assert_eq!(first["NodeID"], web0.node_id.to_string());
    assert_eq!(first["Datacenter"], "dc1");
    assert_eq!(first["JobID"], "web");
    assert_eq!(first["Tags"], json!(["edge", "a"]));
    assert_eq!(first["Address"], "10.0.0.5");
    assert_eq!(first["Port"], 8080);
    assert_eq!((first["CreateIndex"].as_u64(), first["ModifyIndex"].as_u64()), (Some(written), Some(written)));
    assert_eq!(json_of(api, "/v1/service/web?namespace=*").await, web_json);
    assert_eq!(json_of(api, "/v1/service/nope").await, json!([]));

    // Pages of a service's registrations, in the list's order, and a filter.
    let first = get(api, "/v1/service/web?per_page=1").await;
    let token = first.next_token.clone().expect("a next page");
    let second = get(api, &format!("/v1/service/web?per_page=1&next_token={token}")).await;
    assert_eq!(second.next_token, None, "the last page");
    let mut paged = first.json().expect("a page").as_array().expect("a list").clone();
    paged.extend(second.json().expect("a page").as_array().expect("a list").iter().cloned());
    assert_eq!(Value::from(paged), web_json);
    let filtered = json_of(api, &format!("/v1/service/web?filter=AllocID%20%3D%3D%20%22{}%22", web0.id)).await;
    assert_eq!(filtered.as_array().map(Vec::len), Some(1), "web0's registration: {filtered}");

    // The tag filter.
    let tagged = json_of(api, "/v1/service/web?tag=a").await;
    assert_eq!(tagged.as_array().map(Vec::len), Some(1));
    assert_eq!(tagged[0]["AllocID"], web0.id.to_string());
    assert_eq!(json_of(api, "/v1/service/web?tag=zzz").await, json!([]));

    // `choose` is refused, naming it, never ignored.
    let choose = get(api, "/v1/service/web?choose=1%7Ckey").await;
    assert_eq!(choose.status, 400);
    assert!(choose.body.contains("choose"), "{}", choose.body);

    // Bad paths and methods.
    let missing = get(api, "/v1/service/").await;
    assert_eq!((missing.status, missing.body.as_str()), (400, "missing service name"));
    let deep = get(api, "/v1/service/web/a/b").await;
    assert_eq!((deep.status, deep.body.as_str()), (400, "invalid URI"));
    let put = api.request("PUT", "/v1/service/web", Some(&json!({}))).await.expect("answer");
    assert_eq!(put.status, 405);

    // A job's and an allocation's registrations; unknown ones as the other endpoints answer.
    let of_web = get(api, "/v1/job/web/services").await;
    assert_registration_shape(&of_web.body);
    assert_eq!(of_web.json().expect("a list"), web_json);
    let of_db = json_of(api, "/v1/job/db/services").await;
    assert_eq!(of_db.as_array().map(Vec::len), Some(1));
    assert_eq!((of_db[0]["ServiceName"].as_str(), of_db[0]["Port"].as_u64()), (Some("db"), Some(5432)));
    let no_job = get(api, "/v1/job/nope/services").await;
    assert_eq!((no_job.status, no_job.body.as_str()), (404, "job not found"));
    let of_alloc = get(api, &format!("/v1/allocation/{}/services", web1.id)).await;
    assert_registration_shape(&of_alloc.body);
    let of_alloc = of_alloc.json().expect("a list");
    assert_eq!(of_alloc.as_array().map(Vec::len), Some(1));
    assert_eq!(of_alloc[0]["Port"], 8081);
    let unknown_alloc = format!("/v1/allocation/{}/services", uuid::Uuid::from_u128(42));
    let no_alloc = get(api, &unknown_alloc).await;
    assert_eq!((no_alloc.status, no_alloc.body.as_str()), (404, "alloc not found"));

    // A blocking query from the current index is woken by a new registration.
    let waiting = {
        let client = fixture.client(Some(fixture.management_secret.clone()));
        let path = format!("/v1/service/web?index={written}&wait=60s");
        tokio::spawn(async move { client.get(&path).await.expect("an answer") })
    };
    let added = fixture.register(vec![registration(web1, "web", "admin", &["admin"], 9090)]);
    let woken = bounded("the blocking query wakes", waiting).await.expect("the query task");
    assert_eq!(woken.index, Some(added));
    assert!(added > written);
    assert_eq!(woken.json().expect("a list").as_array().map(Vec::len), Some(3));

    // ACL: a read token reads but cannot delete; no token gets nothing.
    let read_policy = json!({"Name": "readonly", "Rules": "namespace \"default\" { policy = \"read\" }"});
    let put_policy = api.request("PUT", "/v1/acl/policy/readonly", Some(&read_policy)).await.expect("answer");
    assert_eq!(put_policy.status, 200, "{}", put_policy.body);
    let body = json!({"Name": "reader", "Type": "client", "Policies": ["readonly"]});
    let token = api.request("POST", "/v1/acl/token", Some(&body)).await.expect("answer").json().expect("token");
    let reader = fixture.client(Some(token["SecretID"].as_str().expect("secret").to_string()));
    assert_eq!(json_of(&reader, "/v1/services").await, json_of(api, "/v1/services").await);
    assert_eq!(json_of(&reader, "/v1/service/web?tag=admin").await.as_array().map(Vec::len), Some(1));
    assert_eq!(get(&reader, "/v1/job/web/services").await.status, 200);
    let web0_id = &ids[0];
    let before = fixture.services_index();
    let refused = reader.request("DELETE", &format!("/v1/service/web/{web0_id}"), None).await.expect("answer");
    assert_eq!((refused.status, refused.body.as_str()), (403, "Permission denied"));
    assert_eq!(get(&fixture.client(None), "/v1/services").await.status, 403);
    assert_eq!(fixture.services_index(), before);

    // Delete: an unknown id changes nothing; a known one goes.
    let unknown = api.request("DELETE", "/v1/service/web/_nomad-task-nope", None).await.expect("answer");
    assert_eq!((unknown.status, unknown.body.as_str()), (404, "service registration not found"));
    assert_eq!(fixture.services_index(), before);
    assert_eq!(json_of(api, "/v1/service/web").await.as_array().map(Vec::len), Some(3));
    let deleted = api.request("DELETE", &format!("/v1/service/web/{web0_id}"), None).await.expect("answer");
    assert_eq!((deleted.status, deleted.body.as_str()), (200, "null"));
    let after = fixture.services_index();
    assert!(after > before);
    assert_eq!(deleted.index, Some(after));
    let left = json_of(api, "/v1/service/web").await;
    let left_ids: Vec<&str> = left.as_array().expect("a list").iter().map(|r| r["ID"].as_str().expect("id")).collect();
    assert!(!left_ids.contains(&web0_id.as_str()), "{left_ids:?}");
    assert_eq!(left_ids.len(), 2);
    let again = api.request("DELETE", &format!("/v1/service/web/{web0_id}"), None).await.expect("answer");
    assert_eq!(again.status, 404);
    let every = api.request("DELETE", &format!("/v1/service/web/{web0_id}?namespace=*"), None).await.expect("answer");
    assert_eq!(every.status, 400, "{}", every.body);
}

/// Runs the `drover` binary against the fixture's API with its token.
async fn drover_cli(fixture: &Fixture, args: &[&str]) -> std::process::Output {
    let mut command = common::drover();
    command.args(args).env("DROVER_ADDR", &fixture.http).env("DROVER_TOKEN", &fixture.management_secret);
    bounded("the CLI answers", tokio::task::spawn_blocking(move || command.output().expect("drover runs")))
        .await
        .expect("the CLI task")
}

fn stdout(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_cli_lists_shows_and_deletes_as_nomad_does() {
    let fixture = fixture().await;
    let (web0, web1) = (&fixture.web[0], &fixture.web[1]);

    let none = drover_cli(&fixture, &["service", "list"]).await;
    assert!(none.status.success());
    assert_eq!(stdout(&none), "No service registrations found\n");

    fixture.register(vec![
        registration(web0, "web", "http", &["a", "edge"], 8080),
        registration(web1, "web", "http", &[], 8081),
        registration(&fixture.db, "db", "pg", &[], 5432),
    ]);
    let list = drover_cli(&fixture, &["service", "list"]).await;
    assert!(list.status.success(), "{list:?}");
    assert_eq!(stdout(&list), "Service Name  Tags\ndb            []\nweb           [a,edge]\n");

    let info = drover_cli(&fixture, &["service", "info", "web"]).await;
    assert!(info.status.success(), "{info:?}");
    let mut rows = vec![
        (web0.id.to_string(), format!("web     10.0.0.5:8080  [a,edge]  {}  {}", short(web0.node_id), short(web0.id))),
        (web1.id.to_string(), format!("web     10.0.0.5:8081  []        {}  {}", short(web1.node_id), short(web1.id))),
    ];
    rows.sort();
    let mut wanted = "Job ID  Address        Tags      Node ID   Alloc ID\n".to_string();
    for (_, row) in &rows {
        wanted.push_str(row);
        wanted.push('\n');
    }
    assert_eq!(stdout(&info), wanted);

    let verbose = drover_cli(&fixture, &["service", "info", "--verbose", "web"]).await;
    let verbose_text = stdout(&verbose);
    let web0_id = ServiceRegistration::make_id(web0.id, ServiceOwner::Task("task"), "web", "http");
    assert!(verbose_text.contains(&format!("ID           = {web0_id}\n")), "{verbose_text}");
    assert!(verbose_text.contains("Address      = 10.0.0.5:8080\n"), "{verbose_text}");

    let deleted = drover_cli(&fixture, &["service", "delete", "web", &web0_id]).await;
    assert!(deleted.status.success(), "{deleted:?}");
    assert_eq!(stdout(&deleted), "Successfully deleted service registration\n");
    let after = drover_cli(&fixture, &["service", "info", "web"]).await;
    assert!(!stdout(&after).contains(&short(web0.id)), "{}", stdout(&after));

    let unknown = drover_cli(&fixture, &["service", "delete", "web", "_nomad-task-nope"]).await;
    assert_eq!(unknown.status.code(), Some(1));
    let error = String::from_utf8_lossy(&unknown.stderr);
    assert!(error.contains("404") && error.contains("service registration not found"), "{error}");
}

/// The first 8 characters of an id, as the CLI shortens them.
fn short(id: impl ToString) -> String {
    id.to_string().chars().take(8).collect()
}
