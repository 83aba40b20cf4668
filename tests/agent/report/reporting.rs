//! Reporting: Node conditions, Events and the NodeReport written on change, the Lease alone
//! while quiet, one connection for every watch, an unregistered node, the kubelet's unit, an
//! API outage, pause acknowledgements, and a clean stop on SIGTERM.

use super::*;

#[tokio::test]
async fn agent_reports_conditions_events_and_node_report_and_stops_on_sigterm() -> anyhow::Result<()>
{
    let (env, node, mut agent) =
        one_node_with_agent("agent-report", "zone-a", "500ms", "2s").await?;

    let nodes: Api<Node> = env.nodes();
    wait_condition(&nodes, &node, "RebootRequired", "False").await?;
    agent.wait_ready().await?;
    assert_eq!(agent.get("/healthz").await?, (200, "ok".to_owned()));
    // The host's statistics, read from this machine (the first sample at start).
    let memory = agent
        .metric("nodeward_host_memory_bytes{state=\"total\"}")
        .await?;
    assert!(memory > 0.0, "host memory {memory}");
    assert!(agent.metric("nodeward_host_uptime_seconds").await? > 0.0);

    std::fs::write(agent.sentinel(), "")?;
    let flagged = wait_condition(&nodes, &node, "RebootRequired", "True").await?;
    assert_eq!(
        reason_of(&flagged, "RebootRequired").as_deref(),
        Some("SentinelFilePresent")
    );
    assert_eq!(
        condition(Some(&flagged), "Ready")
            .map(|(s, _)| s)
            .as_deref(),
        Some("True"),
        "the kubelet's (kwok's) own conditions are untouched"
    );
    assert_eq!(
        agent
            .metric("nodeward_finding{type=\"RebootRequired\"}")
            .await?,
        1.0
    );
    // And per detector: the condition's one check found it.
    assert_eq!(
        agent
            .metric("nodeward_check_status{detector=\"reboot-required\",status=\"problem\"}")
            .await?,
        1.0
    );

    std::fs::remove_file(agent.sentinel())?;
    wait_condition(&nodes, &node, "RebootRequired", "False").await?;

    // One Warning when the problem started, one Normal when it cleared, on the Node, from
    // the agent (the node-lifecycle controller adds its own).
    let reasons = wait::eventually("both events", TIMEOUT, || async {
        let mut reasons: Vec<(String, String)> = env
            .events_about(&node, "")
            .await?
            .into_iter()
            .filter(|e| e.reporting_controller.as_deref() == Some("nodeward-agent"))
            .map(|e| (e.type_.unwrap_or_default(), e.reason.unwrap_or_default()))
            .collect();
        reasons.sort();
        Ok((reasons.len() >= 2).then_some(reasons))
    })
    .await?;
    assert_eq!(
        reasons,
        vec![
            ("Normal".to_owned(), "RebootRequiredCleared".to_owned()),
            ("Warning".to_owned(), "SentinelFilePresent".to_owned())
        ]
    );

    // The report is written after the Node's conditions and their Events: wait for the one
    // that records the cleared finding.
    let what = "a NodeReport with a heartbeat and the cleared reboot-required finding";
    let report = reported(&env, &node, what, |s| {
        let cleared = |f: &Finding| f.detector == "reboot-required" && f.status == "False";
        s.heartbeat_time.is_some() && s.findings.iter().any(cleared)
    })
    .await?;
    let owner = report
        .metadata
        .owner_references
        .as_ref()
        .and_then(|o| o.first())
        .expect("owned by its Node");
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Node", node.as_str())
    );
    let status = report.status.as_ref().expect("status");
    assert_eq!(status.mode, Some(nodeward_api::report::AgentMode::Host));

    agent.terminate()?;
    let exited = wait::eventually("the agent to exit after SIGTERM", TIMEOUT, || {
        let status = agent.child.try_wait();
        async move { Ok(status?) }
    })
    .await?;
    assert!(exited.success(), "the agent exited with {exited}");
    // Stopped, not aborted: the reporter, the executor and the Lease's renewal each ended at a
    // point between writes.
    let output = agent.output();
    assert!(daemon::stopped_between_writes(&output), "{output}");
    env.cleanup().await
}

