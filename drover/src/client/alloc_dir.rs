//! An allocation's directories on its client, laid out as Nomad's so its
//! job files and habits carry over:
//!
//! ```text
//! <data_dir>/alloc/<alloc_id>/
//!     alloc/            shared by the allocation's tasks ($DROVER_ALLOC_DIR)
//!         logs/         <task>.stdout.N and <task>.stderr.N, rotated
//!         data/  tmp/
//!     <task>/           the task's own ($DROVER_TASK_DIR is <task>/local)
//!         local/  secrets/ (0700)  tmp/
//! <data_dir>/client/allocs/<alloc_id>/
//!     state.json        what the agent needs to re-attach (see alloc_runner)
//!     <task>.launch.json, <task>.exit.json, <task>.executor.log
//! ```
//!
//! The second tree is the agent's own and stays out of the tasks' sight.
//! Both are removed together when the allocation is garbage collected
//! (the rule is in `agent.rs`: the servers no longer list it, or it is one
//! of the oldest terminal allocations beyond `gc_max_allocs`).

use std::path::{Path, PathBuf};

use engine::structs::AllocId;

/// The directories of one allocation.
#[derive(Clone, Debug)]
pub struct AllocDir {
    /// `<data_dir>/alloc/<alloc_id>`: what the tasks see.
    root: PathBuf,
    /// `<data_dir>/client/allocs/<alloc_id>`: the agent's own files.
    client: PathBuf,
}

impl AllocDir {
    /// The directories of `alloc_id` under `data_dir` (nothing is created).
    pub fn new(data_dir: &Path, alloc_id: AllocId) -> AllocDir {
        let id = alloc_id.to_string();
        AllocDir { root: data_dir.join("alloc").join(&id), client: data_dir.join("client").join("allocs").join(&id) }
    }

    /// Every allocation that has an agent directory under `data_dir`.
    pub fn existing(data_dir: &Path) -> Vec<AllocId> {
        let Ok(entries) = std::fs::read_dir(data_dir.join("client").join("allocs")) else { return Vec::new() };
        entries.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<uuid::Uuid>().ok()).map(AllocId).collect()
    }

    /// The allocation's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `alloc/`, shared by its tasks.
    pub fn shared_dir(&self) -> PathBuf {
        self.root.join("alloc")
    }

    /// `alloc/logs/`.
    pub fn logs_dir(&self) -> PathBuf {
        self.shared_dir().join("logs")
    }

    /// `<task>/`.
    pub fn task_dir(&self, task: &str) -> PathBuf {
        self.root.join(task)
    }

    /// `<task>/local/`: `$DROVER_TASK_DIR`, and where the task runs unless
    /// its config names a `work_dir`.
    pub fn task_local_dir(&self, task: &str) -> PathBuf {
        self.task_dir(task).join("local")
    }

    /// `<task>/secrets/`.
    pub fn task_secrets_dir(&self, task: &str) -> PathBuf {
        self.task_dir(task).join("secrets")
    }

    /// The agent's directory for this allocation.
    pub fn client_dir(&self) -> &Path {
        &self.client
    }

    /// The re-attach state file.
    pub fn state_file(&self) -> PathBuf {
        self.client.join("state.json")
    }

    /// A task's file in the agent's directory (`<task>.<suffix>`).
    pub fn task_file(&self, task: &str, suffix: &str) -> PathBuf {
        self.client.join(format!("{task}.{suffix}"))
    }

    /// Creates every directory for `tasks` (existing ones are kept). A
    /// task name that is not one plain path component is refused before
    /// anything is created: the servers refuse such names, and the agent
    /// never writes outside an allocation's directories whatever it is given.
    pub fn build<'a>(&self, tasks: impl IntoIterator<Item = &'a str> + Clone) -> std::io::Result<()> {
        for task in tasks.clone() {
            check_name(task)?;
        }
        for dir in [self.logs_dir(), self.shared_dir().join("data"), self.shared_dir().join("tmp")] {
            std::fs::create_dir_all(&dir)?;
        }
        // The agent's own files hold tasks' whole environments.
        storage::create_private_dir(&self.client)?;
        for task in tasks {
            std::fs::create_dir_all(self.task_local_dir(task))?;
            std::fs::create_dir_all(self.task_dir(task).join("tmp"))?;
            let secrets = self.task_secrets_dir(task);
            std::fs::create_dir_all(&secrets)?;
            std::fs::set_permissions(&secrets, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        }
        Ok(())
    }

    /// Removes both trees; what is already gone is not an error.
    pub fn destroy(&self) -> std::io::Result<()> {
        for dir in [&self.root, &self.client] {
            match std::fs::remove_dir_all(dir) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
                _ => {}
            }
        }
        Ok(())
    }
}

/// Refuses a task name that would not stay one directory below an
/// allocation's: empty, `.`, `..`, with a slash or a NUL character.
pub fn check_name(name: &str) -> std::io::Result<()> {
    let mut components = Path::new(name).components();
    let single = matches!(components.next(), Some(std::path::Component::Normal(_))) && components.next().is_none();
    if single && !name.contains(['/', '\0']) {
        Ok(())
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("task name {name:?} is not a plain file name: refusing to use it as a path"),
        ))
    }
}

/// Writes one of the agent's own files (`storage::write_atomic`: whole or
/// not at all), readable by the agent's user only.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    storage::write_atomic(path, bytes, storage::FILE_MODE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_nomads_layout_and_destroys_it() {
        let data_dir = std::env::temp_dir().join(format!("drover-allocdir-{}", std::process::id()));
        let alloc_id = AllocId::from_u128(7);
        let dir = AllocDir::new(&data_dir, alloc_id);
        dir.build(["web", "sidecar"]).expect("builds");
        for path in [dir.logs_dir(), dir.task_local_dir("web"), dir.task_secrets_dir("sidecar"), dir.state_file()] {
            let parent = if path == dir.state_file() { dir.client_dir().to_path_buf() } else { path };
            assert!(parent.is_dir(), "{}", parent.display());
        }
        let mode = std::fs::metadata(dir.task_secrets_dir("web")).expect("exists").permissions();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o700);
        write_private(&dir.state_file(), b"{}").expect("writes");
        let mode = |path: &Path| std::fs::metadata(path).expect("exists").permissions();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode(&dir.state_file())) & 0o777, 0o600);
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode(dir.client_dir())) & 0o777, 0o700);
        assert_eq!(AllocDir::existing(&data_dir), vec![alloc_id]);
        dir.destroy().expect("destroys");
        assert!(!dir.root().exists() && !dir.client_dir().exists());
        dir.destroy().expect("destroying twice is fine");
        std::fs::remove_dir_all(&data_dir).expect("clean up");
    }

    #[test]
    fn a_task_name_that_is_a_path_is_refused_and_nothing_is_created() {
        let data_dir = std::env::temp_dir().join(format!("drover-allocdir-bad-{}", std::process::id()));
        let dir = AllocDir::new(&data_dir, AllocId::from_u128(8));
        for bad in ["/tmp/x/escaped", "../../x", "..", ".", "a/b", "", "nul\0"] {
            let error = dir.build(["web", bad]).expect_err("refused");
            assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput, "{bad:?}");
        }
        assert!(!data_dir.exists(), "nothing was created");
        assert!(check_name("web.v2").is_ok());
    }
}
