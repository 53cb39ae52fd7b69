//! What follows a write: the hooks Nomad's FSM runs after applying a log
//! entry, as the state store's [`ApplyHook`]. The server installs it while
//! it leads, so it runs after every applied command, whoever wrote it:
//! 1. pending evals go to the broker (delayed ones wait there; one a worker
//!    still holds is enqueued again when that worker acks);
//! 2. blocked evals go to the blocked tracker;
//! 3. a complete eval that placed everything untracks its job's blocked eval;
//! 4. capacity changes unblock evals of the node's class and system evals
//!    waiting on the node;
//! 5. a deleted eval that was its job's blocked eval is forgotten (a
//!    deleted eval the broker still holds is acked unscheduled by the
//!    worker that finds it gone);
//! 6. a written scheduler configuration pauses or resumes the broker
//!    (`pause_eval_broker`);
//! 7. a registered periodic job wakes the timer thread, whose periodic
//!    dispatcher computes its next launch.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::clock::SharedClock;
use crate::eval::blocked::BlockedEvals;
use crate::eval::broker::EvalBroker;
use crate::state::{Applied, ApplyHook};
use crate::structs::{EvalStatus, Evaluation};

/// Routes what each applied command did; see the module docs.
#[derive(Debug, Clone)]
pub struct Router {
    broker: Arc<EvalBroker>,
    blocked: Arc<BlockedEvals>,
    /// Woken when a deployment or a drain changed, or an allocation while
    /// a node drains: the timer thread runs the deployment watcher and the
    /// node drainer.
    timers: Option<(SharedClock, Arc<DrainSignals>)>,
}

impl Router {
    /// A router into the given broker and blocked tracker.
    pub fn new(broker: Arc<EvalBroker>, blocked: Arc<BlockedEvals>) -> Self {
        Router { broker, blocked, timers: None }
    }

    /// Also wakes the sleepers on `clock` (the timer thread) whenever a
    /// command changed a deployment or a drain (telling the drainer
    /// through `drains`), or, while a node drains, an allocation.
    pub fn waking_timers(mut self, clock: SharedClock, drains: Arc<DrainSignals>) -> Self {
        self.timers = Some((clock, drains));
        self
    }

    /// Routes an applied command's evals and capacity changes.
    pub fn route(&self, applied: &Applied) {
        if let Some((clock, drains)) = &self.timers {
            if applied.drains_changed {
                drains.changed();
            }
            let drain_moved = !applied.touched_nodes.is_empty() && drains.any_draining();
            let periodic = applied.job.as_ref().is_some_and(|job| job.is_periodic());
            if applied.deployments_changed || applied.drains_changed || drain_moved || periodic {
                clock.wake_sleepers();
            }
        }
        for eval in &applied.evals {
            self.route_eval(eval);
        }
        for change in &applied.capacity_changes {
            self.blocked.unblock(change.computed_class, applied.index);
            self.blocked.unblock_node(change.node_id, applied.index);
        }
        for eval in &applied.deleted_evals {
            self.blocked.forget_deleted(eval);
        }
        if let Some(paused) = applied.pause_eval_broker {
            self.pause_broker(paused);
        }
    }

    /// Pauses or resumes the broker as the scheduler configuration says (step 6).
    pub fn pause_broker(&self, paused: bool) {
        if paused {
            self.broker.pause();
        } else if self.broker.is_paused() {
            self.broker.resume();
        }
    }

    /// Routes one stored eval (steps 1-3).
    pub fn route_eval(&self, eval: &Arc<Evaluation>) {
        match eval.status {
            EvalStatus::Pending => self.broker.enqueue(eval.clone()),
            EvalStatus::Blocked => self.blocked.block(eval.clone()),
            EvalStatus::Complete if eval.failed_tg_allocs.is_empty() && eval.blocked_eval.is_none() => {
                self.blocked.untrack(&eval.job_key());
            }
            EvalStatus::Complete | EvalStatus::Failed | EvalStatus::Canceled => {}
        }
    }
}

