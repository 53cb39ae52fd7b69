//! A container's stdout and stderr copied into the allocation's rotated
//! log files (`<task>.stdout.N`, `<task>.stderr.N`), so that `alloc logs`
//! and `alloc fs` read a container's output as a process's.
//!
//! The copy follows the daemon's log stream with timestamps, and records
//! the last timestamp written in the agent's own directory
//! (`<task>.docker-logs`). A copy started again (the agent restarted, the
//! daemon came back) asks from that second on and skips every entry up to
//! that timestamp, so nothing is written twice and nothing the daemon
//! still holds is lost. Docker's timestamps are RFC 3339 with nine
//! fractional digits, in UTC: they order as text.

use std::path::PathBuf;

use bollard::container::LogOutput;
use bollard::query_parameters::LogsOptionsBuilder;
use engine::structs::LogConfig;
use futures_lite::StreamExt;

use crate::client::alloc_dir::AllocDir;
use crate::client::logs::{prefix, LogKind, RotatingWriter};

/// Copies `container`'s logs until its streams close (it has ended), in
/// the background; the handle ends when the copy has.
pub fn follow(
    client: bollard::Docker,
    container: String,
    dir: &AllocDir,
    task: &str,
    limits: LogConfig,
) -> tokio::task::JoinHandle<()> {
    let copy = Copy {
        logs_dir: dir.logs_dir(),
        task: task.to_string(),
        limits,
        mark_file: dir.task_file(task, "docker-logs"),
    };
    tokio::spawn(async move {
        let mut pause = std::time::Duration::from_millis(250);
        // The stream ends when the container does, or when the daemon
        // goes away; in the second case it is followed again.
        loop {
            match copy.run(&client, &container).await {
                Ok(()) => return,
                // A log driver the Engine cannot read back (syslog, gelf...):
                // Docker keeps no copy to follow, as with Nomad.
                Err(error) if error.contains("does not support reading") => {
                    tracing::warn!(%container, %error, "the container's logs cannot be read back: alloc logs stays empty");
                    return;
                }
                Err(error) => {
                    if has_ended(&client, &container).await {
                        return;
                    }
                    tracing::debug!(%container, %error, "following the container's logs again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(std::time::Duration::from_secs(5));
                }
            }
        }
    })
}

/// Whether `container` no longer runs (or is gone); `false` while the
/// daemon does not answer, so the copy is tried again.
async fn has_ended(client: &bollard::Docker, container: &str) -> bool {
    match client.inspect_container(container, None::<bollard::query_parameters::InspectContainerOptions>).await {
        Ok(found) => found.state.and_then(|state| state.running) != Some(true),
        Err(error) => matches!(error, bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }),
    }
}

struct Copy {
    logs_dir: PathBuf,
    task: String,
    limits: LogConfig,
    mark_file: PathBuf,
}

impl Copy {
    /// One pass over the stream from the last mark; `Ok` when it ended
    /// because the container's streams closed.
    async fn run(&self, client: &bollard::Docker, container: &str) -> Result<(), String> {
        let mark = std::fs::read_to_string(&self.mark_file).ok().map(|text| text.trim().to_string());
        let since = mark.as_deref().and_then(unix_seconds).unwrap_or(0);
        let options =
            LogsOptionsBuilder::new().follow(true).stdout(true).stderr(true).timestamps(true).since(since).build();
        let max_bytes = u64::from(self.limits.max_file_size_mb) * 1024 * 1024;
        let open = |kind| {
            RotatingWriter::open(&self.logs_dir, &prefix(&self.task, kind), self.limits.max_files, max_bytes)
                .map_err(|error| format!("opening the {} log: {error}", kind.as_str()))
        };
        let mut stdout = open(LogKind::Stdout)?;
        let mut stderr = open(LogKind::Stderr)?;
        let mut last = mark.unwrap_or_default();
        let mut stream = std::pin::pin!(client.logs(container, Some(options)));
        let mut unsaved = 0usize;
        let result = loop {
            let Some(entry) = stream.next().await else { break Ok(()) };
            let (writer, message) = match entry {
                Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => (&mut stdout, message),
                Ok(LogOutput::StdErr { message }) => (&mut stderr, message),
                Ok(LogOutput::StdIn { .. }) => continue,
                Err(error) => break Err(error.to_string()),
            };
            let (stamp, text) = split_timestamp(&message);
            if !stamp.is_empty() {
                if stamp <= last.as_str() {
                    continue;
                }
                last = stamp.to_string();
            }
            // A full disk drops output rather than stall the copy.
            let _ = writer.write_all(text);
            unsaved += 1;
            if unsaved >= 64 {
                self.save_mark(&last);
                unsaved = 0;
            }
        };
        self.save_mark(&last);
        result
    }

    fn save_mark(&self, last: &str) {
        if !last.is_empty() {
            let _ = crate::client::alloc_dir::write_private(&self.mark_file, last.as_bytes());
        }
    }
}

/// `(timestamp, rest)` of one entry the daemon sent with timestamps.
fn split_timestamp(message: &[u8]) -> (&str, &[u8]) {
    match message.iter().position(|byte| *byte == b' ') {
        Some(at) => match std::str::from_utf8(&message[..at]) {
            Ok(stamp) if stamp.len() >= 20 && stamp.as_bytes()[4] == b'-' && stamp.ends_with('Z') => {
                (stamp, &message[at + 1..])
            }
            _ => ("", message),
        },
        None => ("", message),
    }
}

/// The whole seconds since the epoch of an RFC 3339 UTC timestamp
/// (`2026-11-27T03:10:00.123456789Z`).
fn unix_seconds(stamp: &str) -> Option<i32> {
    let date = stamp.get(..10)?;
    let time = stamp.get(11..19)?;
    let mut date_parts = date.split('-').map(|part| part.parse::<i64>());
    let (year, month, day) = (date_parts.next()?.ok()?, date_parts.next()?.ok()?, date_parts.next()?.ok()?);
    let mut time_parts = time.split(':').map(|part| part.parse::<i64>());
    let (hour, minute, second) = (time_parts.next()?.ok()?, time_parts.next()?.ok()?, time_parts.next()?.ok()?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    i32::try_from(days * 86_400 + hour * 3600 + minute * 60 + second).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_split_off_and_read_as_unix_seconds() {
        let (stamp, text) = split_timestamp(b"2026-11-27T03:10:00.123456789Z hello world\n");
        assert_eq!((stamp, text), ("2026-11-27T03:10:00.123456789Z", &b"hello world\n"[..]));
        assert_eq!(split_timestamp(b"no stamp here"), ("", &b"no stamp here"[..]));
        assert_eq!(unix_seconds("1970-01-01T00:00:00.000000000Z"), Some(0));
        assert_eq!(unix_seconds("2026-11-27T03:10:00.123456789Z"), Some(1_795_749_000));
        assert_eq!(unix_seconds("2000-02-29T12:00:00Z"), Some(951_825_600));
        assert_eq!(unix_seconds("garbage"), None);
    }
}
