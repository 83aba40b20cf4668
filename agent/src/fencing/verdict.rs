//! Whether the agent goes on feeding its watchdog or fences its node: pure, over when the API
//! server last took its heartbeat (as the coordinator counts it heard) and when each peer last
//! answered a fencing probe. Cut off from the API server, it goes on while more than half of
//! the agents it counts (itself among them) answer: a fleet whose API server is down reaches
//! most of itself and does not reset itself; a node cut off from most of the fleet may be the
//! one the coordinator's side judges dead, and resets.

use std::time::{Duration, Instant};

/// What the agent does with its watchdog now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Feed,
    /// Stop feeding it: why.
    Fence(String),
}

/// What the verdict is taken over.
#[derive(Clone, Debug)]
pub struct Contacts<'a> {
    /// When the API server last took its heartbeat (armed only after the first).
    pub api: Instant,
    /// When each peer that answered last did.
    pub answers: &'a [Instant],
    /// The agents its published fencing counts, itself among them.
    pub agents: u32,
}

pub fn verdict(contacts: &Contacts<'_>, now: Instant, after: Duration) -> Verdict {
    let api = now.saturating_duration_since(contacts.api);
    if api < after {
        return Verdict::Feed;
    }
    let answering = contacts
        .answers
        .iter()
        .filter(|at| now.saturating_duration_since(**at) < after)
        .count();
    let counted = answering.saturating_add(1);
    if counted.saturating_mul(2) > contacts.agents as usize {
        return Verdict::Feed;
    }
    Verdict::Fence(format!(
        "no heartbeat taken by the API server for {}s, and {answering} of the {} other agents it counts answered within the last {}s (it goes on while more than half of all {} answer)",
        api.as_secs(),
        contacts.agents.saturating_sub(1),
        after.as_secs(),
        contacts.agents,
    ))
}

/// Whether to probe every peer now: once half of `after` passed without the API server, so
/// that the answers are there when it counts them.
pub fn probing(api: Instant, now: Instant, after: Duration) -> bool {
    now.saturating_duration_since(api) >= after / 2
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER: Duration = Duration::from_secs(60);

    #[test]
    fn fed_while_the_api_server_takes_its_heartbeat() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let recent = Contacts {
            api: at(100),
            answers: &[],
            agents: 5,
        };
        assert_eq!(verdict(&recent, at(159), AFTER), Verdict::Feed);
        assert!(!probing(recent.api, at(129), AFTER));
        assert!(probing(recent.api, at(130), AFTER));
    }

    #[test]
    fn cut_off_it_goes_on_while_more_than_half_of_the_agents_answer_and_fences_when_not() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // Five agents: itself and two recent answers are three, a majority.
        let majority = [at(150), at(140), at(50)];
        let contacts = Contacts {
            api: at(0),
            answers: &majority,
            agents: 5,
        };
        assert_eq!(verdict(&contacts, at(160), AFTER), Verdict::Feed);
        // Ten seconds later the one at 140 is older than 60 s: two of five.
        let Verdict::Fence(why) = verdict(&contacts, at(200), AFTER) else {
            panic!("two of five");
        };
        assert!(
            why.contains("for 200s") && why.contains("1 of the 4 other agents"),
            "{why}"
        );
        // Never a peer at all.
        let alone = Contacts {
            api: at(0),
            answers: &[],
            agents: 2,
        };
        assert!(matches!(verdict(&alone, at(60), AFTER), Verdict::Fence(_)));
        // The only agent counted: no one else could run its pods.
        let only = Contacts {
            api: at(0),
            answers: &[],
            agents: 1,
        };
        assert_eq!(verdict(&only, at(1000), AFTER), Verdict::Feed);
    }
}
