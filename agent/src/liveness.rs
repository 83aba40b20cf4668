//! The agent's liveness: a Lease of its own (`nodeward-agent-<node>` in nodeward's namespace),
//! renewed every `reporting.heartbeatInterval`, as the kubelet keeps its node Lease. A Lease is
//! a few hundred bytes; the NodeReport, kilobytes, is written only when something in it
//! changes. The Lease is owned by the Node, so it goes with it.

use std::time::{Duration, Instant};

use k8s_openapi::{
    api::{coordination::v1::Lease, core::v1::Node},
    apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, Patch, PatchParams},
};
use nodeward_api::{
    fleet::{LEASE_LABEL, lease_name},
    labels::AGENT_FIELD_MANAGER,
};
use nodeward_runtime::{
    ApiError,
    stop::{self, Stopping},
};

use crate::{Error, backoff::Backoff, metrics::Metrics};

pub struct Liveness {
    pub client: Client,
    pub namespace: String,
    pub node: String,
    pub every: Duration,
    pub metrics: std::sync::Arc<Metrics>,
    pub contact: ApiContact,
}

/// When the API server last took this agent's heartbeat (a Lease renewal, a NodeReport with
/// its heartbeat time): the instant just before the time written was taken, so never later
/// than what the coordinator counts as heard. The fencing counts from it.
#[derive(Clone, Debug)]
pub struct ApiContact(std::sync::Arc<tokio::sync::watch::Sender<Option<Instant>>>);

impl Default for ApiContact {
    fn default() -> Self {
        Self(std::sync::Arc::new(tokio::sync::watch::channel(None).0))
    }
}

impl ApiContact {
    /// A heartbeat taken at `sent` was written.
    pub fn took(&self, sent: Instant) {
        self.0.send_if_modified(|last| {
            let later = last.is_none_or(|l| sent > l);
            if later {
                *last = Some(sent);
            }
            later
        });
    }

    pub fn last(&self) -> Option<Instant> {
        *self.0.borrow()
    }

    pub fn changes(&self) -> tokio::sync::watch::Receiver<Option<Instant>> {
        self.0.subscribe()
    }
}

impl Liveness {
    /// Renews the Lease every `every` (a little sooner or later, so that agents started
    /// together do not renew together) until a stop is asked for (between renewals); a failed
    /// renewal is retried with backoff.
    pub async fn run(self, mut stopping: Stopping) {
        let Some(name) = lease_name(&self.node) else {
            tracing::error!(node = %self.node, "the node name is longer than 238 characters, too long for the agent's Lease: the coordinator sees this agent's liveness only in its NodeReport");
            return;
        };
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        // The Node as owner, read until it exists, and again when the Lease was created anew
        // (the garbage collector took it: its owner is gone, perhaps a Node of the same name
        // replaced it).
        let mut owner: Option<OwnerReference> = None;
        let mut created = None;
        loop {
            let sent = Instant::now();
            let renewed = self.renew(&leases, &name, &mut owner).await;
            self.metrics.api_write("leases", renewed.is_ok());
            let wait = match renewed {
                Ok(lease) => {
                    self.contact.took(sent);
                    let creation = lease.metadata.creation_timestamp;
                    if created.is_some() && created != creation {
                        owner = None;
                    }
                    created = creation;
                    backoff.reset();
                    self.every.mul_f64(0.9 + rand::random::<f64>() * 0.2)
                }
                Err(e) => {
                    tracing::warn!(error = %e, lease = %name, "renewing the agent's Lease failed; will retry");
                    owner = None;
                    backoff.next_delay()
                }
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = stop::asked(&mut stopping) => return,
            }
        }
    }

    /// Writes the Lease renewed now, creating it if need be: one server-side apply, so the
    /// agent needs no read of Leases (it may read none, the coordinator's among them).
    async fn renew(
        &self,
        leases: &Api<Lease>,
        name: &str,
        owner: &mut Option<OwnerReference>,
    ) -> Result<Lease, Error> {
        if owner.is_none() {
            *owner = self.owner().await?;
        }
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(self.namespace.clone()),
                labels: Some([(LEASE_LABEL.to_owned(), "true".to_owned())].into()),
                owner_references: owner.clone().map(|o| vec![o]),
                ..ObjectMeta::default()
            },
            spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                holder_identity: Some(self.node.clone()),
                lease_duration_seconds: Some(self.duration_seconds()),
                renew_time: Some(MicroTime(Timestamp::now())),
                ..Default::default()
            }),
        };
        leases
            .patch(
                name,
                &PatchParams::apply(AGENT_FIELD_MANAGER).force(),
                &Patch::Apply(&lease),
            )
            .await
            .map_err(|e| {
                ApiError::new("renewing", format!("Lease {}/{name}", self.namespace), e).into()
            })
    }

    /// How long the Lease counts as held without renewal: three renewals.
    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.every.as_secs().saturating_mul(3)).unwrap_or(i32::MAX)
    }

    /// The Node, as owner, once it exists.
    async fn owner(&self) -> Result<Option<OwnerReference>, Error> {
        let node = Api::<Node>::all(self.client.clone())
            .get_opt(&self.node)
            .await
            .map_err(|e| ApiError::new("reading", format!("node {}", self.node), e))?;
        Ok(node.and_then(|n| n.metadata.uid).map(|uid| OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: self.node.clone(),
            uid,
            ..OwnerReference::default()
        }))
    }
}
