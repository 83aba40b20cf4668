//! The Helm chart and the systemd unit: `helm lint` and `helm template` with the default values
//! and with every option on; the rendered chart applied server-side to the real API server;
//! the agent's service-account identity kept to its own node by the chart's
//! ValidatingAdmissionPolicy; the coordinator's identity without what it does not need;
//! `systemd-analyze verify` on the unit.

use std::{path::Path, process::Command, time::Duration};

use anyhow::Context;
use futures::TryStreamExt;
use k8s_openapi::api::{
    admissionregistration::v1::ValidatingWebhookConfiguration,
    authentication::v1::TokenRequest,
    coordination::v1::Lease,
    core::v1::{ConfigMap, Node, Pod, Secret, ServiceAccount},
    discovery::v1::EndpointSlice,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client, ResourceExt,
    api::{
        DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
    },
    discovery::{self, Scope},
};
use nodeward_api::{
    DisruptionPolicy, MaintenancePhase, NodeMaintenance, NodeReport,
    labels::{AGENT_GROUP, AGENT_LABEL, AGENT_USER_PREFIX, CORDONED_BY_ANNOTATION},
};
use nodeward_e2e::{
    Identity, NodeSpec, PodOptions, TestEnv,
    controlplane::{client_as, write_kubeconfig},
    daemon::sibling_binary,
    env::TEST_LABEL,
    helm::{adopt_crds, binary as helm, chart, run},
    repo_root,
    siege::Siege,
    wait,
};
use serde_json::{Value, json};

/// The Kubernetes version the chart is rendered for (the test control plane's).
const KUBE_VERSION: &str = "1.34.4";

/// `helm template` with `values` files: the rendered text.
fn render_text(release: &str, namespace: &str, values: &[&Path]) -> anyhow::Result<String> {
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
    run(&mut command)
}

/// The documents of a rendered (or any multi-document) YAML text.
fn documents(text: &str) -> anyhow::Result<Vec<Value>> {
    let mut documents = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let value: Value = serde::Deserialize::deserialize(document)?;
        if !value.is_null() {
            documents.push(value);
        }
    }
    Ok(documents)
}

/// `helm template` with `values` files: the rendered documents.
fn render(release: &str, namespace: &str, values: &[&Path]) -> anyhow::Result<Vec<Value>> {
    documents(&render_text(release, namespace, values)?)
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
        "CustomResourceDefinition",
        "CustomResourceDefinition",
        "CustomResourceDefinition",
        "DaemonSet",
        "Deployment",
        "DisruptionPolicy",
        "PodDisruptionBudget",
        // Each daemon's in nodeward's namespace (the agent: its Lease, what the coordinator
        // publishes for it).
        "Role",
        "Role",
        "RoleBinding",
        "RoleBinding",
        "Service",
        "Service",
        "Service",
        "ServiceAccount",
        "ServiceAccount",
        // The agent's and the coordinator's admission policies, each with its binding, and the
        // agent's first-install copy (a pre-install hook).
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
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
    // The host's journal (where the kernel log is read by default) read-only, through the
    // parents of its directories; never /dev/kmsg, and never privileged.
    assert_eq!(
        host_paths,
        [
            "/run/dbus/system_bus_socket",
            "/etc/systemd/logind.conf.d",
            "/var/log",
            "/run/log"
        ]
    );
    for journal in ["/host/var/log", "/host/run/log"] {
        let mount = pod["containers"][0]["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["mountPath"] == journal);
        assert_eq!(
            mount.map(|m| m["readOnly"] == true),
            Some(true),
            "{journal}"
        );
    }
    assert!(security["privileged"].is_null(), "{security}");
    // The drop-in directory is writable (writeDropIn is on by default: a stock node's 5 s
    // leaves a drain nothing), read-only when it is turned off.
    let logind_conf_read_only = |pod: &Value| {
        pod["containers"][0]["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["name"] == "logind-conf")
            .map(|m| m["readOnly"] == true)
    };
    assert_eq!(logind_conf_read_only(pod), Some(false));
    assert!(pod["containers"][0]["resources"]["limits"]["memory"].is_string());
    let dir = std::env::temp_dir().join(format!("nodeward-chart-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let no_drop_in = dir.join("no-drop-in.yaml");
    std::fs::write(
        &no_drop_in,
        "agent: {shutdownGuard: {writeDropIn: false}}\n",
    )?;
    let without = render("nodeward", "nodeward-system", &[&no_drop_in])?;
    let without_pod = &find(&without, "DaemonSet")?["spec"]["template"]["spec"];
    assert_eq!(logind_conf_read_only(without_pod), Some(true));

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
        std::fs::read_to_string(repo_root().join("systemd/logind.conf.d/zz-nodeward.conf"))?;
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
        let patch = Patch::Apply(document);
        api.patch(&name, &params, &patch)
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

/// The chart's coordinator serving the eviction webhook with the certificate it keeps itself,
/// as the chart's coordinator service account. It never leads (the test holds its Lease for an
/// hour), so it decides nothing about the cluster. The API server reaches it on loopback by the
/// name `localhost` (a kwok pod serves nothing), which it adds to its certificate.
struct EvictionWebhook {
    coordinator: nodeward_e2e::daemon::Daemon,
    url: String,
    release: String,
}

impl EvictionWebhook {
    async fn start(
        env: &TestEnv,
        release: &str,
        dir: &Path,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let lease_name = format!("{release}-nodeward-coordinator");
        let now = jiff::Timestamp::now().to_string();
        let lease: k8s_openapi::api::coordination::v1::Lease = serde_json::from_value(json!({
            "metadata": {"name": lease_name},
            "spec": {"holderIdentity": "e2e", "leaseDurationSeconds": 3600, "acquireTime": now, "renewTime": now},
        }))?;
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
            env.client.clone(),
            &env.namespace,
        )
        .create(&PostParams::default(), &lease)
        .await?;
        let kubeconfig = dir.join("coordinator.kubeconfig");
        write_kubeconfig(
            Identity::Token(token(env, &lease_name, None).await?),
            &kubeconfig,
        )?;
        let address = nodeward_e2e::daemon::free_address()?;
        let port = address.rsplit(':').next().context("a port")?;
        let mut args = vec![
            "--lease-name",
            &lease_name,
            "--lease-duration",
            "1h",
            "--renew-deadline",
            "50m",
            "--retry-period",
            "1m",
            "--webhook-listen",
            &address,
        ];
        let secret = format!("--webhook-secret={release}-nodeward-coordinator-webhook-tls");
        let service = format!("--webhook-service={release}-nodeward-coordinator-webhook");
        let configuration = format!("--webhook-configuration={release}-nodeward-agent-evictions");
        args.extend([
            secret.as_str(),
            service.as_str(),
            configuration.as_str(),
            "--webhook-extra-dns=localhost",
        ]);
        args.extend(extra);
        let coordinator = nodeward_e2e::daemon::coordinator_as(env, &kubeconfig, &args)?;
        coordinator
            .wait_ready(Duration::from_secs(60))
            .await
            .with_context(|| coordinator.output())?;
        Ok(Self {
            coordinator,
            url: format!("https://localhost:{port}/validate/eviction"),
            release: release.to_owned(),
        })
    }

    /// Started as `env`'s release's coordinator, with the chart's webhook configuration from
    /// `documents` pointed at it and its CA bundle in place: evictions go through it.
    async fn serving(
        env: &TestEnv,
        dir: &Path,
        documents: &[Value],
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let webhook = Self::start(env, &env.id, dir, extra).await?;
        apply(&env.client, &[webhook.configuration(documents)?]).await?;
        webhook.wait_ca_bundle(env).await?;
        Ok(webhook)
    }

    /// Evicts `pod` through `pods` (with `params`) until the webhook refuses it as another
    /// node's: the refusal.
    async fn refusal_of(
        &self,
        pods: &Api<Pod>,
        pod: &Pod,
        params: &kube::api::EvictParams,
    ) -> anyhow::Result<String> {
        wait::eventually(
            "the webhook to refuse an eviction of another node's pod",
            Duration::from_secs(30),
            || async {
                let said = refusal(pods.evict(&pod.name_any(), params).await);
                Ok(said.contains("may evict only pods").then_some(said))
            },
        )
        .await
        .with_context(|| self.coordinator.output())
    }

    /// The chart's webhook configuration from `documents`, pointed at this coordinator by URL.
    fn configuration(&self, documents: &[Value]) -> anyhow::Result<Value> {
        let mut configuration = find(documents, "ValidatingWebhookConfiguration")?.clone();
        configuration["webhooks"][0]["clientConfig"] = json!({"url": self.url});
        Ok(configuration)
    }

    /// The webhook certificate Secret the coordinator keeps.
    async fn secret(&self, env: &TestEnv) -> anyhow::Result<Option<Secret>> {
        Ok(
            Api::<Secret>::namespaced(env.client.clone(), &env.namespace)
                .get_opt(&format!(
                    "{}-nodeward-coordinator-webhook-tls",
                    self.release
                ))
                .await?,
        )
    }

    /// Waits until the webhook configuration trusts the coordinator's CA bundle; the bundle.
    async fn wait_ca_bundle(&self, env: &TestEnv) -> anyhow::Result<Vec<u8>> {
        let configurations: Api<ValidatingWebhookConfiguration> = Api::all(env.client.clone());
        let name = format!("{}-nodeward-agent-evictions", self.release);
        wait::eventually(
            "the coordinator to write the caBundle",
            Duration::from_secs(30),
            || async {
                let Some(secret) = self.secret(env).await? else {
                    return Ok(None);
                };
                let bundle = secret
                    .data
                    .unwrap_or_default()
                    .remove("ca.crt")
                    .map(|b| b.0);
                let live = configurations
                    .get(&name)
                    .await?
                    .webhooks
                    .unwrap_or_default();
                let published = live
                    .first()
                    .and_then(|w| w.client_config.ca_bundle.clone())
                    .map(|b| b.0);
                Ok((bundle.is_some() && bundle == published)
                    .then_some(bundle)
                    .flatten())
            },
        )
        .await
        .with_context(|| self.coordinator.output())
    }
}

/// Two kwok nodes for `env`, and the chart rendered (release = the test's id) to schedule on
/// them only, with its default policy over them only, applied server-side; the documents.
async fn apply_chart_on_own_nodes(env: &TestEnv, dir: &Path) -> anyhow::Result<Vec<Value>> {
    env.create_nodes(&[NodeSpec::worker("a"), NodeSpec::worker("b")])
        .await?;
    std::fs::create_dir_all(dir)?;
    let values = dir.join("values.yaml");
    std::fs::write(&values, serde_yaml::to_string(&own_nodes_values(env))?)?;
    let documents = render(&env.id, &env.namespace, &[&values])?;
    // The CRDs are every test's (installed once per run); only the upgrade test changes them.
    // The first-install copy of the agents' policy (a hook) is left out: the release as it
    // stands once the coordinator has retired it.
    let documents: Vec<Value> = documents
        .into_iter()
        .filter(|d| d["kind"] != "CustomResourceDefinition")
        .filter(|d| d["metadata"]["annotations"]["helm.sh/hook"].is_null())
        .collect();
    apply(&env.client, &documents).await?;
    Ok(documents)
}

/// The group whose host-mode certificates `env`'s release takes for agents.
fn agent_group(env: &TestEnv) -> String {
    format!("{AGENT_GROUP}:{}", env.id)
}

fn own_nodes_values(env: &TestEnv) -> Value {
    json!({
        // Host-mode certificates of this test's own group: another test's release (its webhook
        // perhaps not served any more) never takes them in.
        "agent": {"nodeSelector": {TEST_LABEL: env.id}, "hostCertificates": {"group": agent_group(env)},
            "config": {"detectors": {"custom": [
            {"name": "ntp", "condition": "NTPProblem", "reason": "ClockSkew", "command": ["/bin/true"]}]}}},
        "coordinator": {"nodeSelector": {TEST_LABEL: env.id}},
        "defaultPolicy": {"name": format!("{}-default", env.id), "spec": {
            "maxConcurrent": 1, "nodeSelector": {"matchLabels": {TEST_LABEL: env.id}}}},
    })
}

/// A client acting as the chart's agent on `node`: a token bound to its (kwok) pod there.
async fn agent_on(env: &TestEnv, node: &str) -> anyhow::Result<Client> {
    let pod = wait::eventually(
        "the agent's pod on the node",
        Duration::from_secs(60),
        || async {
            let pods = env
                .pods()
                .list(&ListParams::default().labels("app.kubernetes.io/component=agent"))
                .await?;
            Ok(pods.items.into_iter().find(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                    && p.metadata.uid.is_some()
            }))
        },
    )
    .await?;
    let account = format!("{}-nodeward-agent", env.id);
    client_as(Identity::Token(token(env, &account, Some(&pod)).await?)).await
}

/// A running pod (of its own ReplicaSet) on node A and one on node B.
async fn a_pod_on_each(env: &TestEnv, node_a: &str, node_b: &str) -> anyhow::Result<(Pod, Pod)> {
    env.replicaset("on-a", node_a, 1, &PodOptions::default())
        .await?;
    env.replicaset("on-b", node_b, 1, &PodOptions::default())
        .await?;
    let on_a = env.running_pods("on-a", 1).await?.remove(0);
    let on_b = env.running_pods("on-b", 1).await?.remove(0);
    Ok((on_a, on_b))
}

/// `agent` (node A's agent identity) labels its own Node as nodeward's, and the admission policy,
/// once the API server has loaded it, refuses it node B.
async fn held_to_its_own_node(agent: &Client, node_a: &str, node_b: &str) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(agent.clone());
    nodes
        .patch(
            node_a,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {AGENT_LABEL: "true"}}})),
        )
        .await?;
    let label = Patch::Merge(json!({"metadata": {"labels": {"e2e-touched": "b"}}}));
    let message = wait::eventually(
        "the policy to refuse node B",
        Duration::from_secs(30),
        || async {
            let said = refusal(nodes.patch(node_b, &PatchParams::default(), &label).await);
            Ok(said
                .contains("may change only its own Node")
                .then_some(said))
        },
    )
    .await?;
    anyhow::ensure!(
        message.starts_with("403")
            && message.contains(&format!(
                "nodeward-agent on node {node_a} may change only its own Node, not {node_b}"
            )),
        "{message}"
    );
    Ok(())
}

