//! Debouncing: a detector's new verdict is reported only after it has held for the detector's
//! `for` duration, in both directions (a problem must persist before it is reported, and a
//! pass must persist before the problem clears), so that a flapping check never flaps the
//! node condition.

use std::time::{Duration, Instant};

use crate::detect::{Finding, Status};

/// A new message with the same status and reason is reported at most this often (the first
/// one after a status change at once): a message that carries a count or a latency must not
/// turn every detection round into a write of the Node and the NodeReport.
pub const DETAIL_REFRESH: Duration = Duration::from_secs(600);

/// How long a check must keep failing to decide (a timeout, an error) before a verdict it
/// reported becomes Unknown, whatever the detector's `for`: on a loaded node a check now and
/// then runs past its timeout, and with a `for` of 0 (the reboot sentinel's) each such run
/// would flap the node condition to Unknown and back, two writes of the Node and the
/// NodeReport each time (seen on the node lab's emulated VMs: every few seconds).
pub const UNKNOWN_HOLD: Duration = Duration::from_secs(60);

/// What one detector has reported, and what it is currently seeing.
#[derive(Clone, Debug)]
pub struct Debounced {
    reported: Option<Reported>,
    candidate: Option<(Status, Instant)>,
    /// When a change of message alone was last reported (since the last status change).
    detail_reported: Option<Instant>,
}

/// The finding as reported, with when its status last changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reported {
    pub finding: Finding,
    pub since: Instant,
}

/// What an observation changed in the reported state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Nothing to report.
    None,
    /// The reported status changed (or was reported for the first time).
    Status,
    /// Same status, but the reason or message changed.
    Detail,
}

impl Default for Debounced {
    fn default() -> Self {
        Self::new()
    }
}

impl Debounced {
    pub fn new() -> Self {
        Self {
            reported: None,
            candidate: None,
            detail_reported: None,
        }
    }

    /// The currently reported finding, if any has been reported yet.
    pub fn reported(&self) -> Option<&Reported> {
        self.reported.as_ref()
    }

