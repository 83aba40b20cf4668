//! The kernel log (`/dev/kmsg`), read from the oldest record the kernel still holds (so an
//! agent started after an OOM kill or a read-only remount still sees it), matched against
//! patterns compiled once. A match is either an Event (OOM kills, hung tasks) or sets a
//! condition (a filesystem remounted read-only) that clears when the pattern has not matched
//! for its `clearAfter`, counted from the record's own time. An Event is published once per
//! record: the NodeReport keeps the boot id and the sequence number of the last one
//! ([`Replay`]), and a restarted agent publishes only newer ones (or, the first time on a
//! boot, those within `lookback`).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use nodeward_api::report::KernelLogSource;
use regex::Regex;
use serde::Deserialize;
use tokio::sync::mpsc;

use super::{
    AgentContext, Background, Detector, Finding, ForReports, On, Section, Starting, Status,
};
use crate::values;

mod defaults;
pub mod follow;
pub mod journal;
pub mod kmsg;

super::section! {
    pub struct KernelLogConfig {
        /// Where kernel messages are read.
        pub source: SourceSetting,
        /// The kernel log device (source `kmsg`).
        pub device: PathBuf,
        /// systemd-journald's directories (source `journal`), each holding journal files
        /// directly or in machine-id subdirectories.
        pub journal_directories: Vec<PathBuf>,
        /// What is matched against each message (the interval is how often the conditions they
        /// set are judged; matching itself is immediate).
        pub patterns: Vec<KernelPatternConfig>,
        /// How far back, at the agent's first start on a boot, records still become Events
        /// (older ones only set conditions, within their `clearAfter`).
        #[serde(deserialize_with = "crate::values::duration")]
        pub lookback: Duration,
    }
}

/// Where kernel messages are read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceSetting {
    /// The journal when its directories hold journal files, else `/dev/kmsg`.
    #[default]
    Auto,
    /// `/dev/kmsg`: needs CAP_SYSLOG, and in a container a privileged one (the device cgroup).
    Kmsg,
    /// systemd-journald's files, read-only: no privilege beyond reading them.
    Journal,
}

/// The most journal directories a configuration names.
const JOURNAL_DIRECTORIES_LIMIT: usize = 8;

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
    /// Match against the last `lines` messages joined with newlines, ending at the newest
    /// (node-problem-detector's `bufferSize`, for its rules of several lines).
    #[serde(default = "one_line")]
    pub lines: usize,
    /// The condition's reason and message while this pattern has not matched recently
    /// (node-problem-detector's `conditions`, e.g. `KernelHasNoDeadlock`); else `NoKernelProblem`.
    #[serde(default)]
    pub ok_reason: Option<String>,
    #[serde(default)]
    pub ok_message: Option<String>,
    /// Said after the matched lines in the Event or condition message (`lines; suffix`, as
    /// node-problem-detector's `patternGeneratedMessageSuffix`): a runbook, a ticket queue.
    #[serde(default)]
    pub message_suffix: Option<String>,
    /// Only when no pattern before it with the same reason matched the message: a default kept
    /// beside node-problem-detector's rules for the wordings they miss.
    #[serde(skip)]
    pub fallback: bool,
}

fn one_line() -> usize {
    1
}

/// The most messages a pattern may be matched across.
const LINES_LIMIT: usize = 100;

impl KernelPatternConfig {
    /// A pattern of one message.
    pub fn new(reason: &str, regex: &str, condition: Option<&str>) -> Self {
        Self {
            reason: reason.to_owned(),
            regex: regex.to_owned(),
            condition: condition.map(str::to_owned),
            clear_after: kernel_clear_after(),
            lines: 1,
            ok_reason: None,
            ok_message: None,
            message_suffix: None,
            fallback: false,
        }
    }

    /// With the condition's reason and message while it holds no problem.
    fn ok(mut self, reason: &str, message: &str) -> Self {
        self.ok_reason = Some(reason.to_owned());
        self.ok_message = Some(message.to_owned());
        self
    }
}

