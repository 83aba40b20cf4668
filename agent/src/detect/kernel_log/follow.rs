//! Following a log (the kernel log, `detectors.kernelLog`, and the journal monitors,
//! `detectors.journal`, each started by its section): each continues, for its
//! Events, from the place the NodeReport keeps, and a log that cannot be read turns its
//! patterns off and says why.

use std::{sync::Arc, time::Duration};

use nodeward_api::report::KernelLogSource;

use super::{Labels, LogName, MatchedLog, Pattern, Reader, Replay};
use crate::detect::On;

/// The place of the last record of `log` (read from `source`) the agent before this one
/// published as an Event on this boot, as its NodeReport records it. None on a new boot,
/// after a change of the kernel log's source, or when the report cannot be read: then the
/// lookbacks apply, and an Event within one may be published again.
pub async fn published(on: &On<'_>, log: &LogName, source: KernelLogSource) -> Option<u64> {
    let status = on.last_report().await?;
    let sequence = match log {
        LogName::Kernel => status
            .kernel_log
            .as_ref()
            .filter(|p| on.this_boot(&p.boot_id) && p.source == source)
            .map(|p| p.sequence),
        LogName::Journal(identifier) => status
            .journal_log
            .iter()
            .find(|p| &p.identifier == identifier && on.this_boot(&p.boot_id))
            .map(|p| p.sequence),
    }?;
    u64::try_from(sequence).ok()
}

/// A log to follow: what its findings are called, its patterns, and how far back it replays.
pub struct Follow {
    pub name: LogName,
    pub labels: Labels,
    pub patterns: Result<Vec<Pattern>, String>,
    pub lookback: Duration,
    /// The place of its last record published as an Event ([`published`]).
    pub published: Option<u64>,
    /// Says what is read, for the log: "the kernel log (Journal)".
    pub what: String,
}

impl Follow {
    /// Starts it with `follow` (which spawns the reader of the log); its detectors' log, or
    /// None when it cannot be read (said in the log).
    pub fn start(
        self,
        on: &On<'_>,
        follow: impl FnOnce(Reader) -> Result<(), String>,
    ) -> Option<MatchedLog> {
        // The configuration was validated, so the patterns compile; an error here is a bug.
        let patterns = match self.patterns {
            Ok(patterns) => patterns,
            Err(e) => {
                tracing::error!(error = %e, log = ?self.name, "patterns did not compile; the log is not followed");
                return None;
            }
        };
        let log = MatchedLog {
            labels: self.labels,
            patterns: Arc::new(patterns),
            seen: Arc::default(),
            matched: Arc::new(tokio::sync::watch::Sender::new(0)),
        };
        let reader = Reader {
            replay: Replay {
                published: self.published,
                lookback: self.lookback,
            },
            log: self.name,
            patterns: log.patterns.clone(),
            seen: log.seen.clone(),
            events: on.log_events.clone(),
            matched: log.matched.clone(),
        };
        match follow(reader) {
            Ok(()) => {
                tracing::info!("following {}", self.what);
                Some(log)
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read {}; its patterns are off", self.what);
                None
            }
        }
    }
}

/// This boot's id, which the journal is read for.
pub fn this_boot<'a>(on: &On<'a>) -> Result<&'a str, String> {
    on.boot_id.ok_or_else(|| {
        "the journal is read for this boot, and its boot id is unknown (set --boot-id-file)"
            .to_owned()
    })
}
