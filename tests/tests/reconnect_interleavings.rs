//! The reconnect race, every interleaving (`docs/node-lifecycle.md`), in
//! two set-ups.
//!
//! A client with a disconnect-tolerant allocation misses its heartbeat and
//! the allocation is marked `unknown`. Then the client comes back. Its own
//! node has room for a second copy, so a replacement placed too early would
//! land there.
//! - [`Setup::Full`]: the only other node is full, so the replacement cannot
//!   be placed and a blocked eval waits.
//! - [`Setup::Roomy`]: the other node has room, so the replacement R is
//!   placed there and runs when the client comes back.
//!
//! Five things happen in every possible order (5! = 120), per set-up:
//! - `Register`: the client re-registers;
//! - `Heartbeat`: UpdateStatus(ready);
//! - `Report`: UpdateAlloc(running) — refused while the node is still
//!   disconnected, in which case the client retries right after its next
//!   accepted heartbeat;
//! - `Schedule`: an eval of the job runs (full: capacity news unblocks the
//!   blocked eval; roomy: an operator asks for the job to be evaluated);
//! - `JobUpdate`: the job is updated (in place) and its eval runs.
//!
//! After each event the clients heartbeat (A once it has started to) and
//! the server runs the evals that became ready. At the end the client keeps
//! heartbeating and the evals settle, past the disconnect window. For every
//! order: the job never has more running allocations than its count, and
//! ends with exactly one running.
//! - Full: the original, with no replacement ever placed and the reconnect
//!   recorded exactly once in its history.
//! - Roomy: R is stopped only once A's report has confirmed the original,
//!   and never otherwise; the survivor is the original unless the update
//!   reached R before the confirmation (R then runs a newer version); no
//!   third allocation is ever placed.

use std::time::Duration;

use engine::node::endpoint::NodeError;
use engine::structs::{
    AllocId, ClientStatus, Constraint, ConstraintOperand, DesiredStatus, Job, JobType, NodeId, NodeStatus,
    ReconcileStrategy, Resources,
};
use tests::{live_allocs, running_allocs, Cluster};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    Register,
    Heartbeat,
    Report,
    Schedule,
    JobUpdate,
}

const EVENTS: [Event; 5] = [Event::Register, Event::Heartbeat, Event::Report, Event::Schedule, Event::JobUpdate];
const WINDOW: Duration = Duration::from_secs(600);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Setup {
    /// B is full: no replacement can be placed.
    Full,
    /// B has room: the replacement runs there when A returns.
    Roomy,
}

fn web() -> Job {
    let mut job = Job::new_simple("web", JobType::Service, 1, Resources::new(3_000, 256, 0));
    job.task_groups[0].max_client_disconnect = Some(WINDOW);
    // The orders are what is under test, not which of a slot's two
    // allocations the strategy prefers (the reconciler's tests cover each):
    // under the default, best_score, a replacement on a roomier node wins.
    job.task_groups[0].reconcile = ReconcileStrategy::KeepOriginal;
    job
}

/// A job pinned to node B that fills it.
fn filler() -> Job {
    let mut job = Job::new_simple("filler", JobType::Service, 1, Resources::new(3_000, 256, 0));
    let node_b = NodeId::from_u128(2).to_string();
    job.constraints.push(Constraint::new("${node.unique.id}", ConstraintOperand::Equal, &node_b));
    job
}

/// What one order came to.
#[derive(Debug, Default)]
struct Outcome {
    refused_reports: usize,
    /// The event (by position) at which A's report was first taken.
    confirmed_at: Option<usize>,
    /// The event at which the replacement was seen stopped.
    replacement_stopped_at: Option<usize>,
    /// The event at which the job update ran.
    updated_at: Option<usize>,
}

struct Race {
    setup: Setup,
    cluster: Cluster,
    node_a: NodeId,
    node_b: NodeId,
    original: AllocId,
    replacement: Option<AllocId>,
    report_refused: bool,
    heartbeated: bool,
    step: usize,
    outcome: Outcome,
}

