//! Replay is exact: a random sequence of commands applied to one store,
//! and the same commands encoded, decoded and applied to a second store,
//! leave the two in the same state, compared as canonical dumps; and so
//! does a store recovered from a snapshot taken part-way (encoded and
//! decoded in the snapshot format) with the rest of the log applied to it.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::clock::Timestamp;
use crate::structs::{
    AllocId, AllocatedPort, Allocation, ClientStatus, DesiredStatus, EvalId, EvalStatus, Evaluation, Job, JobType,
    Node, NodeEligibility, NodeStatus, Resources, SchedulerAlgorithm, SchedulerConfiguration, ServiceOwner,
    ServiceRegistration, TriggerReason,
};

/// One step of the random sequence; a command is built from it against the
/// first store's state (to name allocations that exist).
#[derive(Clone, Debug)]
enum Op {
    Node {
        n: u8,
        class: u8,
    },
    Status {
        n: u8,
        status: NodeStatus,
    },
    Miss {
        n: u8,
    },
    Eligibility {
        n: u8,
        eligible: bool,
    },
    Register {
        job: u8,
        count: u32,
        job_type: JobType,
        tolerant: bool,
    },
    Deregister {
        job: u8,
        purge: bool,
    },
    Evals {
        job: u8,
        status: EvalStatus,
    },
    Report {
        pick: usize,
        status: ClientStatus,
        wrong_node: bool,
    },
    Plan {
        job: u8,
        n: u8,
        places: u32,
        stop: usize,
        port: u16,
    },
    Config {
        spread: bool,
        cas: Option<u64>,
    },
    /// An ACL write: 0 bootstrap, 1 a policy, 2 delete it, 3 a token with
    /// it, 4 revoke that token (refused when what they name is missing).
    Acl {
        kind: u8,
        n: u8,
    },
    /// A service registration write: 0-2 register a service of an
    /// allocation (refused when it is not live), 3 delete one registration
    /// (refused when unknown), 4 delete an allocation's registrations.
    Service {
        pick: usize,
        kind: u8,
        port: u16,
    },
    /// Mark a version of a job stable or not (refused when not kept).
    Stable {
        job: u8,
        version: u64,
        stable: bool,
    },
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
        (0..3u8, 0..7u8, 0..4u32, any::<usize>(), 0..4u16).prop_map(|(job, n, places, stop, port)| Op::Plan {
            job,
            n,
            places,
            stop,
            port
        }),
        (any::<bool>(), proptest::option::of(0..40u64)).prop_map(|(spread, cas)| Op::Config { spread, cas }),
        (0..5u8, 0..3u8).prop_map(|(kind, n)| Op::Acl { kind, n }),
        (any::<usize>(), 0..5u8, 0..3u16).prop_map(|(pick, kind, port)| Op::Service { pick, kind, port }),
        (0..3u8, 0..4u64, any::<bool>()).prop_map(|(job, version, stable)| Op::Stable { job, version, stable }),
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
        Op::Status { n, status } => {
            Command::UpdateNodeStatus { node_id: node_id(n), status, evals: vec![], time: Timestamp::ZERO }
        }
        Op::Miss { n } => Command::MissHeartbeat {
            node_id: node_id(n),
            evals: vec![eval_for(&job_key(1), EvalStatus::Pending)],
            time: Timestamp::ZERO,
            release_at: None,
        },
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
                services: None,
                checks: None,
                health: None,
                task_states: Default::default(),
            };
            Command::UpdateAllocsFromClient { updates: vec![update], evals: vec![], time }
        }
        Op::Config { spread, cas } => {
            let mut config = SchedulerConfiguration::default();
            config.preemption_config.service_scheduler_enabled = spread;
            if spread {
                config.scheduler_algorithm = SchedulerAlgorithm::Spread;
            }
            Command::SetSchedulerConfig { config, cas_index: cas }
        }
        Op::Acl { kind, n } => {
            let token = crate::structs::AclToken {
                accessor_id: uuid::Uuid::from_u128(u128::from(n) + 1),
                secret_id: uuid::Uuid::from_u128(u128::from(n) + 100),
                name: format!("token-{n}"),
                token_type: crate::structs::AclTokenType::Client,
                policies: vec![format!("policy-{n}")],
                create_time: time,
                create_index: 0,
                modify_index: 0,
            };
            match kind {
                0 => Command::AclBootstrap {
                    token: crate::structs::AclToken {
                        token_type: crate::structs::AclTokenType::Management,
                        policies: vec![],
                        ..token
                    },
                },
                1 => Command::UpsertAclPolicies {
                    policies: vec![crate::structs::AclPolicy {
                        name: format!("policy-{n}"),
                        description: String::new(),
                        rules_text: "node { policy = \"read\" }".into(),
                        rules: crate::structs::AclRules { node: crate::structs::AclLevel::Read, ..Default::default() },
                        create_index: 0,
                        modify_index: 0,
                    }],
                },
                2 => Command::DeleteAclPolicies { names: vec![format!("policy-{n}")] },
                3 => Command::UpsertAclTokens { tokens: vec![token] },
                _ => Command::DeleteAclTokens { accessor_ids: vec![token.accessor_id] },
            }
        }
        Op::Service { pick, kind, port } => {
            let mut allocs: Vec<_> = snapshot.allocs().collect();
            allocs.sort_by_key(|alloc| alloc.id);
            let Some(alloc) = allocs.get(pick % allocs.len().max(1)) else {
                return Command::DeleteServiceRegistration { namespace: "default".into(), id: "none".into() };
            };
            match kind {
                0..=2 => {
                    let name = format!("svc-{}", port % 2);
                    let owner = ServiceOwner::Task("t");
                    let mut registration = ServiceRegistration::of_alloc(alloc, "dc1", owner, &name, "p");
                    registration.port = 20_000 + port;
                    registration.tags = vec![format!("tag-{port}")];
                    Command::UpsertServiceRegistrations { registrations: vec![registration] }
                }
                3 => {
                    let mut ids: Vec<_> = snapshot.service_registrations().map(|row| row.id.clone()).collect();
                    ids.sort();
                    let id = ids.get(pick % ids.len().max(1)).cloned().unwrap_or_else(|| "none".into());
                    Command::DeleteServiceRegistration { namespace: "default".into(), id }
                }
                _ => Command::DeleteServiceRegistrationsOfAllocs { alloc_ids: vec![alloc.id] },
            }
        }
        Op::Stable { job, version, stable } => Command::SetJobStability { key: job_key(job), version, stable },
        Op::Plan { job, n, places, stop, port } => {
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
                    // Few port numbers, so placements collide and are refused now and then.
                    alloc.ports = vec![AllocatedPort {
                        label: "p".into(),
                        value: 20_000 + port + index as u16,
                        to: 0,
                        host_ip: "10.0.0.1".into(),
                    }];
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
                stopped.desired_status = if port % 2 == 0 { DesiredStatus::Stop } else { DesiredStatus::Evict };
                stopped.record_client_status(ClientStatus::Lost, time);
                allocs.insert(0, stopped);
            }
            Command::ApplyPlanResults {
                deployment: None,
                deployment_updates: Vec::new(),
                eval_id: EvalId::from_u128(u128::from(step)),
                allocs,
                evals: vec![],
                time,
            }
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
        // The port index is what the live allocations hold, and never holds one twice.
        let snapshot = live.snapshot();
        prop_assert!(snapshot.port_collisions().is_empty());
        for node in snapshot.nodes() {
            let mut held: Vec<u16> =
                snapshot.allocs_by_node(node.id).filter(|alloc| !alloc.terminal()).flat_map(|alloc| alloc.port_values()).collect();
            held.sort_unstable();
            let indexed: Vec<u16> = snapshot.node_ports(node.id).map(|ports| ports.iter().collect()).unwrap_or_default();
            prop_assert_eq!(held, indexed, "node {}", node.id);
        }
        // The replica's allocations of one job version share one job.
        let snapshot = replica.snapshot();
        let mut by_version: hashbrown::HashMap<(JobKey, u64), Arc<Job>> = hashbrown::HashMap::new();
        for alloc in snapshot.allocs() {
            let shared = by_version.entry((alloc.job_key(), alloc.job.modify_index)).or_insert_with(|| alloc.job.clone());
            prop_assert!(**shared == *alloc.job);
        }
    }

    #[test]
    fn a_snapshot_and_the_log_after_it_recover_the_same_state(
        ops in proptest::collection::vec(op(), 1..80),
        cut in any::<proptest::sample::Index>(),
    ) {
        let live = StateStore::new();
        let commands: Vec<Command> = ops
            .iter()
            .enumerate()
            .map(|(step, op)| {
                let command = command(op, &live.snapshot(), step as u64 + 1);
                let _ = live.apply(command.clone());
                command
            })
            .collect();
        // Replay the same commands up to the cut, snapshot there, recover.
        let cut = cut.index(commands.len() + 1);
        let before = StateStore::new();
        for command in &commands[..cut] {
            let _ = before.apply(command.clone());
        }
        let mut bytes = Vec::new();
        before.snapshot().encode(&mut bytes).expect("a snapshot encodes into memory");
        let decoded = Snapshot::decode(&mut bytes.as_slice()).expect("what was encoded decodes");
        prop_assert_eq!(decoded.dump(), before.snapshot().dump(), "the snapshot itself round-trips");
        let recovered = StateStore::restored(decoded);
        for command in &commands[cut..] {
            let _ = recovered.apply(Command::decode(&command.encode()).expect("decodes"));
        }
        prop_assert_eq!(recovered.snapshot().dump(), live.snapshot().dump());
    }
}
