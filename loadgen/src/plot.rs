//! `--plot PATH.svg`: the run as pictures. A sampler takes one point a
//! second (the server's progress report, the clients' heartbeat counters
//! and latencies); the marks are what the run did to the cluster (leader
//! kills, the storm, the phases); at the end [`Timeline::draw`] writes five
//! charts sharing the time axis with plotters' SVG backend: placements and
//! heartbeats per second, heartbeat RTT percentiles, the server's CPU, its
//! resident memory, and the clients dropped on purpose (flaps and the
//! storm), each with the marks as vertical lines.

use std::path::Path;
use std::time::Instant;

use anyhow::{anyhow, Result};
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use plotters::prelude::*;

/// A line of a chart: its name, its points, its colour.
type Series = (&'static str, Vec<(f64, f64)>, RGBColor);

/// One second of the run.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// Seconds since the clients started.
    pub at: f64,
    /// Allocations created in the last second (every status counted, so
    /// a stop does not take one back).
    pub placements_per_sec: f64,
    /// Heartbeats answered in the last second.
    pub heartbeats_per_sec: f64,
    /// Heartbeat round trips of the last second, in milliseconds (none
    /// when there were none).
    pub rtt_ms: Option<(f64, f64, f64)>,
    /// The server's CPU in the last second, in cores (none across a
    /// leader change: two processes' clocks).
    pub server_cores: Option<f64>,
    /// The server's resident memory, MiB.
    pub server_rss_mib: f64,
    /// Clients dropped on purpose (flapping, the storm) at that moment.
    pub clients_away: u64,
}

/// The samples and the marks of one run.
pub struct Timeline {
    started: Instant,
    samples: Mutex<Vec<Sample>>,
    marks: Mutex<Vec<(f64, String)>>,
    /// Heartbeat round trips since the last sample, in microseconds.
    rtt_us: Mutex<Histogram<u64>>,
}

impl Timeline {
    /// An empty timeline whose clock starts now.
    pub fn new() -> Timeline {
        Timeline {
            started: Instant::now(),
            samples: Mutex::new(Vec::new()),
            marks: Mutex::new(Vec::new()),
            rtt_us: Mutex::new(Histogram::new_with_bounds(1, 600_000_000, 3).expect("bounds")),
        }
    }

