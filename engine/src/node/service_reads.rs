//! What an agent reads of the services table for its tasks' templates
//! (Nomad's `nomadService` and `nomadServices` template functions).
//!
//! 1. An agent asks for a list of [`ServiceQuery`]s at once: the
//!    registrations of one service of a namespace, or a namespace's service
//!    names with their tags. One read answers every template of the node,
//!    so an agent holds at most one read open however many tasks render.
//! 2. A read is a blocking query on the services table's index: it is
//!    answered once that index passes `min_index` (at once for 0), with the
//!    index it is current at, which the agent sends as its next
//!    `min_index`. Only writes wake it, so a watching agent costs nothing
//!    while nothing changes; the caller bounds the wait and then answers
//!    with the data as it is (a Nomad blocking query's timeout).
//! 3. Reads come from the store's published snapshots (on any server,
//!    leader or not); nothing here writes.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::state::{Snapshot, StateStore, WaitError};
use crate::structs::ServiceRegistration;

/// The most queries one read may carry (a node's templates rarely name
/// more than a handful of services).
pub const MAX_SERVICE_QUERIES: usize = 256;

/// One thing a template reads.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ServiceQuery {
    /// The registrations of service `name` in `namespace`, sorted by id
    /// (`nomadService "name"`).
    Instances {
        /// The namespace.
        namespace: String,
        /// The service's name.
        name: String,
    },
    /// Every service name of `namespace` with the union of its instances'
    /// tags, sorted by name (`nomadServices`).
    Names {
        /// The namespace.
        namespace: String,
    },
}

/// A service name and its tags, in a [`ServiceAnswer::Names`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceNameTags {
    /// The service's name.
    pub name: String,
    /// Every tag any instance carries, sorted, once each.
    pub tags: Vec<String>,
}

/// What one [`ServiceQuery`] found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServiceAnswer {
    /// For [`ServiceQuery::Instances`].
    Instances(Vec<ServiceRegistration>),
    /// For [`ServiceQuery::Names`].
    Names(Vec<ServiceNameTags>),
}

/// The answers to a read, in the order of its queries, and the services
/// table's index they are current at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicesRead {
    /// The services table's index.
    pub index: u64,
    /// One answer per query.
    pub answers: Vec<ServiceAnswer>,
}

impl ServiceQuery {
    /// The query's answer in `snapshot`.
    pub fn answer(&self, snapshot: &Snapshot) -> ServiceAnswer {
        match self {
            ServiceQuery::Instances { namespace, name } => ServiceAnswer::Instances(
                snapshot.service_registrations_by_name(namespace, name, None).map(|row| (**row).clone()).collect(),
            ),
            ServiceQuery::Names { namespace } => ServiceAnswer::Names(
                snapshot
                    .service_names()
                    .into_iter()
                    .filter(|(of, _)| **of == **namespace)
                    .flat_map(|(_, listings)| listings)
                    .map(|listing| ServiceNameTags { name: listing.service_name, tags: listing.tags })
                    .collect(),
            ),
        }
    }
}

/// The answers to `queries` in `snapshot`. The index is at least 1, as
/// Nomad's blocking queries answer, so that a table never written is
/// waited on rather than answered again at once.
pub fn read_now(snapshot: &Snapshot, queries: &[ServiceQuery]) -> ServicesRead {
    ServicesRead {
        index: snapshot.table_indexes().services.max(1),
        answers: queries.iter().map(|query| query.answer(snapshot)).collect(),
    }
}

/// The answers once the services table's index passes `min_index` (step
/// 2), awaited without a deadline: the caller bounds it. An error only
/// once the store shuts down.
pub async fn read_after(
    store: &Arc<StateStore>,
    queries: &[ServiceQuery],
    min_index: u64,
) -> Result<ServicesRead, WaitError> {
    loop {
        let snapshot = store.snapshot();
        if min_index == 0 || snapshot.table_indexes().services > min_index {
            return Ok(read_now(&snapshot, queries));
        }
        store.wait_for_index(snapshot.index() + 1).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Command;
    use crate::testing::{populated_store, service_registration};

    fn queries() -> Vec<ServiceQuery> {
        vec![
            ServiceQuery::Instances { namespace: "default".into(), name: "api".into() },
            ServiceQuery::Names { namespace: "default".into() },
            ServiceQuery::Instances { namespace: "other".into(), name: "api".into() },
        ]
    }

    #[test]
    fn a_read_answers_each_query_in_order() {
        let (store, allocs) = populated_store(1, 2);
        let snapshot = store.snapshot();
        let rows: Vec<_> = allocs
            .iter()
            .enumerate()
            .map(|(at, id)| service_registration(snapshot.alloc(*id).expect("placed"), "api", 8000 + at as u16))
            .collect();
        store.apply(Command::UpsertServiceRegistrations { registrations: rows.clone() }).expect("upserted");
        let read = read_now(&store.snapshot(), &queries());
        assert_eq!(read.index, store.snapshot().table_indexes().services);
        let empty = populated_store(1, 1).0;
        assert_eq!(read_now(&empty.snapshot(), &queries()).index, 1, "a table never written is at 1");
        let ServiceAnswer::Instances(found) = &read.answers[0] else { panic!("instances: {read:?}") };
        let mut ports: Vec<u16> = found.iter().map(|row| row.port).collect();
        ports.sort();
        assert_eq!(ports, [8000, 8001]);
        let names = vec![ServiceNameTags { name: "api".into(), tags: vec!["v1".into()] }];
        assert_eq!(read.answers[1], ServiceAnswer::Names(names));
        assert_eq!(read.answers[2], ServiceAnswer::Instances(Vec::new()), "another namespace's are not read");
    }

    #[test]
    fn a_blocking_read_waits_for_a_write_to_the_services_table() {
        let (store, allocs) = populated_store(1, 1);
        let seen = read_now(&store.snapshot(), &queries()).index;
        let asked = queries();
        let mut waiting = Box::pin(read_after(&store, &asked, seen));
        assert!(futures_lite::future::block_on(futures_lite::future::poll_once(&mut waiting)).is_none());
        // A write to another table moves the store's index but not the services table's.
        store.apply(Command::UpsertNode { node: crate::testing::node(7), evals: vec![] }).expect("node");
        assert!(futures_lite::future::block_on(futures_lite::future::poll_once(&mut waiting)).is_none());
        let alloc = store.snapshot().alloc(allocs[0]).expect("placed").clone();
        let row = service_registration(&alloc, "api", 9000);
        store.apply(Command::UpsertServiceRegistrations { registrations: vec![row] }).expect("upserted");
        let read = futures_lite::future::block_on(waiting).expect("answered");
        assert!(read.index > seen);
        let ServiceAnswer::Instances(found) = &read.answers[0] else { panic!("instances: {read:?}") };
        assert_eq!(found.iter().map(|row| row.port).collect::<Vec<_>>(), [9000]);
        store.shutdown();
        let after = futures_lite::future::block_on(read_after(&store, &asked, read.index));
        assert!(matches!(after, Err(WaitError::Shutdown { .. })), "{after:?}");
    }
}
