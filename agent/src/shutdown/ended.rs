//! What the guard says when a drain before shutdown ends: the Event released with the lock.

use kube::runtime::events::EventType;

use crate::drain::evict::Outcome;

/// How a drain before shutdown ended (`None`: out of time), as an Event's type and note.
pub fn described(outcome: &Option<Result<Outcome, crate::Error>>) -> (EventType, String) {
    match outcome {
        Some(Ok(Outcome::Drained)) => (
            EventType::Normal,
            "every pod of the plan is gone".to_owned(),
        ),
        Some(Ok(Outcome::Incomplete { remaining })) => (
            EventType::Warning,
            format!("stages ran out of time; left: {}", remaining.join(", ")),
        ),
        Some(Ok(Outcome::Failed { stage, remaining })) => (
            EventType::Warning,
            format!("stage {stage} failed; left: {}", remaining.join(", ")),
        ),
        Some(Err(e)) => (EventType::Warning, format!("the drain failed: {e}")),
        None => (
            EventType::Warning,
            "out of time: releasing the lock with pods left".to_owned(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drain_that_left_pods_or_ran_out_of_time_is_a_warning_naming_them() {
        let drained = described(&Some(Ok(Outcome::Drained)));
        assert_eq!(drained.0, EventType::Normal);
        let left = described(&Some(Ok(Outcome::Failed {
            stage: "critical".into(),
            remaining: vec!["shop/db-0".into(), "shop/db-1".into()],
        })));
        assert_eq!(left.0, EventType::Warning);
        assert_eq!(left.1, "stage critical failed; left: shop/db-0, shop/db-1");
        let late = described(&None);
        assert_eq!(late.0, EventType::Warning);
        assert!(late.1.starts_with("out of time"), "{}", late.1);
    }
}
