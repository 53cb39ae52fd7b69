//! Services and their checks: how a group's or a task's allocations are
//! found (Nomad's `service` block) and how they are judged healthy (its
//! `check` blocks).
//!
//! Contract:
//! 1. A [`Service`] is plain data in the job: its name and tags may hold
//!    `${...}` variables, filled in by the agent that registers it; defaults
//!    (the name, a check's name, `method`) are applied when a submitted job
//!    is read, as Nomad's canonicaliser does, so the stored job says what
//!    will be registered.
//! 2. [`service_problems`] checks what can be checked at submission: port
//!    labels against the group's network, the fields each check kind needs,
//!    intervals and timeouts, names that are valid DNS labels. Anything
//!    holding `${` is left to the agent.
//! 3. Drover registers services with its own discovery (Nomad's
//!    `provider = "nomad"`), whichever provider a job names.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration::serde_duration;
use super::{Task, TaskGroup};

/// Nomad's shortest check interval and timeout.
pub const MIN_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// The longest service name: one DNS label.
pub const MAX_SERVICE_NAME_LEN: usize = 63;

/// The HTTP methods a check may use.
pub const CHECK_METHODS: [&str; 9] = ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"];

/// Defines a lower-case enum with Nomad's names, parsed and printed.
macro_rules! named_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every value, in Nomad's order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// Nomad's name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// The value of Nomad's name, if it is one.
            pub fn parse(text: &str) -> Option<$name> {
                $name::ALL.iter().copied().find(|value| value.as_str() == text)
            }

            /// Nomad's names, for an error message: `a, b or c`.
            pub fn names() -> String {
                let names: Vec<&str> = $name::ALL.iter().map(|value| value.as_str()).collect();
                match names.split_last() {
                    Some((last, [])) => last.to_string(),
                    Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
                    None => String::new(),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

named_enum! {
    /// Which address a service is registered with (Nomad's `address_mode`).
    /// Drover's drivers advertise no address of their own (no docker
    /// network but the host's ports), so `alloc` and `driver` register the
    /// allocated port's host address with the port's `to`.
    #[derive(Default)]
    AddressMode {
        #[default]
        /// `address` if set, else the driver's if it advertises one, else the host's.
        Auto => "auto",
        /// The allocated port's host address and port.
        Host => "host",
        /// The allocation's network namespace address and the port's `to`.
        Alloc => "alloc",
        /// The driver's address and the port's `to`.
        Driver => "driver",
    }
}

named_enum! {
    /// Where a service is registered (Nomad's `provider`). Drover has its
    /// own discovery; `consul` is kept as written, warned of at submission,
    /// and registered with Drover's discovery all the same.
    #[derive(Default)]
    ServiceProvider {
        #[default]
        /// Nomad's native service discovery: Drover's.
        Nomad => "nomad",
        /// Consul, which Drover does not talk to.
        Consul => "consul",
    }
}

named_enum! {
    /// How a service's or a check's health counts during a deployment
    /// (Nomad's `on_update`).
    #[derive(Default)]
    OnUpdate {
        #[default]
        /// Checks must pass (Nomad's default).
        RequireHealthy => "require_healthy",
        /// Warnings count as passing.
        IgnoreWarnings => "ignore_warnings",
        /// Checks do not count (a readiness check).
        Ignore => "ignore",
    }
}

named_enum! {
    /// What a check does (Nomad's check `type`; `grpc` is refused at submission).
    CheckKind {
        /// An HTTP request; 2xx passes.
        Http => "http",
        /// A TCP connection.
        Tcp => "tcp",
        /// A command run in the task's context: exit 0 passes, 1 warns.
        Script => "script",
    }
}

named_enum! {
    /// A check's status (Consul's names, as Nomad's `initial_status` takes them).
    CheckStatus {
        /// Healthy.
        Passing => "passing",
        /// Degraded.
        Warning => "warning",
        /// Unhealthy.
        Critical => "critical",
    }
}

/// When failing checks restart their task (Nomad's `check_restart`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CheckRestart {
    /// Restart after this many unhealthy results in a row; 0: never.
    pub limit: u32,
    /// How long after the task (re)starts before results count (Nomad's default 1 s).
    #[serde(with = "serde_duration")]
    pub grace: Duration,
    /// Whether a `warning` counts as healthy.
    #[serde(default)]
    pub ignore_warnings: bool,
}

impl CheckRestart {
    /// Nomad's default grace.
    pub const DEFAULT_GRACE: Duration = Duration::from_secs(1);
}

/// One health check of a service (Nomad's `check` block).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ServiceCheck {
    /// Name, unique within its service (default `service: "<service>" check`).
    pub name: String,
    /// What the check does.
    pub kind: CheckKind,
    /// The request path of an `http` check, relative (`/health`).
    #[serde(default)]
    pub path: String,
    /// The method of an `http` check (default `GET`).
    #[serde(default)]
    pub method: String,
    /// Request headers of an `http` check.
    #[serde(default)]
    pub header: BTreeMap<String, Vec<String>>,
    /// The body of an `http` check's request.
    #[serde(default)]
    pub body: String,
    /// `http` or `https` for an `http` check; empty: `http`.
    #[serde(default)]
    pub protocol: String,
    /// Skip verifying an `https` check's certificate.
    #[serde(default)]
    pub tls_skip_verify: bool,
    /// The port checked: a label of the group's network or a number as
    /// text; absent: the service's.
    #[serde(default)]
    pub port_label: Option<String>,
    /// The check's own address mode (`host`, `alloc` or `driver`); absent: the service's.
    #[serde(default)]
    pub address_mode: Option<AddressMode>,
    /// The command of a `script` check.
    #[serde(default)]
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// The task a group service's `script` check runs in (Nomad's check
    /// `task`); absent: the service's `task`.
    #[serde(default)]
    pub task_name: Option<String>,
    /// Time between runs (at least 1 s).
    #[serde(with = "serde_duration")]
    pub interval: Duration,
    /// How long one run may take (at least 1 s).
    #[serde(with = "serde_duration")]
    pub timeout: Duration,
    /// The status before the first run; absent: `critical`.
    #[serde(default)]
    pub initial_status: Option<CheckStatus>,
    /// Passing runs in a row before the check is passing.
    #[serde(default)]
    pub success_before_passing: u32,
    /// Failing runs in a row before the check is critical.
    #[serde(default)]
    pub failures_before_critical: u32,
    /// How the check counts during a deployment.
    #[serde(default)]
    pub on_update: OnUpdate,
    /// When its failures restart the task (the service's applies to
    /// every check without its own, laid in at submission).
    #[serde(default)]
    pub check_restart: Option<CheckRestart>,
}

