//! Peer connectivity across real network namespaces: three agents, each in its own namespace
//! on a bridge, each registered as a (kwok) Node whose InternalIP is its namespace address; the
//! coordinator publishes them as the peer directory. A rule that drops one protocol makes
//! every agent report `<PROTO>Blocked`; removing it clears it; cutting one namespace off from
//! its peers makes that one report `Isolated`, and only it, and its peers list it unreachable
//! until it answers again. The agents reach the API server through a forwarder on the bridge.
//! Needs root.

use std::{
    net::{IpAddr, SocketAddr},
    process::{Child, Command, Output, Stdio},
    time::Duration,
};

use anyhow::Context;
use k8s_openapi::api::{core::v1::Node, discovery::v1::EndpointSlice};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams},
};
use nodeward_api::NodeReport;
use nodeward_e2e::daemon::agent_binary;
use nodeward_e2e::{
    NodeSpec, Scenario, Scene, TestEnv,
    proxy::{self, Proxy},
    scratch, wait,
};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(60);
const PROBE_PORT: u16 = 9471;

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .expect("running a network command")
}

fn must(program: &str, args: &[&str]) {
    let out = run(program, args);
    assert!(
        out.status.success(),
        "{program} {args:?} failed (this test needs root): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A bridge in this namespace and one namespace per agent attached to it; removed on drop.
struct Topology {
    bridge: String,
    namespaces: Vec<String>,
    subnet: u8,
}

impl Topology {
    fn new(count: usize) -> Self {
        let id = std::process::id() % 10_000;
        let subnet = u8::try_from(20 + id % 200).expect("small");
        let bridge = format!("nwb{id}");
        let gateway = format!("10.213.{subnet}.1/24");
        let topology = Self {
            bridge: bridge.clone(),
            namespaces: (0..count).map(|i| format!("nwp-{id}-{i}")).collect(),
            subnet,
        };
        must("ip", &["link", "add", &bridge, "type", "bridge"]);
        must("ip", &["addr", "add", &gateway, "dev", &bridge]);
        must("ip", &["link", "set", &bridge, "up"]);
        for (i, ns) in topology.namespaces.iter().enumerate() {
            let host_end = format!("nwv{id}x{i}");
            must("ip", &["netns", "add", ns]);
            must(
                "ip",
                &[
                    "link", "add", &host_end, "type", "veth", "peer", "name", "eth0", "netns", ns,
                ],
            );
            must("ip", &["link", "set", &host_end, "master", &bridge, "up"]);
            let address = format!("{}/24", topology.address(i));
            for args in [
                vec!["link", "set", "lo", "up"],
                vec!["addr", "add", &address, "dev", "eth0"],
                vec!["link", "set", "eth0", "up"],
                vec![
                    "route",
                    "add",
                    "default",
                    "via",
                    &gateway[..gateway.len() - 3],
                ],
            ] {
                let mut full = vec!["-n", ns.as_str()];
                full.extend(args);
                must("ip", &full);
            }
        }
        topology
    }

    fn gateway(&self) -> IpAddr {
        format!("10.213.{}.1", self.subnet).parse().expect("ip")
    }

    fn address(&self, index: usize) -> IpAddr {
        format!("10.213.{}.{}", self.subnet, index + 2)
            .parse()
            .expect("ip")
    }

    /// Runs an nft script inside namespace `index`.
    fn nft(&self, index: usize, script: &str) {
        must(
            "ip",
            &["netns", "exec", &self.namespaces[index], "nft", script],
        );
    }

    /// Drops incoming packets matching `rule` in every namespace.
    fn drop_everywhere(&self, rule: &str) {
        for i in 0..self.namespaces.len() {
            self.nft(i, "add table inet nwtest");
            self.nft(
                i,
                "add chain inet nwtest input { type filter hook input priority 0; }",
            );
            self.nft(i, &format!("add rule inet nwtest input {rule} drop"));
        }
    }

    fn clear_rules(&self) {
        for (i, ns) in self.namespaces.iter().enumerate() {
            let _ = run(
                "ip",
                &["netns", "exec", ns, "nft", "delete table inet nwtest"],
            );
            let _ = i;
        }
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            let _ = run("ip", &["netns", "del", ns]);
        }
        let _ = run("ip", &["link", "del", &self.bridge]);
    }
}

struct Agents(Vec<Child>);

impl Drop for Agents {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn peer_condition(node: Option<&Node>) -> Option<(String, String)> {
    wait::node_condition(node, "PeerConnectivityProblem")
}

async fn wait_all(
    nodes: &Api<Node>,
    names: &[String],
    what: &str,
    status: &'static str,
    reason: &'static str,
) -> anyhow::Result<()> {
    for name in names {
        wait::until(nodes, name, what, TIMEOUT, move |n| {
            peer_condition(n)
                .is_some_and(|(s, r)| s == status && (reason.is_empty() || r == reason))
        })
        .await?;
    }
    Ok(())
}

/// Waits until every one of `peers` reports `node` sighted `reachable` (or not).
async fn sighted_by_all(
    reports: &Api<NodeReport>,
    peers: &[String],
    node: &str,
    reachable: bool,
) -> anyhow::Result<()> {
    let what = format!(
        "{node} sighted {}",
        if reachable {
            "reachable"
        } else {
            "unreachable"
        }
    );
    for name in peers {
        wait::until(reports, name, &what, TIMEOUT, |r| {
            r.and_then(|r| r.status.as_ref()).is_some_and(|s| {
                let sightings = &s.peer_sightings;
                sightings
                    .iter()
                    .any(|p| p.node == node && p.reachable == reachable)
            })
        })
        .await?;
    }
    Ok(())
}

#[tokio::test]
async fn blocked_protocols_and_isolation_are_detected_between_namespaces() -> anyhow::Result<()> {
    let topology = Topology::new(3);
    // The peer directory: the coordinator publishes each node with an agent (a NodeReport).
    let Scene {
        env,
        nodes: names,
        coordinator,
        ..
    } = Scenario::new("peers")
        .nodes(&[
            NodeSpec::worker("zone-a"),
            NodeSpec::worker("zone-b"),
            NodeSpec::worker("zone-c"),
        ])
        .coordinator(&["--leader-elect=false"])
        .start()
        .await?;
    let coordinator = coordinator.context("the coordinator")?;
    let nodes: Api<Node> = env.nodes();
    for (i, name) in names.iter().enumerate() {
        let addresses = json!({"status": {"addresses": [
            {"type": "InternalIP", "address": topology.address(i).to_string()},
            {"type": "Hostname", "address": name},
        ]}});
        nodes
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&addresses))
            .await?;
    }

    // The API server, reachable from the namespaces through a proxy on the bridge.
    let proxy = Proxy::start(
        SocketAddr::new(topology.gateway(), 0),
        proxy::api_server_address()?,
    )
    .await?;
    let dir = scratch::dir(&format!("nodeward-peers-{}", env.id))?;
    let kubeconfig = scratch::write(
        &dir,
        "kubeconfig",
        proxy::admin_kubeconfig_via(proxy.address),
    )?;
    let config = scratch::agent_config_file(
        &dir,
        &[&format!(
            "peers: {{port: {PROBE_PORT}, interval: 1s, timeout: 1s, probeTimeout: 500ms, for: 2s}}"
        )],
        "reporting:\n  heartbeatInterval: 2s\n",
    )?;
    let mut agents = Agents(Vec::new());
    for (i, name) in names.iter().enumerate() {
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &topology.namespaces[i],
                agent_binary(),
                "run",
                "--node-name",
                name,
                "--listen",
                "0.0.0.0:9470",
                "--namespace",
                &env.namespace,
            ])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?;
        agents.0.push(child);
    }

    // Once the coordinator published the directory, every agent probes the other two.
    wait_all(&nodes, &names, "peers reachable", "False", "PeersReachable")
        .await
        .with_context(|| coordinator.output())?;
    let published = in_the_directory(&env, &topology, &names).await?;
    // No peer is listed unreachable while all answer (one that did not answer before its
    // agent started is listed as reached again): a report changes only when reachability does.
    let reports: Api<NodeReport> = Api::all(env.client.clone());
    for name in &names {
        let listed = wait::until(&reports, name, "no peer listed unreachable", TIMEOUT, |r| {
            r.and_then(|r| r.status.as_ref()).is_some_and(|s| {
                s.peer_sightings
                    .iter()
                    .all(|p| p.reachable || !names.contains(&p.node))
            })
        })
        .await;
        if listed.is_err() {
            let report = reports.get(name).await?;
            anyhow::bail!(
                "{name} lists peers unreachable: {:?}; the directory: {published:?}",
                report.status.map(|s| s.peer_sightings)
            );
        }
    }

    for (rule, reason) in [
        (format!("udp dport {PROBE_PORT}"), "UDPBlocked"),
        (format!("tcp dport {PROBE_PORT}"), "TCPBlocked"),
        ("icmp type echo-request".to_owned(), "ICMPBlocked"),
    ] {
        topology.drop_everywhere(&rule);
        wait_all(&nodes, &names, reason, "True", reason).await?;
        topology.clear_rules();
        wait_all(&nodes, &names, "the block to clear", "False", "").await?;
    }

    // Cut the first namespace off from its peers (the API server stays reachable).
    topology.nft(0, "add table inet nwtest");
    topology.nft(
        0,
        "add chain inet nwtest input { type filter hook input priority 0; }",
    );
    topology.nft(
        0,
        &format!(
            "add rule inet nwtest input ip saddr != {} drop",
            topology.gateway()
        ),
    );
    wait_all(&nodes, &names[..1], "Isolated", "True", "Isolated").await?;
    // Its peers report that their probes of it go unanswered: what the coordinator asks of
    // them before it treats a node whose agent is silent as dead.
    sighted_by_all(&reports, &names[1..], &names[0], false).await?;
    for name in &names[1..] {
        let node = nodes.get(name).await?;
        assert_eq!(
            peer_condition(Some(&node)).map(|(s, _)| s).as_deref(),
            Some("False"),
            "{name} still reaches one of its two peers and reports no problem"
        );
    }
    topology.clear_rules();
    wait_all(&nodes, &names[..1], "isolation to clear", "False", "").await?;
    // Probed again every round while listed, it is marked reachable once it answers.
    sighted_by_all(&reports, &names[1..], &names[0], true).await?;

    drop(agents);
    drop(coordinator);
    std::fs::remove_dir_all(&dir).ok();
    env.cleanup().await
}

/// The peer directory the coordinator published lists every node at its InternalIP (waited
/// for: the slices are rewritten as agents come and go); returns it (node, address).
async fn in_the_directory(
    env: &TestEnv,
    topology: &Topology,
    names: &[String],
) -> anyhow::Result<Vec<(String, String)>> {
    let slices: Api<EndpointSlice> = Api::namespaced(env.client.clone(), &env.namespace);
    let expected: Vec<(String, String)> = names
        .iter()
        .enumerate()
        .map(|(i, name)| (name.clone(), topology.address(i).to_string()))
        .collect();
    wait::eventually(
        "every node at its InternalIP in the peer directory",
        TIMEOUT,
        || async {
            let published: Vec<(String, String)> = slices
                .list(&ListParams::default().labels("kubernetes.io/service-name=nodeward-agents"))
                .await?
                .items
                .iter()
                .flat_map(|s| s.endpoints.iter())
                .filter_map(|e| Some((e.node_name.clone()?, e.addresses.first()?.clone())))
                .collect();
            let all = expected.iter().all(|e| published.contains(e));
            Ok(all.then_some(published))
        },
    )
    .await
    .with_context(|| format!("expected {expected:?}"))
}
