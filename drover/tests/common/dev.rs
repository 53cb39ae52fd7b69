//! A real `drover server --dev` and `drover agent --dev` (the `drover`
//! binary, on loopback ports they pick), for the tests that run real
//! tasks through a whole cluster.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use drover::api::client::ApiClient;

/// The two processes, stopped (and their directory removed) when dropped.
pub struct DevCluster {
    /// The server, then the agents.
    pub children: Vec<std::process::Child>,
    /// A client of the server's HTTP API.
    pub api: ApiClient,
    /// `http://<the HTTP API's address>`.
    pub http: String,
    /// The server's RPC address.
    pub rpc: String,
    /// The directory both keep their data in.
    pub dir: PathBuf,
}

impl DevCluster {
    /// Starts both, the server with `server_flags` besides its own; its
    /// name in the directory's is `name`.
    pub async fn start(name: &str, server_flags: &[&str]) -> DevCluster {
        let dir = super::temp_dir(name);
        let mut server = super::drover()
            .args(["server", "--dev", "--bind", "127.0.0.1", "--port", "0", "--http-port", "0", "--print-address"])
            .args(["--workers", "1", "--log-level", "warn"])
            .args(server_flags)
            .arg("--data-dir")
            .arg(&dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("drover server starts");
        let (rpc, http) = super::printed_addresses(&mut server).await;
        let http = format!("http://{http}");
        let agent = super::dev_agent(&dir, &rpc, &dir.join("agent"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("drover agent starts");
        let api = ApiClient::new(&http, None, None).expect("client");
        DevCluster { children: vec![server, agent], api, http, rpc, dir }
    }

    /// Runs the `drover` CLI against the cluster's HTTP API.
    pub async fn cli(&self, args: &[&str]) -> std::process::Output {
        let mut command = super::drover();
        command.args(args).env("DROVER_ADDR", &self.http);
        super::bounded("the CLI answers", tokio::task::spawn_blocking(move || command.output().expect("drover runs")))
            .await
            .expect("the CLI task")
    }

    /// The CLI's stdout, once it succeeded.
    pub async fn cli_ok(&self, args: &[&str]) -> String {
        let output = self.cli(args).await;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(output.status.success(), "{args:?}: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
        stdout
    }

    /// Starts one more dev agent, named `name`, with its own data dir and
    /// `flags`; its index in `children`.
    pub fn add_agent(&mut self, name: &str, flags: &[&std::ffi::OsStr]) -> usize {
        let agent = super::dev_agent(&self.dir, &self.rpc, &self.dir.join(name))
            .args(["--name", name])
            .args(flags)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("drover agent starts");
        self.children.push(agent);
        self.children.len() - 1
    }
}

impl Drop for DevCluster {
    /// Stops the agents first with SIGTERM (a dev agent stops its tasks as
    /// it exits, so none outlives the test), then the server; SIGKILL for
    /// either still running after 30 s.
    fn drop(&mut self) {
        for child in self.children.iter_mut().rev() {
            let pid = rustix::process::Pid::from_child(child);
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            let deadline = Instant::now() + Duration::from_secs(30);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
