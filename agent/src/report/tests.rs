//! The reporter against a stand-in API server (`nodeward_e2e::http::Endpoint`) whose NodeReport
//! status writes are slow, so that the detectors' snapshot changes while a write is on its way.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use nodeward_e2e::http::Endpoint;
use tokio::sync::{mpsc, watch};

use super::*;
use crate::{
    detect::{Finding, Status},
    runner::{Current, Snapshot},
};

const NODE: &str = "n1";
const REPORT: &str = "/apis/nodeward.io/v1alpha1/nodereports/n1";

/// A snapshot of one detector whose finding's message is `message`.
fn snapshot(message: &str) -> Snapshot {
    let finding = Finding::new(
        "reboot-required",
        "RebootRequired",
        Status::Ok,
        "NoRebootRequired",
        message.to_owned(),
    );
    let current = Current {
        finding,
        since: std::time::SystemTime::now(),
    };
    Arc::new(BTreeMap::from([("reboot-required".to_owned(), current)]))
}

/// The bodies of the NodeReport status writes received so far.
fn status_writes(api: &Endpoint) -> Vec<String> {
    api.received()
        .into_iter()
        .filter(|r| r.method == "PATCH" && r.path == format!("{REPORT}/status"))
        .map(|r| r.body)
        .collect()
}

async fn wait_for_write(api: &Endpoint, count: usize, what: &str) -> String {
    nodeward_e2e::wait::eventually(what, Duration::from_secs(5), || async {
        Ok(status_writes(api).get(count - 1).cloned())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {:?}", status_writes(api)))
}

/// A change that arrives while a write is on its way is written next, even when the reporter's
/// next wake-up is its look for a deleted report (here every 5 ms, so it is always due too).
/// Before the fix, that look took the new snapshot as seen half of the times, and it was never
/// written: eight changes in a row lost none only by a chance of 1 in 256.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_during_a_slow_write_is_written_next_whatever_wakes_the_reporter() {
    let api = Endpoint::start().await.expect("the stand-in API server");
    let report = serde_json::json!({
        "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeReport",
        "metadata": {"name": NODE, "uid": "u1", "resourceVersion": "1"},
        "spec": {"nodeName": NODE},
    })
    .to_string();
    let not_found = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
        "code": 404, "message": "nodes \"n1\" not found",
    })
    .to_string();
    api.reply("/api/v1/nodes/n1", 404, &not_found);
    api.reply(REPORT, 200, &report);
    api.reply_after(
        &format!("{REPORT}/status"),
        200,
        &report,
        Duration::from_millis(200),
    );
    let client = kube::Client::try_from(kube::Config::new(api.url.parse().expect("its URL")))
        .expect("a client");
    let identity = Identity {
        node_name: NODE.to_owned(),
        mode: nodeward_api::report::AgentMode::Host,
        boot_id: None,
    };
    let readiness = Arc::new(nodeward_runtime::server::Readiness::new(&[FIRST_REPORT]));
    let reporter = Reporter::new(client, identity, Arc::new(Metrics::new()), readiness)
        .with_recheck(Duration::from_millis(5));
    let (snapshots, snapshots_rx) = watch::channel(Snapshot::default());
    let (_kernel, kernel_rx) = mpsc::channel(1);
    let (_pauses, pauses_rx) = watch::channel(Vec::new());
    let (_stop, stopping) = nodeward_runtime::stop::channel();
    let running = tokio::spawn(reporter.run(snapshots_rx, kernel_rx, pauses_rx, stopping));

    snapshots.send_replace(snapshot("change 0"));
    for change in 1..=8 {
        // The write of the change before is on its way (held 200 ms): change again meanwhile.
        wait_for_write(&api, change, "the write before").await;
        snapshots.send_replace(snapshot(&format!("change {change}")));
        let body = wait_for_write(&api, change + 1, &format!("change {change} written")).await;
        assert!(body.contains(&format!("change {change}")), "{body}");
    }
    running.abort();
}
