//! What a server answers a write it cannot take itself, at its two
//! boundaries (the HTTP API and the client endpoint), on servers in this
//! process:
//! - a follower forwards both kinds of write to the leader, which takes
//!   them;
//! - once raft has stopped on a server (of a cluster, or alone over its
//!   data dir), both are refused as what it is, on the first try: HTTP 500
//!   saying the raft log has stopped, and a [`RefusalCode::LogStopped`]
//!   refusal, which a client does not retry on the same server (unlike
//!   "no leader").

use std::net::SocketAddr;
use std::sync::Arc;

use drover::api::client::ApiClient;
use drover::listener::HttpLimits;
use drover::server::{ClusterOptions, DurableOptions, HttpOptions, RunningServer, ServerOptions};
use engine::server::ServerConfig;
use serde_json::{json, Value};
use transport::client::{CallError, ClientEndpoints};
use transport::message::RefusalCode;
use transport::tls::TlsMaterial;

mod common;

use common::{bounded, mock_node, temp_dir};

fn free_udp() -> SocketAddr {
    std::net::UdpSocket::bind("127.0.0.1:0").expect("udp").local_addr().expect("addr")
}

/// A server on loopback with its HTTP API (plain, no ACLs) and a data dir
/// under `dir`; one of three when `cluster` is given.
fn options(dir: &std::path::Path, n: usize, tls: &TlsMaterial, cluster: Option<ClusterOptions>) -> ServerOptions {
    ServerOptions {
        bind: free_udp(),
        advertise: None,
        engine: ServerConfig { workers: 1, ..ServerConfig::default() },
        tls: tls.clone(),
        http: Some(HttpOptions {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            tls: false,
            verify_clients: false,
            name: format!("server-{n}"),
            datacenter: "dc1".to_string(),
            acl_enabled: false,
            limits: HttpLimits::default(),
        }),
        durable: Some(DurableOptions::under(&dir.join(format!("data-{n}")), replication::DurableConfig::default())),
        cluster,
    }
}

/// The HTTP API of `server`.
fn api(server: &RunningServer) -> ApiClient {
    let addr = server.http_addr().expect("the HTTP API is served");
    ApiClient::new(&format!("http://{addr}"), None, None).expect("a client")
}

/// A job in Nomad's JSON, as `PUT /v1/jobs` takes it.
fn job(id: &str) -> Value {
    json!({"Job": {"ID": id, "Name": id, "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "web", "Count": 1,
            "Tasks": [{"Name": "server", "Driver": "mock", "Config": {"run_for": "1h"},
                "Resources": {"CPU": 100, "MemoryMB": 64}}]}]}})
}

/// `PUT /v1/jobs` on `api`: the status and the body.
async fn put_job(api: &ApiClient, id: &str) -> (u16, String) {
    let answer =
        bounded("a job write's answer", api.request("PUT", "/v1/jobs", Some(&job(id)))).await.expect("answered");
    (answer.status, answer.body)
}

/// A client registration on `server`'s client endpoint.
async fn register(clients: &ClientEndpoints, server: &RunningServer, n: u128) -> Result<u64, CallError> {
    let connection = bounded("a connection", clients.connect(server.local_addr())).await.expect("connects");
    bounded("a registration's answer", connection.register(mock_node(n))).await.map(|reply| reply.index)
}

/// Both boundaries refuse a write on `server`, whose raft has stopped, as
/// what it is.
async fn refused_as_stopped(clients: &ClientEndpoints, server: &RunningServer, n: u128) {
    let (status, body) = put_job(&api(server), &format!("refused-{n}")).await;
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("raft log has stopped"), "{body}");
    let refused = register(clients, server, n).await.expect_err("a stopped log takes no registration");
    assert_eq!(refused.refusal(), Some(RefusalCode::LogStopped), "{refused}");
    assert!(!refused.is_transient(), "a client would retry a stopped log: {refused}");
}

/// Stops raft on `server`, leaving the rest of it running.
async fn stop_raft(server: &RunningServer) {
    let durable = server.durable().expect("a data dir").clone();
    bounded("raft stopping", durable.raft().shutdown()).await.expect("raft stops");
    assert!(durable.has_stopped());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_forwards_writes_and_a_stopped_log_refuses_them_as_stopped() {
    transport::install_crypto_provider();
    let dir = temp_dir("cluster-errors");
    let (_ca, server_tls, client_tls) = TlsMaterial::dev_pair().expect("dev material");
    let clients = Arc::new(ClientEndpoints::bind(1, &client_tls).expect("client endpoint"));
    let peers: Vec<SocketAddr> = (0..3).map(|_| free_udp()).collect();
    let join: Vec<String> = peers.iter().map(SocketAddr::to_string).collect();
    let mut servers = Vec::new();
    for (n, peer) in peers.iter().enumerate() {
        let cluster = ClusterOptions {
            name: format!("server-{n}"),
            peer_bind: *peer,
            advertise_peer: None,
            bootstrap_expect: 3,
            join: join.clone(),
            hold: drover::server::leadership::HOLD,
        };
        servers.push(RunningServer::start(options(&dir, n, &server_tls, Some(cluster))).expect("starts"));
    }
    let (found, mut first) = tokio::sync::mpsc::unbounded_channel();
    for (n, server) in servers.iter().enumerate() {
        let mut leading = server.leadership().watch();
        let found = found.clone();
        tokio::spawn(async move {
            if leading.wait_for(|leads| *leads).await.is_ok() {
                let _ = found.send(n);
            }
        });
    }
    let leader = bounded("a leader", first.recv()).await.expect("a server leads");
    let follower = (leader + 1) % servers.len();

    // A follower forwards both writes; the leader takes them.
    let (status, body) = put_job(&api(&servers[follower]), "forwarded").await;
    assert_eq!(status, 200, "{body}");
    let index = register(&clients, &servers[follower], 1).await.expect("a forwarded registration is answered");
    let store = servers[leader].leadership().store().clone();
    bounded("the leader's state", store.wait_for_index(index)).await.expect("store running");
    let snapshot = store.snapshot();
    assert!(snapshot.jobs().any(|job| job.id.to_string() == "forwarded"), "the forwarded job is missing");
    assert!(snapshot.node(mock_node(1).id).is_some(), "the forwarded registration is missing");

    // raft stops on the follower: it forwards nothing any more.
    stop_raft(&servers[follower]).await;
    refused_as_stopped(&clients, &servers[follower], 2).await;

    for server in servers {
        server.shutdown().await;
    }
    clients.close().await;
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_alone_whose_log_stopped_refuses_writes_as_stopped() {
    transport::install_crypto_provider();
    let dir = temp_dir("alone-stopped");
    let (_ca, server_tls, client_tls) = TlsMaterial::dev_pair().expect("dev material");
    let clients = ClientEndpoints::bind(1, &client_tls).expect("client endpoint");
    let server = RunningServer::start(options(&dir, 0, &server_tls, None)).expect("starts");
    let (status, body) = put_job(&api(&server), "taken").await;
    assert_eq!(status, 200, "{body}");

    stop_raft(&server).await;
    refused_as_stopped(&clients, &server, 1).await;

    server.shutdown().await;
    clients.close().await;
    std::fs::remove_dir_all(&dir).expect("clean up");
}