impl Race {
    /// Web on A; full: filler on B; A misses its heartbeat; full: the
    /// replacement of web's allocation blocks; roomy: it runs on B.
    fn set_up(setup: Setup) -> Race {
        let mut cluster = Cluster::new(5);
        let node_a = cluster.add_node(1, 8_000);
        cluster.register_job(&web());
        let node_b = cluster.add_node(2, 4_000);
        if setup == Setup::Full {
            cluster.register_job(&filler());
            cluster.report(node_b).expect("filler runs");
        }
        cluster.report(node_a).expect("web runs");
        let original = live_allocs(&cluster.snapshot(), &web())[0].id;
        assert_eq!(cluster.snapshot().alloc(original).expect("alloc").node_id, node_a);

        cluster.miss_heartbeat(node_a, &[node_b]);
        cluster.settle();
        let snapshot = cluster.snapshot();
        assert_eq!(snapshot.node(node_a).expect("a").status, NodeStatus::Disconnected);
        let marked = snapshot.alloc(original).expect("alloc");
        assert_eq!(marked.client_status, ClientStatus::Unknown);
        assert!(marked.needs_reconnect());
        let replacement = match setup {
            Setup::Full => {
                assert!(cluster.server.blocked().blocked_eval_of(&web().key()).is_some(), "the replacement waits");
                assert_eq!(live_allocs(&snapshot, &web()).len(), 1, "no replacement fits");
                None
            }
            Setup::Roomy => {
                let placed = live_allocs(&snapshot, &web()).into_iter().find(|alloc| alloc.id != original);
                let placed = placed.expect("the replacement is placed on B");
                assert_eq!(placed.node_id, node_b);
                cluster.report(node_b).expect("the replacement runs");
                Some(placed.id)
            }
        };
        Race {
            setup,
            cluster,
            node_a,
            node_b,
            original,
            replacement,
            report_refused: false,
            heartbeated: false,
            step: 0,
            outcome: Outcome::default(),
        }
    }

    fn run(&mut self, event: Event) {
        self.step += 1;
        match event {
            Event::Register => {
                self.cluster.server.nodes().register(Cluster::node(1, 8_000)).expect("re-register");
            }
            Event::Heartbeat => {
                self.heartbeated = true;
                self.cluster.heartbeat(self.node_a).expect("heartbeat");
                if self.report_refused {
                    self.report_refused = false;
                    self.cluster.report(self.node_a).expect("the retried report is taken");
                    self.confirmed();
                }
            }
            Event::Report => match self.cluster.report(self.node_a) {
                Ok(_) => self.confirmed(),
                Err(NodeError::NotConnected { status: NodeStatus::Disconnected, .. }) => {
                    self.report_refused = true;
                    self.outcome.refused_reports += 1;
                }
                Err(error) => panic!("unexpected refusal: {error}"),
            },
            Event::Schedule => match self.setup {
                Setup::Full => {
                    let snapshot = self.cluster.snapshot();
                    let class = snapshot.node(self.node_b).expect("b").computed_class;
                    self.cluster.server.blocked().unblock(class, snapshot.index());
                    self.cluster.settle();
                }
                Setup::Roomy => {
                    self.cluster.server.jobs().evaluate(&web().key()).expect("evaluate");
                    self.cluster.settle();
                }
            },
            Event::JobUpdate => {
                let mut updated = web();
                updated.priority = 70;
                self.cluster.register_job(&updated);
                self.outcome.updated_at = Some(self.step);
            }
        }
        // Clients heartbeat on their own: B always, A once it is back. The
        // server runs whatever evals the event made ready.
        self.cluster.heartbeat(self.node_b).expect("b stays alive");
        if self.heartbeated {
            self.cluster.heartbeat(self.node_a).expect("a heartbeats");
        }
        self.cluster.settle();
        self.check_always();
    }

    fn confirmed(&mut self) {
        self.outcome.confirmed_at.get_or_insert(self.step);
    }

    /// The client heartbeats on and the evals settle, through the end of
    /// the disconnect window.
    fn finish(&mut self) {
        if self.report_refused {
            self.run(Event::Heartbeat);
        }
        self.cluster.heartbeat(self.node_a).expect("heartbeat");
        self.cluster.settle();
        self.check_always();
        self.cluster.pass_time(WINDOW + Duration::from_secs(60), &[self.node_a, self.node_b]);
        self.check_always();
    }

    /// Never more running than the count; the replacement is stopped only
    /// once the original was confirmed.
    fn check_always(&mut self) {
        let snapshot = self.cluster.snapshot();
        assert!(running_allocs(&snapshot, &web()).len() <= 1, "more running than the count");
        let Some(replacement) = self.replacement else { return };
        let stopped = snapshot.alloc(replacement).expect("replacement").desired_status != DesiredStatus::Run;
        if stopped && self.outcome.replacement_stopped_at.is_none() {
            self.outcome.replacement_stopped_at = Some(self.step);
            assert!(
                self.outcome.confirmed_at.is_some(),
                "the replacement was stopped at event {} before A confirmed the original",
                self.step
            );
        }
    }

