//! The functions a template may call besides Go's built-ins, and the ones
//! it may not: `env`, `nomadService`, `nomadServices` and
//! consul-template's helpers that need no outside system, with
//! consul-template's argument order (the piped value last).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use base64::Engine as _;
use engine::node::service_reads::{ServiceAnswer, ServiceQuery};
use engine::structs::ServiceRegistration;
use gotmpl::{FuncMap, TemplateError as GoError, Value};

use super::{RenderScope, TemplateError};

/// Go's `text/template` built-ins.
const BUILTINS: &[&str] = &[
    "and", "call", "html", "index", "slice", "js", "len", "not", "or", "print", "printf", "println", "urlquery", "eq",
    "ge", "gt", "le", "lt", "ne",
];

/// consul-template's helpers Drover implements (besides `env`,
/// `envOrDefault`, `mustEnv`, `nomadService` and `nomadServices`).
pub const HELPERS: &[&str] = &[
    "base64Decode",
    "base64Encode",
    "base64URLDecode",
    "base64URLEncode",
    "contains",
    "containsAll",
    "containsAny",
    "containsNone",
    "containsNotAll",
    "in",
    "indent",
    "join",
    "parseBool",
    "parseFloat",
    "parseInt",
    "parseJSON",
    "parseUint",
    "regexMatch",
    "regexReplaceAll",
    "replaceAll",
    "split",
    "toJSON",
    "toJSONPretty",
    "toLower",
    "toTitle",
    "toUnescapedJSON",
    "toUnescapedJSONPretty",
    "toUpper",
    "trim",
    "trimPrefix",
    "trimSpace",
    "trimSuffix",
    "add",
    "subtract",
    "multiply",
    "divide",
    "modulo",
    "minimum",
    "maximum",
];

/// Functions Nomad's templates have that Drover does not, with what they
/// belong to: a template using one fails naming it.
pub const UNSUPPORTED: &[(&str, &str)] = &[
    ("key", "Consul"),
    ("keyExists", "Consul"),
    ("keyOrDefault", "Consul"),
    ("ls", "Consul"),
    ("safeLs", "Consul"),
    ("tree", "Consul"),
    ("safeTree", "Consul"),
    ("service", "Consul"),
    ("services", "Consul"),
    ("connect", "Consul"),
    ("node", "Consul"),
    ("nodes", "Consul"),
    ("datacenters", "Consul"),
    ("partitions", "Consul"),
    ("peerings", "Consul"),
    ("exportedServices", "Consul"),
    ("caRoots", "Consul"),
    ("caLeaf", "Consul"),
    ("byKey", "Consul"),
    ("byTag", "Consul"),
    ("byPort", "Consul"),
    ("byMeta", "Consul"),
    ("secret", "Vault"),
    ("secrets", "Vault"),
    ("pkiCert", "Vault"),
    ("nomadVar", "Nomad variables"),
    ("nomadVarList", "Nomad variables"),
    ("nomadVarListSafe", "Nomad variables"),
    ("nomadVarExists", "Nomad variables"),
    ("file", "a consul-template function reading the agent's files"),
    ("writeToFile", "a consul-template function writing the agent's files"),
    ("plugin", "a consul-template function running programs on the agent"),
    ("executeTemplate", "a consul-template helper not implemented"),
    ("scratch", "a consul-template helper not implemented"),
    ("sockaddr", "a consul-template helper not implemented"),
    ("timestamp", "a consul-template helper not implemented"),
    ("loop", "a consul-template helper not implemented"),
    ("explode", "a consul-template helper not implemented"),
    ("explodeMap", "a consul-template helper not implemented"),
    ("mergeMap", "a consul-template helper not implemented"),
    ("mergeMapWithOverride", "a consul-template helper not implemented"),
    ("splitToMap", "a consul-template helper not implemented"),
    ("parseYAML", "a consul-template helper not implemented"),
    ("toYAML", "a consul-template helper not implemented"),
    ("toTOML", "a consul-template helper not implemented"),
    ("sha256Hex", "a consul-template helper not implemented"),
    ("md5sum", "a consul-template helper not implemented"),
    ("hmacSHA256Hex", "a consul-template helper not implemented"),
];

