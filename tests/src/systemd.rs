//! A private D-Bus bus and a stand-in for `org.freedesktop.systemd1` on it, speaking the real
//! wire protocol: systemd as PID 1 cannot run here. It serves what nodeward (and logind)
//! ask of systemd: `Manager.LoadUnit`/`GetUnit` (unit object paths, escaped the way systemd
//! escapes them), `Manager.ListUnitsByNames`, the `Unit` properties `LoadState`, `ActiveState`, `SubState`, the `Service`
//! property `NRestarts`, and `Manager.StartUnit`, which it records instead of starting.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use zbus::{fdo, interface, object_server::ObjectServer, zvariant::OwnedObjectPath};

/// A `dbus-daemon` of our own, listening on a socket in a temporary directory; stopped on drop.
pub struct PrivateBus {
    child: Child,
    dir: PathBuf,
    /// The bus address, e.g. for `DBUS_SYSTEM_BUS_ADDRESS`.
    pub address: String,
}

/// The private bus's configuration: like a system bus, but any user may connect and own any
/// name (our stand-ins need names; the shutdown-guard tests need callers of other users).
const BUS_CONFIG: &str = r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:tmpdir=/tmp</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_type="method_return"/>
    <allow send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="signal"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
  </policy>
</busconfig>
"#;

impl PrivateBus {
    pub fn start(tag: &str) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("nodeward-bus-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        // Other users (a test's unprivileged caller) must reach the socket.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        std::fs::write(dir.join("bus.conf"), BUS_CONFIG)?;
        let address = format!("unix:path={}", dir.join("bus").display());
        let child = spawn_daemon(&dir, &address)?;
        Ok(Self {
            child,
            dir,
            address,
        })
    }

    /// How many connections the bus has accepted so far: the serial in the unique name it gives
    /// a new one (`:1.N`), that probe's own included.
    pub async fn connections_made(&self) -> anyhow::Result<u64> {
        let probe = zbus::connection::Builder::address(self.address.as_str())?
            .build()
            .await
            .context("probing the private bus")?;
        let name = probe
            .unique_name()
            .context("the bus gave the probe no unique name")?;
        name.rsplit('.')
            .next()
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("a unique name without a serial: {name}"))
    }

    /// Kills the bus daemon (every connection drops) and starts a new one on the same address.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(self.dir.join("bus"));
        self.child = spawn_daemon(&self.dir, &self.address)?;
        Ok(())
    }
}

