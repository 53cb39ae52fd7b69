//! The snapshot format: a whole [`Snapshot`] as bytes, and back. Pure
//! encode and decode over `std::io::Write` and `Read`; the files, their
//! checksums and fsync belong to the `storage` crate.
//!
//! Contract:
//! 1. Layout: `[format version: 1 byte][header][section]*[end]`. A
//!    section is `[tag: 1 byte][record count: u64 LE][record]*`, a record
//!    `[length: u32 LE][postcard]`, the end a tag of 0. The header holds
//!    the index and the per-table indexes. The scheduler configuration is
//!    a section of zero or one record; the ACL tokens and policies one
//!    record.
//! 2. One section per table, in tag order. Each job version that a job row,
//!    a kept version (section `JOB_HISTORY`) or an allocation refers to is
//!    written once (section `JOB_VERSIONS`); they carry an index into it,
//!    and decoding shares one `Arc<Job>` per version again, as the command
//!    log does.
//! 3. Derived indexes are not written but rebuilt on decode, in the order
//!    the live store kept them: nodes are written grouped by computed
//!    class, allocations by node and evaluations by job, each group in its
//!    index's order; the per-job allocation order is written as ids. The
//!    service registrations' indexes keep sorted lists, so their rows go in
//!    any order. So a decoded snapshot dumps ([`Snapshot::dump`]) exactly as
//!    the encoded one.
//! 4. Adding a table is one change here: a new tag, its section written in
//!    [`Snapshot::encode`] and read in [`Snapshot::decode`]. A file without
//!    the section decodes to an empty table, so older files stay readable;
//!    a changed record format bumps [`SNAPSHOT_FORMAT_VERSION`].
//! 5. Decoding refuses anything else with a clear error and never panics:
//!    an unknown version or tag, a record that does not decode, a record
//!    longer than [`MAX_RECORD`], a reference to a job or allocation that is
//!    not in the file, bytes missing at the end.

use std::io::{Read, Write};
use std::sync::Arc;

use imbl::Vector;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::periodic::PeriodicLaunch;
use super::snapshot::{index_add, Snapshot, TableIndexes};
use crate::structs::job_refs::{decoding_jobs, encoding_jobs, JobTable};
use crate::structs::{
    AllocId, Allocation, ComputedClass, Deployment, Evaluation, Job, JobKey, Namespace, Node, NodeId, Resources,
};

/// The version byte of today's snapshot format (2: the records of issue 24's
/// job and allocation fields, as the log format's version 2; 3: a task's
/// `memory_max_mb`, as the log format's version 3; 4: groups' and tasks'
/// services, the header's table index of service registrations, and their
/// section; 5: tasks' shutdown delay and templates, allocations' check
/// results and health, as the log format's version 5; 6: a job's `stable`
/// mark, as the log format's version 6, and the section of kept job
/// versions, `JOB_HISTORY`; 7: the full `update` block, allocations'
/// deployment and canary mark, as the log format's version 7, the
/// header's table index of deployments, and their section; 8: nodes'
/// drain and groups' `migrate` block, jobs' submit time, nodes' status
/// time and the scheduler configuration's `pause_eval_broker`, as the log
/// format's version 8; 9: jobs' periodic, parameterized and dispatch
/// fields and tasks' `dispatch_payload`, as the log format's version 9,
/// and the section of periodic launch records; 10: ACL rules with
/// namespace capabilities, as the log format's version 10, the header's
/// table index of namespaces, and their section; 11: nodes' storm-guard
/// hold, as the log format's version 11).
pub const SNAPSHOT_FORMAT_VERSION: u8 = 11;

/// The longest record a decoder accepts (a group of one node's allocations
/// is the largest record; a million would be far below this).
pub const MAX_RECORD: u32 = 1 << 30;

/// Section tags, in the order they are written (contract, step 4).
mod tag {
    pub const END: u8 = 0;
    pub const JOB_VERSIONS: u8 = 1;
    pub const JOBS: u8 = 2;
    pub const NODES: u8 = 3;
    pub const ALLOCS: u8 = 4;
    pub const ALLOCS_BY_JOB: u8 = 5;
    pub const EVALS: u8 = 6;
    pub const SCHEDULER_CONFIG: u8 = 7;
    pub const ACL: u8 = 8;
    pub const SERVICES: u8 = 9;
    /// The kept versions of each job (`job_versions.rs`), not to be
    /// confused with `JOB_VERSIONS`, the table of job versions written once.
    pub const JOB_HISTORY: u8 = 10;
    /// Deployments, grouped by job in creation order.
    pub const DEPLOYMENTS: u8 = 11;
    /// Periodic launch records.
    pub const PERIODIC_LAUNCHES: u8 = 12;
    /// The namespaces written.
    pub const NAMESPACES: u8 = 13;
    /// The last tag this build knows.
    pub const LAST: u8 = NAMESPACES;
}

