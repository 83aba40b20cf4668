//! Accepting connections so that no client can exhaust a listener: a cap on connections held at
//! once and on those from one address, a deadline for each request's headers (which also
//! closes idle keep-alive connections) and for the TLS handshake, a cap on header size, and
//! accept errors (out of descriptors) backed off instead of spun on. An HTTP/2 connection (the
//! webhook's, where the API server asks for it) has a cap on its streams and is closed once it
//! has had no request in flight for the headers' deadline.
//!
//! Both daemons serve `/healthz` on a port that neighbours on the node's network can reach
//! (the agent runs with the host network), and the coordinator serves the eviction webhook that
//! every drain in the cluster goes through: one client holding thousands of half-open
//! connections must not take them down.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::Duration,
};

use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::net::{TcpListener, TcpStream};

use crate::backoff::Backoff;

/// How much one listener gives its clients.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections held at once; one more is closed as soon as it is accepted.
    pub max_connections: usize,
    /// Connections held at once from one IP address (one node, one pod, one neighbour).
    pub max_per_address: usize,
    /// From the connection (or the end of the last response) to the end of a request's
    /// headers; an idle keep-alive connection is closed after it too.
    pub header_timeout: Duration,
    /// From the connection to the end of the TLS handshake.
    pub handshake_timeout: Duration,
    /// From the headers to the response, the body included (a body sent byte by byte).
    pub request_timeout: Duration,
    /// Request line and headers, in bytes.
    pub max_header_bytes: usize,
    /// Requests in flight at once on one HTTP/2 connection.
    pub max_streams: u32,
}

impl Default for Limits {
    /// A kubelet probe, a Prometheus scrape and the API server's webhook calls need a few
    /// connections each and send their headers in one packet.
    fn default() -> Self {
        Self {
            max_connections: 512,
            max_per_address: 64,
            header_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            max_header_bytes: 16 * 1024,
            max_streams: 100,
        }
    }
}

impl Limits {
    /// An HTTP/1 connection builder that applies these limits.
    pub fn http1(&self) -> hyper::server::conn::http1::Builder {
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_timeout)
            // hyper's read buffer holds the headers; 8 KiB is its smallest.
            .max_buf_size(self.max_header_bytes.max(8192));
        builder
    }

    /// An HTTP/2 connection builder that applies these limits: streams at once, header size,
    /// and pings that drop a peer that stopped answering. [`serve_http2`] closes idle
    /// connections.
    pub fn http2(&self) -> hyper::server::conn::http2::Builder<TokioExecutor> {
        let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .max_concurrent_streams(self.max_streams)
            .max_header_list_size(u32::try_from(self.max_header_bytes).unwrap_or(u32::MAX))
            .keep_alive_interval(self.header_timeout)
            .keep_alive_timeout(self.header_timeout);
        builder
    }
}