#[tokio::test]
async fn the_applied_chart_keeps_each_identity_to_what_it_needs() -> anyhow::Result<()> {
    let env = TestEnv::new("chart").await?;
    let dir = std::env::temp_dir().join(format!("nodeward-chart-{}", env.id));
    let documents = apply_chart_on_own_nodes(&env, &dir).await?;
    let (node_a, node_b) = (env.node_name(0), env.node_name(1));

    let coordinator_account = format!("{}-nodeward-coordinator", env.id);
    let agent = agent_on(&env, &node_a).await?;
    let label = |value: &str| Patch::Merge(json!({"metadata": {"labels": {"e2e-touched": value}}}));
    held_to_its_own_node(&agent, &node_a, &node_b).await?;

    // Pods: deleting one on its node is allowed, on another node refused.
    let (on_a, on_b) = a_pod_on_each(&env, &node_a, &node_b).await?;
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

    // Its liveness: its own Lease, held by its node; not another node's, not another Lease.
    let leases: Api<Lease> = Api::namespaced(agent.clone(), &env.namespace);
    let lease = |name: &str, holder: &str| -> anyhow::Result<Lease> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"nodeward.io/agent-lease": "true"}},
            "spec": {"holderIdentity": holder, "renewTime": "2026-11-25T00:00:00.000000Z"},
        }))?)
    };
    let own_lease = format!("nodeward-agent-{node_a}");
    let mut written = leases
        .create(&PostParams::default(), &lease(&own_lease, &node_a)?)
        .await?;
    for (name, holder) in [
        (format!("nodeward-agent-{node_b}"), node_b.as_str()),
        (format!("nodeward-agent-{node_a}-x"), node_a.as_str()),
        ("nodeward-coordinator".to_owned(), node_a.as_str()),
    ] {
        let said = refusal(
            leases
                .create(&PostParams::default(), &lease(&name, holder)?)
                .await,
        );
        assert!(
            said.contains(&format!(
                "may write only the Lease nodeward-agent-{node_a}, held by its node; not {name}"
            )),
            "{name}: {said}"
        );
    }
    if let Some(spec) = written.spec.as_mut() {
        spec.holder_identity = Some(node_b.clone());
    }
    let said = refusal(
        leases
            .replace(&own_lease, &PostParams::default(), &written)
            .await,
    );
    assert!(said.contains("held by its node"), "{said}");
    // What it reads: the peer directory and the policies the coordinator publishes, not the
    // DisruptionPolicies (their status changes with every admission) nor other ConfigMaps.
    Api::<EndpointSlice>::namespaced(agent.clone(), &env.namespace)
        .list(&ListParams::default())
        .await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(agent.clone(), &env.namespace);
    assert!(
        refusal(configmaps.get("nodeward-agent-policies").await).starts_with("404"),
        "the published policies may be read (there are none here)"
    );
    assert!(refusal(configmaps.get("kube-root-ca.crt").await).starts_with("403"));
    assert!(
        refusal(
            Api::<DisruptionPolicy>::all(agent.clone())
                .list(&ListParams::default())
                .await
        )
        .starts_with("403")
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
    let own = format!("{node_a}-reboot-e2e00001");
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
            json!({"admissionsWithdrawn": 7}),
            "written by the nodeward coordinator only",
        ),
        (
            json!({"deadline": {"phase": "Draining", "time": "2030-01-01T00:00:00Z", "then": "never"}}),
            "written by the nodeward coordinator only",
        ),
        // Forging the workload gate's verdict, keeping the admission as it is.
        (
            json!({"conditions": [
                {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "fits", "lastTransitionTime": "2026-11-21T10:00:00Z"},
                {"type": "WorkloadsAvailable", "status": "True", "reason": "Available", "message": "forged", "lastTransitionTime": "2026-11-21T10:00:00Z"},
            ]}),
            "written by the nodeward coordinator only",
        ),
        // A surge record the coordinator would "restore": another namespace's Deployment to 0.
        (
            json!({"surges": [{"namespace": "kube-system", "deployment": "coredns", "pods": [], "state": "Surging", "replicas": 0}]}),
            "written by the nodeward coordinator only",
        ),
        (
            json!({"phase": "Admitted"}),
            "from Draining to Admitted: only the coordinator admits",
        ),
        (json!({"phase": "Succeeded"}), "from Draining to Succeeded"),
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

    // Nor may it add (or take away) the finalizer that keeps a surge's record.
    let said = refusal(
        maintenances
            .patch(
                &own,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": ["nodeward.io/surge"]}})),
            )
            .await,
    );
    assert!(
        said.contains("the nodeward.io/surge finalizer is the nodeward coordinator's"),
        "{said}"
    );

    // Then on along the lifecycle, and no way back out of a finished phase.
    for phase in ["Acting", "Verifying", "Succeeded"] {
        maintenances
            .patch_status(
                &own,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": phase}})),
            )
            .await
            .with_context(|| format!("moving {own} to {phase}"))?;
    }
    let said = refusal(
        maintenances
            .patch_status(
                &own,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Failed"}})),
            )
            .await,
    );
    assert!(said.contains("from Succeeded to Failed"), "{said}");

    // Evictions: the chart's webhook, served by the chart's coordinator with the certificate it
    // keeps itself.
    let webhook = EvictionWebhook::serving(&env, &dir, &documents, &[]).await?;
    env.replicaset("evict-a", &node_a, 1, &PodOptions::default())
        .await?;
    let evict_a = env.running_pods("evict-a", 1).await?.remove(0);
    let said = webhook
        .refusal_of(&pods, &on_b, &Default::default())
        .await?;
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

    remove_chart(env, &documents).await
}

