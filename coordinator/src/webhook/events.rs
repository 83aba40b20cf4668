//! The agents' Events, bounded per node: an agent may publish [`EVENT_BURST`] Events at once,
//! then one per [`EVENT_REFILL`]. Its admission policy keeps its Events about its own things;
//! how many it creates no policy can count, and each is stored in etcd for an hour. The agent
//! limits itself far below this (20 at once, then one per 10 s for what it reports, plus a few
//! per maintenance): only a flood from a node's stolen identity meets the bound.
//!
//! The allowance is kept in memory per coordinator replica: with several behind the webhook's
//! Service, a node may publish up to that many times the bound. The chart's webhook for Events
//! ignores a coordinator that does not answer, so that Events are not lost while none runs.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use nodeward_runtime::events::RateLimit;
use serde_json::Value;

use super::{Caller, ReviewRequest, caller};

/// The path the ValidatingWebhookConfiguration calls for an agent's new Event.
pub const EVENT_PATH: &str = "/validate/event";
/// How many Events a node's agent may publish at once.
pub const EVENT_BURST: u32 = 200;
/// Then one more per this long.
pub const EVENT_REFILL: Duration = Duration::from_secs(1);

/// What the API server asked about one new Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventReview {
    pub uid: String,
    pub caller: Caller,
}

/// Reads the fields the decision needs from an AdmissionReview; the error says what is
/// missing.
pub fn parse(review: &Value) -> Result<EventReview, String> {
    let request = ReviewRequest::of(review)?;
    Ok(EventReview {
        uid: request.text("uid")?,
        caller: caller(request.0),
    })
}

/// Each node's allowance, with when it last published.
#[derive(Debug, Default)]
pub struct Allowances {
    nodes: Mutex<HashMap<String, (RateLimit, Instant)>>,
}

impl Allowances {
    /// Whether the caller's node may publish one more Event at `now` (taking it if so).
    pub fn review(&self, review: &EventReview, now: Instant) -> Result<(), String> {
        let node = review.caller.node()?;
        let mut nodes = self
            .nodes
            .lock()
            .map_err(|_| "the Event allowances' lock is poisoned".to_owned())?;
        // A node silent for as long as a whole allowance takes to refill has it all again:
        // forgetting it keeps the map to the nodes publishing now.
        let refilled = EVENT_REFILL * EVENT_BURST;
        nodes.retain(|_, (_, last)| now.saturating_duration_since(*last) < refilled);
        let (allowance, last) = nodes
            .entry(node.to_owned())
            .or_insert_with(|| (RateLimit::new(EVENT_BURST, EVENT_REFILL, now), now));
        *last = now;
        decide(node, allowance.try_take(now))
    }
}

/// The verdict for `node`, given whether its allowance had an Event left.
pub fn decide(node: &str, allowed: bool) -> Result<(), String> {
    if allowed {
        return Ok(());
    }
    Err(format!(
        "nodeward-agent on node {node} may publish at most {EVENT_BURST} Events at once, then one every {}; this one is refused until its allowance refills (the agent itself publishes far fewer: a node's identity flooding Events)",
        humantime::format_duration(EVENT_REFILL)
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn review(node: Option<&str>) -> EventReview {
        let mut extra = json!({});
        if let Some(node) = node {
            extra[super::super::NODE_CLAIM] = json!([node]);
        }
        parse(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "e7", "namespace": "default", "name": "node-a.1", "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:nodeward:nodeward-agent", "extra": extra},
        }}))
        .expect("a valid review")
    }

    #[test]
    fn a_node_publishes_its_burst_then_one_per_refill_and_another_node_is_not_held() {
        let allowances = Allowances::default();
        let t0 = Instant::now();
        let a = review(Some("node-a"));
        for _ in 0..EVENT_BURST {
            assert_eq!(allowances.review(&a, t0), Ok(()));
        }
        let refused = allowances.review(&a, t0).expect_err("past the burst");
        assert!(
            refused.starts_with("nodeward-agent on node node-a may publish at most 200 Events at once, then one every 1s"),
            "{refused}"
        );
        assert_eq!(allowances.review(&review(Some("node-b")), t0), Ok(()));
        // One more a second, not two.
        let later = t0 + EVENT_REFILL;
        assert_eq!(allowances.review(&a, later), Ok(()));
        assert!(allowances.review(&a, later).is_err());
    }

    #[test]
    fn a_quiet_node_is_forgotten_with_its_allowance_full_and_a_caller_without_a_node_is_refused() {
        let allowances = Allowances::default();
        let t0 = Instant::now();
        let a = review(Some("node-a"));
        for _ in 0..EVENT_BURST {
            allowances.review(&a, t0).expect("within the burst");
        }
        let quiet = t0 + EVENT_REFILL * EVENT_BURST;
        assert_eq!(allowances.review(&review(Some("node-b")), quiet), Ok(()));
        let nodes = allowances.nodes.lock().expect("the lock");
        assert!(!nodes.contains_key("node-a"), "node-a is forgotten");
        drop(nodes);
        for _ in 0..EVENT_BURST {
            assert_eq!(allowances.review(&a, quiet), Ok(()), "a whole burst again");
        }
        let refused = allowances
            .review(&review(None), quiet)
            .expect_err("no node");
        assert!(refused.contains("names no node"), "{refused}");
    }
}
