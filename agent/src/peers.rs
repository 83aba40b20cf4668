//! Peer probing, the I/O half of the peer-connectivity detector: every agent answers probes on
//! one port over TCP and UDP (with a nonce, so a stray packet never counts), the kernel
//! answers ICMP echo, and a directory of peer addresses follows the Node objects.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv6Addr, SocketAddr},
    sync::{Arc, RwLock},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::{Api, runtime::watcher};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{TcpListener, TcpStream, UdpSocket},
};

use crate::{Error, backoff::Backoff};
use nodeward_api::labels::{AGENT_FIELD_MANAGER, AGENT_LABEL};
use nodeward_runtime::listener::{self, Limits};

/// The probe protocols.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Deserialize)]
pub enum Protocol {
    #[serde(rename = "tcp")]
    Tcp,
    #[serde(rename = "udp")]
    Udp,
    #[serde(rename = "icmp")]
    Icmp,
}

impl Protocol {
    pub fn name(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Icmp => "icmp",
        }
    }
}

const PING: &str = "NWPING ";
const PONG: &str = "NWPONG ";
/// Probes are tiny; anything longer is not ours.
const MAX_PROBE: usize = 64;

/// Answers TCP and UDP probes on `port` (all addresses, IPv4 and IPv6) until dropped.
pub async fn respond(port: u16) -> Result<impl Future<Output = ()>, Error> {
    let any = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
    let (tcp, udp) = match (TcpListener::bind(any).await, UdpSocket::bind(any).await) {
        (Ok(tcp), Ok(udp)) => (tcp, udp),
        // A kernel without IPv6: IPv4 only.
        _ => {
            let v4 = SocketAddr::from(([0, 0, 0, 0], port));
            let tcp = TcpListener::bind(v4)
                .await
                .map_err(|e| Error::PeerProbes(format!("binding tcp {v4}: {e}")))?;
            let udp = UdpSocket::bind(v4)
                .await
                .map_err(|e| Error::PeerProbes(format!("binding udp {v4}: {e}")))?;
            (tcp, udp)
        }
    };
    Ok(async move {
        // Each probe connection gets 5 s to send its line (answer_tcp).
        let tcp_loop = listener::accept(tcp, Limits::default(), |stream, _| answer_tcp(stream));
        let udp_loop = async {
            let mut buffer = [0u8; MAX_PROBE];
            loop {
                let Ok((len, from)) = udp.recv_from(&mut buffer).await else {
                    continue;
                };
                if let Some(nonce) = std::str::from_utf8(&buffer[..len])
                    .ok()
                    .and_then(|t| t.strip_prefix(PING))
                {
                    let _ = udp
                        .send_to(format!("{PONG}{}", nonce.trim_end()).as_bytes(), from)
                        .await;
                }
            }
        };
        tokio::join!(tcp_loop, udp_loop);
    })
}

async fn answer_tcp(stream: TcpStream) {
    let (reader, mut writer) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(reader.take(MAX_PROBE as u64));
    let read = reader.read_line(&mut line);
    if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(5), read).await
        && let Some(nonce) = line.strip_prefix(PING)
    {
        let _ = writer
            .write_all(format!("{PONG}{}\n", nonce.trim_end()).as_bytes())
            .await;
    }
}

