//! Nomad's JSON shapes of what the API answers: jobs, job summaries,
//! evaluations, allocations and nodes, with every field Nomad's clients
//! dereference present (`docs/nomad-http-api.md`, "Object shapes" and
//! "What breaks the clients").

use std::collections::BTreeMap;

use engine::clock::Timestamp;
use engine::state::Snapshot;
use engine::structs::{
    Affinity, AllocMetric, Allocation, ClientStatus, Constraint, Evaluation, Job, NetworkResource, Node, Port,
    ReschedulePolicy, Resources, RestartPolicy, Spread,
};
use serde_json::{json, Value};

/// The region Drover serves (one region).
pub const REGION: &str = "global";

/// A timestamp as Nomad's integer nanoseconds.
fn ns(time: Timestamp) -> u64 {
    time.0
}

/// A timestamp as RFC 3339 (`null` for none).
pub fn rfc3339(time: Timestamp) -> Value {
    if time == Timestamp::ZERO {
        return Value::Null;
    }
    Value::String(crate::api::format::rfc3339(time))
}

fn text<T: serde::Serialize>(value: T) -> Value {
    serde_json::to_value(value).expect("enums serialize to strings")
}

fn constraints(list: &[Constraint]) -> Value {
    Value::Array(
        list.iter()
            .map(|constraint| {
                json!({"LTarget": constraint.l_target, "RTarget": constraint.r_target,
                       "Operand": text(constraint.operand)})
            })
            .collect(),
    )
}

fn affinities(list: &[Affinity]) -> Value {
    if list.is_empty() {
        return Value::Null;
    }
    Value::Array(
        list.iter()
            .map(|affinity| {
                json!({"LTarget": affinity.l_target, "RTarget": affinity.r_target,
                       "Operand": text(affinity.operand), "Weight": affinity.weight})
            })
            .collect(),
    )
}

fn spreads(list: &[Spread]) -> Value {
    if list.is_empty() {
        return Value::Null;
    }
    Value::Array(
        list.iter()
            .map(|spread| {
                let targets: Vec<Value> = spread
                    .targets
                    .iter()
                    .map(|target| json!({"Value": target.value, "Percent": target.percent}))
                    .collect();
                json!({"Attribute": spread.attribute, "Weight": spread.weight, "SpreadTarget": targets})
            })
            .collect(),
    )
}

fn networks(list: &[NetworkResource]) -> Value {
    if list.is_empty() {
        return Value::Null;
    }
    let ports = |ports: &[Port]| -> Vec<Value> {
        ports.iter().map(|port| json!({"Label": &*port.label, "Value": port.value, "To": port.to})).collect()
    };
    Value::Array(
        list.iter()
            .map(|network| {
                json!({"Mode": "host", "ReservedPorts": ports(&network.reserved_ports),
                       "DynamicPorts": ports(&network.dynamic_ports)})
            })
            .collect(),
    )
}

fn restart(policy: &RestartPolicy) -> Value {
    json!({"Attempts": policy.attempts, "Interval": policy.interval.as_nanos() as u64,
           "Delay": policy.delay.as_nanos() as u64, "Mode": text(policy.mode)})
}

fn reschedule(policy: &ReschedulePolicy) -> Value {
    json!({"Attempts": policy.attempts, "Interval": policy.interval.as_nanos() as u64,
           "Delay": policy.delay.as_nanos() as u64, "DelayFunction": text(policy.delay_function),
           "MaxDelay": policy.max_delay.as_nanos() as u64, "Unlimited": policy.unlimited})
}

fn resources(resources: Resources) -> Value {
    json!({"CPU": resources.cpu, "MemoryMB": resources.memory_mb, "DiskMB": resources.disk_mb,
           "IOPS": 0, "Networks": null, "Devices": null})
}

/// When the job's current version was submitted: its register eval was
/// written in the same command, so it was created at the job's modify index.
pub fn submit_time(job: &Job, snapshot: &Snapshot) -> u64 {
    snapshot
        .evals_by_job(&job.key())
        .find(|eval| eval.create_index == job.job_modify_index)
        .map_or(0, |eval| ns(eval.create_time))
}

/// Nomad's job status: `running` while any allocation is live, `pending`
/// while nothing runs and an eval is outstanding or nothing was placed yet,
/// `dead` once stopped, or once everything placed has finished.
pub fn job_status(job: &Job, snapshot: &Snapshot) -> &'static str {
    let key = job.key();
    if snapshot.allocs_by_job(&key).any(|alloc| !alloc.terminal()) {
        return "running";
    }
    if job.stop {
        return "dead";
    }
    let outstanding = snapshot.evals_by_job(&key).any(|eval| !eval.status.is_terminal());
    let placed = snapshot.allocs_by_job(&key).next().is_some();
    if outstanding || !placed {
        "pending"
    } else {
        "dead"
    }
}