/// A host-mode agent's client certificate (user `nodeward:agent:<node>` in `nodeward:agents`,
/// issued through the CSR API as an operator would) is held to the node its name carries, as a
/// token's claim holds the DaemonSet's agent; and it needs no Node, so an agent on a node whose
/// kubelet never registered writes its report and its Lease.
#[tokio::test]
async fn a_host_mode_certificate_keeps_its_agent_to_the_node_its_name_carries() -> anyhow::Result<()>
{
    let env = TestEnv::new("hostcert").await?;
    let dir = std::env::temp_dir().join(format!("nodeward-hostcert-{}", env.id));
    let documents = apply_chart_on_own_nodes(&env, &dir).await?;
    let (node_a, node_b) = (env.node_name(0), env.node_name(1));
    let unregistered = env.node_name(7);
    let agent_of = |node: String| {
        let env = &env;
        async move {
            let issued = nodeward_e2e::certificates::issue(
                &env.client,
                &format!("{}-{node}", env.id),
                &format!("{AGENT_USER_PREFIX}{node}"),
                &[&agent_group(env)],
            )
            .await?;
            client_as(Identity::Certificate(issued)).await
        }
    };
    let agent = agent_of(node_a.clone()).await?;

    held_to_its_own_node(&agent, &node_a, &node_b).await?;

    // A node that never registered: its agent reports and keeps its Lease, under its name only.
    let lonely = agent_of(unregistered.clone()).await?;
    let reports: Api<NodeReport> = Api::all(lonely.clone());
    let report = |node: &str| -> anyhow::Result<NodeReport> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeReport",
            "metadata": {"name": node}, "spec": {"nodeName": node},
        }))?)
    };
    reports
        .create(&PostParams::default(), &report(&unregistered)?)
        .await
        .context("the unregistered node's agent writing its report")?;
    let said = refusal(
        reports
            .create(&PostParams::default(), &report(&node_b)?)
            .await,
    );
    assert!(said.starts_with("403"), "another node's report: {said}");
    let leases: Api<Lease> = Api::namespaced(lonely.clone(), &env.namespace);
    let lease = |name: String| -> anyhow::Result<Lease> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"holderIdentity": unregistered, "renewTime": "2026-11-25T00:00:00.000000Z"},
        }))?)
    };
    leases
        .create(
            &PostParams::default(),
            &lease(format!("nodeward-agent-{unregistered}"))?,
        )
        .await
        .context("the unregistered node's agent writing its Lease")?;
    let said = refusal(
        leases
            .create(
                &PostParams::default(),
                &lease(format!("nodeward-agent-{node_b}"))?,
            )
            .await,
    );
    assert!(said.contains("may write only the Lease"), "{said}");

    // Evictions through the chart's webhook: its own node's pods, not another's.
    let webhook = EvictionWebhook::serving(&env, &dir, &documents, &[]).await?;
    let (on_a, on_b) = a_pod_on_each(&env, &node_a, &node_b).await?;
    let pods: Api<Pod> = Api::namespaced(agent.clone(), &env.namespace);
    let dry_run = dry_run_eviction();
    let said = webhook.refusal_of(&pods, &on_b, &dry_run).await?;
    assert!(
        said.contains(&format!("nodeward-agent on node {node_a} may evict")),
        "{said}"
    );
    pods.evict(&on_a.name_any(), &dry_run)
        .await
        .with_context(|| webhook.coordinator.output())?;
    drop(webhook);

    // The same user outside the group has none of the agent's rights.
    let outsider = nodeward_e2e::certificates::issue(
        &env.client,
        &format!("{}-outsider", env.id),
        &format!("{AGENT_USER_PREFIX}{node_a}"),
        &[],
    )
    .await?;
    let outsider = client_as(Identity::Certificate(outsider)).await?;
    let said = refusal(
        Api::<Node>::all(outsider)
            .patch(
                &node_a,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {AGENT_LABEL: "false"}}})),
            )
            .await,
    );
    assert!(
        said.starts_with("403") && said.contains("forbidden"),
        "{said}"
    );

    Api::<NodeReport>::all(env.client.clone())
        .delete(&unregistered, &DeleteParams::default())
        .await?;
    remove_chart(env, &documents).await
}

/// Reads Node `name` through `api`, applies `change` and writes it back (retried while the
/// node changes underneath, as kwok's status updates make it).
async fn update_node(
    api: &Api<Node>,
    name: &str,
    change: impl Fn(&mut Node),
) -> Result<Node, kube::Error> {
    loop {
        let mut node = api.get(name).await?;
        change(&mut node);
        match api.replace(name, &PostParams::default(), &node).await {
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            other => return other,
        }
    }
}

