//! A task's environment and the `${...}` variables of its config.
//!
//! Every variable is set under Drover's name and under Nomad's, so Nomad
//! job files run unchanged: `DROVER_ALLOC_ID` and `NOMAD_ALLOC_ID`,
//! `*_ALLOC_NAME`, `*_ALLOC_INDEX`, `*_JOB_ID`, `*_JOB_NAME`,
//! `*_GROUP_NAME`, `*_TASK_NAME`, `*_NAMESPACE`, `*_DC`, `*_REGION`,
//! `*_ALLOC_DIR`, `*_TASK_DIR`, `*_SECRETS_DIR`, `*_CPU_LIMIT`,
//! `*_MEMORY_LIMIT`. A raw_exec task also inherits the agent's own
//! environment (as Nomad's raw_exec does), under these, less the
//! variables of the client's `env_denylist` ([`EnvDenylist`]: by default
//! Nomad's list of Consul, Nomad, Vault, AWS and Google credentials); the
//! task's `env` goes on top.
//!
//! `${NAME}` in the driver config, the args and the env values is replaced
//! by the variable of that name, `${node.unique.id}`, `${node.unique.name}`,
//! `${node.datacenter}`, `${node.class}`, `${node.region}`, `${attr.<key>}`
//! and `${meta.<key>}` by the node's. An unknown `${...}` is left as it is,
//! as Nomad leaves it.
//!
//! The allocation's port variables (`NOMAD_PORT_<label>` and friends) join
//! through [`TaskEnv::extend`] once allocations carry ports (issue 16).

use std::collections::BTreeMap;

use engine::structs::{Allocation, Node, Task};

use crate::client::alloc_dir::AllocDir;

/// The region every node is in until regions exist.
pub const REGION: &str = "global";

/// The agent's own variables a task never inherits (`client.env_denylist`,
/// Nomad's `env.denylist`): exact names, or prefixes ending in `*`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvDenylist(Vec<String>);

impl Default for EnvDenylist {
    /// Nomad's default: the credentials an agent's host commonly holds.
    fn default() -> EnvDenylist {
        EnvDenylist::new(
            [
                "CONSUL_TOKEN",
                "CONSUL_HTTP_TOKEN",
                "CONSUL_HTTP_TOKEN_FILE",
                "NOMAD_TOKEN",
                "VAULT_TOKEN",
                "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY",
                "AWS_SESSION_TOKEN",
                "GOOGLE_APPLICATION_CREDENTIALS",
            ]
            .map(String::from),
        )
    }
}

impl EnvDenylist {
    /// A denylist of `names` (a name ending in `*` denies every variable
    /// that starts with what comes before it).
    pub fn new(names: impl IntoIterator<Item = String>) -> EnvDenylist {
        EnvDenylist(names.into_iter().map(|name| name.trim().to_string()).filter(|name| !name.is_empty()).collect())
    }

    /// Whether the agent's variable `key` may reach a task.
    pub fn allows(&self, key: &str) -> bool {
        !self.0.iter().any(|denied| match denied.strip_suffix('*') {
            Some(prefix) => key.starts_with(prefix),
            None => key == denied,
        })
    }
}

/// The variables of one task on one node.
#[derive(Clone, Debug)]
pub struct TaskEnv {
    /// `DROVER_*` and `NOMAD_*`, plus the task's own env once built.
    vars: BTreeMap<String, String>,
    /// `node.*`, `attr.*` and `meta.*`.
    node_vars: BTreeMap<String, String>,
}

impl TaskEnv {
    /// The variables of `task` of `alloc` on `node`, with its directories in `dir`.
    pub fn new(alloc: &Allocation, task: &Task, node: &Node, dir: &AllocDir) -> TaskEnv {
        let path = |path: std::path::PathBuf| path.display().to_string();
        let values = [
            ("ALLOC_ID", alloc.id.to_string()),
            ("ALLOC_NAME", alloc.name.clone()),
            ("ALLOC_INDEX", alloc.index().map_or_else(String::new, |index| index.to_string())),
            ("JOB_ID", alloc.job_id.to_string()),
            ("JOB_NAME", if alloc.job.name.is_empty() { alloc.job_id.to_string() } else { alloc.job.name.clone() }),
            ("GROUP_NAME", alloc.task_group.to_string()),
            ("TASK_NAME", task.name.clone()),
            ("NAMESPACE", alloc.namespace.to_string()),
            ("DC", node.datacenter.to_string()),
            ("REGION", REGION.to_string()),
            ("ALLOC_DIR", path(dir.shared_dir())),
            ("TASK_DIR", path(dir.task_local_dir(&task.name))),
            ("SECRETS_DIR", path(dir.task_secrets_dir(&task.name))),
            ("CPU_LIMIT", task.resources.cpu.to_string()),
            ("MEMORY_LIMIT", task.resources.memory_mb.to_string()),
        ];
        let mut vars = BTreeMap::new();
        for (suffix, value) in values {
            vars.insert(format!("DROVER_{suffix}"), value.clone());
            vars.insert(format!("NOMAD_{suffix}"), value);
        }
        let mut node_vars = BTreeMap::new();
        node_vars.insert("node.unique.id".to_string(), node.id.to_string());
        node_vars.insert("node.unique.name".to_string(), node.name.clone());
        node_vars.insert("node.datacenter".to_string(), node.datacenter.to_string());
        node_vars.insert("node.class".to_string(), node.node_class.to_string());
        node_vars.insert("node.region".to_string(), REGION.to_string());
        for (key, value) in &node.attributes {
            node_vars.insert(format!("attr.{key}"), value.clone());
        }
        for (key, value) in &node.meta {
            node_vars.insert(format!("meta.{key}"), value.clone());
        }
        TaskEnv { vars, node_vars }
    }