/// How long a pattern's condition stays after its last match, unless configured.
pub fn kernel_clear_after() -> Duration {
    Duration::from_secs(3600)
}

impl Section for KernelLogConfig {
    fn validate(&self, place: &str) -> Result<(), String> {
        self.schedule().validate(place)?;
        compile(self)?;
        if self.source != SourceSetting::Kmsg {
            validate_journal_directories(
                &format!("{place}.journalDirectories"),
                &self.journal_directories,
            )?;
        }
        validate_patterns(&format!("{place}.patterns"), &self.patterns)?;
        Ok(())
    }

    /// One detector per condition type the patterns set; none without an agent (the kernel
    /// log is followed from the agent's start).
    fn detectors(&self, agent: Option<&AgentContext>) -> Vec<Detector> {
        agent
            .and_then(AgentContext::started::<FollowedKernelLog>)
            .map(|log| log.0.detectors(self.schedule()))
            .unwrap_or_default()
    }

    /// Follows the kernel log from where the NodeReport says its Events stand; the
    /// NodeReport carries where it is read and that place.
    fn start<'a>(&'a self, on: &'a On<'a>, _: &'a mut tokio::task::JoinSet<()>) -> Starting<'a> {
        Box::pin(async move {
            let source = journal::source(self);
            let mut for_reports = ForReports {
                log_source: Some(source),
                ..ForReports::default()
            };
            if !self.enabled {
                return Ok(Background {
                    context: None,
                    for_reports,
                });
            }
            let published = follow::published(on, &LogName::Kernel, source).await;
            for_reports
                .published
                .extend(published.map(|p| (LogName::Kernel, p)));
            let kernel_log = follow::Follow {
                name: LogName::Kernel,
                labels: Labels::KERNEL,
                patterns: compile(self),
                lookback: self.lookback,
                published,
                what: format!("the kernel log ({source:?})"),
            };
            let log = kernel_log.start(on, |reader| match source {
                KernelLogSource::Kmsg => kmsg::follow(self.device.clone(), reader)
                    .map_err(|e| format!("reading {}: {e}", self.device.display())),
                KernelLogSource::Journal => follow::this_boot(on).and_then(|boot| {
                    journal::follow(
                        &self.journal_directories,
                        boot,
                        journal::Records::Kernel,
                        reader,
                    )
                }),
            });
            let background = Background {
                context: None,
                for_reports,
            };
            Ok(match log {
                Some(log) => background.with_context(FollowedKernelLog(log)),
                None => background,
            })
        })
    }
}

/// The kernel log as followed: what its detectors read.
pub struct FollowedKernelLog(pub MatchedLog);

/// An Event to publish on the Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEvent {
    pub warning: bool,
    pub reason: String,
    pub note: String,
}

/// An Event from the record at place `sequence` (in this boot) of the log `log`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEvent {
    pub event: NodeEvent,
    pub log: LogName,
    pub sequence: u64,
}

/// A log whose Events the NodeReport keeps the place of: the kernel's, or the journal
/// messages of one program (its `SYSLOG_IDENTIFIER`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogName {
    Kernel,
    Journal(String),
}

/// Which records of this boot become Events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replay {
    /// The sequence number of the last record published as an Event on this boot (from the
    /// NodeReport), if known.
    pub published: Option<u64>,
    /// Without it: records at most this old.
    pub lookback: Duration,
}

impl Replay {
    /// Whether the record numbered `sequence`, `age` old, is published as an Event.
    pub fn publishes(&self, sequence: u64, age: Duration) -> bool {
        match self.published {
            Some(last) => sequence > last,
            None => age <= self.lookback,
        }
    }
}

/// One `/dev/kmsg` record: `prio,seq,usec,flags;message\n continuation lines`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    pub sequence: u64,
    /// When it was logged, as time since boot.
    pub since_boot: Duration,
    pub message: &'a str,
}

