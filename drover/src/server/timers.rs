//! The process's `metrics` recorder, for the engine's timers
//! (`engine::timing`): each name and label set keeps an HDR histogram of
//! every value since the process started (microsecond resolution, three
//! significant digits), which `/v1/metrics` answers as Nomad's `Samples`
//! and as Prometheus summaries. Counters and gauges are read from the
//! engine's own counters at scrape time instead (see `http/metrics.rs`),
//! so the recorder hands out no-ops for them.
//!
//! Written here rather than taken from `metrics-exporter-prometheus`: that
//! exporter writes only the Prometheus text, and Nomad's JSON summary needs
//! the count, sum, min, max, mean and deviation of each timer, which the
//! histograms give directly.

use std::sync::{Arc, OnceLock};

use hashbrown::HashMap;
use hdrhistogram::Histogram;
use metrics::{Counter, Gauge, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use parking_lot::Mutex;

/// One timer's values, in microseconds.
#[derive(Debug)]
struct Cell {
    values: Mutex<Histogram<u64>>,
}

impl HistogramFn for Cell {
    fn record(&self, millis: f64) {
        let micros = (millis * 1_000.0).round().max(1.0) as u64;
        self.values.lock().saturating_record(micros);
    }
}

/// The recorder (module docs).
#[derive(Debug, Default)]
pub struct Timers {
    cells: Mutex<HashMap<Key, Arc<Cell>>>,
}

/// One timer as read: values in milliseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct TimerReading {
    /// The dotted name.
    pub name: String,
    /// Its labels.
    pub labels: Vec<(String, String)>,
    /// How many values.
    pub count: u64,
    /// Their sum.
    pub sum: f64,
    /// The smallest.
    pub min: f64,
    /// The largest.
    pub max: f64,
    /// The mean.
    pub mean: f64,
    /// The standard deviation.
    pub stddev: f64,
    /// The median.
    pub p50: f64,
    /// The 90th percentile.
    pub p90: f64,
    /// The 99th percentile.
    pub p99: f64,
}

impl Timers {
    /// Every timer recorded so far, by name.
    pub fn read(&self) -> Vec<TimerReading> {
        let cells: Vec<(Key, Arc<Cell>)> =
            self.cells.lock().iter().map(|(key, cell)| (key.clone(), cell.clone())).collect();
        let mut readings: Vec<TimerReading> = cells
            .into_iter()
            .map(|(key, cell)| {
                let values = cell.values.lock();
                let millis = |micros: f64| micros / 1_000.0;
                TimerReading {
                    name: key.name().to_string(),
                    labels: key.labels().map(|label| (label.key().to_string(), label.value().to_string())).collect(),
                    count: values.len(),
                    sum: millis(values.mean() * values.len() as f64),
                    min: millis(values.min() as f64),
                    max: millis(values.max() as f64),
                    mean: millis(values.mean()),
                    stddev: millis(values.stdev()),
                    p50: millis(values.value_at_quantile(0.5) as f64),
                    p90: millis(values.value_at_quantile(0.9) as f64),
                    p99: millis(values.value_at_quantile(0.99) as f64),
                }
            })
            .collect();
        readings.sort_by(|a, b| (&a.name, &a.labels).cmp(&(&b.name, &b.labels)));
        readings
    }
}

impl Recorder for Timers {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> metrics::Histogram {
        let mut cells = self.cells.lock();
        let cell = match cells.get(key) {
            Some(cell) => cell.clone(),
            None => {
                let values = Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds");
                let cell = Arc::new(Cell { values: Mutex::new(values) });
                cells.insert(key.clone(), cell.clone());
                cell
            }
        };
        metrics::Histogram::from_arc(cell)
    }
}

static TIMERS: OnceLock<&'static Timers> = OnceLock::new();

/// The process's timers, installed as the global recorder on first use.
/// (A process has one; a test that runs several servers shares it.)
pub fn installed() -> &'static Timers {
    TIMERS.get_or_init(|| {
        let timers: &'static Timers = Box::leak(Box::default());
        if metrics::set_global_recorder(timers).is_err() {
            tracing::warn!("another metrics recorder is installed: the engine's timers are not recorded");
        }
        timers
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timer_keeps_its_count_sum_and_percentiles_per_label_set() {
        let timers = Timers::default();
        metrics::with_local_recorder(&timers, || {
            for millis in [1.0, 2.0, 3.0, 4.0] {
                metrics::histogram!("drover.plan.apply").record(millis);
            }
            metrics::histogram!("drover.worker.invoke_scheduler", "type" => "batch").record(10.0);
        });
        let read = timers.read();
        assert_eq!(read.len(), 2);
        let apply = &read[0];
        assert_eq!((apply.name.as_str(), apply.count), ("drover.plan.apply", 4));
        // Three significant digits: each value within 0.1%.
        let near = |value: f64, expected: f64| (value - expected).abs() <= expected * 0.001 + 1e-9;
        assert!(near(apply.min, 1.0) && near(apply.max, 4.0) && near(apply.sum, 10.0), "{apply:?}");
        assert!(near(apply.p50, 2.0), "{apply:?}");
        assert_eq!(read[1].labels, vec![("type".to_string(), "batch".to_string())]);
    }
}
