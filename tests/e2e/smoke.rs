//! Smoke tests that prove the parts of the test control plane are real: the API server
//! enforces the CRDs' CEL rules, the disruption controller backs PDB-respecting evictions, kwok
//! runs pods on simulated nodes and honours grace periods, the scheduler binds DaemonSet pods.

use std::time::{Duration, Instant};

use k8s_openapi::api::{core::v1::Pod, policy::v1::PodDisruptionBudget};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, EvictParams, PostParams},
};
use nodeward_api::DisruptionPolicy;
use nodeward_e2e::{NodeSpec, PodOptions, TestEnv, wait};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn api_server_is_the_pinned_release() -> anyhow::Result<()> {
    let env = TestEnv::new("version").await?;
    let version = env.client.apiserver_version().await?;
    let pinned = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/controlplane/versions.env"
    ))?;
    let pinned = pinned
        .lines()
        .find_map(|l| l.strip_prefix("KUBERNETES_VERSION="))
        .expect("versions.env pins KUBERNETES_VERSION");
    println!(
        "talking to kube-apiserver {} ({})",
        version.git_version, version.platform
    );
    assert_eq!(version.git_version, pinned);
    env.cleanup().await
}

fn policy(name: &str, spec: serde_json::Value) -> DisruptionPolicy {
    serde_json::from_value(json!({
        "apiVersion": "nodeward.io/v1alpha1",
        "kind": "DisruptionPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("a DisruptionPolicy")
}

#[tokio::test]
async fn api_server_refuses_invalid_disruption_policy_with_cel_message() -> anyhow::Result<()> {
    let env = TestEnv::new("cel").await?;
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());

    // Each invalid field, alone, and the message the API server must answer with.
    let cases = [
        (
            json!({"maxConcurrent": "150%"}),
            "spec.maxConcurrent",
            "maxConcurrent must be an integer >= 0 or a percentage",
        ),
        (
            json!({"maxConcurrent": -1}),
            "spec.maxConcurrent",
            "maxConcurrent must be an integer >= 0 or a percentage",
        ),
        (
            json!({"maxUnhealthy": "abc"}),
            "spec.maxUnhealthy",
            "maxUnhealthy must be an integer >= 0 or a percentage",
        ),
        (
            json!({"windows": [{"start": "25:00", "end": "06:00"}]}),
            "spec.windows[0].start",
            "should match",
        ),
        (
            json!({"windows": [{"start": "22:00", "end": "06:00", "timeZone": "Mars/Olympus_Mons"}]}),
            "spec.windows[0].timeZone",
            "timeZone must be an IANA time zone name",
        ),
        (
            json!({"windows": [{"start": "22:00", "end": "06:00", "cron": "0 2 * * *", "duration": "1h"}]}),
            "spec.windows[0]",
            "either start and end (with optional days) or cron and duration",
        ),
        (
            json!({"windows": [{"start": "22:00", "end": "22:00"}]}),
            "spec.windows[0]",
            "start and end must differ",
        ),
        (
            json!({"deadlines": {"agentHeartbeat": "30s"}}),
            "spec.deadlines.agentHeartbeat",
            "deadlines.agentHeartbeat must be at least 1m",
        ),
        (
            json!({"deadlines": {"start": "5s"}}),
            "spec.deadlines.start",
            "deadlines.start must be at least 30s",
        ),
        (
            json!({"drainTimeout": "10d"}),
            "spec.drainTimeout",
            "should match",
        ),
        (
            json!({"rebootBlockers": {"prometheus": {"url": "prometheus:9090"}}}),
            "spec.rebootBlockers.prometheus.url",
            "should match",
        ),
        (
            json!({"drainPlan": {"stages": [{"name": "s", "timeout": "1m", "priority": {"min": 10, "max": 1}}]}}),
            "spec.drainPlan.stages[0].priority",
            "priority.min must not be greater than priority.max",
        ),
        (
            json!({"maxConcurrentByReason": {"Remediation": "150%"}}),
            "spec.maxConcurrentByReason.Remediation",
            "maxConcurrentByReason.Remediation must be an integer >= 0 or a percentage",
        ),
        (
            json!({"blackouts": [{"start": "2027-01-02T00:00:00Z", "end": "2027-01-01T00:00:00Z"}]}),
            "spec.blackouts[0]",
            "a blackout's end must be after its start",
        ),
        // A label that would give the node a role, or take it out of nodeward's own hands.
        (
            json!({"nodeLabels": {"beforeDrain": [{"key": "node-role.kubernetes.io/control-plane", "value": ""}]}}),
            "spec.nodeLabels.beforeDrain[0]",
            "a label in the kubernetes.io, k8s.io or nodeward.io domains (or a subdomain) may not be set",
        ),
        (
            json!({"nodeLabels": {"beforeDrain": [{"key": "kubelet.k8s.io/x", "value": ""}]}}),
            "spec.nodeLabels.beforeDrain[0]",
            "a label in the kubernetes.io, k8s.io or nodeward.io domains (or a subdomain) may not be set",
        ),
        (
            json!({"nodeLabels": {"afterSuccess": [{"key": "nodeward.io/agent", "value": "true"}]}}),
            "spec.nodeLabels.afterSuccess[0]",
            "a label in the kubernetes.io, k8s.io or nodeward.io domains (or a subdomain) may not be set",
        ),
        (
            json!({"nodeLabels": {"beforeDrain": [{"key": "lb", "value": "not a valid value"}]}}),
            "spec.nodeLabels.beforeDrain[0].value",
            "should match",
        ),
    ];
    assert_refused(&env, &policies, "bad", cases).await?;

    // Valid: a percentage, a window crossing midnight in an IANA zone, a cron window.
    let good = policy(
        &format!("{}-good", env.id),
        json!({
            "maxConcurrent": "10%",
            "maxUnhealthy": 3,
            "windows": [
                {"days": ["Sat", "Sun"], "start": "22:00", "end": "06:00", "timeZone": "Europe/Berlin"},
                {"cron": "0 2 * * *", "duration": "2h"},
            ],
            "blackouts": [{"start": "2026-12-20T00:00:00+01:00", "end": "2027-01-04T00:00:00+01:00", "reason": "year-end freeze"}],
            "gates": [{"name": "ceph-healthy", "expression": "object.status.ceph.health == 'HEALTH_OK'",
                "object": {"apiVersion": "ceph.rook.io/v1", "kind": "CephCluster", "namespace": "rook-ceph", "name": "rook-ceph"}}],
            "canary": {"nodeSelector": {"matchLabels": {"canary": "true"}}, "soak": "1h", "validFor": "48h"},
            "failureBudget": {"maxFailures": 1},
            "nodeLabels": {
                "beforeDrain": [
                    {"key": "node.kubernetes.io/exclude-from-external-load-balancers", "value": "true"},
                    {"key": "example.com/state", "value": "draining"},
                ],
                "afterSuccess": [{"key": "example.com/state", "value": "ready"}],
                "annotate": true,
            },
        }),
    );
    let created = policies.create(&PostParams::default(), &good).await?;
    assert_eq!(created.spec.windows.len(), 2);
    assert_eq!(created.spec.blackouts.len(), 1);
    assert_eq!(created.spec.gates[0].object.kind, "CephCluster");
    let canary = created.spec.canary.as_ref().expect("the canary stage");
    assert!(canary.node_selector.is_some() && canary.nodes.is_none());
    assert!(!created.spec.paused, "paused defaults to false");
    policies
        .delete(&created.name_any(), &DeleteParams::default())
        .await?;
    env.cleanup().await
}

/// A canary stage the API server refuses: without a failure budget, both ways of naming the
/// canaries, none, a `validFor` shorter than a minute, a soak that is no duration.
#[tokio::test]
async fn api_server_refuses_an_invalid_canary_stage() -> anyhow::Result<()> {
    let env = TestEnv::new("canary").await?;
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    let cases = [
        // A canary stage without a failure budget would pass a bad update on to the next node.
        (
            json!({"canary": {"nodes": 1}}),
            "spec",
            "canary needs a failureBudget",
        ),
        (
            json!({"canary": {"nodes": 1, "nodeSelector": {"matchLabels": {"canary": "true"}}},
                "failureBudget": {"maxFailures": 1}}),
            "spec.canary",
            "canary: either nodes (how many go first) or nodeSelector (which nodes go first), not both",
        ),
        (
            json!({"canary": {"nodes": 0}, "failureBudget": {"maxFailures": 1}}),
            "spec.canary.nodes",
            "should be greater than or equal to 1",
        ),
        (
            json!({"canary": {"validFor": "30s"}, "failureBudget": {"maxFailures": 1}}),
            "spec.canary.validFor",
            "canary.validFor must be at least 1m",
        ),
        (
            json!({"canary": {"soak": "a day"}, "failureBudget": {"maxFailures": 1}}),
            "spec.canary.soak",
            "should match",
        ),
    ];
    assert_refused(&env, &policies, "bad", cases).await?;
    env.cleanup().await
}

/// Each of `cases` (a spec, the field the API server must name, what it must say) is refused
/// with 422 and that message.
async fn assert_refused<const N: usize>(
    env: &TestEnv,
    policies: &Api<DisruptionPolicy>,
    prefix: &str,
    cases: [(serde_json::Value, &str, &str); N],
) -> anyhow::Result<()> {
    for (index, (spec, field, message)) in cases.into_iter().enumerate() {
        let name = format!("{}-{prefix}-{index}", env.id);
        let created = policies
            .create(&PostParams::default(), &policy(&name, spec.clone()))
            .await;
        assert_unprocessable(created, &format!("the spec {spec}"), field, message);
    }

    Ok(())
}

/// That the API server refused a write (422), naming `field` and saying `message`.
fn assert_unprocessable<T: std::fmt::Debug>(
    written: Result<T, kube::Error>,
    what: &str,
    field: &str,
    message: &str,
) {
    let err = written.expect_err(&format!("the API server accepted {what}"));
    let kube::Error::Api(status) = &err else {
        panic!("expected an API error for {what}, got {err:?}");
    };
    assert_eq!(status.code, 422, "{what}: {status:?}");
    assert!(
        status.message.contains(field) && status.message.contains(message),
        "for {what} the API server said {:?}; expected it to name {field} and say {message:?}",
        status.message
    );
}

/// Gates the API server refuses: duplicate names, too many, an empty or overlong expression,
/// a malformed object reference.
#[tokio::test]
async fn api_server_refuses_invalid_gates() -> anyhow::Result<()> {
    let env = TestEnv::new("gates").await?;
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    let cases = [
        (
            json!({"gates": [gate("web"), gate("web")]}),
            "spec.gates",
            "gates[].name must be unique within the policy",
        ),
        (
            json!({"gates": (0..17).map(|i| gate(&format!("g{i}"))).collect::<Vec<_>>()}),
            "spec.gates",
            "must have at most 16 items",
        ),
        (
            json!({"gates": [{"name": "web", "expression": "",
                "object": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}}]}),
            "spec.gates[0].expression",
            "should be at least 1 chars long",
        ),
        (
            json!({"gates": [{"name": "web", "expression": "x".repeat(1025),
                "object": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}}]}),
            "spec.gates[0].expression",
            "may not be more than 1024 bytes",
        ),
        (
            json!({"gates": [{"name": "web", "expression": "true",
                "object": {"apiVersion": "apps/v1/extra", "kind": "deployment", "name": "web"}}]}),
            "spec.gates[0].object.apiVersion",
            "should match",
        ),
    ];
    assert_refused(&env, &policies, "gate", cases).await?;
    env.cleanup().await
}

