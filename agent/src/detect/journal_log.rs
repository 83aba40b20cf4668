//! The journal messages of named programs (node-problem-detector's journald monitors, e.g.
//! systemd's "Started Kubernetes kubelet."), read from systemd-journald's files and matched
//! as the kernel log is: a match is an Event, or sets a condition until its `clearAfter`. Each
//! record becomes an Event once across agent restarts (the NodeReport keeps each monitor's
//! place, `status.journalLog`).

use std::{collections::BTreeSet, path::PathBuf, time::Duration};

use nodeward_api::report::{JOURNAL_MONITORS_LIMIT, KernelLogSource};
use serde::Deserialize;

use super::{
    AgentContext, Background, Detector, ForReports, On, Section, Starting,
    kernel_log::{
        self, KernelPatternConfig, Labels, LogName, follow,
        journal::{self, Records},
    },
};

/// The detector names' first part: `journal/<identifier>/<condition>`.
pub const DETECTOR: &str = "journal";

/// Detector names are at most this long (the NodeReport's bound).
const DETECTOR_NAME_LIMIT: usize = 63;

super::section! {
    pub struct JournalLogConfig {
        /// systemd-journald's directories, each holding journal files directly or in
        /// machine-id subdirectories.
        pub directories: Vec<PathBuf>,
        /// One per program whose messages are matched.
        pub monitors: Vec<JournalMonitorConfig>,
    }
}

/// The messages of one program, and what is matched against them.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JournalMonitorConfig {
    /// The program's `SYSLOG_IDENTIFIER`, e.g. `systemd`.
    pub identifier: String,
    /// How far back, at the agent's first start on a boot, records still become Events.
    #[serde(
        default = "default_lookback",
        deserialize_with = "crate::values::duration"
    )]
    pub lookback: Duration,
    pub patterns: Vec<KernelPatternConfig>,
}

fn default_lookback() -> Duration {
    Duration::from_secs(300)
}

impl Default for JournalLogConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            hold: Duration::ZERO,
            directories: kernel_log::default_journal_directories(),
            monitors: Vec::new(),
        }
    }
}

impl JournalMonitorConfig {
    /// What its findings are called.
    pub fn labels(&self) -> Labels {
        Labels {
            detector: format!("{DETECTOR}/{}", self.identifier).into(),
            what: self.identifier.clone().into(),
            ok_reason: "NoJournalProblem",
        }
    }
}

impl Section for JournalLogConfig {
    fn validate(&self, place: &str) -> Result<(), String> {
        self.schedule().validate(place)?;
        if self.monitors.is_empty() {
            return Ok(());
        }
        kernel_log::validate_journal_directories(
            &format!("{place}.directories"),
            &self.directories,
        )?;
        if self.monitors.len() > JOURNAL_MONITORS_LIMIT {
            return Err(format!(
                "{place}.monitors: at most {JOURNAL_MONITORS_LIMIT}; put a program's patterns in one monitor"
            ));
        }
        let mut identifiers = BTreeSet::new();
        for (index, monitor) in self.monitors.iter().enumerate() {
            let place = format!("{place}.monitors[{index}]");
            let identifier = &monitor.identifier;
            if identifier.is_empty()
                || identifier.len() > 32
                || identifier.contains(['=', '/', '\n'])
            {
                return Err(format!(
                    "{place}.identifier: {identifier:?} is not a program's SYSLOG_IDENTIFIER (1 to 32 characters, no '=', '/' or newline), e.g. systemd"
                ));
            }
            if !identifiers.insert(identifier) {
                return Err(format!(
                    "{place}.identifier: {identifier:?} has a monitor already; put its patterns there"
                ));
            }
            kernel_log::compile_patterns(&format!("{place}.patterns"), &monitor.patterns)?;
            kernel_log::validate_patterns(&format!("{place}.patterns"), &monitor.patterns)?;
            for (i, pattern) in monitor.patterns.iter().enumerate() {
                let Some(condition) = &pattern.condition else {
                    continue;
                };
                let name = format!("{DETECTOR}/{identifier}/{condition}");
                if name.len() > DETECTOR_NAME_LIMIT {
                    return Err(format!(
                        "{place}.patterns[{i}].condition: its detector name {name:?} is longer than {DETECTOR_NAME_LIMIT} characters; shorten the condition type"
                    ));
                }
            }
        }
        Ok(())
    }

