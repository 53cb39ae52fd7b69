//! `drover job plan FILE`, printed as Nomad's `nomad job plan`: the diff
//! from the stored job (markers `+`, `-`, `+/-`; unchanged fields of a
//! group or task only with `--verbose`), the scheduler's dry run, and the
//! `Job Modify Index` with the `job run --check-index` hint. Exit codes
//! as Nomad's: 0 when no allocation is created or destroyed, 1 when some
//! are, 255 on an error.

use std::path::Path;

use anyhow::{anyhow, Context, Result};
use serde_json::Value;

use crate::api::client::ApiClient;
use crate::api::job_diff::{DiffType, FieldDiff, JobDiff, ObjectDiff, TaskDiff, TaskGroupDiff};
use crate::api::job_plan::{JobPlanResponse, PlanFailedMetric};

/// Nomad's exit code for a plan that could not be made.
const PLAN_ERROR: i32 = 255;

/// `drover job plan [--diff=false] [--verbose] FILE`: `body` is the file
/// read as `job run` reads it (`job::read_job_file`), or why it could not be.
pub async fn plan(api: &ApiClient, path: &Path, body: Result<Value>, diff: bool, verbose: bool) -> Result<i32> {
    let planned = match body {
        Ok(body) => plan_job(api, path, body, diff).await,
        Err(error) => Err(error),
    };
    match planned {
        Ok(answer) => {
            print!("{}", format_plan(&answer, diff, verbose, &path.display().to_string()));
            Ok(if answer.changes_allocations() { 1 } else { 0 })
        }
        Err(error) => {
            eprintln!("Error during plan: {error:#}");
            Ok(PLAN_ERROR)
        }
    }
}

async fn plan_job(api: &ApiClient, path: &Path, mut body: Value, diff: bool) -> Result<JobPlanResponse> {
    let id = body["Job"]["ID"].as_str().ok_or_else(|| anyhow!("{}: the job has no ID", path.display()))?.to_string();
    body["Diff"] = Value::Bool(diff);
    api.write("PUT", &format!("/v1/job/{id}/plan"), &body).await.context("Error during plan")
}

/// The whole output.
pub fn format_plan(answer: &JobPlanResponse, diff: bool, verbose: bool, file: &str) -> String {
    let mut out = String::new();
    if !answer.warnings.is_empty() {
        out += &format!("Job Warnings:\n{}\n\n", answer.warnings);
    }
    if let Some(job_diff) = answer.diff.as_ref().filter(|_| diff) {
        out += &format!("{}\n\n", format_job_diff(job_diff, verbose).trim());
    }
    out += "Scheduler dry-run:\n";
    out += &format_dry_run(answer);
    out += "\n\n";
    let index = answer.job_modify_index;
    out += &format!(
        "Job Modify Index: {index}\nTo submit the job with version verification run:\n\n\
         drover job run --check-index {index} {file}\n\n\
         When running the job with the check-index flag, the job will only be run if the\n\
         job modify index given matches the server-side version. If the index has\n\
         changed, another user has modified the job and the plan's results are\n\
         potentially invalid.\n"
    );
    out
}

/// Nomad's marker of a diff type, and its width.
fn marker(diff_type: DiffType) -> &'static str {
    match diff_type {
        DiffType::Added => "+",
        DiffType::Deleted => "-",
        DiffType::Edited => "+/-",
        DiffType::None => "",
    }
}

/// `marker` followed by a space, padded to `width` markers.
fn marked(diff_type: DiffType, width: usize) -> String {
    let marker = marker(diff_type);
    let space = if width > 0 { " " } else { "" };
    format!("{marker}{}{space}", " ".repeat(width - marker.len()))
}

fn format_job_diff(job: &JobDiff, verbose: bool) -> String {
    let groups = job.task_groups.as_deref().unwrap_or_default();
    let (fields, objects) = (job.fields.as_deref().unwrap_or_default(), job.objects.as_deref().unwrap_or_default());
    let width = groups.iter().map(|group| marker(group.diff_type).len()).chain([marker(job.diff_type).len()]).max();
    let width = width.unwrap_or(0).max(longest_marker(fields, objects));
    let mut out = format!("{}Job: {:?}\n", marked(job.diff_type, marker(job.diff_type).len()), job.id);
    if job.diff_type == DiffType::Edited || verbose {
        let block = aligned(fields, objects, 0, verbose);
        if !block.is_empty() {
            out += &format!("{block}\n");
        }
    }
    for group in groups {
        out += &format!("{}\n", format_group_diff(group, width, verbose));
    }
    out
}

