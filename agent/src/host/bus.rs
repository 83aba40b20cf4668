//! The system D-Bus, shared by the logind and systemd clients.

/// A fresh connection to the system bus (`DBUS_SYSTEM_BUS_ADDRESS` or the standard socket): each
/// caller connects anew, so a restarted bus is simply picked up next time.
pub(crate) async fn connect() -> Result<zbus::Connection, String> {
    zbus::Connection::system()
        .await
        .map_err(|e| format!("connecting to the system bus: {e}"))
}
