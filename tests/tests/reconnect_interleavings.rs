//! The reconnect race, every interleaving (DESIGN.md "Node lifecycle").
//!
//! A client with a disconnect-tolerant allocation misses its heartbeat; the
//! allocation is marked `unknown` and its replacement cannot be placed (the
//! only other node is full), so a blocked eval waits. Then the client comes
//! back. Its own node has room for a second copy, so a replacement placed
//! too early would land there. Five things happen in every possible order (5! = 120):
//! - `Register`: the client re-registers;
//! - `Heartbeat`: UpdateStatus(ready);
//! - `Report`: UpdateAlloc(running) — refused while the node is still
//!   disconnected, in which case the client retries right after its next
//!   accepted heartbeat;
//! - `Schedule`: capacity news unblocks the pending eval and the scheduler runs it;
//! - `JobUpdate`: the job is updated (in place) and its eval runs.
//!
//! After each event the clients heartbeat (A once it has started to) and
//! the server runs the evals that became ready. At the end the client keeps
//! heartbeating and the evals settle, past the disconnect window. For every order: the job never has more running
//! allocations than its count, ends with the original running (never
//! zero), no replacement was placed and then stopped, and the reconnect is
//! recorded exactly once in the original's history.

use std::time::Duration;

use engine::node_endpoint::NodeError;
use engine::structs::{
    AllocId, ClientStatus, Constraint, ConstraintOperand, DesiredStatus, Job, JobType, NodeId, NodeStatus, Resources,
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

fn web() -> Job {
    let mut job = Job::new_simple("web", JobType::Service, 1, Resources::new(3_000, 256, 0));
    job.task_groups[0].max_client_disconnect = Some(WINDOW);
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
}

struct Race {
    cluster: Cluster,
    node_a: NodeId,
    node_b: NodeId,
    original: AllocId,
    report_refused: bool,
    heartbeated: bool,
    outcome: Outcome,
}

impl Race {
    /// Web on A, filler on B, both running; A misses its heartbeat and the
    /// replacement of web's allocation blocks.
    fn set_up() -> Race {
        let mut cluster = Cluster::new(5);
        let node_a = cluster.add_node(1, 8_000);
        cluster.register_job(&web());
        let node_b = cluster.add_node(2, 4_000);
        cluster.register_job(&filler());
        cluster.report(node_a).expect("web runs");
        cluster.report(node_b).expect("filler runs");
        let original = live_allocs(&cluster.snapshot(), &web())[0].id;
        assert_eq!(cluster.snapshot().alloc(original).expect("alloc").node_id, node_a);

        cluster.miss_heartbeat(node_a, &[node_b]);
        cluster.settle();
        let snapshot = cluster.snapshot();
        assert_eq!(snapshot.node(node_a).expect("a").status, NodeStatus::Disconnected);
        let marked = snapshot.alloc(original).expect("alloc");
        assert_eq!(marked.client_status, ClientStatus::Unknown);
        assert!(marked.needs_reconnect());
        assert!(cluster.server.blocked().blocked_eval_of(&web().key()).is_some(), "the replacement waits");
        assert_eq!(live_allocs(&snapshot, &web()).len(), 1, "no replacement fits");
        Race {
            cluster,
            node_a,
            node_b,
            original,
            report_refused: false,
            heartbeated: false,
            outcome: Outcome::default(),
        }
    }

    fn run(&mut self, event: Event) {
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
                }
            }
            Event::Report => match self.cluster.report(self.node_a) {
                Ok(_) => {}
                Err(NodeError::NotConnected { status: NodeStatus::Disconnected, .. }) => {
                    self.report_refused = true;
                    self.outcome.refused_reports += 1;
                }
                Err(error) => panic!("unexpected refusal: {error}"),
            },
            Event::Schedule => {
                let snapshot = self.cluster.snapshot();
                let class = snapshot.node(self.node_b).expect("b").computed_class;
                self.cluster.server.blocked().unblock(class, snapshot.index());
                self.cluster.settle();
            }
            Event::JobUpdate => {
                let mut updated = web();
                updated.priority = 70;
                self.cluster.register_job(&updated);
            }
        }
        // Clients heartbeat on their own: B always, A once it is back. The
        // server runs whatever evals the event made ready.
        self.cluster.heartbeat(self.node_b).expect("b stays alive");
        if self.heartbeated {
            self.cluster.heartbeat(self.node_a).expect("a heartbeats");
        }
        self.cluster.settle();
        self.check_never_over_count();
    }

    /// The client heartbeats on and the evals settle, through the end of
    /// the disconnect window.
    fn finish(&mut self) {
        if self.report_refused {
            self.run(Event::Heartbeat);
        }
        self.cluster.heartbeat(self.node_a).expect("heartbeat");
        self.cluster.settle();
        self.check_never_over_count();
        self.cluster.pass_time(WINDOW + Duration::from_secs(60), &[self.node_a, self.node_b]);
    }

    fn check_never_over_count(&self) {
        let snapshot = self.cluster.snapshot();
        assert!(running_allocs(&snapshot, &web()).len() <= 1, "more running than the count");
    }

    fn check_settled(&self, order: &[Event]) {
        let snapshot = self.cluster.snapshot();
        let context = format!("order {order:?}");
        assert_eq!(snapshot.node(self.node_a).expect("a").status, NodeStatus::Ready, "{context}");
        let allocs: Vec<_> = snapshot.allocs_by_job(&web().key()).cloned().collect();
        assert_eq!(allocs.len(), 1, "{context}: no replacement was ever placed: {allocs:#?}");
        let original = &allocs[0];
        assert_eq!(original.id, self.original, "{context}");
        assert_eq!(original.desired_status, DesiredStatus::Run, "{context}");
        assert_eq!(original.client_status, ClientStatus::Running, "{context}");
        assert_eq!(original.job.priority, 70, "{context}: updated in place");
        let history: Vec<_> = original.alloc_states.iter().map(|state| state.client_status).collect();
        assert_eq!(history, [ClientStatus::Unknown, ClientStatus::Running], "{context}: reconnect recorded once");
        assert!(!original.needs_reconnect(), "{context}");
        assert_eq!(running_allocs(&snapshot, &web()).len(), 1, "{context}");
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
    let orders = permutations(&EVENTS);
    assert_eq!(orders.len(), 120);
    let mut refused_first = 0;
    for order in &orders {
        let mut race = Race::set_up();
        for event in order {
            race.run(*event);
        }
        race.finish();
        race.check_settled(order);
        let report_before_heartbeat = order.iter().position(|event| *event == Event::Report)
            < order.iter().position(|event| *event == Event::Heartbeat);
        assert_eq!(race.outcome.refused_reports, usize::from(report_before_heartbeat), "order {order:?}");
        refused_first += race.outcome.refused_reports;
    }
    assert_eq!(refused_first, 60, "half the orders report before the heartbeat and are refused once");
}
