//! Webhook notifications about this node's maintenances: a JSON POST on drain start, on the
//! reboot or power-off, and on completion (succeeded, failed, cancelled, restored). The body
//! carries a `text` (Slack and Mattermost incoming webhooks show it as is) and the fields a
//! receiver may route on; a shoutrrr URL gets the body its service reads ([`target`]), and
//! a shoutrrr `smtp://` URL sends the text by e-mail ([`email`]).
//! Delivery runs beside the maintenance with retries; a notification that cannot be delivered
//! is logged and dropped, never waited for.

use std::{collections::BTreeMap, time::Duration};

use bytes::Bytes;
use hyper::Method;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use crate::{
    backoff::Backoff,
    flags::{self, Flag},
};

pub mod email;
pub mod target;

/// Where notifications go: a webhook (in the shape its service reads) or e-mail.
#[derive(Clone, Debug, PartialEq)]
pub enum Destination {
    Webhook(target::Target),
    Email(email::Email),
}

/// The destination of a notification URL: `smtp://` is e-mail, the rest are webhooks.
pub fn destination(url: &str) -> Result<Destination, String> {
    if url.starts_with("smtp://") {
        email::parse(url).map(Destination::Email)
    } else {
        target::target(url).map(Destination::Webhook)
    }
}

/// Webhook notifications about this node's maintenances (JSON POST with retries; a failed
/// notification never holds a maintenance up).
/// The flags of the `notifications` section.
pub fn flags() -> Vec<Flag> {
    flags::declare! {
        "notify-url" ("NODEWARD_NOTIFY_URL") => "url": Text, "Where notifications go on drain start, reboot and completion (kured's --notify-url)";
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct NotificationsConfig {
    /// Where to POST; none sent when empty.
    pub url: String,
    /// Extra request headers, e.g. `Authorization` (keep the file private then).
    pub headers: std::collections::BTreeMap<String, String>,
    /// The events sent; all when empty.
    pub events: Vec<NoticeKind>,
    /// The body's `text` per event, with placeholders `{node}`, `{maintenance}`, `{reason}`,
    /// `{action}`, `{message}`, `{correlation}`; kured's `%s` is the node too.
    pub templates: std::collections::BTreeMap<NoticeKind, String>,
    /// Tries per notification, the first included.
    pub attempts: u32,
    /// Longest one try may take.
    #[serde(deserialize_with = "crate::values::duration")]
    pub timeout: Duration,
}

impl Default for NotificationsConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            headers: std::collections::BTreeMap::new(),
            events: Vec::new(),
            templates: std::collections::BTreeMap::new(),
            attempts: 5,
            timeout: Duration::from_secs(10),
        }
    }
}

impl NotificationsConfig {
    pub fn validate(&self, place: &str) -> Result<(), String> {
        if !self.url.is_empty() {
            destination(&self.url).map_err(|e| format!("{place}.url: {e}"))?;
        }
        if self.attempts == 0 {
            return Err(format!("{place}.attempts: must be at least 1, e.g. 5"));
        }
        if self.timeout.is_zero() {
            return Err(format!("{place}.timeout: must be more than 0s, e.g. 10s"));
        }
        for (kind, template) in &self.templates {
            check_template(template).map_err(|e| format!("{place}.templates.{kind:?}: {e}"))?;
        }
        for name in self.headers.keys() {
            if hyper::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(format!(
                    "{place}.headers: {name:?} is not a valid HTTP header name"
                ));
            }
        }
        Ok(())
    }
}

/// Notifications waiting for delivery; more are dropped (with a warning) rather than queued
/// without bound while the receiver is down.
const QUEUE: usize = 64;

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum NoticeKind {
    DrainStarted,
    Rebooting,
    PoweringOff,
    Succeeded,
    Failed,
    Cancelled,
    Restored,
}

/// What happened to which maintenance.
#[derive(Clone, Debug, PartialEq)]
pub struct Notice {
    pub kind: NoticeKind,
    pub node: String,
    pub maintenance: String,
    pub correlation: String,
    pub reason: String,
    pub action: String,
    pub message: String,
}

const PLACEHOLDERS: [&str; 6] = [
    "node",
    "maintenance",
    "reason",
    "action",
    "message",
    "correlation",
];

/// kured's templates (`--message-template-drain="Draining node %s"`) name the node so.
const KURED_NODE: &str = "%s";

