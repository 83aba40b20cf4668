//! The one control plane of a test run.
//!
//! `./tests/run` starts it once and exports `NODEWARD_TEST_CONTROLPLANE` (its state directory);
//! every test process attaches to it. Run without it (`cargo test -p nodeward-e2e`), the first
//! test of the process starts one with `tests/controlplane/start.sh`, which stops itself when
//! this process exits.

use std::{
    fs,
    path::{Path, PathBuf},
    sync::OnceLock,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};

/// Environment variable naming the state directory of an already running control plane.
pub const STATE_ENV: &str = "NODEWARD_TEST_CONTROLPLANE";

/// A running control plane: where its admin kubeconfig is.
#[derive(Debug)]
pub struct ControlPlane {
    pub state_dir: PathBuf,
    pub kubeconfig: PathBuf,
}

/// The control plane shared by every test of this process.
pub fn shared() -> &'static ControlPlane {
    static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
    crate::once_per_process(&SHARED, "the test control plane", attach_or_start)
}

fn attach_or_start() -> anyhow::Result<ControlPlane> {
    if let Ok(dir) = std::env::var(STATE_ENV) {
        let state_dir = PathBuf::from(dir);
        wait_ready(&state_dir, Duration::from_secs(120), || Ok(()))?;
        return Ok(ControlPlane {
            kubeconfig: state_dir.join("admin.kubeconfig"),
            state_dir,
        });
    }
    let (state_dir, mut child) =
        crate::start_script("tests/controlplane/start.sh", "controlplane", &[])?;
    let log_path = state_dir.join("start.log");
    // A cold machine builds the components first; that can take several minutes.
    wait_ready(&state_dir, Duration::from_secs(20 * 60), || {
        match child.try_wait() {
            Ok(Some(status)) => bail!(
                "start.sh exited with {status}; its log:\n{}",
                fs::read_to_string(&log_path).unwrap_or_default()
            ),
            Ok(None) => Ok(()),
            Err(e) => bail!("waiting on start.sh: {e}"),
        }
    })?;
    Ok(ControlPlane {
        kubeconfig: state_dir.join("admin.kubeconfig"),
        state_dir,
    })
}

