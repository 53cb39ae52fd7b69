//! Nomad's task environment and interpolation with real processes: a real
//! `drover server --dev` and a real `drover agent --dev` (the `drover`
//! binary, on loopback ports they pick), jobs sent as Nomad sends them
//! (an HCL file through `drover job run`, JSON through the HTTP API), and
//! raw_exec tasks that print their environment and arguments, serve HTTP
//! on their port, or name a variable that does not exist. Every expected
//! value is read back over the HTTP API (the allocation's ports and
//! address, the node's datacenter and attributes), never assumed.
//!
//! Waits are the API's blocking queries, bounded by a watchdog that only
//! turns a hang into a failure; the one poll, with a deadline, is the HTTP
//! server's port, which nothing announces.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::api::{alloc_of, allocated_port, is_terminal, until};
use common::bounded;
use common::dev::DevCluster;
use drover::api::client::ApiClient;
use serde_json::{json, Value};

async fn dev_cluster(name: &str) -> DevCluster {
    DevCluster::start(&format!("task-env-{name}"), &[]).await
}

/// The node the allocation runs on, as the API answers it.
async fn node_of(cluster: &DevCluster, alloc: &Value) -> Value {
    let node = alloc["NodeID"].as_str().expect("a node id");
    cluster.api.get(&format!("/v1/node/{node}")).await.expect("answer").json().expect("the node")
}

/// `task`'s stdout, read through the server from the agent that runs it.
async fn stdout_of(cluster: &DevCluster, alloc: &Value, task: &str) -> String {
    let path = format!("/v1/client/fs/logs/{}?task={task}&type=stdout&plain=true", alloc["ID"].as_str().expect("id"));
    let answer = cluster.api.get(&path).await.expect("answer");
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

/// A port no process of this machine listens on now.
fn unused_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("binds").local_addr().expect("addr").port()
}

