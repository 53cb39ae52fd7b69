//! An allocation's files as the servers read them through its agent
//! (Nomad's allocdir reads): list, stat and read, each path relative to
//! the allocation's directory (`alloc/logs/web.stdout.0`, `web/local/x`).
//!
//! A path is refused before anything is read when it leaves the
//! allocation's directory, lexically (`..`) or through a symbolic link,
//! and a read of a task's `secrets/` is refused, as Nomad refuses them.
//! What the agent answers with is `ops.rs`'s business.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use transport::message::{AgentError, AgentErrorCode, FileInfo};

/// The most entries a listing answers: a directory with more is refused
/// rather than sent in a message of unbounded size.
pub const MAX_LIST_ENTRIES: usize = 10_000;

/// The files of one allocation.
#[derive(Clone, Debug)]
pub struct AllocFs {
    /// The allocation's directory, symbolic links resolved.
    root: PathBuf,
}

/// An error of `code` saying `message`.
pub fn error(code: AgentErrorCode, message: impl Into<String>) -> AgentError {
    AgentError { code, message: message.into() }
}

impl AllocFs {
    /// The files under `root` (the allocation's directory), which must
    /// exist.
    pub fn open(root: &Path) -> std::io::Result<AllocFs> {
        Ok(AllocFs { root: std::fs::canonicalize(root)? })
    }

    /// `path` as a file of the allocation (module docs).
    pub fn resolve(&self, path: &str) -> Result<PathBuf, AgentError> {
        let escapes = || error(AgentErrorCode::Invalid, format!("Path {path:?} escapes the allocation directory"));
        let mut relative = PathBuf::new();
        for part in Path::new(path).components() {
            match part {
                Component::Normal(name) => relative.push(name),
                Component::ParentDir if !relative.pop() => return Err(escapes()),
                Component::ParentDir | Component::RootDir | Component::CurDir => {}
                Component::Prefix(_) => return Err(escapes()),
            }
        }
        let found = std::fs::canonicalize(self.root.join(&relative)).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => {
                error(AgentErrorCode::NotFound, format!("no such file or directory: {path:?}"))
            }
            _ => error(AgentErrorCode::Internal, format!("{path:?}: {source}")),
        })?;
        if !found.starts_with(&self.root) {
            return Err(escapes());
        }
        Ok(found)
    }

    /// `path` as a file whose bytes may be read: not a task's secret.
    pub fn readable(&self, path: &str) -> Result<PathBuf, AgentError> {
        let found = self.resolve(path)?;
        let inside = found.strip_prefix(&self.root).expect("resolved under the root");
        let mut parts = inside.components();
        if let (Some(_task), Some(Component::Normal(dir))) = (parts.next(), parts.next()) {
            if dir == "secrets" {
                return Err(error(AgentErrorCode::Forbidden, format!("Reading secret file prohibited: {path}")));
            }
        }
        Ok(found)
    }

    /// The entries of the directory `path`, by name.
    pub fn list(&self, path: &str) -> Result<Vec<FileInfo>, AgentError> {
        let dir = self.resolve(path)?;
        let entries = std::fs::read_dir(&dir).map_err(|source| io_error(path, source))?;
        let mut files = Vec::new();
        for entry in entries {
            if files.len() == MAX_LIST_ENTRIES {
                let message = format!("{path:?} holds more than {MAX_LIST_ENTRIES} entries: list a directory below it");
                return Err(error(AgentErrorCode::Invalid, message));
            }
            let entry = entry.map_err(|source| io_error(path, source))?;
            // A symbolic link is listed as what it is, not followed.
            let meta = entry.path().symlink_metadata().map_err(|source| io_error(path, source))?;
            files.push(info(entry.file_name().to_string_lossy().into_owned(), &meta));
        }
        files.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(files)
    }

    /// The file or directory `path`.
    pub fn stat(&self, path: &str) -> Result<FileInfo, AgentError> {
        let found = self.resolve(path)?;
        let meta = found.metadata().map_err(|source| io_error(path, source))?;
        let name = found.file_name().map_or_else(|| "/".to_string(), |name| name.to_string_lossy().into_owned());
        Ok(info(name, &meta))
    }
}

/// An I/O error of `path`, as the agent answers it.
fn io_error(path: &str, source: std::io::Error) -> AgentError {
    match source.kind() {
        std::io::ErrorKind::NotFound => error(AgentErrorCode::NotFound, format!("no such file or directory: {path:?}")),
        std::io::ErrorKind::NotADirectory => error(AgentErrorCode::Invalid, format!("{path:?} is not a directory")),
        _ => error(AgentErrorCode::Internal, format!("{path:?}: {source}")),
    }
}

fn info(name: String, meta: &std::fs::Metadata) -> FileInfo {
    FileInfo {
        name,
        is_dir: meta.is_dir(),
        size: meta.len(),
        mode: meta.mode(),
        mod_time: meta.mtime().saturating_mul(1_000_000_000).saturating_add(meta.mtime_nsec()),
    }
}

