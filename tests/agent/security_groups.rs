//! The security-group detector against AWS's own emulator of the EC2 instance metadata service
//! (amazon-ec2-metadata-mock, IMDSv2 with its session tokens), and, for what the emulator
//! cannot do (a service without tokens as OpenStack's, malformed, failing and slow replies), a
//! stand-in that speaks the same HTTP paths.

use std::{
    convert::Infallible,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use nodeward_agent::{
    config::Config,
    detect::{Detector, Finding, Status, security_groups::SecurityGroupsConfig},
};

/// How the stand-in behaves.
#[derive(Clone)]
struct Behaviour {
    /// IMDSv2: reads without the session token get 401.
    require_token: bool,
    status: StatusCode,
    body: &'static str,
    delay: Duration,
}

impl Behaviour {
    /// An IMDSv2 service answering `body` at once.
    fn imdsv2(body: &'static str) -> Arc<Mutex<Self>> {
        Arc::new(Mutex::new(Self {
            require_token: true,
            status: StatusCode::OK,
            body,
            delay: Duration::ZERO,
        }))
    }
}

const TOKEN: &str = "AQAEAtoken-for-tests==";

async fn serve(behaviour: Arc<Mutex<Behaviour>>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let behaviour = behaviour.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<Incoming>| {
                    let b = behaviour.lock().expect("lock").clone();
                    async move { Ok::<_, Infallible>(answer(&b, &request).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    format!("http://{address}")
}

async fn answer(b: &Behaviour, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: &str| {
        let mut response = Response::new(Full::new(Bytes::from(body.to_owned())));
        *response.status_mut() = status;
        response
    };
    match (request.method(), request.uri().path()) {
        (&Method::PUT, "/latest/api/token") if b.require_token => {
            if request
                .headers()
                .contains_key("x-aws-ec2-metadata-token-ttl-seconds")
            {
                reply(StatusCode::OK, TOKEN)
            } else {
                reply(StatusCode::BAD_REQUEST, "missing TTL header")
            }
        }
        (&Method::PUT, "/latest/api/token") => reply(StatusCode::NOT_FOUND, "Not Found"),
        (&Method::GET, "/latest/meta-data/security-groups") => {
            let token = request
                .headers()
                .get("x-aws-ec2-metadata-token")
                .and_then(|v| v.to_str().ok());
            if b.require_token && token != Some(TOKEN) {
                return reply(StatusCode::UNAUTHORIZED, "");
            }
            tokio::time::sleep(b.delay).await;
            reply(b.status, b.body)
        }
        _ => reply(StatusCode::NOT_FOUND, "Not Found"),
    }
}

fn detector(url: &str, expected: &[&str]) -> Detector {
    let mut config = Config::default();
    config.detectors.security_groups = SecurityGroupsConfig {
        expected: expected.iter().map(|g| (*g).to_owned()).collect(),
        metadata_url: url.to_owned(),
        timeout: Duration::from_secs(2),
        ..SecurityGroupsConfig::default()
    };
    config
        .detectors
        .enabled(None)
        .into_iter()
        .find(|d| d.name == "security-groups")
        .expect("the detector is on when groups are expected")
}

/// Against AWS's own emulator of the service, IMDSv2 only (a read without a session token is
/// refused), serving `groups` as the instance's security groups.
async fn emulated(groups: &str) -> nodeward_e2e::imds::Emulator {
    nodeward_e2e::imds::Emulator::start(
        serde_json::json!({"security-groups": groups}),
        &["--imdsv2"],
    )
    .await
    .expect("ec2-metadata-mock starts")
}

#[tokio::test]
async fn imdsv2_missing_group_is_a_problem_naming_it_and_present_groups_pass() {
    let imds = emulated("default\nk8s-workers").await;
    let found = detector(&imds.url, &["k8s-workers", "k8s-nodeports", "default"])
        .observe_bounded()
        .await;
    assert_eq!(found.status, Status::Problem, "{found:?}");
    assert_eq!(found.condition, "SecurityGroupProblem");
    assert_eq!(found.reason, "SecurityGroupMissing");
    assert_eq!(
        found.message,
        "not a member of k8s-nodeports (member of: default, k8s-workers)"
    );

    let imds = emulated("default\nk8s-workers\nk8s-nodeports").await;
    let found = detector(&imds.url, &["k8s-workers", "k8s-nodeports"])
        .observe_bounded()
        .await;
    assert_eq!(found.status, Status::Ok, "{found:?}");
}

#[tokio::test]
async fn imdsv1_without_tokens_works_too() {
    let url = serve(Arc::new(Mutex::new(Behaviour {
        require_token: false,
        status: StatusCode::OK,
        body: "default\n",
        delay: Duration::ZERO,
    })))
    .await;
    let found = detector(&url, &["default"]).observe_bounded().await;
    assert_eq!(found.status, Status::Ok, "{found:?}");
}

#[tokio::test]
async fn malformed_error_and_slow_replies_are_unknown_with_a_clear_message() {
    let behaviour = Behaviour::imdsv2("<html><head><title>Captive portal</title></head></html>");
    let url = serve(behaviour.clone()).await;
    let d = detector(&url, &["default"]);

    let malformed = d.observe_bounded().await;
    assert_finding(
        &malformed,
        Status::Unknown,
        "MetadataMalformed",
        "malformed reply",
    );

    behaviour.lock().expect("lock").status = StatusCode::INTERNAL_SERVER_ERROR;
    let error = d.observe_bounded().await;
    assert_finding(
        &error,
        Status::Unknown,
        "MetadataError",
        "500 Internal Server Error",
    );

    {
        let mut b = behaviour.lock().expect("lock");
        b.status = StatusCode::OK;
        b.body = "default\n";
        b.delay = Duration::from_secs(30);
    }
    let slow = d.observe_bounded().await;
    assert_finding(&slow, Status::Unknown, "DetectorTimedOut", "2s timeout");
}

#[tokio::test]
async fn an_unreachable_service_is_unknown() {
    let port = nodeward_e2e::daemon::free_port().expect("a port nothing listens on");
    let found = detector(&format!("http://127.0.0.1:{port}"), &["default"])
        .observe_bounded()
        .await;
    assert_finding(
        &found,
        Status::Unknown,
        "MetadataUnreachable",
        "Connection refused",
    );
}

/// Asserts the finding's status and reason, and that its message says `part`.
#[track_caller]
fn assert_finding(found: &Finding, status: Status, reason: &str, part: &str) {
    let seen = (found.status, found.reason.as_str());
    assert_eq!(seen, (status, reason), "{found:?}");
    assert!(
        found.message.contains(part),
        "{found:?} does not say {part:?}"
    );
}
