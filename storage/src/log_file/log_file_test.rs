//! Tests of the raft log (`log_file.rs`): its contract, rotation, purge,
//! truncation, torn tails and corruption, and a model-based property test.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use proptest::prelude::*;

use super::*;

fn ignore_fatal() -> FatalHandler {
    Arc::new(|_: &FatalError| {})
}

/// Runs a write and waits for its completion.
fn wait(write: impl FnOnce(Completion)) -> Result<(), LogError> {
    let (done, result) = std::sync::mpsc::channel();
    write(Box::new(move |outcome| {
        let _ = done.send(outcome);
    }));
    result.recv().expect("every write is answered")
}

fn entry(index: u64) -> (u64, Vec<u8>) {
    // Entries of differing lengths, so offsets are not all alike.
    (index, format!("entry {index} {}", "x".repeat((index % 7) as usize)).into_bytes())
}

fn entries(range: std::ops::RangeInclusive<u64>) -> Vec<(u64, Vec<u8>)> {
    range.map(entry).collect()
}

/// A log with 1 KiB segments.
fn open_small(path: &Path) -> LogFile {
    LogFile::open_with(path, ignore_fatal(), Options { segment_size: 1024, ..Options::default() }).expect("opens")
}

fn segments(path: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(path)
        .expect("lists")
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "wal"))
        .collect();
    found.sort();
    found
}

#[test]
fn writes_survive_a_reopen_and_reads_see_them_in_order() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("wal");
    let log = LogFile::open(&path, ignore_fatal()).expect("opens");
    wait(|done| log.append(entries(1..=10), done)).expect("appends");
    wait(|done| log.save_vote(b"vote".to_vec(), done)).expect("vote");
    wait(|done| log.truncate(8, done)).expect("truncates");
    wait(|done| log.purge(3, b"3".to_vec(), done)).expect("purges");
    wait(|done| log.save_committed(b"7".to_vec(), done)).expect("committed");
    // The last two writes needed no fsync; an append after them makes them durable.
    wait(|done| log.append(entries(8..=9), done)).expect("appends");
    log.close();

    let log = LogFile::open(&path, ignore_fatal()).expect("reopens");
    assert_eq!(log.range().expect("reads"), Some(LogRange { first: 4, last: 9 }));
    assert_eq!(log.read(5..7).expect("reads"), entries(5..=6));
    assert_eq!(log.read(..).expect("reads"), entries(4..=9));
    assert_eq!(log.read(0..=3).expect("reads"), Vec::new(), "purged");
    assert_eq!(log.last().expect("reads"), Some(entry(9)));
    assert_eq!(log.vote().expect("reads"), Some(b"vote".to_vec()));
    assert_eq!(log.committed().expect("reads"), Some(b"7".to_vec()));
    assert_eq!(log.purged().expect("reads"), Some(b"3".to_vec()));
}

#[test]
fn unsynced_writes_are_made_durable_by_close() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("wal");
    let log = LogFile::open(&path, ignore_fatal()).expect("opens");
    wait(|done| log.append(entries(1..=4), done)).expect("appends");
    wait(|done| log.save_committed(b"4".to_vec(), done)).expect("committed");
    wait(|done| log.purge(2, b"2".to_vec(), done)).expect("purges");
    log.close();
    let log = LogFile::open(&path, ignore_fatal()).expect("reopens");
    assert_eq!(log.committed().expect("reads"), Some(b"4".to_vec()));
    assert_eq!(log.range().expect("reads"), Some(LogRange { first: 3, last: 4 }));
}

#[test]
fn concurrent_appends_are_all_answered_in_order() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = LogFile::open(&dir.path().join("wal"), ignore_fatal()).expect("opens");
    let (done, answers) = std::sync::mpsc::channel();
    for index in 1..=200u64 {
        let done = done.clone();
        log.append(entries(index..=index), Box::new(move |result| done.send((index, result)).expect("test alive")));
    }
    let answered: Vec<u64> = (0..200)
        .map(|_| answers.recv().expect("answered"))
        .map(|(index, result)| {
            result.expect("durable");
            index
        })
        .collect();
    assert_eq!(answered, (1..=200).collect::<Vec<_>>(), "answered in the order queued");
    assert_eq!(log.range().expect("reads"), Some(LogRange { first: 1, last: 200 }));
    assert_eq!(log.read(..).expect("reads"), entries(1..=200));
}

