//! Nomad HCL2 job files, for the stanzas Drover supports: parsed with
//! `hcl-edit` (which keeps where each block and attribute is) into the same
//! Nomad job JSON the API takes, so a file and its `nomad job run -output`
//! register the same job. Runtime interpolations (`${attr.kernel.name}`,
//! `${meta.rack}`, `${NOMAD_ALLOC_ID}`) stay text for the servers and
//! clients to fill in, as Nomad's parser leaves them. A block or attribute
//! of Nomad's that Drover does not implement yet ([`NOT_IMPLEMENTED`]) is
//! carried into the JSON under Nomad's name, so `job_spec` warns of it (or
//! refuses the job, where ignoring it would change what runs) exactly as
//! for a JSON job. Anything Nomad does not have either, and any HCL
//! expression beyond literals (variables, functions), is an error naming
//! its line.

use hcl_edit::structure::{Block, BlockLabel, Body, Structure};
use hcl_edit::Span;
use serde_json::{json, Map, Value};

/// Why a job file was refused: `file:line: what`.
#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct HclError {
    /// The file.
    pub file: String,
    /// The line (1-based).
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// Reads `text` (the file `file`) into `{"Job": {...}}`.
pub fn job_json(file: &str, text: &str) -> Result<Value, HclError> {
    let reader = Reader { file, text };
    let body = hcl_edit::parser::parse_body(text).map_err(|error| HclError {
        file: file.to_string(),
        line: error.location().line(),
        message: error.message().to_string(),
    })?;
    let mut jobs =
        body.iter().filter_map(|structure| structure.as_block()).filter(|block| block.ident.as_str() == "job");
    let Some(job) = jobs.next() else { return Err(reader.error(0, "no job block")) };
    if let Some(second) = jobs.next() {
        return Err(reader.error(reader.offset(second.span()), "only one job per file"));
    }
    Ok(json!({ "Job": reader.job(job)? }))
}

/// Nomad's blocks and attributes Drover does not implement yet, by level:
/// `(level, HCL name, JSON name, a block that may repeat)`. Their contents
/// are kept as free-form maps: `job_spec` only needs to see them set.
pub const NOT_IMPLEMENTED: &[(&str, &str, &str, bool)] = &[
    ("job", "multiregion", "Multiregion", false),
    ("job", "migrate", "Migrate", false),
    ("job", "ui", "UI", false),
    ("job", "node_pool", "NodePool", false),
    ("group", "volume", "Volumes", true),
    ("group", "scaling", "Scaling", false),
    ("group", "migrate", "Migrate", false),
    ("group", "consul", "Consul", false),
    ("group", "prevent_reschedule_on_lost", "PreventRescheduleOnLost", false),
    ("task", "vault", "Vault", false),
    ("task", "artifact", "Artifacts", true),
    ("task", "lifecycle", "Lifecycle", false),
    ("task", "volume_mount", "VolumeMounts", true),
    ("task", "scaling", "ScalingPolicies", true),
    ("task", "csi_plugin", "CSIPluginConfig", false),
    ("task", "identity", "Identities", true),
    ("task", "consul", "Consul", false),
    ("task", "action", "Actions", true),
    ("task", "kind", "Kind", false),
    ("resources", "device", "Devices", true),
    ("resources", "network", "Networks", true),
    ("resources", "cores", "Cores", false),
];

/// What each level takes: attributes (HCL name → JSON name, and whether
/// the value is a duration), blocks (HCL name → how they are read).
struct Reader<'a> {
    file: &'a str,
    text: &'a str,
}

/// A duration attribute: HCL's `"30s"` becomes integer nanoseconds.
const DURATION: bool = true;

