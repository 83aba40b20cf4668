//! Stopping a daemon gracefully, the one way both daemons do it: on SIGTERM the tasks are asked
//! to stop ([`Stop::ask`]); those that write (reports, phases, Leases) notice it at their next
//! idle point, so a write under way is finished, and end; after a grace period the rest are
//! aborted. Dropping a task releases what it holds (a logind inhibitor lock is a file
//! descriptor), so nothing outlives the process either way.

use std::time::Duration;

use tokio::{sync::watch, task::JoinSet};

/// What a task watches to know it should stop: `true` once asked.
pub type Stopping = watch::Receiver<bool>;

/// The asking side.
pub struct Stop(watch::Sender<bool>);

/// A new stop signal and what tasks watch.
pub fn channel() -> (Stop, Stopping) {
    let (tx, rx) = watch::channel(false);
    (Stop(tx), rx)
}

/// Resolves once a stop is asked for (or the asking side is gone).
pub async fn asked(stopping: &mut Stopping) {
    let _ = stopping.wait_for(|asked| *asked).await;
}

impl Stop {
    /// Asks every task to stop and waits up to `grace` for the `writers` (the tasks that watch
    /// [`Stopping`] and finish a write first) to end; then aborts what is left of them and
    /// the `rest` (watches, servers: nothing to finish). Returns how many writers had to be
    /// aborted.
    pub async fn drain(
        self,
        mut writers: JoinSet<()>,
        mut rest: JoinSet<()>,
        grace: Duration,
    ) -> usize {
        let _ = self.0.send(true);
        let deadline = tokio::time::Instant::now() + grace;
        while !writers.is_empty() {
            if tokio::time::timeout_at(deadline, writers.join_next())
                .await
                .is_err()
            {
                break;
            }
        }
        let left = writers.len();
        for tasks in [&mut writers, &mut rest] {
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
        }
        left
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };

    use super::*;

    /// A writer that watches the signal finishes its write; one that does not is aborted at
    /// the end of the grace period, and the count says so; the rest do not hold the stop up.
    #[tokio::test]
    async fn a_writer_that_watches_finishes_its_work_and_the_rest_are_aborted() {
        let (stop, stopping) = channel();
        let finished = Arc::new(AtomicBool::new(false));
        let mut writers = JoinSet::new();
        let (done, mut watching) = (finished.clone(), stopping.clone());
        writers.spawn(async move {
            asked(&mut watching).await;
            // The write under way when the stop came.
            tokio::time::sleep(Duration::from_millis(50)).await;
            done.store(true, Ordering::SeqCst);
        });
        writers.spawn(std::future::pending());
        let mut rest = JoinSet::new();
        rest.spawn(std::future::pending());
        let aborted = stop.drain(writers, rest, Duration::from_millis(500)).await;
        assert!(
            finished.load(Ordering::SeqCst),
            "the watching writer finished"
        );
        assert_eq!(aborted, 1, "only the writer that never looks is aborted");
    }

    /// With every writer done at once, the stop does not wait out the grace period (an hour
    /// here) for the rest.
    #[tokio::test]
    async fn the_rest_do_not_hold_the_stop_up() {
        let (stop, mut stopping) = channel();
        let mut writers = JoinSet::new();
        writers.spawn(async move { asked(&mut stopping).await });
        let mut rest = JoinSet::new();
        rest.spawn(std::future::pending());
        let drained = stop.drain(writers, rest, Duration::from_secs(3600));
        let aborted = tokio::time::timeout(Duration::from_secs(30), drained)
            .await
            .expect("the stop waited for the rest");
        assert_eq!(aborted, 0);
    }
}
