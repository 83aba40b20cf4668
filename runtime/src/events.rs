//! Kubernetes Events, published best effort (a failure is logged, never fatal) by one
//! recorder per daemon, within an optional rate limit.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Client,
    runtime::events::{Event, EventType, Recorder, Reporter},
};

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
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: controller.to_owned(),
                    instance: Some(instance),
                },
            ),
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
    ) {
        let events = self.clone();
        let reason = reason.to_owned();
        tokio::spawn(async move {
            events.publish(&about, type_, action, &reason, note).await;
        });
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

#[cfg(test)]
mod tests {
    use super::*;

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
