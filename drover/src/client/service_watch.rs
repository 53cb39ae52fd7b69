//! The agent's one reader of service registrations for its tasks'
//! templates (`nomadService`, `nomadServices`; `template.rs`).
//!
//! 1. A task's templates say what they read by holding an [`Interest`] in
//!    a set of [`ServiceQuery`]s; the watch reads the union of every
//!    interest held on the agent in one call, so a node holds at most one
//!    services read open on its connection however many tasks render
//!    (a server allows a client few streams; heartbeats must never wait
//!    for one).
//! 2. The read blocks on the services table's index: the watch sends the
//!    index of its last answer and the server answers once a registration
//!    changed (or after [`READ_WAIT`] unchanged). When the set of queries
//!    changes, the read in flight is dropped and a new one asks from
//!    index 0, which the server answers at once.
//! 3. Every answer is published as one [`ServiceData`] on a `watch`
//!    channel, only when it differs from the last: the templates re-render
//!    on a publication and compare their text.
//! 4. Without a connection it waits for the agent's next one; a failed
//!    read is tried again after a jittered second. Data already published
//!    stays: templates keep their last rendering while the servers are away.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use engine::node::service_reads::{ServiceAnswer, ServiceQuery};
use engine::structs::NodeId;
use rand::Rng;
use tokio::sync::{watch, Notify};
use transport::client::ClientConnection;
use uuid::Uuid;

/// How long a server may hold one read unchanged.
pub const READ_WAIT: Duration = Duration::from_secs(60);

/// How much longer than [`READ_WAIT`] the agent waits for an answer
/// before it gives the read up and asks again.
const READ_GRACE: Duration = Duration::from_secs(15);

/// What the servers answered, by query: what templates render from. A
/// query with no entry has not been answered yet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceData(pub BTreeMap<ServiceQuery, ServiceAnswer>);

/// The agent's service reads (module docs); cheap to clone.
#[derive(Clone, Debug)]
pub struct ServiceWatch {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// How many interests hold each query.
    wanted: parking_lot::Mutex<BTreeMap<ServiceQuery, usize>>,
    /// Told when `wanted` changes (a permit waits if nobody listens).
    wanted_changed: Notify,
    data: watch::Sender<Arc<ServiceData>>,
}

/// A task's interest in some queries; dropping it withdraws them.
#[derive(Debug)]
pub struct Interest {
    shared: Arc<Shared>,
    queries: BTreeSet<ServiceQuery>,
}

impl Interest {
    /// The queries it holds.
    pub fn queries(&self) -> &BTreeSet<ServiceQuery> {
        &self.queries
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        let mut wanted = self.shared.wanted.lock();
        for query in &self.queries {
            if let Some(count) = wanted.get_mut(query) {
                *count -= 1;
                if *count == 0 {
                    wanted.remove(query);
                }
            }
        }
        drop(wanted);
        self.shared.wanted_changed.notify_one();
    }
}

impl Default for ServiceWatch {
    fn default() -> ServiceWatch {
        ServiceWatch::new()
    }
}

impl ServiceWatch {
    /// A watch with nothing read yet.
    pub fn new() -> ServiceWatch {
        let shared = Shared {
            wanted: parking_lot::Mutex::new(BTreeMap::new()),
            wanted_changed: Notify::new(),
            data: watch::Sender::new(Arc::new(ServiceData::default())),
        };
        ServiceWatch { shared: Arc::new(shared) }
    }

    /// Registers an interest in `queries` for as long as it is held.
    pub fn interest(&self, queries: BTreeSet<ServiceQuery>) -> Interest {
        let mut wanted = self.shared.wanted.lock();
        let mut new = false;
        for query in &queries {
            let count = wanted.entry(query.clone()).or_insert(0);
            new |= *count == 0;
            *count += 1;
        }
        drop(wanted);
        if new {
            self.shared.wanted_changed.notify_one();
        }
        Interest { shared: self.shared.clone(), queries }
    }

    /// The published data, to read and to wait on.
    pub fn data(&self) -> watch::Receiver<Arc<ServiceData>> {
        self.shared.data.subscribe()
    }

