//! Condition types and reasons: on Nodes (written by the agent, `True` means a problem), on
//! NodeMaintenances and on DisruptionPolicies.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// Sets `condition` in `conditions` (one per type, sorted by type), keeping the transition
/// time of the one it replaces while the status stays the same.
pub fn set(conditions: &mut Vec<Condition>, condition: Condition) {
    let condition = carried(conditions, condition);
    conditions.retain(|c| c.type_ != condition.type_);
    conditions.push(condition);
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
}

/// `condition` as it replaces its type among `conditions`: with the transition time it had
/// while its status stays the same.
pub fn carried(conditions: &[Condition], mut condition: Condition) -> Condition {
    if let Some(old) = conditions
        .iter()
        .find(|c| c.type_ == condition.type_ && c.status == condition.status)
    {
        condition.last_transition_time = old.last_transition_time.clone();
    }
    condition
}

/// Node condition types, one per problem the agent detects.
pub mod node {
    pub const NETWORK_PROBLEM: &str = "NetworkProblem";
    pub const PEER_CONNECTIVITY_PROBLEM: &str = "PeerConnectivityProblem";
    pub const SECURITY_GROUP_PROBLEM: &str = "SecurityGroupProblem";
    pub const KUBELET_PROBLEM: &str = "KubeletProblem";
    pub const REBOOT_REQUIRED: &str = "RebootRequired";
    pub const READONLY_FILESYSTEM: &str = "ReadonlyFilesystem";
    /// The kernel log: the container runtime's task hung (node-problem-detector's type).
    pub const KERNEL_DEADLOCK: &str = "KernelDeadlock";
    /// The kernel log: an XFS filesystem shut down (node-problem-detector's type).
    pub const XFS_SHUTDOWN: &str = "XfsShutdown";
    /// The kernel log: UEFI CPER reported a fatal hardware error (node-problem-detector's type).
    pub const CPER_HARDWARE_ERROR_FATAL: &str = "CperHardwareErrorFatal";
    /// The container runtime's unit is down or its CRI socket does not answer ready
    /// (node-problem-detector's type).
    pub const CONTAINER_RUNTIME_UNHEALTHY: &str = "ContainerRuntimeUnhealthy";
    /// The container runtime's unit restarted again and again (node-problem-detector's type).
    pub const FREQUENT_CONTAINERD_RESTART: &str = "FrequentContainerdRestart";
    /// The cloud announced that it takes the node down (a spot interruption, a scheduled
    /// reboot, stop or retirement) or recommends moving off it (a rebalance recommendation).
    pub const CLOUD_DISRUPTION_SCHEDULED: &str = "CloudDisruptionScheduled";
    /// Reported in the NodeReport and as an Event, never as a condition: a node that never
    /// registered has no Node object to carry one.
    pub const KUBELET_UNREGISTERED: &str = "KubeletUnregistered";
    /// The problems a post-reboot health gate checks by default (a pending reboot is not one).
    pub const HEALTH_GATE_DEFAULT: &[&str] = &[
        NETWORK_PROBLEM,
        PEER_CONNECTIVITY_PROBLEM,
        SECURITY_GROUP_PROBLEM,
        KUBELET_PROBLEM,
        READONLY_FILESYSTEM,
        KERNEL_DEADLOCK,
        XFS_SHUTDOWN,
        CPER_HARDWARE_ERROR_FATAL,
        CONTAINER_RUNTIME_UNHEALTHY,
        FREQUENT_CONTAINERD_RESTART,
    ];
    /// Written by the coordinator: the node never became Ready within a policy's
    /// `nodeStartupTimeout`.
    pub const STARTUP_TIMED_OUT: &str = "StartupTimedOut";
    /// The condition types the agent's own detectors write on its Node (the chart's admission
    /// policy lets the agent write these and those its configuration adds, no other).
    pub const WRITTEN_BY_AGENT: &[&str] = &[
        NETWORK_PROBLEM,
        PEER_CONNECTIVITY_PROBLEM,
        SECURITY_GROUP_PROBLEM,
        KUBELET_PROBLEM,
        REBOOT_REQUIRED,
        READONLY_FILESYSTEM,
        KERNEL_DEADLOCK,
        XFS_SHUTDOWN,
        CPER_HARDWARE_ERROR_FATAL,
        CONTAINER_RUNTIME_UNHEALTHY,
        FREQUENT_CONTAINERD_RESTART,
        CLOUD_DISRUPTION_SCHEDULED,
    ];
    /// Condition types others own (the kubelet, the network plugin, the coordinator), which a
    /// custom check or kernel-log pattern may not take.
    pub const OWNED_BY_OTHERS: &[&str] = &[
        "Ready",
        "MemoryPressure",
        "DiskPressure",
        "PIDPressure",
        "NetworkUnavailable",
        STARTUP_TIMED_OUT,
    ];
}

