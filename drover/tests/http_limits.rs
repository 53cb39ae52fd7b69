//! The HTTP listener of a real `drover server` under connections that
//! hold its file descriptors: a descriptor table that runs full neither
//! spins the accept loop nor floods the log, one client address cannot
//! hold more than its share, and connections that stay idle, send half a
//! request head or never finish their TLS handshake are closed once their
//! timeout (`[limits]` in the config file, short here) runs out.
//!
//! Every wait is bounded by a watchdog that turns a hang into a failure;
//! nothing asserts how long anything took.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use common::temp_dir;

/// How long any one wait may take before the test fails.
const WATCHDOG: Duration = Duration::from_secs(60);

/// A `drover server` child whose stderr goes to a file; killed when dropped.
struct Server {
    child: Child,
    http: SocketAddr,
    log: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// What it logged so far.
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Starts `drover server` (dev mode unless `flags` name TLS files) with
/// `limits` as its `[limits]` table, under `ulimit -n <open_files>` (hard
/// and soft, so the server cannot raise it).
fn start(dir: &Path, limits: &str, open_files: u32, flags: &[std::ffi::OsString]) -> Server {
    std::fs::create_dir_all(dir).expect("the server's dir");
    let config = dir.join("limits.toml");
    std::fs::write(&config, format!("[limits]\n{limits}\n")).expect("config");
    let log = dir.join("server.log");
    let mut command = std::process::Command::new("sh");
    command
        .arg("-c")
        .arg(format!("ulimit -n {open_files} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_drover"))
        .args(["server", "--bind", "127.0.0.1", "--port", "0", "--http-port", "0", "--print-address"])
        .args(["--workers", "1", "--data-dir"])
        .arg(dir.join("data"))
        .arg("--config")
        .arg(&config)
        .args(flags)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).expect("log file"));
    if flags.is_empty() {
        command.arg("--dev");
    }
    let mut child = command.spawn().expect("drover server starts");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("piped"));
    let mut lines = Vec::new();
    for _ in 0..2 {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut stdout, &mut line).expect("reads");
        lines.push(line);
    }
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    let http = lines.iter().find_map(|line| line.trim().strip_prefix("http ")).map(|addr| addr.parse());
    let Some(Ok(http)) = http else {
        let _ = child.kill();
        panic!("the server did not start: {lines:?}\n{}", std::fs::read_to_string(&log).unwrap_or_default());
    };
    Server { child, http, log }
}

/// This test process may hold more descriptors than the server it floods.
fn raise_own_open_files_limit() {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let raised = rustix::process::Rlimit { current: limit.maximum, maximum: limit.maximum };
    rustix::process::setrlimit(rustix::process::Resource::Nofile, raised).expect("raise RLIMIT_NOFILE");
}

/// `count` connections to `addr` from source address `from`, each sending
/// nothing (as many as connect within the watchdog).
async fn idle_connections(addr: SocketAddr, from: &str, count: usize) -> Vec<tokio::net::TcpStream> {
    let mut streams = Vec::with_capacity(count);
    for _ in 0..count {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.bind(format!("{from}:0").parse().expect("source address")).expect("bind the source");
        match tokio::time::timeout(WATCHDOG, socket.connect(addr)).await {
            Ok(Ok(stream)) => streams.push(stream),
            Ok(Err(error)) => panic!("connection {} refused: {error}", streams.len()),
            Err(_) => panic!("connection {} not accepted by the kernel within {WATCHDOG:?}", streams.len()),
        }
    }
    streams
}

/// `GET path` on a fresh connection from 127.0.0.1; the status line. Fails
/// the test if no answer comes within the watchdog.
fn get(addr: SocketAddr, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect_timeout(&addr, WATCHDOG).expect("connects");
    stream.set_read_timeout(Some(WATCHDOG)).expect("timeout");
    write!(stream, "GET {path} HTTP/1.1\r\nhost: drover\r\nconnection: close\r\n\r\n").expect("writes");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    assert!(!answer.is_empty(), "no answer to GET {path} within {WATCHDOG:?}");
    answer.lines().next().unwrap_or_default().to_string()
}