/// The names of the functions a [`function_map`] holds, built-ins included.
fn is_defined(function: &str) -> bool {
    BUILTINS.contains(&function)
        || HELPERS.contains(&function)
        || ["env", "envOrDefault", "mustEnv", "nomadService", "nomadServices"].contains(&function)
}

/// Refuses a function the text calls that Drover does not have.
pub(super) fn check_known(function: &str) -> Result<(), TemplateError> {
    if let Some((_, provider)) = UNSUPPORTED.iter().find(|(name, _)| *name == function) {
        return Err(TemplateError::Unsupported { function: function.to_string(), provider });
    }
    if function.starts_with("sprig_") || function.starts_with("spew_") {
        let provider = "a consul-template helper library not implemented";
        return Err(TemplateError::Unsupported { function: function.to_string(), provider });
    }
    if !is_defined(function) {
        return Err(TemplateError::Undefined(function.to_string()));
    }
    Ok(())
}

/// What a render's functions record: the queries made, and whether one
/// had no answer yet.
pub(super) type Recorder = Arc<parking_lot::Mutex<(BTreeSet<ServiceQuery>, bool)>>;

type Outcome = Result<Value, GoError>;

/// A template function.
type Function = Arc<dyn Fn(&[Value]) -> Outcome + Send + Sync>;

fn fail(function: &str, why: impl std::fmt::Display) -> GoError {
    GoError::Exec(format!("{function}: {why}"))
}

fn string(text: impl Into<Arc<str>>) -> Value {
    Value::String(text.into())
}

/// A value as text: a string as it is, nil as nothing, anything else as Go prints it.
fn text(value: &Value) -> String {
    match value {
        Value::String(text) => text.to_string(),
        Value::Nil => String::new(),
        other => other.to_string(),
    }
}

/// The arguments, exactly `count` of them.
fn args<'a>(function: &str, args: &'a [Value], count: usize) -> Result<&'a [Value], GoError> {
    if args.len() != count {
        return Err(GoError::ArgCount { name: function.to_string(), expected: count, got: args.len() });
    }
    Ok(args)
}

/// The function map of one render.
pub(super) fn function_map(scope: &RenderScope, recorder: &Recorder) -> FuncMap {
    let mut map = FuncMap::new();
    let mut add = |name: &str, function: Function| {
        map.insert(name.to_string(), function);
    };
    let env = scope.env.clone();
    add(
        "env",
        Arc::new(move |given| Ok(string(env.get(&text(&args("env", given, 1)?[0])).cloned().unwrap_or_default()))),
    );
    let env = scope.env.clone();
    add(
        "envOrDefault",
        Arc::new(move |given| {
            let given = args("envOrDefault", given, 2)?;
            Ok(string(env.get(&text(&given[0])).cloned().unwrap_or_else(|| text(&given[1]))))
        }),
    );
    let env = scope.env.clone();
    add(
        "mustEnv",
        Arc::new(move |given| {
            let name = text(&args("mustEnv", given, 1)?[0]);
            env.get(&name)
                .map(|value| string(value.as_str()))
                .ok_or_else(|| fail("mustEnv", format!("{name:?} is not set")))
        }),
    );
    let (services, namespace, record) = (scope.services.clone(), scope.namespace.clone(), recorder.clone());
    add("nomadService", Arc::new(move |given| nomad_service(given, &services, &namespace, &record)));
    let (services, namespace, record) = (scope.services.clone(), scope.namespace.clone(), recorder.clone());
    add(
        "nomadServices",
        Arc::new(move |given| {
            args("nomadServices", given, 0)?;
            let query = ServiceQuery::Names { namespace: namespace.clone() };
            let names = match lookup(&services, &query, &record) {
                Some(ServiceAnswer::Names(names)) => names.clone(),
                _ => Vec::new(),
            };
            let entries = names.into_iter().map(|entry| {
                let tags = Value::List(entry.tags.iter().map(|tag| string(tag.as_str())).collect());
                map_value([("Name", string(entry.name)), ("Tags", tags)])
            });
            Ok(Value::List(entries.collect()))
        }),
    );
    for (name, function) in helpers() {
        add(name, function);
    }
    map
}