#[tokio::test]
async fn the_coordinator_changes_only_what_a_lost_agents_maintenance_left_on_a_node()
-> anyhow::Result<()> {
    let env = TestEnv::new("coord-node").await?;
    let dir = std::env::temp_dir().join(format!("nodeward-coord-node-{}", env.id));
    let documents = apply_chart_on_own_nodes(&env, &dir).await?;
    let (node_a, node_b) = (env.node_name(0), env.node_name(1));
    let account = format!("{}-nodeward-coordinator", env.id);
    let coordinator: Api<Node> =
        Api::all(client_as(Identity::Token(token(&env, &account, None).await?)).await?);
    // The policy in force (the API server loads it within seconds). A probe that gets through
    // changes a label on node_a, each try another value, so that it is refused once in force.
    let tries = std::sync::atomic::AtomicU32::new(0);
    wait::eventually(
        "the policy to refuse the coordinator a label",
        Duration::from_secs(30),
        || async {
            let n = tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let said = refusal(
                update_node(&coordinator, &node_a, |node| {
                    node.metadata
                        .labels
                        .get_or_insert_with(Default::default)
                        .insert("e2e-probe".into(), n.to_string());
                })
                .await,
            );
            Ok(said.starts_with("403").then_some(()))
        },
    )
    .await?;
    // node_b as a maintenance left it, beside an admin's dedicated taint.
    env.merge_node(
        &node_b,
        json!({
            "metadata": {"annotations": {CORDONED_BY_ANNOTATION: "maintenance/lost"}},
            "spec": {"unschedulable": true, "taints": [
                {"key": "nodeward.io/maintenance", "effect": "NoSchedule"},
                {"key": "dedicated", "value": "db", "effect": "NoSchedule"},
            ]},
        }),
    )
    .await?;
    // Each attack: what, on which node (a or b), the change, what the refusal says.
    type Attack = (&'static str, &'static str, fn(&mut Node), &'static str);
    let attacks: [Attack; 6] = [
        (
            "relabel",
            "b",
            |n| {
                n.metadata
                    .labels
                    .get_or_insert_with(Default::default)
                    .insert(
                        "node-role.kubernetes.io/control-plane".into(),
                        String::new(),
                    );
            },
            "may only remove the nodeward.io/cordoned-by annotation",
        ),
        (
            "drop the admin's taint",
            "b",
            |n| {
                if let Some(taints) = n.spec.as_mut().and_then(|s| s.taints.as_mut()) {
                    taints.retain(|t| t.key != "dedicated");
                }
            },
            "may only remove nodeward.io/ taints",
        ),
        (
            "uncordon keeping the record",
            "b",
            |n| n.spec.get_or_insert_with(Default::default).unschedulable = Some(false),
            "may uncordon it only where nodeward.io/cordoned-by says",
        ),
        (
            "cordon",
            "a",
            |n| n.spec.get_or_insert_with(Default::default).unschedulable = Some(true),
            "may not cordon",
        ),
        (
            "add a taint",
            "a",
            |n| {
                n.spec
                    .get_or_insert_with(Default::default)
                    .taints
                    .get_or_insert_with(Vec::new)
                    .push(k8s_openapi::api::core::v1::Taint {
                        key: "nodeward.io/maintenance".into(),
                        effect: "NoExecute".into(),
                        ..Default::default()
                    });
            },
            "may only remove nodeward.io/ taints",
        ),
        (
            "taint out of service without the record",
            "a",
            |n| {
                n.spec
                    .get_or_insert_with(Default::default)
                    .taints
                    .get_or_insert_with(Vec::new)
                    .push(k8s_openapi::api::core::v1::Taint {
                        key: "node.kubernetes.io/out-of-service".into(),
                        value: Some("nodeshutdown".into()),
                        effect: "NoExecute".into(),
                        ..Default::default()
                    });
            },
            "only with its record nodeward.io/out-of-service",
        ),
    ];
    for (attack, which, change, expected) in attacks {
        let node = if which == "a" { &node_a } else { &node_b };
        let said = refusal(update_node(&coordinator, node, change).await);
        assert!(
            said.starts_with("403") && said.contains(expected),
            "{attack}: {said}"
        );
    }
    // What it is there for: the maintenance's taint and its recorded cordon go.
    let restored = update_node(&coordinator, &node_b, |n| {
        nodeward_api::node::revert(
            n,
            "nodeward.io/maintenance",
            &nodeward_api::node::left_by(n, "maintenance/lost", true),
        );
    })
    .await?;
    let spec = restored.spec.unwrap_or_default();
    assert_ne!(spec.unschedulable, Some(true));
    // (node.kubernetes.io/unschedulable is the node controller's, following the cordon.)
    let keys: Vec<String> = spec
        .taints
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .filter(|k| !k.starts_with("node.kubernetes.io/"))
        .collect();
    assert_eq!(keys, ["dedicated"], "the admin's taint stays");
    // The out-of-service taint with its record, and only that one taken away again.
    let tainted = update_node(&coordinator, &node_a, |n| {
        nodeward_api::node::out_of_service(n, true, "dead (e2e)");
    })
    .await?;
    assert!(
        tainted
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == "node.kubernetes.io/out-of-service")
    );
    update_node(&coordinator, &node_a, |n| {
        nodeward_api::node::out_of_service(n, false, "");
    })
    .await?;
    env.merge_node(&node_a, json!({"spec": {"taints": [
                {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"},
            ]}})).await?;
    let said = refusal(
        update_node(&coordinator, &node_a, |n| {
            if let Some(taints) = n.spec.as_mut().and_then(|s| s.taints.as_mut()) {
                taints.retain(|t| t.key != "node.kubernetes.io/out-of-service");
            }
        })
        .await,
    );
    assert!(
        said.contains("take away only the one it recorded"),
        "an admin's out-of-service taint stays: {said}"
    );
    env.merge_node(&node_a, json!({"spec": {"taints": null}}))
        .await?;
    // An admin's cordon (no record) is not the coordinator's to lift.
    env.merge_node(&node_a, json!({"spec": {"unschedulable": true}}))
        .await?;
    let said = refusal(
        update_node(&coordinator, &node_a, |n| {
            n.spec.get_or_insert_with(Default::default).unschedulable = Some(false);
        })
        .await,
    );
    assert!(said.contains("may uncordon it only where"), "{said}");
    remove_chart(env, &documents).await
}

/// The chart applied on two nodes of a new test environment, and a client acting as the agent
/// on the first: the environment, the chart's documents, that node, the client.
async fn chart_and_agent(prefix: &str) -> anyhow::Result<(TestEnv, Vec<Value>, String, Client)> {
    let env = TestEnv::new(prefix).await?;
    let dir = std::env::temp_dir().join(format!("nodeward-{prefix}-{}", env.id));
    let documents = apply_chart_on_own_nodes(&env, &dir).await?;
    let node = env.node_name(0);
    let agent = agent_on(&env, &node).await?;
    Ok((env, documents, node, agent))
}

/// Attacks by one node's agent identity (a token read from the agent's pod on that node) on its
/// own Node, and the writes the agent itself makes, through the chart's admission policy.
#[tokio::test]
async fn an_agent_changes_only_nodewards_part_of_its_own_node() -> anyhow::Result<()> {
    let (env, documents, node, agent) = chart_and_agent("ownnode").await?;
    let as_agent: Api<Node> = Api::all(agent.clone());
    let as_admin: Api<Node> = Api::all(env.client.clone());
    let merge = |patch: Value| Patch::Merge(patch);
    let params = PatchParams::default();

    // The policy in force (the API server loads it within seconds): another node is refused.
    let other = env.node_name(1);
    wait::eventually(
        "the policy to refuse another node",
        Duration::from_secs(30),
        || async {
            let said = refusal(
                as_agent
                    .patch(
                        &other,
                        &params,
                        &merge(json!({"metadata": {"labels": {AGENT_LABEL: "true"}}})),
                    )
                    .await,
            );
            Ok(said.contains("may change only its own Node").then_some(()))
        },
    )
    .await?;

    // Escalations: a control-plane or node-restriction label (workloads pinned there would come
    // to this node), dropping a label an admin set, another annotation, a cordon or its record
    // alone.
    let said = refusal(
        as_agent
            .patch(
                &node,
                &params,
                &merge(
                    json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}),
                ),
            )
            .await,
    );
    assert!(
        said.starts_with("403")
            && said.contains(&format!(
                "nodeward-agent on node {node} may change only the nodeward.io/agent label of its Node"
            )),
        "{said}"
    );
    for (attack, patch, expected) in [
        (
            "a node-restriction label",
            json!({"metadata": {"labels": {"node-restriction.kubernetes.io/pool": "gpu"}}}),
            "only the nodeward.io/agent label",
        ),
        (
            "an admin's label removed",
            json!({"metadata": {"labels": {TEST_LABEL: null}}}),
            "only the nodeward.io/agent label",
        ),
        (
            "another annotation",
            json!({"metadata": {"annotations": {"example.com/owner": "me"}}}),
            "only the nodeward.io/cordoned-by annotation",
        ),
        (
            "a cordon without its record",
            json!({"spec": {"unschedulable": true}}),
            "may cordon its Node only recording it",
        ),
        (
            "a record without the cordon",
            json!({"metadata": {"annotations": {CORDONED_BY_ANNOTATION: "maintenance/x"}}}),
            "may cordon its Node only recording it",
        ),
    ] {
        let said = refusal(as_agent.patch(&node, &params, &merge(patch)).await);
        assert!(
            said.starts_with("403") && said.contains(expected),
            "{attack}: {said}"
        );
    }

    // What the agent does: cordon with its record and a nodeward taint, then undo both.
    as_agent
        .patch(
            &node,
            &params,
            &merge(json!({
                "metadata": {"annotations": {CORDONED_BY_ANNOTATION: "maintenance/x"}},
                "spec": {"unschedulable": true,
                         "taints": [{"key": "nodeward.io/maintenance", "effect": "NoSchedule"}]},
            })),
        )
        .await
        .context("cordoning with the record")?;
    // Undone as the agent does (read, change, replace at that resourceVersion): its own taint
    // only; the node controller's node.kubernetes.io/unschedulable is not the agent's.
    let mut attempts = 0;
    loop {
        let mut current = as_agent.get(&node).await?;
        if let Some(annotations) = current.metadata.annotations.as_mut() {
            annotations.remove(CORDONED_BY_ANNOTATION);
        }
        let spec = current.spec.get_or_insert_with(Default::default);
        spec.unschedulable = None;
        if let Some(taints) = spec.taints.as_mut() {
            taints.retain(|t| t.key != "nodeward.io/maintenance");
        }
        match as_agent
            .replace(&node, &PostParams::default(), &current)
            .await
        {
            Ok(_) => break,
            Err(kube::Error::Api(status)) if status.code == 409 && attempts < 10 => attempts += 1,
            Err(e) => return Err(anyhow::Error::from(e).context("undoing its cordon")),
        }
    }

    // An admin's cordon and dedicated taint are not the agent's to lift, in one step or two.
    as_admin
        .patch(
            &node,
            &params,
            &merge(json!({"spec": {"unschedulable": true,
                "taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}})),
        )
        .await?;
    for (attack, patch, expected) in [
        (
            "lifting the admin's cordon",
            json!({"spec": {"unschedulable": null}}),
            "uncordon it only where that record says it cordoned it",
        ),
        (
            "claiming the admin's cordon",
            json!({"metadata": {"annotations": {CORDONED_BY_ANNOTATION: "maintenance/x"}}}),
            "may cordon its Node only recording it",
        ),
        (
            "dropping the dedicated taint",
            json!({"spec": {"taints": [{"key": "nodeward.io/shutdown", "effect": "NoSchedule"}]}}),
            "may change only nodeward.io/ taints",
        ),
    ] {
        let said = refusal(as_agent.patch(&node, &params, &merge(patch)).await);
        assert!(
            said.starts_with("403") && said.contains(expected),
            "{attack}: {said}"
        );
    }
    let kept = as_admin.get(&node).await?;
    let spec = kept.spec.unwrap_or_default();
    assert_eq!(spec.unschedulable, Some(true), "the admin's cordon stays");
    assert!(
        spec.taints
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == "dedicated"),
        "the dedicated taint stays"
    );

    // Status: its own condition types (the detectors' and the configured custom check's), never
    // the kubelet's Ready nor anything else there.
    let condition = |type_: &str, status: &str| {
        json!({"type": type_, "status": status, "reason": "E2E", "message": "e2e",
               "lastHeartbeatTime": "2026-11-23T10:00:00Z", "lastTransitionTime": "2026-11-23T10:00:00Z"})
    };
    let apply = PatchParams::apply("nodeward-agent").force();
    for type_ in ["KubeletProblem", "NTPProblem"] {
        as_agent
            .patch_status(
                &node,
                &apply,
                &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node",
                    "status": {"conditions": [condition(type_, "False")]}})),
            )
            .await
            .with_context(|| format!("writing its own condition {type_}"))?;
    }
    for (attack, status) in [
        (
            "the kubelet's Ready",
            json!({"conditions": [condition("Ready", "False")]}),
        ),
        (
            "another component's condition",
            json!({"conditions": [condition("CorruptDockerOverlay2", "True")]}),
        ),
        ("its capacity", json!({"capacity": {"pods": "1000"}})),
    ] {
        let said = refusal(
            as_agent
                .patch_status(
                    &node,
                    &apply,
                    &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node", "status": status})),
                )
                .await,
        );
        assert!(
            said.starts_with("403")
                && said.contains("may change only the conditions it writes (NetworkProblem,")
                && said.contains("NTPProblem)"),
            "{attack}: {said}"
        );
    }
    as_admin
        .patch(
            &node,
            &params,
            &merge(json!({"spec": {"unschedulable": null, "taints": null}})),
        )
        .await?;
    remove_chart(env, &documents).await
}

