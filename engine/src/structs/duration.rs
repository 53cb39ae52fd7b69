//! Durations in job specs are written the way operators write them:
//! `"30s"`, `"5m"`, `"1h30m"`, `"250ms"`. Binary formats (the command log)
//! carry them as whole nanoseconds instead: exact and compact.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// Why a duration's text did not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Nothing was written.
    #[error("empty duration")]
    Empty,
    /// Something other than a number where one should start.
    #[error("duration {text:?}: expected a number at {at:?}")]
    ExpectedNumber {
        /// The whole text.
        text: String,
        /// What follows where the number should be.
        at: String,
    },
    /// A number that does not fit 64 bits.
    #[error("duration {text:?}: number too large")]
    NumberTooLarge {
        /// The whole text.
        text: String,
    },
    /// A unit other than h, m, s, ms, us and ns.
    #[error("duration {text:?}: unknown unit {unit:?} (use h, m, s, ms, us or ns)")]
    UnknownUnit {
        /// The whole text.
        text: String,
        /// The unit written.
        unit: String,
    },
    /// More whole nanoseconds than 64 bits hold (about 584 years).
    #[error("duration {text:?}: too long")]
    TooLong {
        /// The whole text.
        text: String,
    },
}

/// Parses `"1h30m"`, `"250ms"`, `"10s"`; units h, m, s, ms, us, ns.
pub fn human_duration(text: &str) -> Result<Duration, DurationError> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err(DurationError::Empty);
    }
    let mut total: u128 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return Err(DurationError::ExpectedNumber { text: text.to_string(), at: rest.to_string() });
        }
        let value: u64 =
            rest[..digits].parse().map_err(|_| DurationError::NumberTooLarge { text: text.to_string() })?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let unit_nanos: u128 = match &rest[..unit_len] {
            "h" => 3_600_000_000_000,
            "m" => 60_000_000_000,
            "s" => 1_000_000_000,
            "ms" => 1_000_000,
            "us" => 1_000,
            "ns" => 1,
            other => return Err(DurationError::UnknownUnit { text: text.to_string(), unit: other.to_string() }),
        };
        total += u128::from(value) * unit_nanos;
        rest = &rest[unit_len..];
    }
    u64::try_from(total).map(Duration::from_nanos).map_err(|_| DurationError::TooLong { text: text.to_string() })
}

/// Formats a duration the way [`human_duration`] reads it.
pub fn format_duration(duration: Duration) -> String {
    if duration.is_zero() {
        return "0s".to_string();
    }
    if duration.subsec_nanos() == 0 {
        let secs = duration.as_secs();
        let (hours, minutes, seconds) = (secs / 3600, secs / 60 % 60, secs % 60);
        let mut out = String::new();
        for (value, unit) in [(hours, "h"), (minutes, "m"), (seconds, "s")] {
            if value > 0 {
                out.push_str(&format!("{value}{unit}"));
            }
        }
        return out;
    }
    if duration.subsec_nanos().is_multiple_of(1_000_000) {
        return format!("{}ms", duration.as_millis());
    }
    format!("{}ns", duration.as_nanos())
}

/// Whole nanoseconds, saturating (about 584 years).
fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

pub(crate) mod serde_duration {
    use super::*;

    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serializer.serialize_str(&format_duration(*duration))
        } else {
            serializer.serialize_u64(nanos(*duration))
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        if deserializer.is_human_readable() {
            let text = String::deserialize(deserializer)?;
            human_duration(&text).map_err(serde::de::Error::custom)
        } else {
            u64::deserialize(deserializer).map(Duration::from_nanos)
        }
    }
}

pub(crate) mod serde_opt_duration {
    use super::*;

    pub fn serialize<S: Serializer>(duration: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
        match duration {
            Some(duration) if serializer.is_human_readable() => serializer.serialize_some(&format_duration(*duration)),
            Some(duration) => serializer.serialize_some(&nanos(*duration)),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
        if deserializer.is_human_readable() {
            let text = Option::<String>::deserialize(deserializer)?;
            text.map(|text| human_duration(&text).map_err(serde::de::Error::custom)).transpose()
        } else {
            Ok(Option::<u64>::deserialize(deserializer)?.map(Duration::from_nanos))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_compound_durations() {
        assert_eq!(human_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(human_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(human_duration("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn rejects_bad_durations_with_the_reason() {
        assert!(human_duration("").expect_err("empty").to_string().contains("empty"));
        assert!(human_duration("5 minutes").expect_err("bad unit").to_string().contains("unknown unit"));
        assert!(human_duration("m5").expect_err("no number").to_string().contains("expected a number"));
    }

    #[test]
    fn nanosecond_durations_beyond_four_seconds_round_trip() {
        let odd = Duration::from_nanos(5_000_000_001);
        assert_eq!(human_duration(&format_duration(odd)), Ok(odd));
        assert!(human_duration("99999999999999h").expect_err("too long").to_string().contains("too long"));
    }

    #[test]
    fn formats_what_it_parses() {
        for text in ["1h30m", "250ms", "10s", "0s", "2h5s"] {
            let duration = human_duration(text).expect("valid");
            assert_eq!(format_duration(duration), text);
        }
    }
}
