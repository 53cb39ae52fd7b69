//! A task's templates (Nomad's `template` block): rendered into the task's
//! directory before every start, and again while it runs when the service
//! registrations they read change.
//!
//! 1. [`render`] is a pure function of the template text, the task's
//!    variables and the service data the agent has read: text or an
//!    error, nothing else. It also says which service queries the text
//!    made ([`Rendered::reads`]) and whether one of them has no answer yet
//!    (`missing`, rendered as an empty list, as consul-template does).
//! 2. Before a start ([`TaskTemplates::render_for_start`]) every template
//!    is rendered, waiting for the service data it reads, and written
//!    atomically into the task's directory with its `perms`; the
//!    `env = true` ones are read as `KEY=VALUE` lines into the task's
//!    environment for that start. A failure stops the start: the task
//!    runner records `Killing` with `Template failed: <why>` and the task
//!    is dead, failed.
//! 3. While the task runs ([`TaskTemplates::changed`]) each new publication
//!    of service data re-renders every template but the `once` ones; a
//!    changed text is written at once, and after a random wait in
//!    `[0, splay)` the task runner acts on its `change_mode`: one restart
//!    however many templates changed (a restart wins over signals), or
//!    each distinct `change_signal` once, or nothing for `noop`.
//! 4. Nothing is written outside the task's directory: a destination is
//!    interpolated, then refused if absolute outside the directory or
//!    climbing out of it; the directory it lands in is resolved through
//!    symlinks and must still be inside; the file is written to a new
//!    temporary name (never through a link the task may have left) and
//!    renamed over the destination.
//!
//! Why `gotmpl` (0.6): it is a port of Go's `text/template` kept in step
//! with Go (its test suite runs Go's own cases, `go_compat`), covers the
//! whole syntax (pipelines, `with`/`range`/`else`, `define`/`block`,
//! `break`/`continue`, whitespace trimming, custom delimiters,
//! `missingkey=error`), forbids unsafe code and denies panics, and is
//! maintained (several releases in 2025-2026). `gtmpl` 0.7, the older
//! choice, has had no release since 2021, does not implement `html`, `js`
//! or a complete `printf`, and its own README calls it work in progress.
//!
//! Functions: Go's built-ins; `env` (the task's variables, never the
//! agent's own), `envOrDefault`, `mustEnv`; `nomadService` and
//! `nomadServices` (this namespace's registrations, `tag.name` filtering
//! by tag); and consul-template's helpers that need no outside system
//! ([`HELPERS`]). A function Drover does not have ([`UNSUPPORTED`]: Consul,
//! Vault, Nomad variables, consul-template helpers not ported) fails the
//! render naming it, wherever in the text it is, before anything runs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use engine::node::service_reads::ServiceQuery;
use engine::structs::{ChangeMode, Template};
use gotmpl::parse::{Expr, ListNode, Node, Parser, PipeNode};
use gotmpl::{MissingKey, TemplateError as GoError, Value};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;

use crate::client::beneath;
use crate::client::service_watch::{Interest, ServiceData, ServiceWatch};

#[path = "template_funcs.rs"]
mod funcs;

pub use funcs::{HELPERS, UNSUPPORTED};

/// Why a template could not be rendered or written. The task runner
/// shows it as `Template failed: <this>`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The text uses a function Drover does not have.
    #[error("template uses {function}, which Drover does not support ({provider})")]
    Unsupported {
        /// The function.
        function: String,
        /// What it belongs to (`Consul`, `Vault`, ...).
        provider: &'static str,
    },
    /// The text uses a function nobody has.
    #[error("template uses function {0:?}, which is not defined")]
    Undefined(String),
    /// The text is not a Go template.
    #[error("parsing the template: {0}")]
    Parse(String),
    /// Executing the text failed (a function's error, a missing key).
    #[error("rendering the template: {0}")]
    Execute(String),
    /// The `source` file could not be read.
    #[error("reading the template source {path:?}: {why}")]
    Source {
        /// The source as written.
        path: String,
        /// Why.
        why: String,
    },
    /// The destination would be outside the task's directory.
    #[error("destination {destination:?}: {why}")]
    Destination {
        /// The destination as interpolated.
        destination: String,
        /// Why.
        why: String,
    },
    /// Writing the file failed.
    #[error("writing {path:?}: {why}")]
    Write {
        /// The file.
        path: String,
        /// Why.
        why: String,
    },
    /// An `env = true` template did not render `KEY=VALUE` lines.
    #[error("reading {destination:?} as environment variables: line {line}: {why}")]
    EnvFile {
        /// The destination.
        destination: String,
        /// The 1-based line.
        line: usize,
        /// Why.
        why: String,
    },
    /// The agent stopped reading services (it is shutting down).
    #[error("the agent stopped reading service registrations")]
    NoServiceData,
}

