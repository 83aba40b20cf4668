//! Probing one peer: a line with a fresh nonce over TCP or UDP (a stray packet never counts),
//! or an ICMP echo the peer's kernel answers.

use std::{
    net::{IpAddr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{TcpStream, UdpSocket},
};

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

pub(super) const PING: &str = "NWPING ";
pub(super) const PONG: &str = "NWPONG ";
/// After the nonce of a fencing probe: the prober, cut off from the API server, counts who
/// answers, and the peer records that it probed ([`super::Sightings::probed`]).
pub(super) const FENCING_MARK: &str = " fencing";
/// Probes are tiny; anything longer is not ours.
pub(super) const MAX_PROBE: usize = 64;

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
            Protocol::Tcp => probe_tcp(SocketAddr::new(address, port), "").await,
            Protocol::Udp => probe_udp(SocketAddr::new(address, port)).await,
            Protocol::Icmp => probe_icmp(address, timeout).await,
        }
    };
    within(timeout, attempt).await
}

/// A fencing probe of `address`: over TCP only (its handshake shows the peer whose probe it
/// records is the one at the address).
pub async fn probe_fencing(address: IpAddr, port: u16, timeout: Duration) -> Result<(), String> {
    within(
        timeout,
        probe_tcp(SocketAddr::new(address, port), FENCING_MARK),
    )
    .await
}

async fn within(
    timeout: Duration,
    attempt: impl Future<Output = Result<(), String>>,
) -> Result<(), String> {
    match tokio::time::timeout(timeout, attempt).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

async fn probe_tcp(target: SocketAddr, mark: &str) -> Result<(), String> {
    let nonce = nonce();
    let mut stream = TcpStream::connect(target)
        .await
        .map_err(|e| e.to_string())?;
    stream
        .write_all(format!("{PING}{nonce}{mark}\n").as_bytes())
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
            nodeward_api::bounds::cut(reply, 40)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
