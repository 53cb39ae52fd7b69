use std::sync::Arc;
use std::time::Duration;

use engine::state::ClientAllocUpdate;
use engine::structs::{AllocId, Allocation, ClientStatus, EvalId, Job, JobType, NodeId, NodeStatus, Resources};
use engine::testing;
use proptest::prelude::*;
use uuid::Uuid;

use super::*;
use crate::frame::Frame;

fn round_trip<M: Message + std::fmt::Debug + PartialEq>(message: &M) {
    let frame = message.to_frame(7);
    assert_eq!(frame.kind, M::KIND as u8);
    assert_eq!(&M::from_frame(&frame).expect("decodes"), message);
}

#[test]
fn every_message_round_trips() {
    let node = testing::node(1);
    let node_id = node.id;
    round_trip(&RegisterRequest { node });
    round_trip(&HeartbeatRequest { node_id, secret_id: Uuid::from_u128(5), status: NodeStatus::Initializing });
    round_trip(&UpdateAllocsRequest {
        node_id,
        secret_id: Uuid::from_u128(5),
        updates: vec![ClientAllocUpdate {
            alloc_id: AllocId::from_u128(9),
            node_id,
            client_status: ClientStatus::Running,
            client_description: "started".into(),
            services: None,
            checks: None,
            health: None,
            task_states: Default::default(),
        }],
    });
    let watch = WatchAllocsRequest { node_id, secret_id: Uuid::from_u128(5), last_index: 41 };
    round_trip(&watch);
    round_trip(&WatchAllocChangesRequest(watch));
    round_trip(&NodeReply {
        index: 3,
        status: NodeStatus::Ready,
        heartbeat_ttl: Duration::from_millis(10_250),
        servers: vec!["127.0.0.1:4647".into()],
    });
    round_trip(&IndexReply { index: 12 });
    let secret_id = Uuid::from_u128(5);
    round_trip(&DrainSelfRequest { node_id, secret_id, deadline_nanos: -1, ignore_system_jobs: true });
    round_trip(&Refusal { code: RefusalCode::WrongSecret, message: "no".into() });
    use engine::node::service_reads::{ServiceAnswer, ServiceNameTags, ServiceQuery};
    let queries = vec![
        ServiceQuery::Instances { namespace: "default".into(), name: "api".into() },
        ServiceQuery::Names { namespace: "default".into() },
    ];
    let wait = Duration::from_secs(60);
    round_trip(&ReadServicesRequest { node_id, secret_id: Uuid::from_u128(5), queries, min_index: 8, wait });
    let job = Arc::new(Job::new_simple("web", JobType::Service, 1, Resources::new(1, 1, 0)));
    let alloc = Allocation::new_placement(&job, "group", 0, node_id, EvalId::from_u128(2));
    let instance = testing::service_registration(&alloc, "api", 8080);
    let names = vec![ServiceNameTags { name: "api".into(), tags: vec!["v1".into()] }];
    round_trip(&ServicesReply {
        index: 9,
        answers: vec![ServiceAnswer::Instances(vec![instance]), ServiceAnswer::Names(names)],
    });
}

/// Every call a server makes on an agent's connection, and every answer.
fn agent_calls() -> Vec<AgentCall> {
    let alloc_id = AllocId::from_u128(9);
    vec![
        AgentCall::Logs(LogsCall {
            alloc_id,
            task: "web".into(),
            stream: LogStream::Stderr,
            origin: Origin::End,
            offset: 4096,
            follow: true,
        }),
        AgentCall::List { alloc_id, path: "/alloc/logs".into() },
        AgentCall::Stat { alloc_id, path: "web/local/out.txt".into() },
        AgentCall::Read(ReadCall {
            alloc_id,
            path: "web/local/out.txt".into(),
            origin: Origin::Start,
            offset: 10,
            limit: Some(20),
            follow: false,
        }),
        AgentCall::Restart { alloc_id, task: None },
        AgentCall::Restart { alloc_id, task: Some("web".into()) },
        AgentCall::Signal { alloc_id, task: Some("web".into()), signal: "SIGUSR1".into() },
        AgentCall::AllocStats { alloc_id },
        AgentCall::AllocGc { alloc_id },
        AgentCall::HostStats,
        AgentCall::HostGc,
    ]
}

#[test]
fn every_agent_call_and_answer_round_trips() {
    let node_id = NodeId::from_u128(3);
    for call in agent_calls() {
        round_trip(&AgentCallRequest { node_id, call });
    }
    let file = FileInfo { name: "out.txt".into(), is_dir: false, size: 12, mode: 0o100644, mod_time: 1_700_000_000 };
    let usage = ProcessUsage { rss_bytes: 1 << 20, percent: 12.5, pids: 2, ..ProcessUsage::default() };
    let host = HostStats {
        memory_total: 8 << 30,
        cpus: vec![CpuUsage { cpu: "cpu0".into(), user: 1.5, system: 0.5, idle: 98.0 }],
        disks: vec![DiskUsage { device: "/dev/sda1".into(), mountpoint: "/data".into(), ..DiskUsage::default() }],
        uptime: 77,
        ..HostStats::default()
    };
    for reply in [
        AgentReply::Done,
        AgentReply::Files(vec![file.clone()]),
        AgentReply::File(file),
        AgentReply::AllocStats(AllocUsage { tasks: [("web".to_string(), usage)].into(), timestamp: 5 }),
        AgentReply::HostStats(host),
    ] {
        round_trip(&reply);
    }
    round_trip(&FileChunk { file: "web.stdout.0".into(), offset: 3, data: b"abc".to_vec() });
    round_trip(&AgentError { code: AgentErrorCode::Invalid, message: "no".into() });
    let encoded = AgentCallRequest { node_id, call: AgentCall::HostGc }.to_frame(1);
    let any = AnyMessage::from_frame(&encoded).expect("decodes by its kind");
    assert_eq!(any.to_frame(1), encoded);
}

