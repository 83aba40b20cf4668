//! The admission webhook that keeps each agent's evictions to the pods of its own node, its
//! reboot requests to a few at once ([`requests`]) and its Events to a bounded rate
//! ([`events`]). A ValidatingAdmissionPolicy can do none of it: an eviction's admission request
//! carries the Eviction, not the pod, and a policy can neither read the pod nor count objects. The chart's ValidatingWebhookConfiguration sends
//! only the agent's `pods/eviction`, NodeMaintenance and Event creations here; every
//! coordinator replica answers, leader or not. The same server answers the API server's
//! authorization webhook, where one is configured: each agent's reads of its own node's pods
//! ([`pod_reads`]).
//!
//! The decision is a pure function of the request and the pod's node; serving is HTTPS with
//! the certificate the coordinator keeps itself ([`keeper`]) or one from files
//! (`--webhook-cert-dir`), reloaded when it changes.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, RwLock},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, Response, StatusCode, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use nodeward_api::labels::AGENT_USER_PREFIX;
use nodeward_runtime::listener::{self, Limits};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use serde_json::{Value, json};
use tokio_rustls::{
    TlsAcceptor,
    rustls::{
        self,
        server::{ClientHello, ResolvesServerCert},
        sign::CertifiedKey,
    },
};

pub mod certificate;
pub mod events;
pub mod keeper;
pub mod pod_reads;
pub mod requests;

pub use self::keeper::{CERTIFICATE_LOADED, Keeper};

/// The claim a pod-bound service-account token carries: the pod's node.
pub const NODE_CLAIM: &str = "authentication.kubernetes.io/node-name";
/// The path the ValidatingWebhookConfiguration calls.
pub const EVICTION_PATH: &str = "/validate/eviction";
/// AdmissionReviews larger than this are refused unread.
const MAX_REVIEW: usize = 256 * 1024;

/// Who asks: the user, and the node it acts for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub user: String,
    /// Named by its token's claim, or by its user name (a host-mode agent's certificate,
    /// [`AGENT_USER_PREFIX`]), if either does.
    pub node: Option<String>,
}

impl Caller {
    /// Its node, or why a request without one is refused.
    pub fn node(&self) -> Result<&str, String> {
        self.node.as_deref().ok_or_else(|| {
            format!(
                "{} names no node: nodeward-agent needs a service-account token bound to the agent's pod or Node ({NODE_CLAIM}), or a host-mode certificate for the user {AGENT_USER_PREFIX}<node>",
                self.user
            )
        })
    }

    /// `user`, acting for the node its token claims (`claimed`) or its user name names.
    pub fn of(user: String, claimed: Option<&str>) -> Self {
        let named = user.strip_prefix(AGENT_USER_PREFIX);
        Caller {
            node: claimed
                .or(named)
                .filter(|n| !n.is_empty())
                .map(String::from),
            user,
        }
    }
}

/// The caller of an AdmissionReview's `request`.
pub fn caller(request: &Value) -> Caller {
    let user = request["userInfo"]["username"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    Caller::of(user, request["userInfo"]["extra"][NODE_CLAIM][0].as_str())
}

/// What the API server asked about one eviction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvictionRequest {
    pub uid: String,
    pub caller: Caller,
    pub namespace: String,
    pub pod: String,
}

/// Reads the fields the decision needs from an AdmissionReview; the error says what is
/// missing.
pub fn parse(review: &Value) -> Result<EvictionRequest, String> {
    let request = ReviewRequest::of(review)?;
    Ok(EvictionRequest {
        uid: request.text("uid")?,
        caller: caller(request.0),
        namespace: request.text("namespace")?,
        pod: request.text("name")?,
    })
}

/// The `request` of an AdmissionReview.
pub struct ReviewRequest<'a>(pub &'a Value);

impl<'a> ReviewRequest<'a> {
    pub fn of(review: &'a Value) -> Result<Self, String> {
        review
            .get("request")
            .map(Self)
            .ok_or_else(|| "the AdmissionReview has no request".to_owned())
    }

    /// A text field of the request; the error names it.
    pub fn text(&self, field: &str) -> Result<String, String> {
        self.0[field]
            .as_str()
            .map(String::from)
            .ok_or_else(|| format!("request.{field} is missing"))
    }
}

/// Whether the eviction may go ahead: the caller's node must be the pod's. `pod_node` is the
/// pod's node (`None`: the pod does not exist, and the eviction fails on its own).
pub fn decide(request: &EvictionRequest, pod_node: Option<Option<&str>>) -> Result<(), String> {
    let node = request.caller.node()?;
    match pod_node {
        None => Ok(()),
        Some(Some(on)) if on == node => Ok(()),
        Some(on) => Err(format!(
            "nodeward-agent on node {node} may evict only pods on its own node; {}/{} runs on {}",
            request.namespace,
            request.pod,
            on.unwrap_or("no node")
        )),
    }
}

