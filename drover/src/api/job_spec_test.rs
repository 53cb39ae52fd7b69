//! The reading of submitted jobs: Nomad's defaults, refusals, and the
//! warnings for what Drover does not honour.

use super::*;
use engine::structs::{AddressMode, CheckKind, CheckRestart, CheckStatus, HealthCheckMode, OnUpdate, ServiceProvider};
use serde_json::json;

#[test]
fn a_cli_job_full_of_nulls_gets_nomads_defaults() {
    let body = json!({"Job": {"Region": null, "Namespace": null, "ID": "example", "Name": "example",
        "Type": null, "Priority": null, "Datacenters": ["dc1"], "Constraints": null, "Affinities": null,
        "TaskGroups": [{"Name": "cache", "Count": null, "Tasks": [{"Name": "redis", "Driver": "mock",
            "Config": {"run_for": "10s", "ports": ["db"]}, "Resources": {"CPU": 500, "MemoryMB": null},
            "KillTimeout": null, "Env": null}],
          "Networks": [{"DynamicPorts": [{"Label": "db", "Value": 0}]}], "NewerNomadField": {"x": 1}}],
        "Dispatched": false, "NodePool": "default"}, "Region": "", "Namespace": "", "SecretID": ""});
    let request: JobRegisterRequest = serde_json::from_value(body).expect("lenient");
    let Converted { job, warnings } = convert_job(request.job.expect("job"), None).expect("converts");
    assert_eq!((job.job_type, job.priority, &*job.namespace), (JobType::Service, 50, "default"));
    let group = &job.task_groups[0];
    assert_eq!(group.count, 1);
    assert_eq!(group.tasks[0].resources, Resources::new(500, 300, 300));
    assert_eq!(group.tasks[0].config["ports"], ConfigValue::List(vec!["db".into()]));
    assert_eq!(group.tasks[0].kill_timeout, Duration::from_secs(5), "Nomad's default");
    assert_eq!(group.restart_policy, RestartPolicy::default());
    assert_eq!(
        warnings,
        ["TaskGroup \"cache\": NewerNomadField is not known to Drover and was ignored"],
        "a field Drover does not know is named when set, never when at its zero value"
    );
    assert_eq!(group.networks[0].dynamic_ports[0].label.as_ref(), "db");
    assert_eq!(job.validate(), Ok(()));
}

#[test]
fn meta_is_kept_at_every_level_without_a_warning() {
    let body = json!({"ID": "meta", "Datacenters": ["dc1"], "Meta": {"owner": "ops", "tier": "job"},
        "TaskGroups": [{"Name": "g", "Meta": {"tier": "group"},
            "Tasks": [{"Name": "t", "Driver": "mock", "Meta": {"where": "${node.datacenter}"}}]}]});
    let Converted { job, warnings } = convert_job(serde_json::from_value(body).expect("lenient"), None).expect("ok");
    assert!(warnings.is_empty(), "{warnings:?}");
    let meta = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect()
    };
    assert_eq!(job.meta, meta(&[("owner", "ops"), ("tier", "job")]));
    assert_eq!(job.task_groups[0].meta, meta(&[("tier", "group")]));
    assert_eq!(job.task_groups[0].tasks[0].meta, meta(&[("where", "${node.datacenter}")]), "left for the client");
}

#[test]
fn bad_values_are_refused_with_what_is_wrong() {
    let refuse = |body: Value| convert_job(serde_json::from_value(body).expect("lenient"), None).expect_err("refused");
    assert!(refuse(json!({"ID": ""})).to_string().contains("Job ID"));
    assert!(refuse(json!({"ID": "x", "Type": "daemon"})).to_string().contains("daemon"));
    assert!(refuse(json!({"ID": "x", "Priority": 300})).to_string().contains("priority"));
    let operand = json!({"ID": "x", "Constraints": [{"LTarget": "a", "RTarget": "b", "Operand": "~="}]});
    assert!(refuse(operand).to_string().contains("\"~=\" is not supported"));
    let reconcile = json!({"ID": "x", "TaskGroups": [{"Name": "g", "Disconnect": {"Reconcile": "coin_toss"}}]});
    assert!(refuse(reconcile).to_string().contains("\"coin_toss\" is not one of best_score"));
    assert!(refuse(json!({"ID": "x", "Constraints": [{"LTarget": "a"}]})).to_string().contains("operand"));
}

