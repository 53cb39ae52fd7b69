//! How the agent holds a task to its resources: cgroups v2 when it can
//! make and fill a cgroup of its own, plain process limits otherwise. The
//! agent logs which, and why, at start-up.
//!
//! - **cgroups v2**: the unified hierarchy (found in `/proc/self/mountinfo`)
//!   must offer the `memory` and `cpu` controllers and let the agent create
//!   `drover/` at its root and enable both controllers for its children.
//!   Each task gets `drover/<alloc_id>.<task>` with `memory.max` (its
//!   memory) and `cpu.weight` (its MHz as Nomad's cpu shares, converted to
//!   a weight); an OOM kill is read from `memory.events`, and stopping the
//!   task also kills what left its process group (`cgroup.kill`).
//! - **process limits**: `RLIMIT_DATA` at the task's memory (its heap and
//!   private mappings; a task over it sees allocations fail rather than
//!   being OOM-killed, so no OOM event can be told), and no CPU limit.

use std::path::{Path, PathBuf};

/// The mechanism in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Isolation {
    /// Per-task cgroups under this directory (`<cgroup2 mount>/drover`).
    Cgroups(PathBuf),
    /// Process limits; the reason cgroups are not used.
    ProcessLimits(String),
}

/// What a task gets, in the terms of the mechanism.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskLimits {
    /// The cgroup to put it in.
    pub cgroup: Option<PathBuf>,
    /// `RLIMIT_DATA`, in bytes.
    pub memory_limit_bytes: Option<u64>,
}

impl Isolation {
    /// Finds what this agent can use.
    pub fn detect() -> Isolation {
        match cgroup2_mount().ok_or(CgroupError::NotMounted).and_then(|mount| {
            let parent = mount.join("drover");
            prepare(&mount, &parent).map(|()| parent)
        }) {
            Ok(parent) => Isolation::Cgroups(parent),
            Err(reason) => Isolation::ProcessLimits(reason.to_string()),
        }
    }

    /// One line for the start-up log.
    pub fn describe(&self) -> String {
        match self {
            Isolation::Cgroups(parent) => {
                format!("cgroups v2 under {} (memory.max, cpu.weight, OOM from memory.events)", parent.display())
            }
            Isolation::ProcessLimits(reason) => {
                format!("process limits (RLIMIT_DATA for memory, no CPU limit): cgroups v2 unusable: {reason}")
            }
        }
    }

    /// Sets up the limits of one task: creates its cgroup in cgroup mode.
    pub fn for_task(&self, name: &str, memory_mb: u64, cpu_mhz: u64) -> std::io::Result<TaskLimits> {
        let memory_bytes = memory_mb.saturating_mul(1024 * 1024);
        match self {
            Isolation::Cgroups(parent) => {
                let cgroup = parent.join(name);
                std::fs::create_dir_all(&cgroup)?;
                std::fs::write(cgroup.join("memory.max"), memory_bytes.to_string())?;
                std::fs::write(cgroup.join("cpu.weight"), cpu_weight(cpu_mhz).to_string())?;
                Ok(TaskLimits { cgroup: Some(cgroup), memory_limit_bytes: None })
            }
            Isolation::ProcessLimits(_) => Ok(TaskLimits { cgroup: None, memory_limit_bytes: Some(memory_bytes) }),
        }
    }
}

/// Nomad's cpu shares (one per MHz) as a cgroup v2 weight (1..=10000),
/// with the kernel's own conversion.
pub fn cpu_weight(cpu_mhz: u64) -> u64 {
    let shares = cpu_mhz.clamp(2, 262_144);
    1 + ((shares - 2) * 9_999) / 262_142
}

/// The mount point of the cgroup2 file system, from `/proc/self/mountinfo`.
fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        if after.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        before.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// Why cgroups v2 cannot be used (the agent falls back to process limits).
#[derive(Debug, thiserror::Error)]
enum CgroupError {
    /// No cgroup2 file system is mounted.
    #[error("no cgroup2 file system is mounted")]
    NotMounted,
    /// A file or directory of the hierarchy could not be read, written or made.
    #[error("{what} {}: {source}", .path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The hierarchy does not offer both controllers.
    #[error("{} offers [{offered}], not {missing}", .mount.display())]
    Controllers {
        /// The cgroup2 mount.
        mount: PathBuf,
        /// The controllers it offers.
        offered: String,
        /// Those missing of memory and cpu.
        missing: String,
    },
}

/// Checks the controllers and makes `parent` with both enabled below it.
fn prepare(mount: &Path, parent: &Path) -> Result<(), CgroupError> {
    let io = |what: &'static str, path: PathBuf| move |source| CgroupError::Io { what, path, source };
    let listed = mount.join("cgroup.controllers");
    let controllers = std::fs::read_to_string(&listed).map_err(io("reading", listed.clone()))?;
    let offered: Vec<&str> = controllers.split_whitespace().collect();
    let missing: Vec<&str> = ["memory", "cpu"].into_iter().filter(|c| !offered.contains(c)).collect();
    if !missing.is_empty() {
        let (offered, missing) = (offered.join(" "), missing.join(" and "));
        return Err(CgroupError::Controllers { mount: mount.to_path_buf(), offered, missing });
    }
    let enable = |dir: &Path| {
        std::fs::write(dir.join("cgroup.subtree_control"), "+memory +cpu")
            .map_err(io("enabling memory and cpu in", dir.to_path_buf()))
    };
    enable(mount)?;
    std::fs::create_dir_all(parent).map_err(io("creating", parent.to_path_buf()))?;
    enable(parent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_shares_convert_to_weights_as_the_kernel_does() {
        assert_eq!(cpu_weight(2), 1);
        assert_eq!(cpu_weight(1024), 39);
        assert_eq!(cpu_weight(262_144), 10_000);
        assert_eq!(cpu_weight(0), 1);
    }

    #[test]
    fn detection_names_what_it_chose_and_why() {
        let isolation = Isolation::detect();
        let line = isolation.describe();
        match &isolation {
            Isolation::Cgroups(parent) => assert!(parent.is_dir(), "{line}"),
            Isolation::ProcessLimits(reason) => assert!(!reason.is_empty() && line.contains(reason.as_str())),
        }
        let limits = isolation.for_task("detect-test.task", 64, 100).expect("limits");
        match (&isolation, &limits) {
            (Isolation::Cgroups(_), TaskLimits { cgroup: Some(cgroup), .. }) => {
                assert_eq!(std::fs::read_to_string(cgroup.join("memory.max")).expect("set").trim(), "67108864");
                std::fs::remove_dir(cgroup).expect("an empty cgroup is removed");
            }
            (Isolation::ProcessLimits(_), _) => assert_eq!(limits.memory_limit_bytes, Some(64 << 20)),
            _ => panic!("cgroup mode gives a cgroup: {limits:?}"),
        }
    }
}
