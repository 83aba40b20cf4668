//! The Helm chart and the systemd unit, by concern: the chart rendered ([`render`]), applied
//! with each identity kept to what it needs ([`identity`]) and to its own metadata, sizes and
//! Events ([`metadata`]), the coordinator's deadlines on its own clock ([`clock`]), the
//! admission webhook it runs ([`webhook`]), and installs and upgrades ([`upgrades`]). The
//! helpers they share are here.

mod clock;
mod host_commands;
mod identity;
mod marks;
mod metadata;
mod phases;
mod pod_reads;
mod render;
mod tokens;
mod upgrades;
mod webhook;

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
    api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
};
use nodeward_api::{
    DisruptionPolicy, MaintenancePhase, NodeMaintenance, NodeReport,
    labels::{
        AGENT_GROUP, AGENT_LABEL, AGENT_USER_PREFIX, CORDONED_BY_ANNOTATION, NODE_NAME_LABEL,
    },
};
use nodeward_e2e::{
    Identity, NodeSpec, PodOptions, TestEnv,
    controlplane::{client_as, write_kubeconfig},
    daemon::sibling_binary,
    env::TEST_LABEL,
    helm::{adopt_crds, apply, binary as helm, chart, dynamic_api, render, render_text, run},
    repo_root,
    siege::Siege,
    wait,
};
use serde_json::{Value, json};

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

async fn token(env: &TestEnv, account: &str, bound_to: Option<&Pod>) -> anyhow::Result<String> {
    let pod = bound_to.map(
        |pod| json!({"apiVersion": "v1", "kind": "Pod", "name": pod.name_any(), "uid": pod.uid()}),
    );
    token_bound(env, account, pod).await
}

/// A token of `account`, bound to the object `bound` refers to (a Pod or a Node), if any.
async fn token_bound(env: &TestEnv, account: &str, bound: Option<Value>) -> anyhow::Result<String> {
    let mut spec =
        json!({"audiences": ["https://kubernetes.default.svc"], "expirationSeconds": 600});
    if let Some(bound) = bound {
        spec["boundObjectRef"] = bound;
    }
    let request: TokenRequest = serde_json::from_value(json!({"spec": spec}))?;
    let issued: TokenRequest =
        Api::<ServiceAccount>::namespaced(env.client.clone(), &env.namespace)
            .create_subresource("token", account, &PostParams::default(), &request)
            .await?;
    Ok(issued.status.map(|s| s.token).unwrap_or_default())
}