impl ServiceCheck {
    /// A check of `kind` with Nomad's defaults, for tests and fixtures.
    pub fn new(name: &str, kind: CheckKind, interval: Duration, timeout: Duration) -> ServiceCheck {
        ServiceCheck {
            name: name.to_string(),
            kind,
            path: String::new(),
            method: "GET".to_string(),
            header: BTreeMap::new(),
            body: String::new(),
            protocol: String::new(),
            tls_skip_verify: false,
            port_label: None,
            address_mode: None,
            command: String::new(),
            args: Vec::new(),
            task_name: None,
            interval,
            timeout,
            initial_status: None,
            success_before_passing: 0,
            failures_before_critical: 0,
            on_update: OnUpdate::default(),
            check_restart: None,
        }
    }

    /// Nomad's default check name.
    pub fn default_name(service: &str) -> String {
        format!("service: {service:?} check")
    }

    /// Whether the check connects to a port (http and tcp do).
    pub fn needs_port(&self) -> bool {
        matches!(self.kind, CheckKind::Http | CheckKind::Tcp)
    }
}

/// A service of a group or a task (Nomad's `service` block).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Service {
    /// The name it is registered under; may hold `${...}`, filled in by
    /// the agent (default `<job>-<group>-<task>`, `<job>-<group>` for a
    /// group's).
    pub name: String,
    /// The port registered: a label of the group's network, or a number as
    /// text; empty: none.
    #[serde(default)]
    pub port_label: String,
    /// Tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Tags instead of `tags` while the allocation is an unpromoted canary.
    #[serde(default)]
    pub canary_tags: Vec<String>,
    /// Free-form key-value pairs.
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
    /// Which address is registered.
    #[serde(default)]
    pub address_mode: AddressMode,
    /// An address registered as it is (only with `address_mode = "auto"`).
    #[serde(default)]
    pub address: Option<String>,
    /// Where it is registered (Drover's own discovery either way).
    #[serde(default)]
    pub provider: ServiceProvider,
    /// The task a group service belongs to (Nomad's `task`); always absent
    /// on a task's service.
    #[serde(default)]
    pub task_name: Option<String>,
    /// How its checks count during a deployment.
    #[serde(default)]
    pub on_update: OnUpdate,
    /// Its health checks.
    #[serde(default)]
    pub checks: Vec<ServiceCheck>,
}