    /// Publishes `answers` to `queries` (step 3): kept for the queries
    /// still wanted, published only when something changed.
    fn publish(&self, queries: &[ServiceQuery], answers: Vec<ServiceAnswer>) {
        let wanted: BTreeSet<ServiceQuery> = self.shared.wanted.lock().keys().cloned().collect();
        self.shared.data.send_if_modified(|data| {
            let mut next = BTreeMap::new();
            for (query, answer) in queries.iter().zip(answers) {
                next.insert(query.clone(), answer);
            }
            for (query, answer) in &data.0 {
                if wanted.contains(query) && !next.contains_key(query) {
                    next.insert(query.clone(), answer.clone());
                }
            }
            if next == data.0 {
                return false;
            }
            *data = Arc::new(ServiceData(next));
            true
        });
    }

    /// Publishes `answer` to `query` as if the servers had answered it.
    #[cfg(test)]
    pub(crate) fn publish_for_test(&self, query: ServiceQuery, answer: ServiceAnswer) {
        self.shared.data.send_modify(|data| {
            let mut next = data.0.clone();
            next.insert(query, answer);
            *data = Arc::new(ServiceData(next));
        });
    }

    fn wanted(&self) -> Vec<ServiceQuery> {
        self.shared.wanted.lock().keys().cloned().collect()
    }

    /// Reads for node `node_id` (with its `secret_id`) on the agent's
    /// connection as `connection` has it, forever: the agent aborts the
    /// task when it stops.
    pub async fn run(
        self,
        node_id: NodeId,
        secret_id: Uuid,
        mut connection: watch::Receiver<Option<ClientConnection>>,
    ) {
        let (mut asked, mut index) = (Vec::new(), 0);
        loop {
            let queries = self.wanted();
            if queries.is_empty() {
                self.shared.wanted_changed.notified().await;
                continue;
            }
            let Some(open) = connection.borrow_and_update().clone() else {
                let _ = connection.changed().await;
                continue;
            };
            let min_index = if queries == asked { index } else { 0 };
            let read = open.read_services(node_id, secret_id, queries.clone(), min_index, READ_WAIT);
            let failed = tokio::select! {
                answered = tokio::time::timeout(READ_WAIT + READ_GRACE, read) => match answered {
                    Ok(Ok(reply)) => {
                        index = reply.index;
                        asked = queries.clone();
                        self.publish(&queries, reply.answers);
                        None
                    }
                    Ok(Err(error)) => Some(error.to_string()),
                    Err(_) => Some(format!("no answer within {:?}", READ_WAIT + READ_GRACE)),
                },
                _ = self.shared.wanted_changed.notified() => None,
                _ = connection.changed() => None,
            };
            if let Some(error) = failed {
                tracing::debug!(node = %node_id, %error, "reading services for templates; trying again");
                asked.clear();
                let pause = Duration::from_millis(rand::rng().random_range(1000..2000));
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = connection.changed() => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instances(name: &str) -> ServiceQuery {
        ServiceQuery::Instances { namespace: "default".into(), name: name.into() }
    }

    #[test]
    fn interests_are_counted_and_withdrawn_when_dropped() {
        let watch = ServiceWatch::new();
        let first = watch.interest(BTreeSet::from([instances("a"), instances("b")]));
        let second = watch.interest(BTreeSet::from([instances("b")]));
        assert_eq!(watch.wanted(), [instances("a"), instances("b")]);
        drop(first);
        assert_eq!(watch.wanted(), [instances("b")]);
        drop(second);
        assert!(watch.wanted().is_empty());
    }

    #[test]
    fn only_a_changed_answer_is_published() {
        let watch = ServiceWatch::new();
        let _interest = watch.interest(BTreeSet::from([instances("a")]));
        let mut data = watch.data();
        data.borrow_and_update();
        watch.publish(&[instances("a")], vec![ServiceAnswer::Instances(Vec::new())]);
        assert!(data.has_changed().expect("open"), "the first answer is news");
        data.borrow_and_update();
        watch.publish(&[instances("a")], vec![ServiceAnswer::Instances(Vec::new())]);
        assert!(!data.has_changed().expect("open"), "the same answer again is not");
        assert!(data.borrow().0.contains_key(&instances("a")));
    }
}
