//! A task's environment and the `${...}` variables of its job, as Nomad's
//! `client/taskenv` builds them.
//!
//! Every variable the client sets is set under Nomad's name and under
//! Drover's, so Nomad job files run unchanged: `NOMAD_ALLOC_ID` and
//! `DROVER_ALLOC_ID`, and so on. The environment of a task is built in
//! this order, a later step winning a name:
//!
//! 1. The allocation's: `*_ALLOC_ID`, `*_SHORT_ALLOC_ID` (its first 8
//!    characters), `*_ALLOC_NAME`, `*_ALLOC_INDEX`, `*_JOB_ID`,
//!    `*_JOB_NAME`, `*_GROUP_NAME`, `*_TASK_NAME`, `*_NAMESPACE`, `*_DC`,
//!    `*_REGION`, `*_ALLOC_DIR`, `*_TASK_DIR`, `*_SECRETS_DIR`,
//!    `*_CPU_LIMIT`, `*_MEMORY_LIMIT`; and per port label of the group's
//!    network ([`engine::structs::port_env`]): `*_PORT_<label>` and
//!    `*_ALLOC_PORT_<label>` (the port the task binds: `to` if set, else
//!    the host port), `*_HOST_PORT_<label>`, `*_IP_<label>`,
//!    `*_HOST_IP_<label>`, `*_ADDR_<label>` and `*_HOST_ADDR_<label>`
//!    (`ip:port`).
//! 2. Meta: the job's, the group's and the task's `meta` merged, the
//!    innermost winning a key ([`Job::combined_task_meta`]), each key as
//!    `*_META_<key>` and `*_META_<KEY>` (upper-cased), as Nomad sets both.
//!    Keys and values are interpolated (the rules of step 4).
//! 3. For raw_exec, the agent's own environment (as Nomad's raw_exec
//!    inherits it) where step 1 and 2 set no such name, less its own
//!    `DROVER_*` and `NOMAD_*` and the variables of the client's
//!    `env_denylist` ([`EnvDenylist`]: by default Nomad's list of Consul,
//!    Nomad, Vault, AWS and Google credentials).
//! 4. The task's `env`, each value interpolated against steps 1-3 and the
//!    node: `${NAME}` is the variable `NAME`; `${node.unique.id}`,
//!    `${node.unique.name}`, `${node.datacenter}`, `${node.class}`,
//!    `${node.region}`, `${attr.<key>}` and `${meta.<key>}` are the
//!    node's. A `${...}` that names nothing known stays as it is written,
//!    as Nomad leaves it ([`TaskEnv::interpolate`]; `${env.X}` is not a
//!    variable here either, as in Nomad).
//! 5. The variables the task's `env = true` templates render
//!    (`client/template.rs`), as they are, over everything before, as
//!    Nomad lays a template's environment over the task's.
//! 6. Names under `*_ADDR_`, `*_IP_`, `*_PORT_`, `*_HOST_PORT_` and
//!    `*_META_` are cleaned as Nomad cleans them: a character that is not
//!    a letter, a digit (but first), `_` or `.` becomes `_`, so meta key
//!    `team-name` gives `NOMAD_META_team_name`.
//!
//! A driver's `config` is interpolated as a whole ([`TaskEnv::interpolate_config`]):
//! every string in it, however deep in its lists and maps, with every
//! variable of the task's environment, the node's, `${node.attr.<key>}`
//! and `${node.meta.<key>}`, and `${env.NAME}` (or `${env["NAME"]}`) for
//! the task's variable `NAME`; `$${` is a literal `${`. There, as in
//! Nomad, a `${...}` that names nothing known, or that is not a plain
//! variable (Drover has none of HCL's functions), is an error naming the
//! variable and the config key: the task fails without restarting
//! (`Failed Validation`).

use std::collections::BTreeMap;

#[cfg(doc)]
use engine::structs::Job;
use engine::structs::{port_env, Allocation, ConfigValue, Node, Task};

use crate::client::alloc_dir::AllocDir;

/// The region every node is in until regions exist.
pub const REGION: &str = "global";

/// The prefixes of the client's variables: Nomad's and Drover's.
const PREFIXES: [&str; 2] = ["NOMAD_", "DROVER_"];