/// A valid gate named `name` on Deployment `web`.
fn gate(name: &str) -> serde_json::Value {
    json!({"name": name, "expression": "true",
        "object": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "shop", "name": "web"}})
}

#[tokio::test]
async fn eviction_is_refused_by_pdb_and_allowed_for_uncovered_pod() -> anyhow::Result<()> {
    let (env, node) = TestEnv::with_worker("pdb", "zone-a").await?;
    env.replicaset("guarded", &node, 2, &PodOptions::default())
        .await?;
    env.replicaset("free", &node, 1, &PodOptions::default())
        .await?;
    env.pdb("guarded", "guarded", 2).await?;
    let guarded = env.running_pods("guarded", 2).await?;
    let free = env.running_pods("free", 1).await?;

    // Only the disruption controller writes a PDB's status; wait until it has counted the pods.
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(env.client.clone(), &env.namespace);
    wait::until(
        &pdbs,
        "guarded",
        "the disruption controller to process the PDB",
        TIMEOUT,
        |pdb| {
            pdb.and_then(|p| p.status.as_ref()).is_some_and(|s| {
                s.current_healthy == 2 && s.desired_healthy == 2 && s.disruptions_allowed == 0
            })
        },
    )
    .await?;

    let pods = env.pods();
    let refused = pods
        .evict(&guarded[0].name_any(), &EvictParams::default())
        .await
        .expect_err("evicting a pod whose PDB allows no disruption must fail");
    let kube::Error::Api(status) = &refused else {
        panic!("expected an API error, got {refused:?}");
    };
    assert_eq!(status.code, 429, "{status:?}");
    assert!(status.message.contains("disruption budget"), "{status:?}");

    let evicted = free[0].name_any();
    pods.evict(&evicted, &EvictParams::default()).await?;
    wait::until(
        &pods,
        &evicted,
        "the evicted pod to be gone",
        TIMEOUT,
        |p| p.is_none(),
    )
    .await?;
    // The guarded pods are untouched.
    for pod in &guarded {
        let current = pods.get(&pod.name_any()).await?;
        assert!(
            current.metadata.deletion_timestamp.is_none(),
            "{} was deleted",
            pod.name_any()
        );
    }
    env.cleanup().await
}

