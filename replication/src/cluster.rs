//! Forming a cluster of servers and following its leadership.
//!
//! **Formation** (`drover server --bootstrap-expect N --join ADDR...`): a
//! server whose log has no membership yet says hello ([`kinds::HELLO`]) to
//! every address it was given and every server it has heard of; each
//! answer names the servers the other knows, so everyone learns everyone.
//! Once a server knows `N` servers (itself included) and none of them is
//! part of a cluster yet, the one with the lowest raft id initializes the
//! cluster with all `N` as voters; the others join it as raft replicates
//! that membership to them. A server that finds a cluster already formed
//! asks its leader to add it as a voter ([`kinds::JOIN`]), as `drover
//! operator raft add-voter` does. A server whose log has a membership
//! (any restart) skips all of this: raft elects on its own.
//!
//! **Leadership** ([`watch_leadership`]): on becoming the leader, a server
//! first passes a read barrier (`ensure_linearizable`: a quorum confirmed
//! its leadership and its store has applied everything committed before
//! its term), and only then starts its leader services; on losing the
//! leadership it stops them at once, leaving the store to raft.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ChangeMembershipError, ClientWriteError, Fatal, RaftError};
use openraft::{ChangeMembers, Raft, ServerState};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use transport::peer::Peers;

use crate::network::{kinds, resolve, ServeError};
use crate::types::{ServerNode, TypeConfig};

/// How long a hello or a join may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a forming server says hello again.
const HELLO_EVERY: Duration = Duration::from_millis(500);
/// How long adding a server waits for it to catch up as a learner.
const JOIN_TIMEOUT: Duration = Duration::from_secs(120);

/// What a server says in a hello, and answers to one.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Hello {
    /// Its raft id.
    pub id: u64,
    /// Its addresses.
    pub node: ServerNode,
    /// Whether its log has a membership (it is part of a cluster).
    pub initialized: bool,
    /// The leader it knows, if any.
    pub leader: Option<(u64, ServerNode)>,
    /// Every server it knows of (itself included).
    pub known: Vec<(u64, ServerNode)>,
}

/// What a join answers.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum JoinAnswer {
    /// The server is a voter now.
    Joined,
    /// The callee does not lead; here is the leader, if it knows one.
    NotLeader(Option<ServerNode>),
}

/// This server in the cluster: its id, its addresses, the servers it has
/// heard of while forming.
#[derive(Debug)]
pub struct Membership {
    /// This server's raft id.
    pub id: u64,
    /// Its addresses.
    pub node: ServerNode,
    known: Mutex<BTreeMap<u64, ServerNode>>,
}

impl Membership {
    /// This server, knowing only itself.
    pub fn new(id: u64, node: ServerNode) -> Membership {
        let known = Mutex::new(BTreeMap::from([(id, node.clone())]));
        Membership { id, node, known }
    }

    /// The hello this server says (or answers with) now.
    pub fn hello(&self, raft: &Raft<TypeConfig>) -> Hello {
        let metrics = raft.metrics().borrow().clone();
        let members: Vec<(u64, ServerNode)> =
            metrics.membership_config.nodes().map(|(id, node)| (*id, node.clone())).collect();
        let initialized = !members.is_empty();
        let leader = metrics
            .current_leader
            .and_then(|leader| members.iter().find(|(id, _)| *id == leader).map(|(id, node)| (*id, node.clone())));
        let known = if initialized { members } else { self.known.lock().clone().into_iter().collect() };
        Hello { id: self.id, node: self.node.clone(), initialized, leader, known }
    }

    fn learn(&self, servers: impl IntoIterator<Item = (u64, ServerNode)>) {
        let mut known = self.known.lock();
        for (id, node) in servers {
            known.insert(id, node);
        }
    }
}

/// Answers another server's hello (`kinds::HELLO`): learns of it and of
/// those it knows, says who this server is.
pub fn answer_hello(membership: &Membership, raft: &Raft<TypeConfig>, request: &[u8]) -> Result<Vec<u8>, ServeError> {
    const WHAT: &str = "hello";
    let theirs: Hello = postcard::from_bytes(request).map_err(|source| ServeError::Malformed { what: WHAT, source })?;
    if !theirs.initialized {
        membership.learn(theirs.known.into_iter().chain([(theirs.id, theirs.node)]));
    }
    postcard::to_allocvec(&membership.hello(raft)).map_err(|source| ServeError::Encode { what: WHAT, source })
}