    fn check_settled(&self, order: &[Event]) {
        let snapshot = self.cluster.snapshot();
        let context = format!("{:?} order {order:?}: {:?}", self.setup, self.outcome);
        assert_eq!(snapshot.node(self.node_a).expect("a").status, NodeStatus::Ready, "{context}");
        let allocs: Vec<_> = snapshot.allocs_by_job(&web().key()).cloned().collect();
        let expected_allocs = usize::from(self.replacement.is_some()) + 1;
        assert_eq!(allocs.len(), expected_allocs, "{context}: no other allocation was ever placed: {allocs:#?}");
        let running = running_allocs(&snapshot, &web());
        assert_eq!(running.len(), 1, "{context}");
        let kept = &running[0];
        assert_eq!(kept.job.priority, 70, "{context}: updated in place");
        let original = snapshot.alloc(self.original).expect("original");
        let history: Vec<_> = original.alloc_states.iter().map(|state| state.client_status).collect();
        // The update reached R first exactly when it ran before A's report was taken.
        let replacement_newer = self.replacement.is_some() && self.outcome.updated_at < self.outcome.confirmed_at;
        if replacement_newer {
            assert_eq!(Some(kept.id), self.replacement, "{context}: R runs the newer version and is kept");
            assert_eq!(original.desired_status, DesiredStatus::Stop, "{context}");
            assert_eq!(history, [ClientStatus::Unknown], "{context}: no reconnect recorded for a stopped original");
        } else {
            assert_eq!(kept.id, self.original, "{context}: the original is kept");
            assert_eq!(history, [ClientStatus::Unknown, ClientStatus::Running], "{context}: reconnect recorded once");
            assert!(!kept.needs_reconnect(), "{context}");
            if let Some(replacement) = self.replacement {
                let stopped = snapshot.alloc(replacement).expect("replacement");
                assert_eq!(stopped.desired_status, DesiredStatus::Stop, "{context}");
                assert!(self.outcome.replacement_stopped_at >= self.outcome.confirmed_at, "{context}");
            }
        }
        if replacement_newer {
            assert_eq!(self.outcome.replacement_stopped_at, None, "{context}: R is never stopped");
        }
        assert!(self.cluster.server.blocked().blocked_eval_of(&web().key()).is_none(), "{context}");
        assert!(self.cluster.server.broker_is_idle(), "{context}");
        assert!(snapshot.oversubscribed_nodes().is_empty(), "{context}");
    }
}

fn permutations(items: &[Event]) -> Vec<Vec<Event>> {
    if items.len() <= 1 {
        return vec![items.to_vec()];
    }
    let mut all = Vec::new();
    for (position, first) in items.iter().enumerate() {
        let mut rest = items.to_vec();
        rest.remove(position);
        for mut tail in permutations(&rest) {
            tail.insert(0, *first);
            all.push(tail);
        }
    }
    all
}

#[test]
fn every_interleaving_of_a_reconnect_keeps_exactly_the_original() {
    run_every_order(Setup::Full);
}

#[test]
fn every_interleaving_of_a_reconnect_with_a_running_replacement_stops_it_only_after_confirmation() {
    let outcomes = run_every_order(Setup::Roomy);
    let replacement_kept = outcomes.iter().filter(|outcome| outcome.replacement_stopped_at.is_none()).count();
    // The report is taken at the later of Report and Heartbeat; the update
    // comes before that in two orders of three (80 of 120): R runs the newer
    // version then, and is kept.
    assert_eq!(replacement_kept, 80, "R kept exactly when it was updated first");
}

/// Runs all 120 orders of one set-up and checks each; returns their outcomes.
fn run_every_order(setup: Setup) -> Vec<Outcome> {
    let orders = permutations(&EVENTS);
    assert_eq!(orders.len(), 120);
    let mut refused_first = 0;
    let mut outcomes = Vec::new();
    for order in &orders {
        let mut race = Race::set_up(setup);
        for event in order {
            race.run(*event);
        }
        race.finish();
        race.check_settled(order);
        let report_before_heartbeat = order.iter().position(|event| *event == Event::Report)
            < order.iter().position(|event| *event == Event::Heartbeat);
        assert_eq!(race.outcome.refused_reports, usize::from(report_before_heartbeat), "order {order:?}");
        refused_first += race.outcome.refused_reports;
        outcomes.push(race.outcome);
    }
    assert_eq!(refused_first, 60, "half the orders report before the heartbeat and are refused once");
    outcomes
}
