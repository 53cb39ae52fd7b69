//! Service registrations in the state: the table, its lookups, what the
//! three registration commands do, the lifecycle rules other commands
//! follow, and the reads the services API needs.
//!
//! Contract:
//! 1. Rows are keyed by registration id. Four derived indexes name them by
//!    (namespace, service name), allocation, job and node; each list is kept
//!    sorted by id, so the indexes are the same whatever order the rows
//!    arrived in (a decoded snapshot rebuilds them from the rows alone).
//! 2. The table index ([`super::TableIndexes::services`]) moves only when a
//!    row was written or removed: upserting registrations that say what the
//!    stored rows say writes nothing, as in Nomad
//!    (`upsertServiceRegistrationTxn`'s `Equal` check).
//! 3. Lifecycle, in the command that causes it (Nomad's state store):
//!    an allocation whose client status becomes terminal (complete, failed,
//!    lost; a client report or a plan marking it lost) loses its
//!    registrations; a node set `down` loses all of its. A `disconnected`
//!    node keeps them, as Nomad keeps them (its `updateNodeStatusTxn`
//!    deletes only for `down`): its allocations are `unknown`, not ended,
//!    and if they go `lost` when `max_client_disconnect` runs out the first
//!    rule removes their registrations then.
//! 4. Unlike Nomad, whose state store takes any registration, a
//!    registration naming an allocation that is unknown, placed on another
//!    node, of another job, or stopped or ended is left out (the rest of the
//!    batch is taken) and listed in [`super::Applied::refused_registrations`]:
//!    a late registration racing its allocation's end must not leave an
//!    orphan that nothing removes (Nomad #16616, #16762).

use std::sync::Arc;

use imbl::Vector;
use serde::Serialize;

use super::snapshot::Snapshot;
use super::table::Table;
use super::{Applied, StateError};
use crate::structs::{AllocId, Allocation, JobKey, NodeId, ServiceRegistration};

/// A (namespace, service name) pair: how registrations are looked up by name
/// (the key of [`ServiceDump::by_name`]).
type NameKey = (Arc<str>, String);

/// The registrations table and its derived indexes (contract, step 1).
#[derive(Clone, Debug)]
pub(super) struct ServiceTables {
    rows: Table<String, Arc<ServiceRegistration>>,
    by_name: Table<NameKey, Vector<String>>,
    by_alloc: Table<AllocId, Vector<String>>,
    by_job: Table<JobKey, Vector<String>>,
    by_node: Table<NodeId, Vector<String>>,
}

impl Default for ServiceTables {
    fn default() -> Self {
        ServiceTables {
            rows: Table::with_depth(3),
            by_name: Table::with_depth(2),
            by_alloc: Table::with_depth(3),
            by_job: Table::with_depth(2),
            by_node: Table::with_depth(2),
        }
    }
}

impl ServiceTables {
    /// How many registrations.
    pub(super) fn len(&self) -> usize {
        self.rows.len()
    }

