//! Scheduling on every server of a cluster (Nomad's design).
//!
//! Each server of a cluster runs one pool of scheduling workers for its
//! whole life, over [`ClusterWork`]. While the server leads, its workers
//! take evals from its own broker and give their plans to its own applier.
//! While it follows, they take them from the leader's broker and give
//! their plans and eval writes to the leader, over the server-to-server
//! endpoint ([`kinds::SCHEDULING`]), and schedule against this server's
//! own replicated store: the scheduling work of a cluster is spread over
//! all its servers, and only the plan applier is the leader's alone.
//!
//! Holds across servers: the leader's broker keeps every hold, with the
//! token it handed out and its nack timeout, wherever the worker runs. A
//! follower's worker acks, nacks, resets its hold and submits its plans
//! and eval writes to the server that handed the eval out, in the raft
//! term it was handed out in ([`SchedulingCall`] carries it); the leader
//! refuses any call of another term, and a follower gives up a call as
//! soon as raft names another leader. So a worker that loses its leader
//! gives its eval back (its nack fails; the new leader's broker has every
//! pending eval again from the state, as after any failover), and a plan
//! made under an old leader is never applied by a new one. A hold a
//! follower never ends (it died, or the network parted) ends with the
//! broker's nack timeout, as a local one would.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use engine::eval::broker::{BrokerError, Dequeued, Token};
use engine::scheduler::PlanError;
use engine::server::Server;
use engine::state::{Applied, Command, LogError, PendingWrite, Snapshot, StateError, StateStore};
use engine::structs::job_refs::{take_postcard_sharing, to_postcard_sharing};
use engine::structs::{EvalId, Evaluation, JobType, Plan, PlanResult};
use engine::worker::{LocalWork, WorkError, WorkSource};
use parking_lot::Mutex;
use replication::Durable;
use serde::{Deserialize, Serialize};
use transport::peer::Peers;

use super::kinds;
use super::leader_calls::{leader_peer, while_it_leads, LeaderError};

/// The longest a follower's dequeue waits on the leader (a longer wait
/// asked for is cut to it), so a worker notices a pause or a stop.
pub const MAX_REMOTE_DEQUEUE_WAIT: Duration = Duration::from_secs(2);

/// How long a call to the leader may take beyond what it waits for: a
/// plan waits for the leader's applier and its log.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A scheduling call a follower's worker makes on the leader.
#[derive(Debug, Serialize, Deserialize)]
pub enum SchedulingCall {
    /// The next eval of these types, waiting up to `wait_ms` for one.
    Dequeue {
        /// The scheduler types the worker serves.
        types: Vec<JobType>,
        /// How long to wait, in milliseconds (at most
        /// [`MAX_REMOTE_DEQUEUE_WAIT`]).
        wait_ms: u64,
    },
    /// Ends a hold: the eval is done.
    Ack(Hold),
    /// Ends a hold: the eval goes back to the broker.
    Nack(Hold),
    /// Starts a hold's nack timeout again.
    Reset(Hold),
    /// A plan of a held eval (its token is in the plan).
    Plan {
        /// The term the eval was handed out in.
        term: u64,
        /// The plan (boxed: a call is small but for it).
        plan: Box<Plan>,
    },
    /// Evals the scheduler created or changed while it held `hold`.
    Evals {
        /// The hold they were written under.
        hold: Hold,
        /// The evals.
        evals: Vec<Evaluation>,
    },
}

/// An eval the leader handed out: which, under which token, in which term.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Hold {
    /// The leader's raft term when it handed the eval out.
    pub term: u64,
    /// The eval.
    pub eval: EvalId,
    /// The broker's token.
    pub token: Token,
}

/// The leader's answer to [`SchedulingCall::Dequeue`].
#[derive(Debug, Serialize, Deserialize)]
pub struct Handed {
    /// The leader's term.
    pub term: u64,
    /// The eval.
    pub eval: Evaluation,
    /// The broker's token.
    pub token: Token,
    /// The index the follower's store must reach before it schedules
    /// ([`Dequeued::wait_index`]).
    pub wait_index: u64,
}

