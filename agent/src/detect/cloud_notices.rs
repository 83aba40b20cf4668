//! Cloud notices: what the EC2-compatible instance metadata service announces about this
//! instance. A spot interruption notice (`spot/instance-action`: the instance is stopped,
//! hibernated or terminated at its time), the scheduled events (`events/maintenance/scheduled`:
//! a reboot, stop or retirement from its `NotBefore`), and a rebalance recommendation
//! (`events/recommendations/rebalance`). The finding says what is announced; with
//! `maintenance` on, the agent asks for a `DrainOnly` maintenance with the notice's time as its
//! `disruptionDeadline` (see [`due`] and `maintenance::cloud_request`), which the coordinator
//! admits at once.

use std::time::Duration;

use hyper::StatusCode;
use jiff::{Timestamp, tz::TimeZone};
use nodeward_api::{MaintenanceReason, conditions::node::CLOUD_DISRUPTION_SCHEDULED};
use serde::Deserialize;

use super::{
    AgentContext, Detector, Finding, Section,
    imds::{Answer, Session},
};
use crate::flags::{self, Flag};

super::section! {
    pub struct CloudNoticesConfig {
        /// Base URL of the EC2-compatible instance metadata service.
        #[serde(rename = "metadataURL")]
        pub metadata_url: String,
        /// Ask for a maintenance (drain ahead of the cloud) for a notice that takes the node
        /// down; off: only the finding.
        pub maintenance: bool,
        /// How long before a scheduled event's earliest start its node is drained.
        #[serde(deserialize_with = "crate::values::duration")]
        pub drain_ahead: Duration,
    }
}

impl Default for CloudNoticesConfig {
    fn default() -> Self {
        Self {
            // Off by default: off a cloud, every run would find no metadata service.
            enabled: false,
            metadata_url: "http://169.254.169.254".to_owned(),
            maintenance: true,
            drain_ahead: Duration::from_secs(3600),
            // A spot interruption gives two minutes.
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(4),
            hold: Duration::ZERO,
        }
    }
}

/// The longest `drainAhead`: scheduled events come up to weeks ahead, and a node drained for
/// longer than this ahead of one is a node wasted.
const DRAIN_AHEAD_MAX: Duration = Duration::from_secs(7 * 24 * 3600);

impl Section for CloudNoticesConfig {
    fn validate(&self, place: &str) -> Result<(), String> {
        self.schedule().validate(place)?;
        crate::values::http_url(&format!("{place}.metadataURL"), &self.metadata_url)?;
        if self.drain_ahead > DRAIN_AHEAD_MAX {
            return Err(format!(
                "{place}.drainAhead: at most 168h (a week), e.g. 1h; a node drained longer ahead of a scheduled event is wasted"
            ));
        }
        Ok(())
    }

    fn detectors(&self, _: Option<&AgentContext>) -> Vec<Detector> {
        self.detector(DETECTOR, CLOUD_DISRUPTION_SCHEDULED, |c| async move {
            match read(&c).await {
                Ok(notices) => evaluate(&notices),
                Err(unread) => unread,
            }
        })
    }

    fn flags(&self) -> Vec<Flag> {
        flags::declare! {
            "cloud-notices" ("NODEWARD_CLOUD_NOTICES") => "enabled": Scalar, "true: watch the instance metadata service for spot interruptions, scheduled events and rebalance recommendations";
            "cloud-notices-metadata-url" ("NODEWARD_CLOUD_NOTICES_METADATA_URL") => "metadataURL": Text, "Instance metadata service base URL for cloud notices";
            "cloud-notices-drain-ahead" ("NODEWARD_CLOUD_NOTICES_DRAIN_AHEAD") => "drainAhead": Text, "How long before a scheduled event the node is drained, e.g. 1h";
        }
    }
}

pub const DETECTOR: &str = "cloud-notices";
pub const SPOT_PATH: &str = "/latest/meta-data/spot/instance-action";
pub const SCHEDULED_PATH: &str = "/latest/meta-data/events/maintenance/scheduled";
pub const REBALANCE_PATH: &str = "/latest/meta-data/events/recommendations/rebalance";

/// The largest reply read as a notice: the real ones are a few hundred bytes.
pub const REPLY_LIMIT: usize = 64 * 1024;
/// The most scheduled events read from one reply.
pub const EVENTS_LIMIT: usize = 32;

/// The spot interruption notice: the instance is `action`ed (`terminate`, `stop`,
/// `hibernate`) at `at`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spot {
    pub action: String,
    pub at: Timestamp,
}

/// One active scheduled event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scheduled {
    pub id: String,
    /// `instance-reboot`, `system-reboot`, `instance-stop`, `instance-retirement`,
    /// `system-maintenance`.
    pub code: String,
    pub not_before: Timestamp,
    pub not_after: Option<Timestamp>,
}

