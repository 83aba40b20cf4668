//! `kubectl nodeward status`: policies with their budget use, maintenances with their phase,
//! and unhealthy nodes, as one round of the coordinator would see them now.

use std::fmt::Write;

use jiff::Timestamp;
use kube::ResourceExt;
use nodeward_decide::round::{self, Memory, Objects};

/// Renders the report. `now` is injected for tests.
pub fn render(objects: &Objects, now: Timestamp) -> String {
    let plan = round::plan(objects, &mut Memory::default(), now);
    let mut out = String::new();
    policies_and_progress(objects, &plan, &mut out);

    let mut maintenances: Vec<_> = objects.maintenances.iter().collect();
    maintenances.sort_by_key(|m| (m.metadata.creation_timestamp.clone(), m.name_any()));
    let mut rows = vec![[
        "MAINTENANCE".to_owned(),
        "NODE".to_owned(),
        "REASON".to_owned(),
        "ACTION".to_owned(),
        "PHASE".to_owned(),
        "AGE".to_owned(),
        "MESSAGE".to_owned(),
    ]];
    for m in maintenances {
        let status = m.status.clone().unwrap_or_default();
        let message = status
            .conditions
            .iter()
            .find(|c| {
                c.type_ == nodeward_api::conditions::maintenance::ADMITTED && c.status == "False"
            })
            .map(|c| format!("{}: {}", c.reason, c.message))
            .or_else(|| {
                let last_entered = status.history.last().map(|h| &h.time);
                nodeward_api::update::under_way(&status.host_runs, last_entered)
            })
            .or(status.message)
            .unwrap_or_default();
        let age = m.metadata.creation_timestamp.as_ref().map_or_else(
            || "-".to_owned(),
            |t| {
                let seconds = now.duration_since(t.0).as_secs().max(0);
                humantime::format_duration(std::time::Duration::from_secs(
                    u64::try_from(seconds).unwrap_or_default(),
                ))
                .to_string()
            },
        );
        rows.push([
            m.name_any(),
            m.spec.node_name.clone(),
            format!("{:?}", m.spec.reason),
            format!("{:?}", m.spec.action),
            format!("{:?}", status.phase),
            age,
            message,
        ]);
    }
    table(&mut out, &rows);
    out.push('\n');

    if plan.unhealthy_nodes.is_empty() {
        out.push_str("unhealthy nodes: none\n");
        return out;
    }
    let mut rows = vec![["UNHEALTHY NODE".to_owned(), "WHY".to_owned()]];
    for (node, why) in &plan.unhealthy_nodes {
        rows.push([node.clone(), why.clone()]);
    }
    table(&mut out, &rows);
    out
}

/// The policies' table, then their progress bars (if any policy has progress).
fn policies_and_progress(objects: &Objects, plan: &round::Plan, out: &mut String) {
    let mut policies: Vec<_> = objects.policies.iter().collect();
    policies.sort_by_key(|p| p.name_any());
    let mut progress = String::new();
    let mut rows = vec![[
        "POLICY".to_owned(),
        "DISRUPTED/MAX".to_owned(),
        "SLOTS".to_owned(),
        "BY-OTHERS".to_owned(),
        "MATCHED".to_owned(),
        "READY".to_owned(),
        "UNHEALTHY".to_owned(),
        "PAUSED".to_owned(),
    ]];
    for p in policies {
        let name = p.name_any();
        let (used, max) = plan.budget_use.get(&name).copied().unwrap_or_default();
        let status = plan
            .policy_status
            .get(&name)
            .cloned()
            .or_else(|| p.status.clone())
            .unwrap_or_default();
        let paused = paused_cell(p, &status);
        if let Some(counts) = &status.progress {
            let _ = writeln!(progress, "{name}  {}", progress_line(counts));
        }
        rows.push([
            name,
            format!("{used}/{max}"),
            status.slots.len().to_string(),
            status.disrupted_by_others.to_string(),
            status.matched.to_string(),
            status.ready.to_string(),
            status.unhealthy.to_string(),
            paused,
        ]);
    }
    table(out, &rows);
    out.push('\n');
    if !progress.is_empty() {
        out.push_str("PROGRESS (planned reboots: nodes updated of matched)\n");
        out.push_str(&progress);
        out.push('\n');
    }
}