/// The variable names (after a prefix) whose rest Nomad cleans (`CleanEnvVar`).
const CLEANED: [&str; 5] = ["ADDR_", "IP_", "PORT_", "HOST_PORT_", "META_"];

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

/// Why a driver's config could not be interpolated: the task cannot run
/// as written (Nomad's `failed to parse config`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("failed to parse config: {key}: {problem}")]
pub struct ConfigError {
    /// Where in the config: `config.args[1]`, `config.nested.key`.
    pub key: String,
    /// What is wrong, naming the `${...}`.
    pub problem: String,
}

/// The variables of one task on one node.
#[derive(Clone, Debug)]
pub struct TaskEnv {
    /// The client's: `NOMAD_*` and `DROVER_*`, ports and meta included
    /// (steps 1 and 2 of the module docs).
    vars: BTreeMap<String, String>,
    /// `node.*`, `attr.*` and `meta.*`.
    node_vars: BTreeMap<String, String>,
    /// What the task's `env = true` templates rendered (step 5 of the
    /// module docs); empty until a start sets them.
    template_vars: BTreeMap<String, String>,
}

impl TaskEnv {
    /// The variables of `task` of `alloc` on `node`, with its directories in `dir`.
    pub fn new(alloc: &Allocation, task: &Task, node: &Node, dir: &AllocDir) -> TaskEnv {
        let node_vars = node_vars(node);
        let path = |path: std::path::PathBuf| path.display().to_string();
        let alloc_id = alloc.id.to_string();
        let values = [
            ("ALLOC_ID", alloc_id.clone()),
            ("SHORT_ALLOC_ID", alloc_id.chars().take(8).collect()),
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
            for prefix in PREFIXES {
                vars.insert(format!("{prefix}{suffix}"), value.clone());
            }
        }
        for prefix in PREFIXES {
            vars.extend(port_env(alloc, prefix));
        }
        let meta = meta_vars(&alloc.job.combined_task_meta(&alloc.task_group, &task.name), &vars, &node_vars);
        vars.extend(meta);
        TaskEnv { vars: cleaned(vars), node_vars, template_vars: BTreeMap::new() }
    }

    /// The variables with `vars`, read from the task's `env = true`
    /// templates for one start, over everything else (step 5).
    pub fn with_template_vars(&self, vars: BTreeMap<String, String>) -> TaskEnv {
        TaskEnv { template_vars: vars, ..self.clone() }
    }

    /// The variables as a container sees them: the directories at
    /// `/alloc`, `/local` and `/secrets` (where the docker driver binds
    /// them), and `*_PORT_<label>` the port `port_map` gives the label, as
    /// Nomad's docker driver.
    pub fn in_container(&self, port_map: &BTreeMap<String, u16>) -> TaskEnv {
        let mut vars = self.vars.clone();
        for prefix in PREFIXES {
            for (suffix, path) in [("ALLOC_DIR", "/alloc"), ("TASK_DIR", "/local"), ("SECRETS_DIR", "/secrets")] {
                vars.insert(format!("{prefix}{suffix}"), path.to_string());
            }
            for (label, port) in port_map {
                for name in ["PORT", "ALLOC_PORT"] {
                    vars.insert(clean_name(format!("{prefix}{name}_{label}")), port.to_string());
                }
            }
        }
        TaskEnv { vars, node_vars: self.node_vars.clone(), template_vars: self.template_vars.clone() }
    }

    /// `text` with every `${...}` naming a client variable or a node value
    /// replaced; any other `${...}` stays as written (Nomad's rule for
    /// `env`, services and checks).
    pub fn interpolate(&self, text: &str) -> String {
        replace_known(text, &[&self.vars, &self.node_vars])
    }

    /// The whole environment of the process: the client's variables,
    /// `inherited` (the agent's) where they set no such name, less
    /// `denied` and its own `DROVER_*` and `NOMAD_*`, then the task's `env`
    /// with its values interpolated (against the variables and `inherited`,
    /// not against each other, so their order does not matter), then what
    /// its `env = true` templates rendered.
    pub fn process_env(
        &self,
        task: &Task,
        inherited: impl IntoIterator<Item = (String, String)>,
        denied: &EnvDenylist,
    ) -> BTreeMap<String, String> {
        let mut env = self.vars.clone();
        for (key, value) in inherited {
            if !key.starts_with("DROVER_") && !key.starts_with("NOMAD_") && denied.allows(&key) {
                env.entry(key).or_insert(value);
            }
        }
        let before_task = env.clone();
        for (key, value) in &task.env {
            env.insert(key.clone(), replace_known(value, &[&before_task, &self.node_vars]));
        }
        env.extend(self.template_vars.iter().map(|(key, value)| (key.clone(), value.clone())));
        cleaned(env)
    }

