//! Leader election on a `coordination.k8s.io` Lease, the way client-go does it: a follower
//! takes the Lease over only after it has seen the record unchanged for the lease duration by
//! its own clock (no trust in other machines' clocks); the leader renews every retry period
//! and stops acting when it could not renew for the renew deadline, which is shorter than the
//! lease duration, so that it steps down before anyone else may take over. On shutdown the
//! leader releases the Lease so that the next one takes over at once.
//!
//! Acting as leader is only half the safety: every budget write is conditional on the
//! policy's resourceVersion, so even two coordinators that both believe they lead cannot
//! overbook a budget.

use std::time::{Duration, Instant};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
};
use kube::{
    Api,
    api::{ObjectMeta, PostParams},
};
use nodeward_runtime::ApiError;
use tokio::sync::watch;

use crate::{Error, metrics::Metrics};
use nodeward_runtime::write::{self, Outcome};

#[derive(Clone, Debug)]
pub struct Settings {
    pub name: String,
    pub namespace: String,
    /// This process's identity, recorded as the holder and in every admission it makes.
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// What to do with the Lease as it stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nobody holds it, or the holder let it expire: take it.
    Acquire,
    /// We hold it: renew it.
    Renew,
    /// Someone else holds it and renewed it recently enough.
    Follow { holder: String },
}

/// `unchanged_for`: how long this process has seen the same holder and renew time.
pub fn verdict(lease: Option<&LeaseSpec>, me: &str, unchanged_for: Duration) -> Verdict {
    let Some(spec) = lease else {
        return Verdict::Acquire;
    };
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() {
        return Verdict::Acquire;
    }
    if holder == me {
        return Verdict::Renew;
    }
    let duration = spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(Duration::from_secs(15), Duration::from_secs);
    if unchanged_for >= duration {
        Verdict::Acquire
    } else {
        Verdict::Follow {
            holder: holder.to_owned(),
        }
    }
}

/// The record a follower watches for change: holder and renew time.
fn record(spec: Option<&LeaseSpec>) -> (Option<String>, Option<MicroTime>, Option<i32>) {
    spec.map_or((None, None, None), |s| {
        (
            s.holder_identity.clone(),
            s.renew_time.clone(),
            s.lease_transitions,
        )
    })
}

fn now() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

/// Runs the election until `stop` fires, then releases the Lease if held. `leader` says
/// whether this process leads right now.
pub async fn run(
    client: kube::Client,
    settings: Settings,
    leader: watch::Sender<bool>,
    metrics: std::sync::Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
    let mut observed = record(None);
    let mut observed_at = Instant::now();
    let mut last_renewed: Option<Instant> = None;
    loop {
        match step(&api, &settings, &mut observed, &mut observed_at).await {
            Ok(leading) => {
                if leading {
                    last_renewed = Some(Instant::now());
                }
                set_leader(&leader, &metrics, &settings, leading);
            }
            Err(e) => {
                tracing::warn!(error = %e, lease = %settings.name, "leader election");
                // A leader that cannot renew steps down before the Lease can expire for others.
                if last_renewed.is_some_and(|t| t.elapsed() >= settings.renew_deadline) {
                    last_renewed = None;
                    set_leader(&leader, &metrics, &settings, false);
                }
            }
        }
        let jitter = settings.retry_period.mul_f64(rand::random::<f64>() * 0.2);
        tokio::select! {
            _ = tokio::time::sleep(settings.retry_period + jitter) => {}
            _ = stop.changed() => break,
        }
    }
    if *leader.borrow() {
        set_leader(&leader, &metrics, &settings, false);
        match release(&api, &settings).await {
            Ok(()) => tracing::info!(lease = %settings.name, "released the leader Lease"),
            Err(e) => tracing::warn!(error = %e, "releasing the leader Lease"),
        }
    }
}

fn set_leader(leader: &watch::Sender<bool>, metrics: &Metrics, settings: &Settings, leading: bool) {
    let changed = leader.send_if_modified(|current| {
        let changed = *current != leading;
        *current = leading;
        changed
    });
    metrics.leader.set(i64::from(leading));
    if changed {
        if leading {
            tracing::info!(identity = %settings.identity, "became the leader");
        } else {
            tracing::info!(identity = %settings.identity, "no longer the leader");
        }
    }
}