#[tokio::test]
async fn a_quiet_agent_writes_only_its_lease() -> anyhow::Result<()> {
    let (env, node, agent) = one_node_with_agent("agent-quiet", "zone-b", "300ms", "2s").await?;
    let heartbeat = Duration::from_secs(2);
    wait_condition(&env.nodes(), &node, "RebootRequired", "False").await?;
    agent.wait_ready().await?;
    // The start's last write: the inventory's first reading (the next is an hour away).
    let reports: Api<NodeReport> = Api::all(env.client.clone());
    wait::until(
        &reports,
        &node,
        "the inventory in the report",
        TIMEOUT,
        |r| {
            r.and_then(|r| r.status.as_ref())
                .is_some_and(|s| s.inventory.is_some())
        },
    )
    .await?;

    let rounds = "nodeward_check_duration_seconds_count{detector=\"reboot-required\"}";
    let renewals = "nodeward_api_writes_total{resource=\"leases\",result=\"ok\"}";
    // Measure between two renewals just sent, so that none is in flight at either end, and
    // read the audit log once it has caught up with the agent's own count.
    let just_renewed = || async {
        let before = agent.metric(renewals).await?;
        wait::eventually("a renewal of the Lease", TIMEOUT, || async {
            let now = agent.metric(renewals).await?;
            Ok((now > before).then_some(now))
        })
        .await
    };
    let audited_after = |node: String, count: usize| {
        wait::eventually(
            "the audit log to catch up",
            Duration::from_secs(1),
            move || {
                let node = node.clone();
                async move { Ok(Some(agent_writes(&node)?).filter(|w| w.len() >= count)) }
            },
        )
    };
    let start_renewals = just_renewed().await?;
    let start_writes = audited_after(node.clone(), 0).await?.len();
    let start_rounds = agent.metric(rounds).await?;
    let started = Instant::now();

    // Ten detection rounds with nothing changing.
    wait::eventually("ten more detection rounds", TIMEOUT, || async {
        Ok((agent.metric(rounds).await? >= start_rounds + 10.0).then_some(()))
    })
    .await?;
    let end_renewals = just_renewed().await?;
    let elapsed = started.elapsed();
    let renewals_sent = (end_renewals - start_renewals) as usize;
    let writes: Vec<(String, String)> = audited_after(node.clone(), start_writes + renewals_sent)
        .await?
        .split_off(start_writes);

    assert!(
        writes
            .iter()
            .all(|(resource, verb)| resource == "leases" && verb == "patch"),
        "only renewals of its Lease while nothing changes (no NodeReport write), got {writes:?}"
    );
    assert_eq!(
        writes.len(),
        renewals_sent,
        "the API server saw exactly the renewals the agent counted"
    );
    let expected = elapsed.as_secs_f64() / heartbeat.as_secs_f64();
    assert!(
        (writes.len() as f64 - expected).abs() <= 1.5,
        "{} renewals in {elapsed:?} at one per {heartbeat:?} (each 0.9x to 1.1x of it)",
        writes.len()
    );
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.namespace);
    let lease = leases.get(&format!("nodeward-agent-{node}")).await?;
    let spec = lease.spec.expect("spec");
    assert_eq!(spec.holder_identity.as_deref(), Some(node.as_str()));
    assert_eq!(spec.lease_duration_seconds, Some(6), "three renewals");
    let owner = lease.metadata.owner_references.unwrap_or_default();
    assert_eq!(
        owner.first().map(|o| (o.kind.as_str(), o.name.as_str())),
        Some(("Node", node.as_str())),
        "the Lease goes with its Node"
    );
    env.cleanup_after(agent).await
}

/// A NodeReport deleted while nothing changes (by hand, or with a Node registered again faster
/// than a detector notices) is written again within a heartbeat interval, owned by its Node.
#[tokio::test]
async fn a_deleted_node_report_is_written_again_within_a_heartbeat() -> anyhow::Result<()> {
    let (env, node, agent) =
        one_node_with_agent("agent-report-gone", "zone-b", "300ms", "2s").await?;
    agent.wait_ready().await?;
    let reports: Api<NodeReport> = Api::all(env.client.clone());
    let first = reports.get(&node).await?;
    reports.delete(&node, &DeleteParams::default()).await?;
    // The new object first has no findings (another writer's status may come before the
    // reporter's): what is waited for is the reporter's write.
    let again = wait::until(
        &reports,
        &node,
        "the NodeReport written again with the current findings",
        TIMEOUT,
        |r| {
            r.is_some_and(|r| {
                r.metadata.uid != first.metadata.uid
                    && r.status
                        .as_ref()
                        .is_some_and(|s| s.findings.iter().any(|f| f.detector == "reboot-required"))
            })
        },
    )
    .await?
    .context("NodeReport")?;
    let owner = again.metadata.owner_references.unwrap_or_default();
    assert_eq!(
        owner.first().map(|o| (o.kind.as_str(), o.name.as_str())),
        Some(("Node", node.as_str())),
        "owned by its Node again"
    );
    env.cleanup_after(agent).await
}

