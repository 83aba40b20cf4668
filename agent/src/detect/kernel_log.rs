//! The kernel log (`/dev/kmsg`), read from the current position on (old messages are never
//! re-scanned), matched against patterns compiled once. A match is either an Event (OOM kills,
//! hung tasks) or sets a condition (a filesystem remounted read-only) that clears when the
//! pattern has not matched for its `clearAfter`.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{Read, Seek, SeekFrom},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use regex::Regex;
use serde::Deserialize;
use tokio::sync::mpsc;

use super::{AgentContext, Detector, Finding, Section, Status};
use crate::values;

super::section! {
    pub struct KernelLogConfig {
        /// The kernel log device, read from its current end on.
        pub device: PathBuf,
        /// How often the condition patterns are evaluated (matching itself is immediate).
        pub patterns: Vec<KernelPatternConfig>,
    }
}

/// A kernel log pattern: an Event, or (with `condition`) a condition.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KernelPatternConfig {
    /// CamelCase reason of the Event or condition, e.g. `OOMKilling`.
    pub reason: String,
    /// Regular expression (Rust `regex` syntax) matched against each kernel message.
    pub regex: String,
    /// Node condition type this pattern sets while it matched within `clearAfter`.
    #[serde(default)]
    pub condition: Option<String>,
    #[serde(
        default = "kernel_clear_after",
        deserialize_with = "crate::values::duration"
    )]
    pub clear_after: Duration,
}

fn kernel_clear_after() -> Duration {
    Duration::from_secs(3600)
}

impl Default for KernelLogConfig {
    fn default() -> Self {
        let pattern = |reason: &str, regex: &str, condition: Option<&str>| KernelPatternConfig {
            reason: reason.to_owned(),
            regex: regex.to_owned(),
            condition: condition.map(str::to_owned),
            clear_after: kernel_clear_after(),
        };
        Self {
            enabled: true,
            device: PathBuf::from("/dev/kmsg"),
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            hold: Duration::ZERO,
            patterns: vec![
                pattern(
                    "OOMKilling",
                    r"(Out of memory|Memory cgroup out of memory): Kill(ed)? process \d+",
                    None,
                ),
                pattern(
                    "TaskHung",
                    r"task \S+:\w+ blocked for more than \w+ seconds\.",
                    None,
                ),
                pattern(
                    "KernelOops",
                    r"BUG: unable to handle kernel|Oops: \d+",
                    None,
                ),
                pattern(
                    "FilesystemIsReadOnly",
                    r"Remounting filesystem read-only",
                    Some(nodeward_api::conditions::node::READONLY_FILESYSTEM),
                ),
            ],
        }
    }
}

impl Section for KernelLogConfig {
    fn validate(&self, place: &str) -> Result<(), String> {
        self.schedule().validate(place)?;
        compile(self)?;
        for (index, pattern) in self.patterns.iter().enumerate() {
            let place = format!("{place}.patterns[{index}]");
            values::camel_case(&format!("{place}.reason"), &pattern.reason, "OOMKilling")?;
            if let Some(condition) = pattern.condition.as_deref() {
                values::camel_case(
                    &format!("{place}.condition"),
                    condition,
                    "ReadonlyFilesystem",
                )?;
                values::not_owned_by_others(&format!("{place}.condition"), condition)?;
                if pattern.clear_after.is_zero() {
                    return Err(format!("{place}.clearAfter: must be more than 0s, e.g. 1h"));
                }
            }
        }
        Ok(())
    }

    /// One detector per condition type the patterns set; none without an agent (the kernel
    /// log is followed from the agent's start).
    fn detectors(&self, agent: Option<&AgentContext>) -> Vec<Detector> {
        let Some(log) = agent.and_then(|a| a.kernel_log.as_ref()) else {
            return Vec::new();
        };
        let conditions: BTreeSet<&String> = log
            .patterns
            .iter()
            .filter_map(|p| p.condition.as_ref())
            .collect();
        conditions
            .into_iter()
            .map(|condition| {
                let name = format!("{DETECTOR}/{condition}");
                let input = (log.clone(), condition.clone(), name.clone());
                Detector::new(
                    name,
                    condition.clone(),
                    self.schedule(),
                    input,
                    |(log, condition, name)| async move {
                        let mut finding = evaluate(&log.patterns, &log.seen, Instant::now())
                            .into_iter()
                            .find(|f| f.condition == condition.as_str())
                            .unwrap_or_else(|| {
                                Finding::ok(DETECTOR, condition, "NoKernelProblem", String::new())
                            });
                        finding.detector = name.into();
                        finding
                    },
                )
            })
            .collect()
    }
}

