//! The allocations a client holds and their rules (the core's module docs,
//! "The allocation rules"): what a push starts, stops and destroys, what a
//! runner's news changes, what is reported, which ended allocations'
//! directories go. Pure, like the rest of the core, which drives it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use engine::clock::Timestamp;
use engine::state::ClientAllocUpdate;
use engine::structs::{
    AllocHealth, AllocId, Allocation, CheckResult, ClientStatus, DesiredStatus, NodeId, ServiceRegistration, TaskState,
};

use super::{count, Action, AgentCounters, AllocEvent, ClientConfig, HeldAlloc, RunnerKind};
use crate::client::drivers::mock;

/// Every allocation the client holds, by id (so reports and actions come
/// in one order, whatever the run).
#[derive(Debug)]
pub(super) struct Allocs {
    node_id: NodeId,
    real_tasks: bool,
    gc_max_allocs: usize,
    held: BTreeMap<AllocId, Held>,
}

/// One allocation on the client.
#[derive(Debug)]
struct Held {
    alloc: Arc<Allocation>,
    status: ClientStatus,
    description: String,
    /// Every task's state (real tasks only).
    task_states: BTreeMap<String, TaskState>,
    /// Its service registrations (real tasks only).
    services: Option<Vec<ServiceRegistration>>,
    /// Its checks' latest results (real tasks only).
    checks: Option<BTreeMap<String, CheckResult>>,
    /// Its health, once decided.
    health: Option<AllocHealth>,
    /// Bumped whenever what is reported changes.
    version: u64,
    /// Whether the servers have `version`.
    reported: bool,
    runner: Runner,
    /// A push showed it `unknown` since it last ran.
    seen_unknown: bool,
    /// When it ended here (garbage collection order).
    terminal_since: Option<Timestamp>,
    /// Its tasks were asked to stop here (by the servers or for their
    /// silence); their runner has not said they ended yet.
    stopping: bool,
}

/// What runs an allocation, as the core tracks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Runner {
    /// Nothing (ended, or never run here).
    None,
    /// The mock driver.
    Mock,
    /// An allocation runner with real tasks.
    Tasks,
}

/// A report to send: the updates, and each allocation's version in it.
pub(super) type Report = (Vec<ClientAllocUpdate>, Vec<(AllocId, u64)>);

impl Allocs {
    pub(super) fn new(config: &ClientConfig) -> Allocs {
        Allocs {
            node_id: config.node_id,
            real_tasks: config.real_tasks,
            gc_max_allocs: config.gc_max_allocs,
            held: BTreeMap::new(),
        }
    }

    /// Holds an allocation whose runner a restarted agent re-attached to.
    pub(super) fn restored(&mut self, alloc: Arc<Allocation>) {
        let mut held = Held::new(alloc, ClientStatus::Pending, Runner::Tasks);
        held.description = "re-attaching after an agent restart".to_string();
        self.held.insert(held.alloc.id, held);
    }