/// Why bytes did not decode to a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// Reading the bytes failed (or they ended early).
    #[error("reading the snapshot: {0}")]
    Io(#[from] std::io::Error),
    /// The format version is not one this build reads.
    #[error("snapshot format version {0} is not supported (this build reads version {SNAPSHOT_FORMAT_VERSION})")]
    UnknownVersion(u8),
    /// A section tag this build does not know, or out of order.
    #[error("unexpected snapshot section {found} after section {after}")]
    UnexpectedSection {
        /// The tag read.
        found: u8,
        /// The tag of the section before it.
        after: u8,
    },
    /// A record longer than [`MAX_RECORD`].
    #[error("a snapshot record of {0} bytes is longer than any this format writes")]
    RecordTooLong(u32),
    /// A record that is not what its section holds.
    #[error("malformed record in snapshot section {section}: {reason}")]
    Malformed {
        /// The section's tag.
        section: u8,
        /// What postcard found wrong.
        reason: String,
    },
    /// A row refers to something the file does not hold.
    #[error("snapshot section {section} refers to a missing {what}")]
    Dangling {
        /// The section's tag.
        section: u8,
        /// What is missing.
        what: String,
    },
}

/// The header record.
#[derive(Serialize, Deserialize)]
struct Header {
    index: u64,
    table_indexes: TableIndexes,
}

impl Snapshot {
    /// Writes the whole snapshot in the snapshot format (module docs).
    pub fn encode<W: Write + ?Sized>(&self, out: &mut W) -> std::io::Result<()> {
        let mut writer = RecordWriter { out, buffer: Vec::new() };
        writer.out.write_all(&[SNAPSHOT_FORMAT_VERSION])?;
        writer.record(&Header { index: self.index, table_indexes: self.table_indexes })?;
        let kept = self.job_versions.values().flat_map(|versions| versions.iter());
        let versions = JobTable::of(self.jobs.values().chain(kept).chain(self.allocs.values().map(|alloc| &alloc.job)));
        writer.section(tag::JOB_VERSIONS, versions.jobs().len(), versions.jobs().iter())?;
        encoding_jobs(versions, || self.encode_tables(&mut writer))?;
        writer.out.write_all(&[tag::END])
    }

    /// The sections whose rows refer to job versions (written while the
    /// job table is in force).
    fn encode_tables<W: Write + ?Sized>(&self, writer: &mut RecordWriter<'_, W>) -> std::io::Result<()> {
        writer.section(tag::JOBS, self.jobs.len(), self.jobs.values().map(JobRow))?;
        let nodes = self.nodes_by_class.iter().map(|(class, ids)| (*class, rows(ids, |id| self.nodes.get(id))));
        writer.section(tag::NODES, self.nodes_by_class.len(), nodes)?;
        let allocs = self.allocs_by_node.iter().map(|(node, ids)| (*node, rows(ids, |id| self.allocs.get(id))));
        writer.section(tag::ALLOCS, self.allocs_by_node.len(), allocs)?;
        let by_job = self.allocs_by_job.iter().map(|(job, ids)| (job, ids.iter().copied().collect::<Vec<_>>()));
        writer.section(tag::ALLOCS_BY_JOB, self.allocs_by_job.len(), by_job)?;
        let evals = self.evals_by_job.iter().map(|(job, ids)| (job, rows(ids, |id| self.evals.get(id))));
        writer.section(tag::EVALS, self.evals_by_job.len(), evals)?;
        let config = self.scheduler_config.iter();
        writer.section(tag::SCHEDULER_CONFIG, usize::from(self.scheduler_config.is_some()), config)?;
        writer.section(tag::ACL, 1, std::iter::once(&*self.acl))?;
        writer.section(tag::SERVICES, self.services.len(), self.services.rows())?;
        let history =
            self.job_versions.iter().map(|(job, versions)| (job, versions.iter().map(JobRow).collect::<Vec<_>>()));
        writer.section(tag::JOB_HISTORY, self.job_versions.len(), history)?;
        let deployments =
            self.deployments_by_job.iter().map(|(job, ids)| (job, rows(ids, |id| self.deployments.get(id))));
        writer.section(tag::DEPLOYMENTS, self.deployments_by_job.len(), deployments)?;
        writer.section(tag::PERIODIC_LAUNCHES, self.periodic_launches.len(), self.periodic_launches.values())?;
        writer.section(tag::NAMESPACES, self.namespaces.len(), self.namespaces.values())
    }

