//! The agent's liveness: a Lease of its own (`nodeward-agent-<node>` in nodeward's namespace),
//! renewed every `reporting.heartbeatInterval`, as the kubelet keeps its node Lease. A Lease is
//! a few hundred bytes; the NodeReport, kilobytes, is written only when something in it
//! changes. The Lease is owned by the Node, so it goes with it.

use std::time::Duration;

use k8s_openapi::{
    api::{coordination::v1::Lease, core::v1::Node},
    apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use nodeward_api::fleet::{LEASE_LABEL, lease_name};
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
        // The Lease as last written: renewing it is one write (a conflict reads it again).
        let mut last: Option<Lease> = None;
        loop {
            let renewed = self.renew(&leases, &name, last.take()).await;
            self.metrics.api_write("leases", renewed.is_ok());
            let wait = match renewed {
                Ok(lease) => {
                    last = Some(lease);
                    backoff.reset();
                    self.every.mul_f64(0.9 + rand::random::<f64>() * 0.2)
                }
                Err(e) => {
                    tracing::warn!(error = %e, lease = %name, "renewing the agent's Lease failed; will retry");
                    backoff.next_delay()
                }
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = stop::asked(&mut stopping) => return,
            }
        }
    }

    /// Creates the Lease, or moves its renewal time to now; returns it as written.
    async fn renew(
        &self,
        leases: &Api<Lease>,
        name: &str,
        last: Option<Lease>,
    ) -> Result<Lease, Error> {
        let now = MicroTime(Timestamp::now());
        let object = format!("Lease {}/{name}", self.namespace);
        let existing = match last {
            Some(lease) => Some(lease),
            None => leases
                .get_opt(name)
                .await
                .map_err(|e| ApiError::new("reading", object.clone(), e))?,
        };
        let Some(mut lease) = existing else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    namespace: Some(self.namespace.clone()),
                    labels: Some([(LEASE_LABEL.to_owned(), "true".to_owned())].into()),
                    owner_references: self.owner().await?.map(|o| vec![o]),
                    ..ObjectMeta::default()
                },
                spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                    holder_identity: Some(self.node.clone()),
                    lease_duration_seconds: Some(self.duration_seconds()),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    ..Default::default()
                }),
            };
            return leases
                .create(&PostParams::default(), &lease)
                .await
                .map_err(|e| ApiError::new("creating", object, e).into());
        };
        if lease
            .metadata
            .owner_references
            .as_ref()
            .is_none_or(Vec::is_empty)
        {
            // Created before the Node was registered.
            lease.metadata.owner_references = self.owner().await?.map(|o| vec![o]);
        }
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.holder_identity = Some(self.node.clone());
        spec.lease_duration_seconds = Some(self.duration_seconds());
        spec.renew_time = Some(now);
        // The resourceVersion makes this a compare-and-swap: on a conflict the next attempt
        // reads the Lease again.
        leases
            .replace(name, &PostParams::default(), &lease)
            .await
            .map_err(|e| ApiError::new("renewing", object, e).into())
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
