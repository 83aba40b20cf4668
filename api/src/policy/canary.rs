//! `spec.canary`: a patch rollout's first nodes go alone. The rest of the policy's scope waits
//! until they succeeded and a soak time passed, so that an update that breaks nodes breaks
//! only the canaries (and the failure budget halts the rollout on them).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::Duration;

/// The canary stage of a policy's planned reboots (reason `Reboot` or `Manual`).
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.nodes) && has(self.nodeSelector))").message("canary: either nodes (how many go first) or nodeSelector (which nodes go first), not both"))]
pub struct Canary {
    /// How many nodes go first (default 1): the first planned reboots admitted are canaries
    /// until this many succeeded; the others wait for them and for `soak`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub nodes: Option<u32>,
    /// The canaries are the matched nodes this selects (e.g. `canary: "true"`): every one of
    /// them with a planned reboot waiting or under way goes before the rest, and the rest wait
    /// until at least one of them succeeded and `soak` passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::bounds::optional_selector")]
    pub node_selector: Option<LabelSelector>,
    /// How long the rest wait after the canaries succeeded (default 0s). An urgent
    /// maintenance waits for the canaries to succeed, not for the soak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soak: Option<Duration>,
    /// How long a canary's success stands for the maintenances created after it (default
    /// 24h): a maintenance created later waits for canaries of its own. Keep it shorter than
    /// the time between two rollouts, and longer than the spread of one rollout's requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1m')").message("canary.validFor must be at least 1m, e.g. 24h"))]
    pub valid_for: Option<Duration>,
}

impl Canary {
    /// `validFor` when absent.
    pub const DEFAULT_VALID_FOR: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

    /// How many nodes go first when neither `nodes` nor `nodeSelector` says.
    pub const DEFAULT_NODES: u32 = 1;
}
