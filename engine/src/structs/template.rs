//! A task's templates (Nomad's `template` block): files rendered into the
//! task's directory before it starts, and again while it runs when the
//! data they read changes.
//!
//! Contract:
//! 1. A [`Template`] is plain data in the job, with Nomad's defaults
//!    filled in when a submitted job is read (`perms` `0644`, `change_mode`
//!    `restart`, `splay` 5 s, delimiters `{{` and `}}`), so the stored job
//!    says what the client will do.
//! 2. [`task_template_problems`] checks what can be checked at submission:
//!    one of `data` and `source`, a destination that stays inside the
//!    task's directory (neither absolute nor climbing out with `..`; one
//!    holding `${` is the client's to check once filled in), octal
//!    permissions, a known `change_signal` for `change_mode = "signal"`,
//!    delimiters, and no two templates writing one file.
//! 3. The client renders them (`drover/src/client/template.rs`) and checks
//!    the destination again once interpolated: nothing is written outside
//!    the task's directory whatever reaches it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration::serde_duration;
use super::task_config::KILL_SIGNALS;
use super::Task;

/// Nomad's default file mode of a rendered template.
pub const DEFAULT_TEMPLATE_PERMS: &str = "0644";

/// Nomad's default longest random wait before acting on a change.
pub const DEFAULT_TEMPLATE_SPLAY: Duration = Duration::from_secs(5);

/// What the client does when a running task's template renders to new text
/// (Nomad's `change_mode`; `script` is refused at submission).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeMode {
    /// Restart the task (Nomad's default).
    #[default]
    Restart,
    /// Send the task `change_signal`.
    Signal,
    /// Write the file and do nothing else.
    Noop,
}

impl ChangeMode {
    /// Nomad's name.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeMode::Restart => "restart",
            ChangeMode::Signal => "signal",
            ChangeMode::Noop => "noop",
        }
    }

    /// The mode of Nomad's name, if Drover has it.
    pub fn parse(text: &str) -> Option<ChangeMode> {
        [ChangeMode::Restart, ChangeMode::Signal, ChangeMode::Noop].into_iter().find(|mode| mode.as_str() == text)
    }
}

/// One `template` block of a task.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Template {
    /// The template text (Nomad's `data`, JSON `EmbeddedTmpl`); empty when
    /// it comes from `source`.
    pub data: String,
    /// A file on the client host holding the template text (Nomad's
    /// `source`, JSON `SourcePath`), read each time it renders; relative to
    /// the task's directory unless absolute.
    pub source: Option<String>,
    /// Where the output goes, relative to the task's directory (Nomad's
    /// `destination`, JSON `DestPath`); may use `${...}` variables.
    pub destination: String,
    /// The rendered file's mode, an octal string (`"0644"`).
    pub perms: String,
    /// What a change to the rendered text does to the running task.
    pub change_mode: ChangeMode,
    /// The signal `change_mode = "signal"` sends (upper-cased, `SIGHUP`).
    pub change_signal: Option<String>,
    /// The longest random wait before acting on a change, so that many
    /// allocations re-rendered by one change do not restart at once.
    #[serde(with = "serde_duration")]
    pub splay: Duration,
    /// Render once before the task starts and never again (Nomad 1.7's `once`).
    pub once: bool,
    /// Read the rendered file as `KEY=VALUE` lines into the task's
    /// environment (Nomad's `env`, JSON `Envvars`).
    pub envvars: bool,
    /// The opening delimiter of an action (`{{`).
    pub left_delimiter: String,
    /// The closing delimiter of an action (`}}`).
    pub right_delimiter: String,
    /// A missing map key is an error rather than `<no value>` (Nomad's
    /// `error_on_missing_key`).
    pub error_on_missing_key: bool,
}

impl Template {
    /// A template rendering `data` into `destination`, with Nomad's defaults.
    pub fn new(data: &str, destination: &str) -> Template {
        Template {
            data: data.to_string(),
            source: None,
            destination: destination.to_string(),
            perms: DEFAULT_TEMPLATE_PERMS.to_string(),
            change_mode: ChangeMode::Restart,
            change_signal: None,
            splay: DEFAULT_TEMPLATE_SPLAY,
            once: false,
            envvars: false,
            left_delimiter: "{{".to_string(),
            right_delimiter: "}}".to_string(),
            error_on_missing_key: false,
        }
    }

    /// The file mode of `perms`, if it is an octal mode.
    pub fn mode(&self) -> Option<u32> {
        parse_perms(&self.perms)
    }
}

/// An octal file mode (`"0644"`, `"600"`), at most `07777`.
pub fn parse_perms(text: &str) -> Option<u32> {
    let mode = u32::from_str_radix(text, 8).ok()?;
    (!text.is_empty() && mode <= 0o7777).then_some(mode)
}

/// Why `destination` would not stay inside the task's directory, or `None`:
/// an absolute path, or one whose `..` climbs above where it starts. A
/// path holding `${` is checked by the client once filled in.
pub fn destination_problem(destination: &str) -> Option<String> {
    if destination.contains("${") {
        return None;
    }
    if destination.trim().is_empty() {
        return Some("a template needs a destination".to_string());
    }
    if destination.contains('\0') {
        return Some(format!("destination {destination:?} contains NUL"));
    }
    if destination.starts_with('/') {
        return Some(format!(
            "destination {destination:?} is an absolute path: a destination is a name inside the task's \
             directory (such as \"local/app.conf\"), and this one would become a path outside it"
        ));
    }
    if climbs_out(destination) {
        return Some(format!(
            "destination {destination:?} climbs out of the task's directory with \"..\": a destination is a name \
             inside the task's directory (such as \"local/app.conf\"), and this one would become a path outside it"
        ));
    }
    None
}

