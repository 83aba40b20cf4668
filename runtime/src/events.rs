//! Kubernetes Events, published best effort (a failure is logged, never fatal) by one
//! recorder per daemon, within an optional rate limit.
//!
//! A repeat of an Event within [`SERIES_TTL`] counts in the first one's `series` instead of
//! making a new one, as kube's and client-go's recorders do, but a repeat is the same note
//! too: kube's recorder leaves the note out, so two OOM kills of different processes became
//! one Event counted twice whose note named only the first.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::{
        core::v1::ObjectReference,
        events::v1::{Event as Published, EventSeries},
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::{SignedDuration, Timestamp},
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
    runtime::events::{Event, EventType},
};

/// How long an Event is counted on rather than published anew.
const SERIES_TTL: SignedDuration = SignedDuration::from_mins(6);
/// The most Events kept to count repeats on (distinct notes are distinct Events).
const SERIES_KEPT: usize = 512;

/// What makes two Events the same.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    warning: bool,
    action: String,
    reason: String,
    note: Option<String>,
    regarding: (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    ),
}

/// Writes Events as one reporting controller and instance, counting repeats.
#[derive(Clone)]
struct Recorder {
    client: Client,
    controller: String,
    instance: String,
    published: Arc<tokio::sync::Mutex<HashMap<Key, Published>>>,
}

impl Recorder {
    async fn publish(&self, event: &Event, about: &ObjectReference) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = Key {
            warning: event.type_ == EventType::Warning,
            action: event.action.clone(),
            reason: event.reason.clone(),
            note: event.note.clone(),
            regarding: (
                about.kind.clone(),
                about.namespace.clone(),
                about.name.clone(),
                about.uid.clone(),
            ),
        };
        let namespace = about.namespace.as_deref().unwrap_or("default");
        let events: Api<Published> = Api::namespaced(self.client.clone(), namespace);
        let mut published = self.published.lock().await;
        published.retain(|_, e| last_seen(e) + SERIES_TTL > now);
        let written = match published.get(&key) {
            Some(first) => {
                let series = EventSeries {
                    count: first.series.as_ref().map_or(2, |s| s.count + 1),
                    last_observed_time: MicroTime(now),
                };
                // Only the series: the fields left out of a merge patch stay as they are.
                let patch = Published {
                    series: Some(series),
                    ..Published::default()
                };
                let name = first.metadata.name.clone().unwrap_or_default();
                events
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?
            }
            None => {
                events
                    .create(&PostParams::default(), &self.new_event(event, about, now))
                    .await?
            }
        };
        if published.len() >= SERIES_KEPT && !published.contains_key(&key) {
            // The oldest goes: a repeat of it is a new Event.
            if let Some(oldest) = published
                .iter()
                .min_by_key(|(_, e)| last_seen(e))
                .map(|(k, _)| k.clone())
            {
                published.remove(&oldest);
            }
        }
        published.insert(key, written);
        Ok(())
    }

    fn new_event(&self, event: &Event, about: &ObjectReference, now: Timestamp) -> Published {
        Published {
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(about.clone()),
            note: event.note.clone(),
            metadata: ObjectMeta {
                namespace: about.namespace.clone(),
                name: Some(format!(
                    "{}.{:x}",
                    about.name.as_deref().unwrap_or(&self.controller),
                    now.as_nanosecond()
                )),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(match event.type_ {
                EventType::Normal => "Normal".to_owned(),
                EventType::Warning => "Warning".to_owned(),
            }),
            related: event.secondary.clone(),
            ..Published::default()
        }
    }
}

/// When an Event was last seen: its series' last observation, else its time.
fn last_seen(event: &Published) -> Timestamp {
    event
        .series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or(event.event_time.as_ref().map(|t| t.0))
        .unwrap_or_else(Timestamp::now)
}

/// Publishes Events as one component (`controller`, e.g. the agent's field manager) and
/// instance (the node or pod). Cheap to clone: clones share the recorder and the limit.
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
    limit: Option<Arc<Mutex<RateLimit>>>,
    related: Option<ObjectReference>,
}

