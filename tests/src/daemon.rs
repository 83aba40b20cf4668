//! nodeward's daemons as child processes: a free port for their `/healthz` `/readyz`
//! `/metrics` server, plain HTTP reads of those endpoints, SIGTERM and SIGKILL.

use std::{
    process::{Child, Command, Stdio},
    time::Duration,
};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::wait;

/// A loopback TCP port nothing listened on a moment ago (bound, then freed).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A free loopback address for a daemon's `--listen`.
pub fn free_address() -> anyhow::Result<String> {
    Ok(format!("127.0.0.1:{}", free_port()?))
}

/// GET `path` from the server at `address`: status code and body.
pub async fn get(address: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: nodeward\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await?;
    let code = reply
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = reply
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}

/// The sum of the samples in `/metrics` whose line starts with `series` (0 when none).
pub async fn metric(address: &str, series: &str) -> anyhow::Result<f64> {
    let (_, body) = get(address, "/metrics").await?;
    Ok(body
        .lines()
        .filter(|l| l.starts_with(series))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// A binary of another crate of the workspace, built next to the running test binary by
/// `cargo build --workspace --bins` (`./tests/run` builds just the three the tests run).
/// `CARGO_BIN_EXE_*` names only the test's own crate's binaries, and `cargo test` builds a
/// package's binaries only for its own integration tests.
pub fn sibling_binary(name: &str) -> anyhow::Result<String> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().and_then(|deps| deps.parent()).ok_or_else(|| {
        anyhow::anyhow!("the test binary {} has no parent directory", exe.display())
    })?;
    let path = dir.join(name);
    anyhow::ensure!(
        path.exists(),
        "{} is missing: build it with `cargo build --workspace --bins` (./tests/run does)",
        path.display()
    );
    Ok(path.display().to_string())
}

/// The workspace's `nodeward-agent`, built beside the test binary ([`sibling_binary`]).
pub fn agent_binary() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    built(&PATH, "nodeward-agent")
}

/// The workspace's `nodeward-coordinator` ([`sibling_binary`]).
pub fn coordinator_binary() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    built(&PATH, "nodeward-coordinator")
}

/// The workspace's `kubectl-nodeward` ([`sibling_binary`]).
pub fn cli_binary() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    built(&PATH, "kubectl-nodeward")
}

