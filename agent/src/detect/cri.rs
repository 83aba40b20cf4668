//! The container runtime's CRI socket, asked what the kubelet asks: `RuntimeService/Status`
//! (gRPC over HTTP/2 on a unix socket), whose conditions say whether the runtime and its
//! network are ready, and `RuntimeService/Version`, which names it.

use std::path::Path;

use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::{Request, Uri};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;

/// `runtime.v1.VersionResponse`, the fields read.
#[derive(Clone, PartialEq, Message)]
pub struct VersionResponse {
    #[prost(string, tag = "2")]
    pub runtime_name: String,
    #[prost(string, tag = "3")]
    pub runtime_version: String,
}

/// `runtime.v1.StatusResponse`, the fields read.
#[derive(Clone, PartialEq, Message)]
pub struct StatusResponse {
    #[prost(message, optional, tag = "1")]
    pub status: Option<RuntimeStatus>,
}

#[derive(Clone, PartialEq, Message)]
pub struct RuntimeStatus {
    #[prost(message, repeated, tag = "1")]
    pub conditions: Vec<RuntimeCondition>,
}

/// `runtime.v1.RuntimeCondition`: `RuntimeReady` or `NetworkReady`.
#[derive(Clone, PartialEq, Message)]
pub struct RuntimeCondition {
    #[prost(string, tag = "1")]
    pub r#type: String,
    #[prost(bool, tag = "2")]
    pub status: bool,
    #[prost(string, tag = "3")]
    pub reason: String,
    #[prost(string, tag = "4")]
    pub message: String,
}

/// The answers of one runtime.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub version: VersionResponse,
    pub conditions: Vec<RuntimeCondition>,
}

/// Longest answer read: a Status answer with its `info` is a few KiB.
const MAX_ANSWER: usize = 256 * 1024;

/// Asks the runtime at `socket` for its version and status (empty requests: not verbose).
pub async fn ask(socket: &Path) -> Result<Answer, String> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| format!("connecting to {}: {e}", socket.display()))?;
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP/2 with {}: {e}", socket.display()))?;
    let driver = tokio::spawn(connection);
    let mut call = async |method: &str| -> Result<Bytes, String> {
        let request = Request::post(
            Uri::from_maybe_shared(format!(
                "http://localhost/runtime.v1.RuntimeService/{method}"
            ))
            .map_err(|e| e.to_string())?,
        )
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(frame(&[])))
        .map_err(|e| e.to_string())?;
        let reply = sender
            .send_request(request)
            .await
            .map_err(|e| format!("{method}: {e}"))?;
        let (head, body) = reply.into_parts();
        if let Some(status) = grpc_error(&head.headers) {
            return Err(format!("{method}: {status}"));
        }
        let body = http_body_util::Limited::new(body, MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| format!("{method}: reading the answer: {e}"))?;
        if let Some(status) = body.trailers().and_then(grpc_error) {
            return Err(format!("{method}: {status}"));
        }
        message(body.to_bytes()).map_err(|e| format!("{method}: {e}"))
    };
    let version = VersionResponse::decode(call("Version").await?)
        .map_err(|e| format!("Version: not a CRI answer: {e}"))?;
    let status = StatusResponse::decode(call("Status").await?)
        .map_err(|e| format!("Status: not a CRI answer: {e}"))?;
    driver.abort();
    Ok(Answer {
        version,
        conditions: status.status.unwrap_or_default().conditions,
    })
}

/// A gRPC message frame: uncompressed, its length, the message.
fn frame(message: &[u8]) -> Bytes {
    let mut framed = BytesMut::with_capacity(5 + message.len());
    framed.put_u8(0);
    framed.put_u32(message.len() as u32);
    framed.put_slice(message);
    framed.freeze()
}

/// The one message of a unary answer's frames.
fn message(mut body: Bytes) -> Result<Bytes, String> {
    if body.len() < 5 {
        return Err(format!(
            "an answer of {} bytes is no gRPC frame",
            body.len()
        ));
    }
    if body[0] != 0 {
        return Err("a compressed answer, though none was asked for".to_owned());
    }
    let length = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if body.len() < 5 + length {
        return Err(format!(
            "the frame says {length} bytes, {} came",
            body.len() - 5
        ));
    }
    let _ = body.split_to(5);
    Ok(body.split_to(length))
}

/// A non-zero `grpc-status` with its message.
fn grpc_error(headers: &hyper::HeaderMap) -> Option<String> {
    let status = headers.get("grpc-status")?.to_str().ok()?;
    (status != "0").then(|| {
        let message = headers
            .get("grpc-message")
            .and_then(|m| m.to_str().ok())
            .unwrap_or_default();
        format!("gRPC status {status} {message}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_carry_their_length_and_an_answer_is_read_back() {
        let answer = VersionResponse {
            runtime_name: "containerd".into(),
            runtime_version: "v1.7.24".into(),
        };
        let framed = frame(&answer.encode_to_vec());
        assert_eq!(framed[0], 0);
        assert_eq!(
            u32::from_be_bytes([framed[1], framed[2], framed[3], framed[4]]) as usize,
            framed.len() - 5
        );
        let read = VersionResponse::decode(message(framed).expect("a frame")).expect("decoded");
        assert_eq!(read, answer);
        assert!(message(Bytes::from_static(&[0, 0, 0, 9, 1])).is_err());
        assert!(message(Bytes::from_static(&[1, 0, 0, 0, 0])).is_err());
    }

    #[tokio::test]
    async fn no_runtime_at_the_socket_is_said_so() {
        let err = ask(Path::new("/nonexistent/containerd.sock"))
            .await
            .expect_err("nothing listens there");
        assert!(
            err.starts_with("connecting to /nonexistent/containerd.sock"),
            "{err}"
        );
    }
}
