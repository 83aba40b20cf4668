//! The logs an agent follows in the background, matched against patterns: the kernel log
//! (`detectors.kernelLog`, from the journal or `/dev/kmsg`) and the journal monitors
//! (`detectors.journal`). Each continues, for its Events, from the place the NodeReport keeps.

use std::{collections::BTreeMap, sync::Arc};

use nodeward_api::report::KernelLogSource;
use tokio::sync::mpsc;

use crate::{
    config::Config,
    detect::kernel_log::{
        self, Labels, LogEvent, LogName, MatchedLog, Reader, Replay,
        journal::{self, Records},
    },
};

/// This node's agent on this boot.
pub struct Node<'a> {
    pub name: &'a str,
    /// The boot id as `/proc/sys/kernel/random/boot_id` has it, if known.
    pub boot_id: Option<&'a str>,
}

/// The logs followed, and where their Events stand (for the reporter).
pub struct Followed {
    pub kernel: Option<MatchedLog>,
    pub journal: Vec<MatchedLog>,
    pub source: KernelLogSource,
    pub published: BTreeMap<LogName, u64>,
}

/// Starts following this node's logs from where its NodeReport says their Events stand.
pub async fn start(
    config: &Config,
    client: &kube::Client,
    node: &Node<'_>,
    events: &mpsc::Sender<LogEvent>,
) -> Followed {
    let follows_any = config.detectors.kernel_log.enabled
        || (config.detectors.journal.enabled && !config.detectors.journal.monitors.is_empty());
    // No log followed: nothing to read from the NodeReport (no request at start).
    let (source, published) = if follows_any {
        published(config, client, node).await
    } else {
        (
            journal::source(&config.detectors.kernel_log),
            BTreeMap::new(),
        )
    };
    let (kernel, journal) = follow(config, node, source, events, &published);
    Followed {
        kernel,
        journal,
        source,
        published,
    }
}

/// Where the kernel log is read, and per log the place of the last record this node's agent
/// published from it as an Event on this boot, as its NodeReport records it. None on a new
/// boot, after a change of the kernel log's source, or when the report cannot be read: then
/// the lookbacks apply, and an Event within one may be published again.
async fn published(
    config: &Config,
    client: &kube::Client,
    node: &Node<'_>,
) -> (KernelLogSource, BTreeMap<LogName, u64>) {
    let source = journal::source(&config.detectors.kernel_log);
    let mut places = BTreeMap::new();
    let reports: kube::Api<nodeward_api::NodeReport> = kube::Api::all(client.clone());
    let status = match reports.get_opt(node.name).await {
        Ok(report) => report.and_then(|r| r.status),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read this node's NodeReport for the logs' positions; Events within the lookback may repeat");
            None
        }
    };
    let Some(status) = status else {
        return (source, places);
    };
    let this_boot = |boot_id: &str| Some(boot_id) == node.boot_id;
    if let Some(position) = status.kernel_log
        && this_boot(&position.boot_id)
        && position.source == source
        && let Ok(place) = u64::try_from(position.sequence)
    {
        places.insert(LogName::Kernel, place);
    }
    for position in status.journal_log {
        if this_boot(&position.boot_id)
            && let Ok(place) = u64::try_from(position.sequence)
        {
            places.insert(LogName::Journal(position.identifier), place);
        }
    }
    (source, places)
}

/// Starts following the kernel log (from `source`) and every journal monitor, each sending
/// its Events to `events`; returns those that could be read (the others say why in the log).
fn follow(
    config: &Config,
    node: &Node<'_>,
    source: KernelLogSource,
    events: &mpsc::Sender<LogEvent>,
    places: &BTreeMap<LogName, u64>,
) -> (Option<MatchedLog>, Vec<MatchedLog>) {
    let kernel = config.detectors.kernel_log.enabled.then(|| {
        let settings = &config.detectors.kernel_log;
        let log = matched(
            Labels::KERNEL,
            kernel_log::compile(settings),
            LogName::Kernel,
        )?;
        let reader = reader(&log, LogName::Kernel, events, places, settings.lookback);
        let followed = match source {
            KernelLogSource::Kmsg => kernel_log::follow(settings.device.clone(), reader)
                .map_err(|e| format!("reading {}: {e}", settings.device.display())),
            KernelLogSource::Journal => node.boot_id.ok_or_else(unknown_boot).and_then(|boot| {
                journal::follow(&settings.journal_directories, boot, Records::Kernel, reader)
            }),
        };
        started(log, followed, &format!("the kernel log ({source:?})"))
    });
    let settings = &config.detectors.journal;
    let monitors = settings
        .monitors
        .iter()
        .filter(|_| settings.enabled)
        .filter_map(|monitor| {
            let name = LogName::Journal(monitor.identifier.clone());
            let place = format!(
                "detectors.journal.monitors[{}].patterns",
                monitor.identifier
            );
            let log = matched(
                monitor.labels(),
                kernel_log::compile_patterns(&place, &monitor.patterns),
                name.clone(),
            )?;
            let reader = reader(&log, name, events, places, monitor.lookback);
            let records = Records::Identifier(monitor.identifier.clone());
            let followed = node
                .boot_id
                .ok_or_else(unknown_boot)
                .and_then(|boot| journal::follow(&settings.directories, boot, records, reader));
            started(
                log,
                followed,
                &format!("the journal of {}", monitor.identifier),
            )
        })
        .collect();
    (kernel.flatten(), monitors)
}

fn matched(
    labels: Labels,
    patterns: Result<Vec<kernel_log::Pattern>, String>,
    name: LogName,
) -> Option<MatchedLog> {
    // The configuration was validated, so the patterns compile; an error here would be a bug.
    match patterns {
        Ok(patterns) => Some(MatchedLog {
            labels,
            patterns: Arc::new(patterns),
            seen: Arc::default(),
        }),
        Err(e) => {
            tracing::error!(error = %e, log = ?name, "patterns did not compile; the log is not followed");
            None
        }
    }
}

fn reader(
    log: &MatchedLog,
    name: LogName,
    events: &mpsc::Sender<LogEvent>,
    places: &BTreeMap<LogName, u64>,
    lookback: std::time::Duration,
) -> Reader {
    Reader {
        replay: Replay {
            published: places.get(&name).copied(),
            lookback,
        },
        log: name,
        patterns: log.patterns.clone(),
        seen: log.seen.clone(),
        events: events.clone(),
    }
}

fn unknown_boot() -> String {
    "the journal is read for this boot, and its boot id is unknown (set --boot-id-file)".to_owned()
}

fn started(log: MatchedLog, followed: Result<(), String>, what: &str) -> Option<MatchedLog> {
    match followed {
        Ok(()) => {
            tracing::info!("following {what}");
            Some(log)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read {what}; its patterns are off");
            None
        }
    }
}