/// Answers a server's request to join (`kinds::JOIN`): the leader adds it
/// as a learner, waits until it has caught up, then makes it a voter.
pub async fn answer_join(raft: &Raft<TypeConfig>, request: &[u8]) -> Result<Vec<u8>, ServeError> {
    const WHAT: &str = "join";
    let (id, node): (u64, ServerNode) =
        postcard::from_bytes(request).map_err(|source| ServeError::Malformed { what: WHAT, source })?;
    let answer = match add_voter(raft, id, node).await {
        Ok(()) => JoinAnswer::Joined,
        Err(AddError::NotLeader(leader)) => JoinAnswer::NotLeader(leader),
        Err(error) => return Err(ServeError::Failed { what: WHAT, source: Box::new(error) }),
    };
    postcard::to_allocvec(&answer).map_err(|source| ServeError::Encode { what: WHAT, source })
}

/// Why a membership change was not made.
#[derive(Debug, thiserror::Error)]
pub enum AddError {
    /// This server does not lead; the leader it knows.
    #[error("this server is not the leader")]
    NotLeader(Option<ServerNode>),
    /// The server to remove is not a member of the cluster.
    #[error("server {0} is not a member")]
    NotMember(u64),
    /// The server being added did not catch up as a learner in time.
    #[error("server {id} did not catch up within {after:?}")]
    CatchUp {
        /// The server being added.
        id: u64,
        /// How long it was given.
        after: Duration,
    },
    /// raft refused the change (another one is in progress, say).
    #[error("raft refused the change: {0}")]
    Refused(Box<ChangeMembershipError<u64>>),
    /// raft has stopped on this server.
    #[error("raft has stopped on this server: {0}")]
    Stopped(Box<Fatal<u64>>),
}

fn change_error(error: RaftError<u64, ClientWriteError<u64, ServerNode>>) -> AddError {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => AddError::NotLeader(forward.leader_node),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(refused)) => AddError::Refused(Box::new(refused)),
        RaftError::Fatal(fatal) => AddError::Stopped(Box::new(fatal)),
    }
}

/// Adds server `id` at `node` as a voter (module docs). Leader only.
pub async fn add_voter(raft: &Raft<TypeConfig>, id: u64, node: ServerNode) -> Result<(), AddError> {
    let voters: Vec<u64> = raft.metrics().borrow().membership_config.voter_ids().collect();
    if voters.contains(&id) {
        return Ok(());
    }
    let added = tokio::time::timeout(JOIN_TIMEOUT, raft.add_learner(id, node, true)).await;
    match added {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => return Err(change_error(error)),
        Err(_) => return Err(AddError::CatchUp { id, after: JOIN_TIMEOUT }),
    }
    raft.change_membership(ChangeMembers::AddVoterIds([id].into()), false).await.map(|_| ()).map_err(change_error)
}

/// Removes server `id` from the cluster. Leader only.
pub async fn remove_peer(raft: &Raft<TypeConfig>, id: u64) -> Result<(), AddError> {
    let membership = raft.metrics().borrow().membership_config.clone();
    if !membership.nodes().any(|(member, _)| *member == id) {
        return Err(AddError::NotMember(id));
    }
    let voters = membership.voter_ids().filter(|voter| *voter == id).collect();
    raft.change_membership(ChangeMembers::RemoveVoters(voters), false).await.map_err(change_error)?;
    raft.change_membership(ChangeMembers::RemoveNodes([id].into()), false).await.map(|_| ()).map_err(change_error)
}

