//! Transport benches: one heartbeat call (`UpdateStatus`) on an open QUIC
//! connection with mutual TLS, over loopback, against a real engine server:
//! the round trip a client pays per heartbeat, with the server's whole path
//! (stream accept, frame and message decode, the engine's heartbeat, the
//! reply) in it. The handshake and registration are not timed.
//!
//! `64_clients` is the server's side of the heartbeat path under load: 64
//! connections each send one heartbeat, concurrently, per iteration; its
//! throughput is heartbeats per second through one server on two cores
//! shared with the clients.

use std::net::SocketAddr;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use engine::clock::SystemClock;
use engine::server::{Server, ServerConfig};
use engine::structs::NodeStatus;
use engine::testing::node;
use transport::client::ClientEndpoints;
use transport::server::ClientListener;
use transport::tls::TlsMaterial;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn heartbeat_rtt(c: &mut Criterion) {
    transport::install_crypto_provider();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let server = Server::start(ServerConfig { workers: 1, ..ServerConfig::default() }, SystemClock::shared());
    let (_ca, server_tls, client_tls) = TlsMaterial::dev_pair().expect("dev material");
    let loopback: SocketAddr = "127.0.0.1:0".parse().expect("address");
    let (listener, connection) = runtime.block_on(async {
        let listener =
            Arc::new(ClientListener::bind(loopback, &server_tls, server.nodes(), vec![], None).expect("binds"));
        let addr = listener.local_addr().expect("bound");
        tokio::spawn({
            let listener = listener.clone();
            async move { listener.run().await }
        });
        let endpoints = ClientEndpoints::bind(1, &client_tls).expect("client endpoint");
        let connection = endpoints.connect(addr).await.expect("connects");
        (listener, connection)
    });
    let node = node(1);
    runtime.block_on(connection.register(node.clone())).expect("registers");
    // The workload does its work (checked before timing).
    let reply = runtime.block_on(connection.heartbeat(node.id, node.secret_id, NodeStatus::Ready)).expect("beats");
    assert_eq!(reply.status, NodeStatus::Ready);

    let mut group = c.benchmark_group("transport/heartbeat_rtt");
    group.throughput(Throughput::Elements(1));
    group.bench_function(BenchmarkId::from_parameter("1_client"), |b| {
        b.iter(|| runtime.block_on(connection.heartbeat(node.id, node.secret_id, NodeStatus::Ready)).expect("beats"))
    });
    group.finish();

    const CLIENTS: u64 = 64;
    let clients: Vec<_> = runtime.block_on(async {
        let endpoints = ClientEndpoints::bind(4, &client_tls).expect("client endpoints");
        let addr = listener.local_addr().expect("bound");
        let mut clients = Vec::new();
        for index in 0..CLIENTS {
            let connection = endpoints.connect(addr).await.expect("connects");
            let node = engine::testing::node(100 + index as usize);
            connection.register(node.clone()).await.expect("registers");
            clients.push((connection, node));
        }
        clients
    });
    let mut group = c.benchmark_group("transport/heartbeats");
    group.throughput(Throughput::Elements(CLIENTS));
    group.bench_function(BenchmarkId::from_parameter("64_clients"), |b| {
        b.iter(|| {
            runtime.block_on(async {
                let mut beats = tokio::task::JoinSet::new();
                for (connection, node) in &clients {
                    let (connection, id, secret) = (connection.clone(), node.id, node.secret_id);
                    beats.spawn(async move { connection.heartbeat(id, secret, NodeStatus::Ready).await });
                }
                while let Some(beat) = beats.join_next().await {
                    beat.expect("the task ran").expect("beats");
                }
            })
        })
    });
    group.finish();
    runtime.block_on(listener.close());
    server.shutdown();
}

criterion_group!(benches, heartbeat_rtt);
criterion_main!(benches);
