//! Events on the Node when a problem starts and when it clears (published within the agent's
//! event rate limit, so that a node in trouble never floods the API server).

use super::conditions::NodeCondition;
use crate::detect::{Status, kernel_log::NodeEvent};

/// The events that going from `before` to `after` calls for: a Warning for each condition
/// that became True, a Normal event for each that stopped being True.
pub fn transitions(before: &[NodeCondition], after: &[NodeCondition]) -> Vec<NodeEvent> {
    let was_true = |type_: &str| {
        before
            .iter()
            .any(|c| c.type_ == type_ && c.status == Status::Problem)
    };
    let mut events = Vec::new();
    for condition in after {
        match (
            was_true(&condition.type_),
            condition.status == Status::Problem,
        ) {
            (false, true) => events.push(NodeEvent {
                warning: true,
                reason: condition.reason.clone(),
                note: format!("{}: {}", condition.type_, condition.message),
            }),
            (true, false) => events.push(NodeEvent {
                warning: false,
                reason: format!("{}Cleared", condition.type_),
                note: format!("{} cleared: {}", condition.type_, condition.message),
            }),
            _ => {}
        }
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(type_: &str, status: &'static str, reason: &str) -> NodeCondition {
        NodeCondition {
            type_: type_.into(),
            status: Status::of_condition(status),
            reason: reason.into(),
            message: format!("{reason} seen"),
        }
    }

    #[test]
    fn problem_start_is_a_warning_and_clear_is_normal() {
        let before = [
            condition("RebootRequired", "False", "NoRebootRequired"),
            condition("NetworkProblem", "True", "NoDefaultRoute"),
        ];
        let after = [
            condition("RebootRequired", "True", "SentinelFilePresent"),
            condition("NetworkProblem", "False", "NoProblem"),
        ];
        let events = transitions(&before, &after);
        assert_eq!(
            events,
            vec![
                NodeEvent {
                    warning: true,
                    reason: "SentinelFilePresent".into(),
                    note: "RebootRequired: SentinelFilePresent seen".into()
                },
                NodeEvent {
                    warning: false,
                    reason: "NetworkProblemCleared".into(),
                    note: "NetworkProblem cleared: NoProblem seen".into()
                },
            ]
        );
    }

    #[test]
    fn unchanged_or_unknown_conditions_make_no_events() {
        let same = [condition("X", "True", "A")];
        assert!(transitions(&same, &same).is_empty());
        assert!(
            transitions(
                &[],
                &[
                    condition("X", "Unknown", "Timeout"),
                    condition("Y", "False", "Fine")
                ]
            )
            .is_empty()
        );
        assert_eq!(
            transitions(&[], &[condition("X", "True", "A")]).len(),
            1,
            "a problem at start is an event"
        );
    }
}
