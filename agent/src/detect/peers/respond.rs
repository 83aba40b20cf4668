//! Answering peers' probes: every agent answers on one port over TCP and UDP.

use std::{
    net::{IpAddr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{TcpListener, TcpStream, UdpSocket},
};

use super::probe::{FENCING_MARK, MAX_PROBE, PING, PONG};
use crate::Error;
use nodeward_runtime::listener::{self, Limits};

/// Answers TCP and UDP probes on `port` of `address` (None: all addresses, IPv4 and IPv6)
/// until dropped; tells `fencing_probe` the address of each fencing probe answered over TCP.
pub async fn respond(
    address: Option<IpAddr>,
    port: u16,
    fencing_probe: impl Fn(IpAddr) + Clone + Send + 'static,
) -> Result<impl Future<Output = ()>, Error> {
    let (tcp, udp) = match address {
        Some(ip) => bind(SocketAddr::new(ip, port)).await?,
        None => match bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port))).await {
            Ok(both) => both,
            // A kernel without IPv6: IPv4 only.
            Err(_) => bind(SocketAddr::from(([0, 0, 0, 0], port))).await?,
        },
    };
    Ok(async move {
        // Each probe connection gets 5 s to send its line (answer_tcp).
        let tcp_loop = listener::accept(tcp, Limits::default(), |stream, from| {
            answer_tcp(stream, from.ip().to_canonical(), fencing_probe.clone())
        });
        let udp_loop = async {
            let mut buffer = [0u8; MAX_PROBE];
            loop {
                let Ok((len, from)) = udp.recv_from(&mut buffer).await else {
                    continue;
                };
                if let Some(pong) = answer(&buffer[..len]) {
                    let _ = udp.send_to(&pong, from).await;
                }
            }
        };
        tokio::join!(tcp_loop, udp_loop);
    })
}

async fn bind(address: SocketAddr) -> Result<(TcpListener, UdpSocket), Error> {
    let tcp = TcpListener::bind(address)
        .await
        .map_err(|e| Error::PeerProbes(format!("binding tcp {address}: {e}")))?;
    let udp = UdpSocket::bind(address)
        .await
        .map_err(|e| Error::PeerProbes(format!("binding udp {address}: {e}")))?;
    Ok((tcp, udp))
}

async fn answer_tcp(stream: TcpStream, from: IpAddr, fencing_probe: impl Fn(IpAddr)) {
    let (reader, mut writer) = stream.into_split();
    let mut line = Vec::new();
    let mut reader = BufReader::new(reader.take(MAX_PROBE as u64));
    let read = reader.read_until(b'\n', &mut line);
    if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(5), read).await
        && let Some(mut pong) = answer(&line)
    {
        pong.push(b'\n');
        if writer.write_all(&pong).await.is_ok() && is_fencing(&line) {
            fencing_probe(from);
        }
    }
}

/// The answer to one probe (a UDP datagram or a TCP line), or None for anything that is not
/// a probe. Never longer than the probe: the responder amplifies nothing.
pub fn answer(probe: &[u8]) -> Option<Vec<u8>> {
    let probe = probe.get(..probe.len().min(MAX_PROBE))?;
    let nonce = std::str::from_utf8(probe)
        .ok()?
        .strip_prefix(PING)?
        .trim_end();
    let nonce = nonce.strip_suffix(FENCING_MARK).unwrap_or(nonce);
    Some(format!("{PONG}{nonce}").into_bytes())
}

/// Whether a probe is a fencing probe.
fn is_fencing(probe: &[u8]) -> bool {
    std::str::from_utf8(probe)
        .is_ok_and(|p| p.starts_with(PING) && p.trim_end().ends_with(FENCING_MARK))
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::detect::peers::probe::{Protocol, probe, probe_fencing};

    #[tokio::test]
    async fn probes_are_answered_with_their_nonce_and_fencing_ones_over_tcp_recorded() {
        let recorded: std::sync::Arc<std::sync::Mutex<Vec<IpAddr>>> = Default::default();
        let record = {
            let recorded = recorded.clone();
            move |ip| recorded.lock().expect("lock").push(ip)
        };
        // A port free for UDP may be taken for TCP by a test running beside this one: try
        // another then.
        let mut tries = 0;
        let (port, responder) = loop {
            let port = std::net::UdpSocket::bind("127.0.0.1:0")
                .and_then(|s| s.local_addr())
                .expect("port")
                .port();
            match respond(None, port, record.clone()).await {
                Ok(responder) => break (port, responder),
                Err(e) if tries < 10 => {
                    tries += 1;
                    eprintln!("port {port} taken ({e}); another");
                }
                Err(e) => panic!("bind: {e:?}"),
            }
        };
        let task = tokio::spawn(responder);
        let local: IpAddr = "127.0.0.1".parse().expect("ip");
        let timeout = Duration::from_secs(2);
        assert_eq!(probe(Protocol::Tcp, local, port, timeout).await, Ok(()));
        assert_eq!(probe(Protocol::Udp, local, port, timeout).await, Ok(()));
        assert!(
            recorded.lock().expect("lock").is_empty(),
            "not fencing probes"
        );
        assert_eq!(probe_fencing(local, port, timeout).await, Ok(()));
        // Recorded once the answer is sent, as the prober reads it.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while recorded.lock().expect("lock").is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(*recorded.lock().expect("lock"), [local]);
        task.abort();
    }
}
