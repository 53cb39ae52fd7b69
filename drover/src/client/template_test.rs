//! Rendering as a pure function, the functions' argument orders, the
//! refusals, environment files and destinations.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use engine::node::service_reads::{ServiceAnswer, ServiceNameTags, ServiceQuery};
use engine::structs::{AllocId, JobType, NodeId, Resources, ServiceOwner, ServiceRegistration, Template};

use super::*;

fn instance(alloc_bits: u128, address: &str, port: u16, tags: &[&str]) -> ServiceRegistration {
    let job = Arc::new(engine::structs::Job::new_simple("api", JobType::Service, 1, Resources::new(1, 1, 0)));
    let mut alloc = engine::structs::Allocation::new_placement(
        &job,
        "group",
        0,
        NodeId::from_u128(7),
        engine::structs::EvalId::from_u128(1),
    );
    alloc.id = AllocId::from_u128(alloc_bits);
    let mut row = ServiceRegistration::of_alloc(&alloc, "dc1", ServiceOwner::Task("api"), "api", "http");
    row.address = address.to_string();
    row.port = port;
    row.tags = tags.iter().map(|tag| tag.to_string()).collect();
    row
}

fn scope(answers: Vec<(ServiceQuery, ServiceAnswer)>) -> RenderScope {
    let env = BTreeMap::from([("NOMAD_ALLOC_ID".to_string(), "a1".to_string()), ("GREETING".into(), "hi".into())]);
    RenderScope {
        env: Arc::new(env),
        namespace: "default".to_string(),
        services: Arc::new(ServiceData(answers.into_iter().collect())),
    }
}

fn api() -> ServiceQuery {
    ServiceQuery::Instances { namespace: "default".into(), name: "api".into() }
}

fn render_text(text: &str, scope: &RenderScope) -> Result<Rendered, TemplateError> {
    render(&Template::new(text, "local/out"), text, scope)
}

fn rendered(text: &str) -> String {
    render_text(text, &scope(Vec::new())).expect("renders").text
}

#[test]
fn a_service_s_instances_render_and_the_read_is_recorded() {
    let rows = vec![instance(1, "10.0.0.1", 8001, &["v1"]), instance(2, "10.0.0.2", 8002, &["v2"])];
    let scope = scope(vec![(api(), ServiceAnswer::Instances(rows))]);
    let text = "{{ range nomadService \"api\" }}{{ .Name }} {{ .Address }}:{{ .Port }} {{ .Tags }}\n{{ end }}";
    let out = render_text(text, &scope).expect("renders");
    assert_eq!(out.text, "api 10.0.0.1:8001 [v1]\napi 10.0.0.2:8002 [v2]\n");
    assert_eq!((out.reads, out.missing), (BTreeSet::from([api()]), false));
    let tagged = render_text("{{ range nomadService \"v2.api\" }}{{ .Port }}{{ end }}", &scope).expect("renders");
    assert_eq!(tagged.text, "8002", "tag.name keeps the instances carrying the tag");
    let fields = "{{ with index (nomadService \"api\") 0 }}{{ .ServiceName }} {{ .JobID }} {{ .Datacenter }} \
                  {{ .Namespace }} {{ .NodeID }}{{ end }}";
    assert_eq!(
        render_text(fields, &scope).expect("renders").text,
        format!("api api dc1 default {}", NodeId::from_u128(7))
    );
}

#[test]
fn a_read_without_an_answer_renders_empty_and_says_so() {
    let out = render_text("[{{ range nomadService \"api\" }}x{{ end }}]", &scope(Vec::new())).expect("renders");
    assert_eq!((out.text.as_str(), out.missing), ("[]", true));
    assert_eq!(out.reads, BTreeSet::from([api()]));
}

#[test]
fn the_namespace_s_services_list_names_and_tags() {
    let names = vec![
        ServiceNameTags { name: "api".into(), tags: vec!["v1".into(), "v2".into()] },
        ServiceNameTags { name: "web".into(), tags: vec![] },
    ];
    let query = ServiceQuery::Names { namespace: "default".into() };
    let scope = scope(vec![(query, ServiceAnswer::Names(names))]);
    let text = "{{ range nomadServices }}{{ .Name }}={{ join \",\" .Tags }};{{ end }}";
    assert_eq!(render_text(text, &scope).expect("renders").text, "api=v1,v2;web=;");
}

