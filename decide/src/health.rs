//! Cluster health as remediation sees it: whether a node is unhealthy (NotReady, a configured
//! condition held too long, a stale agent heartbeat), whether it never became Ready within the
//! startup timeout, and whether remediation may go on (`maxUnhealthy`, with a cooldown after
//! a storm). Pure functions over plain data.

use std::time::Duration;

use jiff::Timestamp;

/// A node condition as observed, with when it took its status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedCondition {
    pub type_: String,
    pub status: String,
    pub since: Timestamp,
}

/// What is known of one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub created: Timestamp,
    /// Every condition on the Node, `Ready` included.
    pub conditions: Vec<ObservedCondition>,
    /// The agent's last heartbeat (its NodeReport), if it has one.
    pub agent_heartbeat: Option<Timestamp>,
    /// Whether the node was ever seen Ready (the controller remembers; a Node object alone
    /// does not say).
    pub ever_ready: bool,
}

/// A condition that makes a node unhealthy when it holds for `for_`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnhealthyRule {
    pub type_: String,
    pub status: String,
    pub for_: Duration,
}

/// The remediation settings of a policy, parsed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rules {
    pub unhealthy: Vec<UnhealthyRule>,
    pub heartbeat_timeout: Option<Duration>,
    pub startup_timeout: Option<Duration>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    Healthy,
    /// Unhealthy, and why.
    Unhealthy(String),
    /// Never became Ready within the startup timeout.
    NeverReady(String),
    /// Not Ready yet, still within the startup timeout: neither healthy nor to be remediated.
    Starting,
}

fn held(since: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(since)).unwrap_or(Duration::ZERO)
}

/// Assesses one node at `now`.
pub fn assess(node: &Observed, rules: &Rules, now: Timestamp) -> Health {
    let ready = node.conditions.iter().find(|c| c.type_ == "Ready");
    if ready.is_none_or(|c| c.status != "True") && !node.ever_ready {
        let age = held(node.created, now);
        return match rules.startup_timeout {
            Some(timeout) if age >= timeout => Health::NeverReady(format!(
                "not Ready {}s after it was created (nodeStartupTimeout {}s)",
                age.as_secs(),
                timeout.as_secs()
            )),
            _ => Health::Starting,
        };
    }
    for rule in &rules.unhealthy {
        if let Some(c) = node
            .conditions
            .iter()
            .find(|c| c.type_ == rule.type_ && c.status == rule.status)
            && held(c.since, now) >= rule.for_
        {
            return Health::Unhealthy(format!(
                "{}={} for {}s (limit {}s)",
                c.type_,
                c.status,
                held(c.since, now).as_secs(),
                rule.for_.as_secs()
            ));
        }
    }
    if let Some(c) = ready.filter(|c| c.status != "True")
        && rules.unhealthy.iter().all(|r| r.type_ != "Ready")
    {
        return Health::Unhealthy(format!("Ready={} since {}", c.status, c.since));
    }
    if let (Some(timeout), Some(beat)) = (rules.heartbeat_timeout, node.agent_heartbeat)
        && held(beat, now) >= timeout
    {
        return Health::Unhealthy(format!(
            "agent heartbeat {}s old (limit {}s)",
            held(beat, now).as_secs(),
            timeout.as_secs()
        ));
    }
    Health::Healthy
}

/// Whether remediation may go on: not while more nodes than `limit` are unhealthy, and after
/// such a storm, not before `cooldown` has passed with the count back within the limit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemediationGate {
    /// When the count last exceeded the limit, or came back within it after a storm.
    storm: Option<(bool, Timestamp)>,
}

impl RemediationGate {
    /// Feeds the current count; returns whether remediation is allowed, and why not.
    pub fn allow(
        &mut self,
        unhealthy: usize,
        limit: usize,
        cooldown: Duration,
        now: Timestamp,
    ) -> Result<(), String> {
        if unhealthy > limit {
            self.storm = Some((true, now));
            return Err(format!(
                "{unhealthy} unhealthy nodes, more than maxUnhealthy {limit}"
            ));
        }
        match self.storm {
            Some((true, _)) => {
                self.storm = Some((false, now));
                Err(format!(
                    "unhealthy nodes back within maxUnhealthy {limit}; cooling down for {}s",
                    cooldown.as_secs()
                ))
            }
            Some((false, calmed)) if held(calmed, now) < cooldown => Err(format!(
                "cooling down after too many unhealthy nodes: {}s of {}s",
                held(calmed, now).as_secs(),
                cooldown.as_secs()
            )),
            _ => {
                self.storm = None;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("timestamp")
    }

    fn node(ready: &str, ready_since: i64) -> Observed {
        Observed {
            created: t(0),
            conditions: vec![ObservedCondition {
                type_: "Ready".into(),
                status: ready.into(),
                since: t(ready_since),
            }],
            agent_heartbeat: Some(t(ready_since)),
            ever_ready: true,
        }
    }

    fn rules() -> Rules {
        Rules {
            unhealthy: vec![UnhealthyRule {
                type_: "Ready".into(),
                status: "False".into(),
                for_: Duration::from_secs(300),
            }],
            heartbeat_timeout: Some(Duration::from_secs(120)),
            startup_timeout: Some(Duration::from_secs(600)),
        }
    }

    #[test]
    fn a_condition_counts_only_after_its_duration() {
        let n = node("False", 1000);
        assert_eq!(
            assess(&n, &rules(), t(1100)),
            Health::Healthy,
            "NotReady, but not for 300s yet"
        );
        assert!(
            matches!(assess(&n, &rules(), t(1300)), Health::Unhealthy(m) if m.starts_with("Ready=False for 300s"))
        );
    }

    #[test]
    fn a_stale_agent_heartbeat_is_unhealthy() {
        let mut n = node("True", 1000);
        n.agent_heartbeat = Some(t(1000));
        assert_eq!(assess(&n, &rules(), t(1100)), Health::Healthy);
        assert!(
            matches!(assess(&n, &rules(), t(1120)), Health::Unhealthy(m) if m.starts_with("agent heartbeat 120s old"))
        );
    }

    #[test]
    fn a_node_that_never_became_ready_hits_the_startup_timeout() {
        let mut n = node("False", 0);
        n.ever_ready = false;
        assert_eq!(assess(&n, &rules(), t(300)), Health::Starting);
        assert!(matches!(
            assess(&n, &rules(), t(600)),
            Health::NeverReady(_)
        ));
        n.conditions.clear();
        assert!(
            matches!(assess(&n, &rules(), t(700)), Health::NeverReady(_)),
            "no Ready condition at all"
        );
    }

    #[test]
    fn the_gate_closes_in_a_storm_and_reopens_after_the_cooldown() {
        let cooldown = Duration::from_secs(600);
        let mut gate = RemediationGate::default();
        assert_eq!(gate.allow(1, 2, cooldown, t(0)), Ok(()));
        assert!(gate.allow(3, 2, cooldown, t(10)).is_err());
        assert!(
            gate.allow(2, 2, cooldown, t(20))
                .expect_err("cooling")
                .contains("cooling down")
        );
        assert!(gate.allow(1, 2, cooldown, t(500)).is_err());
        assert_eq!(gate.allow(1, 2, cooldown, t(620)), Ok(()));
        assert_eq!(gate.allow(1, 2, cooldown, t(630)), Ok(()));
    }
}