impl SchedulingCall {
    /// The call as it travels (postcard, a plan's jobs carried once).
    pub fn encode(&self) -> Vec<u8> {
        let jobs = match self {
            SchedulingCall::Plan { plan, .. } => Some(plan.alloc_jobs()),
            _ => None,
        };
        to_postcard_sharing(self, jobs.into_iter().flatten(), Vec::new()).expect("a scheduling call encodes")
    }

    /// A call from the bytes [`SchedulingCall::encode`] wrote.
    pub fn decode(bytes: &[u8]) -> Result<SchedulingCall, postcard::Error> {
        decode_whole(bytes)
    }
}

/// A value [`to_postcard_sharing`] wrote, with no bytes after it.
fn decode_whole<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, postcard::Error> {
    match take_postcard_sharing(bytes)? {
        (value, []) => Ok(value),
        _ => Err(postcard::Error::DeserializeBadEncoding),
    }
}

/// Encodes an answer (a plan result's jobs carried once).
fn encode_answer<T: Serialize>(answer: &T, result: Option<&PlanResult>) -> Vec<u8> {
    let jobs = result.map(PlanResult::alloc_jobs).into_iter().flatten();
    to_postcard_sharing(answer, jobs, Vec::new()).expect("a scheduling answer encodes")
}

/// Why the leader did not serve a scheduling call (sent back as the
/// refusal's reason).
#[derive(Debug, thiserror::Error)]
pub enum SchedulingRefusal {
    /// The call did not decode.
    #[error("a malformed scheduling call: {0}")]
    Malformed(postcard::Error),
    /// This server's leader services do not run.
    #[error("this server does not lead")]
    NotLeading,
    /// The call belongs to another leadership.
    #[error("this server leads in term {leads}, not {asked}")]
    OtherTerm {
        /// The term it leads in.
        leads: u64,
        /// The term the call names.
        asked: u64,
    },
    /// Eval writes under a hold the broker no longer knows.
    #[error("evaluation {0} is no longer held under this token")]
    StaleHold(EvalId),
    /// The blocking part of the call failed.
    #[error("serving the call failed: {0}")]
    Failed(#[from] tokio::task::JoinError),
}

/// Why a call to the leader got no answer a worker can use.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No leader answered (module docs of `leadership`).
    #[error(transparent)]
    Leader(#[from] LeaderError),
    /// The leader's answer did not decode.
    #[error("a malformed answer from the leader: {0}")]
    Malformed(postcard::Error),
}

impl CallError {
    /// As a write the log did not take: "stopped" when raft stopped here,
    /// else refused (the worker retries, through whichever server leads).
    fn into_state_error(self, leader: u64) -> StateError {
        let reason = format!("the leader, server {leader}: {self}");
        match self {
            CallError::Leader(LeaderError::Stopped) => StateError::Log(LogError::Stopped { reason }),
            _ => StateError::Log(LogError::Refused { reason }),
        }
    }
}

/// Serves a follower's scheduling call on the leader (module docs):
/// `leading` is this server's leader services and the raft term they run
/// in, while it leads.
pub async fn serve(leading: Option<(Arc<Server>, u64)>, request: &[u8]) -> Result<Vec<u8>, SchedulingRefusal> {
    let call = SchedulingCall::decode(request).map_err(SchedulingRefusal::Malformed)?;
    let (server, term) = leading.ok_or(SchedulingRefusal::NotLeading)?;
    let work = server.work();
    let in_term = |asked: u64| {
        if asked == term {
            Ok(())
        } else {
            Err(SchedulingRefusal::OtherTerm { leads: term, asked })
        }
    };
    match call {
        SchedulingCall::Dequeue { types, wait_ms } => {
            let wait = Duration::from_millis(wait_ms).min(MAX_REMOTE_DEQUEUE_WAIT);
            let store = server.store().clone();
            // The broker's wait blocks a thread.
            let handed = tokio::task::spawn_blocking(move || hand_out(&work, &store, term, &types, wait));
            Ok(encode_answer(&handed.await?, None))
        }
        SchedulingCall::Ack(hold) => {
            in_term(hold.term)?;
            Ok(encode_answer(&work.broker.ack(hold.eval, hold.token), None))
        }
        SchedulingCall::Nack(hold) => {
            in_term(hold.term)?;
            Ok(encode_answer(&work.broker.nack(hold.eval, hold.token), None))
        }
        SchedulingCall::Reset(hold) => {
            in_term(hold.term)?;
            Ok(encode_answer(&work.broker.outstanding_reset(hold.eval, hold.token), None))
        }
        SchedulingCall::Plan { term: asked, plan } => {
            in_term(asked)?;
            let answer = work.plan_queue.enqueue(*plan).answer().await;
            Ok(encode_answer(&answer, answer.as_ref().ok()))
        }
        SchedulingCall::Evals { hold, evals } => {
            in_term(hold.term)?;
            if work.broker.outstanding(hold.eval) != Some(hold.token) {
                return Err(SchedulingRefusal::StaleHold(hold.eval));
            }
            let written = work.writer.submit(Command::UpsertEvals { evals }).await.map(|applied| applied.index);
            Ok(encode_answer(&written, None))
        }
    }
}

/// The leader's side of [`SchedulingCall::Dequeue`]: the next eval of
/// `types` from its broker, waiting up to `wait`, with its wait index.
fn hand_out(
    work: &LocalWork,
    store: &StateStore,
    term: u64,
    types: &[JobType],
    wait: Duration,
) -> Result<Option<Handed>, BrokerError> {
    let dequeued = work.broker.dequeue(types, wait)?;
    Ok(dequeued.map(|Dequeued { eval, token, .. }| {
        let wait_index = wait_index(&store.snapshot(), &eval);
        Handed { term, eval: Evaluation::clone(&eval), token, wait_index }
    }))
}

/// The index a follower's store must reach before it schedules `eval`:
/// the newest modify index of any eval of its job (Nomad's
/// `getWaitIndex`). The broker hands out one eval of a job at a time, and
/// the one before was written complete after its plan, so a store at that
/// index holds every placement the job's earlier evals made.
fn wait_index(snapshot: &Snapshot, eval: &Evaluation) -> u64 {
    let job = eval.job_key();
    snapshot.evals_by_job(&job).map(|other| other.modify_index).fold(eval.modify_index, u64::max)
}

/// What a server's work source needs of its leadership
/// (`leadership::Leadership`).
pub trait LeaderServices: Send + Sync {
    /// The leader services, while this server leads.
    fn leader(&self) -> Option<Arc<Server>>;
    /// Watches whether they run.
    fn watch(&self) -> tokio::sync::watch::Receiver<bool>;
}

/// Where a server's evals come from: its own broker while it leads, the
/// leader's otherwise (module docs).
#[derive(Debug)]
pub struct ClusterWork {
    leadership: Weak<dyn LeaderServices>,
    durable: Arc<Durable>,
    peers: Arc<Peers>,
    /// The runtime the calls to the leader run on (workers are threads).
    runtime: tokio::runtime::Handle,
    /// Who handed out each eval this server's workers hold.
    held: Mutex<HashMap<(EvalId, Token), Holder>>,
    /// Evals taken from another server's broker.
    remote_evals: AtomicU64,
    /// Plans given to another server's applier.
    remote_plans: AtomicU64,
}

/// What a server's workers did through the leader while following.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteStats {
    /// Evals taken from the leader's broker.
    pub evals: u64,
    /// Plans given to the leader's applier.
    pub plans: u64,
}

