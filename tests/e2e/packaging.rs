//! The Helm chart and the systemd unit: `helm lint` and `helm template` with the default values
//! and with every option on; the rendered chart applied server-side to the real API server;
//! the agent's service-account identity kept to its own node by the chart's
//! ValidatingAdmissionPolicy; the coordinator's identity without what it does not need;
//! `systemd-analyze verify` on the unit.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::Context;
use k8s_openapi::api::{
    authentication::v1::TokenRequest,
    core::v1::{Node, Pod, ServiceAccount},
};
use kube::{
    Api, Client, ResourceExt,
    api::{
        DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
    },
    discovery::{self, Scope},
};
use nodeward_api::NodeMaintenance;
use nodeward_e2e::{
    Identity, NodeSpec, PodOptions, TestEnv, controlplane::client_as, daemon::sibling_binary,
    env::TEST_LABEL, wait,
};
use serde_json::{Value, json};

/// The Kubernetes version the chart is rendered for (the test control plane's).
const KUBE_VERSION: &str = "1.34.4";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

fn chart() -> PathBuf {
    repo_root().join("charts/nodeward")
}

/// helm, built from its Go module by `tests/tools/helm.sh` (cached per version).
fn helm() -> anyhow::Result<PathBuf> {
    let output = Command::new(repo_root().join("tests/tools/helm.sh"))
        .output()
        .context("running tests/tools/helm.sh")?;
    anyhow::ensure!(
        output.status.success(),
        "tests/tools/helm.sh failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(PathBuf::from(String::from_utf8(output.stdout)?.trim()))
}

fn run(command: &mut Command) -> anyhow::Result<String> {
    let output = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    anyhow::ensure!(
        output.status.success(),
        "{command:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

/// `helm template` with `values` files; the rendered documents.
fn render(release: &str, namespace: &str, values: &[&Path]) -> anyhow::Result<Vec<Value>> {
    let mut command = Command::new(helm()?);
    command.args(["template", release]).arg(chart()).args([
        "--namespace",
        namespace,
        "--kube-version",
        KUBE_VERSION,
    ]);
    for file in values {
        command.arg("--values").arg(file);
    }
    let text = run(&mut command)?;
    let mut documents = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value: Value = serde::Deserialize::deserialize(document)?;
        if !value.is_null() {
            documents.push(value);
        }
    }
    Ok(documents)
}

fn kinds(documents: &[Value]) -> Vec<String> {
    let mut kinds: Vec<String> = documents
        .iter()
        .map(|d| d["kind"].as_str().unwrap_or_default().to_owned())
        .collect();
    kinds.sort();
    kinds
}

fn find<'a>(documents: &'a [Value], kind: &str) -> anyhow::Result<&'a Value> {
    documents
        .iter()
        .find(|d| d["kind"] == kind)
        .with_context(|| format!("no {kind} rendered"))
}

