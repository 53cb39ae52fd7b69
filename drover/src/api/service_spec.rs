//! The `Services` of a submitted group or task (Nomad's `api.Service` and
//! `api.ServiceCheck`), read leniently and turned into the engine's
//! [`Service`] with Nomad's defaults (the name, each check's name and
//! method, the service's `CheckRestart` laid under each check's). Every
//! field is honoured, warned of, or refused; none is dropped silently.

use std::collections::BTreeMap;
use std::time::Duration;

use engine::structs::{
    AddressMode, CheckKind, CheckRestart, CheckStatus, OnUpdate, Service, ServiceCheck, ServiceProvider,
};
use serde::Deserialize;
use serde_json::Value;

use super::spec::{is_set, says_something, JobSpecError};

/// A service (`api.Service`).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct ServiceSpec {
    pub name: Option<String>,
    pub port_label: Option<String>,
    pub tags: Option<Vec<String>>,
    pub canary_tags: Option<Vec<String>>,
    pub meta: Option<BTreeMap<String, String>>,
    pub address_mode: Option<String>,
    pub address: Option<String>,
    pub provider: Option<String>,
    pub task_name: Option<String>,
    pub on_update: Option<String>,
    pub checks: Option<Vec<CheckSpec>>,
    pub check_restart: Option<CheckRestartSpec>,
    pub id: Option<Value>,
    pub enable_tag_override: Option<Value>,
    pub canary_meta: Option<Value>,
    pub tagged_addresses: Option<Value>,
    pub connect: Option<Value>,
    pub identity: Option<Value>,
    pub cluster: Option<Value>,
    pub weights: Option<Value>,
    /// Fields Drover does not know: warned of when set.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A check (`api.ServiceCheck`); durations in nanoseconds.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct CheckSpec {
    pub name: Option<String>,
    #[serde(rename = "Type")]
    pub kind: Option<String>,
    pub path: Option<String>,
    pub method: Option<String>,
    pub header: Option<BTreeMap<String, Vec<String>>>,
    pub body: Option<String>,
    pub protocol: Option<String>,
    #[serde(rename = "TLSSkipVerify")]
    pub tls_skip_verify: Option<bool>,
    pub port_label: Option<String>,
    pub address_mode: Option<String>,
    pub command: Option<String>,
    pub args: Option<Vec<String>>,
    pub task_name: Option<String>,
    pub interval: Option<i64>,
    pub timeout: Option<i64>,
    pub initial_status: Option<String>,
    pub success_before_passing: Option<i64>,
    pub failures_before_critical: Option<i64>,
    pub on_update: Option<String>,
    pub check_restart: Option<CheckRestartSpec>,
    pub id: Option<Value>,
    pub expose: Option<Value>,
    #[serde(rename = "GRPCService")]
    pub grpc_service: Option<Value>,
    #[serde(rename = "GRPCUseTLS")]
    pub grpc_use_tls: Option<Value>,
    #[serde(rename = "TLSServerName")]
    pub tls_server_name: Option<Value>,
    pub failures_before_warning: Option<Value>,
    pub notes: Option<Value>,
    /// Fields Drover does not know: warned of when set.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// `CheckRestart`; `Grace` in nanoseconds.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
#[allow(missing_docs)]
pub struct CheckRestartSpec {
    pub limit: Option<i64>,
    pub grace: Option<i64>,
    pub ignore_warnings: Option<bool>,
    /// Fields Drover does not know: warned of when set.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

impl CheckRestartSpec {
    /// Nomad's merge: the check's own fields over the service's.
    fn over(&self, service: Option<&CheckRestartSpec>) -> CheckRestartSpec {
        let Some(service) = service else { return self.clone() };
        CheckRestartSpec {
            limit: self.limit.filter(|limit| *limit != 0).or(service.limit),
            grace: self.grace.or(service.grace),
            ignore_warnings: Some(self.ignore_warnings.unwrap_or(false) || service.ignore_warnings.unwrap_or(false)),
            other: BTreeMap::new(),
        }
    }
}

/// Where the services are: the job, the group and (for a task's) the task,
/// for the default names and for messages.
#[derive(Debug)]
pub struct ServiceOwner<'a> {
    /// The job's name.
    pub job: &'a str,
    /// The group's name.
    pub group: &'a str,
    /// The task's name; absent for a group's services.
    pub task: Option<&'a str>,
    /// `TaskGroup "g": ` or `TaskGroup "g": Task "t": `.
    pub place: &'a str,
}

