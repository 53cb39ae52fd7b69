//! What a task asks of its driver and its client: the driver's `config`
//! (typed values: string, integer, float, bool, list, map), the `logs`
//! stanza, the kill signal names, and the `raw_exec` driver's config read
//! from a task (`command`, `args`, `work_dir`), so that a job is checked at
//! submission (`Job::validate`) with the same rules the agent applies (the
//! `docker` driver's, larger, is in `docker_config.rs`).
//!
//! Contract: a [`ConfigValue`] reads from JSON as the plain value
//! (`"sleep"`, `30`, `["-c", "x"]`) and encodes in binary formats
//! (postcard: the command log, the QUIC messages) as a tagged enum, so a
//! decoder never has to guess a type. The mock driver's settings, strings
//! until now, read as before ([`ConfigValue::as_text`]).

use std::collections::BTreeMap;
use std::fmt;
use std::hash::{Hash, Hasher};

use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::docker_config::{DockerConfig, DOCKER};
use super::Task;

/// The `raw_exec` driver's name, as Nomad's.
pub const RAW_EXEC: &str = "raw_exec";

/// The `mock` driver's name, as Nomad's.
pub const MOCK: &str = "mock";

/// The signals a task's `kill_signal` may name, as in Nomad's job files.
pub const KILL_SIGNALS: [&str; 10] =
    ["SIGHUP", "SIGINT", "SIGQUIT", "SIGKILL", "SIGUSR1", "SIGUSR2", "SIGTERM", "SIGCONT", "SIGSTOP", "SIGWINCH"];

/// The signal sent to stop a task that names none: SIGINT, as Nomad.
pub const DEFAULT_KILL_SIGNAL: &str = "SIGINT";

/// One value of a driver's `config`.
#[derive(Clone, Debug, PartialEq)]
pub enum ConfigValue {
    /// Text.
    String(String),
    /// A whole number.
    Int(i64),
    /// A number with a fraction.
    Float(f64),
    /// true or false.
    Bool(bool),
    /// A list (`args`).
    List(Vec<ConfigValue>),
    /// A nested block.
    Map(BTreeMap<String, ConfigValue>),
}

// Floats compare and hash by their bits, so a config (and so a job) is Eq
// and Hash: a NaN equals itself, which is what comparing two job versions
// needs.
impl Eq for ConfigValue {}

impl Hash for ConfigValue {
    fn hash<H: Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match self {
            ConfigValue::String(text) => text.hash(state),
            ConfigValue::Int(number) => number.hash(state),
            ConfigValue::Float(number) => number.to_bits().hash(state),
            ConfigValue::Bool(flag) => flag.hash(state),
            ConfigValue::List(items) => items.hash(state),
            ConfigValue::Map(entries) => entries.hash(state),
        }
    }
}

impl ConfigValue {
    /// The value as text when it is a scalar: strings as they are, numbers
    /// and bools written out (the mock driver's `exit_code = 1` or `"1"`).
    pub fn as_text(&self) -> Option<String> {
        match self {
            ConfigValue::String(text) => Some(text.clone()),
            ConfigValue::Int(number) => Some(number.to_string()),
            ConfigValue::Float(number) => Some(number.to_string()),
            ConfigValue::Bool(flag) => Some(flag.to_string()),
            ConfigValue::List(_) | ConfigValue::Map(_) => None,
        }
    }

    /// What kind of value this is, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            ConfigValue::String(_) => "a string",
            ConfigValue::Int(_) => "an integer",
            ConfigValue::Float(_) => "a number",
            ConfigValue::Bool(_) => "a bool",
            ConfigValue::List(_) => "a list",
            ConfigValue::Map(_) => "a map",
        }
    }
}

impl From<&str> for ConfigValue {
    fn from(text: &str) -> ConfigValue {
        ConfigValue::String(text.to_string())
    }
}

impl From<String> for ConfigValue {
    fn from(text: String) -> ConfigValue {
        ConfigValue::String(text)
    }
}

