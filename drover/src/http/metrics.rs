//! `GET /v1/metrics`: Nomad's JSON summary (`Timestamp`, `Gauges`,
//! `Points`, `Counters`, `Samples`), or the Prometheus text format with
//! `?format=prometheus`. Gauges and counters are read from the engine's
//! and the QUIC listener's counters when asked, so a scrape costs a few
//! atomic loads and nothing runs between scrapes; the timers (`Samples`,
//! Prometheus summaries) are the engine's `metrics` histograms, kept by
//! the recorder in `timers.rs`. Names follow Nomad's where the
//! meaning is the same, `nomad.nomad.broker.total_ready` becoming
//! `drover.broker.total_ready` in JSON and `drover_broker_total_ready` in
//! Prometheus; `docs/http-api.md` lists them.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use engine::clock::SystemClock;

use crate::api::format::rfc3339_or_none;
use crate::api::metrics::{GaugeValue, MetricsSummary, SampledValue};

use super::query::{Params, Reply};
use super::ApiState;

/// The routes of this file.
pub fn routes() -> Router<ApiState> {
    Router::new().route("/v1/metrics", get(metrics))
}

/// Whether a value only grows (a counter) or goes up and down (a gauge).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Gauge,
    Counter,
}

/// One metric: its dotted name, labels, kind and value.
struct Metric {
    name: &'static str,
    labels: Vec<(&'static str, String)>,
    kind: Kind,
    value: f64,
}

fn metric(name: &'static str, kind: Kind, value: impl Into<f64>) -> Metric {
    Metric { name, labels: Vec::new(), kind, value: value.into() }
}

/// Every metric, read now.
fn collect(state: &ApiState) -> Vec<Metric> {
    use Kind::{Counter, Gauge};
    let leader = state.leadership.leader();
    let stats = leader.as_ref().map(|server| server.stats()).unwrap_or_default();
    let broker = &stats.broker;
    let workers = state.leadership.worker_stats();
    let remote = state.leadership.remote_stats();
    let mut all = vec![
        metric("drover.broker.total_ready", Gauge, broker.total_ready as f64),
        metric("drover.broker.total_unacked", Gauge, broker.total_unacked as f64),
        metric("drover.broker.total_pending", Gauge, broker.total_pending as f64),
        metric("drover.broker.total_waiting", Gauge, broker.total_delayed as f64),
        metric("drover.broker.total_cancelable", Gauge, broker.total_cancelable as f64),
        metric("drover.broker.total_failed", Gauge, broker.total_failed_queue as f64),
        metric("drover.broker.delivery_limit_reached", Counter, broker.total_delivery_limit_reached as f64),
        metric("drover.broker.nack_timeouts", Counter, broker.total_nack_timeouts as f64),
        metric("drover.blocked_evals.total_blocked", Gauge, stats.blocked.total_blocked as f64),
        metric("drover.blocked_evals.total_escaped", Gauge, stats.blocked.total_escaped as f64),
        metric("drover.blocked_evals.total_system", Gauge, stats.blocked.total_system as f64),
        metric("drover.plan.queue_depth", Gauge, stats.plan_queue_depth as f64),
        metric("drover.plan.evaluated", Counter, stats.plan_applier.plans_evaluated as f64),
        metric("drover.plan.partially_refused", Counter, stats.plan_applier.plans_partially_refused as f64),
        metric("drover.plan.node_rejected", Counter, stats.plan_applier.node_rejections as f64),
        metric("drover.worker.evals_processed", Counter, workers.evals_processed as f64),
        metric("drover.worker.evals_nacked", Counter, workers.evals_nacked as f64),
        metric("drover.worker.plans_submitted", Counter, workers.plans_submitted as f64),
        metric("drover.worker.evals_from_leader", Counter, remote.evals as f64),
        metric("drover.worker.plans_to_leader", Counter, remote.plans as f64),
        metric("drover.worker.backoffs", Counter, workers.backoff_count as f64),
        metric("drover.worker.backoff_ms", Counter, workers.backoff_ms_total as f64),
        metric("drover.heartbeat.active", Gauge, stats.heartbeats.active_timers as f64),
        metric("drover.heartbeat.resets", Counter, stats.heartbeats.resets as f64),
        metric("drover.heartbeat.expirations", Counter, stats.heartbeats.expirations as f64),
        metric("drover.heartbeat.storm_guard", Gauge, u8::from(stats.storm_guard.on)),
        metric("drover.heartbeat.storm_guard_activations", Counter, stats.storm_guard.activations as f64),
        metric("drover.heartbeat.storm_guard_held_ms", Counter, stats.storm_guard.held_millis as f64),
        metric("drover.heartbeat.storm_guard_nodes_held", Counter, stats.storm_guard.nodes_held as f64),
        metric("drover.client.alloc_update_batches", Counter, stats.alloc_updates.batches as f64),
        metric("drover.client.alloc_updates", Counter, stats.alloc_updates.updates as f64),
        metric("drover.client.largest_alloc_update_batch", Gauge, stats.alloc_updates.largest_batch as f64),
        metric("drover.state.index", Gauge, stats.index as f64),
        metric("drover.state.index_waiters", Gauge, state.leadership.store().waiters() as f64),
    ];
    for (scheduler, counts) in &broker.by_scheduler {
        for (name, value) in [("drover.broker.ready", counts.ready), ("drover.broker.unacked", counts.unacked)] {
            let labels = vec![("scheduler", scheduler.as_str().to_string())];
            all.push(Metric { name, labels, kind: Gauge, value: value as f64 });
        }
    }
    let workers = state.leadership.with_workers(engine::worker::WorkerPool::workers).unwrap_or_default();
    let paused = workers.iter().filter(|worker| worker.status == engine::worker::WorkerStatus::Paused).count();
    all.push(metric("drover.worker.count", Gauge, workers.len() as f64));
    all.push(metric("drover.worker.paused", Gauge, paused as f64));
    if let Some(listener) = &state.listener {
        let quic = listener.stats();
        all.push(metric("drover.quic.connections_open", Gauge, quic.connections_open as f64));
        all.push(metric("drover.quic.agent_connections", Gauge, listener.agents().len() as f64));
        all.push(metric("drover.quic.connections_accepted", Counter, quic.connections_accepted as f64));
        all.push(metric("drover.quic.handshakes_refused", Counter, quic.handshakes_refused as f64));
        all.push(metric("drover.quic.calls", Counter, quic.calls as f64));
        all.push(metric("drover.quic.refusals", Counter, quic.refusals as f64));
        all.push(metric("drover.quic.alloc_pushes", Counter, quic.pushes as f64));
    }
    all
}

async fn metrics(State(state): State<ApiState>, params: Params) -> Response {
    let all = collect(&state);
    if params.get("format") == Some("prometheus") {
        return ([("content-type", "text/plain; version=0.0.4")], prometheus(&all)).into_response();
    }
    let labels = |metric: &Metric| metric.labels.iter().map(|(key, value)| (key.to_string(), value.clone())).collect();
    let gauges = all
        .iter()
        .filter(|metric| metric.kind == Kind::Gauge)
        .map(|metric| GaugeValue { name: metric.name.to_string(), value: metric.value, labels: labels(metric) })
        .collect();
    // A counter is one value: its count (a whole number, as Nomad's `int`),
    // sum, min, max and mean.
    let counters = all
        .iter()
        .filter(|metric| metric.kind == Kind::Counter)
        .map(|metric| SampledValue {
            name: metric.name.to_string(),
            count: metric.value as u64,
            rate: 0.0,
            sum: metric.value,
            min: metric.value,
            max: metric.value,
            mean: metric.value,
            stddev: 0.0,
            labels: labels(metric),
        })
        .collect();
    let samples = crate::server::timers::installed()
        .read()
        .into_iter()
        .map(|timer| SampledValue {
            name: timer.name,
            count: timer.count,
            rate: 0.0,
            sum: timer.sum,
            min: timer.min,
            max: timer.max,
            mean: timer.mean,
            stddev: timer.stddev,
            labels: timer.labels.into_iter().collect(),
        })
        .collect();
    let body = MetricsSummary {
        timestamp: rfc3339_or_none(SystemClock::shared().now()),
        gauges,
        points: Vec::new(),
        counters,
        samples,
    };
    Reply::json(&body, params.pretty(), None).into_response()
}

/// The Prometheus text exposition of `all`: dots become underscores.
fn prometheus(all: &[Metric]) -> String {
    let mut text = String::new();
    let mut described = std::collections::BTreeSet::new();
    for metric in all {
        let name = metric.name.replace('.', "_");
        if described.insert(name.clone()) {
            let kind = if metric.kind == Kind::Gauge { "gauge" } else { "counter" };
            text.push_str(&format!("# TYPE {name} {kind}\n"));
        }
        let labels: Vec<String> = metric.labels.iter().map(|(key, value)| format!("{key}=\"{value}\"")).collect();
        let labels = if labels.is_empty() { String::new() } else { format!("{{{}}}", labels.join(",")) };
        text.push_str(&format!("{name}{labels} {}\n", metric.value));
    }
    for timer in crate::server::timers::installed().read() {
        let name = timer.name.replace('.', "_");
        if described.insert(name.clone()) {
            text.push_str(&format!("# TYPE {name} summary\n"));
        }
        let labels: Vec<String> = timer.labels.iter().map(|(key, value)| format!("{key}=\"{value}\"")).collect();
        for (quantile, value) in [("0.5", timer.p50), ("0.9", timer.p90), ("0.99", timer.p99)] {
            let with_quantile: Vec<String> =
                labels.iter().cloned().chain([format!("quantile=\"{quantile}\"")]).collect();
            text.push_str(&format!("{name}{{{}}} {value}\n", with_quantile.join(",")));
        }
        let labels = if labels.is_empty() { String::new() } else { format!("{{{}}}", labels.join(",")) };
        text.push_str(&format!("{name}_sum{labels} {}\n{name}_count{labels} {}\n", timer.sum, timer.count));
    }
    text
}
