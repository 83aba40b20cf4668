//! `/healthz`, `/readyz` and `/metrics` over HTTP.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    Request, Response, StatusCode, body::Incoming, header::CONTENT_TYPE, service::service_fn,
};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::{
    Error,
    listener::{self, Limits},
};

/// Whether the daemon is ready: each gate given at the start must be passed. `/readyz` names
/// the gates still closed.
#[derive(Debug)]
pub struct Readiness {
    closed: Mutex<Vec<&'static str>>,
}

impl Readiness {
    /// Each gate completes "not ready: ...", e.g. "the watches have not synced yet".
    pub fn new(gates: &[&'static str]) -> Self {
        Self {
            closed: Mutex::new(gates.to_vec()),
        }
    }

    /// Adds `gate` to what readiness waits for.
    pub fn close(&self, gate: &'static str) {
        if let Ok(mut closed) = self.closed.lock()
            && !closed.contains(&gate)
        {
            closed.push(gate);
        }
    }

    /// Opens `gate` (it no longer holds readiness back).
    pub fn pass(&self, gate: &'static str) {
        if let Ok(mut closed) = self.closed.lock() {
            closed.retain(|g| *g != gate);
        }
    }

    /// Whether `gate` has been passed (or was never closed).
    pub fn passed(&self, gate: &'static str) -> bool {
        self.closed
            .lock()
            .map(|c| !c.contains(&gate))
            .unwrap_or(false)
    }

    pub fn is_ready(&self) -> bool {
        self.closed.lock().map(|c| c.is_empty()).unwrap_or(false)
    }

    /// What readiness waits for, `; `-separated.
    pub fn waiting_for(&self) -> String {
        self.closed
            .lock()
            .map(|c| c.join("; "))
            .unwrap_or_else(|_| "a poisoned lock".to_owned())
    }
}

/// Renders the metrics in the OpenMetrics text format.
pub type Encode = Arc<dyn Fn() -> String + Send + Sync>;

/// Binds `address` and serves until the task is dropped, within `limits`. Returns the bound
/// address (useful with port 0).
pub async fn serve(
    address: SocketAddr,
    metrics: Encode,
    readiness: Arc<Readiness>,
    limits: Limits,
) -> Result<(SocketAddr, impl Future<Output = ()>), Error> {
    let listener = TcpListener::bind(address)
        .await
        .map_err(|e| Error::Serve(format!("binding {address}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::Serve(e.to_string()))?;
    let http = limits.http1();
    let serving = listener::accept(listener, limits, move |stream, _| {
        let metrics = metrics.clone();
        let readiness = readiness.clone();
        let service = service_fn(move |request: Request<Incoming>| {
            let response = route(request.uri().path(), &metrics, &readiness);
            async move { Ok::<_, Infallible>(response) }
        });
        let connection = http.serve_connection(TokioIo::new(stream), service);
        async move {
            let _ = connection.await;
        }
    });
    Ok((bound, serving))
}

/// [`serve`]s `address` with the default [`Limits`] as a task of `tasks`; returns the bound
/// address.
pub async fn spawn(
    address: SocketAddr,
    metrics: Encode,
    readiness: Arc<Readiness>,
    tasks: &mut tokio::task::JoinSet<()>,
) -> Result<SocketAddr, Error> {
    let (bound, serving) = serve(address, metrics, readiness, Limits::default()).await?;
    tracing::info!(address = %bound, "serving /healthz, /readyz and /metrics");
    tasks.spawn(serving);
    Ok(bound)
}

fn route(path: &str, metrics: &Encode, readiness: &Readiness) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match path {
        "/healthz" => (StatusCode::OK, "text/plain", "ok".to_owned()),
        "/readyz" if readiness.is_ready() => (StatusCode::OK, "text/plain", "ok".to_owned()),
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            format!("not ready: {}", readiness.waiting_for()),
        ),
        "/metrics" => (
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found; try /healthz, /readyz or /metrics".to_owned(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response.headers_mut().insert(CONTENT_TYPE, value);
    }
    response
}