/// The binary form: a tagged enum (postcard cannot carry an untagged one).
#[derive(Serialize)]
enum TaggedRef<'a> {
    String(&'a str),
    Int(i64),
    Float(f64),
    Bool(bool),
    List(&'a [ConfigValue]),
    Map(&'a BTreeMap<String, ConfigValue>),
}

#[derive(Deserialize)]
enum Tagged {
    String(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    List(Vec<ConfigValue>),
    Map(BTreeMap<String, ConfigValue>),
}

impl Serialize for ConfigValue {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            return match self {
                ConfigValue::String(text) => serializer.serialize_str(text),
                ConfigValue::Int(number) => serializer.serialize_i64(*number),
                ConfigValue::Float(number) => serializer.serialize_f64(*number),
                ConfigValue::Bool(flag) => serializer.serialize_bool(*flag),
                ConfigValue::List(items) => items.serialize(serializer),
                ConfigValue::Map(entries) => entries.serialize(serializer),
            };
        }
        match self {
            ConfigValue::String(text) => TaggedRef::String(text),
            ConfigValue::Int(number) => TaggedRef::Int(*number),
            ConfigValue::Float(number) => TaggedRef::Float(*number),
            ConfigValue::Bool(flag) => TaggedRef::Bool(*flag),
            ConfigValue::List(items) => TaggedRef::List(items),
            ConfigValue::Map(entries) => TaggedRef::Map(entries),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ConfigValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ConfigValue, D::Error> {
        if deserializer.is_human_readable() {
            return deserializer.deserialize_any(PlainVisitor);
        }
        Ok(match Tagged::deserialize(deserializer)? {
            Tagged::String(text) => ConfigValue::String(text),
            Tagged::Int(number) => ConfigValue::Int(number),
            Tagged::Float(number) => ConfigValue::Float(number),
            Tagged::Bool(flag) => ConfigValue::Bool(flag),
            Tagged::List(items) => ConfigValue::List(items),
            Tagged::Map(entries) => ConfigValue::Map(entries),
        })
    }
}

/// Reads the plain form (JSON, TOML): whatever value is there.
struct PlainVisitor;

impl<'de> Visitor<'de> for PlainVisitor {
    type Value = ConfigValue;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a string, number, bool, list or map")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<ConfigValue, E> {
        Ok(ConfigValue::String(text.to_string()))
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<ConfigValue, E> {
        Ok(ConfigValue::String(text))
    }

    fn visit_i64<E: de::Error>(self, number: i64) -> Result<ConfigValue, E> {
        Ok(ConfigValue::Int(number))
    }

    fn visit_u64<E: de::Error>(self, number: u64) -> Result<ConfigValue, E> {
        Ok(i64::try_from(number).map_or(ConfigValue::Float(number as f64), ConfigValue::Int))
    }

    fn visit_f64<E: de::Error>(self, number: f64) -> Result<ConfigValue, E> {
        Ok(ConfigValue::Float(number))
    }

    fn visit_bool<E: de::Error>(self, flag: bool) -> Result<ConfigValue, E> {
        Ok(ConfigValue::Bool(flag))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ConfigValue, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(ConfigValue::List(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ConfigValue, A::Error> {
        let mut entries = BTreeMap::new();
        while let Some((key, value)) = map.next_entry()? {
            entries.insert(key, value);
        }
        Ok(ConfigValue::Map(entries))
    }
}

/// A task's `logs` stanza: how much of its stdout and stderr the client
/// keeps, each in up to `max_files` files of `max_file_size_mb` MiB
/// (Nomad's defaults: 10 files of 10 MiB).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LogConfig {
    /// Files kept per stream; the oldest is removed when one more is opened.
    #[serde(default = "default_max_files")]
    pub max_files: u32,
    /// Size of one file in MiB before the next is opened.
    #[serde(default = "default_max_file_size_mb")]
    pub max_file_size_mb: u32,
}

fn default_max_files() -> u32 {
    10
}

fn default_max_file_size_mb() -> u32 {
    10
}

impl Default for LogConfig {
    fn default() -> LogConfig {
        LogConfig { max_files: default_max_files(), max_file_size_mb: default_max_file_size_mb() }
    }
}

/// A `raw_exec` task's driver config, read from [`Task::config`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawExecConfig {
    /// The program: an absolute path, a path relative to the task
    /// directory, or a name looked up in the agent's `PATH`.
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// The working directory (default: the task directory); relative paths
    /// are taken from the task directory.
    pub work_dir: Option<String>,
}

impl RawExecConfig {
    /// Reads `task.config`, or lists every problem in it.
    pub fn from_task(task: &Task) -> Result<RawExecConfig, Vec<String>> {
        RawExecConfig::from_config(&task.config)
    }

    /// Reads a raw_exec `config` (a task's, or the client's interpolated
    /// copy of it), or lists every problem in it.
    pub fn from_config(config: &BTreeMap<String, ConfigValue>) -> Result<RawExecConfig, Vec<String>> {
        let mut problems = Vec::new();
        let command = match config.get("command") {
            Some(ConfigValue::String(command)) if !command.trim().is_empty() => command.clone(),
            Some(ConfigValue::String(_)) => {
                problems.push("config.command is empty".to_string());
                String::new()
            }
            Some(other) => {
                problems.push(format!("config.command must be a string, not {}", other.kind()));
                String::new()
            }
            None => {
                problems.push("config.command is required for the raw_exec driver".to_string());
                String::new()
            }
        };
        let args = match config.get("args") {
            None => Vec::new(),
            Some(ConfigValue::List(items)) => items
                .iter()
                .enumerate()
                .filter_map(|(at, item)| match item {
                    ConfigValue::List(_) | ConfigValue::Map(_) => {
                        problems.push(format!("config.args[{at}] must be a string, not {}", item.kind()));
                        None
                    }
                    scalar => scalar.as_text(),
                })
                .collect(),
            Some(other) => {
                problems.push(format!("config.args must be a list of strings, not {}", other.kind()));
                Vec::new()
            }
        };
        let work_dir = match config.get("work_dir") {
            None => None,
            Some(ConfigValue::String(dir)) => Some(dir.clone()),
            Some(other) => {
                problems.push(format!("config.work_dir must be a string, not {}", other.kind()));
                None
            }
        };
        for key in config.keys() {
            if !matches!(key.as_str(), "command" | "args" | "work_dir") {
                problems.push(format!("config.{key} is not a raw_exec setting (command, args, work_dir)"));
            }
        }
        if problems.is_empty() {
            Ok(RawExecConfig { command, args, work_dir })
        } else {
            Err(problems)
        }
    }
}

/// Every problem in a task's driver-facing settings: its driver config
/// (for the drivers Drover knows), `env`, `user`, `kill_signal`, `logs`.
pub(crate) fn task_settings_problems(task: &Task, place: &str, problems: &mut Vec<String>) {
    if task.driver == RAW_EXEC {
        if let Err(found) = RawExecConfig::from_task(task) {
            problems.extend(found.into_iter().map(|problem| format!("{place}: {problem}")));
        }
    }
    if task.driver == DOCKER {
        // As submitted: `${...}` variables are still text, filled in by the client.
        let (found, _ignored) = DockerConfig::submission_problems(&task.config);
        problems.extend(found.into_iter().map(|problem| format!("{place}: {problem}")));
    }
    for key in task.env.keys() {
        if key.is_empty() || key.contains('=') || key.contains('\0') {
            problems.push(format!("{place}: env key {key:?} must be non-empty, without '=' or NUL"));
        }
    }
    if task.env.values().any(|value| value.contains('\0')) {
        problems.push(format!("{place}: an env value contains NUL"));
    }
    if task.user.as_deref().is_some_and(|user| user.trim().is_empty()) {
        problems.push(format!("{place}: user is empty (leave it out to run as the agent's user)"));
    }
    if let Some(signal) = &task.kill_signal {
        if !KILL_SIGNALS.contains(&signal.as_str()) {
            problems.push(format!("{place}: kill_signal {signal:?} is not one of {}", KILL_SIGNALS.join(", ")));
        }
    }
    if task.logs.max_files == 0 {
        problems.push(format!("{place}: logs max_files must be at least 1"));
    }
    if task.logs.max_file_size_mb == 0 {
        problems.push(format!("{place}: logs max_file_size_mb must be at least 1"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structs::{Job, JobType, Resources};

    fn raw_exec_task(config: &str) -> Task {
        let mut task =
            Job::new_simple("j", JobType::Batch, 1, Resources::new(10, 10, 0)).task_groups[0].tasks[0].clone();
        task.driver = RAW_EXEC.to_string();
        task.config = serde_json::from_str(config).expect("a config");
        task
    }

    #[test]
    fn plain_json_reads_as_typed_values_and_round_trips_through_postcard() {
        let task = raw_exec_task(
            r#"{"command": "sh", "args": ["-c", "exit 3", 7], "work_dir": "local",
                                     "nested": {"on": true, "ratio": 0.5, "big": 18446744073709551615}}"#,
        );
        assert_eq!(task.config["command"], ConfigValue::from("sh"));
        let ConfigValue::Map(nested) = &task.config["nested"] else { panic!("a map") };
        assert_eq!(nested["on"], ConfigValue::Bool(true));
        assert_eq!(nested["ratio"], ConfigValue::Float(0.5));
        assert!(matches!(nested["big"], ConfigValue::Float(_)), "beyond i64 reads as a number");
        let bytes = postcard::to_stdvec(&task.config).expect("encodes");
        let back: BTreeMap<String, ConfigValue> = postcard::from_bytes(&bytes).expect("decodes");
        assert_eq!(back, task.config);
        let json = serde_json::to_string(&task.config).expect("json");
        assert!(json.contains(r#""args":["-c","exit 3",7]"#), "{json}");
    }

    #[test]
    fn raw_exec_config_is_read_and_every_problem_named() {
        let task = raw_exec_task(r#"{"command": "sh", "args": ["-c", "exit 3", 7]}"#);
        let config = RawExecConfig::from_task(&task).expect("valid");
        assert_eq!(config.args, ["-c", "exit 3", "7"]);
        let bad = raw_exec_task(r#"{"command": 5, "args": "-c", "image": "x"}"#);
        let problems = RawExecConfig::from_task(&bad).expect_err("three problems");
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].contains("command must be a string, not an integer"), "{problems:?}");
        assert!(problems[1].contains("args must be a list"), "{problems:?}");
        assert!(problems[2].contains("config.image is not a raw_exec setting"), "{problems:?}");
        let missing = raw_exec_task("{}");
        assert!(RawExecConfig::from_task(&missing).expect_err("no command")[0].contains("required"));
    }

    #[test]
    fn task_settings_are_checked() {
        let mut task = raw_exec_task(r#"{"command": "true"}"#);
        task.kill_signal = Some("SIGNOPE".to_string());
        task.env.insert("A=B".to_string(), "x".to_string());
        task.logs.max_files = 0;
        task.user = Some(" ".to_string());
        let mut problems = Vec::new();
        task_settings_problems(&task, "task", &mut problems);
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(problems.iter().any(|problem| problem.contains("kill_signal \"SIGNOPE\"")), "{problems:?}");
    }
}
