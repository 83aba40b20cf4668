//! A small HTTP(S) client for the endpoints beside the API server: the kubelet's healthz and
//! the instance metadata service (agent), notification webhooks (agent), the Prometheus API
//! (coordinator). HTTPS verifies against the system's trust store. Callers bound each request
//! with a timeout.

use std::sync::OnceLock;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, StatusCode};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};

/// Replies larger than this are refused rather than read into memory.
const MAX_BODY: usize = 4 * 1024 * 1024;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("invalid URL {url:?}: {source}")]
    Url {
        url: String,
        source: hyper::http::Error,
    },
    #[error("{method} {url}: {message}")]
    Transport {
        method: Method,
        url: String,
        message: String,
    },
    #[error("{method} {url}: reply larger than {MAX_BODY} bytes or cut off: {message}")]
    Body {
        method: Method,
        url: String,
        message: String,
    },
}

/// The status and body of a reply.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub body: Bytes,
}

/// Sends one request with an empty body and reads the whole reply.
pub async fn request(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
) -> Result<Reply, HttpError> {
    send(method, url, headers, Bytes::new()).await
}

/// Sends one request with `body` and reads the whole reply.
pub async fn send(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Result<Reply, HttpError> {
    let mut builder = Request::builder().method(method.clone()).uri(url);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let request = builder
        .body(Full::new(body))
        .map_err(|source| HttpError::Url {
            url: url.to_owned(),
            source,
        })?;
    let sent = if request.uri().scheme_str() == Some("https") {
        let client = https_client().map_err(|message| HttpError::Transport {
            method: method.clone(),
            url: url.to_owned(),
            message,
        })?;
        client.request(request).await
    } else {
        http_client().request(request).await
    };
    let response = sent.map_err(|e| HttpError::Transport {
        method: method.clone(),
        url: url.to_owned(),
        message: error_chain(&e),
    })?;
    let status = response.status();
    let body = Limited::new(response.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| HttpError::Body {
            method,
            url: url.to_owned(),
            message: e.to_string(),
        })?
        .to_bytes();
    Ok(Reply { status, body })
}

type HttpsClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// The plain-HTTP client (node-local endpoints): no trust store to load.
fn http_client() -> &'static Client<HttpConnector, Full<Bytes>> {
    static CLIENT: OnceLock<Client<HttpConnector, Full<Bytes>>> = OnceLock::new();
    CLIENT.get_or_init(|| Client::builder(TokioExecutor::new()).build_http())
}

/// The HTTPS client, made on the first HTTPS request: the system's trust store is read once
/// (and only by a process that needs it), connections are pooled.
fn https_client() -> Result<&'static HttpsClient, String> {
    static CLIENT: OnceLock<Result<HttpsClient, String>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            let connector = HttpsConnectorBuilder::new()
                .with_native_roots()
                .map_err(|e| format!("reading the system's trusted certificates: {e}"))?
                .https_only()
                .enable_http1()
                .build();
            Ok(Client::builder(TokioExecutor::new()).build(connector))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// An error with its causes, e.g. "client error (Connect): tcp connect error: Connection refused".
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