    /// Every registration, in no particular order.
    pub(super) fn rows(&self) -> impl Iterator<Item = &Arc<ServiceRegistration>> + '_ {
        self.rows.values()
    }

    /// Stores `registration`, replacing the row of the same id.
    pub(super) fn insert(&mut self, registration: ServiceRegistration) {
        if let Some(old) = self.rows.get(&registration.id).cloned() {
            self.unindex(&old);
        }
        let id = &registration.id;
        sorted_add(&mut self.by_name, name_key(&registration), id);
        sorted_add(&mut self.by_alloc, registration.alloc_id, id);
        sorted_add(&mut self.by_job, registration.job_key(), id);
        sorted_add(&mut self.by_node, registration.node_id, id);
        self.rows.insert(registration.id.clone(), Arc::new(registration));
    }

    /// Removes the registration `id`; false if there was none.
    fn remove(&mut self, id: &str) -> bool {
        let Some(old) = self.rows.get(&id.to_string()).cloned() else { return false };
        self.unindex(&old);
        self.rows.remove(&old.id);
        true
    }

    fn unindex(&mut self, old: &ServiceRegistration) {
        let id = &old.id;
        sorted_remove(&mut self.by_name, &name_key(old), id);
        sorted_remove(&mut self.by_alloc, &old.alloc_id, id);
        sorted_remove(&mut self.by_job, &old.job_key(), id);
        sorted_remove(&mut self.by_node, &old.node_id, id);
    }

    /// Removes every registration listed under `key` in `index`; how many.
    fn remove_listed<K: std::hash::Hash + Eq + Clone>(
        &mut self,
        index: fn(&Self) -> &Table<K, Vector<String>>,
        key: &K,
    ) -> usize {
        let ids: Vec<String> = index(self).get(key).map(|ids| ids.iter().cloned().collect()).unwrap_or_default();
        ids.iter().filter(|id| self.remove(id)).count()
    }

    fn listed<'a, K: std::hash::Hash + Eq + Clone>(
        &'a self,
        index: &'a Table<K, Vector<String>>,
        key: &K,
    ) -> impl Iterator<Item = &'a Arc<ServiceRegistration>> + 'a {
        let ids = index.get(key);
        ids.into_iter().flat_map(|ids| ids.iter()).filter_map(|id| self.rows.get(id))
    }

    /// The whole table in canonical order.
    pub(super) fn dump(&self) -> ServiceDump {
        fn sorted<K: Ord + Clone + std::hash::Hash + Eq>(index: &Table<K, Vector<String>>) -> Vec<(K, Vec<String>)> {
            let mut rows: Vec<(K, Vec<String>)> =
                index.iter().map(|(key, ids)| (key.clone(), ids.iter().cloned().collect())).collect();
            rows.sort_by(|a, b| a.0.cmp(&b.0));
            rows
        }
        let mut registrations: Vec<ServiceRegistration> =
            self.rows().map(|row| ServiceRegistration::clone(row)).collect();
        registrations.sort_by(|a, b| a.id.cmp(&b.id));
        ServiceDump {
            registrations,
            by_name: sorted(&self.by_name),
            by_alloc: sorted(&self.by_alloc),
            by_job: sorted(&self.by_job),
            by_node: sorted(&self.by_node),
        }
    }
}

/// The registrations table and its indexes in canonical order, part of a
/// [`super::StateDump`].
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ServiceDump {
    /// Registrations by id.
    pub registrations: Vec<ServiceRegistration>,
    /// Ids per (namespace, service name).
    pub by_name: Vec<(NameKey, Vec<String>)>,
    /// Ids per allocation.
    pub by_alloc: Vec<(AllocId, Vec<String>)>,
    /// Ids per job.
    pub by_job: Vec<(JobKey, Vec<String>)>,
    /// Ids per node.
    pub by_node: Vec<(NodeId, Vec<String>)>,
}

/// One service name of a namespace with the union of its instances' tags
/// (an entry of Nomad's `GET /v1/services`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ServiceListing {
    /// The service name.
    pub service_name: String,
    /// Every tag any instance carries, sorted, once each.
    pub tags: Vec<String>,
}

fn name_key(registration: &ServiceRegistration) -> NameKey {
    (registration.namespace.clone(), registration.service_name.clone())
}

/// Adds `id` to the sorted list under `key`.
fn sorted_add<K: std::hash::Hash + Eq + Clone>(index: &mut Table<K, Vector<String>>, key: K, id: &str) {
    let mut list = index.get(&key).cloned().unwrap_or_default();
    if let Err(position) = list.binary_search_by(|listed| listed.as_str().cmp(id)) {
        list.insert(position, id.to_string());
        index.insert(key, list);
    }
}

/// Removes `id` from the sorted list under `key`, dropping the key when empty.
fn sorted_remove<K: std::hash::Hash + Eq + Clone>(index: &mut Table<K, Vector<String>>, key: &K, id: &str) {
    let Some(mut list) = index.get(key).cloned() else { return };
    if let Ok(position) = list.binary_search_by(|listed| listed.as_str().cmp(id)) {
        list.remove(position);
    }
    if list.is_empty() {
        index.remove(key);
    } else {
        index.insert(key.clone(), list);
    }
}

