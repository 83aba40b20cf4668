//! The system D-Bus, shared by the logind and systemd clients.
//!
//! One connection serves every read and request of the process: each new connection costs the
//! bus daemon an authentication, a `Hello` and a `NameOwnerChanged` to every peer that watches
//! names (systemd and logind among them), which on a busy or emulated node made a check of a
//! unit's state slower than its timeout. A connection the bus closed (the daemon restarted, an
//! I/O error) is made again by the next caller.

use tokio::sync::Mutex;

/// The process's connection, once made; `None` until then.
static SHARED: Mutex<Option<zbus::Connection>> = Mutex::const_new(None);

/// The process's connection to the system bus (`DBUS_SYSTEM_BUS_ADDRESS` or the standard
/// socket), made now if there is none or the bus closed the last one.
pub(crate) async fn shared() -> Result<zbus::Connection, String> {
    let mut shared = SHARED.lock().await;
    if let Some(connection) = shared.as_ref().filter(|c| !c.is_closed()) {
        return Ok(connection.clone());
    }
    let connection = connect().await?;
    *shared = Some(connection.clone());
    Ok(connection)
}

/// A connection of the caller's own, for what must end with it: a lock held as a descriptor
/// with signals watched (the shutdown guard), or a subscription to systemd's job signals
/// (systemd sends them to a subscriber for as long as its connection lives).
pub(crate) async fn connect() -> Result<zbus::Connection, String> {
    zbus::Connection::system()
        .await
        .map_err(|e| format!("connecting to the system bus: {e}"))
}
