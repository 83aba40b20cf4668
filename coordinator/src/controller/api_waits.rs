//! When the decision loop waited on the API server (lookups, budget writes, a round's writes),
//! so that an admission's latency splits into the coordinator's own share and the API
//! server's: a maintenance that arrives while the loop writes another round's denials waits
//! for those writes, which is API server time, however long it takes on a loaded machine.

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

/// Spans kept: enough for every wait since the oldest maintenance still waiting to be
/// decided, in any round seen so far (a full round at 5,000 nodes waits a few hundred times).
const SPANS_KEPT: usize = 4096;

/// The loop's recent waits on the API server, oldest first, not overlapping (one loop).
#[derive(Debug, Default)]
pub struct ApiWaits {
    spans: VecDeque<(Instant, Instant)>,
}

impl ApiWaits {
    /// Records that the loop waited on the API server from `start` until now.
    pub fn since(&mut self, start: Instant) {
        self.record(start, Instant::now());
    }

    fn record(&mut self, start: Instant, end: Instant) {
        if end <= start {
            return;
        }
        if self.spans.len() == SPANS_KEPT {
            self.spans.pop_front();
        }
        self.spans.push_back((start, end));
    }

    /// How much of `from..to` the loop spent waiting on the API server.
    pub fn within(&self, from: Instant, to: Instant) -> Duration {
        self.spans
            .iter()
            .rev()
            .take_while(|(_, end)| *end > from)
            .map(|&(start, end)| end.min(to).saturating_duration_since(start.max(from)))
            .sum()
    }

    /// `from..to` less the waits on the API server within it: the coordinator's own share.
    pub fn own_share(&self, from: Instant, to: Instant) -> Duration {
        to.saturating_duration_since(from)
            .saturating_sub(self.within(from, to))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn only_the_waits_inside_the_interval_count() {
        let t0 = Instant::now();
        let (t, ms) = (|offset| at(t0, offset), Duration::from_millis);
        let mut waits = ApiWaits::default();
        waits.record(t(0), t(100));
        waits.record(t(150), t(400));
        waits.record(t(500), t(520));
        // Arrived mid-way through the second wait, admitted during the third.
        assert_eq!(waits.within(t(300), t(510)), ms(100 + 10));
        assert_eq!(waits.own_share(t(300), t(510)), ms(100));
        // Before all of them, none; across all, all.
        assert_eq!(waits.within(t(600), t(700)), Duration::ZERO);
        assert_eq!(waits.within(t(0), t(1000)), ms(370));
    }

    #[test]
    fn an_admission_with_no_wait_is_all_own_share() {
        let t0 = Instant::now();
        let waits = ApiWaits::default();
        let own = waits.own_share(at(t0, 10), at(t0, 35));
        assert_eq!(own, Duration::from_millis(25));
    }

    #[test]
    fn old_spans_give_way_to_new_ones() {
        let t0 = Instant::now();
        let mut waits = ApiWaits::default();
        for i in 0..(SPANS_KEPT as u64 + 10) {
            waits.record(at(t0, i * 10), at(t0, i * 10 + 5));
        }
        assert_eq!(waits.spans.len(), SPANS_KEPT);
        assert_eq!(waits.spans.front().map(|s| s.0), Some(at(t0, 100)));
    }
}
