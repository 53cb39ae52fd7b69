//! The client core alone: no socket, no thread, a manual clock. Each test
//! plays the runtime, answering the core's calls as a server would.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use engine::clock::Timestamp;
use engine::structs::{
    AllocId, Allocation, ClientStatus, ConfigValue, DesiredStatus, EvalId, Job, JobType, NodeId, NodeStatus, Resources,
    RAW_EXEC,
};

use super::*;
use crate::client::drivers::mock;

const NODE: NodeId = NodeId::from_u128(7);
const TTL: Duration = Duration::from_secs(10);

fn server(n: u8) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, n], 4647))
}

fn config() -> ClientConfig {
    ClientConfig {
        node_id: NODE,
        servers: vec![server(1), server(2)],
        backoff_base: Duration::from_millis(250),
        backoff_cap: Duration::from_secs(30),
        real_tasks: false,
        gc_max_allocs: 50,
        seed: 7,
    }
}

/// A job of one group with one task on `driver`.
fn job(id: &str, driver: &str) -> Arc<Job> {
    let mut job = Job::new_simple(id, JobType::Service, 1, Resources::new(100, 64, 0));
    job.task_groups[0].tasks[0].driver = driver.to_string();
    Arc::new(job)
}

/// Slot `index` of `job`, placed on the node and wanted running.
fn alloc(job: &Arc<Job>, index: u32) -> Arc<Allocation> {
    let group = job.task_groups[0].name.clone();
    let mut alloc = Allocation::new_placement(job, &group, index, NODE, EvalId::from_u128(1));
    alloc.id = AllocId::from_u128(u128::from(index) + 100 * u128::from(job.id.len() as u8));
    Arc::new(alloc)
}

/// `alloc` as the servers changed it.
fn changed(alloc: &Arc<Allocation>, change: impl FnOnce(&mut Allocation)) -> Arc<Allocation> {
    let mut alloc = Allocation::clone(alloc);
    change(&mut alloc);
    Arc::new(alloc)
}

fn stopped(alloc: &Arc<Allocation>) -> Arc<Allocation> {
    changed(alloc, |alloc| alloc.desired_status = DesiredStatus::Stop)
}

fn heartbeat(status: NodeStatus) -> Event {
    Event::Answered(Answer::Heartbeat(HeartbeatReply { status, ttl: TTL, servers: Vec::new() }))
}

fn timed_out() -> Failure {
    Failure { transient: true, refusal: None, message: "no answer within 3s".to_string() }
}

fn refused(refusal: Refusal) -> Failure {
    Failure { transient: refusal == Refusal::NoLeader, refusal: Some(refusal), message: format!("{refusal:?}") }
}

fn update(alloc_id: AllocId, status: ClientStatus) -> AllocEvent {
    AllocEvent {
        alloc_id,
        status,
        description: format!("{status:?}"),
        task_states: BTreeMap::new(),
        services: None,
        checks: None,
        health: None,
    }
}

/// The statuses a report action sends, by allocation.
fn reported(actions: &[Action]) -> BTreeMap<AllocId, ClientStatus> {
    let reports: Vec<_> = actions
        .iter()
        .filter_map(|action| match action {
            Action::Call(Call::Report(updates)) => Some(updates),
            _ => None,
        })
        .collect();
    assert!(reports.len() <= 1, "one report at a time: {actions:?}");
    reports.first().map_or(BTreeMap::new(), |updates| updates.iter().map(|u| (u.alloc_id, u.client_status)).collect())
}

fn started(actions: &[Action]) -> Vec<(AllocId, RunnerKind)> {
    actions
        .iter()
        .filter_map(|action| match action {
            Action::Start { alloc, runner } => Some((alloc.id, *runner)),
            _ => None,
        })
        .collect()
}

/// A client on a manual clock.
struct Client {
    core: ClientState,
    now: Timestamp,
}

impl Client {
    fn new(config: ClientConfig) -> Client {
        Client { core: ClientState::new(config, Arc::new(AgentCounters::default())), now: Timestamp::ZERO }
    }

    fn handle(&mut self, event: Event) -> Vec<Action> {
        self.core.handle(self.now, event)
    }

    /// Moves the clock to `at` and ticks.
    fn tick_at(&mut self, at: Timestamp) -> Vec<Action> {
        self.now = at;
        self.handle(Event::Tick)
    }

    fn advance(&mut self, by: Duration) -> Vec<Action> {
        self.tick_at(self.now.plus(by))
    }

    /// Ticks at the core's deadline.
    fn at_deadline(&mut self) -> Vec<Action> {
        let deadline = self.core.deadline().expect("a deadline");
        self.tick_at(deadline)
    }

    fn counted(&self, counter: fn(&AgentCounters) -> &AtomicU64) -> u64 {
        counter(self.core.counters()).load(Ordering::Relaxed)
    }

    /// The first session: connect, register, heartbeat `ready`, watch.
    fn start(&mut self) {
        assert_eq!(self.handle(Event::Tick), vec![Action::Connect(server(1))]);
        assert_eq!(self.handle(Event::Connected), vec![Action::Call(Call::Register)]);
        assert_eq!(self.handle(Event::Answered(Answer::Registered)), vec![Action::Call(Call::Heartbeat)]);
        assert_eq!(self.handle(heartbeat(NodeStatus::Ready)), vec![Action::Call(Call::Watch { after: 0 })]);
        assert_eq!(self.handle(Event::Answered(Answer::Watching)), vec![]);
        assert!(self.core.is_ready());
    }