/// What an agent may create: a plain reboot of its own node under the pinned name.
#[tokio::test]
async fn an_agent_asks_only_for_a_plain_reboot_under_its_pinned_name() -> anyhow::Result<()> {
    let (env, documents, node, agent) = chart_and_agent("asks").await?;
    let maintenances: Api<NodeMaintenance> = Api::all(agent);
    let maintenance = |name: &str, extra: Value| -> anyhow::Result<NodeMaintenance> {
        let mut spec = json!({"nodeName": node, "reason": "Reboot", "action": "Reboot"});
        if let (Some(spec), Value::Object(extra)) = (spec.as_object_mut(), extra) {
            spec.extend(extra);
        }
        Ok(serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
            "metadata": {"name": name, "labels": {TEST_LABEL: env.id}},
            "spec": spec,
        }))?)
    };
    let said = wait::eventually(
        "the policy to refuse a free name",
        Duration::from_secs(30),
        || async {
            let said = refusal(
                maintenances
                    .create(&PostParams::default(), &maintenance("anything", json!({}))?)
                    .await,
            );
            Ok(said.contains("may create only").then_some(said))
        },
    )
    .await?;
    assert!(
        said.starts_with("403") && said.contains(&format!("may create only {node}-reboot-BOOTID")),
        "{said}"
    );
    let pinned = format!("{node}-reboot-0a1b2c3d");
    for (attack, name, extra, expected) in [
        (
            "a drain plan of its own",
            pinned.as_str(),
            json!({"drainPlan": {"stages": [{"name": "all", "timeout": "1s"}]}}),
            "without a drainPlan",
        ),
        (
            "a remediation, which skips the blockers",
            pinned.as_str(),
            json!({"reason": "Remediation"}),
            "may ask only for Reboot maintenances",
        ),
    ] {
        let said = refusal(
            maintenances
                .create(&PostParams::default(), &maintenance(name, extra)?)
                .await,
        );
        assert!(
            said.starts_with("403") && said.contains(expected),
            "{attack}: {said}"
        );
    }
    maintenances
        .create(&PostParams::default(), &maintenance(&pinned, json!({}))?)
        .await
        .context("the pinned name")?;
    // Pending is the coordinator's to leave: not to Draining, Acting or Succeeded.
    for phase in ["Admitted", "Draining", "Acting", "Succeeded"] {
        let said = refusal(
            maintenances
                .patch_status(
                    &pinned,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"phase": phase}})),
                )
                .await,
        );
        assert!(
            said.starts_with("403") && said.contains(&format!("from Pending to {phase}")),
            "{phase}: {said}"
        );
    }
    remove_chart(env, &documents).await
}

/// The chart's cluster-wide objects go (but the CRDs, which every test shares, as an uninstall
/// keeps them); the namespace takes the rest.
async fn remove_chart(env: TestEnv, documents: &[Value]) -> anyhow::Result<()> {
    for document in documents
        .iter()
        .filter(|d| d["metadata"]["namespace"].is_null() && d["kind"] != "CustomResourceDefinition")
    {
        let (api, name) = dynamic_api(&env.client, document).await?;
        let params = DeleteParams::default();
        api.delete(&name, &params)
            .await
            .with_context(|| format!("deleting {} {name}", document["kind"]))?;
    }
    env.cleanup().await
}

