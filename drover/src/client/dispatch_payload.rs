//! A dispatched job's payload, delivered (Nomad's dispatch hook): before
//! a task with a `dispatch_payload { file }` block first starts, the agent
//! writes its job's payload, decompressed, to `local/<file>` in the task's
//! directory. The write goes through `beneath.rs`, so a link the task
//! planted cannot lead it out of the directory; the file's name was
//! checked at submission (`structs/dispatch.rs`).

use std::path::Path;

use engine::structs::{decompress_payload, Allocation, Task};

use super::alloc_dir::AllocDir;
use super::beneath;

/// The mode of the payload file (Nomad writes it 0666 less the umask).
const PAYLOAD_MODE: u32 = 0o644;

/// Writes the payload of `alloc`'s job for `task`, when the task asks for
/// it; why it could not, otherwise.
pub fn write_payload(dir: &AllocDir, alloc: &Allocation, task: &Task) -> Result<(), String> {
    let Some(block) = &task.dispatch_payload else { return Ok(()) };
    let payload = decompress_payload(&alloc.job.payload)
        .map_err(|error| format!("the dispatched payload does not decompress: {error}"))?;
    let relative = block.task_path();
    beneath::write_bytes(&dir.task_dir(&task.name), Path::new(&relative), &payload, PAYLOAD_MODE)
        .map_err(|error| format!("writing the dispatched payload to {relative}: {error}"))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use engine::structs::{compress_payload, AllocId, DispatchPayloadConfig, EvalId, Job, JobType, NodeId, Resources};

    use super::*;

    #[test]
    fn the_payload_lands_decompressed_in_local() {
        let data = tempfile::tempdir().expect("dir");
        let mut job = Job::new_simple("work/dispatch-1-00000001", JobType::Batch, 1, Resources::new(10, 10, 0));
        job.payload = compress_payload(b"the input");
        job.task_groups[0].tasks[0].dispatch_payload = Some(DispatchPayloadConfig { file: "in/put.txt".into() });
        let job = Arc::new(job);
        let alloc = Allocation::new_placement(&job, "group", 0, NodeId::from_u128(1), EvalId::from_u128(1));
        let dir = AllocDir::new(data.path(), AllocId::from_u128(7));
        dir.build(["task"]).expect("builds");
        write_payload(&dir, &alloc, &job.task_groups[0].tasks[0]).expect("writes");
        let written = std::fs::read(dir.task_local_dir("task").join("in/put.txt")).expect("written");
        assert_eq!(written, b"the input");
    }
}
