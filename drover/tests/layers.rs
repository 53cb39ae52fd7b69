//! The dependency rules of the `drover` crate, checked on the source
//! (ARCHITECTURE.md, "drover/"):
//! 1. The client agent (`client/`) imports nothing from `server`, `http`
//!    or `cli`: it runs on hosts that run no server.
//! 2. The CLI's commands reach a server only through `api`; only
//!    `cli/run/`, the process wiring, imports `server` and `client`.
//! 3. `api`, `config`, `logging`, `tls_files` and `listener` import none of
//!    the process parts (`server`, `http`, `client`, `cli`).
//! 4. No import circle between files: following `crate::` and `super::`
//!    paths from any file never leads back to it.
//!
//! Unit tests (after `mod tests {`) and comments are exempt.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable source dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// A file's module path under `src/`: `client/agent.rs` is
/// `["client", "agent"]`, `http/mod.rs` is `["http"]`.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).expect("under src").with_extension("");
    let mut path: Vec<String> =
        relative.components().map(|part| part.as_os_str().to_string_lossy().to_string()).collect();
    if path.last().is_some_and(|last| last == "mod" || last == "lib" || last == "main") {
        path.pop();
    }
    path
}

/// The source lines that count: no comments, no unit tests.
fn code_lines(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .take_while(|line| !line.starts_with("mod tests {"))
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
        .map(|(number, line)| (number + 1, line.to_string()))
        .collect()
}

/// Every module path a line names through `crate::` or `super::`,
/// absolute (`super::` resolved against `own`, the file's module path).
/// A `{...}` group after a path adds each of its items' first segment.
fn named_paths(line: &str, own: &[String]) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for start in ["crate::", "super::"] {
        for (position, _) in line.match_indices(start) {
            if position > 0 && line[..position].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
                continue; // `super::` inside a longer path was counted with it.
            }
            let mut base: Vec<String> = Vec::new();
            let mut rest = &line[position..];
            if start == "super::" {
                // The parent of a file's module: `super` of `a/b.rs` and of
                // `a/b/mod.rs` (both module a::b) is `a`.
                base = own.to_vec();
                while let Some(after) = rest.strip_prefix("super::") {
                    base.pop();
                    rest = after;
                }
            } else {
                rest = &rest["crate::".len()..];
            }
            let mut path = base.clone();
            for segment in rest.split("::") {
                let name: String = segment.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if name.is_empty() {
                    break;
                }
                path.push(name.clone());
                if name.len() != segment.len() {
                    break;
                }
            }
            found.push(path.clone());
            if let Some(group) = rest.find("::{").map(|at| &rest[at + 3..]) {
                let inner = group.split('}').next().unwrap_or_default();
                let prefix_len = rest[..rest.find("::{").unwrap_or(0)].split("::").count();
                let prefix: Vec<String> =
                    base.iter().cloned().chain(path.iter().skip(base.len()).take(prefix_len).cloned()).collect();
                for item in inner.split(',') {
                    let name: String = item.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                    if !name.is_empty() && name != "self" {
                        let mut item_path = prefix.clone();
                        item_path.push(name);
                        found.push(item_path);
                    }
                }
            }
        }
    }
    found
}

/// The file a module path leads to: its longest prefix that is a file.
fn file_of(modules: &BTreeMap<Vec<String>, PathBuf>, path: &[String]) -> Option<PathBuf> {
    (1..=path.len()).rev().find_map(|len| modules.get(&path[..len]).cloned())
}

struct Source {
    /// Module path to file.
    modules: BTreeMap<Vec<String>, PathBuf>,
    /// File to (line, module path named) for every import.
    imports: BTreeMap<PathBuf, Vec<(usize, Vec<String>)>>,
}

fn read_source() -> Source {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.retain(|file| !file.ends_with("main.rs"));
    let modules: BTreeMap<Vec<String>, PathBuf> =
        files.iter().map(|file| (module_path(&src, file), file.clone())).collect();
    let mut imports = BTreeMap::new();
    for file in &files {
        let own = module_path(&src, file);
        let text = std::fs::read_to_string(file).expect("readable source");
        let mut named = Vec::new();
        for (number, line) in code_lines(&text) {
            for path in named_paths(&line, &own) {
                named.push((number, path));
            }
        }
        imports.insert(file.clone(), named);
    }
    assert!(modules.len() > 50, "the check read the source tree ({} files)", modules.len());
    Source { modules, imports }
}

/// The rules 1-3: what each part may not import.
const FORBIDDEN: &[(&str, &[&str])] = &[
    ("client", &["server", "http", "cli"]),
    ("api", &["server", "http", "client", "cli"]),
    ("config", &["server", "http", "client", "cli"]),
    ("logging", &["server", "http", "client", "cli"]),
    ("tls_files", &["server", "http", "client", "cli"]),
    ("listener", &["server", "http", "client", "cli"]),
    ("server", &["client", "cli"]),
    ("http", &["client", "cli"]),
];

fn top(module: &[String]) -> &str {
    module.first().map_or("", String::as_str)
}

#[test]
fn each_part_imports_only_what_its_layer_allows() {
    let source = read_source();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut violations = Vec::new();
    for (file, named) in &source.imports {
        let own = module_path(&src, file);
        let mut forbidden: Vec<&str> = FORBIDDEN
            .iter()
            .filter(|(part, _)| top(&own) == *part)
            .flat_map(|(_, forbidden)| forbidden.iter().copied())
            .collect();
        let is_run = own.len() >= 2 && own[0] == "cli" && own[1] == "run";
        if top(&own) == "cli" && !is_run {
            forbidden.extend(["server", "http", "client"]);
        }
        for (line, path) in named {
            if forbidden.contains(&top(path)) {
                violations.push(format!("{}:{line}: imports {}", file.display(), path.join("::")));
            }
        }
    }
    assert!(violations.is_empty(), "imports across the layers:\n{}", violations.join("\n"));
}

#[test]
fn no_file_imports_itself_through_others() {
    let source = read_source();
    let mut edges: BTreeMap<&PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for (file, named) in &source.imports {
        let targets = named
            .iter()
            .filter_map(|(_, path)| file_of(&source.modules, path))
            .filter(|target| target != file)
            // A module naming an enclosing folder's `mod.rs`
            // (`super::ApiState`, `crate::client::drivers::StartError` from
            // `drivers/docker/`) is the module tree, not a circle with it.
            .filter(|target| !(target.ends_with("mod.rs") && target.parent().is_some_and(|dir| file.starts_with(dir))));
        edges.entry(file).or_default().extend(targets);
    }
    let mut circles = Vec::new();
    for start in edges.keys() {
        // Depth-first from `start`: reaching it again is a circle.
        let mut stack: Vec<(PathBuf, Vec<PathBuf>)> = vec![((*start).clone(), vec![(*start).clone()])];
        let mut seen = BTreeSet::new();
        while let Some((file, trail)) = stack.pop() {
            for next in edges.get(&file).into_iter().flatten() {
                if next == *start {
                    circles.push(trail.iter().chain([next]).map(|file| file.display().to_string()).collect::<Vec<_>>());
                } else if seen.insert(next.clone()) {
                    stack.push((next.clone(), trail.iter().cloned().chain([next.clone()]).collect()));
                }
            }
        }
    }
    let shown: Vec<String> = circles.iter().map(|circle| circle.join(" -> ")).collect();
    assert!(shown.is_empty(), "import circles:\n{}", shown.join("\n"));
}
