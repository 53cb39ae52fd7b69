//! Files inside a directory a task can write to, reached without ever
//! following a link out of it: the agent writes and reads a task's
//! template files there as root, while the task (a container, say) may
//! plant symbolic links or FIFOs in the same directory at any moment.
//!
//! 1. A path is walked one component at a time from a handle on the root
//!    (`openat` with `O_NOFOLLOW | O_DIRECTORY`), so a link anywhere on the
//!    way is refused, not followed, and nothing can be swapped between a
//!    check and the use: every step uses the handle the last one opened.
//! 2. A write goes to a new temporary file in the final directory
//!    (`O_CREAT | O_EXCL | O_NOFOLLOW`), is synced, then renamed over the
//!    name, all relative to that directory's handle.
//! 3. A read opens the final name with `O_NOFOLLOW | O_NONBLOCK`, takes
//!    only a regular file (never a FIFO or a device, which could block or
//!    never end) and at most [`MAX_READ`] bytes of it.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Component, Path};

use rustix::fs::{Mode, OFlags, CWD};
use rustix::io::Errno;

/// The most a read takes: a template or an environment file is small.
pub const MAX_READ: u64 = 4 << 20;

/// Why a file beneath the root could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum BeneathError {
    /// A component of the path is a symbolic link (or not a directory).
    #[error("it leads out of the task's directory through a symbolic link")]
    Link,
    /// The path names something other than plain components below the root.
    #[error("it is not a plain path below the task's directory")]
    NotBelow,
    /// The file is not a regular file.
    #[error("it is not a regular file")]
    NotRegular,
    /// The file is larger than [`MAX_READ`].
    #[error("it is larger than {MAX_READ} bytes")]
    TooLarge,
    /// Another I/O error.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl From<Errno> for BeneathError {
    fn from(errno: Errno) -> BeneathError {
        match errno {
            Errno::LOOP | Errno::NOTDIR => BeneathError::Link,
            other => BeneathError::Io(other.into()),
        }
    }
}

/// The directory `relative` below `root` (module docs, 1), made when
/// missing if `create`.
fn open_dir(root: &Path, relative: &Path, create: bool) -> Result<OwnedFd, BeneathError> {
    let flags = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY;
    let mut dir = rustix::fs::openat(CWD, root, flags, Mode::empty())?;
    for component in relative.components() {
        let Component::Normal(name) = component else { return Err(BeneathError::NotBelow) };
        dir = match rustix::fs::openat(&dir, name, flags, Mode::empty()) {
            Ok(next) => next,
            Err(Errno::NOENT) if create => {
                match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(errno) => return Err(errno.into()),
                }
                rustix::fs::openat(&dir, name, flags, Mode::empty())?
            }
            Err(errno) => return Err(errno.into()),
        };
    }
    Ok(dir)
}

/// `relative`'s directory and file name.
fn split(relative: &Path) -> Result<(&Path, &std::ffi::OsStr), BeneathError> {
    let name = relative.file_name().ok_or(BeneathError::NotBelow)?;
    Ok((relative.parent().unwrap_or(Path::new("")), name))
}

/// Writes `text` at `relative` below `root` with `mode` (module docs, 2),
/// making its directories.
pub fn write(root: &Path, relative: &Path, text: &str, mode: u32) -> Result<(), BeneathError> {
    write_bytes(root, relative, text.as_bytes(), mode)
}

/// Writes `bytes` at `relative` below `root` with `mode`, as [`write()`].
pub fn write_bytes(root: &Path, relative: &Path, bytes: &[u8], mode: u32) -> Result<(), BeneathError> {
    let (parent, name) = split(relative)?;
    let dir = open_dir(root, parent, true)?;
    let temporary = format!(".{}.{:016x}.tmp", name.to_string_lossy(), rand::random::<u64>());
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(&dir, temporary.as_str(), flags, Mode::from_raw_mode(mode))?;
    let written = (|| -> Result<(), BeneathError> {
        // The mode whatever the agent's umask.
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))?;
        let mut file = std::fs::File::from(fd);
        file.write_all(bytes)?;
        file.sync_all()?;
        rustix::fs::renameat(&dir, temporary.as_str(), &dir, name)?;
        Ok(())
    })();
    if written.is_err() {
        let _ = rustix::fs::unlinkat(&dir, temporary.as_str(), rustix::fs::AtFlags::empty());
    }
    written
}

/// The text at `relative` below `root` (module docs, 3).
pub fn read(root: &Path, relative: &Path) -> Result<String, BeneathError> {
    let (parent, name) = split(relative)?;
    let dir = open_dir(root, parent, false)?;
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    read_regular(rustix::fs::openat(&dir, name, flags, Mode::empty())?)
}

/// The text of the file at `path`, which may be anywhere (a raw_exec
/// task's `source`, read with the agent's rights), links followed: only a
/// regular file, at most [`MAX_READ`] bytes.
pub fn read_anywhere(path: &Path) -> Result<String, BeneathError> {
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC;
    read_regular(rustix::fs::openat(CWD, path, flags, Mode::empty())?)
}

fn read_regular(fd: OwnedFd) -> Result<String, BeneathError> {
    let stat = rustix::fs::fstat(&fd)?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(BeneathError::NotRegular);
    }
    if u64::try_from(stat.st_size).unwrap_or(u64::MAX) > MAX_READ {
        return Err(BeneathError::TooLarge);
    }
    let mut text = String::new();
    std::fs::File::from(fd).take(MAX_READ).read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_and_fifos_are_refused_and_regular_files_read() {
        let root = tempfile::tempdir().expect("tempdir");
        let task = root.path().join("task");
        std::fs::create_dir_all(task.join("local")).expect("dirs");
        write(&task, Path::new("local/new/dir/file"), "text", 0o600).expect("written, directories made");
        assert_eq!(read(&task, Path::new("local/new/dir/file")).expect("read"), "text");
        let outside = root.path().join("outside");
        std::fs::create_dir_all(&outside).expect("outside");
        std::fs::write(outside.join("secret"), "secret").expect("secret");
        std::os::unix::fs::symlink(&outside, task.join("local/dir-link")).expect("link");
        std::os::unix::fs::symlink(outside.join("secret"), task.join("local/file-link")).expect("link");
        assert!(matches!(write(&task, Path::new("local/dir-link/sub/x"), "x", 0o644), Err(BeneathError::Link)));
        assert!(!outside.join("sub").exists(), "no directory made through the link");
        assert!(matches!(read(&task, Path::new("local/dir-link/secret")), Err(BeneathError::Link)));
        assert!(matches!(read(&task, Path::new("local/file-link")), Err(BeneathError::Link)));
        rustix::fs::mknodat(CWD, task.join("local/fifo"), rustix::fs::FileType::Fifo, Mode::from_raw_mode(0o600), 0)
            .expect("a FIFO");
        assert!(matches!(read(&task, Path::new("local/fifo")), Err(BeneathError::NotRegular)), "never blocks");
        assert!(matches!(read_anywhere(&task.join("local/fifo")), Err(BeneathError::NotRegular)));
        assert!(matches!(read(&task, Path::new("../outside/secret")), Err(BeneathError::NotBelow)));
    }
}
