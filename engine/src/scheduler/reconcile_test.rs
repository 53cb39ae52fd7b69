use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::structs::{AllocId, DesiredStatus, EvalId, JobType, Resources, UpdateStrategy};

const NOW: Timestamp = Timestamp(1_000_000 * 1_000_000_000);
/// The eval being reconciled.
const EVAL: EvalId = EvalId::from_u128(7);

struct Fixture {
    job: Arc<Job>,
    allocs: Vec<Arc<Allocation>>,
    nodes: HashMap<NodeId, Arc<Node>>,
}

impl Fixture {
    fn new(job_type: JobType, count: u32) -> Self {
        let mut job = Job::new_simple("web", job_type, count, Resources::new(100, 100, 0));
        job.job_modify_index = 10;
        let nodes = (1..=3)
            .map(|n| {
                let node = Node::new_ready(NodeId::from_u128(n), "dc1", "", Resources::new(10_000, 10_000, 10_000));
                (node.id, Arc::new(node))
            })
            .collect();
        Fixture { job: Arc::new(job), allocs: Vec::new(), nodes }
    }

    fn add(&mut self, index: u32, node: u128, status: ClientStatus) -> Arc<Allocation> {
        let mut alloc =
            Allocation::new_placement(&self.job, "group", index, NodeId::from_u128(node), EvalId::from_u128(1));
        alloc.id = AllocId::from_u128(self.allocs.len() as u128 + 100);
        alloc.create_index = self.allocs.len() as u64 + 1;
        alloc.client_status = status;
        alloc.modify_time = NOW;
        alloc.client_status_time = NOW;
        let alloc = Arc::new(alloc);
        self.allocs.push(alloc.clone());
        alloc
    }

    fn set_node_status(&mut self, node: u128, status: NodeStatus) {
        let mut changed = Node::clone(&self.nodes[&NodeId::from_u128(node)]);
        changed.status = status;
        self.nodes.insert(changed.id, Arc::new(changed));
    }

    fn compute(&self) -> Reconciled {
        self.compute_for(EVAL)
    }

    fn compute_for(&self, eval_id: EvalId) -> Reconciled {
        let key = self.job.key();
        Reconciler {
            job: Some(&self.job),
            job_key: &key,
            allocs: &self.allocs,
            nodes: &self.nodes,
            now: NOW,
            eval_id,
            deployment: None,
            eval_priority: 50,
        }
        .compute()
    }
}

fn placed_indexes(result: &Reconciled) -> Vec<u32> {
    let mut indexes: Vec<_> = result.place.iter().map(|request| request.index).collect();
    indexes.sort_unstable();
    indexes
}

fn stopped_indexes(result: &Reconciled) -> Vec<u32> {
    result.stop.iter().map(|stop| stop.alloc.index().expect("named")).collect()
}

#[test]
fn a_new_job_places_every_slot() {
    let result = Fixture::new(JobType::Service, 3).compute();
    assert_eq!(placed_indexes(&result), [0, 1, 2]);
    assert!(result.stop.is_empty());
}

#[test]
fn scaling_down_stops_the_highest_indexes_first() {
    let mut fixture = Fixture::new(JobType::Service, 5);
    for index in 0..5 {
        fixture.add(index, 1, ClientStatus::Running);
    }
    fixture.job = Arc::new(Job {
        task_groups: vec![TaskGroup { count: 3, ..fixture.job.task_groups[0].clone() }],
        ..Job::clone(&fixture.job)
    });
    let result = fixture.compute();
    assert_eq!(stopped_indexes(&result), [4, 3]);
    assert!(result.place.is_empty());
    assert!(result.inplace.is_empty(), "a count change alone updates nothing");
}

#[test]
fn scaling_up_fills_the_missing_slots() {
    let mut fixture = Fixture::new(JobType::Service, 4);
    fixture.add(0, 1, ClientStatus::Running);
    fixture.add(2, 1, ClientStatus::Running);
    assert_eq!(placed_indexes(&fixture.compute()), [1, 3]);
}

