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

use crate::host::systemd::{ManagerProxy, ServiceProxy, UnitProxy};

/// `CLD_EXITED`: the main process exited (rather than being killed by a signal).
const EXITED: i32 = 1;

/// `LogLevelMax` of a short command's unit: syslog's notice.
const QUIET: i32 = 5;

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

/// Runs `argv` on the host within `timeout` (systemd stops it then), its output through a pipe
/// to the agent: for short commands (a reboot, a check).
pub async fn run(argv: &[String], timeout: Duration) -> Result<Ran, String> {
    let (program, _) = argv.split_first().ok_or("no program configured")?;
    let (connection, systemd) = crate::host::systemd::connect()
        .await
        .map_err(|e| format!("running {program} on the host: {e}"))?;
    let (read, write) = nix::unistd::pipe().map_err(|e| format!("a pipe for {program}: {e}"))?;
    let unit = format!("nodeward-host-{:016x}.service", rand::random::<u64>());
    let reading = tokio::spawn(read_at_most(read, KEEP));
    let code = start_and_wait(
        &connection,
        &systemd,
        &unit,
        argv,
        timeout,
        Output::Pipe(write),
    )
    .await;
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

/// Runs `argv` on the host as the service `unit` (a name of the caller's, one per run) within
/// `timeout`, its output written to a file on the host rather than through the agent: a long
/// command (a package manager) outlives an agent restarted meanwhile without ever writing to a
/// closed pipe, and the restarted agent, calling again with the same `unit`, waits for that run
/// and reads how it ended instead of starting another. The file's last 64 KiB come back.
pub async fn run_logged(unit: &str, argv: &[String], timeout: Duration) -> Result<Ran, String> {
    let (program, _) = argv.split_first().ok_or("no program configured")?;
    let (connection, systemd) = crate::host::systemd::connect()
        .await
        .map_err(|e| format!("running {program} on the host: {e}"))?;
    let log = format!("/run/{}.log", unit.trim_end_matches(".service"));
    let code = match state_of(&connection, &systemd, unit).await {
        // Left by an agent before this one: its run, waited for (or already over).
        Some(state) => {
            if state == "activating" {
                left_running(&connection, &systemd, unit, timeout).await?;
            }
            exit_code(&connection, &systemd, unit).await
        }
        None => {
            let output = Output::File(log.clone());
            start_and_wait(&connection, &systemd, unit, argv, timeout, output).await
        }
    };
    let _ = systemd.stop_unit(unit, "replace").await;
    let _ = systemd.reset_failed_unit(unit).await;
    let tail = format!("tail -c {KEEP} \"$0\" 2>/dev/null; rm -f \"$0\"");
    let read = ["/bin/sh".to_owned(), "-c".to_owned(), tail, log];
    let output = run(&read, Duration::from_secs(60))
        .await
        .map(|r| r.output)
        .unwrap_or_default();
    Ok(Ran {
        code: code?,
        output,
    })
}

/// Where a command's standard output and error go.
enum Output {
    /// The write end of a pipe the agent reads.
    Pipe(OwnedFd),
    /// A file on the host, truncated first.
    File(String),
}

/// `unit`'s ActiveState, when systemd has it loaded.
async fn state_of(
    connection: &zbus::Connection,
    systemd: &ManagerProxy<'_>,
    unit: &str,
) -> Option<String> {
    let path = systemd.get_unit(unit).await.ok()?;
    let proxy: UnitProxy = crate::host::systemd::uncached(connection, path)
        .await
        .ok()?;
    proxy.active_state().await.ok()
}

/// Waits for `unit`, started by an agent before this one, to stop running.
async fn left_running(
    connection: &zbus::Connection,
    systemd: &ManagerProxy<'_>,
    unit: &str,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + timeout + Duration::from_secs(10);
    while state_of(connection, systemd, unit).await.as_deref() == Some("activating") {
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "{unit} on the host: still running past its timeout"
            ));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    Ok(())
}

/// Starts `argv` as the transient oneshot `unit` and waits for it to end: its exit code.
async fn start_and_wait(
    connection: &zbus::Connection,
    systemd: &ManagerProxy<'_>,
    unit: &str,
    argv: &[String],
    timeout: Duration,
    output: Output,
) -> Result<Option<i32>, String> {
    let program = argv.first().map_or("", String::as_str);
    // Job signals come only to subscribers, and must be listened for before the job starts.
    systemd
        .subscribe()
        .await
        .map_err(|e| format!("subscribing to systemd's jobs: {e}"))?;
    let mut jobs = systemd
        .receive_job_removed()
        .await
        .map_err(|e| format!("listening for systemd's jobs: {e}"))?;
    let job = start(systemd, unit, argv, timeout, output)
        .await
        .map_err(|e| format!("running {program} on the host through systemd: {e}"))?;
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
    if !ended {
        return Err(format!(
            "{program} on the host: systemd did not report its end"
        ));
    }
    exit_code(connection, systemd, unit).await
}

/// Starts `argv` as the transient oneshot service `unit`, its stdout and stderr to `output`.
async fn start(
    systemd: &ManagerProxy<'_>,
    unit: &str,
    argv: &[String],
    timeout: Duration,
    output: Output,
) -> zbus::Result<OwnedObjectPath> {
    let micros = u64::try_from(timeout.as_micros()).unwrap_or(u64::MAX);
    let exec = vec![(argv[0].clone(), argv.to_vec(), false)];
    let mut properties: Vec<(&str, Value<'_>)> = vec![
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
    ];
    if let Output::Pipe(_) = output {
        // A short command (a check every few seconds) leaves nothing in the host's journal:
        // its exit code is an answer the agent reads, not a failure of systemd's to log, and
        // the level filters systemd's own lines about the unit too. A command its timeout
        // killed still fails with a warning; a logged run (an update) keeps every line.
        let answers: Vec<i32> = (1..=255).collect();
        properties.push((
            "SuccessExitStatus",
            Value::from((answers, Vec::<i32>::new())),
        ));
        properties.push(("LogLevelMax", Value::from(QUIET)));
    }
    match &output {
        Output::Pipe(fd) => {
            properties.push(("StandardOutputFileDescriptor", Value::from(Fd::from(fd))));
            properties.push(("StandardErrorFileDescriptor", Value::from(Fd::from(fd))));
        }
        // Standard error follows standard output (systemd's default, `inherit`).
        Output::File(path) => {
            properties.push(("StandardOutputFileToTruncate", Value::from(path.as_str())));
        }
    }
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
