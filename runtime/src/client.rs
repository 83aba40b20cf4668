//! The Kubernetes client both daemons use.

use std::path::Path;

use crate::Error;

/// A client from `kubeconfig` (host mode) or the in-cluster service account, identifying
/// itself as `user_agent` and without kube-rs's built-in retries: nodeward retries with its
/// own backoff and must see a 429 (an eviction refused by a PodDisruptionBudget) at once.
pub async fn connect(
    kubeconfig: Option<&Path>,
    user_agent: &'static str,
) -> Result<kube::Client, Error> {
    let mut config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                Error::Connect(format!("reading kubeconfig {}: {e}", path.display()))
            })?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| {
                    Error::Connect(format!("loading kubeconfig {}: {e}", path.display()))
                })?
        }
        None => kube::Config::incluster().map_err(|e| {
            Error::Connect(format!(
                "in-cluster configuration (pass --kubeconfig when running on the host): {e}"
            ))
        })?,
    };
    config.default_retry = false;
    config.headers.push((
        hyper::header::USER_AGENT,
        hyper::header::HeaderValue::from_static(user_agent),
    ));
    kube::Client::try_from(config).map_err(|e| Error::Connect(e.to_string()))
}