#[test]
fn allocations_on_a_down_node_are_lost_and_replaced() {
    let mut fixture = Fixture::new(JobType::Service, 2);
    fixture.add(0, 1, ClientStatus::Running);
    let lost = fixture.add(1, 2, ClientStatus::Running);
    fixture.set_node_status(2, NodeStatus::Down);
    let result = fixture.compute();
    assert_eq!(result.stop.len(), 1);
    assert_eq!(result.stop[0].alloc.id, lost.id);
    assert_eq!(result.stop[0].client_status, Some(ClientStatus::Lost));
    assert_eq!(placed_indexes(&result), [1]);
    assert_eq!(result.place[0].previous.as_ref().map(|alloc| alloc.id), Some(lost.id));
}

#[test]
fn a_lost_allocation_whose_client_stops_it_keeps_its_slot_empty_until_then() {
    let wait = Duration::from_secs(120);
    let mut fixture = Fixture::new(JobType::Service, 1);
    let mut job = Job::clone(&fixture.job);
    job.task_groups[0].stop_after_client_disconnect = Some(wait);
    fixture.job = Arc::new(job);
    let lost = fixture.add(0, 2, ClientStatus::Running);
    fixture.set_node_status(2, NodeStatus::Down);
    let result = fixture.compute();
    assert_eq!(result.stop.iter().map(|stop| stop.alloc.id).collect::<Vec<_>>(), [lost.id]);
    assert!(result.place.is_empty(), "no replacement while its client may still run it");
    assert_eq!(result.follow_up_at, Some(NOW.plus(wait)));
    // As the plan stopped it: desired stop, lost at NOW.
    let mut stopped = Allocation::clone(&lost);
    stopped.desired_status = DesiredStatus::Stop;
    stopped.record_client_status(ClientStatus::Lost, NOW);
    fixture.allocs[0] = Arc::new(stopped);
    let result = fixture.compute();
    assert!(result.place.is_empty() && result.stop.is_empty(), "any eval before then waits too");
    assert_eq!(result.follow_up_at, Some(NOW.plus(wait)));
    let key = fixture.job.key();
    let later = NOW.plus(wait);
    let result = Reconciler {
        job: Some(&fixture.job),
        job_key: &key,
        allocs: &fixture.allocs,
        nodes: &fixture.nodes,
        now: later,
        eval_id: EVAL,
        deployment: None,
        eval_priority: 50,
    }
    .compute();
    assert_eq!(placed_indexes(&result), [0], "then the slot is placed");
}

#[test]
fn a_disconnect_tolerant_group_marks_unknown_and_replaces() {
    let mut fixture = Fixture::new(JobType::Service, 1);
    let mut job = Job::clone(&fixture.job);
    job.task_groups[0].max_client_disconnect = Some(Duration::from_secs(300));
    fixture.job = Arc::new(job);
    let alloc = fixture.add(0, 2, ClientStatus::Running);
    fixture.set_node_status(2, NodeStatus::Disconnected);
    let result = fixture.compute();
    assert_eq!(result.disconnecting.iter().map(|alloc| alloc.id).collect::<Vec<_>>(), vec![alloc.id]);
    assert!(result.stop.is_empty());
    assert_eq!(placed_indexes(&result), [0]);
    assert_eq!(result.follow_up_at, Some(NOW.plus(Duration::from_secs(300))));
}

/// A fixture whose group tolerates a disconnect of `WINDOW`.
const WINDOW: Duration = Duration::from_secs(300);

fn tolerant_fixture() -> Fixture {
    let mut fixture = Fixture::new(JobType::Service, 1);
    let mut job = Job::clone(&fixture.job);
    job.task_groups[0].max_client_disconnect = Some(WINDOW);
    fixture.job = Arc::new(job);
    fixture
}

/// An allocation the servers marked `unknown` at `marked_at`, now reported as `status`.
fn marked_unknown(
    fixture: &mut Fixture,
    index: u32,
    node: u128,
    marked_at: Timestamp,
    status: ClientStatus,
) -> Arc<Allocation> {
    let alloc = fixture.add(index, node, ClientStatus::Running);
    let mut marked = Allocation::clone(&alloc);
    marked.record_client_status(ClientStatus::Unknown, marked_at);
    marked.client_status = status;
    let marked = Arc::new(marked);
    let last = fixture.allocs.len() - 1;
    fixture.allocs[last] = marked.clone();
    marked
}

