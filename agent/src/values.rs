//! Reading and checking the configuration file's values, the same way in every section:
//! durations written like `30s`, `5m`, `1h30m`, CamelCase names, http(s) URLs. Each check's
//! error names the field's place and the fix.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// Reads a Go-style duration string (`30s`, `5m`, `1h30m`).
pub fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    nodeward_api::Duration::parse(text)
        .and_then(|d| d.to_std())
        .map_err(serde::de::Error::custom)
}

pub fn optional_duration<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    duration(deserializer).map(Some)
}

/// A condition type the kubelet, the network plugin or the coordinator owns is not the agent's
/// to write (and the chart's admission policy would refuse it).
pub fn not_owned_by_others(place: &str, condition: &str) -> Result<(), String> {
    if nodeward_api::conditions::node::OWNED_BY_OTHERS.contains(&condition) {
        return Err(format!(
            "{place}: {condition:?} is written by the kubelet, the network plugin or the coordinator; \
             name the agent's own condition, e.g. NTPProblem"
        ));
    }
    Ok(())
}

pub fn is_camel_case(value: &str) -> bool {
    value.chars().next().is_some_and(|c| c.is_ascii_uppercase())
        && value.chars().all(|c| c.is_ascii_alphanumeric())
}

/// `value` at `place` is CamelCase, else an error showing `example`.
pub fn camel_case(place: &str, value: &str, example: &str) -> Result<(), String> {
    if is_camel_case(value) {
        Ok(())
    } else {
        Err(format!(
            "{place}: {value:?} must be CamelCase, e.g. {example}"
        ))
    }
}

/// `url` at `place` is an http:// or https:// URL.
pub fn http_url(place: &str, url: &str) -> Result<(), String> {
    if url.starts_with("http://") || url.starts_with("https://") {
        Ok(())
    } else {
        Err(format!(
            "{place}: {url:?} is not an http:// or https:// URL"
        ))
    }
}
