//! A drain under watch, as the maintenance executor and the shutdown guard both run one: the
//! newest progress once a second (for the caller to record), then how it ended. The drain's
//! deadline is enforced here as well, since a stage can overrun it while an API call hangs.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{
    task::JoinHandle,
    time::{Instant, Interval},
};

use super::evict::{self, Drain, Outcome, Progress};
use crate::Error;

/// What [`Watched::next`] reports.
#[derive(Debug)]
pub enum Report {
    /// A second passed; the progress since the last report, if there was any.
    Tick(Option<Progress>),
    /// The drain is over: its outcome (`None`: the deadline came first) and the progress not
    /// yet reported.
    Ended {
        outcome: Option<Result<Outcome, Error>>,
        last: Option<Progress>,
    },
}

/// A running drain, in a task of its own so that it goes on while the caller records its
/// progress. Dropping it stops the drain.
pub struct Watched {
    /// `None` once it ended.
    draining: Option<JoinHandle<Result<Outcome, Error>>>,
    deadline: Option<Instant>,
    tick: Interval,
    latest: Arc<Mutex<Option<Progress>>>,
}

impl Watched {
    /// Starts `drain`.
    pub fn start(drain: Drain) -> Self {
        let latest: Arc<Mutex<Option<Progress>>> = Arc::default();
        let seen = latest.clone();
        let deadline = drain.deadline;
        let draining = tokio::spawn(async move {
            evict::run(&drain, move |p| {
                if let Ok(mut l) = seen.lock() {
                    *l = Some(p.clone());
                }
            })
            .await
        });
        Self {
            draining: Some(draining),
            deadline,
            tick: tokio::time::interval(Duration::from_secs(1)),
            latest,
        }
    }

    /// The next second's progress, or the end; after the end, nothing more (it waits forever).
    pub async fn next(&mut self) -> Report {
        let Some(draining) = self.draining.as_mut() else {
            return std::future::pending().await;
        };
        let deadline = self.deadline;
        let out_of_time = async move {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let outcome = tokio::select! {
            joined = draining => Some(joined.unwrap_or_else(|e| Err(Error::DrainTask(e.to_string())))),
            _ = out_of_time => None,
            _ = self.tick.tick() => return Report::Tick(self.take()),
        };
        if let Some(draining) = self.draining.take() {
            draining.abort();
        }
        Report::Ended {
            outcome,
            last: self.take(),
        }
    }

    fn take(&self) -> Option<Progress> {
        self.latest.lock().ok().and_then(|mut l| l.take())
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if let Some(draining) = &self.draining {
            draining.abort();
        }
    }
}
