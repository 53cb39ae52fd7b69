//! The log format of a [`Command`]: what a write-ahead log or a replicated
//! log carries, and what a replica decodes and applies.
//!
//! `[format version: 1 byte][jobs: postcard][command: postcard]`. Each job
//! version the command's allocations refer to is written once, in the jobs
//! table; each allocation carries an index into it, and decoding gives every
//! allocation of one job version the same `Arc<Job>` again (see
//! [`crate::structs::job_refs`]). postcard's encoding is deterministic: the
//! same command always encodes to the same bytes (every map in a command is
//! ordered), and durations travel as whole nanoseconds.

use std::sync::Arc;

use super::Command;
use crate::structs::job_refs::{take_postcard_sharing, to_postcard_sharing};
use crate::structs::Job;

/// The version byte of today's format. 2: jobs and allocations carry what
/// issue 24 added (meta, task restart policies, reconcile strategies, port
/// host networks, placement scores). 3: a task carries its `memory_max_mb`
/// (issue 25). 4: groups and tasks carry their services and checks, and
/// the service registration commands (issue 26). 5: what the rest of
/// issue 26 added: tasks' shutdown delay and templates, allocations' check
/// results and health. 6: a job carries its `stable` mark, and
/// `SetJobStability` (issue 27's job versions). 7: deployments (issue 27):
/// the full `update` block, allocations' deployment and canary mark, plan
/// results' deployments and the deployment commands. 8 (issue 28): drains
/// (nodes' drain, groups' `migrate` block, `UpdateNodeDrain`) and garbage
/// collection (jobs' submit time, nodes' status time and the node status
/// commands' time, the scheduler configuration's `pause_eval_broker`, and
/// the `GarbageCollect`, `DeleteEvals` and `PurgeNode` commands). 9
/// (issue 30): jobs' `periodic`, `parameterized`, dispatch fields and
/// tasks' `dispatch_payload`, and `LaunchPeriodicJob`. 10 (issue 30's
/// namespaces): ACL rules with namespace capabilities, and the namespace
/// commands. 11 (issue 29): nodes' storm-guard hold, and `MissHeartbeat`'s
/// `release_at`. A log of an older version is refused, never misread.
pub const FORMAT_VERSION: u8 = 11;

/// Why bytes did not decode to a command.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// There were no bytes.
    #[error("an encoded command is empty")]
    Empty,
    /// The format version is not one this build reads.
    #[error("command format version {0} is not supported (this build reads version {FORMAT_VERSION})")]
    UnknownVersion(u8),
    /// The bytes are not a command of this format.
    #[error("malformed command: {0}")]
    Malformed(String),
    /// Bytes were left after the command.
    #[error("{0} bytes after the end of the command")]
    Trailing(usize),
}

impl Command {
    /// The command in the log format (module docs).
    pub fn encode(&self) -> Vec<u8> {
        to_postcard_sharing(self, self.shared_jobs(), vec![FORMAT_VERSION])
            .expect("a command always encodes: its jobs are in the table")
    }

    /// A command from the log format; refuses anything else with a clear error.
    pub fn decode(bytes: &[u8]) -> Result<Command, CodecError> {
        let (&version, body) = bytes.split_first().ok_or(CodecError::Empty)?;
        if version != FORMAT_VERSION {
            return Err(CodecError::UnknownVersion(version));
        }
        let malformed = |error: postcard::Error| CodecError::Malformed(error.to_string());
        let (command, rest) = take_postcard_sharing::<Command>(body).map_err(malformed)?;
        match rest.len() {
            0 => Ok(command),
            trailing => Err(CodecError::Trailing(trailing)),
        }
    }

    /// How long the command would be with every allocation carrying its
    /// job whole, as it did before this format: what sharing saves.
    pub fn encoded_len_jobs_inline(&self) -> usize {
        let empty_table: &[Job] = &[];
        let table = postcard::to_allocvec(empty_table).expect("an empty table encodes").len();
        1 + table + postcard::to_allocvec(self).expect("a command always encodes").len()
    }

    /// The jobs its allocations refer to.
    fn shared_jobs(&self) -> impl Iterator<Item = &Arc<Job>> + '_ {
        let allocs = match self {
            Command::ApplyPlanResults { allocs, .. } => allocs.as_slice(),
            _ => &[],
        };
        allocs.iter().map(|alloc| &alloc.job)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Timestamp;
    use crate::structs::{Allocation, EvalId, JobType, NodeId, Resources};

    fn plan(n_allocs: u32) -> Command {
        let mut spec = Job::new_simple("web", JobType::Service, n_allocs, Resources::new(10, 10, 0));
        spec.modify_index = 7;
        let job = Arc::new(spec);
        let mut older = Job::clone(&job);
        older.version = 0;
        older.modify_index = 3;
        let older = Arc::new(older);
        let allocs = (0..n_allocs)
            .map(|i| {
                let job = if i % 10 == 0 { &older } else { &job };
                Allocation::new_placement(job, "group", i, NodeId::from_u128(u128::from(i)), EvalId::from_u128(1))
            })
            .collect();
        Command::ApplyPlanResults {
            deployment: None,
            deployment_updates: Vec::new(),
            eval_id: EvalId::from_u128(1),
            allocs,
            evals: vec![],
            time: Timestamp(5),
        }
    }

    #[test]
    fn a_plan_carries_each_job_once_and_decodes_to_shared_jobs() {
        let command = plan(100);
        let bytes = command.encode();
        let decoded = Command::decode(&bytes).expect("decodes");
        assert_eq!(decoded, command);
        assert_eq!(decoded.encode(), bytes, "the same command encodes to the same bytes");
        let Command::ApplyPlanResults { allocs, .. } = &decoded else { panic!("a plan") };
        assert!(Arc::ptr_eq(&allocs[1].job, &allocs[2].job), "one job version, one Arc");
        assert!(!Arc::ptr_eq(&allocs[0].job, &allocs[1].job), "two versions, two jobs");
        let whole = postcard::to_allocvec(&command).expect("encodes with jobs inline").len();
        let job_size = postcard::to_allocvec(&*allocs[1].job).expect("a job").len();
        // Each allocation carries a one-byte index instead of its job; the table carries two jobs.
        assert!(whole - bytes.len() >= 97 * (job_size - 1), "jobs are not repeated: {} against {whole}", bytes.len());
    }

    #[test]
    fn bad_bytes_get_a_clear_error() {
        let bytes = plan(3).encode();
        assert_eq!(Command::decode(&[]), Err(CodecError::Empty));
        let next = FORMAT_VERSION + 1;
        assert_eq!(Command::decode(&[next, 0]), Err(CodecError::UnknownVersion(next)));
        assert!(matches!(Command::decode(&bytes[..bytes.len() / 2]), Err(CodecError::Malformed(_))));
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(Command::decode(&longer), Err(CodecError::Trailing(1)));
        let mut bad_index = Vec::from([FORMAT_VERSION, 0]);
        bad_index.extend(postcard::to_allocvec(&plan(1)).expect("inline").iter());
        assert!(matches!(Command::decode(&bad_index), Err(CodecError::Malformed(_))), "a job index beyond the table");
    }
}
