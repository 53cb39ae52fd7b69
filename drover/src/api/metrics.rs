//! `GET /v1/metrics` (Nomad's `api/operator_metrics.go`): the summary of
//! gauges, counters and timers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The metrics summary (`MetricsSummary`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct MetricsSummary {
    /// When it was read, RFC 3339.
    pub timestamp: Option<String>,
    /// Values that go up and down.
    pub gauges: Vec<GaugeValue>,
    /// Always empty.
    pub points: Vec<PointValue>,
    /// Values that only grow.
    pub counters: Vec<SampledValue>,
    /// Timers, in milliseconds.
    pub samples: Vec<SampledValue>,
}

/// A gauge (`GaugeValue`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct GaugeValue {
    pub name: String,
    pub value: f64,
    pub labels: BTreeMap<String, String>,
}

/// A series of points (`PointValue`): Drover keeps none.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct PointValue {
    pub name: String,
    pub points: Vec<f64>,
}

/// A counter or a timer (`SampledValue`): a counter's `Count`, `Sum`,
/// `Min`, `Max` and `Mean` are all its value.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct SampledValue {
    pub name: String,
    pub count: u64,
    pub rate: f64,
    pub sum: f64,
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    pub stddev: f64,
    pub labels: BTreeMap<String, String>,
}