#[test]
fn env_reads_the_task_s_variables_only() {
    assert_eq!(rendered("{{ env \"NOMAD_ALLOC_ID\" }}/{{ env \"HOME\" }}/{{ envOrDefault \"X\" \"d\" }}"), "a1//d");
    let error = render_text("{{ mustEnv \"HOME\" }}", &scope(Vec::new())).expect_err("not the agent's");
    assert!(error.to_string().contains("mustEnv: \"HOME\" is not set"), "{error}");
}

#[test]
fn string_helpers_take_consul_templates_argument_order() {
    let cases = [
        ("{{ \"Hello World\" | toLower }}", "hello world"),
        ("{{ \"hello\" | toUpper }}", "HELLO"),
        ("{{ \"hello wide world\" | toTitle }}", "Hello Wide World"),
        ("{{ \"  x  \" | trimSpace }}", "x"),
        ("{{ \"!!x!!\" | trim \"!\" }}", "x"),
        ("{{ \"v1.2\" | trimPrefix \"v\" }}", "1.2"),
        ("{{ \"a.conf\" | trimSuffix \".conf\" }}", "a"),
        ("{{ \"a,b,c\" | split \",\" | join \";\" }}", "a;b;c"),
        ("{{ \"\" | split \",\" | len }}", "0"),
        ("{{ \"a-b-c\" | replaceAll \"-\" \"_\" }}", "a_b_c"),
        ("{{ \"v10\" | regexReplaceAll \"v([0-9]+)\" \"$1\" }}", "10"),
        ("{{ \"abc\" | regexMatch \"^a\" }}", "true"),
        ("{{ \"foobar\" | contains \"oba\" }}", "true"),
        ("{{ \"a,b\" | split \",\" | contains \"b\" }}", "true"),
        ("{{ in (\"a,b\" | split \",\") \"c\" }}", "false"),
        ("{{ \"a,b\" | split \",\" | containsAny (\"b,z\" | split \",\") }}", "true"),
        ("{{ \"a,b\" | split \",\" | containsAll (\"b,z\" | split \",\") }}", "false"),
        ("{{ \"42\" | parseInt | add 1 }}", "43"),
        ("{{ 10 | subtract 3 }}", "7"),
        ("{{ 10 | divide 4 }}", "2"),
        ("{{ 10 | modulo 4 }}", "2"),
        ("{{ 2.5 | multiply 2 }}", "5"),
        ("{{ maximum 3 9 }}", "9"),
        ("{{ \"true\" | parseBool }}", "true"),
        ("{{ \"x\" | base64Encode }}", "eA=="),
        ("{{ \"eA==\" | base64Decode }}", "x"),
        ("{{ \"{\\\"a\\\":[1,\\\"<b>\\\"]}\" | parseJSON | toJSON }}", "{\"a\":[1,\"\\u003cb\\u003e\"]}"),
        ("{{ \"a\\nb\" | indent 2 }}", "  a\n  b"),
        ("{{ printf \"%s-%d\" \"x\" 3 }}", "x-3"),
    ];
    for (text, expected) in cases {
        assert_eq!(rendered(text), expected, "{text}");
    }
}

#[test]
fn functions_drover_lacks_fail_the_render_naming_them() {
    for (text, function, provider) in [
        ("{{ key \"config/x\" }}", "key", "Consul"),
        ("{{ if false }}{{ range service \"db\" }}{{ end }}{{ end }}", "service", "Consul"),
        ("{{ with secret \"kv/x\" }}{{ .Data }}{{ end }}", "secret", "Vault"),
        ("{{ nomadVar \"nomad/jobs/x\" }}", "nomadVar", "Nomad variables"),
        ("{{ define \"t\" }}{{ timestamp }}{{ end }}", "timestamp", "a consul-template helper not implemented"),
    ] {
        let error = render_text(text, &scope(Vec::new())).expect_err("refused");
        assert_eq!(
            error,
            TemplateError::Unsupported { function: function.to_string(), provider: UNSUPPORTED_OF(function) },
            "{text}"
        );
        assert_eq!(error.to_string(), format!("template uses {function}, which Drover does not support ({provider})"));
    }
    let undefined = render_text("{{ frobnicate 1 }}", &scope(Vec::new())).expect_err("refused");
    assert_eq!(undefined.to_string(), "template uses function \"frobnicate\", which is not defined");
    let broken = render_text("{{ range }}", &scope(Vec::new())).expect_err("refused");
    assert!(matches!(broken, TemplateError::Parse(_)), "{broken}");
    let choose = render_text("{{ nomadService 2 \"k\" \"api\" }}", &scope(Vec::new())).expect_err("refused");
    assert!(choose.to_string().contains("3-argument form"), "{choose}");
}

