//! Jobs carried once. An [`Allocation`](super::Allocation) holds its job
//! version as an `Arc<Job>`; encoded on its own it carries the whole job.
//! A command log or a snapshot file carries many allocations of few jobs,
//! so while one of them is encoded ([`encoding_jobs`]) each allocation's
//! job is written as an index into a table of the jobs written once, and
//! while one is decoded ([`decoding_jobs`]) the index is resolved to that
//! table's `Arc<Job>`, so every allocation of one job version shares one
//! job in memory, as before encoding.
//!
//! The table lives in a thread-local for the length of one encode or
//! decode: the allocation's serde hook has no other way to reach it. An
//! encode or decode without a table carries jobs whole (JSON, tests).

use std::cell::RefCell;
use std::sync::Arc;

use hashbrown::HashMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{Job, JobKey};

/// The jobs of one encode: each job version once, in first-use order.
#[derive(Debug, Default)]
pub struct JobTable {
    jobs: Vec<Arc<Job>>,
    /// Candidates by stored identity; compared by pointer, then by value.
    by_identity: HashMap<(JobKey, u64, u64), Vec<u32>>,
}

impl JobTable {
    /// The table of every job `jobs` yields.
    pub fn of<'a>(jobs: impl IntoIterator<Item = &'a Arc<Job>>) -> JobTable {
        let mut table = JobTable::default();
        for job in jobs {
            table.index_of(job, true);
        }
        table
    }

    /// The jobs, in table order.
    pub fn jobs(&self) -> &[Arc<Job>] {
        &self.jobs
    }

    /// Where `job` is in the table; added when `add` is set and it is not.
    fn index_of(&mut self, job: &Arc<Job>, add: bool) -> Option<u32> {
        let identity = (job.key(), job.modify_index, job.version);
        let candidates = self.by_identity.entry(identity).or_default();
        let found = candidates.iter().copied().find(|index| {
            let known = &self.jobs[*index as usize];
            Arc::ptr_eq(known, job) || **known == **job
        });
        if found.is_some() || !add {
            return found;
        }
        let index = self.jobs.len() as u32;
        candidates.push(index);
        self.jobs.push(job.clone());
        Some(index)
    }
}

thread_local! {
    static ENCODING: RefCell<Option<JobTable>> = const { RefCell::new(None) };
    static DECODING: RefCell<Option<Vec<Arc<Job>>>> = const { RefCell::new(None) };
}

/// Runs `encode` with `table` in force: every allocation encoded meanwhile
/// writes its job as an index into it. The table must hold every job.
pub fn encoding_jobs<R>(table: JobTable, encode: impl FnOnce() -> R) -> R {
    let _restore = Restore::encoding(ENCODING.with(|slot| slot.replace(Some(table))));
    encode()
}

/// Runs `decode` with `jobs` in force: every allocation decoded meanwhile
/// reads its job as an index into them and shares that `Arc`.
pub fn decoding_jobs<R>(jobs: Vec<Arc<Job>>, decode: impl FnOnce() -> R) -> R {
    let _restore = Restore::decoding(DECODING.with(|slot| slot.replace(Some(jobs))));
    decode()
}

/// `value` in postcard, appended to `bytes`, with the jobs of its
/// allocations carried once: the table of `jobs` (which must hold every one
/// of them) first, then the value, whose allocations name their job by its
/// place in the table.
pub fn to_postcard_sharing<'a, T: Serialize>(
    value: &T,
    jobs: impl IntoIterator<Item = &'a Arc<Job>>,
    bytes: Vec<u8>,
) -> Result<Vec<u8>, postcard::Error> {
    let table = JobTable::of(jobs);
    let bytes = postcard::to_extend(table.jobs(), bytes)?;
    encoding_jobs(table, || postcard::to_extend(value, bytes))
}

/// What [`to_postcard_sharing`] wrote, and the bytes after it.
pub fn take_postcard_sharing<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<(T, &[u8]), postcard::Error> {
    let (jobs, rest): (Vec<Job>, &[u8]) = postcard::take_from_bytes(bytes)?;
    let jobs = jobs.into_iter().map(Arc::new).collect();
    decoding_jobs(jobs, || postcard::take_from_bytes::<T>(rest))
}

/// Puts back the table that was in force before, even if the encode or
/// decode panicked.
enum Restore {
    Encoding(Option<JobTable>),
    Decoding(Option<Vec<Arc<Job>>>),
}

impl Restore {
    fn encoding(previous: Option<JobTable>) -> Self {
        Restore::Encoding(previous)
    }

    fn decoding(previous: Option<Vec<Arc<Job>>>) -> Self {
        Restore::Decoding(previous)
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        match self {
            Restore::Encoding(previous) => ENCODING.with(|slot| *slot.borrow_mut() = previous.take()),
            Restore::Decoding(previous) => DECODING.with(|slot| *slot.borrow_mut() = previous.take()),
        }
    }
}

/// The serde hook of `Allocation::job`.
pub(crate) mod shared_job {
    use super::*;

    pub fn serialize<S: Serializer>(job: &Arc<Job>, serializer: S) -> Result<S::Ok, S::Error> {
        let index = ENCODING.with(|slot| slot.borrow_mut().as_mut().map(|table| table.index_of(job, false)));
        match index {
            None => job.serialize(serializer),
            Some(Some(index)) => serializer.serialize_u32(index),
            Some(None) => Err(serde::ser::Error::custom(format!("job {} is missing from the job table", job.key()))),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Arc<Job>, D::Error> {
        if !DECODING.with(|slot| slot.borrow().is_some()) {
            return Job::deserialize(deserializer).map(Arc::new);
        }
        let index = u32::deserialize(deserializer)?;
        let job = DECODING.with(|slot| slot.borrow().as_ref().and_then(|jobs| jobs.get(index as usize).cloned()));
        job.ok_or_else(|| serde::de::Error::custom(format!("job index {index} is beyond the job table")))
    }
}