#[tokio::test]
async fn a_report_the_cluster_refuses_is_a_warning_event_on_the_node() -> anyhow::Result<()> {
    let (env, node, agent) =
        one_node_with_agent("agent-report-refused", "zone-b", "300ms", "2s").await?;
    agent.wait_ready().await?;
    // The cluster's own rule: no report of this node is written any more.
    env.refusing_policy(
        "no-report",
        serde_json::json!([{"apiGroups": ["nodeward.io"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
            "resources": ["nodereports", "nodereports/status"]}]),
        &format!("request.name == '{node}'"),
        "false",
        "this cluster takes no NodeReport of this node",
    )
    .await?;
    // In force once it refuses the admin too; then the agent writes its report again.
    let reports: Api<NodeReport> = Api::all(env.client.clone());
    let mut again = reports.get(&node).await?;
    again.metadata = kube::api::ObjectMeta {
        name: Some(node.clone()),
        ..Default::default()
    };
    refused_in_dry_run(&reports, &again, "takes no NodeReport").await?;
    reports.delete(&node, &DeleteParams::default()).await?;
    // The inventory's writer is refused too: the report's own Event is the one looked for.
    let event = env
        .wait_event_of(&node, "regarding.kind=Node", "WriteRefused", "Report")
        .await?;
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains("the API server refused nodeward-agent's write")
            && note.contains("this cluster takes no NodeReport of this node"),
        "the cluster's words in the Event: {note}"
    );
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    env.cleanup_after(agent).await
}

#[tokio::test]
async fn an_inventory_the_cluster_refuses_is_a_warning_event_on_the_node() -> anyhow::Result<()> {
    let (env, node) = TestEnv::with_worker("agent-inventory-refused", "zone-b").await?;
    // The cluster's own rule: no inventory in this node's report (the rest of it is taken).
    // A report labelled `probe` is refused too, to see the rule in force before the agent runs.
    env.refusing_policy(
        "no-inventory",
        serde_json::json!([{"apiGroups": ["nodeward.io"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
            "resources": ["nodereports", "nodereports/status"]}]),
        &format!("request.name == '{node}'"),
        "!(has(object.metadata.labels) && 'probe' in object.metadata.labels) && !(has(object.status) && has(object.status.inventory))",
        "this cluster takes no inventory of this node",
    )
    .await?;
    let reports: Api<NodeReport> = Api::all(env.client.clone());
    let probe: NodeReport = serde_json::from_value(serde_json::json!({
        "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeReport",
        "metadata": {"name": node, "labels": {"probe": "yes"}},
        "spec": {"nodeName": node},
    }))?;
    refused_in_dry_run(&reports, &probe, "takes no inventory").await?;
    let agent = Agent::start(&node, &env, "300ms", "2s")?;
    let event = env
        .wait_event_of(&node, "regarding.kind=Node", "WriteRefused", "Inventory")
        .await?;
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains("refused nodeward-agent's inventory")
            && note.contains("this cluster takes no inventory of this node"),
        "the cluster's words in the Event: {note}"
    );
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    // Only the inventory was refused: the report itself is written.
    let report = wait::until(&reports, &node, "the NodeReport", TIMEOUT, |r| r.is_some())
        .await?
        .context("the NodeReport")?;
    assert!(report.status.is_some_and(|s| s.inventory.is_none()));
    env.cleanup_after(agent).await
}

/// Waits until the cluster refuses `report` (created as a dry run) with `words` in its
/// message: a refusing policy is in force.
async fn refused_in_dry_run(
    reports: &Api<NodeReport>,
    report: &NodeReport,
    words: &str,
) -> anyhow::Result<()> {
    let dry = kube::api::PostParams {
        dry_run: true,
        ..Default::default()
    };
    wait::eventually("the cluster's rule in force", TIMEOUT, || async {
        let refused = match reports.create(&dry, report).await {
            Err(kube::Error::Api(status)) => status.message.contains(words),
            _ => false,
        };
        Ok(refused.then_some(()))
    })
    .await
}