    pub(super) fn get(&self, id: AllocId) -> Option<HeldAlloc<'_>> {
        self.held.get(&id).map(Held::view)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = HeldAlloc<'_>> {
        self.held.values().map(Held::view)
    }

    /// Destroys everything: the servers that forgot the node never knew it.
    pub(super) fn drop_all(&mut self, out: &mut Vec<Action>) {
        for id in std::mem::take(&mut self.held).into_keys() {
            out.push(Action::Destroy(id));
        }
    }

    /// Brings the allocations in line with a push (`allocs` changed, of
    /// `listed`; all of them when `listed` is `None`); counts what the
    /// servers showed of the node's absence. One listed but neither held
    /// nor changed was collected here: it stays gone.
    pub(super) fn push(
        &mut self,
        now: Timestamp,
        allocs: Vec<Arc<Allocation>>,
        listed: Option<Vec<AllocId>>,
        counters: &AgentCounters,
        out: &mut Vec<Action>,
    ) {
        let listed: BTreeSet<AllocId> = match listed {
            Some(listed) => listed.into_iter().collect(),
            None => allocs.iter().map(|alloc| alloc.id).collect(),
        };
        self.held.retain(|id, _| {
            let keep = listed.contains(id);
            if !keep {
                out.push(Action::Destroy(*id));
            }
            keep
        });
        let mut lost_here = false;
        for alloc in allocs {
            match self.held.get_mut(&alloc.id) {
                Some(held) => {
                    lost_here |= alloc.client_status == ClientStatus::Lost
                        && held.alloc.client_status != ClientStatus::Lost
                        && !held.status.is_terminal();
                    held.seen(counters, &alloc);
                    if alloc.desired_status != DesiredStatus::Run && !held.status.is_terminal() {
                        held.stop(now, "stopped by the servers", out);
                    }
                    held.alloc = alloc;
                }
                None if alloc.desired_status == DesiredStatus::Run && !alloc.client_status.is_terminal() => {
                    let held = self.start(now, alloc, out);
                    self.held.insert(held.alloc.id, held);
                }
                None => {
                    // Stopped or finished before this agent ran it: hold it
                    // as the servers have it, nothing to run or report.
                    let mut held = Held::new(alloc.clone(), alloc.client_status, Runner::None);
                    held.task_states.clone_from(&alloc.task_states);
                    held.terminal_since = Some(now);
                    self.held.insert(alloc.id, held);
                }
            }
        }
        if lost_here {
            count(&counters.marked_away, 1);
        }
    }

    /// Starts an allocation new to this agent with the driver its tasks
    /// name: real tasks through an allocation runner, the mock driver's
    /// light path, or failed when this agent does not offer the driver.
    fn start(&self, now: Timestamp, alloc: Arc<Allocation>, out: &mut Vec<Action>) -> Held {
        let tasks = alloc.job.group(&alloc.task_group).map(|group| group.tasks.as_slice()).unwrap_or_default();
        let real = tasks.iter().any(|task| task.driver != mock::DRIVER);
        let mut held = Held::new(alloc.clone(), ClientStatus::Pending, Runner::None);
        held.changed();
        if real && self.real_tasks && tasks.iter().all(|task| task.driver != mock::DRIVER) {
            held.description = "starting tasks".to_string();
            held.runner = Runner::Tasks;
            out.push(Action::Start { alloc, runner: RunnerKind::Tasks });
        } else if real {
            held.status = ClientStatus::Failed;
            held.description = match tasks.iter().find(|task| task.driver != mock::DRIVER) {
                Some(real) if !self.real_tasks => format!("driver {:?} is not enabled on this node", real.driver),
                _ => "driver \"mock\" cannot run beside real drivers in one group".to_string(),
            };
            held.terminal_since = Some(now);
        } else {
            held.runner = Runner::Mock;
            match mock::plan(&alloc) {
                Ok(end) => {
                    held.status = ClientStatus::Running;
                    held.description = "tasks started".to_string();
                    held.health = mock::health(&alloc, now);
                    out.push(Action::Start { alloc, runner: RunnerKind::Mock(end) });
                }
                Err(why) => {
                    held.status = ClientStatus::Failed;
                    held.description = why;
                }
            }
        }
        held
    }

    /// Records a runner's news; reported with the next report.
    pub(super) fn runner_news(&mut self, now: Timestamp, event: AllocEvent) {
        let Some(held) = self.held.get_mut(&event.alloc_id) else { return };
        if held.status.is_terminal() && held.runner != Runner::Tasks {
            return;
        }
        let mock = held.runner == Runner::Mock;
        if mock {
            held.runner = Runner::None;
        }
        if held.status != event.status && event.status.is_terminal() {
            held.terminal_since = Some(now);
        }
        held.status = event.status;
        held.description = event.description;
        held.task_states = event.task_states;
        held.services = event.services;
        held.checks = event.checks;
        held.health = match (mock, event.status) {
            // A mock allocation of a deployment that fails turns unhealthy.
            (true, ClientStatus::Failed) if held.health.is_some() => {
                Some(AllocHealth { healthy: false, timestamp: now, modify_index: 0 })
            }
            (true, _) => held.health.clone(),
            (false, _) => event.health,
        };
        held.changed();
    }

    /// Destroys the oldest ended allocations with real tasks beyond
    /// `gc_max_allocs` (their runners stop any task still running first).
    pub(super) fn collect_garbage(&mut self, out: &mut Vec<Action>) {
        if !self.real_tasks {
            return;
        }
        let mut ended: Vec<(Timestamp, AllocId)> = self
            .held
            .iter()
            .filter(|(_, held)| held.runner == Runner::Tasks && held.status.is_terminal())
            .filter_map(|(id, held)| Some((held.terminal_since?, *id)))
            .collect();
        if ended.len() <= self.gc_max_allocs {
            return;
        }
        ended.sort_unstable();
        let excess = ended.len() - self.gc_max_allocs;
        for (_, id) in ended.into_iter().take(excess) {
            if let Some(held) = self.held.get_mut(&id) {
                held.runner = Runner::None;
                out.push(Action::Destroy(id));
            }
        }
    }

    /// Stops what its group lets run no longer without the servers, out of
    /// touch since `since` (the core's module docs).
    pub(super) fn stop_for_silence(&mut self, now: Timestamp, since: Timestamp, out: &mut Vec<Action>) {
        for held in self.held.values_mut() {
            let Some(allowed) = held.silence_allowed() else { continue };
            if since.plus(allowed) <= now {
                let why = format!(
                    "stopped after {} without the servers (stop_after_client_disconnect)",
                    engine::structs::format_duration(allowed)
                );
                tracing::warn!(alloc = %held.alloc.id, %why, "stopping an allocation the servers have not heard of");
                held.stop(now, &why, out);
            }
        }
    }

    /// When the first allocation is due to stop for the servers' silence,
    /// out of touch since `since`.
    pub(super) fn next_silence_stop(&self, since: Timestamp) -> Option<Timestamp> {
        self.held.values().filter_map(|held| Some(since.plus(held.silence_allowed()?))).min()
    }

    /// Destroys `alloc_id`, or every allocation, that has ended here and
    /// whose directories are still kept (an operator's GC).
    pub(super) fn collect_now(&mut self, alloc_id: Option<AllocId>, out: &mut Vec<Action>) {
        for (id, held) in &mut self.held {
            let asked = alloc_id.is_none_or(|asked| asked == *id);
            if asked && held.runner == Runner::Tasks && held.status.is_terminal() {
                held.runner = Runner::None;
                out.push(Action::Destroy(*id));
            }
        }
    }

    /// Every allocation held must be reported again (the resync).
    pub(super) fn resync(&mut self) {
        for held in self.held.values_mut() {
            held.changed();
        }
    }

    /// Every status the servers do not have yet; `None` when they have all.
    pub(super) fn report(&self) -> Option<Report> {
        let mut sent = Vec::new();
        let updates: Vec<ClientAllocUpdate> = self
            .held
            .values()
            .filter(|held| !held.reported)
            .map(|held| {
                sent.push((held.alloc.id, held.version));
                ClientAllocUpdate {
                    alloc_id: held.alloc.id,
                    node_id: self.node_id,
                    client_status: held.status,
                    client_description: held.description.clone(),
                    services: held.services.clone(),
                    checks: held.checks.clone(),
                    health: held.health.clone(),
                    task_states: held.task_states.clone(),
                }
            })
            .collect();
        (!updates.is_empty()).then_some((updates, sent))
    }

    /// The servers took a report: what it sent is theirs, unless it
    /// changed since.
    pub(super) fn reported(&mut self, sent: Vec<(AllocId, u64)>) {
        for (id, version) in sent {
            if let Some(held) = self.held.get_mut(&id).filter(|held| held.version == version) {
                held.reported = true;
            }
        }
    }
}

