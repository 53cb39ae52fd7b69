//! The event stream (`GET /v1/event/stream`) of a real `drover server
//! --dev` with a real `drover agent --dev`, read as its clients read it:
//! - a subscriber sees a job's registration, its evaluation, and its
//!   allocation placed and then running, in index order, and nothing of
//!   another job; a second subscriber from an earlier index (a reconnect)
//!   reads the same events again from there;
//! - a subscriber that stops reading is dropped with a last `Error` line
//!   naming the index to resume from, the stream ends, and the server
//!   goes on;
//! - malformed requests are refused with Nomad's messages;
//! - with ACLs on, each topic needs what Nomad's needs, and deleting a
//!   token ends its stream;
//! - `drover event stream` prints the events.

mod common;

use common::api::{json_of, send, until};
use common::bounded;
use common::dev::DevCluster;
use drover::api::client::{ApiClient, ApiStream};
use drover::api::events::EventFrame;
use serde_json::{json, Value};

fn service_job(id: &str, datacenter: &str, meta: Value) -> Value {
    json!({"Job": {"ID": id, "Name": id, "Type": "service", "Datacenters": [datacenter], "Meta": meta,
        "TaskGroups": [{"Name": "web", "Count": 1,
            "Tasks": [{"Name": "web", "Driver": "mock", "Config": {"run_for": "1h"},
                "Resources": {"CPU": 100, "MemoryMB": 64}}]}]}})
}

async fn status(api: &ApiClient, query: &str) -> u16 {
    api.stream(&format!("/v1/event/stream?{query}")).await.expect("connects").status
}

async fn subscribe(api: &ApiClient, query: &str) -> ApiStream {
    let mut stream = api.stream(&format!("/v1/event/stream?{query}")).await.expect("connects");
    assert_eq!(stream.status, 200, "{query}");
    let first = stream.next_value::<EventFrame>().await.expect("a frame").expect("not the end");
    assert!(first.is_heartbeat(), "the first line is {{}}: {first:?}");
    stream
}

/// Frames (heartbeats left out) until `done` holds for those read so far.
async fn frames_until(stream: &mut ApiStream, what: &str, done: impl Fn(&[EventFrame]) -> bool) -> Vec<EventFrame> {
    bounded(what, async {
        let mut frames = Vec::new();
        while !done(&frames) {
            let frame = stream.next_value::<EventFrame>().await.expect("a frame").expect("the stream goes on");
            if !frame.is_heartbeat() {
                frames.push(frame);
            }
        }
        frames
    })
    .await
}

/// `(index, topic, type, key)` of every event.
fn summary(frames: &[EventFrame]) -> Vec<(u64, String, String, String)> {
    let events = frames.iter().flat_map(|frame| &frame.events);
    events.map(|event| (event.index, event.topic.clone(), event.event_type.clone(), event.key.clone())).collect()
}