impl ApplyHook for Router {
    fn after_apply(&self, applied: &Applied) {
        self.route(applied);
    }
}

/// What the router and the node drainer tell each other: the router says
/// when a drain changed, the drainer says whether any node drains.
#[derive(Debug)]
pub struct DrainSignals {
    /// A drain started, changed or ended (or this server starts leading):
    /// the draining nodes are listed again.
    changed: AtomicBool,
    /// Whether any node drains, as of the last listing: the router wakes
    /// the drainer on every allocation change while one does.
    any_draining: AtomicBool,
}

impl DrainSignals {
    /// Signals for a drainer that has not listed the draining nodes yet.
    pub(crate) fn new() -> Self {
        DrainSignals { changed: AtomicBool::new(true), any_draining: AtomicBool::new(false) }
    }

    /// Whether a drain changed since the last call; clears the flag.
    pub(crate) fn take_changed(&self) -> bool {
        self.changed.swap(false, Ordering::AcqRel)
    }

    /// Records whether any node drains, as of the drainer's listing.
    pub(crate) fn set_any_draining(&self, draining: bool) {
        self.any_draining.store(draining, Ordering::Release);
    }

    /// A drain changed: list the draining nodes again.
    pub fn changed(&self) {
        self.changed.store(true, Ordering::Release);
    }

