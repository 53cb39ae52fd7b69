//! One segment file of the raft log's write-ahead log ([`crate::LogFile`]):
//! its name and header, its records and batches, and reading it back.
//!
//! ```text
//! segment  = header batch*
//! header   = "DRVWAL01" first_sequence:u64            (16 bytes)
//! batch    = record* commit
//! record   = len:u32 crc:u32 kind:u8 payload[len]     (crc: CRC-32 of kind and payload)
//! ```
//!
//! Integers are little-endian. Records are numbered by a sequence that runs
//! on across segments; a segment is named by the sequence of its first
//! record (`{:020}.wal`), so the next segment's name is this one's plus the
//! number of records it holds, which shows a lost segment or a segment cut
//! short at a record boundary (no checksum would).
//!
//! Payloads by kind: an entry is its index (u64) and its bytes; the vote
//! and the committed position are their bytes; a purge is the index it
//! purged up to (u64) and the caller's bytes; a truncation is the index it
//! removes from (u64); a commit is the byte length of the batch before it
//! (u64). One batch is one write followed by one fsync, and is whole only
//! if every record checks and it ends with its commit: the writer writes a
//! batch only after the one before it was synced, so only the last batch
//! can be torn by a crash, and a whole batch after a damaged one proves the
//! damaged one was once synced, i.e. corruption.

use std::fmt;

/// The first bytes of every segment.
pub(crate) const MAGIC: [u8; 8] = *b"DRVWAL01";
/// Magic and first sequence.
pub(crate) const HEADER_LEN: u64 = 16;
/// Length, checksum and kind.
pub(crate) const RECORD_HEADER_LEN: usize = 9;

/// The name of the segment whose first record has sequence `first`.
pub(crate) fn segment_name(first: u64) -> String {
    format!("{first:020}.wal")
}

/// The first sequence of the segment named `name`, if it is a segment's name.
pub(crate) fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".wal")?;
    if digits.len() != 20 || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The header of the segment whose first record has sequence `first`.
pub(crate) fn header(first: u64) -> [u8; HEADER_LEN as usize] {
    let mut header = [0; HEADER_LEN as usize];
    header[..8].copy_from_slice(&MAGIC);
    header[8..].copy_from_slice(&first.to_le_bytes());
    header
}

/// What a record says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Record<'a> {
    /// A log entry.
    Entry { index: u64, bytes: &'a [u8] },
    /// The vote.
    Vote(&'a [u8]),
    /// The committed position.
    Committed(&'a [u8]),
    /// Every entry up to `upto` is gone; `bytes` describe the last one.
    Purged { upto: u64, bytes: &'a [u8] },
    /// Every entry from `from` on is gone.
    Truncate { from: u64 },
    /// The end of a batch of `batch_len` bytes.
    Commit { batch_len: u64 },
}

const ENTRY: u8 = 1;
const VOTE: u8 = 2;
const COMMITTED: u8 = 3;
const PURGED: u8 = 4;
const TRUNCATE: u8 = 5;
const COMMIT: u8 = 6;

impl Record<'_> {
    /// Appends the record to `buffer`.
    pub(crate) fn encode(&self, buffer: &mut Vec<u8>) {
        let (kind, head, body): (u8, Option<u64>, &[u8]) = match *self {
            Record::Entry { index, bytes } => (ENTRY, Some(index), bytes),
            Record::Vote(bytes) => (VOTE, None, bytes),
            Record::Committed(bytes) => (COMMITTED, None, bytes),
            Record::Purged { upto, bytes } => (PURGED, Some(upto), bytes),
            Record::Truncate { from } => (TRUNCATE, Some(from), &[]),
            Record::Commit { batch_len } => (COMMIT, Some(batch_len), &[]),
        };
        let head = head.map(u64::to_le_bytes);
        let head: &[u8] = head.as_ref().map_or(&[], |head| head.as_slice());
        let len = u32::try_from(head.len() + body.len()).expect("a record is smaller than 4 GiB");
        let mut crc = crc32fast::Hasher::new();
        crc.update(&[kind]);
        crc.update(head);
        crc.update(body);
        buffer.extend_from_slice(&len.to_le_bytes());
        buffer.extend_from_slice(&crc.finalize().to_le_bytes());
        buffer.push(kind);
        buffer.extend_from_slice(head);
        buffer.extend_from_slice(body);
    }

    /// The payload length of an entry record holding `bytes`.
    pub(crate) fn entry_len(bytes: &[u8]) -> usize {
        8 + bytes.len()
    }
}

/// Why the record at an offset does not read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum BadRecord {
    /// The file ends inside it.
    Short,
    /// Its checksum does not match.
    Checksum,
    /// Its kind or payload makes no sense (a zeroed length among them).
    Malformed,
}

impl fmt::Display for BadRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BadRecord::Short => "the file ends inside a record",
            BadRecord::Checksum => "a record's checksum does not match",
            BadRecord::Malformed => "a record's kind or length makes no sense",
        })
    }
}