    /// The driver's `config` with every string in it interpolated with the
    /// task's environment `env` ([`TaskEnv::process_env`]) and the node's
    /// values; an unknown `${...}` is an error naming it and its key.
    pub fn interpolate_config(
        &self,
        config: &BTreeMap<String, ConfigValue>,
        env: &BTreeMap<String, String>,
    ) -> Result<BTreeMap<String, ConfigValue>, ConfigError> {
        let scope = ConfigScope { env, node_vars: &self.node_vars };
        config.iter().map(|(key, value)| Ok((key.clone(), scope.value(value, &format!("config.{key}"))?))).collect()
    }
}

/// `text` with every `${name}` that `vars` holds replaced, anything else
/// as written (a template's destination, interpolated with the task's
/// environment).
pub fn interpolate_with(text: &str, vars: &BTreeMap<String, String>) -> String {
    replace_known(text, &[vars])
}

/// `node.*`, `attr.*` and `meta.*` of `node`.
fn node_vars(node: &Node) -> BTreeMap<String, String> {
    let mut vars = BTreeMap::new();
    vars.insert("node.unique.id".to_string(), node.id.to_string());
    vars.insert("node.unique.name".to_string(), node.name.clone());
    vars.insert("node.datacenter".to_string(), node.datacenter.to_string());
    vars.insert("node.class".to_string(), node.node_class.to_string());
    vars.insert("node.region".to_string(), REGION.to_string());
    for (key, value) in &node.attributes {
        vars.insert(format!("attr.{key}"), value.clone());
    }
    for (key, value) in &node.meta {
        vars.insert(format!("meta.{key}"), value.clone());
    }
    vars
}

/// `*_META_<key>` and `*_META_<KEY>` of every entry of `meta`, its keys and
/// values interpolated against `vars` and `node_vars`.
fn meta_vars(
    meta: &BTreeMap<String, String>,
    vars: &BTreeMap<String, String>,
    node_vars: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (key, value) in meta {
        let key = replace_known(key, &[vars, node_vars]);
        let value = replace_known(value, &[vars, node_vars]);
        for name in [key.to_uppercase(), key] {
            for prefix in PREFIXES {
                out.insert(format!("{prefix}META_{name}"), value.clone());
            }
        }
    }
    out
}

/// `env` with the names Nomad cleans cleaned (step 6 of the module docs).
fn cleaned(env: BTreeMap<String, String>) -> BTreeMap<String, String> {
    env.into_iter().map(|(key, value)| (clean_name(key), value)).collect()
}

/// `key` with every character but letters, digits (not first), `_` and `.`
/// replaced by `_` when it is one of the cleaned names (Nomad's `CleanEnvVar`).
fn clean_name(key: String) -> String {
    let cleaned = PREFIXES
        .iter()
        .any(|prefix| key.strip_prefix(prefix).is_some_and(|rest| CLEANED.iter().any(|name| rest.starts_with(name))));
    if !cleaned {
        return key;
    }
    key.char_indices()
        .map(|(at, c)| match c {
            '_' | '.' | 'a'..='z' | 'A'..='Z' => c,
            '0'..='9' if at > 0 => c,
            _ => '_',
        })
        .collect()
}