#[test]
fn the_admission_policy_lets_the_agent_write_its_detectors_conditions_and_the_configured_ones()
-> anyhow::Result<()> {
    let allowed = |documents: &[Value]| -> anyhow::Result<Vec<String>> {
        let policy = find(documents, "ValidatingAdmissionPolicy")?;
        let variable = policy["spec"]["variables"]
            .as_array()
            .and_then(|v| v.iter().find(|v| v["name"] == "agentConditions"))
            .context("the agentConditions variable")?;
        let expression = variable["expression"].as_str().context("its expression")?;
        Ok(serde_json::from_str(expression)?)
    };
    let defaults = render("nodeward", "nodeward-system", &[])?;
    assert_eq!(
        allowed(&defaults)?,
        nodeward_api::conditions::node::WRITTEN_BY_AGENT
    );
    let dir = std::env::temp_dir().join(format!("nodeward-conditions-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let values = dir.join("values.yaml");
    std::fs::write(
        &values,
        "agent:\n  config:\n    detectors:\n      custom:\n      - {name: ntp, condition: NTPProblem, reason: Skew, command: [/bin/true]}\n      kernelLog:\n        patterns:\n        - {reason: Stuck, regex: stuck, condition: NetDeviceStuck}\n        - {reason: Oops, regex: oops}\n",
    )?;
    let configured = render("nodeward", "nodeward-system", &[&values])?;
    std::fs::remove_dir_all(&dir)?;
    let mut expected: Vec<&str> = nodeward_api::conditions::node::WRITTEN_BY_AGENT.to_vec();
    expected.extend(["NTPProblem", "NetDeviceStuck"]);
    assert_eq!(allowed(&configured)?, expected);
    Ok(())
}

#[test]
fn the_crds_the_chart_renders_are_the_ones_generated_from_the_types() -> anyhow::Result<()> {
    let rendered = render("nodeward", "nodeward-system", &[])?;
    let crds: Vec<&Value> = rendered
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .collect();
    let generated = nodeward_api::crds::all();
    assert_eq!(crds.len(), generated.len());
    for crd in generated {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let ours = crds
            .iter()
            .find(|d| d["metadata"]["name"] == name.as_str())
            .with_context(|| format!("{name} is not rendered"))?;
        assert_eq!(
            whole_numbers_as_integers(ours["spec"].clone()),
            whole_numbers_as_integers(serde_json::to_value(&crd.spec)?),
            "{name}: the rendered schema is the generated one"
        );
        assert_eq!(
            ours["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
            "{name}: kept on uninstall"
        );
    }
    // Managed apart (GitOps applying files/crds/ first): not rendered.
    let dir = std::env::temp_dir().join(format!("nodeward-crds-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let values = dir.join("values.yaml");
    std::fs::write(&values, "crds: {install: false}\n")?;
    let without = render("nodeward", "nodeward-system", &[&values])?;
    assert!(!kinds(&without).contains(&"CustomResourceDefinition".to_owned()));
    Ok(())
}

/// `value` with every whole floating-point number as an integer: a schema's `minimum: 0` is a
/// float in the CRD type (0.0) and an integer once helm has rendered it, the same number.
fn whole_numbers_as_integers(value: Value) -> Value {
    match value {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 => json!(f as i64),
            _ => Value::Number(n),
        },
        Value::Array(items) => items.into_iter().map(whole_numbers_as_integers).collect(),
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .map(|(k, v)| (k, whole_numbers_as_integers(v)))
                .collect(),
        ),
        other => other,
    }
}

#[tokio::test]
async fn the_webhook_certificate_is_no_part_of_a_render_and_rotates_without_a_restart()
-> anyhow::Result<()> {
    let env = TestEnv::new("webhook-cert").await?;
    let dir = std::env::temp_dir().join(format!("nodeward-webhook-{}", env.id));
    std::fs::create_dir_all(&dir)?;
    // Two renders in a row are the same text, and neither holds certificate material: a
    // GitOps tool re-rendering the chart changes nothing of the webhook's trust.
    let values = dir.join("values.yaml");
    std::fs::write(&values, serde_yaml::to_string(&own_nodes_values(&env))?)?;
    let first = render_text(&env.id, &env.namespace, &[&values])?;
    let second = render_text(&env.id, &env.namespace, &[&values])?;
    assert_eq!(first, second, "two renders differ");
    assert!(
        !first.contains("BEGIN CERTIFICATE") && !first.contains("caBundle:"),
        "a render carries certificate material"
    );
    let documents = apply_chart_on_own_nodes(&env, &dir).await?;
    let (node_a, node_b) = (env.node_name(0), env.node_name(1));
    let agent = agent_on(&env, &node_a).await?;

    // Short lives, to see renewals and a CA handover within the test: a serving certificate
    // every ~10 s, the CA's successor trusted at 30 s and taking over at 37.5 s.
    let webhook = EvictionWebhook::start(
        &env,
        &env.id,
        &dir,
        &["--webhook-cert-validity=15s", "--webhook-ca-validity=45s"],
    )
    .await?;
    let configuration = webhook.configuration(&documents)?;
    apply(&env.client, std::slice::from_ref(&configuration)).await?;
    webhook.wait_ca_bundle(&env).await?;
    let (on_a, on_b) = a_pod_on_each(&env, &node_a, &node_b).await?;
    let pods: Api<Pod> = Api::namespaced(agent, &env.namespace);
    let dry_run = dry_run_eviction();

    let pid = webhook.coordinator.child.id();
    let (mut serving, mut issuers, mut bundles) = (
        std::collections::BTreeSet::new(),
        std::collections::BTreeSet::new(),
        std::collections::BTreeSet::new(),
    );
    let started = std::time::Instant::now();
    let mut checks = 0;
    let mut reapplied = false;
    while started.elapsed() < Duration::from_secs(55) {
        // Every round: the webhook answers through a TLS chain the API server trusts.
        pods.evict(&on_a.name_any(), &dry_run)
            .await
            .with_context(|| {
                format!(
                    "allowed eviction at {:?}\n{}",
                    started.elapsed(),
                    webhook.coordinator.output()
                )
            })?;
        let said = refusal(pods.evict(&on_b.name_any(), &dry_run).await);
        assert!(
            said.contains("may evict only pods on its own node"),
            "at {:?}: {said}\n{}",
            started.elapsed(),
            webhook.coordinator.output()
        );
        checks += 2;
        if let Some(secret) = webhook.secret(&env).await? {
            let data = secret.data.unwrap_or_default();
            serving.extend(data.get("tls.crt").map(|b| b.0.clone()));
            issuers.extend(data.get("issuer.crt").map(|b| b.0.clone()));
            bundles.extend(data.get("ca.crt").map(|b| b.0.clone()));
        }
        // Half-way: the chart applied again as rendered (as Argo CD or Flux would); the
        // caBundle the coordinator wrote stays.
        if !reapplied && started.elapsed() > Duration::from_secs(20) {
            let before = webhook.wait_ca_bundle(&env).await?;
            let mut again = documents.clone();
            for document in &mut again {
                if document["kind"] == "ValidatingWebhookConfiguration" {
                    *document = configuration.clone();
                }
            }
            apply(&env.client, &again).await?;
            let live: ValidatingWebhookConfiguration = Api::all(env.client.clone())
                .get(&format!("{}-nodeward-agent-evictions", env.id))
                .await?;
            let after = live.webhooks.unwrap_or_default()[0]
                .client_config
                .ca_bundle
                .clone()
                .map(|b| b.0);
            assert_eq!(
                after.as_deref(),
                Some(before.as_slice()),
                "a re-apply kept the caBundle"
            );
            reapplied = true;
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    assert!(
        webhook.coordinator.child.id() == pid
            && webhook
                .coordinator
                .output()
                .matches("nodeward-coordinator running")
                .count()
                == 1,
        "the coordinator was not restarted"
    );
    println!(
        "{checks} evictions checked; {} serving certificates, {} CAs, {} trust bundles",
        serving.len(),
        issuers.len(),
        bundles.len()
    );
    assert!(
        serving.len() >= 4,
        "serving certificates renewed: {}",
        serving.len()
    );
    assert!(
        issuers.len() >= 2,
        "the CA was handed over: {}",
        issuers.len()
    );
    drop(webhook);
    remove_chart(env, &documents).await
}

/// Connections a neighbour opens and never finishes: per listener, those over the limits on
/// connections from one address are closed at once, the rest when their deadline passes.
const SIEGE: usize = 1000;
/// `Limits::default()`: connections held at once from one address, and the deadline for a
/// request's headers and for a TLS handshake.
const HELD_PER_ADDRESS: usize = 64;
const DEADLINE: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_thousand_stalled_connections_exhaust_neither_the_webhook_nor_the_health_port()
-> anyhow::Result<()> {
    let env = TestEnv::new("siege").await?;
    let dir = std::env::temp_dir().join(format!("nodeward-siege-{}", env.id));
    let documents = apply_chart_on_own_nodes(&env, &dir).await?;
    let (node_a, node_b) = (env.node_name(0), env.node_name(1));
    let agent = agent_on(&env, &node_a).await?;
    let webhook = EvictionWebhook::serving(&env, &dir, &documents, &[]).await?;
    env.replicaset("on-b", &node_b, 1, &PodOptions::default())
        .await?;
    let on_b = env.running_pods("on-b", 1).await?.remove(0);
    let pods: Api<Pod> = Api::namespaced(agent, &env.namespace);
    let dry_run = dry_run_eviction();
    // The webhook answers (it refuses the agent on A a pod on B) before the siege.
    let refused = || async { refusal(pods.evict(&on_b.name_any(), &dry_run).await) };
    let said = wait::eventually("the webhook to answer", Duration::from_secs(30), || async {
        let said = refused().await;
        Ok(said.contains("may evict only pods").then_some(said))
    })
    .await
    .with_context(|| webhook.coordinator.output())?;
    assert!(said.contains(&node_b), "{said}");

    let pid = webhook.coordinator.child.id();
    let rss_before = rss_kib(pid)?;
    let neighbour: std::net::IpAddr = [127, 0, 0, 2].into();
    let webhook_port: std::net::SocketAddr = webhook
        .url
        .trim_start_matches("https://localhost:")
        .split('/')
        .next()
        .map(|port| format!("127.0.0.1:{port}"))
        .context("the webhook's port")?
        .parse()?;
    let health_port: std::net::SocketAddr = webhook.coordinator.listen.parse()?;
    // Nothing at all on the webhook port (a TLS handshake that never starts); half a request's
    // headers on the health port.
    let on_webhook = Siege::start(neighbour, webhook_port, SIEGE, b"").await?;
    let on_health =
        Siege::start(neighbour, health_port, SIEGE, b"GET /healthz HTTP/1.1\r\n").await?;
    for (name, siege) in [("webhook", &on_webhook), ("health", &on_health)] {
        let held = siege
            .until_held_at_most(HELD_PER_ADDRESS, Duration::from_secs(5))
            .await
            .with_context(|| format!("the {name} port"))?;
        let early = siege
            .closed()
            .into_iter()
            .filter(|d| *d < DEADLINE / 2)
            .count();
        assert!(
            early >= SIEGE - HELD_PER_ADDRESS,
            "the {name} port closed only {early} of the {SIEGE} connections over its limits at once"
        );
        println!("{name} port: {held} of {SIEGE} stalled connections held, {early} closed at once");
    }
    let rss_held = rss_kib(pid)?;

    // While the neighbour holds its share: the API server's call to the webhook and a probe of
    // /healthz from another address are answered.
    let said = refused().await;
    assert!(
        said.contains("may evict only pods"),
        "during the siege the webhook said: {said}"
    );
    let (status, _) = webhook.coordinator.get("/healthz").await?;
    assert_eq!(status, 200, "/healthz during the siege");

    // Then the deadlines close what the neighbour held, on both ports.
    for (name, siege) in [("webhook", &on_webhook), ("health", &on_health)] {
        siege
            .until_held_at_most(0, DEADLINE * 3)
            .await
            .with_context(|| format!("the {name} port's deadline"))?;
        let last = siege.closed().into_iter().max().unwrap_or_default();
        assert!(
            last >= DEADLINE.mul_f64(0.9),
            "the {name} port closed its last stalled connection after {last:?}, before its {DEADLINE:?} deadline"
        );
    }
    let grown = rss_held.saturating_sub(rss_before);
    println!(
        "coordinator memory: {rss_before} KiB before, {rss_held} KiB holding {} connections (+{grown} KiB)",
        2 * HELD_PER_ADDRESS
    );
    assert!(
        grown < 32 * 1024,
        "the coordinator grew {grown} KiB holding the siege"
    );
    drop(webhook);
    remove_chart(env, &documents).await
}

/// An eviction the API server checks (the webhook included) but does not carry out.
fn dry_run_eviction() -> kube::api::EvictParams {
    kube::api::EvictParams {
        post_options: PostParams {
            dry_run: true,
            ..PostParams::default()
        },
        ..Default::default()
    }
}

/// A process's resident memory, from /proc.
fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    status_kib(pid, "VmRSS")
}

/// A memory figure (`VmRSS`, `VmHWM`, ...) of a process, in KiB, from /proc.
fn status_kib(pid: u32, key: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("{key} of process {pid}"))
}

#[tokio::test]
async fn helm_upgrades_the_crds_with_the_release_and_their_objects_survive() -> anyhow::Result<()> {
    // It changes the CRDs, so it runs while no other test does.
    let env = TestEnv::alone("helm-upgrade").await?;
    let dir = std::env::temp_dir().join(format!("nodeward-upgrade-{}", env.id));
    std::fs::create_dir_all(&dir)?;
    let kubeconfig = nodeward_e2e::controlplane::shared().kubeconfig.clone();
    let helm_in = |args: &[&str], chart_dir: Option<&Path>| -> anyhow::Result<String> {
        let mut command = Command::new(helm()?);
        command.args(args);
        if let Some(chart_dir) = chart_dir {
            command.arg(chart_dir);
        }
        command
            .arg("--namespace")
            .arg(&env.namespace)
            .arg("--kubeconfig")
            .arg(&kubeconfig);
        run(&mut command)
    };
    // Workloads and policies of the release stay off every node: this test is about the CRDs.
    let values = dir.join("values.yaml");
    std::fs::write(
        &values,
        serde_yaml::to_string(&json!({
            "agent": {"nodeSelector": {TEST_LABEL: "none"}},
            "coordinator": {"nodeSelector": {TEST_LABEL: "none"}, "replicas": 1},
            "defaultPolicy": {"enabled": false},
        }))?,
    )?;
    let values_arg = values.to_str().context("values path")?;

    // The CRDs exist already, as after an install of 0.1.0 (crds/ directory, never managed
    // by Helm): the README's one-time step lets the release adopt them.
    adopt_crds(&env.client, &env.id, &env.namespace).await?;
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    helm_in(
        &["install", &env.id, "--values", values_arg],
        Some(&chart()),
    )?;

    // As JSON (a typed DisruptionPolicy would drop the field the next version adds).
    let policy = |name: &str, probe: Option<&str>| -> anyhow::Result<DynamicObject> {
        let mut spec =
            json!({"maxConcurrent": 1, "nodeSelector": {"matchLabels": {TEST_LABEL: env.id}}});
        if let Some(probe) = probe {
            spec["upgradeProbe"] = json!(probe);
        }
        Ok(serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
            "metadata": {"name": name, "labels": {TEST_LABEL: env.id}}, "spec": spec,
        }))?)
    };
    let raw: Api<DynamicObject> = Api::all_with(
        env.client.clone(),
        &kube::api::ApiResource::erase::<DisruptionPolicy>(&()),
    );
    let kept = format!("{}-kept", env.id);
    raw.create(&PostParams::default(), &policy(&kept, None)?)
        .await?;
    // A field the installed schema does not know is pruned.
    let probe = format!("{}-probe", env.id);
    raw.create(&PostParams::default(), &policy(&probe, Some("v1"))?)
        .await?;
    let stored = raw.get(&probe).await?;
    assert!(
        stored.data["spec"]["upgradeProbe"].is_null(),
        "pruned before the upgrade: {:?}",
        stored.data
    );
    raw.delete(&probe, &DeleteParams::default()).await?;

    // A later chart version adds the field to its CRD, as a new release would.
    let next = dir.join("nodeward");
    run(Command::new("cp").arg("-r").arg(chart()).arg(&next))?;
    let crd_file = next.join("files/crds/disruptionpolicies.nodeward.io.yaml");
    let mut crd: Value = serde_yaml::from_str(&std::fs::read_to_string(&crd_file)?)?;
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["upgradeProbe"] =
        json!({"type": "string", "maxLength": 16, "description": "added by the next chart version"});
    std::fs::write(&crd_file, serde_yaml::to_string(&crd)?)?;
    let chart_file = next.join("Chart.yaml");
    let text = std::fs::read_to_string(&chart_file)?;
    std::fs::write(
        &chart_file,
        text.replace("\nversion: 0.1.0\n", "\nversion: 0.2.0\n"),
    )?;
    let said = helm_in(&["upgrade", &env.id, "--values", values_arg], Some(&next))?;
    assert!(said.contains("has been upgraded"), "{said}");

    // The API server serves the new schema: the field is kept now.
    wait::eventually(
        "the upgraded schema to be served",
        Duration::from_secs(30),
        || async {
            let _ = raw.delete(&probe, &DeleteParams::default()).await;
            raw.create(&PostParams::default(), &policy(&probe, Some("v2"))?)
                .await?;
            let stored = raw.get(&probe).await?;
            Ok((stored.data["spec"]["upgradeProbe"] == "v2").then_some(()))
        },
    )
    .await?;
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    let survived = policies.get(&kept).await?;
    assert_eq!(
        survived.spec.max_concurrent,
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1)
    );

    // Uninstalled: the CRDs and every object of theirs stay.
    helm_in(&["uninstall", &env.id], None)?;
    for crd in nodeward_api::crds::all() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        assert!(crds.get_opt(&name).await?.is_some(), "{name} was kept");
    }
    policies.get(&kept).await?;

    // Back to the generated CRDs for the tests that share them.
    for crd in nodeward_api::crds::all() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let mut restored = crd.clone();
        let live = crds.get(&name).await?;
        restored.metadata.resource_version = live.metadata.resource_version;
        restored.metadata.labels = None;
        restored.metadata.annotations = None;
        crds.replace(&name, &PostParams::default(), &restored)
            .await?;
    }
    nodeward_e2e::env::apply_crds(&env.client).await?;
    for name in [&kept, &probe] {
        let _ = policies.delete(name, &DeleteParams::default()).await;
    }
    env.cleanup().await
}

