//! The Kubernetes client both daemons use, counting what it costs the API server: requests by
//! verb and resource, bytes received, and the events each watch delivers.

use std::{
    path::Path,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use http_body_util::{BodyExt, combinators::UnsyncBoxBody};

use crate::Error;

/// What a chunk of a watch delivers: its events, and of them the bookmarks (the API server's
/// periodic note of its resourceVersion, which carries no change).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Events {
    pub all: usize,
    pub bookmarks: usize,
}

impl Events {
    /// The events a chunk of a watch's body completes.
    pub fn of(chunk: &[u8]) -> Self {
        const BOOKMARK: &[u8] = b"\"type\":\"BOOKMARK\"";
        Self {
            all: chunk.iter().filter(|b| **b == b'\n').count(),
            bookmarks: chunk
                .windows(BOOKMARK.len())
                .filter(|w| *w == BOOKMARK)
                .count(),
        }
    }
}

/// Told of every request the client sends and of what comes back.
pub trait ApiCost: Send + Sync {
    /// A request: (verb, resource), e.g. `("watch", "nodes")`, `("create", "pods/eviction")`.
    fn request(&self, verb: &'static str, resource: &str);
    /// A chunk of a response body to a request of `verb` on `resource`: its size, and for a
    /// watch what it delivers (a watch sends one JSON object a line).
    fn received(&self, verb: &'static str, resource: &str, bytes: usize, events: Events);
}

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

/// As [`connect`], telling `cost` of every request and response.
pub async fn connect_counting(
    kubeconfig: Option<&Path>,
    user_agent: &'static str,
    cost: Option<Arc<dyn ApiCost>>,
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
    let builder = if config.proxy_url.is_some() {
        // kube-rs's own stack tunnels through the kubeconfig's proxy-url (over HTTP/1.1).
        kube::client::ClientBuilder::try_from(config).map_err(|e| Error::Connect(e.to_string()))?
    } else {
        let namespace = config.default_namespace.clone();
        kube::client::ClientBuilder::new(http2_service(config)?, namespace)
    };
    match cost {
        None => Ok(builder.build()),
        Some(cost) => Ok(builder.with_layer(&CountingLayer(cost)).build()),
    }
}

/// How often an idle HTTP/2 connection is pinged, and how long an answer may take before the
/// connection is dropped (client-go's ReadIdleTimeout and PingTimeout): with every request on
/// one connection, a connection that died silently must be noticed and replaced.
const PING_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);
const PING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// kube-rs's default stack (base URI, credentials, extra headers, connect and read timeouts)
/// over a connection that speaks HTTP/2 when the API server offers it, as client-go does.
/// kube-rs speaks only HTTP/1.1, which opens a connection and a TLS handshake for each request
/// sent while others are open: ten evictions sent at once cost ten handshakes, which on a
/// slow node is most of a second, and each watch holds a connection of its own.
fn http2_service(config: kube::Config) -> Result<ClientService, Error> {
    use kube::client::ConfigExt;
    use tower::ServiceExt;

    let connect = |what: &str, e: &dyn std::fmt::Display| {
        Error::Connect(format!("{what} for the API server's client: {e}"))
    };
    let tls = config
        .rustls_client_config()
        .map_err(|e| connect("building the TLS configuration", &e))?;
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    let https = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls);
    let https = match &config.tls_server_name {
        None => https.https_or_http(),
        Some(name) => {
            let name = rustls_pki_types::ServerName::try_from(name.clone())
                .map_err(|e| connect(&format!("reading tls-server-name {name:?}"), &e))?;
            https
                .https_or_http()
                .with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
        }
    };
    let mut connector = hyper_timeout::TimeoutConnector::new(
        https.enable_http1().enable_http2().wrap_connector(http),
    );
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .timer(hyper_util::rt::TokioTimer::new())
        .http2_keep_alive_interval(PING_INTERVAL)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(connector);
    Ok(tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .auth_layer()
                .map_err(|e| connect("loading the credentials", &e))?,
        )
        .layer(
            config
                .extra_headers_layer()
                .map_err(|e| connect("reading the extra headers", &e))?,
        )
        .map_err(tower::BoxError::from)
        .service(client)
        .map_response(|response| {
            response.map(|body| {
                Box::new(body.map_err(tower::BoxError::from)) as Box<kube::client::DynBody>
            })
        })
        .boxed())
}

/// What kube-rs's own builder makes: any client stack, its response bodies boxed.
type ClientService = tower::util::BoxService<
    hyper::Request<kube::client::Body>,
    hyper::Response<Box<kube::client::DynBody>>,
    tower::BoxError,
>;

/// Wraps the client's service so that [`ApiCost`] hears of every request and response.
struct CountingLayer(Arc<dyn ApiCost>);