/// What the commands do (contract, steps 2 and 4).
impl Snapshot {
    /// [`super::Command::UpsertServiceRegistrations`].
    pub(super) fn upsert_service_registrations(
        &mut self,
        index: u64,
        registrations: Vec<ServiceRegistration>,
        applied: &mut Applied,
    ) {
        let mut changed = false;
        for mut registration in registrations {
            if let Err(error) = self.check_registration(&registration) {
                applied.refused_registrations.push((registration.id, error));
                continue;
            }
            match self.services.rows.get(&registration.id) {
                Some(stored) if stored.same_as(&registration) => continue,
                Some(stored) => registration.create_index = stored.create_index,
                None => registration.create_index = index,
            }
            registration.modify_index = index;
            self.services.insert(registration);
            changed = true;
        }
        if changed {
            self.table_indexes.services = index;
        }
    }

    /// Whether `registration` may be stored: its allocation is live, on
    /// the node it names and of the job it names (contract, step 4).
    fn check_registration(&self, registration: &ServiceRegistration) -> Result<(), StateError> {
        let alloc = self.allocs.get(&registration.alloc_id).ok_or(StateError::UnknownAlloc(registration.alloc_id))?;
        if alloc.node_id != registration.node_id {
            return Err(StateError::AllocOnOtherNode {
                alloc_id: alloc.id,
                reported_by: registration.node_id,
                placed_on: alloc.node_id,
            });
        }
        if alloc.namespace != registration.namespace || alloc.job_id != registration.job_id {
            return Err(StateError::ServiceRegistrationMismatch {
                id: registration.id.clone(),
                job: registration.job_key(),
                alloc_id: alloc.id,
            });
        }
        if alloc.terminal() {
            return Err(StateError::AllocNotLive(alloc.id));
        }
        Ok(())
    }

    /// A client's report of an allocation's registrations
    /// ([`super::ClientAllocUpdate::services`]): those it no longer lists
    /// go, the rest are upserted (each checked as an upsert is; one that
    /// is stored as it is changes nothing).
    pub(super) fn replace_alloc_service_registrations(
        &mut self,
        index: u64,
        alloc_id: AllocId,
        registrations: Vec<ServiceRegistration>,
        applied: &mut Applied,
    ) {
        let gone: Vec<String> = self
            .services
            .listed(&self.services.by_alloc, &alloc_id)
            .filter(|stored| !registrations.iter().any(|registration| registration.id == stored.id))
            .map(|stored| stored.id.clone())
            .collect();
        for id in &gone {
            self.services.remove(id);
        }
        if !gone.is_empty() {
            self.table_indexes.services = index;
        }
        let (ours, others): (Vec<_>, Vec<_>) =
            registrations.into_iter().partition(|registration| registration.alloc_id == alloc_id);
        for other in others {
            let error =
                StateError::ServiceRegistrationMismatch { id: other.id.clone(), job: other.job_key(), alloc_id };
            applied.refused_registrations.push((other.id, error));
        }
        self.upsert_service_registrations(index, ours, applied);
    }

    /// [`super::Command::DeleteServiceRegistration`]: refused, changing
    /// nothing, when the namespace holds no such id.
    pub(super) fn delete_service_registration(
        &mut self,
        index: u64,
        namespace: &str,
        id: &str,
    ) -> Result<(), StateError> {
        let found = self.services.rows.get(&id.to_string()).is_some_and(|row| &*row.namespace == namespace);
        if !found {
            return Err(StateError::UnknownServiceRegistration {
                namespace: namespace.to_string(),
                id: id.to_string(),
            });
        }
        self.services.remove(id);
        self.table_indexes.services = index;
        Ok(())
    }