impl Scheduled {
    /// The maintenance reason of an event that takes the instance down; none for one that
    /// does not (`system-maintenance`: the host's network or power, with the instance up).
    pub fn takes_down(&self) -> Option<MaintenanceReason> {
        match self.code.as_str() {
            "instance-reboot" | "system-reboot" => Some(MaintenanceReason::Reboot),
            "instance-stop" | "instance-retirement" => Some(MaintenanceReason::Shutdown),
            _ => None,
        }
    }
}

/// What the metadata service announces.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Notices {
    pub spot: Option<Spot>,
    /// Active events only (not `completed` or `canceled`), soonest first.
    pub scheduled: Vec<Scheduled>,
    /// When the rebalance recommendation was made.
    pub rebalance: Option<Timestamp>,
}

/// Reads the three notices; a service that cannot be read or answers what is not a notice is
/// the Unknown finding that says so.
pub async fn read(config: &CloudNoticesConfig) -> Result<Notices, Finding> {
    let session = Session::open(&config.metadata_url).await;
    let mut notices = Notices::default();
    if let Some(body) = body(&session, SPOT_PATH).await? {
        notices.spot = Some(parse_spot(&body).map_err(|e| malformed(&session, SPOT_PATH, &e))?);
    }
    if let Some(body) = body(&session, SCHEDULED_PATH).await? {
        notices.scheduled =
            parse_scheduled(&body).map_err(|e| malformed(&session, SCHEDULED_PATH, &e))?;
    }
    if let Some(body) = body(&session, REBALANCE_PATH).await? {
        notices.rebalance =
            Some(parse_rebalance(&body).map_err(|e| malformed(&session, REBALANCE_PATH, &e))?);
    }
    Ok(notices)
}

/// A path's body; none when the service has no such notice (404).
async fn body(session: &Session, path: &str) -> Result<Option<bytes::Bytes>, Finding> {
    match session.get(path).await {
        Answer::Failed(e) => Err(unknown(
            "MetadataUnreachable",
            format!("cannot reach the instance metadata service: {e}"),
        )),
        Answer::Reply { status, .. } if status == StatusCode::NOT_FOUND => Ok(None),
        Answer::Reply { status, body } if status == StatusCode::OK => Ok(Some(body)),
        Answer::Reply { status, .. } => Err(unknown(
            "MetadataError",
            format!("GET {} answered {status}", session.url(path)),
        )),
    }
}

fn unknown(reason: &str, message: String) -> Finding {
    Finding::unknown(DETECTOR, CLOUD_DISRUPTION_SCHEDULED, reason, message)
}

fn malformed(session: &Session, path: &str, why: &str) -> Finding {
    unknown(
        "MetadataMalformed",
        format!(
            "GET {}: not a notice, so nothing is drained for it: {why}",
            session.url(path)
        ),
    )
}

/// The reply as JSON of type `T`, within [`REPLY_LIMIT`].
fn json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, String> {
    if body.len() > REPLY_LIMIT {
        return Err(format!(
            "the reply has {} bytes, more than the {REPLY_LIMIT} a notice may have",
            body.len()
        ));
    }
    serde_json::from_slice(body).map_err(|e| format!("not the JSON of a notice: {e}"))
}

/// A short name from the service (an action, a code, an id): bounded and plain.
fn plain<'a>(field: &str, value: &'a str) -> Result<&'a str, String> {
    let ok = !value.is_empty()
        && value.len() <= 64
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(value)
    } else {
        Err(format!(
            "{field} {:?} is not a plain name of at most 64 characters",
            nodeward_api::bounds::cut(value, 70)
        ))
    }
}

fn rfc3339(field: &str, value: &str) -> Result<Timestamp, String> {
    value
        .parse()
        .map_err(|e| format!("{field} {value:?} is not an RFC 3339 time: {e}"))
}

/// `spot/instance-action`: `{"action": "terminate", "time": "2026-11-29T08:22:00Z"}`.
pub fn parse_spot(body: &[u8]) -> Result<Spot, String> {
    #[derive(Deserialize)]
    struct Raw {
        action: String,
        time: String,
    }
    let raw: Raw = json(body)?;
    Ok(Spot {
        action: plain("action", &raw.action)?.to_owned(),
        at: rfc3339("time", &raw.time)?,
    })
}

/// `events/recommendations/rebalance`: `{"noticeTime": "2026-11-29T08:17:00Z"}`.
pub fn parse_rebalance(body: &[u8]) -> Result<Timestamp, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Raw {
        notice_time: String,
    }
    let raw: Raw = json(body)?;
    rfc3339("noticeTime", &raw.notice_time)
}

