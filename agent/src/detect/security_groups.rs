//! Security groups: the groups this node must be a member of, against what the EC2-compatible
//! instance metadata service (AWS, OpenStack) says.

use std::{collections::BTreeSet, time::Duration};

use hyper::StatusCode;
use nodeward_api::conditions::node::SECURITY_GROUP_PROBLEM;

pub use super::imds::Answer;
use super::{AgentContext, Detector, Finding, Section, Status, imds::Session};
use crate::flags::{self, Flag};

super::section! {
    pub struct SecurityGroupsConfig {
        /// Security groups this node must be a member of; none turns the check off.
        pub expected: Vec<String>,
        /// Base URL of the EC2-compatible instance metadata service (AWS, OpenStack).
        #[serde(rename = "metadataURL")]
        pub metadata_url: String,
    }
}

impl Default for SecurityGroupsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            expected: Vec::new(),
            metadata_url: "http://169.254.169.254".to_owned(),
            interval: Duration::from_secs(300),
            timeout: Duration::from_secs(5),
            hold: Duration::ZERO,
        }
    }
}

impl Section for SecurityGroupsConfig {
    fn validate(&self, place: &str) -> Result<(), String> {
        self.schedule().validate(place)?;
        crate::values::http_url(&format!("{place}.metadataURL"), &self.metadata_url)
    }

    fn detectors(&self, _: Option<&AgentContext>) -> Vec<Detector> {
        // Nothing expected: nothing to compare against, so the detector is off.
        if self.expected.is_empty() {
            return Vec::new();
        }
        self.detector(DETECTOR, SECURITY_GROUP_PROBLEM, |c| async move {
            observe(&c).await
        })
    }

    fn flags(&self) -> Vec<Flag> {
        flags::declare! {
            "metadata-url" ("NODEWARD_METADATA_URL") => "metadataURL": Text, "Instance metadata service base URL";
            "expected-security-groups" ("NODEWARD_EXPECTED_SECURITY_GROUPS") => "expected": List, "Security groups the node must be in, comma-separated";
        }
    }
}

pub const DETECTOR: &str = "security-groups";
pub const GROUPS_PATH: &str = "/latest/meta-data/security-groups";

pub async fn observe(config: &SecurityGroupsConfig) -> Finding {
    let session = Session::open(&config.metadata_url).await;
    let answer = session.get(GROUPS_PATH).await;
    evaluate(&config.expected, &session.url(GROUPS_PATH), answer)
}

/// Parses the reply: one group name per line. Anything that is not a plain list of names
/// (HTML error pages, binary, control characters) is refused.
pub fn parse_groups(body: &[u8]) -> Result<BTreeSet<String>, String> {
    let text = std::str::from_utf8(body).map_err(|_| "the reply is not UTF-8 text".to_owned())?;
    let mut groups = BTreeSet::new();
    for (index, line) in text.lines().enumerate() {
        let name = line.trim();
        if name.is_empty() {
            continue;
        }
        let plausible = name.len() <= 255
            && !name.contains(['<', '>', '"', '{', '}'])
            && !name.chars().any(char::is_control);
        if !plausible {
            return Err(format!(
                "line {} is not a security group name: {:?}",
                index + 1,
                nodeward_api::bounds::cut(name, 60)
            ));
        }
        groups.insert(name.to_owned());
    }
    Ok(groups)
}

pub fn evaluate(expected: &[String], url: &str, answer: Answer) -> Finding {
    let unknown = |reason: &str, message: String| {
        Finding::unknown(DETECTOR, SECURITY_GROUP_PROBLEM, reason, message)
    };
    let groups = match answer {
        Answer::Failed(e) => {
            return unknown(
                "MetadataUnreachable",
                format!("cannot reach the instance metadata service: {e}"),
            );
        }
        Answer::Reply { status, .. } if status != StatusCode::OK => {
            return unknown("MetadataError", format!("GET {url} answered {status}"));
        }
        Answer::Reply { body, .. } => match parse_groups(&body) {
            Ok(groups) => groups,
            Err(e) => {
                return unknown(
                    "MetadataMalformed",
                    format!("GET {url}: malformed reply: {e}"),
                );
            }
        },
    };
    let missing: Vec<&str> = expected
        .iter()
        .filter(|g| !groups.contains(*g))
        .map(String::as_str)
        .collect();
    let members: Vec<&str> = groups.iter().map(String::as_str).collect();
    let members = match members.as_slice() {
        [] => "none".to_owned(),
        some => some.join(", "),
    };
    let (status, reason, message) = match missing.as_slice() {
        [] => (
            Status::Ok,
            "SecurityGroupsPresent",
            format!("member of {members}"),
        ),
        absent => (
            Status::Problem,
            "SecurityGroupMissing",
            format!(
                "not a member of {} (member of: {members})",
                absent.join(", ")
            ),
        ),
    };
    Finding::new(DETECTOR, SECURITY_GROUP_PROBLEM, status, reason, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: u16, body: &str) -> Answer {
        Answer::Reply {
            status: StatusCode::from_u16(status).expect("status"),
            body: bytes::Bytes::from(body.to_owned()),
        }
    }

    fn expected(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn missing_groups_are_named() {
        let found = evaluate(
            &expected(&["k8s-nodes", "ssh"]),
            "u",
            reply(200, "default\nk8s-nodes\n"),
        );
        found.assert_is(Status::Problem, "SecurityGroupMissing");
        assert_eq!(
            found.message,
            "not a member of ssh (member of: default, k8s-nodes)"
        );
        let ok = evaluate(&expected(&["k8s-nodes"]), "u", reply(200, "k8s-nodes\n"));
        assert_eq!(ok.status, Status::Ok);
    }

    #[test]
    fn errors_and_malformed_replies_are_unknown_with_the_cause() {
        let e = evaluate(&expected(&["a"]), "http://x/g", reply(500, "boom"));
        e.assert_is(Status::Unknown, "MetadataError");
        assert!(e.message.contains("500"), "{}", e.message);
        let html = evaluate(
            &expected(&["a"]),
            "u",
            reply(200, "<html><body>Login</body></html>"),
        );
        html.assert_is(Status::Unknown, "MetadataMalformed");
        let binary = Answer::Reply {
            status: StatusCode::OK,
            body: bytes::Bytes::from_static(&[0xff, 0xfe, 0x00]),
        };
        assert!(
            evaluate(&expected(&["a"]), "u", binary)
                .message
                .contains("not UTF-8")
        );
        let down = evaluate(
            &expected(&["a"]),
            "u",
            Answer::Failed("connection refused".into()),
        );
        down.assert_is(Status::Unknown, "MetadataUnreachable");
    }
}
