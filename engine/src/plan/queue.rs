//! The plan queue: plans from every worker wait here, highest job priority
//! first, then in arrival order, for the one plan applier.
//!
//! A worker [`PlanQueue::enqueue`]s its plan and waits on (or awaits) the
//! returned [`PlanFuture`] until the applier answers with a [`PlanResult`]
//! or an error.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

pub use crate::scheduler::PlanError;
use crate::structs::{Plan, PlanResult};
use crate::sync::Reply;

/// What the applier answers a plan with.
pub type PlanAnswer = Result<PlanResult, PlanError>;

/// A plan waiting for the applier, with the reply to answer on.
#[derive(Debug)]
pub struct PendingPlan {
    /// The plan.
    pub plan: Plan,
    reply: Arc<Reply<PlanAnswer>>,
    seq: u64,
}

impl PendingPlan {
    /// Answers the worker.
    pub fn respond(self, answer: PlanAnswer) {
        self.reply.set(answer);
    }

    /// Plans queue by job priority, then by arrival.
    fn rank(&self) -> (u8, Reverse<u64>) {
        (self.plan.priority, Reverse(self.seq))
    }
}

impl PartialEq for PendingPlan {
    fn eq(&self, other: &Self) -> bool {
        self.rank() == other.rank()
    }
}
impl Eq for PendingPlan {}
impl PartialOrd for PendingPlan {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for PendingPlan {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.rank().cmp(&other.rank())
    }
}

/// What a worker waits on after enqueueing a plan.
#[derive(Debug)]
pub struct PlanFuture {
    reply: Arc<Reply<PlanAnswer>>,
}

impl PlanFuture {
    /// Blocks until the applier answers.
    pub fn wait(self) -> PlanAnswer {
        self.reply.wait_take().unwrap_or(Err(PlanError::ShuttingDown))
    }

    /// Awaits the applier's answer; no thread waits.
    pub async fn answer(self) -> PlanAnswer {
        self.reply.take().await.unwrap_or(Err(PlanError::ShuttingDown))
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
        let reply = Arc::new(Reply::new());
        if self.shutting_down.load(Ordering::Acquire) {
            reply.set(Err(PlanError::ShuttingDown));
            return PlanFuture { reply };
        }
        let pending = PendingPlan { plan, reply: reply.clone(), seq: self.seq.fetch_add(1, Ordering::Relaxed) };
        self.heap.lock().push(pending);
        self.ready.notify_one();
        PlanFuture { reply }
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
        let drained: Vec<_> = {
            let mut heap = self.heap.lock();
            self.shutting_down.store(true, Ordering::Release);
            heap.drain().collect()
        };
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
