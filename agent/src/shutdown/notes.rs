//! What the guard says when a drain before shutdown starts and ends: the Events of its lock.

use std::time::Duration;

use kube::runtime::events::EventType;
use nodeward_api::{MaintenanceAction, MaintenancePhase, NodeMaintenance, update::HostStep};

use crate::drain::evict::Outcome;

/// The maintenance of this node whose reboot or power-off is under way, if any: then the
/// shutdown logind announces is the one nodeward asked for. Under way: Acting, or Verifying
/// once its rollback ran (the rollback reboots into what ran before the update; after that
/// boot a shutdown before the maintenance ends is taken for that one too).
pub fn planned(maintenances: &[std::sync::Arc<NodeMaintenance>]) -> Option<String> {
    maintenances
        .iter()
        .find(|m| {
            let rolled_back = || {
                m.status.as_ref().is_some_and(|s| {
                    s.host_runs
                        .iter()
                        .any(|r| r.step == HostStep::Rollback && r.succeeded())
                })
            };
            let asked = match m.phase() {
                MaintenancePhase::Acting => true,
                MaintenancePhase::Verifying => rolled_back(),
                _ => false,
            };
            asked
                && matches!(
                    m.spec.action,
                    MaintenanceAction::Reboot | MaintenanceAction::PowerOff
                )
        })
        .map(|m| kube::ResourceExt::name_any(m.as_ref()))
}

/// How the start of a drain before shutdown is told: a shutdown nodeward asked for (`planned`
/// names its maintenance) is expected, anything else is a warning.
pub fn started(planned: Option<&str>, left: Duration, resumed: bool) -> (EventType, String) {
    let resumed = if resumed { " (resumed)" } else { "" };
    match planned {
        Some(m) => (
            EventType::Normal,
            format!(
                "the shutdown of maintenance {m} began: tainted and cordoned, draining what it left within {}s{resumed}",
                left.as_secs()
            ),
        ),
        None => (
            EventType::Warning,
            format!(
                "logind announced a shutdown no maintenance asked for: tainted and cordoned, draining within {}s{resumed}",
                left.as_secs()
            ),
        ),
    }
}

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
    fn a_shutdown_a_maintenance_asked_for_is_normal_and_any_other_a_warning() {
        let maintenance = |phase: &str, action: &str| {
            std::sync::Arc::new(
                serde_json::from_value::<NodeMaintenance>(serde_json::json!({
                    "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
                    "metadata": {"name": format!("w0-{phase}")},
                    "spec": {"nodeName": "w0", "reason": "Manual", "action": action},
                    "status": {"phase": phase}
                }))
                .expect("a maintenance"),
            )
        };
        assert_eq!(
            planned(&[
                maintenance("Succeeded", "Reboot"),
                maintenance("Acting", "Reboot")
            ]),
            Some("w0-Acting".to_owned())
        );
        assert_eq!(planned(&[maintenance("Draining", "Reboot")]), None);
        // Verifying: only once its rollback ran, which reboots into what ran before.
        assert_eq!(planned(&[maintenance("Verifying", "Reboot")]), None);
        let mut rolled_back = maintenance("Verifying", "Reboot");
        std::sync::Arc::make_mut(&mut rolled_back)
            .status
            .get_or_insert_default()
            .host_runs = serde_json::from_value(serde_json::json!([{
                "step": "Rollback", "command": "apt-get install nwdemo=1.0",
                "startedAt": "2026-12-07T13:58:37Z", "finishedAt": "2026-12-07T13:58:48Z",
                "result": "Succeeded", "exitCode": 0}]))
        .expect("a run");
        assert_eq!(planned(&[rolled_back]), Some("w0-Verifying".to_owned()));
        assert_eq!(planned(&[maintenance("Acting", "DeleteNode")]), None);
        let (kind, note) = started(Some("w0-Acting"), Duration::from_secs(110), false);
        assert_eq!(kind, EventType::Normal);
        assert!(
            note.starts_with("the shutdown of maintenance w0-Acting began"),
            "{note}"
        );
        let (kind, note) = started(None, Duration::from_secs(110), true);
        assert_eq!(kind, EventType::Warning);
        assert!(note.ends_with("within 110s (resumed)"), "{note}");
    }

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
