//! Job diffs (Nomad's `JobDiff`, `nomad/structs/diff.go`): what changed
//! between two versions of a job, as `job plan` and `job history -p` show
//! it, computed over the jobs as the API answers them (`super::jobs::Job`
//! serialized to JSON), so every field a client can read is compared.
//!
//! The shape, as Nomad's:
//! 1. A job diff lists the job's changed primitive fields by name
//!    (`Priority`, maps as `Meta[key]`), its changed blocks as objects
//!    (`Constraint`, `Datacenters`), and every task group, matched by name.
//!    Fields the servers set (`Version`, the indexes, `Status`, ...) and
//!    the job's `Update` are left out.
//! 2. A task group diff and a task diff are contextual: unchanged fields and
//!    blocks are listed too, typed `None`, which the CLI shows with
//!    `-verbose` only. Tasks are matched by name.
//! 3. A block is an object named as Nomad names it (`RestartPolicy`,
//!    `Network`, `Service`, `Check`, `Static Port`); a list of plain values
//!    is an object of one field per value (`Datacenters`, `Tags`); a
//!    driver's `Config` is one object of flattened fields (`args[0]`,
//!    `labels[0][team]`). Lists of blocks are matched by `Name` or `Label`
//!    when their items have one, else as sets.
//! 4. Every value is text: numbers and bools printed, durations in
//!    nanoseconds. `Type` is `Added`, `Deleted`, `Edited` or `None`.
//!
//! Annotations (the task group's `Updates` counts, `forces create` on a
//! count raised, `forces create/destroy update` on a task) come from a plan
//! and are laid on by [`annotate`].

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// What happened to a job, group, task, block or field.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum DiffType {
    /// Unchanged.
    #[default]
    None,
    /// Only in the new version.
    Added,
    /// Only in the old version.
    Deleted,
    /// In both, changed.
    Edited,
}

/// A primitive field (`FieldDiff`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct FieldDiff {
    /// What happened to it.
    #[serde(rename = "Type")]
    pub diff_type: DiffType,
    /// Its name (`Count`, `Meta[team]`, `args[0]`).
    pub name: String,
    /// The old value (`""` when added).
    pub old: String,
    /// The new value (`""` when deleted).
    pub new: String,
    /// What the change forces (`forces create`, `forces destroy`).
    pub annotations: Option<Vec<String>>,
}

/// A block (`ObjectDiff`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ObjectDiff {
    /// What happened to it.
    #[serde(rename = "Type")]
    pub diff_type: DiffType,
    /// Nomad's name for the block.
    pub name: String,
    /// Its primitive fields.
    pub fields: Option<Vec<FieldDiff>>,
    /// Its blocks.
    pub objects: Option<Vec<ObjectDiff>>,
}

/// A task (`TaskDiff`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct TaskDiff {
    /// What happened to it.
    #[serde(rename = "Type")]
    pub diff_type: DiffType,
    /// The task's name.
    pub name: String,
    /// Its primitive fields.
    pub fields: Option<Vec<FieldDiff>>,
    /// Its blocks.
    pub objects: Option<Vec<ObjectDiff>>,
    /// What the change forces (`forces create/destroy update`, ...).
    pub annotations: Option<Vec<String>>,
}

/// A task group (`TaskGroupDiff`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct TaskGroupDiff {
    /// What happened to it.
    #[serde(rename = "Type")]
    pub diff_type: DiffType,
    /// The group's name.
    pub name: String,
    /// Its primitive fields.
    pub fields: Option<Vec<FieldDiff>>,
    /// Its blocks.
    pub objects: Option<Vec<ObjectDiff>>,
    /// Its tasks.
    pub tasks: Option<Vec<TaskDiff>>,
    /// A plan's counts for the group (`create`, `destroy`, `ignore`,
    /// `in-place update`, `create/destroy update`, `canary`, `migrate`),
    /// the non-zero ones only; `null` outside a plan.
    pub updates: Option<BTreeMap<String, u64>>,
}

