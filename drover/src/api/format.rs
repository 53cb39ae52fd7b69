//! The formats the API's users and its server agree on: Go's durations and
//! booleans as Nomad's query parameters and job files write them, and
//! times as RFC 3339.

use std::time::Duration;

use engine::clock::Timestamp;

/// A timestamp as RFC 3339 with nanoseconds, UTC
/// (`2023-11-14T22:13:20.123456789Z`).
pub fn rfc3339(time: Timestamp) -> String {
    humantime::format_rfc3339_nanos(std::time::UNIX_EPOCH + Duration::from_nanos(time.0)).to_string()
}

/// A timestamp as RFC 3339, `None` for none (zero), as Nomad's answers
/// write an unset time as `null`.
pub fn rfc3339_or_none(time: Timestamp) -> Option<String> {
    (time != Timestamp::ZERO).then(|| rfc3339(time))
}

/// A duration as Nomad's JSON carries it: integer nanoseconds.
pub fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// A timestamp as Nomad's CLI shows dates: `2006-01-02T15:04:05Z`.
pub fn date(time: Timestamp) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_nanos(time.0)).to_string()
}

/// Go's `strconv.ParseBool`.
pub fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// A Go duration string (`300ms`, `10s`, `1m30s`, `1.5h`): a unit is
/// required, so a bare `60` is refused as Nomad refuses it.
pub fn parse_go_duration(text: &str) -> Option<Duration> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let number: f64 = rest[..number_len].parse().ok()?;
        rest = &rest[number_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let nanos_per_unit = match &rest[..unit_len] {
            "ns" => 1e0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        total += number * nanos_per_unit;
        rest = &rest[unit_len..];
    }
    Some(Duration::from_nanos(total as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_need_a_unit() {
        assert_eq!(parse_go_duration("1500ms"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("0.5s"), Some(Duration::from_millis(500)));
        assert_eq!(parse_go_duration("60"), None);
        assert_eq!(parse_go_duration("10x"), None);
        assert_eq!(parse_go_duration(""), None);
    }

    #[test]
    fn times_are_rfc3339_in_utc() {
        assert_eq!(rfc3339(Timestamp(1_700_000_000_123_456_789)), "2023-11-14T22:13:20.123456789Z");
        assert_eq!(rfc3339(Timestamp(951_782_400_000_000_000)), "2000-02-29T00:00:00.000000000Z");
        assert_eq!(date(Timestamp(1_700_000_000_123_456_789)), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339_or_none(Timestamp::ZERO), None);
        assert_eq!(
            rfc3339_or_none(Timestamp(951_782_400_000_000_000)).as_deref(),
            Some("2000-02-29T00:00:00.000000000Z")
        );
    }
}