/// Reads one record; `None` for anything else.
pub fn record_of(raw: &str) -> Option<Record<'_>> {
    let (header, message) = raw.split_once(';')?;
    let mut fields = header.split(',');
    let _priority = fields.next()?;
    let sequence = fields.next()?.parse().ok()?;
    let usec: u64 = fields.next()?.parse().ok()?;
    Some(Record {
        sequence,
        since_boot: Duration::from_micros(usec),
        message: message.lines().next()?,
    })
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
    /// How many of the last messages it is matched across ([`KernelPatternConfig::lines`]).
    pub lines: usize,
    /// The condition's reason and message while it holds no problem.
    pub ok: Option<(String, String)>,
    pub message_suffix: Option<String>,
    pub fallback: bool,
}

/// Checks the journal directories configured at `place`: at least one, all absolute, few.
pub fn validate_journal_directories(place: &str, directories: &[PathBuf]) -> Result<(), String> {
    if directories.is_empty() {
        return Err(format!(
            "{place}: name at least one, e.g. [/var/log/journal, /run/log/journal]"
        ));
    }
    if directories.len() > JOURNAL_DIRECTORIES_LIMIT {
        return Err(format!(
            "{place}: at most {JOURNAL_DIRECTORIES_LIMIT} directories"
        ));
    }
    if let Some(relative) = directories.iter().find(|d| d.is_relative()) {
        return Err(format!(
            "{place}: {} is relative; name an absolute directory, e.g. /var/log/journal",
            relative.display()
        ));
    }
    Ok(())
}

/// Checks the reasons, conditions and `clearAfter` of the patterns configured at `place`.
pub fn validate_patterns(place: &str, patterns: &[KernelPatternConfig]) -> Result<(), String> {
    for (index, pattern) in patterns.iter().enumerate() {
        let place = format!("{place}[{index}]");
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
        if !(1..=LINES_LIMIT).contains(&pattern.lines) {
            return Err(format!(
                "{place}.lines: must be from 1 to {LINES_LIMIT}, e.g. 10 (node-problem-detector's bufferSize)"
            ));
        }
    }
    Ok(())
}

/// The journal's directories where journald keeps them: persistent, then volatile.
pub fn default_journal_directories() -> Vec<PathBuf> {
    vec![
        PathBuf::from("/var/log/journal"),
        PathBuf::from("/run/log/journal"),
    ]
}

/// Compiles the configured patterns; the error names the pattern and the regex problem.
pub fn compile(config: &KernelLogConfig) -> Result<Vec<Pattern>, String> {
    compile_patterns("detectors.kernelLog.patterns", &config.patterns)
}

/// Compiles `patterns` (configured at `place`); the error names the pattern and the problem.
pub fn compile_patterns(
    place: &str,
    patterns: &[KernelPatternConfig],
) -> Result<Vec<Pattern>, String> {
    patterns
        .iter()
        .enumerate()
        .map(|(index, p)| {
            let regex = Regex::new(&p.regex).map_err(|e| format!("{place}[{index}].regex: {e}"))?;
            Ok(Pattern {
                reason: p.reason.clone(),
                regex,
                condition: p.condition.clone(),
                clear_after: p.clear_after,
                lines: p.lines,
                ok: p.ok_reason.clone().map(|reason| {
                    let message = p.ok_message.clone().unwrap_or_default();
                    (reason, message)
                }),
                message_suffix: p.message_suffix.clone(),
                fallback: p.fallback,
            })
        })
        .collect()
}

/// The message of one `/dev/kmsg` record (`prio,seq,usec,flags;message\n continuation`).
pub fn message_of(record: &str) -> Option<&str> {
    record_of(record).map(|r| r.message)
}

/// What the reader has seen, shared with the detector.
#[derive(Debug, Default)]
pub struct Seen {
    /// When each condition pattern (by reason) last matched, and the message.
    last: BTreeMap<String, (Instant, String)>,
    /// Whether the reader has read every record the kernel held at its start: until then a
    /// condition cannot be judged (a restarted agent would clear one it has yet to read).
    pub caught_up: bool,
    /// Condition matches so far: a new one has its detector judge it at once.
    pub condition_matches: u64,
    /// The last messages, newest last, for patterns matched across several.
    recent: std::collections::VecDeque<String>,
}

