//! The `drover` CLI (job run, status, stop; node, alloc and eval status;
//! alloc logs, fs, signal, restart and stop; server members; the workers)
//! against a real `drover dev` process: the output a user sees and the
//! exit codes.

use std::io::BufRead;
use std::process::{Child, Command, Output, Stdio};

/// Kills the dev agent when the test ends, however it ends.
struct Dev(Option<Child>);

impl Drop for Dev {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Dev {
    /// SIGTERM, then its exit status; fails the test if it has not exited
    /// within a bound.
    fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.0.take().expect("running");
        let pid = rustix::process::Pid::from_child(&child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
        let (exited_tx, exited) = std::sync::mpsc::channel();
        std::thread::spawn(move || exited_tx.send(child.wait()));
        match exited.recv_timeout(std::time::Duration::from_secs(90)) {
            Ok(status) => status.expect("waited for"),
            Err(_) => {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                panic!("drover dev did not exit within 90 s of SIGTERM");
            }
        }
    }
}

fn drover(address: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_drover")).args(args).env("DROVER_ADDR", address).output().expect("drover runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn the_cli_runs_a_job_and_shows_it_as_nomad_does() {
    // Its own temporary directory, to see that drover dev leaves nothing there.
    let tmp = std::env::temp_dir().join(format!("drover-cli-tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).expect("dir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_drover"))
        .args(["dev", "--port", "0", "--http-port", "0", "--print-address", "--log-level", "warn"])
        .env("TMPDIR", &tmp)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("drover dev starts");
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut dev = Dev(Some(child));
    let http = loop {
        let line = lines.next().expect("a line").expect("reads");
        if let Some(http) = line.strip_prefix("http ") {
            break format!("http://{http}");
        }
    };
    let dir = std::env::temp_dir().join(format!("drover-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("example.json");
    let job = r#"{"Job": {"ID": "example", "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "cache", "Count": 2, "Tasks": [{"Name": "redis", "Driver": "mock",
        "Config": {"run_for": "1h"}, "Resources": {"CPU": 100, "MemoryMB": 64}}]}]}}"#;
    std::fs::write(&file, job).expect("job file");
    let path = file.to_str().expect("path");

    // The dev agent registers its node after the server is listening.
    until_list(&http, "/v1/nodes", |nodes| nodes.iter().any(|node| node["Status"] == "ready"));
    let run = drover(&http, &["job", "run", path]);
    let text = stdout(&run);
    assert_eq!(run.status.code(), Some(0), "{text}");
    assert!(text.starts_with("==> Monitoring evaluation \""), "{text}");
    assert_eq!(text.matches("created: node").count(), 2, "{text}");
    assert!(text.contains("finished with status \"complete\""), "{text}");

    let list = stdout(&drover(&http, &["job", "status"]));
    assert!(list.starts_with("ID       Type     Priority  Status   Submit Date\nexample  service  50"), "{list}");
    let one = stdout(&drover(&http, &["job", "status", "exa"]));
    assert!(one.contains("ID            = example\n") && one.contains("\nSummary\nTask Group  Queued"), "{one}");
    let json = drover(&http, &["job", "status", "example", "--json"]);
    let parsed: serde_json::Value = serde_json::from_slice(&json.stdout).expect("--json prints JSON");
    assert_eq!(parsed["ID"], "example");

