//! Reading a server's state through its HTTP API, as Nomad's clients do:
//! blocking queries until something holds, an allocation, its ports.

use drover::api::client::ApiClient;
use serde_json::Value;

use super::bounded;

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

/// Whether an allocation stub's client status has ended.
pub fn is_terminal(stub: &Value) -> bool {
    matches!(stub["ClientStatus"].as_str(), Some("complete" | "failed"))
}
