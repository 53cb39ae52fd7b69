//! The dependency rule, checked on the source: nothing in a lower layer of
//! `engine` imports a higher one (ARCHITECTURE.md, "Code map"). Unit tests
//! are exempt: they may use fixtures from any layer.

use std::path::{Path, PathBuf};

/// The layers, lowest first; a module may import only its own layer and those before it.
const LAYERS: &[&str] = &[
    "clock",
    "sync",
    "timing",
    "structs",
    "events",
    "state",
    "scheduler",
    "job_plan",
    "eval",
    "plan",
    "router",
    "node",
    "worker",
    "periodic",
    "job_endpoint",
    "acl_endpoint",
    "operator_endpoint",
    "deployment",
    "server",
    "testing",
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| *layer == module)
}

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

/// The top-level module a file under `src/` belongs to.
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).expect("under src");
    let first = relative.components().next().expect("a component").as_os_str().to_string_lossy().to_string();
    first.trim_end_matches(".rs").to_string()
}

#[test]
fn no_module_imports_a_higher_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    for file in &files {
        let module = module_of(&src, file);
        let Some(own) = layer_of(&module) else { continue };
        if file.to_string_lossy().ends_with("_test.rs") {
            continue; // Tests may use fixtures from any layer.
        }
        let text = std::fs::read_to_string(file).expect("readable source");
        // Inline unit tests sit at the end of their file, in `mod tests`.
        let lines = text.lines().take_while(|line| !line.starts_with("mod tests {"));
        // Docs may point anywhere; code may not.
        let code = lines.enumerate().filter(|(_, line)| !line.trim_start().starts_with("//"));
        for (number, line) in code {
            for (position, _) in line.match_indices("crate::") {
                let rest = &line[position + "crate::".len()..];
                let imported: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if let Some(theirs) = layer_of(&imported) {
                    if theirs > own {
                        violations.push(format!("{}:{}: {module} imports {imported}", file.display(), number + 1));
                    }
                }
            }
        }
    }
    assert!(violations.is_empty(), "lower layers import higher ones:\n{}", violations.join("\n"));
    assert!(files.len() > 30, "the check read the source tree");
}
