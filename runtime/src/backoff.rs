//! Exponential backoff with full jitter for retrying API writes and reconnects.

use std::time::Duration;

#[derive(Clone, Debug)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            attempt: 0,
        }
    }

    /// The delay before the next retry: a random point in [ceiling/2, ceiling], where the
    /// ceiling doubles each attempt up to `max`. `fraction` is a random number in [0, 1).
    pub fn next_with(&mut self, fraction: f64) -> Duration {
        let ceiling = self
            .base
            .saturating_mul(1u32 << self.attempt.min(20))
            .min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        ceiling.mul_f64(0.5 + fraction.clamp(0.0, 1.0) / 2.0)
    }

    pub fn next_delay(&mut self) -> Duration {
        self.next_with(rand::random::<f64>())
    }

    /// After a success the next failure starts from `base` again.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_maximum_and_resets() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
        let ceilings: Vec<u64> = (0..6).map(|_| b.next_with(0.999_999).as_secs()).collect();
        assert_eq!(
            ceilings,
            vec![0, 1, 3, 7, 9, 9],
            "just under the ceiling 1, 2, 4, 8, 10, 10"
        );
        b.reset();
        assert_eq!(b.next_with(0.0), Duration::from_millis(500));
    }

    #[test]
    fn jitter_stays_within_half_to_full_ceiling() {
        let mut b = Backoff::new(Duration::from_secs(4), Duration::from_secs(60));
        for _ in 0..100 {
            let d = b.next_delay();
            assert!(
                d >= Duration::from_secs(2) && d <= Duration::from_secs(60),
                "{d:?}"
            );
        }
    }
}
