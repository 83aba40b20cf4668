//! `why NODE`: what nodeward is doing with a node, or why it is waiting: the node's state as
//! admission sees it (Ready, cordon, agent heartbeat, problems), the policies that count it
//! with their budget use, and its maintenance with the coordinator's last word on it (the
//! reason it is not admitted: budget, window, pause, blocker, workload, quorum, agent), its
//! deadline, its hooks and update as they ran, the pods holding its drain and, after its
//! reboot, the workloads it waits for.

use std::{fmt::Write, time::Duration};

use jiff::Timestamp;
use k8s_openapi::{api::core::v1::Node, apimachinery::pkg::apis::meta::v1::Time};
use kube::ResourceExt;
use nodeward_api::{
    MaintenancePhase, NodeMaintenance,
    conditions::{self, maintenance::ADMITTED},
    fleet::lease_name,
    labels::{CORDONED_BY_ANNOTATION, MAINTENANCE_TAINT},
    node::is_ready,
    update::{self, HostRun, HostRunResult},
};
use nodeward_decide::round::{self, Memory, Objects};

/// The explanation for `node`, or why there is none (no such node and nothing of it).
pub fn explain(node: &str, objects: &Objects, now: Timestamp) -> Result<String, String> {
    let found = objects.nodes.iter().find(|n| n.name_any() == node);
    let mut theirs: Vec<&NodeMaintenance> = objects
        .maintenances
        .iter()
        .map(AsRef::as_ref)
        .filter(|m| m.spec.node_name == node)
        .collect();
    if found.is_none() && theirs.is_empty() {
        return Err(format!("node {node} not found (kubectl get nodes)"));
    }
    let mut out = String::new();
    match found {
        Some(n) => node_lines(&mut out, n, objects, now),
        None => {
            let _ = writeln!(
                out,
                "node {node}: no Node object (deleted, or never registered)"
            );
        }
    }
    let plan = round::plan(objects, &mut Memory::default(), now);
    if let Some(n) = found {
        policy_lines(&mut out, n, objects, &plan);
    }
    theirs.sort_by_key(|m| (m.metadata.creation_timestamp.clone(), m.name_any()));
    let (open, done): (Vec<_>, Vec<_>) = theirs.into_iter().partition(|m| !m.phase().is_finished());
    if open.is_empty() {
        let _ = writeln!(out, "maintenance: none under way");
        if let Some(last) = done.last() {
            let status = last.status.clone().unwrap_or_default();
            let _ = writeln!(
                out,
                "  last: {} {:?}{}{}",
                last.name_any(),
                status.phase,
                status
                    .finished_at
                    .as_ref()
                    .map(|t| format!(" {} ago", ago(t, now)))
                    .unwrap_or_default(),
                status.message.map(|m| format!(": {m}")).unwrap_or_default()
            );
        }
    }
    for m in open {
        maintenance_lines(&mut out, m, objects, &plan, now);
    }
    Ok(out)
}