fn format_group_diff(group: &TaskGroupDiff, width: usize, verbose: bool) -> String {
    let mut out = format!("{}Task Group: {:?}", marked(group.diff_type, width), group.name);
    let updates: Vec<String> = group.updates.iter().flatten().map(|(kind, count)| format!("{count} {kind}")).collect();
    if !updates.is_empty() {
        out += &format!(" ({})", updates.join(", "));
    }
    out += "\n";
    let tasks = group.tasks.as_deref().unwrap_or_default();
    let fields = shown_fields(group.fields.as_deref().unwrap_or_default(), verbose);
    let objects = shown_objects(group.objects.as_deref().unwrap_or_default(), verbose);
    // Nomad's `subStartPrefix`: two past the group's own marker padding.
    let indent = width - marker(group.diff_type).len() + 2;
    if group.diff_type == DiffType::Edited || verbose {
        let block = aligned(&fields, &objects, indent, verbose);
        if !block.is_empty() {
            out += &format!("{block}\n");
        }
    }
    let task_width = tasks.iter().map(|task| marker(task.diff_type).len()).max().unwrap_or(0);
    let task_width = task_width.max(longest_marker(&fields, &objects));
    for task in tasks {
        out += &format!("{}\n", format_task_diff(task, indent, task_width, verbose));
    }
    out.trim_end_matches('\n').to_string()
}

fn format_task_diff(task: &TaskDiff, indent: usize, width: usize, verbose: bool) -> String {
    let mut out = format!("{}{}Task: {:?}", " ".repeat(indent), marked(task.diff_type, width), task.name);
    if let Some(annotations) = task.annotations.as_ref().filter(|annotations| !annotations.is_empty()) {
        out += &format!(" ({})", annotations.join(", "));
    }
    let show = match task.diff_type {
        DiffType::None => false,
        DiffType::Added | DiffType::Deleted => verbose,
        DiffType::Edited => true,
    };
    if show {
        let fields = shown_fields(task.fields.as_deref().unwrap_or_default(), verbose);
        let objects = shown_objects(task.objects.as_deref().unwrap_or_default(), verbose);
        let block = aligned(&fields, &objects, indent + 2, verbose);
        if !block.is_empty() {
            out += &format!("\n{block}");
        }
    }
    out
}

/// A group's or task's own fields and blocks: unchanged ones only when verbose.
fn shown_fields(fields: &[FieldDiff], verbose: bool) -> Vec<FieldDiff> {
    fields.iter().filter(|field| verbose || field.diff_type != DiffType::None).cloned().collect()
}

fn shown_objects(objects: &[ObjectDiff], verbose: bool) -> Vec<ObjectDiff> {
    objects.iter().filter(|object| verbose || object.diff_type != DiffType::None).cloned().collect()
}

fn longest_marker(fields: &[FieldDiff], objects: &[ObjectDiff]) -> usize {
    let field_markers = fields.iter().map(|field| marker(field.diff_type).len());
    field_markers.chain(objects.iter().map(|object| marker(object.diff_type).len())).max().unwrap_or(0)
}

/// Fields then blocks at `indent`, markers and values aligned (Nomad's
/// `alignedFieldAndObjects`).
fn aligned(fields: &[FieldDiff], objects: &[ObjectDiff], indent: usize, verbose: bool) -> String {
    let width = longest_marker(fields, objects);
    let name_width = fields.iter().map(|field| field.name.len()).max().unwrap_or(0);
    let mut lines: Vec<String> = fields.iter().map(|field| format_field(field, indent, width, name_width)).collect();
    lines.extend(objects.iter().map(|object| format_object(object, indent, width, verbose)));
    lines.join("\n")
}

fn format_field(field: &FieldDiff, indent: usize, width: usize, name_width: usize) -> String {
    let value = match field.diff_type {
        DiffType::Added => format!("{:?}", field.new),
        DiffType::Deleted => format!("{:?}", field.old),
        DiffType::Edited => format!("{:?} => {:?}", field.old, field.new),
        DiffType::None => format!("{:?}", field.new),
    };
    let padding = " ".repeat(name_width - field.name.len());
    let mut line = format!("{}{}{}: {padding}{value}", " ".repeat(indent), marked(field.diff_type, width), field.name);
    if let Some(annotations) = field.annotations.as_ref().filter(|annotations| !annotations.is_empty()) {
        line += &format!(" ({})", annotations.join(", "));
    }
    line
}

fn format_object(object: &ObjectDiff, indent: usize, width: usize, verbose: bool) -> String {
    let prefix = marked(object.diff_type, width);
    let fields = object.fields.as_deref().unwrap_or_default();
    let objects = object.objects.as_deref().unwrap_or_default();
    let inner = aligned(fields, objects, indent + width - marker(object.diff_type).len() + 2, verbose);
    format!("{}{prefix}{} {{\n{inner}\n{}}}", " ".repeat(indent), object.name, " ".repeat(indent + prefix.len()))
}

