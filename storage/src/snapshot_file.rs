//! Snapshot files: versioned, checksummed, written so that a crash at any
//! moment leaves either the old set of snapshots or the new one.
//!
//! A file is `[magic "DROVSNAP"][format: u32 LE][meta length: u32 LE]
//! [meta][body][XXH3-64 of everything before: u64 LE][end "DROVSEND"]`.
//! The meta is the caller's (the replication layer's raft position); the
//! body is the engine's snapshot format. Files are named by the raft log
//! index they end at, `{index:020}.snap`.
//!
//! Writing (contract):
//! 1. write to `{index}.snap.tmp`, fsync the file;
//! 2. rename it to `{index}.snap`, fsync the directory;
//! 3. only then delete all but the newest [`KEEP`] snapshots (the log is
//!    kept from the older of them, so recovery can fall back to it).
//!
//! A failed write or fsync is fatal (crate docs). A leftover `.tmp` (a
//! crash during step 1) is deleted on open. Files and the directory are
//! owner-only ([`crate::FILE_MODE`], [`crate::DIR_MODE`]), the `.tmp` from
//! its creation on.
//!
//! Reading verifies the checksum over the whole file before anything
//! decodes it. A truncated or corrupt file is reported with its path and
//! why, and refused ([`SnapshotDir::refuse`]): from then on it is not
//! listed, so neither reading nor pruning counts it, but it stays on disk
//! as it was. Only once the server has started without it does
//! [`SnapshotDir::set_aside_refused`] rename it to `.corrupt`, so a start
//! that is refused changes nothing.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::Xxh3;

use parking_lot::Mutex;

use crate::data_dir::{create_private_dir, private_file, tighten};
use crate::{sync_dir, FatalError, FatalHandler, FILE_MODE};

/// Snapshots kept: the newest and the one before it.
pub const KEEP: usize = 2;

const MAGIC: &[u8; 8] = b"DROVSNAP";
const END: &[u8; 8] = b"DROVSEND";
const FILE_FORMAT: u32 = 1;
const HEADER_LEN: u64 = 16;
const TRAILER_LEN: u64 = 16;

/// A snapshot file on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// The file.
    pub path: PathBuf,
    /// The raft log index it ends at (from its name).
    pub index: u64,
    /// Its size in bytes.
    pub size: u64,
}

/// Why a snapshot file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Reading it failed.
    #[error("reading snapshot {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It is not a whole snapshot of this format.
    #[error("snapshot {path} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// A snapshot whose checksum was verified: its meta, and its body to read.
#[derive(Debug)]
pub struct VerifiedSnapshot {
    /// The file.
    pub info: SnapshotInfo,
    /// The caller's meta, as written.
    pub meta: Vec<u8>,
    body: BufReader<std::io::Take<File>>,
}

impl VerifiedSnapshot {
    /// The body, to decode.
    pub fn body(&mut self) -> &mut impl Read {
        &mut self.body
    }
}

/// The directory of snapshot files (module docs).
pub struct SnapshotDir {
    dir: PathBuf,
    fatal: FatalHandler,
    /// Files refused this run: not listed, not yet renamed (module docs).
    refused: Mutex<Vec<PathBuf>>,
}

impl std::fmt::Debug for SnapshotDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotDir").field("dir", &self.dir).finish_non_exhaustive()
    }
}

impl SnapshotDir {
    /// Opens (or creates) the directory, deleting what a crash left
    /// half-written and tightening what an older build left readable.
    pub fn open(dir: &Path, fatal: FatalHandler) -> std::io::Result<SnapshotDir> {
        create_private_dir(dir)?;
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.extension().is_some_and(|extension| extension == "tmp") {
                tracing::info!(path = %path.display(), "removing a snapshot left half-written by a crash");
                std::fs::remove_file(&path)?;
            } else if path.is_file() {
                tighten(&path, FILE_MODE)?;
            }
        }
        sync_dir(dir)?;
        Ok(SnapshotDir { dir: dir.to_path_buf(), fatal, refused: Mutex::new(Vec::new()) })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Writes the snapshot ending at raft index `index` (module docs):
    /// `meta`, then whatever `body` writes. A failure is fatal (crate docs)
    /// and also returned.
    pub fn write(
        &self,
        index: u64,
        meta: &[u8],
        body: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
    ) -> std::io::Result<SnapshotInfo> {
        let path = self.dir.join(format!("{index:020}.snap"));
        let tmp = path.with_extension("snap.tmp");
        self.fatal_on_error(&path, || {
            let file = private_file().write(true).create(true).truncate(true).open(&tmp)?;
            let mut out = Hashing { out: BufWriter::with_capacity(1 << 20, file), hash: Xxh3::new() };
            out.write_all(MAGIC)?;
            out.write_all(&FILE_FORMAT.to_le_bytes())?;
            out.write_all(&u32::try_from(meta.len()).map_err(std::io::Error::other)?.to_le_bytes())?;
            out.write_all(meta)?;
            body(&mut out)?;
            let digest = out.hash.digest();
            let mut file = out.out.into_inner().map_err(|error| error.into_error())?;
            file.write_all(&digest.to_le_bytes())?;
            file.write_all(END)?;
            file.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            sync_dir(&self.dir)
        })?;
        let size = std::fs::metadata(&path)?.len();
        self.prune()?;
        Ok(SnapshotInfo { path, index, size })
    }