/// Serves one HTTP/2 connection with `handle` within `limits`. Once no request has been in
/// flight for `header_timeout` it is closed (GOAWAY; what is still open gets
/// `request_timeout`), as an idle HTTP/1.1 connection is: a client holding connections it does
/// not use cannot keep their places.
pub async fn serve_http2<I, F, Fut, B>(io: I, handle: F, limits: &Limits)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    F: Fn(hyper::Request<hyper::body::Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = hyper::Response<B>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (in_flight, mut watched) = tokio::sync::watch::channel(0usize);
    let in_flight = Arc::new(in_flight);
    let handle = Arc::new(handle);
    let service = hyper::service::service_fn(move |request| {
        // Counted until the answer or until hyper drops the request (a stream the client reset).
        let counted = InFlight::count(in_flight.clone());
        let answer = handle(request);
        async move {
            let response = answer.await;
            drop(counted);
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    let connection = limits.http2().serve_connection(io, service);
    tokio::pin!(connection);
    let idle = async {
        loop {
            if *watched.borrow_and_update() == 0 {
                match tokio::time::timeout(limits.header_timeout, watched.changed()).await {
                    Err(_) => return,
                    Ok(Err(_)) => std::future::pending::<()>().await,
                    Ok(Ok(())) => {}
                }
            } else if watched.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        ended = connection.as_mut() => {
            if let Err(e) = ended {
                tracing::debug!(error = %e, "HTTP/2 connection ended");
            }
            return;
        }
        () = idle => connection.as_mut().graceful_shutdown(),
    }
    if tokio::time::timeout(limits.request_timeout, connection)
        .await
        .is_err()
    {
        tracing::debug!("an idle HTTP/2 connection did not close in time; dropped");
    }
}

/// One request in flight on an HTTP/2 connection, for [`serve_http2`]'s idle deadline.
struct InFlight(Arc<tokio::sync::watch::Sender<usize>>);

impl InFlight {
    fn count(requests: Arc<tokio::sync::watch::Sender<usize>>) -> Self {
        requests.send_modify(|n| *n += 1);
        Self(requests)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Who holds connections now: the pure bookkeeping behind [`Limits::max_connections`] and
/// [`Limits::max_per_address`].
#[derive(Debug, Default)]
pub struct Connections {
    total: usize,
    by_address: HashMap<IpAddr, usize>,
}

impl Connections {
    /// Counts a new connection from `address` if the limits allow it.
    pub fn admit(&mut self, address: IpAddr, limits: &Limits) -> bool {
        let from_address = self.by_address.get(&address).copied().unwrap_or(0);
        if self.total >= limits.max_connections || from_address >= limits.max_per_address {
            return false;
        }
        self.total += 1;
        self.by_address.insert(address, from_address + 1);
        true
    }

    /// Forgets a connection [`Connections::admit`] counted.
    pub fn release(&mut self, address: IpAddr) {
        let Some(n) = self.by_address.get_mut(&address) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            self.by_address.remove(&address);
        }
        self.total -= 1;
    }

    pub fn total(&self) -> usize {
        self.total
    }
}

/// A listener's connections, shared with the tasks serving them.
#[derive(Clone, Debug, Default)]
struct Held(Arc<Mutex<Connections>>);

impl Held {
    /// Connections held now.
    fn count(&self) -> usize {
        self.0.lock().map(|c| c.total()).unwrap_or(0)
    }

    fn admit(&self, address: IpAddr, limits: &Limits) -> Option<Slot> {
        let mut connections = self.0.lock().ok()?;
        connections.admit(address, limits).then(|| Slot {
            held: self.clone(),
            address,
        })
    }
}

/// One admitted connection; dropping it frees its place.
struct Slot {
    held: Held,
    address: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut connections) = self.held.0.lock() {
            connections.release(self.address);
        }
    }
}

/// Accepts connections until the future is dropped and hands each admitted one to `serve` on
/// its own task. Connections over the limits are closed at once; accept errors back off.
pub async fn accept<F, Fut>(listener: TcpListener, limits: Limits, serve: F)
where
    F: Fn(TcpStream, SocketAddr) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let held = Held::default();
    let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_secs(1));
    let mut refused: u64 = 0;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => {
                backoff.reset();
                accepted
            }
            Err(e) => {
                // EMFILE and the like: spinning would burn a core and starve the rest.
                let delay = backoff.next_delay();
                tracing::warn!(error = %e, retry_in = ?delay, "accepting a connection");
                tokio::time::sleep(delay).await;
                continue;
            }
        };
        let Some(slot) = held.admit(peer.ip(), &limits) else {
            refused += 1;
            // One line per power of two: a flood is visible without flooding the log.
            if refused.is_power_of_two() {
                tracing::warn!(%peer, refused, held = held.count(), "connection over the limits closed");
            }
            drop(stream);
            continue;
        };
        let serving = serve(stream, peer);
        tokio::spawn(async move {
            serving.await;
            drop(slot);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(total: usize, per_address: usize) -> Limits {
        Limits {
            max_connections: total,
            max_per_address: per_address,
            ..Limits::default()
        }
    }

    #[test]
    fn one_address_gets_no_more_than_its_share() {
        let (one, two): (IpAddr, IpAddr) = ([10, 0, 0, 1].into(), [10, 0, 0, 2].into());
        let limits = limits(10, 3);
        let mut c = Connections::default();
        let admitted = (0..5).filter(|_| c.admit(one, &limits)).count();
        assert_eq!(admitted, 3);
        assert!(c.admit(two, &limits), "another address still gets in");
        c.release(one);
        assert!(c.admit(one, &limits), "a freed place is given again");
        assert_eq!(c.total(), 4);
    }

    #[test]
    fn the_total_caps_many_addresses() {
        let limits = limits(4, 3);
        let mut c = Connections::default();
        let admitted = (1..=10u8)
            .filter(|i| c.admit([10, 0, 0, *i].into(), &limits))
            .count();
        assert_eq!(admitted, 4);
        for i in 1..=4u8 {
            c.release([10, 0, 0, i].into());
        }
        assert_eq!(c.total(), 0);
        assert!(c.by_address.is_empty(), "released addresses are forgotten");
    }

    #[test]
    fn releasing_what_was_never_admitted_changes_nothing() {
        let mut c = Connections::default();
        c.release([10, 0, 0, 1].into());
        assert_eq!(c.total(), 0);
    }

    /// Serves one HTTP/2 connection on a loopback port within `limits`, answering each request
    /// "ok" after `delay`; returns the port's address.
    async fn serve_one(limits: &Limits, delay: Duration) -> std::net::SocketAddr {
        use bytes::Bytes;
        use http_body_util::Full;
        use hyper_util::rt::TokioIo;

        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let serving = limits.clone();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            let answer = move |_request| async move {
                tokio::time::sleep(delay).await;
                hyper::Response::new(Full::new(Bytes::from_static(b"ok")))
            };
            serve_http2(TokioIo::new(stream), answer, &serving).await;
        });
        address
    }

    /// An HTTP/2 client connection to `address`; its task ends (with the time) when the
    /// connection closes.
    async fn client(
        address: std::net::SocketAddr,
    ) -> (
        hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>,
        tokio::task::JoinHandle<tokio::time::Instant>,
    ) {
        let stream = TcpStream::connect(address).await.expect("connect");
        let (sender, connection) = hyper::client::conn::http2::handshake(
            TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(stream),
        )
        .await
        .expect("an HTTP/2 handshake");
        let closed = tokio::spawn(async move {
            let _ = connection.await;
            tokio::time::Instant::now()
        });
        (sender, closed)
    }

    fn request(path: &str) -> hyper::Request<http_body_util::Empty<bytes::Bytes>> {
        hyper::Request::get(format!("http://webhook{path}"))
            .body(http_body_util::Empty::new())
            .expect("a request")
    }

    /// A request that outlasts the idle deadline is answered; once nothing is in flight, the
    /// connection is closed, and not before the deadline.
    #[tokio::test]
    async fn an_http2_connection_is_closed_once_idle_for_the_header_deadline() {
        let limits = Limits {
            header_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        let address = serve_one(&limits, limits.header_timeout * 3).await;
        let (mut sender, closed) = client(address).await;
        let response = sender
            .send_request(request("/slow"))
            .await
            .expect("an answer");
        assert_eq!(response.status(), 200, "a long request is not cut");
        let answered = tokio::time::Instant::now();
        let closed = tokio::time::timeout(Duration::from_secs(10), closed)
            .await
            .expect("the idle connection closed")
            .expect("the client's connection task");
        let idle = closed.duration_since(answered);
        assert!(
            idle >= limits.header_timeout.mul_f64(0.9),
            "closed {idle:?} after its last answer, before the {:?} deadline",
            limits.header_timeout
        );
    }

    /// An attacker's way to pin a connection: start a request that takes long and reset its
    /// stream. The request no longer counts as in flight, so the idle deadline still closes
    /// the connection.
    #[tokio::test]
    async fn a_reset_stream_does_not_keep_an_http2_connection_open() {
        let limits = Limits {
            header_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        let address = serve_one(&limits, Duration::from_secs(3600)).await;
        let (mut sender, closed) = client(address).await;
        // Dropping the unanswered request resets its stream.
        let pending = tokio::time::timeout(
            limits.header_timeout,
            sender.send_request(request("/forever")),
        );
        assert!(pending.await.is_err(), "the request is still unanswered");
        let reset = tokio::time::Instant::now();
        let closed = tokio::time::timeout(Duration::from_secs(10), closed)
            .await
            .expect("the connection closed though a request was started on it")
            .expect("the client's connection task");
        assert!(
            closed.duration_since(reset) >= limits.header_timeout.mul_f64(0.9),
            "closed before the idle deadline"
        );
    }

    /// A client that never sends HTTP/2's preface holds the connection no longer than the
    /// idle deadline and the time given to what is open.
    #[tokio::test]
    async fn an_http2_connection_without_a_preface_is_closed() {
        use tokio::io::AsyncReadExt;

        let limits = Limits {
            header_timeout: Duration::from_millis(300),
            request_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        let address = serve_one(&limits, Duration::ZERO).await;
        let mut stream = TcpStream::connect(address).await.expect("connect");
        let connected = tokio::time::Instant::now();
        let mut sink = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut sink))
            .await
            .expect("the server closed the silent connection")
            .expect("reading until the close");
        assert!(
            connected.elapsed() >= limits.header_timeout.mul_f64(0.9),
            "closed before the idle deadline"
        );
    }
}
