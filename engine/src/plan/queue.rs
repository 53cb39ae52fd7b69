//! The plan queue: plans from every worker wait here, highest job priority
//! first, then in arrival order, for the one plan applier.
//!
//! A worker [`PlanQueue::enqueue`]s its plan and blocks on the returned
//! [`PlanFuture`] until the applier answers with a [`PlanResult`] or an error.

use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam::channel::{self, Receiver, Sender};
use parking_lot::{Condvar, Mutex};

use crate::structs::{Plan, PlanResult};

/// Why a plan was not applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The eval's broker token is no longer outstanding: the worker's hold
    /// expired and another worker may have the eval.
    #[error("evaluation {0} is no longer held under this plan's token")]
    StaleToken(crate::structs::EvalId),
    /// The plan could not be written.
    #[error("plan could not be written: {0}")]
    Write(String),
    /// The plan queue is shutting down.
    #[error("the plan queue is shutting down")]
    ShuttingDown,
}

/// A plan waiting for the applier, with the channel to answer on.
#[derive(Debug)]
pub struct PendingPlan {
    /// The plan.
    pub plan: Plan,
    reply: Sender<Result<PlanResult, PlanError>>,
    seq: u64,
    /// When it was enqueued (for queue-wait metrics).
    pub enqueued_at: Instant,
}

impl PendingPlan {
    /// Answers the worker.
    pub fn respond(self, result: Result<PlanResult, PlanError>) {
        // The worker may have given up (shutdown); nothing to do then.
        let _ = self.reply.send(result);
    }
}

impl PartialEq for PendingPlan {
    fn eq(&self, other: &Self) -> bool {
        self.seq == other.seq
    }
}
impl Eq for PendingPlan {}
impl PartialOrd for PendingPlan {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for PendingPlan {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        self.plan.priority.cmp(&other.plan.priority).then(other.seq.cmp(&self.seq))
    }
}

/// What a worker waits on after enqueueing a plan.
#[derive(Debug)]
pub struct PlanFuture {
    reply: Receiver<Result<PlanResult, PlanError>>,
}

impl PlanFuture {
    /// Blocks until the applier answers.
    pub fn wait(self) -> Result<PlanResult, PlanError> {
        self.reply.recv().unwrap_or(Err(PlanError::ShuttingDown))
    }
}

/// The queue; see the module docs.
#[derive(Debug, Default)]
pub struct PlanQueue {
    heap: Mutex<BinaryHeap<PendingPlan>>,
    ready: Condvar,
    seq: AtomicU64,
    shutting_down: AtomicBool,
}

impl PlanQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a plan; the future resolves when the applier is done with it.
    pub fn enqueue(&self, plan: Plan) -> PlanFuture {
        let (reply, receiver) = channel::bounded(1);
        if self.shutting_down.load(Ordering::Acquire) {
            let _ = reply.send(Err(PlanError::ShuttingDown));
            return PlanFuture { reply: receiver };
        }
        let pending =
            PendingPlan { plan, reply, seq: self.seq.fetch_add(1, Ordering::Relaxed), enqueued_at: Instant::now() };
        self.heap.lock().push(pending);
        self.ready.notify_one();
        PlanFuture { reply: receiver }
    }

    /// The next plan, waiting up to `timeout`. `None` on timeout or shutdown.
    pub fn dequeue(&self, timeout: Duration) -> Option<PendingPlan> {
        let deadline = Instant::now() + timeout;
        let mut heap = self.heap.lock();
        loop {
            if let Some(pending) = heap.pop() {
                return Some(pending);
            }
            if self.shutting_down.load(Ordering::Acquire) || self.ready.wait_until(&mut heap, deadline).timed_out() {
                return heap.pop();
            }
        }
    }

    /// Plans waiting.
    pub fn depth(&self) -> usize {
        self.heap.lock().len()
    }

    /// Refuses new plans, answers every waiting one with
    /// [`PlanError::ShuttingDown`] and wakes the applier.
    pub fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
        let drained: Vec<_> = self.heap.lock().drain().collect();
        for pending in drained {
            pending.respond(Err(PlanError::ShuttingDown));
        }
        self.ready.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(priority: u8) -> Plan {
        Plan { priority, ..Plan::default() }
    }

    #[test]
    fn plans_come_out_by_priority_then_arrival() {
        let queue = PlanQueue::new();
        let _low = queue.enqueue(plan(10));
        let _high_first = queue.enqueue(plan(90));
        let _high_second = queue.enqueue(plan(90));
        let order: Vec<_> = std::iter::from_fn(|| queue.dequeue(Duration::ZERO))
            .map(|pending| (pending.plan.priority, pending.seq))
            .collect();
        assert_eq!(order, [(90, 1), (90, 2), (10, 0)]);
    }

    #[test]
    fn the_worker_gets_the_answer_and_shutdown_answers_everyone() {
        let queue = PlanQueue::new();
        let answered = queue.enqueue(plan(50));
        let waiting = queue.enqueue(plan(50));
        let pending = queue.dequeue(Duration::ZERO).expect("a plan");
        pending.respond(Ok(PlanResult { alloc_index: 7, ..PlanResult::default() }));
        assert_eq!(answered.wait().expect("applied").alloc_index, 7);
        queue.shutdown();
        assert_eq!(waiting.wait(), Err(PlanError::ShuttingDown));
        assert_eq!(queue.enqueue(plan(50)).wait(), Err(PlanError::ShuttingDown));
        assert!(queue.dequeue(Duration::ZERO).is_none());
    }
}
