//! Deleting through the log: what goes, what a stale selection keeps, and
//! indexes that stay what a restore rebuilds.

use super::*;
use crate::gc::fixture::{hours, Fixture, NODE};
use crate::gc::{select, GcThresholds};
use crate::structs::{
    ClientStatus, DeploymentStatus, EvalStatus, JobType, NodeStatus, SchedulerConfiguration, TriggerReason,
};

/// The snapshot as a restore from its encoding rebuilds it: every derived
/// index recomputed from the tables.
fn restored(snapshot: &Snapshot) -> StateDump {
    let mut bytes = Vec::new();
    snapshot.encode(&mut bytes).expect("encodes");
    Snapshot::decode(&mut bytes.as_slice()).expect("decodes").dump()
}

fn collect(fixture: &Fixture, hour: u64) -> Applied {
    let collection = select(&fixture.store.snapshot(), hours(hour), &GcThresholds::default());
    fixture.store.apply(Command::GarbageCollect { collection }).expect("collects")
}

#[test]
fn a_collected_job_leaves_nothing_behind() {
    let fixture = Fixture::new();
    let (job, eval, alloc) = fixture.finished_batch("batch", hours(0));
    fixture.deployment(&job, DeploymentStatus::Successful, hours(0));
    let job_allocs = fixture.store.snapshot().allocs_by_job(&job.key()).count() as u32;
    for alloc in fixture.store.snapshot().allocs_by_job(&job.key()).cloned().collect::<Vec<_>>() {
        fixture.report(&alloc, ClientStatus::Complete, hours(0));
    }
    let (other, _, _) = fixture.finished_batch("stays", hours(9));
    let applied = collect(&fixture, 5);
    assert_eq!(applied.collected.jobs, 1);
    assert_eq!(applied.collected.allocs, job_allocs);
    assert_eq!(applied.collected.deployments, 1);
    assert!(applied.touched_nodes.contains(&NODE), "the node's watchers learn its allocations are gone");
    let node = fixture.store.snapshot().node(NODE).expect("node").clone();
    assert_eq!(node.allocs_removed_index, applied.index, "its allocation watch answers");
    assert!(node.modify_index < applied.index, "the node itself did not change");
    let snapshot = fixture.store.snapshot();
    assert!(
        snapshot.job(&job.key()).is_none() && snapshot.eval(eval.id).is_none() && snapshot.alloc(alloc.id).is_none()
    );
    assert_eq!(snapshot.allocs_by_job(&job.key()).count() + snapshot.evals_by_job(&job.key()).count(), 0);
    assert_eq!(snapshot.job_versions(&job.key()).count() + snapshot.deployments_by_job(&job.key()).count(), 0);
    assert!(snapshot.job(&other.key()).is_some(), "the younger job stays");
    assert_eq!(snapshot.dump(), restored(&snapshot), "every index is what a restore rebuilds");
    assert_eq!(snapshot.table_indexes().jobs, applied.index);
    assert_eq!(snapshot.table_indexes().evals, applied.index);
    assert_eq!(snapshot.table_indexes().allocs, applied.index);
    assert_eq!(snapshot.table_indexes().deployments, applied.index);
}

#[test]
fn a_stale_selection_never_deletes_what_came_back() {
    let fixture = Fixture::new();
    let (job, _, _) = fixture.finished_batch("batch", hours(0));
    let down = Command::UpdateNodeStatus { node_id: NODE, status: NodeStatus::Down, evals: vec![], time: hours(0) };
    fixture.store.apply(down).expect("down");
    let collection = select(&fixture.store.snapshot(), hours(30), &GcThresholds::default());
    assert_eq!((collection.jobs.len(), collection.nodes.len()), (1, 1));
    // Between selection and write: the job is registered again, the node comes back.
    fixture.register("batch", JobType::Batch, hours(30));
    let ready = Command::UpdateNodeStatus { node_id: NODE, status: NodeStatus::Ready, evals: vec![], time: hours(30) };
    fixture.store.apply(ready).expect("ready");
    let applied = fixture.store.apply(Command::GarbageCollect { collection }).expect("applies");
    assert_eq!(applied.collected, Collected::default());
    let snapshot = fixture.store.snapshot();
    assert!(snapshot.job(&job.key()).is_some() && snapshot.node(NODE).is_some());
    assert_eq!(snapshot.table_indexes().jobs, snapshot.job(&job.key()).expect("job").modify_index, "nothing moved");
}

