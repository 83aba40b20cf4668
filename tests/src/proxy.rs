//! A TCP forwarder to put between a component and the API server, with a switch that cuts
//! every connection (and refuses new ones) to simulate an outage or a partition.

use std::net::SocketAddr;

use tokio::{net::TcpListener, sync::watch};

/// Forwards connections from its address to a target until dropped.
pub struct Proxy {
    pub address: SocketAddr,
    up: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on `listen` (port 0 for any) and forwards to `target`.
    pub async fn start(listen: SocketAddr, target: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind(listen).await?;
        let address = listener.local_addr()?;
        let (up, up_rx) = watch::channel(true);
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                let mut up = up_rx.clone();
                if !*up.borrow() {
                    continue; // dropped: the connection is refused
                }
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = up.wait_for(|up| !*up) => {}
                    }
                });
            }
        });
        Ok(Self { address, up, task })
    }

    /// Cuts every open connection and refuses new ones until [`Proxy::restore`].
    pub fn cut(&self) {
        let _ = self.up.send(false);
    }

    pub fn restore(&self) {
        let _ = self.up.send(true);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The API server's loopback address, read from the admin kubeconfig.
pub fn api_server_address() -> anyhow::Result<SocketAddr> {
    let admin = std::fs::read_to_string(&crate::controlplane::shared().kubeconfig)?;
    let port: u16 = admin
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: https://127.0.0.1:"))
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("the admin kubeconfig names no loopback API server"))?;
    Ok(SocketAddr::from(([127, 0, 0, 1], port)))
}

/// A kubeconfig with the admin credentials that reaches the API server at `address` (through
/// a proxy); the server certificate is checked against `localhost`, one of its names.
pub fn admin_kubeconfig_via(address: SocketAddr) -> String {
    let pki = crate::controlplane::shared().state_dir.join("pki");
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: https://{address}\n    tls-server-name: localhost\n    certificate-authority: {}\nusers:\n- name: t\n  user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: t\n  context: {{cluster: t, user: t}}\ncurrent-context: t\n",
        pki.join("ca.crt").display(),
        pki.join("admin.crt").display(),
        pki.join("admin.key").display(),
    )
}