    /// One detector per monitor and condition type its patterns set; none without an agent
    /// (the journal is followed from the agent's start).
    fn detectors(&self, agent: Option<&AgentContext>) -> Vec<Detector> {
        agent
            .and_then(AgentContext::started::<FollowedJournal>)
            .map(|logs| {
                logs.0
                    .iter()
                    .flat_map(|log| log.detectors(self.schedule()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Follows each monitor's program in the journal from where the NodeReport says its
    /// Events stand; the NodeReport carries those places.
    fn start<'a>(&'a self, on: &'a On<'a>, _: &'a mut tokio::task::JoinSet<()>) -> Starting<'a> {
        Box::pin(async move {
            let mut for_reports = ForReports::default();
            let mut followed = Vec::new();
            for monitor in self.monitors.iter().filter(|_| self.enabled) {
                let name = LogName::Journal(monitor.identifier.clone());
                // A journal place does not depend on the kernel log's source.
                let published = follow::published(on, &name, KernelLogSource::Journal).await;
                for_reports
                    .published
                    .extend(published.map(|p| (name.clone(), p)));
                let place = format!(
                    "detectors.journal.monitors[{}].patterns",
                    monitor.identifier
                );
                let follow = follow::Follow {
                    name,
                    labels: monitor.labels(),
                    patterns: kernel_log::compile_patterns(&place, &monitor.patterns),
                    lookback: monitor.lookback,
                    published,
                    what: format!("the journal of {}", monitor.identifier),
                };
                let records = Records::Identifier(monitor.identifier.clone());
                followed.extend(follow.start(on, |reader| {
                    follow::this_boot(on)
                        .and_then(|boot| journal::follow(&self.directories, boot, records, reader))
                }));
            }
            let background = Background {
                context: None,
                for_reports,
            };
            Ok(if followed.is_empty() {
                background
            } else {
                background.with_context(FollowedJournal(followed))
            })
        })
    }
}

/// The journal monitors followed: what their detectors read.
pub struct FollowedJournal(pub Vec<kernel_log::MatchedLog>);

#[cfg(test)]
mod tests {
    use super::*;

    fn monitor(identifier: &str, condition: Option<&str>) -> JournalMonitorConfig {
        JournalMonitorConfig {
            identifier: identifier.into(),
            lookback: default_lookback(),
            patterns: vec![KernelPatternConfig::new(
                "KubeletStart",
                "Started Kubernetes kubelet",
                condition,
            )],
        }
    }

    fn validate(monitors: Vec<JournalMonitorConfig>) -> Result<(), String> {
        JournalLogConfig {
            monitors,
            ..JournalLogConfig::default()
        }
        .validate("detectors.journal")
    }

    #[test]
    fn monitors_are_checked_naming_the_field() {
        validate(vec![monitor("systemd", None)]).expect("a plain monitor");
        let bad_identifier = validate(vec![monitor("a=b", None)]).expect_err("refused");
        assert!(
            bad_identifier.starts_with("detectors.journal.monitors[0].identifier:"),
            "{bad_identifier}"
        );
        let twice = validate(vec![monitor("systemd", None), monitor("systemd", None)])
            .expect_err("refused");
        assert!(twice.contains("has a monitor already"), "{twice}");
        let mut bad_regex = monitor("systemd", None);
        bad_regex.patterns[0].regex = "([".into();
        let bad_regex = validate(vec![bad_regex]).expect_err("refused");
        assert!(
            bad_regex.starts_with("detectors.journal.monitors[0].patterns[0].regex:"),
            "{bad_regex}"
        );
        let long = "VeryLongConditionTypeThatMakesTheDetectorNameTooLong";
        let too_long = validate(vec![monitor("systemd", Some(long))]).expect_err("refused");
        assert!(
            too_long.contains("shorten the condition type"),
            "{too_long}"
        );
        let many = (0..=JOURNAL_MONITORS_LIMIT)
            .map(|i| monitor(&format!("p{i}"), None))
            .collect();
        assert!(validate(many).expect_err("too many").contains("at most"));
    }

    #[test]
    fn findings_are_named_for_the_program() {
        let labels = monitor("systemd", None).labels();
        assert_eq!(labels.detector, "journal/systemd");
        assert_eq!(labels.what, "systemd");
    }
}
