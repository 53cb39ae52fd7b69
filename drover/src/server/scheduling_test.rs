//! The leader's side of followers' scheduling calls, over one server's
//! leader services on a manual clock: a hold is handed out with the
//! leader's term and its wait index; a call of another term, an unknown
//! token, or eval writes under a hold that ended are refused; a hold
//! nobody ends is taken back at its nack timeout and handed out again
//! under a new token, and the old one is refused from then on.

use std::sync::Arc;
use std::time::Duration;

use engine::clock::{ManualClock, Timestamp};
use engine::eval::broker::{BrokerConfig, BrokerError, Token};
use engine::scheduler::PlanError;
use engine::server::{Server, ServerConfig};
use engine::state::StateError;
use engine::structs::{Job, JobType, Plan, PlanResult, Resources};

use super::{decode_whole, serve, Handed, Hold, SchedulingCall, SchedulingRefusal};

const NACK_TIMEOUT: Duration = Duration::from_secs(60);

/// Leader services with no workers of their own (so nothing but the test
/// takes their evals), and one job's eval waiting in their broker.
fn leader_with_an_eval() -> (Arc<Server>, Arc<ManualClock>, u64) {
    let clock = ManualClock::new(Timestamp(1_000_000_000));
    // An eval taken back is ready again at once (not after Nomad's 1 s
    // delay, which this clock would wait for forever).
    let broker =
        BrokerConfig { nack_timeout: NACK_TIMEOUT, initial_nack_delay: Duration::ZERO, ..BrokerConfig::default() };
    let config = ServerConfig { workers: 0, broker, ..ServerConfig::default() };
    let server = Server::start(config, clock.clone());
    let written = server.jobs().register(Job::new_simple("web", JobType::Service, 2, Resources::new(10, 10, 0)));
    let index = written.expect("the job registers").index;
    (Arc::new(server), clock, index)
}

/// Makes `call` on the leader, which answers it: the answer, decoded.
async fn answer<T: serde::de::DeserializeOwned>(leader: &Arc<Server>, call: SchedulingCall) -> T {
    let bytes = serve(Some((leader.clone(), 0)), &call.encode()).await.expect("the leader answers");
    decode_whole(&bytes).expect("the leader's answer decodes")
}

/// Makes `call` on the leader, which refuses it: why.
async fn refusal(leader: &Arc<Server>, call: SchedulingCall) -> SchedulingRefusal {
    serve(Some((leader.clone(), 0)), &call.encode()).await.expect_err("the leader refuses")
}

/// What the leader's broker answers a call about a hold.
async fn broker_answer(leader: &Arc<Server>, call: SchedulingCall) -> Result<(), BrokerError> {
    answer(leader, call).await
}

/// The next eval the leader hands out, waiting for one as long as it takes.
async fn dequeue(leader: &Arc<Server>) -> Handed {
    loop {
        let asked = SchedulingCall::Dequeue { types: JobType::ALL.to_vec(), wait_ms: 2_000 };
        let handed: Result<Option<Handed>, BrokerError> = answer(leader, asked).await;
        if let Some(handed) = handed.expect("the broker hands out evals") {
            return handed;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_is_handed_out_in_the_leaders_term_and_refused_in_another() {
    let (leader, _clock, written_at) = leader_with_an_eval();
    let handed = dequeue(&leader).await;
    assert_eq!(handed.term, 0, "the term the leader services run in");
    assert!(handed.wait_index >= written_at && handed.wait_index >= handed.eval.modify_index);
    let hold = Hold { term: handed.term, eval: handed.eval.id, token: handed.token };

    let other_term = refusal(&leader, SchedulingCall::Ack(Hold { term: 7, ..hold })).await;
    assert!(matches!(other_term, SchedulingRefusal::OtherTerm { leads: 0, asked: 7 }), "{other_term:?}");
    let other_token = Hold { token: Token(hold.token.0 + 1), ..hold };
    let evals = SchedulingCall::Evals { hold: other_token, evals: vec![handed.eval.clone()] };
    let stale = refusal(&leader, evals).await;
    assert!(matches!(stale, SchedulingRefusal::StaleHold(id) if id == hold.eval), "{stale:?}");
    let mismatch = broker_answer(&leader, SchedulingCall::Ack(other_token)).await;
    assert_eq!(mismatch, Err(BrokerError::TokenMismatch(hold.eval)));

    // Under the right hold the eval's writes and its ack are taken.
    let evals = SchedulingCall::Evals { hold, evals: vec![handed.eval.clone()] };
    let written: Result<u64, StateError> = answer(&leader, evals).await;
    assert!(written.is_ok_and(|index| index > written_at));
    assert_eq!(broker_answer(&leader, SchedulingCall::Ack(hold)).await, Ok(()));
    leader.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_nobody_ends_is_taken_back_at_its_nack_timeout_and_its_token_refused() {
    let (leader, clock, _) = leader_with_an_eval();
    let first = dequeue(&leader).await;
    let kept = Hold { term: first.term, eval: first.eval.id, token: first.token };
    assert_eq!(broker_answer(&leader, SchedulingCall::Reset(kept)).await, Ok(()));

    // The follower holding it goes silent past the nack timeout.
    clock.advance(NACK_TIMEOUT + Duration::from_secs(1));
    let again = dequeue(&leader).await;
    assert_eq!(again.eval.id, first.eval.id, "the same eval, handed out again");
    assert_ne!(again.token, first.token);

    let late_ack = broker_answer(&leader, SchedulingCall::Ack(kept)).await;
    assert_eq!(late_ack, Err(BrokerError::TokenMismatch(first.eval.id)));
    let late_plan = Plan { eval_id: first.eval.id, eval_token: first.token.0, ..Plan::default() };
    let planned: Result<PlanResult, PlanError> =
        answer(&leader, SchedulingCall::Plan { term: 0, plan: Box::new(late_plan) }).await;
    assert_eq!(planned, Err(PlanError::StaleToken(first.eval.id)));
    let current = Hold { term: again.term, eval: again.eval.id, token: again.token };
    assert_eq!(broker_answer(&leader, SchedulingCall::Ack(current)).await, Ok(()));
    leader.shutdown();
}
