//! What the shutdown record (the NodeReport's `status.shutdown`, written as the guard acts)
//! means when the guard connects to logind anew: after an agent restart, a bus restart or a
//! logind restart.

use nodeward_api::report::{ShutdownPhase, ShutdownProgress};

/// A drain of this boot that was cut short by the agent's restart: when logind still prepares
/// the shutdown, the guard goes on with it (its start, deadline and what it did).
pub fn resumable(record: &ShutdownProgress, boot_id: &str) -> bool {
    record.boot_id == boot_id && record.phase == ShutdownPhase::Draining
}

/// A shutdown of this boot the guard drained for (and may have cordoned and tainted the node
/// for) that logind, reached anew and preparing no shutdown, no longer has: logind was
/// restarted during it. A restarted logind takes back the inhibitor locks from its runtime
/// directory but not a delayed shutdown, and sends no `PrepareForShutdown(false)` for it; the
/// machine is not going down, so the node is restored as after a cancel.
pub fn forgotten(record: &ShutdownProgress, boot_id: &str) -> bool {
    record.boot_id == boot_id
        && matches!(
            record.phase,
            ShutdownPhase::Draining | ShutdownPhase::Released
        )
}

/// Why a shutdown the guard drained for is not going ahead.
#[derive(Clone, Copy, Debug)]
pub enum Undo {
    /// logind said so (`PrepareForShutdown(false)`), e.g. its shutdown job failed.
    Cancelled,
    /// logind was restarted during it and prepares no shutdown now ([`forgotten`]).
    Forgotten,
}

impl Undo {
    pub fn says(self) -> &'static str {
        match self {
            Self::Cancelled => "logind cancelled the shutdown",
            Self::Forgotten => {
                "logind was restarted during the shutdown and no longer prepares it (the machine is not going down)"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn record(boot_id: &str, phase: ShutdownPhase) -> ShutdownProgress {
        let at = Time("2026-11-30T10:00:00Z".parse().expect("a time"));
        ShutdownProgress {
            phase,
            boot_id: boot_id.to_owned(),
            started_at: at.clone(),
            deadline: at,
            pods_total: 1,
            pods_remaining: 1,
            blocking_pods: Vec::new(),
            cordoned_by_agent: true,
            tainted_by_agent: true,
        }
    }

    #[test]
    fn only_a_drain_of_this_boot_resumes() {
        assert!(resumable(&record("b1", ShutdownPhase::Draining), "b1"));
        assert!(!resumable(&record("b0", ShutdownPhase::Draining), "b1"));
        for phase in [
            ShutdownPhase::Released,
            ShutdownPhase::Cancelled,
            ShutdownPhase::Recovering,
        ] {
            assert!(!resumable(&record("b1", phase), "b1"), "{phase:?}");
        }
    }

    #[test]
    fn a_drained_or_released_shutdown_of_this_boot_that_logind_forgot_is_undone() {
        assert!(forgotten(&record("b1", ShutdownPhase::Draining), "b1"));
        // Released and still up: the machine did not go down after the lock was let go.
        assert!(forgotten(&record("b1", ShutdownPhase::Released), "b1"));
        // Undone already, or another boot's (restored once the node is Ready, not here).
        assert!(!forgotten(&record("b1", ShutdownPhase::Cancelled), "b1"));
        assert!(!forgotten(&record("b1", ShutdownPhase::Recovering), "b1"));
        assert!(!forgotten(&record("b0", ShutdownPhase::Released), "b1"));
        assert!(!forgotten(&record("b0", ShutdownPhase::Draining), "b1"));
    }
}