fn nonce() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Probes `address` once over `protocol`; `Ok` when the right answer came back in time.
pub async fn probe(
    protocol: Protocol,
    address: IpAddr,
    port: u16,
    timeout: Duration,
) -> Result<(), String> {
    let attempt = async {
        match protocol {
            Protocol::Tcp => probe_tcp(SocketAddr::new(address, port)).await,
            Protocol::Udp => probe_udp(SocketAddr::new(address, port)).await,
            Protocol::Icmp => probe_icmp(address, timeout).await,
        }
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

async fn probe_tcp(target: SocketAddr) -> Result<(), String> {
    let nonce = nonce();
    let mut stream = TcpStream::connect(target)
        .await
        .map_err(|e| e.to_string())?;
    stream
        .write_all(format!("{PING}{nonce}\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(stream.take(MAX_PROBE as u64))
        .read_line(&mut line)
        .await
        .map_err(|e| e.to_string())?;
    check_pong(line.trim_end(), &nonce)
}

async fn probe_udp(target: SocketAddr) -> Result<(), String> {
    let nonce = nonce();
    let local: SocketAddr = if target.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(local).await.map_err(|e| e.to_string())?;
    socket.connect(target).await.map_err(|e| e.to_string())?;
    socket
        .send(format!("{PING}{nonce}").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut buffer = [0u8; MAX_PROBE];
    loop {
        let len = socket.recv(&mut buffer).await.map_err(|e| e.to_string())?;
        if check_pong(&String::from_utf8_lossy(&buffer[..len]), &nonce).is_ok() {
            return Ok(());
        }
    }
}

async fn probe_icmp(address: IpAddr, timeout: Duration) -> Result<(), String> {
    let config = match address {
        IpAddr::V4(_) => surge_ping::Config::default(),
        IpAddr::V6(_) => surge_ping::Config::builder()
            .kind(surge_ping::ICMP::V6)
            .build(),
    };
    let client =
        surge_ping::Client::new(&config).map_err(|e| format!("opening an ICMP socket: {e}"))?;
    let mut pinger = client
        .pinger(address, surge_ping::PingIdentifier(rand::random()))
        .await;
    pinger.timeout(timeout);
    pinger
        .ping(surge_ping::PingSequence(0), nonce().as_bytes())
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn check_pong(reply: &str, nonce: &str) -> Result<(), String> {
    match reply.strip_prefix(PONG) {
        Some(n) if n == nonce => Ok(()),
        _ => Err(format!(
            "unexpected answer {:?}",
            crate::detect::command::cap(reply, 40)
        )),
    }
}

/// The addresses of the other nodes, kept current by a watch on the Node objects.
#[derive(Clone, Debug, Default)]
pub struct Directory(Arc<RwLock<BTreeMap<String, IpAddr>>>);

impl Directory {
    /// Every known peer except `own`.
    pub fn peers(&self, own: &str) -> Vec<(String, IpAddr)> {
        let map = self
            .0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        map.iter()
            .filter(|(name, _)| name.as_str() != own)
            .map(|(n, a)| (n.clone(), *a))
            .collect()
    }

    fn set(&self, name: String, address: Option<IpAddr>) {
        let mut map = self
            .0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match address {
            Some(a) => map.insert(name, a),
            None => map.remove(&name),
        };
    }

    /// Follows the Node objects that run an agent (labelled [`AGENT_LABEL`]) until dropped; a
    /// re-list (after a lost watch) replaces the whole map, so nodes deleted meanwhile
    /// disappear too.
    pub async fn follow(self, client: kube::Client) {
        let nodes: Api<Node> = Api::all(client);
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        let selector = watcher::Config::default().labels(AGENT_LABEL);
        let mut stream = std::pin::pin!(watcher(nodes, selector));
        let mut relisted = BTreeMap::new();
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(node)) => self.set(
                    node.metadata.name.clone().unwrap_or_default(),
                    internal_ip(&node),
                ),
                Ok(watcher::Event::Delete(node)) => {
                    self.set(node.metadata.name.clone().unwrap_or_default(), None)
                }
                Ok(watcher::Event::Init) => relisted.clear(),
                Ok(watcher::Event::InitApply(node)) => {
                    if let (Some(name), Some(ip)) = (node.metadata.name.clone(), internal_ip(&node))
                    {
                        relisted.insert(name, ip);
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    backoff.reset();
                    let mut map = self
                        .0
                        .write()
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                    *map = std::mem::take(&mut relisted);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "watching nodes for peer addresses failed; retrying");
                    tokio::time::sleep(backoff.next_delay()).await;
                }
            }
        }
    }
}

/// Labels this agent's own Node as running an agent, so that its peers probe it; retries
/// with backoff until the Node exists and the write succeeds.
pub async fn mark_own_node(client: kube::Client, node_name: String) {
    let nodes: Api<Node> = Api::all(client);
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
    let patch = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node_name, "labels": {AGENT_LABEL: "true"}},
    });
    let params = kube::api::PatchParams::apply(AGENT_FIELD_MANAGER);
    loop {
        match nodes
            .patch(&node_name, &params, &kube::api::Patch::Apply(&patch))
            .await
        {
            Ok(_) => return,
            Err(e) => {
                tracing::debug!(error = %e, node = %node_name, "labelling the node as running an agent; will retry")
            }
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// A node's InternalIP (IPv4 preferred), where its agent answers probes.
pub fn internal_ip(node: &Node) -> Option<IpAddr> {
    let addresses = node.status.as_ref()?.addresses.as_ref()?;
    let mut ips: Vec<IpAddr> = addresses
        .iter()
        .filter(|a| a.type_ == "InternalIP")
        .filter_map(|a| a.address.parse().ok())
        .collect();
    ips.sort_by_key(|ip| !ip.is_ipv4());
    ips.first().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tcp_and_udp_probes_are_answered_with_their_nonce() {
        let port = std::net::UdpSocket::bind("127.0.0.1:0")
            .and_then(|s| s.local_addr())
            .expect("port")
            .port();
        let responder = respond(port).await.expect("bind");
        let task = tokio::spawn(responder);
        let local: IpAddr = "127.0.0.1".parse().expect("ip");
        let timeout = Duration::from_secs(2);
        assert_eq!(probe(Protocol::Tcp, local, port, timeout).await, Ok(()));
        assert_eq!(probe(Protocol::Udp, local, port, timeout).await, Ok(()));
        task.abort();
    }

    #[tokio::test]
    async fn a_closed_port_fails_tcp_and_udp() {
        let port = std::net::UdpSocket::bind("127.0.0.1:0")
            .and_then(|s| s.local_addr())
            .expect("port")
            .port();
        let local: IpAddr = "127.0.0.1".parse().expect("ip");
        let timeout = Duration::from_millis(300);
        assert!(probe(Protocol::Tcp, local, port, timeout).await.is_err());
        assert!(probe(Protocol::Udp, local, port, timeout).await.is_err());
    }

    #[test]
    fn only_the_right_nonce_counts() {
        assert!(check_pong("NWPONG abc", "abc").is_ok());
        assert!(check_pong("NWPONG abd", "abc").is_err());
        assert!(check_pong("HTTP/1.1 400", "abc").is_err());
    }

    #[test]
    fn internal_ipv4_is_preferred() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n"},
            "status": {"addresses": [
                {"type": "Hostname", "address": "n"},
                {"type": "InternalIP", "address": "fd00::5"},
                {"type": "InternalIP", "address": "10.0.0.5"},
            ]}
        }))
        .expect("node");
        assert_eq!(internal_ip(&node), Some("10.0.0.5".parse().expect("ip")));
    }
}
