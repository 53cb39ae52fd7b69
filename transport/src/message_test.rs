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
            task_states: Default::default(),
        }],
    });
    round_trip(&WatchAllocsRequest { node_id, secret_id: Uuid::from_u128(5), last_index: 41 });
    round_trip(&LogsAccessRequest {
        node_id,
        secret_id: Uuid::from_u128(5),
        alloc_id: AllocId::from_u128(9),
        token: Some("secret".into()),
    });
    round_trip(&NodeReply {
        index: 3,
        status: NodeStatus::Ready,
        heartbeat_ttl: Duration::from_millis(10_250),
        servers: vec!["127.0.0.1:4647".into()],
    });
    round_trip(&IndexReply { index: 12 });
    round_trip(&Refusal { code: RefusalCode::WrongSecret, message: "no".into() });
}

#[test]
fn a_push_carries_each_job_once_and_shares_it_again() {
    let job = Arc::new(Job::new_simple("web", JobType::Service, 20, Resources::new(100, 64, 0)));
    let allocs: Vec<_> = (0..20)
        .map(|i| Arc::new(Allocation::new_placement(&job, "group", i, NodeId::from_u128(1), EvalId::from_u128(1))))
        .collect();
    let push = AllocsPush { index: 99, allocs };
    let frame = push.to_frame(1);
    let job_len = postcard::to_allocvec(&*push.allocs[0].job).expect("encodes").len();
    assert!(frame.payload.len() < 2 * job_len + 20 * 400, "{} bytes", frame.payload.len());
    let decoded = AllocsPush::from_frame(&frame).expect("decodes");
    assert_eq!(decoded, push);
    assert!(decoded.allocs.windows(2).all(|pair| Arc::ptr_eq(&pair[0].job, &pair[1].job)));
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
    }
}
