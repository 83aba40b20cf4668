//! systemd-journald's files, read-only: the kernel's messages (reading them needs no privilege,
//! where `/dev/kmsg` needs a privileged container; the DaemonSet mounts the host's journal
//! directories read-only) and the messages of named programs (the journal monitors). journald
//! keeps no kmsg sequence number, so a record's place is its timestamp in microseconds since
//! boot (the kernel's own, `_SOURCE_MONOTONIC_TIMESTAMP`, for kernel records), which is also
//! its age.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use nodeward_api::report::KernelLogSource;
use sdjournal::{Cursor, EntryRef, Journal};

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
    !files_as_they_are(directories).is_empty()
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
/// boot's first record on, in a thread of its own, until the receiver of the Events is gone.
///
/// Every [`POLL`] in which the journal's files changed, it asks the journal for its records
/// after the last one taken, by the journal's own index (the entries of a field's value):
/// other programs' entries are never read. Following every append instead decoded each entry
/// of the journal to filter it, which cost 51 millicores beside 1,000 entries a second of
/// another program (BENCHMARKS.md, "Kernel lines to the API server, and a busy journal").
pub fn follow(
    directories: &[PathBuf],
    boot_id: &str,
    records: Records,
    reader: Reader,
) -> Result<(), String> {
    let opening = {
        let names: Vec<String> = directories
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        move |e: sdjournal::SdJournalError| {
            format!("opening the journal in {}: {e}", names.join(", "))
        }
    };
    Journal::open_dirs(directories).map_err(&opening)?;
    let directories = directories.to_vec();
    let boot = journal_boot_id(boot_id);
    // From this boot's start (the boot id keeps other boots out; the minute spares clock steps).
    let since = boot_started_realtime().saturating_sub(60_000_000);
    std::thread::Builder::new()
        .name("journal-reader".into())
        .spawn(move || {
            let mut last: Option<Cursor> = None;
            let mut failing = false;
            let mut seen = Vec::new();
            loop {
                // The journal is asked only when its files changed: a look at their sizes
                // costs next to nothing, a query of them (opened anew) does not.
                let now = files_as_they_are(&directories);
                if last.is_some() && !failing && now == seen {
                    std::thread::sleep(POLL);
                    continue;
                }
                seen = now;
                match records_after(&directories, &records, &boot, since, last.as_ref()) {
                    Ok(entries) => {
                        failing = false;
                        for entry in entries {
                            match entry {
                                Ok(entry) => {
                                    last = entry.cursor().ok().or(last);
                                    if !take(&reader, &records, &entry) {
                                        return;
                                    }
                                }
                                Err(e) => {
                                    tracing::warn!(error = %e, "a journal entry could not be read; skipped")
                                }
                            }
                        }
                        // The first pass read the boot's records so far: conditions can be judged.
                        reader.caught_up();
                    }
                    Err(e) if !failing => {
                        failing = true;
                        tracing::warn!(error = %opening(e), records = ?records, "reading the journal failed; trying again");
                    }
                    Err(_) => {}
                }
                std::thread::sleep(POLL);
            }
        })
        .map_err(|e| format!("starting a thread to follow the journal: {e}"))?;
    Ok(())
}

/// Each journal file under `directories` (directly or in a machine-id subdirectory) with its
/// size and modification time, in order.
fn files_as_they_are(
    directories: &[PathBuf],
) -> Vec<(PathBuf, u64, Option<std::time::SystemTime>)> {
    fn journal_files(
        dir: &Path,
        depth: usize,
        found: &mut Vec<(PathBuf, u64, Option<std::time::SystemTime>)>,
    ) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            if meta.is_dir() && depth > 0 {
                journal_files(&path, depth - 1, found);
            } else if path.extension().is_some_and(|x| x == "journal") {
                found.push((path, meta.len(), meta.modified().ok()));
            }
        }
    }
    let mut found = Vec::new();
    for dir in directories {
        journal_files(dir, 1, &mut found);
    }
    found.sort();
    found
}

/// How often the journal is asked for new records (it adds up to this to a line's delay).
const POLL: Duration = Duration::from_millis(250);

/// The `records` of boot `boot` after `last` (or, before the first, since `since`), as the
/// journal's files hold them now.
fn records_after(
    directories: &[PathBuf],
    records: &Records,
    boot: &str,
    since: u64,
    last: Option<&Cursor>,
) -> Result<Vec<sdjournal::Result<EntryRef>>, sdjournal::SdJournalError> {
    let journal = Journal::open_dirs(directories)?;
    let mut query = journal.query();
    match records {
        Records::Kernel => query.match_exact("_TRANSPORT", b"kernel"),
        Records::Identifier(identifier) => {
            query.match_exact("SYSLOG_IDENTIFIER", identifier.as_bytes())
        }
    };
    query.match_exact("_BOOT_ID", boot.as_bytes());
    match last {
        Some(cursor) => query.after_cursor(cursor.clone()),
        None => query.since_realtime(since),
    };
    Ok(query.iter()?.collect())
}

/// Takes one record of the journal; false once the Events' receiver is gone.
fn take(reader: &Reader, records: &Records, entry: &EntryRef) -> bool {
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