/// The established TCP connections process `pid` holds to `port` on the loopback address,
/// read from the kernel's socket table of its network namespace.
fn connections_to(pid: u32, port: u16) -> anyhow::Result<usize> {
    let mut sockets = std::collections::HashSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let target = std::fs::read_link(fd?.path()).unwrap_or_default();
        if let Some(inode) = target
            .to_str()
            .and_then(|t| t.strip_prefix("socket:["))
            .and_then(|t| t.strip_suffix(']'))
        {
            sockets.insert(inode.to_owned());
        }
    }
    const ESTABLISHED: &str = "01";
    let remote = format!("0100007F:{port:04X}");
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp"))?;
    Ok(table
        .lines()
        .skip(1)
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() > 9 && f[2] == remote && f[3] == ESTABLISHED && sockets.contains(f[9]))
        .count())
}

/// HTTP/2 carries all of an agent's watches and requests on one connection: a fleet of agents
/// costs the API server one connection (and one TLS session) per node, and requests sent at
/// once, as a drain's evictions are, need no new handshakes. Over HTTP/1.1 each open watch
/// holds a connection of its own.
#[tokio::test]
async fn an_agent_holds_one_connection_to_the_api_server_for_all_its_watches() -> anyhow::Result<()>
{
    let (env, node, agent) = one_node_with_agent("agent-conns", "zone-a", "500ms", "2s").await?;
    wait_condition(&env.nodes(), &node, "RebootRequired", "False").await?;
    agent.wait_ready().await?;
    let watches = || async {
        let (_, text) = agent.get("/metrics").await?;
        anyhow::Ok(
            text.lines()
                .filter(|l| {
                    l.starts_with("nodeward_api_requests_total{") && l.contains("verb=\"watch\"")
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>(),
        )
    };
    let opened = wait::eventually("the agent's watches to be open", TIMEOUT, || async {
        Ok(Some(watches().await?).filter(|w| *w >= 2.0))
    })
    .await?;

    let kubeconfig = kube::config::Kubeconfig::read_from(&controlplane::shared().kubeconfig)?;
    let server = kubeconfig
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref()?.server.clone())
        .context("the kubeconfig names no server")?;
    let port = server
        .parse::<hyper::Uri>()?
        .port_u16()
        .with_context(|| format!("no port in {server}"))?;
    // Several rounds of checks and a heartbeat have sent requests meanwhile.
    let renewals = "nodeward_api_writes_total{resource=\"leases\",result=\"ok\"}";
    wait::eventually("a renewal of the Lease", TIMEOUT, || async {
        Ok((agent.metric(renewals).await? >= 1.0).then_some(()))
    })
    .await?;
    let connections = connections_to(agent.child.id(), port)?;
    assert_eq!(
        connections, 1,
        "{opened} watches opened, the Lease renewed: one connection to the API server"
    );
    env.cleanup_after(agent).await
}

#[tokio::test]
async fn an_unregistered_node_is_reported_until_its_node_appears() -> anyhow::Result<()> {
    let env = TestEnv::new("agent-unregistered").await?;
    let node = env.node_name(0);
    let _agent = Agent::start_with(
        &node,
        &env,
        Options {
            heartbeat: "1s",
            kubelet: "{interval: 500ms, timeout: 500ms, for: 0s, registrationTimeout: 1s, healthzURL: \"http://127.0.0.1:1/healthz\"}",
            ..Options::default()
        },
    )?;
    let reports: Api<NodeReport> = Api::all(env.client.clone());
    let finding = |r: Option<&NodeReport>, status: &str| {
        r.and_then(|r| r.status.as_ref()).is_some_and(|s| {
            s.findings
                .iter()
                .any(|f| f.type_ == "KubeletUnregistered" && f.status == status)
        })
    };
    let report = wait::until(
        &reports,
        &node,
        "KubeletUnregistered in the NodeReport",
        TIMEOUT,
        |r| finding(r, "True"),
    )
    .await?
    .expect("report");
    assert!(
        report.metadata.owner_references.is_none(),
        "no Node to own it yet"
    );

    wait::eventually(
        "the KubeletUnregistered event on the NodeReport",
        TIMEOUT,
        || async {
            let events = env.events_about(&node, "regarding.kind=NodeReport").await?;
            Ok(events
                .iter()
                .any(|e| e.reason.as_deref() == Some("KubeletUnregistered"))
                .then_some(()))
        },
    )
    .await?;

    env.create_nodes(&[NodeSpec::worker("zone-c")]).await?;
    let report = wait::until(
        &reports,
        &node,
        "registration to clear and the Node to own the report",
        TIMEOUT,
        |r| {
            finding(r, "False")
                && r.is_some_and(|r| {
                    r.metadata
                        .owner_references
                        .as_ref()
                        .is_some_and(|o| o.iter().any(|o| o.kind == "Node"))
                })
        },
    )
    .await?
    .expect("report");
    let node_object = env.nodes().get(&node).await?;
    assert_eq!(
        report
            .metadata
            .owner_references
            .as_ref()
            .map(|o| o[0].uid.clone()),
        node_object.metadata.uid
    );
    let conditions = nodeward_api::node::conditions(&node_object);
    assert!(
        !conditions.iter().any(|c| c.type_ == "KubeletUnregistered"),
        "report-only, never a Node condition"
    );

    // The Node deleted (the garbage collector takes its report with it) and registered again
    // later: the agent makes its report again and hands it to the new Node.
    env.nodes().delete(&node, &DeleteParams::default()).await?;
    wait::until(
        &reports,
        &node,
        "the report made again, unowned and unregistered, after its Node went",
        TIMEOUT,
        |r| {
            finding(r, "True")
                && r.is_some_and(|r| {
                    r.metadata
                        .owner_references
                        .as_ref()
                        .is_none_or(Vec::is_empty)
                })
        },
    )
    .await?;
    env.create_nodes(&[NodeSpec::worker("zone-c")]).await?;
    let again = env.nodes().get(&node).await?;
    assert_ne!(again.metadata.uid, node_object.metadata.uid, "a new Node");
    wait::until(
        &reports,
        &node,
        "the new Node owning the report, registered",
        TIMEOUT,
        |r| {
            finding(r, "False")
                && r.is_some_and(|r| {
                    r.metadata.owner_references.as_ref().is_some_and(|o| {
                        o.iter()
                            .any(|o| Some(&o.uid) == again.metadata.uid.as_ref())
                    })
                })
        },
    )
    .await?;
    env.cleanup().await
}

/// The kubelet's unit read from systemd, its healthz answering ok: a unit restarting often is
/// a problem; every read goes over one connection to the bus, made again once the bus restarted.
#[tokio::test]
async fn a_failed_or_restarting_kubelet_unit_is_read_from_systemd_over_one_bus_connection()
-> anyhow::Result<()> {
    use nodeward_e2e::systemd::{PrivateBus, Systemd, Unit};
    use std::sync::atomic::Ordering;
    let (env, node) = TestEnv::with_worker("agent-kubelet", "zone-e").await?;
    let mut bus = PrivateBus::start(&env.id)?;
    let systemd = Systemd::default();
    systemd.set("kubelet.service", Unit::active());
    let serving = systemd.serve(&bus.address).await?;

    // The kubelet's healthz answers ok (a stand-in on loopback), so only systemd can tell.
    let healthz = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let healthz_url = format!("http://{}/healthz", healthz.local_addr()?);
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        while let Ok((mut stream, _)) = healthz.accept().await {
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                .await;
        }
    });
    let kubelet = format!(
        "{{interval: 300ms, timeout: 300ms, for: 0s, healthzURL: \"{healthz_url}\", frequentRestarts: {{count: 3, window: 10m}}}}"
    );
    let _agent = Agent::start_with(
        &node,
        &env,
        Options {
            kubelet: &kubelet,
            env: vec![("DBUS_SYSTEM_BUS_ADDRESS", bus.address.clone())],
            ..Options::default()
        },
    )?;
    let nodes: Api<Node> = env.nodes();
    wait_condition(&nodes, &node, "KubeletProblem", "False").await?;

    // Ten reads of the unit, and the bus accepted no connection but the second probe's.
    let before = bus.connections_made().await?;
    let reads = systemd.listed.load(Ordering::Relaxed);
    wait::eventually("ten more reads of the unit", TIMEOUT, || async {
        Ok((systemd.listed.load(Ordering::Relaxed) >= reads + 10).then_some(()))
    })
    .await?;
    let after = bus.connections_made().await?;
    assert_eq!(after, before + 1, "connections made during ten reads");

    // The bus restarts (every connection drops) and then systemd restarts the kubelet three
    // times: the agent's next reads connect again and see a kubelet healthy but not stable.
    drop(serving);
    bus.restart()?;
    let serving = systemd.serve(&bus.address).await?;
    systemd.update("kubelet.service", |u| u.restarts += 3);
    wait::until(&nodes, &node, "FrequentRestarts", TIMEOUT, |n| {
        n.is_some_and(|n| reason_of(n, "KubeletProblem").as_deref() == Some("FrequentRestarts"))
    })
    .await?;
    drop(serving);
    env.cleanup().await
}