/// What one render needs besides the text (contract, step 1).
#[derive(Clone, Debug)]
pub struct RenderScope {
    /// The task's variables (`env`).
    pub env: Arc<BTreeMap<String, String>>,
    /// The namespace of the task's job (`nomadService` reads there).
    pub namespace: String,
    /// The service data read so far.
    pub services: Arc<ServiceData>,
}

/// A rendered text and what it read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendered {
    /// The output.
    pub text: String,
    /// Every service query the text made.
    pub reads: BTreeSet<ServiceQuery>,
    /// Whether a query had no answer yet (rendered as empty).
    pub missing: bool,
}

/// Renders `text` as `template` says (its delimiters and missing-key
/// rule) in `scope` (contract, step 1).
pub fn render(template: &Template, text: &str, scope: &RenderScope) -> Result<Rendered, TemplateError> {
    let (left, right) = (template.left_delimiter.as_str(), template.right_delimiter.as_str());
    let (tree, defines) = Parser::new(text, left, right)
        .and_then(Parser::parse)
        .map_err(|error| TemplateError::Parse(error.to_string()))?;
    let mut used = BTreeSet::new();
    functions_in_list(&tree, &mut used);
    for define in &defines {
        functions_in_list(&define.body, &mut used);
    }
    for function in &used {
        funcs::check_known(function)?;
    }
    let recorder = Arc::new(parking_lot::Mutex::new((BTreeSet::new(), false)));
    let missing_key = if template.error_on_missing_key { MissingKey::Error } else { MissingKey::Invalid };
    let parsed = gotmpl::Template::new("")
        .delims(left, right)
        .missing_key(missing_key)
        .funcs(funcs::function_map(scope, &recorder))
        .parse(text)
        .map_err(|error| TemplateError::Parse(error.to_string()))?;
    let output = parsed.execute_to_string(&Value::Nil).map_err(|error| match error {
        GoError::UndefinedFunction(function) => TemplateError::Undefined(function),
        other => TemplateError::Execute(other.to_string()),
    })?;
    let (reads, missing) = std::mem::take(&mut *recorder.lock());
    Ok(Rendered { text: output, reads, missing })
}

/// Adds every function name `list` calls to `used`.
fn functions_in_list(list: &ListNode, used: &mut BTreeSet<String>) {
    for node in &list.nodes {
        match node {
            Node::List(inner) => functions_in_list(inner, used),
            Node::Action(action) => functions_in_pipe(&action.pipe, used),
            Node::If(branch) | Node::Range(branch) | Node::With(branch) => {
                functions_in_pipe(&branch.pipe, used);
                functions_in_list(&branch.body, used);
                if let Some(otherwise) = &branch.else_body {
                    functions_in_list(otherwise, used);
                }
            }
            Node::Template(call) => {
                if let Some(pipe) = &call.pipe {
                    functions_in_pipe(pipe, used);
                }
            }
            Node::Define(define) => functions_in_list(&define.body, used),
            Node::Text(_) | Node::Break(_) | Node::Continue(_) => {}
        }
    }
}

fn functions_in_pipe(pipe: &PipeNode, used: &mut BTreeSet<String>) {
    for command in &pipe.commands {
        for expression in &command.args {
            functions_in_expr(expression, used);
        }
    }
}

fn functions_in_expr(expression: &Expr, used: &mut BTreeSet<String>) {
    match expression {
        Expr::Identifier(_, name) => {
            used.insert(name.to_string());
        }
        Expr::Pipe(_, pipe) => functions_in_pipe(pipe, used),
        Expr::Chain(_, inner, _) => functions_in_expr(inner, used),
        _ => {}
    }
}

