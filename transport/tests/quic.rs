//! The protocol over real QUIC on loopback: a real engine server behind a
//! real `ClientListener`, real clients. Waits are on events (a push, a
//! reply, the store's index); every wait is bounded by a generous watchdog
//! that only turns a hang into a failure.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use engine::clock::SystemClock;
use engine::server::{Server, ServerConfig};
use engine::state::ClientAllocUpdate;
use engine::structs::{ClientStatus, Job, JobType, NodeStatus, Resources};
use transport::client::{CallError, ClientEndpoints};
use transport::frame::{Frame, HEADER_LEN, MAGIC, VERSION};
use transport::message::{AllocsPush, Kind, Message, Refusal, RefusalCode, WatchAllocsRequest};
use transport::server::ClientListener;
use transport::tls::TlsMaterial;
use uuid::Uuid;

/// A hang becomes a failure after this long; nothing here is timed.
const WATCHDOG: Duration = Duration::from_secs(60);

async fn bounded<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WATCHDOG, future).await.unwrap_or_else(|_| panic!("{what} did not happen within {WATCHDOG:?}"))
}

struct Setup {
    server: Arc<Server>,
    listener: Arc<ClientListener>,
    addr: SocketAddr,
    client_tls: TlsMaterial,
}

fn start() -> Setup {
    transport::install_crypto_provider();
    let (_ca, server_tls, client_tls) = TlsMaterial::dev_pair().expect("dev material");
    let config = ServerConfig { workers: 1, ..ServerConfig::default() };
    let server = Arc::new(Server::start(config, SystemClock::shared()));
    let loopback: SocketAddr = "127.0.0.1:0".parse().expect("address");
    let listener = Arc::new(
        ClientListener::bind(loopback, &server_tls, server.nodes(), vec!["127.0.0.1:4647".into()], None)
            .expect("binds"),
    );
    let addr = listener.local_addr().expect("bound");
    tokio::spawn({
        let listener = listener.clone();
        async move { listener.run().await }
    });
    Setup { server, listener, addr, client_tls }
}