/// The width of a progress bar, in characters.
const BAR: usize = 20;

/// A policy's progress as a bar and its counts: `[#####...............]  1/4 updated, 1 in
/// progress, 2 pending, 0 failed`, naming the failed nodes.
fn progress_line(p: &nodeward_api::policy::Progress) -> String {
    let total = (p.updated + p.in_progress + p.pending + p.failed).max(0);
    let updated = usize::try_from(p.updated.max(0)).unwrap_or_default();
    let total_nodes = usize::try_from(total).unwrap_or_default();
    let filled = (updated * BAR).checked_div(total_nodes).unwrap_or(BAR);
    let mut line = format!(
        "[{}{}]  {}/{total} updated, {} in progress, {} pending, {} failed",
        "#".repeat(filled),
        ".".repeat(BAR - filled),
        p.updated,
        p.in_progress,
        p.pending,
        p.failed
    );
    if !p.failed_nodes.is_empty() {
        let _ = write!(line, " ({})", p.failed_nodes.join(", "));
    }
    line
}

/// The PAUSED cell of a policy: `yes` once the pause took hold, `pausing` until then, `halted`
/// while its failure budget is spent (which stops admission as a pause does, until `resume`),
/// `no` otherwise.
fn paused_cell(
    p: &nodeward_api::DisruptionPolicy,
    status: &nodeward_api::DisruptionPolicyStatus,
) -> String {
    let paused = status
        .conditions
        .iter()
        .find(|c| c.type_ == nodeward_api::conditions::policy::PAUSED)
        .map_or_else(
            || p.spec.paused.to_string(),
            |c| match (p.spec.paused, c.status.as_str()) {
                (true, "True") => "yes".to_owned(),
                (true, _) => "pausing".to_owned(),
                _ => "no".to_owned(),
            },
        );
    let halted = status
        .conditions
        .iter()
        .any(|c| c.type_ == nodeward_api::conditions::policy::HALTED && c.status == "True");
    if halted { "halted".to_owned() } else { paused }
}

fn table<const N: usize>(out: &mut String, rows: &[[String; N]]) {
    let mut widths = [0; N];
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == N {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}  ", width = widths[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    #[test]
    fn progress_is_a_bar_of_the_updated_share_with_the_counts() {
        let p = nodeward_api::policy::Progress {
            updated: 1,
            in_progress: 1,
            pending: 1,
            failed: 1,
            failed_nodes: vec!["w3".into()],
        };
        assert_eq!(
            progress_line(&p),
            "[#####...............]  1/4 updated, 1 in progress, 1 pending, 1 failed (w3)"
        );
        let none = nodeward_api::policy::Progress::default();
        assert_eq!(
            progress_line(&none),
            "[####################]  0/0 updated, 0 in progress, 0 pending, 0 failed"
        );
    }

    #[test]
    fn unhealthy_nodes_are_a_table_when_there_are_some_and_one_line_when_none() {
        let now: Timestamp = "2026-11-25T12:10:00Z".parse().expect("a time");
        let healthy = render(&Objects::default(), now);
        assert!(healthy.ends_with("\nunhealthy nodes: none\n"), "{healthy}");
        assert!(!healthy.contains("UNHEALTHY NODE"), "{healthy}");
        let down = Objects {
            nodes: vec![Arc::new(
                serde_json::from_value(json!({
                    "metadata": {"name": "w0"},
                    "status": {"conditions": [{"type": "Ready", "status": "False",
                                               "lastTransitionTime": "2026-11-25T12:00:00Z"}]}
                }))
                .expect("a node"),
            )],
            ..Objects::default()
        };
        let text = render(&down, now);
        let table: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("UNHEALTHY NODE"))
            .collect();
        assert!(
            table.len() == 2 && table[1].starts_with("w0 "),
            "the header and w0's row: {text}"
        );
    }
}
