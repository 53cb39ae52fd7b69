//! python-nomad 2.1.0, the real library from PyPI, against a real
//! `drover server --dev` and a real `drover agent --dev` (mock, raw_exec
//! and docker drivers), both the `drover` binary on loopback ports they
//! pick, one Python script a test (`tests/python/`): jobs (their versions,
//! stability and revert too), deployments (read, paused, resumed, promoted,
//! failed, an allocation's health set), evals, nodes (drained, made
//! eligible, evaluated), periodic jobs (forced) and parameterized jobs
//! (dispatched), namespaces (made, read, a job run in one, deleted),
//! allocations, the event stream, and the client endpoints (logs, files, stats, signal,
//! restart, stop, gc) the server answers through the agent; and a Nomad
//! job file with `driver = "docker"` run as `nomad job run` runs it
//! (`/v1/jobs/parse`, register, the task's events, its HTTP answer on the
//! allocated host port, the stop), on an image the test builds, its
//! containers removed however it ends.
//! The library lives in a virtual environment that `.ci/run` installs; the
//! test installs it itself when it is missing (`pip install
//! python-nomad==2.1.0`).

mod common;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

/// How long the whole Python run may take before the test fails.
const WATCHDOG: Duration = Duration::from_secs(240);

/// The processes a test started, each with its stderr kept in a file so
/// a failure can show it; killed when the test ends, however it ends.
struct Children {
    dir: PathBuf,
    running: Vec<(String, Child)>,
}

impl Children {
    /// Starts `command` as `name`, its stderr in `<dir>/<name>.stderr`.
    fn spawn(&mut self, name: &str, command: &mut Command) -> &mut Child {
        let stderr = std::fs::File::create(self.stderr_path(name)).expect("a stderr file");
        let child = command.stderr(stderr).spawn().unwrap_or_else(|error| panic!("{name} starts: {error}"));
        self.running.push((name.to_string(), child));
        &mut self.running.last_mut().expect("just pushed").1
    }

    fn stderr_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.stderr"))
    }

    /// Every child's stderr, for a failure message.
    fn stderrs(&self) -> String {
        let mut shown = String::new();
        for (name, _) in &self.running {
            let text = std::fs::read_to_string(self.stderr_path(name)).unwrap_or_default();
            shown.push_str(&format!("--- {name} stderr ---\n{text}\n"));
        }
        shown
    }

    /// A child that has exited already, with its status.
    fn exited(&mut self) -> Option<String> {
        self.running.iter_mut().find_map(|(name, child)| {
            let status = child.try_wait().ok().flatten()?;
            Some(format!("{name} exited early ({status})"))
        })
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for (_, child) in &mut self.running {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The virtual environment with python-nomad 2.1.0: `.ci/run` makes it;
/// the first test that finds it missing makes it, while the others wait.
fn python() -> PathBuf {
    static MAKING: Mutex<()> = Mutex::new(());
    let _making = MAKING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-nomad-2.1.0");
    let python = venv.join("bin/python");
    if !python.exists() {
        let made = Command::new("python3").args(["-m", "venv"]).arg(&venv).status().expect("python3 runs");
        assert!(made.success(), "python3 -m venv {}", venv.display());
        let pip = Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "python-nomad==2.1.0"])
            .status()
            .expect("pip runs");
        assert!(pip.success(), "pip install python-nomad==2.1.0");
    }
    python
}

/// A real `drover server --dev` and `drover agent --dev` on loopback
/// ports they pick, their data in `dir`; the children, and the server's
/// HTTP address.
fn dev_cluster(dir: &Path) -> (Children, String) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("temp dir");
    let mut children = Children { dir: dir.to_path_buf(), running: Vec::new() };
    // Every listener of every process on a port it picks: a test never
    // depends on a well-known port being free.
    let server = children.spawn(
        "server",
        Command::new(env!("CARGO_BIN_EXE_drover"))
            .args(["server", "--dev", "--bind", "127.0.0.1", "--port", "0", "--http-port", "0", "--print-address"])
            .args(["--workers", "1", "--data-dir"])
            .arg(dir)
            .stdout(Stdio::piped()),
    );
    let mut lines = std::io::BufReader::new(server.stdout.take().expect("stdout")).lines();
    let mut line = |what: &str| match lines.next() {
        Some(Ok(line)) => line,
        _ => panic!("the server printed no {what} line"),
    };
    let rpc = line("listening").strip_prefix("listening ").map(str::to_string);
    let http = line("http").strip_prefix("http ").map(str::to_string);
    let (Some(rpc), Some(http)) = (rpc, http) else { panic!("the server's address lines:\n{}", children.stderrs()) };
    // The rest of its stdout is read on, so it never writes to a closed pipe.
    std::thread::spawn(move || lines.for_each(drop));
    children.spawn("agent", common::dev_agent(dir, &rpc, &dir.join("agent")).stdout(Stdio::null()));
    (children, format!("http://{http}"))
}