/// Forms the cluster (module docs); returns once this server's log has a
/// membership. With `bootstrap_expect` 0 this server never bootstraps: it
/// only joins a cluster formed already.
pub async fn form(
    raft: Raft<TypeConfig>,
    membership: Arc<Membership>,
    peers: Arc<Peers>,
    bootstrap_expect: usize,
    join: Vec<String>,
) {
    loop {
        if raft.is_initialized().await.unwrap_or(true) {
            return;
        }
        let mut addresses: Vec<String> = join.clone();
        addresses.extend(membership.known.lock().values().map(|node| node.peer.clone()));
        addresses.sort();
        addresses.dedup();
        addresses.retain(|addr| *addr != membership.node.peer);
        for addr in addresses {
            let Ok(target) = resolve(&addr) else {
                tracing::warn!(%addr, "cannot resolve a server's address");
                continue;
            };
            let hello = postcard::to_allocvec(&membership.hello(&raft)).expect("a hello encodes");
            let answer = match peers.call(target, kinds::HELLO, &hello, CALL_TIMEOUT).await {
                Ok(answer) => answer,
                Err(error) => {
                    tracing::debug!(%error, "no hello back yet");
                    continue;
                }
            };
            let Ok(theirs) = postcard::from_bytes::<Hello>(&answer) else { continue };
            if theirs.initialized {
                let leader = theirs.leader.map(|(_, node)| node.peer).unwrap_or(addr);
                if ask_to_join(&peers, &membership, &leader).await {
                    return;
                }
                continue;
            }
            membership.learn(theirs.known.into_iter().chain([(theirs.id, theirs.node)]));
        }
        let known = membership.known.lock().clone();
        let lowest = known.keys().next().copied();
        if bootstrap_expect > 0 && known.len() >= bootstrap_expect && lowest == Some(membership.id) {
            tracing::info!(servers = known.len(), "bootstrapping the cluster");
            match raft.initialize(known).await {
                Ok(()) => return,
                Err(error) => tracing::warn!(%error, "bootstrapping the cluster failed"),
            }
        }
        tokio::time::sleep(HELLO_EVERY).await;
    }
}

/// Asks the server at `addr` (the leader, hopefully) to add this one.
async fn ask_to_join(peers: &Peers, membership: &Membership, addr: &str) -> bool {
    let Ok(target) = resolve(addr) else { return false };
    let request = postcard::to_allocvec(&(membership.id, membership.node.clone())).expect("a join encodes");
    match peers.call(target, kinds::JOIN, &request, JOIN_TIMEOUT).await {
        Ok(answer) => matches!(postcard::from_bytes(&answer), Ok(JoinAnswer::Joined)),
        Err(error) => {
            tracing::info!(%error, "joining the cluster failed; trying again");
            false
        }
    }
}

/// Calls `on_change(true)` once this server leads and has passed the read
/// barrier, `on_change(false)` as soon as it no longer does (module docs).
/// The calls may block (they run on the blocking pool) and never overlap.
/// Ends when raft shuts down, after a last `on_change(false)` if leading.
pub async fn watch_leadership(raft: Raft<TypeConfig>, id: u64, on_change: Arc<dyn Fn(bool) + Send + Sync>) {
    let mut metrics = raft.metrics();
    let mut leading = false;
    loop {
        let now_leading = {
            let now = metrics.borrow_and_update();
            let failed = now.running_state.as_ref().err().filter(|fatal| !matches!(fatal, Fatal::Stopped));
            if let Some(fatal) = failed {
                tracing::error!(%fatal, "raft stopped on an error: this server no longer takes part in the cluster");
            }
            now.state == ServerState::Leader && now.current_leader == Some(id)
        };
        if now_leading && !leading {
            match raft.ensure_linearizable().await {
                Ok(_) => {
                    leading = true;
                    let change = on_change.clone();
                    let _ = tokio::task::spawn_blocking(move || change(true)).await;
                    // Leadership may have gone while the services started.
                    continue;
                }
                Err(error) => tracing::info!(%error, "lost the leadership before the read barrier"),
            }
        } else if !now_leading && leading {
            leading = false;
            let change = on_change.clone();
            let _ = tokio::task::spawn_blocking(move || change(false)).await;
        }
        if metrics.changed().await.is_err() {
            if leading {
                let change = on_change.clone();
                let _ = tokio::task::spawn_blocking(move || change(false)).await;
            }
            return;
        }
    }
}