#[tokio::test]
async fn the_chart_lints_and_renders_with_default_and_all_on_values() -> anyhow::Result<()> {
    let all_on = chart().join("ci/all-on-values.yaml");
    for values in [None, Some(all_on.as_path())] {
        let mut lint = Command::new(helm()?);
        lint.arg("lint").arg("--strict").arg(chart());
        if let Some(file) = values {
            lint.arg("--values").arg(file);
        }
        let said = run(&mut lint)?;
        assert!(said.contains("0 chart(s) failed"), "{said}");
    }

    let defaults = render("nodeward", "nodeward-system", &[])?;
    let expected = [
        "ClusterRole",
        "ClusterRole",
        "ClusterRoleBinding",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
        "Deployment",
        "DisruptionPolicy",
        "PodDisruptionBudget",
        "Role",
        "RoleBinding",
        "Secret",
        "Service",
        "Service",
        "Service",
        "ServiceAccount",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingWebhookConfiguration",
    ];
    assert_eq!(kinds(&defaults), expected);
    let all = render("nodeward", "nodeward-system", &[&all_on])?;
    let mut with_monitoring: Vec<&str> = expected.to_vec();
    with_monitoring.extend(["PrometheusRule", "ServiceMonitor", "ServiceMonitor"]);
    with_monitoring.sort();
    assert_eq!(kinds(&all), with_monitoring);

    // The agent: every node, host network, no capabilities but raw sockets, read-only root,
    // only the host paths it uses.
    let ds = find(&defaults, "DaemonSet")?;
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["tolerations"], json!([{"operator": "Exists"}]));
    let security = &pod["containers"][0]["securityContext"];
    assert_eq!(
        security["capabilities"],
        json!({"drop": ["ALL"], "add": ["NET_RAW"]})
    );
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["seccompProfile"]["type"], "RuntimeDefault");
    let host_paths: Vec<&str> = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["hostPath"]["path"].as_str())
        .collect();
    assert_eq!(
        host_paths,
        [
            "/run/dbus/system_bus_socket",
            "/var/run",
            "/etc/systemd/logind.conf.d"
        ]
    );
    let mounts = &pod["containers"][0]["volumeMounts"];
    assert!(
        mounts
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m["name"] == "logind-conf" && m["readOnly"] == true),
        "logind.conf.d read-only unless writeDropIn: {mounts}"
    );
    assert!(pod["containers"][0]["resources"]["limits"]["memory"].is_string());
    // With writeDropIn the drop-in directory becomes writable.
    let all_pod = &find(&all, "DaemonSet")?["spec"]["template"]["spec"];
    assert!(
        all_pod["containers"][0]["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m["name"] == "logind-conf" && m["readOnly"] == false)
    );

    // The coordinator: two replicas on different nodes, non-root, read-only root.
    let deployment = find(&defaults, "Deployment")?;
    assert_eq!(deployment["spec"]["replicas"], 2);
    let spec = &deployment["spec"]["template"]["spec"];
    assert_eq!(
        spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"],
        "kubernetes.io/hostname"
    );
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"],
        true
    );
    assert_eq!(
        spec["containers"][0]["securityContext"]["capabilities"],
        json!({"drop": ["ALL"]})
    );

    // The agent accepts the configuration the chart renders for it (exit 2 = invalid).
    let dir = std::env::temp_dir().join(format!("nodeward-chart-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    for (name, documents) in [("default", &defaults), ("all-on", &all)] {
        let config = find(documents, "ConfigMap")?["data"]["agent.yaml"]
            .as_str()
            .context("agent.yaml")?;
        let file = dir.join(format!("{name}.yaml"));
        std::fs::write(&file, config)?;
        let output = Command::new(sibling_binary("nodeward-agent")?)
            .args(["check", "--output", "json", "--config"])
            .arg(&file)
            .output()?;
        assert_ne!(
            output.status.code(),
            Some(2),
            "the agent refused the {name} configuration:\n{config}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

#[test]
fn the_systemd_unit_verifies() -> anyhow::Result<()> {
    let unit = std::fs::read_to_string(repo_root().join("systemd/nodeward-agent.service"))?;
    // systemd-analyze checks that ExecStart's program exists: point it at the built agent.
    let agent = sibling_binary("nodeward-agent")?;
    assert!(unit.contains("/usr/local/bin/nodeward-agent"));
    let dir = std::env::temp_dir().join(format!("nodeward-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("nodeward-agent.service");
    std::fs::write(&file, unit.replace("/usr/local/bin/nodeward-agent", &agent))?;
    let output = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&file)
        .output()?;
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "systemd-analyze verify failed: {said}"
    );
    assert!(
        !said.contains("nodeward-agent.service"),
        "systemd-analyze has something to say about the unit: {said}"
    );
    let dropin =
        std::fs::read_to_string(repo_root().join("systemd/logind.conf.d/60-nodeward.conf"))?;
    assert!(
        dropin.contains("[Login]\nInhibitDelayMaxSec=120\n"),
        "{dropin}"
    );
    Ok(())
}

/// Applies every document server-side, as `kubectl apply --server-side` does.
async fn apply(client: &Client, documents: &[Value]) -> anyhow::Result<()> {
    let params = PatchParams::apply("nodeward-e2e-chart").force();
    for document in documents {
        let (api, name) = dynamic_api(client, document).await?;
        api.patch(&name, &params, &Patch::Apply(document))
            .await
            .with_context(|| format!("applying {} {name}", document["kind"]))?;
    }
    Ok(())
}

async fn dynamic_api(
    client: &Client,
    document: &Value,
) -> anyhow::Result<(Api<DynamicObject>, String)> {
    let api_version = document["apiVersion"].as_str().context("apiVersion")?;
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let kind = document["kind"].as_str().context("kind")?;
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, capabilities) = discovery::pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("discovering {api_version} {kind}"))?;
    let name = document["metadata"]["name"]
        .as_str()
        .context("name")?
        .to_owned();
    let api = match (
        capabilities.scope,
        document["metadata"]["namespace"].as_str(),
    ) {
        (Scope::Namespaced, Some(namespace)) => {
            Api::namespaced_with(client.clone(), namespace, &resource)
        }
        _ => Api::all_with(client.clone(), &resource),
    };
    Ok((api, name))
}

async fn token(env: &TestEnv, account: &str, bound_to: Option<&Pod>) -> anyhow::Result<String> {
    let mut spec =
        json!({"audiences": ["https://kubernetes.default.svc"], "expirationSeconds": 600});
    if let Some(pod) = bound_to {
        spec["boundObjectRef"] =
            json!({"apiVersion": "v1", "kind": "Pod", "name": pod.name_any(), "uid": pod.uid()});
    }
    let request: TokenRequest = serde_json::from_value(json!({"spec": spec}))?;
    let issued: TokenRequest =
        Api::<ServiceAccount>::namespaced(env.client.clone(), &env.namespace)
            .create_subresource("token", account, &PostParams::default(), &request)
            .await?;
    Ok(issued.status.map(|s| s.token).unwrap_or_default())
}

/// The API server's refusal message, or why the call was not refused.
fn refusal<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) => format!("{} {}", status.code, status.message),
        other => format!("not refused: {other:?}"),
    }
}

