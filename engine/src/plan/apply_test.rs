use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use super::*;
use crate::clock::ManualClock;
use crate::eval::broker::BrokerConfig;
use crate::state::{Applied, ApplyHook, StateStore};
use crate::structs::{DesiredStatus, EvalId, Evaluation, Job, JobType, Node, NodeStatus, TriggerReason};

const NODE: u128 = 1;

struct Fixture {
    store: Arc<StateStore>,
    job: Arc<Job>,
}

/// One node of 1000 MHz with 600 MHz in use by one allocation.
fn fixture() -> (Fixture, Allocation) {
    let store = Arc::new(StateStore::new());
    store
        .apply(Command::UpsertNode {
            node: Node::new_ready(NodeId::from_u128(NODE), "dc1", "", Resources::new(1000, 1000, 1000)),
            evals: vec![],
        })
        .expect("node");
    let spec = Job::new_simple("web", JobType::Service, 5, Resources::new(100, 10, 0));
    store.apply(Command::RegisterJob { job: spec.clone(), eval: None }).expect("job");
    let job = store.snapshot().job(&spec.key()).expect("stored").clone();
    let existing = alloc_of(&job, 0, 600);
    store
        .apply(Command::ApplyPlanResults {
            deployment: None,
            deployment_updates: Vec::new(),
            eval_id: EvalId::from_u128(1),
            allocs: vec![existing.clone()],
            evals: vec![],
            time: Timestamp(1),
        })
        .expect("existing");
    (Fixture { store, job }, existing)
}

fn alloc_of(job: &Arc<Job>, index: u32, cpu: u64) -> Allocation {
    let mut alloc = Allocation::new_placement(job, "group", index, NodeId::from_u128(NODE), EvalId::from_u128(1));
    alloc.resources = Resources::new(cpu, 10, 0);
    alloc
}

fn plan_placing(allocs: Vec<Allocation>) -> Plan {
    let mut plan = Plan::default();
    plan.node_allocation.insert(NodeId::from_u128(NODE), allocs);
    plan
}

#[test]
fn placements_that_fit_are_accepted_and_others_refused_per_node() {
    let (f, existing) = fixture();
    let snapshot = f.store.snapshot();
    let (result, refused) = evaluate_plan(&plan_placing(vec![alloc_of(&f.job, 1, 400)]), &snapshot, &HashMap::new());
    assert!(refused.is_empty());
    assert_eq!(result.node_allocation.len(), 1);

    let mut too_much = plan_placing(vec![alloc_of(&f.job, 1, 401)]);
    let mut stop = existing.clone();
    stop.desired_status = DesiredStatus::Stop;
    let (result, refused) = evaluate_plan(&too_much, &snapshot, &HashMap::new());
    assert_eq!(refused, vec![NodeId::from_u128(NODE)]);
    assert!(result.node_allocation.is_empty());

    // Stopping the existing allocation in the same plan makes room.
    too_much.node_update.insert(NodeId::from_u128(NODE), vec![stop]);
    let (_, refused) = evaluate_plan(&too_much, &snapshot, &HashMap::new());
    assert!(refused.is_empty(), "a stop in the plan frees its resources");
}

#[test]
fn the_plan_being_committed_counts_against_the_next() {
    let (f, _) = fixture();
    let snapshot = f.store.snapshot();
    let in_flight = HashMap::from([(NodeId::from_u128(NODE), vec![alloc_of(&f.job, 1, 300)])]);
    let (_, refused) = evaluate_plan(&plan_placing(vec![alloc_of(&f.job, 2, 200)]), &snapshot, &in_flight);
    assert_eq!(refused.len(), 1, "600 + 300 in flight + 200 > 1000");
    let (_, refused) = evaluate_plan(&plan_placing(vec![alloc_of(&f.job, 2, 100)]), &snapshot, &in_flight);
    assert!(refused.is_empty());
}

#[test]
fn new_placements_need_a_ready_node_but_updates_do_not() {
    let (f, existing) = fixture();
    f.store
        .apply(Command::UpdateNodeStatus {
            node_id: NodeId::from_u128(NODE),
            status: NodeStatus::Disconnected,
            evals: vec![],
            time: Timestamp::ZERO,
        })
        .expect("disconnect");
    let snapshot = f.store.snapshot();
    let (_, refused) = evaluate_plan(&plan_placing(vec![alloc_of(&f.job, 1, 10)]), &snapshot, &HashMap::new());
    assert_eq!(refused.len(), 1, "no new work on a disconnected node");
    let mut unknown = existing;
    unknown.record_client_status(crate::structs::ClientStatus::Unknown, Timestamp(2));
    let (_, refused) = evaluate_plan(&plan_placing(vec![unknown]), &snapshot, &HashMap::new());
    assert!(refused.is_empty(), "marking an existing allocation unknown is an update");
    let (_, refused) =
        evaluate_plan(&plan_placing(vec![alloc_of(&f.job, 1, 10)]), &Snapshot::default(), &HashMap::new());
    assert_eq!(refused.len(), 1, "unknown node");
}