#[tokio::test]
async fn an_api_outage_never_stops_detection_and_writes_resume_after_it() -> anyhow::Result<()> {
    use nodeward_e2e::proxy::{self, Proxy};
    let (env, node) = TestEnv::with_worker("agent-outage", "zone-f").await?;
    let proxy = Proxy::start("127.0.0.1:0".parse()?, proxy::api_server_address()?).await?;
    let dir = nodeward_e2e::scratch::dir(&format!("nodeward-outage-{}", env.id))?;
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, proxy::admin_kubeconfig_via(proxy.address))?;
    let agent = Agent::start_with(
        &node,
        &env,
        Options {
            kubeconfig: Some(kubeconfig),
            heartbeat: "1s",
            ..Options::default()
        },
    )?;
    let nodes: Api<Node> = env.nodes();
    wait_condition(&nodes, &node, "RebootRequired", "False").await?;

    proxy.cut();
    std::fs::write(agent.sentinel(), "")?;
    // Detection goes on locally: the finding turns to a problem with no API server.
    wait::eventually(
        "the finding while the API server is away",
        TIMEOUT,
        || async {
            Ok((agent
                .metric("nodeward_finding{type=\"RebootRequired\"}")
                .await?
                == 1.0)
                .then_some(()))
        },
    )
    .await?;
    // ...and the writes fail meanwhile, counted.
    wait::eventually("a failed write", TIMEOUT, || async {
        Ok((agent
            .metric("nodeward_api_writes_total{resource=\"nodes/status\",result=\"error\"}")
            .await?
            >= 1.0)
            .then_some(()))
    })
    .await?;
    let during = nodes.get(&node).await?;
    assert_eq!(
        condition(Some(&during), "RebootRequired")
            .map(|(s, _)| s)
            .as_deref(),
        Some("False")
    );

    proxy.restore();
    let after = wait_condition(&nodes, &node, "RebootRequired", "True").await?;
    assert_eq!(
        reason_of(&after, "RebootRequired").as_deref(),
        Some("SentinelFilePresent")
    );
    std::fs::remove_dir_all(&dir).ok();
    env.cleanup().await
}