    /// Reads a snapshot written by [`Snapshot::encode`], rebuilding its
    /// derived indexes (module docs).
    pub fn decode(input: &mut impl Read) -> Result<Snapshot, PersistError> {
        let mut reader = RecordReader { input, buffer: Vec::new(), section: 0 };
        let mut version = [0u8];
        reader.input.read_exact(&mut version)?;
        if version[0] != SNAPSHOT_FORMAT_VERSION {
            return Err(PersistError::UnknownVersion(version[0]));
        }
        let header: Header = reader.record()?;
        let mut snapshot = Snapshot { index: header.index, table_indexes: header.table_indexes, ..Snapshot::default() };
        let mut versions = Vec::new();
        while let Some(count) = reader.next_section()? {
            match reader.section {
                tag::JOB_VERSIONS => {
                    versions = (0..count).map(|_| reader.record::<Job>().map(Arc::new)).collect::<Result<_, _>>()?;
                }
                section => decoding_jobs(versions.clone(), || snapshot.decode_section(section, count, &mut reader))?,
            }
        }
        Ok(snapshot)
    }

    /// Reads one section's `count` records into the tables.
    fn decode_section(
        &mut self,
        section: u8,
        count: u64,
        reader: &mut RecordReader<'_, impl Read>,
    ) -> Result<(), PersistError> {
        for _ in 0..count {
            match section {
                tag::JOBS => {
                    let JobRowOwned(job) = reader.record()?;
                    self.jobs.insert(job.key(), job);
                }
                tag::NODES => {
                    let (class, nodes): (ComputedClass, Vec<Node>) = reader.record()?;
                    for node in nodes {
                        self.restore_node(class, node);
                    }
                }
                tag::ALLOCS => {
                    let (node_id, allocs): (NodeId, Vec<Allocation>) = reader.record()?;
                    for alloc in allocs {
                        self.restore_alloc(node_id, alloc);
                    }
                }
                tag::ALLOCS_BY_JOB => {
                    let (job, ids): (JobKey, Vec<AllocId>) = reader.record()?;
                    if let Some(missing) = ids.iter().find(|id| !self.allocs.contains_key(id)) {
                        return Err(PersistError::Dangling { section, what: format!("allocation {missing}") });
                    }
                    self.allocs_by_job.insert(job, ids.into_iter().collect());
                }
                tag::EVALS => {
                    let (job, evals): (JobKey, Vec<Evaluation>) = reader.record()?;
                    for eval in evals {
                        index_add(&mut self.evals_by_job, job.clone(), eval.id);
                        self.evals.insert(eval.id, Arc::new(eval));
                    }
                }
                tag::SCHEDULER_CONFIG => self.scheduler_config = Some(reader.record()?),
                tag::ACL => self.acl = Arc::new(reader.record()?),
                tag::SERVICES => self.services.insert(reader.record()?),
                tag::JOB_HISTORY => {
                    let (job, versions): (JobKey, Vec<JobRowOwned>) = reader.record()?;
                    self.job_versions.insert(job, versions.into_iter().map(|JobRowOwned(version)| version).collect());
                }
                tag::DEPLOYMENTS => {
                    let (job, deployments): (JobKey, Vec<Deployment>) = reader.record()?;
                    for deployment in deployments {
                        index_add(&mut self.deployments_by_job, job.clone(), deployment.id);
                        if deployment.is_active() {
                            self.active_deployments.insert(deployment.id);
                        }
                        self.deployments.insert(deployment.id, Arc::new(deployment));
                    }
                }
                tag::PERIODIC_LAUNCHES => {
                    let launch: PeriodicLaunch = reader.record()?;
                    self.periodic_launches.insert(launch.job.clone(), launch);
                }
                tag::NAMESPACES => {
                    let namespace: Namespace = reader.record()?;
                    Arc::make_mut(&mut self.namespaces).insert(namespace.name.clone(), namespace);
                }
                _ => unreachable!("next_section accepts only known tags"),
            }
        }
        Ok(())
    }