impl Reader<'_> {
    fn error(&self, offset: usize, message: impl Into<String>) -> HclError {
        let line = self.text[..offset.min(self.text.len())].matches('\n').count() + 1;
        HclError { file: self.file.to_string(), line, message: message.into() }
    }

    fn offset(&self, span: Option<std::ops::Range<usize>>) -> usize {
        span.map_or(0, |span| span.start)
    }

    fn label(&self, block: &Block) -> Result<String, HclError> {
        match block.labels.first() {
            Some(BlockLabel::String(text)) => Ok(text.value().to_string()),
            Some(BlockLabel::Ident(ident)) => Ok(ident.as_str().to_string()),
            None => Err(self.error(self.offset(block.span()), format!("{} block needs a name", block.ident.as_str()))),
        }
    }

    /// Reads `body`'s attributes by `attributes` and its blocks by `blocks`
    /// into `object`; anything else is an error naming its line.
    fn fill(
        &self,
        body: &Body,
        place: &str,
        attributes: &[(&str, &str, bool)],
        object: &mut Map<String, Value>,
        mut block: impl FnMut(&Block, &mut Map<String, Value>) -> Result<bool, HclError>,
    ) -> Result<(), HclError> {
        for structure in body.iter() {
            match structure {
                Structure::Attribute(attribute) => {
                    let key = attribute.key.as_str();
                    let offset = self.offset(attribute.span());
                    let Some((_, json_name, duration)) = attributes.iter().find(|(name, _, _)| *name == key) else {
                        if let Some(json_name) = not_implemented(place, key, false) {
                            object.insert(json_name.to_string(), self.value(&attribute.value, offset)?);
                            continue;
                        }
                        return Err(
                            self.error(offset, format!("{place}: attribute {key:?} is not supported by Drover"))
                        );
                    };
                    let value = self.value(&attribute.value, offset)?;
                    let value = if *duration { self.duration(&value, offset)? } else { value };
                    object.insert(json_name.to_string(), value);
                }
                Structure::Block(inner) => {
                    if !block(inner, object)? {
                        let name = inner.ident.as_str();
                        if let Some(json_name) = not_implemented(place, name, false) {
                            object.insert(json_name.to_string(), self.map(inner)?);
                            continue;
                        }
                        if let Some(json_name) = not_implemented(place, name, true) {
                            push(object, json_name, self.map(inner)?);
                            continue;
                        }
                        let offset = self.offset(inner.span());
                        return Err(self.error(offset, format!("{place}: block {name:?} is not supported by Drover")));
                    }
                }
            }
        }
        Ok(())
    }

    /// A literal value; templates stay text.
    fn value(&self, expression: &hcl_edit::expr::Expression, offset: usize) -> Result<Value, HclError> {
        self.literal(&hcl::Expression::from(expression.clone()), offset)
    }

    fn literal(&self, expression: &hcl::Expression, offset: usize) -> Result<Value, HclError> {
        Ok(match expression {
            hcl::Expression::Null => Value::Null,
            hcl::Expression::Bool(flag) => Value::Bool(*flag),
            hcl::Expression::Number(number) => match (number.as_i64(), number.as_f64()) {
                (Some(whole), _) => Value::from(whole),
                (None, Some(real)) => Value::from(real),
                _ => return Err(self.error(offset, "a number out of range")),
            },
            hcl::Expression::String(text) => Value::String(text.clone()),
            hcl::Expression::TemplateExpr(template) => Value::String(template.to_string()),
            hcl::Expression::Array(items) => {
                Value::Array(items.iter().map(|item| self.literal(item, offset)).collect::<Result<_, _>>()?)
            }
            hcl::Expression::Object(fields) => {
                let mut object = Map::new();
                for (key, value) in fields {
                    object.insert(key.to_string(), self.literal(value, offset)?);
                }
                Value::Object(object)
            }
            _ => {
                return Err(self.error(
                    offset,
                    "only literal values are supported (no variables, functions or operators; run `nomad job run -output` to expand them)",
                ))
            }
        })
    }

    fn duration(&self, value: &Value, offset: usize) -> Result<Value, HclError> {
        match value {
            Value::String(text) => crate::api::format::parse_go_duration(text)
                .map(|duration| Value::from(duration.as_nanos() as u64))
                .ok_or_else(|| self.error(offset, format!("{text:?} is not a duration such as \"30s\""))),
            Value::Number(_) => Ok(value.clone()),
            _ => Err(self.error(offset, "a duration must be a string such as \"30s\"")),
        }
    }

    fn job(&self, block: &Block) -> Result<Value, HclError> {
        let id = self.label(block)?;
        let mut job = Map::new();
        job.insert("ID".into(), Value::from(id.clone()));
        job.insert("Name".into(), Value::from(id));
        let attributes = [
            ("datacenters", "Datacenters", false),
            ("type", "Type", false),
            ("priority", "Priority", false),
            ("namespace", "Namespace", false),
            ("region", "Region", false),
            ("all_at_once", "AllAtOnce", false),
            ("meta", "Meta", false),
        ];
        let mut groups = Vec::new();
        self.fill(&block.body, "job", &attributes, &mut job, |inner, job| {
            match inner.ident.as_str() {
                "group" => groups.push(self.group(inner)?),
                "constraint" => push(job, "Constraints", self.constraint(inner)?),
                "affinity" => push(job, "Affinities", self.affinity(inner)?),
                "spread" => push(job, "Spreads", self.spread(inner)?),
                "update" => {
                    job.insert("Update".into(), self.update(inner)?);
                }
                "reschedule" => {
                    job.insert("Reschedule".into(), self.reschedule(inner)?);
                }
                "periodic" => {
                    let attributes = [
                        ("cron", "Spec", false),
                        ("crons", "Specs", false),
                        ("prohibit_overlap", "ProhibitOverlap", false),
                        ("time_zone", "TimeZone", false),
                        ("enabled", "Enabled", false),
                    ];
                    job.insert("Periodic".into(), self.simple(inner, &attributes)?);
                }
                "parameterized" => {
                    let attributes = [
                        ("payload", "Payload", false),
                        ("meta_required", "MetaRequired", false),
                        ("meta_optional", "MetaOptional", false),
                    ];
                    job.insert("ParameterizedJob".into(), self.simple(inner, &attributes)?);
                }
                "meta" => {
                    job.insert("Meta".into(), self.map(inner)?);
                }
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        job.insert("TaskGroups".into(), Value::Array(groups));
        Ok(Value::Object(job))
    }

    fn group(&self, block: &Block) -> Result<Value, HclError> {
        let mut group = Map::new();
        group.insert("Name".into(), Value::from(self.label(block)?));
        let attributes = [
            ("count", "Count", false),
            ("max_client_disconnect", "MaxClientDisconnect", DURATION),
            ("stop_after_client_disconnect", "StopAfterClientDisconnect", DURATION),
            ("shutdown_delay", "ShutdownDelay", DURATION),
            ("meta", "Meta", false),
        ];
        let mut tasks = Vec::new();
        self.fill(&block.body, "group", &attributes, &mut group, |inner, group| {
            match inner.ident.as_str() {
                "task" => tasks.push(self.task(inner)?),
                "constraint" => push(group, "Constraints", self.constraint(inner)?),
                "affinity" => push(group, "Affinities", self.affinity(inner)?),
                "spread" => push(group, "Spreads", self.spread(inner)?),
                "network" => push(group, "Networks", self.network(inner)?),
                "service" => push(group, "Services", self.service(inner)?),
                "restart" => {
                    group.insert("RestartPolicy".into(), self.restart(inner)?);
                }
                "reschedule" => {
                    group.insert("ReschedulePolicy".into(), self.reschedule(inner)?);
                }
                "update" => {
                    group.insert("Update".into(), self.update(inner)?);
                }
                "ephemeral_disk" => {
                    let attributes =
                        [("size", "SizeMB", false), ("sticky", "Sticky", false), ("migrate", "Migrate", false)];
                    group.insert("EphemeralDisk".into(), self.simple(inner, &attributes)?);
                }
                "disconnect" => {
                    let attributes = [
                        ("lost_after", "LostAfter", DURATION),
                        ("stop_on_client_after", "StopOnClientAfter", DURATION),
                        ("replace", "Replace", false),
                        ("reconcile", "Reconcile", false),
                    ];
                    group.insert("Disconnect".into(), self.simple(inner, &attributes)?);
                }
                "meta" => {
                    group.insert("Meta".into(), self.map(inner)?);
                }
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        group.insert("Tasks".into(), Value::Array(tasks));
        Ok(Value::Object(group))
    }

    fn task(&self, block: &Block) -> Result<Value, HclError> {
        let mut task = Map::new();
        task.insert("Name".into(), Value::from(self.label(block)?));
        let attributes = [
            ("driver", "Driver", false),
            ("user", "User", false),
            ("kill_timeout", "KillTimeout", DURATION),
            ("shutdown_delay", "ShutdownDelay", DURATION),
            ("kill_signal", "KillSignal", false),
            ("leader", "Leader", false),
            ("config", "Config", false),
            ("env", "Env", false),
            ("meta", "Meta", false),
        ];
        self.fill(&block.body, "task", &attributes, &mut task, |inner, task| {
            match inner.ident.as_str() {
                "config" | "env" | "meta" => {
                    let key = match inner.ident.as_str() {
                        "config" => "Config",
                        "env" => "Env",
                        _ => "Meta",
                    };
                    task.insert(key.into(), self.map(inner)?);
                }
                "resources" => {
                    let attributes = [
                        ("cpu", "CPU", false),
                        ("memory", "MemoryMB", false),
                        ("memory_max", "MemoryMaxMB", false),
                        ("disk", "DiskMB", false),
                    ];
                    task.insert("Resources".into(), self.simple(inner, &attributes)?);
                }
                "logs" => {
                    let attributes = [("max_files", "MaxFiles", false), ("max_file_size", "MaxFileSizeMB", false)];
                    task.insert("LogConfig".into(), self.simple(inner, &attributes)?);
                }
                "restart" => {
                    task.insert("RestartPolicy".into(), self.restart(inner)?);
                }
                "constraint" => push(task, "Constraints", self.constraint(inner)?),
                "affinity" => push(task, "Affinities", self.affinity(inner)?),
                "service" => push(task, "Services", self.service(inner)?),
                "template" => push(task, "Templates", self.template(inner)?),
                "dispatch_payload" => {
                    task.insert("DispatchPayload".into(), self.simple(inner, &[("file", "File", false)])?);
                }
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        Ok(Value::Object(task))
    }

    /// A `template` block, under Nomad's JSON names (`data` is
    /// `EmbeddedTmpl`, `destination` `DestPath`, `env` `Envvars`, ...);
    /// its `wait` and `change_script` blocks are kept for `job_spec` to
    /// warn of or refuse.
    fn template(&self, block: &Block) -> Result<Value, HclError> {
        let attributes = [
            ("data", "EmbeddedTmpl", false),
            ("source", "SourcePath", false),
            ("destination", "DestPath", false),
            ("perms", "Perms", false),
            ("change_mode", "ChangeMode", false),
            ("change_signal", "ChangeSignal", false),
            ("splay", "Splay", DURATION),
            ("once", "Once", false),
            ("env", "Envvars", false),
            ("left_delimiter", "LeftDelim", false),
            ("right_delimiter", "RightDelim", false),
            ("error_on_missing_key", "ErrMissingKey", false),
            ("uid", "Uid", false),
            ("gid", "Gid", false),
            ("vault_grace", "VaultGrace", DURATION),
        ];
        let mut template = Map::new();
        self.fill(&block.body, "template", &attributes, &mut template, |inner, template| {
            match inner.ident.as_str() {
                "wait" => {
                    let attributes = [("min", "Min", DURATION), ("max", "Max", DURATION)];
                    template.insert("Wait".into(), self.simple(inner, &attributes)?);
                }
                "change_script" => {
                    let attributes = [
                        ("command", "Command", false),
                        ("args", "Args", false),
                        ("timeout", "Timeout", DURATION),
                        ("fail_on_error", "FailOnError", false),
                    ];
                    template.insert("ChangeScript".into(), self.simple(inner, &attributes)?);
                }
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        Ok(Value::Object(template))
    }

    /// A block of plain attributes only.
    fn simple(&self, block: &Block, attributes: &[(&str, &str, bool)]) -> Result<Value, HclError> {
        let mut object = Map::new();
        self.fill(&block.body, block.ident.as_str(), attributes, &mut object, |_, _| Ok(false))?;
        Ok(Value::Object(object))
    }

    /// A block read as a free-form map (`config`, `env`, `meta`): every
    /// attribute kept by its own name, a nested block as an object, and a
    /// block written more than once (a docker task's `mount`) as the list
    /// of them, in order.
    fn map(&self, block: &Block) -> Result<Value, HclError> {
        let mut object = Map::new();
        let mut block_names = std::collections::BTreeMap::<&str, usize>::new();
        for inner in block.body.iter().filter_map(Structure::as_block) {
            *block_names.entry(inner.ident.as_str()).or_default() += 1;
        }
        for structure in block.body.iter() {
            match structure {
                Structure::Attribute(attribute) => {
                    let value = self.value(&attribute.value, self.offset(attribute.span()))?;
                    object.insert(attribute.key.as_str().to_string(), value);
                }
                Structure::Block(inner) if block_names.get(inner.ident.as_str()).is_some_and(|count| *count > 1) => {
                    push(&mut object, inner.ident.as_str(), self.map(inner)?);
                }
                Structure::Block(inner) => {
                    object.insert(inner.ident.as_str().to_string(), self.map(inner)?);
                }
            }
        }
        Ok(Value::Object(object))
    }

    fn constraint(&self, block: &Block) -> Result<Value, HclError> {
        let attributes = [
            ("attribute", "LTarget", false),
            ("operator", "Operand", false),
            ("value", "RTarget", false),
            ("distinct_hosts", "distinct_hosts", false),
            ("distinct_property", "distinct_property", false),
        ];
        let mut fields = Map::new();
        self.fill(&block.body, "constraint", &attributes, &mut fields, |_, _| Ok(false))?;
        // Nomad's shorthands: `distinct_hosts = true`, `distinct_property = X`.
        if fields.remove("distinct_hosts") == Some(Value::Bool(true)) {
            return Ok(json!({"LTarget": "", "RTarget": "", "Operand": "distinct_hosts"}));
        }
        if let Some(property) = fields.remove("distinct_property") {
            let limit = fields.get("RTarget").cloned().unwrap_or(Value::from(""));
            return Ok(json!({"LTarget": property, "RTarget": limit, "Operand": "distinct_property"}));
        }
        fields.entry("Operand").or_insert(Value::from("="));
        Ok(Value::Object(fields))
    }

    fn affinity(&self, block: &Block) -> Result<Value, HclError> {
        let attributes = [
            ("attribute", "LTarget", false),
            ("operator", "Operand", false),
            ("value", "RTarget", false),
            ("weight", "Weight", false),
        ];
        let mut fields = Map::new();
        self.fill(&block.body, "affinity", &attributes, &mut fields, |_, _| Ok(false))?;
        fields.entry("Operand").or_insert(Value::from("="));
        fields.entry("Weight").or_insert(Value::from(50));
        Ok(Value::Object(fields))
    }

    fn spread(&self, block: &Block) -> Result<Value, HclError> {
        let attributes = [("attribute", "Attribute", false), ("weight", "Weight", false)];
        let mut fields = Map::new();
        let mut targets = Vec::new();
        self.fill(&block.body, "spread", &attributes, &mut fields, |inner, _| {
            if inner.ident.as_str() != "target" {
                return Ok(false);
            }
            let mut target = Map::new();
            target.insert("Value".into(), Value::from(self.label(inner)?));
            self.fill(&inner.body, "target", &[("percent", "Percent", false)], &mut target, |_, _| Ok(false))?;
            targets.push(Value::Object(target));
            Ok(true)
        })?;
        fields.insert("SpreadTarget".into(), Value::Array(targets));
        fields.entry("Weight").or_insert(Value::from(50));
        Ok(Value::Object(fields))
    }

    fn network(&self, block: &Block) -> Result<Value, HclError> {
        let mut network = Map::new();
        let (mut reserved, mut dynamic) = (Vec::new(), Vec::new());
        let attributes = [("mode", "Mode", false), ("mbits", "MBits", false)];
        self.fill(&block.body, "network", &attributes, &mut network, |inner, _| {
            if inner.ident.as_str() != "port" {
                return Ok(false);
            }
            let mut port = Map::new();
            port.insert("Label".into(), Value::from(self.label(inner)?));
            let attributes = [("static", "Value", false), ("to", "To", false), ("host_network", "HostNetwork", false)];
            self.fill(&inner.body, "port", &attributes, &mut port, |_, _| Ok(false))?;
            // As Nomad's parser: a port with a static value is reserved.
            if port.contains_key("Value") {
                reserved.push(Value::Object(port));
            } else {
                dynamic.push(Value::Object(port));
            }
            Ok(true)
        })?;
        network.insert("ReservedPorts".into(), Value::Array(reserved));
        network.insert("DynamicPorts".into(), Value::Array(dynamic));
        Ok(Value::Object(network))
    }

    /// A `service` block: its `check` blocks become `Checks`, `port` is
    /// `PortLabel`; Nomad's blocks Drover warns of or refuses (`connect`,
    /// `identity`, ...) are kept under their JSON names for `job_spec`.
    fn service(&self, block: &Block) -> Result<Value, HclError> {
        let attributes = [
            ("name", "Name", false),
            ("port", "PortLabel", false),
            ("tags", "Tags", false),
            ("canary_tags", "CanaryTags", false),
            ("enable_tag_override", "EnableTagOverride", false),
            ("address_mode", "AddressMode", false),
            ("address", "Address", false),
            ("provider", "Provider", false),
            ("task", "TaskName", false),
            ("on_update", "OnUpdate", false),
            ("meta", "Meta", false),
            ("canary_meta", "CanaryMeta", false),
            ("tagged_addresses", "TaggedAddresses", false),
            ("cluster", "Cluster", false),
        ];
        let mut service = Map::new();
        let mut checks = Vec::new();
        self.fill(&block.body, "service", &attributes, &mut service, |inner, service| {
            let free_form = match inner.ident.as_str() {
                "check" => {
                    checks.push(self.check(inner)?);
                    return Ok(true);
                }
                "check_restart" => {
                    service.insert("CheckRestart".into(), self.check_restart(inner)?);
                    return Ok(true);
                }
                "meta" => "Meta",
                "canary_meta" => "CanaryMeta",
                "tagged_addresses" => "TaggedAddresses",
                "connect" => "Connect",
                "identity" => "Identity",
                "weights" => "Weights",
                _ => return Ok(false),
            };
            service.insert(free_form.into(), self.map(inner)?);
            Ok(true)
        })?;
        if !checks.is_empty() {
            service.insert("Checks".into(), Value::Array(checks));
        }
        Ok(Value::Object(service))
    }

    fn check(&self, block: &Block) -> Result<Value, HclError> {
        let attributes = [
            ("name", "Name", false),
            ("type", "Type", false),
            ("path", "Path", false),
            ("method", "Method", false),
            ("body", "Body", false),
            ("protocol", "Protocol", false),
            ("port", "PortLabel", false),
            ("address_mode", "AddressMode", false),
            ("command", "Command", false),
            ("args", "Args", false),
            ("task", "TaskName", false),
            ("interval", "Interval", DURATION),
            ("timeout", "Timeout", DURATION),
            ("initial_status", "InitialStatus", false),
            ("success_before_passing", "SuccessBeforePassing", false),
            ("failures_before_critical", "FailuresBeforeCritical", false),
            ("failures_before_warning", "FailuresBeforeWarning", false),
            ("on_update", "OnUpdate", false),
            ("tls_skip_verify", "TLSSkipVerify", false),
            ("tls_server_name", "TLSServerName", false),
            ("grpc_service", "GRPCService", false),
            ("grpc_use_tls", "GRPCUseTLS", false),
            ("expose", "Expose", false),
            ("notes", "Notes", false),
            ("header", "Header", false),
        ];
        let mut check = Map::new();
        self.fill(&block.body, "check", &attributes, &mut check, |inner, check| {
            match inner.ident.as_str() {
                "header" => {
                    check.insert("Header".into(), self.map(inner)?);
                }
                "check_restart" => {
                    check.insert("CheckRestart".into(), self.check_restart(inner)?);
                }
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        Ok(Value::Object(check))
    }

    fn check_restart(&self, block: &Block) -> Result<Value, HclError> {
        let attributes =
            [("limit", "Limit", false), ("grace", "Grace", DURATION), ("ignore_warnings", "IgnoreWarnings", false)];
        self.simple(block, &attributes)
    }

    fn restart(&self, block: &Block) -> Result<Value, HclError> {
        let attributes = [
            ("attempts", "Attempts", false),
            ("interval", "Interval", DURATION),
            ("delay", "Delay", DURATION),
            ("mode", "Mode", false),
        ];
        self.simple(block, &attributes)
    }

    fn reschedule(&self, block: &Block) -> Result<Value, HclError> {
        let attributes = [
            ("attempts", "Attempts", false),
            ("interval", "Interval", DURATION),
            ("delay", "Delay", DURATION),
            ("delay_function", "DelayFunction", false),
            ("max_delay", "MaxDelay", DURATION),
            ("unlimited", "Unlimited", false),
        ];
        self.simple(block, &attributes)
    }

    fn update(&self, block: &Block) -> Result<Value, HclError> {
        let attributes = [
            ("max_parallel", "MaxParallel", false),
            ("stagger", "Stagger", DURATION),
            ("health_check", "HealthCheck", false),
            ("min_healthy_time", "MinHealthyTime", DURATION),
            ("healthy_deadline", "HealthyDeadline", DURATION),
            ("progress_deadline", "ProgressDeadline", DURATION),
            ("auto_revert", "AutoRevert", false),
            ("auto_promote", "AutoPromote", false),
            ("canary", "Canary", false),
        ];
        self.simple(block, &attributes)
    }
}

/// The JSON name of Nomad's `name` at `level` if Drover does not implement
/// it yet (and it is a repeating block, when `repeated`).
fn not_implemented(level: &str, name: &str, repeated: bool) -> Option<&'static str> {
    NOT_IMPLEMENTED.iter().find(|entry| entry.0 == level && entry.1 == name && entry.3 == repeated).map(|entry| entry.2)
}

fn push(object: &mut Map<String, Value>, key: &str, value: Value) {
    match object.entry(key).or_insert_with(|| Value::Array(Vec::new())) {
        Value::Array(items) => items.push(value),
        other => *other = Value::Array(vec![value]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
job "example" {
  datacenters = ["dc1"]
  type = "service"

  constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
  }

  group "cache" {
    count = 2
    restart {
      attempts = 3
      delay    = "20s"
    }
    network {
      port "db" {}
      port "admin" { static = 9090 }
    }
    task "redis" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["3600"]
      }
      env { NAME = "${NOMAD_ALLOC_ID}" }
      resources {
        cpu    = 500
        memory = 256
      }
      kill_timeout = "10s"
    }
  }
}
"#;

    #[test]
    fn a_nomad_job_file_becomes_nomads_job_json() {
        let json = job_json("example.hcl", EXAMPLE).expect("parses");
        let job = &json["Job"];
        assert_eq!((job["ID"].as_str(), job["Type"].as_str()), (Some("example"), Some("service")));
        assert_eq!(
            job["Constraints"][0],
            json!({"LTarget": "${attr.kernel.name}", "RTarget": "linux", "Operand": "="})
        );
        let group = &job["TaskGroups"][0];
        assert_eq!(group["Count"], 2);
        assert_eq!(group["RestartPolicy"], json!({"Attempts": 3, "Delay": 20_000_000_000u64}));
        assert_eq!(group["Networks"][0]["DynamicPorts"], json!([{"Label": "db"}]));
        assert_eq!(group["Networks"][0]["ReservedPorts"], json!([{"Label": "admin", "Value": 9090}]));
        let task = &group["Tasks"][0];
        assert_eq!(task["Config"], json!({"command": "/bin/sleep", "args": ["3600"]}));
        assert_eq!(task["Env"]["NAME"], "${NOMAD_ALLOC_ID}");
        assert_eq!(task["Resources"], json!({"CPU": 500, "MemoryMB": 256}));
        assert_eq!(task["KillTimeout"], 10_000_000_000u64);
    }

    #[test]
    fn nomads_blocks_drover_lacks_reach_the_json_to_be_warned_of() {
        let more = EXAMPLE
            .replace(
                "      kill_timeout = \"10s\"",
                "      vault { policies = [\"x\"] }\n      service {\n        name = \"a\"\n        check { type = \"tcp\" }\n      }\n      \
                 service { name = \"b\" }\n      shutdown_delay = \"5s\"",
            )
            .replace("        memory = 256", "        memory = 256\n        memory_max = 512");
        let json = job_json("example.hcl", &more).expect("parses");
        let task = &json["Job"]["TaskGroups"][0]["Tasks"][0];
        assert_eq!(task["Vault"], json!({"policies": ["x"]}));
        assert_eq!(task["Services"], json!([{"Name": "a", "Checks": [{"Type": "tcp"}]}, {"Name": "b"}]));
        assert_eq!(
            (task["ShutdownDelay"].as_u64(), task["Resources"]["MemoryMaxMB"].as_i64()),
            (Some(5_000_000_000), Some(512))
        );
        let request: crate::api::job_spec::JobRegisterRequest = serde_json::from_value(json).expect("lenient");
        let converted = crate::api::job_spec::convert_job(request.job.expect("job"), None).expect("converts");
        let text = converted.warnings.join("\n");
        assert!(text.contains("Task \"redis\": Vault is not implemented"), "{text}");
        assert!(!text.contains("ShutdownDelay"), "shutdown_delay is honoured: {text}");
        assert!(!text.contains("MemoryMaxMB"), "memory_max is honoured: {text}");
        assert_eq!(converted.job.task_groups[0].tasks[0].memory_max_mb, 512);
    }

    #[test]
    fn periodic_parameterized_and_dispatch_payload_blocks_read_as_nomads_json() {
        let blocks = "  type = \"batch\"\n  periodic {\n    crons = [\"@daily\", \"*/5 * * * *\"]\n    \
                      prohibit_overlap = true\n    time_zone = \"Europe/Paris\"\n  }\n  parameterized {\n    \
                      payload = \"required\"\n    meta_required = [\"owner\"]\n  }";
        let text = EXAMPLE.replace("  type = \"service\"", blocks).replace(
            "      driver = \"raw_exec\"",
            "      driver = \"raw_exec\"\n      dispatch_payload { file = \"input.json\" }",
        );
        let json = job_json("example.hcl", &text).expect("parses");
        let job = &json["Job"];
        assert_eq!(job["Periodic"]["Specs"], json!(["@daily", "*/5 * * * *"]));
        assert_eq!(job["Periodic"]["ProhibitOverlap"], json!(true));
        assert_eq!(job["ParameterizedJob"]["MetaRequired"], json!(["owner"]));
        assert_eq!(job["TaskGroups"][0]["Tasks"][0]["DispatchPayload"], json!({"File": "input.json"}));
        let request: crate::api::job_spec::JobRegisterRequest = serde_json::from_value(json).expect("lenient");
        let converted = crate::api::job_spec::convert_job(request.job.expect("job"), None).expect("converts");
        let periodic = converted.job.periodic.as_ref().expect("periodic");
        assert_eq!((periodic.specs.len(), periodic.time_zone.as_str()), (2, "Europe/Paris"));
        assert_eq!(converted.job.parameterized.as_ref().expect("parameterized").meta_required, ["owner"]);
        let file = converted.job.task_groups[0].tasks[0].dispatch_payload.as_ref().map(|block| block.file.as_str());
        assert_eq!(file, Some("input.json"));
    }

    #[test]
    fn a_docker_task_s_config_comes_out_as_the_driver_reads_it() {
        let text = r#"
job "web" {
  datacenters = ["dc1"]
  group "g" {
    network {
      port "http" { to = 8080 }
    }
    task "web" {
      driver = "docker"
      config {
        image = "registry.example:5000/web:1.2"
        ports = ["http"]
        port_map { http = 8080 }
        labels { team = "web" }
        logging {
          type = "json-file"
          config { max-file = "3" }
        }
        auth {
          username = "deploy"
          password = "secret"
        }
        mount {
          type     = "bind"
          source   = "local/conf"
          target   = "/etc/web"
          readonly = true
        }
        mount {
          type   = "tmpfs"
          target = "/scratch"
        }
        devices = [{ host_path = "/dev/fuse" }]
      }
      resources {
        memory     = 128
        memory_max = 256
      }
    }
  }
}
"#;
        let json = job_json("web.hcl", text).expect("parses");
        let request: crate::api::job_spec::JobRegisterRequest = serde_json::from_value(json).expect("lenient");
        let converted = crate::api::job_spec::convert_job(request.job.expect("job"), None).expect("converts");
        assert_eq!(converted.job.validate(), Ok(()));
        assert_eq!(
            converted.warnings,
            ["TaskGroup \"g\": Task \"web\": config.devices is not implemented by Drover and was ignored"]
        );
        let task = &converted.job.task_groups[0].tasks[0];
        assert_eq!((task.resources.memory_mb, task.memory_max_mb), (128, 256));
        let docker = engine::structs::DockerConfig::from_task(task).expect("the driver reads it");
        assert_eq!(docker.image_reference(), ("registry.example:5000/web".to_string(), "1.2".to_string()));
        assert_eq!(docker.ports, ["http"]);
        assert_eq!(docker.port_map.get("http"), Some(&8080));
        assert_eq!(docker.labels.get("team").map(String::as_str), Some("web"));
        let logging = docker.logging.expect("a logging block");
        assert_eq!(
            (logging.kind.as_str(), logging.config.get("max-file").map(String::as_str)),
            ("json-file", Some("3"))
        );
        let auth = docker.auth.expect("an auth block");
        assert_eq!((auth.username.as_str(), auth.password.as_str()), ("deploy", "secret"));
        let mounts: Vec<_> = docker.mounts.iter().map(|mount| (mount.kind, mount.target.as_str())).collect();
        use engine::structs::MountKind;
        assert_eq!(mounts, [(MountKind::Bind, "/etc/web"), (MountKind::Tmpfs, "/scratch")], "both mount blocks");
        assert!(docker.mounts[0].readonly);
    }

    #[test]
    fn meta_blocks_and_attributes_at_every_level_become_meta() {
        let text = r#"
job "m" {
  meta { owner = "ops" }
  group "g" {
    meta = { "team-name" = "core" }
    task "t" {
      driver = "raw_exec"
      meta { where = "${node.datacenter}" }
    }
  }
}
"#;
        let json = job_json("m.hcl", text).expect("parses");
        let job = &json["Job"];
        assert_eq!(job["Meta"], json!({"owner": "ops"}));
        assert_eq!(job["TaskGroups"][0]["Meta"], json!({"team-name": "core"}));
        assert_eq!(job["TaskGroups"][0]["Tasks"][0]["Meta"], json!({"where": "${node.datacenter}"}));
    }

    #[test]
    fn what_drover_does_not_support_is_named_with_its_line() {
        let typo = EXAMPLE.replace("      kill_timeout = \"10s\"", "      vualt { policies = [\"x\"] }");
        let error = job_json("example.hcl", &typo).expect_err("refused");
        assert_eq!(error.line, 32, "{error}");
        assert!(error.to_string().starts_with("example.hcl:32: task: block \"vualt\" is not supported"), "{error}");
        let variable = EXAMPLE.replace("count = 2", "count = var.count");
        let error = job_json("example.hcl", &variable).expect_err("refused");
        assert_eq!(error.line, 12, "{error}");
        let broken = job_json("broken.hcl", "job \"x\" {\n  group \"g\" {\n").expect_err("refused");
        assert!(broken.to_string().starts_with("broken.hcl:"), "{broken}");
    }

    #[test]
    fn a_port_s_host_network_reaches_the_job() {
        let text = EXAMPLE.replace("port \"db\" {}", "port \"db\" { host_network = \"public\" }");
        let json = job_json("example.hcl", &text).expect("parses");
        let ports = &json["Job"]["TaskGroups"][0]["Networks"][0];
        assert_eq!(ports["DynamicPorts"], json!([{"Label": "db", "HostNetwork": "public"}]));
        let mut request: super::super::job_spec::JobRegisterRequest = serde_json::from_value(json).expect("a job");
        let spec = request.job.take().expect("job");
        let converted = super::super::job_spec::convert_job(spec, None).expect("converts");
        let warned: Vec<&String> =
            converted.warnings.iter().filter(|warning| warning.contains("HostNetwork")).collect();
        assert!(warned.is_empty(), "host_network is honoured, not warned of: {warned:?}");
        let network = &converted.job.task_groups[0].networks[0];
        assert_eq!(network.dynamic_ports[0].host_network.as_deref(), Some("public"));
        assert_eq!(network.reserved_ports[0].host_network, None, "no host_network: the node's address");
    }

    #[test]
    fn a_web_service_with_http_and_tcp_checks_reaches_the_engine_job() {
        let text = r#"
job "shop" {
  datacenters = ["dc1"]
  group "web" {
    count = 2
    network {
      port "http" { to = 8080 }
      port "metrics" {}
    }
    service {
      name         = "shop-web"
      port         = "http"
      tags         = ["urlprefix-/shop", "v2"]
      canary_tags  = ["canary"]
      address_mode = "host"
      provider     = "nomad"
      meta { version = "2" }
      check_restart {
        limit = 3
        grace = "30s"
      }
      check {
        name     = "alive"
        type     = "http"
        path     = "/health"
        method   = "GET"
        interval = "10s"
        timeout  = "2s"
        header { X-Foo = ["bar"] }
        check_restart {
          limit           = 5
          ignore_warnings = true
        }
      }
      check {
        type     = "tcp"
        port     = "metrics"
        interval = "5s"
        timeout  = "1s"
      }
    }
    task "server" {
      driver = "raw_exec"
      config {
        command = "/usr/local/bin/shop"
        args    = ["--port", "${NOMAD_PORT_http}"]
      }
      service {
        port = "metrics"
        tags = ["metrics"]
      }
    }
  }
}
"#;
        let json = job_json("shop.hcl", text).expect("parses");
        let service = &json["Job"]["TaskGroups"][0]["Services"][0];
        assert_eq!(
            (service["PortLabel"].as_str(), service["Checks"][0]["Interval"].as_u64()),
            (Some("http"), Some(10_000_000_000))
        );
        assert_eq!(service["Checks"][0]["Header"], json!({"X-Foo": ["bar"]}));
        assert_eq!(service["CheckRestart"], json!({"Limit": 3, "Grace": 30_000_000_000u64}));
        let request: crate::api::job_spec::JobRegisterRequest = serde_json::from_value(json).expect("lenient");
        let converted = crate::api::job_spec::convert_job(request.job.expect("job"), None).expect("converts");
        assert_eq!(converted.job.validate(), Ok(()));
        assert!(converted.warnings.is_empty(), "services and checks are honoured: {:?}", converted.warnings);
        use engine::structs::{AddressMode, CheckKind, CheckRestart};
        use std::time::Duration;
        let group = &converted.job.task_groups[0];
        let service = &group.services[0];
        assert_eq!((service.name.as_str(), service.port_label.as_str()), ("shop-web", "http"));
        assert_eq!(
            (&service.tags[..], &service.canary_tags[..]),
            (&["urlprefix-/shop".to_string(), "v2".to_string()][..], &["canary".to_string()][..])
        );
        assert_eq!((service.address_mode, service.meta["version"].as_str()), (AddressMode::Host, "2"));
        let [http, tcp] = &service.checks[..] else { panic!("two checks: {:?}", service.checks) };
        assert_eq!((http.kind, http.path.as_str(), http.method.as_str()), (CheckKind::Http, "/health", "GET"));
        assert_eq!((http.interval, http.timeout), (Duration::from_secs(10), Duration::from_secs(2)));
        assert_eq!(http.header["X-Foo"], ["bar"]);
        assert_eq!(
            http.check_restart,
            Some(CheckRestart { limit: 5, grace: Duration::from_secs(30), ignore_warnings: true })
        );
        assert_eq!(
            (tcp.kind, tcp.port_label.as_deref(), tcp.name.as_str()),
            (CheckKind::Tcp, Some("metrics"), "service: \"shop-web\" check")
        );
        assert_eq!(
            tcp.check_restart,
            Some(CheckRestart { limit: 3, grace: Duration::from_secs(30), ignore_warnings: false })
        );
        let task_service = &group.tasks[0].services[0];
        assert_eq!((task_service.name.as_str(), task_service.port_label.as_str()), ("shop-web-server", "metrics"));
        assert_eq!(task_service.tags, ["metrics"]);
    }

    #[test]
    fn template_blocks_reach_the_engine_job_under_nomads_names() {
        let text = r#"
job "web" {
  datacenters = ["dc1"]
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/true"
      }
      template {
        data          = <<EOF
{{ range nomadService "api" }}{{ .Address }}:{{ .Port }}
{{ end }}
EOF
        destination   = "local/upstreams.txt"
        change_mode   = "signal"
        change_signal = "SIGHUP"
        splay         = "2s"
        perms         = "0600"
      }
      template {
        source      = "/srv/app.env.tpl"
        destination = "secrets/app.env"
        env         = true
        uid         = 1000
        wait {
          min = "5s"
        }
      }
    }
  }
}
"#;
        let json = job_json("web.hcl", text).expect("parses");
        let templates = &json["Job"]["TaskGroups"][0]["Tasks"][0]["Templates"];
        assert_eq!(templates[0]["Splay"], 2_000_000_000u64);
        assert_eq!(templates[1]["Wait"], json!({"Min": 5_000_000_000u64}));
        let request: crate::api::job_spec::JobRegisterRequest = serde_json::from_value(json).expect("lenient");
        let converted = crate::api::job_spec::convert_job(request.job.expect("job"), None).expect("converts");
        assert_eq!(converted.job.validate(), Ok(()));
        let warned = converted.warnings.join("\n");
        assert!(warned.contains("Template 2 (\"secrets/app.env\"): Uid is not implemented"), "{warned}");
        assert!(warned.contains("Wait is not implemented"), "{warned}");
        let [first, second] = &converted.job.task_groups[0].tasks[0].templates[..] else { panic!("two templates") };
        assert_eq!(first.data, "{{ range nomadService \"api\" }}{{ .Address }}:{{ .Port }}\n{{ end }}\n");
        assert_eq!((first.destination.as_str(), first.perms.as_str()), ("local/upstreams.txt", "0600"));
        use engine::structs::ChangeMode;
        assert_eq!((first.change_mode, first.change_signal.as_deref()), (ChangeMode::Signal, Some("SIGHUP")));
        assert_eq!(first.splay, std::time::Duration::from_secs(2));
        assert_eq!((second.source.as_deref(), second.envvars), (Some("/srv/app.env.tpl"), true));
        let escaping = text.replace("local/upstreams.txt", "../../etc/cron.d/x");
        let json = job_json("web.hcl", &escaping).expect("parses");
        let request: crate::api::job_spec::JobRegisterRequest = serde_json::from_value(json).expect("lenient");
        let converted = crate::api::job_spec::convert_job(request.job.expect("job"), None).expect("converts");
        let problems = converted.job.validate().expect_err("refused").to_string();
        assert!(problems.contains("climbs out of the task's directory"), "{problems}");
    }

    #[test]
    fn a_misspelt_check_attribute_is_named_with_its_line() {
        let text = "job \"j\" {\n  group \"g\" {\n    service {\n      check {\n        intreval = \"10s\"\n      }\n    }\n  }\n}\n";
        let error = job_json("j.hcl", text).expect_err("refused");
        assert_eq!(error.line, 5, "{error}");
        assert!(error.to_string().contains("check: attribute \"intreval\" is not supported"), "{error}");
    }
}
