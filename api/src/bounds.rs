//! Schemas with bounds for the Kubernetes types the CRDs embed (label selectors, conditions),
//! whose own schemas have none: every list, map and string of a nodeward object has a size the
//! API server enforces (`api/tests/crds_bounded.rs` checks every field). The limits are
//! Kubernetes' own where it has them (a label key is at most 317 characters, a value 63; a
//! condition's type 316, its reason 1024, its message 32768).

use schemars::{Schema, SchemaGenerator, json_schema};
use serde_json::{Value, json};

/// The longest message a status field holds (the agent and the coordinator cut theirs to it).
pub const MESSAGE_LIMIT: usize = 4096;

/// `text` cut to `max` characters (an ellipsis marks the cut), as a field bounded to `max`
/// takes it.
pub fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// What a remote peer answered (an error page, a reply body), fit to quote in a status or an
/// Event: decoded leniently, every control character (line breaks, escape sequences, NUL)
/// shown as one space, runs of white space as one, cut to `max` characters.
pub fn excerpt(body: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(body);
    let mut out = String::with_capacity(text.len().min(max * 4));
    for c in text.chars() {
        let c = if c.is_control() || c.is_whitespace() {
            ' '
        } else {
            c
        };
        if c == ' ' && (out.is_empty() || out.ends_with(' ')) {
            continue;
        }
        out.push(c);
        if out.len() > max * 4 {
            break;
        }
    }
    cut(out.trim_end(), max)
}

/// The last `limit` bytes of `output` as text, each line's carriage-return progress collapsed
/// to its last state ([`last_states`]), cut at a character boundary (and after a line break
/// when one is near), with `…` in front when something was cut.
pub fn tail(output: &[u8], limit: usize) -> String {
    let text = last_states(&String::from_utf8_lossy(output));
    let text = text.trim_end();
    if text.len() <= limit {
        return text.to_owned();
    }
    let mut start = text.len() - (limit - '…'.len_utf8());
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let kept = &text[start..];
    // A whole first line reads better, when cutting to one loses little.
    let kept = match kept.find('\n') {
        Some(at) if at < 200 => &kept[at + 1..],
        _ => kept,
    };
    format!("…{kept}")
}

/// `text` with each line as a terminal shows it in the end: what follows the line's last
/// carriage return. dpkg's and apt's progress (`(Reading database ... 45%\r… 50%\r…`) would
/// otherwise fill a status's few KiB with states nobody reads.
pub fn last_states(text: &str) -> String {
    text.split('\n')
        .map(|line| {
            let line = line.strip_suffix('\r').unwrap_or(line);
            line.rsplit('\r').next().unwrap_or(line)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Requirements in one label selector; keys in its `matchLabels`.
pub const SELECTOR_TERMS: usize = 32;
/// Values of one `In`/`NotIn` requirement.
pub const SELECTOR_VALUES: usize = 64;
/// Conditions in one status.
pub const CONDITIONS: usize = 16;

fn label_selector() -> Value {
    json!({
        "type": "object",
        "description": "A label selector: matchLabels and matchExpressions, both must match; empty selects everything.",
        "properties": {
            "matchLabels": {
                "type": "object",
                "maxProperties": SELECTOR_TERMS,
                "additionalProperties": {"type": "string", "maxLength": 63},
                "x-kubernetes-validations": [{
                    "rule": "self.all(k, size(k) <= 317)",
                    "message": "a label key is at most 317 characters (prefix/name)"
                }]
            },
            "matchExpressions": {
                "type": "array",
                "maxItems": SELECTOR_TERMS,
                "items": {
                    "type": "object",
                    "required": ["key", "operator"],
                    "properties": {
                        "key": {"type": "string", "maxLength": 317},
                        "operator": {"type": "string", "enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                        "values": {
                            "type": "array",
                            "maxItems": SELECTOR_VALUES,
                            "items": {"type": "string", "maxLength": 63}
                        }
                    }
                }
            }
        },
        "x-kubernetes-map-type": "atomic"
    })
}

fn to_schema(value: Value) -> Schema {
    Schema::try_from(value).unwrap_or_default()
}

/// An optional label selector.
pub fn optional_selector(_: &mut SchemaGenerator) -> Schema {
    let mut selector = label_selector();
    selector["nullable"] = json!(true);
    to_schema(selector)
}

/// Up to 16 label selectors.
pub fn selectors(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": 16,
        "items": label_selector()
    })
}

/// The longest message of a condition (metav1.Condition's own bound).
pub const CONDITION_MESSAGE_LIMIT: usize = 32768;

/// A status's conditions, one per type.
pub fn conditions(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": CONDITIONS,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "required": ["type", "status", "reason", "message", "lastTransitionTime"],
            "properties": {
                "type": {"type": "string", "maxLength": 316},
                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                "reason": {"type": "string", "maxLength": 1024},
                "message": {"type": "string", "maxLength": CONDITION_MESSAGE_LIMIT},
                "lastTransitionTime": {"type": "string", "format": "date-time"},
                "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0}
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carriage_return_progress_collapses_to_each_lines_last_state() {
        let dpkg = b"Preparing to unpack nwdemo_3.0_all.deb ...\r\n(Reading database ... 5%\r(Reading database ... 50%\r(Reading database ... 45123 files and directories currently installed.)\nUnpacking nwdemo (3.0) over (1.0) ...\r\n";
        assert_eq!(
            tail(dpkg, 2048),
            "Preparing to unpack nwdemo_3.0_all.deb ...\n(Reading database ... 45123 files and directories currently installed.)\nUnpacking nwdemo (3.0) over (1.0) ..."
        );
        assert_eq!(last_states("a\rb\rc"), "c");
        assert_eq!(last_states("no progress\nhere"), "no progress\nhere");
        // A line that ends in its progress shows the last state.
        assert_eq!(last_states("10%\r100%\r"), "100%");
    }

    #[test]
    fn a_tail_keeps_the_end_within_its_limit() {
        assert_eq!(tail(b"done\n", 100), "done");
        let long: String = (0..500).map(|i| format!("line {i}\n")).collect();
        let cut = tail(long.as_bytes(), 200);
        assert!(cut.len() <= 200, "{}", cut.len());
        assert!(cut.starts_with("…line "), "{cut}");
        assert!(cut.ends_with("line 499"), "{cut}");
        let wide = "é".repeat(300);
        let cut = tail(wide.as_bytes(), 101);
        assert!(cut.len() <= 101 && cut.starts_with('…'), "{cut}");
    }

    #[test]
    fn an_excerpt_shows_no_control_characters() {
        assert_eq!(
            excerpt(b"  <html>\r\n<body>\x1b[31mred\x00</body>\n", 100),
            "<html> <body> [31mred </body>"
        );
        assert_eq!(excerpt(&[0xff, b'o', b'k'], 10), "\u{fffd}ok");
        assert_eq!(excerpt(b"abcdef", 4), "abc\u{2026}");
        assert_eq!(excerpt(b"\n\t ", 10), "");
    }

    #[test]
    fn text_is_cut_on_characters() {
        assert_eq!(cut("abc", 3), "abc");
        assert_eq!(cut("abcdef", 4), "abc…");
        assert_eq!(cut("ééééé", 3), "éé…");
    }
}
