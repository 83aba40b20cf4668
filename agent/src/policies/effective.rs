//! What applies to one maintenance, from its own drain plan and every policy that admitted it
//! (it holds a slot in each). Where they differ, the side that is kinder to the workloads
//! wins:
//! - the drain plan: the maintenance's own, else the first policy's (by name) that has one,
//!   else the default for its action; the `skip` rules of every policy join it, so a pod that
//!   any policy protects is never evicted;
//! - the drain timeout: the longest any policy sets (none set: no timeout);
//! - force on timeout: only when every policy says `onDrainTimeout: Force`;
//! - the health gate: the longest `for`, the problem types of every gate (a gate that names
//!   none means the default ones), the longest timeout (none set: no timeout);
//! - the update and the hooks: the maintenance's own, else the first policy's that has them
//!   ([`HostSteps::of`]).

use std::time::Duration;

use nodeward_api::{
    DisruptionPolicy, DisruptionPolicySpec, DrainPlan, MaintenanceAction, MaintenanceReason,
    NodeMaintenance, NodeMaintenanceSpec,
    conditions::node::HEALTH_GATE_DEFAULT,
    policy::DrainTimeoutAction,
    update::{Hooks, Update},
};

use crate::drain::plan::{self, Purpose};

/// What applies to one maintenance.
#[derive(Clone, Debug, PartialEq)]
pub struct Effective {
    pub plan: DrainPlan,
    /// Counted from the drain's start.
    pub drain_timeout: Option<Duration>,
    /// Force the drain through (PodDisruptionBudgets bypassed) when it runs out of time.
    pub force_on_timeout: bool,
    pub health_gate: HealthGate,
    /// The hooks and the update it runs on the host.
    pub host: HostSteps,
}

/// After a reboot: the node must be Ready and free of `problem_types` for `hold`, within
/// `timeout` of entering Verifying.
#[derive(Clone, Debug, PartialEq)]
pub struct HealthGate {
    pub hold: Duration,
    pub problem_types: Vec<String>,
    pub timeout: Option<Duration>,
}

impl Default for HealthGate {
    /// No policy has a gate: Ready and none of the default problems, at once, for as long
    /// as it takes.
    fn default() -> Self {
        Self {
            hold: Duration::ZERO,
            problem_types: defaults(),
            timeout: None,
        }
    }
}

fn defaults() -> Vec<String> {
    HEALTH_GATE_DEFAULT
        .iter()
        .map(|t| (*t).to_owned())
        .collect()
}

/// What a maintenance runs on the host.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostSteps {
    pub update: Option<Update>,
    pub hooks: Hooks,
}

impl HostSteps {
    /// The maintenance's own update and hooks, else the first of `policies` (sorted by name)
    /// that has them. A policy's update applies only to a planned reboot (reason Reboot or
    /// Manual): a remediation or a shutdown is not the time to patch.
    pub fn of(spec: &NodeMaintenanceSpec, policies: &[&DisruptionPolicySpec]) -> Self {
        let planned = matches!(
            spec.reason,
            MaintenanceReason::Reboot | MaintenanceReason::Manual
        );
        let update = spec.update.clone().or_else(|| {
            planned
                .then(|| policies.iter().find_map(|p| p.update.clone()))
                .flatten()
        });
        let hooks = spec
            .hooks
            .clone()
            .or_else(|| policies.iter().find_map(|p| p.hooks.clone()))
            .unwrap_or_default();
        let update = update.filter(|_| spec.action == MaintenanceAction::Reboot);
        Self { update, hooks }
    }
}

/// The longest of the durations given (unreadable ones are left out; the CRD refuses them).
fn longest<'a>(durations: impl Iterator<Item = &'a nodeward_api::Duration>) -> Option<Duration> {
    durations.filter_map(|d| d.to_std().ok()).max()
}

