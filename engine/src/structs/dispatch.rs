//! Parameterized jobs (Nomad's `ParameterizedJobConfig`) and the task's
//! `dispatch_payload` block: what a dispatch may and must carry, and where
//! the client writes its payload.
//!
//! Contract:
//! 1. A parameterized job is a template: registering it runs nothing;
//!    each dispatch registers a child job (`<parent>/dispatch-<unix
//!    seconds>-<8 hex>`) carrying the dispatch's meta and payload.
//! 2. The payload is at most [`DISPATCH_PAYLOAD_SIZE_LIMIT`] bytes, and is
//!    stored snappy-compressed on the child (Nomad's `Job.Payload`); the
//!    client decompresses it into `local/<file>` of each task with a
//!    `dispatch_payload` block before the task starts.
//! 3. [`ParameterizedJobConfig::check_dispatch`] gives Nomad's refusals,
//!    in Nomad's order and words.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::template::climbs_out;
use super::Job;
use crate::clock::Timestamp;

/// The largest payload a dispatch may carry, in bytes (Nomad's 16 KiB).
pub const DISPATCH_PAYLOAD_SIZE_LIMIT: usize = 16 * 1024;

/// Whether a dispatch carries a payload (Nomad's `DispatchPayload*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PayloadRule {
    /// It may (Nomad's default).
    #[default]
    Optional,
    /// It must.
    Required,
    /// It must not.
    Forbidden,
}

impl PayloadRule {
    /// Nomad's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            PayloadRule::Optional => "optional",
            PayloadRule::Required => "required",
            PayloadRule::Forbidden => "forbidden",
        }
    }

    /// The rule of Nomad's word (empty: the default).
    pub fn parse(word: &str) -> Option<PayloadRule> {
        match word {
            "" | "optional" => Some(PayloadRule::Optional),
            "required" => Some(PayloadRule::Required),
            "forbidden" => Some(PayloadRule::Forbidden),
            _ => None,
        }
    }
}

/// A job's `parameterized` block.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ParameterizedJobConfig {
    /// Whether a dispatch carries a payload.
    pub payload: PayloadRule,
    /// Meta keys every dispatch must set.
    pub meta_required: Vec<String>,
    /// Meta keys a dispatch may set.
    pub meta_optional: Vec<String>,
}

/// Why a dispatch was refused, in Nomad's words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DispatchCheckError {
    /// A required payload is missing.
    #[error("Payload is not provided but required by parameterized job")]
    PayloadRequired,
    /// A forbidden payload was given.
    #[error("Payload provided but forbidden by parameterized job")]
    PayloadForbidden,
    /// The payload is too large.
    #[error("Payload exceeds maximum size; {0} > {DISPATCH_PAYLOAD_SIZE_LIMIT}")]
    PayloadTooLarge(usize),
    /// Meta keys the job does not name.
    #[error("Dispatch request included unpermitted metadata keys: {0:?}")]
    UnpermittedMeta(Vec<String>),
    /// Required meta keys left out.
    #[error("Dispatch did not provide required meta keys: {0:?}")]
    MissingMeta(Vec<String>),
}

impl ParameterizedJobConfig {
    /// Checks a dispatch's payload and meta (contract, step 3).
    pub fn check_dispatch(&self, payload: &[u8], meta: &BTreeMap<String, String>) -> Result<(), DispatchCheckError> {
        match self.payload {
            PayloadRule::Required if payload.is_empty() => return Err(DispatchCheckError::PayloadRequired),
            PayloadRule::Forbidden if !payload.is_empty() => return Err(DispatchCheckError::PayloadForbidden),
            _ => {}
        }
        if payload.len() > DISPATCH_PAYLOAD_SIZE_LIMIT {
            return Err(DispatchCheckError::PayloadTooLarge(payload.len()));
        }
        let allowed = |key: &String| self.meta_required.contains(key) || self.meta_optional.contains(key);
        let unpermitted: Vec<String> = meta.keys().filter(|key| !allowed(key)).cloned().collect();
        if !unpermitted.is_empty() {
            return Err(DispatchCheckError::UnpermittedMeta(unpermitted));
        }
        let missing: Vec<String> = self.meta_required.iter().filter(|key| !meta.contains_key(*key)).cloned().collect();
        if !missing.is_empty() {
            return Err(DispatchCheckError::MissingMeta(missing));
        }
        Ok(())
    }