    /// [`super::Command::DeleteServiceRegistrationsOfAllocs`], and the
    /// first lifecycle rule: removes every registration of `alloc_ids`.
    pub(super) fn delete_alloc_service_registrations(&mut self, index: u64, alloc_ids: &[AllocId]) {
        let removed: usize =
            alloc_ids.iter().map(|id| self.services.remove_listed(|tables| &tables.by_alloc, id)).sum();
        if removed > 0 {
            self.table_indexes.services = index;
        }
    }

    /// The first lifecycle rule (contract, step 3): an allocation written
    /// with a terminal client status loses its registrations.
    pub(super) fn forget_services_if_ended(&mut self, index: u64, alloc: &Allocation) {
        if alloc.client_terminal() {
            self.delete_alloc_service_registrations(index, &[alloc.id]);
        }
    }

    /// The second lifecycle rule (contract, step 3): a node set `down`
    /// loses its registrations.
    pub(super) fn forget_services_of_node(&mut self, index: u64, node_id: NodeId) {
        if self.services.remove_listed(|tables| &tables.by_node, &node_id) > 0 {
            self.table_indexes.services = index;
        }
    }
}

/// The reads the services API needs.
impl Snapshot {
    /// A registration by id.
    pub fn service_registration(&self, id: &str) -> Option<&Arc<ServiceRegistration>> {
        self.services.rows.get(&id.to_string())
    }

    /// Number of registrations.
    pub fn service_registration_count(&self) -> usize {
        self.services.len()
    }

    /// Every registration, in no particular order.
    pub fn service_registrations(&self) -> impl Iterator<Item = &Arc<ServiceRegistration>> + '_ {
        self.services.rows()
    }

    /// Every service name of every namespace with the union of its tags
    /// (Nomad's `GET /v1/services`): namespaces sorted, names sorted within
    /// each. A namespace without registrations is not listed.
    pub fn service_names(&self) -> Vec<(Arc<str>, Vec<ServiceListing>)> {
        let mut names: Vec<&NameKey> = self.services.by_name.iter().map(|(key, _)| key).collect();
        names.sort();
        let mut namespaces: Vec<(Arc<str>, Vec<ServiceListing>)> = Vec::new();
        for key in names {
            let mut tags: Vec<String> =
                self.services.listed(&self.services.by_name, key).flat_map(|row| row.tags.iter().cloned()).collect();
            tags.sort();
            tags.dedup();
            let listing = ServiceListing { service_name: key.1.clone(), tags };
            match namespaces.last_mut() {
                Some((namespace, listings)) if *namespace == key.0 => listings.push(listing),
                _ => namespaces.push((key.0.clone(), vec![listing])),
            }
        }
        namespaces
    }

    /// The registrations of service `name` in `namespace`, sorted by id;
    /// with `tag`, only those that carry it (Nomad's `?tag=`).
    pub fn service_registrations_by_name<'a>(
        &'a self,
        namespace: &str,
        name: &str,
        tag: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Arc<ServiceRegistration>> + 'a {
        let key: NameKey = (Arc::from(namespace), name.to_string());
        let rows: Vec<&Arc<ServiceRegistration>> = self.services.listed(&self.services.by_name, &key).collect();
        rows.into_iter().filter(move |row| tag.is_none_or(|tag| row.tags.iter().any(|carried| carried == tag)))
    }

    /// The registrations of a job, sorted by id.
    pub fn service_registrations_by_job(&self, job: &JobKey) -> impl Iterator<Item = &Arc<ServiceRegistration>> + '_ {
        self.services.listed(&self.services.by_job, job)
    }

    /// The registrations of an allocation, sorted by id.
    pub fn service_registrations_by_alloc(
        &self,
        alloc_id: AllocId,
    ) -> impl Iterator<Item = &Arc<ServiceRegistration>> + '_ {
        self.services.listed(&self.services.by_alloc, &alloc_id)
    }

    /// The registrations on a node, sorted by id.
    pub fn service_registrations_by_node(
        &self,
        node_id: NodeId,
    ) -> impl Iterator<Item = &Arc<ServiceRegistration>> + '_ {
        self.services.listed(&self.services.by_node, &node_id)
    }
}