fn node_lines(out: &mut String, node: &Node, objects: &Objects, now: Timestamp) {
    let name = node.name_any();
    let ready = if is_ready(node) { "Ready" } else { "NotReady" };
    let spec = node.spec.clone().unwrap_or_default();
    let ours = spec
        .taints
        .unwrap_or_default()
        .iter()
        .any(|t| t.key == MAINTENANCE_TAINT);
    let cordon = match (
        spec.unschedulable == Some(true),
        node.annotations().get(CORDONED_BY_ANNOTATION),
    ) {
        (false, _) => "schedulable".to_owned(),
        (true, Some(by)) => format!("cordoned by nodeward ({by})"),
        (true, None) => {
            format!("cordoned, not by nodeward (`kubectl uncordon {name}` is yours to run)")
        }
    };
    let taint = if ours {
        ", tainted for maintenance"
    } else {
        ""
    };
    let _ = writeln!(out, "node {name}: {ready}, {cordon}{taint}");

    let lease = lease_name(&name)
        .and_then(|lease| objects.leases.iter().find(|l| l.name_any() == lease))
        .and_then(|l| l.spec.as_ref());
    let renewed = lease.and_then(|l| Some(l.renew_time.as_ref()?.0));
    let reported = objects
        .reports
        .iter()
        .find(|r| r.name_any() == name)
        .and_then(|r| Some(r.status.as_ref()?.heartbeat_time.as_ref()?.0));
    match renewed.max(reported) {
        Some(t) => {
            // The agent renews its Lease every third of its duration, as the kubelet does.
            let lasts = lease
                .and_then(|l| l.lease_duration_seconds)
                .and_then(|s| u64::try_from(s).ok())
                .filter(|s| *s > 0)
                .map(Duration::from_secs);
            let since = Duration::try_from(now.duration_since(t)).unwrap_or(Duration::ZERO);
            let rhythm = match lasts {
                Some(lasts) if since > lasts => format!(
                    ": silent, past its Lease's {}",
                    humantime::format_duration(lasts)
                ),
                Some(lasts) => format!(
                    " (renewed every {}; silent only after {})",
                    humantime::format_duration(lasts / 3),
                    humantime::format_duration(lasts)
                ),
                None => String::new(),
            };
            let _ = writeln!(
                out,
                "agent: last heartbeat {} ago{rhythm}",
                ago(&Time(t), now)
            );
        }
        None => {
            let _ = writeln!(
                out,
                "agent: no heartbeat (no agent runs on this node, or it cannot reach the API server): maintenances that need it are not admitted"
            );
        }
    }
    let problems: Vec<String> = nodeward_api::node::conditions(node)
        .iter()
        .filter(|c| {
            c.status == "True"
                && (conditions::node::WRITTEN_BY_AGENT.contains(&c.type_.as_str())
                    || c.type_ == conditions::node::STARTUP_TIMED_OUT)
        })
        .map(|c| match c.message.as_deref().filter(|m| !m.is_empty()) {
            Some(m) => format!("{} ({m})", c.type_),
            None => c.type_.clone(),
        })
        .collect();
    let _ = writeln!(
        out,
        "problems: {}",
        if problems.is_empty() {
            "none".to_owned()
        } else {
            problems.join("; ")
        }
    );
}

fn policy_lines(out: &mut String, node: &Node, objects: &Objects, plan: &round::Plan) {
    let mut any = false;
    for policy in &objects.policies {
        match policy.selects(node.labels()) {
            Ok(false) => continue,
            Ok(true) => {}
            Err(e) => {
                let _ = writeln!(
                    out,
                    "policy {}: its nodeSelector is invalid ({e}): it blocks every node",
                    policy.name_any()
                );
                continue;
            }
        }
        any = true;
        let name = policy.name_any();
        let (used, max) = plan.budget_use.get(&name).copied().unwrap_or_default();
        let holders: Vec<String> = plan
            .policy_status
            .get(&name)
            .or(policy.status.as_ref())
            .map(|s| s.slots.iter().map(|s| s.node_name.clone()).collect())
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "policy {name}: {used} of {max} disrupted now{}{}",
            if holders.is_empty() {
                String::new()
            } else {
                format!(" (slots: {})", holders.join(", "))
            },
            if policy.spec.paused { ", paused" } else { "" }
        );
    }
    if !any {
        let _ = writeln!(out, "policy: none selects this node (no budget limits it)");
    }
}