    /// Seconds since the timeline started.
    pub fn now(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Records one heartbeat's round trip for the current second.
    pub fn heartbeat(&self, rtt_us: u64) {
        self.rtt_us.lock().saturating_record(rtt_us);
    }

    /// The current second's round-trip percentiles (p50, p99, max) in
    /// milliseconds, and a fresh second.
    pub fn take_rtt(&self) -> Option<(f64, f64, f64)> {
        let mut rtt = self.rtt_us.lock();
        if rtt.is_empty() {
            return None;
        }
        let ms = |us: u64| us as f64 / 1000.0;
        let taken = (ms(rtt.value_at_quantile(0.5)), ms(rtt.value_at_quantile(0.99)), ms(rtt.max()));
        rtt.reset();
        Some(taken)
    }

    /// Marks something the run did, now.
    pub fn mark(&self, what: impl Into<String>) {
        let at = self.now();
        self.marks.lock().push((at, what.into()));
    }

    /// Adds a sample.
    pub fn push(&self, sample: Sample) {
        self.samples.lock().push(sample);
    }

    /// Writes the charts to `path` (SVG), titled `title`.
    pub fn draw(&self, path: &Path, title: &str) -> Result<()> {
        let samples = self.samples.lock().clone();
        let marks = self.marks.lock().clone();
        if samples.is_empty() {
            return Err(anyhow!("no samples to plot: the run ended before its first second"));
        }
        let end = samples.last().map_or(1.0, |sample| sample.at).max(1.0);
        let root = SVGBackend::new(path, (1200, 1400)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let root = root.titled(title, ("sans-serif", 22)).map_err(plot_error)?;
        let panels = root.split_evenly((5, 1));

        let over_time = |pick: fn(&Sample) -> f64| samples.iter().map(move |sample| (sample.at, pick(sample)));
        let top =
            samples.iter().map(|sample| sample.placements_per_sec.max(sample.heartbeats_per_sec)).fold(1.0, f64::max);
        let series: [Series; 2] = [
            ("placements/s", over_time(|sample| sample.placements_per_sec).collect(), BLUE),
            ("heartbeats/s", over_time(|sample| sample.heartbeats_per_sec).collect(), GREEN),
        ];
        chart(&panels[0], "per second", end, top * 1.1, &series, &marks)?;

        let rtt = |pick: fn(&(f64, f64, f64)) -> f64| {
            samples.iter().filter_map(move |sample| sample.rtt_ms.as_ref().map(|rtt| (sample.at, pick(rtt)))).collect()
        };
        let top = samples.iter().filter_map(|sample| sample.rtt_ms.map(|rtt| rtt.1)).fold(1.0, f64::max);
        let series: [Series; 2] = [("RTT p50 ms", rtt(|rtt| rtt.0), BLUE), ("RTT p99 ms", rtt(|rtt| rtt.1), RED)];
        chart(&panels[1], "heartbeat round trip, ms", end, top * 1.1, &series, &marks)?;

        let cores: Vec<(f64, f64)> =
            samples.iter().filter_map(|sample| sample.server_cores.map(|cores| (sample.at, cores))).collect();
        let top = cores.iter().map(|(_, cores)| *cores).fold(1.0, f64::max);
        let series: [Series; 1] = [("server CPU, cores", cores, MAGENTA)];
        chart(&panels[2], "server CPU, cores", end, top * 1.1, &series, &marks)?;

        let top = samples.iter().map(|sample| sample.server_rss_mib).fold(1.0, f64::max);
        let series: [Series; 1] = [("server RSS MiB", over_time(|sample| sample.server_rss_mib).collect(), CYAN)];
        chart(&panels[3], "server resident memory, MiB", end, top * 1.1, &series, &marks)?;

        let top = samples.iter().map(|sample| sample.clients_away as f64).fold(1.0, f64::max);
        let series: [Series; 1] = [("clients away", over_time(|sample| sample.clients_away as f64).collect(), BLACK)];
        chart(&panels[4], "clients dropped on purpose", end, top * 1.1, &series, &marks)?;
        root.present().map_err(plot_error)?;
        Ok(())
    }
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline::new()
    }
}

/// One chart: `series` over `0..end` seconds and `0..top`, the marks as
/// labelled vertical lines.
fn chart<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    y_label: &str,
    end: f64,
    top: f64,
    series: &[Series],
    marks: &[(f64, String)],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let mut chart = ChartBuilder::on(area)
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..end, 0.0..top)
        .map_err(plot_error)?;
    chart.configure_mesh().x_desc("seconds").y_desc(y_label).draw().map_err(plot_error)?;
    for (name, points, color) in series {
        let color = *color;
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
            .map_err(plot_error)?
            .label(*name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    for (at, what) in marks {
        let line = PathElement::new([(*at, 0.0), (*at, top)], RED.mix(0.6).stroke_width(1));
        chart.draw_series(std::iter::once(line)).map_err(plot_error)?;
        let label = Text::new(what.clone(), (*at, top * 0.95), ("sans-serif", 12).into_font().color(&RED));
        chart.draw_series(std::iter::once(label)).map_err(plot_error)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(plot_error)?;
    Ok(())
}

fn plot_error(error: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("drawing the plot: {error}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeline_draws_an_svg_with_its_series_and_marks() {
        let timeline = Timeline::new();
        timeline.heartbeat(800);
        timeline.heartbeat(2_500);
        let rtt = timeline.take_rtt().expect("two round trips");
        assert!((rtt.0 - 0.8).abs() < 0.01 && (rtt.2 - 2.5).abs() < 0.01, "{rtt:?}");
        assert_eq!(timeline.take_rtt(), None, "each second starts afresh");
        for second in 0u32..5 {
            timeline.push(Sample {
                at: f64::from(second),
                placements_per_sec: 1000.0 * f64::from(second),
                heartbeats_per_sec: 500.0,
                rtt_ms: Some(rtt),
                server_cores: (second != 2).then_some(0.5),
                server_rss_mib: 200.0,
                clients_away: u64::from(second) * 10,
            });
        }
        timeline.marks.lock().push((2.0, "leader killed".to_string()));
        let path = std::env::temp_dir().join(format!("loadgen-plot-test-{}.svg", std::process::id()));
        timeline.draw(&path, "a test run").expect("drawn");
        let svg = std::fs::read_to_string(&path).expect("written");
        let _ = std::fs::remove_file(&path);
        assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
        for text in ["a test run", "placements/s", "heartbeats/s", "RTT p99 ms", "server RSS MiB", "leader killed"] {
            assert!(svg.contains(text), "the SVG has no {text:?}");
        }
    }
}
