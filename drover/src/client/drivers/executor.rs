//! The task executor: a small process per running task (`drover executor
//! <launch.json>`, started by the agent), as Nomad's raw_exec has its
//! executor. It outlives the agent, so a task keeps its logs and its exit
//! status while the agent restarts.
//!
//! What it does, in order:
//!
//! 1. Becomes a child subreaper, so the task's orphaned descendants are
//!    re-parented to it and reaped (a process group then empties exactly
//!    when its last member exits).
//! 2. Starts the task through a gate: a second `drover executor --gate`
//!    in a new process group (its pid is the group id), as the task's user,
//!    in its working directory with its environment, stdout and stderr
//!    piped back. The executor puts the gate in the task's cgroup; the gate
//!    waits for one byte on stdin, sets its own `RLIMIT_DATA` (when
//!    process limits are in force) with everything for `exec` already
//!    built, and `exec`s the task. So the limits are in force before the
//!    task's first instruction, with no `unsafe` pre-exec hook, and the
//!    gate's own allocator never runs under the task's limit.
//! 3. Prints `started <pid> <start time>` on its stdout for the agent (the
//!    start time is field 22 of `/proc/<pid>/stat`, so a recycled pid is
//!    never mistaken for the task), or `failed <reason>`.
//! 4. Copies the two pipes into rotated log files (`logs.rs`).
//! 5. When the task's main process exits, records how; sends the kill
//!    signal to what is left of its process group, waits the kill timeout
//!    for it to empty, then kills the group (and the cgroup: processes that
//!    left the group). Stopping a task is the agent signalling the group:
//!    the same path.
//! 6. Writes `<task>.exit.json` (temporary file, fsync, rename) and exits.
//!    An executor that died without that file lost its task: the agent
//!    says so.

use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitOptions};
use serde::{Deserialize, Serialize};

use crate::client::alloc_dir::write_private;
use crate::client::logs::{self, LogKind, RotatingWriter};

/// Everything the executor needs, written by the agent as JSON.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LaunchSpec {
    /// The task's name (log file names).
    pub task: String,
    /// The program, resolved to a path by the agent.
    pub command: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its whole environment.
    pub env: Vec<(String, String)>,
    /// Where it runs.
    pub work_dir: PathBuf,
    /// Run as this user and group id.
    pub user: Option<(u32, u32)>,
    /// Limit its data segment to this many bytes (process-limit mode).
    pub memory_limit_bytes: Option<u64>,
    /// Put it in this cgroup (cgroup mode); removed when it ends.
    pub cgroup: Option<PathBuf>,
    /// Where its logs go.
    pub logs_dir: PathBuf,
    /// Files kept per stream.
    pub log_max_files: u32,
    /// Size of one log file.
    pub log_max_file_bytes: u64,
    /// The signal that asks what is left of the group to stop.
    pub kill_signal: i32,
    /// How long it has before it is killed.
    pub kill_timeout: Duration,
    /// Where the exit record goes.
    pub exit_file: PathBuf,
}

/// How a task ended, as its executor saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitRecord {
    /// Its exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// The kernel's OOM killer ended a process of its cgroup.
    pub oom_killed: bool,
}

impl ExitRecord {
    /// Exited with code 0.
    pub fn success(&self) -> bool {
        self.exit_code == Some(0) && self.signal.is_none()
    }
}

/// `drover executor <launch.json>`: runs one task and exits when it is
/// gone. Returns the process exit code.
pub fn run(spec_path: &Path) -> i32 {
    let spec: LaunchSpec = match std::fs::read(spec_path)
        .map_err(|error| error.to_string())
        .and_then(|bytes| serde_json::from_slice(&bytes).map_err(|error| error.to_string()))
    {
        Ok(spec) => spec,
        Err(error) => {
            println!("failed reading {}: {error}", spec_path.display());
            return 1;
        }
    };
    if let Err(error) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
        eprintln!("executor: cannot become a subreaper ({error}); orphans of the task go to init");
    }
    let mut gate = match start_gate(&spec) {
        Ok(gate) => gate,
        Err(error) => {
            println!("failed {error}");
            return 1;
        }
    };
    let pid = Pid::from_child(&gate);
    if let Err(error) = limit(&spec, pid) {
        let _ = rustix::process::kill_process_group(pid, Signal::KILL);
        println!("failed setting resource limits: {error}");
        return 1;
    }
    let (pumped_tx, pumped) = mpsc::channel();
    let mut pumps = 0;
    if let Some(out) = gate.stdout.take() {
        spawn_pump(out, &spec, LogKind::Stdout, pumped_tx.clone());
        pumps += 1;
    }
    if let Some(err) = gate.stderr.take() {
        spawn_pump(err, &spec, LogKind::Stderr, pumped_tx);
        pumps += 1;
    }
    // Open the gate: the task starts now, limits in force.
    let opened = gate.stdin.take().map(|mut stdin| stdin.write_all(b"g"));
    if !matches!(opened, Some(Ok(()))) {
        println!("failed opening the gate");
    }
    println!("started {} {}", pid.as_raw_nonzero(), start_time(pid).unwrap_or(0));
    let _ = std::io::stdout().flush();
    let record = supervise(&spec, pid);
    // The pipes end when the last process holding them exits; one that
    // left the group (a daemon) may hold them for ever, so wait a little.
    let deadline = Instant::now() + Duration::from_secs(2);
    for _ in 0..pumps {
        if pumped.recv_timeout(deadline.saturating_duration_since(Instant::now())).is_err() {
            break;
        }
    }
    if let Some(cgroup) = &spec.cgroup {
        let _ = std::fs::remove_dir(cgroup);
    }
    match serde_json::to_vec(&record)
        .map_err(std::io::Error::other)
        .and_then(|bytes| write_private(&spec.exit_file, &bytes))
    {
        Ok(()) => 0,
        Err(error) => {
            eprintln!("executor: writing {}: {error}", spec.exit_file.display());
            1
        }
    }
}

