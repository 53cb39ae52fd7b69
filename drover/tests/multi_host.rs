//! Several hosts with addresses of their own: a real `drover server --dev`
//! and two real `drover agent`s, each in a network namespace of its own,
//! joined by a bridge (`ip netns` and veth pairs; the test runs as root, as
//! CI does). Each agent finds its address by the interface of its default
//! route; its node, its allocations' ports and its tasks' `NOMAD_*`
//! variables carry it, and the other host reaches a service there.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

mod common;

use common::{bounded, temp_dir};
use drover::api::client::ApiClient;
use serde_json::{json, Value};

/// `ip` with `args`, which must succeed.
fn ip(args: &[&str]) {
    let output = Command::new("ip").args(args).output().expect("the ip command runs (iproute2)");
    assert!(output.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr));
}

/// `ip` with `args` inside the namespace `namespace`.
fn ip_in(namespace: &str, args: &[&str]) {
    let mut full = vec!["netns", "exec", namespace, "ip"];
    full.extend_from_slice(args);
    ip(&full);
}

/// Three hosts on one switch: the server's and two agents', each a network
/// namespace. The switch is a bridge inside the server's namespace, whose
/// packet filter is empty, so the hosts reach each other whatever this
/// machine's own firewall forwards (Docker's drops what it does not know).
/// The test reaches the server over a link of its own. All removed when
/// dropped.
struct Hosts {
    /// The server's namespace (and the switch's), then the agents'.
    namespaces: Vec<String>,
    /// The link from this namespace to the server's.
    uplink: String,
    /// The server's address on the switch (the agents reach it there).
    server: String,
    /// The server's address on the uplink (the test reaches it there).
    server_uplink: String,
    /// Each agent host's address, in the order of `namespaces[1..]`.
    addresses: Vec<String>,
}

impl Hosts {
    fn create() -> Hosts {
        let id = std::process::id();
        let n = 20 + id % 200;
        let (switch_net, uplink_net) = (format!("10.213.{n}"), format!("10.214.{n}"));
        let namespaces: Vec<String> = ["srv", "a", "b"].iter().map(|name| format!("drv-{name}-{id}")).collect();
        let hosts = Hosts {
            namespaces: namespaces.clone(),
            uplink: format!("dvu{id}"),
            server: format!("{switch_net}.1"),
            server_uplink: format!("{uplink_net}.2"),
            addresses: vec![format!("{switch_net}.2"), format!("{switch_net}.3")],
        };
        for namespace in &namespaces {
            let _ = Command::new("ip").args(["netns", "del", namespace]).output();
            ip(&["netns", "add", namespace]);
            ip_in(namespace, &["link", "set", "lo", "up"]);
        }
        let switch = &namespaces[0];
        ip_in(switch, &["link", "add", "br0", "type", "bridge"]);
        ip_in(switch, &["addr", "add", &format!("{}/24", hosts.server), "dev", "br0"]);
        ip_in(switch, &["link", "set", "br0", "up"]);
        for (host, address) in namespaces[1..].iter().zip(&hosts.addresses) {
            let port = format!("dvp{id}");
            ip(&["link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", host]);
            ip(&["link", "set", &port, "netns", switch]);
            ip_in(switch, &["link", "set", &port, "name", &format!("to-{}", &host[4..5]), "master", "br0", "up"]);
            ip_in(host, &["addr", "add", &format!("{address}/24"), "dev", "eth0"]);
            ip_in(host, &["link", "set", "eth0", "up"]);
            ip_in(host, &["route", "add", "default", "via", &hosts.server]);
        }
        let _ = Command::new("ip").args(["link", "del", &hosts.uplink]).output();
        ip(&["link", "add", &hosts.uplink, "type", "veth", "peer", "name", "uplink", "netns", switch]);
        ip(&["addr", "add", &format!("{uplink_net}.1/30"), "dev", &hosts.uplink]);
        ip(&["link", "set", &hosts.uplink, "up"]);
        ip_in(switch, &["addr", "add", &format!("{}/30", hosts.server_uplink), "dev", "uplink"]);
        ip_in(switch, &["link", "set", "uplink", "up"]);
        hosts
    }

    /// `program` run inside the namespace `n` (0: the server's).
    fn command_in(&self, n: usize, program: &Path) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.namespaces[n]]).arg(program);
        command
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for namespace in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", namespace]).output();
        }
        let _ = Command::new("ip").args(["link", "del", &self.uplink]).output();
    }
}

/// Child processes killed when dropped (before the namespaces go).
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Blocks on `path` until `done` holds (blocking queries; a watchdog turns a hang into a failure).
async fn until(api: &ApiClient, path: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    bounded(what, async {
        let mut index = 0;
        loop {
            let separator = if path.contains('?') { '&' } else { '?' };
            let answer = api.get(&format!("{path}{separator}index={index}&wait=30s")).await.expect("request");
            let value = answer.json().unwrap_or(Value::Null);
            if answer.status == 200 && done(&value) {
                return value;
            }
            index = answer.index.unwrap_or(index);
        }
    })
    .await
}