/// Who handed out an eval.
#[derive(Debug, Clone)]
enum Holder {
    /// This server, while it led.
    Local(LocalWork),
    /// The leader at `addr`, raft id `leader`, in `term`.
    Remote {
        /// Its raft id.
        leader: u64,
        /// Its server-to-server address.
        addr: SocketAddr,
        /// The term it handed the eval out in.
        term: u64,
    },
}

impl ClusterWork {
    /// The work source of a server of a cluster: `leadership` says when it
    /// leads; calls to the leader go through `peers` on `runtime`.
    pub fn new(
        leadership: &Arc<dyn LeaderServices>,
        durable: Arc<Durable>,
        peers: Arc<Peers>,
        runtime: tokio::runtime::Handle,
    ) -> ClusterWork {
        ClusterWork {
            leadership: Arc::downgrade(leadership),
            durable,
            peers,
            runtime,
            held: Mutex::default(),
            remote_evals: AtomicU64::new(0),
            remote_plans: AtomicU64::new(0),
        }
    }

    /// What this server's workers did through the leader.
    pub fn stats(&self) -> RemoteStats {
        RemoteStats {
            evals: self.remote_evals.load(Ordering::Relaxed),
            plans: self.remote_plans.load(Ordering::Relaxed),
        }
    }

    fn holder(&self, eval: EvalId, token: Token) -> Option<Holder> {
        self.held.lock().get(&(eval, token)).cloned()
    }

