//! Watch plumbing shared by the daemons' reflectors.

use std::sync::Arc;

use kube::runtime::watcher;
use tokio::sync::Notify;

/// For a watch stream's `for_each`: wakes `changed` on every event and logs failed ones (the
/// stream itself retries with backoff).
pub fn notifier<T>(
    changed: Arc<Notify>,
    kind: String,
) -> impl FnMut(Result<T, watcher::Error>) -> futures::future::Ready<()> {
    move |event| {
        if let Err(e) = event {
            tracing::warn!(error = %e, %kind, "watch failed; retrying with backoff");
        }
        changed.notify_one();
        futures::future::ready(())
    }
}