fn spawn_daemon(dir: &std::path::Path, address: &str) -> anyhow::Result<Child> {
    let socket = dir.join("bus");
    let child = Command::new("dbus-daemon")
        .args(["--nofork", "--nopidfile"])
        .arg(format!("--config-file={}", dir.join("bus.conf").display()))
        .arg(format!("--address={address}"))
        .stdout(Stdio::null())
        // It warns that it may not raise its fd limit; that is harmless here.
        .stderr(Stdio::null())
        .spawn()
        .context("starting dbus-daemon (Debian package dbus)")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    // The socket file appears when dbus-daemon binds it, a moment before it listens (a
    // connection then is refused): ready once a connection is accepted.
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        if Instant::now() > deadline {
            bail!("dbus-daemon did not listen on {} in time", socket.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::set_permissions(&socket, std::os::unix::fs::PermissionsExt::from_mode(0o777))?;
    Ok(child)
}

impl Drop for PrivateBus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The state of one unit the stand-in knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unit {
    pub active_state: String,
    pub sub_state: String,
    pub restarts: u32,
}

impl Unit {
    pub fn active() -> Self {
        Self {
            active_state: "active".into(),
            sub_state: "running".into(),
            restarts: 0,
        }
    }
}

/// What the stand-in serves and records; change it from the test at any time.
#[derive(Clone, Debug, Default)]
pub struct Systemd {
    pub units: Arc<Mutex<BTreeMap<String, Unit>>>,
    /// Every `StartUnit(name, mode)` received, in order, with when.
    pub started: Arc<Mutex<Vec<(String, String)>>>,
    pub started_at: Arc<Mutex<Vec<Instant>>>,
    /// Every `ReloadOrRestartUnit(name, mode)` received.
    pub reloaded: Arc<Mutex<Vec<String>>>,
    /// Process that `ReloadOrRestartUnit` sends SIGHUP to (logind reloads its configuration on
    /// it).
    pub reload_pid: Arc<Mutex<Option<u32>>>,
    /// When set, `StartUnit` fails (logind then cancels the shutdown it prepared).
    pub fail_start: Arc<std::sync::atomic::AtomicBool>,
    /// How many `ListUnitsByNames` calls it answered (a check's read of a unit).
    pub listed: Arc<std::sync::atomic::AtomicUsize>,
}

impl Systemd {
    pub fn set(&self, name: &str, unit: Unit) {
        self.units
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_owned(), unit);
    }

    pub fn update(&self, name: &str, change: impl FnOnce(&mut Unit)) {
        if let Some(unit) = self
            .units
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(name)
        {
            change(unit);
        }
    }

    /// Connects to `bus`, takes the name `org.freedesktop.systemd1` and serves until the
    /// returned connection is dropped.
    pub async fn serve(&self, bus: &str) -> anyhow::Result<zbus::Connection> {
        let connection = zbus::connection::Builder::address(bus)?
            .name("org.freedesktop.systemd1")?
            .serve_at("/org/freedesktop/systemd1", Manager(self.clone()))?
            .build()
            .await
            .context("serving the systemd stand-in")?;
        Ok(connection)
    }
}

impl Systemd {
    /// Serves on `bus` with the targets logind checks before `PowerOff`/`Reboot` already loaded
    /// (logind reads their `LoadState` by path, without `LoadUnit`).
    pub async fn serve_for_logind(&self, bus: &str) -> anyhow::Result<zbus::Connection> {
        let connection = self.serve(bus).await?;
        for target in [
            "poweroff.target",
            "reboot.target",
            "halt.target",
            "kexec.target",
        ] {
            self.set(target, Unit::active());
            let object = UnitObject {
                name: target.to_owned(),
                systemd: self.clone(),
            };
            connection
                .object_server()
                .at(unit_path(target).as_str(), object)
                .await?;
        }
        Ok(connection)
    }
}

/// systemd's object path for a unit: every byte but ASCII letters and digits becomes `_xx`.
pub fn unit_path(name: &str) -> String {
    let escaped: String = name
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("_{b:02x}")
            }
        })
        .collect();
    format!("/org/freedesktop/systemd1/unit/{escaped}")
}

struct Manager(Systemd);

impl Manager {
    async fn export(&self, server: &ObjectServer, name: &str) -> fdo::Result<OwnedObjectPath> {
        let path = unit_path(name);
        let object = UnitObject {
            name: name.to_owned(),
            systemd: self.0.clone(),
        };
        // Exporting twice is refused with `false`; either way the object is there.
        server
            .at(path.as_str(), object.clone())
            .await
            .map_err(|e| fdo::Error::Failed(e.to_string()))?;
        server
            .at(path.as_str(), ServiceObject(object))
            .await
            .map_err(|e| fdo::Error::Failed(e.to_string()))?;
        OwnedObjectPath::try_from(path).map_err(|e| fdo::Error::Failed(e.to_string()))
    }
}

#[interface(name = "org.freedesktop.systemd1.Manager")]
impl Manager {
    async fn load_unit(
        &self,
        name: &str,
        #[zbus(object_server)] server: &ObjectServer,
    ) -> fdo::Result<OwnedObjectPath> {
        self.export(server, name).await
    }

    async fn get_unit(
        &self,
        name: &str,
        #[zbus(object_server)] server: &ObjectServer,
    ) -> fdo::Result<OwnedObjectPath> {
        if !self
            .0
            .units
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(name)
        {
            return Err(fdo::Error::Failed(format!("Unit {name} not loaded.")));
        }
        self.export(server, name).await
    }

