//! The HTTP API's latency and what blocking queries cost, against the real
//! `drover server --dev` binary (in memory, plain HTTP) on loopback:
//!
//! 1. `GET /v1/job/:id`, 10,000 requests one after another on one
//!    keep-alive connection: p50/p99/max;
//! 2. job registers (`PUT /v1/jobs`, Nomad's job JSON, count 0 so the
//!    scheduler has nothing to place), 10,000 the same way;
//! 3. 10,000 blocking queries (`GET /v1/job/:id?index=N&wait=5m`, as a
//!    deploy script watches its job) held at once, each on its own
//!    connection, with the 10,000 jobs above in the state: the server's RSS
//!    before and while they are held; then one write to that job wakes
//!    them all and each must answer.
//!
//! ```sh
//! cargo build --release -p drover && cargo run --release -p drover --example http_latency
//! ```

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

const REQUESTS: usize = 10_000;
const BLOCKING: usize = 10_000;

fn main() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(measure())
}

async fn connect(addr: &str) -> Result<SendRequest<Full<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(addr).await.with_context(|| format!("connecting to {addr}"))?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

/// One request on `sender`; the status and the `X-Nomad-Index`.
async fn call(sender: &mut SendRequest<Full<Bytes>>, method: &str, path: &str, body: Bytes) -> Result<(u16, u64)> {
    sender.ready().await?;
    let request =
        hyper::Request::builder().method(method).uri(path).header("host", "localhost").body(Full::new(body))?;
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    let index = response
        .headers()
        .get("x-nomad-index")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0);
    response.into_body().collect().await?;
    Ok((status, index))
}

fn job_json(id: &str) -> Bytes {
    Bytes::from(format!(
        r#"{{"Job": {{"ID": "{id}", "Type": "service", "Datacenters": ["dc1"], "TaskGroups": [{{"Name": "web",
            "Count": 0, "Tasks": [{{"Name": "server", "Driver": "mock", "Config": {{"run_for": "1h"}},
            "Resources": {{"CPU": 100, "MemoryMB": 64}}}}]}}]}}}}"#
    ))
}

fn report(what: &str, histogram: &Histogram<u64>) {
    println!(
        "{what}: p50 {} µs, p99 {} µs, max {} µs over {} requests",
        histogram.value_at_quantile(0.5),
        histogram.value_at_quantile(0.99),
        histogram.max(),
        histogram.len()
    );
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = status
        .lines()
        .find(|line| line.starts_with("VmRSS:"))
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|kib| kib.parse::<f64>().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

async fn measure() -> Result<()> {
    let drover_bin = std::env::current_exe()?
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("drover"))
        .context("locating target/<profile>/drover")?;
    anyhow::ensure!(drover_bin.exists(), "build the binary first: cargo build --release -p drover");
    let mut child = std::process::Command::new(&drover_bin)
        .args(["server", "--dev", "--bind", "127.0.0.1", "--port", "0", "--http-port", "0", "--print-address"])
        .args(["--log-level", "warn"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("starting drover server --dev")?;
    let stdout = child.stdout.take().context("stdout")?;
    let mut reader = std::io::BufReader::new(stdout);
    let mut http = String::new();
    while !http.starts_with("http ") {
        http.clear();
        if std::io::BufRead::read_line(&mut reader, &mut http)? == 0 {
            bail!("the server ended before saying where it listens");
        }
    }
    let addr = http.trim().trim_start_matches("http ").to_string();
    let pid = child.id();
    let outcome = run(&addr, pid).await;
    if outcome.is_err() {
        eprintln!("the server: {:?}", child.try_wait());
    }
    let _ = child.kill();
    let _ = child.wait();
    outcome
}

async fn run(addr: &str, pid: u32) -> Result<()> {
    let mut sender = connect(addr).await?;
    let (status, _) = call(&mut sender, "PUT", "/v1/jobs", job_json("read-me")).await?;
    anyhow::ensure!(status == 200, "register answered {status}");

    let mut reads = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for _ in 0..REQUESTS {
        let started = Instant::now();
        let (status, _) = call(&mut sender, "GET", "/v1/job/read-me", Bytes::new()).await?;
        reads.saturating_record(started.elapsed().as_micros() as u64);
        anyhow::ensure!(status == 200, "read answered {status}");
    }
    report("GET /v1/job/:id", &reads);

    let mut writes = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for n in 0..REQUESTS {
        let body = job_json(&format!("job-{n}"));
        let started = Instant::now();
        let (status, _) = call(&mut sender, "PUT", "/v1/jobs", body).await?;
        writes.saturating_record(started.elapsed().as_micros() as u64);
        anyhow::ensure!(status == 200, "register answered {status}");
    }
    report("PUT /v1/jobs (register)", &writes);

    let (_, index) = call(&mut sender, "GET", "/v1/job/read-me", Bytes::new()).await?;
    let before = rss_mib(pid);
    let mut held = Vec::with_capacity(BLOCKING);
    for n in 0..BLOCKING {
        let mut waiter = connect(addr).await.with_context(|| format!("blocking query {n}"))?;
        let path = format!("/v1/job/read-me?index={index}&wait=5m");
        held.push(tokio::spawn(async move { call(&mut waiter, "GET", &path, Bytes::new()).await }));
    }
    // Every query is in: the server's waiter gauge says so.
    let waiting = loop {
        let answer = index_waiters(&mut sender).await?;
        if answer >= BLOCKING as u64 {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let while_held = rss_mib(pid);
    println!(
        "{waiting} blocking queries held: server RSS {before:.1} MiB before, {while_held:.1} MiB while held \
         ({:.1} KiB each)",
        (while_held - before) * 1024.0 / BLOCKING as f64
    );
    let started = Instant::now();
    let changed = job_json("read-me").slice(..).to_vec();
    let changed =
        String::from_utf8(changed)?.replace("\"Type\": \"service\"", "\"Type\": \"service\", \"Priority\": 60");
    let (status, _) = call(&mut sender, "PUT", "/v1/jobs", Bytes::from(changed)).await?;
    anyhow::ensure!(status == 200, "register answered {status}");
    for waiter in held {
        let (status, woke_at) = waiter.await??;
        anyhow::ensure!(status == 200 && woke_at > index, "a blocking query answered {status} at {woke_at}");
    }
    println!("one write woke all {BLOCKING} and each answered, in {:.2?}", started.elapsed());
    Ok(())
}

/// `drover.state.index_waiters` from `/v1/metrics`.
async fn index_waiters(sender: &mut SendRequest<Full<Bytes>>) -> Result<u64> {
    sender.ready().await?;
    let request = hyper::Request::get("/v1/metrics").header("host", "localhost").body(Full::new(Bytes::new()))?;
    let body = sender.send_request(request).await?.into_body().collect().await?.to_bytes();
    let metrics: serde_json::Value = serde_json::from_slice(&body)?;
    let waiters = metrics["Gauges"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|gauge| gauge["Name"] == "drover.state.index_waiters")
        .and_then(|gauge| gauge["Value"].as_f64())
        .unwrap_or(0.0);
    Ok(waiters as u64)
}
