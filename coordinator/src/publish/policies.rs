//! The policies as agents need them, in one ConfigMap (see `nodeward_api::fleet`): rewritten
//! when a policy is created, deleted or its spec edited, never for its status, which changes
//! with every admission.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use nodeward_api::{
    DisruptionPolicy,
    fleet::{POLICIES_CONFIGMAP, POLICIES_KEY, PublishedPolicies},
};

/// A ConfigMap holds at most 1 MiB; this leaves room for its metadata.
pub const LIMIT: usize = 1000 * 1024;

/// The ConfigMap to write for `policies` in `namespace`, or None when `current` already says
/// the same (or the policies do not fit, which is logged: the agents keep what they have).
pub fn wanted(
    policies: &[Arc<DisruptionPolicy>],
    current: Option<&ConfigMap>,
    namespace: &str,
) -> Option<ConfigMap> {
    let published = PublishedPolicies::of(policies.iter().map(AsRef::as_ref));
    let text = match serde_json::to_string(&published) {
        Ok(text) => text,
        Err(e) => {
            tracing::error!(error = %e, "the policies cannot be written as JSON");
            return None;
        }
    };
    if text.len() > LIMIT {
        tracing::error!(
            bytes = text.len(),
            policies = published.policies.len(),
            "the policies' specs together are larger than a ConfigMap holds: agents keep the ones published before"
        );
        return None;
    }
    let unchanged = current
        .and_then(|c| c.data.as_ref()?.get(POLICIES_KEY))
        .is_some_and(|old| *old == text);
    (!unchanged).then(|| ConfigMap {
        metadata: ObjectMeta {
            name: Some(POLICIES_CONFIGMAP.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some([(POLICIES_KEY.to_owned(), text)].into()),
        ..ConfigMap::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(name: &str, generation: i64, paused: bool) -> Arc<DisruptionPolicy> {
        let mut p: DisruptionPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
            "metadata": {"name": name, "generation": generation},
            "spec": {"paused": paused},
        }))
        .expect("policy");
        p.status = Some(Default::default());
        Arc::new(p)
    }

    #[test]
    fn only_a_changed_spec_is_written_again() {
        let policies = vec![policy("a", 1, false)];
        let first = wanted(&policies, None, "ns").expect("nothing published yet");
        assert_eq!(first.metadata.name.as_deref(), Some(POLICIES_CONFIGMAP));
        assert_eq!(
            wanted(&policies, Some(&first), "ns"),
            None,
            "the same again"
        );

        // The status changed (an admission): nothing to write.
        let mut admitted = (*policies[0]).clone();
        admitted
            .status
            .get_or_insert_with(Default::default)
            .in_maintenance = 3;
        assert_eq!(wanted(&[Arc::new(admitted)], Some(&first), "ns"), None);

        // Paused (a new generation): written.
        let paused = wanted(&[policy("a", 2, true)], Some(&first), "ns").expect("written");
        let text = &paused.data.as_ref().expect("data")[POLICIES_KEY];
        let read: PublishedPolicies = serde_json::from_str(text).expect("json");
        assert!(read.policies[0].spec.paused);
        assert_eq!(read.policies[0].generation, 2);
    }
}