/// A job (`JobDiff`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct JobDiff {
    /// What happened to it.
    #[serde(rename = "Type")]
    pub diff_type: DiffType,
    /// The job's id.
    #[serde(rename = "ID")]
    pub id: String,
    /// Its changed primitive fields.
    pub fields: Option<Vec<FieldDiff>>,
    /// Its changed blocks.
    pub objects: Option<Vec<ObjectDiff>>,
    /// Every task group.
    pub task_groups: Option<Vec<TaskGroupDiff>>,
}

/// Job fields a diff leaves out: the servers set them, or Drover keeps
/// them per group (`Update`).
const JOB_SKIPPED: [&str; 14] = [
    "ID",
    "Status",
    "StatusDescription",
    "Version",
    "Stable",
    "CreateIndex",
    "ModifyIndex",
    "JobModifyIndex",
    "Update",
    "SubmitTime",
    "NomadTokenID",
    "VaultToken",
    "ConsulToken",
    "TaskGroups",
];

/// Fields that are maps of values, listed as `Name[key]` fields.
const MAPS: [&str; 4] = ["Meta", "Env", "CanaryMeta", "Labels"];

/// Nomad's object name for a block or a list of blocks.
fn object_name(key: &str) -> &str {
    match key {
        "Constraints" => "Constraint",
        "Affinities" => "Affinity",
        "Spreads" => "Spread",
        "Networks" => "Network",
        "Services" => "Service",
        "Checks" => "Check",
        "Templates" => "Template",
        "Artifacts" => "Artifact",
        "ReservedPorts" => "Static Port",
        "DynamicPorts" => "Dynamic Port",
        "Volumes" => "Volume",
        "VolumeMounts" => "VolumeMount",
        "Devices" => "Device",
        other => other,
    }
}

/// The diff from `old` to `new`, jobs as the API answers them
/// (`api::jobs::Job`; either absent: the job is added or deleted); see the
/// module docs. `None` when both are absent.
pub fn job_diff<J: Serialize>(old: Option<&J>, new: Option<&J>) -> Option<JobDiff> {
    let (old, new) = (old.map(to_map), new.map(to_map));
    let id = new.as_ref().or(old.as_ref())?.get("ID").map(text_of).unwrap_or_default();
    let (fields, objects) = diff_block(old.as_ref(), new.as_ref(), &JOB_SKIPPED, false);
    let (old_groups, new_groups) = (list_of(old.as_ref(), "TaskGroups"), list_of(new.as_ref(), "TaskGroups"));
    let task_groups: Vec<TaskGroupDiff> = matched_by_name(&old_groups, &new_groups, name_of)
        .into_iter()
        .map(|(name, old, new)| group_diff(name, old.cloned(), new.cloned()))
        .collect();
    let changed =
        !fields.is_empty() || !objects.is_empty() || task_groups.iter().any(|g| g.diff_type != DiffType::None);
    Some(JobDiff {
        diff_type: side_type(old.is_some(), new.is_some(), changed),
        id,
        fields: Some(fields),
        objects: Some(objects),
        task_groups: Some(task_groups),
    })
}

/// Step 2 for one group.
fn group_diff(name: String, old: Option<Map<String, Value>>, new: Option<Map<String, Value>>) -> TaskGroupDiff {
    let (fields, objects) = diff_block(old.as_ref(), new.as_ref(), &["Name", "Tasks"], true);
    let (old_tasks, new_tasks) = (list_of(old.as_ref(), "Tasks"), list_of(new.as_ref(), "Tasks"));
    let tasks: Vec<TaskDiff> = matched_by_name(&old_tasks, &new_tasks, name_of)
        .into_iter()
        .map(|(name, old, new)| {
            let (fields, objects) = diff_block(old, new, &["Name"], true);
            let changed = any_change(&fields, &objects);
            let diff_type = side_type(old.is_some(), new.is_some(), changed);
            TaskDiff { diff_type, name, fields: Some(fields), objects: Some(objects), annotations: None }
        })
        .collect();
    let changed = any_change(&fields, &objects) || tasks.iter().any(|task| task.diff_type != DiffType::None);
    TaskGroupDiff {
        diff_type: side_type(old.is_some(), new.is_some(), changed),
        name,
        fields: Some(fields),
        objects: Some(objects),
        tasks: Some(tasks),
        updates: None,
    }
}

