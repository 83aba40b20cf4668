//! The coordinator's Prometheus metrics. Labels carry policy names, denial reasons and the
//! kinds of a round's writes (small sets), never node or maintenance names.

use std::sync::Arc;

use nodeward_decide::{admission::rules::RULES, round::EFFECTS};
use nodeward_runtime::write::Outcome;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabels {
    pub policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

/// An admission rule of [`RULES`] and one of its denial reasons.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DenialLabels {
    pub rule: &'static str,
    pub reason: &'static str,
}

/// One kind of a round's writes ([`EFFECTS`]) and what became of it ([`Applied`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EffectLabels {
    pub effect: &'static str,
    /// [`Applied::name`].
    pub outcome: &'static str,
}

/// What became of one effect of a round's plan. Of a batch (the slots and admissions, the
/// denials, a release), the worst of its writes.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum Applied {
    /// Nothing needed writing (already so, or debounced).
    Unchanged,
    Written,
    /// Its object is gone (404).
    Gone,
    /// Its object changed since the round read it (409): the next round decides again.
    Conflict,
    Failed,
}

impl Applied {
    pub const ALL: [Applied; 5] = [
        Self::Unchanged,
        Self::Written,
        Self::Gone,
        Self::Conflict,
        Self::Failed,
    ];

    pub fn of<K>(outcome: &Outcome<K>) -> Self {
        match outcome {
            Outcome::Written(_) => Self::Written,
            Outcome::Gone(_) => Self::Gone,
            Outcome::Conflict(_) => Self::Conflict,
            Outcome::Failed(_) => Self::Failed,
        }
    }

    /// Of several writes, the worst; of none, `Unchanged`.
    pub fn worst(all: impl IntoIterator<Item = Self>) -> Self {
        all.into_iter().max().unwrap_or(Self::Unchanged)
    }

    /// Its label value.
    pub fn name(self) -> &'static str {
        match self {
            Self::Unchanged => "unchanged",
            Self::Written => "written",
            Self::Gone => "gone",
            Self::Conflict => "conflict",
            Self::Failed => "failed",
        }
    }

    pub fn is_written(self) -> bool {
        self == Self::Written
    }
}

/// `full`: a round over every watched object; `admission`: one that decided only maintenances
/// created since (see [`nodeward_decide::round::admit_new`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoundLabels {
    pub round: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Every metric the coordinator exports.