/// Feeds one message through the patterns: records condition matches and returns the Events.
/// A pattern of several `lines` is matched against the last ones joined with newlines, as
/// node-problem-detector matches its buffer, and must match up to the end (its `\z`).
pub fn feed(
    patterns: &[Pattern],
    seen: &Mutex<Seen>,
    message: &str,
    now: Instant,
) -> Vec<NodeEvent> {
    let mut seen = seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let most = patterns.iter().map(|p| p.lines).max().unwrap_or(1);
    if most > 1 {
        seen.recent.push_back(message.to_owned());
        while seen.recent.len() > most {
            seen.recent.pop_front();
        }
    }
    let mut events: Vec<NodeEvent> = Vec::new();
    let mut matched: Vec<&str> = Vec::new();
    for pattern in patterns {
        if pattern.fallback && matched.contains(&pattern.reason.as_str()) {
            continue;
        }
        let joined;
        let text = if pattern.lines > 1 {
            joined = buffer(&seen.recent, pattern.lines);
            joined.as_str()
        } else {
            message
        };
        let Some(found) = pattern.regex.find(text) else {
            continue;
        };
        matched.push(&pattern.reason);
        // The lines the match spans, from the start of its first.
        let start = text[..found.start()].rfind('\n').map_or(0, |i| i + 1);
        let lines = match &pattern.message_suffix {
            Some(suffix) => format!("{}; {suffix}", &text[start..]),
            None => text[start..].to_owned(),
        };
        let lines = lines.as_str();
        match &pattern.condition {
            None => events.push(NodeEvent {
                warning: true,
                reason: pattern.reason.clone(),
                note: nodeward_api::bounds::cut(lines, 512),
            }),
            Some(_) => {
                seen.last
                    .insert(pattern.reason.clone(), (now, lines.to_owned()));
                seen.condition_matches += 1;
            }
        }
    }
    events
}

/// The last `lines` messages joined with newlines as node-problem-detector joins its buffer of
/// that many: the slots not filled yet are empty lines before them.
fn buffer(recent: &std::collections::VecDeque<String>, lines: usize) -> String {
    let skip = recent.len().saturating_sub(lines);
    let empty = lines.saturating_sub(recent.len());
    let mut joined = "\n".repeat(empty);
    let filled: Vec<&str> = recent.iter().skip(skip).map(String::as_str).collect();
    joined.push_str(&filled.join("\n"));
    joined
}

/// The kernel log's findings for the condition patterns at `now`.
pub fn evaluate(patterns: &[Pattern], seen: &Mutex<Seen>, now: Instant) -> Vec<Finding> {
    evaluate_as(patterns, seen, now, &Labels::KERNEL)
}

/// What a log's findings are called.
#[derive(Clone, Debug)]
pub struct Labels {
    /// The detector (its name's first part, before `/<condition>`).
    pub detector: super::Name,
    /// Whose messages, at the start of a finding's message, e.g. `kernel`.
    pub what: super::Name,
    /// A condition's reason while no pattern matched recently.
    pub ok_reason: &'static str,
}

impl Labels {
    pub const KERNEL: Labels = Labels {
        detector: std::borrow::Cow::Borrowed(DETECTOR),
        what: std::borrow::Cow::Borrowed("kernel"),
        ok_reason: "NoKernelProblem",
    };
}

/// The findings for the condition patterns at `now`: a problem while a match is younger than
/// its `clearAfter`.
pub fn evaluate_as(
    patterns: &[Pattern],
    seen: &Mutex<Seen>,
    now: Instant,
    labels: &Labels,
) -> Vec<Finding> {
    let seen = seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut by_condition: BTreeMap<&str, Option<(&Pattern, &String)>> = BTreeMap::new();
    let mut ok: BTreeMap<&str, &(String, String)> = BTreeMap::new();
    for pattern in patterns {
        let Some(condition) = pattern.condition.as_deref() else {
            continue;
        };
        if let Some(reason) = &pattern.ok {
            ok.entry(condition).or_insert(reason);
        }
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
                labels.detector.clone(),
                condition.to_owned(),
                Status::Problem,
                &pattern.reason,
                format!(
                    "{}: {}",
                    labels.what,
                    nodeward_api::bounds::cut(message, 512)
                ),
            ),
            None => match ok.get(condition) {
                Some((reason, message)) => Finding::new(
                    labels.detector.clone(),
                    condition.to_owned(),
                    Status::Ok,
                    reason,
                    message.clone(),
                ),
                None => Finding::new(
                    labels.detector.clone(),
                    condition.to_owned(),
                    Status::Ok,
                    labels.ok_reason,
                    format!("no matching {} message recently", labels.what),
                ),
            },
        })
        .collect()
}