/// Reads `stream` to its end: what the server wrote before closing it.
/// Fails the test if it is still open after the watchdog.
fn read_until_closed(mut stream: std::net::TcpStream, what: &str) -> Vec<u8> {
    stream.set_read_timeout(Some(WATCHDOG)).expect("timeout");
    let mut bytes = Vec::new();
    match stream.read_to_end(&mut bytes) {
        Ok(_) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => bytes,
        Err(error) => panic!("{what}: not closed within {WATCHDOG:?} ({error})"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_out_of_descriptors_backs_off_logs_little_and_answers_once_idle_connections_close() {
    raise_own_open_files_limit();
    let dir = temp_dir("http-fd-limit");
    // No per-client cap, so 1,100 idle connections from one address run
    // the table (1,024) full; they are closed after 20 s idle, time enough
    // to open them all on a slow machine.
    let server = start(&dir, "http_max_conns_per_client = 0\nhttp_idle_timeout = \"20s\"", 1024, &[]);
    let held = idle_connections(server.http, "127.0.0.1", 1_100).await;
    let http = server.http;
    let status = tokio::task::spawn_blocking(move || get(http, "/v1/agent/health")).await.expect("getter");
    assert!(status.contains(" 200 "), "{status}");
    drop(held);
    let log = server.log();
    let failures = log.lines().filter(|line| line.contains("HTTP accept failed")).count();
    assert!(failures >= 1, "the descriptor table never ran full, so nothing was tested:\n{log}");
    assert!(failures <= 10, "{failures} accept failures logged: one per 10 s at most\n{log}");
    assert!(log.lines().count() < 200, "the log stays small:\n{log}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_address_holds_at_most_its_share_of_connections() {
    raise_own_open_files_limit();
    let dir = temp_dir("http-per-client");
    // Nomad's default cap (100 per address), under the same descriptor limit.
    let server = start(&dir, "", 1024, &[]);
    let held = idle_connections(server.http, "127.0.0.2", 1_100).await;
    // Another address is served at once, while the 1,100 are open.
    let http = server.http;
    let status = tokio::task::spawn_blocking(move || get(http, "/v1/agent/health")).await.expect("getter");
    assert!(status.contains(" 200 "), "{status}");
    let refused = tokio::task::spawn_blocking(move || {
        let mut refused = 0;
        for stream in held.into_iter().skip(100) {
            let stream = stream.into_std().expect("std stream");
            stream.set_nonblocking(false).expect("blocking");
            let answer = read_until_closed(stream, "a connection over the cap");
            if answer.starts_with(b"HTTP/1.1 429 Too Many Requests") {
                refused += 1;
            }
        }
        refused
    })
    .await
    .expect("reader");
    assert_eq!(refused, 1_000, "every connection past the 100th was answered 429 and closed");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_slow_and_unfinished_tls_connections_are_closed_after_their_timeouts() {
    let dir = temp_dir("http-timeouts");
    let limits = "http_idle_timeout = \"1s\"\nhttps_handshake_timeout = \"1s\"";
    let plain = start(&dir.join("plain"), limits, 4096, &[]);
    let idle = std::net::TcpStream::connect(plain.http).expect("connects");
    read_until_closed(idle, "an idle connection");
    let mut slow = std::net::TcpStream::connect(plain.http).expect("connects");
    slow.write_all(b"GET /v1/agent/health HTTP/1.1\r\nhost: drover\r\nx-slow: ").expect("half a head");
    read_until_closed(slow, "a connection that sent half a request head");
    let mut kept = std::net::TcpStream::connect(plain.http).expect("connects");
    kept.write_all(b"GET /v1/agent/health HTTP/1.1\r\nhost: drover\r\n\r\n").expect("a request");
    let answer =
        String::from_utf8_lossy(&read_until_closed(kept, "a kept-alive connection, idle after its answer")).to_string();
    assert!(answer.starts_with("HTTP/1.1 200"), "answered first: {answer}");
    drop(plain);

    let certs = common::Certs::create(&dir);
    let https = start(&dir.join("https"), limits, 4096, &certs.server_flags());
    let mut stuck = std::net::TcpStream::connect(https.http).expect("connects");
    stuck.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00]).expect("the start of a ClientHello");
    read_until_closed(stuck, "a connection that never finished its TLS handshake");
    drop(https);
    let _ = std::fs::remove_dir_all(&dir);
}