/// Whether the relative path `path` leaves the directory it starts from.
pub fn climbs_out(path: &str) -> bool {
    let mut depth: i64 = 0;
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => depth -= 1,
            _ => depth += 1,
        }
        if depth < 0 {
            return true;
        }
    }
    false
}

/// The templates of `task`, checked (contract, step 2).
pub(crate) fn task_template_problems(task: &Task, place: &str, problems: &mut Vec<String>) {
    let mut destinations = std::collections::BTreeSet::new();
    for (index, template) in task.templates.iter().enumerate() {
        let place = format!("{place}, template {}", index + 1);
        template_problems(template, &place, problems);
        let normalized = template.destination.trim_start_matches("./").to_string();
        if !template.destination.is_empty() && !destinations.insert(normalized) {
            problems.push(format!(
                "{place}: destination {:?} is written by another template of the task",
                template.destination
            ));
        }
    }
}

fn template_problems(template: &Template, place: &str, problems: &mut Vec<String>) {
    let has_source = template.source.as_deref().is_some_and(|source| !source.is_empty());
    match (template.data.is_empty(), has_source) {
        (true, false) => problems.push(format!("{place}: must specify a source path or have an embedded template")),
        (false, true) => problems.push(format!("{place}: data and source cannot both be set: choose one")),
        _ => {}
    }
    if let Some(why) = destination_problem(&template.destination) {
        problems.push(format!("{place}: {why}"));
    }
    if template.mode().is_none() {
        problems.push(format!("{place}: perms {:?} is not an octal file mode such as \"0644\"", template.perms));
    }
    match (template.change_mode, template.change_signal.as_deref()) {
        (ChangeMode::Signal, None | Some("")) => {
            problems.push(format!("{place}: must specify a change_signal when change_mode is \"signal\""))
        }
        (ChangeMode::Signal, Some(signal)) if !KILL_SIGNALS.contains(&signal) => {
            problems.push(format!("{place}: change_signal {signal:?} is not one of {}", KILL_SIGNALS.join(", ")))
        }
        _ => {}
    }
    if template.left_delimiter.is_empty() || template.right_delimiter.is_empty() {
        problems.push(format!("{place}: the delimiters must not be empty"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structs::Resources;

    fn task_with(templates: Vec<Template>) -> Task {
        let mut task = Task::new("web", "raw_exec", Resources::new(100, 64, 0));
        task.templates = templates;
        task
    }

    fn problems_of(task: &Task) -> Vec<String> {
        let mut problems = Vec::new();
        task_template_problems(task, "task \"web\"", &mut problems);
        problems
    }

    #[test]
    fn a_template_with_nomads_defaults_is_valid() {
        let task = task_with(vec![Template::new("x={{ env \"A\" }}", "local/app.conf")]);
        assert_eq!(problems_of(&task), Vec::<String>::new());
        assert_eq!(task.templates[0].mode(), Some(0o644));
    }

    #[test]
    fn a_destination_outside_the_task_directory_is_refused() {
        for destination in ["/etc/passwd", "../other/x", "local/../../x", ""] {
            let problems = problems_of(&task_with(vec![Template::new("x", destination)]));
            assert_eq!(problems.len(), 1, "{destination}: {problems:?}");
        }
        let problems = problems_of(&task_with(vec![Template::new("x", "/etc/passwd")]));
        assert!(problems[0].contains("would become a path outside it"), "{problems:?}");
        for destination in ["local/../secrets/x", "./local/a.env", "${NOMAD_SECRETS_DIR}/x"] {
            assert_eq!(problems_of(&task_with(vec![Template::new("x", destination)])), Vec::<String>::new());
        }
    }

    #[test]
    fn data_or_source_perms_signal_and_duplicates_are_checked() {
        let mut neither = Template::new("", "local/a");
        neither.source = None;
        let mut both = Template::new("x", "local/b");
        both.source = Some("/srv/t.tpl".to_string());
        let mut perms = Template::new("x", "local/c");
        perms.perms = "rw-r--r--".to_string();
        let mut signal = Template::new("x", "local/d");
        signal.change_mode = ChangeMode::Signal;
        let mut unknown_signal = Template::new("x", "local/e");
        unknown_signal.change_mode = ChangeMode::Signal;
        unknown_signal.change_signal = Some("SIGFOO".to_string());
        let twice = Template::new("y", "./local/e");
        let problems = problems_of(&task_with(vec![neither, both, perms, signal, unknown_signal, twice]));
        let expected = [
            "template 1: must specify a source path or have an embedded template",
            "template 2: data and source cannot both be set",
            "template 3: perms \"rw-r--r--\" is not an octal file mode",
            "template 4: must specify a change_signal",
            "template 5: change_signal \"SIGFOO\" is not one of",
            "template 6: destination \"./local/e\" is written by another template",
        ];
        assert_eq!(problems.len(), expected.len(), "{problems:?}");
        for (problem, expected) in problems.iter().zip(expected) {
            assert!(problem.contains(expected), "{problem} / {expected}");
        }
    }

    #[test]
    fn perms_parse_as_octal() {
        assert_eq!(parse_perms("0600"), Some(0o600));
        assert_eq!(parse_perms("755"), Some(0o755));
        assert_eq!(parse_perms("0800"), None);
        assert_eq!(parse_perms("17777"), None);
        assert_eq!(parse_perms(""), None);
    }
}