    /// A push of `allocs` at `index`, its report answered.
    fn push(&mut self, index: u64, allocs: &[&Arc<Allocation>]) -> Vec<Action> {
        let allocs = allocs.iter().map(|alloc| Arc::clone(alloc)).collect();
        let actions = self.handle(Event::Push { index, allocs, listed: None });
        if !reported(&actions).is_empty() {
            assert_eq!(self.handle(Event::Answered(Answer::Reported)), vec![]);
        }
        actions
    }

    /// Loses the session; returns the reconnect delay.
    fn lose(&mut self) -> Duration {
        let actions = self.handle(Event::Disconnected(Failure::lost("the network link went down")));
        assert_eq!(actions, vec![Action::Disconnect { why: "the network link went down".to_string() }]);
        self.core.deadline().expect("a reconnect time").since(self.now)
    }
}

#[test]
fn a_new_client_registers_heartbeats_at_the_ttl_and_opens_its_watch() {
    let mut client = Client::new(config());
    client.start();
    assert_eq!(client.core.deadline(), Some(Timestamp::ZERO.plus(TTL)), "next heartbeat at the TTL");
    assert_eq!(client.advance(TTL - Duration::from_millis(1)), vec![]);
    assert_eq!(client.advance(Duration::from_millis(1)), vec![Action::Call(Call::Heartbeat)]);
    assert_eq!(client.core.deadline(), None, "no timer while a call is out");
    assert_eq!(client.handle(heartbeat(NodeStatus::Ready)), vec![]);
    assert_eq!(client.core.deadline(), Some(client.now.plus(TTL)));
    assert_eq!(client.counted(|c| &c.heartbeats), 2);
    assert_eq!(client.counted(|c| &c.connections), 1);
}

#[test]
fn a_lost_session_reconnects_to_the_next_server_after_a_jittered_backoff() {
    let mut client = Client::new(config());
    client.start();
    client.advance(Duration::from_secs(3));
    let delay = client.lose();
    assert!(delay <= Duration::from_millis(250), "the first ceiling is the base: {delay:?}");
    assert!(!client.core.is_connected());
    if delay > Duration::ZERO {
        assert_eq!(client.advance(delay / 2), vec![], "nothing before the backoff ends");
    }
    assert_eq!(client.at_deadline(), vec![Action::Connect(server(2))]);
    // Attempts that fail back off under a ceiling that doubles, capped at
    // half the TTL the servers handed (back before they give up on the node).
    let mut delays = Vec::new();
    for _ in 0..8 {
        let actions = client.handle(Event::Disconnected(Failure::lost("connecting: refused")));
        assert!(matches!(&actions[..], [Action::Disconnect { .. }]), "{actions:?}");
        delays.push(client.core.deadline().expect("a reconnect time").since(client.now));
        assert!(matches!(&client.at_deadline()[..], [Action::Connect(_)]));
    }
    let ceilings = [500, 1_000, 2_000, 4_000, 5_000, 5_000, 5_000, 5_000].map(Duration::from_millis);
    for (delay, ceiling) in delays.iter().zip(ceilings) {
        assert!(*delay <= ceiling, "{delays:?}");
    }
    assert!(delays[4..].iter().any(|delay| *delay > Duration::from_secs(2)), "the ceiling grew: {delays:?}");
    assert_eq!(client.counted(|c| &c.reconnects), 0, "no connection was made again yet");
    // A session that greets resets the backoff.
    assert_eq!(client.handle(Event::Connected), vec![Action::Call(Call::Heartbeat)], "registered already");
    assert_eq!(client.handle(heartbeat(NodeStatus::Ready)), vec![Action::Call(Call::Watch { after: 0 })]);
    client.handle(Event::Answered(Answer::Watching));
    assert!(client.lose() <= Duration::from_millis(250));
    assert_eq!(client.counted(|c| &c.reconnects), 1);
}