/// An Event to publish on the Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEvent {
    pub warning: bool,
    pub reason: String,
    pub note: String,
}

pub const DETECTOR: &str = "kernel-log";

/// One compiled pattern.
#[derive(Clone, Debug)]
pub struct Pattern {
    pub reason: String,
    pub regex: Regex,
    /// The condition type it sets; `None` means it is an Event only.
    pub condition: Option<String>,
    pub clear_after: Duration,
}

/// Compiles the configured patterns; the error names the pattern and the regex problem.
pub fn compile(config: &KernelLogConfig) -> Result<Vec<Pattern>, String> {
    config
        .patterns
        .iter()
        .enumerate()
        .map(|(index, p)| {
            let regex = Regex::new(&p.regex)
                .map_err(|e| format!("detectors.kernelLog.patterns[{index}].regex: {e}"))?;
            Ok(Pattern {
                reason: p.reason.clone(),
                regex,
                condition: p.condition.clone(),
                clear_after: p.clear_after,
            })
        })
        .collect()
}

/// The message of one `/dev/kmsg` record (`prio,seq,usec,flags;message\n continuation`).
pub fn message_of(record: &str) -> Option<&str> {
    let (_, message) = record.split_once(';')?;
    message.lines().next()
}

/// What the reader has seen, shared with the detector.
#[derive(Debug, Default)]
pub struct Seen {
    /// When each condition pattern (by reason) last matched, and the message.
    last: BTreeMap<String, (Instant, String)>,
}

/// Feeds one message through the patterns: records condition matches and returns the Events.
pub fn feed(
    patterns: &[Pattern],
    seen: &Mutex<Seen>,
    message: &str,
    now: Instant,
) -> Vec<NodeEvent> {
    let mut events = Vec::new();
    for pattern in patterns.iter().filter(|p| p.regex.is_match(message)) {
        match &pattern.condition {
            None => events.push(NodeEvent {
                warning: true,
                reason: pattern.reason.clone(),
                note: nodeward_api::bounds::cut(message, 512),
            }),
            Some(_) => {
                let mut seen = seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                seen.last
                    .insert(pattern.reason.clone(), (now, message.to_owned()));
            }
        }
    }
    events
}

/// The findings for the condition patterns at `now`: a problem while a match is younger than
/// its `clearAfter`.
pub fn evaluate(patterns: &[Pattern], seen: &Mutex<Seen>, now: Instant) -> Vec<Finding> {
    let seen = seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut by_condition: BTreeMap<&str, Option<(&Pattern, &String)>> = BTreeMap::new();
    for pattern in patterns {
        let Some(condition) = pattern.condition.as_deref() else {
            continue;
        };
        let recent = seen
            .last
            .get(&pattern.reason)
            .filter(|(at, _)| now.saturating_duration_since(*at) < pattern.clear_after)
            .map(|(_, message)| (pattern, message));
        let slot = by_condition.entry(condition).or_insert(None);
        if slot.is_none() {
            *slot = recent;
        }
    }
    by_condition
        .into_iter()
        .map(|(condition, recent)| match recent {
            Some((pattern, message)) => Finding::new(
                DETECTOR,
                condition.to_owned(),
                Status::Problem,
                &pattern.reason,
                format!("kernel: {}", nodeward_api::bounds::cut(message, 512)),
            ),
            None => Finding::new(
                DETECTOR,
                condition.to_owned(),
                Status::Ok,
                "NoKernelProblem",
                "no matching kernel message recently".to_owned(),
            ),
        })
        .collect()
}