/// The AdmissionReview answer.
pub fn response(uid: &str, verdict: &Result<(), String>) -> Value {
    let mut answer = json!({"uid": uid, "allowed": verdict.is_ok()});
    if let Err(message) = verdict {
        answer["status"] = json!({"code": 403, "reason": "Forbidden", "message": message});
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": answer})
}

/// The certificate handshakes are answered with; replaced at any time (renewal, a changed
/// Secret or file) without a restart. Until one is loaded, handshakes fail.
#[derive(Debug, Default)]
pub struct ServingCert {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl ServingCert {
    /// Loads a PEM certificate chain and key; `Ok(true)` when it differs from the one served.
    pub fn load(&self, cert_pem: &str, key_pem: &str) -> Result<bool, String> {
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|e| format!("reading the serving certificate: {e}"))?;
        if chain.is_empty() {
            return Err("the serving certificate holds no certificate".to_owned());
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| format!("reading the serving key: {e}"))?;
        let provider = rustls::crypto::ring::default_provider();
        let certified = CertifiedKey::from_der(chain, key, &provider)
            .map_err(|e| format!("the serving certificate and key do not make a pair: {e}"))?;
        let mut current = self
            .current
            .write()
            .map_err(|_| "the serving certificate lock is poisoned".to_owned())?;
        let changed = current.as_ref().is_none_or(|c| c.cert != certified.cert);
        if changed {
            *current = Some(Arc::new(certified));
        }
        Ok(changed)
    }

    /// The certificate served now (its chain), if any.
    pub fn chain(&self) -> Option<Vec<CertificateDer<'static>>> {
        self.current.read().ok()?.as_ref().map(|c| c.cert.clone())
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok()?.clone()
    }
}

/// TLS that answers with whatever `serving` holds at each handshake.
pub fn acceptor(serving: Arc<ServingCert>) -> Result<TlsAcceptor, String> {
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_no_client_auth()
    .with_cert_resolver(serving);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Binds `address` and returns the bound address and the serving future, within `limits`:
/// the TLS handshake, each request's headers and each whole request have their deadlines.
pub async fn serve(
    address: SocketAddr,
    acceptor: TlsAcceptor,
    client: Client,
    agents: pod_reads::Agents,
    limits: Limits,
) -> Result<(SocketAddr, impl Future<Output = ()>), String> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| format!("binding the webhook to {address}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    let http = limits.http1();
    let (handshake_timeout, request_timeout) = (limits.handshake_timeout, limits.request_timeout);
    let per_connection = limits.clone();
    let shared = Arc::new(Shared {
        agents,
        ..Shared::default()
    });
    let serving = listener::accept(listener, limits, move |stream, peer| {
        let acceptor = acceptor.clone();
        let client = client.clone();
        let shared = shared.clone();
        let http = http.clone();
        let limits = per_connection.clone();
        async move {
            let stream =
                match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "webhook TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "webhook TLS handshake timed out");
                        return;
                    }
                };
            let answer = move |request| {
                let answer = handle(request, client.clone(), shared.clone());
                async move {
                    tokio::time::timeout(request_timeout, answer)
                        .await
                        .unwrap_or_else(|_| {
                            reply(
                                StatusCode::REQUEST_TIMEOUT,
                                json!({"error": "the request took too long"}).to_string(),
                            )
                        })
                }
            };
            // The API server speaks HTTP/2 where offered: its calls for a drain's evictions,
            // sent at once, share one connection instead of a TLS handshake each.
            if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
                listener::serve_http2(TokioIo::new(stream), answer, &limits).await;
                return;
            }
            let service = service_fn(move |request| {
                let answer = answer(request);
                async move { Ok::<_, Infallible>(answer.await) }
            });
            if let Err(e) = http.serve_connection(TokioIo::new(stream), service).await {
                tracing::debug!(%peer, error = %e, "webhook connection ended");
            }
        }
    });
    Ok((bound, serving))
}

