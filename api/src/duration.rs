//! Durations as they appear in the API: Go-style strings such as `90s`, `10m` or `1h30m`.
//!
//! The string is kept as written so that a server-side apply of an unchanged object never
//! shows a diff; callers convert with [`Duration::to_std`].

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// The pattern the API server enforces: one or more integer-and-unit pairs.
pub const DURATION_PATTERN: &str = r"^([0-9]+(ms|s|m|h))+$";

/// A Go-style duration string (`500ms`, `30s`, `10m`, `1h30m`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
#[serde(transparent)]
pub struct Duration(String);

/// Why a duration string could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a duration: {why}; write it like 90s, 10m or 1h30m")]
pub struct InvalidDuration {
    pub value: String,
    pub why: &'static str,
}

impl Duration {
    /// Builds a duration from a string, checking it as the API server would.
    pub fn parse(value: impl Into<String>) -> Result<Self, InvalidDuration> {
        let value = value.into();
        parse_go_duration(&value)?;
        Ok(Self(value))
    }

    /// A duration of whole seconds, written the short way (`90s`).
    pub fn from_secs(secs: u64) -> Self {
        Self(format!("{secs}s"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The value as a `std::time::Duration`.
    pub fn to_std(&self) -> Result<std::time::Duration, InvalidDuration> {
        parse_go_duration(&self.0)
    }
}

impl std::fmt::Display for Duration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn parse_go_duration(value: &str) -> Result<std::time::Duration, InvalidDuration> {
    let invalid = |why| InvalidDuration {
        value: value.to_owned(),
        why,
    };
    if value.is_empty() {
        return Err(invalid("it is empty"));
    }
    let mut total = std::time::Duration::ZERO;
    let mut rest = value;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(invalid("each unit needs a whole number before it"));
        }
        let number: u64 = rest[..digits]
            .parse()
            .map_err(|_| invalid("a number is too large"))?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (std::time::Duration::from_millis(1), 2)
        } else if rest.starts_with('s') {
            (std::time::Duration::from_secs(1), 1)
        } else if rest.starts_with('m') {
            (std::time::Duration::from_secs(60), 1)
        } else if rest.starts_with('h') {
            (std::time::Duration::from_secs(3600), 1)
        } else {
            return Err(invalid("the unit must be one of ms, s, m, h"));
        };
        rest = &rest[len..];
        let part = u32::try_from(number)
            .ok()
            .and_then(|n| unit.checked_mul(n))
            .ok_or_else(|| invalid("it is too long"))?;
        total = total
            .checked_add(part)
            .ok_or_else(|| invalid("it is too long"))?;
    }
    Ok(total)
}

impl JsonSchema for Duration {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": DURATION_PATTERN,
            "maxLength": 32,
            "description": "A duration such as 90s, 10m or 1h30m (units: ms, s, m, h)."
        })
    }

    fn inline_schema() -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_compound_go_durations() {
        let d = Duration::parse("1h30m15s").expect("valid");
        assert_eq!(d.to_std(), Ok(std::time::Duration::from_secs(5415)));
        assert_eq!(
            Duration::parse("250ms").and_then(|d| d.to_std()),
            Ok(std::time::Duration::from_millis(250))
        );
        assert_eq!(Duration::from_secs(90).as_str(), "90s");
    }

    #[test]
    fn refuses_what_the_api_server_refuses() {
        for bad in ["", "10", "m", "1.5h", "10d", "-1s", "1h 30m"] {
            let err = Duration::parse(bad).expect_err(bad);
            assert!(err.to_string().contains("write it like"), "{err}");
        }
    }

    #[test]
    fn refuses_overflow_instead_of_wrapping() {
        let err = Duration::parse("99999999999999999999h").expect_err("overflow");
        assert!(err.why.contains("too"), "{err}");
    }
}
