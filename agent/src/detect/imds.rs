//! The EC2-compatible instance metadata service (AWS, OpenStack) as the cloud detectors read
//! it: an IMDSv2 session token when the service offers one, plain IMDSv1 reads otherwise.

use hyper::{Method, StatusCode};

use crate::http;

pub const TOKEN_PATH: &str = "/latest/api/token";
const TOKEN_TTL_HEADER: &str = "X-aws-ec2-metadata-token-ttl-seconds";
const TOKEN_HEADER: &str = "X-aws-ec2-metadata-token";

/// What the metadata service answered for one path.
#[derive(Debug)]
pub enum Answer {
    Reply {
        status: StatusCode,
        body: bytes::Bytes,
    },
    Failed(String),
}

/// Reads from one metadata service, with the session token it gave (if any).
pub struct Session {
    base: String,
    token: Option<String>,
}

impl Session {
    /// Asks `base_url` for an IMDSv2 session token. Services without it (OpenStack,
    /// IMDSv1-only) answer 404/405 or nothing useful; then reads go without a token.
    pub async fn open(base_url: &str) -> Self {
        let base = base_url.trim_end_matches('/').to_owned();
        let token = match http::request(
            Method::PUT,
            &format!("{base}{TOKEN_PATH}"),
            &[(TOKEN_TTL_HEADER, "60")],
        )
        .await
        {
            Ok(reply) if reply.status == StatusCode::OK => String::from_utf8(reply.body.to_vec())
                .ok()
                .map(|t| t.trim().to_owned())
                .filter(|t| {
                    !t.is_empty() && t.len() <= 4096 && t.chars().all(|c| c.is_ascii_graphic())
                }),
            _ => None,
        };
        Self { base, token }
    }

    /// The full URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// GETs `path`.
    pub async fn get(&self, path: &str) -> Answer {
        let headers: Vec<(&str, &str)> = self
            .token
            .as_deref()
            .map(|t| (TOKEN_HEADER, t))
            .into_iter()
            .collect();
        match http::request(Method::GET, &self.url(path), &headers).await {
            Ok(reply) => Answer::Reply {
                status: reply.status,
                body: reply.body,
            },
            Err(e) => Answer::Failed(e.to_string()),
        }
    }
}