fn job(id: &str, count: u32) -> Job {
    Job::new_simple(id, JobType::Service, count, Resources::new(100, 64, 0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_registers_heartbeats_receives_an_alloc_and_reports_it_running() {
    let setup = start();
    let endpoints = ClientEndpoints::bind(1, &setup.client_tls).expect("client endpoint");
    let connection = bounded("connect", endpoints.connect(setup.addr)).await.expect("connects");
    // Node 0 is in dc1, where the test jobs run.
    let node = engine::testing::node(0);
    let registered = bounded("register", connection.register(node.clone())).await.expect("registers");
    assert_eq!(registered.status, NodeStatus::Ready);
    assert!(registered.heartbeat_ttl > Duration::ZERO);
    let beat =
        bounded("heartbeat", connection.heartbeat(node.id, node.secret_id, NodeStatus::Ready)).await.expect("beats");
    assert_eq!(beat.servers, vec!["127.0.0.1:4647".to_string()]);

    let mut watch = bounded("watch", connection.watch_allocs(node.id, node.secret_id, 0)).await.expect("watch opens");
    let first = bounded("first push", watch.next()).await.expect("first push");
    assert!(first.allocs.is_empty());

    setup.server.jobs().register(job("web", 1)).expect("job registers");
    let push = bounded("the alloc's push", watch.next()).await.expect("push");
    assert_eq!(push.allocs.len(), 1);
    let alloc = push.allocs[0].clone();
    assert_eq!(alloc.node_id, node.id);
    assert!(push.index > first.index);

    let update = ClientAllocUpdate {
        alloc_id: alloc.id,
        node_id: node.id,
        client_status: ClientStatus::Running,
        client_description: "started".into(),
        services: None,
        checks: None,
        health: None,
        task_states: Default::default(),
    };
    let index =
        bounded("report", connection.update_allocs(node.id, node.secret_id, vec![update])).await.expect("accepted");
    let snapshot = setup.server.store().snapshot_min_index(index, WATCHDOG).expect("written");
    assert_eq!(snapshot.alloc(alloc.id).expect("stored").client_status, ClientStatus::Running);
    // The agent knows what it reported: the watch does not push it back.
    // The servers' next change to the node is pushed, the report with it.
    setup.server.jobs().register(job("db", 1)).expect("job registers");
    let pushed = bounded("the next placement's push", watch.next()).await.expect("push");
    assert_eq!(pushed.allocs.len(), 2, "the report alone pushed nothing: {pushed:?}");
    let web = pushed.allocs.iter().find(|pushed| pushed.id == alloc.id).expect("still placed");
    assert_eq!(web.client_status, ClientStatus::Running);

    let stats = setup.listener.stats();
    assert_eq!(stats.connections_accepted, 1);
    assert_eq!(stats.refusals, 0);
    setup.listener.close().await;
    setup.server.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_is_refused_and_changes_nothing() {
    let setup = start();
    let endpoints = ClientEndpoints::bind(1, &setup.client_tls).expect("client endpoint");
    let connection = bounded("connect", endpoints.connect(setup.addr)).await.expect("connects");
    let node = engine::testing::node(2);
    bounded("register", connection.register(node.clone())).await.expect("registers");
    let before = setup.server.store().latest_index();
    let wrong = Uuid::from_u128(0xbad);

    let refused = bounded("heartbeat", connection.heartbeat(node.id, wrong, NodeStatus::Ready)).await;
    assert_eq!(refused.expect_err("wrong secret").refusal(), Some(RefusalCode::WrongSecret));
    let mut impostor = node.clone();
    impostor.secret_id = wrong;
    impostor.name = "impostor".into();
    let refused = bounded("register", connection.register(impostor)).await;
    assert_eq!(refused.expect_err("wrong secret").refusal(), Some(RefusalCode::WrongSecret));
    let mut watch = bounded("watch", connection.watch_allocs(node.id, wrong, 0)).await.expect("stream opens");
    assert_eq!(
        bounded("watch answer", watch.next()).await.expect_err("refused").refusal(),
        Some(RefusalCode::WrongSecret)
    );

    assert_eq!(setup.server.store().latest_index(), before, "a refused call writes nothing");
    assert_eq!(setup.server.store().snapshot().node(node.id).expect("kept").name, node.name);
    assert_eq!(setup.listener.stats().wrong_secrets, 3);
    setup.listener.close().await;
    setup.server.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_certificate_is_not_signed_by_the_cluster_ca_cannot_connect() {
    let setup = start();
    let (_other_ca, _, stranger) = TlsMaterial::dev_pair().expect("another CA");
    // The stranger trusts the cluster CA (it can check the server) but
    // presents a certificate of its own CA.
    let stranger = TlsMaterial { ca_pem: setup.client_tls.ca_pem.clone(), identity: stranger.identity };
    let endpoints = ClientEndpoints::bind(1, &stranger).expect("client endpoint");
    let outcome = bounded("handshake", async {
        let connection = endpoints.connect(setup.addr).await?;
        connection.heartbeat(engine::testing::node(3).id, Uuid::nil(), NodeStatus::Ready).await
    })
    .await;
    let error = outcome.expect_err("the server refuses the certificate");
    assert!(error.is_connection_lost(), "{error}");
    assert_eq!(setup.listener.stats().connections_accepted, 0);
    assert_eq!(setup.server.store().snapshot().nodes().count(), 0);
    setup.listener.close().await;
    setup.server.shutdown();
}

/// A frame's bytes with any header fields.
fn raw_frame(magic: &[u8; 3], version: u8, kind: u8, length: u32, payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(HEADER_LEN + payload.len());
    bytes.extend_from_slice(magic);
    bytes.push(version);
    bytes.push(kind);
    bytes.extend_from_slice(&9u64.to_be_bytes());
    bytes.extend_from_slice(&length.to_be_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_close_their_stream_and_the_server_keeps_serving() {
    let setup = start();
    let endpoints = ClientEndpoints::bind(1, &setup.client_tls).expect("client endpoint");
    let bad = bounded("connect", endpoints.connect(setup.addr)).await.expect("connects");
    let good = bounded("connect", endpoints.connect(setup.addr)).await.expect("connects");
    let node = engine::testing::node(4);
    bounded("register", good.register(node.clone())).await.expect("registers");

    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("bad magic", b"GET / HTTP/1.1\r\n\r\n".to_vec()),
        ("bad version", raw_frame(&MAGIC, VERSION + 1, Kind::Heartbeat as u8, 0, &[])),
        ("oversized", raw_frame(&MAGIC, VERSION, Kind::UpdateAllocs as u8, 2 * 1024 * 1024, &[])),
        ("unknown kind", raw_frame(&MAGIC, VERSION, 99, 0, &[])),
        ("a reply kind as a request", raw_frame(&MAGIC, VERSION, Kind::IndexReply as u8, 1, &[0])),
        ("garbage payload", raw_frame(&MAGIC, VERSION, Kind::Heartbeat as u8, 4, &[0xff, 0xff, 0xff, 0xff])),
        ("truncated", raw_frame(&MAGIC, VERSION, Kind::Heartbeat as u8, 100, &[1, 2, 3])),
    ];
    let before = setup.server.store().latest_index();
    for (case, bytes) in &cases {
        let answer = bounded(case, bad.raw_call(bytes)).await.unwrap_or_else(|error| panic!("{case}: {error}"));
        let frame: Frame = answer.unwrap_or_else(|| panic!("{case}: no answer"));
        let refusal = Refusal::from_frame(&frame).unwrap_or_else(|error| panic!("{case}: {error}"));
        assert_eq!(refusal.code, RefusalCode::Malformed, "{case}: {refusal}");
        assert!(!refusal.message.is_empty(), "{case}");
    }
    assert_eq!(setup.listener.stats().malformed, cases.len() as u64);
    assert_eq!(setup.server.store().latest_index(), before, "nothing was written");

    // The same connection and another client are served as before.
    let beat = bounded("heartbeat", bad.heartbeat(node.id, node.secret_id, NodeStatus::Ready)).await;
    assert_eq!(beat.expect("served").status, NodeStatus::Ready);
    let beat = bounded("heartbeat", good.heartbeat(node.id, node.secret_id, NodeStatus::Ready)).await;
    assert_eq!(beat.expect("served").status, NodeStatus::Ready);
    setup.listener.close().await;
    setup.server.shutdown();
}

/// A registered node watching its allocations, and the first push that
/// placed job `api` on it.
struct Watching {
    endpoints: ClientEndpoints,
    connection: transport::client::ClientConnection,
    node: engine::structs::Node,
    watch: transport::client::AllocWatch,
    first: transport::message::AllocChanges,
}

async fn watching_api(setup: &Setup) -> Watching {
    let endpoints = ClientEndpoints::bind(1, &setup.client_tls).expect("client endpoint");
    let connection = bounded("connect", endpoints.connect(setup.addr)).await.expect("connects");
    let node = engine::testing::node(8);
    bounded("register", connection.register(node.clone())).await.expect("registers");
    setup.server.jobs().register(job("api", 1)).expect("job registers");
    let mut watch = bounded("watch", connection.watch_allocs(node.id, node.secret_id, 0)).await.expect("opens");
    let mut first = bounded("push", watch.next()).await.expect("push");
    while first.allocs.is_empty() {
        first = bounded("push", watch.next()).await.expect("push");
    }
    Watching { endpoints, connection, node, watch, first }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resumes_after_the_last_index_the_client_saw() {
    let setup = start();
    let Watching { endpoints, connection, node, watch, first: seen } = watching_api(&setup).await;
    connection.close();
    drop(watch);

    // Reconnected, resuming from the last index seen: nothing changed, so
    // the first push is the next change, not a replay.
    let connection = bounded("reconnect", endpoints.connect(setup.addr)).await.expect("reconnects");
    let mut watch =
        bounded("watch", connection.watch_allocs(node.id, node.secret_id, seen.index)).await.expect("opens");
    let alloc = &seen.allocs[0];
    let update = ClientAllocUpdate {
        alloc_id: alloc.id,
        node_id: node.id,
        client_status: ClientStatus::Running,
        client_description: String::new(),
        services: None,
        checks: None,
        health: None,
        task_states: Default::default(),
    };
    let index = bounded("report", connection.update_allocs(node.id, node.secret_id, vec![update])).await.expect("ok");
    // The report is not pushed back to the agent that sent it; the next
    // placement is, the report with it.
    setup.server.jobs().register(job("cache", 1)).expect("job registers");
    let next = bounded("push", watch.next()).await.expect("push");
    assert!(next.index > index && next.index > seen.index);
    assert_eq!(next.allocs.len(), 2, "{next:?}");
    assert_eq!(next.listed.len(), 2, "{next:?}");
    let api = next.allocs.iter().find(|pushed| pushed.id == alloc.id).expect("still placed");
    assert_eq!(api.client_status, ClientStatus::Running);
    setup.listener.close().await;
    setup.server.shutdown();
}

/// A push carries what changed since the one before it on its stream,
/// with the ids of all (a stream's first push carries everything); an
/// agent of an earlier build, whose watch is `WatchAllocs`, is still
/// pushed the whole list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_pushes_what_changed_after_its_first_push_and_an_earlier_builds_watch_the_whole_list() {
    let setup = start();
    let Watching { endpoints: _endpoints, connection, node, mut watch, first } = watching_api(&setup).await;
    let api = first.allocs[0].id;
    assert_eq!(first.listed, vec![api]);

    setup.server.jobs().register(job("cache", 1)).expect("job registers");
    let next = bounded("push", watch.next()).await.expect("push");
    let changed: Vec<_> = next.allocs.iter().map(|alloc| alloc.job_id.to_string()).collect();
    assert_eq!(changed, vec!["cache"], "api did not change: {next:?}");
    assert_eq!(next.listed.len(), 2);
    assert!(next.listed.contains(&api) && next.listed.contains(&next.allocs[0].id));

    // A resumed watch's stream pushes everything first (the agent's index
    // may come from another server's timeline), changes after that.
    let mut resumed =
        bounded("watch", connection.watch_allocs(node.id, node.secret_id, next.index)).await.expect("opens");
    setup.server.jobs().register(job("db", 1)).expect("job registers");
    let first_resumed = bounded("push", resumed.next()).await.expect("push");
    let mut jobs: Vec<_> = first_resumed.allocs.iter().map(|alloc| alloc.job_id.to_string()).collect();
    jobs.sort_unstable();
    assert_eq!(jobs, vec!["api", "cache", "db"]);
    assert_eq!(first_resumed.listed.len(), 3);

    let mut earlier = Vec::new();
    let request = WatchAllocsRequest { node_id: node.id, secret_id: node.secret_id, last_index: 0 };
    request.to_frame(1).encode(&mut earlier).expect("encodes");
    let frame = bounded("earlier watch", connection.raw_call(&earlier)).await.expect("answered").expect("a frame");
    let whole = AllocsPush::from_frame(&frame).expect("the whole list");
    let mut jobs: Vec<_> = whole.allocs.iter().map(|alloc| alloc.job_id.to_string()).collect();
    jobs.sort_unstable();
    assert_eq!(jobs, vec!["api", "cache", "db"]);
    setup.listener.close().await;
    setup.server.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_shutting_down_tells_its_clients() {
    let setup = start();
    let endpoints = ClientEndpoints::bind(1, &setup.client_tls).expect("client endpoint");
    let connection = bounded("connect", endpoints.connect(setup.addr)).await.expect("connects");
    let node = engine::testing::node(6);
    bounded("register", connection.register(node.clone())).await.expect("registers");
    let mut watch = bounded("watch", connection.watch_allocs(node.id, node.secret_id, 0)).await.expect("opens");
    bounded("first push", watch.next()).await.expect("push");
    setup.listener.stop_accepting();
    let ended = bounded("the watch's end", watch.next()).await.expect_err("ended");
    assert_eq!(ended.refusal(), Some(RefusalCode::ShuttingDown), "{ended}");
    setup.listener.close().await;
    let closed = bounded("close", connection.closed()).await;
    assert!(
        matches!(closed, quinn::ConnectionError::ApplicationClosed(ref close) if close.error_code == transport::stream::codes::SHUTTING_DOWN),
        "{closed}"
    );
    assert!(matches!(
        bounded("call", connection.heartbeat(node.id, node.secret_id, NodeStatus::Ready)).await,
        Err(CallError::Connection(_))
    ));
    setup.server.shutdown();
}

/// A server calls an agent back on the agent's own connection, once the
/// node's watch made the connection the node's: a reply, a stream of
/// bounded chunks read as they come, and a follow the caller abandons,
/// which the agent notices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_calls_an_agent_back_on_its_connection_and_reads_its_stream() {
    use transport::agent_call::AgentFrame;
    use transport::message::{
        AgentCall, AgentCallRequest, AgentReply, FileChunk, LogStream, LogsCall, Origin, ReadCall, MAX_CHUNK,
    };

    let setup = start();
    let endpoints = ClientEndpoints::bind(1, &setup.client_tls).expect("client endpoint");
    let connection = bounded("connect", endpoints.connect(setup.addr)).await.expect("connects");
    let node = engine::testing::node(0);
    bounded("register", connection.register(node.clone())).await.expect("registers");
    let request = |call: AgentCall| AgentCallRequest { node_id: node.id, call };
    assert!(setup.listener.call_agent(node.id, &request(AgentCall::HostGc)).await.is_none(), "no watch: not held");
    let mut watch = bounded("watch", connection.watch_allocs(node.id, node.secret_id, 0)).await.expect("watch opens");
    bounded("first push", watch.next()).await.expect("first push");
    assert_eq!(setup.listener.agents().len(), 1, "the watch made the connection the node's");

    // The agent's side: a reply, three full chunks, or a follow that
    // waits for its caller to go away.
    let (gone_tx, gone) = tokio::sync::oneshot::channel();
    let agent = tokio::spawn({
        let connection = connection.clone();
        async move {
            let mut gone_tx = Some(gone_tx);
            while let Ok(mut call) = connection.accept_call().await {
                let Some(asked) = call.request().await else { continue };
                match asked.call {
                    AgentCall::HostGc => call.reply(&AgentReply::Done).await,
                    AgentCall::Read(_) => {
                        for n in 0..3u64 {
                            let chunk =
                                FileChunk { file: "f".into(), offset: (n + 1) * 1024, data: vec![7; MAX_CHUNK] };
                            call.chunk(&chunk).await.expect("the caller reads");
                        }
                        call.finish();
                    }
                    _ => {
                        call.chunk(&FileChunk { file: "f".into(), offset: 0, data: vec![] }).await.expect("sent");
                        call.caller_gone().await;
                        let _ = gone_tx.take().expect("one follow").send(());
                    }
                }
            }
        }
    });

    let mut answer =
        setup.listener.call_agent(node.id, &request(AgentCall::HostGc)).await.expect("held").expect("call");
    assert_eq!(answer.first(WATCHDOG).await.expect("answered"), AgentFrame::Reply(AgentReply::Done));

    let read = ReadCall {
        alloc_id: engine::structs::AllocId::from_u128(1),
        path: "f".into(),
        origin: Origin::Start,
        offset: 0,
        limit: None,
        follow: false,
    };
    let mut answer =
        setup.listener.call_agent(node.id, &request(AgentCall::Read(read))).await.expect("held").expect("call");
    let mut chunks = Vec::new();
    while let Some(frame) = bounded("a chunk", answer.next()).await.expect("a frame") {
        let AgentFrame::Chunk(chunk) = frame else { panic!("a chunk, not {frame:?}") };
        chunks.push(chunk);
    }
    assert_eq!(chunks.len(), 3);
    assert!(chunks.iter().all(|chunk| chunk.data.len() == MAX_CHUNK));

    let logs = LogsCall {
        alloc_id: engine::structs::AllocId::from_u128(1),
        task: "web".into(),
        stream: LogStream::Stdout,
        origin: Origin::Start,
        offset: 0,
        follow: true,
    };
    let mut answer =
        setup.listener.call_agent(node.id, &request(AgentCall::Logs(logs))).await.expect("held").expect("call");
    let first = answer.first(WATCHDOG).await.expect("the stream starts");
    assert!(matches!(first, AgentFrame::Chunk(chunk) if chunk.data.is_empty()));
    drop(answer);
    bounded("the agent noticing its caller left", gone).await.expect("noticed");

    let (held, _) = setup.listener.agents().get(node.id).expect("held");
    connection.close();
    bounded("the agent's loop ending", agent).await.expect("agent task");
    bounded("the server seeing the connection close", held.closed()).await;
    assert!(setup.listener.agents().get(node.id).is_none(), "a closed connection is nobody's");
    setup.server.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_services_read_blocks_until_a_registration_and_refuses_strangers() {
    use engine::node::service_reads::{ServiceAnswer, ServiceQuery, MAX_SERVICE_QUERIES};
    use transport::message::ReadServicesRequest;
    let setup = start();
    let endpoints = ClientEndpoints::bind(1, &setup.client_tls).expect("client endpoint");
    let connection = bounded("connect", endpoints.connect(setup.addr)).await.expect("connects");
    let node = engine::testing::node(0);
    bounded("register", connection.register(node.clone())).await.expect("registers");
    let mut watch = bounded("watch", connection.watch_allocs(node.id, node.secret_id, 0)).await.expect("opens");
    bounded("first push", watch.next()).await.expect("first push");
    setup.server.jobs().register(job("web", 1)).expect("job registers");
    let alloc = bounded("the alloc's push", watch.next()).await.expect("push").allocs[0].clone();

    let queries = vec![ServiceQuery::Instances { namespace: "default".into(), name: "web".into() }];
    let read = |min_index: u64, wait: Duration| {
        connection.read_services(node.id, node.secret_id, queries.clone(), min_index, wait)
    };
    let first = bounded("a first read", read(0, Duration::from_secs(30))).await.expect("answered");
    assert!(first.index >= 1, "an index to block on: {first:?}");
    assert_eq!(first.answers, vec![ServiceAnswer::Instances(Vec::new())]);
    let unchanged = bounded("a read bounded by its wait", read(first.index, Duration::ZERO)).await.expect("answered");
    assert_eq!(unchanged, first, "at the end of its wait a read answers with the data as it is");

    let waiting = tokio::spawn({
        let (connection, queries, index) = (connection.clone(), queries.clone(), first.index);
        let (node_id, secret_id) = (node.id, node.secret_id);
        async move { connection.read_services(node_id, secret_id, queries, index, Duration::from_secs(60)).await }
    });
    let registration = engine::testing::service_registration(&alloc, "web", 8080);
    let command = engine::state::Command::UpsertServiceRegistrations { registrations: vec![registration.clone()] };
    tokio::task::block_in_place(|| setup.server.writer().write(command)).expect("registered");
    let woken = bounded("the blocked read", waiting).await.expect("joined").expect("answered");
    assert!(woken.index > first.index);
    let ServiceAnswer::Instances(found) = &woken.answers[0] else { panic!("instances: {woken:?}") };
    assert_eq!(found.iter().map(|row| (&row.id, row.port)).collect::<Vec<_>>(), [(&registration.id, 8080)]);

    let stranger = engine::testing::node(9);
    let unknown = connection.read_services(stranger.id, stranger.secret_id, queries.clone(), 0, Duration::ZERO);
    let refused = bounded("an unknown node's read", unknown).await.expect_err("refused");
    assert_eq!(refused.refusal(), Some(RefusalCode::UnknownNode), "{refused}");
    let wrong = connection.read_services(node.id, Uuid::from_u128(1), queries.clone(), 0, Duration::ZERO);
    let refused = bounded("a wrong secret's read", wrong).await.expect_err("refused");
    assert_eq!(refused.refusal(), Some(RefusalCode::WrongSecret), "{refused}");
    let too_many = vec![queries[0].clone(); MAX_SERVICE_QUERIES + 1];
    let request = ReadServicesRequest {
        node_id: node.id,
        secret_id: node.secret_id,
        queries: too_many,
        min_index: 0,
        wait: Duration::ZERO,
    };
    let mut bytes = Vec::new();
    request.to_frame(3).encode(&mut bytes).expect("encodes");
    for (case, bytes) in [
        ("too many queries", bytes),
        ("garbage payload", raw_frame(&MAGIC, VERSION, Kind::ReadServices as u8, 3, &[0xff, 0xff, 0xff])),
    ] {
        let answer = bounded(case, connection.raw_call(&bytes)).await.expect("answered").expect("a frame");
        let refusal = Refusal::from_frame(&answer).unwrap_or_else(|error| panic!("{case}: {error}"));
        assert_eq!(refusal.code, RefusalCode::Malformed, "{case}: {refusal}");
    }
    setup.listener.close().await;
    setup.server.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_in_flight_together_on_one_connection_are_each_answered() {
    let setup = start();
    let endpoints = ClientEndpoints::bind(1, &setup.client_tls).expect("client endpoint");
    let connection = bounded("connect", endpoints.connect(setup.addr)).await.expect("connects");
    let nodes: Vec<_> = (0..20).map(engine::testing::node).collect();
    for node in &nodes {
        bounded("register", connection.register(node.clone())).await.expect("registers");
    }
    // Heartbeats of every node and a wrong secret, all in flight at once
    // on the connection's call stream: each caller gets its own answer.
    let mut calls = tokio::task::JoinSet::new();
    for (index, node) in nodes.iter().enumerate() {
        let connection = connection.clone();
        let (id, secret) = (node.id, if index == 7 { Uuid::from_u128(7) } else { node.secret_id });
        calls.spawn(async move { (index, connection.heartbeat(id, secret, NodeStatus::Ready).await) });
    }
    let mut answered = 0;
    while let Some(joined) = bounded("the heartbeats", calls.join_next()).await {
        let (index, answer) = joined.expect("the call ran");
        match index {
            7 => assert_eq!(answer.expect_err("a wrong secret").refusal(), Some(RefusalCode::WrongSecret)),
            _ => assert_eq!(answer.expect("beats").status, NodeStatus::Ready),
        }
        answered += 1;
    }
    assert_eq!(answered, nodes.len());
    setup.listener.close().await;
    setup.server.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_one_call_is_answered_and_finished_and_an_unreadable_message_is_refused_on_its_own() {
    use transport::message::{HeartbeatRequest, NodeReply};
    let setup = start();
    let endpoints = ClientEndpoints::bind(1, &setup.client_tls).expect("client endpoint");
    let connection = bounded("connect", endpoints.connect(setup.addr)).await.expect("connects");
    let node = engine::testing::node(5);
    bounded("register", connection.register(node.clone())).await.expect("registers");
    let heartbeat = |request_id: u64| {
        let request = HeartbeatRequest { node_id: node.id, secret_id: node.secret_id, status: NodeStatus::Ready };
        let mut bytes = Vec::new();
        request.to_frame(request_id).encode(&mut bytes).expect("encodes");
        bytes
    };

    // A client of an earlier build: one call, then its side finished. The
    // answer comes, then the server finishes its side too.
    let answers = bounded("one call", connection.raw_calls(&heartbeat(41))).await.expect("answered");
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0].request_id, 41);
    assert_eq!(NodeReply::from_frame(&answers[0]).expect("a heartbeat's answer").status, NodeStatus::Ready);

    // A frame whose message cannot be read, then a good call on the same
    // stream: the first is refused, the second answered.
    let mut bytes = raw_frame(&MAGIC, VERSION, Kind::Heartbeat as u8, 4, &[0xff, 0xff, 0xff, 0xff]);
    bytes.extend(heartbeat(43));
    let answers = bounded("two calls", connection.raw_calls(&bytes)).await.expect("answered");
    assert_eq!(answers.len(), 2, "{answers:?}");
    let refusal = Refusal::from_frame(&answers[0]).expect("a refusal");
    assert_eq!(refusal.code, RefusalCode::Malformed, "{refusal}");
    assert_eq!(answers[1].request_id, 43);
    assert_eq!(NodeReply::from_frame(&answers[1]).expect("a heartbeat's answer").status, NodeStatus::Ready);
    assert_eq!(setup.listener.stats().malformed, 1);
    setup.listener.close().await;
    setup.server.shutdown();
}
