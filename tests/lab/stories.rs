//! What a test prints when a wait on the lab fails: where the pods are stuck, what the
//! Events and the agent's logs say.

use anyhow::Context;
use k8s_openapi::api::{core::v1::Pod, events::v1::Event};
use kube::{Api, Client, ResourceExt, api::ListParams};
use nodeward_e2e::nodelab::Vm;

use crate::support::NAMESPACE;

/// Where the pods of `namespace` matching `labels` are stuck, and the namespace's Events: for a
/// wait on them that timed out.
pub async fn pods_story(client: &Client, namespace: &str, labels: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let mut lines = match pods.list(&ListParams::default().labels(labels)).await {
        Ok(list) if list.items.is_empty() => vec![format!("no pod {labels}")],
        Ok(list) => list.items.iter().map(pod_line).collect(),
        Err(e) => vec![format!("(no pods: {e})")],
    };
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    match events.list(&ListParams::default()).await {
        Ok(list) => {
            let events = oldest_first(list.items);
            lines.extend(events.iter().rev().take(15).rev().map(|e| {
                format!(
                    "event: {} {}: {}",
                    e.regarding
                        .as_ref()
                        .and_then(|r| r.name.clone())
                        .unwrap_or_default(),
                    e.reason.as_deref().unwrap_or_default(),
                    e.note.as_deref().unwrap_or_default()
                )
            }));
        }
        Err(e) => lines.push(format!("(no Events: {e})")),
    }
    format!("the pods {labels} in {namespace}:\n{}", lines.join("\n"))
}

/// One pod's node, phase, conditions not True and containers not running.
fn pod_line(pod: &Pod) -> String {
    let status = pod.status.as_ref();
    let mut parts = vec![format!(
        "{} on {}: {}",
        pod.name_any(),
        pod.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or("no node"),
        status
            .and_then(|s| s.phase.as_deref())
            .unwrap_or("no phase")
    )];
    for c in status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.status != "True")
    {
        parts.push(format!(
            "{} {} ({}: {})",
            c.type_,
            c.status,
            c.reason.as_deref().unwrap_or_default(),
            c.message.as_deref().unwrap_or_default()
        ));
    }
    for c in status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
    {
        if let Some(waiting) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) {
            parts.push(format!(
                "container {} waiting ({}: {})",
                c.name,
                waiting.reason.as_deref().unwrap_or_default(),
                waiting.message.as_deref().unwrap_or_default()
            ));
        }
    }
    parts.join("; ")
}

/// The Events about `node` (events.k8s.io, by `regarding`).
pub async fn node_events(client: &Client, node: &str) -> kube::Result<Vec<Event>> {
    let events: Api<Event> = Api::all(client.clone());
    let list = events
        .list(&ListParams::default().fields(&format!("regarding.name={node}")))
        .await?;
    Ok(list.items)
}

/// When `event` last happened, by its reporter's clock: a repeat within the agent's series
/// window (the same note on the same node, as a drain started by an earlier test) is counted in
/// the first Event's `series`, and that Event's creation time stays the first occurrence's.
pub fn last_seen(event: &Event) -> Option<jiff::Timestamp> {
    event
        .series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or_else(|| event.event_time.as_ref().map(|t| t.0))
}

/// The note of the agent's `Acting` Event on the maintenance `name`: how it asked for the
/// reboot (logind, a command or a signal).
pub async fn acting_note(client: &Client, name: &str) -> anyhow::Result<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let acting = events
        .list(&ListParams::default().fields(&format!("regarding.name={name}")))
        .await?
        .items
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("Acting"))
        .with_context(|| format!("{name}: an Acting Event"))?;
    Ok(acting.note.unwrap_or_default())
}

/// What a failed drain test needs to be understood: the Events about `node` (the agent's and
/// the coordinator's, oldest first) and the last lines the agent containers on `vm` logged,
/// the previous boot's included (the kubelet keeps a container's log files across reboots).
pub async fn drain_story(client: &Client, vm: &Vm) -> String {
    let mut lines = match node_events(client, &vm.name).await {
        Ok(items) => oldest_first(items)
            .iter()
            .map(|e| {
                format!(
                    "{} {} {}",
                    e.metadata
                        .creation_timestamp
                        .as_ref()
                        .map(|t| t.0.to_string())
                        .unwrap_or_default(),
                    e.reason.as_deref().unwrap_or_default(),
                    e.note.as_deref().unwrap_or_default()
                )
            })
            .collect(),
        Err(e) => vec![format!("(no Events: {e})")],
    };
    lines.insert(0, format!("Events about {}:", vm.name));
    let logs = vm
        .exec(&format!(
            "for f in /var/log/pods/{NAMESPACE}_*-agent-*/agent/*.log; do echo \"== $f\"; tail -n 40 \"$f\"; done"
        ))
        .await
        .map(|o| o.stdout)
        .unwrap_or_else(|e| format!("(no agent logs: {e:#})"));
    format!("{}\nthe agent's logs:\n{logs}", lines.join("\n"))
}

/// `events`, the oldest first.
fn oldest_first(mut events: Vec<Event>) -> Vec<Event> {
    events.sort_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0));
    events
}