/// Pairs the items of two lists by name, in name order.
fn matched_by_name<'a, T, K: Ord + ToString>(
    old: &'a [T],
    new: &'a [T],
    name: impl Fn(&'a T) -> K,
) -> Vec<(String, Option<&'a T>, Option<&'a T>)> {
    let mut pairs: BTreeMap<K, (Option<&T>, Option<&T>)> = BTreeMap::new();
    for item in old {
        pairs.entry(name(item)).or_default().0 = Some(item);
    }
    for item in new {
        pairs.entry(name(item)).or_default().1 = Some(item);
    }
    pairs.into_iter().map(|(key, (old, new))| (key.to_string(), old, new)).collect()
}

/// The objects of the list `key` of `block`.
fn list_of(block: Option<&Map<String, Value>>, key: &str) -> Vec<Map<String, Value>> {
    let items = block.and_then(|block| block.get(key)).and_then(Value::as_array);
    items.into_iter().flatten().filter_map(|item| item.as_object().cloned()).collect()
}

/// A group's or task's `Name`.
fn name_of(block: &Map<String, Value>) -> String {
    block.get("Name").and_then(Value::as_str).unwrap_or_default().to_string()
}

fn to_map<T: Serialize>(value: &T) -> Map<String, Value> {
    match serde_json::to_value(value) {
        Ok(Value::Object(map)) => map,
        other => unreachable!("a job, group or task serializes to an object, not {other:?}"),
    }
}

fn any_change(fields: &[FieldDiff], objects: &[ObjectDiff]) -> bool {
    fields.iter().any(|field| field.diff_type != DiffType::None)
        || objects.iter().any(|object| object.diff_type != DiffType::None)
}

/// Added or Deleted by which side is there, else Edited or None.
fn side_type(old: bool, new: bool, changed: bool) -> DiffType {
    match (old, new) {
        (false, true) => DiffType::Added,
        (true, false) => DiffType::Deleted,
        _ if changed => DiffType::Edited,
        _ => DiffType::None,
    }
}

/// The fields and objects of one block (a job, group, task or nested
/// block), `skip` left out; unchanged ones only when `contextual`.
fn diff_block(
    old: Option<&Map<String, Value>>,
    new: Option<&Map<String, Value>>,
    skip: &[&str],
    contextual: bool,
) -> (Vec<FieldDiff>, Vec<ObjectDiff>) {
    let keys: BTreeSet<&String> = old.into_iter().chain(new).flat_map(|map| map.keys()).collect();
    let mut fields = Vec::new();
    let mut objects = Vec::new();
    for key in keys.into_iter().filter(|key| !skip.contains(&key.as_str())) {
        let old_value = old.and_then(|map| map.get(key)).filter(|value| !value.is_null());
        let new_value = new.and_then(|map| map.get(key)).filter(|value| !value.is_null());
        let Some(shape) = new_value.or(old_value) else { continue };
        match shape {
            Value::Object(_) if MAPS.contains(&key.as_str()) => {
                let (old_flat, new_flat) = (flatten(key, old_value), flatten(key, new_value));
                fields.extend(field_diffs(&old_flat, &new_flat, contextual));
            }
            Value::Object(_) if key == "Config" => {
                let (old_flat, new_flat) = (flatten("", old_value), flatten("", new_value));
                let config_fields = field_diffs(&old_flat, &new_flat, contextual);
                objects.extend(object_of("Config", old_value.is_some(), new_value.is_some(), config_fields, vec![]));
            }
            Value::Object(_) => {
                let (inner_fields, inner_objects) = diff_block(
                    old_value.and_then(Value::as_object),
                    new_value.and_then(Value::as_object),
                    &[],
                    contextual,
                );
                let (had, has) = (old_value.is_some(), new_value.is_some());
                objects.extend(object_of(object_name(key), had, has, inner_fields, inner_objects));
            }
            Value::Array(items) if items.iter().all(|item| !item.is_object()) => {
                let (old_set, new_set) = (value_set(old_value), value_set(new_value));
                let set_fields = set_diffs(key, &old_set, &new_set, contextual);
                objects.extend(object_of(key, old_value.is_some(), new_value.is_some(), set_fields, vec![]));
            }
            Value::Array(_) => objects.extend(block_list(key, old_value, new_value, contextual)),
            _ => fields.extend(field_diff(key, old_value.map(text_of), new_value.map(text_of), contextual)),
        }
    }
    fields.sort_by(|a, b| a.name.cmp(&b.name));
    objects.sort_by(|a, b| a.name.cmp(&b.name));
    let keep = |diff_type: DiffType| contextual || diff_type != DiffType::None;
    fields.retain(|field| keep(field.diff_type));
    objects.retain(|object| keep(object.diff_type));
    (fields, objects)
}

