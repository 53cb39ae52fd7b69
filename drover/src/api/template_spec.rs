//! The `Templates` of a submitted task (Nomad's `api.Template`), read
//! leniently and turned into the engine's [`Template`] with Nomad's
//! defaults (`perms` `0644`, `change_mode` `restart`, `splay` 5 s,
//! delimiters `{{` `}}`, a `change_signal` upper-cased). Every field is
//! honoured, warned of, or refused; none is dropped silently:
//!
//! - honoured: `EmbeddedTmpl`, `SourcePath`, `DestPath`, `Perms`,
//!   `ChangeMode` (`restart`, `signal`, `noop`), `ChangeSignal`, `Splay`,
//!   `Once`, `Envvars`, `LeftDelim`, `RightDelim`, `ErrMissingKey`;
//! - warned of and ignored: `Uid`, `Gid` (the file belongs to the agent's
//!   user), `Wait` (every change is rendered at once), `VaultGrace`
//!   (Drover has no Vault);
//! - refused: `ChangeMode = "script"` and a `ChangeScript`, since the task
//!   would not be told of a change the job counts on it hearing of.
//!
//! What the engine checks (a destination inside the task's directory,
//! octal perms, a known signal) is `Job::validate`'s to refuse.

use std::collections::BTreeMap;
use std::time::Duration;

use engine::structs::{ChangeMode, Template, DEFAULT_TEMPLATE_PERMS, DEFAULT_TEMPLATE_SPLAY};
use serde::Deserialize;
use serde_json::Value;

use super::spec::{is_set, says_something, JobSpecError};

/// A template (`api.Template`); durations in nanoseconds.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct TemplateSpec {
    pub source_path: Option<String>,
    pub dest_path: Option<String>,
    pub embedded_tmpl: Option<String>,
    pub change_mode: Option<String>,
    pub change_signal: Option<String>,
    pub change_script: Option<Value>,
    pub splay: Option<i64>,
    pub perms: Option<String>,
    pub once: Option<bool>,
    pub envvars: Option<bool>,
    pub left_delim: Option<String>,
    pub right_delim: Option<String>,
    pub err_missing_key: Option<bool>,
    pub uid: Option<Value>,
    pub gid: Option<Value>,
    pub vault_grace: Option<Value>,
    pub wait: Option<Value>,
    /// Fields Drover does not know: warned of when set.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// Converts a task's `Templates`; `place` is `TaskGroup "g": Task "t": `.
pub fn convert_templates(
    templates: Option<Vec<TemplateSpec>>,
    place: &str,
    warnings: &mut Vec<String>,
) -> Result<Vec<Template>, JobSpecError> {
    templates
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(index, template)| {
            let destination = template.dest_path.clone().unwrap_or_default();
            let place = format!("{place}Template {} ({destination:?}): ", index + 1);
            convert_template(template, &place, warnings)
        })
        .collect()
}