/// How many maintenances the flood creates (issue: a few dozen large objects or 100k small
/// ones from one node used to take both coordinator replicas past their memory limit).
const FLOOD: usize = 10_000;

/// One node's agent identity creates 10,000 reboot requests (every one the admission policy
/// lets it: its node, its pinned name pattern, no drain plan). The coordinator decides only
/// the newest of them and ends the others a few a round; meanwhile another node's maintenance
/// is admitted, the flooding node's agent still evicts through the webhook, and the
/// coordinator stays within the chart's memory limit.
#[tokio::test]
async fn a_flood_of_maintenances_from_one_node_stalls_neither_admission_nor_the_webhook()
-> anyhow::Result<()> {
    let (env, documents, node_a, agent) = chart_and_agent("flood").await?;
    let node_b = env.node_name(1);
    // Only B's agent is alive: the flood's newest request waits (AgentUnavailable).
    env.heartbeats(std::slice::from_ref(&node_b)).await?;
    let dir = std::env::temp_dir().join(format!("nodeward-flood-{}", env.id));
    let webhook =
        EvictionWebhook::serving(&env, &dir, &documents, &["--leader-elect=false"]).await?;
    let pid = webhook.coordinator.child.id();
    let rss_before = rss_kib(pid)?;

    let flooding: Api<NodeMaintenance> = Api::all(agent.clone());
    let started = std::time::Instant::now();
    nodeward_e2e::concurrently(0..FLOOD, 32, |i| {
        let flooding = flooding.clone();
        let maintenance: anyhow::Result<NodeMaintenance> = serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
            "metadata": {"name": format!("{node_a}-reboot-{i:08}"), "labels": {TEST_LABEL: env.id}},
            "spec": {"nodeName": node_a, "reason": "Reboot", "action": "Reboot"},
        }))
        .map_err(Into::into);
        async move {
            flooding
                .create(&PostParams::default(), &maintenance?)
                .await
                .context("the flood")?;
            anyhow::Ok(())
        }
    })
    .await?;
    let flooded_in = started.elapsed();

    // Another node's maintenance is admitted with the flood there.
    let other = format!("{node_b}-m");
    env.create_maintenance(&other, &node_b, "Manual", "DrainOnly")
        .await?;
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let asked = std::time::Instant::now();
    let within = Duration::from_secs(60);
    wait::phase(&maintenances, &other, MaintenancePhase::Admitted, within)
        .await
        .with_context(|| webhook.coordinator.output())?;
    let admitted_in = asked.elapsed();

    // The flooding node's agent still evicts its own pods through the webhook.
    env.replicaset("on-a", &node_a, 1, &PodOptions::default())
        .await?;
    let on_a = env.running_pods("on-a", 1).await?.remove(0);
    Api::<Pod>::namespaced(agent, &env.namespace)
        .evict(&on_a.name_any(), &dry_run_eviction())
        .await
        .context("an eviction through the webhook during the flood")?;

    // Older requests are ended a few a round; only the newest waits.
    let superseded = wait::eventually(
        "older requests superseded",
        Duration::from_secs(60),
        || async {
            let failed = maintenances
                .list(&ListParams::default().labels(&format!("{TEST_LABEL}={}", env.id)))
                .await?
                .items
                .iter()
                .filter(|m| {
                    m.phase() == MaintenancePhase::Failed
                        && m.status
                            .as_ref()
                            .and_then(|s| s.message.as_deref())
                            .is_some_and(|t| t.starts_with("superseded by"))
                })
                .count();
            Ok((failed >= 200).then_some(failed))
        },
    )
    .await?;
    let peak = status_kib(pid, "VmHWM")?;
    println!(
        "{FLOOD} maintenances from one node's identity in {:.0} s; another node admitted {:.1} s after asking; {superseded} superseded so far; coordinator RSS {} MiB before, peak {} MiB (limit 256 MiB)",
        flooded_in.as_secs_f64(),
        admitted_in.as_secs_f64(),
        rss_before / 1024,
        peak / 1024
    );
    assert!(
        peak < 256 * 1024,
        "the coordinator peaked at {} MiB, over the chart's 256 MiB limit",
        peak / 1024
    );
    drop(webhook);
    maintenances
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&format!("{TEST_LABEL}={}", env.id)),
        )
        .await?;
    remove_chart(env, &documents).await
}

