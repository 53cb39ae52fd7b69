//! How each [`Command`] changes a [`Snapshot`]. Only the store's writer calls
//! this, on a private clone that is published only if the whole command
//! applied: a command that fails changes nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::command::{ClientAllocUpdate, Command};
use super::snapshot::{index_add, index_remove, Snapshot};
use super::{Applied, CapacityChange, StateError};
use crate::clock::Timestamp;
use crate::structs::{
    AclPolicy, AclToken, AllocHealth, AllocId, Allocation, ClientStatus, DesiredStatus, DrainMetadata, DrainStatus,
    DrainStrategy, EvalId, Evaluation, Job, JobKey, Namespace, Node, NodeEligibility, NodeHold, NodeId, NodeStatus,
    Resources, SchedulerConfiguration, DEFAULT_NAMESPACE,
};

impl Snapshot {
    /// Applies `command` at `index`, recording what followers of the store
    /// (broker, blocked evals) need to hear about in `applied`.
    pub(super) fn apply(&mut self, index: u64, command: Command, applied: &mut Applied) -> Result<(), StateError> {
        let deployments = self.table_indexes.deployments;
        let outcome = self.apply_command(index, command, applied);
        applied.deployments_changed = self.table_indexes.deployments != deployments;
        outcome
    }

    fn apply_command(&mut self, index: u64, command: Command, applied: &mut Applied) -> Result<(), StateError> {
        self.index = index;
        match command {
            Command::UpsertNode { node, evals } => {
                self.upsert_node(index, node, applied)?;
                self.upsert_evals(index, evals, applied);
                Ok(())
            }
            Command::UpdateNodeStatus { node_id, status, evals, time } => {
                self.update_node_status(index, node_id, status, time, false, applied)?;
                self.upsert_evals(index, evals, applied);
                Ok(())
            }
            Command::MissHeartbeat { node_id, evals, time, release_at } => {
                let status = self.status_after_missed_heartbeat(node_id, release_at.is_some())?;
                self.update_node_status(index, node_id, status, time, true, applied)?;
                if let Some(release_at) = release_at {
                    self.hold_node(node_id, NodeHold { since: time, release_at });
                }
                self.upsert_evals(index, evals, applied);
                Ok(())
            }
            Command::UpdateNodeEligibility { node_id, eligibility, evals } => {
                self.update_node_eligibility(index, node_id, eligibility, applied)?;
                self.upsert_evals(index, evals, applied);
                Ok(())
            }
            Command::UpdateNodeDrain { node_id, drain, mark_eligible, complete, meta, accessor_id, evals, time } => {
                let change = DrainChange { drain, mark_eligible, complete, meta, accessor_id, time };
                self.update_node_drain(index, node_id, change, applied)?;
                applied.drains_changed = true;
                self.upsert_evals(index, evals, applied);
                Ok(())
            }
            Command::RegisterJob { job, eval } => {
                if !self.has_namespace(&job.namespace) {
                    return Err(StateError::UnknownNamespace(job.namespace.to_string()));
                }
                let job = self.register_job(index, job);
                self.upsert_evals(index, eval.into_iter().map(|eval| with_job_index(eval, &job)).collect(), applied);
                applied.job = Some(job);
                Ok(())
            }
            Command::SetJobStability { key, version, stable } => self.set_job_stability(index, &key, version, stable),
            Command::DeregisterJob { job, purge, eval } => {
                applied.job = self.deregister_job(index, &job, purge)?;
                self.upsert_evals(index, eval.into_iter().collect(), applied);
                Ok(())
            }
            Command::UpsertEvals { evals } => {
                self.upsert_evals(index, evals, applied);
                Ok(())
            }
            Command::UpdateAllocsFromClient { updates, evals, time } => {
                self.update_allocs_from_client(index, &updates, time, applied)?;
                self.upsert_evals(index, evals, applied);
                Ok(())
            }
            Command::ApplyPlanResults { eval_id, allocs, evals, deployment, deployment_updates, time } => {
                if let Some(deployment) = deployment {
                    self.upsert_plan_deployment(index, deployment, time);
                }
                self.apply_plan_results(index, eval_id, allocs, time, applied)?;
                self.apply_deployment_updates(index, deployment_updates, time);
                self.upsert_evals(index, evals, applied);
                Ok(())
            }
            Command::UpdateDeploymentStatus { update, job, eval, time } => {
                self.update_deployment_status(index, update, time)?;
                self.register_with_eval(index, job, eval, applied);
                Ok(())
            }
            Command::PromoteDeployment { deployment_id, groups, eval, time } => {
                self.promote_deployment(index, deployment_id, &groups, time)?;
                self.upsert_evals(index, eval.into_iter().collect(), applied);
                Ok(())
            }
            Command::SetAllocHealth { deployment_id, healthy, unhealthy, update, job, eval, time } => {
                self.set_alloc_health(index, deployment_id, &healthy, &unhealthy, time)?;
                if let Some(update) = update {
                    self.update_deployment_status(index, update, time)?;
                }
                self.register_with_eval(index, job, eval, applied);
                Ok(())
            }
            Command::SetSchedulerConfig { config, cas_index } => {
                self.set_scheduler_config(index, config, cas_index, applied)
            }
            Command::AclBootstrap { token } => {
                if let Some(done) = self.acl.bootstrap_index {
                    return Err(StateError::AclBootstrapped(done));
                }
                self.upsert_acl_tokens(index, vec![token])?;
                Arc::make_mut(&mut self.acl).bootstrap_index = Some(index);
                Ok(())
            }
            Command::UpsertAclPolicies { policies } => {
                self.upsert_acl_policies(index, policies);
                Ok(())
            }
            Command::DeleteAclPolicies { names } => self.delete_acl_policies(&names),
            Command::UpsertAclTokens { tokens } => self.upsert_acl_tokens(index, tokens),
            Command::DeleteAclTokens { accessor_ids } => self.delete_acl_tokens(&accessor_ids),
            Command::AclBootstrapReset { token, reset_index } => {
                match self.acl.bootstrap_index {
                    Some(done) if done != reset_index => return Err(StateError::AclBootstrapped(done)),
                    _ => {}
                }
                self.upsert_acl_tokens(index, vec![token])?;
                Arc::make_mut(&mut self.acl).bootstrap_index = Some(index);
                Ok(())
            }
            Command::StopAlloc { alloc_id, eval, time } => {
                self.stop_alloc(index, alloc_id, time, applied)?;
                self.upsert_evals(index, vec![eval], applied);
                Ok(())
            }
            Command::UpsertServiceRegistrations { registrations } => {
                self.upsert_service_registrations(index, registrations, applied);
                Ok(())
            }
            Command::DeleteServiceRegistration { namespace, id } => {
                self.delete_service_registration(index, &namespace, &id)
            }
            Command::DeleteServiceRegistrationsOfAllocs { alloc_ids } => {
                self.delete_alloc_service_registrations(index, &alloc_ids);
                Ok(())
            }
            Command::GarbageCollect { collection } => {
                self.garbage_collect(index, &collection, applied);
                Ok(())
            }
            Command::DeleteEvals { eval_ids } => self.delete_evals(index, &eval_ids, applied),
            Command::PurgeNode { node_id, evals, time } => {
                self.purge_node(index, node_id, time, applied)?;
                self.upsert_evals(index, evals, applied);
                Ok(())
            }
            Command::LaunchPeriodicJob { parent, child, eval, launch, force } => {
                self.record_launch(index, &parent, launch, force)?;
                self.register_with_eval(index, Some(child), eval, applied);
                Ok(())
            }
            Command::UpsertNamespaces { namespaces } => self.upsert_namespaces(index, namespaces),
            Command::DeleteNamespaces { names } => self.delete_namespaces(index, &names),
        }
    }

