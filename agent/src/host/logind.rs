//! systemd-logind's `org.freedesktop.login1.Manager`: the parts the shutdown guard uses, and
//! the reboot or power-off of a drained node.

use zbus::{proxy, zvariant::OwnedFd};

#[proxy(
    interface = "org.freedesktop.login1.Manager",
    default_service = "org.freedesktop.login1",
    default_path = "/org/freedesktop/login1"
)]
pub trait Manager {
    /// Takes an inhibitor lock; it holds until the returned descriptor is closed.
    fn inhibit(&self, what: &str, who: &str, why: &str, mode: &str) -> zbus::Result<OwnedFd>;

    /// (what, who, why, mode, uid, pid) of every lock held.
    #[allow(clippy::type_complexity)]
    fn list_inhibitors(&self) -> zbus::Result<Vec<(String, String, String, String, u32, u32)>>;

    fn power_off(&self, interactive: bool) -> zbus::Result<()>;

    fn reboot(&self, interactive: bool) -> zbus::Result<()>;

    /// With flag 1 (`SD_LOGIND_ROOT_CHECK_INHIBITORS`) even root is refused by a block lock.
    fn power_off_with_flags(&self, flags: u64) -> zbus::Result<()>;

    #[zbus(signal)]
    fn prepare_for_shutdown(&self, start: bool) -> zbus::Result<()>;

    #[zbus(property, name = "InhibitDelayMaxUSec")]
    fn inhibit_delay_max_usec(&self) -> zbus::Result<u64>;

    #[zbus(property)]
    fn preparing_for_shutdown(&self) -> zbus::Result<bool>;
}

/// Asks logind to reboot (or else power off); one already under way (asked before this agent
/// restarted) counts as asked.
pub async fn act(reboot: bool) -> Result<(), String> {
    let connection = crate::host::bus::shared().await?;
    let manager = ManagerProxy::new(&connection)
        .await
        .map_err(|e| format!("logind on the system bus: {e}"))?;
    let asked = if reboot {
        manager.reboot(false).await
    } else {
        manager.power_off(false).await
    };
    match asked {
        Err(zbus::Error::MethodError(name, ..))
            if name.as_str() == "org.freedesktop.login1.OperationInProgress" =>
        {
            Ok(())
        }
        other => other.map_err(|e| format!("asking logind: {e}")),
    }
}