#[tokio::test]
async fn the_agent_acknowledges_pauses_of_policies_selecting_its_node() -> anyhow::Result<()> {
    use kube::api::{Patch, PatchParams, PostParams};
    use nodeward_api::DisruptionPolicy;
    use nodeward_e2e::env::TEST_LABEL;

    // A coordinator decides over the whole cluster: the test runs alone.
    let (env, node) = TestEnv::alone_with_worker("agent-pause", "zone-a").await?;
    let agent = Agent::start(&node, &env, "500ms", "30s")?;
    agent.wait_ready().await?;
    // The agent learns of policies from what the coordinator publishes for agents.
    let coordinator = nodeward_e2e::daemon::coordinator(&env, &["--leader-elect=false"]).await?;

    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    let mut created = Vec::new();
    for (name, selector) in [
        (
            "mine",
            serde_json::json!({"matchLabels": {TEST_LABEL: env.id}}),
        ),
        (
            "other",
            serde_json::json!({"matchLabels": {TEST_LABEL: "another-test"}}),
        ),
    ] {
        let name = format!("{}-{name}", env.id);
        let policy: DisruptionPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
            "metadata": {"name": name, "labels": {TEST_LABEL: env.id}},
            "spec": {"paused": true, "nodeSelector": selector},
        }))?;
        let policy = policies.create(&PostParams::default(), &policy).await?;
        created.push((name, policy.metadata.generation.unwrap_or(0)));
    }
    let (mine, generation) = created[0].clone();
    let reports: Api<NodeReport> = Api::all(env.client.clone());
    let acks = |r: Option<&NodeReport>| -> Vec<(String, i64)> {
        r.and_then(|r| r.status.as_ref())
            .map(|s| {
                s.pause_acknowledgements
                    .iter()
                    .map(|a| (a.policy.clone(), a.observed_generation))
                    .collect()
            })
            .unwrap_or_default()
    };
    // Acknowledged as soon as published (not at the next 30s heartbeat), and only the policy
    // selecting it.
    let report = wait::until(&reports, &node, "the pause acknowledged", TIMEOUT, |r| {
        !acks(r).is_empty()
    })
    .await
    .with_context(|| coordinator.output())?;
    assert_eq!(acks(report.as_ref()), vec![(mine.clone(), generation)]);

    policies
        .patch(
            &mine,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"paused": false}})),
        )
        .await?;
    wait::until(
        &reports,
        &node,
        "the acknowledgement withdrawn",
        TIMEOUT,
        |r| r.is_some() && acks(r).is_empty(),
    )
    .await?;
    drop(agent);
    env.cleanup_after(coordinator).await
}