/// `text` (an `env = true` template's output) as environment variables:
/// `KEY=VALUE` lines, blank lines and `#` comments skipped, an optional
/// `export ` before the key, a value in double quotes (with `\n`, `\"`,
/// `\\` escapes) or single quotes (as written), or bare up to a ` #`
/// comment, trimmed.
pub fn parse_env_file(text: &str) -> Result<BTreeMap<String, String>, (usize, String)> {
    let mut vars = BTreeMap::new();
    for (at, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").map(str::trim_start).unwrap_or(line);
        let Some((key, value)) = line.split_once('=') else {
            return Err((at + 1, format!("{line:?} is not KEY=VALUE")));
        };
        let key = key.trim();
        let valid = key
            .chars()
            .enumerate()
            .all(|(i, c)| c == '_' || c.is_ascii_alphabetic() || (i > 0 && (c.is_ascii_digit() || c == '.')));
        if key.is_empty() || !valid {
            return Err((at + 1, format!("{key:?} is not a variable name")));
        }
        vars.insert(key.to_string(), env_value(value.trim()).map_err(|why| (at + 1, why))?);
    }
    Ok(vars)
}

fn env_value(value: &str) -> Result<String, String> {
    if let Some(quoted) = value.strip_prefix('"') {
        let mut out = String::new();
        let mut chars = quoted.chars();
        while let Some(c) = chars.next() {
            match c {
                '"' => return Ok(out),
                '\\' => match chars.next() {
                    Some('n') => out.push('\n'),
                    Some('t') => out.push('\t'),
                    Some(other) => out.push(other),
                    None => break,
                },
                c => out.push(c),
            }
        }
        return Err(format!("unclosed double quote in {value:?}"));
    }
    if let Some(quoted) = value.strip_prefix('\'') {
        return quoted
            .split_once('\'')
            .map(|(inside, _)| inside.to_string())
            .ok_or_else(|| format!("unclosed single quote in {value:?}"));
    }
    let bare = value.split(" #").next().unwrap_or(value);
    Ok(bare.trim_end().to_string())
}

/// Where `destination` (interpolated) lands in `task_dir`, or why it may
/// not (contract, step 4; the symlink check is [`write_rendered`]'s).
pub fn resolve_destination(task_dir: &Path, destination: &str) -> Result<PathBuf, TemplateError> {
    let refuse = |why: &str| TemplateError::Destination { destination: destination.to_string(), why: why.to_string() };
    if destination.contains("${") {
        return Err(refuse("names a variable the task does not have"));
    }
    if destination.contains('\0') {
        return Err(refuse("contains NUL"));
    }
    let relative = match Path::new(destination).strip_prefix(task_dir) {
        Ok(inside) => inside.to_string_lossy().into_owned(),
        Err(_) if destination.starts_with('/') => {
            return Err(refuse("would become a path outside the task's directory (it is absolute)"))
        }
        Err(_) => destination.to_string(),
    };
    if engine::structs::climbs_out(&relative) {
        return Err(refuse("would become a path outside the task's directory (it climbs out with \"..\")"));
    }
    let mut path = task_dir.to_path_buf();
    for component in Path::new(&relative).components() {
        match component {
            Component::Normal(part) => path.push(part),
            Component::ParentDir => {
                path.pop();
            }
            _ => {}
        }
    }
    if path == task_dir {
        return Err(refuse("names the task's directory itself, not a file in it"));
    }
    Ok(path)
}

/// Writes `text` to `path` (inside `task_dir`) with `mode`, atomically,
/// never through a link (contract, step 4; `beneath.rs`).
pub fn write_rendered(task_dir: &Path, path: &Path, text: &str, mode: u32) -> Result<(), TemplateError> {
    let failed = |why: String| TemplateError::Write { path: path.display().to_string(), why };
    let relative = path.strip_prefix(task_dir).map_err(|_| failed("it is not inside the task's directory".into()))?;
    beneath::write(task_dir, relative, text, mode).map_err(|error| failed(error.to_string()))
}

/// Where a task's templates live and read from.
#[derive(Clone, Debug)]
pub struct TemplateSite {
    /// The task's directory (`<alloc>/<task>`).
    pub task_dir: PathBuf,
    /// Whether the task may read a `source` anywhere on the host (raw_exec
    /// runs with the agent's rights already); other drivers read sources
    /// inside the task's directory only, as Nomad's file sandbox.
    pub host_sources: bool,
}

