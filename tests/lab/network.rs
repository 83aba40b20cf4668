//! The network for real, faults injected into a guest: its default route gone, its resolver
//! down, the API server blocked by its firewall, each reported by the chart's agent and
//! cleared once undone; and a guest whose firewall drops UDP to the peer port (as a missing
//! security-group rule would), found out by its own peer probes over the lab's L2 while TCP
//! and ICMP still work, its peers, which still reach the other node, blaming nobody.

use nodeward_e2e::{nodelab::Vm, wait};

use crate::support::{FIREWALL_TABLE, Lab, Pick, REBOOT, agent_gauge};

/// The default route every lab guest has (`tests/nodelab/rootfs/etc/systemd/network`).
const DEFAULT_ROUTE: &str = "default via 10.0.2.2";
/// The name the agents' DNS check resolves (the lab's chart), and its address.
const LAB_NAME: &str = "api.nodelab.test -> 10.0.2.100";
/// The agent's gauge of the Node condition its network checks write.
const NETWORK_GAUGE: &str = r#"nodeward_finding{type="NetworkProblem"}"#;

/// What the faults test changes, undone (a test that failed half-way leaves it): the default
/// route back, the node's resolver running.
pub const NETWORK_RESTORED: &str =
    "ip -4 route show default | grep -q . || ip -4 route add default via 10.0.2.2
    systemctl start nodelab-dns.service";

/// `series` as the agent exports it reads `value`, waited for.
async fn gauge_is(vm: &Vm, series: &str, value: &str) -> anyhow::Result<()> {
    wait::eventually(&format!("{series} {value}"), REBOOT, || async {
        Ok((agent_gauge(vm, series).await? == value).then_some(()))
    })
    .await
}

