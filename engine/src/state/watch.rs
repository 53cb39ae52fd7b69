//! Per-node watches: a client waiting for its allocations is woken only by
//! a command that changed an allocation on its node, not by every write
//! (10,000 clients holding a watch each must not all wake on every commit).
//!
//! The writer knows which nodes a command touched (`Applied::touched_nodes`)
//! and notifies only their events; a command of clients' reports of their
//! own allocations notifies none (`Applied::reported_by_clients`). A
//! watcher listens first and then checks the state, so a change between
//! its check and its wait still wakes it.

use std::sync::Arc;

use event_listener::{Event, EventListener};
use hashbrown::HashMap;
use parking_lot::Mutex;

use crate::structs::NodeId;

const SHARDS: usize = 16;

/// The events of watched nodes, created on first watch.
#[derive(Debug)]
pub(super) struct NodeWatches {
    shards: Vec<Mutex<HashMap<NodeId, Arc<Event>>>>,
}

impl Default for NodeWatches {
    fn default() -> Self {
        NodeWatches { shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect() }
    }
}

impl NodeWatches {
    fn shard(&self, node_id: NodeId) -> &Mutex<HashMap<NodeId, Arc<Event>>> {
        let (high, low) = node_id.0.as_u64_pair();
        &self.shards[(high ^ low) as usize % SHARDS]
    }

    pub(super) fn watch(&self, node_id: NodeId) -> NodeWatch {
        let event = self.shard(node_id).lock().entry(node_id).or_insert_with(|| Arc::new(Event::new())).clone();
        NodeWatch { event }
    }

    /// Wakes the watchers of `nodes`, and only those.
    pub(super) fn notify(&self, nodes: &[NodeId]) {
        for node_id in nodes {
            let event = self.shard(*node_id).lock().get(node_id).cloned();
            if let Some(event) = event {
                event.notify(usize::MAX);
            }
        }
    }

    /// Wakes every watcher (shutdown).
    pub(super) fn notify_all(&self) {
        for shard in &self.shards {
            for event in shard.lock().values() {
                event.notify(usize::MAX);
            }
        }
    }
}

/// A watch on one node's allocations ([`super::StateStore::watch_node`]).
#[derive(Clone, Debug)]
pub struct NodeWatch {
    event: Arc<Event>,
}

impl NodeWatch {
    /// Starts listening: the listener (a future, or `.wait()` for threads)
    /// completes at the next change to the node's allocations, or at
    /// shutdown. Listen first, then check the state, then wait.
    pub fn listen(&self) -> EventListener {
        self.event.listen()
    }
}

/// Waits until `check` finds what it looks for: checks, starts listening,
/// checks again (so a change between the first check and the listening is
/// not missed), then blocks this thread until the next notification or
/// `deadline`. `Ok(None)`: the deadline passed first.
pub fn wait_until<T, E>(
    listen: impl Fn() -> EventListener,
    deadline: std::time::Instant,
    mut check: impl FnMut() -> Result<Option<T>, E>,
) -> Result<Option<T>, E> {
    loop {
        if let Some(found) = check()? {
            return Ok(Some(found));
        }
        let listener = listen();
        if let Some(found) = check()? {
            return Ok(Some(found));
        }
        if event_listener::Listener::wait_deadline(listener, deadline).is_none() {
            return Ok(None);
        }
    }
}

/// [`wait_until`], awaited and without a deadline: no thread waits.
pub async fn wait_until_async<T, E>(
    listen: impl Fn() -> EventListener,
    mut check: impl FnMut() -> Result<Option<T>, E>,
) -> Result<T, E> {
    loop {
        if let Some(found) = check()? {
            return Ok(found);
        }
        let listener = listen();
        if let Some(found) = check()? {
            return Ok(found);
        }
        listener.await;
    }
}