impl Events {
    pub fn new(client: Client, controller: &str, instance: String) -> Self {
        Self {
            recorder: Recorder {
                client,
                controller: controller.to_owned(),
                instance,
                published: Arc::default(),
            },
            limit: None,
            related: None,
        }
    }

    /// Every Event names `related` as the object it is related to (an agent's Events, its
    /// Node: the admission policy lets an agent publish only about its own things).
    pub fn related_to(mut self, related: ObjectReference) -> Self {
        self.related = Some(related);
        self
    }

    /// At most `burst` Events at once, then one more every `refill`; the others are dropped
    /// with a warning.
    pub fn limited(mut self, burst: u32, refill: Duration) -> Self {
        self.limit = Some(Arc::new(Mutex::new(RateLimit::new(
            burst,
            refill,
            Instant::now(),
        ))));
        self
    }

    /// Publishes an Event about `about`; returns whether the API server took it, or `None`
    /// when the rate limit held it back (either is logged).
    pub async fn publish(
        &self,
        about: &ObjectReference,
        type_: EventType,
        action: &str,
        reason: &str,
        note: String,
    ) -> Option<bool> {
        let allowed = self.limit.as_ref().is_none_or(|limit| {
            limit
                .lock()
                .map_or(true, |mut limit| limit.try_take(Instant::now()))
        });
        if !allowed {
            tracing::warn!(%reason, "event rate limit reached; not publishing");
            return None;
        }
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(fitted(note)),
            action: action.to_owned(),
            secondary: self.related.clone(),
        };
        let published = self.recorder.publish(&event, about).await;
        if let Err(e) = &published {
            tracing::warn!(error = %e, %reason, "publishing an event failed");
        }
        Some(published.is_ok())
    }

    /// Publishes in the background, off the caller's path (which does not wait for it).
    pub fn spawn(
        &self,
        about: ObjectReference,
        type_: EventType,
        action: &'static str,
        reason: &str,
        note: String,
    ) -> tokio::task::JoinHandle<()> {
        let events = self.clone();
        let reason = reason.to_owned();
        tokio::spawn(async move {
            events.publish(&about, type_, action, &reason, note).await;
        })
    }
}

/// How long [`briefly`] waits for an Event.
pub const EVENT_WAIT: Duration = Duration::from_secs(1);

/// Waits for an Event [`Events::spawn`] publishes, at most [`EVENT_WAIT`]; past it the Event
/// goes on in the background. For the paths that must go on (a drain, a shutdown): an API
/// server, or an admission webhook on Events, answering slowly holds none of them.
pub async fn briefly(publishing: tokio::task::JoinHandle<()>) {
    if tokio::time::timeout(EVENT_WAIT, publishing).await.is_err() {
        tracing::debug!(
            "an Event takes longer than {EVENT_WAIT:?}; going on without waiting for it"
        );
    }
}

/// The API server refuses an Event whose note is over 1024 bytes (and the Event is lost);
/// a longer one (a drain's list of the pods it left) is cut at a character boundary, saying so.
const NOTE_LIMIT: usize = 1024;

fn fitted(note: String) -> String {
    if note.len() <= NOTE_LIMIT {
        return note;
    }
    let suffix = format!(" ... ({} bytes in all; cut at the API's limit)", note.len());
    let end = note.floor_char_boundary(NOTE_LIMIT.saturating_sub(suffix.len()));
    format!("{}{suffix}", &note[..end])
}

/// A token bucket: `capacity` events at once, then one more every `refill`.
#[derive(Clone, Debug)]
pub struct RateLimit {
    capacity: u32,
    tokens: u32,
    refill: Duration,
    last_refill: Instant,
}

impl RateLimit {
    pub fn new(capacity: u32, refill: Duration, now: Instant) -> Self {
        Self {
            capacity,
            tokens: capacity,
            refill,
            last_refill: now,
        }
    }

