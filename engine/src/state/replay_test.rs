//! Replay is exact: a random sequence of commands applied to one store,
//! and the same commands encoded, decoded and applied to a second store,
//! leave the two in the same state, compared as canonical dumps.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::clock::Timestamp;
use crate::structs::{
    AllocId, Allocation, ClientStatus, DesiredStatus, EvalId, EvalStatus, Evaluation, Job, JobType, Node,
    NodeEligibility, NodeStatus, Resources, TriggerReason,
};

/// One step of the random sequence; a command is built from it against the
/// first store's state (to name allocations that exist).
#[derive(Clone, Debug)]
enum Op {
    Node { n: u8, class: u8 },
    Status { n: u8, status: NodeStatus },
    Miss { n: u8 },
    Eligibility { n: u8, eligible: bool },
    Register { job: u8, count: u32, job_type: JobType, tolerant: bool },
    Deregister { job: u8, purge: bool },
    Evals { job: u8, status: EvalStatus },
    Report { pick: usize, status: ClientStatus, wrong_node: bool },
    Plan { job: u8, n: u8, places: u32, stop: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let status = prop_oneof![Just(NodeStatus::Ready), Just(NodeStatus::Down), Just(NodeStatus::Initializing)];
    let job_type = prop_oneof![Just(JobType::Service), Just(JobType::Batch), Just(JobType::System)];
    let eval_status = prop_oneof![Just(EvalStatus::Pending), Just(EvalStatus::Blocked), Just(EvalStatus::Complete)];
    let client = prop_oneof![Just(ClientStatus::Running), Just(ClientStatus::Failed), Just(ClientStatus::Complete)];
    prop_oneof![
        (0..6u8, 0..3u8).prop_map(|(n, class)| Op::Node { n, class }),
        (0..7u8, status).prop_map(|(n, status)| Op::Status { n, status }),
        (0..7u8).prop_map(|n| Op::Miss { n }),
        (0..7u8, any::<bool>()).prop_map(|(n, eligible)| Op::Eligibility { n, eligible }),
        (0..3u8, 1..4u32, job_type, any::<bool>()).prop_map(|(job, count, job_type, tolerant)| Op::Register {
            job,
            count,
            job_type,
            tolerant
        }),
        (0..4u8, any::<bool>()).prop_map(|(job, purge)| Op::Deregister { job, purge }),
        (0..3u8, eval_status).prop_map(|(job, status)| Op::Evals { job, status }),
        (any::<usize>(), client, any::<bool>()).prop_map(|(pick, status, wrong_node)| Op::Report {
            pick,
            status,
            wrong_node
        }),
        (0..3u8, 0..7u8, 0..4u32, any::<usize>()).prop_map(|(job, n, places, stop)| Op::Plan { job, n, places, stop }),
    ]
}

fn node(n: u8, class: u8) -> Node {
    let mut node = Node::new_ready(NodeId::from_u128(u128::from(n) + 1), "dc1", "c", Resources::new(4_000, 8_192, 0));
    node.meta.insert("class".into(), class.to_string());
    node
}

fn job_key(job: u8) -> JobKey {
    JobKey::new("default", &format!("job-{job}"))
}

/// The command for `op`, read against `snapshot`; `step` makes ids and times.
fn command(op: &Op, snapshot: &Snapshot, step: u64) -> Command {
    let time = Timestamp(1_000_000 + step);
    let eval_for = |key: &JobKey, status: EvalStatus| {
        let spec = snapshot
            .job(key)
            .map(|job| Job::clone(job))
            .unwrap_or_else(|| Job::new_simple(&key.id, JobType::Service, 1, Resources::new(1, 1, 0)));
        let mut eval = Evaluation::with_id(EvalId::from_u128(u128::from(step)), &spec, TriggerReason::NodeUpdate, time);
        eval.status = status;
        eval
    };
    let node_id = |n: u8| NodeId::from_u128(u128::from(n) + 1);
    match *op {
        Op::Node { n, class } => {
            Command::UpsertNode { node: node(n, class), evals: vec![eval_for(&job_key(0), EvalStatus::Pending)] }
        }
        Op::Status { n, status } => Command::UpdateNodeStatus { node_id: node_id(n), status, evals: vec![] },
        Op::Miss { n } => {
            Command::MissHeartbeat { node_id: node_id(n), evals: vec![eval_for(&job_key(1), EvalStatus::Pending)] }
        }
        Op::Eligibility { n, eligible } => {
            let eligibility = if eligible { NodeEligibility::Eligible } else { NodeEligibility::Ineligible };
            Command::UpdateNodeEligibility { node_id: node_id(n), eligibility, evals: vec![] }
        }
        Op::Register { job, count, job_type, tolerant } => {
            let mut spec = Job::new_simple(&format!("job-{job}"), job_type, count, Resources::new(100, 64, 0));
            if tolerant {
                spec.task_groups[0].max_client_disconnect = Some(Duration::from_secs(300));
            }
            let eval = eval_for(&spec.key(), EvalStatus::Pending);
            Command::RegisterJob { job: spec, eval: Some(eval) }
        }
        Op::Deregister { job, purge } => Command::DeregisterJob { job: job_key(job), purge, eval: None },
        Op::Evals { job, status } => Command::UpsertEvals { evals: vec![eval_for(&job_key(job), status)] },
        Op::Report { pick, status, wrong_node } => {
            let mut allocs: Vec<_> = snapshot.allocs().collect();
            allocs.sort_by_key(|alloc| alloc.id);
            let (alloc_id, node) = match allocs.get(pick % allocs.len().max(1)) {
                Some(alloc) => (alloc.id, alloc.node_id),
                None => (AllocId::from_u128(99), node_id(0)),
            };
            let node_id = if wrong_node { NodeId::from_u128(77) } else { node };
            let update = ClientAllocUpdate {
                alloc_id,
                node_id,
                client_status: status,
                client_description: "r".into(),
                task_states: Default::default(),
            };
            Command::UpdateAllocsFromClient { updates: vec![update], evals: vec![], time }
        }
        Op::Plan { job, n, places, stop } => {
            let mut allocs: Vec<Allocation> = Vec::new();
            // Mostly on a node that takes placements; now and then on any.
            let schedulable = snapshot.schedulable_nodes();
            let target = match schedulable.get(usize::from(n) % schedulable.len().max(1)) {
                Some(node) if n < 5 => node,
                _ => node_id(n),
            };
            if let Some(stored) = snapshot.job(&job_key(job)) {
                for index in 0..places {
                    let mut alloc = Allocation::new_placement(stored, "group", index, target, EvalId::from_u128(1));
                    alloc.id = AllocId::from_u128(u128::from(step) << 8 | u128::from(index));
                    if index == 1 {
                        alloc.previous_allocation = snapshot.allocs_by_job(&job_key(job)).map(|alloc| alloc.id).min();
                    }
                    allocs.push(alloc);
                }
            }
            let mut existing: Vec<_> = snapshot.allocs().collect();
            existing.sort_by_key(|alloc| alloc.id);
            if let Some(victim) = existing.get(stop % existing.len().max(1)) {
                let mut stopped = Allocation::clone(victim);
                stopped.desired_status = DesiredStatus::Stop;
                stopped.record_client_status(ClientStatus::Lost, time);
                allocs.insert(0, stopped);
            }
            Command::ApplyPlanResults { eval_id: EvalId::from_u128(u128::from(step)), allocs, evals: vec![], time }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn a_decoded_log_replays_to_the_same_state(ops in proptest::collection::vec(op(), 1..80)) {
        let live = StateStore::new();
        let replica = StateStore::new();
        let mut refused = 0;
        for (step, op) in ops.iter().enumerate() {
            let command = command(op, &live.snapshot(), step as u64 + 1);
            let bytes = command.encode();
            let live_result = live.apply(command);
            let decoded = Command::decode(&bytes).expect("what was encoded decodes");
            let replica_result = replica.apply(decoded);
            prop_assert_eq!(live_result.is_ok(), replica_result.is_ok(), "both refuse or both apply {:?}", op);
            refused += usize::from(live_result.is_err());
            prop_assert_eq!(live.latest_index(), replica.latest_index());
        }
        prop_assert_eq!(live.latest_index(), ops.len() as u64, "every command took one position ({} refused)", refused);
        prop_assert_eq!(live.snapshot().dump(), replica.snapshot().dump());
        // The replica's allocations of one job version share one job.
        let snapshot = replica.snapshot();
        let mut by_version: hashbrown::HashMap<(JobKey, u64), Arc<Job>> = hashbrown::HashMap::new();
        for alloc in snapshot.allocs() {
            let shared = by_version.entry((alloc.job_key(), alloc.job.modify_index)).or_insert_with(|| alloc.job.clone());
            prop_assert!(**shared == *alloc.job);
        }
    }
}