/// A job of one raw_exec web server, placed on the host at `address`: it
/// writes what its environment says into the page it serves, bound to
/// `${NOMAD_IP_http}:${NOMAD_PORT_http}`.
fn web_job(address: &str) -> Value {
    let script = "printf '%s %s %s' \"$NOMAD_ADDR_http\" \"$NOMAD_IP_http\" \"$NOMAD_HOST_PORT_http\" > index.html \
                  && exec python3 -m http.server \"$NOMAD_PORT_http\" --bind \"$NOMAD_IP_http\"";
    json!({"Job": {"ID": "web", "Type": "service", "Datacenters": ["dc1"],
        "Constraints": [{"LTarget": "${attr.unique.network.ip-address}", "RTarget": address, "Operand": "="}],
        "TaskGroups": [{"Name": "web", "Count": 1,
            "Networks": [{"DynamicPorts": [{"Label": "http"}]}],
            "Tasks": [{"Name": "server", "Driver": "raw_exec",
                "Config": {"command": "/bin/sh", "args": ["-c", script]},
                "Resources": {"CPU": 100, "MemoryMB": 64}}]}]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_on_their_own_hosts_advertise_their_addresses_and_serve_there() {
    transport::install_crypto_provider();
    let hosts = Hosts::create();
    let dir = temp_dir("multi-host");
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_drover"));
    let mut server = hosts.command_in(0, &bin);
    server
        .args(["server", "--dev", "--bind", "0.0.0.0", "--port", "0", "--http-port", "0", "--print-address"])
        .args(["--workers", "1", "--log-level", "warn", "--data-dir"])
        .arg(dir.join("server"))
        .stdout(Stdio::piped());
    let mut server = server.spawn().expect("drover server starts in its namespace");
    let (rpc, http) = common::printed_addresses(&mut server).await;
    let mut children = Children(vec![server]);
    let port = |address: &str| address.rsplit(':').next().expect("a port").to_string();
    let rpc = format!("{}:{}", hosts.server, port(&rpc));
    let http = format!("{}:{}", hosts.server_uplink, port(&http));
    let api = ApiClient::new(&format!("http://{http}"), None, None).expect("client");
    let tls = dir.join("server").join("dev-tls");
    for n in 0..2 {
        let data_dir = dir.join(format!("agent-{n}"));
        std::fs::create_dir_all(&data_dir).expect("data dir");
        let mut agent = hosts.command_in(n + 1, &bin);
        agent.args(["agent", "--raw-exec", "--log-level", "warn", "--servers", &rpc, "--name", &format!("host-{n}")]);
        for (flag, file) in [("--ca-file", "ca.pem"), ("--cert-file", "client.pem"), ("--key-file", "client-key.pem")] {
            agent.arg(flag).arg(tls.join(file));
        }
        agent.arg("--data-dir").arg(&data_dir);
        children.0.push(agent.spawn().expect("drover agent starts in its namespace"));
    }

    // Each node is at its namespace's address.
    let nodes = until(&api, "/v1/nodes", "both nodes ready", |nodes| {
        nodes.as_array().is_some_and(|list| list.iter().filter(|node| node["Status"] == "ready").count() == 2)
    })
    .await;
    for (n, address) in hosts.addresses.iter().enumerate() {
        let stub =
            nodes.as_array().expect("list").iter().find(|node| node["Name"] == format!("host-{n}")).expect("node");
        assert_eq!(stub["Address"], json!(address), "{stub}");
        let node = api.get(&format!("/v1/node/{}", stub["ID"].as_str().expect("id"))).await.expect("node");
        let node = node.json().expect("json");
        assert_eq!(node["Attributes"]["unique.network.ip-address"], json!(address), "{node}");
    }

    // A web server placed on host a is at host a's address, and host b reaches it there.
    let registered = api.request("PUT", "/v1/jobs", Some(&web_job(&hosts.addresses[0]))).await.expect("register");
    assert_eq!(registered.status, 200, "{}", registered.body);
    let allocs = until(&api, "/v1/job/web/allocations", "the web server running", |allocs| {
        allocs.as_array().is_some_and(|list| list.iter().any(|alloc| alloc["ClientStatus"] == "running"))
    })
    .await;
    let alloc_id = allocs[0]["ID"].as_str().expect("alloc id").to_string();
    let alloc = api.get(&format!("/v1/allocation/{alloc_id}")).await.expect("alloc").json().expect("json");
    let network = &alloc["AllocatedResources"]["Shared"]["Networks"][0];
    assert_eq!(network["IP"], json!(hosts.addresses[0]), "{alloc}");
    let port = network["DynamicPorts"][0]["Value"].as_u64().expect("the port");
    let url = format!("http://{}:{port}/index.html", hosts.addresses[0]);
    // The task runs, but nothing says when its server has bound the port:
    // host b asks until it answers (for a minute at most).
    let fetch = format!(
        "import sys, time, urllib.request\n\
         deadline = time.time() + 60\n\
         while True:\n    \
             try:\n        sys.stdout.write(urllib.request.urlopen({url:?}, timeout=2).read().decode()); break\n    \
             except OSError:\n        \
                 if time.time() > deadline: raise\n        \
                 time.sleep(0.05)\n"
    );
    let mut from_b = hosts.command_in(2, Path::new("python3"));
    from_b.args(["-c", &fetch]);
    let fetched = bounded("host b fetching the page", tokio::task::spawn_blocking(move || from_b.output()))
        .await
        .expect("joins")
        .expect("python3 runs in host b's namespace");
    let page = String::from_utf8_lossy(&fetched.stdout).to_string();
    let address = alloc["AllocatedResources"]["Shared"]["Networks"][0]["IP"].as_str().expect("ip").to_string();
    assert_eq!(page, format!("{address}:{port} {address} {port}"), "{}", String::from_utf8_lossy(&fetched.stderr));
    drop(children);
    drop(hosts);
}