impl Held {
    /// An allocation with nothing running and nothing to report.
    fn new(alloc: Arc<Allocation>, status: ClientStatus, runner: Runner) -> Held {
        Held {
            task_states: BTreeMap::new(),
            services: None,
            checks: None,
            health: None,
            alloc,
            status,
            description: String::new(),
            version: 0,
            reported: true,
            runner,
            seen_unknown: false,
            terminal_since: None,
            stopping: false,
        }
    }

    fn view(&self) -> HeldAlloc<'_> {
        HeldAlloc { alloc: &self.alloc, status: self.status, reported: self.reported }
    }

    /// The servers must hear of it (again).
    fn changed(&mut self) {
        self.version += 1;
        self.reported = false;
    }

    /// Counts an allocation this agent runs that the servers showed
    /// `unknown`, and its return.
    fn seen(&mut self, counters: &AgentCounters, alloc: &Allocation) {
        if alloc.client_status == ClientStatus::Unknown && !self.seen_unknown && !self.status.is_terminal() {
            self.seen_unknown = true;
            count(&counters.allocs_seen_unknown, 1);
        } else if alloc.client_status == ClientStatus::Running && self.seen_unknown {
            self.seen_unknown = false;
            count(&counters.allocs_reconnected, 1);
        }
    }

    /// Stops an allocation that has not ended here (the servers stopped
    /// it, or their silence did; `why` says which): its tasks are stopped
    /// once; the mock driver's (or nothing) ends now, real tasks when their
    /// runner says.
    fn stop(&mut self, now: Timestamp, why: &str, out: &mut Vec<Action>) {
        match self.runner {
            Runner::Tasks => {
                if !std::mem::replace(&mut self.stopping, true) {
                    out.push(Action::Stop(self.alloc.id));
                }
                return;
            }
            Runner::Mock => out.push(Action::Stop(self.alloc.id)),
            Runner::None => {}
        }
        self.runner = Runner::None;
        self.status = ClientStatus::Complete;
        self.description = why.to_string();
        self.terminal_since = Some(now);
        self.changed();
    }

    /// How long its group lets it run without the servers, if it runs here.
    fn silence_allowed(&self) -> Option<std::time::Duration> {
        if self.status.is_terminal() || self.stopping || self.runner == Runner::None {
            return None;
        }
        self.alloc.job.group(&self.alloc.task_group)?.stop_after_client_disconnect
    }
}
