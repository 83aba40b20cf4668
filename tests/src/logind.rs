//! The real `systemd-logind` on a private system bus, in a private mount namespace (tmpfs on
//! `/run`, its `logind.conf.d` bind-mounted from a test directory), with the systemd stand-in
//! answering what logind asks of PID 1. `PowerOff`/`Reboot` then run logind's whole
//! delay-inhibitor path, and end in a recorded `StartUnit` instead of a shutdown.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::Context;

use crate::{
    systemd::{PrivateBus, Systemd},
    wait,
};

/// logind's binary on Debian.
pub const LOGIND: &str = "/lib/systemd/systemd-logind";
/// polkit's daemon on Debian (package polkitd).
pub const POLKITD: &str = "/usr/lib/polkit-1/polkitd";

/// One private logind; everything stops on drop.
pub struct Logind {
    pub bus: PrivateBus,
    pub systemd: Systemd,
    systemd_connection: Option<zbus::Connection>,
    child: Option<Child>,
    polkit: Option<Child>,
    /// Bind-mounted as logind's `/etc/systemd/logind.conf.d`.
    pub conf_dir: PathBuf,
    pub log: PathBuf,
}

impl Logind {
    /// Starts the bus, the stand-in and logind with `InhibitDelayMaxSec=delay_seconds`.
    pub async fn start(tag: &str, delay_seconds: u64) -> anyhow::Result<Self> {
        let bus = PrivateBus::start(tag)?;
        let dir =
            std::env::temp_dir().join(format!("nodeward-logind-{tag}-{}", std::process::id()));
        let conf_dir = dir.join("logind.conf.d");
        std::fs::create_dir_all(&conf_dir)?;
        // No VTs to manage in a test; the delay is the test's.
        std::fs::write(
            conf_dir.join("10-test.conf"),
            format!("[Login]\nNAutoVTs=0\nReserveVT=0\nInhibitDelayMaxSec={delay_seconds}\n"),
        )?;
        let systemd = Systemd::default();
        let connection = systemd.serve_for_logind(&bus.address).await?;
        let mut logind = Self {
            bus,
            systemd,
            systemd_connection: Some(connection),
            child: None,
            polkit: None,
            log: dir.join("logind.log"),
            conf_dir,
        };
        logind.start_logind().await?;
        Ok(logind)
    }

    /// Starts (or restarts) the logind process and waits until it owns its bus name.
    pub async fn start_logind(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let script = format!(
            "set -e; mount -t tmpfs tmpfs /run; mkdir -p /run/systemd; \
             mkdir -p /etc/systemd/logind.conf.d; \
             mount --bind '{}' /etc/systemd/logind.conf.d; exec {LOGIND}",
            self.conf_dir.display()
        );
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .env("DBUS_SYSTEM_BUS_ADDRESS", &self.bus.address)
            .env("SYSTEMD_LOG_LEVEL", "info")
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .context("starting systemd-logind in a private mount namespace")?;
        *self
            .systemd
            .reload_pid
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(child.id());
        self.child = Some(child);
        wait_for_name(&self.bus.address, "org.freedesktop.login1")
            .await
            .with_context(|| {
                format!(
                    "logind log: {}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                )
            })
    }

    /// Makes logind reload its configuration (SIGHUP, as `systemctl reload` does).
    pub fn reload(&self) -> anyhow::Result<()> {
        let child = self.child.as_ref().context("logind is not running")?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(child.id())?),
            nix::sys::signal::Signal::SIGHUP,
        )?;
        Ok(())
    }

    /// Runs the real polkitd on the private bus with `rules` (JavaScript, as in
    /// `/etc/polkit-1/rules.d`) as its only local rules, so that logind asks it about callers
    /// that are not root.
    pub async fn start_polkit(&mut self, rules: &str) -> anyhow::Result<()> {
        let dir = self.conf_dir.with_file_name("polkit-rules");
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("10-e2e.rules"), rules)?;
        // polkitd reads its rules as its own user.
        for path in [&dir, &dir.join("10-e2e.rules")] {
            let mode = if path.is_dir() { 0o755 } else { 0o644 };
            std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let script = format!(
            "set -e; mount --bind '{}' /etc/polkit-1/rules.d; exec {POLKITD} --no-debug",
            dir.display()
        );
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .env("DBUS_SYSTEM_BUS_ADDRESS", &self.bus.address)
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .context("starting polkitd in a private mount namespace")?;
        self.polkit = Some(child);
        wait_for_name(&self.bus.address, "org.freedesktop.PolicyKit1").await
    }

    /// Calls logind's `PowerOff(false)` as the unprivileged `uid` (through `busctl`); the
    /// error message when logind refuses.
    pub async fn power_off_as(&self, uid: u32) -> anyhow::Result<Result<(), String>> {
        // Async: the systemd stand-in that logind calls meanwhile runs on this runtime.
        let output = tokio::process::Command::new("setpriv")
            .args([
                &format!("--reuid={uid}"),
                &format!("--regid={uid}"),
                "--clear-groups",
                "busctl",
                "--system",
                "call",
                "org.freedesktop.login1",
                "/org/freedesktop/login1",
                "org.freedesktop.login1.Manager",
                "PowerOff",
                "b",
                "false",
            ])
            .env("DBUS_SYSTEM_BUS_ADDRESS", &self.bus.address)
            .output()
            .await
            .context("running busctl as another user")?;
        Ok(if output.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).trim().to_owned())
        })
    }

    /// Kills logind (SIGKILL): every lock it held is gone.
    pub fn kill_logind(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the bus daemon (and with it logind and the stand-in), then starts all three again
    /// on the same address.
    pub async fn restart_bus(&mut self) -> anyhow::Result<()> {
        self.kill_logind();
        self.systemd_connection = None;
        self.bus.restart()?;
        self.systemd_connection = Some(self.systemd.serve_for_logind(&self.bus.address).await?);
        self.start_logind().await
    }

    /// A client connection to the private bus (to call logind as root would).
    pub async fn connect(&self) -> anyhow::Result<zbus::Connection> {
        Ok(
            zbus::connection::Builder::address(self.bus.address.as_str())?
                .build()
                .await?,
        )
    }

    /// Whether systemd was asked to start `unit`.
    pub fn started(&self, unit: &str) -> bool {
        self.started_units()
            .iter()
            .any(|(started, _)| started == unit)
    }

    /// `StartUnit` calls the stand-in received so far (name, mode).
    pub fn started_units(&self) -> Vec<(String, String)> {
        self.systemd
            .started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Waits until `name` has an owner on the bus at `address`.
async fn wait_for_name(address: &str, name: &'static str) -> anyhow::Result<()> {
    wait::eventually(
        &format!("{name} on the private bus"),
        Duration::from_secs(20),
        || async move {
            let connection = zbus::connection::Builder::address(address)?.build().await?;
            let dbus = zbus::fdo::DBusProxy::new(&connection).await?;
            let name = zbus::names::BusName::try_from(name)?;
            Ok(dbus.name_has_owner(name).await?.then_some(()))
        },
    )
    .await
}

impl Drop for Logind {
    fn drop(&mut self) {
        self.kill_logind();
        if let Some(mut polkit) = self.polkit.take() {
            let _ = polkit.kill();
            let _ = polkit.wait();
        }
    }
}