/// What a log reader does with each record: feeds it through the patterns and sends the
/// Events its replay lets through. Shared by the `/dev/kmsg` and the journal readers.
pub struct Reader {
    pub log: LogName,
    pub patterns: Arc<Vec<Pattern>>,
    pub seen: Arc<Mutex<Seen>>,
    pub events: mpsc::Sender<LogEvent>,
    pub replay: Replay,
    /// Moved on each condition match once caught up: wakes the condition detectors.
    pub matched: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Reader {
    /// Takes one record, numbered `sequence` and logged `since_boot` into this boot. False once
    /// the receiver of the Events is gone (the reader then stops).
    pub fn take(&self, sequence: u64, since_boot: Duration, message: &str) -> bool {
        // Judged by the record's own time (counted from boot, as CLOCK_MONOTONIC is).
        let age = time_since_boot().saturating_sub(since_boot);
        let now = Instant::now();
        let at = now.checked_sub(age).unwrap_or(now);
        let found = feed(&self.patterns, &self.seen, message, at);
        let (matches, caught_up) = {
            let seen = self
                .seen
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            (seen.condition_matches, seen.caught_up)
        };
        // Judged now rather than at the next interval (before catching up, the first
        // judgement waits for it anyway).
        if caught_up {
            self.matched
                .send_if_modified(|last| std::mem::replace(last, matches) != matches);
        }
        if !self.replay.publishes(sequence, age) {
            return true;
        }
        found.into_iter().all(|event| {
            self.events
                .blocking_send(LogEvent {
                    event,
                    log: self.log.clone(),
                    sequence,
                })
                .is_ok()
        })
    }

    /// Every record from before the start is read: conditions can be judged.
    pub fn caught_up(&self) {
        self.seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .caught_up = true;
    }
}

/// Time since boot, as the kernel log stamps its records.
fn time_since_boot() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(Duration::from)
        .unwrap_or_default()
}

/// A log followed in the background and matched against patterns: what its detectors read.
#[derive(Clone, Debug)]
pub struct MatchedLog {
    pub labels: Labels,
    pub patterns: Arc<Vec<Pattern>>,
    pub seen: Arc<Mutex<Seen>>,
    /// Moves on each condition match ([`Reader::matched`]).
    pub matched: Arc<tokio::sync::watch::Sender<u64>>,
}