fn with_port(mut alloc: Allocation, port: u16) -> Allocation {
    alloc.ports = vec![crate::structs::AllocatedPort { label: "p".into(), value: port, to: 0, host_ip: "".into() }];
    alloc
}

#[test]
fn a_port_is_never_given_twice_on_a_node_across_plans() {
    let (f, _) = fixture();
    let holder = with_port(alloc_of(&f.job, 1, 10), 8080);
    let write = Command::ApplyPlanResults {
        deployment: None,
        deployment_updates: Vec::new(),
        eval_id: EvalId::from_u128(2),
        allocs: vec![holder.clone()],
        evals: vec![],
        time: Timestamp(2),
    };
    f.store.apply(write).expect("the holder");
    let snapshot = f.store.snapshot();
    let check = |plan: &Plan, overlay: &HashMap<NodeId, Vec<Allocation>>| evaluate_plan(plan, &snapshot, overlay).1;
    let none = HashMap::new();
    assert_eq!(
        check(&plan_placing(vec![with_port(alloc_of(&f.job, 2, 10), 8080)]), &none).len(),
        1,
        "held in the state"
    );
    assert!(check(&plan_placing(vec![with_port(alloc_of(&f.job, 2, 10), 8081)]), &none).is_empty());
    let twice = plan_placing(vec![with_port(alloc_of(&f.job, 2, 10), 9000), with_port(alloc_of(&f.job, 3, 10), 9000)]);
    assert_eq!(check(&twice, &none).len(), 1, "twice in one plan");
    let in_flight = HashMap::from([(NodeId::from_u128(NODE), vec![with_port(alloc_of(&f.job, 4, 10), 9001)])]);
    assert_eq!(check(&plan_placing(vec![with_port(alloc_of(&f.job, 2, 10), 9001)]), &in_flight).len(), 1, "in flight");
    // Stopping (or evicting) the holder in the same plan frees its port; an
    // update of the holder keeps it.
    let mut freed = plan_placing(vec![with_port(alloc_of(&f.job, 2, 10), 8080)]);
    let mut stopped = holder.clone();
    stopped.desired_status = DesiredStatus::Evict;
    freed.node_preemptions.insert(NodeId::from_u128(NODE), vec![stopped]);
    assert!(check(&freed, &none).is_empty(), "an eviction frees the port");
    assert!(check(&plan_placing(vec![holder]), &none).is_empty(), "an update of the holder");
    let mut reserved_node = f.store.snapshot().node(NodeId::from_u128(NODE)).expect("node").as_ref().clone();
    reserved_node.network.reserved_ports = crate::structs::PortSet::of([7000]);
    f.store.apply(Command::UpsertNode { node: reserved_node, evals: vec![] }).expect("re-registered");
    let snapshot = f.store.snapshot();
    let (_, refused) = evaluate_plan(&plan_placing(vec![with_port(alloc_of(&f.job, 2, 10), 7000)]), &snapshot, &none);
    assert_eq!(refused.len(), 1, "a reserved port");
}

#[test]
fn evictions_make_room_and_their_jobs_get_evals() {
    let (f, existing) = fixture();
    let snapshot = f.store.snapshot();
    let mut plan = plan_placing(vec![alloc_of(&f.job, 1, 900)]);
    let (_, refused) = evaluate_plan(&plan, &snapshot, &HashMap::new());
    assert_eq!(refused.len(), 1, "600 + 900 > 1000");
    let mut evicted = existing.clone();
    evicted.desired_status = DesiredStatus::Evict;
    plan.node_preemptions.insert(NodeId::from_u128(NODE), vec![evicted]);
    let (result, refused) = evaluate_plan(&plan, &snapshot, &HashMap::new());
    assert!(refused.is_empty(), "the eviction frees 600");
    assert_eq!(result.node_preemptions.len(), 1);
    let Command::ApplyPlanResults { allocs, evals, .. } =
        Command::apply_plan_result(EvalId::from_u128(5), &result, Timestamp(3))
    else {
        panic!("a plan result")
    };
    assert_eq!(allocs[0].id, existing.id, "evictions are written before placements");
    assert_eq!(evals.len(), 1);
    assert_eq!((evals[0].job_id.clone(), evals[0].triggered_by), (f.job.id.clone(), TriggerReason::Preemption));
}

#[test]
fn the_tracker_marks_repeat_offenders_at_a_bounded_rate() {
    let config = PlanApplierConfig {
        rejection_threshold: 2,
        rejection_window: Duration::from_secs(60),
        max_marked_per_window: 1,
    };
    let mut tracker = RejectionTracker { config, refusals: HashMap::new(), marked: VecDeque::new() };
    let (a, b) = (NodeId::from_u128(1), NodeId::from_u128(2));
    assert!(tracker.record(&[a, b], Timestamp(1)).is_empty());
    assert!(tracker.record(&[a, b], Timestamp(2)).is_empty());
    assert_eq!(tracker.record(&[a, b], Timestamp(3)), vec![a], "only one node per window");
    let later = Timestamp(3 + 61_000_000_000);
    assert!(tracker.record(&[b], later).is_empty(), "b's old refusals left the window");
}

