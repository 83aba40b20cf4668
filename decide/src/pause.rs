//! Pause with acknowledgement: a paused policy reports `Paused=True` only once every agent in
//! its scope has seen the pause (acknowledged the policy's current generation in its
//! NodeReport) and no maintenance in scope is still admitted (about to drain), draining or
//! acting.

use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PauseState {
    NotPaused,
    /// Paused in the spec, not yet in effect everywhere.
    Pausing {
        unacknowledged: Vec<String>,
        active_maintenances: usize,
    },
    Paused,
}

/// `agents`: each node in scope that runs an agent, with the policy generation its agent
/// acknowledged as paused (if any).
pub fn pause_state(
    paused: bool,
    generation: i64,
    agents: &BTreeMap<String, Option<i64>>,
    active_maintenances: usize,
) -> PauseState {
    if !paused {
        return PauseState::NotPaused;
    }
    let unacknowledged: Vec<String> = agents
        .iter()
        .filter(|(_, ack)| ack.is_none_or(|g| g < generation))
        .map(|(node, _)| node.clone())
        .collect();
    if unacknowledged.is_empty() && active_maintenances == 0 {
        PauseState::Paused
    } else {
        PauseState::Pausing {
            unacknowledged,
            active_maintenances,
        }
    }
}

impl PauseState {
    /// The `Paused` condition: status, reason and message.
    pub fn condition(&self) -> (&'static str, &'static str, String) {
        match self {
            Self::NotPaused => ("False", "NotPaused", "the policy is not paused".into()),
            Self::Paused => (
                "True",
                "Paused",
                "every agent in scope acknowledged and nothing is disrupting".into(),
            ),
            Self::Pausing {
                unacknowledged,
                active_maintenances,
            } => {
                let mut waiting: Vec<&str> =
                    unacknowledged.iter().take(5).map(String::as_str).collect();
                if unacknowledged.len() > waiting.len() {
                    waiting.push("...");
                }
                (
                    "False",
                    "Pausing",
                    format!(
                        "waiting for {} agent(s) to acknowledge ({}) and {active_maintenances} maintenance(s) admitted, draining or acting",
                        unacknowledged.len(),
                        waiting.join(", ")
                    ),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agents(acks: &[(&str, Option<i64>)]) -> BTreeMap<String, Option<i64>> {
        acks.iter().map(|(n, a)| ((*n).to_owned(), *a)).collect()
    }

    #[test]
    fn paused_only_once_everyone_acknowledged_the_current_generation_and_nothing_acts() {
        let state = pause_state(
            true,
            4,
            &agents(&[("a", Some(4)), ("b", Some(3)), ("c", None)]),
            0,
        );
        assert_eq!(
            state,
            PauseState::Pausing {
                unacknowledged: vec!["b".into(), "c".into()],
                active_maintenances: 0
            }
        );
        assert_eq!(state.condition().0, "False");
        let acked = agents(&[("a", Some(4)), ("b", Some(4)), ("c", Some(5))]);
        assert!(matches!(
            pause_state(true, 4, &acked, 1),
            PauseState::Pausing {
                active_maintenances: 1,
                ..
            }
        ));
        assert_eq!(pause_state(true, 4, &acked, 0), PauseState::Paused);
        assert_eq!(pause_state(true, 4, &acked, 0).condition().0, "True");
    }

    #[test]
    fn unpausing_clears_it_at_once() {
        assert_eq!(
            pause_state(false, 5, &agents(&[("a", None)]), 3),
            PauseState::NotPaused
        );
    }
}