    /// Calls the leader `leader` at `addr` and decodes its answer; fails as
    /// soon as raft names another leader.
    fn call<T: serde::de::DeserializeOwned>(
        &self,
        leader: u64,
        addr: SocketAddr,
        call: &SchedulingCall,
        timeout: Duration,
    ) -> Result<T, CallError> {
        let request = call.encode();
        let bytes = self.runtime.block_on(async {
            let call = self.peers.call(addr, kinds::SCHEDULING, &request, timeout);
            while_it_leads(&self.durable, leader, call).await
        })?;
        decode_whole(&bytes).map_err(CallError::Malformed)
    }

    /// A call about a hold, to whoever handed it out.
    fn hold_call(
        &self,
        eval: EvalId,
        token: Token,
        local: impl FnOnce(&LocalWork) -> Result<(), WorkError>,
        remote: impl FnOnce(Hold) -> SchedulingCall,
    ) -> Result<(), WorkError> {
        match self.holder(eval, token) {
            None => Err(WorkError::Broker(BrokerError::NotOutstanding(eval))),
            Some(Holder::Local(work)) => local(&work),
            Some(Holder::Remote { leader, addr, term }) => {
                let call = remote(Hold { term, eval, token });
                let answer: Result<(), BrokerError> = self
                    .call(leader, addr, &call, CALL_TIMEOUT)
                    .map_err(|error| WorkError::Unreachable(error.to_string()))?;
                Ok(answer?)
            }
        }
    }

    /// Waits up to `timeout` for the leadership to change (this server
    /// starting or stopping its leader services, or raft naming another
    /// leader): a dequeue with no leader to go to.
    fn await_leader_change(&self, leadership: &dyn LeaderServices, timeout: Duration) {
        let mut leading = leadership.watch();
        let mut metrics = self.durable.raft().metrics();
        let known = metrics.borrow_and_update().current_leader;
        self.runtime.block_on(async {
            let changed = async {
                tokio::select! {
                    _ = leading.changed() => {}
                    _ = metrics.wait_for(|now| now.current_leader != known) => {}
                }
            };
            let _ = tokio::time::timeout(timeout, changed).await;
        });
    }
}