fn maintenance_lines(
    out: &mut String,
    m: &NodeMaintenance,
    objects: &Objects,
    plan: &round::Plan,
    now: Timestamp,
) {
    let status = m.status.clone().unwrap_or_default();
    let since = m
        .entered(status.phase)
        .or(m.metadata.creation_timestamp.as_ref())
        .map(|t| format!(" for {}", ago(t, now)))
        .unwrap_or_default();
    let deleting = if m.metadata.deletion_timestamp.is_some() {
        ", being cancelled"
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "maintenance {} ({:?}, {:?}): {:?}{since}{deleting}",
        m.name_any(),
        m.spec.reason,
        m.spec.action,
        status.phase
    );
    if status.phase == MaintenancePhase::Pending {
        pending_line(out, m, objects, plan);
    }
    if let Some(c) = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::maintenance::WORKLOADS_AVAILABLE)
        .filter(|_| status.phase == MaintenancePhase::Verifying)
    {
        let _ = writeln!(out, "  workloads: {}: {}", c.reason, c.message);
    }
    // A deadline recorded for a phase it has left is over: not shown.
    if let Some(deadline) = status.deadline.as_ref().filter(|d| d.phase == status.phase) {
        let _ = writeln!(
            out,
            "  deadline: {} if still {:?} at {}",
            deadline.then, deadline.phase, deadline.time.0
        );
    }
    for run in &status.host_runs {
        let _ = writeln!(out, "  {}", host_run_line(run, now));
    }
    for pod in &status.blocking_pods {
        let _ = writeln!(
            out,
            "  blocking: {}/{} ({}{})",
            pod.namespace,
            pod.name,
            pod.reason,
            pod.message
                .as_ref()
                .map(|m| format!(": {m}"))
                .unwrap_or_default()
        );
    }
    let last_entered = status.history.last().map(|h| &h.time);
    if let Some(doing) = update::under_way(&status.host_runs, last_entered) {
        let _ = writeln!(out, "  now: {doing}");
    } else if let Some(message) = status
        .message
        .filter(|_| status.phase != MaintenancePhase::Pending)
    {
        let _ = writeln!(out, "  now: {message}");
    }
}

/// One hook or update as it ran: "update: Succeeded (exit 0) in 41s; reboot needed", or
/// "BeforeDrain hook: running for 2m: /usr/local/bin/quiesce".
fn host_run_line(run: &HostRun, now: Timestamp) -> String {
    let what = run.step.named();
    let Some(result) = run.result else {
        return format!(
            "{what}: running for {}: {}",
            ago(&run.started_at, now),
            run.command
        );
    };
    let exit = run
        .exit_code
        .map(|c| format!(" (exit {c})"))
        .unwrap_or_default();
    let took = run
        .finished_at
        .as_ref()
        .map(|end| format!(" in {}", ago(&run.started_at, end.0)))
        .unwrap_or_default();
    let reboot = match run.reboot {
        Some(true) => "; reboot needed",
        Some(false) => "; no reboot needed",
        None => "",
    };
    let why = match result {
        HostRunResult::Succeeded => String::new(),
        _ => run
            .message
            .as_ref()
            .map(|m| format!(": {m}"))
            .unwrap_or_default(),
    };
    format!("{what}: {result:?}{exit}{took}{reboot}{why}")
}

/// Why a pending maintenance waits. The coordinator's word (its `Admitted` condition) can be
/// older than the slots: right after a resume it still says `Paused` while the slots are held
/// and the condition is being written, so the slots written and this round's verdict come
/// first.
fn pending_line(out: &mut String, m: &NodeMaintenance, objects: &Objects, plan: &round::Plan) {
    let name = m.name_any();
    let held_in: Vec<String> = objects
        .policies
        .iter()
        .filter(|p| {
            p.status
                .as_ref()
                .is_some_and(|s| s.slots.iter().any(|slot| slot.maintenance == name))
        })
        .map(|p| p.name_any())
        .collect();
    let stored = m.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == ADMITTED && c.status == "False")
    });
    let line = if !held_in.is_empty() {
        format!(
            "  admitted: holds its slot in {}; the coordinator is marking it Admitted",
            held_in.join(", ")
        )
    } else if plan.admit.iter().any(|a| a.maintenance == name) {
        format!(
            "  admissible now: the coordinator admits it at its next round{}",
            stored
                .map(|c| format!(" (its last word: {})", c.reason))
                .unwrap_or_default()
        )
    } else if let Some(c) = stored {
        format!("  waiting: {}: {}", c.reason, c.message)
    } else {
        "  waiting: not yet decided (is the coordinator running? kubectl -n nodeward-system get pods)"
            .to_owned()
    };
    let _ = writeln!(out, "{line}");
}

/// How long ago `t` was, to the second.
/// A write of nodeward's about the node that the cluster refused, as the Warning Event of the
/// daemon that tried says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// Who tried (the Event's reporting controller).
    pub by: String,
    pub at: Option<Time>,
    pub note: String,
}

