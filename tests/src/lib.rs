//! Test support for nodeward's end-to-end tests: a real control plane shared by the whole test
//! run, a namespace and node names per test, and fixtures (kwok nodes, workloads, PDBs).

pub mod certificates;
pub mod chaos;
pub mod controlplane;
pub mod daemon;
pub mod env;
pub mod fixtures;
pub mod helm;
pub mod history;
pub mod http;
pub mod identities;
pub mod imds;
pub mod journald;
pub mod logind;
pub mod machine;
pub mod nodelab;
pub mod proxy;
pub mod scenario;
pub mod scratch;
pub mod siege;
pub mod systemd;
pub mod wait;
pub mod workload;

pub use controlplane::Identity;
pub use env::{NodeSpec, PodOptions, Role, TestEnv};
pub use scenario::{Scenario, Scene};

/// The repository this test library was built from.
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default()
}

/// The workspace version (Cargo.toml), which the images, the chart and a release carry.
pub fn workspace_version() -> anyhow::Result<String> {
    use anyhow::Context;
    let manifest = std::fs::read_to_string(repo_root().join("Cargo.toml"))?;
    let section = manifest
        .split("[workspace.package]")
        .nth(1)
        .context("Cargo.toml has no [workspace.package]")?;
    section
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .map(str::to_owned)
        .context("workspace.package.version")
}

/// What `start` made, once for the whole test process. If it failed, every test that asks fails,
/// naming `what` and why.
pub fn once_per_process<T>(
    cell: &'static std::sync::OnceLock<Result<T, String>>,
    what: &str,
    start: impl FnOnce() -> anyhow::Result<T>,
) -> &'static T {
    match cell.get_or_init(|| start().map_err(|e| format!("{e:#}"))) {
        Ok(made) => made,
        Err(e) => panic!("{what} is not available: {e}"),
    }
}

/// Starts `script` (a `start.sh` of this repository, tied to this process by `--parent-pid`) on
/// the state directory `target/e2e-<name>-<pid>` with `args`, its output in `start.log` there.
pub fn start_script(
    script: &str,
    name: &str,
    args: &[&std::ffi::OsStr],
) -> anyhow::Result<(std::path::PathBuf, std::process::Child)> {
    use anyhow::Context as _;
    let pid = std::process::id();
    let dir = repo_root().join("target").join(format!("e2e-{name}-{pid}"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let log_path = dir.join("start.log");
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let child = std::process::Command::new(repo_root().join(script))
        .arg(&dir)
        .args(args)
        .arg("--parent-pid")
        .arg(pid.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {script}"))?;
    Ok((dir, child))
}

/// Runs `task` on every item, `at_once` of them at a time, until all are done or one fails.
pub async fn concurrently<I, F, Fut>(items: I, at_once: usize, task: F) -> anyhow::Result<()>
where
    I: IntoIterator,
    F: FnMut(I::Item) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    use futures::{StreamExt, TryStreamExt};
    futures::stream::iter(items)
        .map(task)
        .buffer_unordered(at_once)
        .try_collect()
        .await
}

/// Whether `node` carries nothing of nodeward's: not cordoned, no `nodeward.io/` taint, no
/// cordon record.
pub fn node_restored(node: &k8s_openapi::api::core::v1::Node) -> bool {
    let spec = node.spec.clone().unwrap_or_default();
    spec.unschedulable != Some(true)
        && spec
            .taints
            .unwrap_or_default()
            .iter()
            .all(|t| !t.key.starts_with("nodeward.io/"))
        && !node
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(nodeward_api::labels::CORDONED_BY_ANNOTATION))
}
