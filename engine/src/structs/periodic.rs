//! A job's `periodic` block (Nomad's `PeriodicConfig`): when its children
//! are launched, and the pure rule that says the next launch after a time.
//!
//! Contract:
//! 1. Specs are Nomad's cron (hashicorp/cronexpr): 5 fields (minute, hour,
//!    day of month, month, day of week), 6 (the same and a year), 7
//!    (seconds first, year last), or a macro (`@yearly`, `@annually`,
//!    `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly`). With
//!    several specs (`crons`, Nomad 1.7+) the next launch is the earliest
//!    of theirs.
//! 2. Times are computed in the block's `time_zone` (an IANA name; `UTC`
//!    by default), so "9 every morning" follows its zone's daylight saving.
//! 3. [`PeriodicConfig::next_launch`] is strictly after the time it is
//!    given, whole seconds, and `None` when no spec matches again (a spec
//!    whose years have passed). It reads no clock: the dispatcher, the
//!    CLI and `job plan` hand it their `now`.

use std::str::FromStr;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;

/// The only spec type Nomad has.
pub const SPEC_TYPE_CRON: &str = "cron";

/// Nomad's default time zone.
pub const DEFAULT_TIME_ZONE: &str = "UTC";

/// A job's `periodic` block.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PeriodicConfig {
    /// Whether launches happen (a disabled block keeps the job periodic:
    /// it launches nothing, but may be forced).
    pub enabled: bool,
    /// The cron specs (Nomad's `Spec`, or its `Specs` list).
    pub specs: Vec<String>,
    /// The spec type; only `cron`.
    pub spec_type: String,
    /// No launch while a child is still running.
    pub prohibit_overlap: bool,
    /// The IANA time zone the specs are read in.
    pub time_zone: String,
}

impl Default for PeriodicConfig {
    fn default() -> Self {
        PeriodicConfig {
            enabled: true,
            specs: Vec::new(),
            spec_type: SPEC_TYPE_CRON.to_string(),
            prohibit_overlap: false,
            time_zone: DEFAULT_TIME_ZONE.to_string(),
        }
    }
}

/// Why a spec or time zone does not parse, in Nomad's words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PeriodicError {
    /// A cron spec that does not parse.
    #[error("Invalid cron spec {spec:?}: {reason}")]
    Spec {
        /// The spec.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A time zone that is not an IANA name.
    #[error("Invalid time zone {0:?}: unknown time zone")]
    TimeZone(String),
}

impl PeriodicConfig {
    /// A block of one cron spec, with Nomad's defaults for the rest.
    pub fn cron(spec: &str) -> PeriodicConfig {
        PeriodicConfig { specs: vec![spec.to_string()], ..PeriodicConfig::default() }
    }

    /// The first launch strictly after `after` (contract, step 3).
    pub fn next_launch(&self, after: Timestamp) -> Result<Option<Timestamp>, PeriodicError> {
        let zone = self.zone()?;
        let mut earliest = None;
        for spec in &self.specs {
            let next = next_of(&parse_spec(spec)?, zone, after);
            earliest = match (earliest, next) {
                (Some(known), Some(found)) => Some(std::cmp::min(known, found)),
                (known, found) => known.or(found),
            };
        }
        Ok(earliest)
    }

    /// The time zone the specs are read in.
    fn zone(&self) -> Result<Tz, PeriodicError> {
        match self.time_zone.as_str() {
            "" => Ok(Tz::UTC),
            name => Tz::from_str(name).map_err(|_| PeriodicError::TimeZone(name.to_string())),
        }
    }

    /// Every problem of the block, for [`super::Job::validate`].
    pub(crate) fn problems(&self, problems: &mut Vec<String>) {
        if self.spec_type != SPEC_TYPE_CRON {
            problems.push(format!("Unknown periodic specification type {:?}", self.spec_type));
        }
        if self.specs.iter().all(|spec| spec.trim().is_empty()) {
            problems.push("Must specify a spec".to_string());
        }
        for spec in self.specs.iter().filter(|spec| !spec.trim().is_empty()) {
            if let Err(error) = parse_spec(spec) {
                problems.push(error.to_string());
            }
        }
        if let Err(error) = self.zone() {
            problems.push(error.to_string());
        }
    }
}