/// The record at `pos` in `bytes` and the offset after it.
pub(crate) fn record_at(bytes: &[u8], pos: usize) -> Result<(Record<'_>, usize), BadRecord> {
    let header = bytes.get(pos..pos + RECORD_HEADER_LEN).ok_or(BadRecord::Short)?;
    let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
    let kind = header[8];
    if !(ENTRY..=COMMIT).contains(&kind) {
        return Err(BadRecord::Malformed);
    }
    let start = pos + RECORD_HEADER_LEN;
    let payload = bytes.get(start..start + len).ok_or(BadRecord::Short)?;
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&[kind]);
    hasher.update(payload);
    if hasher.finalize() != crc {
        return Err(BadRecord::Checksum);
    }
    Ok((decode(kind, payload).ok_or(BadRecord::Malformed)?, start + len))
}

fn decode(kind: u8, payload: &[u8]) -> Option<Record<'_>> {
    let head = || payload.get(..8).map(|head| u64::from_le_bytes(head.try_into().expect("8 bytes")));
    let exactly_head = || head().filter(|_| payload.len() == 8);
    Some(match kind {
        ENTRY => Record::Entry { index: head()?, bytes: &payload[8..] },
        VOTE => Record::Vote(payload),
        COMMITTED => Record::Committed(payload),
        PURGED => Record::Purged { upto: head()?, bytes: &payload[8..] },
        TRUNCATE => Record::Truncate { from: exactly_head()? },
        COMMIT => Record::Commit { batch_len: exactly_head()? },
        _ => return None,
    })
}

/// A whole batch read back.
struct Batch<'a> {
    /// Its records with their offsets, the commit left out.
    records: Vec<(u64, Record<'a>)>,
    /// The offset after it.
    end: usize,
    /// How many records it has, the commit included.
    count: u64,
}

/// The whole batch starting at `pos`, or where and why it is not whole.
fn batch_at(bytes: &[u8], pos: usize) -> Result<Batch<'_>, (usize, BadRecord)> {
    let mut records = Vec::new();
    let mut at = pos;
    loop {
        let (record, end) = record_at(bytes, at).map_err(|bad| (at, bad))?;
        if let Record::Commit { batch_len } = record {
            if batch_len != (at - pos) as u64 {
                return Err((at, BadRecord::Malformed));
            }
            let count = records.len() as u64 + 1;
            return Ok(Batch { records, end, count });
        }
        records.push((at as u64, record));
        at = end;
    }
}

/// Whether a whole batch starts anywhere after `pos`: looks for commit
/// records whose batch starts after `pos` and checks that batch.
fn whole_batch_after(bytes: &[u8], pos: usize) -> Option<usize> {
    let commit_len = RECORD_HEADER_LEN + 8;
    (pos + 1..=bytes.len().saturating_sub(commit_len)).find_map(|at| {
        let looks_like_commit = bytes[at..at + 4] == 8u32.to_le_bytes() && bytes[at + 8] == COMMIT;
        if !looks_like_commit {
            return None;
        }
        let Ok((Record::Commit { batch_len }, _)) = record_at(bytes, at) else { return None };
        let start = at.checked_sub(usize::try_from(batch_len).ok()?)?;
        (start > pos && batch_at(bytes, start).is_ok()).then_some(start)
    })
}

/// A segment read back.
#[derive(Debug)]
pub(crate) struct Scanned<'a> {
    /// Every record of its whole batches (commits left out), in order.
    pub records: Vec<(u64, Record<'a>)>,
    /// How many records it holds, commits included.
    pub count: u64,
    /// The offset after its last whole batch.
    pub end: u64,
    /// How many bytes of a torn last batch follow `end` (0 if none).
    pub torn: u64,
}

/// Where and why a segment is corrupt.
#[derive(Debug)]
pub(crate) struct Corrupt {
    /// The byte offset in the segment.
    pub offset: u64,
    /// What is wrong there.
    pub why: String,
}

