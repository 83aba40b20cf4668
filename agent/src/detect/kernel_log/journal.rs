//! systemd-journald's files, read-only: the kernel's messages (reading them needs no privilege,
//! where `/dev/kmsg` needs a privileged container; the DaemonSet mounts the host's journal
//! directories read-only) and the messages of named programs (the journal monitors). journald
//! keeps no kmsg sequence number, so a record's place is its timestamp in microseconds since
//! boot (the kernel's own, `_SOURCE_MONOTONIC_TIMESTAMP`, for kernel records), which is also
//! its age.

use std::{
    path::{Path, PathBuf},
    sync::mpsc::{RecvTimeoutError, TryRecvError},
    time::Duration,
};

use nodeward_api::report::KernelLogSource;
use sdjournal::{Journal, LiveEntry, SubscriptionOptions};

use super::{KernelLogConfig, Reader, SourceSetting};

/// The source the configuration means on this host: `auto` is the journal when its
/// directories hold journal files.
pub fn source(config: &KernelLogConfig) -> KernelLogSource {
    match config.source {
        SourceSetting::Kmsg => KernelLogSource::Kmsg,
        SourceSetting::Journal => KernelLogSource::Journal,
        SourceSetting::Auto if holds_journal(&config.journal_directories) => {
            KernelLogSource::Journal
        }
        SourceSetting::Auto => KernelLogSource::Kmsg,
    }
}

/// Whether any of `directories` holds a journal file, directly or in a machine-id
/// subdirectory (where journald writes them).
pub fn holds_journal(directories: &[PathBuf]) -> bool {
    fn has_journal_file(dir: &Path) -> bool {
        std::fs::read_dir(dir).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.path().extension().is_some_and(|x| x == "journal"))
        })
    }
    directories.iter().any(|dir| {
        has_journal_file(dir)
            || std::fs::read_dir(dir).is_ok_and(|entries| {
                entries
                    .flatten()
                    .any(|e| e.file_type().is_ok_and(|t| t.is_dir()) && has_journal_file(&e.path()))
            })
    })
}

/// The line as the kernel log held it. journald files a message's leading `identifier:` (or
/// `identifier[pid]:`) under SYSLOG_IDENTIFIER (and SYSLOG_PID) unless the kernel itself logged
/// it (facility 0), which is how messages written to `/dev/kmsg` from user space are stored;
/// the patterns are written for the whole line.
pub fn kernel_line(
    facility: Option<&str>,
    identifier: Option<&str>,
    pid: Option<&str>,
    message: &str,
) -> String {
    match (facility, identifier) {
        (Some(f), Some(identifier)) if f != "0" => match pid {
            Some(pid) => format!("{identifier}[{pid}]: {message}"),
            None => format!("{identifier}: {message}"),
        },
        _ => message.to_owned(),
    }
}

/// The journal's form of a boot id: 32 hex digits, no dashes.
pub fn journal_boot_id(boot_id: &str) -> String {
    boot_id.trim().replace('-', "").to_ascii_lowercase()
}

/// Which journal records a reader takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Records {
    /// What journald read from the kernel (`_TRANSPORT=kernel`); a record's place is the
    /// kernel's timestamp of it.
    Kernel,
    /// The messages of one program (its `SYSLOG_IDENTIFIER`, as node-problem-detector's
    /// journald monitors select them); a record's place is journald's timestamp of it.
    Identifier(String),
}

/// Follows the `records` of boot `boot_id` in the journal under `directories`, from the
/// boot's first record on, in threads of their own, until the receiver of the Events is gone.
pub fn follow(
    directories: &[PathBuf],
    boot_id: &str,
    records: Records,
    reader: Reader,
) -> Result<(), String> {
    let opening = |e: sdjournal::SdJournalError| {
        let names: Vec<String> = directories
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        format!("opening the journal in {}: {e}", names.join(", "))
    };
    let journal = Journal::open_dirs(directories).map_err(opening)?;
    let mut live = journal.live().map_err(opening)?;
    let mut filter = live.filter();
    match &records {
        Records::Kernel => filter.match_exact("_TRANSPORT", b"kernel"),
        Records::Identifier(identifier) => {
            filter.match_exact("SYSLOG_IDENTIFIER", identifier.as_bytes())
        }
    };
    filter.match_exact("_BOOT_ID", journal_boot_id(boot_id).as_bytes());
    let mut options = SubscriptionOptions::new(filter);
    // From this boot's start (the filter keeps other boots out; the minute spares clock steps).
    options.since_realtime(boot_started_realtime().saturating_sub(60_000_000));
    let subscription = live.subscribe_with_options(options).map_err(opening)?;
    let records_watched = records.clone();
    std::thread::Builder::new()
        .name("journal-watch".into())
        .spawn(move || {
            if let Err(e) = live.run() {
                tracing::warn!(error = %e, records = ?records_watched, "following the journal failed; its patterns stop");
            }
        })
        .map_err(|e| format!("starting a thread to follow the journal: {e}"))?;
    std::thread::Builder::new()
        .name("journal-reader".into())
        .spawn(move || {
            // The backlog was queued at subscription: once it is drained, the reader caught up.
            loop {
                let entry = match subscription.try_recv() {
                    Ok(entry) => entry,
                    Err(TryRecvError::Empty) => {
                        reader.caught_up();
                        match subscription.recv_timeout(Duration::from_secs(1)) {
                            Ok(entry) => entry,
                            Err(RecvTimeoutError::Timeout) => continue,
                            Err(RecvTimeoutError::Disconnected) => return,
                        }
                    }
                    Err(TryRecvError::Disconnected) => return,
                };
                match entry {
                    Ok(entry) => {
                        if !take(&reader, &records, &entry) {
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "a journal entry could not be read; skipped")
                    }
                }
            }
        })
        .map_err(|e| format!("starting a thread to follow the journal: {e}"))?;
    Ok(())
}