    /// Writes namespaces ([`Command::UpsertNamespaces`]).
    fn upsert_namespaces(&mut self, index: u64, namespaces: Vec<Namespace>) -> Result<(), StateError> {
        if let Some(problem) = namespaces.iter().find_map(Namespace::problem) {
            return Err(StateError::InvalidNamespace(problem));
        }
        let stored = Arc::make_mut(&mut self.namespaces);
        for mut namespace in namespaces {
            namespace.create_index = stored.get(&namespace.name).map_or(index, |old| old.create_index);
            namespace.modify_index = index;
            stored.insert(namespace.name.clone(), namespace);
        }
        self.table_indexes.namespaces = index;
        Ok(())
    }

    /// Deletes namespaces ([`Command::DeleteNamespaces`]).
    fn delete_namespaces(&mut self, index: u64, names: &[String]) -> Result<(), StateError> {
        for name in names {
            if name == DEFAULT_NAMESPACE {
                return Err(StateError::DefaultNamespace);
            }
            if !self.namespaces.contains_key(name) {
                return Err(StateError::UnknownNamespace(name.clone()));
            }
            let jobs = self.jobs.values().filter(|job| *job.namespace == **name).count();
            if jobs > 0 {
                return Err(StateError::NamespaceInUse { name: name.clone(), jobs });
            }
        }
        let stored = Arc::make_mut(&mut self.namespaces);
        for name in names {
            stored.remove(name);
        }
        self.table_indexes.namespaces = index;
        Ok(())
    }

