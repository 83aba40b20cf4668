//! AWS's emulator of the EC2 instance metadata service, amazon-ec2-metadata-mock (AEMM, built
//! once per machine by `tests/imds/build.sh`), on a loopback port of its own per test, with the
//! metadata values a test gives it: the cloud detectors are tested against the real service's
//! paths, tokens and answers, not a stand-in of ours.

use std::{
    process::{Child, Command, Stdio},
    sync::OnceLock,
    time::Duration,
};

use anyhow::{Context, bail};
use serde_json::{Value, json};

/// The emulator's binary, built on first use.
fn binary() -> anyhow::Result<&'static str> {
    static BUILT: OnceLock<Result<String, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let output = Command::new(crate::repo_root().join("tests/imds/build.sh"))
                .stderr(Stdio::inherit())
                .output()
                .map_err(|e| format!("running tests/imds/build.sh: {e}"))?;
            if !output.status.success() {
                return Err(format!("tests/imds/build.sh failed ({})", output.status));
            }
            Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
        })
        .as_ref()
        .map(String::as_str)
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// A running emulator; stopped when dropped.
pub struct Emulator {
    child: Child,
    /// Its base URL, `http://127.0.0.1:PORT`.
    pub url: String,
}

impl Emulator {
    /// Serves the metadata `values` (by AEMM's key, e.g. `security-groups`) over its defaults,
    /// with `args` (e.g. `--imdsv2` to require a session token, or a subcommand such as `spot`
    /// before them); returns once it answers.
    pub async fn start(values: Value, args: &[&str]) -> anyhow::Result<Self> {
        let port = crate::daemon::free_port()?;
        let dir = crate::scratch::dir(&format!("aemm-{port}"))?;
        let config = crate::scratch::write(
            &dir,
            "aemm-config.json",
            serde_json::to_vec(&json!({"metadata": {"values": values}}))?,
        )?;
        let child = Command::new(binary()?)
            .args(args)
            .args(["--hostname", "127.0.0.1", "--port", &port.to_string()])
            .arg("--config-file")
            .arg(&config)
            // Its saved configuration and caches go into the test's directory, not $HOME.
            .env("HOME", &dir)
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting ec2-metadata-mock")?;
        let mut emulator = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        emulator.wait_listening(port).await?;
        Ok(emulator)
    }

    async fn wait_listening(&mut self, port: u16) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("ec2-metadata-mock exited at start: {status}");
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "ec2-metadata-mock did not listen at {} within 30 s",
                    self.url
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Serves an emulator on a Unix socket, where the node lab's VMs reach it at 10.0.2.101:80
/// through their uplink (`tests/nodelab/start.sh`): each connection is relayed to the emulator
/// set last with [`Relay::to`], so a test can change what the service says (stop one emulator,
/// start another) while the VM's address stays. Stops listening when dropped.
pub struct Relay {
    target: std::sync::Arc<std::sync::Mutex<String>>,
    path: std::path::PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Listens on `path` (a stale socket there is replaced), relaying to `emulator`.
    pub fn listen(path: &std::path::Path, emulator: &Emulator) -> anyhow::Result<Self> {
        let _ = std::fs::remove_file(path);
        let listener = tokio::net::UnixListener::bind(path)
            .with_context(|| format!("listening on {}", path.display()))?;
        let target = std::sync::Arc::new(std::sync::Mutex::new(address_of(emulator)));
        Ok(Self {
            target: target.clone(),
            path: path.to_owned(),
            task: tokio::spawn(async move {
                while let Ok((mut guest, _)) = listener.accept().await {
                    let to = target.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    tokio::spawn(async move {
                        if let Ok(mut service) = tokio::net::TcpStream::connect(to).await {
                            let _ = tokio::io::copy_bidirectional(&mut guest, &mut service).await;
                        }
                    });
                }
            }),
        })
    }

    /// Relays the connections from now on to `emulator`.
    pub fn to(&self, emulator: &Emulator) {
        *self.target.lock().unwrap_or_else(|p| p.into_inner()) = address_of(emulator);
    }
}

/// The `host:port` of `emulator`.
fn address_of(emulator: &Emulator) -> String {
    emulator.url.trim_start_matches("http://").to_owned()
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}
