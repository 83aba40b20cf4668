//! The eviction webhook as the chart runs it: its certificate kept by the coordinator (two
//! replicas at a first install settle on one) and rotated without a restart, its listeners under a
//! thousand stalled connections, admission and the webhook under a flood of maintenances from
//! one node.

use super::*;

#[tokio::test]
async fn the_webhook_certificate_is_no_part_of_a_render_and_rotates_without_a_restart()
-> anyhow::Result<()> {
    let env = TestEnv::new("webhook-cert").await?;
    let dir = nodeward_e2e::scratch::dir(&format!("nodeward-webhook-{}", env.id))?;
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

/// The chart runs two coordinator replicas, and at a first install both find no certificate:
/// one writes it, the other serves what it wrote, and neither warns nor retries. Whether both
/// write at once is up to timing: the install is tried again (the Secret deleted) until they
/// did, at most `TRIES` times, and every try must settle.
#[tokio::test]
async fn two_replicas_starting_together_settle_on_one_certificate_without_a_warning()
-> anyhow::Result<()> {
    const TRIES: usize = 6;
    let env = TestEnv::new("webhook-race").await?;
    let dir = nodeward_e2e::scratch::dir(&format!("nodeward-webhook-{}", env.id))?;
    let documents = apply_chart_on_own_nodes(&env, &dir).await?;
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &env.namespace);
    let mut raced_in = None;
    for attempt in 1..=TRIES {
        let (one, two) = tokio::join!(
            EvictionWebhook::start(&env, &env.id, &dir, &[]),
            EvictionWebhook::start(&env, &env.id, &dir, &[]),
        );
        let replicas = [one?, two?];
        if settled_on_one(&env, &replicas).await? {
            raced_in = Some(attempt);
            break;
        }
        let secret = replicas[0].secret(&env).await?.context("the Secret")?;
        drop(replicas);
        secrets
            .delete(&secret.name_any(), &Default::default())
            .await?;
    }
    println!(
        "both replicas wrote at once, and the loser took the winner's, in try {raced_in:?} of {TRIES}"
    );
    remove_chart(env, &documents).await
}

/// Checks that `replicas` settled on one certificate (one write, no warning, both serving the
/// Secret's); whether they raced for it.
async fn settled_on_one(env: &TestEnv, replicas: &[EvictionWebhook]) -> anyhow::Result<bool> {
    let outputs: Vec<String> = replicas.iter().map(|r| r.coordinator.output()).collect();
    let writes: usize = outputs
        .iter()
        .map(|o| o.matches("webhook certificate written").count())
        .sum();
    assert_eq!(
        writes, 1,
        "one replica wrote the certificate:\n{outputs:#?}"
    );
    for output in &outputs {
        assert!(
            output.contains("serving the webhook certificate from the Secret"),
            "each replica serves the Secret's certificate:\n{output}"
        );
        assert!(
            !output.contains("will retry") && !output.contains("ErrorResponse"),
            "no warning, no status dump:\n{output}"
        );
    }
    let secret = replicas[0].secret(env).await?.context("the Secret")?;
    let kept = secret.data.unwrap_or_default();
    let kept = first_pem(&String::from_utf8_lossy(
        &kept.get("tls.crt").context("tls.crt")?.0,
    ))
    .context("a certificate in tls.crt")?;
    for replica in replicas {
        let served = replica.served_certificate().await?;
        assert_eq!(
            served, kept,
            "{} serves the Secret's certificate",
            replica.url
        );
    }
    Ok(outputs
        .iter()
        .any(|o| o.contains("wrote the webhook certificate first")))
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
    let (env, dir, documents) = own_chart("siege").await?;
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

/// How many reboot requests the flood tries to create (issue 41: one node's identity created
/// 2,000 in 7 s, none refused).
const FLOOD: usize = 2_000;

/// One node's agent identity tries to create 2,000 reboot requests, 32 at once (every one the
/// admission policy lets it: its node, its pinned name pattern, no drain plan). The webhook
/// lets it have 10 at once and refuses the others with the reason; the coordinator decides only
/// the newest of those and ends the others; meanwhile another node's maintenance is admitted,
/// the flooding node's agent still evicts through the webhook, and the coordinator stays within
/// the chart's memory limit.
#[tokio::test]
async fn a_flood_of_requests_from_one_node_is_refused_past_its_bound_and_stalls_nothing()
-> anyhow::Result<()> {
    let (env, dir, documents, node_a, agent) = chart_and_agent_alone("flood").await?;
    let node_b = env.node_name(1);
    // Only B's agent is alive: the flood's newest request waits (AgentUnavailable).
    env.heartbeats(std::slice::from_ref(&node_b)).await?;
    let webhook =
        EvictionWebhook::serving(&env, &dir, &documents, &["--leader-elect=false"]).await?;
    let pid = webhook.coordinator.child.id();
    let rss_before = rss_kib(pid)?;
    let etcd_before = nodeward_e2e::controlplane::etcd_database_bytes()?;

    let flooding: Api<NodeMaintenance> = Api::all(agent.clone());
    let started = std::time::Instant::now();
    // Each as large as the agent may make it: the longest note the CRD takes.
    let largest_message = "m".repeat(nodeward_api::maintenance::SPEC_MESSAGE_LIMIT);
    let requests = (0..FLOOD).map(|i| {
        serde_json::from_value::<NodeMaintenance>(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
            "metadata": {"name": format!("{node_a}-reboot-{i:08}"), "labels": {NODE_NAME_LABEL: node_a}},
            "spec": {"nodeName": node_a, "reason": "Reboot", "action": "Reboot", "requestedBy": "nodeward-agent",
                     "message": largest_message},
        }))
    });
    let refusals = flood(&flooding, requests.collect::<Result<_, _>>()?).await?;
    let flooded_in = started.elapsed();
    let bound = "may have at most 10 reboot requests at once and has 10";
    let stored = Api::<NodeMaintenance>::all(env.client.clone())
        .list(&ListParams::default().labels(&format!("{NODE_NAME_LABEL}={node_a}")))
        .await?
        .items
        .len();
    assert_eq!(stored, 10, "requests stored for the flooding node");
    assert_eq!(refusals.len(), FLOOD - 10);
    assert!(
        refusals
            .iter()
            .all(|r| r.starts_with("403") && r.contains(bound)),
        "{:?}",
        refusals.iter().find(|r| !r.contains(bound))
    );

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

    // Older requests are ended; only the newest waits.
    let superseded = wait::eventually(
        "older requests superseded",
        Duration::from_secs(60),
        || async {
            let failed = maintenances
                .list(&ListParams::default().labels(&format!("{NODE_NAME_LABEL}={node_a}")))
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
            Ok((failed >= 9).then_some(failed))
        },
    )
    .await?;
    let peak = status_kib(pid, "VmHWM")?;
    let etcd_after = nodeward_e2e::controlplane::etcd_database_bytes()?;
    println!(
        "{FLOOD} requests from one node's identity in {:.1} s: {stored} stored, {} refused; another node admitted {:.1} s after asking; {superseded} superseded; coordinator RSS {} MiB before, peak {} MiB (limit 256 MiB); etcd in use {:.1} -> {:.1} MB, its file {:.1} -> {:.1} MB (the whole control plane's, other tests' writes included)",
        flooded_in.as_secs_f64(),
        refusals.len(),
        admitted_in.as_secs_f64(),
        rss_before / 1024,
        peak / 1024,
        megabytes(etcd_before.0),
        megabytes(etcd_after.0),
        megabytes(etcd_before.1),
        megabytes(etcd_after.1),
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
            &ListParams::default().labels(&format!("{NODE_NAME_LABEL}={node_a}")),
        )
        .await?;
    remove_chart(env, &documents).await
}

