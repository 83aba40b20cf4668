//! Reading unit state from systemd over the system bus (`org.freedesktop.systemd1`).

use zbus::{
    proxy,
    proxy::CacheProperties,
    zvariant::{OwnedObjectPath, Value},
};

#[proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1"
)]
pub(crate) trait Manager {
    fn load_unit(&self, name: &str) -> zbus::Result<OwnedObjectPath>;
    fn reload_or_restart_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    fn subscribe(&self) -> zbus::Result<()>;
    fn start_transient_unit(
        &self,
        name: &str,
        mode: &str,
        properties: &[(&str, Value<'_>)],
        aux: &[(&str, &[(&str, Value<'_>)])],
    ) -> zbus::Result<OwnedObjectPath>;
    fn get_unit(&self, name: &str) -> zbus::Result<OwnedObjectPath>;
    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;
    fn reset_failed_unit(&self, name: &str) -> zbus::Result<()>;
    /// Each unit named, loaded if it must be: one round trip for what a check reads.
    fn list_units_by_names(&self, names: &[&str]) -> zbus::Result<Vec<ListedUnit>>;
    /// `running`, `degraded`, ..., `stopping` once the machine is going down.
    #[zbus(property)]
    fn system_state(&self) -> zbus::Result<String>;
    #[zbus(signal)]
    fn job_removed(
        &self,
        id: u32,
        job: OwnedObjectPath,
        unit: String,
        result: String,
    ) -> zbus::Result<()>;
}

#[proxy(
    interface = "org.freedesktop.systemd1.Unit",
    default_service = "org.freedesktop.systemd1"
)]
pub(crate) trait Unit {
    #[zbus(property)]
    fn load_state(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn active_state(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn sub_state(&self) -> zbus::Result<String>;
}

#[proxy(
    interface = "org.freedesktop.systemd1.Service",
    default_service = "org.freedesktop.systemd1"
)]
pub(crate) trait Service {
    #[zbus(property, name = "NRestarts")]
    fn n_restarts(&self) -> zbus::Result<u32>;
    /// How the main process ended: 1 (CLD_EXITED) with its exit status, else a signal.
    #[zbus(property)]
    fn exec_main_code(&self) -> zbus::Result<i32>;
    #[zbus(property)]
    fn exec_main_status(&self) -> zbus::Result<i32>;
}

/// A unit as `ListUnitsByNames` lists it: name, description, load, active and sub state, the
/// unit it follows, its object, and its job (id, type, object).
type ListedUnit = (
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
);

/// A unit as systemd reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitState {
    /// `loaded`, `not-found`, `masked`, ...
    pub load_state: String,
    pub active_state: String,
    pub sub_state: String,
    /// How often systemd restarted the service (services only).
    pub restarts: Option<u32>,
}

#[cfg(test)]
impl UnitState {
    /// A loaded unit in `active_state`: `running` when active, else `failed`; never restarted.
    pub fn loaded(active_state: &str) -> Self {
        Self {
            load_state: "loaded".into(),
            active_state: active_state.into(),
            sub_state: if active_state == "active" {
                "running"
            } else {
                "failed"
            }
            .into(),
            restarts: Some(0),
        }
    }
}

/// systemd's manager on the process's shared connection (`host::bus`), its properties read
/// afresh each time. A command's own connection comes from [`connect`].
pub(crate) async fn manager() -> Result<(zbus::Connection, ManagerProxy<'static>), String> {
    on(crate::host::bus::shared().await?).await
}

/// systemd's manager on a connection of the caller's own: for a command, whose subscription to
/// systemd's job signals ends with its connection.
pub(crate) async fn connect() -> Result<(zbus::Connection, ManagerProxy<'static>), String> {
    on(crate::host::bus::connect().await?).await
}

async fn on(
    connection: zbus::Connection,
) -> Result<(zbus::Connection, ManagerProxy<'static>), String> {
    let manager = ManagerProxy::builder(&connection)
        .cache_properties(CacheProperties::No)
        .build()
        .await
        .map_err(|e| format!("systemd on the system bus: {e}"))?;
    Ok((connection, manager))
}

/// A proxy of `P` for the object at `path`, reading its properties afresh each time.
pub(crate) async fn uncached<'a, P>(
    connection: &zbus::Connection,
    path: OwnedObjectPath,
) -> zbus::Result<P>
where
    P: From<zbus::Proxy<'a>> + zbus::proxy::Defaults,
{
    zbus::proxy::Builder::<P>::new(connection)
        .path(path)?
        .cache_properties(CacheProperties::No)
        .build()
        .await
}

/// Reads `unit` from systemd on the system bus: its states in one call, and how often systemd
/// restarted it (services only) in another.
pub async fn unit_state(unit: &str) -> Result<UnitState, String> {
    let (connection, manager) = manager().await?;
    let listed = manager
        .list_units_by_names(&[unit])
        .await
        .map_err(|e| format!("asking systemd for {unit}: {e}"))?;
    let Some((_, _, load_state, active_state, sub_state, _, path, ..)) = listed.into_iter().next()
    else {
        return Err(format!("asking systemd for {unit}: it listed nothing"));
    };
    let restarts = match uncached::<ServiceProxy>(&connection, path).await {
        Ok(service) => service.n_restarts().await.ok(),
        Err(_) => None,
    };
    Ok(UnitState {
        load_state,
        active_state,
        sub_state,
        restarts,
    })
}

/// Whether the host is going down (systemd's `SystemState` is `stopping`): a reboot command
/// whose unit the shutdown stopped before it was seen to exit did its job.
pub async fn going_down() -> bool {
    let Ok((_connection, manager)) = manager().await else {
        return false;
    };
    manager
        .system_state()
        .await
        .is_ok_and(|state| state == "stopping")
}

/// Asks systemd to reload `unit`, or to restart it where it cannot reload (as `systemctl
/// reload-or-restart` does): logind reloads its configuration since systemd 254, and is
/// restarted on older ones.
pub async fn reload_or_restart_unit(unit: &str) -> Result<(), String> {
    let (_connection, manager) = manager().await?;
    manager
        .reload_or_restart_unit(unit, "replace")
        .await
        .map(|_| ())
        .map_err(|e| format!("asking systemd to reload {unit}: {e}"))
}