/// An agent run for maintenances alone, every detector off: with nothing to wait for it reports
/// at once (so it gets ready) and keeps reporting (a pause is acknowledged after that).
#[tokio::test]
async fn an_agent_with_every_detector_off_gets_ready_and_keeps_reporting() -> anyhow::Result<()> {
    // It starts a coordinator, which decides over the whole cluster: the test runs alone.
    let (env, node) = TestEnv::alone_with_worker("agent-no-detectors", "zone-a").await?;
    let dir = scratch::dir(&format!("nodeward-no-detectors-{}", env.id))?;
    let config = scratch::agent_config_file(&dir, &[], "shutdownGuard: {enabled: false}\n")?;
    let agent = daemon::agent(
        agent_binary(),
        &env,
        &node,
        &config,
        daemon::NO_SYSTEM_BUS,
        "agent",
    )?;
    agent.wait_ready(TIMEOUT).await?;
    let reports: Api<NodeReport> = Api::all(env.client.clone());
    let report = wait::until(&reports, &node, "the first NodeReport", TIMEOUT, |r| {
        r.and_then(|r| r.status.as_ref())
            .is_some_and(|s| s.heartbeat_time.is_some())
    })
    .await
    .with_context(|| agent.output())?
    .context("NodeReport")?;
    let findings = report.status.map(|s| s.findings).unwrap_or_default();
    assert!(findings.is_empty(), "no detector, no finding: {findings:?}");

    let coordinator = daemon::coordinator(&env, &["--leader-elect=false"]).await?;
    let policy = env
        .create_policy("paused", serde_json::json!({"paused": true}))
        .await?;
    wait::until(&reports, &node, "the pause acknowledged", TIMEOUT, |r| {
        r.and_then(|r| r.status.as_ref())
            .is_some_and(|s| s.pause_acknowledgements.iter().any(|a| a.policy == policy))
    })
    .await
    .with_context(|| format!("{}\n{}", agent.output(), coordinator.output()))?;
    env.cleanup_after((agent, coordinator)).await
}

/// A check removed from the agent's configuration leaves no condition behind
/// (node-problem-detector #1011): the restarted agent removes the condition it applied before,
/// and its other conditions stay.
#[tokio::test]
async fn a_removed_checks_condition_is_removed_from_the_node() -> anyhow::Result<()> {
    let (env, node) = TestEnv::with_worker("agent-retired", "zone-a").await?;
    let failing = "[{name: retired, condition: RetiredCheckProblem, reason: RetiredCheckFailed, command: [/bin/false], interval: 500ms, timeout: 500ms}]";
    let agent = Agent::start_with(
        &node,
        &env,
        Options {
            custom: failing,
            ..Options::default()
        },
    )?;
    let nodes: Api<Node> = env.nodes();
    wait_condition(&nodes, &node, "RetiredCheckProblem", "True").await?;
    wait_condition(&nodes, &node, "RebootRequired", "False").await?;
    drop(agent);

    let agent = Agent::start(&node, &env, "500ms", "2s")?;
    let cleared = wait::until(
        &nodes,
        &node,
        "RetiredCheckProblem gone from the Node",
        TIMEOUT,
        |n: Option<&Node>| n.is_some_and(|n| condition(Some(n), "RetiredCheckProblem").is_none()),
    )
    .await?
    .context("the node")?;
    assert!(
        condition(Some(&cleared), "RebootRequired").is_some(),
        "the agent's other conditions stay"
    );
    assert!(
        condition(Some(&cleared), "Ready").is_some(),
        "the kubelet's conditions stay"
    );
    env.cleanup_after(agent).await
}
