//! The task drivers, one file (or folder) each: `raw_exec` (a process on
//! the host, run by an executor process so tasks outlive an agent restart;
//! `executor.rs` and `isolation.rs` are its parts) and `mock` (Nomad's
//! `mock_driver`, for tests and load).

pub mod executor;
pub mod isolation;
pub mod mock;
pub mod raw_exec;