fn reply(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

/// What every answer shares: the requests allowed moments ago, each node's Event allowance,
/// and who the agents are.
#[derive(Debug, Default)]
struct Shared {
    requests: requests::Recent,
    events: events::Allowances,
    agents: pod_reads::Agents,
}

async fn handle(
    request: Request<Incoming>,
    client: Client,
    shared: Arc<Shared>,
) -> Response<Full<Bytes>> {
    let path = request.uri().path().to_owned();
    if request.method() != Method::POST
        || ![
            EVICTION_PATH,
            requests::REQUEST_PATH,
            events::EVENT_PATH,
            pod_reads::POD_READS_PATH,
        ]
        .contains(&path.as_str())
    {
        return reply(StatusCode::NOT_FOUND, "{}".to_owned());
    }
    let review = match Limited::new(request.into_body(), MAX_REVIEW)
        .collect()
        .await
    {
        Ok(body) => serde_json::from_slice::<Value>(&body.to_bytes())
            .map_err(|e| format!("the body is not JSON: {e}")),
        Err(e) => {
            return reply(
                StatusCode::BAD_REQUEST,
                json!({"error": e.to_string()}).to_string(),
            );
        }
    };
    let answered = match review {
        Ok(review) if path == pod_reads::POD_READS_PATH => {
            pod_reads::parse(review).map(|access| {
                let verdict = pod_reads::decide(&access, &shared.agents);
                if verdict.is_err() && shared.agents.include(&access.caller.user, &access.groups) {
                    tracing::debug!(user = %access.caller.user, ?access.resource, "an agent's read not granted");
                }
                pod_reads::response(&verdict)
            })
        }
        Ok(review) if path == EVICTION_PATH => match parse(&review) {
            Ok(eviction) => Ok(answer_eviction(&eviction, client).await),
            Err(e) => Err(e),
        },
        Ok(review) if path == events::EVENT_PATH => match events::parse(&review) {
            Ok(event) => {
                let verdict = shared.events.review(&event, std::time::Instant::now());
                if let Err(why) = &verdict {
                    tracing::debug!(user = %event.caller.user, %why, "Event refused");
                }
                Ok(response(&event.uid, &verdict))
            }
            Err(e) => Err(e),
        },
        Ok(review) => match requests::parse(&review) {
            Ok(asked) => {
                let verdict = requests::review(&asked, &client, &shared.requests).await;
                if let Err(why) = &verdict {
                    tracing::warn!(user = %asked.caller.user, maintenance = %asked.name, %why, "reboot request refused");
                }
                Ok(response(&asked.uid, &verdict))
            }
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    match answered {
        Ok(answer) => reply(StatusCode::OK, answer.to_string()),
        Err(e) => {
            tracing::warn!(error = %e, %path, "a webhook request that is not a review");
            reply(StatusCode::BAD_REQUEST, json!({"error": e}).to_string())
        }
    }
}

/// Looks up where the pod runs and answers the eviction.
async fn answer_eviction(eviction: &EvictionRequest, client: Client) -> Value {
    let pods: Api<Pod> = Api::namespaced(client, &eviction.namespace);
    let verdict = match pods.get_opt(&eviction.pod).await {
        Ok(pod) => {
            let node = pod
                .as_ref()
                .map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()));
            decide(eviction, node.as_ref().map(|n| n.as_deref()))
        }
        // Not knowing where the pod runs, the eviction cannot be allowed.
        Err(e) => Err(format!(
            "could not read pod {}/{} to check its node: {e}",
            eviction.namespace, eviction.pod
        )),
    };
    if let Err(why) = &verdict {
        tracing::warn!(user = %eviction.caller.user, pod = %format!("{}/{}", eviction.namespace, eviction.pod), %why, "eviction refused");
    }
    response(&eviction.uid, &verdict)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn review(node: Option<&str>) -> Value {
        let mut extra = json!({});
        if let Some(node) = node {
            extra[NODE_CLAIM] = json!([node]);
        }
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "705ab4f5", "namespace": "shop", "name": "cart-7", "subResource": "eviction",
            "userInfo": {"username": "system:serviceaccount:nodeward:nodeward-agent", "extra": extra},
            "object": {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "cart-7", "namespace": "shop"}},
        }})
    }

    #[test]
    fn an_agent_evicts_only_pods_of_its_own_node() {
        let request = parse(&review(Some("node-a"))).expect("a valid review");
        assert_eq!(request.pod, "cart-7");
        assert_eq!(decide(&request, Some(Some("node-a"))), Ok(()));
        let refused = decide(&request, Some(Some("node-b"))).expect_err("another node");
        assert_eq!(
            refused,
            "nodeward-agent on node node-a may evict only pods on its own node; shop/cart-7 runs on node-b"
        );
        assert!(
            decide(&request, Some(None)).is_err(),
            "an unscheduled pod is not its own"
        );
        assert_eq!(
            decide(&request, None),
            Ok(()),
            "a missing pod fails on its own"
        );
        let anonymous = parse(&review(None)).expect("a valid review");
        assert!(
            decide(&anonymous, Some(Some("node-a")))
                .expect_err("no claim")
                .contains("names no node")
        );
    }

    #[test]
    fn a_host_mode_certificate_names_its_node_in_its_user_name() {
        let as_user = |user: &str| {
            let mut review = review(None);
            review["request"]["userInfo"]["username"] = json!(user);
            parse(&review).expect("a valid review")
        };
        let request = as_user("nodeward:agent:node-a");
        assert_eq!(request.caller.node(), Ok("node-a"));
        assert_eq!(decide(&request, Some(Some("node-a"))), Ok(()));
        assert!(decide(&request, Some(Some("node-b"))).is_err());
        // The prefix alone names nothing; another user's name is no node.
        assert_eq!(as_user("nodeward:agent:").caller.node, None);
        assert_eq!(as_user("system:node:node-a").caller.node, None);
    }

    #[test]
    fn answers_carry_the_uid_and_the_reason() {
        let allowed = response("705ab4f5", &Ok(()));
        assert_eq!(
            allowed["response"],
            json!({"uid": "705ab4f5", "allowed": true})
        );
        let denied = response("705ab4f5", &Err("no".into()));
        assert_eq!(denied["response"]["allowed"], false);
        assert_eq!(denied["response"]["status"]["code"], 403);
        assert_eq!(denied["response"]["status"]["message"], "no");
        assert!(parse(&json!({})).is_err());
        assert_eq!(
            parse(&json!({"request": {"uid": "1", "namespace": "a"}})),
            Err("request.name is missing".to_owned())
        );
    }
}
