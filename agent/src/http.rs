//! A small plain-HTTP client for the node-local endpoints the detectors talk to (the kubelet's
//! healthz, the instance metadata service). Callers bound each request with a timeout.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::{Method, Request, StatusCode};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};

/// Replies larger than this are refused rather than read into memory.
const MAX_BODY: usize = 64 * 1024;

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
    let mut builder = Request::builder().method(method.clone()).uri(url);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let request = builder
        .body(Empty::<Bytes>::new())
        .map_err(|source| HttpError::Url {
            url: url.to_owned(),
            source,
        })?;
    let client = Client::builder(TokioExecutor::new()).build_http();
    let response = client
        .request(request)
        .await
        .map_err(|e| HttpError::Transport {
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