/// Nomad's `formatDryRun`, with Drover's per-class lines.
fn format_dry_run(answer: &JobPlanResponse) -> String {
    let Some(failed) = answer.failed_tg_allocs.as_ref().filter(|failed| !failed.is_empty()) else {
        return "- All tasks successfully allocated.".to_string();
    };
    let mut out = "- WARNING: Failed to place all allocations.".to_string();
    for (group, failure) in failed {
        let count = failure.metric.coalesced_failures + 1;
        let noun = if count > 1 { "allocations" } else { "allocation" };
        out += &format!("\n  Task Group {group:?} (failed to place {count} {noun}):");
        for line in metric_lines(failure) {
            out += &format!("\n    * {line}");
        }
    }
    out
}

/// Nomad's `formatAllocMetrics` lines, then Drover's classes.
fn metric_lines(failure: &PlanFailedMetric) -> Vec<String> {
    let metric = &failure.metric;
    let mut lines = Vec::new();
    if metric.nodes_evaluated == 0 {
        lines.push("No nodes were eligible for evaluation".to_string());
    }
    for (datacenter, _) in metric.nodes_available.iter().filter(|(_, available)| **available == 0) {
        lines.push(format!("No nodes are available in datacenter {datacenter:?}"));
    }
    for (class, nodes) in &metric.class_filtered {
        lines.push(format!("Class {class:?}: {nodes} nodes excluded by filter"));
    }
    for (constraint, nodes) in &metric.constraint_filtered {
        lines.push(format!("Constraint {constraint:?}: {nodes} nodes excluded by filter"));
    }
    if metric.nodes_exhausted > 0 {
        lines.push(format!("Resources exhausted on {} nodes", metric.nodes_exhausted));
    }
    for (class, nodes) in &metric.class_exhausted {
        lines.push(format!("Class {class:?} exhausted on {nodes} nodes"));
    }
    for (dimension, nodes) in &metric.dimension_exhausted {
        lines.push(format!("Dimension {dimension:?} exhausted on {nodes} nodes"));
    }
    for class in &failure.filtered_classes {
        let examples: Vec<&str> = class
            .example_nodes
            .iter()
            .map(|node| if node.name.is_empty() { node.id.as_str() } else { node.name.as_str() })
            .collect();
        let why = if class.exhausted { "exhausted" } else { "filtered" };
        lines.push(format!(
            "Drover: node class {:?} (computed {}): {} nodes {why} by {:?}, e.g. {}",
            class.node_class,
            class.computed_class,
            class.nodes,
            class.reason,
            examples.join(", ")
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::job_diff::{annotate, job_diff, DiffAnnotations};
    use crate::api::jobs::Job;

    fn job(count: u64, run_for: &str) -> Job {
        serde_json::from_value(json!({"ID": "web", "Name": "web", "Type": "service", "Datacenters": ["dc1"],
            "TaskGroups": [{"Name": "web", "Count": count, "Tasks": [{"Name": "server", "Driver": "mock",
                "Config": {"run_for": run_for, "exit_code": 0}}]}]}))
        .expect("a job")
    }

    fn printed(old: &Job, new: &Job, updates: &[(&str, u64)], destructive: bool) -> String {
        let mut diff = job_diff(Some(old), Some(new)).expect("a diff");
        let counts = updates.iter().map(|(kind, count)| (kind.to_string(), *count)).collect();
        let destructive_groups = if destructive { ["web".to_string()].into() } else { Default::default() };
        annotate(&mut diff, &DiffAnnotations { updates: [("web".to_string(), counts)].into(), destructive_groups });
        let answer = JobPlanResponse { diff: Some(diff), job_modify_index: 7, ..JobPlanResponse::default() };
        format_plan(&answer, true, false, "web.json")
    }

    #[test]
    fn a_plan_prints_as_nomads() {
        let scaled = printed(&job(1, "1h"), &job(2, "1h"), &[("create", 1), ("in-place update", 1)], false);
        let expected = "+/- Job: \"web\"\n\
            +/- Task Group: \"web\" (1 create, 1 in-place update)\n  \
            +/- Count: \"1\" => \"2\" (forces create)\n      \
            Task: \"server\"\n\n\
            Scheduler dry-run:\n- All tasks successfully allocated.\n\n\
            Job Modify Index: 7\nTo submit the job with version verification run:\n\n\
            drover job run --check-index 7 web.json\n";
        assert!(scaled.starts_with(expected), "{scaled}");
        let changed = printed(&job(1, "1h"), &job(1, "2h"), &[("create/destroy update", 1)], true);
        let expected = "+/- Job: \"web\"\n\
            +/- Task Group: \"web\" (1 create/destroy update)\n  \
            +/- Task: \"server\" (forces create/destroy update)\n    \
            +/- Config {\n          \
            exit_code: \"0\"\n      \
            +/- run_for:   \"1h\" => \"2h\"\n        \
            }\n\n\
            Scheduler dry-run:\n";
        assert!(changed.starts_with(expected), "{changed}");
    }
}