#[test]
fn a_second_process_cannot_open_a_log_in_use() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("wal");
    let log = LogFile::open(&path, ignore_fatal()).expect("opens");
    let error = LogFile::open(&path, ignore_fatal()).expect_err("in use");
    assert!(error.to_string().contains(&path.display().to_string()) && error.to_string().contains("in use"), "{error}");
    log.close();
    LogFile::open(&path, ignore_fatal()).expect("opens once closed");
}

#[test]
fn a_write_after_close_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut log = LogFile::open(&dir.path().join("wal"), ignore_fatal()).expect("opens");
    log.stop_writer();
    assert!(matches!(wait(|done| log.append(entries(1..=1), done)), Err(LogError::Closed)));
}

#[test]
fn an_append_that_does_not_follow_the_last_entry_is_refused_and_the_log_goes_on() {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = LogFile::open(&dir.path().join("wal"), ignore_fatal()).expect("opens");
    wait(|done| log.append(entries(5..=6), done)).expect("any first index");
    for wrong in [entries(8..=8), entries(6..=7), vec![entry(7), entry(9)]] {
        let refused = wait(|done| log.append(wrong, done));
        assert!(matches!(&refused, Err(LogError::Refused(why)) if why.contains("does not follow")), "{refused:?}");
    }
    wait(|done| log.append(entries(7..=7), done)).expect("the right one");
    assert_eq!(log.read(..).expect("reads"), entries(5..=7));
}

#[test]
fn a_new_log_is_an_owner_only_directory_made_whole() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("wal");
    let log = LogFile::open(&path, ignore_fatal()).expect("opens");
    assert!(log.is_blank().expect("reads"));
    let mode = |path: &Path| std::fs::metadata(path).expect("exists").permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o700);
    assert_eq!(segments(&path).len(), 1);
    assert_eq!(mode(&segments(&path)[0]), 0o600);
    let names: Vec<_> =
        std::fs::read_dir(dir.path()).expect("lists").flatten().map(|entry| entry.file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("wal")], "no temporary left");
}

#[test]
fn reopen_after_rotation_across_several_segments_gives_every_entry_and_the_positions() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("wal");
    let log = open_small(&path);
    wait(|done| log.save_vote(b"vote".to_vec(), done)).expect("vote");
    for index in 1..=300 {
        wait(|done| log.append(entries(index..=index), done)).expect("appends");
        if index % 50 == 0 {
            wait(|done| log.save_committed(index.to_string().into_bytes(), done)).expect("committed");
        }
    }
    let before = segments(&path);
    assert!(before.len() > 5, "1 KiB segments rotate: {}", before.len());
    assert_eq!(log.read(..).expect("reads across segments"), entries(1..=300));
    log.close();

    let log = open_small(&path);
    assert_eq!(log.read(..).expect("reads"), entries(1..=300));
    assert_eq!(log.vote().expect("reads"), Some(b"vote".to_vec()));
    assert_eq!(log.committed().expect("reads"), Some(b"300".to_vec()));
    wait(|done| log.append(entries(301..=310), done)).expect("appends after a reopen");
    log.close();
    assert_eq!(open_small(&path).read(295..).expect("reads"), entries(295..=310));
}