fn default_template(kind: NoticeKind) -> &'static str {
    match kind {
        NoticeKind::DrainStarted => "Draining node {node} for {reason} ({action})",
        NoticeKind::Rebooting => "Rebooting node {node}",
        NoticeKind::PoweringOff => "Powering off node {node}",
        NoticeKind::Succeeded => "Node {node} is back in service after {maintenance}",
        NoticeKind::Failed => "Maintenance {maintenance} of node {node} failed: {message}",
        NoticeKind::Cancelled => "Maintenance {maintenance} of node {node} was cancelled",
        NoticeKind::Restored => "Node {node} is restored ({maintenance} was deleted)",
    }
}

/// Refuses a template with an unknown or unclosed placeholder, naming the known ones.
pub fn check_template(template: &str) -> Result<(), String> {
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let close = after
            .find('}')
            .ok_or_else(|| format!("{{ without a closing }}; placeholders are {}", known()))?;
        let name = &after[..close];
        if !PLACEHOLDERS.contains(&name) {
            return Err(format!("unknown placeholder {{{name}}}; use {}", known()));
        }
        rest = &after[close + 1..];
    }
    Ok(())
}

fn known() -> String {
    PLACEHOLDERS.map(|p| format!("{{{p}}}")).join(", ")
}

/// The template with the notice's values in place of its placeholders.
pub fn render(template: &str, notice: &Notice) -> String {
    let template = template.replace(KURED_NODE, "{node}");
    let mut rest = template.as_str();
    let values = [
        ("{node}", &notice.node),
        ("{maintenance}", &notice.maintenance),
        ("{reason}", &notice.reason),
        ("{action}", &notice.action),
        ("{message}", &notice.message),
        ("{correlation}", &notice.correlation),
    ];
    let mut text = String::with_capacity(template.len() + 64);
    'outer: while let Some(open) = rest.find('{') {
        text.push_str(&rest[..open]);
        for (placeholder, value) in values {
            if rest[open..].starts_with(placeholder) {
                text.push_str(value);
                rest = &rest[open + placeholder.len()..];
                continue 'outer;
            }
        }
        text.push('{');
        rest = &rest[open + 1..];
    }
    text.push_str(rest);
    text
}

/// The JSON body of one notification.
pub fn body(notice: &Notice, templates: &BTreeMap<NoticeKind, String>) -> serde_json::Value {
    let template = templates
        .get(&notice.kind)
        .map_or(default_template(notice.kind), String::as_str);
    json!({
        "text": render(template, notice),
        "event": notice.kind,
        "node": notice.node,
        "maintenance": notice.maintenance,
        "correlation": notice.correlation,
        "reason": notice.reason,
        "action": notice.action,
        "message": notice.message,
        "time": jiff::Timestamp::now().to_string(),
    })
}

struct Queued {
    notice: Notice,
    /// Told when the first try is over (delivered or not).
    first_try: Option<oneshot::Sender<()>>,
}

/// Hands notifications to the delivery task. Cloning shares the queue.
#[derive(Clone, Default)]
pub struct Notifier {
    queue: Option<mpsc::Sender<Queued>>,
    events: Vec<NoticeKind>,
}

impl Notifier {
    /// A notifier for `config`, and the delivery task to spawn (none when no URL is set).
    pub fn new(
        config: &NotificationsConfig,
    ) -> (Self, Option<impl Future<Output = ()> + Send + 'static>) {
        if config.url.is_empty() {
            return (Self::default(), None);
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        let notifier = Self {
            queue: Some(tx),
            events: config.events.clone(),
        };
        (notifier, Some(deliver(config.clone(), rx)))
    }

    /// Queues a notification; returns at once.
    pub fn send(&self, notice: Notice) {
        self.queue(notice, None);
    }

    /// Queues a notification and waits until its first try is over, at most `limit`: for
    /// the last word before the machine goes down.
    pub async fn send_before(&self, notice: Notice, limit: Duration) {
        let (tx, rx) = oneshot::channel();
        if self.queue(notice, Some(tx)) {
            let _ = tokio::time::timeout(limit, rx).await;
        }
    }

    fn queue(&self, notice: Notice, first_try: Option<oneshot::Sender<()>>) -> bool {
        let Some(queue) = &self.queue else {
            return false;
        };
        if !self.events.is_empty() && !self.events.contains(&notice.kind) {
            return false;
        }
        let kind = notice.kind;
        match queue.try_send(Queued { notice, first_try }) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(event = ?kind, error = %e, "notification dropped: the queue is full or closed");
                false
            }
        }
    }
}

