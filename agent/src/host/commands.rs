//! Commands run on the host, not in the agent's container: as transient systemd services
//! started over the system bus the agent already holds (what `systemd-run --pipe --wait`
//! does). The command runs in the host's namespaces with the host's tools, and its output comes
//! back through a pipe whose write end is handed to systemd; the agent needs no host mount
//! (not `/var/run`, which holds the container runtime's socket) and no host PID namespace.
//!
//! What this takes is what the agent already has: root on the host's system bus, which is
//! root on the host (README, "Threat model").

use std::{os::fd::OwnedFd, time::Duration};

use futures::StreamExt;
use tokio::io::AsyncReadExt;
use zbus::zvariant::{Fd, OwnedObjectPath, Value};

use crate::host::systemd::{ManagerProxy, ServiceProxy};

/// `CLD_EXITED`: the main process exited (rather than being killed by a signal).
const EXITED: i32 = 1;

/// Output kept: its last 64 KiB (where a package manager says what went wrong), however much
/// the command writes.
const KEEP: usize = 64 * 1024;

/// How a command on the host ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ran {
    /// Its exit code; `None` when a signal ended it (its timeout among them).
    pub code: Option<i32>,
    /// Its output, standard output and error together: the last 64 KiB.
    pub output: Vec<u8>,
}

/// Runs `argv` on the host within `timeout` (systemd stops it then).
pub async fn run(argv: &[String], timeout: Duration) -> Result<Ran, String> {
    let (program, _) = argv.split_first().ok_or("no program configured")?;
    let (connection, systemd) = crate::host::systemd::connect()
        .await
        .map_err(|e| format!("running {program} on the host: {e}"))?;
    // Job signals come only to subscribers, and must be listened for before the job starts.
    systemd
        .subscribe()
        .await
        .map_err(|e| format!("subscribing to systemd's jobs: {e}"))?;
    let mut jobs = systemd
        .receive_job_removed()
        .await
        .map_err(|e| format!("listening for systemd's jobs: {e}"))?;
    let (read, write) = nix::unistd::pipe().map_err(|e| format!("a pipe for {program}: {e}"))?;
    let unit = format!("nodeward-host-{:016x}.service", rand::random::<u64>());
    let started = start(&systemd, &unit, argv, timeout, write).await;
    let job = started.map_err(|e| format!("running {program} on the host through systemd: {e}"))?;
    let reading = tokio::spawn(read_at_most(read, KEEP));
    // Type=oneshot: the start job ends when the command does (or its start timeout hits).
    let ended = tokio::time::timeout(timeout + Duration::from_secs(10), async {
        while let Some(signal) = jobs.next().await {
            if signal.args().is_ok_and(|a| a.job == job) {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    let code = if ended {
        exit_code(&connection, &systemd, &unit).await
    } else {
        Err(format!(
            "{program} on the host: systemd did not report its end"
        ))
    };
    // The unit goes (and systemd's copies of the pipe with it), whatever happened.
    let _ = systemd.stop_unit(&unit, "replace").await;
    let _ = systemd.reset_failed_unit(&unit).await;
    let output = tokio::time::timeout(Duration::from_secs(2), reading)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    Ok(Ran {
        code: code?,
        output,
    })
}

/// Starts `argv` as the transient oneshot service `unit`, its stdout and stderr `output`.
async fn start(
    systemd: &ManagerProxy<'_>,
    unit: &str,
    argv: &[String],
    timeout: Duration,
    output: OwnedFd,
) -> zbus::Result<OwnedObjectPath> {
    let micros = u64::try_from(timeout.as_micros()).unwrap_or(u64::MAX);
    let exec = vec![(argv[0].clone(), argv.to_vec(), false)];
    let properties: Vec<(&str, Value<'_>)> = vec![
        (
            "Description",
            Value::from(format!("nodeward-agent: {}", argv.join(" "))),
        ),
        ("Type", Value::from("oneshot")),
        // Kept after it exits, so that its exit status can be read; stopped right after.
        ("RemainAfterExit", Value::from(true)),
        ("ExecStart", Value::from(exec)),
        ("TimeoutStartUSec", Value::from(micros)),
        ("StandardInput", Value::from("null")),
        (
            "StandardOutputFileDescriptor",
            Value::from(Fd::from(&output)),
        ),
        (
            "StandardErrorFileDescriptor",
            Value::from(Fd::from(&output)),
        ),
    ];
    systemd
        .start_transient_unit(unit, "fail", &properties, &[])
        .await
}

/// The exit code of the unit's command (None: a signal ended it, e.g. its timeout).
async fn exit_code(
    connection: &zbus::Connection,
    systemd: &ManagerProxy<'_>,
    unit: &str,
) -> Result<Option<i32>, String> {
    let read = |e: zbus::Error| format!("reading how {unit} ended: {e}");
    let path = systemd.get_unit(unit).await.map_err(read)?;
    let service: ServiceProxy = crate::host::systemd::uncached(connection, path)
        .await
        .map_err(read)?;
    let how = service.exec_main_code().await.map_err(read)?;
    let status = service.exec_main_status().await.map_err(read)?;
    Ok((how == EXITED).then_some(status))
}

/// Reads `fd` to its end, keeping its last `keep` bytes (all is read, so that the command
/// never blocks on a full pipe).
async fn read_at_most(fd: OwnedFd, keep: usize) -> Vec<u8> {
    let Ok(mut pipe) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
        return Vec::new();
    };
    let mut kept = Vec::new();
    let mut buffer = [0u8; 8192];
    while let Ok(n @ 1..) = pipe.read(&mut buffer).await {
        kept.extend_from_slice(&buffer[..n]);
        // Dropped in chunks rather than per read: at most twice `keep` is held.
        if kept.len() > 2 * keep {
            kept.drain(..kept.len() - keep);
        }
    }
    if kept.len() > keep {
        kept.drain(..kept.len() - keep);
    }
    kept
}