/// `drover executor --gate <data limit|-> <command> <args...>`: waits for
/// the executor's byte on stdin, limits its data segment (unless `-`),
/// then becomes the task. Returns only if `exec` failed.
pub fn gate(data_limit: Option<u64>, command: &Path, args: &[String]) -> i32 {
    let mut byte = [0u8; 1];
    if std::io::stdin().read_exact(&mut byte).is_err() {
        return 1;
    }
    let mut task = Command::new(command);
    task.args(args);
    if let Some(bytes) = data_limit {
        let limit = rustix::process::Rlimit { current: Some(bytes), maximum: Some(bytes) };
        if let Err(error) = rustix::process::setrlimit(rustix::process::Resource::Data, limit) {
            eprintln!("drover: cannot limit the task's memory: {error}");
            return 126;
        }
    }
    let error = std::os::unix::process::CommandExt::exec(&mut task);
    eprintln!("drover: cannot run {}: {error}", command.display());
    if error.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}

/// Why the gate (the task-to-be) did not start.
#[derive(Debug, thiserror::Error)]
enum GateError {
    /// This process's own binary, which the gate runs, was not found.
    #[error("finding the drover binary: {0}")]
    OwnBinary(std::io::Error),
    /// The gate process did not start.
    #[error("starting {command}: {source}")]
    Spawn {
        /// The task's command.
        command: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

fn start_gate(spec: &LaunchSpec) -> Result<std::process::Child, GateError> {
    let executable = std::env::current_exe().map_err(GateError::OwnBinary)?;
    let mut command = Command::new(executable);
    command
        .arg("executor")
        .arg("--gate")
        .arg(spec.memory_limit_bytes.map_or_else(|| "-".to_string(), |bytes| bytes.to_string()))
        .arg(&spec.command)
        .args(&spec.args)
        .env_clear()
        .envs(spec.env.iter().map(|(key, value)| (key, value)))
        .current_dir(&spec.work_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    if let Some((uid, gid)) = spec.user {
        std::os::unix::process::CommandExt::gid(&mut command, gid);
        std::os::unix::process::CommandExt::uid(&mut command, uid);
    }
    command.spawn().map_err(|source| GateError::Spawn { command: spec.command.clone(), source })
}

/// Puts the gate (the task-to-be) in its cgroup; the gate sets its
/// process limits itself.
fn limit(spec: &LaunchSpec, pid: Pid) -> std::io::Result<()> {
    if let Some(cgroup) = &spec.cgroup {
        std::fs::write(cgroup.join("cgroup.procs"), pid.as_raw_nonzero().to_string())?;
    }
    Ok(())
}

/// Copies one pipe into its log files on a thread; says so on `done` at the end.
fn spawn_pump(source: impl Read + Send + 'static, spec: &LaunchSpec, kind: LogKind, done: mpsc::Sender<()>) {
    let writer = RotatingWriter::open(
        &spec.logs_dir,
        &logs::prefix(&spec.task, kind),
        spec.log_max_files,
        spec.log_max_file_bytes,
    );
    std::thread::spawn(move || {
        match writer {
            Ok(writer) => logs::pump(source, writer),
            Err(error) => {
                eprintln!("executor: opening the {} log: {error}", kind.as_str());
                // Keep draining, so the task never blocks on a full pipe.
                let _ = std::io::copy(&mut std::io::BufReader::new(source), &mut std::io::sink());
            }
        }
        let _ = done.send(());
    });
}

/// Waits for the task's main process, then empties its process group:
/// the kill signal, the kill timeout, SIGKILL.
fn supervise(spec: &LaunchSpec, leader: Pid) -> ExitRecord {
    let (reaped_tx, reaped) = mpsc::channel();
    // Reaps every child (the gate, and orphans re-parented to this
    // subreaper); ends when there are none left.
    std::thread::spawn(move || loop {
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(Some((pid, status))) => {
                if reaped_tx.send((pid, status)).is_err() {
                    return;
                }
            }
            Err(rustix::io::Errno::INTR) | Ok(None) => {}
            Err(_) => return,
        }
    });
    let mut record = ExitRecord { exit_code: None, signal: None, oom_killed: false };
    for (pid, status) in reaped.iter() {
        if pid == leader {
            record.exit_code = status.exit_status();
            record.signal = status.terminating_signal();
            break;
        }
    }
    let signal = Signal::from_named_raw(spec.kill_signal).unwrap_or(Signal::INT);
    if group_alive(leader) {
        let _ = rustix::process::kill_process_group(leader, signal);
        let deadline = Instant::now() + spec.kill_timeout;
        while group_alive(leader) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let _ = reaped.recv_timeout(left);
        }
    }
    kill_all(spec, leader, &reaped);
    record.oom_killed = spec.cgroup.as_deref().is_some_and(cgroup_oom_killed);
    record
}

/// SIGKILL to the group and the cgroup, then wait (bounded) until it is empty.
fn kill_all(spec: &LaunchSpec, leader: Pid, reaped: &mpsc::Receiver<(Pid, rustix::process::WaitStatus)>) {
    let _ = rustix::process::kill_process_group(leader, Signal::KILL);
    if let Some(cgroup) = &spec.cgroup {
        let _ = std::fs::write(cgroup.join("cgroup.kill"), "1");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while group_alive(leader) && Instant::now() < deadline {
        let _ = reaped.recv_timeout(Duration::from_millis(100));
    }
}

/// Whether any process of the group is left.
fn group_alive(group: Pid) -> bool {
    rustix::process::test_kill_process_group(group).is_ok()
}

/// Whether the cgroup's `memory.events` counts an OOM kill.
fn cgroup_oom_killed(cgroup: &Path) -> bool {
    let Ok(file) = std::fs::File::open(cgroup.join("memory.events")) else { return false };
    std::io::BufReader::new(file).lines().map_while(Result::ok).any(|line| {
        line.strip_prefix("oom_kill ").and_then(|count| count.trim().parse::<u64>().ok()).is_some_and(|n| n > 0)
    })
}

/// Field 22 of `/proc/<pid>/stat`: when the process started, in clock
/// ticks after boot. With the pid, it names one process for good.
pub fn start_time(pid: Pid) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

/// Whether `pid` is a live process: it exists and is not a zombie
/// waiting to be reaped (field 3 of `/proc/<pid>/stat`).
pub fn is_running(pid: Pid) -> bool {
    stat_fields(pid).and_then(|fields| fields.first().cloned()).is_some_and(|state| state != "Z" && state != "X")
}

/// The fields of `/proc/<pid>/stat` after the command name (field 3 on).
pub(crate) fn stat_fields(pid: Pid) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_nonzero())).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let after_name = &stat[stat.rfind(')')? + 1..];
    Some(after_name.split_whitespace().map(str::to_string).collect())
}