fn warn_unknown(place: &str, other: &BTreeMap<String, Value>, warnings: &mut Vec<String>) {
    for (field, value) in other {
        if says_something(value) {
            warnings.push(format!("{place}{field} is not known to Drover and was ignored"));
        }
    }
}

/// Converts the `Services` of a group or a task.
pub fn convert_services(
    services: Option<Vec<ServiceSpec>>,
    owner: &ServiceOwner<'_>,
    warnings: &mut Vec<String>,
) -> Result<Vec<Service>, JobSpecError> {
    services.unwrap_or_default().into_iter().map(|service| convert_service(service, owner, warnings)).collect()
}

fn convert_service(
    api: ServiceSpec,
    owner: &ServiceOwner<'_>,
    warnings: &mut Vec<String>,
) -> Result<Service, JobSpecError> {
    let name = api
        .name
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| Service::default_name(owner.job, owner.group, owner.task));
    let place = format!("{}Service {name:?}: ", owner.place);
    if is_set(&api.connect) {
        return Err(JobSpecError::new(format!(
            "{place}Connect is refused: Drover has no Consul Connect service mesh, and the job would run \
             without its sidecar proxy; nothing was registered"
        )));
    }
    for (field, value) in [
        ("ID", &api.id),
        ("EnableTagOverride", &api.enable_tag_override),
        ("CanaryMeta", &api.canary_meta),
        ("TaggedAddresses", &api.tagged_addresses),
        ("Identity", &api.identity),
        ("Cluster", &api.cluster),
        ("Weights", &api.weights),
    ] {
        if is_set(value) {
            warnings.push(format!("{place}{field} is not implemented by Drover and was ignored"));
        }
    }
    warn_unknown(&place, &api.other, warnings);
    let mut service = Service::new(&name, &api.port_label.unwrap_or_default());
    service.tags = api.tags.unwrap_or_default();
    service.canary_tags = api.canary_tags.unwrap_or_default();
    service.meta = api.meta.unwrap_or_default();
    service.address_mode =
        parsed(api.address_mode, &place, "AddressMode", AddressMode::parse, AddressMode::names)?.unwrap_or_default();
    service.address = api.address.filter(|address| !address.is_empty());
    service.provider =
        parsed(api.provider, &place, "Provider", ServiceProvider::parse, ServiceProvider::names)?.unwrap_or_default();
    if service.provider == ServiceProvider::Consul {
        warnings.push(format!(
            "{place}Provider \"consul\" is not supported by Drover: the service is registered with Drover's own \
             service discovery"
        ));
    }
    service.task_name = api.task_name.filter(|task| !task.is_empty());
    service.on_update =
        parsed(api.on_update, &place, "OnUpdate", OnUpdate::parse, OnUpdate::names)?.unwrap_or_default();
    if let Some(restart) = &api.check_restart {
        warn_unknown(&format!("{place}CheckRestart."), &restart.other, warnings);
    }
    for check in api.checks.unwrap_or_default() {
        service.checks.push(convert_check(check, &name, api.check_restart.as_ref(), &place, warnings)?);
    }
    Ok(service)
}