    /// Whether any node drains, as of the drainer's last listing.
    pub fn any_draining(&self) -> bool {
        self.any_draining.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{ManualClock, SharedClock, Timestamp};
    use crate::eval::broker::BrokerConfig;
    use crate::state::{ClientAllocUpdate, Command, StateStore, Writer};
    use crate::structs::{
        Allocation, ClientStatus, DesiredStatus, DrainDeadline, DrainStrategy, EvalId, Job, JobType, NodeEligibility,
        NodeId, NodeStatus, Resources, TriggerReason,
    };
    use crate::testing::{node, service_registration};

    fn acl_token(name: &str, policies: &[&str]) -> crate::structs::AclToken {
        crate::structs::AclToken {
            accessor_id: uuid::Uuid::from_u128(name.len() as u128 + 1),
            secret_id: uuid::Uuid::from_u128(name.len() as u128 + 1_000),
            name: name.to_string(),
            token_type: crate::structs::AclTokenType::Client,
            policies: policies.iter().map(|name| name.to_string()).collect(),
            create_time: Timestamp(1),
            create_index: 0,
            modify_index: 0,
        }
    }

    fn namespace(name: &str) -> crate::structs::Namespace {
        crate::structs::Namespace { name: name.to_string(), ..crate::structs::Namespace::default() }
    }

    fn acl_policy(name: &str) -> crate::structs::AclPolicy {
        crate::structs::AclPolicy {
            name: name.to_string(),
            description: String::new(),
            rules_text: String::new(),
            rules: crate::structs::AclRules::default(),
            create_index: 0,
            modify_index: 0,
        }
    }

    /// A store whose apply hook is the router, with a writer in front.
    struct Seam {
        writer: Writer,
        broker: Arc<EvalBroker>,
        blocked: Arc<BlockedEvals>,
        job: Arc<Job>,
    }

    impl Seam {
        fn new() -> Seam {
            let clock: SharedClock = ManualClock::new(Timestamp(1));
            let store = Arc::new(StateStore::new());
            let broker = Arc::new(EvalBroker::new(BrokerConfig::default(), clock.clone()));
            let blocked = Arc::new(BlockedEvals::new(broker.clone(), clock));
            store.set_hook(Some(Box::new(Router::new(broker.clone(), blocked.clone()))));
            let writer = Writer::direct(store.clone());
            let spec = Job::new_simple("web", JobType::Service, 1, Resources::new(100, 64, 0));
            writer.write(Command::UpsertNode { node: node(0), evals: vec![] }).expect("node");
            writer.write(Command::RegisterJob { job: spec.clone(), eval: None }).expect("job");
            let job = store.snapshot().job(&spec.key()).expect("job").clone();
            Seam { writer, broker, blocked, job }
        }

        fn eval(&self) -> Evaluation {
            Evaluation::for_job(&self.job, TriggerReason::NodeUpdate, Timestamp(1))
        }

        /// Parks a blocked eval of another job, checked against `node`'s class.
        fn park_blocked(&self, node_id: NodeId) -> Arc<Evaluation> {
            let other = Job::new_simple("waiting", JobType::Service, 1, Resources::new(100, 64, 0));
            let mut blocked = Evaluation::for_job(&other, TriggerReason::QueuedAllocs, Timestamp(1));
            blocked.status = EvalStatus::Blocked;
            let snapshot = self.writer.store().snapshot();
            let class = snapshot.node(node_id).map_or(node(0).compute_class(), |node| node.computed_class);
            blocked.class_eligibility.insert(class, true);
            blocked.snapshot_index = snapshot.index();
            let stored = self.writer.write(Command::UpsertEvals { evals: vec![blocked] }).expect("blocked");
            assert_eq!(self.blocked.stats().total_blocked, 1, "routed to the blocked tracker");
            stored.evals[0].clone()
        }

        fn ready(&self) -> i64 {
            let stats = self.broker.stats();
            stats.total_ready + stats.total_pending
        }

        /// A running deployment of the job, with one allocation placed in it.
        fn deployment(&self) -> (crate::structs::Deployment, Allocation) {
            let mut deployment = crate::structs::Deployment::new(&self.job, 50, Timestamp(2));
            deployment.task_groups.insert("group".into(), crate::structs::DeploymentGroup::default());
            let mut alloc = Allocation::new_placement(&self.job, "group", 0, node(0).id, EvalId::from_u128(9));
            alloc.deployment_id = Some(deployment.id);
            let command = Command::ApplyPlanResults {
                deployment: Some(deployment.clone()),
                deployment_updates: Vec::new(),
                eval_id: EvalId::from_u128(9),
                allocs: vec![alloc.clone()],
                evals: vec![],
                time: Timestamp(2),
            };
            self.writer.write(command).expect("deployed");
            (deployment, alloc)
        }

        fn placed(&self, node_id: NodeId) -> Allocation {
            let mut alloc = Allocation::new_placement(&self.job, "group", 0, node_id, EvalId::from_u128(9));
            alloc.client_status = ClientStatus::Running;
            let command = Command::ApplyPlanResults {
                deployment: None,
                deployment_updates: Vec::new(),
                eval_id: EvalId::from_u128(9),
                allocs: vec![alloc.clone()],
                evals: vec![],
                time: Timestamp(2),
            };
            self.writer.write(command).expect("placed");
            alloc
        }
    }

    /// Every command kind, submitted through the one write seam, and what
    /// the router (the store's apply hook) did with it. The match has no
    /// wildcard: a new kind of command does not compile until it is here.
    #[test]
    fn every_command_kind_through_the_seam_is_followed_by_the_hook() {
        let kinds = [
            "upsert_node",
            "update_node_status",
            "miss_heartbeat",
            "update_node_eligibility",
            "update_node_drain",
            "register_job",
            "deregister_job",
            "upsert_evals",
            "update_allocs_from_client",
            "apply_plan_results",
            "set_scheduler_config",
            "acl_bootstrap",
            "upsert_acl_policies",
            "delete_acl_policies",
            "upsert_acl_tokens",
            "delete_acl_tokens",
            "stop_alloc",
            "upsert_service_registrations",
            "delete_service_registration",
            "delete_service_registrations_of_allocs",
            "set_job_stability",
            "update_deployment_status",
            "promote_deployment",
            "set_alloc_health",
            "garbage_collect",
            "delete_evals",
            "purge_node",
            "launch_periodic_job",
            "upsert_namespaces",
            "delete_namespaces",
        ];
        for kind in kinds {
            let seam = Seam::new();
            let eval = seam.eval();
            let command = match kind {
                "upsert_node" => Command::UpsertNode { node: node(1), evals: vec![eval] },
                "update_node_status" => {
                    let down = Command::UpdateNodeStatus {
                        node_id: node(0).id,
                        status: NodeStatus::Down,
                        evals: vec![],
                        time: Timestamp::ZERO,
                    };
                    seam.writer.write(down).expect("down");
                    Command::UpdateNodeStatus {
                        node_id: node(0).id,
                        status: NodeStatus::Ready,
                        evals: vec![eval],
                        time: Timestamp::ZERO,
                    }
                }
                "miss_heartbeat" => Command::MissHeartbeat {
                    node_id: node(0).id,
                    evals: vec![eval],
                    time: Timestamp::ZERO,
                    release_at: None,
                },
                "update_node_eligibility" => {
                    let off = NodeEligibility::Ineligible;
                    let ineligible =
                        Command::UpdateNodeEligibility { node_id: node(0).id, eligibility: off, evals: vec![] };
                    seam.writer.write(ineligible).expect("ineligible");
                    let on = NodeEligibility::Eligible;
                    Command::UpdateNodeEligibility { node_id: node(0).id, eligibility: on, evals: vec![eval] }
                }
                "update_node_drain" => {
                    let drain = |drain, evals| Command::UpdateNodeDrain {
                        node_id: node(0).id,
                        drain,
                        mark_eligible: true,
                        complete: false,
                        meta: Default::default(),
                        accessor_id: String::new(),
                        evals,
                        time: Timestamp(3),
                    };
                    let forced = DrainStrategy {
                        deadline: DrainDeadline::Force,
                        ignore_system_jobs: false,
                        started_at: Timestamp(2),
                    };
                    seam.writer.write(drain(Some(forced), vec![])).expect("drain");
                    drain(None, vec![eval])
                }
                "register_job" => Command::RegisterJob { job: Job::clone(&seam.job), eval: Some(eval) },
                "deregister_job" => Command::DeregisterJob { job: seam.job.key(), purge: false, eval: Some(eval) },
                "upsert_evals" => Command::UpsertEvals { evals: vec![eval] },
                "update_allocs_from_client" => {
                    let alloc = seam.placed(node(0).id);
                    let failed = ClientAllocUpdate {
                        alloc_id: alloc.id,
                        node_id: alloc.node_id,
                        client_status: ClientStatus::Failed,
                        client_description: String::new(),
                        services: None,
                        checks: None,
                        health: None,
                        task_states: Default::default(),
                    };
                    Command::UpdateAllocsFromClient { updates: vec![failed], evals: vec![eval], time: Timestamp(3) }
                }
                "apply_plan_results" => {
                    let mut stopped = seam.placed(node(0).id);
                    stopped.desired_status = DesiredStatus::Stop;
                    Command::ApplyPlanResults {
                        deployment: None,
                        deployment_updates: Vec::new(),
                        eval_id: EvalId::from_u128(9),
                        allocs: vec![stopped],
                        evals: vec![eval],
                        time: Timestamp(3),
                    }
                }
                "set_scheduler_config" => Command::SetSchedulerConfig {
                    config: crate::structs::SchedulerConfiguration::default(),
                    cas_index: None,
                },
                "acl_bootstrap" => Command::AclBootstrap { token: acl_token("operator", &[]) },
                "upsert_acl_policies" => Command::UpsertAclPolicies { policies: vec![acl_policy("readers")] },
                "delete_acl_policies" => {
                    seam.writer
                        .write(Command::UpsertAclPolicies { policies: vec![acl_policy("old")] })
                        .expect("policy");
                    Command::DeleteAclPolicies { names: vec!["old".into()] }
                }
                "upsert_acl_tokens" => Command::UpsertAclTokens { tokens: vec![acl_token("ci", &[])] },
                "delete_acl_tokens" => {
                    let token = acl_token("gone", &[]);
                    let accessor = token.accessor_id;
                    seam.writer.write(Command::UpsertAclTokens { tokens: vec![token] }).expect("token");
                    Command::DeleteAclTokens { accessor_ids: vec![accessor] }
                }
                "stop_alloc" => {
                    let alloc = seam.placed(node(0).id);
                    Command::StopAlloc { alloc_id: alloc.id, eval, time: Timestamp(3) }
                }
                "upsert_service_registrations" => {
                    let alloc = seam.placed(node(0).id);
                    Command::UpsertServiceRegistrations { registrations: vec![service_registration(&alloc, "web", 80)] }
                }
                "delete_service_registration" => {
                    let registration = service_registration(&seam.placed(node(0).id), "web", 80);
                    let upsert = Command::UpsertServiceRegistrations { registrations: vec![registration.clone()] };
                    seam.writer.write(upsert).expect("registered");
                    Command::DeleteServiceRegistration {
                        namespace: registration.namespace.to_string(),
                        id: registration.id,
                    }
                }
                "delete_service_registrations_of_allocs" => {
                    let alloc = seam.placed(node(0).id);
                    Command::DeleteServiceRegistrationsOfAllocs { alloc_ids: vec![alloc.id] }
                }
                "set_job_stability" => Command::SetJobStability { key: seam.job.key(), version: 0, stable: true },
                "update_deployment_status" => {
                    let (deployment, _) = seam.deployment();
                    let update = crate::structs::DeploymentStatusUpdate {
                        deployment_id: deployment.id,
                        status: crate::structs::DeploymentStatus::Failed,
                        status_description: "Deployment marked as failed".into(),
                    };
                    Command::UpdateDeploymentStatus { update, job: None, eval: Some(eval), time: Timestamp(3) }
                }
                "promote_deployment" => {
                    let (deployment, _) = seam.deployment();
                    let deployment_id = deployment.id;
                    Command::PromoteDeployment { deployment_id, groups: vec![], eval: Some(eval), time: Timestamp(3) }
                }
                "set_alloc_health" => {
                    let (deployment, alloc) = seam.deployment();
                    Command::SetAllocHealth {
                        deployment_id: deployment.id,
                        healthy: vec![alloc.id],
                        unhealthy: vec![],
                        update: None,
                        job: None,
                        eval: Some(eval),
                        time: Timestamp(3),
                    }
                }
                "garbage_collect" => Command::GarbageCollect { collection: crate::state::Collection::default() },
                "delete_evals" => {
                    let config =
                        crate::structs::SchedulerConfiguration { pause_eval_broker: true, ..Default::default() };
                    seam.writer.write(Command::SetSchedulerConfig { config, cas_index: None }).expect("paused");
                    Command::DeleteEvals { eval_ids: vec![EvalId::from_u128(404)] }
                }
                "purge_node" => Command::PurgeNode { node_id: node(0).id, evals: vec![eval], time: Timestamp(3) },
                "launch_periodic_job" => {
                    let mut parent = Job::new_simple("cron", JobType::Batch, 1, Resources::new(1, 1, 0));
                    parent.periodic = Some(crate::structs::PeriodicConfig::cron("@hourly"));
                    seam.writer.write(Command::RegisterJob { job: parent.clone(), eval: None }).expect("periodic");
                    crate::periodic::launch_command(&parent, Timestamp(3), Timestamp(3), false).0
                }
                "upsert_namespaces" => Command::UpsertNamespaces { namespaces: vec![namespace("web")] },
                "delete_namespaces" => {
                    let upsert = Command::UpsertNamespaces { namespaces: vec![namespace("old")] };
                    seam.writer.write(upsert).expect("namespace");
                    Command::DeleteNamespaces { names: vec!["old".into()] }
                }
                other => unreachable!("{other}"),
            };
            let frees_capacity = match &command {
                Command::UpsertNode { .. }
                | Command::UpdateNodeStatus { .. }
                | Command::UpdateNodeEligibility { .. }
                | Command::UpdateNodeDrain { .. }
                | Command::UpdateAllocsFromClient { .. }
                | Command::ApplyPlanResults { .. }
                | Command::StopAlloc { .. } => true,
                Command::MissHeartbeat { .. }
                | Command::RegisterJob { .. }
                | Command::DeregisterJob { .. }
                | Command::UpsertEvals { .. }
                | Command::SetSchedulerConfig { .. }
                | Command::AclBootstrap { .. }
                | Command::UpsertAclPolicies { .. }
                | Command::DeleteAclPolicies { .. }
                | Command::UpsertAclTokens { .. }
                | Command::DeleteAclTokens { .. }
                | Command::AclBootstrapReset { .. }
                | Command::UpsertServiceRegistrations { .. }
                | Command::DeleteServiceRegistration { .. }
                | Command::DeleteServiceRegistrationsOfAllocs { .. }
                | Command::SetJobStability { .. }
                | Command::UpdateDeploymentStatus { .. }
                | Command::PromoteDeployment { .. }
                | Command::SetAllocHealth { .. }
                | Command::GarbageCollect { .. }
                | Command::DeleteEvals { .. }
                | Command::PurgeNode { .. }
                | Command::LaunchPeriodicJob { .. }
                | Command::UpsertNamespaces { .. }
                | Command::DeleteNamespaces { .. } => false,
            };
            // The scheduler configuration, the ACL and service registrations
            // carry no eval; every other kind carries one.
            let carries_eval = !matches!(
                command,
                Command::SetSchedulerConfig { .. }
                    | Command::AclBootstrap { .. }
                    | Command::UpsertAclPolicies { .. }
                    | Command::DeleteAclPolicies { .. }
                    | Command::UpsertAclTokens { .. }
                    | Command::DeleteAclTokens { .. }
                    | Command::AclBootstrapReset { .. }
                    | Command::UpsertServiceRegistrations { .. }
                    | Command::DeleteServiceRegistration { .. }
                    | Command::DeleteServiceRegistrationsOfAllocs { .. }
                    | Command::SetJobStability { .. }
                    | Command::GarbageCollect { .. }
                    | Command::DeleteEvals { .. }
                    | Command::UpsertNamespaces { .. }
                    | Command::DeleteNamespaces { .. }
            );
            let parked = seam.park_blocked(if kind == "upsert_node" { node(1).id } else { node(0).id });
            let ready_before = seam.ready();
            seam.writer.write(command).unwrap_or_else(|error| panic!("{kind}: {error}"));
            assert_eq!(
                seam.ready() - ready_before,
                i64::from(carries_eval) + i64::from(frees_capacity),
                "{kind}: its eval reached the broker"
            );
            let still_blocked = seam.blocked.blocked_eval_of(&parked.job_key()).is_some();
            assert_eq!(still_blocked, !frees_capacity, "{kind}: new capacity unblocks");
        }
    }

    #[test]
    fn an_eval_reblocked_while_held_runs_again_after_the_ack() {
        let seam = Seam::new();
        let parked = seam.park_blocked(node(0).id);
        // Capacity unblocks it; a worker takes it and, still short, reblocks it.
        seam.blocked.unblock(parked.class_eligibility.keys().next().copied().expect("a class"), 1_000);
        let held = seam.broker.try_dequeue(&[JobType::Service]).expect("running").expect("unblocked");
        let mut reblocked = Evaluation::clone(&held.eval);
        reblocked.snapshot_index = 1_000;
        seam.writer.write(Command::UpsertEvals { evals: vec![reblocked] }).expect("reblocked through the seam");
        // More capacity comes while the worker still holds it.
        seam.blocked.unblock(parked.class_eligibility.keys().next().copied().expect("a class"), 1_001);
        assert!(seam.broker.try_dequeue(&[JobType::Service]).expect("running").is_none(), "held: not handed out twice");
        seam.broker.ack(held.eval.id, held.token).expect("ack");
        let again = seam.broker.try_dequeue(&[JobType::Service]).expect("running").expect("enqueued again on the ack");
        assert_eq!(again.eval.id, parked.id);
    }
}
