//! The real `systemd-journald` (not as a service of PID 1), in a private mount namespace: tmpfs
//! on `/run` and over `/var/log/journal` (so it keeps the journal volatile), and the test's
//! directory bind-mounted as `/run/log/journal`. It reads this machine's `/dev/kmsg`, so what a
//! test writes there lands in journal files the test can hand to an agent.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::Context;

use crate::wait;

/// journald's binary on Debian.
pub const JOURNALD: &str = "/lib/systemd/systemd-journald";

/// One private journald; it stops on drop.
pub struct Journald {
    child: Child,
    /// Where its journal files are (in a machine-id subdirectory).
    pub dir: PathBuf,
    /// Its sockets (`/run/systemd/journal` in its namespace): `socket` takes the native protocol.
    pub sockets: PathBuf,
    pub log: PathBuf,
}

impl Journald {
    /// Starts journald writing into a new directory named for `tag`, and waits for its first
    /// journal file.
    pub async fn start(tag: &str) -> anyhow::Result<Self> {
        Self::start_with(tag, "").await
    }

    /// As [`Journald::start`], with `conf` (journald.conf lines under `[Journal]`, e.g.
    /// `RateLimitIntervalSec=0`) as a drop-in of its own.
    pub async fn start_with(tag: &str, conf: &str) -> anyhow::Result<Self> {
        let root =
            std::env::temp_dir().join(format!("nodeward-journald-{tag}-{}", std::process::id()));
        let dir = root.join("journal");
        let sockets = root.join("sockets");
        std::fs::create_dir_all(&dir)?;
        std::fs::create_dir_all(&sockets)?;
        let log = root.join("journald.log");
        let output = std::fs::File::create(&log)?;
        let drop_in = root.join("journald.conf");
        std::fs::write(&drop_in, format!("[Journal]\n{conf}\n"))?;
        // journald reads drop-ins from /run/systemd/journald.conf.d, in its private /run.
        let script = format!(
            "set -e; mount -t tmpfs tmpfs /run; mkdir -p /run/systemd/journal /run/log/journal; \
             mkdir -p /run/systemd/journald.conf.d; cp '{}' /run/systemd/journald.conf.d/nodeward.conf; \
             mount --bind '{}' /run/log/journal; mount --bind '{}' /run/systemd/journal; \
             if [ -d /var/log/journal ]; then mount -t tmpfs tmpfs /var/log/journal; fi; \
             exec {JOURNALD}",
            drop_in.display(),
            dir.display(),
            sockets.display()
        );
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .stdout(Stdio::from(output.try_clone()?))
            .stderr(Stdio::from(output))
            .spawn()
            .context("starting systemd-journald in a private mount namespace")?;
        let journald = Self {
            child,
            dir,
            sockets,
            log,
        };
        wait::eventually(
            "journald's first journal file",
            Duration::from_secs(30),
            || async { Ok(has_journal_file(&journald.dir).then_some(())) },
        )
        .await
        .with_context(|| {
            format!(
                "journald log: {}",
                std::fs::read_to_string(&journald.log).unwrap_or_default()
            )
        })?;
        Ok(journald)
    }
}

impl Journald {
    /// Logs `message` as the program `identifier` (journald's native protocol, as
    /// `sd_journal_send` does).
    pub fn send(&self, identifier: &str, message: &str) -> anyhow::Result<()> {
        let socket = std::os::unix::net::UnixDatagram::unbound()?;
        let datagram = format!("SYSLOG_IDENTIFIER={identifier}\nPRIORITY=6\nMESSAGE={message}\n");
        socket
            .send_to(datagram.as_bytes(), self.sockets.join("socket"))
            .context("sending to journald's native socket")?;
        Ok(())
    }
}

fn has_journal_file(dir: &Path) -> bool {
    walk(dir)
        .iter()
        .any(|p| p.extension().is_some_and(|e| e == "journal"))
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .flat_map(|e| {
            let path = e.path();
            if path.is_dir() {
                walk(&path)
            } else {
                vec![path]
            }
        })
        .collect()
}

impl Drop for Journald {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(root) = self.dir.parent() {
            let _ = std::fs::remove_dir_all(root);
        }
    }
}
