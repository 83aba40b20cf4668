//! `nodeward-agent check`: every local detector once, as a table or JSON.

use futures::future::join_all;
use serde::Serialize;

use crate::{
    config::Config,
    detect::{Detector, Finding, Status},
};

/// Runs every enabled local detector once, concurrently, each within its timeout, so that a
/// hung check never holds the others up.
pub async fn run(config: &Config) -> Vec<Finding> {
    let detectors = config.detectors.enabled(None);
    join_all(detectors.iter().map(Detector::observe_bounded)).await
}

/// The process exit status for these findings: 1 when any is a problem, else 0.
pub fn exit_code(findings: &[Finding]) -> u8 {
    u8::from(findings.iter().any(|f| f.status == Status::Problem))
}

/// A fixed-width table, one finding a line, problems first.
pub fn render_table(findings: &[Finding]) -> String {
    let mut rows: Vec<[String; 5]> =
        vec![["DETECTOR", "CONDITION", "STATUS", "REASON", "MESSAGE"].map(String::from)];
    let mut sorted: Vec<&Finding> = findings.iter().collect();
    sorted.sort_by_key(|f| (f.status != Status::Problem, f.status != Status::Unknown));
    for f in sorted {
        rows.push([
            f.detector.to_string(),
            f.condition.to_string(),
            format!("{:?}", f.status),
            f.reason.clone(),
            f.message.clone(),
        ]);
    }
    let mut widths = [0usize; 4];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        for (w, cell) in widths.iter().zip(row) {
            out.push_str(&format!("{cell:<w$}  "));
        }
        out.push_str(&row[4]);
        out.push('\n');
    }
    let problems = findings
        .iter()
        .filter(|f| f.status == Status::Problem)
        .count();
    let unknown = findings
        .iter()
        .filter(|f| f.status == Status::Unknown)
        .count();
    let skipped = findings
        .iter()
        .filter(|f| f.status == Status::Skipped)
        .count();
    out.push_str(&format!(
        "\n{} checks: {problems} problem(s), {unknown} unknown, {skipped} skipped\n",
        findings.len()
    ));
    out
}

#[derive(Serialize)]
struct Report<'a> {
    problems: usize,
    findings: &'a [Finding],
}

pub fn render_json(findings: &[Finding]) -> String {
    let report = Report {
        problems: findings
            .iter()
            .filter(|f| f.status == Status::Problem)
            .count(),
        findings,
    };
    // Serializing plain strings and enums into a String cannot fail.
    serde_json::to_string_pretty(&report).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Finding> {
        vec![
            Finding::ok(
                "interfaces",
                "NetworkProblem",
                "InterfacesUp",
                "up: eth0".into(),
            ),
            Finding::problem(
                "default-route",
                "NetworkProblem",
                "NoDefaultRoute",
                "no IPv4 default route".into(),
            ),
        ]
    }

    #[test]
    fn exit_code_is_one_only_with_a_problem() {
        assert_eq!(exit_code(&sample()), 1);
        assert_eq!(exit_code(&sample()[..1]), 0);
        let unknown = [Finding::unknown(
            "x",
            "NetworkProblem",
            "Unreadable",
            "?".into(),
        )];
        assert_eq!(exit_code(&unknown), 0);
    }

    #[test]
    fn table_lists_problems_first_with_a_summary() {
        let table = render_table(&sample());
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("DETECTOR"));
        assert!(
            lines[1].starts_with("default-route") && lines[1].contains("Problem"),
            "{table}"
        );
        assert!(lines[2].starts_with("interfaces"), "{table}");
        assert!(
            table.ends_with("2 checks: 1 problem(s), 0 unknown, 0 skipped\n"),
            "{table}"
        );
    }

    #[test]
    fn json_counts_problems() {
        let value: serde_json::Value = serde_json::from_str(&render_json(&sample())).expect("json");
        assert_eq!(value["problems"], 1);
        assert_eq!(value["findings"][1]["reason"], "NoDefaultRoute");
        assert_eq!(value["findings"][1]["status"], "Problem");
    }
}