/// Counts the commands the store applied, as its apply hook.
#[derive(Debug)]
struct CountingHook(Arc<AtomicUsize>);

impl ApplyHook for CountingHook {
    fn after_apply(&self, _applied: &Applied) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn running_applier(store: &Arc<StateStore>) -> (Arc<PlanQueue>, Arc<EvalBroker>, PlanApplierHandle, Arc<AtomicUsize>) {
    let clock = ManualClock::new(Timestamp(10));
    let broker = Arc::new(EvalBroker::new(BrokerConfig::default(), clock.clone()));
    let queue = Arc::new(PlanQueue::new());
    let seen = Arc::new(AtomicUsize::new(0));
    store.set_hook(Some(Box::new(CountingHook(seen.clone()))));
    let writer = Writer::direct(store.clone());
    let handle = PlanApplier::start(PlanApplierConfig::default(), writer, queue.clone(), broker.clone(), clock);
    (queue, broker, handle, seen)
}

/// Holds a new eval of `job`, as a worker does.
fn hold_eval(broker: &EvalBroker, job: &Arc<Job>) -> crate::eval::broker::Dequeued {
    broker.enqueue(Arc::new(Evaluation::for_job(job, TriggerReason::JobRegister, Timestamp(0))));
    broker.try_dequeue(&[JobType::Service]).expect("running").expect("held")
}

/// The held eval's plan placing `alloc`.
fn plan_of(held: &crate::eval::broker::Dequeued, alloc: Allocation) -> Plan {
    let mut plan = plan_placing(vec![alloc]);
    plan.eval_id = held.eval.id;
    plan.eval_token = held.token.0;
    plan
}

#[test]
fn the_applier_commits_what_fits_and_answers_with_the_index() {
    let (f, _) = fixture();
    let (queue, broker, handle, seen) = running_applier(&f.store);
    let held = hold_eval(&broker, &f.job);
    let submit = |alloc: Allocation| queue.enqueue(plan_of(&held, alloc));
    // Both are queued before the first is written: the second is checked against the first.
    let first = submit(alloc_of(&f.job, 1, 300));
    let second = submit(alloc_of(&f.job, 2, 300));
    let first = first.wait().expect("applied");
    let second = second.wait().expect("answered");
    assert_eq!(first.refresh_index, 0);
    assert!(first.alloc_index > 0);
    assert!(second.node_allocation.is_empty(), "600 + 300 + 300 does not fit 1000");
    assert!(second.refresh_index >= first.alloc_index, "re-plan at least against the first plan's state");
    assert_eq!(f.store.snapshot().allocs_by_node(NodeId::from_u128(NODE)).count(), 2);
    assert_eq!(seen.load(Ordering::SeqCst), 1, "the server hook saw the one write");
    assert_eq!(handle.stats().plans_partially_refused, 1);

    // A plan whose eval is no longer held under its token is refused.
    broker.ack(held.eval.id, held.token).expect("ack");
    assert_eq!(submit(alloc_of(&f.job, 3, 10)).wait(), Err(PlanError::StaleToken(held.eval.id)));
    handle.stop();
}

/// A durable log holds a plan until its fsync; the next plan does not wait
/// for it to be written before it is submitted, and the answers keep the
/// plans' order.
#[test]
fn the_committer_submits_a_plan_while_the_one_before_it_is_being_written() {
    let (f, _) = fixture();
    let clock = ManualClock::new(Timestamp(10));
    let broker = Arc::new(EvalBroker::new(BrokerConfig::default(), clock.clone()));
    let queue = Arc::new(PlanQueue::new());
    let log = crate::testing::HeldLog::new(f.store.clone());
    let writer = Writer::through(log.clone(), f.store.clone());
    let handle = PlanApplier::start(PlanApplierConfig::default(), writer, queue.clone(), broker.clone(), clock);
    let held = hold_eval(&broker, &f.job);
    let submit = |alloc: Allocation| queue.enqueue(plan_of(&held, alloc));
    let first = submit(alloc_of(&f.job, 1, 100));
    log.wait_until("the first plan never reached the log", |held| held.len() == 1);
    let second = submit(alloc_of(&f.job, 2, 100));
    log.wait_until("the second plan waited for the first to be written", |held| held.len() == 2);
    assert_eq!(log.write_held(), 2);
    let (first, second) = (first.wait().expect("first"), second.wait().expect("second"));
    assert!(first.alloc_index < second.alloc_index, "answered in the log's order");
    assert_eq!(second.refresh_index, 0, "checked against the first, both fit");
    assert_eq!(f.store.snapshot().allocs_by_node(NodeId::from_u128(NODE)).count(), 3);
    handle.stop();
}
