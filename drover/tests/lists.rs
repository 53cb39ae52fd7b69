//! Lists that scale, on a real `drover server --dev` and `drover agent
//! --dev`: jobs, allocations, evaluations, nodes and deployments each take
//! `per_page`, `next_token` (from `X-Nomad-NextToken`) and `filter`, as
//! Nomad 1.3+; paging through a list returns each item once, the last page
//! carries no token, and a malformed token or filter is a 400.

mod common;

use std::collections::BTreeSet;

use common::api::{json_of, until};
use common::dev::DevCluster;
use drover::api::client::ApiClient;
use serde_json::{json, Value};

fn job(id: &str, datacenter: &str) -> Value {
    json!({"Job": {"ID": id, "Name": id, "Type": "service", "Datacenters": [datacenter],
        "TaskGroups": [{"Name": "web", "Count": 2,
            "Tasks": [{"Name": "web", "Driver": "mock", "Config": {"run_for": "1h"},
                "Resources": {"CPU": 10, "MemoryMB": 10}}]}]}})
}

/// Every page of `path` with `per_page`, following the tokens: the ids
/// of each page.
async fn pages(api: &ApiClient, path: &str, per_page: usize) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let separator = if path.contains('?') { '&' } else { '?' };
        let mut url = format!("{path}{separator}per_page={per_page}");
        if let Some(token) = &token {
            url.push_str(&format!("&next_token={token}"));
        }
        let answer = api.get(&url).await.expect("an answer");
        assert_eq!(answer.status, 200, "{url}: {}", answer.body);
        let list = answer.json().expect("a list");
        let ids = list.as_array().expect("a list").iter().map(|item| item["ID"].as_str().expect("an id").to_string());
        pages.push(ids.collect());
        match answer.next_token {
            Some(next) => token = Some(next),
            None => return pages,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_list_pages_and_filters_as_nomads() {
    let cluster = DevCluster::start("lists", &[]).await;
    let api = &cluster.api;
    until(api, "/v1/nodes", "the agent registers", |nodes| nodes.as_array().is_some_and(|list| list.len() == 1)).await;
    let ids = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf"];
    for id in ids {
        json_of(api, "PUT", "/v1/jobs", Some(&job(id, "dc1"))).await;
    }
    until(api, "/v1/allocations", "14 allocations", |allocs| allocs.as_array().is_some_and(|list| list.len() == 14))
        .await;

    let jobs = pages(api, "/v1/jobs", 3).await;
    assert_eq!(jobs.iter().map(Vec::len).collect::<Vec<_>>(), vec![3, 3, 1], "{jobs:?}");
    assert_eq!(jobs.concat(), ids.to_vec(), "by id, each once");
    for (path, total) in [("/v1/allocations", 14), ("/v1/evaluations", 7), ("/v1/deployments", 7), ("/v1/nodes", 1)] {
        let listed = pages(api, path, 4).await;
        let all: Vec<String> = listed.concat();
        let unique: BTreeSet<&String> = all.iter().collect();
        assert_eq!((all.len(), unique.len()), (total, total), "{path}: {listed:?}");
        assert!(listed.iter().all(|page| page.len() <= 4), "{path}: {listed:?}");
        let whole = json_of(api, "GET", path, None).await;
        let order: Vec<String> = whole
            .as_array()
            .expect("a list")
            .iter()
            .map(|item| item["ID"].as_str().expect("an id").to_string())
            .collect();
        assert_eq!(all, order, "{path}: the pages in the list's own order");
    }

    // A filter is applied before the page is cut: two pages of the matches.
    let filtered =
        pages(api, "/v1/allocations?filter=JobID%20%3D%3D%20%22alpha%22%20or%20JobID%20%3D%3D%20%22golf%22", 3).await;
    assert_eq!(filtered.iter().map(Vec::len).collect::<Vec<_>>(), vec![3, 1], "{filtered:?}");
    let named = json_of(api, "GET", "/v1/jobs?filter=ID%20matches%20%22%5E%5Bab%5D%22", None).await;
    let named: Vec<&str> =
        named.as_array().expect("a list").iter().map(|job| job["ID"].as_str().expect("an id")).collect();
    assert_eq!(named, vec!["alpha", "bravo"]);

    let bad_token = api.get("/v1/jobs?per_page=2&next_token=nodot").await.expect("an answer");
    assert_eq!(bad_token.status, 400, "{}", bad_token.body);
    let bad_filter = api.get("/v1/nodes?filter=Status%20%3D%3D").await.expect("an answer");
    assert_eq!(bad_filter.status, 400, "{}", bad_filter.body);
    assert!(bad_filter.body.contains("failed to read filter expression"), "{}", bad_filter.body);
}