#[test]
fn an_unknown_allocation_waits_and_its_slot_is_replaced_while_its_node_is_away() {
    let mut fixture = tolerant_fixture();
    let unknown = marked_unknown(&mut fixture, 0, 2, NOW, ClientStatus::Unknown);
    fixture.set_node_status(2, NodeStatus::Disconnected);
    let result = fixture.compute();
    assert!(result.stop.is_empty() && result.disconnecting.is_empty() && result.reconnect.is_empty());
    assert_eq!(placed_indexes(&result), [0]);
    assert_eq!(result.place[0].previous.as_ref().map(|alloc| alloc.id), Some(unknown.id));
    assert_eq!(result.follow_up_at, None, "its expiry eval was made when it was marked");
}

#[test]
fn an_unconfirmed_allocation_whose_node_is_back_is_ignored_until_the_client_reports() {
    for status in [NodeStatus::Initializing, NodeStatus::Ready] {
        // No replacement yet: the slot is not held, so one is asked for (it
        // cannot land on the original's node, which takes no placement until
        // the client has reported).
        let mut fixture = tolerant_fixture();
        let original = marked_unknown(&mut fixture, 0, 2, NOW, ClientStatus::Unknown);
        fixture.set_node_status(2, status);
        let result = fixture.compute();
        assert_eq!(placed_indexes(&result), [0], "{status:?}");
        assert_eq!(result.place[0].previous.as_ref().map(|alloc| alloc.id), Some(original.id));
        assert!(result.stop.is_empty() && result.reconnect.is_empty(), "{status:?}");

        // A running replacement keeps running, and the original is not rolled over.
        let replacement = fixture.add(0, 1, ClientStatus::Running);
        let mut newer_job = Job::clone(&fixture.job);
        newer_job.version = 1;
        newer_job.job_modify_index = 20;
        newer_job.task_groups[0].tasks[0].config.insert("image".into(), "v2".into());
        fixture.job = Arc::new(newer_job);
        let result = fixture.compute();
        assert!(result
            .place
            .iter()
            .all(|request| request.previous.as_ref().map(|alloc| alloc.id) != Some(original.id)));
        assert!(result.reconnect.is_empty() && result.inplace.is_empty(), "{status:?}");
        let stopped: Vec<_> = result.stop.iter().map(|stop| stop.alloc.id).collect();
        assert_eq!(stopped, [replacement.id], "{status:?}: only the outdated replacement rolls over");
    }
}

#[test]
fn a_reconnecting_original_is_kept_once_and_its_replacement_stopped() {
    let mut fixture = tolerant_fixture();
    let original = marked_unknown(&mut fixture, 0, 2, NOW, ClientStatus::Running);
    let replacement = fixture.add(0, 1, ClientStatus::Running);
    fixture.set_node_status(2, NodeStatus::Initializing);
    let result = fixture.compute();
    assert_eq!(result.reconnect.iter().map(|alloc| alloc.id).collect::<Vec<_>>(), [original.id]);
    assert_eq!(result.stop.iter().map(|stop| stop.alloc.id).collect::<Vec<_>>(), [replacement.id]);
    assert!(result.place.is_empty());
}