#[allow(non_snake_case)]
fn UNSUPPORTED_OF(function: &str) -> &'static str {
    UNSUPPORTED.iter().find(|(name, _)| *name == function).map(|(_, provider)| *provider).expect("listed")
}

#[test]
fn delimiters_and_missing_keys_follow_the_template() {
    let mut template = Template::new("", "local/out");
    template.left_delimiter = "[[".into();
    template.right_delimiter = "]]".into();
    let text = "{{ literal }} [[ env \"GREETING\" ]]";
    assert_eq!(render(&template, text, &scope(Vec::new())).expect("renders").text, "{{ literal }} hi");
    let lookup = "{{ with parseJSON \"{\\\"a\\\":1}\" }}{{ .b }}{{ end }}";
    assert_eq!(rendered(lookup), "<no value>");
    let mut strict = Template::new(lookup, "local/out");
    strict.error_on_missing_key = true;
    let error = render(&strict, lookup, &scope(Vec::new())).expect_err("missing key");
    assert!(error.to_string().contains("b"), "{error}");
}

#[test]
fn an_env_file_reads_as_nomad_reads_it() {
    let text = "# comment\n\nA=1\nexport B = two words \nC=\"quoted \\\"x\\\"\\nnext\"\nD='as # is'\nE=bare # note\n";
    let vars = parse_env_file(text).expect("parses");
    let expected = BTreeMap::from([
        ("A".to_string(), "1".to_string()),
        ("B".into(), "two words".into()),
        ("C".into(), "quoted \"x\"\nnext".into()),
        ("D".into(), "as # is".into()),
        ("E".into(), "bare".into()),
    ]);
    assert_eq!(vars, expected);
    assert_eq!(parse_env_file("A=1\nnot a pair\n"), Err((2, "\"not a pair\" is not KEY=VALUE".to_string())));
    assert!(parse_env_file("1A=x").is_err());
}

#[test]
fn a_destination_stays_in_the_task_directory() {
    let task_dir = Path::new("/data/alloc/a1/web");
    assert_eq!(resolve_destination(task_dir, "local/app.conf").expect("ok"), task_dir.join("local/app.conf"));
    assert_eq!(resolve_destination(task_dir, "local/../secrets/x").expect("ok"), task_dir.join("secrets/x"));
    assert_eq!(
        resolve_destination(task_dir, "/data/alloc/a1/web/secrets/x").expect("inside"),
        task_dir.join("secrets/x"),
        "an interpolated NOMAD_SECRETS_DIR is absolute and inside"
    );
    for outside in ["/etc/passwd", "../../x", "local/../../x", "${UNKNOWN}/x", "."] {
        let error = resolve_destination(task_dir, outside).expect_err("refused");
        assert!(matches!(error, TemplateError::Destination { .. }), "{outside}: {error}");
    }
    let error = resolve_destination(task_dir, "/etc/passwd").expect_err("refused").to_string();
    assert!(error.contains("would become a path outside the task's directory"), "{error}");
}

