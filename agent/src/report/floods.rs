//! Floods of log Events. Each reason has an allowance of its own (a burst, then one more every
//! refill), so that a flood of one problem never silences another. What a reason's allowance
//! holds back is summarised in the Events it lets through next: each distinct subject (the
//! message with its numbers masked, which leaves the process or the device) with how often it
//! was seen, so every distinct process or device reaches the API server, only later.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use nodeward_runtime::events::{RateLimit, subject};

use crate::detect::kernel_log::NodeEvent;

/// The most distinct subjects held per reason; the rest are only counted.
const SUBJECTS_HELD: usize = 64;
/// The room a summary's list of subjects gets (the API takes notes of up to 1,024 bytes).
const SUMMARY_ROOM: usize = 900;
/// The longest example of a subject in a summary.
const EXAMPLE_ROOM: usize = 200;

/// Every reason's allowance and what it holds back.
#[derive(Debug)]
pub struct Floods {
    burst: u32,
    refill: Duration,
    reasons: BTreeMap<String, Flood>,
}

#[derive(Debug)]
struct Flood {
    allowance: RateLimit,
    warning: bool,
    /// Held back, by subject: how often, and the first message (in order of arrival).
    held: Vec<(String, u64, String)>,
    /// Held back beyond [`SUBJECTS_HELD`] distinct subjects.
    uncounted: u64,
}

impl Floods {
    pub fn new(burst: u32, refill: Duration) -> Self {
        Self {
            burst,
            refill,
            reasons: BTreeMap::new(),
        }
    }

    /// An Event seen at `now`: returned to publish while its reason's allowance lasts, else
    /// held for a summary.
    pub fn offer(&mut self, event: NodeEvent, now: Instant) -> Option<NodeEvent> {
        let (burst, refill) = (self.burst, self.refill);
        let flood = self
            .reasons
            .entry(event.reason.clone())
            .or_insert_with(|| Flood {
                allowance: RateLimit::new(burst, refill, now),
                warning: event.warning,
                held: Vec::new(),
                uncounted: 0,
            });
        // Held ones go first: a new Event waits behind a summary not yet out.
        if flood.held.is_empty() && flood.uncounted == 0 && flood.allowance.try_take(now) {
            return Some(event);
        }
        let subject = subject(&event.note);
        match flood.held.iter().position(|(s, _, _)| *s == subject) {
            Some(at) => flood.held[at].1 += 1,
            None if flood.held.len() < SUBJECTS_HELD => flood.held.push((subject, 1, event.note)),
            None => flood.uncounted += 1,
        }
        None
    }

    /// The summaries the allowances let out at `now`.
    pub fn due(&mut self, now: Instant) -> Vec<NodeEvent> {
        let mut due = Vec::new();
        for (reason, flood) in &mut self.reasons {
            while (!flood.held.is_empty() || flood.uncounted > 0) && flood.allowance.try_take(now) {
                due.push(NodeEvent {
                    warning: flood.warning,
                    reason: reason.clone(),
                    note: summary(flood),
                });
            }
        }
        due
    }

    /// Whether anything is held back for a later summary.
    pub fn holding(&self) -> bool {
        self.reasons
            .values()
            .any(|f| !f.held.is_empty() || f.uncounted > 0)
    }
}

/// A summary of what `flood` holds, taking out the subjects it names (those that do not fit
/// stay for the next one).
fn summary(flood: &mut Flood) -> String {
    let total: u64 = flood.held.iter().map(|(_, n, _)| n).sum::<u64>() + flood.uncounted;
    let mut named = Vec::new();
    let mut room = SUMMARY_ROOM;
    while let Some((_, count, example)) = flood.held.first() {
        let line = format!(
            "{count}x {}",
            nodeward_api::bounds::cut(example, EXAMPLE_ROOM)
        );
        if !named.is_empty() && line.len() + 2 > room {
            break;
        }
        room = room.saturating_sub(line.len() + 2);
        named.push(line);
        flood.held.remove(0);
    }
    let left = flood.held.len();
    let mut note = format!(
        "{total} more held back by the rate limit; {} of them:",
        if left == 0 {
            "every kind"
        } else {
            "these kinds"
        }
    );
    note.push(' ');
    note.push_str(&named.join("; "));
    if left > 0 {
        note.push_str(&format!(" (and {left} more kinds in the next summary)"));
    }
    if flood.uncounted > 0 && left == 0 {
        note.push_str(&format!(
            " (and {} of kinds past the {SUBJECTS_HELD} kept)",
            flood.uncounted
        ));
        flood.uncounted = 0;
    }
    note
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oom(pid: u32, process: &str) -> NodeEvent {
        NodeEvent {
            warning: true,
            reason: "OOMKilling".into(),
            note: format!(
                "Out of memory: Killed process {pid} ({process}) total-vm:{}kB, anon-rss:{}kB",
                pid * 3,
                pid * 2
            ),
        }
    }

    #[test]
    fn a_flood_is_published_up_to_its_allowance_then_summarised_with_every_process() {
        let t0 = Instant::now();
        let mut floods = Floods::new(3, Duration::from_secs(30));
        let processes = ["java", "python", "node", "postgres"];
        let published: Vec<NodeEvent> = (0..500)
            .filter_map(|i| floods.offer(oom(1000 + i, processes[i as usize % 4]), t0))
            .collect();
        assert_eq!(published.len(), 3, "the burst");
        assert!(floods.holding());
        assert!(
            floods.due(t0 + Duration::from_secs(1)).is_empty(),
            "no allowance yet"
        );
        let summaries = floods.due(t0 + Duration::from_secs(30));
        assert_eq!(summaries.len(), 1);
        let note = &summaries[0].note;
        assert!(note.starts_with("497 more held back"), "{note}");
        for process in processes {
            assert!(note.contains(&format!("({process})")), "{process}: {note}");
        }
        assert!(note.len() <= 1024, "{} bytes", note.len());
        assert!(!floods.holding());
    }

    #[test]
    fn another_problem_right_after_a_flood_is_published_at_once() {
        let t0 = Instant::now();
        let mut floods = Floods::new(3, Duration::from_secs(30));
        for i in 0..100 {
            floods.offer(oom(i, "java"), t0);
        }
        let hung = NodeEvent {
            warning: true,
            reason: "TaskHung".into(),
            note: "INFO: task jbd2/sda1-8:123 blocked for more than 120 seconds.".into(),
        };
        assert_eq!(floods.offer(hung.clone(), t0), Some(hung));
    }

    #[test]
    fn subjects_that_do_not_fit_one_summary_go_in_the_next() {
        let t0 = Instant::now();
        let mut floods = Floods::new(1, Duration::from_secs(30));
        let long = "x".repeat(150);
        for i in 0..20 {
            floods.offer(
                NodeEvent {
                    warning: true,
                    reason: "IOError".into(),
                    note: format!("I/O error, dev sd{}{long}, sector 1", (b'a' + i) as char),
                },
                t0,
            );
        }
        let first = floods.due(t0 + Duration::from_secs(30));
        assert_eq!(first.len(), 1);
        assert!(
            first[0].note.contains("more kinds in the next summary"),
            "{}",
            first[0].note
        );
        assert!(first[0].note.len() <= 1024);
        let mut named = first[0].note.matches("I/O error").count();
        let mut at = t0 + Duration::from_secs(30);
        while floods.holding() {
            at += Duration::from_secs(30);
            named += floods
                .due(at)
                .iter()
                .map(|e| e.note.matches("I/O error").count())
                .sum::<usize>();
        }
        assert_eq!(named, 19, "every device but the first (published at once)");
    }
}