impl Service {
    /// A service named `name` on `port_label`, with Nomad's defaults.
    pub fn new(name: &str, port_label: &str) -> Service {
        Service {
            name: name.to_string(),
            port_label: port_label.to_string(),
            tags: Vec::new(),
            canary_tags: Vec::new(),
            meta: BTreeMap::new(),
            address_mode: AddressMode::default(),
            address: None,
            provider: ServiceProvider::default(),
            task_name: None,
            on_update: OnUpdate::default(),
            checks: Vec::new(),
        }
    }

    /// Nomad's default name: `<job>-<group>-<task>`, or `<job>-<group>`
    /// for a group's service (`task` absent).
    pub fn default_name(job: &str, group: &str, task: Option<&str>) -> String {
        match task {
            Some(task) => format!("{job}-{group}-{task}"),
            None => format!("{job}-{group}"),
        }
    }
}

/// Why `name` cannot be a service name (Nomad's `ValidateName`: RFC 1123
/// letters, digits and dashes, not starting or ending with a dash, at most
/// 63 characters), or `None`. A name holding `${` is the agent's to check
/// once filled in.
pub fn service_name_problem(name: &str) -> Option<String> {
    if name.contains("${") {
        return None;
    }
    let valid_chars = name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    if name.is_empty()
        || name.len() > MAX_SERVICE_NAME_LEN
        || !valid_chars
        || name.starts_with('-')
        || name.ends_with('-')
    {
        return Some(format!(
            "service name must be valid per RFC 1123 and can contain only alphanumeric characters or dashes and \
             must be no longer than {MAX_SERVICE_NAME_LEN} characters: {name:?}"
        ));
    }
    None
}

/// The group's services and every task's, checked (contract, step 2).
pub(crate) fn group_service_problems(group: &TaskGroup, place: &str, problems: &mut Vec<String>) {
    let ports: BTreeSet<&str> = group
        .networks
        .iter()
        .flat_map(|network| network.reserved_ports.iter().chain(&network.dynamic_ports))
        .map(|port| &*port.label)
        .collect();
    let scope = Scope { group, ports: &ports, task: None };
    services_problems(&group.services, &scope, place, problems);
    for task in &group.tasks {
        let scope = Scope { group, ports: &ports, task: Some(task) };
        services_problems(&task.services, &scope, &format!("{place}, task {:?}", task.name), problems);
    }
    let providers: BTreeSet<ServiceProvider> = group
        .services
        .iter()
        .chain(group.tasks.iter().flat_map(|task| &task.services))
        .map(|service| service.provider)
        .collect();
    if providers.len() > 1 {
        problems
            .push(format!("{place}: multiple service providers used: task group services must use the same provider"));
    }
}

/// Where a list of services is: its group, the group's port labels, and
/// its task (absent for a group's).
struct Scope<'a> {
    group: &'a TaskGroup,
    ports: &'a BTreeSet<&'a str>,
    task: Option<&'a Task>,
}

impl Scope<'_> {
    /// Why `label` names no port the service can register, or `None`.
    fn port_problem(&self, label: &str) -> Option<String> {
        let known = label.contains("${") || label.parse::<u16>().is_ok() || self.ports.contains(label);
        (!known).then(|| format!("port label {label:?} is not a port of the group's network (or a port number)"))
    }

    fn has_task(&self, name: &str) -> bool {
        self.group.tasks.iter().any(|task| task.name == name)
    }
}

fn services_problems(services: &[Service], scope: &Scope<'_>, place: &str, problems: &mut Vec<String>) {
    let mut seen = BTreeSet::new();
    for service in services {
        let service_place = format!("{place}, service {:?}", service.name);
        if !seen.insert((service.name.as_str(), service.port_label.as_str())) {
            problems.push(format!("{service_place}: defined more than once with port {:?}", service.port_label));
        }
        service_problems(service, scope, &service_place, problems);
    }
}

fn service_problems(service: &Service, scope: &Scope<'_>, place: &str, problems: &mut Vec<String>) {
    if let Some(why) = service_name_problem(&service.name) {
        problems.push(format!("{place}: {why}"));
    }
    if !service.port_label.is_empty() {
        if let Some(why) = scope.port_problem(&service.port_label) {
            problems.push(format!("{place}: {why}"));
        }
    }
    if service.address.is_some() && service.address_mode != AddressMode::Auto {
        problems.push(format!(
            "{place}: an address requires address_mode \"auto\" (got {:?})",
            service.address_mode.as_str()
        ));
    }
    match (scope.task, service.task_name.as_deref()) {
        (Some(task), Some(named)) if named != task.name => {
            problems.push(format!("{place}: task {named:?} is only for a group's service"));
        }
        (None, Some(named)) if !scope.has_task(named) => {
            problems.push(format!("{place}: task {named:?} is not a task of the group"));
        }
        _ => {}
    }
    for (key, value) in &service.meta {
        if key.contains('\0') || value.contains('\0') {
            problems.push(format!("{place}: meta {key:?} contains NUL"));
        }
    }
    let mut check_names = BTreeSet::new();
    for check in &service.checks {
        let check_place = format!("{place}, check {:?}", check.name);
        if !check_names.insert(check.name.as_str()) {
            problems.push(format!("{check_place}: defined more than once"));
        }
        check_problems(check, service, scope, &check_place, problems);
    }
}

