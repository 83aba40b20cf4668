//! Drains ahead of the cloud: while the metadata service announces that it takes the node down
//! (a spot interruption, a scheduled reboot, stop or retirement, see
//! [`cloud_notices::due`]), the agent asks for a `DrainOnly` maintenance with the notice's time
//! as its `disruptionDeadline`, which the coordinator admits at once. One request per notice:
//! `<node>-cloud-<key>`. It ends once the node has booted again (the lifecycle).

use std::{collections::BTreeSet, time::Duration};

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{Client, runtime::events::EventType};
use nodeward_api::{MaintenanceAction, NodeMaintenance, labels::AGENT_FIELD_MANAGER};
use nodeward_runtime::{backoff::Backoff, events::Events};

use crate::detect::cloud_notices::{self, CloudNoticesConfig, Due};

/// The longest wait before asking again after the cluster refused (the notice may give two
/// minutes).
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The maintenance `due` asks for on `node`.
pub fn maintenance(node: &str, due: &Due) -> NodeMaintenance {
    let mut m = NodeMaintenance::request(
        &super::request::name(node, "cloud", &due.key),
        node,
        due.reason,
        MaintenanceAction::DrainOnly,
        AGENT_FIELD_MANAGER,
        due.message.clone(),
    );
    m.spec.disruption_deadline = Some(Time(due.deadline));
    m
}

/// Runs until the agent stops: reads the notices every `config.interval` and asks for what is
/// due. A request the cluster refuses is a Warning Event on the node, once per reason, and
/// asked again with backoff; a service that cannot be read asks for nothing (the detector's
/// finding says why).
pub async fn run(
    client: Client,
    events: Events,
    node: String,
    boot_id: String,
    config: CloudNoticesConfig,
) {
    let about = crate::node_reference(&node);
    let mut asked = BTreeSet::new();
    let mut shown: Option<String> = None;
    let mut backoff = Backoff::new(config.interval, RETRY_MAX);
    loop {
        let mut wait = config.interval;
        let read = tokio::time::timeout(config.timeout, cloud_notices::read(&config)).await;
        let due = match read {
            Ok(Ok(notices)) => {
                cloud_notices::due(&notices, Timestamp::now(), config.drain_ahead, &boot_id)
            }
            Ok(Err(_)) | Err(_) => None,
        };
        if let Some(due) = due {
            let request = maintenance(&node, &due);
            let name = request.metadata.name.clone().unwrap_or_default();
            if !asked.contains(&name) {
                match super::request::file(&client, &request).await {
                    Ok(filed) => {
                        tracing::info!(maintenance = %name, notice = %due.message, ?filed, "asked to drain ahead of the cloud");
                        asked.insert(name);
                        backoff.reset();
                    }
                    Err(why) => {
                        wait = backoff.next_delay();
                        tracing::warn!(error = %why, maintenance = %name, retry = ?wait, "asking to drain ahead of the cloud failed; asking again");
                        if shown.as_ref() != Some(&why) {
                            events
                                .publish(
                                    &about,
                                    EventType::Warning,
                                    "CloudNotice",
                                    "CloudNoticeRequestRefused",
                                    format!(
                                        "{}; asking for NodeMaintenance {name} to drain ahead of it failed, asking again with backoff: {why}",
                                        due.message
                                    ),
                                )
                                .await;
                            shown = Some(why);
                        }
                    }
                }
            }
        }
        tokio::time::sleep(wait).await;
    }
}
