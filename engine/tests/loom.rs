//! Model checks (loom) of the hand-written hand-offs, exploring every
//! interleaving up to a bounded number of preemptions:
//! - the broker's wake-up of a dequeuing worker ([`engine::eval::wake`]);
//! - the update batcher's hand-off, submitters to the flusher and the
//!   written batch back to each submitter ([`engine::node::update_batch`]);
//! - [`engine::sync::Reply`], a value set once and waited for.
//!
//! Run with `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p engine --test loom --release`.
#![cfg(loom)]

use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};
use std::sync::Arc as StdArc;
use std::time::Duration;

use engine::eval::wake::WakeGate;
use engine::node::update_batch::{BatchConfig, UpdateBatcher, WriteBatch};
use engine::state::{Applied, ClientAllocUpdate, StateError};
use engine::structs::{AllocId, ClientStatus, NodeId};
use engine::sync::Reply;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

#[test]
fn a_worker_parking_on_the_gate_never_misses_a_published_eval() {
    loom::model(|| {
        let ready = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(WakeGate::new());
        let producer = {
            let (ready, gate) = (ready.clone(), gate.clone());
            thread::spawn(move || {
                // Publish, then notify: the broker's push_ready.
                ready.fetch_add(1, Ordering::SeqCst);
                gate.notify();
            })
        };
        // The worker's dequeue: look, park, look again; no deadline, so a
        // missed wake-up would leave it parked forever, which loom reports.
        let taken = gate.wait_for(None, || {
            let available = ready.load(Ordering::SeqCst);
            (available > 0
                && ready.compare_exchange(available, available - 1, Ordering::SeqCst, Ordering::SeqCst).is_ok())
            .then_some(())
        });
        assert!(taken.is_some());
        producer.join().expect("producer");
    });
}

#[test]
fn a_reply_set_while_waited_for_is_seen() {
    loom::model(|| {
        let reply: Arc<Reply<u32>> = Arc::new(Reply::new());
        let setter = {
            let reply = reply.clone();
            thread::spawn(move || {
                reply.set(7);
            })
        };
        assert_eq!(reply.wait(), 7);
        setter.join().expect("setter");
    });
}

fn update(n: u128) -> ClientAllocUpdate {
    ClientAllocUpdate {
        alloc_id: AllocId::from_u128(n),
        node_id: NodeId::from_u128(1),
        client_status: ClientStatus::Running,
        client_description: String::new(),
        services: None,
        checks: None,
        health: None,
        task_states: Default::default(),
    }
}

#[test]
fn every_submission_to_the_batcher_is_written_and_answered() {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(2);
    builder.check(|| {
        // A window that never passes: batches are sealed by size or by stop.
        let config = BatchConfig { window: Duration::from_secs(3_600), max_updates: 2 };
        let written = StdArc::new(StdAtomicUsize::new(0));
        let counter = written.clone();
        let write: WriteBatch = Box::new(move |updates| {
            let index = counter.fetch_add(updates.len(), StdOrdering::SeqCst) as u64 + 1;
            Ok::<_, StateError>(StdArc::new(Applied { index, ..Applied::default() }))
        });
        let batcher = UpdateBatcher::with_write(config, write);
        let flusher = batcher.spawn();
        let submitters: Vec<_> = (0..2)
            .map(|n| {
                let batcher = batcher.clone();
                thread::spawn(move || batcher.submit(vec![update(n)]).map(|pending| pending.wait()))
            })
            .collect();
        batcher.stop();
        let answers: Vec<_> = submitters.into_iter().map(|submitter| submitter.join().expect("submitter")).collect();
        flusher.join().expect("flusher");
        for answer in answers {
            // Either written, or refused because stop came first; never lost.
            match answer {
                Ok(Ok(index)) => assert!(index >= 1),
                Ok(Err(error)) => panic!("a submitted update was refused: {error}"),
                Err(StateError::ShuttingDown) => {}
                Err(error) => panic!("unexpected refusal: {error}"),
            }
        }
        assert!(batcher.is_stopped());
    });
}