#[test]
fn a_purge_deletes_whole_segments_and_the_vote_and_range_survive_a_reopen() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("wal");
    let log = open_small(&path);
    wait(|done| log.save_vote(b"vote".to_vec(), done)).expect("vote");
    wait(|done| log.save_committed(b"c".to_vec(), done)).expect("committed");
    for index in 1..=300 {
        wait(|done| log.append(entries(index..=index), done)).expect("appends");
    }
    let before = segments(&path);
    wait(|done| log.purge(250, b"250".to_vec(), done)).expect("purges");
    let after = segments(&path);
    assert!(after.len() < before.len() / 2, "whole segments deleted: {} of {}", after.len(), before.len());
    assert_eq!(after[..], before[before.len() - after.len()..], "the oldest ones");
    assert_eq!(log.read(..).expect("reads"), entries(251..=300));
    log.close();

    let log = open_small(&path);
    assert_eq!(log.range().expect("reads"), Some(LogRange { first: 251, last: 300 }));
    assert_eq!(log.read(..).expect("reads"), entries(251..=300));
    assert_eq!(log.vote().expect("reads"), Some(b"vote".to_vec()), "restated in a kept segment");
    assert_eq!(log.committed().expect("reads"), Some(b"c".to_vec()));
    assert_eq!(log.purged().expect("reads"), Some(b"250".to_vec()));

    // Purging everything keeps only the segment written to.
    wait(|done| log.purge(300, b"300".to_vec(), done)).expect("purges all");
    assert_eq!(segments(&path).len(), 1);
    wait(|done| log.append(entries(301..=302), done)).expect("appends after");
    log.close();
    let log = open_small(&path);
    assert_eq!(log.read(..).expect("reads"), entries(301..=302));
    assert_eq!(log.vote().expect("reads"), Some(b"vote".to_vec()));
    assert_eq!(log.purged().expect("reads"), Some(b"300".to_vec()));
}

#[test]
fn truncate_then_append_then_reopen_gives_the_new_entries() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("wal");
    let log = open_small(&path);
    wait(|done| log.append(entries(1..=100), done)).expect("appends");
    wait(|done| log.truncate(40, done)).expect("truncates");
    assert_eq!(log.range().expect("reads"), Some(LogRange { first: 1, last: 39 }));
    let replaced: Vec<(u64, Vec<u8>)> = (40..=60).map(|index| (index, format!("new {index}").into_bytes())).collect();
    wait(|done| log.append(replaced.clone(), done)).expect("appends again");
    log.close();

    let log = open_small(&path);
    let mut expected = entries(1..=39);
    expected.extend(replaced);
    assert_eq!(log.read(..).expect("reads"), expected);
    wait(|done| log.truncate(0, done)).expect("truncates all");
    log.close();
    assert_eq!(open_small(&path).range().expect("reads"), None);
}

/// A log of two segments and the last segment's path and length.
fn two_segment_log(path: &Path) -> (PathBuf, u64) {
    let log = open_small(path);
    for index in 1..=60 {
        wait(|done| log.append(entries(index..=index), done)).expect("appends");
    }
    log.close();
    let last = segments(path).pop().expect("a segment");
    let len = std::fs::metadata(&last).expect("exists").len();
    (last, len)
}

#[test]
fn a_torn_last_write_is_cut_and_every_complete_batch_kept() {
    for tear in ["cut mid-record", "garbage after", "zeros after", "a batch without its commit"] {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("wal");
        let (last, len) = two_segment_log(&path);
        let log = open_small(&path);
        let before = log.read(..).expect("reads");
        let last_index = log.range().expect("reads").expect("entries").last;
        log.close();
        let mut bytes = std::fs::read(&last).expect("reads");
        let whole = bytes.len();
        match tear {
            "cut mid-record" => {
                // One more batch, then cut in the middle of its entry.
                let log = open_small(&path);
                wait(|done| log.append(entries(last_index + 1..=last_index + 1), done)).expect("appends");
                log.close();
                bytes = std::fs::read(&last).expect("reads");
                assert!(bytes.len() > whole, "the batch went to this segment");
                bytes.truncate(whole + 12);
            }
            "garbage after" => bytes.extend((0..300u32).map(|n| (n * 7 + 3) as u8)),
            "zeros after" => bytes.extend([0u8; 4096]),
            _ => Record::Entry { index: last_index + 1, bytes: b"never committed" }.encode(&mut bytes),
        }
        std::fs::write(&last, &bytes).expect("tears");
        let log = open_small(&path);
        assert_eq!(log.read(..).expect("reads"), before, "{tear}: every complete batch is kept");
        assert_eq!(std::fs::metadata(&last).expect("exists").len(), len, "{tear}: cut at the last whole batch");
        wait(|done| log.append(entries(last_index + 1..=last_index + 1), done)).expect("appends after the cut");
        log.close();
        assert_eq!(open_small(&path).last().expect("reads"), Some(entry(last_index + 1)), "{tear}");
    }
}