/// Reads a segment whose name says its first sequence is `first`. A
/// damaged last batch of the `last` segment is a torn write (module docs)
/// and is reported in [`Scanned::torn`]; any other damage is [`Corrupt`].
pub(crate) fn scan(bytes: &[u8], first: u64, last: bool) -> Result<Scanned<'_>, Corrupt> {
    let corrupt = |offset: usize, why: String| Corrupt { offset: offset as u64, why };
    if bytes.len() < HEADER_LEN as usize || bytes[..8] != MAGIC {
        return Err(corrupt(0, "it does not start with a segment header".into()));
    }
    let named = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    if named != first {
        return Err(corrupt(8, format!("its header says its first record is {named}, its name says {first}")));
    }
    let mut scanned = Scanned { records: Vec::new(), count: 0, end: HEADER_LEN, torn: 0 };
    let mut pos = HEADER_LEN as usize;
    while pos < bytes.len() {
        match batch_at(bytes, pos) {
            Ok(batch) => {
                scanned.records.extend(batch.records);
                scanned.count += batch.count;
                pos = batch.end;
            }
            Err((at, bad)) if !last => {
                return Err(corrupt(at, format!("{bad}, in a segment that is not the last")));
            }
            Err((at, bad)) => {
                if let Some(whole) = whole_batch_after(bytes, pos) {
                    return Err(corrupt(at, format!("{bad}, and a whole batch follows at byte {whole}")));
                }
                scanned.torn = (bytes.len() - pos) as u64;
                break;
            }
        }
        scanned.end = pos as u64;
    }
    Ok(scanned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(batches: &[&[Record<'_>]]) -> Vec<u8> {
        let mut bytes = header(7).to_vec();
        for batch in batches {
            let start = bytes.len();
            batch.iter().for_each(|record| record.encode(&mut bytes));
            Record::Commit { batch_len: (bytes.len() - start) as u64 }.encode(&mut bytes);
        }
        bytes
    }

    #[test]
    fn every_kind_of_record_reads_back_as_written() {
        let records = [
            Record::Entry { index: 3, bytes: b"three" },
            Record::Vote(b"vote"),
            Record::Committed(b""),
            Record::Purged { upto: 2, bytes: b"two" },
            Record::Truncate { from: 9 },
        ];
        let bytes = segment(&[&records[..2], &records[2..]]);
        let scanned = scan(&bytes, 7, true).expect("whole");
        let read: Vec<Record<'_>> = scanned.records.iter().map(|(_, record)| *record).collect();
        assert_eq!(read, records);
        assert_eq!((scanned.count, scanned.end, scanned.torn), (7, bytes.len() as u64, 0));
    }

    #[test]
    fn names_are_twenty_digits_and_nothing_else_is_a_segment() {
        assert_eq!(segment_name(42), "00000000000000000042.wal");
        assert_eq!(parse_segment_name(&segment_name(42)), Some(42));
        for other in ["42.wal", "00000000000000000042.wal.tmp", "0000000000000000004x.wal", "lock"] {
            assert_eq!(parse_segment_name(other), None, "{other}");
        }
    }

    #[test]
    fn a_batch_without_its_commit_is_torn_in_the_last_segment_and_corrupt_elsewhere() {
        let whole = segment(&[&[Record::Vote(b"a")]]);
        let mut bytes = whole.clone();
        Record::Entry { index: 1, bytes: b"uncommitted" }.encode(&mut bytes);
        let scanned = scan(&bytes, 7, true).expect("a torn tail");
        assert_eq!((scanned.end, scanned.torn), (whole.len() as u64, (bytes.len() - whole.len()) as u64));
        assert_eq!(scanned.records.len(), 1);
        let error = scan(&bytes, 7, false).expect_err("not the last segment");
        assert_eq!(error.offset, whole.len() as u64 + 28, "the file ends inside the commit after the entry: {error:?}");
    }

    #[test]
    fn a_damaged_batch_followed_by_a_whole_one_is_corrupt() {
        let bytes = segment(&[&[Record::Vote(b"a")], &[Record::Vote(b"b")], &[Record::Vote(b"c")]]);
        let mut damaged = bytes.clone();
        damaged[HEADER_LEN as usize + 40] ^= 1;
        let error = scan(&damaged, 7, true).expect_err("corrupt");
        assert!(error.why.contains("whole batch follows"), "{error:?}");
    }

    #[test]
    fn a_header_that_disagrees_with_the_name_is_corrupt() {
        let bytes = segment(&[]);
        assert!(scan(&bytes, 8, true).expect_err("misnamed").why.contains("its name says 8"));
        assert!(scan(&bytes[..10], 7, true).is_err(), "a short header");
    }
}