#[test]
fn set_operands_are_read() {
    let body = json!({"ID": "x", "Constraints": [
        {"LTarget": "${meta.features}", "RTarget": "a,b", "Operand": "set_contains"},
        {"LTarget": "${meta.features}", "RTarget": "a,b", "Operand": "set_contains_any"},
        {"LTarget": "${meta.features}", "RTarget": "a,b", "Operand": "set_contains_all"}]});
    let job = convert_job(serde_json::from_value(body).expect("lenient"), None).expect("converts").job;
    let operands: Vec<_> = job.constraints.iter().map(|constraint| constraint.operand).collect();
    use ConstraintOperand::*;
    assert_eq!(operands, [SetContains, SetContainsAny, SetContainsAll]);
}

/// A job with every field of issue 24's list (update, group and task
/// restart, disconnect) set away from its default.
fn job_with_every_listed_field() -> Value {
    json!({"ID": "web", "Datacenters": ["dc1"],
        "Update": {"MaxParallel": 2, "Canary": 1, "AutoRevert": true, "MinHealthyTime": 30_000_000_000u64,
            "HealthyDeadline": 300_000_000_000u64, "HealthCheck": "task_states"},
        "TaskGroups": [{"Name": "g", "Count": 2,
            "Update": {"AutoPromote": true, "ProgressDeadline": 900_000_000_000u64, "Stagger": 5_000_000_000u64},
            "RestartPolicy": {"Attempts": 5, "Interval": 600_000_000_000u64, "Delay": 1_000_000_000, "Mode": "delay"},
            "Disconnect": {"LostAfter": 60_000_000_000u64, "Replace": false, "Reconcile": "keep_replacement"},
            "Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/true"},
                "RestartPolicy": {"Attempts": 1}}]}]})
}

#[test]
fn every_listed_field_is_honoured_or_warned_of() {
    let body = job_with_every_listed_field();
    let Converted { job, warnings } = convert_job(serde_json::from_value(body).expect("lenient"), None).expect("ok");
    let group = &job.task_groups[0];
    assert_eq!(group.update.as_ref().map(|update| update.max_parallel), Some(2), "the job's, field by field");
    assert_eq!(group.reconcile, ReconcileStrategy::KeepReplacement);
    assert!(!group.replace_on_disconnect);
    assert_eq!(group.max_client_disconnect, Some(Duration::from_secs(60)));
    let group_restart = RestartPolicy {
        attempts: 5,
        interval: Duration::from_secs(600),
        delay: Duration::from_secs(1),
        mode: RestartMode::Delay,
    };
    assert_eq!(group.restart_policy, group_restart);
    let task_restart = RestartPolicy { attempts: 1, ..group_restart.clone() };
    assert_eq!(group.tasks[0].restart_policy, Some(task_restart), "the task's fields over the group's");
    assert_eq!(job.validate(), Ok(()));
    assert!(warnings.is_empty(), "every update field is honoured: {warnings:?}");
    let update = group.update.clone().expect("an update block");
    let expected = UpdateStrategy {
        max_parallel: 2,
        canary: 1,
        auto_revert: true,
        auto_promote: true,
        progress_deadline: Duration::from_secs(900),
        stagger: Duration::from_secs(5),
    };
    assert_eq!(update, expected, "the group's fields over the job's");
    assert_eq!(group.health.min_healthy_time, Duration::from_secs(30));
    assert_eq!(group.health.mode, engine::structs::HealthCheckMode::TaskStates);
}