#[test]
fn the_group_reconcile_strategy_picks_which_of_a_reconnected_slot_stays() {
    use crate::structs::{ReconcileStrategy, TaskState};
    let started = |alloc: &Arc<Allocation>, at: u64, score: f64| {
        let mut changed = Allocation::clone(alloc);
        changed.score = score;
        let state = TaskState { started_at: Some(Timestamp(at)), ..TaskState::default() };
        changed.task_states.insert("task".into(), state);
        Arc::new(changed)
    };
    // The original started first on a worse node; the replacement later on a better one.
    let cases = [
        (ReconcileStrategy::BestScore, false),
        (ReconcileStrategy::KeepOriginal, true),
        (ReconcileStrategy::KeepReplacement, false),
        (ReconcileStrategy::LongestRunning, true),
    ];
    for (strategy, original_stays) in cases {
        let mut fixture = tolerant_fixture();
        let mut job = Job::clone(&fixture.job);
        job.task_groups[0].reconcile = strategy;
        fixture.job = Arc::new(job);
        let original = marked_unknown(&mut fixture, 0, 2, NOW, ClientStatus::Running);
        let replacement = fixture.add(0, 1, ClientStatus::Running);
        fixture.allocs[0] = started(&original, 10, 0.4);
        fixture.allocs[1] = started(&replacement, 20, 0.9);
        fixture.set_node_status(2, NodeStatus::Initializing);
        let result = fixture.compute();
        let stopped: Vec<_> = result.stop.iter().map(|stop| (stop.alloc.id, stop.description)).collect();
        let reconnected: Vec<_> = result.reconnect.iter().map(|alloc| alloc.id).collect();
        if original_stays {
            assert_eq!(reconnected, [original.id], "{strategy:?}");
            assert_eq!(stopped, [(replacement.id, stop_reason::ORIGINAL_RECONNECTED)], "{strategy:?}");
        } else {
            assert!(reconnected.is_empty(), "{strategy:?}");
            assert_eq!(stopped, [(original.id, stop_reason::REPLACEMENT_KEPT)], "{strategy:?}");
        }
        assert!(result.place.is_empty(), "{strategy:?}: the slot is held either way");
    }
    // Equal scores keep the original; a replacement that never started loses the longest-running test.
    for strategy in [ReconcileStrategy::BestScore, ReconcileStrategy::LongestRunning] {
        let mut fixture = tolerant_fixture();
        let mut job = Job::clone(&fixture.job);
        job.task_groups[0].reconcile = strategy;
        fixture.job = Arc::new(job);
        let original = marked_unknown(&mut fixture, 0, 2, NOW, ClientStatus::Running);
        fixture.allocs[0] = started(&original, 10, 0.5);
        let replacement = fixture.add(0, 1, ClientStatus::Running);
        let mut same_score = Allocation::clone(&replacement);
        same_score.score = 0.5;
        fixture.allocs[1] = Arc::new(same_score);
        fixture.set_node_status(2, NodeStatus::Initializing);
        let result = fixture.compute();
        assert_eq!(result.reconnect.iter().map(|alloc| alloc.id).collect::<Vec<_>>(), [original.id], "{strategy:?}");
    }
}

#[test]
fn a_replacement_of_a_newer_job_version_wins_over_the_reconnecting_original() {
    let mut fixture = tolerant_fixture();
    let original = marked_unknown(&mut fixture, 0, 2, NOW, ClientStatus::Running);
    let mut newer_job = Job::clone(&fixture.job);
    newer_job.version = 1;
    newer_job.job_modify_index = 20;
    fixture.job = Arc::new(newer_job);
    let replacement = fixture.add(0, 1, ClientStatus::Running);
    let result = fixture.compute();
    assert!(result.reconnect.is_empty());
    assert_eq!(result.stop.iter().map(|stop| stop.alloc.id).collect::<Vec<_>>(), [original.id]);
    assert!(result.place.is_empty(), "the replacement holds the slot");
    assert_ne!(replacement.id, original.id);
}

#[test]
fn a_failed_replacement_of_an_unknown_allocation_carries_the_slot_on_its_own() {
    for node_status in [NodeStatus::Disconnected, NodeStatus::Initializing] {
        let mut fixture = tolerant_fixture();
        let original = marked_unknown(&mut fixture, 0, 2, NOW, ClientStatus::Unknown);
        let failed = fixture.add(0, 1, ClientStatus::Failed);
        let mut replaced = Allocation::clone(&original);
        replaced.next_allocation = Some(failed.id);
        fixture.allocs[0] = Arc::new(replaced);
        let mut linked = Allocation::clone(&failed);
        linked.previous_allocation = Some(original.id);
        linked.client_status_time = Timestamp(NOW.0 - 3_600_000_000_000);
        fixture.allocs[1] = Arc::new(linked);
        fixture.set_node_status(2, node_status);
        let result = fixture.compute();
        assert_eq!(placed_indexes(&result), [0], "{node_status:?}: one replacement");
        let request = &result.place[0];
        assert_eq!(request.previous.as_ref().map(|alloc| alloc.id), Some(failed.id), "{node_status:?}");
        assert!(request.reschedule, "{node_status:?}: a reschedule of the failed replacement");
    }
}

