//! Prefix search (Nomad's `api/search.go`), for `status <prefix>`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::WriteMeta;

/// `PUT /v1/search` body (`SearchRequest`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct SearchRequest {
    /// What the ids start with.
    pub prefix: String,
    /// `jobs`, `evals`, `allocs`, `nodes`, `deployment`, or `all` (or `""`).
    pub context: String,
    /// The namespace of jobs (the query's when absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// The answer (`SearchResponse`): per context, the matching ids (at most
/// 20, sorted) and whether there were more.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct SearchResponse {
    pub matches: BTreeMap<String, Vec<String>>,
    pub truncations: BTreeMap<String, bool>,
    #[serde(flatten)]
    pub meta: WriteMeta,
}