fn check_problems(check: &ServiceCheck, service: &Service, scope: &Scope<'_>, place: &str, problems: &mut Vec<String>) {
    for (what, value) in [("interval", check.interval), ("timeout", check.timeout)] {
        if value < MIN_CHECK_INTERVAL {
            problems.push(format!("{place}: {what} ({value:?}) must be at least {MIN_CHECK_INTERVAL:?}"));
        }
    }
    match check.kind {
        CheckKind::Http => http_check_problems(check, place, problems),
        CheckKind::Tcp => {}
        CheckKind::Script => script_check_problems(check, service, scope, place, problems),
    }
    match check.port_label.as_deref() {
        Some(label) => {
            if let Some(why) = scope.port_problem(label) {
                problems.push(format!("{place}: {why}"));
            }
        }
        None if check.needs_port() && service.port_label.is_empty() => {
            problems
                .push(format!("{place}: a {} check needs a port, and neither it nor its service has one", check.kind));
        }
        None => {}
    }
    if check.address_mode == Some(AddressMode::Auto) {
        problems.push(format!("{place}: a check's address_mode is host, alloc or driver (\"auto\" is for services)"));
    }
    if check.task_name.is_some() && scope.task.is_some() {
        problems.push(format!("{place}: a check's task is only for a group's service"));
    }
}

fn http_check_problems(check: &ServiceCheck, place: &str, problems: &mut Vec<String>) {
    if check.path.is_empty() {
        problems.push(format!("{place}: an http check needs a path"));
    } else if check.path.contains("://") {
        problems.push(format!("{place}: an http check's path must be relative (got {:?})", check.path));
    }
    if !check.method.contains("${") && !CHECK_METHODS.contains(&check.method.as_str()) {
        problems.push(format!("{place}: method {:?} is not one of {}", check.method, CHECK_METHODS.join(", ")));
    }
    if !matches!(check.protocol.as_str(), "" | "http" | "https") && !check.protocol.contains("${") {
        problems.push(format!("{place}: protocol {:?} is not http or https", check.protocol));
    }
}