/// Takes one record of the journal; false once the Events' receiver is gone.
fn take(reader: &Reader, records: &Records, entry: &LiveEntry) -> bool {
    let text = |field| entry.get(field).map(String::from_utf8_lossy);
    let Some(message) = text("MESSAGE") else {
        return true;
    };
    let (line, usec) = match records {
        Records::Kernel => {
            let facility = text("SYSLOG_FACILITY");
            let identifier = text("SYSLOG_IDENTIFIER");
            let pid = text("SYSLOG_PID");
            let line = kernel_line(
                facility.as_deref(),
                identifier.as_deref(),
                pid.as_deref(),
                &message,
            );
            let usec = text("_SOURCE_MONOTONIC_TIMESTAMP")
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| entry.monotonic_usec());
            (line, usec)
        }
        Records::Identifier(_) => (message.trim().to_owned(), entry.monotonic_usec()),
    };
    reader.take(usec, Duration::from_micros(usec), &line)
}

/// When this boot started, in microseconds since the epoch.
fn boot_started_realtime() -> u64 {
    let now = |clock| {
        nix::time::clock_gettime(clock)
            .map(Duration::from)
            .unwrap_or_default()
    };
    let realtime = now(nix::time::ClockId::CLOCK_REALTIME);
    let monotonic = now(nix::time::ClockId::CLOCK_MONOTONIC);
    u64::try_from(realtime.saturating_sub(monotonic).as_micros()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_line_is_put_back_together_only_for_messages_from_user_space() {
        // Logged by the kernel (facility 0): MESSAGE is the whole line.
        assert_eq!(
            kernel_line(
                Some("0"),
                Some("kernel"),
                None,
                "BUG: kernel NULL pointer dereference"
            ),
            "BUG: kernel NULL pointer dereference"
        );
        // Written to /dev/kmsg from user space: journald took the identifier off.
        assert_eq!(
            kernel_line(
                Some("1"),
                Some("BUG"),
                None,
                "kernel NULL pointer dereference"
            ),
            "BUG: kernel NULL pointer dereference"
        );
        assert_eq!(
            kernel_line(Some("1"), Some("probe"), Some("42"), "hello"),
            "probe[42]: hello"
        );
        assert_eq!(kernel_line(None, None, None, "plain"), "plain");
    }

    #[test]
    fn boot_ids_are_compared_in_the_journal_form() {
        assert_eq!(
            journal_boot_id("3D1219C7-c4c5-404a-aa1f-6d2a48adfda4\n"),
            "3d1219c7c4c5404aaa1f6d2a48adfda4"
        );
    }

    #[test]
    fn auto_is_the_journal_only_where_journal_files_are() {
        let root = std::env::temp_dir().join(format!("nodeward-journal-{}", std::process::id()));
        let machine = root.join("3d1219c7c4c5404aaa1f6d2a48adfda4");
        std::fs::create_dir_all(&machine).expect("a machine-id directory");
        let config = |dir: &Path| KernelLogConfig {
            journal_directories: vec![dir.to_path_buf()],
            ..KernelLogConfig::default()
        };
        assert_eq!(
            source(&config(&root)),
            KernelLogSource::Kmsg,
            "no journal files"
        );
        std::fs::write(machine.join("system.journal"), b"").expect("a journal file");
        assert_eq!(source(&config(&root)), KernelLogSource::Journal);
        let kmsg = KernelLogConfig {
            source: SourceSetting::Kmsg,
            ..config(&root)
        };
        assert_eq!(source(&kmsg), KernelLogSource::Kmsg);
        std::fs::remove_dir_all(&root).expect("removing the test directory");
    }
}