/// What a changed rendering asks of the running task (contract, step 3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TemplateAction {
    /// Restart it.
    Restart,
    /// Send it each of these signals (by name), once.
    Signal(BTreeSet<String>),
}

impl TemplateAction {
    /// This action and `other` as one: a restart wins.
    fn merge(self, other: TemplateAction) -> TemplateAction {
        match (self, other) {
            (TemplateAction::Signal(mut mine), TemplateAction::Signal(theirs)) => {
                mine.extend(theirs);
                TemplateAction::Signal(mine)
            }
            _ => TemplateAction::Restart,
        }
    }
}

/// The action waiting for its splay.
#[derive(Debug)]
struct Pending {
    at: tokio::time::Instant,
    action: TemplateAction,
}

/// A task's templates over its life (contract, steps 2 and 3).
#[derive(Debug)]
pub struct TaskTemplates {
    templates: Vec<Template>,
    site: TemplateSite,
    /// The task's variables: `env` reads them, destinations use them.
    env: Arc<BTreeMap<String, String>>,
    namespace: String,
    services: ServiceWatch,
    data: watch::Receiver<Arc<ServiceData>>,
    interest: Option<Interest>,
    /// The text last written, per template.
    written: Vec<Option<String>>,
    pending: Option<Pending>,
    rng: SmallRng,
}

/// One pass over every template.
struct Pass {
    texts: Vec<String>,
    reads: BTreeSet<ServiceQuery>,
    missing: bool,
}

impl TaskTemplates {
    /// The templates `templates` of a task in `namespace` whose variables
    /// are `env`.
    pub fn new(
        templates: Vec<Template>,
        site: TemplateSite,
        env: BTreeMap<String, String>,
        namespace: &str,
        services: ServiceWatch,
    ) -> TaskTemplates {
        let written = vec![None; templates.len()];
        TaskTemplates {
            templates,
            site,
            env: Arc::new(env),
            namespace: namespace.to_string(),
            data: services.data(),
            services,
            interest: None,
            written,
            pending: None,
            rng: SmallRng::from_os_rng(),
        }
    }

    /// Whether the task has templates.
    pub fn is_empty(&self) -> bool {
        self.templates.is_empty()
    }

    /// Renders and writes every template before a start, waiting for the
    /// service data they read; the variables of the `env = true` ones
    /// (contract, step 2). Cancel-safe.
    pub async fn render_for_start(&mut self) -> Result<BTreeMap<String, String>, TemplateError> {
        self.pending = None;
        loop {
            let data = self.data.borrow_and_update().clone();
            let pass = self.pass(&data, false)?;
            if pass.missing {
                self.data.changed().await.map_err(|_| TemplateError::NoServiceData)?;
                continue;
            }
            let mut vars = BTreeMap::new();
            for (at, text) in pass.texts.into_iter().enumerate() {
                let path = self.write(at, &text)?;
                if self.templates[at].envvars {
                    let destination = path.display().to_string();
                    let read = parse_env_file(&text).map_err(|(line, why)| TemplateError::EnvFile {
                        destination,
                        line,
                        why,
                    })?;
                    vars.extend(read);
                }
                self.written[at] = Some(text);
            }
            return Ok(vars);
        }
    }

    /// While the task runs: resolves, after the splay, with what a changed
    /// rendering asks of it, or with why rendering failed; never when
    /// nothing it reads can change (contract, step 3). Cancel-safe: the
    /// state is kept between calls.
    pub async fn changed(&mut self) -> Result<TemplateAction, TemplateError> {
        loop {
            if let Some(pending) = &self.pending {
                tokio::time::sleep_until(pending.at).await;
                let pending = self.pending.take().expect("set before the wait");
                return Ok(pending.action);
            }
            if self.templates.iter().all(|template| template.once) {
                return std::future::pending().await;
            }
            // Before the first pass (a task re-attached after the agent
            // restarted) nothing is read yet: render at once to ask for it.
            if self.interest.is_some() && self.data.changed().await.is_err() {
                return std::future::pending().await;
            }
            let data = self.data.borrow_and_update().clone();
            let pass = self.pass(&data, true)?;
            if pass.missing {
                continue;
            }
            for (at, text) in pass.texts.into_iter().enumerate() {
                if self.templates[at].once {
                    continue;
                }
                // A re-attached task's files are what it last saw.
                let previous = match &self.written[at] {
                    Some(previous) => Some(previous.clone()),
                    None => self.on_disk(at),
                };
                if previous.as_deref() == Some(text.as_str()) {
                    self.written[at] = Some(text);
                    continue;
                }
                self.write(at, &text)?;
                self.written[at] = Some(text);
                let template = &self.templates[at];
                let action = match template.change_mode {
                    ChangeMode::Noop => continue,
                    ChangeMode::Restart => TemplateAction::Restart,
                    ChangeMode::Signal => TemplateAction::Signal(template.change_signal.iter().cloned().collect()),
                };
                let wait = self.splay(template.splay);
                let at = tokio::time::Instant::now() + wait;
                self.pending = Some(match self.pending.take() {
                    Some(pending) => Pending { at: pending.at.min(at), action: pending.action.merge(action) },
                    None => Pending { at, action },
                });
            }
        }
    }