    /// Copies a snapshot file from elsewhere (a backup, a leader's) in as
    /// the newest, ending at raft index `index`, after verifying it; written
    /// as [`SnapshotDir::write`] writes (module docs).
    pub fn import(&self, from: &Path, index: u64) -> Result<SnapshotInfo, SnapshotError> {
        let outside = SnapshotInfo { path: from.to_path_buf(), index, size: 0 };
        verify(&outside)?;
        let path = self.dir.join(format!("{index:020}.snap"));
        let tmp = path.with_extension("snap.tmp");
        let copied = self.fatal_on_error(&path, || {
            // Not `fs::copy`, which would copy the source's mode too.
            let mut copy = private_file().write(true).create(true).truncate(true).open(&tmp)?;
            std::io::copy(&mut File::open(from)?, &mut copy)?;
            copy.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            sync_dir(&self.dir)
        });
        let io = |source| SnapshotError::Io { path: path.clone(), source };
        copied.map_err(io)?;
        let size = std::fs::metadata(&path).map_err(io)?.len();
        self.prune().map_err(io)?;
        Ok(SnapshotInfo { path: path.clone(), index, size })
    }

    /// The snapshots here, newest first, but those refused.
    pub fn list(&self) -> std::io::Result<Vec<SnapshotInfo>> {
        let refused = self.refused.lock().clone();
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let path = entry.path();
            if path.extension().is_none_or(|extension| extension != "snap") || refused.contains(&path) {
                continue;
            }
            let Some(index) = path.file_stem().and_then(|stem| stem.to_str()).and_then(|stem| stem.parse().ok()) else {
                continue;
            };
            found.push(SnapshotInfo { path, index, size: entry.metadata()?.len() });
        }
        found.sort_by_key(|info| std::cmp::Reverse(info.index));
        Ok(found)
    }

    /// The newest snapshot whose checksum holds, and the newer ones that
    /// did not (each refused, so it is not tried again).
    pub fn newest_valid(&self) -> std::io::Result<(Option<VerifiedSnapshot>, Vec<SnapshotError>)> {
        let mut refused = Vec::new();
        for info in self.list()? {
            match verify(&info) {
                Ok(verified) => return Ok((Some(verified), refused)),
                Err(error) => {
                    tracing::error!(%error, "refusing a snapshot");
                    self.refuse(&info);
                    refused.push(error);
                }
            }
        }
        Ok((None, refused))
    }

    /// Refuses a snapshot that cannot be used: it is no longer listed, and
    /// left on disk as it is until [`SnapshotDir::set_aside_refused`].
    pub fn refuse(&self, info: &SnapshotInfo) {
        self.refused.lock().push(info.path.clone());
    }

    /// Renames each refused snapshot to `.corrupt`, where it is kept for a
    /// look but never read again. Call it once the server started without
    /// them (module docs).
    pub fn set_aside_refused(&self) -> std::io::Result<()> {
        let refused = std::mem::take(&mut *self.refused.lock());
        if refused.is_empty() {
            return Ok(());
        }
        for path in &refused {
            std::fs::rename(path, path.with_extension("snap.corrupt"))?;
        }
        sync_dir(&self.dir)
    }

    /// Deletes every snapshot but the newest [`KEEP`].
    fn prune(&self) -> std::io::Result<()> {
        let old = self.list()?.into_iter().skip(KEEP).collect::<Vec<_>>();
        if old.is_empty() {
            return Ok(());
        }
        for info in &old {
            std::fs::remove_file(&info.path)?;
        }
        sync_dir(&self.dir)
    }

    /// Runs `write`; an error is fatal (crate docs) and returned.
    fn fatal_on_error(&self, path: &Path, write: impl FnOnce() -> std::io::Result<()>) -> std::io::Result<()> {
        write().inspect_err(|error| {
            let what = format!("writing snapshot {}", path.display());
            (self.fatal)(&FatalError { what, source: std::io::Error::new(error.kind(), error.to_string()) });
        })
    }
}