    /// Registers a job (when given) and writes the eval, which takes the
    /// stored job's index when there is one.
    fn register_with_eval(&mut self, index: u64, job: Option<Job>, eval: Option<Evaluation>, applied: &mut Applied) {
        let stored = job.map(|job| self.register_job(index, job));
        let evals = eval.into_iter().map(|eval| match &stored {
            Some(job) => with_job_index(eval, job),
            None => eval,
        });
        self.upsert_evals(index, evals.collect(), applied);
        if stored.is_some() {
            applied.job = stored;
        }
    }

    /// Marks an allocation desired `stop` ([`Command::StopAlloc`]).
    fn stop_alloc(
        &mut self,
        index: u64,
        alloc_id: AllocId,
        time: Timestamp,
        applied: &mut Applied,
    ) -> Result<(), StateError> {
        let existing = self.allocs.get(&alloc_id).ok_or(StateError::UnknownAlloc(alloc_id))?.clone();
        if existing.server_terminal() {
            return Ok(());
        }
        let mut alloc = Allocation::clone(&existing);
        alloc.desired_status = DesiredStatus::Stop;
        alloc.desired_description = Allocation::STOPPED_BY_OPERATOR.to_string();
        alloc.modify_index = index;
        alloc.modify_time = time;
        if !existing.terminal() {
            self.note_freed_capacity(alloc.node_id, applied);
        }
        applied.touch(alloc.node_id);
        self.forget_services_if_ended(index, &alloc);
        self.put_alloc(alloc);
        self.table_indexes.allocs = index;
        Ok(())
    }

    fn upsert_acl_policies(&mut self, index: u64, policies: Vec<AclPolicy>) {
        let acl = Arc::make_mut(&mut self.acl);
        for mut policy in policies {
            policy.create_index = acl.policies.get(&policy.name).map_or(index, |stored| stored.create_index);
            policy.modify_index = index;
            acl.policies.insert(policy.name.clone(), policy);
        }
    }

    fn delete_acl_policies(&mut self, names: &[String]) -> Result<(), StateError> {
        if let Some(missing) = names.iter().find(|name| !self.acl.policies.contains_key(*name)) {
            return Err(StateError::UnknownAclPolicy(missing.clone()));
        }
        let acl = Arc::make_mut(&mut self.acl);
        for name in names {
            acl.policies.remove(name);
        }
        Ok(())
    }

    fn upsert_acl_tokens(&mut self, index: u64, tokens: Vec<AclToken>) -> Result<(), StateError> {
        for token in &tokens {
            if let Some(missing) = token.policies.iter().find(|name| !self.acl.policies.contains_key(*name)) {
                return Err(StateError::UnknownAclPolicy(missing.clone()));
            }
            let holder = self.acl.by_secret.get(&token.secret_id);
            if holder.is_some_and(|holder| *holder != token.accessor_id) {
                return Err(StateError::DuplicateAclSecret(token.accessor_id));
            }
        }
        let acl = Arc::make_mut(&mut self.acl);
        for mut token in tokens {
            if let Some(stored) = acl.tokens.get(&token.accessor_id) {
                token.create_index = stored.create_index;
                acl.by_secret.remove(&stored.secret_id);
            } else {
                token.create_index = index;
            }
            token.modify_index = index;
            acl.by_secret.insert(token.secret_id, token.accessor_id);
            acl.tokens.insert(token.accessor_id, token);
        }
        Ok(())
    }