/// One round: reads the Lease and acquires, renews or follows. Returns whether we lead.
async fn step(
    api: &Api<Lease>,
    settings: &Settings,
    observed: &mut (Option<String>, Option<MicroTime>, Option<i32>),
    observed_at: &mut Instant,
) -> Result<bool, Error> {
    let current = api
        .get_opt(&settings.name)
        .await
        .map_err(|e| ApiError::new("reading lease", settings.name.clone(), e))?;
    let spec = current.as_ref().and_then(|l| l.spec.as_ref());
    let seen = record(spec);
    if seen != *observed {
        *observed = seen;
        *observed_at = Instant::now();
    }
    let verdict = verdict(spec, &settings.identity, observed_at.elapsed());
    let Some(mut lease) = current else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(settings.name.clone()),
                namespace: Some(settings.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(held_spec(settings, 0)),
        };
        return match write::create(api, &lease).await {
            Outcome::Written(_) => Ok(true),
            // Someone else created it first; follow them next round.
            Outcome::Conflict(_) => Ok(false),
            Outcome::Gone(e) | Outcome::Failed(e) => Err(e.into()),
        };
    };
    let old = lease.spec.take().unwrap_or_default();
    let spec = match verdict {
        Verdict::Follow { .. } => return Ok(false),
        Verdict::Renew => LeaseSpec {
            renew_time: Some(now()),
            lease_duration_seconds: Some(seconds(settings.lease_duration)),
            ..old
        },
        Verdict::Acquire => {
            let transitions = old.lease_transitions.unwrap_or(0).saturating_add(1);
            held_spec(settings, transitions)
        }
    };
    lease.spec = Some(spec);
    // The resourceVersion in `lease` makes this a compare-and-swap: of two candidates only one
    // wins, the other gets Conflict and follows.
    match write::replace(api, &lease).await {
        Outcome::Written(_) => Ok(true),
        Outcome::Conflict(_) => Ok(false),
        Outcome::Gone(e) | Outcome::Failed(e) => Err(e.into()),
    }
}

fn seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

fn held_spec(settings: &Settings, transitions: i32) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(settings.identity.clone()),
        lease_duration_seconds: Some(seconds(settings.lease_duration)),
        acquire_time: Some(now()),
        renew_time: Some(now()),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    }
}

/// Gives the Lease up (holder cleared) so that a follower takes over without waiting for it
/// to expire.
async fn release(api: &Api<Lease>, settings: &Settings) -> Result<(), Error> {
    let mut lease = api
        .get(&settings.name)
        .await
        .map_err(|e| ApiError::new("reading lease", settings.name.clone(), e))?;
    let Some(spec) = lease.spec.as_mut() else {
        return Ok(());
    };
    if spec.holder_identity.as_deref() != Some(settings.identity.as_str()) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(now());
    api.replace(&settings.name, &PostParams::default(), &lease)
        .await
        .map(|_| ())
        .map_err(|e| ApiError::new("releasing lease", settings.name.clone(), e).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_by(holder: &str, seconds: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(seconds),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn a_missing_or_released_lease_is_acquired() {
        assert_eq!(verdict(None, "a", Duration::ZERO), Verdict::Acquire);
        let released = LeaseSpec {
            holder_identity: None,
            ..held_by("", 15)
        };
        assert_eq!(
            verdict(Some(&released), "a", Duration::ZERO),
            Verdict::Acquire
        );
        assert_eq!(
            verdict(Some(&held_by("", 15)), "a", Duration::ZERO),
            Verdict::Acquire
        );
    }

    #[test]
    fn our_own_lease_is_renewed() {
        assert_eq!(
            verdict(Some(&held_by("a", 15)), "a", Duration::from_secs(60)),
            Verdict::Renew
        );
    }

    #[test]
    fn another_holder_is_followed_until_its_record_went_unchanged_for_the_duration() {
        let lease = held_by("b", 15);
        assert_eq!(
            verdict(Some(&lease), "a", Duration::from_secs(14)),
            Verdict::Follow { holder: "b".into() }
        );
        assert_eq!(
            verdict(Some(&lease), "a", Duration::from_secs(15)),
            Verdict::Acquire
        );
    }
}