/// Why a task's user has no uid and gid here ([`lookup_user`]).
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    /// `/etc/passwd` could not be read.
    #[error("reading /etc/passwd: {0}")]
    Passwd(std::io::Error),
    /// The user's line has a uid or gid that is not a number.
    #[error("/etc/passwd: bad uid or gid for {0:?}")]
    Malformed(String),
    /// No line names the user.
    #[error("user {0:?} does not exist on this node")]
    Unknown(String),
}

/// The uid and primary gid of `user`, from `/etc/passwd` (a name or a
/// number).
pub fn lookup_user(user: &str) -> Result<(u32, u32), UserError> {
    let passwd = std::fs::read_to_string("/etc/passwd").map_err(UserError::Passwd)?;
    for line in passwd.lines() {
        let fields: Vec<&str> = line.split(':').collect();
        if fields.len() >= 4 && (fields[0] == user || fields[2] == user) {
            let malformed = |_| UserError::Malformed(user.to_string());
            return Ok((fields[2].parse().map_err(malformed)?, fields[3].parse().map_err(malformed)?));
        }
    }
    Err(UserError::Unknown(user.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_of_this_process_is_read() {
        let own = start_time(rustix::process::getpid()).expect("readable");
        assert!(own > 0);
        assert_eq!(start_time(rustix::process::getpid()), Some(own), "stable");
        assert!(is_running(rustix::process::getpid()));
    }

    #[test]
    fn users_are_looked_up_by_name_or_number() {
        assert_eq!(lookup_user("root").expect("root is there"), (0, 0));
        assert_eq!(lookup_user("0").expect("uid 0 is there"), (0, 0));
        let unknown = lookup_user("no-such-user-here").expect_err("unknown");
        assert!(
            matches!(unknown, UserError::Unknown(_)) && unknown.to_string().contains("does not exist"),
            "{unknown}"
        );
    }
}
