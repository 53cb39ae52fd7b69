//! openraft's own storage conformance suite against Drover's log store
//! (the write-ahead log, with its tail of appended entries) and state machine (the
//! engine's store with snapshot files), each built in a fresh directory.

use std::sync::Arc;

use openraft::testing::{StoreBuilder, Suite};
use replication::types::{StorageError, TypeConfig};
use replication::{LogStore, StateMachine};
use storage::{DataDir, FatalError, LogFile, SnapshotDir};

struct Fresh;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Fresh {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError> {
        let temp = tempfile::tempdir().expect("a temp dir");
        let dir = DataDir::new(temp.path());
        let fatal = Arc::new(|error: &FatalError| panic!("a write failed in the suite: {error}"));
        let log = LogStore::new(LogFile::open(&dir.log_path(), fatal.clone()).expect("the log opens"));
        let snapshots = SnapshotDir::open(&dir.snapshot_dir(), fatal).expect("the snapshot dir opens");
        let (machine, _) = StateMachine::open(snapshots).expect("the state machine opens");
        Ok((temp, log, machine))
    }
}

#[test]
fn openraft_storage_suite_passes() {
    Suite::test_all(Fresh).expect("the log store and state machine pass openraft's suite");
}