/// An object of `fields` and `objects` typed by its sides and changes;
/// none when it is empty on both sides.
fn object_of(name: &str, had: bool, has: bool, fields: Vec<FieldDiff>, objects: Vec<ObjectDiff>) -> Option<ObjectDiff> {
    if fields.is_empty() && objects.is_empty() {
        return None;
    }
    let diff_type = side_type(had, has, any_change(&fields, &objects));
    Some(ObjectDiff { diff_type, name: name.to_string(), fields: Some(fields), objects: Some(objects) })
}

/// A list of blocks: items matched by `Name` or `Label` when they have
/// one, else as a set (a changed constraint is one deleted, one added).
fn block_list(key: &str, old: Option<&Value>, new: Option<&Value>, contextual: bool) -> Vec<ObjectDiff> {
    let items = |value: Option<&Value>| -> Vec<Map<String, Value>> {
        value.and_then(Value::as_array).into_iter().flatten().filter_map(|item| item.as_object().cloned()).collect()
    };
    let (old_items, new_items) = (items(old), items(new));
    let identity = |item: &Map<String, Value>| -> String {
        match item.get("Name").or_else(|| item.get("Label")).and_then(Value::as_str) {
            Some(name) => name.to_string(),
            None => Value::Object(item.clone()).to_string(),
        }
    };
    matched_by_name(&old_items, &new_items, identity)
        .into_iter()
        .filter_map(|(_, old, new)| {
            let (fields, objects) = diff_block(old, new, &[], contextual);
            object_of(object_name(key), old.is_some(), new.is_some(), fields, objects)
        })
        .collect()
}

/// The values of a list of plain values, as text.
fn value_set(value: Option<&Value>) -> BTreeSet<String> {
    value.and_then(Value::as_array).into_iter().flatten().map(text_of).collect()
}

/// A list of plain values as Nomad diffs it: one field named `name` per
/// value added, deleted or (contextual) kept.
fn set_diffs(name: &str, old: &BTreeSet<String>, new: &BTreeSet<String>, contextual: bool) -> Vec<FieldDiff> {
    let all: BTreeSet<&String> = old.union(new).collect();
    all.into_iter()
        .filter_map(|value| {
            let old_value = old.contains(value).then(|| value.clone());
            let new_value = new.contains(value).then(|| value.clone());
            field_diff(name, old_value, new_value, contextual)
        })
        .collect()
}

/// The fields of two flattened maps.
fn field_diffs(old: &BTreeMap<String, String>, new: &BTreeMap<String, String>, contextual: bool) -> Vec<FieldDiff> {
    let names: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    names
        .into_iter()
        .filter_map(|name| field_diff(name, old.get(name).cloned(), new.get(name).cloned(), contextual))
        .collect()
}