/// NodeMaintenance condition types.
pub mod maintenance {
    /// `True` once the coordinator admitted it; `False` with a [`super::denial`] reason.
    pub const ADMITTED: &str = "Admitted";
    /// `True` while the node is drained (tainted and cordoned, pods evicted).
    pub const DRAINED: &str = "Drained";
    /// `False` when the coordinator ended or sent back a maintenance whose node may still carry
    /// its taint and cordon (a deadline passed without the agent): the agent undoes them when
    /// it runs again and sets it `True`.
    pub const NODE_RESTORED: &str = "NodeRestored";
    /// Written by the coordinator while a reboot that evicted pods is Verifying: `True` once
    /// the controllers of those pods are available again (or the gate is off), `False` while
    /// they are short ([`workloads`](super::workloads) reasons).
    pub const WORKLOADS_AVAILABLE: &str = "WorkloadsAvailable";
}

/// Reasons of a maintenance's `WorkloadsAvailable` condition.
pub mod workloads {
    /// Every controller of the evicted pods has all its replicas available.
    pub const AVAILABLE: &str = "Available";
    /// No policy of the maintenance waits for them (`workloadGate.waitForEvicted: false`).
    pub const NOT_CHECKED: &str = "NotChecked";
    /// Some are short; the message says which and by how much.
    pub const WAITING: &str = "Waiting";
    /// Still short after `workloadGate.timeout`: the maintenance succeeds, with this as the
    /// warning (`onTimeout: Succeed`).
    pub const TIMED_OUT: &str = "TimedOut";
    /// Still short after `workloadGate.timeout`, and the policy says `onTimeout: Fail`.
    pub const TIMED_OUT_FAILED: &str = "TimedOutFailed";
}

/// Why the coordinator moved a maintenance on its own: a deadline of the policy's `deadlines`
/// passed (the reason of its Event and of `NodeRestored=False`).
pub mod overdue {
    /// Admitted, but its agent did not start it within `deadlines.start`: back to Pending.
    pub const NOT_STARTED: &str = "NotStarted";
    /// Acting on a reboot and no new boot within `deadlines.reboot`: Failed.
    pub const NODE_DID_NOT_RETURN: &str = "NodeDidNotReturn";
    /// Draining for longer than `deadlines.drain` (the agent neither finished nor failed the
    /// drain): Failed.
    pub const DRAIN_NOT_FINISHED: &str = "DrainNotFinished";
    /// Verifying for longer than `deadlines.verify` (the agent neither passed nor failed the
    /// health gate): Failed.
    pub const NOT_VERIFIED: &str = "NotVerified";
    /// The node's agent silent for `deadlines.agentLost`: the coordinator finished it.
    pub const AGENT_LOST: &str = "AgentLost";
    /// An admitted DeleteNode of a dead node: Acting at once, the node deleted without a drain.
    pub const NODE_DEAD: &str = "NodeDead";
}