    fn delete_acl_tokens(&mut self, accessor_ids: &[uuid::Uuid]) -> Result<(), StateError> {
        if let Some(missing) = accessor_ids.iter().find(|id| !self.acl.tokens.contains_key(*id)) {
            return Err(StateError::UnknownAclToken(*missing));
        }
        let acl = Arc::make_mut(&mut self.acl);
        for accessor in accessor_ids {
            if let Some(token) = acl.tokens.remove(accessor) {
                acl.by_secret.remove(&token.secret_id);
            }
        }
        Ok(())
    }

    fn set_scheduler_config(
        &mut self,
        index: u64,
        mut config: SchedulerConfiguration,
        cas_index: Option<u64>,
        applied: &mut Applied,
    ) -> Result<(), StateError> {
        let stored = self.scheduler_config.map_or(0, |stored| stored.modify_index);
        if let Some(expected) = cas_index.filter(|expected| *expected != stored) {
            return Err(StateError::ConfigIndexMismatch { expected, stored });
        }
        config.create_index = self.scheduler_config.map_or(index, |stored| stored.create_index);
        config.modify_index = index;
        self.scheduler_config = Some(config);
        applied.pause_eval_broker = Some(config.pause_eval_broker);
        Ok(())
    }

    /// Stores a registration. A known node keeps what the servers decide
    /// for it, whatever the client sent: its status, its scheduling
    /// eligibility (an operator's `node eligibility -disable` outlives the
    /// client's next registration, as Nomad keeps `SchedulingEligibility`)
    /// and the indexes of its history.
    fn upsert_node(&mut self, index: u64, mut node: Node, applied: &mut Applied) -> Result<(), StateError> {
        node.computed_class = node.compute_class();
        node.modify_index = index;
        match self.nodes.get(&node.id).cloned() {
            Some(existing) => {
                node.status = existing.status;
                node.eligibility = existing.eligibility;
                node.drain = existing.drain.clone();
                node.create_index = existing.create_index;
                node.last_missed_heartbeat_index = existing.last_missed_heartbeat_index;
                node.last_alloc_update_index = existing.last_alloc_update_index;
                node.status_updated_at = existing.status_updated_at;
                node.allocs_removed_index = existing.allocs_removed_index;
                node.hold = existing.hold;
                if existing.computed_class != node.computed_class {
                    index_remove(&mut self.nodes_by_class, &existing.computed_class, &node.id);
                    index_add(&mut self.nodes_by_class, node.computed_class, node.id);
                    if node.is_schedulable() {
                        applied.capacity_changes.push(CapacityChange::of(&node));
                    }
                }
            }
            None => {
                node.create_index = index;
                index_add(&mut self.nodes_by_class, node.computed_class, node.id);
                if node.is_schedulable() {
                    applied.capacity_changes.push(CapacityChange::of(&node));
                }
            }
        }
        self.put_node(node);
        self.table_indexes.nodes = index;
        Ok(())
    }

    fn update_node_status(
        &mut self,
        index: u64,
        node_id: NodeId,
        status: NodeStatus,
        time: Timestamp,
        missed_heartbeat: bool,
        applied: &mut Applied,
    ) -> Result<(), StateError> {
        let existing = self.nodes.get(&node_id).ok_or(StateError::UnknownNode(node_id))?;
        let was_schedulable = existing.is_schedulable();
        let mut node = Node::clone(existing);
        if node.status != status {
            node.status_updated_at = time;
            node.hold = None;
        }
        node.status = status;
        node.modify_index = index;
        if missed_heartbeat {
            node.last_missed_heartbeat_index = index;
        }
        if !was_schedulable && node.is_schedulable() {
            applied.capacity_changes.push(CapacityChange::of(&node));
        }
        // A node marked down loses its service registrations; a
        // disconnected one keeps them, as in Nomad (`services.rs`).
        if status == NodeStatus::Down {
            self.forget_services_of_node(index, node_id);
        }
        self.put_node(node);
        self.table_indexes.nodes = index;
        Ok(())
    }

