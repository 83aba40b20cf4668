//! The Kubernetes client both daemons use, counting its requests by verb and resource.

use std::{path::Path, sync::Arc};

use crate::Error;

/// Told of every request the client sends: (verb, resource), e.g. `("watch", "nodes")`,
/// `("create", "pods/eviction")`.
pub type OnRequest = Arc<dyn Fn(&'static str, &str) + Send + Sync>;

/// The Kubernetes verb and resource of a request, from its method, path and query:
/// `GET /api/v1/nodes?watch=true` is ("watch", "nodes"),
/// `POST /api/v1/namespaces/a/pods/p/eviction` is ("create", "pods/eviction").
pub fn classify(method: &hyper::Method, path: &str, query: Option<&str>) -> (&'static str, String) {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // /api/v1/... or /apis/group/version/...
    let rest: &[&str] = match segments.first() {
        Some(&"api") => segments.get(2..).unwrap_or_default(),
        Some(&"apis") => segments.get(3..).unwrap_or_default(),
        _ => &[],
    };
    let rest = match rest {
        ["namespaces", _, more @ ..] if !more.is_empty() => more,
        other => other,
    };
    let (resource, named) = match rest {
        [] => ("".to_owned(), false),
        [resource] => ((*resource).to_owned(), false),
        [resource, _name] => ((*resource).to_owned(), true),
        [resource, _name, sub, ..] => (format!("{resource}/{sub}"), true),
    };
    let watch = query.is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    let verb = match *method {
        hyper::Method::GET if watch => "watch",
        hyper::Method::GET if named => "get",
        hyper::Method::GET => "list",
        hyper::Method::POST => "create",
        hyper::Method::PUT => "update",
        hyper::Method::PATCH => "patch",
        hyper::Method::DELETE if named => "delete",
        hyper::Method::DELETE => "deletecollection",
        _ => "other",
    };
    (verb, resource)
}

/// A client from `kubeconfig` (host mode) or the in-cluster service account, identifying
/// itself as `user_agent` and without kube-rs's built-in retries: nodeward retries with its
/// own backoff and must see a 429 (an eviction refused by a PodDisruptionBudget) at once.
pub async fn connect(
    kubeconfig: Option<&Path>,
    user_agent: &'static str,
) -> Result<kube::Client, Error> {
    connect_counting(kubeconfig, user_agent, None).await
}

/// As [`connect`], telling `on_request` of every request.
pub async fn connect_counting(
    kubeconfig: Option<&Path>,
    user_agent: &'static str,
    on_request: Option<OnRequest>,
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
    let builder =
        kube::client::ClientBuilder::try_from(config).map_err(|e| Error::Connect(e.to_string()))?;
    let Some(on_request) = on_request else {
        return Ok(builder.build());
    };
    let counting =
        tower::util::MapRequestLayer::new(move |request: hyper::Request<kube::client::Body>| {
            let (verb, resource) = classify(
                request.method(),
                request.uri().path(),
                request.uri().query(),
            );
            on_request(verb, &resource);
            request
        });
    Ok(builder.with_layer(&counting).build())
}

#[cfg(test)]
mod tests {
    use hyper::Method;

    use super::classify;

    #[test]
    fn requests_are_named_by_verb_and_resource() {
        let c = |m: Method, path: &str, q: Option<&str>| {
            let (verb, resource) = classify(&m, path, q);
            format!("{verb} {resource}")
        };
        assert_eq!(
            c(
                Method::GET,
                "/api/v1/nodes",
                Some("watch=true&resourceVersion=5")
            ),
            "watch nodes"
        );
        assert_eq!(
            c(Method::GET, "/api/v1/nodes", Some("limit=500")),
            "list nodes"
        );
        assert_eq!(c(Method::GET, "/api/v1/nodes/n1", None), "get nodes");
        assert_eq!(
            c(Method::PATCH, "/api/v1/nodes/n1/status", None),
            "patch nodes/status"
        );
        assert_eq!(
            c(Method::POST, "/api/v1/namespaces/a/pods/p/eviction", None),
            "create pods/eviction"
        );
        assert_eq!(
            c(
                Method::GET,
                "/api/v1/namespaces/a/pods",
                Some("fieldSelector=spec.nodeName%3Dn1")
            ),
            "list pods"
        );
        assert_eq!(
            c(
                Method::PATCH,
                "/apis/nodeward.io/v1alpha1/nodereports/n1/status",
                None
            ),
            "patch nodereports/status"
        );
        assert_eq!(
            c(
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/default/events",
                None
            ),
            "create events"
        );
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces", None),
            "list namespaces"
        );
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces/kube-system", None),
            "get namespaces"
        );
        assert_eq!(
            c(
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/n/leases/l",
                None
            ),
            "update leases"
        );
    }
}
