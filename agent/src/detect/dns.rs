//! DNS: each configured name must resolve through the node's resolver.

use std::time::Duration;

use futures::future::join_all;
use nodeward_api::conditions::node::NETWORK_PROBLEM;
use serde::Deserialize;

use super::{Finding, Status};

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct DnsConfig {
    /// Names that must resolve through the node's resolver; none means no DNS check.
    pub names: Vec<String>,
}

pub const DETECTOR: &str = "dns";

/// Resolves every name concurrently, each bounded by `timeout`.
pub async fn observe(names: &[String], timeout: Duration) -> Finding {
    let lookups = names.iter().map(|name| async move {
        let result =
            tokio::time::timeout(timeout, tokio::net::lookup_host((name.as_str(), 0))).await;
        let outcome = match result {
            Err(_) => Err(format!("timed out after {timeout:?}")),
            Ok(Err(e)) => Err(e.to_string()),
            Ok(Ok(mut addresses)) => addresses
                .next()
                .map(|a| a.ip())
                .ok_or_else(|| "no addresses".to_owned()),
        };
        (name.as_str(), outcome)
    });
    evaluate(&join_all(lookups).await)
}

pub fn evaluate(results: &[(&str, Result<std::net::IpAddr, String>)]) -> Finding {
    let failed: Vec<String> = results
        .iter()
        .filter_map(|(name, r)| r.as_ref().err().map(|e| format!("{name}: {e}")))
        .collect();
    let (status, reason, message) = if failed.is_empty() {
        let resolved: Vec<String> = results
            .iter()
            .filter_map(|(name, r)| r.as_ref().ok().map(|ip| format!("{name} -> {ip}")))
            .collect();
        (Status::Ok, "DNSResolves", resolved.join(", "))
    } else {
        let failures = failed.join("; ");
        (
            Status::Problem,
            "DNSFailure",
            format!("cannot resolve {failures}"),
        )
    };
    Finding::new(DETECTOR, NETWORK_PROBLEM, status, reason, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn localhost_resolves_and_an_invalid_name_fails() {
        let ok = observe(&["localhost".to_owned()], Duration::from_secs(5)).await;
        assert_eq!(ok.status, Status::Ok, "{ok:?}");
        let bad = observe(
            &["localhost".to_owned(), "no-such-host.invalid".to_owned()],
            Duration::from_secs(5),
        )
        .await;
        bad.assert_is(Status::Problem, "DNSFailure");
        assert!(
            bad.message
                .starts_with("cannot resolve no-such-host.invalid: "),
            "{}",
            bad.message
        );
    }
}