/// The API server's refusal message, or why the call was not refused.
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
        let address = nodeward_e2e::daemon::free_address()?;
        let secret = format!("--webhook-secret={release}-nodeward-coordinator-webhook-tls");
        let service = format!("--webhook-service={release}-nodeward-coordinator-webhook");
        let configuration = format!("--webhook-configuration={release}-nodeward-agent-evictions");
        let mut args = vec![
            secret.as_str(),
            service.as_str(),
            configuration.as_str(),
            "--webhook-extra-dns=localhost",
        ];
        args.extend(extra);
        Self::listening(env, release, dir, &address, &args).await
    }

    /// The release's coordinator serving on `address`, with `args` (its certificate among
    /// them).
    async fn listening(
        env: &TestEnv,
        release: &str,
        dir: &Path,
        address: &str,
        args: &[&str],
    ) -> anyhow::Result<Self> {
        let lease_name = format!("{release}-nodeward-coordinator");
        let now = jiff::Timestamp::now().to_string();
        let lease: k8s_openapi::api::coordination::v1::Lease = serde_json::from_value(json!({
            "metadata": {"name": lease_name},
            "spec": {"holderIdentity": "e2e", "leaseDurationSeconds": 3600, "acquireTime": now, "renewTime": now},
        }))?;
        // A second replica of the same release finds the Lease made.
        match Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
            env.client.clone(),
            &env.namespace,
        )
        .create(&PostParams::default(), &lease)
        .await
        {
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            other => {
                other?;
            }
        }
        let kubeconfig = dir.join("coordinator.kubeconfig");
        write_kubeconfig(
            Identity::Token(token(env, &lease_name, None).await?),
            &kubeconfig,
        )?;
        let port = address.rsplit(':').next().context("a port")?;
        let mut all = vec![
            "--lease-name",
            &lease_name,
            "--lease-duration",
            "1h",
            "--renew-deadline",
            "50m",
            "--retry-period",
            "1m",
            "--webhook-listen",
            address,
        ];
        all.extend(args);
        let coordinator = nodeward_e2e::daemon::coordinator_as(env, &kubeconfig, &all)?;
        coordinator
            .wait_ready(Duration::from_secs(60))
            .await
            .with_context(|| coordinator.output())?;
        Ok(Self {
            coordinator,
            url: format!("https://localhost:{port}"),
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

    /// The chart's webhook configuration from `documents`, each of its webhooks pointed at
    /// this coordinator by URL (at the path the chart calls through the Service).
    fn configuration(&self, documents: &[Value]) -> anyhow::Result<Value> {
        let mut configuration = find(documents, "ValidatingWebhookConfiguration")?.clone();
        let webhooks = configuration["webhooks"]
            .as_array_mut()
            .context("the configuration's webhooks")?;
        for webhook in webhooks {
            let path = webhook["clientConfig"]["service"]["path"]
                .as_str()
                .context("a webhook's path")?
                .to_owned();
            webhook["clientConfig"] = json!({"url": format!("{}{path}", self.url)});
        }
        Ok(configuration)
    }

    /// The first certificate this replica presents (PEM), as `openssl s_client` receives it.
    async fn served_certificate(&self) -> anyhow::Result<String> {
        let address = self.url.trim_start_matches("https://");
        let output = tokio::process::Command::new("openssl")
            .args(["s_client", "-connect", address, "-servername", "localhost"])
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .context("running openssl s_client")?;
        first_pem(&String::from_utf8_lossy(&output.stdout))
            .with_context(|| format!("no certificate from {address}"))
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
                let everywhere = !live.is_empty()
                    && live.iter().all(|w| {
                        w.client_config.ca_bundle.as_ref().map(|b| &b.0) == bundle.as_ref()
                    });
                Ok((bundle.is_some() && everywhere).then_some(bundle).flatten())
            },
        )
        .await
        .with_context(|| self.coordinator.output())
    }
}

/// Two kwok nodes for `env`, and the chart rendered (release = the test's id) to schedule on
/// them only, with its default policy over them only, applied server-side; the documents.
async fn apply_chart_on_own_nodes(env: &TestEnv, dir: &Path) -> anyhow::Result<Vec<Value>> {
    apply_chart_on_own_nodes_with(env, dir, &json!({})).await
}

/// As [`apply_chart_on_own_nodes`], with the values `overrides` over the test's.
async fn apply_chart_on_own_nodes_with(
    env: &TestEnv,
    dir: &Path,
    overrides: &Value,
) -> anyhow::Result<Vec<Value>> {
    env.create_nodes(&[NodeSpec::worker("a"), NodeSpec::worker("b")])
        .await?;
    std::fs::create_dir_all(dir)?;
    let values = dir.join("values.yaml");
    std::fs::write(&values, serde_yaml::to_string(&own_nodes_values(env))?)?;
    let more = dir.join("overrides.yaml");
    std::fs::write(&more, serde_yaml::to_string(overrides)?)?;
    let documents = render(&env.id, &env.namespace, &[&values, &more])?;
    // The CRDs are every test's (installed once per run); only the upgrade test changes them.
    // The first-install copy of the agents' policy (a hook) is left out: the release as it
    // stands once the coordinator has retired it.
    let documents: Vec<Value> = documents
        .into_iter()
        .filter(|d| d["kind"] != "CustomResourceDefinition")
        .filter(|d| d["metadata"]["annotations"]["helm.sh/hook"].is_null())
        .collect();
    // The webhook configuration goes in once a coordinator serves it
    // ([`EvictionWebhook::serving`]): with none, the API server could not call it (its failure
    // policy refuses what it would check).
    let served_later: Vec<Value> = documents
        .iter()
        .filter(|d| d["kind"] != "ValidatingWebhookConfiguration")
        .cloned()
        .collect();
    apply(&env.client, &served_later).await?;
    Ok(documents)
}

/// A client acting as a host-mode agent of `node`: a client certificate (user
/// `nodeward:agent:<node>` in the release's group), issued through the CSR API as an operator
/// would.
async fn host_mode_agent(env: &TestEnv, node: &str) -> anyhow::Result<Client> {
    let issued = nodeward_e2e::certificates::issue(
        &env.client,
        &format!("{}-{node}", env.id),
        &format!("{AGENT_USER_PREFIX}{node}"),
        &[&agent_group(env)],
    )
    .await?;
    client_as(Identity::Certificate(issued)).await
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
            {"name": "ntp", "condition": "NTPProblem", "reason": "ClockSkew", "command": ["/bin/true"]}]}},
            "retiredConditionTypes": ["OldCheckProblem"]},
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