impl<S> tower::Layer<S> for CountingLayer {
    type Service = Counting<S>;

    fn layer(&self, inner: S) -> Counting<S> {
        Counting {
            inner,
            cost: self.0.clone(),
        }
    }
}

#[derive(Clone)]
struct Counting<S> {
    inner: S,
    cost: Arc<dyn ApiCost>,
}

type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> tower::Service<hyper::Request<kube::client::Body>> for Counting<S>
where
    S: tower::Service<hyper::Request<kube::client::Body>, Response = hyper::Response<B>>,
    S::Future: Send + 'static,
    B: hyper::body::Body<Data = bytes::Bytes> + Send + 'static,
{
    type Response = hyper::Response<UnsyncBoxBody<bytes::Bytes, B::Error>>;
    type Error = S::Error;
    type Future = Boxed<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: hyper::Request<kube::client::Body>) -> Self::Future {
        let (verb, resource) = classify(
            request.method(),
            request.uri().path(),
            request.uri().query(),
        );
        self.cost.request(verb, &resource);
        let cost = self.cost.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| {
                body.map_frame(move |frame| {
                    if let Some(data) = frame.data_ref() {
                        let events = if verb == "watch" {
                            Events::of(data)
                        } else {
                            Events::default()
                        };
                        cost.received(verb, &resource, data.len(), events);
                    }
                    frame
                })
                .boxed_unsync()
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use hyper::Method;
    use tower::{Layer, Service, ServiceExt};

    use super::*;

    #[derive(Default)]
    struct Seen(Mutex<Vec<String>>);

    impl ApiCost for Seen {
        fn request(&self, verb: &'static str, resource: &str) {
            self.0
                .lock()
                .expect("seen")
                .push(format!("{verb} {resource}"));
        }
        fn received(&self, verb: &'static str, resource: &str, bytes: usize, events: Events) {
            self.0.lock().expect("seen").push(format!(
                "{verb} {resource}: {bytes} bytes, {} events, {} bookmarks",
                events.all, events.bookmarks
            ));
        }
    }

    #[tokio::test]
    async fn watch_events_and_bytes_are_counted_as_they_arrive() {
        let seen = Arc::new(Seen::default());
        let server = tower::service_fn(|_request: hyper::Request<kube::client::Body>| async {
            let body = http_body_util::Full::new(bytes::Bytes::from_static(
                b"{\"type\":\"ADDED\"}\n{\"type\":\"BOOKMARK\"}\n",
            ));
            Ok::<_, std::convert::Infallible>(hyper::Response::new(body))
        });
        let mut client = CountingLayer(seen.clone()).layer(server);
        let request = hyper::Request::get("/api/v1/nodes?watch=true&resourceVersion=1")
            .body(kube::client::Body::empty())
            .expect("request");
        let response = client
            .ready()
            .await
            .expect("ready")
            .call(request)
            .await
            .expect("response");
        let body = response.into_body().collect().await.expect("body");
        assert_eq!(body.to_bytes().len(), 37);
        assert_eq!(
            *seen.0.lock().expect("seen"),
            [
                "watch nodes",
                "watch nodes: 37 bytes, 2 events, 1 bookmarks"
            ]
        );
    }

    #[test]
    fn requests_are_named_by_verb_and_resource() {
        let requests = [
            (
                "GET /api/v1/nodes?watch=true&resourceVersion=5",
                "watch nodes",
            ),
            ("GET /api/v1/nodes?limit=500", "list nodes"),
            ("GET /api/v1/nodes/n1", "get nodes"),
            ("PATCH /api/v1/nodes/n1/status", "patch nodes/status"),
            (
                "POST /api/v1/namespaces/a/pods/p/eviction",
                "create pods/eviction",
            ),
            (
                "GET /api/v1/namespaces/a/pods?fieldSelector=spec.nodeName%3Dn1",
                "list pods",
            ),
            (
                "PATCH /apis/nodeward.io/v1alpha1/nodereports/n1/status",
                "patch nodereports/status",
            ),
            (
                "POST /apis/events.k8s.io/v1/namespaces/default/events",
                "create events",
            ),
            ("GET /api/v1/namespaces", "list namespaces"),
            ("GET /api/v1/namespaces/kube-system", "get namespaces"),
            (
                "PUT /apis/coordination.k8s.io/v1/namespaces/n/leases/l",
                "update leases",
            ),
        ];
        for (request, named) in requests {
            let (method, uri) = request.split_once(' ').expect("METHOD URI");
            let method = Method::from_bytes(method.as_bytes()).expect("a method");
            let (path, query) = uri
                .split_once('?')
                .map_or((uri, None), |(p, q)| (p, Some(q)));
            let (verb, resource) = classify(&method, path, query);
            assert_eq!(format!("{verb} {resource}"), named, "{request}");
        }
    }
}
