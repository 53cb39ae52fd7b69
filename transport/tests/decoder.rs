//! The frame and message decoder against a few hundred thousand random and
//! mutated inputs (the same entry point as the `cargo fuzz` target in
//! `transport/fuzz`): bad input is refused, never a panic, and whatever
//! decodes survives a round trip.

use std::sync::Arc;
use std::time::Duration;

use engine::state::ClientAllocUpdate;
use engine::structs::{Allocation, ClientStatus, EvalId, Job, JobType, NodeStatus, Resources};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use transport::message::{
    decode_all, AllocChanges, AllocsPush, ClusterAudit, ClusterReport, HeartbeatRequest, IndexReply, JobCounts,
    Message, NodeReply, Refusal, RefusalCode, RegisterRequest, ReportRequest, ReportScope, SubmitJobRequest,
    UpdateAllocsRequest, WatchAllocChangesRequest, WatchAllocsRequest,
};

/// Inputs per run: half random, half mutations of valid streams.
const INPUTS: usize = 300_000;

/// Valid streams: every message kind, framed, alone and back to back.
fn corpus() -> Vec<Vec<u8>> {
    let node = engine::testing::node(7);
    let job = Arc::new(Job::new_simple("web", JobType::Service, 3, Resources::new(100, 64, 0)));
    let allocs: Vec<_> =
        (0..3).map(|i| Arc::new(Allocation::new_placement(&job, "group", i, node.id, EvalId::from_u128(1)))).collect();
    let update = ClientAllocUpdate {
        alloc_id: allocs[0].id,
        node_id: node.id,
        client_status: ClientStatus::Running,
        client_description: "started".into(),
        services: None,
        checks: None,
        health: None,
        task_states: Default::default(),
    };
    let frames = [
        RegisterRequest { node: node.clone() }.to_frame(1),
        HeartbeatRequest { node_id: node.id, secret_id: node.secret_id, status: NodeStatus::Ready }.to_frame(2),
        UpdateAllocsRequest { node_id: node.id, secret_id: node.secret_id, updates: vec![update] }.to_frame(3),
        WatchAllocsRequest { node_id: node.id, secret_id: node.secret_id, last_index: 4 }.to_frame(4),
        NodeReply {
            index: 5,
            status: NodeStatus::Ready,
            heartbeat_ttl: Duration::from_secs(10),
            servers: vec!["a:1".into()],
        }
        .to_frame(5),
        IndexReply { index: 6 }.to_frame(6),
        AllocsPush { index: 7, allocs: allocs.clone() }.to_frame(7),
        WatchAllocChangesRequest(WatchAllocsRequest { node_id: node.id, secret_id: node.secret_id, last_index: 7 })
            .to_frame(13),
        AllocChanges { index: 14, listed: allocs.iter().map(|alloc| alloc.id).collect(), allocs: allocs[1..].to_vec() }
            .to_frame(14),
        Refusal { code: RefusalCode::Malformed, message: "bad".into() }.to_frame(8),
        SubmitJobRequest { job: Job::clone(&job) }.to_frame(9),
        ReportRequest { scope: ReportScope::Full }.to_frame(10),
        ClusterReport { index: 11, jobs: vec![JobCounts::default()], ..ClusterReport::default() }.to_frame(11),
        ClusterReport { index: 12, audit: Some(ClusterAudit::default()), ..ClusterReport::default() }.to_frame(12),
    ];
    let encoded: Vec<Vec<u8>> = frames
        .iter()
        .map(|frame| {
            let mut bytes = Vec::new();
            frame.encode(&mut bytes).expect("encodes");
            bytes
        })
        .collect();
    let mut corpus = encoded.clone();
    corpus.push(encoded.concat());
    corpus
}

fn mutate(rng: &mut SmallRng, input: &[u8]) -> Vec<u8> {
    let mut bytes = input.to_vec();
    for _ in 0..rng.random_range(1..=4) {
        match rng.random_range(0..6) {
            0 if !bytes.is_empty() => {
                let at = rng.random_range(0..bytes.len());
                bytes[at] ^= 1 << rng.random_range(0..8);
            }
            1 if !bytes.is_empty() => {
                let at = rng.random_range(0..bytes.len());
                bytes[at] = rng.random();
            }
            2 => bytes.truncate(rng.random_range(0..=bytes.len())),
            3 => bytes.extend((0..rng.random_range(1..32)).map(|_| rng.random::<u8>())),
            4 if bytes.len() >= 17 => {
                // The header's length field.
                let length: u32 = if rng.random() { rng.random() } else { rng.random_range(0..64) };
                bytes[13..17].copy_from_slice(&length.to_be_bytes());
            }
            _ if !bytes.is_empty() => {
                // A payload byte set to an edge value (varint prefixes, bools, enum tags).
                let at = rng.random_range(0..bytes.len());
                bytes[at] = [0x00, 0x01, 0x7f, 0x80, 0xff][rng.random_range(0..5)];
            }
            _ => {}
        }
    }
    bytes
}

#[test]
fn random_and_mutated_inputs_are_refused_or_round_trip() {
    let corpus = corpus();
    for valid in &corpus {
        assert!(decode_all(valid) >= 1, "every valid stream decodes");
    }
    let mut rng = SmallRng::seed_from_u64(0x5eed);
    let mut decoded = 0;
    for n in 0..INPUTS {
        let input = if n % 2 == 0 {
            (0..rng.random_range(0..96)).map(|_| rng.random::<u8>()).collect::<Vec<u8>>()
        } else {
            let pick = rng.random_range(0..corpus.len());
            mutate(&mut rng, &corpus[pick])
        };
        decoded += decode_all(&input);
    }
    // Mutations that keep a frame valid still reach the message decoders.
    assert!(decoded > INPUTS / 100, "only {decoded} of {INPUTS} inputs decoded to a message");
}
