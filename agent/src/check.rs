//! `nodeward-agent check`: every local detector once, as a table or JSON.

use std::path::Path;

use serde::Serialize;

use crate::{
    config::Config,
    detect::{Finding, Status, interfaces, routes},
};

/// Runs every enabled local detector once.
pub fn run(config: &Config) -> Vec<Finding> {
    let mut findings = Vec::new();
    let network = &config.detectors.network;
    if network.enabled {
        let (interfaces_finding, has_global_ipv6) = match interfaces::read() {
            Ok(list) => {
                let has_global_ipv6 = interfaces::relevant(&list, &network.interfaces)
                    .filter(|i| i.up)
                    .flat_map(|i| &i.addresses)
                    .any(|a| a.is_ipv6() && interfaces::is_usable(a));
                (
                    interfaces::evaluate(&list, &network.interfaces),
                    has_global_ipv6,
                )
            }
            Err(e) => (
                Finding::unknown(
                    "interfaces",
                    nodeward_api::conditions::node::NETWORK_PROBLEM,
                    "InterfacesUnreadable",
                    format!("cannot list network interfaces: {e}"),
                ),
                false,
            ),
        };
        findings.push(interfaces_finding);
        let ipv4 = read_table(routes::IPV4_TABLE).map(|t| routes::parse_ipv4(&t));
        let ipv6 = read_table(routes::IPV6_TABLE).map(|t| routes::parse_ipv6(&t));
        findings.push(routes::evaluate(
            &ipv4,
            &ipv6,
            has_global_ipv6,
            &network.default_route,
        ));
    }
    findings
}

fn read_table(path: &str) -> Result<String, String> {
    // A kernel without IPv6 has no ipv6_route file: that is an empty table, not an error.
    match std::fs::read_to_string(Path::new(path)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && path == routes::IPV6_TABLE => {
            Ok(String::new())
        }
        other => other.map_err(|e| e.to_string()),
    }
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
            f.detector.to_owned(),
            f.condition.to_owned(),
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
    out.push_str(&format!(
        "\n{} checks: {problems} problem(s), {unknown} unknown\n",
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
            table.ends_with("2 checks: 1 problem(s), 0 unknown\n"),
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
