//! The control plane authenticates service-account tokens (with the node-name claim of a
//! pod-bound token), supports impersonation, and authorizes through RBAC: what the RBAC tests
//! of later issues build on.

use std::time::Duration;

use k8s_openapi::api::{
    authentication::v1::{SelfSubjectReview, TokenRequest},
    core::v1::{Node, Pod, ServiceAccount},
    rbac::v1::{Role, RoleBinding},
};
use kube::{
    Api, ResourceExt,
    api::{ListParams, PostParams},
};
use nodeward_e2e::{Identity, PodOptions, TestEnv, controlplane::client_as, wait};
use serde_json::json;

fn is_forbidden(result: &Result<impl std::fmt::Debug, kube::Error>) -> bool {
    matches!(result, Err(kube::Error::Api(status)) if status.code == 403)
}

#[tokio::test]
async fn service_account_tokens_impersonation_and_rbac_work() -> anyhow::Result<()> {
    let (env, node) = TestEnv::with_worker("identity", "zone-a").await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(env.client.clone(), &env.namespace);
    let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "reader"}}))?;
    accounts.create(&PostParams::default(), &account).await?;
    let options = PodOptions {
        service_account: Some("reader".into()),
        ..PodOptions::default()
    };
    env.replicaset("holder", &node, 1, &options).await?;
    let pod = env.running_pods("holder", 1).await?.remove(0);

    // A token bound to the pod, as the kubelet projects it into the pod.
    let request: TokenRequest = serde_json::from_value(json!({
        "spec": {
            "audiences": ["https://kubernetes.default.svc"],
            "expirationSeconds": 600,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod.name_any(), "uid": pod.uid()},
        }
    }))?;
    let issued: TokenRequest = accounts
        .create_subresource("token", "reader", &PostParams::default(), &request)
        .await?;
    let token = issued.status.map(|s| s.token).unwrap_or_default();
    assert!(!token.is_empty(), "the API server issued no token");

    let as_account = client_as(Identity::Token(token)).await?;
    let review: SelfSubjectReview = Api::<SelfSubjectReview>::all(as_account.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {}}))?,
        )
        .await?;
    let user = review.status.and_then(|s| s.user_info).expect("user info");
    let service_account_user = format!("system:serviceaccount:{}:reader", env.namespace);
    assert_eq!(
        user.username.as_deref(),
        Some(service_account_user.as_str())
    );
    let node_claim = user
        .extra
        .as_ref()
        .and_then(|extra| extra.get("authentication.kubernetes.io/node-name"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        node_claim,
        vec![node.clone()],
        "the pod-bound token carries its node's name"
    );

    // RBAC: nothing before the binding, exactly the bound permissions after it.
    let pods_as_account: Api<Pod> = Api::namespaced(as_account.clone(), &env.namespace);
    assert!(is_forbidden(
        &pods_as_account.list(&ListParams::default()).await
    ));
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "pod-reader"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
    }))?;
    Api::<Role>::namespaced(env.client.clone(), &env.namespace)
        .create(&PostParams::default(), &role)
        .await?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "pod-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": env.namespace}],
    }))?;
    Api::<RoleBinding>::namespaced(env.client.clone(), &env.namespace)
        .create(&PostParams::default(), &binding)
        .await?;
    // The authorizer's informers see the binding a moment later.
    let listed = wait::eventually(
        "the RoleBinding to take effect",
        Duration::from_secs(30),
        || {
            let pods = pods_as_account.clone();
            async move { Ok(pods.list(&ListParams::default()).await.ok()) }
        },
    )
    .await?;
    assert_eq!(listed.items.len(), 1);
    assert!(is_forbidden(
        &Api::<Node>::all(as_account)
            .list(&ListParams::default())
            .await
    ));

    // Impersonation by the admin gets the same answers as the token.
    let impersonated = client_as(Identity::Impersonate {
        user: service_account_user,
        groups: vec![
            "system:serviceaccounts".into(),
            "system:authenticated".into(),
        ],
    })
    .await?;
    let pods: Api<Pod> = Api::namespaced(impersonated.clone(), &env.namespace);
    assert_eq!(pods.list(&ListParams::default()).await?.items.len(), 1);
    assert!(is_forbidden(
        &Api::<Node>::all(impersonated)
            .list(&ListParams::default())
            .await
    ));
    env.cleanup().await
}