fn wait_ready(
    state_dir: &Path,
    timeout: Duration,
    mut still_starting: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !state_dir.join("ready").exists() {
        still_starting()?;
        if Instant::now() > deadline {
            bail!(
                "control plane in {} not ready after {timeout:?}",
                state_dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// `name` in the shared control plane's `env` file (written by start.sh once it is ready).
pub fn env_value(name: &str) -> anyhow::Result<String> {
    let env_file = shared().state_dir.join("env");
    let env =
        fs::read_to_string(&env_file).with_context(|| format!("reading {}", env_file.display()))?;
    env.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
        .map(String::from)
        .with_context(|| {
            format!(
                "{} names no {name} (a control plane started by an older start.sh: start it again)",
                env_file.display()
            )
        })
}

/// etcd's database of the shared control plane: (bytes in use, bytes of its file), from its
/// metrics `etcd_mvcc_db_total_size_in_use_in_bytes` and `etcd_mvcc_db_total_size_in_bytes`;
/// for benchmarks of what writes cost it.
pub fn etcd_database_bytes() -> anyhow::Result<(u64, u64)> {
    let etcd = env_value("NODEWARD_ETCD")?;
    let output = std::process::Command::new("curl")
        .args(["-fsS", "--max-time", "10", &format!("{etcd}/metrics")])
        .output()
        .context("running curl for etcd's metrics")?;
    if !output.status.success() {
        bail!(
            "etcd's metrics at {etcd}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let metrics = String::from_utf8_lossy(&output.stdout);
    let value = |name: &str| -> anyhow::Result<u64> {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<f64>().ok())
            // Byte counts well below 2^53: the float is exact.
            .map(|v| v as u64)
            .with_context(|| format!("etcd's metrics have no {name}"))
    };
    Ok((
        value("etcd_mvcc_db_total_size_in_use_in_bytes")?,
        value("etcd_mvcc_db_total_size_in_bytes")?,
    ))
}

/// Who a test client acts as.
#[derive(Clone, Debug)]
pub enum Identity {
    /// The cluster admin (`system:masters`).
    Admin,
    /// A bearer token, e.g. a service-account token from a TokenRequest.
    Token(String),
    /// The admin impersonating a user (and groups), as `kubectl --as` does.
    Impersonate { user: String, groups: Vec<String> },
    /// A client certificate ([`crate::certificates::issue`]).
    Certificate(crate::certificates::ClientCertificate),
}

/// A client with the admin credentials of the shared control plane. Clients are bound to the
/// tokio runtime that made them, and each test has its own runtime, so each test makes its own.
pub async fn admin_client() -> anyhow::Result<kube::Client> {
    client_as(Identity::Admin).await
}

/// The shared control plane's kubeconfig, acting as `identity`.
pub fn kubeconfig_as(identity: Identity) -> anyhow::Result<kube::config::Kubeconfig> {
    let cp = shared();
    let mut kubeconfig = kube::config::Kubeconfig::read_from(&cp.kubeconfig)
        .with_context(|| format!("reading {}", cp.kubeconfig.display()))?;
    let auth = kubeconfig
        .auth_infos
        .first_mut()
        .and_then(|named| named.auth_info.as_mut())
        .context("the admin kubeconfig has no user")?;
    match identity {
        Identity::Admin => {}
        Identity::Token(token) => {
            *auth = kube::config::AuthInfo {
                token: Some(token.into()),
                ..Default::default()
            };
        }
        Identity::Impersonate { user, groups } => {
            auth.impersonate = Some(user);
            auth.impersonate_groups = (!groups.is_empty()).then_some(groups);
        }
        Identity::Certificate(issued) => {
            let (certificate, key) = issued.kubeconfig_data();
            *auth = kube::config::AuthInfo {
                client_certificate_data: Some(certificate),
                client_key_data: Some(key.into()),
                ..Default::default()
            };
        }
    }
    Ok(kubeconfig)
}

/// Writes a kubeconfig acting as `identity` to `path`, for a daemon (`--kubeconfig`). The file
/// is replaced whole (written beside it, then renamed): a daemon another task started with the
/// same path reads the old file or the new one, never a truncated one.
pub fn write_kubeconfig(identity: Identity, path: &Path) -> anyhow::Result<()> {
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let kubeconfig = kubeconfig_as(identity)?;
    let mut beside = path.as_os_str().to_owned();
    beside.push(format!(
        ".{}-{}.tmp",
        std::process::id(),
        WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let beside = std::path::PathBuf::from(beside);
    fs::write(&beside, serde_yaml::to_string(&kubeconfig)?)
        .with_context(|| format!("writing {}", beside.display()))?;
    fs::rename(&beside, path).with_context(|| format!("moving a kubeconfig to {}", path.display()))
}

/// A client of the shared control plane acting as `identity`.
pub async fn client_as(identity: Identity) -> anyhow::Result<kube::Client> {
    let kubeconfig = kubeconfig_as(identity)?;
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .context("loading the test kubeconfig")?;
    // kube retries 429 by default (up to 15 times, minutes in all); a test must see the
    // API server's answer, e.g. an eviction refused by a PodDisruptionBudget.
    config.default_retry = false;
    kube::Client::try_from(config).context("building the test client")
}

/// Every audited write request so far (the API server audits writes, not reads), oldest
/// first, as the JSON audit events it logged.
pub fn audited_writes() -> anyhow::Result<Vec<serde_json::Value>> {
    let path = shared().state_dir.join("logs/audit.log");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    // A line being written while we read may be cut; only whole JSON lines count.
    Ok(text
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect())
}
