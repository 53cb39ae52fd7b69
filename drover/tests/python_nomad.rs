//! python-nomad 2.1.0, the real library from PyPI, against a real
//! `drover server --dev` and a real `drover agent --dev` (mock driver), both
//! the `drover` binary on loopback ports they pick. The library lives in a
//! virtual environment that `.ci/run` installs; the test installs it itself
//! when it is missing (`pip install python-nomad==2.1.0`).

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Kills the child processes when the test ends, however it ends.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The virtual environment with python-nomad 2.1.0: `.ci/run` makes it.
fn python() -> PathBuf {
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

#[test]
fn python_nomad_registers_reads_and_stops_a_job_on_a_real_server_and_agent() {
    let python = python();
    let dir = std::env::temp_dir().join(format!("drover-python-nomad-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut children = Children(Vec::new());
    let mut server = Command::new(env!("CARGO_BIN_EXE_drover"))
        .args(["server", "--dev", "--bind", "127.0.0.1", "--port", "0", "--http-port", "0", "--print-address"])
        .args(["--workers", "1", "--data-dir"])
        .arg(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("drover server starts");
    let mut lines = std::io::BufReader::new(server.stdout.take().expect("stdout")).lines();
    children.0.push(server);
    let rpc = lines.next().expect("a line").expect("reads").strip_prefix("listening ").expect("listening").to_string();
    let http = lines.next().expect("a line").expect("reads").strip_prefix("http ").expect("http").to_string();
    let tls = dir.join("dev-tls");
    let agent = Command::new(env!("CARGO_BIN_EXE_drover"))
        .args(["agent", "--dev", "--servers", &rpc, "--ca-file"])
        .arg(tls.join("ca.pem"))
        .arg("--cert-file")
        .arg(tls.join("client.pem"))
        .arg("--key-file")
        .arg(tls.join("client-key.pem"))
        .arg("--data-dir")
        .arg(dir.join("agent"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("drover agent starts");
    children.0.push(agent);

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/nomad_client.py");
    let output = Command::new(&python)
        .arg(&script)
        .env("NOMAD_ADDR", format!("http://{http}"))
        .output()
        .expect("the python test runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "python-nomad test failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("checks passed"), "{stdout}");
    drop(children);
    let _ = std::fs::remove_dir_all(&dir);
}
