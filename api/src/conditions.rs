//! Condition types and reasons: on Nodes (written by the agent, `True` means a problem), on
//! NodeMaintenances and on DisruptionPolicies.

/// Node condition types, one per problem the agent detects.
pub mod node {
    pub const NETWORK_PROBLEM: &str = "NetworkProblem";
    pub const PEER_CONNECTIVITY_PROBLEM: &str = "PeerConnectivityProblem";
    pub const SECURITY_GROUP_PROBLEM: &str = "SecurityGroupProblem";
    pub const KUBELET_PROBLEM: &str = "KubeletProblem";
    pub const REBOOT_REQUIRED: &str = "RebootRequired";
    pub const READONLY_FILESYSTEM: &str = "ReadonlyFilesystem";
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
}

/// Why the coordinator did not admit a NodeMaintenance (reason of `Admitted=False`).
pub mod denial {
    pub const BUDGET_EXHAUSTED: &str = "BudgetExhausted";
    pub const OUTSIDE_WINDOW: &str = "OutsideWindow";
    pub const PAUSED: &str = "Paused";
    pub const QUORUM_PROTECTED: &str = "QuorumProtected";
    pub const TOO_MANY_UNHEALTHY: &str = "TooManyUnhealthy";
    pub const BLOCKED: &str = "Blocked";
}