/// The server's job (`GET /v1/job/:id`, and `Allocation.Job`).
pub fn job(job: &Job, snapshot: &Snapshot) -> Value {
    let groups: Vec<Value> = job
        .task_groups
        .iter()
        .map(|group| {
            let tasks: Vec<Value> = group
                .tasks
                .iter()
                .map(|task| {
                    json!({"Name": task.name, "Driver": task.driver, "User": task.user.clone().unwrap_or_default(),
                           "Config": task.config, "Env": task.env, "Services": null, "Vault": null, "Templates": null,
                           "Constraints": constraints(&task.constraints), "Affinities": affinities(&task.affinities),
                           "Resources": resources(task.resources), "RestartPolicy": restart(&group.restart_policy),
                           "DispatchPayload": null, "Lifecycle": null, "Meta": null,
                           "KillTimeout": u64::try_from(task.kill_timeout.as_nanos()).unwrap_or(u64::MAX),
                           "LogConfig": {"MaxFiles": task.logs.max_files, "MaxFileSizeMB": task.logs.max_file_size_mb},
                           "Artifacts": null, "Leader": false, "ShutdownDelay": 0, "VolumeMounts": null,
                           "ScalingPolicies": null, "KillSignal": task.kill_signal.clone().unwrap_or_default(), "Kind": ""})
                })
                .collect();
            let disk: u64 = group.tasks.iter().map(|task| task.resources.disk_mb).sum();
            json!({"Name": group.name, "Count": group.count,
                   "Update": group.update.as_ref().map(|update| json!({"MaxParallel": update.max_parallel})),
                   "Migrate": null, "Constraints": constraints(&group.constraints), "Scaling": null,
                   "RestartPolicy": restart(&group.restart_policy), "Tasks": tasks,
                   "EphemeralDisk": {"Sticky": false, "Migrate": false, "SizeMB": disk}, "Meta": null,
                   "ReschedulePolicy": job.reschedule_policy(group).as_ref().map(reschedule),
                   "Affinities": affinities(&group.affinities), "Spreads": spreads(&group.spreads),
                   "Networks": networks(&group.networks), "Services": null, "Volumes": null,
                   "ShutdownDelay": null,
                   "StopAfterClientDisconnect": group.stop_after_client_disconnect.map(|d| d.as_nanos() as u64),
                   "MaxClientDisconnect": group.max_client_disconnect.map(|d| d.as_nanos() as u64),
                   "Disconnect": group.max_client_disconnect.map(|lost_after| json!({
                       "LostAfter": lost_after.as_nanos() as u64, "Replace": group.replace_on_disconnect,
                       "Reconcile": "best_score", "StopOnClientAfter": null}))})
        })
        .collect();
    json!({"Stop": job.stop, "Region": REGION, "Namespace": &*job.namespace, "ID": &*job.id, "ParentID": "",
           "Name": job.name, "Type": text(job.job_type), "Priority": job.priority, "AllAtOnce": false,
           "Datacenters": job.datacenters, "Constraints": constraints(&job.constraints),
           "Affinities": affinities(&job.affinities), "Spreads": spreads(&job.spreads), "TaskGroups": groups, "Update": {"Stagger": 0, "MaxParallel": 0},
           "Multiregion": null, "Periodic": null, "ParameterizedJob": null, "Dispatched": false,
           "Payload": null, "Meta": null, "ConsulToken": "", "VaultToken": "", "VaultNamespace": "",
           "NomadTokenID": "", "Status": job_status(job, snapshot), "StatusDescription": "", "Stable": false,
           "Version": job.version, "SubmitTime": submit_time(job, snapshot), "CreateIndex": job.create_index,
           "ModifyIndex": job.modify_index, "JobModifyIndex": job.job_modify_index})
}