#[tokio::test]
async fn kwok_node_runs_pods_and_honours_grace_period() -> anyhow::Result<()> {
    let env = TestEnv::new("kwok").await?;
    let node = env.node_name(0);
    let nodes = env.create_nodes(&[NodeSpec::worker("zone-b")]).await?;
    assert_eq!(
        wait::condition_status(&nodes[0], "Ready").as_deref(),
        Some("True")
    );

    let options = PodOptions {
        priority: Some(1000),
        grace_period_seconds: 5,
        ..PodOptions::default()
    };
    env.replicaset("graceful", &node, 1, &options).await?;
    let pod = env.running_pods("graceful", 1).await?.remove(0);
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(node.as_str())
    );
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.priority),
        Some(1000),
        "priority admission resolved the class"
    );

    let pods: Api<Pod> = env.pods();
    let name = pod.name_any();
    let deleted_at = Instant::now();
    pods.delete(&name, &DeleteParams::default()).await?;
    // Within the grace period the pod is still there, terminating.
    let terminating = pods.get(&name).await?;
    assert!(terminating.metadata.deletion_timestamp.is_some());
    wait::until(&pods, &name, "the deleted pod to be gone", TIMEOUT, |p| {
        p.is_none()
    })
    .await?;
    let took = deleted_at.elapsed();
    assert!(
        took >= Duration::from_secs(4),
        "the pod went away after {took:?}, before its 5 s grace period"
    );
    env.cleanup().await
}

