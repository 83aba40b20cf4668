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

/// A watch of a few objects of a kind that changes rarely (this node's maintenances, one
/// named object): without the API server's bookmarks. A bookmark, sent on every watch about
/// once a minute, only lets a long-idle watch resume without a relist; for such a watch a
/// relist is one small object, and one it seldom needs (the watch cache of a rarely
/// changing kind still holds the version it resumes from). An agent keeps bookmarks on its
/// watches whose kind churns cluster-wide (Nodes, EndpointSlices), where a relist is what
/// they save. Halves an idle agent's watch events (issue 18).
pub fn of_few(config: watcher::Config) -> watcher::Config {
    config.disable_bookmarks()
}

/// Whether a watch failed only because the version it resumed from has expired (410 Gone):
/// the watcher lists afresh, as it should. Routine for a watch [`of_few`] while its kind
/// churns (a large rollout's maintenances), so not worth a warning.
pub fn expired(error: &watcher::Error) -> bool {
    matches!(error, watcher::Error::WatchError(status) if status.code == 410)
}

#[cfg(test)]
mod tests {
    use kube::core::Status;

    use super::*;

    #[test]
    fn only_an_expired_version_is_routine() {
        let status =
            |code| watcher::Error::WatchError(Box::new(Status::failure("x", "y").with_code(code)));
        assert!(expired(&status(410)));
        assert!(!expired(&status(403)));
        assert!(!expired(&status(500)));
        assert!(!expired(&watcher::Error::NoResourceVersion));
    }
}