/// One field; an unchanged one only when `contextual`.
fn field_diff(name: &str, old: Option<String>, new: Option<String>, contextual: bool) -> Option<FieldDiff> {
    let diff_type = match (&old, &new) {
        (None, None) => return None,
        (None, Some(_)) => DiffType::Added,
        (Some(_), None) => DiffType::Deleted,
        (Some(old), Some(new)) if old != new => DiffType::Edited,
        _ if contextual => DiffType::None,
        _ => return None,
    };
    let (old, new) = (old.unwrap_or_default(), new.unwrap_or_default());
    Some(FieldDiff { diff_type, name: name.to_string(), old, new, annotations: None })
}

/// A value flattened into named text fields: a map's entries as
/// `prefix[key]`, a list's items as `prefix[i]`, nested to any depth
/// (`labels[0][team]`); an empty prefix names the top keys bare.
fn flatten(prefix: &str, value: Option<&Value>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Some(value) = value {
        flatten_into(prefix, value, &mut out);
    }
    out
}

fn flatten_into(prefix: &str, value: &Value, out: &mut BTreeMap<String, String>) {
    let sub = |key: &str| if prefix.is_empty() { key.to_string() } else { format!("{prefix}[{key}]") };
    match value {
        Value::Object(map) => map.iter().for_each(|(key, value)| flatten_into(&sub(key), value, out)),
        Value::Array(items) => {
            items.iter().enumerate().for_each(|(i, item)| flatten_into(&sub(&i.to_string()), item, out))
        }
        Value::Null => {}
        primitive => {
            out.insert(prefix.to_string(), text_of(primitive));
        }
    }
}

/// A plain value as Nomad's diff prints it.
fn text_of(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// What a plan decided for the groups and tasks of a diff.
#[derive(Clone, Debug, Default)]
pub struct DiffAnnotations {
    /// Per group: Nomad's update counts by name (`create`, `destroy`, ...).
    pub updates: BTreeMap<String, BTreeMap<String, u64>>,
    /// The groups whose change replaces their allocations (the scheduler's
    /// own test, `needs_destructive_update`).
    pub destructive_groups: BTreeSet<String>,
}

/// Lays a plan's annotations on `diff` (Nomad's `scheduler/annotate.go`,
/// but for an edited task's kind of update, which is the scheduler's own
/// decision for its group rather than a guess from the changed fields):
/// each group's non-zero counts; `forces create` / `forces destroy` on a
/// raised or lowered `Count`; `forces create` / `forces destroy` on the
/// tasks of an added or deleted group; on any other changed task, `forces
/// create/destroy update` when its group is destructive, else `forces
/// in-place update`.
pub fn annotate(diff: &mut JobDiff, annotations: &DiffAnnotations) {
    for group in diff.task_groups.iter_mut().flatten() {
        let updates = annotations.updates.get(&group.name).cloned().unwrap_or_default();
        group.updates = Some(updates.into_iter().filter(|(_, count)| *count > 0).collect());
        for field in group.fields.iter_mut().flatten().filter(|field| field.name == "Count") {
            let (old, new) = (field.old.parse::<u64>().ok(), field.new.parse::<u64>().ok());
            let forced = match (old, new) {
                (Some(old), Some(new)) if new > old => Some("forces create"),
                (Some(old), Some(new)) if new < old => Some("forces destroy"),
                _ => None,
            };
            field.annotations = forced.map(|forced| vec![forced.to_string()]);
        }
        let destructive = annotations.destructive_groups.contains(&group.name);
        for task in group.tasks.iter_mut().flatten() {
            let forced = match (group.diff_type, task.diff_type) {
                (_, DiffType::None) => continue,
                (DiffType::Added, _) => "forces create",
                (DiffType::Deleted, _) => "forces destroy",
                _ if destructive => "forces create/destroy update",
                _ => "forces in-place update",
            };
            task.annotations = Some(vec![forced.to_string()]);
        }
    }
}

#[cfg(test)]
#[path = "job_diff_test.rs"]
mod job_diff_test;
