//! Keeps the webhook's certificate: in a Secret of the coordinator's namespace, issued and
//! renewed by [`certificate::decide`], loaded into [`ServingCert`] without a restart, and its CA
//! bundle kept in the ValidatingWebhookConfiguration. Every replica runs it: writes are
//! conditional (create, or replace at the resourceVersion read), so two replicas renewing at
//! once settle on one result, and every replica serves what the Secret holds.
//!
//! With `--webhook-cert-dir` instead (certificates from cert-manager or the operator), the
//! files are watched and reloaded when they change; nothing is written.

use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::{
    ByteString,
    api::{admissionregistration::v1::ValidatingWebhookConfiguration, core::v1::Secret},
};
use kube::{
    Api, Client,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use nodeward_runtime::{ApiError, backoff::Backoff, server::Readiness};

use super::{
    ServingCert,
    certificate::{self, Material, Step, Wanted},
};

/// The readiness gate the first loaded serving certificate opens: until then the API server
/// would get no certificate from this replica.
pub const CERTIFICATE_LOADED: &str = "the webhook's serving certificate is not loaded yet";

/// Looked at again at least this often, besides when the next renewal falls due.
const RECHECK: Duration = Duration::from_secs(600);

/// Where the Secret-kept certificate lives and what it must be.
#[derive(Clone)]
pub struct Keeper {
    pub client: Client,
    pub namespace: String,
    pub secret: String,
    /// The ValidatingWebhookConfiguration whose webhooks' `caBundle` is kept, and the webhook
    /// that must be in it.
    pub configuration: String,
    pub webhook: String,
    pub wanted: Wanted,
    pub serving: Arc<ServingCert>,
    pub readiness: Arc<Readiness>,
}

fn text(data: &BTreeMap<String, ByteString>, key: &str) -> Option<String> {
    data.get(key)
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
}

/// The material a Secret holds, or why it holds none.
pub fn read(secret: &Secret) -> Result<Material, String> {
    let empty = BTreeMap::new();
    let data = secret.data.as_ref().unwrap_or(&empty);
    let need = |key: &str| text(data, key).ok_or_else(|| format!("{key} is missing"));
    let next_issuer = match (
        text(data, certificate::NEXT_ISSUER_CERT),
        text(data, certificate::NEXT_ISSUER_KEY),
    ) {
        (Some(cert), Some(key)) => Some(certificate::Authority { cert, key }),
        _ => None,
    };
    Ok(Material {
        issuer: certificate::Authority {
            cert: need(certificate::ISSUER_CERT)?,
            key: need(certificate::ISSUER_KEY)?,
        },
        next_issuer,
        trust_bundle: need(certificate::TRUST_BUNDLE)?,
        serving_cert: need(certificate::SERVING_CERT)?,
        serving_key: need(certificate::SERVING_KEY)?,
    })
}

fn data(material: &Material) -> BTreeMap<String, ByteString> {
    let mut data = BTreeMap::new();
    let mut put = |key: &str, value: &str| {
        data.insert(key.to_owned(), ByteString(value.as_bytes().to_vec()));
    };
    put(certificate::TRUST_BUNDLE, &material.trust_bundle);
    put(certificate::SERVING_CERT, &material.serving_cert);
    put(certificate::SERVING_KEY, &material.serving_key);
    put(certificate::ISSUER_CERT, &material.issuer.cert);
    put(certificate::ISSUER_KEY, &material.issuer.key);
    if let Some(next) = &material.next_issuer {
        put(certificate::NEXT_ISSUER_CERT, &next.cert);
        put(certificate::NEXT_ISSUER_KEY, &next.key);
    }
    data
}

impl Keeper {
    fn secret_path(&self) -> String {
        format!("Secret {}/{}", self.namespace, self.secret)
    }

    fn configuration_path(&self) -> String {
        format!("ValidatingWebhookConfiguration {}", self.configuration)
    }

    /// Runs until the task is dropped: woken by changes of the Secret or the webhook
    /// configuration, and every [`RECHECK`].
    pub async fn run(self) {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let configurations: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
        let by_name =
            |name: &str| watcher::Config::default().fields(&format!("metadata.name={name}"));
        let secret_changes = watcher(secrets.clone(), by_name(&self.secret))
            .default_backoff()
            .map(|_| ());
        let configuration_changes = watcher(configurations.clone(), by_name(&self.configuration))
            .default_backoff()
            .map(|_| ());
        let mut changes = futures::stream::select(secret_changes, configuration_changes).boxed();
        let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(60));
        loop {
            let wait = match self.once(&secrets, &configurations).await {
                Ok(due) => {
                    backoff.reset();
                    let now = certificate::unix(std::time::SystemTime::now());
                    let until_due = u64::try_from(due.saturating_sub(now)).unwrap_or(0);
                    Duration::from_secs(until_due.max(1)).min(RECHECK)
                }
                Err(e) => {
                    tracing::warn!(secret = %self.secret_path(), error = %e, "keeping the webhook certificate; will retry");
                    backoff.next_delay()
                }
            };
            tokio::select! {
                _ = changes.next() => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One look: renew if due, load, publish. Returns when the next renewal is due.
    async fn once(
        &self,
        secrets: &Api<Secret>,
        configurations: &Api<ValidatingWebhookConfiguration>,
    ) -> Result<i64, String> {
        let now = certificate::unix(std::time::SystemTime::now());
        let existing = secrets
            .get_opt(&self.secret)
            .await
            .map_err(|e| ApiError::new("reading", self.secret_path(), e).to_string())?;
        let material = existing.as_ref().map(read);
        let step = match &material {
            None => Step::Fresh("there is no certificate yet"),
            Some(Err(why)) => {
                tracing::warn!(secret = %self.secret, %why, "the webhook certificate Secret is unusable; making a new one");
                Step::Fresh("the Secret is unusable")
            }
            Some(Ok(material)) => match certificate::facts(material, now) {
                Ok(facts) => certificate::decide(&facts, &self.wanted, now),
                Err(why) => {
                    tracing::warn!(secret = %self.secret, %why, "the webhook certificate is unreadable; making a new one");
                    Step::Fresh("the certificate is unreadable")
                }
            },
        };
        let mut current = material.and_then(Result::ok);
        if step != Step::Keep
            && let Some(renewed) = certificate::apply(step, current.as_ref(), &self.wanted, now)?
        {
            match self.write(secrets, existing, &renewed).await {
                Ok(()) => {
                    tracing::info!(secret = %self.secret, ?step, "webhook certificate written");
                    current = Some(renewed);
                }
                // Another replica wrote first (both start together at install): serve theirs,
                // which the Secret's watch brings at once.
                Err(e) if e.code() == Some(409) => {
                    tracing::info!(secret = %self.secret, "another replica wrote the webhook certificate first; using theirs");
                    return Ok(now);
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        let Some(current) = current else {
            return Ok(now);
        };
        self.publish(&current, configurations).await?;
        let facts = certificate::facts(&current, now)?;
        Ok(certificate::next_due(&facts))
    }

    /// Creates the Secret, or replaces it at the version read (another replica's write in
    /// between makes this one fail with a conflict; the next look reads theirs).
    async fn write(
        &self,
        secrets: &Api<Secret>,
        existing: Option<Secret>,
        material: &Material,
    ) -> Result<(), ApiError> {
        let labels = BTreeMap::from([(
            "app.kubernetes.io/component".to_owned(),
            "coordinator".to_owned(),
        )]);
        match existing {
            None => {
                let secret = Secret {
                    metadata: ObjectMeta {
                        name: Some(self.secret.clone()),
                        namespace: Some(self.namespace.clone()),
                        labels: Some(labels),
                        ..ObjectMeta::default()
                    },
                    type_: Some("kubernetes.io/tls".to_owned()),
                    data: Some(data(material)),
                    ..Secret::default()
                };
                secrets
                    .create(&PostParams::default(), &secret)
                    .await
                    .map_err(|e| ApiError::new("creating", self.secret_path(), e))?;
            }
            Some(mut secret) => {
                secret.data = Some(data(material));
                secret.type_ = Some("kubernetes.io/tls".to_owned());
                secrets
                    .replace(&self.secret, &PostParams::default(), &secret)
                    .await
                    .map_err(|e| ApiError::new("replacing", self.secret_path(), e))?;
            }
        }
        Ok(())
    }

    /// Loads the serving certificate and keeps the CA bundle in the webhook configuration.
    async fn publish(
        &self,
        material: &Material,
        configurations: &Api<ValidatingWebhookConfiguration>,
    ) -> Result<(), String> {
        if self
            .serving
            .load(&material.serving_cert, &material.serving_key)?
        {
            tracing::info!(secret = %self.secret, "serving the webhook certificate from the Secret");
        }
        self.readiness.pass(CERTIFICATE_LOADED);
        let Some(configuration) = configurations
            .get_opt(&self.configuration)
            .await
            .map_err(|e| ApiError::new("reading", self.configuration_path(), e).to_string())?
        else {
            tracing::debug!(configuration = %self.configuration, "no webhook configuration yet");
            return Ok(());
        };
        let webhooks = configuration.webhooks.unwrap_or_default();
        if !webhooks.iter().any(|w| w.name == self.webhook) {
            return Err(format!(
                "ValidatingWebhookConfiguration {} has no webhook named {}",
                self.configuration, self.webhook
            ));
        }
        // Every webhook of the configuration is served here (evictions, requests).
        let bundle = ByteString(material.trust_bundle.as_bytes().to_vec());
        let stale: Vec<WebhookCaBundle<'_>> = webhooks
            .iter()
            .filter(|w| w.client_config.ca_bundle.as_ref() != Some(&bundle))
            .map(|w| WebhookCaBundle {
                name: &w.name,
                client_config: ClientCaBundle { ca_bundle: &bundle },
            })
            .collect();
        if stale.is_empty() {
            return Ok(());
        }
        // A strategic merge patch: the webhooks list merges by name, so only these entries'
        // caBundle changes, whatever else was changed by others.
        let patch = CaBundlePatch { webhooks: stale };
        configurations
            .patch(
                &self.configuration,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
            .map_err(|e| {
                ApiError::new("writing the caBundle of", self.configuration_path(), e).to_string()
            })?;
        tracing::info!(configuration = %self.configuration, "webhook caBundle updated");
        Ok(())
    }
}

/// Serves the certificate in `dir` (`tls.crt`, `tls.key`) and loads it again whenever the files
/// change (a mounted Secret is updated in place by the kubelet).
pub async fn follow_files(
    dir: PathBuf,
    serving: Arc<ServingCert>,
    readiness: Arc<Readiness>,
    every: Duration,
) {
    loop {
        let cert = tokio::fs::read_to_string(dir.join(certificate::SERVING_CERT)).await;
        let key = tokio::fs::read_to_string(dir.join(certificate::SERVING_KEY)).await;
        match (cert, key) {
            (Ok(cert), Ok(key)) => match serving.load(&cert, &key) {
                Ok(changed) => {
                    if changed {
                        tracing::info!(dir = %dir.display(), "serving the webhook certificate from files");
                    }
                    readiness.pass(CERTIFICATE_LOADED);
                }
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "the webhook certificate files are unusable; serving the last good one")
                }
            },
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(dir = %dir.display(), error = %e, "reading the webhook certificate files")
            }
        }
        tokio::time::sleep(every).await;
    }
}
/// A strategic merge patch of one webhook's CA bundle.
#[derive(Debug, serde::Serialize)]
struct CaBundlePatch<'a> {
    webhooks: Vec<WebhookCaBundle<'a>>,
}

#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct WebhookCaBundle<'a> {
    name: &'a str,
    client_config: ClientCaBundle<'a>,
}

#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ClientCaBundle<'a> {
    ca_bundle: &'a ByteString,
}
