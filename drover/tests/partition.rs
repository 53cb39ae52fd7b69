//! A network partition between three servers, in one process: each
//! server's server-to-server endpoint is reached through a UDP relay that
//! can drop every datagram from or to chosen servers (a real packet loss
//! on loopback, below QUIC).
//!
//! The leader is cut off from the other two:
//! - a write on it (the minority side) is not acknowledged;
//! - the majority elects a new leader and acknowledges writes;
//! - after healing, the old leader's write fails (it was never committed),
//!   the old leader steps down, and all three servers converge on the same
//!   state: the writes acknowledged, and not the minority's.
//!
//! And before the cluster has a leader at all, a client's call is held
//! until it has one (up to the server's hold), or refused at once by a
//! server without a hold.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use drover::server::{ClusterOptions, DurableOptions, RunningServer, ServerOptions};
use engine::server::ServerConfig;
use engine::structs::{Job, JobType, NodeId, Resources};
use parking_lot::RwLock;
use tokio::net::UdpSocket;
use transport::client::ClientEndpoints;
use transport::message::RefusalCode;
use transport::tls::TlsMaterial;

mod common;

use common::{bounded, mock_node, temp_dir};

/// A relay in front of one server's server-to-server endpoint: datagrams
/// from the other servers go through it, both ways, unless their server
/// is blocked.
struct Relay {
    blocked: Arc<RwLock<HashSet<SocketAddr>>>,
}

async fn relay(front: UdpSocket, target: SocketAddr) -> Relay {
    let front = Arc::new(front);
    let blocked: Arc<RwLock<HashSet<SocketAddr>>> = Arc::default();
    let is_blocked = blocked.clone();
    tokio::spawn(async move {
        // One socket towards the target per sender, so answers find their way back.
        let mut upstreams: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
        let mut buf = vec![0u8; 65_536];
        while let Ok((len, from)) = front.recv_from(&mut buf).await {
            if is_blocked.read().contains(&from) {
                continue;
            }
            let upstream = match upstreams.get(&from) {
                Some(upstream) => upstream.clone(),
                None => {
                    let upstream = Arc::new(UdpSocket::bind("127.0.0.1:0").await.expect("upstream socket"));
                    upstream.connect(target).await.expect("connect upstream");
                    let (reader, front, blocked) = (upstream.clone(), front.clone(), is_blocked.clone());
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 65_536];
                        while let Ok(len) = reader.recv(&mut buf).await {
                            if !blocked.read().contains(&from) {
                                let _ = front.send_to(&buf[..len], from).await;
                            }
                        }
                    });
                    upstreams.insert(from, upstream.clone());
                    upstream
                }
            };
            let _ = upstream.send(&buf[..len]).await;
        }
    });
    Relay { blocked }
}

/// One server: its real server-to-server address and the relay in front.
struct Member {
    server: RunningServer,
    peer: SocketAddr,
    relay: Relay,
}

fn free_udp() -> SocketAddr {
    std::net::UdpSocket::bind("127.0.0.1:0").expect("udp").local_addr().expect("addr")
}

fn job(id: &str) -> Job {
    let mut job = Job::new_simple(id, JobType::Service, 1, Resources::new(1, 1, 0));
    job.task_groups[0].tasks[0].driver = "mock".into();
    job
}

/// Cuts `member` off from the others (or heals the cut): each side's
/// relay drops the other side's datagrams.
fn cut(members: &[Member], member: usize, on: bool) {
    let cut_off = &members[member];
    for (_, other) in members.iter().enumerate().filter(|(n, _)| *n != member) {
        if on {
            cut_off.relay.blocked.write().insert(other.peer);
            other.relay.blocked.write().insert(cut_off.peer);
        } else {
            cut_off.relay.blocked.write().remove(&other.peer);
            other.relay.blocked.write().remove(&cut_off.peer);
        }
    }
}

/// Waits until one of `candidates` runs its leader services; its index.
async fn a_leader_among(members: &[Member], candidates: &[usize]) -> usize {
    let (found, mut first) = tokio::sync::mpsc::unbounded_channel();
    for &n in candidates {
        let mut leading = members[n].server.leadership().watch();
        let found = found.clone();
        tokio::spawn(async move {
            if leading.wait_for(|leads| *leads).await.is_ok() {
                let _ = found.send(n);
            }
        });
    }
    bounded("a leader", first.recv()).await.expect("a candidate")
}

/// Registers `job` on `member`'s leader services, blocking a pool thread.
fn register(member: &Member, job: Job) -> tokio::task::JoinHandle<Result<u64, String>> {
    let leader = member.server.leadership().leader();
    tokio::task::spawn_blocking(move || {
        let leader = leader.ok_or("not leading")?;
        leader.jobs().register(job).map(|written| written.index).map_err(|error| error.to_string())
    })
}

/// The job ids `member` holds once its store has reached `index`.
async fn jobs_at(member: &Member, index: u64) -> Vec<String> {
    let store = member.server.leadership().store().clone();
    bounded("a server catching up", store.wait_for_index(index)).await.expect("store running");
    let mut ids: Vec<String> = store.snapshot().jobs().map(|job| job.id.to_string()).collect();
    ids.sort();
    ids
}