    fn splay(&mut self, splay: Duration) -> Duration {
        match splay.as_nanos() {
            0 => Duration::ZERO,
            nanos => Duration::from_nanos(self.rng.random_range(0..nanos.min(u64::MAX as u128) as u64)),
        }
    }

    /// Renders every template (but the `once` ones while running) with
    /// `data`, and keeps the agent reading what they read.
    fn pass(&mut self, data: &Arc<ServiceData>, running: bool) -> Result<Pass, TemplateError> {
        let scope = RenderScope { env: self.env.clone(), namespace: self.namespace.clone(), services: data.clone() };
        let mut pass = Pass { texts: Vec::new(), reads: BTreeSet::new(), missing: false };
        for template in &self.templates {
            if running && template.once {
                pass.texts.push(String::new());
                continue;
            }
            let text = self.text_of(template)?;
            let rendered = render(template, &text, &scope)?;
            pass.reads.extend(rendered.reads);
            pass.missing |= rendered.missing;
            pass.texts.push(rendered.text);
        }
        let held = self.interest.as_ref().map(Interest::queries);
        if held != Some(&pass.reads) {
            self.interest = Some(self.services.interest(pass.reads.clone()));
        }
        Ok(pass)
    }

    /// The template's text: its `data`, or its `source` read now.
    fn text_of(&self, template: &Template) -> Result<String, TemplateError> {
        let Some(source) = template.source.as_deref().filter(|source| !source.is_empty()) else {
            return Ok(template.data.clone());
        };
        let refuse = |why: String| TemplateError::Source { path: source.to_string(), why };
        let inside = if source.starts_with('/') {
            Path::new(source).strip_prefix(&self.site.task_dir).ok()
        } else {
            Some(Path::new(source))
        };
        let read = match (inside, self.site.host_sources) {
            // raw_exec runs with the agent's rights: any regular file.
            (_, true) => beneath::read_anywhere(&self.site.task_dir.join(source)),
            (Some(relative), false) => beneath::read(&self.site.task_dir, relative),
            (None, false) => {
                return Err(refuse(
                    "it is outside the task's directory: only raw_exec tasks, which run with the agent's rights, \
                     read templates from anywhere on the host"
                        .to_string(),
                ))
            }
        };
        read.map_err(|error| refuse(error.to_string()))
    }

    /// Writes template `at`'s `text`; the file written.
    fn write(&self, at: usize, text: &str) -> Result<PathBuf, TemplateError> {
        let template = &self.templates[at];
        let destination = crate::client::task_env::interpolate_with(&template.destination, &self.env);
        let path = resolve_destination(&self.site.task_dir, &destination)?;
        let mode = template.mode().ok_or_else(|| TemplateError::Write {
            path: path.display().to_string(),
            why: format!("perms {:?} is not an octal mode", template.perms),
        })?;
        write_rendered(&self.site.task_dir, &path, text, mode)?;
        Ok(path)
    }

    /// What template `at`'s file holds now, if it can be read.
    fn on_disk(&self, at: usize) -> Option<String> {
        let destination = crate::client::task_env::interpolate_with(&self.templates[at].destination, &self.env);
        let path = resolve_destination(&self.site.task_dir, &destination).ok()?;
        let relative = path.strip_prefix(&self.site.task_dir).ok()?;
        beneath::read(&self.site.task_dir, relative).ok()
    }
}

#[cfg(test)]
#[path = "template_test.rs"]
mod template_test;
