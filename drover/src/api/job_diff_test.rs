use std::collections::{BTreeMap, BTreeSet};

use serde_json::json;

use super::{annotate, job_diff, DiffAnnotations, DiffType, FieldDiff, JobDiff, ObjectDiff};
use crate::api::jobs::Job;

/// Job `web` as the API answers it: one group `web` of `count`, task
/// `server` with `args`.
fn job(count: u64, args: &[&str]) -> Job {
    serde_json::from_value(json!({
        "ID": "web", "Name": "web", "Type": "service", "Priority": 50, "Datacenters": ["dc1"],
        "Meta": {"team": "a"},
        "TaskGroups": [{"Name": "web", "Count": count,
            "RestartPolicy": {"Attempts": 2, "Interval": 1, "Delay": 1, "Mode": "fail"},
            "Tasks": [{"Name": "server", "Driver": "raw_exec",
                "Config": {"command": "/bin/sleep", "args": args},
                "Resources": {"CPU": 100, "MemoryMB": 64}}]}]
    }))
    .expect("a job")
}

fn field<'a>(fields: &'a Option<Vec<FieldDiff>>, name: &str) -> &'a FieldDiff {
    fields.iter().flatten().find(|field| field.name == name).unwrap_or_else(|| panic!("field {name}: {fields:?}"))
}

fn object<'a>(objects: &'a Option<Vec<ObjectDiff>>, name: &str) -> &'a ObjectDiff {
    objects.iter().flatten().find(|object| object.name == name).unwrap_or_else(|| panic!("object {name}"))
}

fn groups(diff: &JobDiff) -> &[super::TaskGroupDiff] {
    diff.task_groups.as_deref().expect("groups")
}

#[test]
fn a_new_job_is_added_whole() {
    let diff = job_diff(None, Some(&job(1, &["1"]))).expect("a diff");
    assert_eq!((diff.diff_type, diff.id.as_str()), (DiffType::Added, "web"));
    let priority = field(&diff.fields, "Priority");
    assert_eq!((priority.diff_type, priority.old.as_str(), priority.new.as_str()), (DiffType::Added, "", "50"));
    assert_eq!(field(&diff.fields, "Meta[team]").new, "a", "maps flatten as Name[key]");
    assert!(diff.fields.iter().flatten().all(|field| !["ID", "Version", "Status"].contains(&field.name.as_str())));
    let datacenters = object(&diff.objects, "Datacenters");
    assert_eq!(field(&datacenters.fields, "Datacenters").new, "dc1");
    let group = &groups(&diff)[0];
    assert_eq!((group.diff_type, field(&group.fields, "Count").new.as_str()), (DiffType::Added, "1"));
    let task = &group.tasks.as_deref().expect("tasks")[0];
    assert_eq!(task.diff_type, DiffType::Added);
    let config = object(&task.objects, "Config");
    assert_eq!(
        (field(&config.fields, "command").new.as_str(), field(&config.fields, "args[0]").new.as_str()),
        ("/bin/sleep", "1")
    );
}

#[test]
fn an_unchanged_job_lists_its_groups_and_tasks_as_none() {
    let diff = job_diff(Some(&job(1, &["1"])), Some(&job(1, &["1"]))).expect("a diff");
    assert_eq!(diff.diff_type, DiffType::None);
    assert_eq!(diff.fields.as_deref(), Some(&[][..]), "job fields only when changed");
    let group = &groups(&diff)[0];
    assert_eq!(group.diff_type, DiffType::None);
    assert_eq!(field(&group.fields, "Count").diff_type, DiffType::None, "group fields are contextual");
    assert_eq!(group.tasks.as_deref().expect("tasks")[0].diff_type, DiffType::None);
}

#[test]
fn a_changed_count_and_config_are_edits_annotated_by_the_plan() {
    let mut diff = job_diff(Some(&job(1, &["1"])), Some(&job(2, &["2"]))).expect("a diff");
    assert_eq!(diff.diff_type, DiffType::Edited);
    let annotations = DiffAnnotations {
        updates: BTreeMap::from([(
            "web".to_string(),
            BTreeMap::from([("create/destroy update".to_string(), 1), ("create".to_string(), 1), ("ignore".into(), 0)]),
        )]),
        destructive_groups: BTreeSet::from(["web".to_string()]),
    };
    annotate(&mut diff, &annotations);
    let group = &groups(&diff)[0];
    assert_eq!(group.diff_type, DiffType::Edited);
    let count = field(&group.fields, "Count");
    assert_eq!((count.old.as_str(), count.new.as_str()), ("1", "2"));
    assert_eq!(count.annotations, Some(vec!["forces create".to_string()]));
    let updates = group.updates.as_ref().expect("updates");
    assert_eq!(updates.keys().collect::<Vec<_>>(), ["create", "create/destroy update"], "only non-zero counts");
    let task = &group.tasks.as_deref().expect("tasks")[0];
    assert_eq!(task.diff_type, DiffType::Edited);
    assert_eq!(task.annotations, Some(vec!["forces create/destroy update".to_string()]));
    let arg = field(&object(&task.objects, "Config").fields, "args[0]");
    assert_eq!((arg.diff_type, arg.old.as_str(), arg.new.as_str()), (DiffType::Edited, "1", "2"));
}

#[test]
fn a_changed_constraint_is_one_deleted_and_one_added() {
    let mut old = job(1, &[]);
    old.constraints =
        vec![crate::api::jobs::Constraint { l_target: "a".into(), r_target: "1".into(), operand: "=".into() }];
    let mut new = old.clone();
    new.constraints[0].r_target = "2".into();
    let diff = job_diff(Some(&old), Some(&new)).expect("a diff");
    let types: Vec<DiffType> =
        diff.objects.iter().flatten().filter(|o| o.name == "Constraint").map(|o| o.diff_type).collect();
    assert_eq!(types.len(), 2);
    assert!(types.contains(&DiffType::Added) && types.contains(&DiffType::Deleted), "{types:?}");
}
