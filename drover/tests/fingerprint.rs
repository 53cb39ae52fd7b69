//! A real `drover agent` fingerprints its host and advertises what it
//! found and what its file configures (reserved resources and ports, a
//! host network) through the node reads; the scheduler honours both; and
//! `drover dev` takes Nomad's `-acl-enabled -node NAME` flags. Real
//! processes on loopback ports they pick; waits are blocking queries, a
//! watchdog only turns a hang into a failure.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

mod common;

use common::api::until;
use common::{drover, temp_dir};
use drover::api::client::ApiClient;
use serde_json::{json, Value};

/// A child process killed when dropped, with the directory it used.
struct Running {
    child: Child,
    dir: Option<PathBuf>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// `drover server --dev` with its data (and dev TLS files) in `dir`.
async fn dev_server(dir: &Path) -> (Running, SocketAddr, ApiClient) {
    let mut child = drover()
        .args(["server", "--dev", "--bind", "127.0.0.1", "--port", "0", "--http-port", "0", "--print-address"])
        .args(["--workers", "1", "--log-level", "warn", "--data-dir"])
        .arg(dir.join("server"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("drover server starts");
    let (rpc, http) = common::printed_addresses(&mut child).await;
    let rpc: SocketAddr = rpc.parse().expect("an address");
    let api = ApiClient::new(&format!("http://{http}"), None, None).expect("client");
    (Running { child, dir: None }, rpc, api)
}

/// The client files of the dev server whose data is in `dir`.
fn dev_client_files(dir: &Path) -> [PathBuf; 3] {
    let tls = dir.join("server/dev-tls");
    [tls.join("ca.pem"), tls.join("client.pem"), tls.join("client-key.pem")]
}

/// `drover agent` (mock driver) against `rpc` with the client files
/// `tls`, its data and the configuration file `config` in `dir`.
fn agent(dir: &Path, rpc: SocketAddr, tls: &[PathBuf; 3], config: &str) -> Command {
    let file = dir.join("agent.toml");
    std::fs::write(&file, config).expect("config written");
    let mut command = common::agent_command(&rpc.to_string(), tls, &dir.join("agent"));
    command.args(["--mock-driver", "--log-level", "warn", "--config"]).arg(file);
    command
}

/// Nomad's JSON for a service job of one mock task asking for `cpu` MHz,
/// with `constraints` and a group network of `ports`.
fn job(id: &str, cpu: u64, constraints: Value, ports: Value) -> Value {
    json!({"Job": {"ID": id, "Name": id, "Type": "service", "Datacenters": ["dc1"], "Constraints": constraints,
        "TaskGroups": [{"Name": "web", "Count": 1, "Networks": [ports],
            "Tasks": [{"Name": "server", "Driver": "mock", "Config": {"run_for": "1h"},
                "Resources": {"CPU": cpu, "MemoryMB": 32}}],
            "EphemeralDisk": {"SizeMB": 10}}]}})
}

async fn register(api: &ApiClient, job: &Value) {
    let answer = api.request("PUT", "/v1/jobs", Some(job)).await.expect("answer");
    assert_eq!(answer.status, 200, "{}", answer.body);
}

/// The job's allocations once one is running.
async fn running_alloc(api: &ApiClient, id: &str) -> Value {
    let allocs = until(api, &format!("/v1/job/{id}/allocations"), &format!("{id} running"), |allocs| {
        allocs.as_array().is_some_and(|allocs| allocs.iter().any(|alloc| alloc["ClientStatus"] == "running"))
    })
    .await;
    let stub = allocs.as_array().expect("a list").iter().find(|alloc| alloc["ClientStatus"] == "running").cloned();
    let alloc_id = stub.expect("running")["ID"].as_str().expect("an id").to_string();
    api.get(&format!("/v1/allocation/{alloc_id}")).await.expect("answer").json().expect("an allocation")
}

/// The placement failures of the job's evaluation once it has run: the
/// metrics of the group that could not be placed.
async fn failed_placement(api: &ApiClient, id: &str) -> Value {
    let evals = until(api, &format!("/v1/job/{id}/evaluations"), &format!("{id} evaluated"), |evals| {
        evals.as_array().is_some_and(|evals| {
            evals.iter().any(|eval| eval["Status"] == "complete" && eval["FailedTGAllocs"].is_object())
        })
    })
    .await;
    let allocs = api.get(&format!("/v1/job/{id}/allocations")).await.expect("answer").json().expect("a list");
    assert_eq!(allocs, json!([]), "{id}: nothing placed");
    let eval = evals.as_array().expect("a list").iter().find(|eval| eval["FailedTGAllocs"].is_object()).cloned();
    eval.expect("a failed placement")["FailedTGAllocs"]["web"].clone()
}

fn uname(flag: &str) -> String {
    let output = Command::new("uname").arg(flag).output().expect("uname runs");
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

const AGENT_CONFIG: &str = r#"
[client]
node_class = "fingerprinted"
meta = { rack = "r1" }

[client.reserved]
cpu = 1000
memory = 256
disk = 100
reserved_ports = "22,20000-20009"

[client.host_network.loopback]
interface = "lo"
reserved_ports = "8081"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_advertises_its_fingerprint_and_the_scheduler_keeps_off_what_it_reserves() {
    transport::install_crypto_provider();
    let dir = temp_dir("fingerprint");
    let (_server, rpc, api) = dev_server(&dir).await;
    let child = agent(&dir, rpc, &dev_client_files(&dir), AGENT_CONFIG)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starts");
    let _agent = Running { child, dir: Some(dir) };

    let nodes = until(&api, "/v1/nodes", "the node ready", |nodes| nodes[0]["Status"] == "ready").await;
    let stub = &nodes[0];
    assert!(stub.get("NodeResources").is_none(), "resources only when asked for: {stub}");
    let node_id = stub["ID"].as_str().expect("an id");
    let node = api.get(&format!("/v1/node/{node_id}")).await.expect("answer").json().expect("a node");
    let attr = |key: &str| node["Attributes"][key].as_str().unwrap_or_else(|| panic!("no {key}: {node}")).to_string();

    // Read from the host, as the host reports it.
    let arch = match uname("-m").as_str() {
        "x86_64" => "amd64".to_string(),
        "aarch64" => "arm64".to_string(),
        other => other.to_string(),
    };
    assert_eq!(attr("cpu.arch"), arch);
    assert_eq!(attr("kernel.version"), uname("-r"));
    assert_eq!(attr("kernel.name"), "linux");
    let os_release = std::fs::read_to_string("/etc/os-release").expect("os-release");
    let os_id = os_release.lines().find_map(|line| line.strip_prefix("ID=")).expect("ID").trim_matches('"');
    assert_eq!(attr("os.name"), os_id);
    let address = attr("unique.network.ip-address");
    let host_addresses = drover::client::fingerprint::interface_addresses();
    assert!(host_addresses.iter().any(|found| found.ip.to_string() == address), "{address}: {host_addresses:?}");
    assert_eq!(stub["Address"], address.as_str());
    assert_eq!(stub["Version"], drover::client::fingerprint::NOMAD_VERSION);
    assert_eq!((stub["NodeClass"].as_str(), node["Meta"]["rack"].as_str()), (Some("fingerprinted"), Some("r1")));

    // The node's resources: the fingerprint's, less what the file reserves.
    let resources = &node["NodeResources"];
    let cores: u64 = attr("cpu.numcores").parse().expect("cores");
    let compute: u64 = attr("cpu.totalcompute").parse().expect("compute");
    assert_eq!(compute, cores * attr("cpu.frequency").parse::<u64>().expect("MHz"), "cores × MHz");
    assert_eq!(resources["Cpu"]["CpuShares"], compute);
    assert_eq!(resources["Cpu"]["TotalCpuCores"], cores);
    let memory_bytes: u64 = attr("memory.totalbytes").parse().expect("bytes");
    assert_eq!(resources["Memory"]["MemoryMB"], memory_bytes / (1024 * 1024));
    assert!(resources["Disk"]["DiskMB"].as_u64().is_some_and(|mb| mb > 0), "{resources}");
    assert_eq!(resources["Networks"][0]["IP"], address.as_str());
    assert_eq!(
        (resources["MinDynamicPort"].as_u64(), resources["MaxDynamicPort"].as_u64()),
        (Some(20_000), Some(32_000))
    );
    let aliases: Vec<(String, String)> = resources["NodeNetworks"]
        .as_array()
        .expect("node networks")
        .iter()
        .flat_map(|network| network["Addresses"].as_array().cloned().unwrap_or_default())
        .map(|address| {
            (address["Alias"].as_str().unwrap_or("").into(), address["Address"].as_str().unwrap_or("").into())
        })
        .collect();
    assert!(aliases.contains(&("default".into(), address.clone())), "{aliases:?}");
    assert!(aliases.contains(&("loopback".into(), "127.0.0.1".into())), "{aliases:?}");
    let reserved = &node["ReservedResources"];
    assert_eq!(
        (&reserved["Cpu"]["CpuShares"], &reserved["Memory"]["MemoryMB"], &reserved["Disk"]["DiskMB"]),
        (&json!(1000), &json!(256), &json!(100))
    );
    assert_eq!(reserved["Networks"]["ReservedHostPorts"], "22,8081,20000-20009", "the node's and its host network's");
    let listed = api.get("/v1/nodes?resources=true").await.expect("answer").json().expect("a list");
    assert_eq!(listed[0]["NodeResources"], node["NodeResources"]);
    assert_eq!(listed[0]["ReservedResources"], node["ReservedResources"]);

    // A job constrained on what was fingerprinted places, its ports at
    // the node's address and on the host network's.
    let constraints = json!([
        {"LTarget": "${attr.cpu.arch}", "RTarget": arch, "Operand": "="},
        {"LTarget": "${attr.unique.network.ip-address}", "RTarget": address, "Operand": "="}
    ]);
    let ports = json!({"DynamicPorts": [{"Label": "http"}, {"Label": "local", "HostNetwork": "loopback"}]});
    register(&api, &job("pinned", 100, constraints, ports)).await;
    let alloc = running_alloc(&api, "pinned").await;
    let given = alloc["AllocatedResources"]["Shared"]["Ports"].as_array().cloned().expect("ports");
    let port = |label: &str| given.iter().find(|port| port["Label"] == label).cloned().expect("given");
    assert_eq!(port("http")["HostIP"], address.as_str());
    assert_eq!(port("local")["HostIP"], "127.0.0.1");
    for label in ["http", "local"] {
        let value = port(label)["Value"].as_u64().expect("a port");
        assert!((20_010..=32_000).contains(&value), "{label}: {value} is in the range and not reserved");
    }
    let elsewhere = json!([{"LTarget": "${attr.unique.network.ip-address}", "RTarget": "192.0.2.254", "Operand": "="}]);
    register(&api, &job("elsewhere", 100, elsewhere, json!({}))).await;
    let metric = failed_placement(&api, "elsewhere").await;
    assert_eq!(metric["NodesFiltered"], 1, "{metric}");

    // What is reserved is never given.
    let allocatable = compute - 1000;
    register(&api, &job("too-big", allocatable + 1, json!([]), json!({}))).await;
    let metric = failed_placement(&api, "too-big").await;
    assert_eq!(metric["DimensionExhausted"]["cpu"], 1, "{metric}");
    for (id, port, network) in [("ssh", 22, "default"), ("on-loopback", 8081, "loopback")] {
        let ports = json!({"ReservedPorts": [{"Label": "p", "Value": port, "HostNetwork": network}]});
        register(&api, &job(id, 100, json!([]), ports)).await;
        let metric = failed_placement(&api, id).await;
        assert_eq!(metric["DimensionExhausted"][format!("network: reserved port collision p={port}")], 1, "{metric}");
    }
    let missing = json!({"DynamicPorts": [{"Label": "http", "HostNetwork": "public"}]});
    register(&api, &job("no-public", 100, json!([]), missing)).await;
    let metric = failed_placement(&api, "no-public").await;
    assert_eq!(metric["ConstraintFiltered"]["missing host network \"public\" for port \"http\""], 1, "{metric}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_client_config_is_refused_naming_its_key() {
    let dir = temp_dir("fingerprint-bad");
    let rpc: SocketAddr = "127.0.0.1:4647".parse().expect("an address");
    let certs = common::Certs::create(&dir);
    let tls = ["drover-agent-ca.pem", "global-client-drover.pem", "global-client-drover-key.pem"]
        .map(|name| certs.file(name));
    let cases = [
        ("[client.reserved]\nreserved_ports = \"22,9000-8000\"\n", "client.reserved.reserved_ports"),
        ("[client]\nnetwork_interface = \"nonexistent0\"\n", "client.network_interface"),
        ("[client.host_network.public]\ncidr = \"10.0.0.0/40\"\n", "client.host_network.public.cidr"),
        ("[client.host_network.public]\nreserved_ports = \"80\"\n", "client.host_network.public"),
    ];
    for (config, key) in cases {
        let output = agent(&dir, rpc, &tls, config).output().expect("runs");
        let error = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{config}: {error}");
        assert!(error.contains(key), "{config}: the error names {key}: {error}");
    }
    let output = agent(&dir, rpc, &tls, "").args(["--meta", "novalue"]).output().expect("runs");
    let error = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{error}");
    assert!(error.contains("--meta") && error.contains("KEY=VALUE"), "{error}");
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drover_dev_takes_acls_a_node_name_a_class_and_meta() {
    let mut child = drover()
        .args(["dev", "--port", "0", "--http-port", "0", "--print-address", "--log-level", "warn"])
        .args(["--acl-enabled", "--node-name", "n1", "--node-class", "c", "--meta", "k=v", "--meta", "rack=r2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("drover dev starts");
    let (_, http) = common::printed_addresses(&mut child).await;
    let _dev = Running { child, dir: None };
    let address = format!("http://{http}");
    let anonymous = ApiClient::new(&address, None, None).expect("client");
    let refused = anonymous.get("/v1/nodes").await.expect("answer");
    assert_eq!((refused.status, refused.body.as_str()), (403, "Permission denied"));
    let bootstrap = anonymous.request("POST", "/v1/acl/bootstrap", None).await.expect("answer");
    assert_eq!(bootstrap.status, 200, "{}", bootstrap.body);
    let secret = bootstrap.json().expect("a token")["SecretID"].as_str().expect("a secret").to_string();
    let management = ApiClient::new(&address, Some(secret), None).expect("client");
    let nodes = until(&management, "/v1/nodes", "the dev node ready", |nodes| nodes[0]["Status"] == "ready").await;
    let node_id = nodes[0]["ID"].as_str().expect("an id");
    let node = management.get(&format!("/v1/node/{node_id}")).await.expect("answer").json().expect("a node");
    assert_eq!((node["Name"].as_str(), node["NodeClass"].as_str()), (Some("n1"), Some("c")));
    assert_eq!(node["Meta"], json!({"k": "v", "rack": "r2"}));
    assert_eq!(nodes[0]["Address"], "127.0.0.1", "a dev agent is on the loopback interface, as Nomad's");
    assert_eq!(anonymous.get(&format!("/v1/node/{node_id}")).await.expect("answer").status, 403);

    let output = drover().args(["dev", "--meta", "=v"]).output().expect("runs");
    let error = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{error}");
    assert!(error.contains("--meta") && error.contains("KEY=VALUE"), "{error}");
}
