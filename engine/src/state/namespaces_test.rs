//! Namespaces in the store: `default` always there, jobs only in
//! namespaces that exist, no deletion of one still in use.

use super::store_test::{job, register};
use super::*;
use crate::structs::{Namespace, DEFAULT_NAMESPACE};

fn namespace(name: &str) -> Namespace {
    Namespace { name: name.to_string(), description: format!("{name} team"), ..Namespace::default() }
}

#[test]
fn default_exists_unwritten_and_others_once_written() {
    let store = StateStore::new();
    let snapshot = store.snapshot();
    assert!(snapshot.has_namespace(DEFAULT_NAMESPACE));
    assert!(!snapshot.has_namespace("web"));
    assert_eq!(snapshot.namespaces(), vec![Namespace::implicit_default()]);
    let written = store.apply(Command::UpsertNamespaces { namespaces: vec![namespace("web")] }).expect("written");
    let again = store.apply(Command::UpsertNamespaces { namespaces: vec![namespace("web")] }).expect("rewritten");
    let snapshot = store.snapshot();
    let web = snapshot.namespace("web").expect("web");
    assert_eq!((web.create_index, web.modify_index), (written.index, again.index));
    assert_eq!(snapshot.table_indexes().namespaces, again.index);
    let names: Vec<String> = snapshot.namespaces().into_iter().map(|namespace| namespace.name).collect();
    assert_eq!(names, ["default", "web"]);
    let refused = store.apply(Command::UpsertNamespaces { namespaces: vec![namespace("web"), namespace("a/b")] });
    assert!(matches!(refused, Err(StateError::InvalidNamespace(_))), "{refused:?}");
}

#[test]
fn a_job_is_registered_only_in_a_namespace_that_exists() {
    let store = StateStore::new();
    let mut web = job("api");
    web.namespace = Arc::from("web");
    let refused = store.apply(Command::RegisterJob { job: web.clone(), eval: None });
    assert_eq!(refused.expect_err("no such namespace"), StateError::UnknownNamespace("web".to_string()));
    assert_eq!(store.snapshot().jobs().count(), 0);
    store.apply(Command::UpsertNamespaces { namespaces: vec![namespace("web")] }).expect("written");
    register(&store, &web);
    register(&store, &job("api"));
    assert_eq!(store.snapshot().jobs().count(), 2, "one job id in two namespaces is two jobs");
}

#[test]
fn a_namespace_in_use_or_default_is_not_deleted() {
    let store = StateStore::new();
    let write = |names: &[&str]| {
        let namespaces = names.iter().map(|name| namespace(name)).collect();
        store.apply(Command::UpsertNamespaces { namespaces }).expect("written")
    };
    write(&["web", "batch"]);
    let mut api = job("api");
    api.namespace = Arc::from("web");
    register(&store, &api);
    let delete = |names: &[&str]| {
        store.apply(Command::DeleteNamespaces { names: names.iter().map(|name| name.to_string()).collect() })
    };
    assert_eq!(delete(&["default"]).expect_err("default"), StateError::DefaultNamespace);
    assert_eq!(delete(&["nope"]).expect_err("unknown"), StateError::UnknownNamespace("nope".to_string()));
    let in_use = delete(&["batch", "web"]).expect_err("web holds a job");
    assert_eq!(in_use, StateError::NamespaceInUse { name: "web".to_string(), jobs: 1 });
    assert!(store.snapshot().has_namespace("batch"), "a refused command deletes none of its namespaces");
    delete(&["batch"]).expect("empty");
    assert!(!store.snapshot().has_namespace("batch"));
    store.apply(Command::DeregisterJob { job: api.key(), purge: true, eval: None }).expect("purged");
    delete(&["web"]).expect("empty now");
    assert_eq!(store.snapshot().namespaces().len(), 1);
}

#[test]
fn namespaces_survive_a_snapshot_round_trip() {
    let store = StateStore::new();
    let mut described = namespace("web");
    described.meta.insert("owner".to_string(), "team-web".to_string());
    store.apply(Command::UpsertNamespaces { namespaces: vec![described] }).expect("written");
    let snapshot = store.snapshot();
    let mut bytes = Vec::new();
    snapshot.encode(&mut bytes).expect("encodes");
    let decoded = Snapshot::decode(&mut bytes.as_slice()).expect("decodes");
    assert_eq!(decoded.dump(), snapshot.dump());
    assert_eq!(decoded.namespace("web").expect("web").meta["owner"], "team-web");
}