    /// `disconnected` when the storm guard holds the node or a live
    /// allocation on it tolerates it, else `down`.
    fn status_after_missed_heartbeat(&self, node_id: NodeId, held: bool) -> Result<NodeStatus, StateError> {
        let node = self.nodes.get(&node_id).ok_or(StateError::UnknownNode(node_id))?;
        if node.status.is_terminal_for_scheduling() {
            return Err(StateError::NodeNotConnected { node_id, status: node.status });
        }
        if held {
            return Ok(NodeStatus::Disconnected);
        }
        let tolerates = |alloc: &Allocation| {
            alloc.job.group(&alloc.task_group).is_some_and(|group| group.max_client_disconnect.is_some())
        };
        let disconnect = self.allocs_by_node(node_id).any(|alloc| !alloc.terminal() && tolerates(alloc));
        Ok(if disconnect { NodeStatus::Disconnected } else { NodeStatus::Down })
    }

    /// Records the storm guard's hold on a node just marked `disconnected`.
    fn hold_node(&mut self, node_id: NodeId, hold: NodeHold) {
        if let Some(existing) = self.nodes.get(&node_id) {
            let mut node = Node::clone(existing);
            node.hold = Some(hold);
            self.put_node(node);
        }
    }

    fn update_node_eligibility(
        &mut self,
        index: u64,
        node_id: NodeId,
        eligibility: NodeEligibility,
        applied: &mut Applied,
    ) -> Result<(), StateError> {
        let existing = self.nodes.get(&node_id).ok_or(StateError::UnknownNode(node_id))?;
        if existing.is_draining() && eligibility == NodeEligibility::Eligible {
            return Err(StateError::NodeDraining(node_id));
        }
        let was_schedulable = existing.is_schedulable();
        let mut node = Node::clone(existing);
        node.eligibility = eligibility;
        self.put_changed_node(index, node, was_schedulable, applied);
        Ok(())
    }

    /// Stores an operator's change of `node` at `index`: capacity appears
    /// where it became schedulable.
    fn put_changed_node(&mut self, index: u64, mut node: Node, was_schedulable: bool, applied: &mut Applied) {
        node.modify_index = index;
        if !was_schedulable && node.is_schedulable() {
            applied.capacity_changes.push(CapacityChange::of(&node));
        }
        self.put_node(node);
        self.table_indexes.nodes = index;
    }

    /// A node's drain starts, changes or ends ([`Command::UpdateNodeDrain`]).
    /// A changed drain keeps its start; the node's drain record follows.
    fn update_node_drain(
        &mut self,
        index: u64,
        node_id: NodeId,
        change: DrainChange,
        applied: &mut Applied,
    ) -> Result<(), StateError> {
        let existing = self.nodes.get(&node_id).ok_or(StateError::UnknownNode(node_id))?;
        if change.complete && !existing.is_draining() {
            return Err(StateError::NodeNotDraining(node_id));
        }
        let was_schedulable = existing.is_schedulable();
        let mut node = Node::clone(existing);
        let started_at = node.drain.strategy.as_ref().map(|drain| drain.started_at);
        let record = node.drain.last.take().filter(|_| started_at.is_some());
        let meta = match change.meta.is_empty() {
            true => record.as_ref().map(|record| record.meta.clone()).unwrap_or_default(),
            false => change.meta,
        };
        let (status, eligibility) = match (&change.drain, change.complete) {
            (Some(_), _) => (DrainStatus::Draining, NodeEligibility::Ineligible),
            (None, true) => (DrainStatus::Complete, NodeEligibility::Ineligible),
            (None, false) if change.mark_eligible => (DrainStatus::Canceled, NodeEligibility::Eligible),
            (None, false) => (DrainStatus::Canceled, node.eligibility),
        };
        node.drain.strategy = change.drain.map(|mut drain| {
            drain.started_at = started_at.unwrap_or(drain.started_at);
            drain
        });
        node.drain.last = match (started_at, status) {
            // Ending a drain that is not under way leaves the last record be.
            (None, DrainStatus::Canceled) => existing.drain.last.clone(),
            _ => Some(DrainMetadata {
                started_at: started_at.unwrap_or(change.time),
                updated_at: change.time,
                status,
                accessor_id: change.accessor_id,
                meta,
            }),
        };
        node.eligibility = eligibility;
        self.put_changed_node(index, node, was_schedulable, applied);
        Ok(())
    }