impl MatchedLog {
    /// One detector per condition type the patterns set, each named `<detector>/<condition>`.
    pub fn detectors(&self, schedule: super::Schedule) -> Vec<Detector> {
        let conditions: BTreeSet<&String> = self
            .patterns
            .iter()
            .filter_map(|p| p.condition.as_ref())
            .collect();
        conditions
            .into_iter()
            .map(|condition| {
                let name = format!("{}/{condition}", self.labels.detector);
                let input = (self.clone(), condition.clone(), name.clone());
                Detector::new(
                    name,
                    condition.clone(),
                    schedule,
                    input,
                    |(log, condition, name)| async move {
                        // Judged once the records from before the start are read (the
                        // detector's timeout bounds the wait).
                        while !log.seen.lock().is_ok_and(|s| s.caught_up) {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        let labels = &log.labels;
                        let mut finding =
                            evaluate_as(&log.patterns, &log.seen, Instant::now(), labels)
                                .into_iter()
                                .find(|f| f.condition == condition.as_str())
                                .unwrap_or_else(|| {
                                    Finding::ok(
                                        labels.detector.clone(),
                                        condition,
                                        labels.ok_reason,
                                        String::new(),
                                    )
                                });
                        finding.detector = name.into();
                        finding
                    },
                )
                .woken_by(self.matched.subscribe())
            })
            .collect()
    }
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
        let readonly = |findings: Vec<Finding>| {
            findings
                .into_iter()
                .find(|f| f.condition == "ReadonlyFilesystem")
                .expect("the ReadonlyFilesystem finding")
        };
        let conditions: Vec<String> = evaluate(&p, &seen, t0)
            .iter()
            .map(|f| f.condition.to_string())
            .collect();
        assert_eq!(
            conditions,
            [
                "CperHardwareErrorFatal",
                "KernelDeadlock",
                "ReadonlyFilesystem",
                "XfsShutdown"
            ],
            "one finding per condition type"
        );
        let healthy = readonly(evaluate(&p, &seen, t0));
        assert_eq!(healthy.status, Status::Ok);
        assert_eq!(
            (healthy.reason.as_ref(), healthy.message.as_str()),
            ("FilesystemIsNotReadOnly", "Filesystem is not read-only"),
            "node-problem-detector's healthy reason and message"
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
        let during = readonly(evaluate(&p, &seen, t0 + Duration::from_secs(60)));
        during.assert_is(Status::Problem, "FilesystemIsReadOnly");
        assert!(during.message.contains("Remounting filesystem read-only"));
        let clear_after = p
            .iter()
            .find_map(|p| p.condition.as_ref().map(|_| p.clear_after))
            .expect("a condition pattern");
        let after = readonly(evaluate(&p, &seen, t0 + clear_after));
        assert_eq!(after.status, Status::Ok);
    }

    /// Real kernel messages (as printed by Linux 4.x to 6.x) and what each must give.
    const KERNEL_LINES: &[(&str, &str)] = &[
        (
            "Out of memory: Killed process 2592 (stress) total-vm:8192148kB, anon-rss:7868176kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:15420kB oom_score_adj:0",
            "OOMKilling",
        ),
        (
            "Memory cgroup out of memory: Killed process 3012 (python3) total-vm:1090420kB, anon-rss:1048900kB, file-rss:5036kB, shmem-rss:0kB, UID:1000 pgtables:2108kB oom_score_adj:985",
            "OOMKilling",
        ),
        (
            "Killed process 1733 (java) total-vm:4397296kB, anon-rss:1712400kB, file-rss:0kB",
            "OOMKilling",
        ),
        (
            "INFO: task kworker/u16:2:1234 blocked for more than 122 seconds.",
            "TaskHung",
        ),
        (
            "INFO: task jbd2/nvme0n1p1-8:456 blocked for more than 120 seconds.",
            "TaskHung",
        ),
        (
            "unregister_netdevice: waiting for eth0 to become free. Usage count = 1",
            "UnregisterNetDevice",
        ),
        (
            "unregister_netdevice: waiting for veth7a1b2c3 to become free. Usage count = -1",
            "UnregisterNetDevice",
        ),
        (
            "BUG: unable to handle kernel NULL pointer dereference at 0000000000000008",
            "KernelOops",
        ),
        (
            "BUG: kernel NULL pointer dereference, address: 0000000000000008",
            "KernelOops",
        ),
        (
            "BUG: unable to handle page fault for address: ffffc90000a7e000",
            "KernelOops",
        ),
        ("divide error: 0000 [#1] SMP PTI", "KernelOops"),
        ("Oops: 0002 [#1] PREEMPT SMP NOPTI", "KernelOops"),
        (
            "general protection fault, probably for non-canonical address 0xdead000000000122: 0000 [#1] SMP PTI",
            "KernelOops",
        ),
        (
            "EXT4-fs error (device sda1): ext4_find_entry:1455: inode #2: comm ls: reading directory lblock 0",
            "Ext4Error",
        ),
        (
            "EXT4-fs warning (device sdb1): ext4_end_bio:345: I/O error 10 writing to inode 12 starting block 8192)",
            "Ext4Warning",
        ),
        (
            "Buffer I/O error on dev sdb1, logical block 0, async page read",
            "IOError",
        ),
        (
            "blk_update_request: I/O error, dev sdb, sector 2048 op 0x1:(WRITE) flags 0x800 phys_seg 1 prio class 0",
            "IOError",
        ),
        (
            "I/O error, dev nvme1n1, sector 123456 op 0x0:(READ) flags 0x80700 phys_seg 1 prio class 2",
            "IOError",
        ),
        (
            "EDAC MC0: 1 CE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0 (channel:1 slot:0 page:0x2f4d63 offset:0x0 grain:32 syndrome:0x0 - area:DRAM err_code:0001:0091 socket:0 ha:0 channel_mask:2 rank:0)",
            "MemoryReadError",
        ),
        // ghes_edac/cper as a corrected, a recoverable and a fatal error print their severity.
        (
            "{1}[Hardware Error]: event severity: corrected",
            "CperHardwareErrorCorrected",
        ),
        (
            "{2}[Hardware Error]: event severity: recoverable",
            "CperHardwareErrorRecoverable",
        ),
        (
            "{3}[Hardware Error]: event severity: fatal",
            "CperHardwareErrorFatal",
        ),
        (
            "XFS (dm-0): Corruption of in-memory data detected.  Shutting down filesystem",
            "XfsHasShutdown",
        ),
        (
            "XFS (sdb1): Log I/O Error Detected. Shutting down filesystem",
            "XfsHasShutdown",
        ),
        (
            "XFS (sda1): Filesystem has been shut down due to log error (0x2).",
            "XfsHasShutdown",
        ),
        (
            "INFO: task dockerd:1873 blocked for more than 120 seconds.",
            "DockerHung",
        ),
        (
            "INFO: task containerd:2123 blocked for more than 120 seconds.",
            "ContainerdHung",
        ),
        (
            "EXT4-fs (sda1): Remounting filesystem read-only",
            "FilesystemIsReadOnly",
        ),
    ];

    #[test]
    fn the_default_rules_match_real_kernel_messages_and_nothing_of_a_healthy_boot() {
        let p = patterns();
        for (line, reason) in KERNEL_LINES {
            let matched: Vec<&str> = p
                .iter()
                .filter(|p| p.regex.is_match(line))
                .map(|p| p.reason.as_str())
                .collect();
            assert!(
                matched.contains(reason),
                "{line}: {matched:?}, want {reason}"
            );
        }
        // Every default rule is exercised by a real line.
        for pattern in &p {
            assert!(
                KERNEL_LINES.iter().any(|(_, r)| *r == pattern.reason),
                "no real line for {}",
                pattern.reason
            );
        }
        let healthy = [
            "Linux version 6.1.0-28-cloud-amd64 (debian-kernel@lists.debian.org)",
            "EXT4-fs (vda): mounted filesystem 1e0c3c4a with ordered data mode. Quota mode: none.",
            "EXT4-fs (vda): re-mounted 1e0c3c4a. Quota mode: none.",
            "XFS (sdb1): Mounting V5 Filesystem",
            "systemd[1]: Started containerd.service - containerd container runtime.",
            "virtio_net virtio0 enp0s2: renamed from eth0",
            "IPv6: ADDRCONF(NETDEV_CHANGE): veth1234: link becomes ready",
        ];
        for line in healthy {
            let matched: Vec<&str> = p
                .iter()
                .filter(|p| p.regex.is_match(line))
                .map(|p| p.reason.as_str())
                .collect();
            assert!(matched.is_empty(), "{line}: {matched:?}");
        }
        // The runtime's hung task is both an Event and the KernelDeadlock condition.
        let seen = Mutex::new(Seen::default());
        let now = Instant::now();
        let events = feed(
            &p,
            &seen,
            "INFO: task containerd:2123 blocked for more than 120 seconds.",
            now,
        );
        assert_eq!(
            events.iter().map(|e| e.reason.as_str()).collect::<Vec<_>>(),
            ["TaskHung"]
        );
        let deadlock = evaluate(&p, &seen, now)
            .into_iter()
            .find(|f| f.condition == "KernelDeadlock")
            .expect("KernelDeadlock");
        deadlock.assert_is(Status::Problem, "ContainerdHung");
    }

    #[test]
    fn records_carry_their_sequence_and_time_since_boot() {
        assert_eq!(
            record_of("3,1093,84012345,-;EXT4-fs error (device sda1): bad\n SUBSYSTEM=block\n"),
            Some(Record {
                sequence: 1093,
                since_boot: Duration::from_micros(84_012_345),
                message: "EXT4-fs error (device sda1): bad",
            })
        );
        assert_eq!(record_of("3,x,1,-;message"), None);
    }

    #[test]
    fn a_restarted_agent_publishes_only_records_after_the_last_one_it_published() {
        let known = Replay {
            published: Some(1093),
            lookback: Duration::from_secs(300),
        };
        assert!(
            !known.publishes(1093, Duration::ZERO),
            "the same record again"
        );
        assert!(!known.publishes(12, Duration::ZERO));
        assert!(
            known.publishes(1094, Duration::from_secs(3600)),
            "newer, however old"
        );
        // The first start on a boot: only what is within the lookback.
        let fresh = Replay {
            published: None,
            lookback: Duration::from_secs(300),
        };
        assert!(fresh.publishes(5, Duration::from_secs(299)));
        assert!(!fresh.publishes(5, Duration::from_secs(301)));
    }

    #[test]
    fn an_old_remount_read_back_at_start_sets_the_condition_only_within_its_clear_after() {
        let p = patterns();
        let now = Instant::now();
        let recent = Mutex::new(Seen::default());
        feed(
            &p,
            &recent,
            "EXT4-fs (sda1): Remounting filesystem read-only",
            now - Duration::from_secs(600),
        );
        let f = evaluate(&p, &recent, now);
        f.iter()
            .find(|f| f.condition == "ReadonlyFilesystem")
            .expect("condition")
            .assert_is(Status::Problem, "FilesystemIsReadOnly");
        let old = Mutex::new(Seen::default());
        feed(
            &p,
            &old,
            "EXT4-fs (sda1): Remounting filesystem read-only",
            now - Duration::from_secs(7200),
        );
        let f = evaluate(&p, &old, now);
        assert_eq!(
            f.iter()
                .find(|f| f.condition == "ReadonlyFilesystem")
                .map(|f| f.status),
            Some(Status::Ok),
            "older than clearAfter (1h)"
        );
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

    #[test]
    fn journal_directories_are_named_absolute_and_few() {
        let place = "detectors.kernelLog";
        let with = |source, dirs: &[&str]| KernelLogConfig {
            source,
            journal_directories: dirs.iter().map(PathBuf::from).collect(),
            ..KernelLogConfig::default()
        };
        let none = with(SourceSetting::Journal, &[]).validate(place);
        assert!(
            none.as_ref().is_err_and(
                |e| e.starts_with("detectors.kernelLog.journalDirectories: name at least one")
            ),
            "{none:?}"
        );
        let relative = with(SourceSetting::Auto, &["var/log/journal"]).validate(place);
        assert!(
            relative
                .as_ref()
                .is_err_and(|e| e.contains("relative; name an absolute directory")),
            "{relative:?}"
        );
        let many = vec!["/var/log/journal"; JOURNAL_DIRECTORIES_LIMIT + 1];
        assert!(with(SourceSetting::Journal, &many).validate(place).is_err());
        // /dev/kmsg needs none.
        with(SourceSetting::Kmsg, &[])
            .validate(place)
            .expect("kmsg without journal directories");
        with(SourceSetting::Journal, &["/host/var/log/journal"])
            .validate(place)
            .expect("one absolute directory");
    }

    #[test]
    fn an_unknown_source_is_refused_naming_the_choices() {
        let err = serde_yaml::from_str::<KernelLogConfig>("source: dmesg")
            .expect_err("an unknown source");
        assert!(
            err.to_string()
                .contains("expected one of `auto`, `kmsg`, `journal`"),
            "{err}"
        );
    }
}