#[test]
fn a_malformed_agent_call_is_refused_with_the_reason() {
    let node_id = NodeId::from_u128(3);
    // A call this build does not know: the node, then variant 100.
    let mut payload = postcard::to_allocvec(&node_id).expect("encodes");
    payload.push(100);
    let frame = Frame { kind: Kind::AgentCall as u8, request_id: 1, payload };
    let refused = AgentCallRequest::from_frame(&frame).expect_err("refused");
    assert!(matches!(refused, MessageError::Malformed { kind: Kind::AgentCall, .. }), "{refused}");
    let mut truncated = AgentCallRequest { node_id, call: AgentCall::HostStats }.to_frame(1);
    truncated.payload.truncate(4);
    assert!(matches!(AgentCallRequest::from_frame(&truncated), Err(MessageError::Malformed { .. })));
    let chunk = FileChunk { file: "f".into(), offset: 0, data: vec![] }.to_frame(1);
    assert_eq!(
        AgentCallRequest::from_frame(&chunk),
        Err(MessageError::UnexpectedKind { expected: Kind::AgentCall, found: Kind::FileChunk })
    );
}

/// `count` allocations of one job on one node.
fn placed(count: u32) -> Vec<Arc<Allocation>> {
    let job = Arc::new(Job::new_simple("web", JobType::Service, count, Resources::new(100, 64, 0)));
    (0..count)
        .map(|i| Arc::new(Allocation::new_placement(&job, "group", i, NodeId::from_u128(1), EvalId::from_u128(1))))
        .collect()
}

#[test]
fn a_push_carries_each_job_once_and_shares_it_again() {
    let allocs = placed(20);
    let push = AllocsPush { index: 99, allocs };
    let frame = push.to_frame(1);
    let job_len = postcard::to_allocvec(&*push.allocs[0].job).expect("encodes").len();
    assert!(frame.payload.len() < 2 * job_len + 20 * 400, "{} bytes", frame.payload.len());
    let decoded = AllocsPush::from_frame(&frame).expect("decodes");
    assert_eq!(decoded, push);
    assert!(decoded.allocs.windows(2).all(|pair| Arc::ptr_eq(&pair[0].job, &pair[1].job)));
}

#[test]
fn changes_round_trip_and_a_change_that_is_not_listed_is_refused() {
    let allocs = placed(3);
    let listed: Vec<_> = allocs.iter().map(|alloc| alloc.id).collect();
    let changes = AllocChanges { index: 12, listed: listed.clone(), allocs: allocs[1..].to_vec() };
    round_trip(&changes);
    round_trip(&AllocChanges { index: 13, listed: listed.clone(), allocs: vec![] });
    let unlisted = AllocChanges { index: 14, listed: listed[1..].to_vec(), allocs: allocs[..1].to_vec() };
    let refused = AllocChanges::from_frame(&unlisted.to_frame(1)).expect_err("refused");
    assert!(
        matches!(&refused, MessageError::Malformed { kind: Kind::AllocChanges, reason } if reason.contains("not listed"))
    );
}

#[test]
fn the_wrong_kind_and_garbage_are_refused_with_the_reason() {
    let frame = IndexReply { index: 1 }.to_frame(1);
    assert_eq!(
        NodeReply::from_frame(&frame),
        Err(MessageError::UnexpectedKind { expected: Kind::NodeReply, found: Kind::IndexReply })
    );
    let unknown = Frame { kind: 200, request_id: 1, payload: vec![] };
    assert_eq!(NodeReply::from_frame(&unknown), Err(MessageError::UnknownKind(200)));
    let mut trailing = IndexReply { index: 1 }.to_frame(1);
    trailing.payload.push(0);
    assert!(matches!(IndexReply::from_frame(&trailing), Err(MessageError::Malformed { .. })));
}

proptest! {
    #[test]
    fn arbitrary_payloads_never_panic(kind in any::<u8>(), payload in proptest::collection::vec(any::<u8>(), 0..256)) {
        let frame = Frame { kind, request_id: 1, payload };
        let _ = RegisterRequest::from_frame(&frame);
        let _ = UpdateAllocsRequest::from_frame(&frame);
        let _ = AllocsPush::from_frame(&frame);
        let _ = AllocChanges::from_frame(&frame);
        let _ = AgentCallRequest::from_frame(&frame);
        let _ = AgentReply::from_frame(&frame);
    }
}