/// A first `helm install`: Helm creates admission policies after every kind it knows, the
/// agent DaemonSet among them, so the chart installs a copy of the agents' policy as a
/// pre-install hook. The copy exists before the DaemonSet does, refuses an agent's escalation
/// on its own, and the coordinator (as its own identity) retires it once the release's own
/// binding is in force, never before.
#[tokio::test]
async fn a_first_install_puts_the_agents_admission_policy_in_force_before_the_daemonset()
-> anyhow::Result<()> {
    use k8s_openapi::api::{
        admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
        apps::v1::DaemonSet,
    };
    use kube::api::{WatchEvent, WatchParams};
    let (env, node) = TestEnv::with_worker("firstinstall", "a").await?;
    let dir = std::env::temp_dir().join(format!("nodeward-firstinstall-{}", env.id));
    std::fs::create_dir_all(&dir)?;
    let kubeconfig = nodeward_e2e::controlplane::shared().kubeconfig.clone();
    let values = dir.join("values.yaml");
    std::fs::write(
        &values,
        serde_yaml::to_string(&json!({
            "agent": {"nodeSelector": {TEST_LABEL: env.id}},
            "coordinator": {"nodeSelector": {TEST_LABEL: "none"}, "replicas": 1},
            "defaultPolicy": {"enabled": false},
            "evictionWebhook": {"enabled": false},
        }))?,
    )?;
    let helm_in = |args: &[&str]| -> anyhow::Result<String> {
        run(Command::new(helm()?)
            .args(args)
            .arg("--namespace")
            .arg(&env.namespace)
            .arg("--kubeconfig")
            .arg(&kubeconfig))
    };

    // When the DaemonSet is created, from before the install on.
    let daemonsets: Api<DaemonSet> = Api::namespaced(env.client.clone(), &env.namespace);
    let from = daemonsets
        .list(&ListParams::default())
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let watching = daemonsets.clone();
    let created = tokio::spawn(async move {
        let events = watching
            .watch(&WatchParams::default().timeout(120), &from)
            .await?;
        futures::pin_mut!(events);
        while let Some(event) = events.try_next().await? {
            if let WatchEvent::Added(daemonset) = event {
                return Ok(daemonset.resource_version());
            }
        }
        anyhow::Ok(None)
    });
    adopt_crds(&env.client, &env.id, &env.namespace).await?;
    helm_in(&[
        "install",
        &env.id,
        chart().to_str().context("chart path")?,
        "--values",
        values.to_str().context("values path")?,
    ])?;
    let daemonset_created: u64 = created
        .await??
        .context("the DaemonSet's creation")?
        .parse()?;

    let own = format!("{}-nodeward-agent-own-node", env.id);
    let copy = format!("{own}-bootstrap");
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(env.client.clone());
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(env.client.clone());
    // Never changed since it was created, so its resource version is its creation's (one etcd:
    // the versions of all objects are one sequence).
    let copy_created: u64 = bindings
        .get(&copy)
        .await?
        .resource_version()
        .context("the copy's resource version")?
        .parse()?;
    let policy_created: u64 = policies
        .get(&copy)
        .await?
        .resource_version()
        .context("the copy's policy's resource version")?
        .parse()?;
    assert!(
        policy_created < daemonset_created && copy_created < daemonset_created,
        "the copy (policy {policy_created}, binding {copy_created}) before the DaemonSet ({daemonset_created})"
    );

    // Without the release's own binding (as in the moment before Helm creates it), the copy
    // alone refuses an escalation by the agent's identity.
    let own_binding = bindings.get(&own).await?;
    bindings.delete(&own, &DeleteParams::default()).await?;
    let agent = agent_on(&env, &node).await?;
    let as_agent: Api<Node> = Api::all(agent);
    let control_plane = Patch::Merge(
        json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}),
    );
    // The API server loads policies and bindings from its watches, within moments of their
    // changes: the attack is tried as a dry run (admitted or not, nothing is written) until the
    // copy alone refuses it.
    let dry_run = PatchParams::default().dry_run();
    let said = wait::eventually(
        "a refusal by the copy alone",
        Duration::from_secs(30),
        || async {
            let said = refusal(as_agent.patch(&node, &dry_run, &control_plane).await);
            Ok(said
                .contains(&format!("with binding '{copy}'"))
                .then_some(said))
        },
    )
    .await?;
    assert!(said.starts_with("403"), "{said}");
    assert!(
        said.contains("may change only the nodeward.io/agent label of its Node"),
        "{said}"
    );

    // The coordinator, as the chart's coordinator identity, keeps the copy while the release's
    // binding is missing and retires it once that binding is in force.
    let lease_name = format!("{}-nodeward-coordinator", env.id);
    let coordinator_kubeconfig = dir.join("coordinator.kubeconfig");
    write_kubeconfig(
        Identity::Token(token(&env, &lease_name, None).await?),
        &coordinator_kubeconfig,
    )?;
    let policy_flag = format!("--agent-admission-policy={own}");
    let coordinator = nodeward_e2e::daemon::coordinator_as(
        &env,
        &coordinator_kubeconfig,
        &["--lease-name", &lease_name, &policy_flag],
    )?;
    coordinator
        .wait_ready(Duration::from_secs(60))
        .await
        .with_context(|| coordinator.output())?;
    assert!(
        bindings.get_opt(&copy).await?.is_some(),
        "kept while the release's binding is missing"
    );
    let mut restored = own_binding.clone();
    restored.metadata = kube::api::ObjectMeta {
        name: Some(own.clone()),
        labels: own_binding.metadata.labels.clone(),
        ..Default::default()
    };
    bindings.create(&PostParams::default(), &restored).await?;
    wait::eventually("the copy retired", Duration::from_secs(90), || async {
        let gone =
            bindings.get_opt(&copy).await?.is_none() && policies.get_opt(&copy).await?.is_none();
        Ok(gone.then_some(()))
    })
    .await
    .with_context(|| coordinator.output())?;
    assert!(bindings.get_opt(&own).await?.is_some() && policies.get_opt(&own).await?.is_some());
    drop(coordinator);

    helm_in(&["uninstall", &env.id])?;
    env.cleanup().await
}