#[test]
fn a_write_is_atomic_with_its_mode_and_never_follows_a_link_out() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().expect("tempdir");
    let task_dir = root.path().join("web");
    std::fs::create_dir_all(task_dir.join("local")).expect("dirs");
    let path = task_dir.join("local/app.conf");
    write_rendered(&task_dir, &path, "one", 0o640).expect("written");
    write_rendered(&task_dir, &path, "two", 0o600).expect("replaced");
    assert_eq!(std::fs::read_to_string(&path).expect("read"), "two");
    assert_eq!(std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777, 0o600);
    let names: Vec<_> =
        std::fs::read_dir(task_dir.join("local")).expect("dir").map(|e| e.expect("e").file_name()).collect();
    assert_eq!(names, ["app.conf"], "no temporary is left");
    // The task makes local/out a link to a directory outside: refused.
    let outside = root.path().join("outside");
    std::fs::create_dir_all(&outside).expect("outside");
    std::os::unix::fs::symlink(&outside, task_dir.join("local/out")).expect("link");
    let error = write_rendered(&task_dir, &task_dir.join("local/out/x"), "x", 0o644).expect_err("refused");
    assert!(error.to_string().contains("leads out of the task's directory"), "{error}");
    assert!(!outside.join("x").exists());
    // A link at the destination itself is replaced, not written through.
    let target = outside.join("target");
    std::fs::write(&target, "keep").expect("target");
    std::os::unix::fs::symlink(&target, task_dir.join("local/linked")).expect("link");
    write_rendered(&task_dir, &task_dir.join("local/linked"), "new", 0o644).expect("written");
    assert_eq!(std::fs::read_to_string(&target).expect("read"), "keep");
}

#[tokio::test]
async fn a_change_restarts_once_for_several_templates_and_noop_only_writes() {
    let root = tempfile::tempdir().expect("tempdir");
    let task_dir = root.path().join("web");
    std::fs::create_dir_all(&task_dir).expect("dir");
    let text = "{{ range nomadService \"api\" }}{{ .Port }} {{ end }}";
    let mut first = Template::new(text, "local/a");
    first.splay = Duration::ZERO;
    let mut second = Template::new(text, "local/b");
    second.splay = Duration::ZERO;
    let mut quiet = Template::new(text, "local/c");
    quiet.change_mode = ChangeMode::Noop;
    let watch = ServiceWatch::new();
    let site = TemplateSite { task_dir: task_dir.clone(), host_sources: true };
    let mut templates = TaskTemplates::new(vec![first, second, quiet], site, BTreeMap::new(), "default", watch.clone());
    let publish = |rows: Vec<ServiceRegistration>| watch.publish_for_test(api(), ServiceAnswer::Instances(rows));
    publish(vec![instance(1, "10.0.0.1", 8001, &[])]);
    templates.render_for_start().await.expect("rendered");
    assert_eq!(std::fs::read_to_string(task_dir.join("local/a")).expect("a"), "8001 ");
    publish(vec![instance(1, "10.0.0.1", 8001, &[]), instance(2, "10.0.0.2", 8002, &[])]);
    assert_eq!(templates.changed().await, Ok(TemplateAction::Restart));
    for file in ["a", "b", "c"] {
        assert_eq!(std::fs::read_to_string(task_dir.join("local").join(file)).expect("file"), "8001 8002 ", "{file}");
    }
    let again = futures_lite::future::poll_once(templates.changed()).await;
    assert!(again.is_none(), "one restart for the one change: {again:?}");
}

#[tokio::test]
async fn a_source_linked_out_of_the_task_directory_is_refused_unless_raw_exec() {
    let root = tempfile::tempdir().expect("tempdir");
    let task_dir = root.path().join("web");
    std::fs::create_dir_all(task_dir.join("local")).expect("dir");
    let outside = root.path().join("host-secret");
    std::fs::write(&outside, "secret").expect("outside");
    // What a container can make in its /local: a link the agent would follow on the host.
    std::os::unix::fs::symlink(&outside, task_dir.join("local/link")).expect("link");
    let mut template = Template::new("", "local/out");
    template.source = Some("local/link".into());
    let site = TemplateSite { task_dir: task_dir.clone(), host_sources: false };
    let mut contained =
        TaskTemplates::new(vec![template.clone()], site, BTreeMap::new(), "default", ServiceWatch::new());
    let refused = contained.render_for_start().await.expect_err("refused");
    assert!(refused.to_string().contains("leads out of the task's directory"), "{refused}");
    assert!(!task_dir.join("local/out").exists(), "nothing written");
    let site = TemplateSite { task_dir: task_dir.clone(), host_sources: true };
    let mut raw_exec = TaskTemplates::new(vec![template], site, BTreeMap::new(), "default", ServiceWatch::new());
    raw_exec.render_for_start().await.expect("raw_exec reads with the agent's rights");
    assert_eq!(std::fs::read_to_string(task_dir.join("local/out")).expect("written"), "secret");
}