fn convert_template(api: TemplateSpec, place: &str, warnings: &mut Vec<String>) -> Result<Template, JobSpecError> {
    let change_mode = match api.change_mode.as_deref().unwrap_or("") {
        "" => ChangeMode::Restart,
        "script" => {
            return Err(JobSpecError::new(format!(
                "{place}ChangeMode \"script\" is refused: Drover does not run change scripts, and the task would \
                 never hear of a changed file; use \"restart\", \"signal\" or \"noop\"; nothing was registered"
            )))
        }
        text => ChangeMode::parse(text).ok_or_else(|| {
            JobSpecError::new(format!("{place}ChangeMode {text:?} is not one of restart, signal or noop"))
        })?,
    };
    if is_set(&api.change_script) {
        return Err(JobSpecError::new(format!(
            "{place}ChangeScript is refused: Drover does not run change scripts; nothing was registered"
        )));
    }
    for (field, value, why) in [
        ("Uid", &api.uid, "the file is owned by the agent's user"),
        ("Gid", &api.gid, "the file is owned by the agent's group"),
        ("Wait", &api.wait, "every change is rendered at once"),
        ("VaultGrace", &api.vault_grace, "Drover has no Vault"),
    ] {
        if is_set(value) {
            warnings.push(format!("{place}{field} is not implemented by Drover and was ignored: {why}"));
        }
    }
    for (field, value) in &api.other {
        if says_something(value) {
            warnings.push(format!("{place}{field} is not known to Drover and was ignored"));
        }
    }
    let splay = match api.splay {
        None => DEFAULT_TEMPLATE_SPLAY,
        Some(nanos) => Duration::from_nanos(
            u64::try_from(nanos).map_err(|_| JobSpecError::new(format!("{place}Splay must not be negative")))?,
        ),
    };
    let non_empty = |text: Option<String>| text.filter(|text| !text.is_empty());
    let mut template = Template::new(&api.embedded_tmpl.unwrap_or_default(), &api.dest_path.unwrap_or_default());
    template.source = non_empty(api.source_path);
    template.perms = non_empty(api.perms).unwrap_or_else(|| DEFAULT_TEMPLATE_PERMS.to_string());
    template.change_mode = change_mode;
    template.change_signal = non_empty(api.change_signal).map(|signal| signal.to_uppercase());
    template.splay = splay;
    template.once = api.once.unwrap_or(false);
    template.envvars = api.envvars.unwrap_or(false);
    if let Some(left) = non_empty(api.left_delim) {
        template.left_delimiter = left;
    }
    if let Some(right) = non_empty(api.right_delim) {
        template.right_delimiter = right;
    }
    template.error_on_missing_key = api.err_missing_key.unwrap_or(false);
    Ok(template)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn convert(templates: Value) -> Result<(Vec<Template>, Vec<String>), JobSpecError> {
        let specs: Vec<TemplateSpec> = serde_json::from_value(templates).expect("lenient");
        let mut warnings = Vec::new();
        let converted = convert_templates(Some(specs), "Task \"t\": ", &mut warnings)?;
        Ok((converted, warnings))
    }

    #[test]
    fn nomads_defaults_fill_what_a_template_leaves_out() {
        let (templates, warnings) =
            convert(json!([{"EmbeddedTmpl": "x", "DestPath": "local/x", "ChangeMode": null}])).expect("ok");
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(templates, [Template::new("x", "local/x")]);
        let template = &templates[0];
        assert_eq!(
            (template.perms.as_str(), template.change_mode, template.splay),
            ("0644", ChangeMode::Restart, DEFAULT_TEMPLATE_SPLAY)
        );
        assert_eq!((template.left_delimiter.as_str(), template.right_delimiter.as_str()), ("{{", "}}"));
    }

    #[test]
    fn every_honoured_field_is_read() {
        let (templates, warnings) = convert(json!([{"SourcePath": "/srv/app.tpl", "DestPath": "secrets/app.env",
            "ChangeMode": "signal", "ChangeSignal": "sigusr1", "Splay": 0, "Perms": "0600", "Once": true,
            "Envvars": true, "LeftDelim": "[[", "RightDelim": "]]", "ErrMissingKey": true}]))
        .expect("ok");
        assert!(warnings.is_empty(), "{warnings:?}");
        let template = &templates[0];
        assert_eq!(template.source.as_deref(), Some("/srv/app.tpl"));
        assert_eq!((template.change_mode, template.change_signal.as_deref()), (ChangeMode::Signal, Some("SIGUSR1")));
        assert_eq!((template.splay, template.perms.as_str()), (Duration::ZERO, "0600"));
        assert!(template.once && template.envvars && template.error_on_missing_key);
        assert_eq!((template.left_delimiter.as_str(), template.right_delimiter.as_str()), ("[[", "]]"));
    }

    #[test]
    fn a_template_read_back_from_the_api_converts_to_itself() {
        let mut template = Template::new("{{ env \"X\" }}", "secrets/x.env");
        template.source = None;
        template.change_mode = ChangeMode::Signal;
        template.change_signal = Some("SIGUSR1".to_string());
        template.splay = Duration::from_millis(1500);
        template.envvars = true;
        template.once = true;
        let written = serde_json::to_value(crate::api::jobs::Template::from(&template)).expect("serializes");
        assert_eq!(written["DestPath"], "secrets/x.env");
        let (read, warnings) = convert(json!([written])).expect("converts");
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(read, [template]);
    }

    #[test]
    fn what_drover_ignores_is_warned_of_and_scripts_are_refused() {
        let (_, warnings) = convert(json!([{"EmbeddedTmpl": "x", "DestPath": "local/x", "Uid": 1000, "Gid": null,
            "Wait": {"Min": 5_000_000_000u64}, "VaultGrace": 0, "Future": "y"}]))
        .expect("ok");
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(
            warnings[0].starts_with("Task \"t\": Template 1 (\"local/x\"): Uid is not implemented"),
            "{warnings:?}"
        );
        assert!(warnings[1].contains("Wait is not implemented"), "{warnings:?}");
        assert!(warnings[2].contains("Future is not known"), "{warnings:?}");
        let script = convert(json!([{"EmbeddedTmpl": "x", "DestPath": "local/x", "ChangeMode": "script",
            "ChangeScript": {"Command": "/bin/reload"}}]))
        .expect_err("refused");
        assert!(script.to_string().contains("ChangeMode \"script\" is refused"), "{script}");
        let unknown =
            convert(json!([{"EmbeddedTmpl": "x", "DestPath": "l/x", "ChangeMode": "reload"}])).expect_err("no");
        assert!(unknown.to_string().contains("\"reload\" is not one of restart, signal or noop"), "{unknown}");
        let negative = convert(json!([{"EmbeddedTmpl": "x", "DestPath": "l/x", "Splay": -1}])).expect_err("no");
        assert!(negative.to_string().contains("Splay must not be negative"), "{negative}");
    }
}