#[test]
fn the_backoff_is_a_function_of_the_seed() {
    let delays = |seed| {
        let mut client = Client::new(ClientConfig { seed, ..config() });
        client.start();
        (0..6)
            .map(|_| {
                let delay = client.lose();
                client.at_deadline();
                delay
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(delays(1), delays(1));
    assert_ne!(delays(1), delays(2));
}

#[test]
fn reconnects_go_to_the_servers_the_last_heartbeat_listed() {
    let mut client = Client::new(config());
    client.start();
    client.advance(TTL);
    let servers = ["10.0.0.9:4647", "0.0.0.0:4647", "10.0.0.8:0", "not an address", "10.0.0.8:4647"];
    let reply = HeartbeatReply { status: NodeStatus::Ready, ttl: TTL, servers: servers.map(String::from).to_vec() };
    client.handle(Event::Answered(Answer::Heartbeat(reply)));
    client.lose();
    assert_eq!(client.at_deadline(), vec![Action::Connect("10.0.0.8:4647".parse().expect("an address"))]);
    client.handle(Event::Disconnected(Failure::lost("refused")));
    assert_eq!(client.at_deadline(), vec![Action::Connect("10.0.0.9:4647".parse().expect("an address"))]);
}

#[test]
fn a_client_marked_away_resyncs_every_allocation_then_heartbeats_again() {
    let mut client = Client::new(config());
    client.start();
    let (web, db) = (alloc(&job("web", mock::DRIVER), 0), alloc(&job("db", mock::DRIVER), 0));
    client.push(5, &[&web, &db]);
    client.lose();
    client.at_deadline();
    assert_eq!(client.handle(Event::Connected), vec![Action::Call(Call::Heartbeat)]);
    let watch = client.handle(heartbeat(NodeStatus::Initializing));
    assert_eq!(watch, vec![Action::Call(Call::Watch { after: 5 })], "the watch resumes after the last push");
    let resync = client.handle(Event::Answered(Answer::Watching));
    let sent = reported(&resync);
    assert_eq!(
        sent,
        BTreeMap::from([(web.id, ClientStatus::Running), (db.id, ClientStatus::Running)]),
        "reported already, sent again"
    );
    assert!(!client.core.is_ready());
    assert_eq!(client.handle(Event::Answered(Answer::Reported)), vec![Action::Call(Call::Heartbeat)]);
    assert_eq!(client.handle(heartbeat(NodeStatus::Ready)), vec![]);
    assert!(client.core.is_ready());
    assert_eq!((client.counted(|c| &c.resyncs), client.counted(|c| &c.marked_away)), (1, 1));
}

#[test]
fn an_initializing_answer_mid_session_resyncs_then_heartbeats_at_once() {
    let mut client = Client::new(config());
    client.start();
    let web = alloc(&job("web", mock::DRIVER), 0);
    client.push(3, &[&web]);
    assert_eq!(client.advance(TTL), vec![Action::Call(Call::Heartbeat)]);
    let resync = client.handle(heartbeat(NodeStatus::Initializing));
    assert_eq!(reported(&resync), BTreeMap::from([(web.id, ClientStatus::Running)]));
    assert_eq!(client.handle(Event::Answered(Answer::Reported)), vec![]);
    assert_eq!(client.core.deadline(), Some(client.now), "a heartbeat at once");
    assert_eq!(client.handle(Event::Tick), vec![Action::Call(Call::Heartbeat)]);
    assert_eq!(client.handle(heartbeat(NodeStatus::Ready)), vec![]);
    assert_eq!(client.core.deadline(), Some(client.now.plus(TTL)));
}

#[test]
fn a_push_that_stops_an_allocation_stops_it_and_reports_it_complete_never_to_run_it_again() {
    let mut client = Client::new(config());
    client.start();
    let web = alloc(&job("web", mock::DRIVER), 0);
    let first = client.push(1, &[&web]);
    assert_eq!(started(&first), vec![(web.id, RunnerKind::Mock(None))]);
    assert_eq!(reported(&first), BTreeMap::from([(web.id, ClientStatus::Running)]));
    let stop = client.push(2, &[&stopped(&web)]);
    assert_eq!(stop[0], Action::Stop(web.id));
    assert_eq!(reported(&stop), BTreeMap::from([(web.id, ClientStatus::Complete)]));
    // The servers want it running again (a stale push): it stays stopped.
    let again = client.push(3, &[&web]);
    assert!(started(&again).is_empty() && reported(&again).is_empty(), "{again:?}");
    // A mock timer that fired before it was stopped changes nothing.
    assert_eq!(client.handle(Event::AllocsUpdated(vec![update(web.id, ClientStatus::Failed)])), vec![]);
    let held = client.core.alloc(web.id).expect("held");
    assert_eq!((held.status, held.reported), (ClientStatus::Complete, true));
}

#[test]
fn real_tasks_stopped_by_the_servers_are_reported_when_their_runner_says_they_ended() {
    let mut client = Client::new(ClientConfig { real_tasks: true, ..config() });
    client.start();
    let web = alloc(&job("web", RAW_EXEC), 0);
    let first = client.push(1, &[&web]);
    assert_eq!(started(&first), vec![(web.id, RunnerKind::Tasks)]);
    assert_eq!(reported(&first), BTreeMap::from([(web.id, ClientStatus::Pending)]));
    let running = client.handle(Event::AllocsUpdated(vec![update(web.id, ClientStatus::Running)]));
    assert_eq!(reported(&running), BTreeMap::from([(web.id, ClientStatus::Running)]));
    client.handle(Event::Answered(Answer::Reported));
    let stop = client.push(2, &[&stopped(&web)]);
    assert_eq!(stop, vec![Action::Stop(web.id)], "nothing to report until the tasks are dead");
    let ended = client.handle(Event::AllocsUpdated(vec![update(web.id, ClientStatus::Complete)]));
    assert_eq!(reported(&ended), BTreeMap::from([(web.id, ClientStatus::Complete)]));
}

#[test]
fn a_stopped_allocation_is_never_resumed_after_an_agent_restart() {
    let web = alloc(&job("web", RAW_EXEC), 0);
    let db = alloc(&job("db", RAW_EXEC), 0);
    let mut client = Client::new(ClientConfig { real_tasks: true, ..config() });
    // The restarted agent re-attached to both from its data dir.
    client.core.restored(web.clone());
    client.core.restored(db.clone());
    client.start();
    // While it was gone the servers stopped web; db still runs. Two more
    // are not in the data dir: one stopped, one that ended here before.
    let gone = stopped(&alloc(&job("gone", RAW_EXEC), 0));
    let done = changed(&alloc(&job("done", RAW_EXEC), 0), |alloc| alloc.client_status = ClientStatus::Complete);
    let push = client.handle(Event::Push {
        index: 9,
        allocs: vec![stopped(&web), db.clone(), gone.clone(), done],
        listed: None,
    });
    assert!(started(&push).is_empty(), "nothing starts again: {push:?}");
    assert_eq!(
        push,
        vec![Action::Stop(web.id), Action::FirstPushApplied],
        "the stop comes first, then restarts may go on"
    );
    let ended = client.handle(Event::AllocsUpdated(vec![
        update(web.id, ClientStatus::Complete),
        update(db.id, ClientStatus::Running),
    ]));
    let sent = reported(&ended);
    assert_eq!(sent, BTreeMap::from([(web.id, ClientStatus::Complete), (db.id, ClientStatus::Running)]));
    client.handle(Event::Answered(Answer::Reported));
    let later = client.push(10, &[&stopped(&web), &db, &gone]);
    assert!(started(&later).is_empty() && !later.contains(&Action::FirstPushApplied), "{later:?}");
}

#[test]
fn a_push_of_changes_leaves_what_it_only_lists_as_it_was_and_drops_what_it_does_not_list() {
    let mut client = Client::new(ClientConfig { real_tasks: true, ..config() });
    client.start();
    let (web, db) = (alloc(&job("web", RAW_EXEC), 0), alloc(&job("db", RAW_EXEC), 0));
    let first = client.push(1, &[&web, &db]);
    assert_eq!(started(&first), vec![(web.id, RunnerKind::Tasks), (db.id, RunnerKind::Tasks)]);
    let running = client.handle(Event::AllocsUpdated(vec![
        update(web.id, ClientStatus::Running),
        update(db.id, ClientStatus::Running),
    ]));
    assert_eq!(reported(&running).len(), 2);
    client.handle(Event::Answered(Answer::Reported));
    // The servers stopped web; db did not change, so it is only listed.
    let ids = |allocs: &[&Arc<Allocation>]| Some(allocs.iter().map(|alloc| alloc.id).collect());
    let listed = ids(&[&web, &db]);
    let stop = client.handle(Event::Push { index: 2, allocs: vec![stopped(&web)], listed });
    assert_eq!(stop, vec![Action::Stop(web.id)], "db goes on untouched");
    let ended = client.handle(Event::AllocsUpdated(vec![update(web.id, ClientStatus::Complete)]));
    assert_eq!(reported(&ended), BTreeMap::from([(web.id, ClientStatus::Complete)]));
    client.handle(Event::Answered(Answer::Reported));
    // web was collected on the servers: it is no longer listed.
    let gone = client.handle(Event::Push { index: 3, allocs: vec![], listed: ids(&[&db]) });
    assert_eq!(gone, vec![Action::Destroy(web.id)]);
    let held: Vec<_> = client.core.allocs().map(|held| (held.alloc.id, held.status)).collect();
    assert_eq!(held, vec![(db.id, ClientStatus::Running)]);
}

#[test]
fn a_new_allocation_starts_with_its_driver_or_fails_at_once() {
    let mut client = Client::new(config());
    client.start();
    let timed = {
        let mut job = Job::clone(&job("timed", mock::DRIVER));
        let config = &mut job.task_groups[0].tasks[0].config;
        config.insert("run_for".to_string(), ConfigValue::String("30s".to_string()));
        config.insert("exit_code".to_string(), ConfigValue::Int(3));
        alloc(&Arc::new(job), 0)
    };
    let real = alloc(&job("real", RAW_EXEC), 0);
    let exec = alloc(&job("exec", "exec"), 0);
    let push = client.push(1, &[&timed, &real, &exec]);
    let end = MockEnd { after: Duration::from_secs(30), exit_code: 3 };
    assert_eq!(started(&push), vec![(timed.id, RunnerKind::Mock(Some(end)))]);
    let sent = reported(&push);
    let expected =
        [(timed.id, ClientStatus::Running), (real.id, ClientStatus::Failed), (exec.id, ClientStatus::Failed)];
    assert_eq!(sent, BTreeMap::from(expected));
    // The mock timer fires: the allocation ended as its task did.
    let ended = client.handle(Event::AllocsUpdated(vec![update(timed.id, ClientStatus::Failed)]));
    assert_eq!(reported(&ended), BTreeMap::from([(timed.id, ClientStatus::Failed)]));
}

#[test]
fn a_mock_service_allocation_reports_itself_healthy_as_it_starts_unless_health_is_manual() {
    let mut client = Client::new(config());
    client.start();
    let web = alloc(&job("web", mock::DRIVER), 0);
    let deployed = changed(&alloc(&job("deployed", mock::DRIVER), 0), |alloc| {
        alloc.deployment_id = Some(engine::structs::DeploymentId::from_u128(7));
    });
    let mut manual_job = Job::clone(&job("manual", mock::DRIVER));
    manual_job.task_groups[0].health.mode = engine::structs::HealthCheckMode::Manual;
    let manual = changed(&alloc(&Arc::new(manual_job), 0), |alloc| {
        alloc.deployment_id = Some(engine::structs::DeploymentId::from_u128(8));
    });
    let mut batch_job = Job::clone(&job("batch", mock::DRIVER));
    batch_job.job_type = JobType::Batch;
    let batch = alloc(&Arc::new(batch_job), 0);
    let push = client.push(1, &[&web, &deployed, &manual, &batch]);
    let health: BTreeMap<AllocId, Option<bool>> = push
        .iter()
        .filter_map(|action| match action {
            Action::Call(Call::Report(updates)) => Some(updates),
            _ => None,
        })
        .flatten()
        .map(|update| (update.alloc_id, update.health.as_ref().map(|health| health.healthy)))
        .collect();
    let expected = [(web.id, Some(true)), (deployed.id, Some(true)), (manual.id, None), (batch.id, None)];
    assert_eq!(health, BTreeMap::from(expected), "outside a deployment, by its migrate block: {push:?}");
}

#[test]
fn an_allocation_no_longer_listed_is_destroyed() {
    let mut client = Client::new(config());
    client.start();
    let (web, db) = (alloc(&job("web", mock::DRIVER), 0), alloc(&job("db", mock::DRIVER), 0));
    client.push(1, &[&web, &db]);
    assert_eq!(client.push(2, &[&db]), vec![Action::Destroy(web.id)]);
    assert!(client.core.alloc(web.id).is_none());
}

#[test]
fn a_server_that_forgot_the_node_gets_a_new_registration_and_the_old_allocations_go() {
    let mut client = Client::new(config());
    client.start();
    let web = alloc(&job("web", mock::DRIVER), 0);
    client.push(4, &[&web]);
    client.lose();
    client.at_deadline();
    client.handle(Event::Connected);
    let register = client.handle(Event::CallFailed(refused(Refusal::UnknownNode)));
    assert_eq!(register, vec![Action::Call(Call::Register)]);
    let heartbeat_again = client.handle(Event::Answered(Answer::Registered));
    assert_eq!(heartbeat_again, vec![Action::Destroy(web.id), Action::Call(Call::Heartbeat)]);
    assert_eq!(client.handle(heartbeat(NodeStatus::Ready)), vec![Action::Call(Call::Watch { after: 0 })]);
    // Told again that the node is unknown right after registering: the session is lost.
    client.lose();
    client.at_deadline();
    client.handle(Event::Connected);
    client.handle(Event::CallFailed(refused(Refusal::UnknownNode)));
    client.handle(Event::Answered(Answer::Registered));
    let lost = client.handle(Event::CallFailed(refused(Refusal::UnknownNode)));
    assert!(matches!(&lost[..], [Action::Disconnect { .. }]), "{lost:?}");
}

#[test]
fn an_unanswered_heartbeat_is_retried_on_the_same_connection_then_the_session_is_given_up() {
    let mut client = Client::new(config());
    // The greeting: three tries, 0.5-1.5 s apart.
    client.handle(Event::Tick);
    client.handle(Event::Connected);
    client.handle(Event::Answered(Answer::Registered));
    for _ in 0..2 {
        assert_eq!(client.handle(Event::CallFailed(timed_out())), vec![]);
        let pause = client.core.deadline().expect("a retry").since(client.now);
        assert!((Duration::from_millis(500)..=Duration::from_millis(1_500)).contains(&pause), "{pause:?}");
        assert_eq!(client.at_deadline(), vec![Action::Call(Call::Heartbeat)]);
    }
    assert_eq!(client.handle(heartbeat(NodeStatus::Ready)), vec![Action::Call(Call::Watch { after: 0 })]);
    client.handle(Event::Answered(Answer::Watching));
    // In the session: two retries, the third miss gives the server up;
    // refusals for want of a leader count as misses.
    client.advance(TTL);
    assert_eq!(client.handle(Event::CallFailed(refused(Refusal::NoLeader))), vec![]);
    assert_eq!(client.at_deadline(), vec![Action::Call(Call::Heartbeat)]);
    assert_eq!(client.handle(Event::CallFailed(timed_out())), vec![]);
    assert_eq!(client.at_deadline(), vec![Action::Call(Call::Heartbeat)]);
    let lost = client.handle(Event::CallFailed(timed_out()));
    assert!(matches!(&lost[..], [Action::Disconnect { .. }]), "{lost:?}");
    assert_eq!(client.counted(|c| &c.heartbeat_retries), 4);
    assert_eq!(client.counted(|c| &c.writes_retried), 1);
    // An answer resets the count.
    client.at_deadline();
    client.handle(Event::Connected);
    client.handle(heartbeat(NodeStatus::Ready));
    client.handle(Event::Answered(Answer::Watching));
    for _ in 0..3 {
        client.at_deadline();
        assert_eq!(client.handle(Event::CallFailed(timed_out())), vec![]);
        client.at_deadline();
        assert_eq!(client.handle(heartbeat(NodeStatus::Ready)), vec![]);
    }
    assert!(client.core.is_ready());
}

#[test]
fn a_refused_report_ends_the_session_and_the_next_resyncs_from_the_servers_view() {
    let mut client = Client::new(config());
    client.start();
    let web = alloc(&job("web", mock::DRIVER), 0);
    let push = client.handle(Event::Push { index: 6, allocs: vec![web.clone()], listed: None });
    assert_eq!(reported(&push), BTreeMap::from([(web.id, ClientStatus::Running)]));
    // The node was marked down meanwhile: refused, the session is lost, the
    // status is still to be sent.
    let lost = client.handle(Event::CallFailed(refused(Refusal::NotConnected)));
    assert!(matches!(&lost[..], [Action::Disconnect { .. }]), "{lost:?}");
    assert!(!client.core.alloc(web.id).expect("held").reported);
    client.at_deadline();
    client.handle(Event::Connected);
    assert_eq!(client.handle(heartbeat(NodeStatus::Initializing)), vec![Action::Call(Call::Watch { after: 6 })]);
    assert_eq!(
        reported(&client.handle(Event::Answered(Answer::Watching))),
        BTreeMap::from([(web.id, ClientStatus::Running)])
    );
    // A report naming an allocation the servers removed: the watch starts over.
    client.handle(Event::CallFailed(refused(Refusal::NotItsAllocation)));
    client.at_deadline();
    client.handle(Event::Connected);
    assert_eq!(client.handle(heartbeat(NodeStatus::Ready)), vec![Action::Call(Call::Watch { after: 0 })]);
}

#[test]
fn news_that_comes_while_a_call_is_out_is_sent_once_it_is_answered() {
    let mut client = Client::new(config());
    client.start();
    let (web, db) = (alloc(&job("web", mock::DRIVER), 0), alloc(&job("db", mock::DRIVER), 0));
    let first = client.handle(Event::Push { index: 1, allocs: vec![web.clone()], listed: None });
    assert_eq!(reported(&first), BTreeMap::from([(web.id, ClientStatus::Running)]));
    // While that report is out: web fails, db is placed, the heartbeat is due.
    assert_eq!(client.handle(Event::AllocsUpdated(vec![update(web.id, ClientStatus::Failed)])), vec![]);
    let push = client.handle(Event::Push { index: 2, allocs: vec![web.clone(), db.clone()], listed: None });
    assert_eq!(started(&push), vec![(db.id, RunnerKind::Mock(None))]);
    assert!(reported(&push).is_empty());
    assert_eq!(client.advance(TTL), vec![]);
    let next = client.handle(Event::Answered(Answer::Reported));
    assert_eq!(reported(&next), BTreeMap::from([(web.id, ClientStatus::Failed), (db.id, ClientStatus::Running)]));
    assert_eq!(client.handle(Event::Answered(Answer::Reported)), vec![]);
    assert_eq!(client.handle(Event::Tick), vec![Action::Call(Call::Heartbeat)], "the heartbeat came due meanwhile");
}

#[test]
fn ended_real_allocations_beyond_gc_max_allocs_are_destroyed_oldest_first() {
    let mut client = Client::new(ClientConfig { real_tasks: true, gc_max_allocs: 1, ..config() });
    client.start();
    let allocs: Vec<_> = (0..3).map(|index| alloc(&job("batch", RAW_EXEC), index)).collect();
    client.push(1, &allocs.iter().collect::<Vec<_>>());
    let mut destroyed = Vec::new();
    for alloc in &allocs {
        client.advance(Duration::from_secs(1));
        let actions = client.handle(Event::AllocsUpdated(vec![update(alloc.id, ClientStatus::Complete)]));
        destroyed.extend(actions.iter().filter(|action| matches!(action, Action::Destroy(_))).cloned());
        client.handle(Event::Answered(Answer::Reported));
    }
    assert_eq!(destroyed, vec![Action::Destroy(allocs[0].id), Action::Destroy(allocs[1].id)]);
}

#[test]
fn an_operators_gc_destroys_ended_real_allocations_only_and_each_once() {
    let mut client = Client::new(ClientConfig { real_tasks: true, ..config() });
    client.start();
    let allocs: Vec<_> = (0..3).map(|index| alloc(&job("batch", RAW_EXEC), index)).collect();
    client.push(1, &allocs.iter().collect::<Vec<_>>());
    for alloc in &allocs[..2] {
        client.handle(Event::AllocsUpdated(vec![update(alloc.id, ClientStatus::Complete)]));
        client.handle(Event::Answered(Answer::Reported));
    }
    let running = allocs[2].id;
    assert_eq!(client.handle(Event::CollectGarbage(Some(running))), vec![], "a running allocation is kept");
    assert_eq!(client.handle(Event::CollectGarbage(Some(allocs[0].id))), vec![Action::Destroy(allocs[0].id)]);
    assert_eq!(client.handle(Event::CollectGarbage(None)), vec![Action::Destroy(allocs[1].id)], "the rest");
    assert_eq!(client.handle(Event::CollectGarbage(None)), vec![], "each once");
    assert_eq!(client.core.alloc(allocs[0].id).map(|held| held.status), Some(ClientStatus::Complete), "still held");
}

#[test]
fn the_heartbeat_override_takes_effect_at_once_and_holds_across_sessions() {
    let mut client = Client::new(config());
    client.start();
    client.advance(Duration::from_secs(1));
    assert_eq!(client.handle(Event::HeartbeatPeriod(Some(Duration::from_secs(2)))), vec![]);
    assert_eq!(client.core.deadline(), Some(client.now.plus(Duration::from_secs(2))));
    client.at_deadline();
    client.handle(heartbeat(NodeStatus::Ready));
    assert_eq!(client.core.deadline(), Some(client.now.plus(Duration::from_secs(2))));
    // Back at the TTL: the next heartbeat stays when it was due.
    client.handle(Event::HeartbeatPeriod(None));
    assert_eq!(client.core.deadline(), Some(client.now.plus(Duration::from_secs(2))));
}

#[test]
fn allocations_seen_unknown_and_lost_are_counted() {
    let mut client = Client::new(config());
    client.start();
    let (web, db) = (alloc(&job("web", mock::DRIVER), 0), alloc(&job("db", mock::DRIVER), 0));
    client.push(1, &[&web, &db]);
    let unknown = |alloc: &Arc<Allocation>| changed(alloc, |alloc| alloc.client_status = ClientStatus::Unknown);
    client.push(2, &[&unknown(&web), &db]);
    client.push(3, &[&unknown(&web), &db]);
    let running = changed(&web, |alloc| alloc.client_status = ClientStatus::Running);
    let lost = changed(&db, |alloc| {
        alloc.client_status = ClientStatus::Lost;
        alloc.desired_status = DesiredStatus::Stop;
    });
    let push = client.push(4, &[&running, &lost]);
    assert_eq!(
        reported(&push),
        BTreeMap::from([(db.id, ClientStatus::Complete)]),
        "a lost allocation still running is stopped"
    );
    assert_eq!(client.counted(|c| &c.allocs_seen_unknown), 1);
    assert_eq!(client.counted(|c| &c.allocs_reconnected), 1);
    assert_eq!(client.counted(|c| &c.marked_away), 1);
    assert_eq!(client.counted(|c| &c.pushes), 4);
}

#[test]
fn allocations_stop_once_their_group_has_been_without_the_servers_long_enough() {
    let mut client = Client::new(ClientConfig { real_tasks: true, ..config() });
    client.start();
    let allowance = Duration::from_secs(60);
    let tolerant = |id: &str, driver: &str| {
        let mut job = Job::clone(&job(id, driver));
        job.task_groups[0].stop_after_client_disconnect = Some(allowance);
        Arc::new(job)
    };
    let (web, real) = (alloc(&tolerant("web", mock::DRIVER), 0), alloc(&tolerant("real", RAW_EXEC), 0));
    let forever = alloc(&job("forever", mock::DRIVER), 0);
    client.push(3, &[&web, &real, &forever]);
    assert_eq!(client.core.deadline(), Some(Timestamp::ZERO.plus(TTL)), "in touch: no stop is due");
    assert_eq!(client.advance(TTL), vec![Action::Call(Call::Heartbeat)]);
    assert_eq!(client.handle(heartbeat(NodeStatus::Ready)), vec![]);
    let heard = client.now;
    client.lose();
    let due = heard.plus(allowance);
    let mut stops = Vec::new();
    while client.now < due {
        let actions = client.at_deadline();
        for action in &actions {
            match action {
                Action::Connect(_) => {
                    let failed = client.handle(Event::Disconnected(Failure::lost("refused")));
                    assert!(matches!(&failed[..], [Action::Disconnect { .. }]), "{failed:?}");
                }
                Action::Stop(id) => stops.push((client.now, *id)),
                other => panic!("{other:?}"),
            }
        }
        assert!(client.core.deadline().expect("a deadline") <= due || client.now >= due);
    }
    assert_eq!(stops, vec![(due, web.id), (due, real.id)], "at the allowance, and only the groups that say so");
    for _ in 0..3 {
        let actions = client.at_deadline();
        assert!(!actions.iter().any(|action| matches!(action, Action::Stop(_))), "stopped once: {actions:?}");
        if matches!(&actions[..], [Action::Connect(_)]) {
            client.handle(Event::Disconnected(Failure::lost("refused")));
        }
    }
    // Back in touch: the mock task's end is reported; the real one's comes from its runner.
    while !matches!(&client.at_deadline()[..], [Action::Connect(_)]) {}
    assert_eq!(client.handle(Event::Connected), vec![Action::Call(Call::Heartbeat)]);
    assert_eq!(client.handle(heartbeat(NodeStatus::Ready)), vec![Action::Call(Call::Watch { after: 3 })]);
    let report = reported(&client.handle(Event::Answered(Answer::Watching)));
    assert_eq!(report, BTreeMap::from([(web.id, ClientStatus::Complete)]));
    assert_eq!(client.core.stop_deadline(), None, "in touch again");
}

#[test]
fn a_node_changed_while_the_session_runs_is_registered_again_and_its_allocations_stay() {
    let mut client = Client::new(config());
    client.start();
    let web = alloc(&job("web", mock::DRIVER), 0);
    client.push(1, &[&web]);
    let heartbeat_due = client.core.deadline();
    assert_eq!(client.handle(Event::NodeChanged), vec![Action::Call(Call::Register)]);
    assert_eq!(client.core.deadline(), None, "the registration is out");
    assert_eq!(client.handle(Event::Answered(Answer::Registered)), vec![], "no heartbeat, no destroy: still ready");
    assert!(client.core.is_ready());
    assert_eq!(client.core.deadline(), heartbeat_due, "the heartbeat stays when it was due");
    assert!(client.core.alloc(web.id).is_some(), "a node update drops nothing");
    assert_eq!(client.advance(TTL), vec![Action::Call(Call::Heartbeat)], "sent once");
}

#[test]
fn a_node_changed_while_a_call_is_out_is_registered_once_it_is_answered() {
    let mut client = Client::new(config());
    client.start();
    assert_eq!(client.advance(TTL), vec![Action::Call(Call::Heartbeat)]);
    assert_eq!(client.handle(Event::NodeChanged), vec![], "one call at a time");
    assert_eq!(client.handle(heartbeat(NodeStatus::Ready)), vec![Action::Call(Call::Register)]);
    // A change while the registration is out: the node sent may predate it.
    assert_eq!(client.handle(Event::NodeChanged), vec![]);
    assert_eq!(client.handle(Event::Answered(Answer::Registered)), vec![Action::Call(Call::Register)]);
    assert_eq!(client.handle(Event::Answered(Answer::Registered)), vec![]);
    // Both a report and the node due once the heartbeat is answered: the
    // report goes first, the node right after.
    assert_eq!(client.advance(TTL), vec![Action::Call(Call::Heartbeat)]);
    let web = alloc(&job("web", mock::DRIVER), 0);
    assert_eq!(client.handle(Event::NodeChanged), vec![]);
    let push = client.handle(Event::Push { index: 1, allocs: vec![web.clone()], listed: None });
    assert!(reported(&push).is_empty(), "{push:?}");
    let report = client.handle(heartbeat(NodeStatus::Ready));
    assert_eq!(reported(&report), BTreeMap::from([(web.id, ClientStatus::Running)]));
    assert_eq!(client.handle(Event::Answered(Answer::Reported)), vec![Action::Call(Call::Register)]);
    assert_eq!(client.handle(Event::Answered(Answer::Registered)), vec![]);
}

#[test]
fn changes_before_the_registration_goes_make_one_call() {
    let mut client = Client::new(config());
    client.start();
    assert_eq!(client.advance(TTL), vec![Action::Call(Call::Heartbeat)]);
    for _ in 0..3 {
        assert_eq!(client.handle(Event::NodeChanged), vec![]);
    }
    assert_eq!(client.handle(heartbeat(NodeStatus::Ready)), vec![Action::Call(Call::Register)]);
    assert_eq!(client.handle(Event::Answered(Answer::Registered)), vec![]);
    assert_eq!(client.advance(TTL), vec![Action::Call(Call::Heartbeat)], "no second registration");
}

#[test]
fn a_node_changed_before_the_first_registration_goes_with_it() {
    let mut client = Client::new(config());
    assert_eq!(client.handle(Event::NodeChanged), vec![]);
    client.start();
    assert_eq!(client.handle(Event::NodeChanged), vec![Action::Call(Call::Register)], "only a later change");
}

#[test]
fn a_node_changed_while_disconnected_is_registered_once_the_next_session_runs() {
    let mut client = Client::new(config());
    client.start();
    let web = alloc(&job("web", mock::DRIVER), 0);
    client.push(2, &[&web]);
    client.lose();
    assert_eq!(client.handle(Event::NodeChanged), vec![]);
    client.at_deadline();
    assert_eq!(client.handle(Event::Connected), vec![Action::Call(Call::Heartbeat)], "the servers know the node");
    assert_eq!(client.handle(heartbeat(NodeStatus::Ready)), vec![Action::Call(Call::Watch { after: 2 })]);
    assert_eq!(client.handle(Event::Answered(Answer::Watching)), vec![Action::Call(Call::Register)]);
    assert_eq!(client.handle(Event::Answered(Answer::Registered)), vec![]);
    assert!(client.core.is_ready());
    assert!(client.core.alloc(web.id).is_some());
}

#[test]
fn a_failed_node_registration_ends_the_session_and_the_next_one_sends_it() {
    let mut client = Client::new(config());
    client.start();
    assert_eq!(client.handle(Event::NodeChanged), vec![Action::Call(Call::Register)]);
    let lost = client.handle(Event::CallFailed(timed_out()));
    assert!(matches!(&lost[..], [Action::Disconnect { .. }]), "{lost:?}");
    client.at_deadline();
    assert_eq!(client.handle(Event::Connected), vec![Action::Call(Call::Heartbeat)]);
    assert_eq!(client.handle(heartbeat(NodeStatus::Ready)), vec![Action::Call(Call::Watch { after: 0 })]);
    assert_eq!(client.handle(Event::Answered(Answer::Watching)), vec![Action::Call(Call::Register)], "sent again");
    // Lost with the registration out, the change is still due.
    client.lose();
    client.at_deadline();
    client.handle(Event::Connected);
    client.handle(heartbeat(NodeStatus::Ready));
    assert_eq!(client.handle(Event::Answered(Answer::Watching)), vec![Action::Call(Call::Register)]);
    assert_eq!(client.handle(Event::Answered(Answer::Registered)), vec![]);
}
