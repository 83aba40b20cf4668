//! Runs every detector on its own interval, each in its own task (a hung detector never blocks
//! another), debounces the findings and publishes the reported state whenever it changes.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use tokio::{
    sync::{mpsc, watch},
    task::JoinSet,
};

mod debounce;

use self::debounce::{Change, Debounced};
use crate::{
    detect::{Detector, Finding, Schedule},
    metrics::{DetectorLabels, Metrics},
};

/// A reported finding with the wall-clock time its status last changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Current {
    pub finding: Finding,
    pub since: SystemTime,
}

/// Every detector's reported finding, by detector name.
pub type Snapshot = Arc<BTreeMap<String, Current>>;

/// Starts the detectors. The returned receiver sees a new snapshot after every change; the
/// tasks stop when the receiver and its clones are dropped.
pub fn start(
    detectors: Vec<Detector>,
    metrics: Arc<Metrics>,
    tasks: &mut JoinSet<()>,
) -> watch::Receiver<Snapshot> {
    let (found_tx, mut found_rx) = mpsc::channel::<(Duration, Finding)>(detectors.len().max(1) * 2);
    let (snapshot_tx, snapshot_rx) = watch::channel(Snapshot::default());
    if detectors.is_empty() {
        // Nothing will be found, so the empty snapshot is already the whole one: published as
        // a change, the first NodeReport is written now (and the agent gets ready) rather than
        // never, as with an agent run for its maintenances and shutdown guard alone.
        snapshot_tx.send_replace(Snapshot::default());
    }
    for detector in detectors {
        let found_tx = found_tx.clone();
        let metrics = metrics.clone();
        tasks.spawn(async move {
            let labels = DetectorLabels {
                detector: detector.name.to_string(),
            };
            let Schedule { interval, hold, .. } = detector.schedule;
            // Spread the first runs so that detectors with one interval do not run in lockstep.
            tokio::time::sleep(interval.mul_f64(rand::random::<f64>() * 0.1)).await;
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut wake = detector.wake.clone();
            loop {
                tokio::select! {
                    _ = ticks.tick() => {}
                    // A change between ticks: judged now, and the next tick a whole interval on.
                    Some(()) = async { wake.as_mut()?.changed().await.ok() }, if wake.is_some() => {
                        ticks.reset();
                    }
                }
                let started = Instant::now();
                let finding = detector.observe_bounded().await;
                metrics
                    .check_duration
                    .get_or_create(&labels)
                    .observe(started.elapsed().as_secs_f64());
                if found_tx.send((hold, finding)).await.is_err() {
                    return;
                }
            }
        });
    }
    drop(found_tx);
    tasks.spawn(async move {
        let mut state: BTreeMap<String, (Debounced, SystemTime)> = BTreeMap::new();
        // Keyed by the finding's detector name, which is the detector's own.
        while let Some((hold, finding)) = found_rx.recv().await {
            let name = finding.detector.to_string();
            let entry = state
                .entry(name)
                .or_insert_with(|| (Debounced::new(), SystemTime::now()));
            match entry.0.observe(finding, Instant::now(), hold) {
                Change::None => continue,
                Change::Status => entry.1 = SystemTime::now(),
                Change::Detail => {}
            }
            if let Some(reported) = entry.0.reported() {
                let finding = &reported.finding;
                metrics.check_verdict(&finding.detector, finding.status.metric_label());
            }
            let snapshot: BTreeMap<String, Current> = state
                .iter()
                .filter_map(|(name, (debounced, since))| {
                    debounced.reported().map(|r| {
                        let current = Current {
                            finding: r.finding.clone(),
                            since: *since,
                        };
                        (name.clone(), current)
                    })
                })
                .collect();
            if snapshot_tx.send(Arc::new(snapshot)).is_err() {
                return;
            }
        }
        // Without detectors the loop ends at once; the reporter's snapshots stay open (a closed
        // channel would end it, and with it the pause acknowledgements it writes).
        snapshot_tx.closed().await;
    });
    snapshot_rx
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        config::Config,
        detect::{Section, custom::CustomCheckConfig},
    };

    fn custom(name: &str, script: &str, hold: Duration) -> CustomCheckConfig {
        CustomCheckConfig {
            name: name.into(),
            condition: "TestProblem".into(),
            reason: "Broken".into(),
            command: vec!["/bin/sh".into(), "-c".into(), script.into()],
            interval: Duration::from_millis(50),
            timeout: Duration::from_millis(50),
            hold,
            max_output_length: 80,
            on_host: false,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn without_detectors_the_empty_snapshot_is_published_at_once() {
        let mut tasks = JoinSet::new();
        let mut snapshots = start(Vec::new(), Arc::new(Metrics::new()), &mut tasks);
        tokio::time::timeout(Duration::from_secs(1), snapshots.changed())
            .await
            .expect("published at once")
            .expect("runner alive");
        assert!(snapshots.borrow_and_update().is_empty());
        let later = tokio::time::timeout(Duration::from_millis(200), snapshots.changed()).await;
        assert!(
            later.is_err(),
            "no further change, and the channel stays open: {later:?}"
        );
        tasks.abort_all();
    }

    #[tokio::test]
    async fn a_hung_detector_does_not_hold_up_the_others_and_changes_are_published() {
        let marker = std::env::temp_dir().join(format!("nodeward-runner-{}", std::process::id()));
        let mut config = Config::default();
        config.detectors.custom = vec![
            custom("hangs", "sleep 60", Duration::ZERO),
            custom(
                "flips",
                &format!("test -e {} && exit 1; exit 0", marker.display()),
                Duration::ZERO,
            ),
        ];
        let detectors = config.detectors.custom.detectors(None);
        let mut tasks = JoinSet::new();
        let metrics = Arc::new(Metrics::new());
        let mut snapshots = start(detectors, metrics.clone(), &mut tasks);

        let wait_for = |pred: fn(&Snapshot) -> bool| {
            let mut rx = snapshots.clone();
            async move {
                tokio::time::timeout(Duration::from_secs(10), rx.wait_for(pred))
                    .await
                    .expect("the runner published in time")
                    .map(|s| s.clone())
                    .expect("runner alive")
            }
        };
        let first = wait_for(|s| s.contains_key("flips") && s.contains_key("hangs")).await;
        assert_eq!(first["flips"].finding.status, crate::detect::Status::Ok);
        assert_eq!(first["hangs"].finding.reason, "DetectorTimedOut");

        std::fs::write(&marker, "").expect("marker");
        let broken = wait_for(|s| {
            s.get("flips")
                .is_some_and(|c| c.finding.status == crate::detect::Status::Problem)
        })
        .await;
        assert!(broken["flips"].since >= first["flips"].since);
        // Each detector's reported status is exported, set before the snapshot is published.
        let text = metrics.encode();
        for line in [
            "nodeward_check_status{detector=\"flips\",status=\"problem\"} 1",
            "nodeward_check_status{detector=\"flips\",status=\"ok\"} 0",
            "nodeward_check_status{detector=\"hangs\",status=\"unknown\"} 1",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        std::fs::remove_file(&marker).ok();
        snapshots.mark_unchanged();
        tasks.abort_all();
    }
}