fn convert_check(
    api: CheckSpec,
    service_name: &str,
    service_restart: Option<&CheckRestartSpec>,
    service_place: &str,
    warnings: &mut Vec<String>,
) -> Result<ServiceCheck, JobSpecError> {
    let name = api.name.filter(|name| !name.is_empty()).unwrap_or_else(|| ServiceCheck::default_name(service_name));
    let place = format!("{service_place}Check {name:?}: ");
    let kind = match api.kind.as_deref().unwrap_or("") {
        "grpc" => {
            return Err(JobSpecError::new(format!(
                "{place}Type \"grpc\" is refused: Drover runs http, tcp and script checks only; nothing was \
                 registered"
            )))
        }
        text => CheckKind::parse(text)
            .ok_or_else(|| JobSpecError::new(format!("{place}Type {text:?} is not one of {}", CheckKind::names())))?,
    };
    for (field, value) in [
        ("ID", &api.id),
        ("Expose", &api.expose),
        ("GRPCService", &api.grpc_service),
        ("GRPCUseTLS", &api.grpc_use_tls),
        ("TLSServerName", &api.tls_server_name),
        ("FailuresBeforeWarning", &api.failures_before_warning),
        ("Notes", &api.notes),
    ] {
        if is_set(value) {
            warnings.push(format!("{place}{field} is not implemented by Drover and was ignored"));
        }
    }
    warn_unknown(&place, &api.other, warnings);
    let duration = |value: Option<i64>, field: &str| {
        u64::try_from(value.unwrap_or(0))
            .map(Duration::from_nanos)
            .map_err(|_| JobSpecError::new(format!("{place}{field} must not be negative")))
    };
    let mut check =
        ServiceCheck::new(&name, kind, duration(api.interval, "Interval")?, duration(api.timeout, "Timeout")?);
    check.path = api.path.unwrap_or_default();
    check.method = api.method.filter(|method| !method.is_empty()).unwrap_or_else(|| "GET".to_string());
    check.header = api.header.unwrap_or_default();
    check.body = api.body.unwrap_or_default();
    check.protocol = api.protocol.unwrap_or_default();
    check.tls_skip_verify = api.tls_skip_verify.unwrap_or(false);
    check.port_label = api.port_label.filter(|label| !label.is_empty());
    check.address_mode = parsed(api.address_mode, &place, "AddressMode", AddressMode::parse, AddressMode::names)?;
    check.command = api.command.unwrap_or_default();
    check.args = api.args.unwrap_or_default();
    check.task_name = api.task_name.filter(|task| !task.is_empty());
    check.initial_status = parsed(api.initial_status, &place, "InitialStatus", CheckStatus::parse, CheckStatus::names)?;
    // Nomad clamps negative counts to 0.
    let count = |value: Option<i64>| u32::try_from(value.unwrap_or(0).max(0)).unwrap_or(u32::MAX);
    check.success_before_passing = count(api.success_before_passing);
    check.failures_before_critical = count(api.failures_before_critical);
    check.on_update = parsed(api.on_update, &place, "OnUpdate", OnUpdate::parse, OnUpdate::names)?.unwrap_or_default();
    if let Some(own) = &api.check_restart {
        warn_unknown(&format!("{place}CheckRestart."), &own.other, warnings);
    }
    let restart = match (&api.check_restart, service_restart) {
        (Some(own), service) => Some(own.over(service)),
        (None, Some(service)) => Some(service.clone()),
        (None, None) => None,
    };
    check.check_restart = restart.map(|restart| check_restart(&restart, &place)).transpose()?;
    Ok(check)
}

fn check_restart(api: &CheckRestartSpec, place: &str) -> Result<CheckRestart, JobSpecError> {
    let limit = api.limit.unwrap_or(0);
    let grace = match api.grace {
        None => CheckRestart::DEFAULT_GRACE,
        Some(nanos) => Duration::from_nanos(
            u64::try_from(nanos)
                .map_err(|_| JobSpecError::new(format!("{place}CheckRestart.Grace must not be negative")))?,
        ),
    };
    Ok(CheckRestart {
        limit: u32::try_from(limit)
            .map_err(|_| JobSpecError::new(format!("{place}CheckRestart.Limit {limit} is invalid")))?,
        grace,
        ignore_warnings: api.ignore_warnings.unwrap_or(false),
    })
}

/// An enum by Nomad's name; `""` and absent are `None`.
fn parsed<T>(
    text: Option<String>,
    place: &str,
    field: &str,
    parse: fn(&str) -> Option<T>,
    names: fn() -> String,
) -> Result<Option<T>, JobSpecError> {
    match text.as_deref() {
        None | Some("") => Ok(None),
        Some(text) => parse(text)
            .map(Some)
            .ok_or_else(|| JobSpecError::new(format!("{place}{field} {text:?} is not one of {}", names()))),
    }
}
