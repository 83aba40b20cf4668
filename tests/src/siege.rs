//! A neighbour holding many connections to a listener without finishing a request: each sends
//! `opening` (e.g. half of a request's headers, or nothing at all, which stalls a TLS
//! handshake) and then waits for the server to close it. What the server did with each: closed
//! at once (over its limits), or held and closed later (its deadline), or still held.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use nix::sys::resource::{Resource, getrlimit, setrlimit};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpSocket,
};

/// Connections opened from one address and what became of them.
pub struct Siege {
    /// When the server closed each connection, after it was opened; `None` while held.
    closed: Arc<Mutex<Vec<Option<Duration>>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Siege {
    /// Opens `count` connections from `from` (an address of this machine, e.g. 127.0.0.2) to
    /// `target`, each sending `opening` and then nothing.
    pub async fn start(
        from: std::net::IpAddr,
        target: SocketAddr,
        count: usize,
        opening: &'static [u8],
    ) -> anyhow::Result<Self> {
        // Each connection is a descriptor here too: the soft limit (often 1,024) up to the hard.
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
        let closed = Arc::new(Mutex::new(vec![None; count]));
        let mut tasks = Vec::with_capacity(count);
        for index in 0..count {
            let socket = TcpSocket::new_v4()?;
            socket.bind(SocketAddr::new(from, 0))?;
            let mut stream = socket.connect(target).await?;
            let opened = Instant::now();
            let closed = closed.clone();
            tasks.push(tokio::spawn(async move {
                let _ = stream.write_all(opening).await;
                let mut buffer = [0u8; 1024];
                // Until the server closes it: end of stream, or a reset.
                while let Ok(n) = stream.read(&mut buffer).await {
                    if n == 0 {
                        break;
                    }
                }
                if let Ok(mut closed) = closed.lock() {
                    closed[index] = Some(opened.elapsed());
                }
            }));
        }
        Ok(Self { closed, tasks })
    }

    /// How long each connection lasted, for those the server closed.
    pub fn closed(&self) -> Vec<Duration> {
        self.closed
            .lock()
            .map(|c| c.iter().flatten().copied().collect())
            .unwrap_or_default()
    }

    /// Connections the server still holds.
    pub fn held(&self) -> usize {
        self.closed
            .lock()
            .map(|c| c.iter().filter(|c| c.is_none()).count())
            .unwrap_or(0)
    }

    /// Waits until the server holds at most `count` connections; the number it holds then.
    pub async fn until_held_at_most(
        &self,
        count: usize,
        timeout: Duration,
    ) -> anyhow::Result<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            let held = self.held();
            if held <= count {
                return Ok(held);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the server still holds {held} connections after {timeout:?} (waited for at most {count})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Siege {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}