/// Follows the kernel log from now on, in a thread of its own (reads block), until the
/// receiver of `events` is gone.
pub fn follow(
    device: PathBuf,
    patterns: Arc<Vec<Pattern>>,
    seen: Arc<Mutex<Seen>>,
    events: mpsc::Sender<NodeEvent>,
) -> std::io::Result<()> {
    let mut file = std::fs::File::open(&device)?;
    // Start at the end: what happened before the agent started was reported (or not) then.
    file.seek(SeekFrom::End(0))?;
    std::thread::Builder::new().name("kmsg".into()).spawn(move || {
        // One read returns one record; records are at most about 8 KiB.
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            match file.read(&mut buffer) {
                Ok(0) => std::thread::sleep(Duration::from_millis(200)),
                Ok(len) => {
                    let record = String::from_utf8_lossy(&buffer[..len]);
                    if let Some(message) = message_of(&record) {
                        for event in feed(&patterns, &seen, message, Instant::now()) {
                            if events.blocking_send(event).is_err() {
                                return;
                            }
                        }
                    }
                }
                // EPIPE: the ring buffer overwrote records we had not read; go on from here.
                Err(e) if e.raw_os_error() == Some(nix::libc::EPIPE) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!(error = %e, device = %device.display(), "reading the kernel log failed; stopping it");
                    return;
                }
            }
        }
    })?;
    Ok(())
}

/// What the kernel-log detector reads.
#[derive(Clone, Debug)]
pub struct KernelLog {
    pub patterns: Arc<Vec<Pattern>>,
    pub seen: Arc<Mutex<Seen>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patterns() -> Vec<Pattern> {
        compile(&KernelLogConfig::default()).expect("the default patterns compile")
    }

    #[test]
    fn parses_kmsg_records() {
        assert_eq!(
            message_of("6,1234,5678901,-;EXT4-fs (sda1): mounted\n SUBSYSTEM=block\n"),
            Some("EXT4-fs (sda1): mounted")
        );
        assert_eq!(message_of("garbage"), None);
    }

    #[test]
    fn oom_kills_and_hung_tasks_are_events() {
        let seen = Mutex::new(Seen::default());
        let now = Instant::now();
        let oom = feed(
            &patterns(),
            &seen,
            "Out of memory: Killed process 4242 (java) total-vm:1234kB",
            now,
        );
        assert_eq!(
            oom.iter().map(|e| e.reason.as_str()).collect::<Vec<_>>(),
            ["OOMKilling"]
        );
        let hung = feed(
            &patterns(),
            &seen,
            "INFO: task jbd2/sda1-8:123 blocked for more than 120 seconds.",
            now,
        );
        assert_eq!(
            hung.iter().map(|e| e.reason.as_str()).collect::<Vec<_>>(),
            ["TaskHung"]
        );
        assert!(
            feed(
                &patterns(),
                &seen,
                "usb 1-1: new high-speed USB device",
                now
            )
            .is_empty()
        );
    }

    #[test]
    fn a_read_only_remount_sets_the_condition_until_it_ages_out() {
        let p = patterns();
        let seen = Mutex::new(Seen::default());
        let t0 = Instant::now();
        let before = evaluate(&p, &seen, t0);
        assert_eq!(before.len(), 1);
        assert_eq!(
            (before[0].condition.as_ref(), before[0].status),
            ("ReadonlyFilesystem", Status::Ok)
        );
        assert!(
            feed(
                &p,
                &seen,
                "EXT4-fs (sda1): Remounting filesystem read-only",
                t0
            )
            .is_empty()
        );
        let during = evaluate(&p, &seen, t0 + Duration::from_secs(60));
        during[0].assert_is(Status::Problem, "FilesystemIsReadOnly");
        assert!(
            during[0]
                .message
                .contains("Remounting filesystem read-only")
        );
        let clear_after = p
            .iter()
            .find_map(|p| p.condition.as_ref().map(|_| p.clear_after))
            .expect("a condition pattern");
        let after = evaluate(&p, &seen, t0 + clear_after);
        assert_eq!(after[0].status, Status::Ok);
    }

    #[test]
    fn a_bad_regex_names_its_pattern() {
        let mut config = KernelLogConfig::default();
        config.patterns[1].regex = "([unclosed".into();
        let err = compile(&config).expect_err("bad regex");
        assert!(
            err.starts_with("detectors.kernelLog.patterns[1].regex"),
            "{err}"
        );
    }
}
