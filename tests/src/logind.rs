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

/// One private logind; everything stops on drop.
pub struct Logind {
    pub bus: PrivateBus,
    pub systemd: Systemd,
    systemd_connection: Option<zbus::Connection>,
    child: Option<Child>,
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
        let address = self.bus.address.clone();
        wait::eventually("logind on the private bus", Duration::from_secs(20), || {
            let address = address.clone();
            async move {
                let connection = zbus::connection::Builder::address(address.as_str())?
                    .build()
                    .await?;
                let dbus = zbus::fdo::DBusProxy::new(&connection).await?;
                let name = zbus::names::BusName::try_from("org.freedesktop.login1")?;
                Ok(dbus.name_has_owner(name).await?.then_some(()))
            }
        })
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

    /// `StartUnit` calls the stand-in received so far (name, mode).
    pub fn started_units(&self) -> Vec<(String, String)> {
        self.systemd
            .started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for Logind {
    fn drop(&mut self) {
        self.kill_logind();
    }
}