/// Opens `info`'s file and verifies its checksum over the whole file,
/// before anything decodes it.
pub fn verify(info: &SnapshotInfo) -> Result<VerifiedSnapshot, SnapshotError> {
    let path = &info.path;
    let io = |source| SnapshotError::Io { path: path.clone(), source };
    let mut file = File::open(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    if size < HEADER_LEN + TRAILER_LEN {
        return Err(corrupt(path, &format!("{size} bytes is shorter than any snapshot")));
    }
    let mut header = [0u8; HEADER_LEN as usize];
    file.read_exact(&mut header).map_err(io)?;
    if &header[..8] != MAGIC {
        return Err(corrupt(path, "not a snapshot file (bad magic)"));
    }
    let format = u32::from_le_bytes(header[8..12].try_into().expect("four bytes"));
    if format != FILE_FORMAT {
        return Err(corrupt(path, &format!("file format {format} is not one this build reads ({FILE_FORMAT})")));
    }
    let meta_len = u64::from(u32::from_le_bytes(header[12..16].try_into().expect("four bytes")));
    if HEADER_LEN + meta_len + TRAILER_LEN > size {
        return Err(corrupt(path, "truncated (its meta runs past the end)"));
    }
    let mut trailer = [0u8; TRAILER_LEN as usize];
    file.seek(SeekFrom::Start(size - TRAILER_LEN)).map_err(io)?;
    file.read_exact(&mut trailer).map_err(io)?;
    if &trailer[8..] != END {
        return Err(corrupt(path, "truncated (no end marker)"));
    }
    let expected = u64::from_le_bytes(trailer[..8].try_into().expect("eight bytes"));
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    let mut hash = Xxh3::new();
    let mut chunk = vec![0u8; 1 << 20];
    let mut left = size - TRAILER_LEN;
    while left > 0 {
        let want = chunk.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let read = file.read(&mut chunk[..want]).map_err(io)?;
        if read == 0 {
            return Err(corrupt(path, "shorter than it was a moment ago"));
        }
        hash.update(&chunk[..read]);
        left -= read as u64;
    }
    if hash.digest() != expected {
        return Err(corrupt(path, "checksum mismatch"));
    }
    file.seek(SeekFrom::Start(HEADER_LEN)).map_err(io)?;
    let mut meta = vec![0u8; meta_len as usize];
    file.read_exact(&mut meta).map_err(io)?;
    let body_len = size - HEADER_LEN - meta_len - TRAILER_LEN;
    let body = BufReader::with_capacity(1 << 20, file.take(body_len));
    Ok(VerifiedSnapshot { info: SnapshotInfo { size, ..info.clone() }, meta, body })
}

fn corrupt(path: &Path, reason: &str) -> SnapshotError {
    SnapshotError::Corrupt { path: path.to_path_buf(), reason: reason.to_string() }
}

/// A writer that hashes what passes through it.
struct Hashing<W: Write> {
    out: W,
    hash: Xxh3,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let written = self.out.write(bytes)?;
        self.hash.update(&bytes[..written]);
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn dir() -> (tempfile::TempDir, SnapshotDir) {
        let temp = tempfile::tempdir().expect("temp dir");
        let snapshots = SnapshotDir::open(temp.path(), Arc::new(|_: &FatalError| {})).expect("opens");
        (temp, snapshots)
    }

    fn write(snapshots: &SnapshotDir, index: u64) -> SnapshotInfo {
        let body = vec![index as u8; 10_000];
        snapshots.write(index, format!("meta {index}").as_bytes(), |out| out.write_all(&body)).expect("writes")
    }

    fn read(mut verified: VerifiedSnapshot) -> (Vec<u8>, Vec<u8>) {
        let mut body = Vec::new();
        verified.body().read_to_end(&mut body).expect("reads");
        (verified.meta, body)
    }

    #[test]
    fn a_written_snapshot_reads_back_and_only_the_newest_two_are_kept() {
        let (_temp, snapshots) = dir();
        for index in [5, 10, 15] {
            write(&snapshots, index);
        }
        let listed: Vec<u64> = snapshots.list().expect("lists").iter().map(|info| info.index).collect();
        assert_eq!(listed, vec![15, 10]);
        let (newest, refused) = snapshots.newest_valid().expect("reads");
        assert!(refused.is_empty());
        let (meta, body) = read(newest.expect("a snapshot"));
        assert_eq!((meta, body), (b"meta 15".to_vec(), vec![15u8; 10_000]));
    }

    #[test]
    fn a_corrupt_or_truncated_snapshot_is_refused_and_the_older_one_used() {
        for damage in ["flip", "truncate"] {
            let (_temp, snapshots) = dir();
            write(&snapshots, 5);
            let newest = write(&snapshots, 10);
            let mut bytes = std::fs::read(&newest.path).expect("reads");
            match damage {
                "flip" => bytes[5_000] ^= 1,
                _ => bytes.truncate(bytes.len() - 100),
            }
            std::fs::write(&newest.path, &bytes).expect("damages");
            let (valid, refused) = snapshots.newest_valid().expect("reads");
            assert_eq!(refused.len(), 1, "{damage}");
            let shown = refused[0].to_string();
            assert!(shown.contains("00000000000000000010.snap") && shown.contains("corrupt"), "{shown}");
            assert_eq!(read(valid.expect("the older one")).0, b"meta 5".to_vec(), "{damage}");
            let listed: Vec<u64> = snapshots.list().expect("lists").iter().map(|info| info.index).collect();
            assert_eq!(listed, vec![5], "not tried again");
            assert_eq!(std::fs::read(&newest.path).expect("still there"), bytes, "left as it was until set aside");

            snapshots.set_aside_refused().expect("renames");
            assert!(!newest.path.exists());
            assert!(newest.path.with_extension("snap.corrupt").exists(), "kept aside for a look");
            let listed: Vec<u64> = snapshots.list().expect("lists").iter().map(|info| info.index).collect();
            assert_eq!(listed, vec![5]);
        }
    }

    #[test]
    fn a_refused_snapshot_is_neither_counted_nor_deleted_by_pruning() {
        let (_temp, snapshots) = dir();
        write(&snapshots, 5);
        let newest = write(&snapshots, 10);
        std::fs::write(&newest.path, b"DROVSNAP damaged").expect("damages");
        assert!(snapshots.newest_valid().expect("reads").0.is_some());
        write(&snapshots, 15);
        let listed: Vec<u64> = snapshots.list().expect("lists").iter().map(|info| info.index).collect();
        assert_eq!(listed, vec![15, 5], "the older good one is kept, the refused one not counted");
        assert!(newest.path.exists(), "kept for a look");
    }

    #[test]
    fn snapshot_files_and_their_directory_are_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |path: &Path| std::fs::metadata(path).expect("exists").permissions().mode() & 0o777;
        let (temp, snapshots) = dir();
        let written = write(&snapshots, 5);
        assert_eq!(mode(&written.path), 0o600);
        assert_eq!(mode(temp.path()), 0o700);
        let outside = temp.path().join("backup.bin");
        std::fs::copy(&written.path, &outside).expect("copies");
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o644)).expect("loosens");
        let imported = snapshots.import(&outside, 9).expect("imports");
        assert_eq!(mode(&imported.path), 0o600, "not the source's mode");
        // The temporary a snapshot is written through is owner-only from the start.
        snapshots
            .write(12, b"meta", |out| {
                let tmp = temp.path().join("00000000000000000012.snap.tmp");
                assert_eq!(mode(&tmp), 0o600);
                out.write_all(b"body")
            })
            .expect("writes");
    }

    #[test]
    fn a_half_written_snapshot_is_removed_on_open() {
        let temp = tempfile::tempdir().expect("temp dir");
        std::fs::write(temp.path().join("00000000000000000007.snap.tmp"), b"half").expect("writes");
        let snapshots = SnapshotDir::open(temp.path(), Arc::new(|_: &FatalError| {})).expect("opens");
        assert!(snapshots.list().expect("lists").is_empty());
        assert_eq!(std::fs::read_dir(temp.path()).expect("lists").count(), 0);
    }

    #[test]
    fn an_imported_snapshot_is_verified_first() {
        let (_source_temp, source) = dir();
        let exported = write(&source, 42);
        let (_temp, snapshots) = dir();
        let imported = snapshots.import(&exported.path, 42).expect("imports");
        assert_eq!(imported.index, 42);
        assert_eq!(read(snapshots.newest_valid().expect("reads").0.expect("there")).0, b"meta 42".to_vec());

        let bad = exported.path.with_extension("bad");
        std::fs::write(&bad, b"DROVSNAP not really").expect("writes");
        let error = snapshots.import(&bad, 50).expect_err("refused");
        assert!(matches!(error, SnapshotError::Corrupt { .. }), "{error}");
        assert_eq!(snapshots.list().expect("lists").len(), 1, "nothing written");
    }
}