#[tokio::test]
async fn daemonset_pods_are_bound_to_each_matching_node() -> anyhow::Result<()> {
    let env = TestEnv::new("daemonset").await?;
    env.create_nodes(&[
        NodeSpec::worker("zone-a").label("pool", "blue"),
        NodeSpec::worker("zone-b").label("pool", "blue"),
        NodeSpec::control_plane("zone-c"),
    ])
    .await?;
    env.daemonset("agent", ("pool", "blue"), &PodOptions::default())
        .await?;
    let pods = env.running_pods("agent", 2).await?;
    let mut bound: Vec<String> = pods
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    bound.sort();
    assert_eq!(bound, vec![env.node_name(0), env.node_name(1)]);
    assert!(
        pods.iter()
            .all(|p| p.owner_references().iter().any(|o| o.kind == "DaemonSet"))
    );
    env.cleanup().await
}

/// A fencing claim the API server refuses: a fencing time under 10 s or a watchdog past 600 s
/// (the coordinator would wait on a claim it cannot trust), an empty device.
#[tokio::test]
async fn api_server_refuses_a_fencing_claim_out_of_bounds() -> anyhow::Result<()> {
    use kube::api::{Patch, PatchParams};
    use nodeward_api::NodeReport;

    let env = TestEnv::new("fencing").await?;
    let reports: Api<NodeReport> = Api::all(env.client.clone());
    let name = format!("{}-node", env.id);
    reports
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeReport",
                "metadata": {"name": name}, "spec": {"nodeName": name}}))?,
        )
        .await?;
    let fencing = |device: &str, after: i64, timeout: i64, agents: i64| json!({"status": {"fencing": {"device": device, "fenceAfterSeconds": after, "timeoutSeconds": timeout, "agents": agents}}});
    for (claim, field, message) in [
        (
            fencing("/dev/watchdog", 5, 30, 3),
            "status.fencing.fenceAfterSeconds",
            "should be greater than or equal to 10",
        ),
        (
            fencing("/dev/watchdog", 60, 601, 3),
            "status.fencing.timeoutSeconds",
            "should be less than or equal to 600",
        ),
        (
            fencing("", 60, 30, 3),
            "status.fencing.device",
            "should be at least 1 chars long",
        ),
        (
            fencing("/dev/watchdog", 60, 30, 0),
            "status.fencing.agents",
            "should be greater than or equal to 1",
        ),
    ] {
        let written = reports
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&claim))
            .await;
        assert_unprocessable(written, &format!("the claim {claim}"), field, message);
    }
    reports
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(fencing("/dev/watchdog", 60, 30, 3)),
        )
        .await?;
    reports.delete(&name, &DeleteParams::default()).await?;
    Ok(())
}