    /// Stores the job, bumping its version when the spec changed, keeps
    /// the version (`job_versions.rs`), and returns it as stored. A new
    /// version is never stable; a resubmission of the same spec keeps the
    /// stored version's stability.
    fn register_job(&mut self, index: u64, mut job: Job) -> Arc<Job> {
        job.modify_index = index;
        match self.jobs.get(&job.key()) {
            Some(existing) if same_spec(existing, &job) => {
                job.version = existing.version;
                job.stable = existing.stable;
                job.submit_time = existing.submit_time;
                job.create_index = existing.create_index;
                job.job_modify_index = existing.job_modify_index;
            }
            Some(existing) => {
                job.version = existing.version + 1;
                job.stable = false;
                job.create_index = existing.create_index;
                job.job_modify_index = index;
            }
            None => {
                job.version = 0;
                job.stable = false;
                job.create_index = index;
                job.job_modify_index = index;
            }
        }
        let job = Arc::new(job);
        self.jobs.insert(job.key(), job.clone());
        self.track_periodic(index, &job);
        self.record_job_version(&job);
        self.table_indexes.jobs = index;
        job
    }

    /// Stops the job (or removes it with `purge`) and returns it as stored
    /// (none when purged).
    fn deregister_job(&mut self, index: u64, key: &JobKey, purge: bool) -> Result<Option<Arc<Job>>, StateError> {
        let existing = self.jobs.get(key).ok_or_else(|| StateError::UnknownJob(key.clone()))?.clone();
        let stored = if purge {
            self.jobs.remove(key);
            self.forget_job_versions(key);
            self.forget_periodic(key);
            None
        } else if existing.stop {
            Some(existing)
        } else {
            let mut stopped = Job::clone(&existing);
            stopped.stop = true;
            Some(self.register_job(index, stopped))
        };
        self.table_indexes.jobs = index;
        Ok(stored)
    }

    fn upsert_evals(&mut self, index: u64, evals: Vec<Evaluation>, applied: &mut Applied) {
        if evals.is_empty() {
            return;
        }
        for mut eval in evals {
            eval.modify_index = index;
            match self.evals.get(&eval.id) {
                Some(existing) => eval.create_index = existing.create_index,
                None => {
                    eval.create_index = index;
                    index_add(&mut self.evals_by_job, eval.job_key(), eval.id);
                }
            }
            let eval = Arc::new(eval);
            self.evals.insert(eval.id, eval.clone());
            applied.evals.push(eval);
        }
        self.table_indexes.evals = index;
    }

    fn update_allocs_from_client(
        &mut self,
        index: u64,
        updates: &[ClientAllocUpdate],
        time: Timestamp,
        applied: &mut Applied,
    ) -> Result<(), StateError> {
        applied.reported_by_clients = true;
        for update in updates {
            let existing = match self.check_client_update(update) {
                Ok(existing) => existing,
                Err(error) => {
                    applied.refused_updates.push((update.alloc_id, error));
                    continue;
                }
            };
            let was_terminal = existing.terminal();
            let mut alloc = Allocation::clone(&existing);
            alloc.set_client_status(update.client_status, &update.client_description, time);
            if !update.task_states.is_empty() {
                alloc.task_states.clone_from(&update.task_states);
            }
            if let Some(checks) = &update.checks {
                alloc.checks.clone_from(checks);
            }
            // A verdict repeated by later reports keeps the index it was first stored at.
            if let Some(health) = &update.health {
                if alloc.health.as_ref().is_none_or(|stored| stored.healthy != health.healthy) {
                    alloc.health = Some(AllocHealth { modify_index: index, ..health.clone() });
                }
            }
            alloc.modify_index = index;
            alloc.modify_time = time;
            if !was_terminal && alloc.terminal() {
                self.note_freed_capacity(alloc.node_id, applied);
            }
            applied.touch(alloc.node_id);
            self.forget_services_if_ended(index, &alloc);
            // Still running on its client: what it lists replaces what is
            // stored, also once the servers stopped it (its tasks being
            // killed are deregistered first); only additions are refused then.
            let running_here = !alloc.client_terminal();
            self.count_in_deployment(index, Some(&existing), &alloc, time);
            self.put_alloc(alloc);
            if let (true, Some(services)) = (running_here, &update.services) {
                self.replace_alloc_service_registrations(index, update.alloc_id, services.clone(), applied);
            }
            self.touch_node_alloc_update(index, update.node_id)?;
        }
        self.table_indexes.allocs = index;
        Ok(())
    }