/// Nomad's cron (contract, step 1) as croner reads it: croner's seven
/// fields are Nomad's, and a six-field Nomad spec has a year, not seconds.
fn parse_spec(spec: &str) -> Result<Cron, PeriodicError> {
    let trimmed = spec.trim();
    let fields = trimmed.split_whitespace().count();
    let normalized = match trimmed {
        "@midnight" => "0 0 * * *".to_string(),
        _ if fields == 6 => format!("0 {trimmed}"),
        _ => trimmed.to_string(),
    };
    let invalid = |reason: String| PeriodicError::Spec { spec: spec.to_string(), reason };
    if !trimmed.starts_with('@') && !(5..=7).contains(&fields) {
        return Err(invalid(format!("expected 5 to 7 fields, found {fields}")));
    }
    let parser = CronParser::builder().seconds(Seconds::Optional).year(Year::Optional).build();
    parser.parse(&normalized).map_err(|error| invalid(error.to_string()))
}

/// The first time `cron` matches strictly after `after`, in `zone`.
fn next_of(cron: &Cron, zone: Tz, after: Timestamp) -> Option<Timestamp> {
    let seconds = i64::try_from(after.0 / 1_000_000_000).ok()?;
    let start: DateTime<Tz> = Utc.timestamp_opt(seconds, 0).single()?.with_timezone(&zone);
    // Whole seconds: `after` inside a matching second still launches after it.
    let next = cron.find_next_occurrence(&start, false).ok()?;
    let next_seconds = u64::try_from(next.timestamp()).ok()?;
    Some(Timestamp(next_seconds.checked_mul(1_000_000_000)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-03-07T10:20:30Z.
    const T: u64 = 1_772_878_830;

    fn at(seconds: u64) -> Timestamp {
        Timestamp(seconds * 1_000_000_000)
    }

    fn next(config: &PeriodicConfig, after: u64) -> u64 {
        config.next_launch(at(after)).expect("valid").expect("matches again").0 / 1_000_000_000
    }

    #[test]
    fn a_minute_cron_launches_at_the_next_whole_minute_strictly_after() {
        let config = PeriodicConfig::cron("* * * * *");
        assert_eq!(next(&config, T), T - 30 + 60);
        assert_eq!(next(&config, T - 30), T - 30 + 60, "a launch time itself is not launched again");
        let every_five = PeriodicConfig::cron("*/5 * * * *");
        assert_eq!(next(&every_five, T) % 300, 0);
    }

    #[test]
    fn macros_six_and_seven_fields_read_as_nomad_reads_them() {
        assert_eq!(next(&PeriodicConfig::cron("@hourly"), T) % 3600, 0);
        assert_eq!(next(&PeriodicConfig::cron("@daily"), T) % 86_400, 0);
        assert_eq!(next(&PeriodicConfig::cron("@midnight"), T) % 86_400, 0);
        // Six fields: the sixth is a year, and 2025 has passed.
        assert_eq!(PeriodicConfig::cron("* * * * * 2025").next_launch(at(T)), Ok(None));
        assert_eq!(next(&PeriodicConfig::cron("0 * * * * 2026"), T) % 3600, 0);
        // Seven fields: seconds first.
        assert_eq!(next(&PeriodicConfig::cron("15 * * * * * *"), T), T - 30 + 60 + 15);
    }

    #[test]
    fn several_specs_launch_at_the_earliest() {
        let mut config = PeriodicConfig::cron("@daily");
        config.specs.push("*/10 * * * *".to_string());
        assert_eq!(next(&config, T) % 600, 0);
        assert!(next(&config, T) - T < 600);
    }

    #[test]
    fn times_are_read_in_the_time_zone() {
        let mut config = PeriodicConfig::cron("0 9 * * *");
        assert_eq!(next(&config, T) % 86_400, 9 * 3600, "09:00 UTC");
        config.time_zone = "America/New_York".to_string();
        // 2026-03-07 is before the switch to daylight saving: UTC-5.
        assert_eq!(next(&config, T) % 86_400, 14 * 3600, "09:00 in New York");
    }

    #[test]
    fn bad_blocks_are_listed_in_nomads_words() {
        let mut problems = Vec::new();
        let mut config = PeriodicConfig::cron("61 * * * *");
        config.time_zone = "Mars/Olympus".to_string();
        config.problems(&mut problems);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with("Invalid cron spec \"61 * * * *\""), "{problems:?}");
        assert_eq!(problems[1], "Invalid time zone \"Mars/Olympus\": unknown time zone");
        let mut problems = Vec::new();
        PeriodicConfig { specs: vec![], ..PeriodicConfig::default() }.problems(&mut problems);
        assert_eq!(problems, ["Must specify a spec"]);
        let mut problems = Vec::new();
        PeriodicConfig::cron("* * *").problems(&mut problems);
        assert!(problems[0].contains("expected 5 to 7 fields"), "{problems:?}");
    }
}