fn running(frames: &[EventFrame]) -> bool {
    frames
        .iter()
        .flat_map(|frame| &frame.events)
        .any(|event| event.topic == "Allocation" && event.payload["Allocation"]["ClientStatus"] == "running")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_sees_a_job_placed_and_running_in_index_order_and_resumes_from_an_index() {
    let cluster = DevCluster::start("events-life", &[]).await;
    let api = &cluster.api;
    until(api, "/v1/nodes", "the agent registers", |nodes| nodes.as_array().is_some_and(|list| list.len() == 1)).await;
    let mut stream = subscribe(api, "topic=Job:web&topic=Evaluation:web&topic=Allocation:web").await;
    json_of(api, "PUT", "/v1/jobs", Some(&service_job("other", "dc1", json!({})))).await;
    json_of(api, "PUT", "/v1/jobs", Some(&service_job("web", "dc1", json!({})))).await;

    let frames = frames_until(&mut stream, "web's allocation runs", running).await;
    let indexes: Vec<u64> = frames.iter().map(|frame| frame.index).collect();
    assert!(indexes.windows(2).all(|pair| pair[0] < pair[1]), "in index order: {indexes:?}");
    for frame in &frames {
        assert!(frame.events.iter().all(|event| event.index == frame.index && event.namespace == "default"));
    }
    let seen = summary(&frames);
    let first_of = |topic: &str, event_type: &str| {
        seen.iter()
            .position(|(_, t, ty, _)| t == topic && ty == event_type)
            .unwrap_or_else(|| panic!("a {topic} {event_type} event in {seen:?}"))
    };
    let registered = first_of("Job", "JobRegistered");
    let its_eval = first_of("Evaluation", "JobRegistered");
    assert_eq!((seen[registered].3.as_str(), seen[its_eval].0), ("web", seen[registered].0), "one write: {seen:?}");
    let placed = first_of("Allocation", "PlanResult");
    let updated = first_of("Allocation", "AllocationUpdated");
    assert!(registered < placed && placed < updated, "{seen:?}");
    let events: Vec<_> = frames.iter().flat_map(|frame| &frame.events).collect();
    let of_web = |event: &&drover::api::events::Event| {
        event.key == "web" || event.filter_keys.as_ref().is_some_and(|keys| keys.iter().any(|key| key == "web"))
    };
    assert!(events.iter().all(of_web), "nothing of another job: {seen:?}");
    let allocation = &events[placed].payload["Allocation"];
    assert_eq!((allocation["JobID"].as_str(), &allocation["Job"]), (Some("web"), &Value::Null), "{allocation}");
    assert_eq!(events[registered].payload["Job"]["ID"], "web");
    drop(stream);

    // A reconnect from the placement's index reads the same events again.
    let from = seen[placed].0;
    let query = format!("index={from}&topic=Job:web&topic=Evaluation:web&topic=Allocation:web");
    let mut resumed = subscribe(api, &query).await;
    let wanted = seen.len() - placed;
    let again =
        frames_until(&mut resumed, "the events since the placement", |frames| summary(frames).len() >= wanted).await;
    assert_eq!(summary(&again)[..wanted], seen[placed..], "the same events from index {from}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_stops_reading_is_dropped_with_where_to_resume() {
    let cluster = DevCluster::start("events-slow", &["--event-buffer-size", "4"]).await;
    let api = &cluster.api;
    let mut slow = subscribe(api, "topic=Job:big").await;
    // 32 MiB of job events, more than loopback's socket buffers hold: the
    // server cannot write them all into a stream nobody reads.
    let pad = "x".repeat(256 * 1024);
    for version in 0..128 {
        let job = service_job("big", "nowhere", json!({"pad": pad, "version": version.to_string()}));
        json_of(api, "PUT", "/v1/jobs", Some(&job)).await;
    }
    let frames = bounded("the slow stream ends", async {
        let mut frames = Vec::new();
        while let Some(frame) = slow.next_value::<EventFrame>().await.expect("a frame") {
            frames.push(frame);
        }
        frames
    })
    .await;
    let last = frames.last().expect("frames");
    let error = last.error.as_deref().expect("the last line says why the stream ended");
    assert!(error.contains("fell more than 4 event batches behind") && error.contains("index="), "{error}");
    let read: Vec<u64> = frames.iter().filter(|frame| !frame.events.is_empty()).map(|frame| frame.index).collect();
    assert!(read.len() < 128 && read.windows(2).all(|pair| pair[0] < pair[1]), "{read:?}");

    // The server went on, and a new subscriber reads what comes next.
    assert_eq!(json_of(api, "GET", "/v1/job/big", None).await["Meta"]["version"], "127");
    let mut fresh = subscribe(api, "topic=Job:big").await;
    let job = service_job("big", "nowhere", json!({"version": "128"}));
    let index = json_of(api, "PUT", "/v1/jobs", Some(&job)).await["JobModifyIndex"].as_u64().expect("an index");
    frames_until(&mut fresh, "the next version's event", |frames| frames.iter().any(|frame| frame.index == index))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_refused_with_nomads_messages() {
    let cluster = DevCluster::start("events-refused", &[]).await;
    let api = &cluster.api;
    let refused = [
        (
            "topic=Job:a:b",
            "Invalid topic query: error parsing topics: Invalid key value pair for topic, topic: Job:a:b",
        ),
        ("index=x", "Unable to parse index"),
        ("topic=job", "unknown topic \"job\""),
    ];
    for (query, message) in refused {
        let answer = send(api, "GET", &format!("/v1/event/stream?{query}"), None).await;
        assert_eq!(answer.status, 400, "{query}");
        assert!(answer.body.contains(message), "{query}: {}", answer.body);
    }
    assert_eq!(send(api, "POST", "/v1/event/stream", None).await.status, 405);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_topic_needs_its_capability_and_a_deleted_token_ends_its_stream() {
    let cluster = DevCluster::start("events-acl", &["--acl-enabled"]).await;
    let anonymous = &cluster.api;
    let bootstrap = json_of(anonymous, "PUT", "/v1/acl/bootstrap", None).await;
    let management =
        ApiClient::new(&cluster.http, bootstrap["SecretID"].as_str().map(str::to_string), None).expect("client");
    let policy = json!({"Name": "nodes", "Rules": "node { policy = \"read\" }"});
    send(&management, "PUT", "/v1/acl/policy/nodes", Some(&policy)).await;
    let token = json_of(
        &management,
        "PUT",
        "/v1/acl/token",
        Some(&json!({"Name": "reader", "Type": "client", "Policies": ["nodes"]})),
    )
    .await;
    let reader = ApiClient::new(&cluster.http, token["SecretID"].as_str().map(str::to_string), None).expect("client");
    let stranger =
        ApiClient::new(&cluster.http, Some("a1b2c3d4-0000-4000-8000-000000000000".to_string()), None).expect("client");

    assert_eq!(status(&reader, "topic=Node").await, 200, "node:read reads Node");
    assert_eq!(status(&reader, "topic=Job").await, 403, "Job needs read-job");
    assert_eq!(status(&reader, "").await, 403, "every topic needs a management token");
    assert_eq!(status(anonymous, "topic=Node").await, 403, "no anonymous policy");
    assert_eq!(status(&stranger, "topic=Node").await, 403, "an unknown token");
    assert_eq!(status(&management, "").await, 200);

    let mut stream = subscribe(&reader, "topic=Node").await;
    let accessor = token["AccessorID"].as_str().expect("an accessor");
    send(&management, "DELETE", &format!("/v1/acl/token/{accessor}"), None).await;
    let last = bounded("the stream ends", async {
        let mut last = None;
        while let Some(frame) = stream.next_value::<EventFrame>().await.expect("a frame") {
            last = Some(frame);
        }
        last
    })
    .await;
    let error = last.and_then(|frame| frame.error).expect("a last line saying why");
    assert!(error.contains("ACL token was deleted"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drover_event_stream_prints_each_event() {
    let cluster = DevCluster::start("events-cli", &[]).await;
    let api = &cluster.api;
    json_of(api, "PUT", "/v1/jobs", Some(&service_job("cli", "nowhere", json!({})))).await;
    let job = json_of(api, "GET", "/v1/job/cli", None).await;
    let mut child = common::drover()
        .args(["event", "stream", "--topic", "Job:cli", "--address", &cluster.http])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("drover event stream starts");
    let stdout = child.stdout.take().expect("stdout");
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).map(|_| line)
    });
    let line = bounded("a line", line).await.expect("the reader").expect("reads");
    let _ = child.kill();
    let _ = child.wait();
    let index = job["ModifyIndex"].as_u64().expect("an index");
    assert_eq!(line.trim_end(), format!("{index}  Job  JobRegistered  cli"));
}