    /// Each unit's (name, description, load, active and sub state, following, object, job id,
    /// job type, job object), as systemd lists them: an unknown one `not-found`, `inactive`.
    #[allow(clippy::type_complexity)]
    async fn list_units_by_names(
        &self,
        names: Vec<String>,
        #[zbus(object_server)] server: &ObjectServer,
    ) -> fdo::Result<
        Vec<(
            String,
            String,
            String,
            String,
            String,
            String,
            OwnedObjectPath,
            u32,
            String,
            OwnedObjectPath,
        )>,
    > {
        self.0
            .listed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut listed = Vec::with_capacity(names.len());
        for name in names {
            let path = self.export(server, &name).await?;
            let unit = self
                .0
                .units
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&name)
                .cloned();
            let (load, active, sub) = match unit {
                Some(u) => ("loaded".to_owned(), u.active_state, u.sub_state),
                None => ("not-found".to_owned(), "inactive".into(), "dead".into()),
            };
            let no_job =
                OwnedObjectPath::try_from("/").map_err(|e| fdo::Error::Failed(e.to_string()))?;
            listed.push((
                name,
                String::new(),
                load,
                active,
                sub,
                String::new(),
                path,
                0,
                String::new(),
                no_job,
            ));
        }
        Ok(listed)
    }

    async fn subscribe(&self) {}

    async fn reload_or_restart_unit(
        &self,
        name: &str,
        _mode: &str,
    ) -> fdo::Result<OwnedObjectPath> {
        self.0
            .reloaded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(name.to_owned());
        let pid = *self.0.reload_pid.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGHUP,
            )
            .map_err(|e| fdo::Error::Failed(format!("reloading {name}: {e}")))?;
        }
        OwnedObjectPath::try_from("/org/freedesktop/systemd1/job/reload")
            .map_err(|e| fdo::Error::Failed(e.to_string()))
    }

    async fn start_unit(&self, name: &str, mode: &str) -> fdo::Result<OwnedObjectPath> {
        self.0
            .started_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Instant::now());
        let mut started = self.0.started.lock().unwrap_or_else(|p| p.into_inner());
        started.push((name.to_owned(), mode.to_owned()));
        if self.0.fail_start.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(fdo::Error::Failed(format!(
                "starting {name} refused by the test"
            )));
        }
        OwnedObjectPath::try_from(format!("/org/freedesktop/systemd1/job/{}", started.len()))
            .map_err(|e| fdo::Error::Failed(e.to_string()))
    }
}

#[derive(Clone)]
struct UnitObject {
    name: String,
    systemd: Systemd,
}

impl UnitObject {
    fn unit(&self) -> Option<Unit> {
        self.systemd
            .units
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&self.name)
            .cloned()
    }
}

#[interface(name = "org.freedesktop.systemd1.Unit")]
impl UnitObject {
    #[zbus(property)]
    fn load_state(&self) -> String {
        if self.unit().is_some() {
            "loaded"
        } else {
            "not-found"
        }
        .to_owned()
    }

    #[zbus(property)]
    fn active_state(&self) -> String {
        self.unit()
            .map_or_else(|| "inactive".to_owned(), |u| u.active_state)
    }

    #[zbus(property)]
    fn sub_state(&self) -> String {
        self.unit()
            .map_or_else(|| "dead".to_owned(), |u| u.sub_state)
    }
}

struct ServiceObject(UnitObject);

#[interface(name = "org.freedesktop.systemd1.Service")]
impl ServiceObject {
    #[zbus(property, name = "NRestarts")]
    fn n_restarts(&self) -> u32 {
        self.0.unit().map_or(0, |u| u.restarts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_unit_names_like_systemd() {
        assert_eq!(
            unit_path("kubelet.service"),
            "/org/freedesktop/systemd1/unit/kubelet_2eservice"
        );
        assert_eq!(
            unit_path("poweroff.target"),
            "/org/freedesktop/systemd1/unit/poweroff_2etarget"
        );
    }
}
