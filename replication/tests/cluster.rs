//! The command log's answers at the cluster boundary, on servers in this
//! process talking over their real server-to-server endpoints:
//! - a write on a follower is refused as "not the leader", naming the
//!   leader's id and addresses, while the leader takes it;
//! - once raft has stopped on a server, a write there is refused as
//!   "stopped" on its first try (the log's answer is final, no retry loop
//!   hides it), and so is the next one.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use engine::state::{Command, LeaderHint, LogError, StateError};
use engine::structs::{Node, NodeId, Resources};
use replication::{ClusterSetup, Durable, DurableConfig, Membership, ServerNode};
use storage::{DataDir, FatalError};
use transport::peer::{PeerAnswer, PeerHandler, Peers};
use transport::tls::TlsMaterial;

/// How long the cluster may take to elect its first leader before the
/// test fails (it is not a pause: the wait ends as soon as one leads).
const ELECTION: Duration = Duration::from_secs(60);

/// A write that any state takes: a node registers.
fn register(n: u128) -> Command {
    let node = Node::new_ready(NodeId::from_u128(n), "dc1", "c", Resources::new(4_000, 8_192, 0));
    Command::UpsertNode { node, evals: vec![] }
}

fn fatal_handler() -> storage::FatalHandler {
    Arc::new(|error: &FatalError| panic!("a write to disk failed: {error}"))
}

/// Answers the other servers' calls with a server's durable state, once
/// it is open (the endpoint is bound before).
#[derive(Default)]
struct Answers(OnceLock<Arc<Durable>>);

impl PeerHandler for Answers {
    fn call(&self, kind: u8, request: Vec<u8>) -> PeerAnswer {
        let durable = self.0.get().cloned();
        Box::pin(async move {
            let durable = durable.ok_or("this server is starting")?;
            match durable.serve_peer(kind, &request).await {
                Some(answer) => Ok(answer?),
                None => Err(format!("unknown call kind {kind}").into()),
            }
        })
    }
}

/// One server of the cluster.
struct Member {
    durable: Arc<Durable>,
    node: ServerNode,
    peers: Arc<Peers>,
    _dir: tempfile::TempDir,
}

/// Three servers forming one cluster; their endpoints run on `runtime`.
fn three_servers(runtime: &tokio::runtime::Runtime) -> Vec<Member> {
    transport::install_crypto_provider();
    let (_ca, tls, _client) = TlsMaterial::dev_pair().expect("dev material");
    let _entered = runtime.enter();
    let handlers: Vec<Arc<Answers>> = (0..3).map(|_| Arc::new(Answers::default())).collect();
    let peers: Vec<Arc<Peers>> = handlers
        .iter()
        .map(|handler| Peers::bind("127.0.0.1:0".parse().expect("an address"), &tls, handler.clone()).expect("bound"))
        .collect();
    let addrs: Vec<String> = peers.iter().map(|peers| peers.local_addr().expect("bound").to_string()).collect();
    let mut members = Vec::new();
    for (n, (handler, peers)) in handlers.into_iter().zip(peers).enumerate() {
        let node = ServerNode {
            name: format!("server-{n}"),
            peer: addrs[n].clone(),
            rpc: format!("127.0.0.1:{}", 14_000 + n),
            http: format!("127.0.0.1:{}", 15_000 + n),
        };
        let setup = ClusterSetup {
            membership: Arc::new(Membership::new(n as u64 + 1, node.clone())),
            peers: peers.clone(),
            bootstrap_expect: 3,
            join: addrs.clone(),
        };
        let dir = tempfile::tempdir().expect("a temp dir");
        let durable =
            Durable::open_cluster(&DataDir::new(dir.path()), &DurableConfig::default(), fatal_handler(), setup)
                .expect("opens");
        let durable = Arc::new(durable);
        let _ = handler.0.set(durable.clone());
        members.push(Member { durable, node, peers, _dir: dir });
    }
    members
}

/// Waits until every member knows the same leader; its index in `members`.
fn leader_of(runtime: &tokio::runtime::Runtime, members: &[Member]) -> usize {
    let first = members[0].durable.raft().clone();
    let leader = runtime
        .block_on(first.wait(Some(ELECTION)).metrics(|now| now.current_leader.is_some(), "a leader"))
        .expect("a leader is elected")
        .current_leader
        .expect("a leader");
    for member in members {
        let raft = member.durable.raft().clone();
        runtime
            .block_on(raft.wait(Some(ELECTION)).current_leader(leader, "the same leader"))
            .expect("every server knows the leader");
    }
    members.iter().position(|member| member.durable.id() == leader).expect("the leader is a member")
}

#[test]
fn a_follower_refuses_a_write_naming_the_leader_and_a_stopped_log_refuses_at_once() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let members = three_servers(&runtime);
    let leader = leader_of(&runtime, &members);
    let follower = (leader + 1) % members.len();

    // The leader takes a write; a follower's log refuses one, naming the
    // leader and where its clients and its HTTP API reach it.
    members[leader].durable.writer().write(register(1)).expect("the leader takes a write");
    let refused = members[follower].durable.writer().write(register(2)).expect_err("a follower takes no write");
    let StateError::Log(LogError::NotLeader { leader: Some(hint) }) = &refused else {
        panic!("a follower's refusal names the leader: {refused:?}");
    };
    // The leader it names (the one elected, unless a busy machine made the
    // cluster elect again since) with its addresses as the membership has them.
    let named = members.iter().find(|member| member.durable.id() == hint.id).expect("a member is named");
    assert_ne!(hint.id, members[follower].durable.id(), "a follower names itself");
    let expected = LeaderHint { id: hint.id, rpc: named.node.rpc.clone(), http: named.node.http.clone() };
    assert_eq!(*hint, expected);
    assert!(refused.to_string().contains(&named.node.rpc), "{refused}");

    // raft stops on the leader: its log refuses as stopped, every time.
    let stopped = members[leader].durable.raft().clone();
    runtime.block_on(stopped.shutdown()).expect("raft stops");
    assert!(members[leader].durable.has_stopped());
    for n in [3, 4] {
        let refused = members[leader].durable.writer().write(register(n)).expect_err("a stopped log takes no write");
        assert!(matches!(refused, StateError::Log(LogError::Stopped { .. })), "{refused:?}");
    }

    for member in &members {
        member.durable.shutdown();
        member.peers.close();
    }
}