/// DisruptionPolicy condition types.
pub mod policy {
    /// `True` only once every agent in scope acknowledged the pause and nothing there is
    /// draining or acting.
    pub const PAUSED: &str = "Paused";
    /// `False` with reason `TooManyUnhealthy` when `maxUnhealthy` is exceeded.
    pub const REMEDIATION_ALLOWED: &str = "RemediationAllowed";
    /// `False` with the problem when the spec cannot be applied (nothing in scope is admitted).
    pub const VALID: &str = "Valid";
    /// `True` (reason `FailureBudgetSpent`, naming the failed nodes) once `failureBudget` is
    /// spent: nothing more in scope is admitted until an operator resumes the policy.
    pub const HALTED: &str = "Halted";
    /// `True` once the canaries of `canary` succeeded and soaked (for a maintenance created
    /// now); `False` (reason `CanaryPending`) while the rest of the scope waits for them.
    pub const CANARY_PASSED: &str = "CanaryPassed";
    /// `True` (reason `AllUpdated`) once every matched node is updated (`status.progress`);
    /// `False` (reason `Updating`) with the counts while not.
    pub const UPDATED: &str = "Updated";
}

/// Why the coordinator did not admit a NodeMaintenance (reason of `Admitted=False`).
pub mod denial {
    pub const BUDGET_EXHAUSTED: &str = "BudgetExhausted";
    pub const OUTSIDE_WINDOW: &str = "OutsideWindow";
    /// Inside one of a policy's blackouts (`spec.blackouts`, a change freeze): nothing in its
    /// scope is admitted until it ends, whatever the windows say.
    pub const IN_BLACKOUT: &str = "InBlackout";
    pub const PAUSED: &str = "Paused";
    pub const QUORUM_PROTECTED: &str = "QuorumProtected";
    pub const TOO_MANY_UNHEALTHY: &str = "TooManyUnhealthy";
    pub const BLOCKED: &str = "Blocked";
    /// The node's agent has not written its heartbeat within `deadlines.agentHeartbeat`.
    pub const AGENT_UNAVAILABLE: &str = "AgentUnavailable";
    /// A PodDisruptionBudget covering a pod on the node allows no disruption now
    /// (`workloadGate.checkDisruptionBudgets`).
    pub const WORKLOAD_NOT_READY: &str = "WorkloadNotReady";
    /// A policy selecting the node spent its `failureBudget` and was not resumed since.
    pub const ROLLOUT_HALTED: &str = "RolloutHalted";
    /// A policy selecting the node has a canary stage, the node is no canary, and the canaries
    /// have not all succeeded (and soaked) yet.
    pub const CANARY_PENDING: &str = "CanaryPending";
    /// One of the `gates` of a policy selecting the node does not hold (its expression is
    /// false or fails, or its object is missing or could not be read); the message names it.
    pub const GATE_CLOSED: &str = "GateClosed";
}

#[cfg(test)]
pub(crate) mod tests {
    use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};

    use super::*;

    /// A condition of `type_` with `status`, last changed at second `second` (test support
    /// for the crate's tests).
    pub(crate) fn condition(type_: &str, status: &str, second: i64) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "Test".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(Timestamp::from_second(second).expect("a valid time")),
        }
    }

    #[test]
    fn setting_a_condition_keeps_its_transition_time_until_the_status_changes() {
        let mut conditions = vec![condition("B", "True", 1)];
        set(&mut conditions, condition("A", "False", 2));
        set(&mut conditions, condition("B", "True", 3));
        assert_eq!(conditions.len(), 2);
        assert_eq!(conditions[0].type_, "A", "sorted by type");
        assert_eq!(
            conditions[1].last_transition_time,
            condition("B", "True", 1).last_transition_time
        );
        set(&mut conditions, condition("B", "False", 4));
        assert_eq!(conditions[1].status, "False");
        assert_eq!(
            conditions[1].last_transition_time,
            condition("B", "False", 4).last_transition_time
        );
    }
}
