//! Step 4 against a log that answers later (a durable one): a worker does
//! not wait for the status write that ends an eval, and acks the eval only
//! once it is written.

use super::*;
use crate::clock::{SystemClock, Timestamp};
use crate::server::{Server, ServerConfig};
use crate::state::{Command, Writer};
use crate::structs::{EvalStatus, Job, Resources, TriggerReason};
use crate::testing::{node, HeldLog};

/// The eval the status write `command` ends, if it is one.
fn ended(command: &Command) -> Option<EvalId> {
    match command {
        Command::UpsertEvals { evals } => evals.iter().find(|eval| eval.status == EvalStatus::Complete).map(|e| e.id),
        _ => None,
    }
}

/// The eval whose plan `command` is, if it is one.
fn planned(command: &Command) -> Option<EvalId> {
    match command {
        Command::ApplyPlanResults { eval_id, .. } => Some(*eval_id),
        _ => None,
    }
}

fn job(id: &str) -> (Job, Evaluation) {
    let job = Job::new_simple(id, JobType::Service, 1, Resources::new(100, 64, 0));
    let eval = Evaluation::for_job(&job, TriggerReason::JobRegister, Timestamp(0));
    (job, eval)
}

#[test]
fn a_worker_goes_on_while_an_eval_status_write_is_held_and_acks_the_eval_once_written() {
    let store = Arc::new(StateStore::new());
    store.apply(Command::UpsertNode { node: node(0), evals: vec![] }).expect("node");
    let log = HeldLog::new(store.clone());
    let config = ServerConfig { workers: 1, ..ServerConfig::default() };
    let server = Server::start_with(config, SystemClock::shared(), Writer::through(log.clone(), store.clone()));
    // Registered straight into the store: the apply hook hands the evals to
    // the broker, and the log holds only what the worker writes.
    let (a, first) = job("a");
    store.apply(Command::RegisterJob { job: a, eval: Some(first.clone()) }).expect("job a");
    log.wait_until("the worker never planned the first eval", |held| held.iter().any(|c| planned(c) == Some(first.id)));
    let (b, other) = job("b");
    store.apply(Command::RegisterJob { job: b, eval: Some(other.clone()) }).expect("job b");
    // A second eval of the first job waits in the broker while the first is held.
    let mut again = first.clone();
    again.id = EvalId::from_u128(7);
    store.apply(Command::UpsertEvals { evals: vec![again.clone()] }).expect("the job's next eval");

    log.write_held();
    // The first eval's status write is held; the worker went on to the
    // other job's eval (a worker waiting for the write never plans it).
    log.wait_until("the worker waited for the status write before its next eval", |held| {
        held.iter().any(|c| ended(c) == Some(first.id)) && held.iter().any(|c| planned(c) == Some(other.id))
    });
    assert!(server.broker().outstanding(first.id).is_some(), "acked before its status was written");
    assert_ne!(store.snapshot().eval(first.id).expect("first").status, EvalStatus::Complete);

    // Written, the first eval is acked, and only then does the broker hand
    // out its job's next eval: the worker ends that one too.
    log.write_held();
    log.wait_until("the job's next eval never ran: the first was not acked", |held| {
        held.iter().any(|c| ended(c) == Some(again.id))
    });
    assert_eq!(store.snapshot().eval(first.id).expect("first").status, EvalStatus::Complete);
    assert_eq!(server.broker().outstanding(first.id), None);
    log.write_held();
    server.shutdown();
}