    let allocs: serde_json::Value =
        serde_json::from_slice(&drover(&http, &["node", "status", "--json"]).stdout).expect("nodes json");
    let node = allocs[0]["ID"].as_str().expect("node id").to_string();
    let node_text = stdout(&drover(&http, &["node", "status", &node[..6]]));
    let drivers = node_text.lines().find_map(|line| line.strip_prefix("Driver Status = ")).unwrap_or_default();
    assert!(drivers.split(',').any(|driver| driver == "mock") && node_text.contains("\nAllocations\n"), "{node_text}");
    let members = stdout(&drover(&http, &["server", "members"]));
    assert!(members.starts_with("Name") && members.contains("alive   true"), "{members}");
    let workers = stdout(&drover(&http, &["operator", "scheduler", "workers", "set", "1"]));
    assert_eq!(workers.lines().count(), 2, "one worker: {workers}");
    let paused = stdout(&drover(&http, &["operator", "scheduler", "workers", "pause"]));
    assert!(paused.contains("Paus"), "pausing or paused: {paused}");
    let resumed = drover(&http, &["operator", "scheduler", "workers", "resume"]);
    assert_eq!(resumed.status.code(), Some(0), "{}", String::from_utf8_lossy(&resumed.stderr));
    let unknown = drover(&http, &["operator", "scheduler", "workers", "pause", "99"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no worker 99"));

    // A Nomad HCL2 job file runs the same way; an unsupported block is named with its line.
    let hcl = dir.join("web.hcl");
    let spec = "job \"web\" {\n  datacenters = [\"dc1\"]\n  group \"web\" {\n    task \"server\" {\n      driver = \"mock\"\n      config { run_for = \"1h\" }\n      resources {\n        cpu    = 100\n        memory = 64\n      }\n    }\n  }\n}\n";
    std::fs::write(&hcl, spec).expect("hcl file");
    let run = drover(&http, &["job", "run", hcl.to_str().expect("path")]);
    assert_eq!(run.status.code(), Some(0), "{}", stdout(&run));
    assert!(stdout(&run).contains("finished with status \"complete\""));
    // A block of Nomad's that Drover lacks is a warning; one Nomad lacks too is refused, named with its line.
    std::fs::write(&hcl, spec.replace("      driver = \"mock\"", "      driver = \"mock\"\n      vault {}"))
        .expect("hcl");
    let warned = drover(&http, &["job", "run", "--detach", hcl.to_str().expect("path")]);
    assert_eq!(warned.status.code(), Some(0), "{}", String::from_utf8_lossy(&warned.stderr));
    let printed = stdout(&warned);
    assert!(
        printed.contains("Job Warnings:") && printed.contains("Task \"server\": Vault is not implemented"),
        "{printed}"
    );
    std::fs::write(&hcl, spec.replace("      driver = \"mock\"", "      driver = \"mock\"\n      vualt {}"))
        .expect("hcl");
    let refused = drover(&http, &["job", "run", hcl.to_str().expect("path")]);
    let error = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{error}");
    assert!(error.contains("web.hcl:6: task: block \"vualt\" is not supported by Drover"), "{error}");

    // A raw_exec task's output, read through the server with `alloc logs`.
    let batch = dir.join("hello.json");
    let job = r#"{"Job": {"ID": "hello", "Type": "batch", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "hello", "Tasks": [{"Name": "say", "Driver": "raw_exec",
        "Config": {"command": "/bin/sh", "args": ["-c", "echo hello from drover; echo oops >&2"]},
        "Resources": {"CPU": 100, "MemoryMB": 64}}]}]}}"#;
    std::fs::write(&batch, job).expect("job file");
    let run = drover(&http, &["job", "run", batch.to_str().expect("path")]);
    assert_eq!(run.status.code(), Some(0), "{}", stdout(&run));
    let alloc = complete_alloc(&http, "hello");
    let logs = drover(&http, &["alloc", "logs", &alloc[..8]]);
    assert_eq!(stdout(&logs), "hello from drover\n", "{}", String::from_utf8_lossy(&logs.stderr));
    let logs = drover(&http, &["alloc", "logs", "--stderr", "-f", &alloc, "say"]);
    assert_eq!(stdout(&logs), "oops\n", "{}", String::from_utf8_lossy(&logs.stderr));
    let wrong = drover(&http, &["alloc", "logs", &alloc, "nosuch"]);
    assert_eq!(wrong.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("Task \"nosuch\" is not in allocation"));
    let tail = drover(&http, &["alloc", "logs", "--tail", "-n", "1", &alloc]);
    assert_eq!(stdout(&tail), "hello from drover\n", "{}", String::from_utf8_lossy(&tail.stderr));

    // Its files, with `alloc fs`: a directory listed, a file printed.
    let root = stdout(&drover(&http, &["alloc", "fs", &alloc]));
    assert!(root.starts_with("Mode") && root.contains(" alloc/\n") && root.contains(" say/\n"), "{root}");
    let file = drover(&http, &["alloc", "fs", &alloc, "alloc/logs/say.stdout.0"]);
    assert_eq!(stdout(&file), "hello from drover\n", "{}", String::from_utf8_lossy(&file.stderr));
    let stat = stdout(&drover(&http, &["alloc", "fs", "--stat", &alloc, "alloc/logs/say.stdout.0"]));
    assert!(stat.contains("-rw") && stat.contains(" say.stdout.0\n"), "{stat}");
    let escape = drover(&http, &["alloc", "fs", &alloc, "../../.."]);
    assert_eq!(escape.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&escape.stderr).contains("escapes the allocation directory"));

    // A service task that answers SIGUSR1: signalled, restarted and
    // stopped with the CLI, its log followed by `alloc logs -f` meanwhile.
    let trap = dir.join("trap.json");
    let job = r#"{"Job": {"ID": "trap", "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "raw_exec",
        "Config": {"command": "/bin/sh", "args": ["-c", "trap 'echo got-usr1' USR1; echo started; while :; do sleep 1; done"]},
        "Resources": {"CPU": 100, "MemoryMB": 64}}]}]}}"#;
    std::fs::write(&trap, job).expect("job file");
    let run = drover(&http, &["job", "run", trap.to_str().expect("path")]);
    assert_eq!(run.status.code(), Some(0), "{}", stdout(&run));
    let allocs = until_list(&http, "/v1/job/trap/allocations", |allocs| {
        allocs.iter().any(|alloc| alloc["ClientStatus"] == "running")
    });
    let trapping = allocs[0]["ID"].as_str().expect("id").to_string();
    let mut follow = Followed::start(&http, &["alloc", "logs", "-f", &trapping]);
    follow.until("started");
    let signal = drover(&http, &["alloc", "signal", "-s", "SIGUSR1", &trapping, "t"]);
    assert_eq!(signal.status.code(), Some(0), "{}", String::from_utf8_lossy(&signal.stderr));
    follow.until("got-usr1");
    let bad = drover(&http, &["alloc", "signal", "-s", "SIGNOPE", &trapping]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("invalid signal"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let restart = drover(&http, &["alloc", "restart", &trapping]);
    assert_eq!(restart.status.code(), Some(0), "{}", String::from_utf8_lossy(&restart.stderr));
    follow.until("started");
    let stop = drover(&http, &["alloc", "stop", &trapping[..8]]);
    assert!(stdout(&stop).contains("finished with status \"complete\""), "{}", stdout(&stop));
    follow.ends();
    let stopped = drover(&http, &["job", "stop", "trap"]);
    assert_eq!(stopped.status.code(), Some(0), "{}", stdout(&stopped));

    let unknown = drover(&http, &["job", "status", "nope"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("No job(s) with prefix or id \"nope\" found"));

    let stop = drover(&http, &["job", "stop", "example"]);
    assert_eq!(stop.status.code(), Some(0), "{}", stdout(&stop));
    let after = stdout(&drover(&http, &["job", "status"]));
    assert!(after.contains("example  service  50        dead (stopped)"), "{after}");
    let _ = std::fs::remove_dir_all(&dir);

    assert!(dev.terminate().success());
    let left: Vec<_> = std::fs::read_dir(&tmp).expect("tmp").map(|entry| entry.expect("entry").path()).collect();
    assert!(left.is_empty(), "drover dev left {left:?} behind");
    let _ = std::fs::remove_dir_all(&tmp);
}

/// A `drover` command whose output is read line by line as it comes.
struct Followed {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Followed {
    fn start(address: &str, args: &[&str]) -> Followed {
        let mut child = Command::new(env!("CARGO_BIN_EXE_drover"))
            .args(args)
            .env("DROVER_ADDR", address)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("drover runs");
        let stdout = child.stdout.take().expect("piped");
        let (line_tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = line_tx.send(line);
            }
        });
        Followed { child, lines }
    }

    /// Reads until a line is `wanted`; a hang fails after a bound.
    fn until(&mut self, wanted: &str) {
        loop {
            match self.lines.recv_timeout(std::time::Duration::from_secs(90)) {
                Ok(line) if line == wanted => return,
                Ok(_) => {}
                Err(error) => panic!("no line {wanted:?} came: {error}"),
            }
        }
    }

    /// Waits for the command to end by itself, successfully.
    fn ends(mut self) {
        use std::sync::mpsc::RecvTimeoutError;
        loop {
            match self.lines.recv_timeout(std::time::Duration::from_secs(90)) {
                Ok(_) => {}
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => panic!("the command did not end"),
            }
        }
        let status = self.child.wait().expect("waited for");
        assert!(status.success(), "{status}");
    }
}

impl Drop for Followed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The list at `path` once `holds` is true of it, woken by each write (a
/// blocking query). Each wait ends at the next write or after 30 s; 20
/// with `holds` still false is a hang, reported with what was seen.
fn until_list(http: &str, path: &str, holds: impl Fn(&[serde_json::Value]) -> bool) -> Vec<serde_json::Value> {
    let api = drover::api::client::ApiClient::new(http, None, None).expect("client");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let mut index = 0;
        let mut seen = Vec::new();
        for _ in 0..20 {
            let answer = api.get(&format!("{path}?index={index}&wait=30s")).await.expect("a list");
            seen = answer.json().expect("JSON").as_array().cloned().expect("a list");
            if holds(&seen) {
                return seen;
            }
            index = answer.index.expect("X-Nomad-Index");
        }
        panic!("{path} never became what the test waits for: {seen:?}");
    })
}

/// The id of `job`'s allocation once it is complete.
fn complete_alloc(http: &str, job: &str) -> String {
    let allocs = until_list(http, &format!("/v1/job/{job}/allocations"), |allocs| {
        assert!(allocs.iter().all(|alloc| alloc["ClientStatus"] != "failed"), "{allocs:?}");
        allocs.iter().any(|alloc| alloc["ClientStatus"] == "complete")
    });
    let done = allocs.iter().find(|alloc| alloc["ClientStatus"] == "complete").expect("complete");
    done["ID"].as_str().expect("id").to_string()
}