/// The Nomad job file of the first test: ports, meta at every level, a
/// task printing its environment and one printing its interpolated args.
fn env_job_file(static_port: u16) -> String {
    format!(
        r#"
job "envdump" {{
  datacenters = ["dc1"]
  type = "batch"
  meta {{
    owner = "job-owner"
    tier  = "job"
  }}
  group "web" {{
    meta {{
      tier        = "group"
      team-name   = "ops"
    }}
    network {{
      port "http" {{}}
      port "admin" {{ static = {static_port} }}
    }}
    task "env" {{
      driver = "raw_exec"
      config {{
        command = "env"
      }}
      meta {{
        tier  = "task"
        where = "${{node.datacenter}}/${{NOMAD_TASK_NAME}}"
      }}
      env {{
        PORT_COPY = "${{NOMAD_PORT_http}}"
        ADDR_COPY = "${{NOMAD_ADDR_admin}}"
        UNKNOWN   = "${{nope}} and ${{env.HOME}}"
      }}
      resources {{
        cpu    = 100
        memory = 64
      }}
    }}
    task "echo" {{
      driver = "raw_exec"
      config {{
        command = "echo"
        args = ["port=${{NOMAD_PORT_http}}", "dc=${{node.datacenter}}", "kernel=${{attr.kernel.name}}",
                "index=${{NOMAD_ALLOC_INDEX}}", "owner=${{NOMAD_META_owner}}", "task=${{env.NOMAD_TASK_NAME}}"]
      }}
      resources {{
        cpu    = 100
        memory = 64
      }}
    }}
  }}
}}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_sees_nomads_environment_and_its_args_are_interpolated() {
    let cluster = dev_cluster("env").await;
    let static_port = unused_port();
    let file = cluster.dir.join("envdump.hcl");
    std::fs::write(&file, env_job_file(static_port)).expect("job file");
    let run = common::drover()
        .args(["job", "run", "--detach", "--address", &cluster.http])
        .arg(&file)
        .output()
        .expect("drover job run");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));

    let alloc = alloc_of(&cluster.api, "envdump", "the allocation complete", is_terminal).await;
    assert_eq!(alloc["ClientStatus"], "complete", "{:#}", alloc["TaskStates"]);
    let node = node_of(&cluster, &alloc).await;
    let (ip, http_port) = allocated_port(&alloc, "http");
    let (admin_ip, admin_port) = allocated_port(&alloc, "admin");
    assert_eq!((admin_ip.as_str(), admin_port), (ip.as_str(), u64::from(static_port)));

    // The allocation answers carry the network, as `nomad alloc status` reads it.
    let network = &alloc["AllocatedResources"]["Shared"]["Networks"][0];
    assert_eq!((network["Mode"].as_str(), network["IP"].as_str()), (Some("host"), Some(ip.as_str())));
    assert_eq!(
        network["DynamicPorts"],
        json!([{"Label": "http", "Value": http_port, "To": 0, "HostNetwork": "default"}])
    );
    assert_eq!(
        network["ReservedPorts"],
        json!([{"Label": "admin", "Value": static_port, "To": 0, "HostNetwork": "default"}])
    );
    assert_eq!(&alloc["Resources"]["Networks"][0], network, "the older view too");
    assert_eq!(&alloc["SharedResources"]["Networks"][0], network);

    // Job reads carry the meta at every level.
    let job = cluster.api.get("/v1/job/envdump").await.expect("answer").json().expect("the job");
    assert_eq!(job["Meta"], json!({"owner": "job-owner", "tier": "job"}));
    assert_eq!(job["TaskGroups"][0]["Meta"], json!({"tier": "group", "team-name": "ops"}));
    assert_eq!(job["TaskGroups"][0]["Tasks"][0]["Meta"]["where"], "${node.datacenter}/${NOMAD_TASK_NAME}");

    let printed = stdout_of(&cluster, &alloc, "env").await;
    let env: BTreeMap<&str, &str> = printed.lines().filter_map(|line| line.split_once('=')).collect();
    let id = alloc["ID"].as_str().expect("id");
    let datacenter = node["Datacenter"].as_str().expect("the node's datacenter");
    let ports = [("http", http_port), ("admin", u64::from(static_port))];
    let mut expected: Vec<(String, String)> = Vec::new();
    for prefix in ["NOMAD_", "DROVER_"] {
        let mut set = |name: &str, value: String| expected.push((format!("{prefix}{name}"), value));
        for (label, port) in ports {
            for name in ["PORT", "ALLOC_PORT", "HOST_PORT"] {
                set(&format!("{name}_{label}"), port.to_string());
            }
            for name in ["IP", "HOST_IP"] {
                set(&format!("{name}_{label}"), ip.clone());
            }
            for name in ["ADDR", "HOST_ADDR"] {
                set(&format!("{name}_{label}"), format!("{ip}:{port}"));
            }
        }
        for (key, value) in [
            ("owner", "job-owner"),
            ("OWNER", "job-owner"),
            ("tier", "task"),
            ("TIER", "task"),
            ("team_name", "ops"),
            ("TEAM_NAME", "ops"),
        ] {
            set(&format!("META_{key}"), value.to_string());
        }
        set("META_where", format!("{datacenter}/env"));
        set("META_WHERE", format!("{datacenter}/env"));
        set("ALLOC_ID", id.to_string());
        set("SHORT_ALLOC_ID", id[..8].to_string());
        set("ALLOC_NAME", alloc["Name"].as_str().expect("name").to_string());
        set("ALLOC_INDEX", "0".to_string());
        set("JOB_ID", "envdump".to_string());
        set("JOB_NAME", "envdump".to_string());
        set("GROUP_NAME", "web".to_string());
        set("TASK_NAME", "env".to_string());
        set("NAMESPACE", "default".to_string());
        set("DC", datacenter.to_string());
        set("REGION", "global".to_string());
        set("CPU_LIMIT", "100".to_string());
        set("MEMORY_LIMIT", "64".to_string());
    }
    expected.push(("PORT_COPY".to_string(), http_port.to_string()));
    expected.push(("ADDR_COPY".to_string(), format!("{ip}:{static_port}")));
    expected.push(("UNKNOWN".to_string(), "${nope} and ${env.HOME}".to_string()));
    for (key, value) in &expected {
        assert_eq!(env.get(key.as_str()), Some(&value.as_str()), "{key} in:\n{printed}");
    }
    for (name, end) in [("ALLOC_DIR", format!("{id}/alloc")), ("TASK_DIR", format!("{id}/env/local"))] {
        let path = env[format!("NOMAD_{name}").as_str()];
        assert!(path.ends_with(&end) && std::path::Path::new(path).is_absolute(), "{name}={path}");
    }
    assert!(env["NOMAD_SECRETS_DIR"].ends_with(&format!("{id}/env/secrets")), "{printed}");

    let echoed = stdout_of(&cluster, &alloc, "echo").await;
    let kernel = node["Attributes"]["kernel.name"].as_str().expect("the node's kernel");
    assert_eq!(
        echoed.trim_end(),
        format!("port={http_port} dc={datacenter} kernel={kernel} index=0 owner=job-owner task=echo")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_server_bound_to_its_port_answers_where_its_allocation_says() {
    let cluster = dev_cluster("http").await;
    // `${...}` is the client's interpolation; `$NOMAD_ALLOC_ID` the shell's.
    let script = "echo \"$NOMAD_ALLOC_ID\" > \"$NOMAD_TASK_DIR/id.txt\"; \
        exec python3 -m http.server ${NOMAD_PORT_http} --bind ${NOMAD_IP_http} --directory \"$NOMAD_TASK_DIR\"";
    let job = json!({"Job": {"ID": "web", "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "web", "Count": 1, "Networks": [{"DynamicPorts": [{"Label": "http"}]}],
            "Tasks": [{"Name": "server", "Driver": "raw_exec", "KillTimeout": 1_000_000_000u64,
                "Config": {"command": "sh", "args": ["-c", script]},
                "Services": [{"Name": "web-${NOMAD_TASK_NAME}", "PortLabel": "http", "Tags": ["v1"]}],
                "Resources": {"CPU": 100, "MemoryMB": 128}}]}]}});
    let written = cluster.api.request("PUT", "/v1/jobs", Some(&job)).await.expect("answer");
    assert_eq!(written.status, 200, "{}", written.body);

    let alloc = alloc_of(&cluster.api, "web", "the server running", |stub| stub["ClientStatus"] == "running").await;
    let network = &alloc["AllocatedResources"]["Shared"]["Networks"][0];
    let ip = network["IP"].as_str().expect("the allocation's address");
    let port = network["DynamicPorts"][0]["Value"].as_u64().expect("its port");
    let address: SocketAddr = format!("{ip}:{port}").parse().expect("an address");
    let server = ApiClient::new(&format!("http://{address}"), None, None).expect("client");
    // Nothing announces that the server has bound its port: ask until it answers.
    let answer = bounded("the task's HTTP server answers", async {
        loop {
            if let Ok(answer) = server.get("/id.txt").await {
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!((answer.status, answer.body.trim()), (200, alloc["ID"].as_str().expect("id")));

    // The running task's service is registered where it answers.
    let found = until(&cluster.api, "/v1/service/web-server", "the service registered", |list| {
        list.as_array().is_some_and(|list| !list.is_empty())
    })
    .await;
    let registrations = found.as_array().expect("a list");
    assert_eq!(registrations.len(), 1, "{found:#}");
    let registration = &registrations[0];
    assert_eq!((registration["Address"].as_str(), registration["Port"].as_u64()), (Some(ip), Some(port)));
    assert_eq!((&registration["AllocID"], &registration["Tags"]), (&alloc["ID"], &json!(["v1"])));

    let stopped = cluster.api.request("DELETE", "/v1/job/web", None).await.expect("answer");
    assert_eq!(stopped.status, 200, "{}", stopped.body);
    until(&cluster.api, "/v1/job/web/allocations", "the server stopped", |allocs| {
        allocs.as_array().is_some_and(|list| list.iter().all(|stub| stub["ClientStatus"] == "complete"))
    })
    .await;
    assert!(server.get("/id.txt").await.is_err(), "the port is closed with its task");
    let services = cluster.api.get("/v1/job/web/services").await.expect("answer").json().expect("JSON");
    assert_eq!(services, json!([]), "its registration went with it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_variable_in_a_driver_config_fails_the_task_at_once() {
    let cluster = dev_cluster("unknown").await;
    let job = json!({"Job": {"ID": "typo", "Type": "service", "Datacenters": ["dc1"],
        "TaskGroups": [{"Name": "g", "Count": 1,
            "Tasks": [{"Name": "t", "Driver": "raw_exec",
                "Config": {"command": "sh", "args": ["-c", "echo ${NOMAD_TASK_NAME} ${nope}"]},
                "Env": {"KEPT": "${nope}"}, "Resources": {"CPU": 100, "MemoryMB": 64}}]}]}});
    let written = cluster.api.request("PUT", "/v1/jobs", Some(&job)).await.expect("answer");
    assert_eq!(written.status, 200, "{}", written.body);

    let alloc = alloc_of(&cluster.api, "typo", "the allocation failed", |stub| stub["ClientStatus"] == "failed").await;
    let state = &alloc["TaskStates"]["t"];
    assert_eq!((state["State"].as_str(), state["Failed"].as_bool()), (Some("dead"), Some(true)), "{state:#}");
    assert_eq!(state["Restarts"], 0, "never restarted: {state:#}");
    let events = state["Events"].as_array().expect("events");
    let types: Vec<&str> = events.iter().filter_map(|event| event["Type"].as_str()).collect();
    assert!(!types.contains(&"Started") && !types.contains(&"Restarting"), "{types:?}");
    let failed = events.iter().find(|event| event["Type"] == "Failed Validation").expect("a Failed Validation event");
    assert_eq!(
        failed["DisplayMessage"], "failed to parse config: config.args[1]: unknown variable \"${nope}\"",
        "names the variable and its key"
    );
    let last = events.last().expect("an event");
    assert_eq!(
        (last["Type"].as_str(), last["DisplayMessage"].as_str()),
        (Some("Not Restarting"), Some("Error was unrecoverable"))
    );
    assert_eq!(last["FailsTask"], true);
}
