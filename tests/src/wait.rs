//! Waiting on conditions with a deadline (never sleeping and hoping).

use std::{fmt::Debug, future::Future, time::Duration};

use anyhow::{Context, anyhow};
use kube::{Api, Resource, runtime::wait::await_condition};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

/// Waits, through a watch, until `condition` holds for the object `name`, or fails after
/// `timeout` naming `what` was awaited.
pub async fn until<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    timeout: Duration,
    condition: impl Fn(Option<&K>) -> bool,
) -> anyhow::Result<Option<K>>
where
    K: Resource + Clone + Debug + Send + Serialize + DeserializeOwned + 'static,
{
    match tokio::time::timeout(timeout, await_condition(api.clone(), name, condition)).await {
        Ok(found) => found.with_context(|| format!("watching {name} for {what}")),
        Err(_) => Err(anyhow!(
            "timed out after {timeout:?} waiting for {what} ({name}); {}",
            last_seen(api, name).await
        )),
    }
}

/// The status of `name` as it is now, for a timeout's message: what was there instead of
/// what was awaited.
async fn last_seen<K>(api: &Api<K>, name: &str) -> String
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
{
    const MAX: usize = 4000;
    match api.get_opt(name).await {
        Ok(None) => "it does not exist".to_string(),
        Err(error) => format!("reading it again failed: {error}"),
        Ok(Some(object)) => {
            let json = serde_json::to_value(&object).unwrap_or_default();
            let mut shown = json.get("status").unwrap_or(&Value::Null).to_string();
            if shown.len() > MAX {
                let end = (0..=MAX)
                    .rev()
                    .find(|&i| shown.is_char_boundary(i))
                    .unwrap_or(0);
                shown.truncate(end);
                shown.push_str("...");
            }
            format!("its status now: {shown}")
        }
    }
}

/// Waits, like [`until`], until `extract` finds what is awaited in the object `name`, and
/// returns what it found.
pub async fn until_some<K, T>(
    api: &Api<K>,
    name: &str,
    what: &str,
    timeout: Duration,
    extract: impl Fn(&K) -> Option<T>,
) -> anyhow::Result<T>
where
    K: Resource + Clone + Debug + Send + Serialize + DeserializeOwned + 'static,
{
    let found = until(api, name, what, timeout, |k| k.and_then(&extract).is_some()).await?;
    found
        .as_ref()
        .and_then(&extract)
        .with_context(|| format!("{name}: {what} not found"))
}

/// Waits until the NodeMaintenance `name` is in `phase`, and returns it.
pub async fn phase(
    api: &Api<nodeward_api::NodeMaintenance>,
    name: &str,
    phase: nodeward_api::MaintenancePhase,
    timeout: Duration,
) -> anyhow::Result<nodeward_api::NodeMaintenance> {
    until_some(api, name, &format!("{phase:?}"), timeout, |m| {
        (m.phase() == phase).then(|| m.clone())
    })
    .await
}

/// Deletes the object `name` and waits until it is gone. Already gone, or deleted by someone
/// else between a list and this call, is fine: what is asked for is that it no longer exists.
pub async fn deleted<K>(api: &Api<K>, name: &str, timeout: Duration) -> anyhow::Result<()>
where
    K: Resource + Clone + Debug + Send + Serialize + DeserializeOwned + 'static,
{
    match api.delete(name, &kube::api::DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("deleting {name}")),
    }
    until(api, name, "it gone", timeout, |o| o.is_none()).await?;
    Ok(())
}

/// Polls `probe` until it returns `Some`, or fails after `timeout`; for states no single
/// object's watch shows.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last_error = None;
    loop {
        match probe().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(e) => last_error = Some(e),
        }
        if tokio::time::Instant::now() >= deadline {
            let why = last_error
                .map(|e| format!(" (last error: {e:#})"))
                .unwrap_or_default();
            return Err(anyhow!(
                "timed out after {timeout:?} waiting for {what}{why}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Reads a condition's status from any object's `status.conditions`.
pub fn condition_status<K: serde::Serialize>(object: &K, type_: &str) -> Option<String> {
    let value = serde_json::to_value(object).ok()?;
    value
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))?
        .get("status")?
        .as_str()
        .map(str::to_owned)
}

/// A Node's out-of-service taint (`node.kubernetes.io/out-of-service`), if it has one.
pub fn out_of_service_taint(
    node: Option<&k8s_openapi::api::core::v1::Node>,
) -> Option<&k8s_openapi::api::core::v1::Taint> {
    node?
        .spec
        .as_ref()?
        .taints
        .as_ref()?
        .iter()
        .find(|t| t.key == nodeward_api::labels::OUT_OF_SERVICE_TAINT)
}

/// A Node's condition of `type_`: its status and reason.
pub fn node_condition(
    node: Option<&k8s_openapi::api::core::v1::Node>,
    type_: &str,
) -> Option<(String, String)> {
    let c = node?
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone().unwrap_or_default()))
}
