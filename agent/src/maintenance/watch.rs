//! This node's NodeMaintenances, watched once for the whole agent: the executor carries them
//! out, and the shutdown guard's reboot gate opens while one of them is admitted.

use futures::StreamExt;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, reflector, reflector::Store, watcher},
};
use nodeward_api::NodeMaintenance;
use tokio::sync::watch;

/// The store and a counter that moves on every watch event (every reader sees each change).
#[derive(Clone)]
pub struct NodeMaintenances {
    pub store: Store<NodeMaintenance>,
    pub changes: watch::Receiver<u64>,
}

/// Starts watching the maintenances of `node` (field selector `spec.nodeName`); the returned
/// future runs the watch and must be spawned.
pub fn start(
    client: Client,
    node: &str,
) -> (NodeMaintenances, impl Future<Output = ()> + Send + 'static) {
    let (store, writer) = reflector::store::<NodeMaintenance>();
    let (tx, changes) = watch::channel(0u64);
    let api: Api<NodeMaintenance> = Api::all(client);
    let events = reflector(
        writer,
        watcher(
            api,
            nodeward_runtime::watch::of_few(
                watcher::Config::default().fields(&format!("spec.nodeName={node}")),
            ),
        )
        .default_backoff(),
    );
    let running = events.for_each(move |event| {
        match event {
            Err(e) if nodeward_runtime::watch::expired(&e) => {
                tracing::debug!(error = %e, "the watch of this node's maintenances lists afresh");
            }
            Err(e) => {
                tracing::warn!(error = %e, "watching this node's maintenances failed; retrying with backoff");
            }
            Ok(_) => {}
        }
        tx.send_modify(|n| *n = n.wrapping_add(1));
        futures::future::ready(())
    });
    (NodeMaintenances { store, changes }, running)
}

/// Whether one of `maintenances` is admitted and not finished.
pub fn any_admitted(maintenances: &[std::sync::Arc<NodeMaintenance>]) -> bool {
    maintenances.iter().any(|m| m.is_active())
}

/// Publishes whether a maintenance of this node is admitted and unfinished.
pub async fn follow_admissions(
    mut maintenances: NodeMaintenances,
    admitted: tokio::sync::watch::Sender<bool>,
) {
    loop {
        let now = any_admitted(&maintenances.store.state());
        admitted.send_if_modified(|current| std::mem::replace(current, now) != now);
        if maintenances.changes.changed().await.is_err() {
            return;
        }
    }
}