/// `events/maintenance/scheduled`: a list of events, with times as `21 Jan 2026 09:00:43 GMT`.
/// Completed and canceled events are left out; the rest come soonest first.
pub fn parse_scheduled(body: &[u8]) -> Result<Vec<Scheduled>, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Raw {
        code: String,
        event_id: String,
        state: String,
        not_before: String,
        #[serde(default)]
        not_after: String,
    }
    let raw: Vec<Raw> = json(body)?;
    if raw.len() > EVENTS_LIMIT {
        return Err(format!(
            "{} events, more than the {EVENTS_LIMIT} read",
            raw.len()
        ));
    }
    let mut events = Vec::new();
    for (index, event) in raw.iter().enumerate() {
        let place = |e: String| format!("event {index}: {e}");
        let state = plain("State", &event.state).map_err(place)?;
        if !state.eq_ignore_ascii_case("active") {
            continue;
        }
        events.push(Scheduled {
            id: plain("EventId", &event.event_id).map_err(place)?.to_owned(),
            code: plain("Code", &event.code).map_err(place)?.to_owned(),
            not_before: event_time("NotBefore", &event.not_before).map_err(place)?,
            not_after: match event.not_after.trim() {
                "" => None,
                after => Some(event_time("NotAfter", after).map_err(place)?),
            },
        });
    }
    events.sort_by_key(|e| e.not_before);
    Ok(events)
}

/// A scheduled event's time, `21 Jan 2026 09:00:43 GMT`.
fn event_time(field: &str, value: &str) -> Result<Timestamp, String> {
    let wrong = |e: jiff::Error| {
        format!("{field} {value:?} is not a time like \"21 Jan 2026 09:00:43 GMT\": {e}")
    };
    if value.len() > 40 {
        return Err(format!("{field} is longer than a time"));
    }
    let parsed = jiff::fmt::strtime::parse("%d %b %Y %H:%M:%S GMT", value.trim()).map_err(wrong)?;
    let at = parsed.to_datetime().map_err(wrong)?;
    Ok(at.to_zoned(TimeZone::UTC).map_err(wrong)?.timestamp())
}

/// The finding: what the cloud announces, the notice that takes the node down first.
pub fn evaluate(notices: &Notices) -> Finding {
    let mut said = Vec::new();
    let mut reason = None;
    if let Some(spot) = &notices.spot {
        said.push(format!(
            "spot interruption: the instance is {} at {}",
            past(&spot.action),
            spot.at
        ));
        reason.get_or_insert("SpotInterruption");
    }
    for event in &notices.scheduled {
        let until = event
            .not_after
            .map(|t| format!(" and {t}"))
            .unwrap_or_default();
        said.push(format!(
            "scheduled event {} ({}) between {}{until}",
            event.code, event.id, event.not_before
        ));
        reason.get_or_insert(if event.takes_down().is_some() {
            "ScheduledEvent"
        } else {
            "ScheduledMaintenance"
        });
    }
    if let Some(at) = notices.rebalance {
        said.push(format!("rebalance recommended at {at}"));
        reason.get_or_insert("RebalanceRecommended");
    }
    match reason {
        None => Finding::ok(
            DETECTOR,
            CLOUD_DISRUPTION_SCHEDULED,
            "NoNotice",
            "no spot interruption, scheduled event or rebalance recommendation".to_owned(),
        ),
        Some(reason) => Finding::problem(
            DETECTOR,
            CLOUD_DISRUPTION_SCHEDULED,
            reason,
            said.join("; "),
        ),
    }
}

fn past(action: &str) -> String {
    match action {
        "stop" => "stopped".to_owned(),
        "terminate" => "terminated".to_owned(),
        "hibernate" => "hibernated".to_owned(),
        other => format!("{other}ed"),
    }
}

/// A notice that takes the node down, due to be drained for now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Due {
    /// What names its maintenance (at most 8 lowercase letters and digits): the boot for a
    /// spot interruption (one per boot), the event for a scheduled one.
    pub key: String,
    pub reason: MaintenanceReason,
    /// When the cloud acts.
    pub deadline: Timestamp,
    pub message: String,
}

/// The notice to drain for at `now`, if any: a spot interruption at once, else the soonest
/// scheduled event that takes the instance down, once its `NotBefore` is `drain_ahead` away.
pub fn due(notices: &Notices, now: Timestamp, drain_ahead: Duration, boot_id: &str) -> Option<Due> {
    if let Some(spot) = &notices.spot {
        return Some(Due {
            key: key(boot_id.chars()),
            reason: MaintenanceReason::Shutdown,
            deadline: spot.at,
            message: format!(
                "spot interruption notice: the instance is {} at {}",
                past(&spot.action),
                spot.at
            ),
        });
    }
    let ahead = jiff::SignedDuration::try_from(drain_ahead).ok()?;
    notices.scheduled.iter().find_map(|event| {
        let reason = event.takes_down()?;
        if event.not_before.duration_since(now) > ahead {
            return None;
        }
        let tail: Vec<char> = event
            .id
            .chars()
            .rev()
            .filter(char::is_ascii_alphanumeric)
            .take(8)
            .collect();
        Some(Due {
            key: key(tail.into_iter().rev()),
            reason,
            deadline: event.not_before,
            message: format!(
                "scheduled event {} ({}): the cloud acts from {}",
                event.code, event.id, event.not_before
            ),
        })
    })
}

/// The first 8 letters and digits of `chars`, lowercase.
fn key(chars: impl Iterator<Item = char>) -> String {
    chars
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect::<String>()
        .to_ascii_lowercase()
}

#[cfg(test)]
mod tests;