/// The answer to `query`, recording it; `None` (and recorded as missing)
/// when the agent has not read it yet.
fn lookup<'a>(services: &'a super::ServiceData, query: &ServiceQuery, record: &Recorder) -> Option<&'a ServiceAnswer> {
    let mut recorded = record.lock();
    recorded.0.insert(query.clone());
    let found = services.0.get(query);
    recorded.1 |= found.is_none();
    found
}

/// `nomadService "name"` or `nomadService "tag.name"`: the instances,
/// sorted by id, each as a map of Nomad's fields.
fn nomad_service(given: &[Value], services: &super::ServiceData, namespace: &str, record: &Recorder) -> Outcome {
    if given.len() == 3 {
        return Err(fail(
            "nomadService",
            "choosing instances by count and key (its 3-argument form) is not supported by Drover",
        ));
    }
    let spec = text(&args("nomadService", given, 1)?[0]);
    if spec.contains('@') {
        return Err(fail("nomadService", format!("{spec:?}: Drover has one region; name the service without \"@\"")));
    }
    let (tag, name) = match spec.rsplit_once('.') {
        Some((tag, name)) => (Some(tag.to_string()), name.to_string()),
        None => (None, spec),
    };
    let query = ServiceQuery::Instances { namespace: namespace.to_string(), name };
    let instances: Vec<&ServiceRegistration> = match lookup(services, &query, record) {
        Some(ServiceAnswer::Instances(rows)) => rows.iter().collect(),
        _ => Vec::new(),
    };
    let chosen = instances.into_iter().filter(|row| tag.as_ref().is_none_or(|tag| row.tags.contains(tag)));
    Ok(Value::List(chosen.map(instance).collect()))
}

/// One registration as a template sees it.
fn instance(row: &ServiceRegistration) -> Value {
    let tags = Value::List(row.tags.iter().map(|tag| string(tag.as_str())).collect());
    map_value([
        ("ID", string(row.id.as_str())),
        ("Name", string(row.service_name.as_str())),
        ("ServiceName", string(row.service_name.as_str())),
        ("Namespace", string(&*row.namespace)),
        ("NodeID", string(row.node_id.to_string())),
        ("Node", string(row.node_id.to_string())),
        ("Datacenter", string(&*row.datacenter)),
        ("JobID", string(&*row.job_id)),
        ("AllocID", string(row.alloc_id.to_string())),
        ("Tags", tags),
        ("Address", string(row.address.as_str())),
        ("Port", Value::Int(i64::from(row.port))),
    ])
}

fn map_value<const N: usize>(entries: [(&str, Value); N]) -> Value {
    Value::Map(Arc::new(entries.into_iter().map(|(key, value)| (Arc::from(key), value)).collect()))
}