impl WorkSource for ClusterWork {
    fn dequeue(&self, types: &[JobType], timeout: Duration) -> Result<Option<Dequeued>, WorkError> {
        let Some(leadership) = self.leadership.upgrade() else {
            return Err(WorkError::Broker(BrokerError::ShuttingDown));
        };
        if let Some(server) = leadership.leader() {
            let work = server.work();
            // A leadership that just went: its broker shuts down; the next
            // dequeue finds the new leader.
            let Ok(dequeued) = work.dequeue(types, timeout) else { return Ok(None) };
            if let Some(dequeued) = &dequeued {
                self.held.lock().insert((dequeued.eval.id, dequeued.token), Holder::Local(work));
            }
            return Ok(dequeued);
        }
        let (leader, addr) = match leader_peer(&self.durable) {
            Ok(found) => found,
            Err(LeaderError::Stopped) => return Err(WorkError::Broker(BrokerError::ShuttingDown)),
            Err(_) => {
                self.await_leader_change(leadership.as_ref(), timeout);
                return Ok(None);
            }
        };
        let wait = timeout.min(MAX_REMOTE_DEQUEUE_WAIT);
        let call = SchedulingCall::Dequeue { types: types.to_vec(), wait_ms: wait.as_millis() as u64 };
        let answer: Result<Option<Handed>, BrokerError> = match self.call(leader, addr, &call, wait + CALL_TIMEOUT) {
            Ok(answer) => answer,
            Err(error) => {
                tracing::debug!(leader, %error, "dequeue from the leader failed");
                self.await_leader_change(leadership.as_ref(), timeout);
                return Ok(None);
            }
        };
        match answer {
            Ok(Some(Handed { term, eval, token, wait_index })) => {
                self.held.lock().insert((eval.id, token), Holder::Remote { leader, addr, term });
                self.remote_evals.fetch_add(1, Ordering::Relaxed);
                Ok(Some(Dequeued { eval: Arc::new(eval), token, wait_index }))
            }
            Ok(None) => Ok(None),
            // The leader is stepping down: wait for the next one.
            Err(_) => {
                self.await_leader_change(leadership.as_ref(), timeout);
                Ok(None)
            }
        }
    }

    fn ack(&self, eval: EvalId, token: Token) -> Result<(), WorkError> {
        let acked = self.hold_call(eval, token, |work| work.ack(eval, token), SchedulingCall::Ack);
        self.held.lock().remove(&(eval, token));
        acked
    }

    fn nack(&self, eval: EvalId, token: Token) -> Result<(), WorkError> {
        let nacked = self.hold_call(eval, token, |work| work.nack(eval, token), SchedulingCall::Nack);
        self.held.lock().remove(&(eval, token));
        nacked
    }

    fn outstanding_reset(&self, eval: EvalId, token: Token) -> Result<(), WorkError> {
        self.hold_call(eval, token, |work| work.outstanding_reset(eval, token), SchedulingCall::Reset)
    }

    fn submit_plan(&self, plan: Plan) -> Result<PlanResult, PlanError> {
        let (eval, token) = (plan.eval_id, Token(plan.eval_token));
        match self.holder(eval, token) {
            None => Err(PlanError::StaleToken(eval)),
            Some(Holder::Local(work)) => work.submit_plan(plan),
            Some(Holder::Remote { leader, addr, term }) => {
                let call = SchedulingCall::Plan { term, plan: Box::new(plan) };
                self.remote_plans.fetch_add(1, Ordering::Relaxed);
                let answer: Result<PlanResult, PlanError> = self
                    .call(leader, addr, &call, CALL_TIMEOUT)
                    .map_err(|error| PlanError::Write(error.into_state_error(leader)))?;
                answer
            }
        }
    }

    fn submit_evals(&self, held: EvalId, token: Token, evals: Vec<Evaluation>) -> PendingWrite {
        match self.holder(held, token) {
            None => PendingWrite::done(Err(StateError::Log(LogError::Refused {
                reason: format!("evaluation {held} is not held here"),
            }))),
            Some(Holder::Local(work)) => work.submit_evals(held, token, evals),
            Some(Holder::Remote { leader, addr, term }) => {
                // The leader answers once the evals are written.
                let call = SchedulingCall::Evals { hold: Hold { term, eval: held, token }, evals };
                let answer: Result<Result<u64, StateError>, _> = self.call(leader, addr, &call, CALL_TIMEOUT);
                let written = answer.map_err(|error| error.into_state_error(leader)).and_then(|written| written);
                PendingWrite::done(written.map(|index| Applied { index, ..Applied::default() }))
            }
        }
    }
}

#[cfg(test)]
#[path = "scheduling_test.rs"]
mod scheduling_test;