    /// Adds variables (the allocation's ports, when it has them).
    pub fn extend(&mut self, more: impl IntoIterator<Item = (String, String)>) {
        self.vars.extend(more);
    }

    /// `text` with every known `${...}` replaced.
    pub fn interpolate(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(open) = rest.find("${") {
            out.push_str(&rest[..open]);
            let after = &rest[open + 2..];
            let Some(close) = after.find('}') else {
                out.push_str(&rest[open..]);
                return out;
            };
            let name = &after[..close];
            match self.vars.get(name).or_else(|| self.node_vars.get(name)) {
                Some(value) => out.push_str(value),
                None => out.push_str(&rest[open..open + 2 + close + 1]),
            }
            rest = &after[close + 1..];
        }
        out.push_str(rest);
        out
    }

    /// The whole environment of the process: `inherited` (the agent's)
    /// less `denied` and its own `DROVER_*` and `NOMAD_*`, the variables,
    /// then the task's `env` with its values interpolated.
    pub fn process_env(
        &self,
        task: &Task,
        inherited: impl IntoIterator<Item = (String, String)>,
        denied: &EnvDenylist,
    ) -> Vec<(String, String)> {
        let mut env: BTreeMap<String, String> = inherited
            .into_iter()
            .filter(|(key, _)| !key.starts_with("DROVER_") && !key.starts_with("NOMAD_") && denied.allows(key))
            .collect();
        env.extend(self.vars.iter().map(|(key, value)| (key.clone(), value.clone())));
        for (key, value) in &task.env {
            env.insert(key.clone(), self.interpolate(value));
        }
        env.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::structs::{EvalId, Job, JobType, NodeId, Resources};
    use std::sync::Arc;

    #[test]
    fn variables_under_both_names_and_interpolation() {
        let job = Arc::new(Job::new_simple("web", JobType::Service, 3, Resources::new(250, 128, 0)));
        let mut node = Node::new_ready(NodeId::from_u128(9), "dc2", "gpu", Resources::new(1000, 1000, 1000));
        node.meta.insert("rack".to_string(), "r7".to_string());
        let alloc = Allocation::new_placement(&job, "group", 2, node.id, EvalId::from_u128(1));
        let dir = AllocDir::new(std::path::Path::new("/data"), alloc.id);
        let mut task = job.task_groups[0].tasks[0].clone();
        task.env.insert("GREETING".to_string(), "task ${NOMAD_TASK_NAME} in ${node.datacenter}".to_string());
        let env = TaskEnv::new(&alloc, &task, &node, &dir);
        assert_eq!(env.interpolate("${DROVER_ALLOC_INDEX}/${NOMAD_ALLOC_INDEX}"), "2/2");
        assert_eq!(env.interpolate("${meta.rack}-${node.class}-${nope}-${"), "r7-gpu-${nope}-${");
        assert_eq!(env.interpolate("${NOMAD_TASK_DIR}"), format!("/data/alloc/{}/task/local", alloc.id));
        let inherited = [("PATH", "/bin"), ("NOMAD_TOKEN", "x"), ("AWS_SECRET_ACCESS_KEY", "s"), ("VAULT_TOKEN", "v")];
        let inherited = inherited.map(|(key, value)| (key.to_string(), value.to_string()));
        let process = env.process_env(&task, inherited.clone(), &EnvDenylist::default());
        let get = |key: &str| process.iter().find(|(name, _)| name == key).map(|(_, value)| value.as_str());
        assert_eq!(get("GREETING"), Some("task task in dc2"));
        assert_eq!(get("PATH"), Some("/bin"));
        assert_eq!(get("NOMAD_TOKEN"), None, "the agent's own NOMAD_ variables are not passed on");
        assert_eq!(get("DROVER_JOB_ID"), Some("web"));
        assert_eq!(get("NOMAD_MEMORY_LIMIT"), Some("128"));
        assert_eq!((get("AWS_SECRET_ACCESS_KEY"), get("VAULT_TOKEN")), (None, None), "denied by default");
        let own = EnvDenylist::new(["VAULT_*".to_string()]);
        let process = env.process_env(&task, inherited, &own);
        let get = |key: &str| process.iter().find(|(name, _)| name == key).map(|(_, value)| value.as_str());
        assert_eq!((get("AWS_SECRET_ACCESS_KEY"), get("VAULT_TOKEN")), (Some("s"), None), "a list of its own");
    }
}
