//! What the job spec readers (`job_spec.rs`, `service_spec.rs`) share: the
//! refusal of a submitted job, and whether a JSON field says anything.

use serde_json::Value;

use super::EveryNamespace;

/// Why a submitted job was refused: what is wrong, and where (the API
/// answers it with 400).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct JobSpecError(pub(crate) String);

impl JobSpecError {
    /// A refusal saying `message`.
    pub(crate) fn new(message: String) -> JobSpecError {
        JobSpecError(message)
    }
}

impl From<EveryNamespace> for JobSpecError {
    fn from(error: EveryNamespace) -> Self {
        JobSpecError(error.to_string())
    }
}

/// Whether a JSON value says anything: not null, not an empty list, not
/// `false`, `0` or `""` (the zero values the CLI fills in). An object says
/// something even when empty: Go's encoder writes an absent block as
/// `null`, and a job file's `vault {}` asks for the block's defaults.
pub(crate) fn is_set(value: &Option<Value>) -> bool {
    value.as_ref().is_some_and(says_something)
}

/// [`is_set`] of a value that is there.
pub(crate) fn says_something(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Array(items) => !items.is_empty(),
        Value::Object(_) => true,
        Value::Bool(flag) => *flag,
        Value::String(text) => !text.is_empty(),
        Value::Number(number) => number.as_f64() != Some(0.0),
    }
}
