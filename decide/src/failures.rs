//! The failure budget (`spec.failureBudget`): a rollout that breaks nodes halts itself. The
//! maintenances a policy admitted that ended Failed within its window, and not before its last
//! resume, are counted; at `maxFailures`, or at the failure of a canary whatever `maxFailures`
//! says, the policy halts and nothing more in its scope is admitted until an operator resumes
//! it (which moves `countSince` to then).
//!
//! A failure's time is its agent's clock (`status.finishedAt`), not the coordinator's: one
//! stamped ahead of the coordinator's clock has happened all the same and counts at once. (It
//! once did not, for the seconds the clocks differed: the round that freed the failed node's
//! slot gave it to the next node before the halt counted.)

use jiff::{SignedDuration, Timestamp};
use nodeward_api::{MaintenancePhase, NodeMaintenance, bounds::cut, policy::FailureBudget};

/// What a halt's condition says after its count, before the policy's name.
pub const UNTIL_RESUMED: &str = "; nothing in scope is admitted until kubectl nodeward resume ";

/// The most failures a halt names in its message (the rest are counted).
const NAMED: usize = 5;

/// The longest reason a halt quotes of each failure: five of them stay well within a
/// maintenance's message (a denial's) and a condition's.
const WHY_LIMIT: usize = 400;

/// A maintenance that counts against a failure budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub maintenance: String,
    pub node: String,
    /// When it ended Failed.
    pub at: Timestamp,
    /// Why, as its status said.
    pub why: String,
    /// It went as one of the policy's canaries ([`crate::canary::Stage::went_as_canary`]).
    pub canary: bool,
}

/// A policy's failure budget as of now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spending {
    pub max_failures: usize,
    /// Its failures within the window, oldest first.
    pub failures: Vec<Failure>,
    /// The window, as written (`24h` when absent).
    pub window: String,
}

impl Spending {
    /// Whether the budget is spent, or a canary failed: the policy is halted.
    pub fn halted(&self) -> bool {
        self.failures.len() >= self.max_failures || self.failures.iter().any(|f| f.canary)
    }

    /// Marks the failures of the maintenances `went_as_canary` says went as canaries.
    pub fn mark_canaries(&mut self, went_as_canary: impl Fn(&str) -> bool) {
        for f in &mut self.failures {
            f.canary = went_as_canary(&f.maintenance);
        }
    }

    /// What the `Halted` condition (and a denial) says: how many failed within the window,
    /// and which nodes, why.
    pub fn message(&self) -> String {
        let named: Vec<String> = self
            .failures
            .iter()
            .rev()
            .take(NAMED)
            .map(|f| {
                let canary = if f.canary { ", a canary" } else { "" };
                let why = cut(&f.why, WHY_LIMIT);
                format!("{} ({}{canary}): {why}", f.node, f.maintenance)
            })
            .collect();
        let more = self.failures.len().saturating_sub(NAMED);
        let mut message = format!(
            "{} of maxFailures {} failed within {}",
            self.failures.len(),
            self.max_failures,
            self.window
        );
        if !named.is_empty() {
            message.push_str(": ");
            message.push_str(&named.join("; "));
        }
        if more > 0 {
            message.push_str(&format!("; and {more} more"));
        }
        message
    }
}