    /// Every problem of the block, for [`super::Job::validate`].
    pub(crate) fn problems(&self, problems: &mut Vec<String>) {
        let both: Vec<&String> = self.meta_required.iter().filter(|key| self.meta_optional.contains(key)).collect();
        if !both.is_empty() {
            problems.push(format!(
                "Required and optional meta keys should be disjoint. Following keys exist in both: {both:?}"
            ));
        }
    }
}

/// A task's `dispatch_payload` block: the file, under the task's `local/`
/// directory, its dispatched job's payload is written to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DispatchPayloadConfig {
    /// The file's name relative to `local/`.
    pub file: String,
}

impl DispatchPayloadConfig {
    /// The path inside the task's directory the payload is written to.
    pub fn task_path(&self) -> String {
        format!("local/{}", self.file.trim_start_matches("./"))
    }

    /// Why the file would not stay inside the task's `local/` directory, or `None`.
    pub fn problem(&self) -> Option<String> {
        let file = &self.file;
        if file.trim().is_empty() {
            Some("dispatch_payload needs a file".to_string())
        } else if file.contains('\0') {
            Some(format!("dispatch_payload file {file:?} contains NUL"))
        } else if file.starts_with('/') || climbs_out(file) || file.trim_end_matches('/').is_empty() {
            Some(format!(
                "dispatch_payload file {file:?} escapes the task's directory: it is a name inside \"local/\" \
                 (such as \"input.json\")"
            ))
        } else {
            None
        }
    }
}

/// The id of a child dispatched at `now`: Nomad's
/// `<parent>/dispatch-<unix seconds>-<8 hex>`, the hex from `random`, or
/// with a `template` (Nomad 1.5's `IdPrefixTemplate`)
/// `<parent>/dispatch-<template>-<unix seconds>-<8 hex>`.
pub fn dispatched_id(parent: &str, template: &str, now: Timestamp, random: u32) -> String {
    let seconds = now.0 / 1_000_000_000;
    match template {
        "" => format!("{parent}/dispatch-{seconds}-{random:08x}"),
        template => format!("{parent}/dispatch-{template}-{seconds}-{random:08x}"),
    }
}

/// The child a dispatch registers (Nomad's `Job.Dispatch`, contract,
/// step 1): a copy of `parent` named `id`, its meta the parent's with the
/// dispatch's over it, its payload compressed; the `parameterized` block
/// is kept and `dispatched` set, so the child is not a template itself.
pub fn derive_dispatched(
    parent: &Job,
    id: &str,
    payload: &[u8],
    meta: &BTreeMap<String, String>,
    idempotency_token: &str,
    now: Timestamp,
) -> Job {
    let mut child = parent.child(id, now);
    child.dispatched = true;
    child.meta.extend(meta.iter().map(|(key, value)| (key.clone(), value.clone())));
    child.payload = compress_payload(payload);
    child.dispatch_idempotency_token = idempotency_token.to_string();
    child
}

/// A payload as a child stores it: snappy-compressed (empty stays empty).
pub fn compress_payload(payload: &[u8]) -> Vec<u8> {
    if payload.is_empty() {
        return Vec::new();
    }
    snap::raw::Encoder::new().compress_vec(payload).expect("a payload below the size limit always compresses")
}