#[test]
fn a_corrupt_record_followed_by_whole_batches_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("wal");
    let (last, _) = two_segment_log(&path);
    for segment in [segments(&path)[0].clone(), last] {
        let pristine = std::fs::read(&segment).expect("reads");
        let mut bytes = pristine.clone();
        bytes[HEADER_LEN as usize + 30] ^= 0x10;
        std::fs::write(&segment, &bytes).expect("corrupts");
        let error = LogFile::open(&path, ignore_fatal()).expect_err("refused").to_string();
        assert!(error.contains(&segment.display().to_string()) && error.contains("is corrupt at byte"), "{error}");
        assert_eq!(std::fs::read(&segment).expect("reads"), bytes, "nothing is cut");
        std::fs::write(&segment, &pristine).expect("repairs");
    }
    open_small(&path).close();
}

#[test]
fn a_missing_segment_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("wal");
    let log = open_small(&path);
    for index in 1..=200 {
        wait(|done| log.append(entries(index..=index), done)).expect("appends");
    }
    log.close();
    let found = segments(&path);
    assert!(found.len() >= 3);
    std::fs::remove_file(&found[1]).expect("deletes a middle segment");
    let error = LogFile::open(&path, ignore_fatal()).expect_err("refused").to_string();
    assert!(error.contains("a segment is missing") && error.contains(&found[2].display().to_string()), "{error}");
}

/// A disk whose fsync fails once told to.
struct FailingSync {
    fail: Arc<AtomicBool>,
}

impl Disk for FailingSync {
    fn write_all_at(&self, file: &File, bytes: &[u8], offset: u64) -> std::io::Result<()> {
        RealDisk.write_all_at(file, bytes, offset)
    }

    fn sync_data(&self, file: &File) -> std::io::Result<()> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("injected fsync failure"));
        }
        RealDisk.sync_data(file)
    }
}

#[test]
fn a_failed_fsync_stops_the_log_and_calls_the_fatal_handler_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fail = Arc::new(AtomicBool::new(false));
    let fatal_calls = Arc::new(AtomicUsize::new(0));
    let handler: FatalHandler = {
        let fatal_calls = fatal_calls.clone();
        Arc::new(move |error: &FatalError| {
            assert!(error.to_string().contains("injected fsync failure"), "{error}");
            fatal_calls.fetch_add(1, Ordering::SeqCst);
        })
    };
    let options = Options { disk: Arc::new(FailingSync { fail: fail.clone() }), ..Options::default() };
    let log = LogFile::open_with(&dir.path().join("wal"), handler, options).expect("opens");
    wait(|done| log.append(entries(1..=2), done)).expect("durable while fsync works");

    fail.store(true, Ordering::SeqCst);
    let failed = wait(|done| log.append(entries(3..=3), done));
    assert!(matches!(failed, Err(LogError::Stopped(_))), "{failed:?}");
    fail.store(false, Ordering::SeqCst);
    let later = wait(|done| log.append(entries(3..=3), done));
    assert!(matches!(later, Err(LogError::Stopped(_))), "no write is taken after a failed fsync: {later:?}");
    assert!(matches!(wait(|done| log.save_vote(vec![1], done)), Err(LogError::Stopped(_))));
    assert!(matches!(wait(|done| log.save_committed(vec![1], done)), Err(LogError::Stopped(_))));
    assert_eq!(fatal_calls.load(Ordering::SeqCst), 1);
    assert_eq!(log.range().expect("reads"), Some(LogRange { first: 1, last: 2 }), "the failed append is not there");
}

