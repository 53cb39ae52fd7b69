//! Task logs on disk: Nomad's names (`<task>.stdout.N`, `<task>.stderr.N`
//! in the allocation's `alloc/logs/`), rotated by size and count.
//!
//! The writer runs in the task's executor process (see `executor.rs`),
//! which owns the read ends of the task's stdout and stderr pipes, so logs
//! are kept for as long as the task runs, whether the agent does or not.
//! Readers (the agent's `/v1/client/fs/logs` endpoint) see a stream as the
//! concatenation of the files still kept, oldest first.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Which of a task's streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogKind {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl LogKind {
    /// `stdout` or `stderr`, as in file names and the logs API.
    pub fn as_str(self) -> &'static str {
        match self {
            LogKind::Stdout => "stdout",
            LogKind::Stderr => "stderr",
        }
    }
}

/// The file name prefix of `task`'s `kind` stream: `<task>.<kind>`.
pub fn prefix(task: &str, kind: LogKind) -> String {
    format!("{task}.{}", kind.as_str())
}

/// The files of one stream in `dir`, by index, oldest first.
pub fn log_files(dir: &Path, prefix: &str) -> Vec<(u64, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<(u64, PathBuf)> = entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let name = entry.file_name();
            let index = name.to_str()?.strip_prefix(prefix)?.strip_prefix('.')?.parse().ok()?;
            Some((index, entry.path()))
        })
        .collect();
    files.sort_unstable();
    files
}

/// Writes one stream into files of at most `max_bytes`, keeping the
/// newest `max_files`. A writer opened where files exist goes on after
/// the newest (the numbering never restarts, as Nomad's logmon).
#[derive(Debug)]
pub struct RotatingWriter {
    dir: PathBuf,
    prefix: String,
    max_files: u64,
    max_bytes: u64,
    index: u64,
    file: File,
    written: u64,
}

impl RotatingWriter {
    /// A writer for `prefix` in `dir`.
    pub fn open(dir: &Path, prefix: &str, max_files: u32, max_bytes: u64) -> std::io::Result<RotatingWriter> {
        let index = log_files(dir, prefix).last().map_or(0, |(index, _)| *index);
        let path = dir.join(format!("{prefix}.{index}"));
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        let written = file.metadata()?.len();
        let mut writer = RotatingWriter {
            dir: dir.to_path_buf(),
            prefix: prefix.to_string(),
            max_files: u64::from(max_files.max(1)),
            max_bytes: max_bytes.max(1),
            index,
            file,
            written,
        };
        if writer.written >= writer.max_bytes {
            writer.rotate()?;
        }
        Ok(writer)
    }

    /// Writes all of `bytes`, splitting across files at the size limit.
    pub fn write_all(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        while !bytes.is_empty() {
            let room = (self.max_bytes - self.written) as usize;
            let (now, rest) = bytes.split_at(room.min(bytes.len()));
            self.file.write_all(now)?;
            self.written += now.len() as u64;
            bytes = rest;
            if self.written >= self.max_bytes {
                self.rotate()?;
            }
        }
        Ok(())
    }

    /// Opens the next file and removes those beyond the count limit.
    fn rotate(&mut self) -> std::io::Result<()> {
        self.index += 1;
        let path = self.dir.join(format!("{}.{}", self.prefix, self.index));
        self.file = OpenOptions::new().create(true).append(true).open(path)?;
        self.written = 0;
        for (index, path) in log_files(&self.dir, &self.prefix) {
            if index + self.max_files <= self.index {
                std::fs::remove_file(path)?;
            }
        }
        Ok(())
    }
}

