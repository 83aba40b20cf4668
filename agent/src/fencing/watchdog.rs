//! A Linux watchdog device (`/dev/watchdog`, the kernel's watchdog API): opened (which starts
//! it), its timeout set, fed with keepalives; closed with the magic character only when the
//! agent stops on purpose (the driver then stops it, unless the kernel was built with
//! nowayout). Dropped any other way, the device goes on counting and resets the machine.
// The watchdog API is ioctls; nix declares them, their calls are unsafe.
#![allow(unsafe_code)]

use std::{
    fs::File,
    io::Write,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    time::Duration,
};

use nix::libc::c_int;

// <linux/watchdog.h>: WDIOC_KEEPALIVE, WDIOC_SETTIMEOUT.
nix::ioctl_read!(keepalive, b'W', 5, c_int);
nix::ioctl_readwrite!(set_timeout, b'W', 6, c_int);

#[derive(Debug)]
pub struct Watchdog {
    file: File,
    device: PathBuf,
    /// The timeout the driver took (drivers round to what their hardware counts).
    pub timeout: Duration,
}

impl Watchdog {
    /// Opens `device`, which starts it, and asks for `timeout`.
    pub fn arm(device: &Path, timeout: Duration) -> Result<Self, String> {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(device)
            .map_err(|e| {
                let hint = match e.raw_os_error() {
                    Some(nix::libc::EBUSY) => ": another process holds it (systemd does when RuntimeWatchdogSec is set; give the agent a device of its own, or unset it)",
                    Some(nix::libc::ENOENT) => ": no such device (load the driver of the machine's watchdog, or softdog)",
                    Some(nix::libc::EACCES) | Some(nix::libc::EPERM) => ": permission denied (the chart mounts it with agent.fencing.enabled)",
                    _ => "",
                };
                format!("opening the watchdog {}: {e}{hint}", device.display())
            })?;
        let mut seconds = c_int::try_from(timeout.as_secs()).unwrap_or(c_int::MAX);
        // SAFETY: WDIOC_SETTIMEOUT reads and writes one int through the pointer, which is valid
        // for the call.
        let set = unsafe { set_timeout(file.as_raw_fd(), &mut seconds) };
        let mut armed = Self {
            file,
            device: device.to_owned(),
            timeout,
        };
        match set {
            Ok(_) => armed.timeout = Duration::from_secs(u64::try_from(seconds).unwrap_or(0)),
            Err(e) => {
                // Opened, so started: stop it again before refusing.
                let _ = armed.disarm();
                return Err(format!(
                    "setting the timeout of the watchdog {} to {}s: {e}",
                    device.display(),
                    timeout.as_secs()
                ));
            }
        }
        Ok(armed)
    }

    pub fn feed(&self) -> Result<(), String> {
        let mut unused: c_int = 0;
        // SAFETY: WDIOC_KEEPALIVE takes an int pointer, valid for the call, that it ignores.
        unsafe { keepalive(self.file.as_raw_fd(), &mut unused) }
            .map(|_| ())
            .map_err(|e| format!("feeding the watchdog {}: {e}", self.device.display()))
    }

    /// Stops it: the magic close.
    pub fn disarm(mut self) -> Result<(), String> {
        self.file
            .write_all(b"V")
            .map_err(|e| format!("stopping the watchdog {}: {e}", self.device.display()))
    }
}