    /// Takes a token if one is left at `now`.
    pub fn try_take(&mut self, now: Instant) -> bool {
        if !self.refill.is_zero() {
            let elapsed = now.saturating_duration_since(self.last_refill);
            let earned =
                (elapsed.as_nanos() / self.refill.as_nanos()).min(u128::from(self.capacity)) as u32;
            if earned > 0 {
                self.tokens = (self.tokens + earned).min(self.capacity);
                self.last_refill += self.refill * earned;
                if self.tokens == self.capacity {
                    self.last_refill = now;
                }
            }
        }
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
    }
}

/// What a message is about: the message with each number that is not part of a name masked
/// (`Killed process 4242 (java) total-vm:1234kB` and `… 4343 (java) …` are one subject,
/// `dev sda1` and `dev sdb1` two; `NotReady for 60s` and `NotReady for 65s` one). Notes that
/// restate a state with its counts and ages are published again only when their subject changes.
pub fn subject(message: &str) -> String {
    let mut subject = String::with_capacity(message.len());
    let mut previous: Option<char> = None;
    let mut masking = false;
    for c in message.chars() {
        if c.is_ascii_digit() {
            if masking {
                continue;
            }
            if previous.is_none_or(|p| !p.is_ascii_alphanumeric() && p != '_') {
                masking = true;
                subject.push('#');
                previous = Some(c);
                continue;
            }
        } else {
            masking = false;
        }
        subject.push(c);
        previous = Some(c);
    }
    subject
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subject_masks_counts_and_ids_but_keeps_names() {
        assert_eq!(
            subject("Out of memory: Killed process 4242 (java) total-vm:1234kB"),
            "Out of memory: Killed process # (java) total-vm:#kB"
        );
        assert_eq!(
            subject("I/O error, dev sdb1, sector 123456"),
            "I/O error, dev sdb1, sector #"
        );
        assert_ne!(
            subject("EXT4-fs error (device nvme0n1p1)"),
            subject("EXT4-fs error (device nvme1n1p1)")
        );
        // A state restated each round with its ages is one subject; another reason is another.
        let waits = |n: u32, why: &str| {
            format!(
                "NotReady for {n}s, its agent last wrote its heartbeat {}s ago; but {why}",
                n + 55
            )
        };
        assert_eq!(
            subject(&waits(60, "its agent does not fence it")),
            subject(&waits(65, "its agent does not fence it"))
        );
        assert_ne!(
            subject(&waits(60, "its agent does not fence it")),
            subject(&waits(60, "a pause holds it"))
        );
    }

    #[test]
    fn a_note_over_the_apis_limit_is_cut_at_a_character_boundary() {
        assert_eq!(fitted("short".into()), "short");
        let exact = "x".repeat(NOTE_LIMIT);
        assert_eq!(fitted(exact.clone()), exact);
        // Two-byte characters, so that the cut falls inside one unless it looks for a boundary.
        let long = "é".repeat(NOTE_LIMIT);
        let cut = fitted(long);
        assert!(cut.len() <= NOTE_LIMIT, "{} bytes", cut.len());
        assert!(cut.starts_with("éé"), "{cut}");
        assert!(
            cut.ends_with("(2048 bytes in all; cut at the API's limit)"),
            "{cut}"
        );
    }

    #[test]
    fn rate_limit_allows_a_burst_then_one_per_refill() {
        let t0 = Instant::now();
        let mut limit = RateLimit::new(3, Duration::from_secs(30), t0);
        assert!((0..3).all(|_| limit.try_take(t0)));
        assert!(!limit.try_take(t0));
        assert!(!limit.try_take(t0 + Duration::from_secs(29)));
        assert!(limit.try_take(t0 + Duration::from_secs(30)));
        assert!(!limit.try_take(t0 + Duration::from_secs(31)));
        // A long quiet spell refills to capacity, not beyond.
        let later = t0 + Duration::from_secs(3600);
        assert!((0..3).all(|_| limit.try_take(later)));
        assert!(!limit.try_take(later));
    }
}