type Helper = (&'static str, Function);

/// A helper of one string argument.
fn on_text(name: &'static str, apply: fn(&str) -> String) -> Helper {
    (name, Arc::new(move |given| Ok(string(apply(&text(&args(name, given, 1)?[0]))))))
}

/// A helper of a string and the piped string.
fn on_two(name: &'static str, apply: fn(&str, &str) -> String) -> Helper {
    (
        name,
        Arc::new(move |given| {
            let given = args(name, given, 2)?;
            Ok(string(apply(&text(&given[0]), &text(&given[1]))))
        }),
    )
}

/// A helper that may fail.
fn checked(name: &'static str, count: usize, apply: fn(&[Value]) -> Result<Value, String>) -> Helper {
    (name, Arc::new(move |given| apply(args(name, given, count)?).map_err(|why| fail(name, why))))
}

fn helpers() -> Vec<Helper> {
    vec![
        on_text("toLower", str::to_lowercase),
        on_text("toUpper", str::to_uppercase),
        on_text("toTitle", title),
        on_text("trimSpace", |s| s.trim().to_string()),
        on_two("trim", |cutset, s| s.trim_matches(|c| cutset.contains(c)).to_string()),
        on_two("trimPrefix", |prefix, s| s.strip_prefix(prefix).unwrap_or(s).to_string()),
        on_two("trimSuffix", |suffix, s| s.strip_suffix(suffix).unwrap_or(s).to_string()),
        (
            "replaceAll",
            Arc::new(|given| {
                let given = args("replaceAll", given, 3)?;
                Ok(string(text(&given[2]).replace(&text(&given[0]), &text(&given[1]))))
            }),
        ),
        (
            "split",
            Arc::new(|given| {
                let given = args("split", given, 2)?;
                let (separator, whole) = (text(&given[0]), text(&given[1]));
                let whole = whole.trim();
                let parts: Vec<Value> = match (whole.is_empty(), separator.is_empty()) {
                    (true, _) => Vec::new(),
                    (false, true) => whole.chars().map(|c| string(c.to_string())).collect(),
                    (false, false) => whole.split(separator.as_str()).map(string).collect(),
                };
                Ok(Value::List(parts.into()))
            }),
        ),
        checked("join", 2, |given| match &given[1] {
            Value::List(items) => Ok(string(items.iter().map(text).collect::<Vec<_>>().join(&text(&given[0])))),
            other => Err(format!("expected a list to join, got {}", other.type_name())),
        }),
        checked("indent", 2, |given| {
            let spaces =
                given[0].as_int().filter(|spaces| *spaces >= 0).ok_or("indent value must be a positive integer")?;
            Ok(string(indent(spaces as usize, &text(&given[1]))))
        }),
        checked("regexReplaceAll", 3, |given| {
            let pattern = regex::Regex::new(&text(&given[0])).map_err(|error| error.to_string())?;
            Ok(string(pattern.replace_all(&text(&given[2]), text(&given[1]).as_str()).into_owned()))
        }),
        checked("regexMatch", 2, |given| {
            let pattern = regex::Regex::new(&text(&given[0])).map_err(|error| error.to_string())?;
            Ok(Value::Bool(pattern.is_match(&text(&given[1]))))
        }),
        checked("contains", 2, |given| Ok(Value::Bool(is_in(&given[1], &given[0])))),
        checked("in", 2, |given| Ok(Value::Bool(is_in(&given[0], &given[1])))),
        checked("containsAny", 2, |given| Ok(Value::Bool(list(&given[0])?.iter().any(|v| is_in(&given[1], v))))),
        checked("containsAll", 2, |given| Ok(Value::Bool(list(&given[0])?.iter().all(|v| is_in(&given[1], v))))),
        checked("containsNone", 2, |given| Ok(Value::Bool(!list(&given[0])?.iter().any(|v| is_in(&given[1], v))))),
        checked("containsNotAll", 2, |given| Ok(Value::Bool(!list(&given[0])?.iter().all(|v| is_in(&given[1], v))))),
        checked("parseInt", 1, |given| {
            parse_or_zero(&given[0], |s| s.parse::<i64>().map(Value::Int).map_err(|e| e.to_string()), Value::Int(0))
        }),
        checked("parseUint", 1, |given| {
            parse_or_zero(&given[0], |s| s.parse::<u64>().map(Value::Uint).map_err(|e| e.to_string()), Value::Uint(0))
        }),
        checked("parseFloat", 1, |given| {
            parse_or_zero(
                &given[0],
                |s| s.parse::<f64>().map(Value::Float).map_err(|e| e.to_string()),
                Value::Float(0.0),
            )
        }),
        checked("parseBool", 1, |given| parse_or_zero(&given[0], parse_bool, Value::Bool(false))),
        checked("parseJSON", 1, |given| {
            let source = text(&given[0]);
            if source.is_empty() {
                return Ok(Value::Map(Arc::default()));
            }
            serde_json::from_str::<serde_json::Value>(&source)
                .map(|json| from_json(&json))
                .map_err(|error| error.to_string())
        }),
        checked("toJSON", 1, |given| {
            Ok(string(go_escaped(&serde_json::to_string(&to_json(&given[0])?).map_err(|e| e.to_string())?)))
        }),
        checked("toJSONPretty", 1, |given| {
            Ok(string(go_escaped(&serde_json::to_string_pretty(&to_json(&given[0])?).map_err(|e| e.to_string())?)))
        }),
        checked("toUnescapedJSON", 1, |given| {
            Ok(string(serde_json::to_string(&to_json(&given[0])?).map_err(|e| e.to_string())?))
        }),
        checked("toUnescapedJSONPretty", 1, |given| {
            Ok(string(serde_json::to_string_pretty(&to_json(&given[0])?).map_err(|e| e.to_string())?))
        }),
        on_text("base64Encode", |s| base64::engine::general_purpose::STANDARD.encode(s)),
        on_text("base64URLEncode", |s| base64::engine::general_purpose::URL_SAFE.encode(s)),
        checked("base64Decode", 1, |given| decode(base64::engine::general_purpose::STANDARD, &text(&given[0]))),
        checked("base64URLDecode", 1, |given| decode(base64::engine::general_purpose::URL_SAFE, &text(&given[0]))),
        checked("add", 2, |given| arithmetic(&given[1], &given[0], Op::Add)),
        checked("subtract", 2, |given| arithmetic(&given[1], &given[0], Op::Subtract)),
        checked("multiply", 2, |given| arithmetic(&given[1], &given[0], Op::Multiply)),
        checked("divide", 2, |given| arithmetic(&given[1], &given[0], Op::Divide)),
        checked("modulo", 2, |given| arithmetic(&given[1], &given[0], Op::Modulo)),
        checked("minimum", 2, |given| extreme(&given[0], &given[1], true)),
        checked("maximum", 2, |given| extreme(&given[0], &given[1], false)),
    ]
}

/// Go's `strings.Title`: the first letter of every word upper-cased.
fn title(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at_start = true;
    for c in text.chars() {
        if at_start && c.is_alphabetic() {
            out.extend(c.to_uppercase());
        } else {
            out.push(c);
        }
        at_start = !(c.is_alphanumeric() || c == '_' || c == '\'');
    }
    out
}

/// consul-template's `indent`: every line that has text gets `spaces` spaces.
fn indent(spaces: usize, text: &str) -> String {
    let prefix = " ".repeat(spaces);
    let mut out = String::with_capacity(text.len());
    let mut line_start = true;
    for c in text.chars() {
        if line_start && c != '\n' {
            out.push_str(&prefix);
        }
        out.push(c);
        line_start = c == '\n';
    }
    out
}

fn list(value: &Value) -> Result<&[Value], String> {
    match value {
        Value::List(items) => Ok(items),
        other => Err(format!("expected a list, got {}", other.type_name())),
    }
}

/// consul-template's `in`: whether the list `haystack` holds `needle`, or
/// the string `haystack` contains the string `needle`.
fn is_in(haystack: &Value, needle: &Value) -> bool {
    match (haystack, needle) {
        (Value::List(items), needle) => items.iter().any(|item| same(item, needle)),
        (Value::String(whole), Value::String(part)) => whole.contains(&**part),
        _ => false,
    }
}

fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::String(a), Value::String(b)) => a == b,
        (Value::Bool(a), Value::Bool(b)) => a == b,
        _ => match (number(a), number(b)) {
            (Some(a), Some(b)) => a.as_f64() == b.as_f64(),
            _ => false,
        },
    }
}

