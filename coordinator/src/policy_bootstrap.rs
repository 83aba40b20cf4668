//! The agents' admission policy on a first install. Helm creates a ValidatingAdmissionPolicy
//! after every kind it knows, the agent DaemonSet among them, so the chart also installs a copy
//! of the policy and its binding as a pre-install hook (`<policy>-bootstrap`), in force before
//! any agent runs. Once the release's own binding has been in place for a moment, the copy is
//! retired here: left after an upgrade, it would hold the agents to the first install's rules.

use std::time::Duration;

use k8s_openapi::{
    api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
    jiff::Timestamp,
};
use kube::{Api, Client, api::DeleteParams};
use nodeward_runtime::write::{self, Outcome};
use nodeward_runtime::{ApiError, backoff::Backoff};

/// What the chart appends to the policy's name for its copy.
pub const SUFFIX: &str = "-bootstrap";

/// How long the release's own binding must have existed: the API server loads policies and
/// bindings from its watch, not at once.
pub const SETTLE: Duration = Duration::from_secs(5);

/// The name of the bootstrap copy of `policy` (and of its binding).
pub fn copy_of(policy: &str) -> String {
    format!("{policy}{SUFFIX}")
}

/// Whether the release's own binding, created at `created`, binds `policy` and has been in
/// force long enough at `now` for its copy to go.
pub fn own_binding_settled(
    binding: &ValidatingAdmissionPolicyBinding,
    policy: &str,
    now: Timestamp,
) -> bool {
    let binds_policy = binding.spec.as_ref().and_then(|s| s.policy_name.as_deref()) == Some(policy);
    let settled = binding
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(|created| now.duration_since(created.0).try_into().ok())
        .is_some_and(|age: Duration| age >= SETTLE);
    binds_policy && settled
}

/// Retires the copy of `policy` once the release's own binding (named as the policy) is in
/// force, retrying with backoff until done.
pub async fn retire(client: Client, policy: String) {
    let mut backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(120));
    loop {
        match retire_once(&client, &policy).await {
            Ok(true) => {
                tracing::info!(%policy, "the admission policy's bootstrap copy is retired");
                return;
            }
            Ok(false) => {
                tracing::debug!(%policy, "the release's admission policy binding is not in force yet");
            }
            Err(e) => {
                tracing::warn!(error = %e, "retiring the admission policy's bootstrap copy failed; will retry");
            }
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// One attempt: true once the release's own binding is in force and the copy is gone.
pub async fn retire_once(client: &Client, policy: &str) -> Result<bool, ApiError> {
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let own = bindings.get_opt(policy).await.map_err(|e| {
        ApiError::new(
            "reading",
            format!("ValidatingAdmissionPolicyBinding {policy}"),
            e,
        )
    })?;
    if !own.is_some_and(|b| own_binding_settled(&b, policy, Timestamp::now())) {
        return Ok(false);
    }
    let copy = copy_of(policy);
    // The binding first: a policy without a binding enforces nothing, a binding without its
    // policy is an error the API server reports on every request it matches.
    delete_if_present(&bindings, &copy).await?;
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    delete_if_present(&policies, &copy).await?;
    Ok(true)
}

async fn delete_if_present<K>(api: &Api<K>, name: &str) -> Result<(), ApiError>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match write::delete(api, name, &DeleteParams::default()).await {
        Outcome::Written(()) | Outcome::Gone(_) => Ok(()),
        Outcome::Conflict(e) | Outcome::Failed(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::admissionregistration::v1::ValidatingAdmissionPolicyBindingSpec,
        apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    };

    use super::*;

    fn binding(policy: &str, created: Timestamp) -> ValidatingAdmissionPolicyBinding {
        ValidatingAdmissionPolicyBinding {
            metadata: ObjectMeta {
                name: Some(policy.into()),
                creation_timestamp: Some(Time(created)),
                ..ObjectMeta::default()
            },
            spec: Some(ValidatingAdmissionPolicyBindingSpec {
                policy_name: Some(policy.into()),
                ..ValidatingAdmissionPolicyBindingSpec::default()
            }),
        }
    }

    #[test]
    fn the_copy_goes_only_once_the_release_binding_has_been_in_force_a_moment() {
        let policy = "nodeward-agent-own-node";
        let now = Timestamp::now();
        let young = binding(policy, now - Duration::from_secs(1));
        assert!(!own_binding_settled(&young, policy, now));
        let settled = binding(policy, now - SETTLE);
        assert!(own_binding_settled(&settled, policy, now));
        let elsewhere = binding("another-policy", now - SETTLE * 2);
        assert!(
            !own_binding_settled(&elsewhere, policy, now),
            "a binding of another policy"
        );
        assert_eq!(copy_of(policy), "nodeward-agent-own-node-bootstrap");
    }
}