fn script_check_problems(
    check: &ServiceCheck,
    service: &Service,
    scope: &Scope<'_>,
    place: &str,
    problems: &mut Vec<String>,
) {
    if check.command.is_empty() {
        problems.push(format!("{place}: a script check needs a command"));
    }
    if scope.task.is_some() {
        return;
    }
    match check.task_name.as_deref().or(service.task_name.as_deref()) {
        None => problems.push(format!("{place}: a script check of a group's service needs the task it runs in (task)")),
        Some(named) if !scope.has_task(named) => {
            problems.push(format!("{place}: task {named:?} is not a task of the group"));
        }
        Some(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::structs::{Job, JobType, NetworkResource, Port, Resources};

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn job_with(group_services: Vec<Service>, task_services: Vec<Service>) -> Job {
        let mut job = Job::new_simple("web", JobType::Service, 1, Resources::new(100, 128, 0));
        let group = &mut job.task_groups[0];
        group.networks = vec![NetworkResource {
            reserved_ports: vec![Port::new("admin", 9090)],
            dynamic_ports: vec![Port::new("http", 0)],
        }];
        group.services = group_services;
        group.tasks[0].services = task_services;
        job
    }

    fn problems(job: &Job) -> Vec<String> {
        job.validate().err().map(|error| error.problems).unwrap_or_default()
    }

    #[test]
    fn a_web_service_with_http_and_tcp_checks_is_valid() {
        let mut service = Service::new("web", "http");
        let mut http = ServiceCheck::new("alive", CheckKind::Http, secs(10), secs(2));
        http.path = "/health".to_string();
        service.checks = vec![http, ServiceCheck::new("port", CheckKind::Tcp, secs(10), secs(2))];
        let mut admin = Service::new("${NOMAD_JOB_NAME}-admin", "admin");
        admin.checks = vec![ServiceCheck::new("tcp", CheckKind::Tcp, secs(5), secs(1))];
        assert_eq!(
            problems(&job_with(vec![admin], vec![service, Service::new("numbered", "8080")])),
            Vec::<String>::new()
        );
    }

    #[test]
    fn every_service_problem_is_named_with_its_place() {
        let mut service = Service::new("web_1", "nope");
        let mut http = ServiceCheck::new("alive", CheckKind::Http, Duration::from_millis(500), secs(2));
        http.method = "FETCH".to_string();
        let mut script = ServiceCheck::new("script", CheckKind::Script, secs(10), secs(2));
        script.port_label = Some("missing".to_string());
        service.checks = vec![http, script];
        let job = job_with(vec![], vec![service]);
        let place = "task group \"group\", task \"task\", service \"web_1\"";
        assert_eq!(
            problems(&job),
            [
                format!("{place}: service name must be valid per RFC 1123 and can contain only alphanumeric characters or dashes and must be no longer than 63 characters: \"web_1\""),
                format!("{place}: port label \"nope\" is not a port of the group's network (or a port number)"),
                format!("{place}, check \"alive\": interval (500ms) must be at least 1s"),
                format!("{place}, check \"alive\": an http check needs a path"),
                format!("{place}, check \"alive\": method \"FETCH\" is not one of GET, HEAD, POST, PUT, DELETE, CONNECT, OPTIONS, TRACE, PATCH"),
                format!("{place}, check \"script\": a script check needs a command"),
                format!("{place}, check \"script\": port label \"missing\" is not a port of the group's network (or a port number)"),
            ]
        );
    }

    #[test]
    fn a_group_services_script_check_needs_a_task_of_the_group() {
        let mut service = Service::new("web", "http");
        let mut script = ServiceCheck::new("script", CheckKind::Script, secs(10), secs(2));
        script.command = "/bin/true".to_string();
        service.checks = vec![script];
        let text = problems(&job_with(vec![service.clone()], vec![])).join("\n");
        assert!(text.contains("a script check of a group's service needs the task it runs in"), "{text}");
        service.task_name = Some("task".to_string());
        assert_eq!(problems(&job_with(vec![service.clone()], vec![])), Vec::<String>::new());
        service.task_name = None;
        service.checks[0].task_name = Some("other".to_string());
        let text = problems(&job_with(vec![service], vec![])).join("\n");
        assert!(text.contains("task \"other\" is not a task of the group"), "{text}");
    }

    #[test]
    fn a_tcp_check_needs_a_port_and_providers_agree() {
        let mut service = Service::new("web", "");
        service.checks = vec![ServiceCheck::new("tcp", CheckKind::Tcp, secs(10), secs(2))];
        let mut consul = Service::new("other", "http");
        consul.provider = ServiceProvider::Consul;
        consul.address = Some("10.0.0.1".to_string());
        consul.address_mode = AddressMode::Host;
        let text = problems(&job_with(vec![consul], vec![service])).join("\n");
        assert!(text.contains("a tcp check needs a port, and neither it nor its service has one"), "{text}");
        assert!(text.contains("multiple service providers used"), "{text}");
        assert!(text.contains("an address requires address_mode \"auto\" (got \"host\")"), "{text}");
    }

    #[test]
    fn names_follow_nomads_rule_unless_interpolated() {
        assert_eq!(service_name_problem("web-1"), None);
        assert_eq!(service_name_problem("${NOMAD_JOB_NAME}_x"), None, "the agent's to check");
        for bad in ["", "-web", "web-", "web.api", &"a".repeat(64)] {
            assert!(service_name_problem(bad).is_some(), "{bad:?}");
        }
        assert_eq!(Service::default_name("j", "g", Some("t")), "j-g-t");
        assert_eq!(Service::default_name("j", "g", None), "j-g");
        assert_eq!(ServiceCheck::default_name("web"), "service: \"web\" check");
        assert_eq!(AddressMode::names(), "auto, host, alloc or driver");
        assert_eq!(OnUpdate::parse("ignore_warnings"), Some(OnUpdate::IgnoreWarnings));
    }

    #[test]
    fn services_change_the_job_and_read_back_from_json() {
        let mut service = Service::new("web", "http");
        service.checks = vec![ServiceCheck::new("tcp", CheckKind::Tcp, secs(10), secs(2))];
        service.checks[0].check_restart = Some(CheckRestart { limit: 3, grace: secs(30), ignore_warnings: false });
        let job = job_with(vec![], vec![service]);
        assert_ne!(job, job_with(vec![], vec![]), "a service is part of the spec");
        let again: Job = serde_json::from_str(&serde_json::to_string(&job).expect("serializes")).expect("reads");
        assert_eq!(again, job);
    }
}