#[test]
fn an_unknown_allocation_is_lost_once_its_window_runs_out_wherever_its_node_is() {
    for node_status in [NodeStatus::Disconnected, NodeStatus::Initializing, NodeStatus::Ready] {
        let mut fixture = tolerant_fixture();
        let marked_at = Timestamp(NOW.0 - WINDOW.as_nanos() as u64);
        let unknown = marked_unknown(&mut fixture, 0, 2, marked_at, ClientStatus::Unknown);
        fixture.set_node_status(2, node_status);
        let result = fixture.compute();
        assert_eq!(result.stop.len(), 1, "{node_status:?}");
        assert_eq!(result.stop[0].alloc.id, unknown.id);
        assert_eq!(result.stop[0].client_status, Some(ClientStatus::Lost));
        assert_eq!(placed_indexes(&result), [0], "{node_status:?}");
    }
}

#[test]
fn without_replace_on_disconnect_an_unknown_allocation_keeps_its_slot_until_it_returns_or_runs_out() {
    let not_replaced = |fixture: &mut Fixture| {
        let mut job = Job::clone(&fixture.job);
        job.task_groups[0].replace_on_disconnect = false;
        fixture.job = Arc::new(job);
    };
    // Disconnecting: marked unknown, nothing placed, expiry eval due.
    let mut fixture = tolerant_fixture();
    not_replaced(&mut fixture);
    let alloc = fixture.add(0, 2, ClientStatus::Running);
    fixture.set_node_status(2, NodeStatus::Disconnected);
    let result = fixture.compute();
    assert_eq!(result.disconnecting.iter().map(|alloc| alloc.id).collect::<Vec<_>>(), [alloc.id]);
    assert!(result.place.is_empty() && result.stop.is_empty());
    assert_eq!(result.follow_up_at, Some(NOW.plus(WINDOW)));

    // Unknown while its node is away, or back but not yet reported: still nothing placed.
    for node_status in [NodeStatus::Disconnected, NodeStatus::Initializing, NodeStatus::Ready] {
        let mut fixture = tolerant_fixture();
        not_replaced(&mut fixture);
        marked_unknown(&mut fixture, 0, 2, NOW, ClientStatus::Unknown);
        fixture.set_node_status(2, node_status);
        let result = fixture.compute();
        assert!(result.place.is_empty() && result.stop.is_empty(), "{node_status:?}");
    }

    // Reported running again: reconnected, and there is nothing to stop.
    let mut fixture = tolerant_fixture();
    not_replaced(&mut fixture);
    let original = marked_unknown(&mut fixture, 0, 2, NOW, ClientStatus::Running);
    fixture.set_node_status(2, NodeStatus::Initializing);
    let result = fixture.compute();
    assert_eq!(result.reconnect.iter().map(|alloc| alloc.id).collect::<Vec<_>>(), [original.id]);
    assert!(result.place.is_empty() && result.stop.is_empty());

    // Its window ran out: lost and replaced, as with replacement on.
    let mut fixture = tolerant_fixture();
    not_replaced(&mut fixture);
    let unknown =
        marked_unknown(&mut fixture, 0, 2, Timestamp(NOW.0 - WINDOW.as_nanos() as u64), ClientStatus::Unknown);
    fixture.set_node_status(2, NodeStatus::Disconnected);
    let result = fixture.compute();
    assert_eq!(
        result.stop.iter().map(|stop| (stop.alloc.id, stop.client_status)).collect::<Vec<_>>(),
        [(unknown.id, Some(ClientStatus::Lost))]
    );
    assert_eq!(placed_indexes(&result), [0]);
    assert_eq!(result.place[0].previous.as_ref().map(|alloc| alloc.id), Some(unknown.id));
}

#[test]
fn a_pending_allocation_on_a_disconnected_node_is_lost_since_it_never_started() {
    let mut fixture = tolerant_fixture();
    fixture.add(0, 2, ClientStatus::Pending);
    fixture.set_node_status(2, NodeStatus::Disconnected);
    let result = fixture.compute();
    assert_eq!(result.stop.len(), 1);
    assert_eq!(result.stop[0].client_status, Some(ClientStatus::Lost));
    assert!(result.disconnecting.is_empty());
}

