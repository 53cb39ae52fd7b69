//! Reading a server's state through its HTTP API, as Nomad's clients do:
//! blocking queries until something holds, an allocation, its ports.

use drover::api::client::{ApiClient, ApiResponse};
use serde_json::Value;

use super::bounded;

/// `method` on `path` with `body`; the answer, whatever its status.
pub async fn send(api: &ApiClient, method: &str, path: &str, body: Option<&Value>) -> ApiResponse {
    api.request(method, path, body).await.expect("an answer")
}

/// `method` on `path` with `body`, which must answer 200; its JSON.
pub async fn json_of(api: &ApiClient, method: &str, path: &str, body: Option<&Value>) -> Value {
    let answer = send(api, method, path, body).await;
    assert_eq!(answer.status, 200, "{method} {path}: {}", answer.body);
    answer.json().expect("JSON")
}

/// Blocks on `path` (a blocking query from `index`) until `done` holds;
/// the value that made it hold.
pub async fn until(api: &ApiClient, path: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    bounded(what, async {
        let mut index = 0;
        loop {
            let separator = if path.contains('?') { '&' } else { '?' };
            let answer = api.get(&format!("{path}{separator}index={index}&wait=30s")).await.expect("request");
            let value = answer.json().unwrap_or_else(|error| panic!("{what}: {error:#}"));
            if done(&value) {
                return value;
            }
            index = answer.index.expect("X-Nomad-Index on reads");
        }
    })
    .await
}

/// `job`'s first allocation whose stub satisfies `done`, read in full.
pub async fn alloc_of(api: &ApiClient, job: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let allocs = until(api, &format!("/v1/job/{job}/allocations"), what, |allocs| {
        allocs.as_array().is_some_and(|list| list.iter().any(&done))
    })
    .await;
    let stub = allocs.as_array().expect("a list").iter().find(|stub| done(stub)).expect("found").clone();
    let id = stub["ID"].as_str().expect("an id");
    api.get(&format!("/v1/allocation/{id}")).await.expect("answer").json().expect("the allocation")
}

/// The allocation's port `label` as its `AllocatedResources` report it:
/// the host address and port.
pub fn allocated_port(alloc: &Value, label: &str) -> (String, u64) {
    let ports = alloc["AllocatedResources"]["Shared"]["Ports"].as_array().expect("the allocation's ports");
    let port = ports.iter().find(|port| port["Label"] == label).unwrap_or_else(|| panic!("port {label}: {ports:?}"));
    (port["HostIP"].as_str().expect("an address").to_string(), port["Value"].as_u64().expect("a number"))
}

/// The nodes of the allocation stubs in `allocs` that run (client status).
pub fn running_nodes(allocs: &Value) -> Vec<String> {
    let list = allocs.as_array().map(Vec::as_slice).unwrap_or_default();
    let running = list.iter().filter(|stub| stub["ClientStatus"] == "running");
    running.map(|stub| stub["NodeID"].as_str().expect("a node").to_string()).collect()
}

/// Follows `path` with blocking queries in the background, keeping the
/// fewest `count` said of any answer, starting from `most`: the sampler's
/// task (abort it when done) and the fewest so far.
pub fn fewest_of(
    api: &ApiClient,
    path: &str,
    most: usize,
    count: fn(&Value) -> usize,
) -> (tokio::task::JoinHandle<()>, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let fewest = std::sync::Arc::new(AtomicUsize::new(most));
    let (api, path, seen) = (api.clone(), path.to_string(), fewest.clone());
    let sampler = tokio::spawn(async move {
        let mut index = 0;
        loop {
            let answer = api.get(&format!("{path}?index={index}&wait=30s")).await.expect("read");
            index = answer.index.unwrap_or(index);
            seen.fetch_min(count(&answer.json().expect("JSON")), Ordering::SeqCst);
        }
    });
    (sampler, fewest)
}

/// Whether an allocation stub's client status has ended.
pub fn is_terminal(stub: &Value) -> bool {
    matches!(stub["ClientStatus"].as_str(), Some("complete" | "failed"))
}
