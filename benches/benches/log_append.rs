//! Appending to the raft log: a batch of N entries of 512 bytes, answered
//! once durable (one fsync), for N in 1, 16 and 256. The log lives under
//! the target directory, on the disk a server's data dir would be on (a
//! tmpfs would make the fsync free).
//!
//! ```sh
//! CARGO_TARGET_DIR=target cargo bench -p benches --bench log_append
//! ```

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use storage::{Completion, FatalError, LogFile, LogRange};

const ENTRY_BYTES: usize = 512;

/// Appends `entries` and waits until they are durable.
fn append_durably(log: &LogFile, entries: Vec<(u64, Vec<u8>)>) {
    let (done, answer) = std::sync::mpsc::channel();
    let done: Completion = Box::new(move |result| {
        let _ = done.send(result);
    });
    log.append(entries, done);
    answer.recv().expect("every write is answered").expect("durable");
}

fn append(c: &mut Criterion) {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| "target".into(), std::path::PathBuf::from);
    std::fs::create_dir_all(&target).expect("the target directory");
    let mut group = c.benchmark_group("log_append");
    for batch in [1u64, 16, 256] {
        let dir = tempfile::tempdir_in(&target).expect("a directory on the target's disk");
        let log = LogFile::open(&dir.path().join("log"), Arc::new(|error: &FatalError| panic!("{error}")))
            .expect("the log opens");
        let payload = vec![0x5a; ENTRY_BYTES];
        let mut next = 1u64;
        group.throughput(Throughput::Elements(batch));
        group.bench_with_input(BenchmarkId::from_parameter(batch), &batch, |b, &batch| {
            b.iter(|| {
                let entries = (next..next + batch).map(|index| (index, payload.clone())).collect();
                append_durably(&log, entries);
                next += batch;
            });
        });
        // The workload did its work: every batch is in the log.
        assert_eq!(log.range().expect("reads"), Some(LogRange { first: 1, last: next - 1 }));
        assert_eq!(log.read(next - 1..next).expect("reads")[0].1, payload);
        log.close();
    }
    group.finish();
}

criterion_group!(benches, append);
criterion_main!(benches);