/// One write of the property test.
#[derive(Clone, Debug)]
enum Op {
    Append(u8),
    Truncate(u8),
    Purge(u8),
    Vote(u8),
    Committed(u8),
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u8..20).prop_map(Op::Append),
        1 => any::<u8>().prop_map(Op::Truncate),
        1 => any::<u8>().prop_map(Op::Purge),
        1 => any::<u8>().prop_map(Op::Vote),
        1 => any::<u8>().prop_map(Op::Committed),
        1 => Just(Op::Reopen),
    ]
}

/// What the log should hold.
#[derive(Debug, Default)]
struct Model {
    entries: BTreeMap<u64, Vec<u8>>,
    vote: Option<Vec<u8>>,
    committed: Option<Vec<u8>>,
    purged: Option<Vec<u8>>,
    /// The index the next append starts at.
    next: u64,
}

impl Model {
    /// Turns an offset drawn by the strategy into an index near the log's.
    fn index(&self, offset: u8) -> u64 {
        let first = self.entries.keys().next().copied().unwrap_or(self.next);
        first + u64::from(offset) % (self.next - first + 2)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn any_sequence_of_writes_and_reopens_reads_back_as_the_model_says(ops in proptest::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("wal");
        let mut log = LogFile::open_with(&path, ignore_fatal(), Options { segment_size: 512, ..Options::default() })
            .expect("opens");
        let mut model = Model { next: 1, ..Model::default() };
        for (step, op) in ops.into_iter().enumerate() {
            match op {
                Op::Append(count) => {
                    let batch: Vec<(u64, Vec<u8>)> = (model.next..model.next + u64::from(count))
                        .map(|index| (index, format!("{step}:{index}").into_bytes()))
                        .collect();
                    model.entries.extend(batch.iter().cloned());
                    model.next += u64::from(count);
                    wait(|done| log.append(batch, done)).expect("appends");
                }
                Op::Truncate(offset) => {
                    let from = model.index(offset);
                    model.entries.split_off(&from);
                    // An empty log takes any index next; keep appending near where it was.
                    model.next = model.entries.keys().next_back().map_or(model.next.min(from).max(1), |last| last + 1);
                    wait(|done| log.truncate(from, done)).expect("truncates");
                }
                Op::Purge(offset) => {
                    let upto = model.index(offset).min(model.next - 1);
                    model.entries = model.entries.split_off(&(upto + 1));
                    model.purged = Some(upto.to_le_bytes().to_vec());
                    wait(|done| log.purge(upto, upto.to_le_bytes().to_vec(), done)).expect("purges");
                }
                Op::Vote(vote) => {
                    model.vote = Some(vec![vote]);
                    wait(|done| log.save_vote(vec![vote], done)).expect("votes");
                }
                Op::Committed(committed) => {
                    model.committed = Some(vec![committed]);
                    wait(|done| log.save_committed(vec![committed], done)).expect("commits");
                }
                Op::Reopen => {
                    log.close();
                    log = LogFile::open_with(&path, ignore_fatal(), Options { segment_size: 512, ..Options::default() })
                        .expect("reopens");
                }
            }
            let expected: Vec<(u64, Vec<u8>)> = model.entries.clone().into_iter().collect();
            prop_assert_eq!(log.read(..).expect("reads"), expected, "after step {}", step);
            let range = model.entries.keys().next().zip(model.entries.keys().next_back());
            prop_assert_eq!(log.range().expect("reads"), range.map(|(first, last)| LogRange { first: *first, last: *last }));
            prop_assert_eq!(log.vote().expect("reads"), model.vote.clone());
            prop_assert_eq!(log.committed().expect("reads"), model.committed.clone());
            prop_assert_eq!(log.purged().expect("reads"), model.purged.clone());
        }
        log.close();
    }
}