/// `policy`'s failure budget at `now` over `maintenances`, if it has one. A failure counts
/// when its maintenance was admitted under the policy (its admission record, which only the
/// coordinator writes, names it), ended Failed within the window (or stamped after `now` by a
/// clock ahead of this one) and after `countSince`, or was admitted after `countSince` (an
/// agent's clock behind the operator's must not forgive a failure of the resumed rollout).
/// A window that does not parse counts as the default (the CRD refuses one).
pub fn spending<'a>(
    policy: &str,
    budget: &FailureBudget,
    maintenances: impl IntoIterator<Item = &'a NodeMaintenance>,
    now: Timestamp,
) -> Spending {
    let window = budget
        .window
        .as_ref()
        .and_then(|w| w.to_std().ok())
        .unwrap_or(FailureBudget::DEFAULT_WINDOW);
    let since = SignedDuration::try_from(window)
        .ok()
        .and_then(|w| now.checked_sub(w).ok())
        .unwrap_or(Timestamp::MIN);
    // Times are kept to the second: a failure in the second of the resume is forgiven with it.
    let resumed = budget.count_since.as_ref().map(|t| t.0);
    let mut failures: Vec<Failure> = maintenances
        .into_iter()
        .filter_map(|m| failure(policy, m))
        .filter(|(f, _)| f.at >= since)
        .filter(|(f, admitted)| {
            resumed.is_none_or(|r| {
                f.at.as_second() > r.as_second() || admitted.as_second() > r.as_second()
            })
        })
        .map(|(f, _)| f)
        .collect();
    failures.sort_by(|a, b| (a.at, &a.maintenance).cmp(&(b.at, &b.maintenance)));
    Spending {
        max_failures: usize::try_from(budget.max_failures).unwrap_or(usize::MAX),
        failures,
        window: budget
            .window
            .as_ref()
            .map_or_else(|| "24h".to_owned(), ToString::to_string),
    }
}