pub struct Metrics {
    registry: Registry,
    pub leader: Gauge,
    pub admissions: Counter,
    /// By admission rule and reason: every rule of [`RULES`] from the start, at zero.
    pub denials: Family<DenialLabels, Counter>,
    /// A round's writes by effect and outcome: every pair from the start, at zero.
    pub effects: Family<EffectLabels, Counter>,
    /// Maintenances moved on by the coordinator because a deadline passed, by reason.
    pub deadlines_passed: Family<ReasonLabels, Counter>,
    pub budget_used: Family<PolicyLabels, Gauge>,
    pub budget_max: Family<PolicyLabels, Gauge>,
    pub unhealthy: Family<PolicyLabels, Gauge>,
    /// Time of one reconcile round's decisions (no API calls), by kind of round.
    pub decision_seconds: Histograms<RoundLabels>,
    /// From a maintenance's creation to its admission being written.
    pub admission_latency_seconds: Histogram,
    /// The coordinator's own share of an admission decided as soon as it arrived: from its
    /// watch event to its admission write, less the decision loop's waits on the API server
    /// meanwhile (lookups, budget writes, an earlier round's writes).
    pub admission_coordinator_seconds: Histogram,
    /// Conditional budget writes refused because another writer changed the policy first.
    pub slot_conflicts: Counter,
    pub remediations: Counter,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("nodeward_coordinator");
        let metrics = Self {
            leader: Gauge::default(),
            admissions: Counter::default(),
            denials: Family::default(),
            effects: Family::default(),
            deadlines_passed: Family::default(),
            budget_used: Family::default(),
            budget_max: Family::default(),
            unhealthy: Family::default(),
            decision_seconds: Family::new_with_constructor(|| {
                Histogram::new([0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0])
            }),
            admission_latency_seconds: Histogram::new([
                0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 30.0, 300.0,
            ]),
            admission_coordinator_seconds: Histogram::new([
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
            ]),
            slot_conflicts: Counter::default(),
            remediations: Counter::default(),
            registry: Registry::default(),
        };
        registry.register(
            "leader",
            "1 while this coordinator leads",
            metrics.leader.clone(),
        );
        registry.register(
            "admissions",
            "Maintenances admitted",
            metrics.admissions.clone(),
        );
        registry.register(
            "denials",
            "Admission denials newly recorded on a maintenance, by admission rule and reason",
            metrics.denials.clone(),
        );
        registry.register(
            "effects",
            "What a round's plan wrote, by effect (in the order written) and outcome",
            metrics.effects.clone(),
        );
        registry.register(
            "deadlines_passed",
            "Maintenances the coordinator moved on because their agent missed a deadline, by reason",
            metrics.deadlines_passed.clone(),
        );
        registry.register(
            "budget_used",
            "Nodes disrupted (slots held plus NotReady) per policy",
            metrics.budget_used.clone(),
        );
        registry.register(
            "budget_max",
            "maxConcurrent per policy, as a count",
            metrics.budget_max.clone(),
        );
        registry.register(
            "unhealthy_nodes",
            "Unhealthy nodes per policy",
            metrics.unhealthy.clone(),
        );
        registry.register(
            "decision_duration_seconds",
            "Time to decide one reconcile round (without API calls), by round: full or admission",
            metrics.decision_seconds.clone(),
        );
        registry.register(
            "admission_latency_seconds",
            "From a maintenance's creation to its admission",
            metrics.admission_latency_seconds.clone(),
        );
        registry.register(
            "admission_coordinator_seconds",
            "From a new maintenance's watch event to its admission write, less the decision loop's waits on the API server meanwhile (admitted at once)",
            metrics.admission_coordinator_seconds.clone(),
        );
        registry.register(
            "slot_conflicts",
            "Budget writes refused with Conflict (another writer was first)",
            metrics.slot_conflicts.clone(),
        );
        registry.register(
            "remediations",
            "Remediation maintenances created",
            metrics.remediations.clone(),
        );
        metrics.zeroed();
        Self {
            registry,
            ..metrics
        }
    }

    /// Every admission rule with each of its reasons, and every effect with each outcome, as
    /// a series from the start, at zero: a dashboard sees what can happen before it does.
    fn zeroed(&self) {
        for rule in RULES {
            for reason in rule.reasons {
                let labels = DenialLabels {
                    rule: rule.name,
                    reason,
                };
                drop(self.denials.get_or_create(&labels));
            }
        }
        for effect in EFFECTS {
            for outcome in Applied::ALL {
                let outcome = outcome.name();
                drop(
                    self.effects
                        .get_or_create(&EffectLabels { effect, outcome }),
                );
            }
        }
    }

    pub fn encode(&self) -> String {
        nodeward_runtime::metrics::encode(&self.registry)
    }

    /// The encoder the health and metrics server calls.
    pub fn encoder(self: &Arc<Self>) -> nodeward_runtime::server::Encode {
        nodeward_runtime::metrics::encoder(self.clone(), |m| &m.registry)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The metrics count the rules the code checks: each rule, with each of its reasons, is a
    /// series from the start, and no other rule is.
    #[test]
    fn every_admission_rule_is_a_denial_series_from_the_start() {
        let text = Metrics::new().encode();
        let series: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("nodeward_coordinator_denials_total{"))
            .collect();
        let expected: usize = RULES.iter().map(|r| r.reasons.len()).sum();
        assert_eq!(series.len(), expected, "{series:#?}");
        for rule in RULES {
            for reason in rule.reasons {
                let line = format!(
                    "nodeward_coordinator_denials_total{{rule=\"{}\",reason=\"{reason}\"}} 0",
                    rule.name
                );
                assert!(series.contains(&line.as_str()), "{line} in {series:#?}");
            }
        }
    }

    #[test]
    fn every_effect_and_outcome_is_a_series_from_the_start() {
        let text = Metrics::new().encode();
        for effect in EFFECTS {
            for outcome in ["unchanged", "written", "gone", "conflict", "failed"] {
                let line = format!(
                    "nodeward_coordinator_effects_total{{effect=\"{effect}\",outcome=\"{outcome}\"}} 0"
                );
                assert!(text.contains(&line), "{line} in {text}");
            }
        }
    }
}