#[test]
fn a_service_job_without_an_update_block_gets_nomads_default_and_max_parallel_0_none() {
    let plain = json!({"ID": "web", "Type": "service", "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "mock"}]}]});
    let job = convert_job(serde_json::from_value(plain).expect("lenient"), None).expect("converts").job;
    assert_eq!(job.task_groups[0].update, Some(UpdateStrategy::default()));
    let off = json!({"ID": "web", "Update": {"MaxParallel": 0},
        "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "mock"}]}]});
    let job = convert_job(serde_json::from_value(off).expect("lenient"), None).expect("converts").job;
    assert_eq!(job.task_groups[0].update, None, "no deployments: everything at once");
    let batch =
        json!({"ID": "b", "Type": "batch", "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "mock"}]}]});
    let job = convert_job(serde_json::from_value(batch).expect("lenient"), None).expect("converts").job;
    assert_eq!(job.task_groups[0].update, None, "a batch job has none");
}

#[test]
fn an_update_block_that_makes_no_sense_is_refused() {
    let body = json!({"ID": "web", "TaskGroups": [{"Name": "g", "Count": 2,
        "Update": {"HealthyDeadline": 900_000_000_000u64, "ProgressDeadline": 600_000_000_000u64, "AutoPromote": true},
        "Tasks": [{"Name": "t", "Driver": "mock"}]}]});
    let job = convert_job(serde_json::from_value(body).expect("lenient"), None).expect("converts").job;
    let problems = job.validate().expect_err("refused").problems;
    assert!(
        problems
            .iter()
            .any(|problem| problem.contains("healthy_deadline (15m) must be less than progress_deadline (10m)")),
        "{problems:?}"
    );
    assert!(problems.iter().any(|problem| problem.contains("auto_promote needs canary > 0")), "{problems:?}");
    let wide = json!({"ID": "web", "TaskGroups": [{"Name": "g", "Count": 2, "Update": {"MaxParallel": 5},
        "Tasks": [{"Name": "t", "Driver": "mock"}]}]});
    let warnings = convert_job(serde_json::from_value(wide).expect("lenient"), None).expect("converts").warnings;
    assert!(
        warnings.iter().any(|warning| warning.contains("max parallel count is greater than task group count (5 > 2)")),
        "{warnings:?}"
    );
}

#[test]
fn update_fields_at_nomads_defaults_are_no_news() {
    let body = json!({"ID": "web", "Update": {"MaxParallel": 1, "Stagger": 30_000_000_000u64, "HealthCheck": "checks",
        "MinHealthyTime": 10_000_000_000u64, "HealthyDeadline": 300_000_000_000u64,
        "ProgressDeadline": 600_000_000_000u64, "AutoRevert": false, "AutoPromote": false, "Canary": 0},
        "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "mock"}]}]});
    let Converted { warnings, .. } = convert_job(serde_json::from_value(body).expect("lenient"), None).expect("ok");
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[test]
fn blocks_that_would_change_what_runs_are_refused() {
    let task = json!({"Name": "t", "Driver": "mock"});
    let cases = [
        (json!({"ID": "pool", "NodePool": "gpu"}), "Job.NodePool \"gpu\" is refused"),
        (
            json!({"ID": "init", "TaskGroups": [{"Name": "g", "Tasks": [task,
            {"Name": "migrate", "Driver": "mock", "Lifecycle": {"Hook": "prestart"}}]}]}),
            "Task \"migrate\": Lifecycle is refused",
        ),
    ];
    for (body, reason) in cases {
        let error = convert_job(serde_json::from_value(body).expect("lenient"), None).expect_err("refused");
        assert!(error.to_string().contains(reason), "{error}");
        assert!(error.to_string().contains("nothing was registered"), "{error}");
    }
}

#[test]
fn periodic_and_parameterized_blocks_read_with_nomads_defaults() {
    let task = json!({"Name": "t", "Driver": "mock", "DispatchPayload": {"File": "in.txt"}});
    let body = json!({"ID": "cron", "Type": "batch", "Datacenters": ["dc1"],
        "Periodic": {"Spec": "*/5 * * * *", "ProhibitOverlap": true},
        "TaskGroups": [{"Name": "g", "Tasks": [task]}]});
    let Converted { job, warnings } = convert_job(serde_json::from_value(body).expect("lenient"), None).expect("ok");
    assert!(warnings.is_empty(), "{warnings:?}");
    let periodic = job.periodic.as_ref().expect("periodic");
    assert_eq!((periodic.enabled, periodic.prohibit_overlap, periodic.time_zone.as_str()), (true, true, "UTC"));
    assert_eq!(job.task_groups[0].tasks[0].dispatch_payload.as_ref().map(|block| block.file.as_str()), Some("in.txt"));
    assert_eq!(job.validate(), Ok(()));
    let parameterized = json!({"ID": "work", "Type": "batch", "ParameterizedJob": {"MetaOptional": ["a"]}});
    let Converted { job, .. } = convert_job(serde_json::from_value(parameterized).expect("lenient"), None).expect("ok");
    let block = job.parameterized.expect("parameterized");
    assert_eq!((block.payload, block.meta_optional), (engine::structs::PayloadRule::Optional, vec!["a".to_string()]));
    let dispatched = json!({"ID": "work", "Type": "batch", "Dispatched": true});
    let refused = convert_job(serde_json::from_value(dispatched).expect("lenient"), None).expect_err("refused");
    assert_eq!(refused.to_string(), "job can't be submitted with 'Dispatched' set");
}

#[test]
fn a_docker_task_s_ignored_keys_are_warned_of_and_its_problems_refused() {
    let body = json!({"ID": "web", "Datacenters": ["dc1"], "TaskGroups": [{"Name": "g",
        "Networks": [{"DynamicPorts": [{"Label": "http", "To": 8080}]}],
        "Tasks": [{"Name": "web", "Driver": "docker", "Config": {"image": "nginx:1.25", "ports": ["http"],
            "devices": [{"host_path": "/dev/fuse"}], "colour": "blue",
            "mount": [{"target": "/data", "source": "data", "volume_options": {"no_copy": true}}],
            "port_map": [{"http": "${NOMAD_META_port}"}]}}]}]});
    let Converted { job, warnings } = convert_job(serde_json::from_value(body).expect("lenient"), None).expect("ok");
    assert_eq!(
        warnings,
        [
            "TaskGroup \"g\": Task \"web\": config.colour is not a docker setting and was ignored",
            "TaskGroup \"g\": Task \"web\": config.devices is not implemented by Drover and was ignored",
            "TaskGroup \"g\": Task \"web\": config.mount[0].volume_options is not implemented by Drover and was ignored",
        ]
    );
    assert_eq!(job.validate(), Ok(()), "a variable in port_map is the client's to fill in");
    let bad = json!({"ID": "web", "Datacenters": ["dc1"], "TaskGroups": [{"Name": "g",
        "Tasks": [{"Name": "web", "Driver": "docker", "Config": {"ports": ["http"], "privileged": "yes"}}]}]});
    let Converted { job, .. } = convert_job(serde_json::from_value(bad).expect("lenient"), None).expect("converts");
    let problems = job.validate().expect_err("three problems").problems;
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(problems[0].ends_with("config.privileged must be true or false, not \"yes\""), "{problems:?}");
    assert!(problems[1].ends_with("config.image is required for the docker driver"), "{problems:?}");
    assert!(problems[2].ends_with("config.ports: Port \"http\" not found, check network stanza"), "{problems:?}");
}

#[test]
fn memory_max_is_honoured_and_never_below_memory() {
    let task = |resources: Value| {
        json!({"ID": "web", "Datacenters": ["dc1"], "TaskGroups": [{"Name": "g",
            "Tasks": [{"Name": "t", "Driver": "mock", "Resources": resources}]}]})
    };
    let body = task(json!({"CPU": 100, "MemoryMB": 256, "MemoryMaxMB": 1024}));
    let Converted { job, warnings } = convert_job(serde_json::from_value(body).expect("lenient"), None).expect("ok");
    assert!(warnings.is_empty(), "{warnings:?}");
    let read = &job.task_groups[0].tasks[0];
    assert_eq!((read.resources.memory_mb, read.memory_max_mb), (256, 1024));
    let answered = serde_json::to_value(crate::api::jobs::Task::new(read, crate::api::jobs::RestartPolicy::default()))
        .expect("json");
    assert_eq!(
        (&answered["Resources"]["MemoryMB"], &answered["Resources"]["MemoryMaxMB"]),
        (&json!(256), &json!(1024))
    );
    let read_back = task(json!({"CPU": 100, "MemoryMB": 256, "MemoryMaxMB": 0}));
    let job = convert_job(serde_json::from_value(read_back).expect("lenient"), None).expect("ok").job;
    assert_eq!(job.task_groups[0].tasks[0].memory_max_mb, 0, "Go's zero value: no limit");
    let below = task(json!({"CPU": 100, "MemoryMB": 256, "MemoryMaxMB": 128}));
    let error = convert_job(serde_json::from_value(below).expect("lenient"), None).expect_err("refused");
    assert!(error.to_string().contains("MemoryMaxMB value (128) cannot be less than MemoryMB value (256)"), "{error}");
}

/// A group with a web service (http and tcp checks, a service-level
/// `CheckRestart`) and a task service left to its defaults.
fn job_with_services() -> Value {
    json!({"ID": "shop", "Name": "shop", "Datacenters": ["dc1"], "TaskGroups": [{"Name": "web",
        "Networks": [{"DynamicPorts": [{"Label": "http"}], "ReservedPorts": [{"Label": "admin", "Value": 9090}]}],
        "Services": [{"Name": "shop-web", "PortLabel": "http", "Tags": ["v1", "${NOMAD_META_tier}"],
            "CanaryTags": ["canary"], "Meta": {"team": "shop"}, "AddressMode": "host", "Provider": "nomad",
            "TaskName": "server", "OnUpdate": "ignore_warnings", "EnableTagOverride": false, "Connect": null,
            "CheckRestart": {"Limit": 3, "Grace": 30_000_000_000u64, "IgnoreWarnings": true},
            "Checks": [
                {"Name": "alive", "Type": "http", "Path": "/health", "Method": "HEAD", "Protocol": "https",
                 "Header": {"X-Foo": ["bar", "baz"]}, "Interval": 10_000_000_000u64, "Timeout": 2_000_000_000u64,
                 "InitialStatus": "warning", "SuccessBeforePassing": 2, "FailuresBeforeCritical": -1,
                 "TLSSkipVerify": true, "CheckRestart": {"Limit": 5}},
                {"Type": "tcp", "PortLabel": "admin", "Interval": 5_000_000_000u64, "Timeout": 1_000_000_000u64},
                {"Name": "script", "Type": "script", "Command": "/bin/check", "Args": ["-q"],
                 "Interval": 30_000_000_000u64, "Timeout": 5_000_000_000u64}]}],
        "Tasks": [{"Name": "server", "Driver": "raw_exec", "Config": {"command": "/bin/web"},
            "Services": [{"PortLabel": "admin"}]}]}]})
}

#[test]
fn services_and_checks_are_read_with_nomads_defaults() {
    let Converted { job, warnings } =
        convert_job(serde_json::from_value(job_with_services()).expect("lenient"), None).expect("converts");
    assert_eq!(job.validate(), Ok(()));
    let service = &job.task_groups[0].services[0];
    assert_eq!((service.name.as_str(), service.port_label.as_str()), ("shop-web", "http"));
    assert_eq!(service.tags, ["v1", "${NOMAD_META_tier}"], "left for the agent");
    assert_eq!(service.canary_tags, ["canary"]);
    assert_eq!(service.meta["team"], "shop");
    assert_eq!(service.address_mode, AddressMode::Host);
    assert_eq!(service.provider, ServiceProvider::Nomad);
    assert_eq!((service.task_name.as_deref(), service.on_update), (Some("server"), OnUpdate::IgnoreWarnings));
    let [http, tcp, script] = &service.checks[..] else { panic!("three checks: {:?}", service.checks) };
    assert_eq!((http.kind, http.path.as_str(), http.method.as_str()), (CheckKind::Http, "/health", "HEAD"));
    assert_eq!((http.protocol.as_str(), http.tls_skip_verify), ("https", true));
    assert_eq!(http.header["X-Foo"], ["bar", "baz"]);
    assert_eq!((http.interval, http.timeout), (Duration::from_secs(10), Duration::from_secs(2)));
    assert_eq!(http.initial_status, Some(CheckStatus::Warning));
    assert_eq!((http.success_before_passing, http.failures_before_critical), (2, 0), "negative clamps to 0");
    let own = CheckRestart { limit: 5, grace: Duration::from_secs(30), ignore_warnings: true };
    assert_eq!(http.check_restart, Some(own), "the check's limit over the service's grace and warnings");
    assert_eq!(tcp.name, "service: \"shop-web\" check", "Nomad's default check name");
    assert_eq!((tcp.method.as_str(), tcp.port_label.as_deref()), ("GET", Some("admin")));
    let inherited = CheckRestart { limit: 3, grace: Duration::from_secs(30), ignore_warnings: true };
    assert_eq!(tcp.check_restart, Some(inherited), "the service's check_restart");
    assert_eq!((script.command.as_str(), &script.args[..]), ("/bin/check", &["-q".to_string()][..]));
    let task_service = &job.task_groups[0].tasks[0].services[0];
    assert_eq!(task_service.name, "shop-web-server", "<job>-<group>-<task>");
    assert_eq!(task_service.provider, ServiceProvider::Nomad, "Drover's default");
    assert!(warnings.is_empty(), "checks are run: nothing is warned of: {warnings:?}");
}

#[test]
fn a_job_read_back_converts_to_the_same_job() {
    let mut submitted = job_with_services();
    submitted["TaskGroups"][0]["ShutdownDelay"] = json!(2_000_000_000u64);
    submitted["TaskGroups"][0]["Tasks"][0]["ShutdownDelay"] = json!(3_000_000_000u64);
    submitted["TaskGroups"][0]["Update"] =
        json!({"HealthCheck": "task_states", "MinHealthyTime": 1_000_000_000u64, "HealthyDeadline": 60_000_000_000u64});
    let Converted { job, .. } =
        convert_job(serde_json::from_value(submitted.clone()).expect("lenient"), None).expect("converts");
    assert_eq!(job.task_groups[0].health.mode, HealthCheckMode::TaskStates);
    let answered = crate::api::jobs::TaskGroup::new(&job.task_groups[0], None);
    let services = serde_json::to_value(&answered.services).expect("serializes");
    assert_eq!(services[0]["Checks"][0]["Interval"], 10_000_000_000u64);
    assert_eq!(
        services[0]["Checks"][1]["CheckRestart"],
        json!({"Limit": 3, "Grace": 30_000_000_000u64, "IgnoreWarnings": true})
    );
    let mut body = submitted;
    let group = serde_json::to_value(&answered).expect("serializes");
    for field in ["ShutdownDelay", "Update"] {
        body["TaskGroups"][0][field] = group[field].clone();
    }
    body["TaskGroups"][0]["Tasks"][0]["ShutdownDelay"] = json!(answered.tasks[0].shutdown_delay);
    body["TaskGroups"][0]["Services"] = services;
    body["TaskGroups"][0]["Tasks"][0]["Services"] =
        serde_json::to_value(&answered.tasks[0].services).expect("serializes");
    let again = convert_job(serde_json::from_value(body).expect("lenient"), None).expect("converts");
    assert_eq!(again.job, job, "what GET /v1/job/:id answers registers the same job");
}

#[test]
fn service_fields_drover_lacks_are_warned_of_or_refused() {
    let mut body = job_with_services();
    let service = &mut body["TaskGroups"][0]["Services"][0];
    service["EnableTagOverride"] = json!(true);
    service["Identity"] = json!({"Name": "consul"});
    service["Provider"] = json!("consul");
    service["Checks"][0]["Expose"] = json!(true);
    service["Checks"][0]["GRPCService"] = json!("x");
    service["Checks"][0]["Brand-new"] = json!(1);
    let Converted { warnings, .. } =
        convert_job(serde_json::from_value(body.clone()).expect("lenient"), None).expect("converts");
    let text = warnings.join("\n");
    let place = "TaskGroup \"web\": Service \"shop-web\": ";
    for expected in [
        format!("{place}EnableTagOverride is not implemented by Drover and was ignored"),
        format!("{place}Identity is not implemented by Drover and was ignored"),
        format!("{place}Provider \"consul\" is not supported by Drover"),
        format!("{place}Check \"alive\": Expose is not implemented by Drover and was ignored"),
        format!("{place}Check \"alive\": GRPCService is not implemented by Drover and was ignored"),
        format!("{place}Check \"alive\": Brand-new is not known to Drover and was ignored"),
    ] {
        assert!(text.contains(&expected), "{expected}\n{text}");
    }
    let refuse = |body: Value| convert_job(serde_json::from_value(body).expect("lenient"), None).expect_err("refused");
    let mut grpc = job_with_services();
    grpc["TaskGroups"][0]["Services"][0]["Checks"][1]["Type"] = json!("grpc");
    let error = refuse(grpc).to_string();
    assert!(error.contains("Check \"service: \\\"shop-web\\\" check\": Type \"grpc\" is refused"), "{error}");
    let mut connect = job_with_services();
    connect["TaskGroups"][0]["Tasks"][0]["Services"][0]["Connect"] = json!({"SidecarService": {}});
    assert!(refuse(connect).to_string().contains("Service \"shop-web-server\": Connect is refused"));
    let mut mode = job_with_services();
    mode["TaskGroups"][0]["Services"][0]["AddressMode"] = json!("bridge");
    assert!(refuse(mode).to_string().contains("AddressMode \"bridge\" is not one of auto, host, alloc or driver"));
}