    fn restore_node(&mut self, class: ComputedClass, node: Node) {
        index_add(&mut self.nodes_by_class, class, node.id);
        if node.is_schedulable() {
            self.schedulable.insert(node.id);
        }
        self.nodes.insert(node.id, Arc::new(node));
    }

    fn restore_alloc(&mut self, node_id: NodeId, alloc: Allocation) {
        index_add(&mut self.allocs_by_node, node_id, alloc.id);
        if !alloc.terminal() && alloc.resources != Resources::default() {
            let usage = self.node_usage.get(&alloc.node_id).copied().unwrap_or_default();
            self.node_usage.insert(alloc.node_id, usage.plus(alloc.resources));
        }
        if !alloc.terminal() {
            let held: Vec<u16> = alloc.port_values().collect();
            if !held.is_empty() {
                let ports = self.node_ports.get(&alloc.node_id).cloned().unwrap_or_default().changed(&held, &[]);
                self.node_ports.insert(alloc.node_id, ports);
            }
        }
        self.allocs.insert(alloc.id, Arc::new(alloc));
    }
}

/// The rows an index list names, in its order.
fn rows<'a, K, V>(ids: &'a Vector<K>, row: impl Fn(&K) -> Option<&'a V>) -> Vec<&'a V>
where
    K: Clone,
{
    ids.iter().filter_map(row).collect()
}

/// A job row: written as its version's index in the job table (the job's
/// serde hook, as an allocation's job is).
struct JobRow<'a>(&'a Arc<Job>);

impl Serialize for JobRow<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        crate::structs::job_refs::shared_job::serialize(self.0, serializer)
    }
}

/// A job row as read back: the shared version it names.
struct JobRowOwned(Arc<Job>);

impl<'de> Deserialize<'de> for JobRowOwned {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        crate::structs::job_refs::shared_job::deserialize(deserializer).map(JobRowOwned)
    }
}

/// Writes sections of length-prefixed postcard records.
struct RecordWriter<'a, W: Write + ?Sized> {
    out: &'a mut W,
    buffer: Vec<u8>,
}

impl<W: Write + ?Sized> RecordWriter<'_, W> {
    fn record(&mut self, value: &impl Serialize) -> std::io::Result<()> {
        self.buffer.clear();
        let buffer = std::mem::take(&mut self.buffer);
        self.buffer = postcard::to_extend(value, buffer).map_err(std::io::Error::other)?;
        let length = u32::try_from(self.buffer.len()).map_err(std::io::Error::other)?;
        self.out.write_all(&length.to_le_bytes())?;
        self.out.write_all(&self.buffer)
    }

    fn section<T: Serialize>(&mut self, tag: u8, count: usize, rows: impl Iterator<Item = T>) -> std::io::Result<()> {
        self.out.write_all(&[tag])?;
        self.out.write_all(&(count as u64).to_le_bytes())?;
        rows.into_iter().try_for_each(|row| self.record(&row))
    }
}

/// Reads what [`RecordWriter`] wrote.
struct RecordReader<'a, R: Read> {
    input: &'a mut R,
    buffer: Vec<u8>,
    /// The tag of the section being read.
    section: u8,
}

impl<R: Read> RecordReader<'_, R> {
    /// The next section's record count, or `None` at the end.
    fn next_section(&mut self) -> Result<Option<u64>, PersistError> {
        let mut tag = [0u8];
        self.input.read_exact(&mut tag)?;
        if tag[0] == tag::END {
            return Ok(None);
        }
        if tag[0] <= self.section || tag[0] > tag::LAST {
            return Err(PersistError::UnexpectedSection { found: tag[0], after: self.section });
        }
        self.section = tag[0];
        let mut count = [0u8; 8];
        self.input.read_exact(&mut count)?;
        Ok(Some(u64::from_le_bytes(count)))
    }

    fn record<T: DeserializeOwned>(&mut self) -> Result<T, PersistError> {
        let mut length = [0u8; 4];
        self.input.read_exact(&mut length)?;
        let length = u32::from_le_bytes(length);
        if length > MAX_RECORD {
            return Err(PersistError::RecordTooLong(length));
        }
        // Read what is there rather than trusting the length with memory.
        self.buffer.clear();
        (&mut *self.input).take(u64::from(length)).read_to_end(&mut self.buffer)?;
        if self.buffer.len() != length as usize {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
        postcard::from_bytes(&self.buffer)
            .map_err(|error| PersistError::Malformed { section: self.section, reason: error.to_string() })
    }
}

#[cfg(test)]
#[path = "persist_test.rs"]
mod persist_test;