impl Effective {
    /// What applies to `m` under `policies`, those of the policies that admitted it that
    /// still exist.
    pub fn of(m: &NodeMaintenance, policies: &[&DisruptionPolicy]) -> Self {
        let mut policies = policies.to_vec();
        policies.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let specs: Vec<_> = policies.iter().map(|p| &p.spec).collect();
        let mut plan = m
            .spec
            .drain_plan
            .clone()
            .or_else(|| specs.iter().find_map(|s| s.drain_plan.clone()))
            .unwrap_or_else(|| plan::default_plan(Purpose::of(m.spec.action)));
        for rule in specs
            .iter()
            .filter_map(|s| s.drain_plan.as_ref())
            .flat_map(|p| &p.skip)
        {
            if !plan.skip.contains(rule) {
                plan.skip.push(rule.clone());
            }
        }
        let gates: Vec<_> = specs
            .iter()
            .filter_map(|s| s.health_gate.as_ref())
            .collect();
        let health_gate = if gates.is_empty() {
            HealthGate::default()
        } else {
            let mut problem_types: Vec<String> = gates
                .iter()
                .flat_map(|g| {
                    if g.problem_types.is_empty() {
                        defaults()
                    } else {
                        g.problem_types.clone()
                    }
                })
                .collect();
            problem_types.sort();
            problem_types.dedup();
            HealthGate {
                hold: longest(gates.iter().map(|g| &g.for_)).unwrap_or_default(),
                problem_types,
                timeout: longest(gates.iter().filter_map(|g| g.timeout.as_ref())),
            }
        };
        Self {
            plan,
            drain_timeout: longest(specs.iter().filter_map(|s| s.drain_timeout.as_ref())),
            force_on_timeout: !specs.is_empty()
                && specs
                    .iter()
                    .all(|s| s.on_drain_timeout == DrainTimeoutAction::Force),
            health_gate,
            host: HostSteps::of(&m.spec, &specs),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn maintenance(drain_plan: Option<serde_json::Value>) -> NodeMaintenance {
        serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
            "metadata": {"name": "m"},
            "spec": {"nodeName": "n", "action": "Reboot", "reason": "Manual", "drainPlan": drain_plan},
        }))
        .expect("maintenance")
    }

    fn policy(name: &str, spec: serde_json::Value) -> DisruptionPolicy {
        serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
            "metadata": {"name": name}, "spec": spec,
        }))
        .expect("policy")
    }

    fn skip(app: &str) -> serde_json::Value {
        json!({"podSelector": {"matchLabels": {"app": app}}})
    }

    #[test]
    fn the_maintenance_plan_wins_then_the_first_policy_then_the_default() {
        let b = policy(
            "b",
            json!({"drainPlan": {"stages": [{"name": "from-b", "timeout": "1m"}]}}),
        );
        let a = policy(
            "a",
            json!({"drainPlan": {"stages": [{"name": "from-a", "timeout": "1m"}]}}),
        );
        let own = json!({"stages": [{"name": "own", "timeout": "1m"}]});
        assert_eq!(
            Effective::of(&maintenance(Some(own)), &[&b, &a])
                .plan
                .stages[0]
                .name,
            "own"
        );
        assert_eq!(
            Effective::of(&maintenance(None), &[&b, &a]).plan.stages[0].name,
            "from-a"
        );
        assert_eq!(
            Effective::of(&maintenance(None), &[]).plan,
            plan::default_plan(Purpose::MachineDown)
        );
    }

    #[test]
    fn every_policys_skip_rules_protect_their_pods() {
        let a = policy(
            "a",
            json!({"drainPlan": {"stages": [{"name": "s", "timeout": "1m"}], "skip": [skip("db")]}}),
        );
        let b = policy(
            "b",
            json!({"drainPlan": {"stages": [{"name": "t", "timeout": "1m"}], "skip": [skip("cache"), skip("db")]}}),
        );
        let own = json!({"stages": [{"name": "own", "timeout": "1m"}], "skip": [skip("web")]});
        let skipped: Vec<serde_json::Value> = Effective::of(&maintenance(Some(own)), &[&a, &b])
            .plan
            .skip
            .iter()
            .map(|r| serde_json::to_value(r).expect("rule"))
            .collect();
        assert_eq!(skipped, [skip("web"), skip("db"), skip("cache")]);
    }

    #[test]
    fn the_longest_timeout_applies_and_force_needs_every_policy() {
        let fast = policy(
            "a",
            json!({"drainTimeout": "5m", "onDrainTimeout": "Force"}),
        );
        let slow = policy(
            "b",
            json!({"drainTimeout": "20m", "onDrainTimeout": "Force"}),
        );
        let careful = policy("c", json!({"onDrainTimeout": "Fail"}));
        let both = Effective::of(&maintenance(None), &[&fast, &slow]);
        assert_eq!(both.drain_timeout, Some(Duration::from_secs(1200)));
        assert!(both.force_on_timeout);
        let all = Effective::of(&maintenance(None), &[&fast, &slow, &careful]);
        assert_eq!(all.drain_timeout, Some(Duration::from_secs(1200)));
        assert!(!all.force_on_timeout, "one policy forbids forcing");
        let none = Effective::of(&maintenance(None), &[]);
        assert_eq!((none.drain_timeout, none.force_on_timeout), (None, false));
    }

    #[test]
    fn health_gates_combine_to_the_longest_hold_every_problem_and_the_longest_timeout() {
        let a = policy(
            "a",
            json!({"healthGate": {"for": "2m", "problemTypes": ["NTPProblem"], "timeout": "10m"}}),
        );
        let b = policy("b", json!({"healthGate": {"for": "5m", "timeout": "30m"}}));
        let c = policy("c", json!({}));
        let gate = Effective::of(&maintenance(None), &[&a, &b, &c]).health_gate;
        assert_eq!(gate.hold, Duration::from_secs(300));
        assert_eq!(gate.timeout, Some(Duration::from_secs(1800)));
        assert!(gate.problem_types.contains(&"NTPProblem".to_owned()));
        for default in HEALTH_GATE_DEFAULT {
            assert!(gate.problem_types.iter().any(|t| t == default), "{default}");
        }
        let only_a = Effective::of(&maintenance(None), &[&a]).health_gate;
        assert_eq!(only_a.problem_types, ["NTPProblem"]);
        assert_eq!(
            Effective::of(&maintenance(None), &[&c]).health_gate,
            HealthGate::default()
        );
    }
}