/// A coordinator serving only the eviction webhook: it never leads (the test holds its Lease
/// for an hour), so it decides nothing about the cluster.
struct EvictionWebhook {
    coordinator: nodeward_e2e::daemon::Daemon,
    address: String,
    ca_bundle: Value,
}

impl EvictionWebhook {
    async fn start(env: &TestEnv, dir: &Path) -> anyhow::Result<Self> {
        let certs = dir.join("webhook");
        std::fs::create_dir_all(&certs)?;
        run(Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=nodeward-e2e-webhook",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
            ])
            .arg("-keyout")
            .arg(certs.join("tls.key"))
            .arg("-out")
            .arg(certs.join("tls.crt")))?;
        let now = jiff::Timestamp::now().to_string();
        let lease: k8s_openapi::api::coordination::v1::Lease = serde_json::from_value(json!({
            "metadata": {"name": "e2e-held"},
            "spec": {"holderIdentity": "e2e", "leaseDurationSeconds": 3600, "acquireTime": now, "renewTime": now},
        }))?;
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
            env.client.clone(),
            &env.namespace,
        )
        .create(&PostParams::default(), &lease)
        .await?;
        let address = nodeward_e2e::daemon::free_address()?;
        let coordinator = nodeward_e2e::daemon::coordinator(
            env,
            &[
                "--lease-name",
                "e2e-held",
                "--lease-duration",
                "1h",
                "--renew-deadline",
                "50m",
                "--retry-period",
                "1m",
                "--webhook-listen",
                &address,
                "--webhook-cert-dir",
                certs.to_str().context("certificate directory")?,
            ],
        )?;
        coordinator.wait_ready(Duration::from_secs(60)).await?;
        let ca_bundle = serde_json::to_value(k8s_openapi::ByteString(std::fs::read(
            certs.join("tls.crt"),
        )?))?;
        Ok(Self {
            coordinator,
            address,
            ca_bundle,
        })
    }
}

