//! The docker tests' image and clean-up, shared by the tests (through
//! `common`) and `examples/task_latency.rs` (through `#[path]`, so this
//! file stands alone). No registry can be reached, so the image is built
//! here: `FROM scratch` with a static busybox (Debian's `busybox-static`,
//! which `.ci/run` installs) and its applets linked in `/bin`: `sh`,
//! `httpd`, `sleep`, `head`, `tr` and the rest.

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

/// The test image's reference (a tag other than `latest`, which the
/// driver would try to pull).
pub const IMAGE: &str = "drover-test-busybox:1";

/// The label every test container carries (in the job's `labels`) with
/// the test's own value, so a test removes only what it made.
pub const TEST_LABEL: &str = "drover-test";

/// Builds [`IMAGE`] unless the engine has it.
pub fn test_image() -> &'static str {
    static BUILT: Mutex<bool> = Mutex::new(false);
    let mut built = BUILT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if *built {
        return IMAGE;
    }
    let present = Command::new("docker").args(["image", "inspect", IMAGE]).output().expect("docker runs");
    if !present.status.success() {
        let busybox = ["/bin/busybox", "/usr/bin/busybox"]
            .into_iter()
            .find(|path| Path::new(path).exists())
            .expect("a static busybox (Debian's busybox-static; .ci/run installs it)");
        let context = std::env::temp_dir().join(format!("drover-docker-image-{}", std::process::id()));
        std::fs::create_dir_all(&context).expect("the build context");
        std::fs::copy(busybox, context.join("busybox")).expect("copies busybox");
        std::fs::write(
            context.join("Dockerfile"),
            "FROM scratch\nCOPY busybox /bin/busybox\nRUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\nENV PATH=/bin\n",
        )
        .expect("writes the Dockerfile");
        let output =
            Command::new("docker").args(["build", "-q", "-t", IMAGE]).arg(&context).output().expect("docker build");
        assert!(output.status.success(), "building {IMAGE}: {}", String::from_utf8_lossy(&output.stderr));
        let _ = std::fs::remove_dir_all(&context);
    }
    *built = true;
    IMAGE
}

/// Runs `docker` with `args`; its stdout, trimmed.
pub fn docker(args: &[&str]) -> String {
    let output = Command::new("docker").args(args).output().expect("docker runs");
    assert!(output.status.success(), "docker {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// The ids of the containers (running or not) labelled `label=value`.
pub fn containers(label: &str, value: &str) -> Vec<String> {
    docker(&["ps", "-aq", "--filter", &format!("label={label}={value}")])
        .lines()
        .map(str::to_string)
        .filter(|id| !id.is_empty())
        .collect()
}

/// Removes every container a test made (its [`TEST_LABEL`] is `value`).
pub fn remove_test_containers(value: &str) {
    let ids = containers(TEST_LABEL, value);
    if !ids.is_empty() {
        let mut args = vec!["rm", "-f", "-v"];
        args.extend(ids.iter().map(String::as_str));
        let _ = Command::new("docker").args(&args).output();
    }
}