/// The agent's reported status of one check: `1` for it in `nodeward_check_status`, which the
/// agent sets once the status held for the check's `for`.
async fn check_status_is(vm: &Vm, detector: &str, status: &str) -> anyhow::Result<()> {
    let series = format!(r#"nodeward_check_status{{detector="{detector}",status="{status}"}}"#);
    gauge_is(vm, &series, "1").await
}

/// A fault that also cuts the agent off from the API server, injected and undone: the agent
/// exports `detector`'s problem, and its condition's, while it lasts (as a Prometheus on
/// another node scrapes them), and once it writes again, the detector's finding last changed
/// after the fault began (it saw it). Each check is waited for by its own status: the
/// condition's gauge is 1 as soon as any of its checks (the API server's, here) finds a
/// problem, which may be before `detector`'s own `for` has held.
async fn fault_seen_in_the_gauge(
    lab: &Lab,
    vm: &Vm,
    node: &str,
    detector: &str,
    (inject, undo): (&str, &str),
) -> anyhow::Result<()> {
    let began = jiff::Timestamp::now();
    vm.run(inject).await?;
    check_status_is(vm, detector, "problem").await?;
    gauge_is(vm, NETWORK_GAUGE, "1").await?;
    vm.run(undo).await?;
    check_status_is(vm, detector, "ok").await?;
    gauge_is(vm, NETWORK_GAUGE, "0").await?;
    let after = lab
        .finding(node, detector, "cleared since the fault began", |f| {
            f.status == "False" && f.since.0 > began
        })
        .await?;
    println!(
        "{detector}: cleared at {} ({})",
        after.since.0, after.message
    );
    lab.condition(node, "NetworkProblem", "False", "NoProblem")
        .await
}

#[tokio::test]
async fn a_missing_default_route_a_stopped_resolver_and_a_blocked_api_server_are_reported_and_cleared()
-> anyhow::Result<()> {
    // The last VM's lane: the faults are this node's own, and the other lane's tests go on.
    let (lab, node, vm) = Lab::beside(Pick::Last).await?;
    let resolves = lab.cleared(&node, "dns", "the lab's name resolves").await?;
    assert_eq!(resolves.reason, "DNSResolves");
    assert_eq!(resolves.message, LAB_NAME);
    let routed = lab
        .cleared(&node, "default-route", "a default route")
        .await?;
    assert_eq!(routed.reason, "DefaultRoutePresent", "{}", routed.message);
    let reachable = lab
        .cleared(&node, "apiserver", "the API server answers")
        .await?;
    assert_eq!(
        reachable.reason, "APIServerReachable",
        "{}",
        reachable.message
    );
    lab.condition(&node, "NetworkProblem", "False", "NoProblem")
        .await?;
    assert_eq!(agent_gauge(&vm, NETWORK_GAUGE).await?, "0");

    // The node's resolver stops: the name no longer resolves, which the Node shows.
    vm.run("systemctl stop nodelab-dns.service").await?;
    let failing = lab.with_reason(&node, "dns", "DNSFailure").await?;
    assert_eq!(failing.status, "True");
    assert!(
        failing
            .message
            .starts_with("cannot resolve api.nodelab.test: "),
        "{}",
        failing.message
    );
    lab.condition(&node, "NetworkProblem", "True", "DNSFailure")
        .await?;
    vm.run("systemctl start nodelab-dns.service").await?;
    let again = lab.cleared(&node, "dns", "resolves again").await?;
    assert_eq!(again.message, LAB_NAME);
    lab.condition(&node, "NetworkProblem", "False", "NoProblem")
        .await?;

    // The default route goes. The agent reaches the API server through the `kubernetes`
    // Service, whose address is routed before kube-proxy rewrites it: without a default route
    // it is cut off too (the kubelet, which dials the API server's own address on the uplink's
    // subnet, is not), so the problem is seen in its gauge.
    fault_seen_in_the_gauge(
        &lab,
        &vm,
        &node,
        "default-route",
        (
            "ip -4 route del default",
            &format!("ip -4 route add {DEFAULT_ROUTE}"),
        ),
    )
    .await?;

    // The API server blocked by the guest's firewall (the kubelet's traffic too: the node goes
    // NotReady if this lasts).
    fault_seen_in_the_gauge(
        &lab,
        &vm,
        &node,
        "apiserver",
        (
            &format!(
                "nft add table inet {FIREWALL_TABLE} && \
                 nft add chain inet {FIREWALL_TABLE} out '{{ type filter hook output priority -10; }}' && \
                 nft add rule inet {FIREWALL_TABLE} out ip daddr 10.0.2.100 drop"
            ),
            &format!("nft delete table inet {FIREWALL_TABLE}"),
        ),
    )
    .await?;
    Ok(())
}

#[tokio::test]
#[ignore = "out of ./tests/run for its time: the node-lab tests ran past CI's limit (BENCHMARKS.md, \"A cold ./tests/run\"); run with --ignored network::"]
async fn a_node_that_drops_udp_to_the_peer_port_is_udp_blocked_until_the_rule_goes()
-> anyhow::Result<()> {
    let (lab, blocked, vm) = Lab::with_node(Pick::At(0)).await?;
    for node in &lab.lab.nodes {
        let finding = lab
            .finding(node, "peers", "its peers answer every protocol", |f| {
                f.reason == "PeersReachable" && f.message.contains("tcp, udp, icmp")
            })
            .await?;
        assert_eq!(finding.status, "False", "{node}: {}", finding.message);
    }

    // UDP to and from the peer port (the agent's probe listener), both ways.
    vm.run(&format!(
        "nft add table inet {FIREWALL_TABLE} && \
         nft add chain inet {FIREWALL_TABLE} in '{{ type filter hook input priority -10; }}' && \
         nft add chain inet {FIREWALL_TABLE} out '{{ type filter hook output priority -10; }}' && \
         nft add rule inet {FIREWALL_TABLE} in udp dport 9471 drop && \
         nft add rule inet {FIREWALL_TABLE} out udp dport 9471 drop"
    ))
    .await?;
    let found = lab.with_reason(&blocked, "peers", "UDPBlocked").await?;
    assert_eq!(
        (found.type_.as_str(), found.status.as_str()),
        ("PeerConnectivityProblem", "True")
    );
    assert!(
        found.message.contains("udp 0/2") && found.message.contains("tcp 2/2"),
        "{}",
        found.message
    );
    // The others reach one peer of two over UDP: one unreachable peer is not their problem
    // (waited for: an agent the kubelet restarted under the lab's load is briefly a second
    // unreachable peer).
    for node in lab.lab.nodes.iter().filter(|n| **n != blocked) {
        lab.cleared(
            node,
            "peers",
            "one unreachable peer of two is not a problem",
        )
        .await?;
    }

    vm.run(&format!("nft delete table inet {FIREWALL_TABLE}"))
        .await?;
    let cleared = lab.cleared(&blocked, "peers", "reachable again").await?;
    assert_eq!(cleared.reason, "PeersReachable", "{}", cleared.message);
    Ok(())
}