#[test]
fn a_stopped_job_stops_everything() {
    let mut fixture = Fixture::new(JobType::Service, 2);
    fixture.add(0, 1, ClientStatus::Running);
    fixture.add(1, 1, ClientStatus::Pending);
    fixture.job = Arc::new(Job { stop: true, ..Job::clone(&fixture.job) });
    let result = fixture.compute();
    assert_eq!(result.stop.len(), 2);
    assert!(result.place.is_empty());
}

#[test]
fn complete_batch_allocations_keep_their_slot_and_service_ones_are_replaced() {
    let mut batch = Fixture::new(JobType::Batch, 2);
    batch.add(0, 1, ClientStatus::Complete);
    batch.add(1, 1, ClientStatus::Running);
    assert!(batch.compute().place.is_empty(), "batch work that finished is done");

    let mut service = Fixture::new(JobType::Service, 2);
    service.add(0, 1, ClientStatus::Complete);
    service.add(1, 1, ClientStatus::Running);
    assert_eq!(placed_indexes(&service.compute()), [0], "a service that exited is run again");
}

#[test]
fn failed_allocations_reschedule_after_their_delay() {
    let mut fixture = Fixture::new(JobType::Service, 1);
    let failed = fixture.add(0, 1, ClientStatus::Failed);
    // Service default: 30 s exponential. Failed just now: later.
    let result = fixture.compute();
    assert!(result.place.is_empty());
    assert_eq!(result.delayed_reschedules.len(), 1);
    assert_eq!(result.delayed_reschedules[0].1, NOW.plus(Duration::from_secs(30)));

    // Failed 31 s ago: now, replacing it and penalizing its node.
    let mut earlier = Allocation::clone(&failed);
    earlier.client_status_time = Timestamp(NOW.0 - 31_000_000_000);
    fixture.allocs = vec![Arc::new(earlier)];
    let result = fixture.compute();
    assert_eq!(placed_indexes(&result), [0]);
    assert!(result.place[0].reschedule);
}

#[test]
fn the_delay_counts_from_the_failure_and_the_follow_up_eval_always_reschedules() {
    let mut fixture = Fixture::new(JobType::Service, 1);
    let failed = fixture.add(0, 1, ClientStatus::Failed);
    // A plan recorded the follow-up later; that moved the modify time, not the failure time.
    let mut marked = Allocation::clone(&failed);
    marked.client_status_time = Timestamp(NOW.0 - 31_000_000_000);
    marked.modify_time = NOW;
    marked.follow_up_eval_id = Some(EvalId::from_u128(99));
    fixture.allocs = vec![Arc::new(marked.clone())];
    assert_eq!(placed_indexes(&fixture.compute()), [0], "due 1 s ago");

    // Not yet due, but this is its follow-up eval: rescheduled now.
    marked.client_status_time = NOW;
    fixture.allocs = vec![Arc::new(marked)];
    let result = fixture.compute();
    assert!(result.place.is_empty() && result.delayed_reschedules.is_empty(), "another eval waits for it");
    let result = fixture.compute_for(EvalId::from_u128(99));
    assert_eq!(placed_indexes(&result), [0], "its follow-up eval");
}

#[test]
fn a_replaced_allocation_does_not_outlive_its_replacements_reschedule_policy() {
    let mut fixture = tolerant_fixture();
    let mut job = Job::clone(&fixture.job);
    job.task_groups[0].reschedule_policy = Some(ReschedulePolicy {
        attempts: 1,
        interval: Duration::from_secs(3600),
        delay: Duration::from_secs(5),
        delay_function: DelayFunction::Constant,
        max_delay: Duration::ZERO,
        unlimited: false,
    });
    fixture.job = Arc::new(job);
    let original = marked_unknown(&mut fixture, 0, 2, NOW, ClientStatus::Unknown);
    fixture.set_node_status(2, NodeStatus::Disconnected);
    // Its replacement failed and has used its one reschedule of the hour.
    let failed = fixture.add(0, 1, ClientStatus::Failed);
    let mut replaced = Allocation::clone(&original);
    replaced.next_allocation = Some(failed.id);
    fixture.allocs[0] = Arc::new(replaced);
    let mut exhausted = Allocation::clone(&failed);
    exhausted.previous_allocation = Some(original.id);
    exhausted.client_status_time = Timestamp(NOW.0 - 60_000_000_000);
    exhausted.reschedule_events.push(crate::structs::RescheduleEvent {
        time: Timestamp(NOW.0 - 600_000_000_000),
        prev_alloc_id: AllocId::from_u128(1),
        prev_node_id: NodeId::from_u128(3),
        delay_nanos: 0,
    });
    fixture.allocs[1] = Arc::new(exhausted);
    let result = fixture.compute();
    assert!(result.place.is_empty(), "the unknown original asks for nothing on its chain's behalf: {:?}", result.place);
}