    /// The allocation a client update changes, if the update may be taken.
    fn check_client_update(&self, update: &ClientAllocUpdate) -> Result<Arc<Allocation>, StateError> {
        let node = self.nodes.get(&update.node_id).ok_or(StateError::UnknownNode(update.node_id))?;
        if node.status.is_terminal_for_scheduling() {
            return Err(StateError::NodeNotConnected { node_id: node.id, status: node.status });
        }
        let existing = self.allocs.get(&update.alloc_id).ok_or(StateError::UnknownAlloc(update.alloc_id))?;
        if existing.node_id != update.node_id {
            return Err(StateError::AllocOnOtherNode {
                alloc_id: update.alloc_id,
                reported_by: update.node_id,
                placed_on: existing.node_id,
            });
        }
        // An ended client status is final: once the allocation no longer
        // holds its ports and resources, another may have taken them. (One
        // the servers stopped stays terminal whatever its client says.)
        if existing.client_terminal() && !existing.server_terminal() && !update.client_status.is_terminal() {
            return Err(StateError::AllocEnded { alloc_id: update.alloc_id, status: existing.client_status });
        }
        Ok(existing.clone())
    }

    fn touch_node_alloc_update(&mut self, index: u64, node_id: NodeId) -> Result<(), StateError> {
        let existing = self.nodes.get(&node_id).ok_or(StateError::UnknownNode(node_id))?;
        if existing.last_alloc_update_index != index {
            let mut node = Node::clone(existing);
            node.last_alloc_update_index = index;
            self.put_node(node);
            self.table_indexes.nodes = index;
        }
        Ok(())
    }

    fn apply_plan_results(
        &mut self,
        index: u64,
        eval_id: EvalId,
        allocs: Vec<Allocation>,
        time: Timestamp,
        applied: &mut Applied,
    ) -> Result<(), StateError> {
        for mut alloc in allocs {
            alloc.modify_index = index;
            alloc.modify_time = time;
            let existing = self.allocs.get(&alloc.id).cloned();
            match &existing {
                Some(existing) => {
                    alloc.create_index = existing.create_index;
                    alloc.create_time = existing.create_time;
                    if !matches!(alloc.client_status, ClientStatus::Lost | ClientStatus::Unknown) {
                        alloc.client_status = existing.client_status;
                        alloc.client_description.clone_from(&existing.client_description);
                    }
                    // The client owns its task states, checks and health,
                    // and promotion clears the canary mark; a plan's copy
                    // may be older.
                    alloc.task_states.clone_from(&existing.task_states);
                    alloc.checks.clone_from(&existing.checks);
                    alloc.health.clone_from(&existing.health);
                    alloc.canary = existing.canary && alloc.canary;
                    alloc.client_status_time = existing.client_status_time;
                    // Only the store links a replacement to what it replaces
                    // (below); a plan's copy may predate the link.
                    alloc.next_allocation = alloc.next_allocation.or(existing.next_allocation);
                    if !existing.terminal() && alloc.terminal() {
                        self.note_freed_capacity(alloc.node_id, applied);
                    }
                }
                None => {
                    let node = self
                        .nodes
                        .get(&alloc.node_id)
                        .ok_or(StateError::PlacementOnUnknownNode { eval_id, node_id: alloc.node_id })?;
                    // The applier checked the node, but a heartbeat miss may
                    // have been written since: never place on a node that
                    // left. Nor give a port that is taken: the port index
                    // stays a set of distinct ports per node.
                    if !node.is_schedulable() || self.port_taken(node, &alloc) {
                        applied.refused_placements.push(alloc.id);
                        continue;
                    }
                    alloc.create_index = index;
                    alloc.create_time = time;
                    alloc.client_status_time = time;
                    index_add(&mut self.allocs_by_node, alloc.node_id, alloc.id);
                    index_add(&mut self.allocs_by_job, alloc.job_key(), alloc.id);
                    self.link_previous(index, &alloc, applied);
                }
            }
            applied.touch(alloc.node_id);
            self.forget_services_if_ended(index, &alloc);
            self.count_in_deployment(index, existing.as_deref(), &alloc, time);
            self.put_alloc(alloc);
        }
        self.table_indexes.allocs = index;
        Ok(())
    }