/// The chart's cluster-wide objects go (but the CRDs, which every test shares, as an uninstall
/// keeps them); the namespace takes the rest.
async fn remove_chart(env: TestEnv, documents: &[Value]) -> anyhow::Result<()> {
    for document in documents
        .iter()
        .filter(|d| d["metadata"]["namespace"].is_null() && d["kind"] != "CustomResourceDefinition")
    {
        let (api, name) = dynamic_api(&env.client, document).await?;
        match api.delete(&name, &DeleteParams::default()).await {
            // Never applied (the webhook configuration of a test that served none).
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            deleted => {
                deleted.with_context(|| format!("deleting {} {name}", document["kind"]))?;
            }
        }
    }
    env.cleanup().await
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

/// The chart applied on two nodes of a new test environment, and a client acting as the agent
/// on the first: the environment, the chart's documents, that node, the client.
async fn chart_and_agent(prefix: &str) -> anyhow::Result<(TestEnv, Vec<Value>, String, Client)> {
    let (env, _, documents) = own_chart(prefix).await?;
    let node = env.node_name(0);
    let agent = agent_on(&env, &node).await?;
    Ok((env, documents, node, agent))
}

/// As [`chart_and_agent`], alone ([`TestEnv::alone`]), for a test whose coordinator decides;
/// with the scratch directory, once the policy refuses the agent the other node.
async fn chart_and_agent_alone(
    prefix: &str,
) -> anyhow::Result<(TestEnv, std::path::PathBuf, Vec<Value>, String, Client)> {
    let (env, dir, documents) = own_chart_alone(prefix).await?;
    let node = env.node_name(0);
    let agent = agent_on(&env, &node).await?;
    held_to_its_own_node(&agent, &node, &env.node_name(1)).await?;
    Ok((env, dir, documents, node, agent))
}

/// A test's environment, its scratch directory, and the chart applied on its own two nodes
/// ([`apply_chart_on_own_nodes`]).
async fn own_chart(test: &str) -> anyhow::Result<(TestEnv, std::path::PathBuf, Vec<Value>)> {
    own_chart_in(TestEnv::new(test).await?, test, &json!({})).await
}

/// As [`own_chart`], with the values `overrides` over the test's.
async fn own_chart_with(
    test: &str,
    overrides: &Value,
) -> anyhow::Result<(TestEnv, std::path::PathBuf, Vec<Value>)> {
    own_chart_in(TestEnv::new(test).await?, test, overrides).await
}

/// As [`own_chart`], alone ([`TestEnv::alone`]): for a test whose coordinator decides, which
/// would act on other tests' maintenances too.
async fn own_chart_alone(test: &str) -> anyhow::Result<(TestEnv, std::path::PathBuf, Vec<Value>)> {
    own_chart_in(TestEnv::alone(test).await?, test, &json!({})).await
}

async fn own_chart_in(
    env: TestEnv,
    test: &str,
    overrides: &Value,
) -> anyhow::Result<(TestEnv, std::path::PathBuf, Vec<Value>)> {
    let dir = nodeward_e2e::scratch::dir(&format!("nodeward-{test}-{}", env.id))?;
    let documents = apply_chart_on_own_nodes_with(&env, &dir, overrides).await?;
    Ok((env, dir, documents))
}

/// The chart rendered (release nodeward, namespace nodeward-system) with these values.
fn render_values(test: &str, values: &str) -> anyhow::Result<Vec<Value>> {
    let dir = nodeward_e2e::scratch::dir(&format!("nodeward-{test}-{}", std::process::id()))?;
    let file = dir.join("values.yaml");
    std::fs::write(&file, values)?;
    let rendered = render("nodeward", "nodeward-system", &[&file]);
    std::fs::remove_dir_all(&dir)?;
    rendered
}

/// The first PEM certificate in `text`.
fn first_pem(text: &str) -> Option<String> {
    const END: &str = "-----END CERTIFICATE-----";
    let start = text.find("-----BEGIN CERTIFICATE-----")?;
    let end = start + text[start..].find(END)? + END.len();
    Some(text[start..end].to_owned())
}