#[test]
fn of_two_failures_in_a_slot_the_newest_chain_goes_on() {
    let mut fixture = Fixture::new(JobType::Service, 1);
    let older = fixture.add(0, 1, ClientStatus::Failed);
    let newer = fixture.add(0, 2, ClientStatus::Failed);
    let long_ago = Timestamp(NOW.0 - 3_600_000_000_000);
    fixture.allocs = [older, newer.clone()]
        .into_iter()
        .map(|alloc| {
            let mut due = Allocation::clone(&alloc);
            due.client_status_time = long_ago;
            Arc::new(due)
        })
        .collect();
    let result = fixture.compute();
    assert_eq!(placed_indexes(&result), [0], "one replacement for the slot");
    assert_eq!(result.place[0].previous.as_ref().map(|alloc| alloc.id), Some(newer.id));
}

#[test]
fn reschedule_attempts_run_out() {
    let policy = ReschedulePolicy {
        attempts: 2,
        interval: Duration::from_secs(3600),
        delay: Duration::from_secs(5),
        delay_function: DelayFunction::Constant,
        max_delay: Duration::ZERO,
        unlimited: false,
    };
    let job = Job::new_simple("web", JobType::Batch, 1, Resources::new(1, 1, 0));
    let mut alloc = Allocation::new_placement(&Arc::new(job), "group", 0, NodeId::from_u128(1), EvalId::from_u128(1));
    alloc.client_status = ClientStatus::Failed;
    alloc.client_status_time = Timestamp(NOW.0 - 10_000_000_000);
    let event = |ago_secs: u64| crate::structs::RescheduleEvent {
        time: Timestamp(NOW.0 - ago_secs * 1_000_000_000),
        prev_alloc_id: AllocId::from_u128(1),
        prev_node_id: NodeId::from_u128(1),
        delay_nanos: 0,
    };
    alloc.reschedule_events = vec![event(100)];
    assert_eq!(reschedule_decision(Some(&policy), &alloc, NOW), Reschedule::Now);
    alloc.reschedule_events.push(event(50));
    assert_eq!(reschedule_decision(Some(&policy), &alloc, NOW), Reschedule::Never, "two attempts in the hour");
    alloc.reschedule_events = vec![event(7200), event(5000)];
    assert_eq!(reschedule_decision(Some(&policy), &alloc, NOW), Reschedule::Now, "old attempts fall out of the window");
    assert_eq!(reschedule_decision(None, &alloc, NOW), Reschedule::Never);
}

#[test]
fn reschedule_delays_grow_by_their_function_up_to_the_cap() {
    let mut policy = ReschedulePolicy {
        attempts: 0,
        interval: Duration::ZERO,
        delay: Duration::from_secs(5),
        delay_function: DelayFunction::Exponential,
        max_delay: Duration::from_secs(60),
        unlimited: true,
    };
    let job = Arc::new(Job::new_simple("web", JobType::Service, 1, Resources::new(1, 1, 0)));
    let mut alloc = Allocation::new_placement(&job, "group", 0, NodeId::from_u128(1), EvalId::from_u128(1));
    let mut delays = Vec::new();
    for _ in 0..6 {
        delays.push(reschedule_delay(&policy, &alloc).as_secs());
        alloc.reschedule_events.push(crate::structs::RescheduleEvent {
            time: NOW,
            prev_alloc_id: AllocId::from_u128(1),
            prev_node_id: NodeId::from_u128(1),
            delay_nanos: 0,
        });
    }
    assert_eq!(delays, [5, 10, 20, 40, 60, 60]);
    policy.delay_function = DelayFunction::Fibonacci;
    alloc.reschedule_events.truncate(5);
    let fib: Vec<u64> = (0..6)
        .map(|n| {
            let mut probe = alloc.clone();
            probe.reschedule_events.truncate(n);
            reschedule_delay(&policy, &probe).as_secs()
        })
        .collect();
    assert_eq!(fib, [5, 5, 10, 15, 25, 40]);
}