/// A stored payload as the task reads it.
pub fn decompress_payload(stored: &[u8]) -> Result<Vec<u8>, snap::Error> {
    if stored.is_empty() {
        return Ok(Vec::new());
    }
    snap::raw::Decoder::new().decompress_vec(stored)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect()
    }

    #[test]
    fn dispatches_are_checked_in_nomads_order_and_words() {
        let config = ParameterizedJobConfig {
            payload: PayloadRule::Required,
            meta_required: vec!["owner".to_string()],
            meta_optional: vec!["tier".to_string()],
        };
        let owner = meta(&[("owner", "me")]);
        assert_eq!(config.check_dispatch(b"", &owner), Err(DispatchCheckError::PayloadRequired));
        let big = vec![0u8; DISPATCH_PAYLOAD_SIZE_LIMIT + 1];
        let too_large = config.check_dispatch(&big, &owner).expect_err("too large").to_string();
        assert_eq!(too_large, "Payload exceeds maximum size; 16385 > 16384");
        let extra = config.check_dispatch(b"x", &meta(&[("owner", "me"), ("color", "red")]));
        assert_eq!(
            extra.expect_err("unpermitted").to_string(),
            "Dispatch request included unpermitted metadata keys: [\"color\"]"
        );
        let missing = config.check_dispatch(b"x", &meta(&[("tier", "1")]));
        assert_eq!(
            missing.expect_err("missing").to_string(),
            "Dispatch did not provide required meta keys: [\"owner\"]"
        );
        assert_eq!(config.check_dispatch(b"x", &owner), Ok(()));
        let forbidden = ParameterizedJobConfig { payload: PayloadRule::Forbidden, ..ParameterizedJobConfig::default() };
        assert_eq!(forbidden.check_dispatch(b"x", &BTreeMap::new()), Err(DispatchCheckError::PayloadForbidden));
        assert_eq!(forbidden.check_dispatch(b"", &BTreeMap::new()), Ok(()));
    }

    #[test]
    fn a_payload_file_stays_inside_local() {
        for good in ["input", "in/put.json", "./x", "a/../b"] {
            assert_eq!(DispatchPayloadConfig { file: good.to_string() }.problem(), None, "{good}");
        }
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "..", "nul\0", "/"] {
            assert!(DispatchPayloadConfig { file: bad.to_string() }.problem().is_some(), "{bad:?}");
        }
        assert_eq!(DispatchPayloadConfig { file: "./in.json".to_string() }.task_path(), "local/in.json");
    }

    #[test]
    fn a_dispatched_child_carries_merged_meta_and_a_compressed_payload() {
        use crate::structs::{JobType, Resources};
        let mut parent = Job::new_simple("work", JobType::Batch, 1, Resources::new(10, 10, 0));
        parent.parameterized = Some(ParameterizedJobConfig::default());
        parent.meta = meta(&[("owner", "parent"), ("tier", "1")]);
        let id = dispatched_id("work", "", Timestamp(1_700_000_000_123_000_000), 0xab);
        assert_eq!(id, "work/dispatch-1700000000-000000ab");
        let templated = dispatched_id("work", "nightly", Timestamp(1_700_000_000_123_000_000), 0xab);
        assert_eq!(templated, "work/dispatch-nightly-1700000000-000000ab");
        let child =
            derive_dispatched(&parent, &id, b"hello hello hello", &meta(&[("owner", "me")]), "t1", Timestamp(5));
        assert_eq!(child.parent_id, "work");
        assert!(child.dispatched && !child.is_parameterized() && child.is_scheduled_directly());
        assert_eq!(child.meta, meta(&[("owner", "me"), ("tier", "1")]));
        assert_ne!(child.payload, b"hello hello hello");
        assert_eq!(decompress_payload(&child.payload).expect("decompresses"), b"hello hello hello");
        assert_eq!(child.dispatch_idempotency_token, "t1");
        assert_eq!(child.validate(), Ok(()));
    }

    #[test]
    fn required_and_optional_keys_are_disjoint() {
        let config = ParameterizedJobConfig {
            payload: PayloadRule::Optional,
            meta_required: vec!["a".to_string()],
            meta_optional: vec!["a".to_string(), "b".to_string()],
        };
        let mut problems = Vec::new();
        config.problems(&mut problems);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("disjoint"), "{problems:?}");
    }
}
