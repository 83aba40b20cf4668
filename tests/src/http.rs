//! A small HTTP endpoint for the services nodeward talks to that cannot run here: the
//! Prometheus HTTP API (`GET /api/v1/alerts`, answered with the replies a test sets) and
//! notification webhooks (records every request). It speaks plain HTTP/1.1 through hyper.

use std::{
    collections::HashMap,
    convert::Infallible,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;

/// One request as received.
#[derive(Clone, Debug)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub content_type: Option<String>,
    pub body: String,
}

#[derive(Default)]
struct State {
    /// Per path: the status, the body and how long to hold the answer.
    replies: HashMap<String, (u16, String, Duration)>,
    received: Vec<Received>,
}

/// Serves until dropped; `url` is its base URL.
pub struct Endpoint {
    pub url: String,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Endpoint {
    pub async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = shared.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request| answer(state.clone(), request));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { url, state, task })
    }

    /// Answers requests for `path` with `status` and `body` from now on (404 until set).
    pub fn reply(&self, path: &str, status: u16, body: &str) {
        self.reply_after(path, status, body, Duration::ZERO);
    }

    /// As [`Endpoint::reply`], each answer held for `delay` after the request is recorded (a
    /// slow server: what a client does while its request is on its way).
    pub fn reply_after(&self, path: &str, status: u16, body: &str, delay: Duration) {
        self.lock()
            .replies
            .insert(path.to_owned(), (status, body.to_owned(), delay));
    }

    /// Every request received so far, oldest first.
    pub fn received(&self) -> Vec<Received> {
        self.lock().received.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    state: Arc<Mutex<State>>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = request.method().to_string();
    let path = request.uri().path().to_owned();
    let content_type = request
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let body = match request.into_body().collect().await {
        Ok(collected) => String::from_utf8_lossy(&collected.to_bytes()).into_owned(),
        Err(_) => String::new(),
    };
    let (status, body, delay) = {
        let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
        state.received.push(Received {
            method,
            path: path.clone(),
            content_type,
            body,
        });
        state
            .replies
            .get(&path)
            .cloned()
            .unwrap_or((404, "not found".to_owned(), Duration::ZERO))
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() =
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    Ok(response)
}