#[tokio::test]
async fn the_applied_chart_keeps_each_identity_to_what_it_needs() -> anyhow::Result<()> {
    let env = TestEnv::new("chart").await?;
    env.create_nodes(&[NodeSpec::worker("a"), NodeSpec::worker("b")])
        .await?;
    let (node_a, node_b) = (env.node_name(0), env.node_name(1));
    // Scheduled on this test's nodes only, its policy over them only.
    let dir = std::env::temp_dir().join(format!("nodeward-chart-{}", env.id));
    std::fs::create_dir_all(&dir)?;
    let values = dir.join("values.yaml");
    std::fs::write(
        &values,
        serde_yaml::to_string(&json!({
            "agent": {"nodeSelector": {TEST_LABEL: env.id}},
            "coordinator": {"nodeSelector": {TEST_LABEL: env.id}},
            "defaultPolicy": {"name": format!("{}-default", env.id), "spec": {
                "maxConcurrent": 1, "nodeSelector": {"matchLabels": {TEST_LABEL: env.id}}}},
        }))?,
    )?;
    let documents = render(&env.id, &env.namespace, &[&values])?;
    apply(&env.client, &documents).await?;

    let agent_account = format!("{}-nodeward-agent", env.id);
    let coordinator_account = format!("{}-nodeward-coordinator", env.id);
    let agent_pod = wait::eventually(
        "the agent's pod on node A",
        Duration::from_secs(60),
        || async {
            let pods = env
                .pods()
                .list(&ListParams::default().labels("app.kubernetes.io/component=agent"))
                .await?;
            Ok(pods.items.into_iter().find(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node_a.as_str())
                    && p.metadata.uid.is_some()
            }))
        },
    )
    .await?;
    let agent = client_as(Identity::Token(
        token(&env, &agent_account, Some(&agent_pod)).await?,
    ))
    .await?;
    let nodes: Api<Node> = Api::all(agent.clone());
    let label = |value: &str| Patch::Merge(json!({"metadata": {"labels": {"e2e-touched": value}}}));

    // Its own Node: yes. Another: refused by the policy (once the API server has loaded it).
    nodes
        .patch(&node_a, &PatchParams::default(), &label("a"))
        .await?;
    let message = wait::eventually(
        "the policy to refuse node B",
        Duration::from_secs(30),
        || async {
            let said = refusal(
                nodes
                    .patch(&node_b, &PatchParams::default(), &label("b"))
                    .await,
            );
            Ok(said
                .contains("may change only its own Node")
                .then_some(said))
        },
    )
    .await?;
    assert!(
        message.starts_with("403")
            && message.contains(&format!(
                "nodeward-agent on node {node_a} may change only its own Node, not {node_b}"
            )),
        "{message}"
    );

    // Pods: deleting one on its node is allowed, on another node refused.
    env.replicaset("on-a", &node_a, 1, &PodOptions::default())
        .await?;
    env.replicaset("on-b", &node_b, 1, &PodOptions::default())
        .await?;
    let on_a = env.running_pods("on-a", 1).await?.remove(0);
    let on_b = env.running_pods("on-b", 1).await?.remove(0);
    let pods: Api<Pod> = Api::namespaced(agent.clone(), &env.namespace);
    pods.delete(&on_a.name_any(), &DeleteParams::default())
        .await?;
    let said = refusal(
        pods.delete(&on_b.name_any(), &DeleteParams::default())
            .await,
    );
    assert!(
        said.contains("may delete only pods on its own node"),
        "{said}"
    );

    // Maintenances: only Reboot ones of its own node may be asked for.
    let maintenances: Api<NodeMaintenance> = Api::all(agent.clone());
    let maintenance = |name: &str, node: &str, action: &str| -> anyhow::Result<NodeMaintenance> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
            "metadata": {"name": name, "labels": {TEST_LABEL: env.id}},
            "spec": {"nodeName": node, "reason": "Reboot", "action": action},
        }))?)
    };
    let own = format!("{node_a}-reboot");
    maintenances
        .create(
            &PostParams::default(),
            &maintenance(&own, &node_a, "Reboot")?,
        )
        .await?;
    for (node, action) in [(&node_b, "Reboot"), (&node_a, "DeleteNode")] {
        let said = refusal(
            maintenances
                .create(
                    &PostParams::default(),
                    &maintenance(&format!("{node}-{}", action.to_lowercase()), node, action)?,
                )
                .await,
        );
        assert!(
            said.contains("may ask only for Reboot maintenances of its own node"),
            "{action} on {node}: {said}"
        );
    }

    // Admitted by "the coordinator" (the admin here); the agent may move it on, not rewrite
    // the admission or take it back to Admitted.
    Api::<NodeMaintenance>::all(env.client.clone())
        .patch_status(
            &own,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "phase": "Admitted",
                "admission": {"policies": [format!("{}-default", env.id)], "admittedAt": "2026-11-21T10:00:00Z", "admittedBy": "coordinator-0"},
                "conditions": [{"type": "Admitted", "status": "True", "reason": "Admitted", "message": "fits", "lastTransitionTime": "2026-11-21T10:00:00Z"}],
            }})),
        )
        .await?;
    maintenances
        .patch_status(
            &own,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Draining", "podsTotal": 1}})),
        )
        .await?;
    for (status, expected) in [
        (
            json!({"admission": {"admittedBy": "agent"}}),
            "written by the nodeward coordinator only",
        ),
        (
            json!({"conditions": []}),
            "written by the nodeward coordinator only",
        ),
        (
            json!({"phase": "Admitted"}),
            "may not move a maintenance to Admitted",
        ),
    ] {
        let said = refusal(
            maintenances
                .patch_status(
                    &own,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": status})),
                )
                .await,
        );
        assert!(said.contains(expected), "{status}: {said}");
    }

    // Evictions: the chart's webhook, served by a real coordinator (reached on loopback with
    // a certificate for 127.0.0.1 instead of through the Service, which a kwok pod cannot
    // serve).
    let webhook = EvictionWebhook::start(&env, &dir).await?;
    let mut configuration = find(&documents, "ValidatingWebhookConfiguration")?.clone();
    configuration["webhooks"][0]["clientConfig"] = json!({
        "url": format!("https://{}/validate/eviction", webhook.address),
        "caBundle": webhook.ca_bundle,
    });
    apply(&env.client, &[configuration]).await?;
    env.replicaset("evict-a", &node_a, 1, &PodOptions::default())
        .await?;
    let evict_a = env.running_pods("evict-a", 1).await?.remove(0);
    let said = wait::eventually(
        "the webhook to refuse the eviction on node B",
        Duration::from_secs(30),
        || async {
            let said = refusal(pods.evict(&on_b.name_any(), &Default::default()).await);
            Ok(said.contains("may evict only pods").then_some(said))
        },
    )
    .await
    .with_context(|| webhook.coordinator.output())?;
    assert!(
        said.contains(&format!(
            "nodeward-agent on node {node_a} may evict only pods on its own node; {}/{} runs on {node_b}",
            env.namespace,
            on_b.name_any()
        )),
        "{said}"
    );
    pods.evict(&evict_a.name_any(), &Default::default())
        .await
        .with_context(|| webhook.coordinator.output())?;
    drop(webhook);

    // The coordinator's identity: reads nodes, may not delete pods nor relabel nodes.
    let coordinator = client_as(Identity::Token(
        token(&env, &coordinator_account, None).await?,
    ))
    .await?;
    Api::<Node>::all(coordinator.clone()).get(&node_a).await?;
    let said = refusal(
        Api::<Pod>::namespaced(coordinator.clone(), &env.namespace)
            .delete(&on_b.name_any(), &DeleteParams::default())
            .await,
    );
    assert!(said.starts_with("403"), "{said}");
    let said = refusal(
        Api::<Node>::all(coordinator)
            .patch(&node_b, &PatchParams::default(), &label("c"))
            .await,
    );
    assert!(said.starts_with("403"), "{said}");

    // The chart's cluster-wide objects go; the namespace takes the rest.
    for document in documents
        .iter()
        .filter(|d| d["metadata"]["namespace"].is_null())
    {
        let (api, name) = dynamic_api(&env.client, document).await?;
        api.delete(&name, &DeleteParams::default()).await?;
    }
    env.cleanup().await
}
