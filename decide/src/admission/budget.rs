//! Budget math: a policy's `maxConcurrent` and `maxUnhealthy` as counts of nodes.
//!
//! Rounding, as documented for users:
//! - `maxConcurrent: "10%"` is 10% of the matched nodes rounded **down**, but at least 1 when the
//!   percentage is above 0% and the policy matches any node (so a small pool still makes
//!   progress: 10% of 5 nodes is 1). `"0%"` and `0` admit nothing.
//! - `maxUnhealthy: "40%"` is 40% of the matched nodes rounded **down**, with no minimum
//!   (remediation stops early rather than late).

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// How a percentage becomes a count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rounding {
    /// Down, but at least 1 when above 0% and there is anything to count (`maxConcurrent`).
    DownAtLeastOne,
    /// Down (`maxUnhealthy`).
    Down,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {value:?} is not an integer >= 0 or a percentage from \"0%\" to \"100%\"")]
pub struct InvalidLimit {
    pub field: &'static str,
    pub value: String,
}

/// The number of nodes `limit` allows out of `matched`.
pub fn resolve(
    field: &'static str,
    limit: &IntOrString,
    matched: usize,
    rounding: Rounding,
) -> Result<usize, InvalidLimit> {
    let invalid = || InvalidLimit {
        field,
        value: match limit {
            IntOrString::Int(i) => i.to_string(),
            IntOrString::String(s) => s.clone(),
        },
    };
    match limit {
        IntOrString::Int(count) => usize::try_from(*count).map_err(|_| invalid()),
        IntOrString::String(text) => {
            let percent: usize = text
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .filter(|p| *p <= 100)
                .ok_or_else(invalid)?;
            let count = matched * percent / 100;
            Ok(match rounding {
                Rounding::DownAtLeastOne if percent > 0 && matched > 0 => count.max(1),
                _ => count,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pct(text: &str) -> IntOrString {
        IntOrString::String(text.to_owned())
    }

    #[test]
    fn counts_are_taken_as_they_are() {
        assert_eq!(
            resolve(
                "maxConcurrent",
                &IntOrString::Int(3),
                100,
                Rounding::DownAtLeastOne
            ),
            Ok(3)
        );
        assert_eq!(
            resolve(
                "maxConcurrent",
                &IntOrString::Int(0),
                100,
                Rounding::DownAtLeastOne
            ),
            Ok(0)
        );
        assert!(
            resolve(
                "maxConcurrent",
                &IntOrString::Int(-1),
                100,
                Rounding::DownAtLeastOne
            )
            .is_err()
        );
    }

    #[test]
    fn max_concurrent_percentages_round_down_but_make_progress() {
        let r = |p: &str, n: usize| resolve("maxConcurrent", &pct(p), n, Rounding::DownAtLeastOne);
        assert_eq!(r("10%", 100), Ok(10));
        assert_eq!(r("10%", 109), Ok(10), "10.9 rounds down");
        assert_eq!(r("10%", 5), Ok(1), "0.5 would be 0: at least one");
        assert_eq!(r("0%", 100), Ok(0));
        assert_eq!(r("100%", 7), Ok(7));
        assert_eq!(r("10%", 0), Ok(0), "nothing matched, nothing to admit");
    }

    #[test]
    fn max_unhealthy_percentages_round_down_without_minimum() {
        let r = |p: &str, n: usize| resolve("maxUnhealthy", &pct(p), n, Rounding::Down);
        assert_eq!(r("40%", 10), Ok(4));
        assert_eq!(r("40%", 2), Ok(0));
    }

    #[test]
    fn malformed_percentages_name_the_field() {
        for bad in ["150%", "ten%", "10", "-5%", ""] {
            let err =
                resolve("maxConcurrent", &pct(bad), 10, Rounding::DownAtLeastOne).expect_err(bad);
            assert!(err.to_string().starts_with("maxConcurrent: "), "{err}");
        }
    }
}