#[test]
fn a_collection_replays_to_the_same_state() {
    let fixture = Fixture::new();
    fixture.finished_batch("batch", hours(0));
    let (web, eval) = fixture.register("web", JobType::Service, hours(0));
    let alloc = fixture.place(&web, eval.id, hours(0));
    fixture.finish(&eval, EvalStatus::Complete, hours(0));
    fixture.report(&alloc, ClientStatus::Complete, hours(0));
    let collection = select(&fixture.store.snapshot(), hours(5), &GcThresholds::default());
    let command = Command::GarbageCollect { collection };
    let decoded = Command::decode(&command.encode()).expect("the log carries it");
    assert_eq!(decoded, command);
    let replica = StateStore::restored(Snapshot::clone(&fixture.store.snapshot()));
    fixture.store.apply(command).expect("leader");
    replica.apply(decoded).expect("replica");
    assert_eq!(fixture.store.snapshot().dump(), replica.snapshot().dump());
    assert_eq!(fixture.store.snapshot().eval(eval.id), None, "the service job's old eval went on its own");
}

#[test]
fn evals_are_deleted_by_hand_only_while_the_broker_is_paused() {
    let fixture = Fixture::new();
    let (_, eval) = fixture.register("web", JobType::Service, hours(0));
    let delete = Command::DeleteEvals { eval_ids: vec![eval.id] };
    assert_eq!(fixture.store.apply(delete.clone()).map(|_| ()), Err(StateError::EvalBrokerNotPaused));
    assert!(fixture.store.snapshot().eval(eval.id).is_some());
    let config = SchedulerConfiguration { pause_eval_broker: true, ..SchedulerConfiguration::default() };
    let paused = fixture.store.apply(Command::SetSchedulerConfig { config, cas_index: None }).expect("paused");
    assert_eq!(paused.pause_eval_broker, Some(true));
    let applied = fixture.store.apply(delete).expect("deleted");
    assert_eq!(applied.deleted_evals.iter().map(|eval| eval.id).collect::<Vec<_>>(), vec![eval.id]);
    let snapshot = fixture.store.snapshot();
    assert!(snapshot.eval(eval.id).is_none());
    assert_eq!(snapshot.dump(), restored(&snapshot));
}

#[test]
fn a_purged_node_is_gone_and_its_allocations_lost() {
    let fixture = Fixture::new();
    let (web, eval) = fixture.register("web", JobType::Service, hours(0));
    let alloc = fixture.place(&web, eval.id, hours(0));
    fixture.report(&alloc, ClientStatus::Running, hours(0));
    let replace = Evaluation::for_job(&web, TriggerReason::NodeUpdate, hours(1));
    let purge = Command::PurgeNode { node_id: NODE, evals: vec![replace.clone()], time: hours(1) };
    let applied = fixture.store.apply(purge.clone()).expect("purged");
    assert_eq!(applied.evals.len(), 1);
    let snapshot = fixture.store.snapshot();
    assert!(snapshot.node(NODE).is_none() && snapshot.schedulable_nodes().is_empty());
    let lost = snapshot.alloc(alloc.id).expect("kept, as lost");
    assert_eq!((lost.client_status, lost.client_description.as_str()), (ClientStatus::Lost, NODE_PURGED));
    assert_eq!(snapshot.node_usage(NODE), crate::structs::Resources::default());
    assert_eq!(snapshot.dump(), restored(&snapshot));
    assert_eq!(fixture.store.apply(purge).map(|_| ()), Err(StateError::UnknownNode(NODE)));
}
