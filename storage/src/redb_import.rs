//! Reading the raft log an older build kept in one redb file
//! (`DATA_DIR/raft/log.redb`: a table `log` of index to entry bytes and a
//! table `meta` holding `vote`, `committed` and `purged`), so that
//! [`crate::DataDir::open_log`] can import it into the write-ahead log.
//! The only use of redb left.

use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, TableError};

const LOG: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("meta");

/// Everything an old log holds.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct OldLog {
    /// Its entries, by index.
    pub entries: Vec<(u64, Vec<u8>)>,
    /// The vote.
    pub vote: Option<Vec<u8>>,
    /// The committed position.
    pub committed: Option<Vec<u8>>,
    /// What its last purge recorded.
    pub purged: Option<Vec<u8>>,
}

/// Reads the old log at `path`. Opened read-write, as the old build did,
/// so that redb repairs a log a crash left.
pub(crate) fn read(path: &Path) -> Result<OldLog, redb::Error> {
    let db = Database::open(path)?;
    let txn = db.begin_read()?;
    let mut old = OldLog::default();
    match txn.open_table(LOG) {
        Ok(table) => {
            for row in table.iter()? {
                let (index, bytes) = row?;
                old.entries.push((index.value(), bytes.value().to_vec()));
            }
        }
        Err(TableError::TableDoesNotExist(_)) => {}
        Err(error) => return Err(error.into()),
    }
    match txn.open_table(META) {
        Ok(table) => {
            let get = |key: &str| -> Result<Option<Vec<u8>>, redb::Error> {
                Ok(table.get(key)?.map(|value| value.value().to_vec()))
            };
            old.vote = get("vote")?;
            old.committed = get("committed")?;
            old.purged = get("purged")?;
        }
        Err(TableError::TableDoesNotExist(_)) => {}
        Err(error) => return Err(error.into()),
    }
    Ok(old)
}

/// Writes `old` at `path` as the older build's `LogFile` did (its tables,
/// its keys), for the import's tests.
#[cfg(test)]
pub(crate) fn write(path: &Path, old: &OldLog) -> Result<(), redb::Error> {
    let db = Database::create(path)?;
    let txn = db.begin_write()?;
    {
        let mut log = txn.open_table(LOG)?;
        for (index, bytes) in &old.entries {
            log.insert(*index, bytes.as_slice())?;
        }
        let mut meta = txn.open_table(META)?;
        for (key, value) in [("vote", &old.vote), ("committed", &old.committed), ("purged", &old.purged)] {
            if let Some(value) = value {
                meta.insert(key, value.as_slice())?;
            }
        }
    }
    txn.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_old_log_reads_back_whole() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("log.redb");
        let old = OldLog {
            entries: (5..=9).map(|index| (index, vec![index as u8; 3])).collect(),
            vote: Some(b"vote".to_vec()),
            committed: None,
            purged: Some(b"4".to_vec()),
        };
        write(&path, &old).expect("writes");
        assert_eq!(read(&path).expect("reads"), old);
    }
}