#[test]
fn a_new_version_updates_in_place_or_destructively() {
    let mut fixture = Fixture::new(JobType::Service, 2);
    fixture.add(0, 1, ClientStatus::Running);
    fixture.add(1, 1, ClientStatus::Running);
    let mut newer = Job::clone(&fixture.job);
    newer.job_modify_index = 20;
    newer.priority = 70;
    fixture.job = Arc::new(newer.clone());
    let result = fixture.compute();
    assert_eq!(result.inplace.len(), 2, "only the priority changed");
    assert!(result.stop.is_empty() && result.place.is_empty());

    newer.task_groups[0].tasks[0].resources.cpu = 200;
    fixture.job = Arc::new(newer);
    let result = fixture.compute();
    assert!(result.inplace.is_empty());
    assert_eq!(stopped_indexes(&result).len(), 2);
    assert_eq!(placed_indexes(&result), [0, 1]);
}

#[test]
fn job_or_group_metadata_reaches_the_tasks_so_a_change_replaces_them() {
    for level in ["job", "group"] {
        let mut fixture = Fixture::new(JobType::Service, 1);
        fixture.add(0, 1, ClientStatus::Running);
        let mut newer = Job::clone(&fixture.job);
        newer.job_modify_index = 20;
        let meta = match level {
            "job" => &mut newer.meta,
            _ => &mut newer.task_groups[0].meta,
        };
        meta.insert("release".into(), "2".into());
        fixture.job = Arc::new(newer);
        let result = fixture.compute();
        assert!(result.inplace.is_empty(), "{level} metadata is NOMAD_META_* in the tasks' environment");
        assert_eq!((stopped_indexes(&result).len(), placed_indexes(&result)), (1, vec![0]), "{level}");
    }
}

#[test]
fn destructive_updates_respect_max_parallel() {
    let mut fixture = Fixture::new(JobType::Service, 4);
    for index in 0..4 {
        fixture.add(index, 1, ClientStatus::Running);
    }
    let mut newer = Job::clone(&fixture.job);
    newer.job_modify_index = 20;
    newer.task_groups[0].tasks[0].driver = "docker".into();
    newer.task_groups[0].update = Some(UpdateStrategy::rolling(1));
    fixture.job = Arc::new(newer);
    let result = fixture.compute();
    assert_eq!(result.stop.len(), 1);
    assert_eq!(result.place.len(), 1);
    assert_eq!(result.follow_up_at, None, "the next batch comes with the new allocation's health, not a timer");
    let deployment = result.deployment.expect("a deployment rolls the new version out");
    assert_eq!(deployment.task_groups["group"].desired_total, 4);
    assert_eq!(result.deployment_id, Some(deployment.id));
}

#[test]
fn duplicates_of_a_slot_keep_the_oldest() {
    let mut fixture = Fixture::new(JobType::Service, 1);
    let original = fixture.add(0, 1, ClientStatus::Running);
    let duplicate = fixture.add(0, 2, ClientStatus::Running);
    let result = fixture.compute();
    assert_eq!(result.stop.iter().map(|stop| stop.alloc.id).collect::<Vec<_>>(), vec![duplicate.id]);
    assert!(result.place.is_empty());
    assert_ne!(original.id, duplicate.id);
}

#[test]
fn stopped_allocations_are_ignored() {
    let mut fixture = Fixture::new(JobType::Service, 1);
    let alloc = fixture.add(0, 1, ClientStatus::Running);
    let mut stopped = Allocation::clone(&alloc);
    stopped.desired_status = DesiredStatus::Stop;
    fixture.allocs = vec![Arc::new(stopped)];
    assert_eq!(placed_indexes(&fixture.compute()), [0]);
}
