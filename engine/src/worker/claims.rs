//! Node claims: a hint that keeps parallel workers off each other's nodes,
//! so fewer plans conflict in the plan applier (the scheduler's
//! [`NodeClaims`]). It is only a hint: the applier still checks every plan.
//!
//! A worker claims the nodes it places on while it plans. When its plan is
//! committed at index `i`, those claims stay visible to workers whose
//! snapshot predates `i` (they cannot see the placements yet), until the
//! worker commits its next plan. A refused or abandoned plan drops them.

use parking_lot::Mutex;

use crate::scheduler::NodeClaims;
use crate::structs::NodeId;

/// A claimant's nodes: claimed while planning, and of its last committed plan.
#[derive(Debug, Default)]
struct Held {
    /// Claimed while planning.
    planning: Vec<NodeId>,
    /// Of its last committed plan.
    committed: Vec<NodeId>,
}

/// Marks a claim whose plan is still being made or waiting to be applied.
const PLANNING: u64 = u64::MAX;

/// The node claims workers share ([`NodeClaims`]): node → (worker, the index
/// its plan was committed at, or `PLANNING`). A committed claim stays
/// visible to workers whose snapshot is older than the commit, and is dropped
/// when its worker commits its next plan.
#[derive(Debug)]
pub struct ClaimTable {
    shards: Vec<Mutex<hashbrown::HashMap<NodeId, (u64, u64)>>>,
    /// Per claimant: nodes claimed while planning, and nodes of its last committed plan.
    held: Mutex<hashbrown::HashMap<u64, Held>>,
}

impl Default for ClaimTable {
    fn default() -> Self {
        ClaimTable {
            shards: (0..64).map(|_| Mutex::new(hashbrown::HashMap::new())).collect(),
            held: Mutex::new(hashbrown::HashMap::new()),
        }
    }
}

impl ClaimTable {
    fn shard(&self, node: NodeId) -> &Mutex<hashbrown::HashMap<NodeId, (u64, u64)>> {
        let (high, low) = node.0.as_u64_pair();
        &self.shards[(high ^ low) as usize % self.shards.len()]
    }

    /// Applies `change` to each of `nodes` still held by `claimant`; drops the entry when it returns false.
    fn update(&self, claimant: u64, nodes: &[NodeId], change: impl Fn(&mut u64) -> bool) {
        for node in nodes {
            let mut shard = self.shard(*node).lock();
            if let Some((holder, committed)) = shard.get_mut(node) {
                if *holder == claimant && !change(committed) {
                    shard.remove(node);
                }
            }
        }
    }

    /// The claimant's plan was committed at `index`: its planning claims
    /// become committed claims, and those of its previous plan are dropped.
    pub fn settle(&self, claimant: u64, index: u64) {
        let (planning, previous) = {
            let mut held = self.held.lock();
            let claims = held.entry(claimant).or_default();
            let previous = std::mem::replace(&mut claims.committed, claims.planning.clone());
            (std::mem::take(&mut claims.planning), previous)
        };
        self.update(claimant, &previous, |committed| *committed == PLANNING);
        self.update(claimant, &planning, |committed| {
            *committed = index;
            true
        });
    }

    /// Drops the claimant's planning claims (a refused or abandoned plan).
    pub fn release(&self, claimant: u64) {
        let planning = std::mem::take(&mut self.held.lock().entry(claimant).or_default().planning);
        self.update(claimant, &planning, |committed| *committed != PLANNING);
    }
}

impl NodeClaims for ClaimTable {
    fn claimed_by_other(&self, node: NodeId, claimant: u64, snapshot_index: u64) -> bool {
        self.shard(node)
            .lock()
            .get(&node)
            .is_some_and(|(holder, committed)| *holder != claimant && *committed > snapshot_index)
    }

    fn try_claim(&self, node: NodeId, claimant: u64) -> bool {
        let mut shard = self.shard(node).lock();
        match shard.get(&node) {
            Some((holder, PLANNING)) if *holder != claimant => false,
            _ => {
                shard.insert(node, (claimant, PLANNING));
                drop(shard);
                self.held.lock().entry(claimant).or_default().planning.push(node);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_hide_nodes_until_other_workers_can_see_the_commit() {
        let table = ClaimTable::default();
        let node = NodeId::from_u128(1);
        assert!(table.try_claim(node, 1));
        assert!(!table.try_claim(node, 2), "worker 1 is still planning on it");
        assert!(table.claimed_by_other(node, 2, 1_000));
        assert!(!table.claimed_by_other(node, 1, 0), "a worker's own claims never hide a node from it");

        table.settle(1, 50);
        assert!(table.claimed_by_other(node, 2, 49), "a snapshot before the commit cannot see it");
        assert!(!table.claimed_by_other(node, 2, 50), "a snapshot at the commit can");
        assert!(table.try_claim(node, 2), "committed claims do not block a new plan");

        let other = NodeId::from_u128(2);
        assert!(table.try_claim(other, 1));
        table.release(1);
        assert!(!table.claimed_by_other(other, 2, 0), "a refused plan's claims are dropped");
        table.settle(3, 60);
        assert!(table.claimed_by_other(node, 1, 0), "worker 2 still plans on the first node");
    }
}