/// `m` as a failure under `policy`, if it is one, with when it was admitted.
fn failure(policy: &str, m: &NodeMaintenance) -> Option<(Failure, Timestamp)> {
    let status = m.status.as_ref()?;
    if status.phase != MaintenancePhase::Failed {
        return None;
    }
    let admission = status
        .admission
        .as_ref()
        .filter(|a| a.policies.iter().any(|p| p == policy))?;
    let at = status
        .finished_at
        .as_ref()
        .map(|t| t.0)
        .or_else(|| m.entered(MaintenancePhase::Failed).map(|t| t.0))?;
    let failure = Failure {
        maintenance: m.metadata.name.clone().unwrap_or_default(),
        node: m.spec.node_name.clone(),
        at,
        why: match (&status.reason, &status.message) {
            (Some(reason), Some(message)) => format!("{reason}: {message}"),
            (Some(said), None) | (None, Some(said)) => said.clone(),
            (None, None) => "no reason given".to_owned(),
        },
        canary: false,
    };
    Some((failure, admission.admitted_at.0))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use nodeward_api::Duration;

    use super::*;
    use crate::testing::{at, reboot as ended};

    fn budget(max_failures: u32, window: Option<&str>, count_since: Option<i64>) -> FailureBudget {
        FailureBudget {
            max_failures,
            window: window.map(|w| Duration::parse(w).expect("a duration")),
            count_since: count_since.map(|s| Time(at(s))),
        }
    }

    #[test]
    fn only_failures_admitted_under_the_policy_within_its_window_count() {
        let now = 10_000;
        let maintenances = [
            ended("m1", "n1", &["pool"], MaintenancePhase::Failed, now - 60),
            // Succeeded, another policy's, never admitted (superseded), too old: none count.
            ended("m2", "n2", &["pool"], MaintenancePhase::Succeeded, now - 60),
            ended("m3", "n3", &["other"], MaintenancePhase::Failed, now - 60),
            ended("m4", "n4", &[], MaintenancePhase::Failed, now - 60),
            ended("m5", "n5", &["pool"], MaintenancePhase::Failed, now - 7200),
            ended(
                "m6",
                "n6",
                &["other", "pool"],
                MaintenancePhase::Failed,
                now - 30,
            ),
        ];
        let spent = spending("pool", &budget(2, Some("1h"), None), &maintenances, at(now));
        let counted: Vec<&str> = spent.failures.iter().map(|f| f.node.as_str()).collect();
        assert_eq!(counted, ["n1", "n6"]);
        assert!(spent.halted());
        assert_eq!(
            spent.message(),
            "2 of maxFailures 2 failed within 1h: n6 (m6): m6 went wrong; n1 (m1): m1 went wrong"
        );
        let one_short = spending("pool", &budget(3, Some("1h"), None), &maintenances, at(now));
        assert!(!one_short.halted());
    }

    #[test]
    fn a_resume_forgets_the_failures_before_it_and_the_default_window_is_a_day() {
        let now = 100_000;
        let maintenances = [
            ended(
                "m1",
                "n1",
                &["pool"],
                MaintenancePhase::Failed,
                now - 80_000,
            ),
            ended(
                "m2",
                "n2",
                &["pool"],
                MaintenancePhase::Failed,
                now - 86_000,
            ),
        ];
        let spent = spending("pool", &budget(2, None, None), &maintenances, at(now));
        assert!(spent.halted(), "both within the default 24h");
        assert!(
            spent.message().contains("within 24h"),
            "{}",
            spent.message()
        );
        let after_resume = |resumed: i64| {
            let budget = budget(2, None, Some(now - resumed));
            spending("pool", &budget, &maintenances, at(now))
                .failures
                .len()
        };
        assert_eq!(
            after_resume(83_000),
            1,
            "the one before the resume is forgiven"
        );
        assert_eq!(
            after_resume(80_000),
            0,
            "one in the second of the resume goes with it"
        );
    }

    #[test]
    fn a_failure_stamped_ahead_of_the_coordinators_clock_counts_at_once() {
        let now = 10_000;
        for ahead in [1, 2, 30, 600] {
            let maintenances = [ended(
                "m1",
                "n1",
                &["pool"],
                MaintenancePhase::Failed,
                now + ahead,
            )];
            let spent = spending("pool", &budget(1, None, None), &maintenances, at(now));
            assert!(spent.halted(), "an agent's clock {ahead} s ahead");
        }
    }

    #[test]
    fn a_failure_of_a_maintenance_admitted_after_the_resume_counts_whatever_its_agents_clock() {
        let now = 10_000;
        // Admitted 100 s before its end: at now - 20, after the resume at now - 30; its agent's
        // clock, 60 s behind, stamped its failure before the resume.
        let maintenances = [ended(
            "m1",
            "n1",
            &["pool"],
            MaintenancePhase::Failed,
            now + 80,
        )];
        let mut m = maintenances[0].clone();
        if let Some(s) = m.status.as_mut() {
            s.finished_at = Some(Time(at(now - 40)));
        }
        let spent = spending("pool", &budget(1, None, Some(now - 30)), [&m], at(now));
        assert!(spent.halted(), "{}", spent.message());
    }

    #[test]
    fn a_canarys_failure_halts_whatever_max_failures_says() {
        let now = 10_000;
        let maintenances = [ended(
            "m1",
            "n1",
            &["pool"],
            MaintenancePhase::Failed,
            now - 60,
        )];
        let mut spent = spending("pool", &budget(3, None, None), &maintenances, at(now));
        assert!(!spent.halted(), "1 of 3");
        spent.mark_canaries(|m| m == "m1");
        assert!(spent.halted(), "the canary failed");
        assert_eq!(
            spent.message(),
            "1 of maxFailures 3 failed within 24h: n1 (m1, a canary): m1 went wrong"
        );
    }

    #[test]
    fn a_halt_names_the_latest_failures_and_counts_the_rest() {
        let now = 10_000;
        let maintenances: Vec<NodeMaintenance> = (0..8)
            .map(|i| {
                ended(
                    &format!("m{i}"),
                    &format!("n{i}"),
                    &["pool"],
                    MaintenancePhase::Failed,
                    now - 100 + i,
                )
            })
            .collect();
        let message = spending("pool", &budget(3, None, None), &maintenances, at(now)).message();
        assert!(
            message.starts_with("8 of maxFailures 3 failed within 24h: n7 (m7)"),
            "{message}"
        );
        assert!(message.ends_with("; and 3 more"), "{message}");
    }
}