    /// Feeds one observation made at `now`. The first observation of a detector that passes
    /// is reported at once (a healthy start needs no waiting); every status change, including
    /// the first problem, must hold for `hold` first, and a reported verdict gives way to
    /// Unknown only after [`UNKNOWN_HOLD`] at least.
    pub fn observe(&mut self, finding: Finding, now: Instant, hold: Duration) -> Change {
        let current = self.reported.as_ref().map(|r| r.finding.status);
        let hold = match current {
            Some(status) if status != Status::Unknown && finding.status == Status::Unknown => {
                hold.max(UNKNOWN_HOLD)
            }
            _ => hold,
        };
        if current == Some(finding.status) {
            self.candidate = None;
            let due = self
                .detail_reported
                .is_none_or(|at| now.saturating_duration_since(at) >= DETAIL_REFRESH);
            let reported = self.reported.as_mut().map(|r| &mut r.finding);
            return match reported {
                Some(r) if r.reason != finding.reason || (r.message != finding.message && due) => {
                    *r = finding;
                    self.detail_reported = Some(now);
                    Change::Detail
                }
                _ => Change::None,
            };
        }
        if current.is_none() && finding.status == Status::Ok {
            self.reported = Some(Reported {
                finding,
                since: now,
            });
            return Change::Status;
        }
        let first_seen = match self.candidate {
            Some((status, since)) if status == finding.status => since,
            _ => {
                self.candidate = Some((finding.status, now));
                now
            }
        };
        if now.saturating_duration_since(first_seen) >= hold {
            self.candidate = None;
            self.detail_reported = None;
            self.reported = Some(Reported {
                finding,
                since: now,
            });
            Change::Status
        } else {
            Change::None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOLD: Duration = Duration::from_secs(30);

    fn finding(status: Status, message: &str) -> Finding {
        Finding {
            detector: "test".into(),
            condition: "NetworkProblem".into(),
            status,
            reason: format!("{status:?}"),
            message: message.to_owned(),
        }
    }

    #[test]
    fn a_healthy_start_is_reported_at_once() {
        let t0 = Instant::now();
        let mut d = Debounced::new();
        assert_eq!(
            d.observe(finding(Status::Ok, "fine"), t0, HOLD),
            Change::Status
        );
        assert_eq!(d.reported().map(|r| r.finding.status), Some(Status::Ok));
    }

    /// Observes `status`, with the message these tests give it, `secs` after `t0`
    /// under the test's hold.
    fn seen(d: &mut Debounced, t0: Instant, secs: u64, status: Status) -> Change {
        let message = if status == Status::Ok { "fine" } else { "bad" };
        d.observe(
            finding(status, message),
            t0 + Duration::from_secs(secs),
            HOLD,
        )
    }

    #[test]
    fn a_problem_is_reported_only_after_it_held_for_the_duration() {
        let t0 = Instant::now();
        let mut d = Debounced::new();
        d.observe(finding(Status::Ok, "fine"), t0, HOLD);
        assert_eq!(seen(&mut d, t0, 1, Status::Problem), Change::None);
        assert_eq!(seen(&mut d, t0, 20, Status::Problem), Change::None);
        assert_eq!(seen(&mut d, t0, 31, Status::Problem), Change::Status);
        let reported = d.reported().expect("reported");
        assert_eq!(reported.finding.status, Status::Problem);
        assert_eq!(reported.since, t0 + Duration::from_secs(31));
    }

    #[test]
    fn a_flapping_check_never_changes_the_report() {
        let t0 = Instant::now();
        let mut d = Debounced::new();
        d.observe(finding(Status::Ok, "fine"), t0, HOLD);
        for second in 1..200 {
            let observed = if second % 2 == 0 {
                Status::Problem
            } else {
                Status::Ok
            };
            assert_eq!(seen(&mut d, t0, second, observed), Change::None);
        }
        assert_eq!(d.reported().map(|r| r.finding.status), Some(Status::Ok));
    }

    #[test]
    fn a_problem_clears_only_after_passing_for_the_duration() {
        let t0 = Instant::now();
        let mut d = Debounced::new();
        d.observe(finding(Status::Problem, "bad"), t0, Duration::ZERO);
        assert_eq!(
            d.reported().map(|r| r.finding.status),
            Some(Status::Problem)
        );
        assert_eq!(seen(&mut d, t0, 1, Status::Ok), Change::None);
        // A relapse restarts the clock.
        seen(&mut d, t0, 10, Status::Problem);
        assert_eq!(seen(&mut d, t0, 11, Status::Ok), Change::None);
        assert_eq!(seen(&mut d, t0, 40, Status::Ok), Change::None);
        assert_eq!(seen(&mut d, t0, 41, Status::Ok), Change::Status);
    }

    #[test]
    fn unknown_is_debounced_like_a_problem() {
        let t0 = Instant::now();
        let mut d = Debounced::new();
        assert_eq!(
            d.observe(finding(Status::Unknown, "?"), t0, HOLD),
            Change::None
        );
        assert!(d.reported().is_none());
        assert_eq!(
            d.observe(finding(Status::Unknown, "?"), t0 + HOLD, HOLD),
            Change::Status
        );
    }

    #[test]
    fn a_verdict_gives_way_to_unknown_only_after_a_minute_even_without_a_hold() {
        let t0 = Instant::now();
        let mut d = Debounced::new();
        d.observe(finding(Status::Ok, "no sentinel"), t0, Duration::ZERO);
        // One check past its timeout, then a verdict again: nothing is reported.
        let late = |at| finding(Status::Unknown, &format!("timed out at {at}"));
        assert_eq!(
            d.observe(late(5), t0 + Duration::from_secs(5), Duration::ZERO),
            Change::None
        );
        assert_eq!(
            d.observe(
                finding(Status::Ok, "no sentinel"),
                t0 + Duration::from_secs(10),
                Duration::ZERO
            ),
            Change::None
        );
        assert_eq!(d.reported().map(|r| r.finding.status), Some(Status::Ok));
        // A check that keeps failing is Unknown once it has for UNKNOWN_HOLD.
        let since = t0 + Duration::from_secs(20);
        assert_eq!(d.observe(late(20), since, Duration::ZERO), Change::None);
        assert_eq!(
            d.observe(
                late(79),
                since + UNKNOWN_HOLD - Duration::from_secs(1),
                Duration::ZERO
            ),
            Change::None
        );
        assert_eq!(
            d.observe(late(80), since + UNKNOWN_HOLD, Duration::ZERO),
            Change::Status
        );
        assert_eq!(
            d.reported().map(|r| r.finding.status),
            Some(Status::Unknown)
        );
        // A problem, by contrast, is reported after the detector's own hold (here none).
        assert_eq!(
            d.observe(
                finding(Status::Problem, "sentinel"),
                since + UNKNOWN_HOLD,
                Duration::ZERO
            ),
            Change::Status
        );
    }

    #[test]
    fn a_new_message_with_the_same_status_is_a_detail_change() {
        let t0 = Instant::now();
        let mut d = Debounced::new();
        d.observe(finding(Status::Problem, "sg-1 missing"), t0, Duration::ZERO);
        let change = d.observe(
            finding(Status::Problem, "sg-1, sg-2 missing"),
            t0 + Duration::from_secs(1),
            HOLD,
        );
        assert_eq!(change, Change::Detail);
        assert_eq!(
            d.reported().map(|r| r.finding.message.as_str()),
            Some("sg-1, sg-2 missing")
        );
        assert_eq!(
            d.reported().map(|r| r.since),
            Some(t0),
            "since is when the status changed"
        );
        let again = finding(Status::Problem, "sg-1, sg-2 missing");
        let change = d.observe(again, t0 + Duration::from_secs(2), HOLD);
        assert_eq!(change, Change::None);
    }

    #[test]
    fn a_message_that_keeps_changing_is_reported_at_most_every_refresh() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut d = Debounced::new();
        d.observe(finding(Status::Ok, "latency 3 ms"), t0, HOLD);
        assert_eq!(
            d.observe(finding(Status::Ok, "latency 4 ms"), at(30), HOLD),
            Change::Detail,
            "the first new message at once"
        );
        assert_eq!(
            d.observe(finding(Status::Ok, "latency 5 ms"), at(60), HOLD),
            Change::None
        );
        assert_eq!(
            d.reported().map(|r| r.finding.message.as_str()),
            Some("latency 4 ms")
        );
        let mut reason = finding(Status::Ok, "latency 6 ms");
        reason.reason = "Slow".into();
        assert_eq!(
            d.observe(reason, at(90), HOLD),
            Change::Detail,
            "a new reason is never held back"
        );
        let later = at(90) + DETAIL_REFRESH;
        assert_eq!(
            d.observe(finding(Status::Ok, "latency 7 ms"), later, HOLD),
            Change::Detail,
            "once the refresh has passed, the latest message"
        );
    }
}
