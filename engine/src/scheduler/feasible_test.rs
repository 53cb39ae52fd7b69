use std::collections::BTreeSet;
use std::sync::Arc;

use super::*;
use crate::structs::{JobType, NodeId, Resources};

fn node(n: u128, class: &str, kernel_version: &str) -> Node {
    let mut node = Node::new_ready(NodeId::from_u128(n), "dc1", class, Resources::new(1000, 1000, 1000));
    node.attributes.insert("kernel.version".into(), kernel_version.into());
    node.attributes.insert("cpu.numcores".into(), "8".into());
    node.meta.insert("rack".into(), format!("r{}", n % 3));
    node.computed_class = node.compute_class();
    node
}

fn job_with(constraint: Constraint) -> Job {
    let mut job = Job::new_simple("web", JobType::Service, 1, Resources::new(1, 1, 0));
    job.constraints.push(constraint);
    job
}

fn holds(constraint: Constraint, node: &Node) -> bool {
    let job = job_with(constraint);
    FeasibilityChecker::new(&job, &job.task_groups[0]).check(node).is_ok()
}

#[test]
fn every_comparison_operator() {
    let linux = node(1, "a", "5.10.0");
    let c = |l: &str, op, r: &str| Constraint::new(l, op, r);
    assert!(holds(c("${attr.kernel.name}", ConstraintOperand::Equal, "linux"), &linux));
    assert!(!holds(c("${attr.kernel.name}", ConstraintOperand::Equal, "windows"), &linux));
    assert!(holds(c("${attr.kernel.name}", ConstraintOperand::NotEqual, "windows"), &linux));
    assert!(holds(c("${attr.missing}", ConstraintOperand::NotEqual, "x"), &linux), "missing counts as different");
    assert!(holds(c("${attr.cpu.numcores}", ConstraintOperand::Less, "10"), &linux), "numeric, not lexical");
    assert!(holds(c("${attr.cpu.numcores}", ConstraintOperand::LessOrEqual, "8"), &linux));
    assert!(holds(c("${attr.cpu.numcores}", ConstraintOperand::Greater, "4"), &linux));
    assert!(!holds(c("${attr.cpu.numcores}", ConstraintOperand::GreaterOrEqual, "9"), &linux));
    assert!(holds(c("${meta.rack}", ConstraintOperand::Regexp, "^r[0-9]$"), &linux));
    assert!(!holds(c("${meta.rack}", ConstraintOperand::Regexp, "^x"), &linux));
    assert!(holds(c("${attr.kernel.version}", ConstraintOperand::Version, ">= 5.4, < 6"), &linux));
    assert!(!holds(c("${attr.kernel.version}", ConstraintOperand::Version, "< 5.4"), &linux));
    assert!(holds(c("${meta.rack}", ConstraintOperand::IsSet, ""), &linux));
    assert!(!holds(c("${meta.zone}", ConstraintOperand::IsSet, ""), &linux));
    assert!(holds(c("${meta.zone}", ConstraintOperand::IsNotSet, ""), &linux));
    assert!(holds(c("${node.datacenter}", ConstraintOperand::Equal, "dc1"), &linux));
    assert!(holds(c("${node.class}", ConstraintOperand::Equal, "a"), &linux));
}

#[test]
fn set_operators_read_comma_separated_members() {
    let mut gpu = node(1, "a", "5.10.0");
    gpu.meta.insert("features".into(), "cuda, avx2,sse4".into());
    let c = |op, r: &str| Constraint::new("${meta.features}", op, r);
    assert!(holds(c(ConstraintOperand::SetContains, "avx2,cuda"), &gpu));
    assert!(holds(c(ConstraintOperand::SetContainsAll, "sse4"), &gpu));
    assert!(!holds(c(ConstraintOperand::SetContainsAll, "avx2,neon"), &gpu), "every member");
    assert!(holds(c(ConstraintOperand::SetContainsAny, "neon, avx2"), &gpu));
    assert!(!holds(c(ConstraintOperand::SetContainsAny, "neon,sve"), &gpu));
    let plain = node(2, "a", "5.10.0");
    assert!(!holds(c(ConstraintOperand::SetContainsAny, "cuda"), &plain), "a missing attribute holds nothing");
}

#[test]
fn class_checks_run_once_per_class_and_unique_constraints_escape() {
    let nodes: Vec<Arc<Node>> = (0..1000).map(|n| Arc::new(node(n, &format!("c{}", n % 5), "5.10"))).collect();
    let job = job_with(Constraint::new("${attr.kernel.name}", ConstraintOperand::Equal, "linux"));
    let mut checker = FeasibilityChecker::new(&job, &job.task_groups[0]);
    assert!(nodes.iter().all(|node| checker.check(node).is_ok()));
    let classes: BTreeSet<_> = nodes.iter().map(|node| node.computed_class).collect();
    assert_eq!(classes.len(), 15, "5 node classes x 3 racks");
    assert_eq!(checker.class_eligibility.len(), classes.len(), "one check per computed class, not per node");
    assert!(!checker.escaped());

    let pinned = job_with(Constraint::new("${node.unique.name}", ConstraintOperand::Equal, &nodes[7].name));
    let mut checker = FeasibilityChecker::new(&pinned, &pinned.task_groups[0]);
    assert!(checker.escaped());
    let feasible: Vec<_> = nodes.iter().filter(|node| checker.check(node).is_ok()).map(|node| node.id).collect();
    assert_eq!(feasible, vec![nodes[7].id]);
}

#[test]
fn datacenter_driver_and_status_filter_with_reasons() {
    let mut job = Job::new_simple("web", JobType::Service, 1, Resources::new(1, 1, 0));
    let mut checker = FeasibilityChecker::new(&job, &job.task_groups[0]);
    let mut elsewhere = node(1, "a", "5");
    elsewhere.datacenter = Arc::from("dc9");
    elsewhere.computed_class = elsewhere.compute_class();
    assert_eq!(checker.check(&elsewhere), Err(Filtered::Datacenter));
    let mut down = node(2, "a", "5");
    down.status = crate::structs::NodeStatus::Down;
    assert_eq!(checker.check(&down), Err(Filtered::NotSchedulable));
    job.task_groups[0].tasks[0].driver = "docker".into();
    let mut checker = FeasibilityChecker::new(&job, &job.task_groups[0]);
    assert_eq!(checker.check(&node(3, "a", "5")), Err(Filtered::MissingDriver("docker".into())));
}