/// Copies `source` into `writer` until end of file (the task closed the
/// stream). A write error (disk full) drops the data rather than block the
/// task, which would otherwise hang on a full pipe.
pub fn pump(mut source: impl Read, mut writer: RotatingWriter) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        match source.read(&mut buffer) {
            Ok(0) => return,
            Ok(read) => {
                let _ = writer.write_all(&buffer[..read]);
            }
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// Reads a stream from a logical position: the stream is the files still
/// kept, oldest first, one after the other.
#[derive(Debug)]
pub struct StreamCursor {
    dir: PathBuf,
    prefix: String,
    /// The file being read and the offset in it.
    at: Option<(u64, u64)>,
}

impl StreamCursor {
    /// A cursor `offset` bytes from the start (`from_end` false) or before
    /// the end (`from_end` true) of the stream as it is now.
    pub fn new(dir: &Path, prefix: &str, offset: u64, from_end: bool) -> StreamCursor {
        let files = log_files(dir, prefix);
        let sizes: Vec<(u64, u64)> =
            files.iter().map(|(index, path)| (*index, std::fs::metadata(path).map_or(0, |meta| meta.len()))).collect();
        let total: u64 = sizes.iter().map(|(_, size)| size).sum();
        let mut skip = if from_end { total.saturating_sub(offset) } else { offset.min(total) };
        let mut at = sizes.last().map(|(index, size)| (*index, *size));
        for (index, size) in &sizes {
            if skip < *size || Some(*index) == at.map(|(last, _)| last) {
                at = Some((*index, skip.min(*size)));
                break;
            }
            skip -= size;
        }
        StreamCursor { dir: dir.to_path_buf(), prefix: prefix.to_string(), at }
    }

    /// The name of the file the cursor is in and its offset there.
    pub fn position(&self) -> Option<(String, u64)> {
        self.at.map(|(index, offset)| (format!("{}.{index}", self.prefix), offset))
    }

    /// Up to `limit` bytes from the cursor, moving on to newer files; empty
    /// when nothing more is there now. A file removed by rotation while it
    /// was read is skipped.
    pub fn read_more(&mut self, limit: usize) -> std::io::Result<Vec<u8>> {
        let files = log_files(&self.dir, &self.prefix);
        let Some(mut at) = self.at.or_else(|| files.first().map(|(index, _)| (*index, 0))) else {
            return Ok(Vec::new());
        };
        if files.first().is_some_and(|(oldest, _)| *oldest > at.0) {
            at = (files[0].0, 0);
        }
        let mut out = Vec::new();
        let first = at.0;
        for (index, path) in files.iter().filter(|(index, _)| *index >= first) {
            let offset = if *index == at.0 { at.1 } else { 0 };
            let mut file = match File::open(path) {
                Ok(file) => file,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(error) => return Err(error),
            };
            file.seek(SeekFrom::Start(offset))?;
            let read = file.take((limit - out.len()) as u64).read_to_end(&mut out)?;
            at = (*index, offset + read as u64);
            if out.len() >= limit {
                break;
            }
        }
        self.at = Some(at);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("drover-logs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    #[test]
    fn rotates_by_size_and_keeps_the_newest_files() {
        let dir = temp("rotate");
        let mut writer = RotatingWriter::open(&dir, "web.stdout", 3, 10).expect("opens");
        writer.write_all(b"0123456789abcdefghijklmnopqrstuvwxyz").expect("writes");
        let files = log_files(&dir, "web.stdout");
        let indexes: Vec<u64> = files.iter().map(|(index, _)| *index).collect();
        assert_eq!(indexes, vec![1, 2, 3], "36 bytes in files of 10, three kept");
        assert_eq!(std::fs::read(&files[2].1).expect("reads"), b"uvwxyz");
        drop(writer);
        let mut again = RotatingWriter::open(&dir, "web.stdout", 3, 10).expect("reopens");
        again.write_all(b"ABCDE").expect("writes");
        assert_eq!(std::fs::read(dir.join("web.stdout.3")).expect("reads"), b"uvwxyzABCD", "appends to the newest");
        assert_eq!(std::fs::read(dir.join("web.stdout.4")).expect("reads"), b"E");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn a_cursor_reads_across_files_from_either_end() {
        let dir = temp("cursor");
        let mut writer = RotatingWriter::open(&dir, "t.stderr", 5, 4).expect("opens");
        writer.write_all(b"abcdefghij").expect("writes");
        let mut from_start = StreamCursor::new(&dir, "t.stderr", 2, false);
        assert_eq!(from_start.read_more(100).expect("reads"), b"cdefghij");
        assert!(from_start.read_more(100).expect("reads").is_empty());
        writer.write_all(b"kl").expect("writes");
        assert_eq!(from_start.read_more(100).expect("reads"), b"kl", "follows what comes next");
        let mut tail = StreamCursor::new(&dir, "t.stderr", 5, true);
        assert_eq!(tail.read_more(3).expect("reads"), b"hij");
        assert_eq!(tail.read_more(100).expect("reads"), b"kl");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
