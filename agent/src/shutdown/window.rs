//! How long a drain before shutdown gets: logind delays a shutdown only so long
//! (`InhibitDelayMaxSec`), and the lock must be released a margin before that.

use std::time::Duration;

/// The safety margin of a drain that may take up to `window`: the configured one, or a
/// twentieth of the window from 1s to 5s (4s of drain in logind's default 5s, 115s in 120s).
pub fn margin(configured: Option<Duration>, window: Duration) -> Duration {
    configured
        .unwrap_or_else(|| (window / 20).clamp(Duration::from_secs(1), Duration::from_secs(5)))
}

/// How long a drain gets: the budget or logind's delay, whichever is shorter, less the margin.
pub fn drain_window(budget: Duration, delay: Duration, configured: Option<Duration>) -> Duration {
    let window = budget.min(delay);
    window.saturating_sub(margin(configured, window))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_margin_scales_with_the_drains_time() {
        let s = Duration::from_secs;
        // logind's default delay: the drain gets 4s, not 0s.
        assert_eq!(drain_window(s(120), s(5), None), s(4));
        assert_eq!(drain_window(s(120), s(120), None), s(115));
        assert_eq!(
            drain_window(s(30), s(120), None),
            Duration::from_millis(28_500)
        );
        assert_eq!(drain_window(s(600), s(600), None), s(595));
        // A configured margin is taken as it is.
        assert_eq!(drain_window(s(120), s(5), Some(s(5))), Duration::ZERO);
        assert_eq!(drain_window(s(15), s(120), Some(s(2))), s(13));
    }
}