/// Whether `name` can be a `${name}` of Nomad's string replacement
/// (`\$\{[a-zA-Z0-9_\-\.]+\}`).
fn is_plain_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// `text` with every `${name}` found in `maps` (the first that has it)
/// replaced; anything else stays as written.
fn replace_known(text: &str, maps: &[&BTreeMap<String, String>]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find("${") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let found = after.find('}').and_then(|close| {
            let name = &after[..close];
            let value = maps.iter().find_map(|map| map.get(name)).filter(|_| is_plain_name(name))?;
            Some((value, close))
        });
        match found {
            Some((value, close)) => {
                out.push_str(value);
                rest = &after[close + 1..];
            }
            None => {
                out.push_str("${");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// What a driver config's `${...}` can name.
struct ConfigScope<'a> {
    env: &'a BTreeMap<String, String>,
    node_vars: &'a BTreeMap<String, String>,
}

impl ConfigScope<'_> {
    /// `value` interpolated; `place` is where it is (`config.args[1]`).
    fn value(&self, value: &ConfigValue, place: &str) -> Result<ConfigValue, ConfigError> {
        Ok(match value {
            ConfigValue::String(text) => ConfigValue::String(self.text(text, place)?),
            ConfigValue::List(items) => ConfigValue::List(
                items
                    .iter()
                    .enumerate()
                    .map(|(at, item)| self.value(item, &format!("{place}[{at}]")))
                    .collect::<Result<_, _>>()?,
            ),
            ConfigValue::Map(entries) => ConfigValue::Map(
                entries
                    .iter()
                    .map(|(key, item)| Ok((key.clone(), self.value(item, &format!("{place}.{key}"))?)))
                    .collect::<Result<_, _>>()?,
            ),
            scalar => scalar.clone(),
        })
    }

    /// `text` as an HCL template of variables: `$${` is a literal `${`.
    fn text(&self, text: &str, place: &str) -> Result<String, ConfigError> {
        let error = |problem: String| ConfigError { key: place.to_string(), problem };
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(open) = rest.find("${") {
            if rest[..open].ends_with('$') {
                out.push_str(&rest[..open - 1]);
                out.push_str("${");
                rest = &rest[open + 2..];
                continue;
            }
            out.push_str(&rest[..open]);
            let after = &rest[open + 2..];
            let Some(close) = after.find('}') else {
                return Err(error(format!("unclosed \"${{\" in {text:?}")));
            };
            out.push_str(&self.resolve(after[..close].trim()).map_err(error)?);
            rest = &after[close + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }

    /// The value of the expression `expression` (a variable).
    fn resolve(&self, expression: &str) -> Result<String, String> {
        let env_name = expression
            .strip_prefix("env.")
            .or_else(|| expression.strip_prefix("env[\"").and_then(|rest| rest.strip_suffix("\"]")));
        let found = match env_name {
            Some(name) => self.env.get(name),
            None if !is_plain_name(expression) => {
                return Err(format!(
                    "\"${{{expression}}}\" is not a variable (Drover interpolates variables only, no functions or operators)"
                ))
            }
            None => {
                let node_alias = expression
                    .strip_prefix("node.attr.")
                    .map(|key| format!("attr.{key}"))
                    .or_else(|| expression.strip_prefix("node.meta.").map(|key| format!("meta.{key}")));
                let node_name = node_alias.as_deref().unwrap_or(expression);
                self.env.get(expression).or_else(|| self.node_vars.get(node_name))
            }
        };
        found.cloned().ok_or_else(|| format!("unknown variable \"${{{expression}}}\""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::structs::{AllocatedPort, EvalId, Job, JobType, NodeId, Resources};
    use std::sync::Arc;

    fn entries(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect()
    }

    /// A task of a job with meta at every level, in an allocation holding
    /// ports, on a node with meta: its environment.
    fn fixture() -> (Allocation, Task, TaskEnv) {
        let mut job = Job::new_simple("web", JobType::Service, 3, Resources::new(250, 128, 0));
        job.meta = entries(&[("owner", "job"), ("tier", "job"), ("team-name", "ops")]);
        job.task_groups[0].meta = entries(&[("tier", "group"), ("where", "${node.datacenter}/${NOMAD_TASK_NAME}")]);
        job.task_groups[0].tasks[0].meta = entries(&[("owner", "task")]);
        let job = Arc::new(job);
        let mut node = Node::new_ready(NodeId::from_u128(9), "dc2", "gpu", Resources::new(1000, 1000, 1000));
        node.meta.insert("rack".to_string(), "r7".to_string());
        let mut alloc = Allocation::new_placement(&job, "group", 2, node.id, EvalId::from_u128(1));
        alloc.ports = vec![
            AllocatedPort { label: "http".into(), value: 20_123, to: 0, host_ip: "10.0.0.5".into() },
            AllocatedPort { label: "db".into(), value: 5432, to: 5433, host_ip: "10.0.0.5".into() },
        ];
        let dir = AllocDir::new(std::path::Path::new("/data"), alloc.id);
        let mut task = job.task_groups[0].tasks[0].clone();
        task.env = entries(&[
            ("GREETING", "task ${NOMAD_TASK_NAME} in ${node.datacenter} at ${NOMAD_ADDR_http}"),
            ("HOME_TOO", "${HOME}"),
            ("LITERAL", "${nope} ${env.HOME} ${NOMAD_PORT_http"),
            ("NOMAD_META_from-env", "x"),
        ]);
        let env = TaskEnv::new(&alloc, &task, &node, &dir);
        (alloc, task, env)
    }

    #[test]
    fn variables_under_both_names_and_interpolation() {
        let (alloc, task, env) = fixture();
        assert_eq!(env.interpolate("${DROVER_ALLOC_INDEX}/${NOMAD_ALLOC_INDEX}"), "2/2");
        assert_eq!(env.interpolate("${meta.rack}-${node.class}-${nope}-${"), "r7-gpu-${nope}-${");
        assert_eq!(env.interpolate("${NOMAD_TASK_DIR}"), format!("/data/alloc/{}/task/local", alloc.id));
        assert_eq!(env.interpolate("${NOMAD_SHORT_ALLOC_ID}"), alloc.id.to_string()[..8]);
        let inherited = [("PATH", "/bin"), ("HOME", "/home/agent"), ("NOMAD_TOKEN", "x"), ("VAULT_TOKEN", "v")];
        let inherited = inherited.map(|(key, value)| (key.to_string(), value.to_string()));
        let process = env.process_env(&task, inherited.clone(), &EnvDenylist::default());
        let get = |key: &str| process.get(key).map(String::as_str);
        assert_eq!(get("GREETING"), Some("task task in dc2 at 10.0.0.5:20123"));
        assert_eq!(get("HOME_TOO"), Some("/home/agent"), "the inherited environment is a variable too");
        assert_eq!(get("LITERAL"), Some("${nope} ${env.HOME} ${NOMAD_PORT_http"), "unknown stays as text in env");
        assert_eq!(get("NOMAD_META_from_env"), Some("x"), "a NOMAD_META_ name is cleaned wherever it comes from");
        assert_eq!(get("PATH"), Some("/bin"));
        assert_eq!(get("NOMAD_TOKEN"), None, "the agent's own NOMAD_ variables are not passed on");
        assert_eq!(get("VAULT_TOKEN"), None, "denied by default");
        assert_eq!(get("DROVER_JOB_ID"), Some("web"));
        assert_eq!(get("NOMAD_MEMORY_LIMIT"), Some("128"));
        let own = EnvDenylist::new(["VAULT_*".to_string(), "PATH".to_string()]);
        let process = env.process_env(&task, inherited, &own);
        assert_eq!((process.get("PATH"), process.get("VAULT_TOKEN")), (None, None), "a list of its own");
    }

    #[test]
    fn ports_reach_the_task_under_every_name_nomad_gives_them() {
        let (_, task, env) = fixture();
        let process = env.process_env(&task, [], &EnvDenylist::default());
        for prefix in PREFIXES {
            let get = |name: &str| process.get(&format!("{prefix}{name}")).map(String::as_str);
            assert_eq!(get("PORT_http"), Some("20123"));
            assert_eq!(get("ALLOC_PORT_http"), Some("20123"));
            assert_eq!(get("HOST_PORT_http"), Some("20123"));
            assert_eq!((get("IP_http"), get("HOST_IP_http")), (Some("10.0.0.5"), Some("10.0.0.5")));
            assert_eq!((get("ADDR_http"), get("HOST_ADDR_http")), (Some("10.0.0.5:20123"), Some("10.0.0.5:20123")));
            assert_eq!((get("PORT_db"), get("ALLOC_PORT_db")), (Some("5433"), Some("5433")), "the task binds `to`");
            assert_eq!((get("HOST_PORT_db"), get("ADDR_db")), (Some("5432"), Some("10.0.0.5:5432")));
        }
    }

    #[test]
    fn a_container_sees_its_directories_and_mapped_ports_as_docker_binds_them() {
        let (_, task, env) = fixture();
        let inside = env.in_container(&BTreeMap::from([("http".to_string(), 8080)]));
        let process = inside.process_env(&task, [], &EnvDenylist::default());
        for prefix in PREFIXES {
            let get = |name: &str| process.get(&format!("{prefix}{name}")).map(String::as_str);
            assert_eq!(
                (get("ALLOC_DIR"), get("TASK_DIR"), get("SECRETS_DIR")),
                (Some("/alloc"), Some("/local"), Some("/secrets"))
            );
            assert_eq!(
                (get("PORT_http"), get("HOST_PORT_http")),
                (Some("8080"), Some("20123")),
                "port_map moves the inside"
            );
            assert_eq!(get("PORT_db"), Some("5433"), "unmapped ports as before");
        }
        assert_eq!(inside.interpolate("${NOMAD_TASK_DIR}/conf"), "/local/conf");
    }

    #[test]
    fn meta_merges_job_group_task_with_the_task_winning_under_both_spellings() {
        let (_, task, env) = fixture();
        let process = env.process_env(&task, [], &EnvDenylist::default());
        let meta: BTreeMap<&str, &str> = process
            .iter()
            .filter_map(|(key, value)| Some((key.strip_prefix("NOMAD_META_")?, value.as_str())))
            .collect();
        let expected = BTreeMap::from([
            ("OWNER", "task"),
            ("owner", "task"),
            ("TIER", "group"),
            ("tier", "group"),
            ("TEAM_NAME", "ops"),
            ("team_name", "ops"),
            ("WHERE", "dc2/task"),
            ("where", "dc2/task"),
            ("from_env", "x"),
        ]);
        assert_eq!(meta, expected, "the innermost wins; values are interpolated");
        assert_eq!(process["DROVER_META_owner"], "task");
    }

    #[test]
    fn every_string_of_a_driver_config_is_interpolated_however_deep() {
        let (alloc, task, env) = fixture();
        let process = env.process_env(&task, [("HOME".to_string(), "/home/agent".to_string())], &Default::default());
        let config: BTreeMap<String, ConfigValue> = serde_json::from_value(serde_json::json!({
            "command": "${NOMAD_TASK_DIR}/run",
            "args": ["--port=${NOMAD_PORT_http}", 7, ["${ node.datacenter }", {"deep": "${attr.kernel.name}"}]],
            "nested": {"rack": "${node.meta.rack}", "home": "${env.HOME}", "greeting": "${env[\"GREETING\"]}",
                       "literal": "$${NOMAD_PORT_http}", "flag": true, "owner": "${NOMAD_META_owner}"}
        }))
        .expect("a config");
        let done = env.interpolate_config(&config, &process).expect("every variable is known");
        let expected: BTreeMap<String, ConfigValue> = serde_json::from_value(serde_json::json!({
            "command": format!("/data/alloc/{}/task/local/run", alloc.id),
            "args": ["--port=20123", 7, ["dc2", {"deep": "linux"}]],
            "nested": {"rack": "r7", "home": "/home/agent", "greeting": "task task in dc2 at 10.0.0.5:20123",
                       "literal": "${NOMAD_PORT_http}", "flag": true, "owner": "task"}
        }))
        .expect("a config");
        assert_eq!(done, expected);
    }

    #[test]
    fn an_unknown_variable_in_a_driver_config_is_an_error_naming_it_and_its_key() {
        let (_, task, env) = fixture();
        let process = env.process_env(&task, [], &EnvDenylist::default());
        let fail = |config: serde_json::Value| {
            let config: BTreeMap<String, ConfigValue> = serde_json::from_value(config).expect("a config");
            env.interpolate_config(&config, &process).expect_err("refused").to_string()
        };
        assert_eq!(
            fail(serde_json::json!({"command": "sh", "args": ["-c", "echo ${nope}"]})),
            "failed to parse config: config.args[1]: unknown variable \"${nope}\""
        );
        let nested = fail(serde_json::json!({"outer": {"list": ["ok", "${NOMAD_META_missing}"]}}));
        assert!(nested.contains("config.outer.list[1]: unknown variable \"${NOMAD_META_missing}\""), "{nested}");
        let function = fail(serde_json::json!({"command": "${upper(NOMAD_TASK_NAME)}"}));
        assert!(function.contains("config.command: \"${upper(NOMAD_TASK_NAME)}\" is not a variable"), "{function}");
        assert!(fail(serde_json::json!({"command": "${NOMAD_TASK_NAME"})).contains("unclosed"));
        assert!(fail(serde_json::json!({"command": "${env.nope}"})).contains("unknown variable \"${env.nope}\""));
    }
}