    /// Stores a node, keeping the schedulable-node list in step.
    fn put_node(&mut self, node: Node) {
        let was = self.nodes.get(&node.id).is_some_and(|old| old.is_schedulable());
        match (was, node.is_schedulable()) {
            (false, true) => {
                self.schedulable.insert(node.id);
            }
            (true, false) => {
                self.schedulable.remove(node.id);
            }
            _ => {}
        }
        self.nodes.insert(node.id, Arc::new(node));
    }

    /// Whether a new placement would take a port its node reserves, or one
    /// a live allocation there holds.
    fn port_taken(&self, node: &Node, alloc: &Allocation) -> bool {
        alloc.port_values().any(|port| node.network.reserved_ports.contains(port) || self.port_in_use(node.id, port))
    }

    /// Stores an allocation, keeping its node's usage and ports in step.
    pub(super) fn put_alloc(&mut self, alloc: Allocation) {
        let live = |alloc: &Allocation| if alloc.terminal() { Resources::default() } else { alloc.resources };
        let old = self.allocs.get(&alloc.id).cloned();
        let before = old.as_deref().map(live).unwrap_or_default();
        let after = live(&alloc);
        if before != after {
            // A node without live usage has no row, so a decoded snapshot,
            // which sums the live allocations, rebuilds the same rows.
            let usage = self.node_usage.get(&alloc.node_id).copied().unwrap_or_default().minus(before).plus(after);
            if usage == Resources::default() {
                self.node_usage.remove(&alloc.node_id);
            } else {
                self.node_usage.insert(alloc.node_id, usage);
            }
        }
        let live_ports = |alloc: &Allocation| if alloc.terminal() { Vec::new() } else { alloc.port_values().collect() };
        let (freed, taken) = (old.as_deref().map(live_ports).unwrap_or_default(), live_ports(&alloc));
        if freed != taken {
            self.change_ports(alloc.node_id, &taken, &freed);
        }
        self.allocs.insert(alloc.id, Arc::new(alloc));
    }

    /// Takes `taken` and frees `freed` in a node's port index, dropping the
    /// node's entry when it holds none.
    fn change_ports(&mut self, node_id: NodeId, taken: &[u16], freed: &[u16]) {
        let ports = self.node_ports.get(&node_id).cloned().unwrap_or_default().changed(taken, freed);
        if ports.is_empty() {
            self.node_ports.remove(&node_id);
        } else {
            self.node_ports.insert(node_id, ports);
        }
    }

    /// Points a replaced allocation at its replacement, so it is not
    /// replaced twice.
    fn link_previous(&mut self, index: u64, alloc: &Allocation, applied: &mut Applied) {
        let Some(previous) = alloc.previous_allocation.and_then(|id| self.allocs.get(&id)) else { return };
        if previous.next_allocation != Some(alloc.id) {
            let mut previous = Allocation::clone(previous);
            previous.next_allocation = Some(alloc.id);
            previous.modify_index = index;
            applied.touch(previous.node_id);
            self.put_alloc(previous);
        }
    }

    fn note_freed_capacity(&self, node_id: NodeId, applied: &mut Applied) {
        if let Some(node) = self.nodes.get(&node_id) {
            applied.capacity_changes.push(CapacityChange::of(node));
        }
    }
}

/// Whether two submissions of a job describe the same thing, ignoring what
/// the store and the endpoint set (version, stability, indexes, submit time).
pub fn same_spec(existing: &Job, submitted: &Job) -> bool {
    let mut normalized = submitted.clone();
    normalized.version = existing.version;
    normalized.stable = existing.stable;
    normalized.create_index = existing.create_index;
    normalized.modify_index = existing.modify_index;
    normalized.job_modify_index = existing.job_modify_index;
    normalized.submit_time = existing.submit_time;
    normalized == *existing
}

/// What an [`Command::UpdateNodeDrain`] changes.
struct DrainChange {
    drain: Option<DrainStrategy>,
    mark_eligible: bool,
    complete: bool,
    meta: BTreeMap<String, String>,
    accessor_id: String,
    time: Timestamp,
}

fn with_job_index(mut eval: Evaluation, job: &Job) -> Evaluation {
    eval.job_modify_index = job.job_modify_index;
    eval
}