/// `name`'s path, found once; a test without it cannot run, and says how to build it.
fn built(path: &'static std::sync::OnceLock<String>, name: &str) -> &'static str {
    path.get_or_init(|| sibling_binary(name).unwrap_or_else(|e| panic!("{e}")))
}

/// `nodeward-agent run` for `node`, with the Leases and what the coordinator publishes in
/// `namespace`, the configuration in `config`, through `kubeconfig`.
pub fn agent_args(
    node: &str,
    namespace: &str,
    kubeconfig: &std::path::Path,
    config: &std::path::Path,
) -> Vec<String> {
    vec![
        "run".into(),
        "--namespace".into(),
        namespace.into(),
        "--node-name".into(),
        node.into(),
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
        "--config".into(),
        config.display().to_string(),
    ]
}

/// A system bus address where none listens: an agent given it can ask logind for nothing.
pub const NO_SYSTEM_BUS: &str = "unix:path=/nonexistent/nodeward-e2e-bus";

/// `nodeward-agent run` (the binary `binary`) for `node` in the test `env`, through the shared
/// control plane's admin kubeconfig, with the configuration file `config` and `bus` as its
/// system bus (a private one with logind, or one that does not exist); its log is named for
/// `label`.
pub fn agent(
    binary: &str,
    env: &crate::TestEnv,
    node: &str,
    config: &std::path::Path,
    bus: &str,
    label: &str,
) -> anyhow::Result<Daemon> {
    let kubeconfig = &crate::controlplane::shared().kubeconfig;
    Daemon::start_with_env(
        binary,
        &format!("{}-{label}", env.id),
        &agent_args(node, &env.namespace, kubeconfig, config),
        &[("DBUS_SYSTEM_BUS_ADDRESS", bus)],
    )
}

/// The workspace's coordinator as the chart runs it: with the chart's coordinator identity
/// ([`crate::identities::coordinator`]), electing its leader with the Lease that identity may
/// hold, in the test's namespace, deciding every second (`--resync 1s`), with `extra` arguments.
pub async fn coordinator(env: &crate::TestEnv, extra: &[&str]) -> anyhow::Result<Daemon> {
    let identity = crate::identities::coordinator(env).await?;
    let mut args = vec!["--lease-name", &identity.lease_name];
    args.extend(extra);
    coordinator_as(env, &identity.kubeconfig, &args)
}

/// As [`coordinator`], with the identity of `kubeconfig`.
pub fn coordinator_as(
    env: &crate::TestEnv,
    kubeconfig: &std::path::Path,
    extra: &[&str],
) -> anyhow::Result<Daemon> {
    let mut args: Vec<String> = vec![
        "run".into(),
        "--lease-namespace".into(),
        env.namespace.clone(),
        "--resync".into(),
        "1s".into(),
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    Daemon::start(
        &sibling_binary("nodeward-coordinator")?,
        &format!("{}-coordinator", env.id),
        &args,
    )
}

/// A running daemon, killed when dropped.
pub struct Daemon {
    pub child: Child,
    pub listen: String,
    /// Its output (logs), kept after the test for diagnosis.
    pub log: std::path::PathBuf,
}

impl Daemon {
    /// Starts `program` with `args` plus `--listen <free address>`; its output goes to a log
    /// file named after `label` in the temporary directory.
    pub fn start(program: &str, label: &str, args: &[String]) -> anyhow::Result<Self> {
        Self::start_with_env(program, label, args, &[])
    }

    /// As [`Daemon::start`], with extra environment variables.
    pub fn start_with_env(
        program: &str,
        label: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let listen = free_address()?;
        let mut args = args.to_vec();
        args.extend(["--listen".to_owned(), listen.clone()]);
        let mut daemon = Self::spawn(program, label, &args, env)?;
        daemon.listen = listen;
        Ok(daemon)
    }

    /// Starts `program` with exactly `args` (a program that takes no `--listen`); its output
    /// goes to a log file named after `label`.
    pub fn start_plain(program: &str, label: &str, args: &[String]) -> anyhow::Result<Self> {
        Self::spawn(program, label, args, &[])
    }

    fn spawn(
        program: &str,
        label: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join("nodeward-e2e-logs");
        std::fs::create_dir_all(&dir)?;
        // Two daemons of one label at once (replicas of a release) each get their own file.
        let log = {
            let mut in_use = LOGS_IN_USE.lock().unwrap_or_else(|p| p.into_inner());
            let log = (0..)
                .map(|n| match n {
                    0 => dir.join(format!("{label}.log")),
                    n => dir.join(format!("{label}-{n}.log")),
                })
                .find(|log| !in_use.contains(log))
                .unwrap_or_else(|| dir.join(format!("{label}.log")));
            in_use.insert(log.clone());
            log
        };
        let file = std::fs::File::create(&log)?;
        let child = Command::new(program)
            .args(args)
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::from(file))
            .spawn()?;
        Ok(Self {
            child,
            listen: String::new(),
            log,
        })
    }

    /// The daemon's output so far (for assertion messages).
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        get(&self.listen, path).await
    }

    pub async fn metric(&self, series: &str) -> anyhow::Result<f64> {
        metric(&self.listen, series).await
    }

    /// Whether the process has exited (it is a zombie until waited for, or gone).
    pub fn has_exited(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
            .map(|stat| {
                stat.rsplit_once(") ")
                    .is_some_and(|(_, rest)| rest.starts_with('Z'))
            })
            .unwrap_or(true)
    }

    /// Waits until `/readyz` answers 200; fails at once if the daemon exits.
    pub async fn wait_ready(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.get("/readyz").await.map(|r| r.0).unwrap_or(0) == 200 {
                return Ok(());
            }
            anyhow::ensure!(
                !self.has_exited(),
                "the daemon exited before it was ready; its output:\n{}",
                self.output()
            );
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the daemon was not ready within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) -> anyhow::Result<()> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id())?);
        nix::sys::signal::kill(pid, signal)?;
        Ok(())
    }

    /// Waits for the process to exit; its exit status.
    pub async fn wait_exit(
        &mut self,
        timeout: Duration,
    ) -> anyhow::Result<std::process::ExitStatus> {
        wait::eventually("the daemon to exit", timeout, || {
            let status = self.child.try_wait();
            async move { Ok(status?) }
        })
        .await
    }
}

/// The log files of the daemons running now.
static LOGS_IN_USE: std::sync::Mutex<std::collections::BTreeSet<std::path::PathBuf>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        LOGS_IN_USE
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.log);
    }
}

/// Whether a daemon's log says it stopped gracefully: every task that writes ended between
/// writes, none had to be aborted (`nodeward_runtime::stop`).
pub fn stopped_between_writes(log: &str) -> bool {
    log.lines()
        .any(|l| l.contains("stopped") && l.contains("aborted=0"))
}