/// Reads one file from a position on, as far as it goes now; with
/// `follow`, again later for what was appended.
#[derive(Debug)]
pub struct FileCursor {
    path: PathBuf,
    offset: u64,
    /// The offset not to read past (`readat`'s limit).
    end: Option<u64>,
}

impl FileCursor {
    /// A cursor on the regular file `path`, `offset` bytes from its start
    /// (`from_end`: before its end), reading at most `limit` bytes.
    pub fn open(path: PathBuf, offset: u64, from_end: bool, limit: Option<u64>) -> Result<FileCursor, AgentError> {
        let shown = path.display().to_string();
        let meta = path.metadata().map_err(|source| io_error(&shown, source))?;
        if meta.is_dir() {
            return Err(error(AgentErrorCode::Invalid, "the path is a directory: list it instead"));
        }
        let offset = if from_end { meta.len().saturating_sub(offset) } else { offset };
        Ok(FileCursor { path, offset, end: limit.map(|limit| offset.saturating_add(limit)) })
    }

    /// The offset after what was read.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Whether the limit was reached: nothing more will be read.
    pub fn done(&self) -> bool {
        self.end.is_some_and(|end| self.offset >= end)
    }

    /// Up to `limit` bytes from the cursor; empty when nothing more is
    /// there now (a truncated file is read from its new end).
    pub fn read_more(&mut self, limit: usize) -> std::io::Result<Vec<u8>> {
        let mut file = File::open(&self.path)?;
        let size = file.metadata()?.len();
        if size < self.offset {
            self.offset = size;
        }
        let room = self.end.map_or(limit as u64, |end| end.saturating_sub(self.offset).min(limit as u64));
        file.seek(SeekFrom::Start(self.offset))?;
        let mut out = Vec::new();
        file.take(room).read_to_end(&mut out)?;
        self.offset += out.len() as u64;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("drover-fs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("alloc/logs")).expect("temp dir");
        std::fs::create_dir_all(dir.join("web/secrets")).expect("temp dir");
        std::fs::create_dir_all(dir.join("web/local")).expect("temp dir");
        dir
    }

    #[test]
    fn paths_stay_in_the_allocation_and_secrets_are_not_read() {
        let dir = temp("paths");
        std::fs::write(dir.join("web/local/out.txt"), "hello").expect("writes");
        std::fs::write(dir.join("web/secrets/token"), "s3cret").expect("writes");
        std::os::unix::fs::symlink("/etc", dir.join("web/local/etc")).expect("a link out");
        let fs = AllocFs::open(&dir).expect("opens");
        assert!(fs.resolve("/web/local/out.txt").is_ok());
        assert!(fs.resolve("web/local/../local/out.txt").is_ok());
        for escaping in ["../../etc/passwd", "/../x", "web/../../x", "web/local/etc/passwd"] {
            let refused = fs.resolve(escaping).expect_err(escaping);
            assert_eq!(refused.code, AgentErrorCode::Invalid, "{escaping}: {refused}");
            assert!(refused.message.contains("escapes the allocation directory"), "{refused}");
        }
        assert_eq!(fs.resolve("web/nope").expect_err("missing").code, AgentErrorCode::NotFound);
        assert_eq!(fs.readable("web/secrets/token").expect_err("secret").code, AgentErrorCode::Forbidden);
        let listed: Vec<String> = fs.list("/").expect("lists").into_iter().map(|file| file.name).collect();
        assert_eq!(listed, ["alloc", "web"]);
        let file = fs.stat("web/local/out.txt").expect("stats");
        assert_eq!((file.name.as_str(), file.size, file.is_dir), ("out.txt", 5, false));
        assert_eq!(fs.list("web/local/out.txt").expect_err("a file").code, AgentErrorCode::Invalid);
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn a_cursor_reads_from_either_end_within_its_limit_and_follows() {
        let dir = temp("cursor");
        let path = dir.join("web/local/out.txt");
        std::fs::write(&path, "0123456789").expect("writes");
        let mut at = FileCursor::open(path.clone(), 2, false, Some(5)).expect("opens");
        assert_eq!(at.read_more(3).expect("reads"), b"234");
        assert_eq!(at.read_more(100).expect("reads"), b"56");
        assert!(at.done());
        let mut tail = FileCursor::open(path.clone(), 3, true, None).expect("opens");
        assert_eq!(tail.read_more(100).expect("reads"), b"789");
        assert!(tail.read_more(100).expect("reads").is_empty());
        std::fs::write(&path, "0123456789ab").expect("appends");
        assert_eq!(tail.read_more(100).expect("reads"), b"ab", "follows what is appended");
        assert_eq!(tail.offset(), 12);
        assert!(FileCursor::open(dir.join("web"), 0, false, None).is_err(), "a directory is not read");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