/// Per task group counts, as `JobSummary.Summary`.
pub fn summary_counts(job: &Job, snapshot: &Snapshot) -> Value {
    let mut groups: BTreeMap<&str, [u64; 7]> =
        job.task_groups.iter().map(|group| (group.name.as_str(), [0; 7])).collect();
    for alloc in snapshot.allocs_by_job(&job.key()) {
        let Some(counts) = groups.get_mut(&*alloc.task_group) else { continue };
        let slot = match (alloc.client_status, alloc.server_terminal()) {
            (ClientStatus::Pending, false) => 1,
            (ClientStatus::Running, false) => 2,
            (ClientStatus::Pending | ClientStatus::Running, true) => continue,
            (ClientStatus::Failed, _) => 3,
            (ClientStatus::Complete, _) => 4,
            (ClientStatus::Lost, _) => 5,
            (ClientStatus::Unknown, _) => 6,
        };
        counts[slot] += 1;
    }
    let latest =
        snapshot.evals_by_job(&job.key()).filter(|eval| eval.status.is_terminal()).max_by_key(|e| e.modify_index);
    if let Some(eval) = latest {
        for (group, queued) in &eval.queued_allocations {
            if let Some(counts) = groups.get_mut(group.as_str()) {
                counts[0] = *queued;
            }
        }
    }
    groups
        .into_iter()
        .map(|(name, [queued, starting, running, failed, complete, lost, unknown])| {
            (
                name.to_string(),
                json!({"Queued": queued, "Starting": starting, "Running": running,
                                     "Failed": failed, "Complete": complete, "Lost": lost, "Unknown": unknown}),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// `JobSummary` (`/v1/job/:id/summary`, and in every list stub).
pub fn job_summary(job: &Job, snapshot: &Snapshot) -> Value {
    json!({"JobID": &*job.id, "Namespace": &*job.namespace, "Summary": summary_counts(job, snapshot),
           "Children": {"Pending": 0, "Running": 0, "Dead": 0},
           "CreateIndex": job.create_index, "ModifyIndex": job.modify_index})
}

/// A `JobListStub`.
pub fn job_stub(job: &Job, snapshot: &Snapshot) -> Value {
    json!({"ID": &*job.id, "ParentID": "", "Name": job.name, "Namespace": &*job.namespace,
           "Datacenters": job.datacenters, "Multiregion": null, "Type": text(job.job_type),
           "Priority": job.priority, "Periodic": false, "ParameterizedJob": false, "Stop": job.stop,
           "Status": job_status(job, snapshot), "StatusDescription": "",
           "JobSummary": job_summary(job, snapshot), "CreateIndex": job.create_index,
           "ModifyIndex": job.modify_index, "JobModifyIndex": job.job_modify_index,
           "SubmitTime": submit_time(job, snapshot)})
}

/// An `AllocMetric`.
pub fn metric(metric: &AllocMetric) -> Value {
    json!({"NodesEvaluated": metric.nodes_evaluated, "NodesFiltered": metric.nodes_filtered,
           "NodesAvailable": metric.nodes_available, "ClassFiltered": metric.class_filtered,
           "ConstraintFiltered": metric.constraint_filtered, "NodesExhausted": metric.nodes_exhausted,
           "ClassExhausted": metric.class_exhausted, "DimensionExhausted": metric.dimension_exhausted,
           "QuotaExhausted": [], "Scores": null, "ScoreMetaData": [], "AllocationTime": 0,
           "CoalescedFailures": metric.coalesced_failures})
}

fn id_text(id: Option<impl std::fmt::Display>) -> String {
    id.map(|id| id.to_string()).unwrap_or_default()
}

/// An `Evaluation`.
pub fn eval(eval: &Evaluation) -> Value {
    let failed: serde_json::Map<String, Value> =
        eval.failed_tg_allocs.iter().map(|(group, m)| (group.clone(), metric(m))).collect();
    let wait = eval.wait_until.map_or(0, |until| until.0.saturating_sub(eval.create_time.0));
    json!({"ID": eval.id.to_string(), "Namespace": &*eval.namespace, "Priority": eval.priority,
           "Type": text(eval.eval_type), "TriggeredBy": nomad_trigger(eval), "JobID": &*eval.job_id,
           "JobModifyIndex": eval.job_modify_index, "NodeID": id_text(eval.node_id), "NodeModifyIndex": 0,
           "DeploymentID": "", "Status": text(eval.status), "StatusDescription": eval.status_description,
           "Wait": wait, "WaitUntil": eval.wait_until.map_or(Value::Null, rfc3339),
           "NextEval": id_text(eval.next_eval), "PreviousEval": id_text(eval.previous_eval),
           "BlockedEval": id_text(eval.blocked_eval),
           "FailedTGAllocs": if failed.is_empty() { Value::Null } else { Value::Object(failed) },
           "ClassEligibility": eval.class_eligibility.iter().map(|(class, ok)| (class.0.to_string(), *ok))
               .collect::<BTreeMap<_, _>>(),
           "QuotaLimitReached": "", "EscapedComputedClass": eval.escaped_computed_class, "AnnotatePlan": false,
           "QueuedAllocations": eval.queued_allocations, "SnapshotIndex": eval.snapshot_index,
           "CreateIndex": eval.create_index, "ModifyIndex": eval.modify_index,
           "CreateTime": ns(eval.create_time), "ModifyTime": ns(eval.modify_time)})
}

/// Nomad's `TriggeredBy` word for Drover's trigger reasons.
fn nomad_trigger(eval: &Evaluation) -> &'static str {
    use engine::structs::TriggerReason::*;
    match eval.triggered_by {
        JobRegister => "job-register",
        JobDeregister => "job-deregister",
        NodeUpdate => "node-update",
        AllocFailure => "alloc-failure",
        JobScaling => "job-scaling",
        JobEvaluate => "job-register",
        RetryFailedAlloc => "alloc-failure",
        FailedFollowUp => "failed-follow-up",
        QueuedAllocs => "queued-allocs",
        MaxDisconnectTimeout => "max-disconnect-timeout",
        Reconnect => "reconnect",
        MaxPlanAttempts => "max-plan-attempts",
        Preemption => "preemption",
    }
}

/// An `AllocListStub`.
pub fn alloc_stub(alloc: &Allocation, snapshot: &Snapshot) -> Value {
    let node_name = snapshot.node(alloc.node_id).map(|node| node.name.clone()).unwrap_or_default();
    json!({"ID": alloc.id.to_string(), "EvalID": alloc.eval_id.to_string(), "Name": alloc.name,
           "Namespace": &*alloc.namespace, "NodeID": alloc.node_id.to_string(), "NodeName": node_name,
           "JobID": &*alloc.job_id, "JobType": text(alloc.job.job_type), "JobVersion": alloc.job.version,
           "TaskGroup": &*alloc.task_group, "DesiredStatus": text(alloc.desired_status),
           "DesiredDescription": alloc.desired_description, "ClientStatus": text(alloc.client_status),
           "ClientDescription": alloc.client_description,
           "DesiredTransition": {"Migrate": null, "Reschedule": null, "ForceReschedule": null},
           "TaskStates": task_states(alloc), "DeploymentStatus": null, "FollowupEvalID": id_text(alloc.follow_up_eval_id),
           "RescheduleTracker": reschedule_tracker(alloc),
           "PreemptedAllocations": alloc.preempted_allocations.iter().map(|id| id.to_string()).collect::<Vec<_>>(),
           "PreemptedByAllocation": id_text(alloc.preempted_by_allocation), "CreateIndex": alloc.create_index, "ModifyIndex": alloc.modify_index,
           "CreateTime": ns(alloc.create_time), "ModifyTime": ns(alloc.modify_time)})
}

/// `TaskStates`: each task's state and events as its client reported them.
fn task_states(alloc: &Allocation) -> Value {
    let states: serde_json::Map<String, Value> = alloc
        .task_states
        .iter()
        .map(|(name, state)| {
            let events: Vec<Value> = state
                .events
                .iter()
                .map(|event| {
                    json!({"Type": event.event_type, "Time": ns(event.time), "DisplayMessage": event.display_message,
                           "Message": event.display_message, "Details": event.details,
                           "ExitCode": event.exit_code.unwrap_or(0), "Signal": event.signal.unwrap_or(0),
                           "FailsTask": event.event_type == engine::structs::TaskEvent::NOT_RESTARTING && state.failed})
                })
                .collect();
            let time = |at: Option<Timestamp>| at.map_or(Value::Null, rfc3339);
            let state = json!({"State": text(state.state), "Failed": state.failed, "Restarts": state.restarts,
                               "LastRestart": time(state.last_restart), "StartedAt": time(state.started_at),
                               "FinishedAt": time(state.finished_at), "Events": events});
            (name.clone(), state)
        })
        .collect();
    Value::Object(states)
}

fn reschedule_tracker(alloc: &Allocation) -> Value {
    if alloc.reschedule_events.is_empty() {
        return Value::Null;
    }
    let events: Vec<Value> = alloc
        .reschedule_events
        .iter()
        .map(|event| {
            json!({"RescheduleTime": ns(event.time), "PrevAllocID": event.prev_alloc_id.to_string(),
                   "PrevNodeID": event.prev_node_id.to_string(), "Delay": event.delay_nanos})
        })
        .collect();
    json!({"Events": events})
}

/// A full `Allocation`: the stub, the job it runs and its resources in
/// the four views Nomad 1.0 fills.
pub fn alloc(alloc: &Allocation, snapshot: &Snapshot) -> Value {
    let mut value = alloc_stub(alloc, snapshot);
    let group = alloc.job.group(&alloc.task_group);
    let task_resources: serde_json::Map<String, Value> = group
        .map(|group| group.tasks.iter().map(|task| (task.name.clone(), resources(task.resources))).collect())
        .unwrap_or_default();
    let allocated_tasks: serde_json::Map<String, Value> = group
        .map(|group| {
            group
                .tasks
                .iter()
                .map(|task| {
                    (
                        task.name.clone(),
                        json!({"Cpu": {"CpuShares": task.resources.cpu},
                                               "Memory": {"MemoryMB": task.resources.memory_mb},
                                               "Networks": null, "Devices": null}),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let extra = json!({"Job": job(&alloc.job, snapshot), "Resources": resources(alloc.resources),
        "SharedResources": {"DiskMB": alloc.resources.disk_mb, "Networks": null},
        "TaskResources": task_resources,
        "AllocatedResources": {"Tasks": allocated_tasks, "TaskLifecycles": null,
                               "Shared": {"Networks": null, "DiskMB": alloc.resources.disk_mb,
                                          "Ports": alloc.ports.iter().map(|port| json!({"Label": &*port.label,
                                              "Value": port.value, "To": port.to, "HostIP": &*port.host_ip}))
                                              .collect::<Vec<_>>()}},
        "Metrics": metric(&AllocMetric::default()), "AllocModifyIndex": alloc.modify_index,
        "PreviousAllocation": id_text(alloc.previous_allocation), "NextAllocation": id_text(alloc.next_allocation),
        "DeploymentID": ""});
    if let (Value::Object(fields), Value::Object(more)) = (&mut value, extra) {
        fields.extend(more);
    }
    value
}

fn drivers(node: &Node) -> Value {
    node.attributes
        .iter()
        .filter_map(|(key, value)| {
            let name = key.strip_prefix("driver.").filter(|name| !name.contains('.'))?;
            let detected = value != "0" && value != "false";
            Some((
                name.to_string(),
                json!({"Attributes": null, "Detected": detected, "Healthy": detected,
                                           "HealthDescription": "", "UpdateTime": null}),
            ))
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

fn eligibility(node: &Node) -> Value {
    text(node.eligibility)
}

/// A `NodeListStub`.
pub fn node_stub(node: &Node) -> Value {
    json!({"Address": node.attributes.get("unique.network.ip-address").cloned().unwrap_or_default(),
           "ID": node.id.to_string(), "Datacenter": &*node.datacenter, "Name": node.name,
           "NodeClass": &*node.node_class, "Version": node.attributes.get("drover.version").cloned().unwrap_or_default(),
           "Drain": false, "SchedulingEligibility": eligibility(node), "Status": text(node.status),
           "StatusDescription": "", "Drivers": drivers(node), "HostVolumes": null,
           "CreateIndex": node.create_index, "ModifyIndex": node.modify_index})
}

/// A full `Node` (its secret is never answered).
pub fn node(node: &Node) -> Value {
    let (total, reserved) = (node.resources, node.reserved);
    json!({"ID": node.id.to_string(), "SecretID": "", "Datacenter": &*node.datacenter, "Name": node.name,
           "HTTPAddr": node.attributes.get("unique.advertise.http").cloned().unwrap_or_default(),
           "TLSEnabled": false, "Attributes": node.attributes,
           "NodeResources": {"Cpu": {"CpuShares": total.cpu}, "Memory": {"MemoryMB": total.memory_mb},
                             "Disk": {"DiskMB": total.disk_mb}, "Networks": null, "NodeNetworks": null,
                             "Devices": null},
           "ReservedResources": {"Cpu": {"CpuShares": reserved.cpu}, "Memory": {"MemoryMB": reserved.memory_mb},
                                 "Disk": {"DiskMB": reserved.disk_mb}, "Networks": {"ReservedHostPorts": ""}},
           "Resources": resources(total), "Reserved": resources(reserved), "Links": null, "Meta": node.meta,
           "NodeClass": &*node.node_class, "ComputedClass": node.computed_class.0.to_string(), "Drain": false,
           "DrainStrategy": null, "SchedulingEligibility": eligibility(node), "Status": text(node.status),
           "StatusDescription": "", "StatusUpdatedAt": 0, "Events": [], "Drivers": drivers(node),
           "HostVolumes": null, "CSIControllerPlugins": null, "CSINodePlugins": null,
           "CreateIndex": node.create_index, "ModifyIndex": node.modify_index})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(rfc3339(Timestamp(0)), Value::Null);
        assert_eq!(rfc3339(Timestamp(1_700_000_000_123_456_789)), json!("2023-11-14T22:13:20.123456789Z"));
        assert_eq!(rfc3339(Timestamp(951_782_400_000_000_000)), json!("2000-02-29T00:00:00.000000000Z"));
    }
}