/// Three relays, one per server to come, and their addresses (what the
/// servers advertise and join).
async fn relays() -> (Vec<UdpSocket>, Vec<String>) {
    let mut fronts = Vec::new();
    for _ in 0..3 {
        fronts.push(UdpSocket::bind("127.0.0.1:0").await.expect("relay"));
    }
    let join = fronts.iter().map(|front| front.local_addr().expect("bound").to_string()).collect();
    (fronts, join)
}

/// Starts server `n` of three behind `front`; calls wait up to `hold` for a leader.
async fn start_member(
    dir: &std::path::Path,
    n: usize,
    front: UdpSocket,
    join: &[String],
    tls: &TlsMaterial,
    hold: Duration,
) -> Member {
    let peer = free_udp();
    let options = ServerOptions {
        bind: free_udp(),
        advertise: None,
        engine: ServerConfig { workers: 1, ..ServerConfig::default() },
        tls: tls.clone(),
        http: None,
        durable: Some(DurableOptions::under(&dir.join(format!("data-{n}")), replication::DurableConfig::default())),
        cluster: Some(ClusterOptions {
            name: format!("server-{n}"),
            peer_bind: peer,
            advertise_peer: Some(join[n].clone()),
            bootstrap_expect: 3,
            join: join.to_vec(),
            hold,
        }),
    };
    let server = RunningServer::start(options).expect("starts");
    Member { server, peer, relay: relay(front, peer).await }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_stops_acknowledging_and_the_cluster_converges_after_healing() {
    transport::install_crypto_provider();
    let dir = temp_dir("partition");
    let (_ca, server_tls, _client_tls) = TlsMaterial::dev_pair().expect("dev material");
    let (fronts, join) = relays().await;
    let mut members = Vec::new();
    for (n, front) in fronts.into_iter().enumerate() {
        members.push(start_member(&dir, n, front, &join, &server_tls, drover::server::leadership::HOLD).await);
    }

    let leader = a_leader_among(&members, &[0, 1, 2]).await;
    let before = register(&members[leader], job("before")).await.expect("joined").expect("acknowledged");
    for member in &members {
        assert_eq!(jobs_at(member, before).await, ["before"]);
    }

    cut(&members, leader, true);
    let minority = register(&members[leader], job("minority"));
    let majority: Vec<usize> = (0..3).filter(|n| *n != leader).collect();
    let new_leader = a_leader_among(&members, &majority).await;
    let written = register(&members[new_leader], job("majority")).await.expect("joined").expect("acknowledged");
    assert!(!minority.is_finished(), "the cut-off leader acknowledged a write the majority never saw");

    cut(&members, leader, false);
    let refused = bounded("the minority's write to end", minority).await.expect("joined");
    assert!(refused.is_err(), "a write the majority never had was acknowledged: {refused:?}");
    let mut old_leader = members[leader].server.leadership().watch();
    bounded("the old leader stepping down", old_leader.wait_for(|leads| !leads)).await.expect("watch");
    // Every server converges on the majority's state (the minority's
    // uncommitted write is gone), at the same index.
    let index = written.max(members[new_leader].server.leadership().store().latest_index());
    for member in &members {
        assert_eq!(jobs_at(member, index).await, ["before", "majority"]);
    }

    for member in members {
        member.server.shutdown().await;
    }
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// Before the cluster has its first leader (two of the three servers it
/// expects are up), a server with no hold refuses a client's call at once
/// with "no cluster leader", and a server with a hold keeps the call
/// until the third server starts and a leader is elected, then answers
/// it: the registration is then in every server's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_held_until_the_cluster_has_a_leader() {
    transport::install_crypto_provider();
    let dir = temp_dir("hold");
    let (_ca, server_tls, client_tls) = TlsMaterial::dev_pair().expect("dev material");
    let (mut fronts, join) = relays().await;
    let last = fronts.pop().expect("three relays");
    let mut fronts = fronts.into_iter();
    let mut members = vec![
        start_member(&dir, 0, fronts.next().expect("a relay"), &join, &server_tls, Duration::ZERO).await,
        start_member(&dir, 1, fronts.next().expect("a relay"), &join, &server_tls, common::WATCHDOG).await,
    ];
    let clients = Arc::new(ClientEndpoints::bind(1, &client_tls).expect("client endpoint"));

    let impatient = bounded("a connection", clients.connect(members[0].server.local_addr())).await.expect("connects");
    let refused = bounded("a refusal", impatient.register(mock_node(1))).await.expect_err("no leader yet");
    assert_eq!(refused.refusal(), Some(RefusalCode::NoLeader), "{refused}");

    let patient = bounded("a connection", clients.connect(members[1].server.local_addr())).await.expect("connects");
    let held = tokio::spawn(async move { patient.register(mock_node(2)).await });
    members.push(start_member(&dir, 2, last, &join, &server_tls, drover::server::leadership::HOLD).await);
    let reply = bounded("the held registration", held).await.expect("joined").expect("answered once a leader leads");
    for member in &members {
        let store = member.server.leadership().store().clone();
        bounded("a server catching up", store.wait_for_index(reply.index)).await.expect("store running");
        let snapshot = store.snapshot();
        assert!(snapshot.node(NodeId::from_u128(2)).is_some(), "the held registration is missing");
        assert!(snapshot.node(NodeId::from_u128(1)).is_none(), "the refused registration was applied");
    }

    for member in members {
        member.server.shutdown().await;
    }
    clients.close().await;
    std::fs::remove_dir_all(&dir).expect("clean up");
}
