//! The agent's ports face the node's network (the agent runs with the host network): a
//! neighbour opening a thousand connections and never finishing a request or a probe gets its
//! share and no more, the deadlines close what it held, and the node's own probes are answered
//! meanwhile.

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use nodeward_agent::server::{self, Readiness};
use nodeward_e2e::{daemon, siege::Siege};
use nodeward_runtime::listener::Limits;

const SIEGE: usize = 1000;
const NEIGHBOUR: [u8; 4] = [127, 0, 0, 2];

#[tokio::test]
async fn a_thousand_stalled_connections_do_not_exhaust_the_agents_health_and_metrics_port()
-> anyhow::Result<()> {
    let limits = Limits::default();
    let (bound, serving) = server::serve(
        "127.0.0.1:0".parse()?,
        Arc::new(|| "# EOF\n".to_owned()),
        Arc::new(Readiness::new(&[])),
        limits.clone(),
    )
    .await?;
    let serving = tokio::spawn(serving);
    let siege = Siege::start(
        IpAddr::from(NEIGHBOUR),
        bound,
        SIEGE,
        b"GET /metrics HTTP/1.1\r\n",
    )
    .await?;

    let held = siege
        .until_held_at_most(limits.max_per_address, Duration::from_secs(5))
        .await?;
    let at_once = siege
        .closed()
        .into_iter()
        .filter(|d| *d < limits.header_timeout / 2)
        .count();
    assert!(
        at_once >= SIEGE - limits.max_per_address,
        "only {at_once} of {SIEGE} connections over the limit closed at once"
    );
    // The kubelet's probe, from another address, is answered while the neighbour holds its share.
    let (status, body) = daemon::get(&bound.to_string(), "/healthz").await?;
    assert_eq!(
        (status, body.as_str()),
        (200, "ok"),
        "/healthz during the siege"
    );

    siege
        .until_held_at_most(0, limits.header_timeout * 3)
        .await?;
    let last = siege.closed().into_iter().max().unwrap_or_default();
    assert!(
        last >= limits.header_timeout.mul_f64(0.9),
        "the last stalled connection closed after {last:?}, before the {:?} header deadline",
        limits.header_timeout
    );
    println!("{held} of {SIEGE} stalled connections held until the header deadline ({last:?})");
    serving.abort();
    Ok(())
}

#[tokio::test]
async fn a_thousand_silent_connections_do_not_exhaust_the_peer_probe_port() -> anyhow::Result<()> {
    let port = nodeward_e2e::daemon::free_port()?;
    let responding =
        tokio::spawn(nodeward_agent::detect::peers::respond(None, port, |_| {}).await?);
    let target = SocketAddr::from(([127, 0, 0, 1], port));
    let siege = Siege::start(IpAddr::from(NEIGHBOUR), target, SIEGE, b"").await?;
    let limits = Limits::default();
    siege
        .until_held_at_most(limits.max_per_address, Duration::from_secs(5))
        .await?;
    // A peer's probe from another address is answered while the neighbour holds its share.
    nodeward_agent::detect::peers::probe(
        nodeward_agent::detect::peers::Protocol::Tcp,
        [127, 0, 0, 1].into(),
        port,
        Duration::from_secs(2),
    )
    .await
    .map_err(anyhow::Error::msg)?;
    // A probe has 5 s to send its line.
    siege.until_held_at_most(0, Duration::from_secs(15)).await?;
    responding.abort();
    Ok(())
}