/// `value` parsed by `parse`; the empty string is `zero`, as consul-template.
fn parse_or_zero(value: &Value, parse: fn(&str) -> Result<Value, String>, zero: Value) -> Result<Value, String> {
    let source = text(value);
    match source.is_empty() {
        true => Ok(zero),
        false => parse(&source).map_err(|why| format!("{source:?}: {why}")),
    }
}

/// Go's `strconv.ParseBool`.
fn parse_bool(text: &str) -> Result<Value, String> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(Value::Bool(true)),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(Value::Bool(false)),
        _ => Err("invalid syntax".to_string()),
    }
}

fn decode(engine: base64::engine::GeneralPurpose, source: &str) -> Result<Value, String> {
    let bytes = engine.decode(source).map_err(|error| error.to_string())?;
    String::from_utf8(bytes).map(string).map_err(|_| "the decoded bytes are not UTF-8".to_string())
}

/// JSON as Go's `json.Marshal` writes it: `<`, `>`, `&`, U+2028 and U+2029 escaped.
fn go_escaped(json: &str) -> String {
    json.replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

fn to_json(value: &Value) -> Result<serde_json::Value, String> {
    use serde_json::Value as Json;
    Ok(match value {
        Value::Nil => Json::Null,
        Value::Bool(flag) => Json::Bool(*flag),
        Value::Int(n) => Json::from(*n),
        Value::Uint(n) => Json::from(*n),
        Value::Float(n) => serde_json::Number::from_f64(*n).map_or(Json::Null, Json::Number),
        Value::String(text) => Json::String(text.to_string()),
        Value::List(items) => Json::Array(items.iter().map(to_json).collect::<Result<_, _>>()?),
        Value::Map(entries) => Json::Object(
            entries.iter().map(|(key, value)| Ok((key.to_string(), to_json(value)?))).collect::<Result<_, String>>()?,
        ),
        other => return Err(format!("a {} cannot be written as JSON", other.type_name())),
    })
}

fn from_json(json: &serde_json::Value) -> Value {
    use serde_json::Value as Json;
    match json {
        Json::Null => Value::Nil,
        Json::Bool(flag) => Value::Bool(*flag),
        Json::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(n), _) => Value::Int(n),
            (None, Some(n)) => Value::Uint(n),
            _ => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(text) => string(text.as_str()),
        Json::Array(items) => Value::List(items.iter().map(from_json).collect()),
        Json::Object(entries) => {
            let map: BTreeMap<Arc<str>, Value> =
                entries.iter().map(|(key, value)| (Arc::from(key.as_str()), from_json(value))).collect();
            Value::Map(Arc::new(map))
        }
    }
}