/// The most refusals `why` shows, newest first.
pub const REFUSALS_SHOWN: usize = 3;

/// The lines of the newest refused writes, or none when nothing was refused: a write the
/// cluster refuses does not go away by retrying, and the maintenance may go on without it.
pub fn refusal_lines(refused: &[Refused], now: Timestamp) -> String {
    let mut out = String::new();
    if refused.is_empty() {
        return out;
    }
    let mut newest: Vec<&Refused> = refused.iter().collect();
    newest.sort_by(|a, b| b.at.as_ref().map(|t| t.0).cmp(&a.at.as_ref().map(|t| t.0)));
    let _ = writeln!(
        out,
        "writes the cluster refused ({} Warning Events; kubectl get events --field-selector regarding.name=NODE):",
        refused.len()
    );
    for r in newest.into_iter().take(REFUSALS_SHOWN) {
        let when =
            r.at.as_ref()
                .map(|t| format!(" {} ago", ago(t, now)))
                .unwrap_or_default();
        let _ = writeln!(out, "  {}{when}: {}", r.by, r.note);
    }
    out
}

fn ago(t: &Time, now: Timestamp) -> String {
    let seconds = u64::try_from(now.duration_since(t.0).as_secs()).unwrap_or(0);
    humantime::format_duration(Duration::from_secs(seconds)).to_string()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    #[test]
    fn refused_writes_are_shown_newest_first_and_nothing_when_none() {
        assert_eq!(refusal_lines(&[], now()), "");
        let refused = |by: &str, seconds: i64, note: &str| Refused {
            by: by.into(),
            at: Some(Time(
                now()
                    .checked_sub(jiff::SignedDuration::from_secs(seconds))
                    .expect("time"),
            )),
            note: note.into(),
        };
        let text = refusal_lines(
            &[
                refused("nodeward-coordinator", 600, "old"),
                refused(
                    "nodeward-agent",
                    60,
                    "the API server refused the agent's report",
                ),
                refused("nodeward-coordinator", 120, "labels refused"),
                refused("nodeward-coordinator", 3000, "oldest"),
            ],
            now(),
        );
        assert_eq!(
            text,
            "writes the cluster refused (4 Warning Events; kubectl get events --field-selector regarding.name=NODE):\n  nodeward-agent 1m ago: the API server refused the agent's report\n  nodeward-coordinator 2m ago: labels refused\n  nodeward-coordinator 10m ago: old\n"
        );
    }

    fn now() -> Timestamp {
        "2026-11-25T12:10:00Z".parse().expect("a time")
    }

    fn node(name: &str, cordoned_by: Option<&str>, problem: bool) -> Arc<Node> {
        let mut annotations = serde_json::Map::new();
        if let Some(by) = cordoned_by {
            annotations.insert(CORDONED_BY_ANNOTATION.into(), json!(by));
        }
        let mut conditions = vec![json!({"type": "Ready", "status": "True"})];
        if problem {
            conditions.push(json!({"type": "RebootRequired", "status": "True", "message": "/var/run/reboot-required"}));
        }
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"pool": "a"}, "annotations": annotations},
                "spec": {"unschedulable": cordoned_by.is_some()},
                "status": {"conditions": conditions}
            }))
            .expect("a node"),
        )
    }

    fn objects() -> Objects {
        Objects {
            nodes: vec![node("w0", Some("maintenance"), false), node("w1", None, true)],
            policies: vec![Arc::new(
                serde_json::from_value(json!({
                    "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
                    "metadata": {"name": "pool-a"},
                    "spec": {"maxConcurrent": 1, "nodeSelector": {"matchLabels": {"pool": "a"}}},
                    "status": {"slots": [{"maintenance": "w0-reboot", "uid": "u0", "nodeName": "w0",
                                          "admittedAt": "2026-11-25T12:00:00Z"}]}
                }))
                .expect("a policy"),
            )],
            maintenances: vec![
                Arc::new(
                    serde_json::from_value(json!({
                        "metadata": {"name": "w0-reboot", "uid": "u0", "creationTimestamp": "2026-11-25T12:00:00Z"},
                        "spec": {"nodeName": "w0", "reason": "Manual", "action": "Reboot"},
                        "status": {"phase": "Draining",
                                   "history": [{"phase": "Draining", "time": "2026-11-25T12:08:00Z"}],
                                   "admission": {"policies": ["pool-a"], "admittedAt": "2026-11-25T12:07:00Z", "admittedBy": "c1"},
                                   "blockingPods": [{"namespace": "shop", "name": "web-a", "reason": "DisruptionBudget",
                                                     "message": "PodDisruptionBudget shop/web"}]}
                    }))
                    .expect("a maintenance"),
                ),
                Arc::new(
                    serde_json::from_value(json!({
                        "metadata": {"name": "w1-reboot", "creationTimestamp": "2026-11-25T12:05:00Z"},
                        "spec": {"nodeName": "w1", "reason": "Reboot", "action": "Reboot"},
                        "status": {"phase": "Pending", "conditions": [{
                            "type": "Admitted", "status": "False", "reason": "BudgetExhausted",
                            "message": "policy pool-a: 1 of 1 disrupted (w0)",
                            "lastTransitionTime": "2026-11-25T12:05:01Z"}]}
                    }))
                    .expect("a maintenance"),
                ),
            ],
            ..Objects::default()
        }
    }

    #[test]
    fn a_waiting_node_shows_its_state_its_policy_and_the_coordinators_reason() {
        let text = explain("w1", &objects(), now()).expect("explained");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "node w1: Ready, schedulable");
        assert!(lines[1].starts_with("agent: no heartbeat"), "{text}");
        assert_eq!(
            lines[2],
            "problems: RebootRequired (/var/run/reboot-required)"
        );
        assert_eq!(lines[3], "policy pool-a: 1 of 1 disrupted now (slots: w0)");
        assert_eq!(
            lines[4],
            "maintenance w1-reboot (Reboot, Reboot): Pending for 5m"
        );
        assert_eq!(
            lines[5],
            "  waiting: BudgetExhausted: policy pool-a: 1 of 1 disrupted (w0)"
        );
    }

    #[test]
    fn a_draining_node_shows_its_cordon_and_the_pods_holding_it() {
        let text = explain("w0", &objects(), now()).expect("explained");
        assert!(
            text.starts_with("node w0: Ready, cordoned by nodeward (maintenance)\n"),
            "{text}"
        );
        assert!(
            text.contains("maintenance w0-reboot (Manual, Reboot): Draining for 2m\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "  blocking: shop/web-a (DisruptionBudget: PodDisruptionBudget shop/web)\n"
            ),
            "{text}"
        );
    }

    /// `w1`'s agent alive (its Lease renewed a minute ago, lasting 15 minutes), `w0` idle, and
    /// `w1`'s request still saying the coordinator's last word from before a resume.
    fn after_a_resume(slot_held: bool) -> Objects {
        let mut objects = objects();
        objects.maintenances.remove(0);
        let mut w1 = (*objects.maintenances[0]).clone();
        if let Some(c) = w1.status.as_mut().and_then(|s| s.conditions.first_mut()) {
            c.reason = "Paused".into();
            c.message = "policy pool-a is paused".into();
        }
        objects.maintenances[0] = Arc::new(w1);
        let mut policy = (*objects.policies[0]).clone();
        policy.status = Some(
            serde_json::from_value(json!({"slots": if slot_held {
                json!([{"maintenance": "w1-reboot", "uid": "u1", "nodeName": "w1",
                        "admittedAt": "2026-11-25T12:09:59Z"}])
            } else {
                json!([])
            }}))
            .expect("a status"),
        );
        objects.policies[0] = Arc::new(policy);
        objects.leases = vec![Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": "nodeward-agent-w1", "namespace": "nodeward-system"},
                "spec": {"holderIdentity": "w1", "leaseDurationSeconds": 900,
                         "renewTime": "2026-11-25T12:09:00.000000Z"}
            }))
            .expect("a lease"),
        )];
        objects
    }

    #[test]
    fn right_after_a_resume_the_slots_and_this_rounds_verdict_come_before_the_stale_pause() {
        let held = explain("w1", &after_a_resume(true), now()).expect("explained");
        assert!(
            held.contains(
                "  admitted: holds its slot in pool-a; the coordinator is marking it Admitted\n"
            ),
            "{held}"
        );
        assert!(!held.contains("Paused"), "{held}");
        let free = explain("w1", &after_a_resume(false), now()).expect("explained");
        assert!(
            free.contains(
                "  admissible now: the coordinator admits it at its next round (its last word: Paused)\n"
            ),
            "{free}"
        );
    }

    #[test]
    fn a_live_agents_heartbeat_says_how_often_it_is_renewed_and_a_silent_ones_that_it_is_silent() {
        let objects = after_a_resume(false);
        let text = explain("w1", &objects, now()).expect("explained");
        assert!(
            text.contains(
                "agent: last heartbeat 1m ago (renewed every 5m; silent only after 15m)\n"
            ),
            "{text}"
        );
        let later = now() + jiff::SignedDuration::from_mins(20);
        let text = explain("w1", &objects, later).expect("explained");
        assert!(
            text.contains("agent: last heartbeat 21m ago: silent, past its Lease's 15m\n"),
            "{text}"
        );
    }

    #[test]
    fn only_the_deadline_of_the_phase_it_is_in_is_shown() {
        let with_deadline = |phase: &str| {
            let mut objects = objects();
            let mut w0 = (*objects.maintenances[0]).clone();
            if let Some(status) = w0.status.as_mut() {
                status.deadline = Some(
                    serde_json::from_value(json!({"phase": phase, "time": "2026-11-25T14:08:00Z",
                                                  "then": "Failed"}))
                    .expect("a deadline"),
                );
            }
            objects.maintenances[0] = Arc::new(w0);
            explain("w0", &objects, now()).expect("explained")
        };
        assert!(
            with_deadline("Draining")
                .contains("  deadline: Failed if still Draining at 2026-11-25T14:08:00Z\n")
        );
        let left = with_deadline("Admitted");
        assert!(!left.contains("deadline"), "{left}");
    }

    #[test]
    fn a_host_run_says_how_it_ended_or_how_long_it_has_run() {
        let run = |value: serde_json::Value| -> HostRun {
            serde_json::from_value(value).expect("a host run")
        };
        let done = run(
            json!({"step": "Update", "command": "/bin/sh -c apt-get ...",
            "startedAt": "2026-11-25T12:08:00Z", "finishedAt": "2026-11-25T12:08:41Z",
            "result": "Succeeded", "exitCode": 0, "reboot": true}),
        );
        assert_eq!(
            host_run_line(&done, now()),
            "update: Succeeded (exit 0) in 41s; reboot needed"
        );
        let failed = run(
            json!({"step": "BeforeDrain", "command": "/usr/local/bin/quiesce",
            "startedAt": "2026-11-25T12:08:00Z", "finishedAt": "2026-11-25T12:08:03Z",
            "result": "Failed", "exitCode": 3,
            "message": "the BeforeDrain hook exited with 3 after 3s"}),
        );
        assert_eq!(
            host_run_line(&failed, now()),
            "BeforeDrain hook: Failed (exit 3) in 3s: the BeforeDrain hook exited with 3 after 3s"
        );
        let running = run(
            json!({"step": "AfterBoot", "command": "/usr/local/bin/selftest",
            "startedAt": "2026-11-25T12:08:00Z"}),
        );
        assert_eq!(
            host_run_line(&running, now()),
            "AfterBoot hook: running for 2m: /usr/local/bin/selftest"
        );
    }

    #[test]
    fn an_unknown_node_is_an_error_and_an_idle_one_says_so() {
        assert_eq!(
            explain("ghost", &objects(), now()),
            Err("node ghost not found (kubectl get nodes)".to_owned())
        );
        let mut idle = objects();
        idle.maintenances.clear();
        let text = explain("w1", &idle, now()).expect("explained");
        assert!(text.ends_with("maintenance: none under way\n"), "{text}");
    }
}
