use super::store_test::{client_reports, job, node, place, register};
use super::*;
use crate::clock::Timestamp;
use crate::events::{Subscription, Topic};
use crate::structs::{AclPolicy, AclRules, Allocation, ClientStatus, Evaluation, Job, Node, NodeStatus, TriggerReason};

/// `(topic, type, key)` of one event.
type Seen = (Topic, &'static str, String);

/// Each batch read so far: its index, and what each of its events was.
fn read(subscription: &mut Subscription) -> Vec<(u64, Vec<Seen>)> {
    let mut batches = Vec::new();
    while let Some(batch) = subscription.try_next().expect("subscribed") {
        let events = batch.events.iter().map(|event| (event.payload.topic(), event.event_type, event.payload.key()));
        batches.push((batch.index, events.collect()));
    }
    batches
}

/// A store with one node, job `web` and one allocation of it placed there.
fn web_placed() -> (StateStore, Node, Job, Allocation) {
    let store = StateStore::new();
    let node = node(1);
    store.apply(Command::UpsertNode { node: node.clone(), evals: vec![] }).expect("node");
    let web = job("web");
    register(&store, &web);
    let alloc = place(&store, &web, node.id, 0);
    (store, node, web, alloc)
}

#[test]
fn a_job_its_eval_and_its_allocations_arrive_in_index_order_with_nomads_types() {
    let store = StateStore::new();
    let mut subscription = store.events().subscribe(0);
    let node = node(1);
    store.apply(Command::UpsertNode { node: node.clone(), evals: vec![] }).expect("node");
    let web = job("web");
    let registered = register(&store, &web);
    let alloc = place(&store, &web, node.id, 0);
    store.apply(client_reports(&alloc, ClientStatus::Running, 6)).expect("running");

    let eval_id = registered.evals[0].id.to_string();
    assert_eq!(
        read(&mut subscription),
        vec![
            (1, vec![(Topic::Node, "NodeRegistration", node.id.to_string())]),
            (2, vec![(Topic::Job, "JobRegistered", "web".to_string()), (Topic::Evaluation, "JobRegistered", eval_id)]),
            (3, vec![(Topic::Allocation, "PlanResult", alloc.id.to_string())]),
            (4, vec![(Topic::Allocation, "AllocationUpdated", alloc.id.to_string())]),
        ]
    );
    let batch = store.events().subscribe(3).try_next().expect("subscribed").expect("kept");
    let allocation = &batch.events[0].payload;
    assert_eq!(allocation.namespace(), Some("default"));
    assert_eq!(allocation.filter_keys(), vec!["web".to_string()], "its job (no deployment)");
}

#[test]
fn what_a_command_names_but_leaves_alone_yields_nothing() {
    let (store, _node, web, alloc) = web_placed();
    let mut subscription = store.events().subscribe(store.latest_index() + 1);

    // Job stability has no event type in Nomad.
    store.apply(Command::SetJobStability { key: web.key(), version: 0, stable: true }).expect("stable");
    // A client report of another node's allocation is refused on its own.
    let mut stranger = client_reports(&alloc, ClientStatus::Running, 6);
    if let Command::UpdateAllocsFromClient { updates, .. } = &mut stranger {
        updates[0].node_id = NodeId::from_u128(99);
    }
    let applied = store.apply(stranger).expect("applied, the update refused");
    assert_eq!(applied.refused_updates.len(), 1);
    // A refused command.
    assert!(store
        .apply(Command::PurgeNode { node_id: NodeId::from_u128(98), evals: vec![], time: Timestamp(7) })
        .is_err());
    // The scheduler configuration has no event type in Nomad.
    store.apply(Command::SetSchedulerConfig { config: Default::default(), cas_index: None }).expect("config");

    assert_eq!(read(&mut subscription), vec![]);
}

#[test]
fn removals_carry_the_object_as_it_was() {
    let (store, node, web, alloc) = web_placed();
    let policy = AclPolicy {
        name: "readers".into(),
        description: String::new(),
        rules_text: String::new(),
        rules: AclRules::default(),
        create_index: 0,
        modify_index: 0,
    };
    store.apply(Command::UpsertAclPolicies { policies: vec![policy] }).expect("policy");
    let mut subscription = store.events().subscribe(store.latest_index() + 1);

    store.apply(Command::DeleteAclPolicies { names: vec!["readers".into()] }).expect("deleted");
    let replace = Evaluation::for_job(&web, TriggerReason::NodeUpdate, Timestamp(8));
    let purged = store.apply(Command::PurgeNode { node_id: node.id, evals: vec![replace], time: Timestamp(8) });
    let replace_id = purged.expect("purged").evals[0].id.to_string();

    let batches = read(&mut subscription);
    assert_eq!(batches[0].1, vec![(Topic::AclPolicy, "ACLPolicyDeleted", "readers".to_string())]);
    assert_eq!(
        batches[1].1,
        vec![
            (Topic::Evaluation, "NodeDeregistration", replace_id),
            (Topic::Allocation, "NodeDeregistration", alloc.id.to_string()),
            (Topic::Node, "NodeDeregistration", node.id.to_string()),
        ],
        "the lost allocation and the node as it was"
    );
    let node_event = store.events().subscribe(batches[1].0).try_next().expect("subscribed").expect("kept");
    let crate::events::Payload::Node(gone) = &node_event.events[2].payload else { panic!("a node event") };
    assert_eq!(gone.status, NodeStatus::Ready, "as it was before the purge");
}

#[test]
fn with_events_off_the_store_keeps_none() {
    let store = StateStore::new();
    store.events().set_capacity(0);
    store.apply(Command::UpsertNode { node: node(1), evals: vec![] }).expect("node");
    assert_eq!(store.events().newest_index(), None);
}