/// A number a math helper takes.
#[derive(Clone, Copy)]
enum Number {
    Int(i128),
    Float(f64),
}

impl Number {
    fn as_f64(self) -> f64 {
        match self {
            Number::Int(n) => n as f64,
            Number::Float(n) => n,
        }
    }
}

fn number(value: &Value) -> Option<Number> {
    match value {
        Value::Int(n) => Some(Number::Int(i128::from(*n))),
        Value::Uint(n) => Some(Number::Int(i128::from(*n))),
        Value::Float(n) => Some(Number::Float(*n)),
        _ => None,
    }
}

#[derive(Clone, Copy)]
enum Op {
    Add,
    Subtract,
    Multiply,
    Divide,
    Modulo,
}

/// `a op b` as consul-template's math helpers: whole numbers stay whole
/// (an overflow or a division by zero is an error), a float makes a float.
fn arithmetic(a: &Value, b: &Value, op: Op) -> Result<Value, String> {
    let unknown = |value: &Value| format!("unknown type for {value} ({})", value.type_name());
    let a_number = number(a).ok_or_else(|| unknown(a))?;
    let b_number = number(b).ok_or_else(|| unknown(b))?;
    match (a_number, b_number) {
        (Number::Int(a), Number::Int(b)) => {
            let result = match op {
                Op::Add => a.checked_add(b),
                Op::Subtract => a.checked_sub(b),
                Op::Multiply => a.checked_mul(b),
                Op::Divide | Op::Modulo if b == 0 => return Err("division by zero".to_string()),
                Op::Divide => a.checked_div(b),
                Op::Modulo => a.checked_rem(b),
            };
            result.and_then(|n| i64::try_from(n).ok()).map(Value::Int).ok_or_else(|| "integer overflow".to_string())
        }
        (a, b) => {
            let (a, b) = (a.as_f64(), b.as_f64());
            Ok(Value::Float(match op {
                Op::Add => a + b,
                Op::Subtract => a - b,
                Op::Multiply => a * b,
                Op::Divide => a / b,
                Op::Modulo => return Err("modulo takes whole numbers".to_string()),
            }))
        }
    }
}

fn extreme(a: &Value, b: &Value, smallest: bool) -> Result<Value, String> {
    let (Some(x), Some(y)) = (number(a), number(b)) else {
        return Err(format!("expected two numbers, got {} and {}", a.type_name(), b.type_name()));
    };
    let first = (x.as_f64() <= y.as_f64()) == smallest;
    Ok(if first { a.clone() } else { b.clone() })
}