/// Runs `tests/python/<script>` against the server at `http` with `env`,
/// until it ends or a child does, within [`WATCHDOG`]; its stdout, once
/// it passed.
fn run_script(children: &mut Children, script: &str, http: &str, env: &[(&str, &str)]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python").join(script);
    let mut python = Command::new(python())
        .arg(&script)
        .env("NOMAD_ADDR", http)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the python test runs");
    let (stdout, stderr) = (python.stdout.take().expect("piped"), python.stderr.take().expect("piped"));
    let read_all = |mut from: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = from.read_to_string(&mut text);
            text
        })
    };
    let (stdout, stderr) = (read_all(Box::new(stdout)), read_all(Box::new(stderr)));
    // The script's end, or a child's: whichever comes first; a bound on both.
    let (done_tx, done) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let status = python.wait();
        let _ = done_tx.send(());
        status
    });
    let deadline = std::time::Instant::now() + WATCHDOG;
    loop {
        if let Some(early) = children.exited() {
            panic!("{early} while the python test ran:\n{}", children.stderrs());
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match done.recv_timeout(left.min(Duration::from_secs(1))) {
            Ok(()) => break,
            Err(mpsc::RecvTimeoutError::Timeout) if !left.is_zero() => {}
            Err(_) => panic!("the python test did not end within {WATCHDOG:?}:\n{}", children.stderrs()),
        }
    }
    let status = waiter.join().expect("the waiter").expect("python was waited for");
    let (stdout, stderr) = (stdout.join().expect("stdout"), stderr.join().expect("stderr"));
    assert!(status.success(), "python-nomad test failed:\n{stdout}\n{stderr}\n{}", children.stderrs());
    stdout
}

#[test]
fn python_nomad_registers_reads_and_stops_a_job_on_a_real_server_and_agent() {
    let dir = std::env::temp_dir().join(format!("drover-python-nomad-{}", std::process::id()));
    let (mut children, http) = dev_cluster(&dir);
    let stdout = run_script(&mut children, "nomad_client.py", &http, &[]);
    assert!(stdout.contains("checks passed"), "{stdout}");
    drop(children);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn python_nomad_reads_promotes_pauses_and_fails_deployments() {
    let dir = std::env::temp_dir().join(format!("drover-python-nomad-deployments-{}", std::process::id()));
    let (mut children, http) = dev_cluster(&dir);
    let stdout = run_script(&mut children, "nomad_deployments.py", &http, &[]);
    assert!(stdout.contains("checks passed"), "{stdout}");
    drop(children);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn python_nomad_reads_the_event_stream() {
    let dir = std::env::temp_dir().join(format!("drover-python-nomad-events-{}", std::process::id()));
    let (mut children, http) = dev_cluster(&dir);
    let stdout = run_script(&mut children, "nomad_events.py", &http, &[]);
    assert!(stdout.contains("checks passed"), "{stdout}");
    drop(children);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn python_nomad_forces_a_periodic_job_and_dispatches_a_parameterized_one() {
    let dir = std::env::temp_dir().join(format!("drover-python-nomad-periodic-{}", std::process::id()));
    let (mut children, http) = dev_cluster(&dir);
    let stdout = run_script(&mut children, "nomad_periodic.py", &http, &[]);
    assert!(stdout.contains("checks passed"), "{stdout}");
    drop(children);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn python_nomad_makes_namespaces_and_runs_a_job_in_one() {
    let dir = std::env::temp_dir().join(format!("drover-python-nomad-namespaces-{}", std::process::id()));
    let (mut children, http) = dev_cluster(&dir);
    let stdout = run_script(&mut children, "nomad_namespaces.py", &http, &[]);
    assert!(stdout.contains("checks passed"), "{stdout}");
    drop(children);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn python_nomad_drains_a_node_and_sets_its_eligibility() {
    let dir = std::env::temp_dir().join(format!("drover-python-nomad-drain-{}", std::process::id()));
    let (mut children, http) = dev_cluster(&dir);
    let stdout = run_script(&mut children, "nomad_drain.py", &http, &[]);
    assert!(stdout.contains("checks passed"), "{stdout}");
    drop(children);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Removes the test's containers when dropped, however the test ends.
struct TestContainers(String);

impl Drop for TestContainers {
    fn drop(&mut self) {
        common::docker::remove_test_containers(&self.0);
    }
}

#[test]
fn python_nomad_runs_a_docker_job_file_as_nomad_job_run_does() {
    let image = common::docker::test_image();
    let label = format!("python-nomad-{}", std::process::id());
    // Dropped after the children (declared before them): the agent is
    // gone before its containers are removed.
    let _containers = TestContainers(label.clone());
    let dir = std::env::temp_dir().join(format!("drover-python-nomad-docker-{}", std::process::id()));
    let (mut children, http) = dev_cluster(&dir);
    let env = [
        ("DROVER_TEST_IMAGE", image),
        ("DROVER_TEST_LABEL", common::docker::TEST_LABEL),
        ("DROVER_TEST_LABEL_VALUE", label.as_str()),
    ];
    let stdout = run_script(&mut children, "nomad_docker_job.py", &http, &env);
    assert!(stdout.contains("checks passed"), "{stdout}");
    let left = common::docker::containers(common::docker::TEST_LABEL, &label);
    assert!(left.is_empty(), "the stopped allocation's container is removed: {left:?}");
    drop(children);
    let _ = std::fs::remove_dir_all(&dir);
}