async fn deliver(config: NotificationsConfig, mut queue: mpsc::Receiver<Queued>) {
    // Validated with the configuration: a URL that does not parse sends nothing.
    let Ok(destination) = destination(&config.url) else {
        tracing::warn!("notifications off: the URL is not one they can be sent to");
        return;
    };
    let mut headers: Vec<(&str, &str)> = vec![("content-type", "application/json")];
    headers.extend(config.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    while let Some(Queued {
        notice,
        mut first_try,
    }) = queue.recv().await
    {
        let ours = body(&notice, &config.templates);
        let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
        for attempt in 1..=config.attempts {
            let sent = tokio::time::timeout(
                config.timeout,
                send_once(&destination, &headers, &ours, config.timeout),
            )
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {:?}", config.timeout)));
            let problem = match sent {
                Ok(()) => {
                    tracing::info!(event = ?notice.kind, maintenance = %notice.maintenance, correlation = %notice.correlation, "notification delivered");
                    break;
                }
                Err(problem) => problem,
            };
            if let Some(tx) = first_try.take() {
                let _ = tx.send(());
            }
            if attempt == config.attempts {
                tracing::warn!(event = ?notice.kind, maintenance = %notice.maintenance, correlation = %notice.correlation, %problem, attempts = attempt, "notification not delivered; giving up");
            } else {
                tracing::warn!(event = ?notice.kind, maintenance = %notice.maintenance, correlation = %notice.correlation, %problem, attempt, "notification not delivered; retrying");
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
        if let Some(tx) = first_try.take() {
            let _ = tx.send(());
        }
    }
}

/// One try at delivering the notification whose JSON body is `ours`.
async fn send_once(
    destination: &Destination,
    headers: &[(&str, &str)],
    ours: &serde_json::Value,
    timeout: Duration,
) -> Result<(), String> {
    let text = ours["text"].as_str().unwrap_or_default();
    match destination {
        Destination::Webhook(target) => {
            let payload = Bytes::from(target::body(&target.format, text, ours.clone()).to_string());
            let reply = crate::http::send(Method::POST, &target.url, headers, payload)
                .await
                .map_err(|e| e.to_string())?;
            if reply.status.is_success() {
                Ok(())
            } else {
                Err(format!("the receiver answered {}", reply.status))
            }
        }
        Destination::Email(email) => email.send(text, &details(ours), timeout).await,
    }
}

/// The fields of a notification's JSON body as `field: value` lines, for a mail's body.
fn details(ours: &serde_json::Value) -> String {
    // A notice's fields (what a template can name) between its event and its time.
    std::iter::once("event")
        .chain(PLACEHOLDERS)
        .chain(["time"])
        .filter_map(|field| {
            let value = ours.get(field)?.as_str()?;
            (!value.is_empty()).then(|| format!("{field}: {value}"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice() -> Notice {
        Notice {
            kind: NoticeKind::DrainStarted,
            node: "worker-1".into(),
            maintenance: "worker-1-reboot-3f2a9c1e".into(),
            correlation: "85b2".into(),
            reason: "Reboot".into(),
            action: "Reboot".into(),
            message: "".into(),
        }
    }

    #[test]
    fn templates_render_their_placeholders_and_leave_other_braces() {
        assert_eq!(
            render("Draining {node} for {reason} ({maintenance})", &notice()),
            "Draining worker-1 for Reboot (worker-1-reboot-3f2a9c1e)"
        );
        assert_eq!(render("{x} {node}}", &notice()), "{x} worker-1}");
        assert_eq!(
            render("Draining node %s", &notice()),
            "Draining node worker-1",
            "kured's templates work as they are"
        );
        let b = body(&notice(), &BTreeMap::new());
        assert_eq!(b["text"], "Draining node worker-1 for Reboot (Reboot)");
        assert_eq!(b["event"], "DrainStarted");
        assert_eq!(b["correlation"], "85b2");
        let custom = BTreeMap::from([(NoticeKind::DrainStarted, ":wrench: {node}".to_owned())]);
        assert_eq!(body(&notice(), &custom)["text"], ":wrench: worker-1");
    }

    #[test]
    fn bad_templates_name_the_placeholder() {
        assert!(check_template("Rebooting {node} now").is_ok());
        let e = check_template("Rebooting {nodename}").expect_err("unknown");
        assert!(
            e.contains("unknown placeholder {nodename}; use {node}"),
            "{e}"
        );
        let e = check_template("Rebooting {node").expect_err("unclosed");
        assert!(e.contains("without a closing"), "{e}");
    }

    /// A webhook receiver on this machine (plain HTTP/1.1, as the services speak
    /// it): the first request's path and JSON body.
    async fn receive_one(listener: tokio::net::TcpListener) -> (String, serde_json::Value) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut socket, _) = listener.accept().await.expect("a connection");
        let mut request = Vec::new();
        let mut buffer = [0u8; 4096];
        loop {
            let n = socket.read(&mut buffer).await.expect("read");
            request.extend_from_slice(&buffer[..n]);
            let text = String::from_utf8_lossy(&request).to_string();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap_or(0))
                    })
                    .unwrap_or(0);
                if body.len() >= length {
                    socket
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .await
                        .expect("answer");
                    let path = head
                        .split_whitespace()
                        .nth(1)
                        .unwrap_or_default()
                        .to_owned();
                    return (path, serde_json::from_str(body).expect("JSON body"));
                }
            }
            assert!(n > 0, "the connection closed before the request was whole");
        }
    }

    /// The notice, sent through a notifier of the URL `url` makes for a receiver's port: the
    /// path and body the receiver got.
    async fn sent_to(url: impl FnOnce(u16) -> String) -> (String, serde_json::Value) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("address").port();
        let config = NotificationsConfig {
            url: url(port),
            ..NotificationsConfig::default()
        };
        config.validate("notifications").expect("a valid URL");
        let (notifier, delivery) = Notifier::new(&config);
        tokio::spawn(delivery.expect("a delivery task"));
        notifier.send(notice());
        tokio::time::timeout(Duration::from_secs(10), receive_one(listener))
            .await
            .expect("delivered within 10 s")
    }

    #[tokio::test]
    async fn a_shoutrrr_mattermost_url_posts_the_webhook_body_to_its_hook() {
        let (path, body) = sent_to(|port| {
            format!("mattermost://nodeward@127.0.0.1:{port}/tok3n/ops?disabletls=yes")
        })
        .await;
        assert_eq!(path, "/hooks/tok3n");
        assert_eq!(
            body,
            json!({"text": "Draining node worker-1 for Reboot (Reboot)", "username": "nodeward", "channel": "ops"})
        );
    }

    /// What a Teams Workflows trigger ("post to a channel when a webhook request is received")
    /// needs to post a card: a message whose attachments are Adaptive Cards of a version Teams
    /// renders (up to 1.5), each element of a known type with its required fields.
    fn adaptive_card_problems(message: &serde_json::Value) -> Vec<String> {
        let mut problems = Vec::new();
        let mut expect = |ok: bool, what: &str| {
            if !ok {
                problems.push(what.to_owned());
            }
        };
        expect(message["type"] == "message", "type is message");
        let attachments = message["attachments"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        expect(!attachments.is_empty(), "at least one attachment");
        for attachment in &attachments {
            expect(
                attachment["contentType"] == "application/vnd.microsoft.card.adaptive",
                "the Adaptive Card content type",
            );
            let card = &attachment["content"];
            expect(card["type"] == "AdaptiveCard", "content.type AdaptiveCard");
            let version = card["version"].as_str().unwrap_or_default();
            expect(
                ["1.0", "1.1", "1.2", "1.3", "1.4", "1.5"].contains(&version),
                "a version Teams renders",
            );
            for element in card["body"].as_array().cloned().unwrap_or_default() {
                match element["type"].as_str() {
                    Some("TextBlock") => expect(element["text"].is_string(), "a TextBlock's text"),
                    Some("FactSet") => expect(
                        element["facts"].as_array().is_some_and(|facts| {
                            facts
                                .iter()
                                .all(|f| f["title"].is_string() && f["value"].is_string())
                        }),
                        "a FactSet's facts with a title and a value",
                    ),
                    _ => expect(false, "only TextBlock and FactSet elements"),
                }
            }
        }
        problems
    }

    #[tokio::test]
    async fn a_teams_workflows_url_posts_an_adaptive_card_to_its_trigger() {
        let trigger =
            "/workflows/a5b6/triggers/manual/paths/invoke?api-version=2016-06-01&sig=o7p8";
        let (path, body) = sent_to(|port| format!("teams+http://127.0.0.1:{port}{trigger}")).await;
        assert_eq!(path, trigger, "the trigger with its signature");
        assert_eq!(
            adaptive_card_problems(&body),
            Vec::<String>::new(),
            "{body:#}"
        );
        let card = &body["attachments"][0]["content"];
        assert_eq!(
            card["body"][0]["text"],
            "Draining node worker-1 for Reboot (Reboot)"
        );
        let facts = card["body"][1]["facts"].to_string();
        for fact in [
            "worker-1",
            "worker-1-reboot-3f2a9c1e",
            "DrainStarted",
            "85b2",
        ] {
            assert!(facts.contains(fact), "{fact} in {facts}");
        }
        assert_eq!(
            adaptive_card_problems(&json!({"@type": "MessageCard", "text": "draining"})).len(),
            2,
            "the retired connector's MessageCard is not a card a Workflow posts"
        );
    }

    #[test]
    fn an_unsupported_notification_url_is_refused_with_its_place() {
        let config = NotificationsConfig {
            url: "telegram://token@telegram?chats=@ops".into(),
            ..NotificationsConfig::default()
        };
        let e = config.validate("notifications").expect_err("telegram");
        assert!(e.starts_with("notifications.url: "), "{e}");
        let config = NotificationsConfig {
            url: "smtp://mail.example.com:587/?to=ops@example.com".into(),
            ..NotificationsConfig::default()
        };
        let e = config.validate("notifications").expect_err("no sender");
        assert!(e.starts_with("notifications.url: "), "{e}");
        assert!(e.contains("from= is missing"), "{e}");
    }

    /// A real SMTP server on this machine (aiosmtpd, Debian's python3-aiosmtpd, which
    /// `tests/run` installs), storing what it accepts in a Maildir under `dir`; its port.
    async fn smtp_server(dir: &std::path::Path) -> (tokio::process::Child, u16) {
        let port = nodeward_e2e::daemon::free_port().expect("a free port");
        let child = tokio::process::Command::new("/usr/bin/python3")
            .args(["-m", "aiosmtpd", "-n", "-l", &format!("127.0.0.1:{port}")])
            .args(["-c", "aiosmtpd.handlers.Mailbox"])
            .arg(dir)
            .kill_on_drop(true)
            .spawn()
            .expect("aiosmtpd starts (python3-aiosmtpd; tests/run installs it)");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "aiosmtpd listens on {port} within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (child, port)
    }

    #[tokio::test]
    async fn a_shoutrrr_smtp_url_mails_the_notice_through_a_real_smtp_server() {
        let dir = std::env::temp_dir().join(format!("nodeward-smtp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (_server, port) = smtp_server(&dir).await;
        let config = NotificationsConfig {
            url: format!(
                "smtp://127.0.0.1:{port}/?from=nodes@example.com&fromname=Node+Reboots&to=ops@example.com,oncall@example.com"
            ),
            templates: BTreeMap::from([(
                NoticeKind::DrainStarted,
                "Draining node {node}".to_owned(),
            )]),
            ..NotificationsConfig::default()
        };
        config.validate("notifications").expect("a valid URL");
        let (notifier, delivery) = Notifier::new(&config);
        tokio::spawn(delivery.expect("a delivery task"));
        notifier.send(notice());

        let new = dir.join("new");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let mail = loop {
            let first = std::fs::read_dir(&new)
                .ok()
                .and_then(|mut entries| entries.next())
                .and_then(Result::ok);
            if let Some(entry) = first {
                break std::fs::read_to_string(entry.path()).expect("the stored mail");
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the mail reaches the server within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let _ = std::fs::remove_dir_all(&dir);
        assert!(mail.contains("Subject: Draining node worker-1"), "{mail}");
        assert!(
            mail.contains("From: \"Node Reboots\" <nodes@example.com>"),
            "{mail}"
        );
        assert!(
            mail.contains("To: ops@example.com, oncall@example.com"),
            "{mail}"
        );
        assert!(
            mail.contains("X-RcptTo: ops@example.com, oncall@example.com"),
            "{mail}"
        );
        assert!(
            mail.contains("maintenance: worker-1-reboot-3f2a9c1e"),
            "{mail}"
        );
    }

    #[tokio::test]
    async fn required_starttls_is_not_given_up_for_a_server_without_it() {
        let dir = std::env::temp_dir().join(format!("nodeward-smtp-tls-{}", std::process::id()));
        let (_server, port) = smtp_server(&dir).await;
        let Ok(Destination::Email(email)) = destination(&format!(
            "smtp://127.0.0.1:{port}/?from=n@example.com&to=o@example.com&encryption=ExplicitTLS"
        )) else {
            panic!("an e-mail destination");
        };
        let err = email
            .send("Rebooting node worker-1", "", Duration::from_secs(10))
            .await
            .expect_err("no STARTTLS offered, so nothing is sent in plain text");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            err.contains(&format!("sending to 127.0.0.1:{port}")),
            "{err}"
        );
        assert!(
            !dir.join("new").exists()
                || std::fs::read_dir(dir.join("new"))
                    .map(|d| d.count())
                    .unwrap_or(0)
                    == 0
        );
    }
}