/// Creates every one of `objects` through `api`, 32 at once: what the API server refused.
async fn flood<K>(api: &Api<K>, objects: Vec<K>) -> anyhow::Result<Vec<String>>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let refusals = std::sync::Mutex::new(Vec::new());
    nodeward_e2e::concurrently(objects, 32, |object| {
        let refusals = &refusals;
        async move {
            if let Err(e) = api.create(&PostParams::default(), &object).await {
                refusals
                    .lock()
                    .map_err(|_| anyhow::anyhow!("poisoned"))?
                    .push(refusal::<()>(Err(e)));
            }
            anyhow::Ok(())
        }
    })
    .await?;
    refusals
        .into_inner()
        .map_err(|_| anyhow::anyhow!("poisoned"))
}

/// `bytes` in MB (10^6 bytes).
fn megabytes(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// One node's agent identity publishes Events about its own Node as fast as it can: the
/// webhook lets through its allowance (200 at once, then one a second) and refuses the rest
/// with the reason; another node's agent publishes meanwhile.
#[tokio::test]
async fn a_flood_of_events_from_one_node_is_refused_past_its_allowance_and_another_node_publishes()
-> anyhow::Result<()> {
    const EVENTS: usize = 400;
    let (env, dir, documents, node_a, agent_a) = chart_and_agent_alone("events").await?;
    let node_b = env.node_name(1);
    let agent_b = agent_on(&env, &node_b).await?;
    let webhook =
        EvictionWebhook::serving(&env, &dir, &documents, &["--leader-elect=false"]).await?;
    let event = |node: &str, n: usize| -> anyhow::Result<k8s_openapi::api::events::v1::Event> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": format!("{node}.{n:04}")},
            "eventTime": "2026-11-28T10:00:00.000000Z",
            "reportingController": "nodeward-agent", "reportingInstance": node,
            "action": "Detect", "reason": "E2E", "type": "Normal", "note": "a flood",
            "regarding": {"apiVersion": "v1", "kind": "Node", "name": node},
        }))?)
    };
    // About a Node, cluster-scoped: in the namespace `default`, as the API server wants.
    let events_a: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(agent_a, "default");
    let started = std::time::Instant::now();
    let events = (0..EVENTS).map(|n| event(&node_a, n));
    let refusals = flood(&events_a, events.collect::<anyhow::Result<_>>()?).await?;
    let took = started.elapsed();
    let published = EVENTS - refusals.len();
    // The allowance, and one more for each second the flood took.
    let most = 200 + took.as_secs() as usize + 1;
    assert!(
        (200..=most).contains(&published),
        "{published} published in {took:?}; {:?}\n{}",
        refusals.first(),
        webhook.coordinator.output()
    );
    let bound = format!("nodeward-agent on node {node_a} may publish at most 200 Events at once");
    assert!(
        refusals
            .iter()
            .all(|r| r.starts_with("403") && r.contains(&bound)),
        "{:?}",
        refusals.iter().find(|r| !r.contains(&bound))
    );
    Api::<k8s_openapi::api::events::v1::Event>::namespaced(agent_b, "default")
        .create(&PostParams::default(), &event(&node_b, 0)?)
        .await
        .context("another node's Event during the flood")?;
    println!(
        "{EVENTS} Events from one node's identity in {:.1} s: {published} published, {} refused",
        took.as_secs_f64(),
        refusals.len()
    );
    drop(webhook);
    remove_chart(env, &documents).await
}
