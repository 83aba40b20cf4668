//! The programs the agent runs (custom checks, the reboot sentinel command) and what they leave
//! behind. Each runs in its own process group, killed whole when it ends or times out, so a
//! check that backgrounds a process cannot leave it running. In its container the agent is
//! PID 1, so the processes thus orphaned become its children; [`reap_orphans`] collects them
//! (as an init would) without taking the exit status of a child the agent still waits for.

use std::{
    collections::HashSet,
    process::Stdio,
    sync::{LazyLock, Mutex, MutexGuard},
    time::Duration,
};

use nix::{
    sys::{
        signal::{Signal, killpg},
        wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid},
    },
    unistd::Pid,
};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Children the agent spawned and waits for itself (their exit status is theirs to take).
static OWN: LazyLock<Mutex<HashSet<i32>>> = LazyLock::new(Mutex::default);

fn own() -> MutexGuard<'static, HashSet<i32>> {
    OWN.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a program printed and how it ended.
#[derive(Debug)]
pub struct Ran {
    pub status: std::process::ExitStatus,
    /// At most `keep` bytes of each stream; the rest was read and dropped.
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// The process group of a running program: killed when dropped.
struct Group(Pid);

impl Drop for Group {
    fn drop(&mut self) {
        // ESRCH: nothing of it is left.
        let _ = killpg(self.0, Signal::SIGKILL);
    }
}

/// Runs `program` with `args` in its own process group and waits for it, keeping at most
/// `keep` bytes of each output stream. When it exits, or when this future is dropped (a
/// timeout), whatever is left of its group is killed.
pub async fn run(program: &str, args: &[String], keep: usize) -> Result<Ran, String> {
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let (mut child, pid) = {
        // Held across the spawn: a child that exits at once is known as ours before a reaper
        // could see it.
        let mut own = own();
        let child = command
            .spawn()
            .map_err(|e| format!("cannot run {program}: {e}"))?;
        let pid = child.id().and_then(|id| i32::try_from(id).ok());
        if let Some(pid) = pid {
            own.insert(pid);
        }
        (child, pid)
    };
    let forget = Forget(pid);
    let group = pid.map(|pid| Group(Pid::from_raw(pid)));
    let stdout = tokio::spawn(capture(child.stdout.take(), keep));
    let stderr = tokio::spawn(capture(child.stderr.take(), keep));
    let status = child
        .wait()
        .await
        .map_err(|e| format!("waiting for {program}: {e}"));
    // Its leftovers die now; with them go the last holders of its pipes.
    drop(group);
    drop(forget);
    let status = status?;
    let stdout = stdout.await.unwrap_or_default();
    let stderr = stderr.await.unwrap_or_default();
    Ok(Ran {
        status,
        stdout,
        stderr,
    })
}

/// Forgets a child once it has been waited for (or its wait was abandoned).
struct Forget(Option<i32>);

impl Drop for Forget {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            own().remove(&pid);
        }
    }
}

async fn capture(pipe: Option<impl AsyncRead + Unpin>, keep: usize) -> Vec<u8> {
    let mut kept = Vec::new();
    let Some(mut pipe) = pipe else {
        return kept;
    };
    let mut buffer = [0u8; 8192];
    // Read to the end even past `keep`, so that the program never blocks on a full pipe.
    while let Ok(n) = pipe.read(&mut buffer).await {
        if n == 0 {
            break;
        }
        let room = keep.saturating_sub(kept.len());
        kept.extend_from_slice(&buffer[..n.min(room)]);
    }
    kept
}

/// Collects every exited child that is not one the agent waits for itself; how many.
pub fn reap_orphans() -> usize {
    let mut reaped = 0;
    loop {
        let own = own();
        // WNOWAIT: look at the first exited child without taking its status.
        let found = waitid(
            Id::All,
            WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT,
        );
        let pid = match found {
            Ok(status) => match status.pid() {
                Some(pid) => pid,
                None => return reaped, // none exited (StillAlive)
            },
            Err(_) => return reaped, // ECHILD: no children at all
        };
        if own.contains(&pid.as_raw()) {
            // Ours to wait for; it is taken as soon as its task runs, and the next round
            // looks past it.
            return reaped;
        }
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return reaped,
            Ok(_) => reaped += 1,
        }
    }
}

/// Whether orphans come to this process: it is PID 1 (of its container) or a subreaper.
pub fn receives_orphans() -> bool {
    std::process::id() == 1 || nix::sys::prctl::get_child_subreaper().unwrap_or(false)
}

/// Reaps orphans on every SIGCHLD and every `every` (a signal can be coalesced) until
/// dropped.
pub async fn reap(every: Duration) {
    let mut children = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()) {
        Ok(signal) => Some(signal),
        Err(e) => {
            tracing::warn!(error = %e, "no SIGCHLD handler; reaping orphans every {every:?}");
            None
        }
    };
    let mut tick = tokio::time::interval(every);
    loop {
        match children.as_mut() {
            Some(signal) => {
                tokio::select! {
                    _ = signal.recv() => {}
                    _ = tick.tick() => {}
                }
            }
            None => {
                tick.tick().await;
            }
        }
        let reaped = reap_orphans();
        if reaped > 0 {
            tracing::debug!(reaped, "collected orphaned processes");
        }
    }
}
