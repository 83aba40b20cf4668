//! Where a notification goes and in which shape: an `http(s)://` URL gets nodeward's JSON
//! (with a `text` that Slack and Mattermost incoming webhooks show), and the shoutrrr URLs
//! that kured users have in their values (`slack://`, `mattermost://`, `generic://`) become
//! the webhook they name with the body that service reads. A Microsoft Teams Workflows
//! webhook (Power Automate's "post to a channel when a webhook request is received") gets an
//! Adaptive Card; shoutrrr's `teams://` names an Office 365 connector, which Microsoft retired,
//! and is refused with the way to a Workflows URL.

use hyper::Uri;
use serde_json::{Value, json};

/// The body a receiver reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Format {
    /// nodeward's own body: `text` and the fields to route on.
    Json,
    /// A Slack incoming webhook: `text`, with the bot name and channel when given.
    Slack {
        username: Option<String>,
        channel: Option<String>,
    },
    /// A Mattermost incoming webhook: as Slack's.
    Mattermost {
        username: Option<String>,
        channel: Option<String>,
    },
    /// A Microsoft Teams Workflows webhook: a message with one Adaptive Card.
    TeamsWorkflow,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The URL POSTed to.
    pub url: String,
    pub format: Format,
}

/// A shoutrrr URL's parts.
struct Parts<'a> {
    url: &'a str,
    uri: &'a Uri,
    scheme: &'a str,
    authority: &'a str,
    user: Option<&'a str>,
    host: &'a str,
    path: Vec<&'a str>,
    /// `https`, or `http` with `?disabletls=yes`.
    base: &'static str,
}

impl Parts<'_> {
    /// The query parameter `key` (case-insensitive).
    fn query(&self, key: &str) -> Option<String> {
        self.uri
            .query()?
            .split('&')
            .filter_map(|pair| pair.split_once('='))
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.to_owned())
    }
}

/// The target of `url`; the error says what is wrong and what form is expected.
pub fn target(url: &str) -> Result<Target, String> {
    if let Some(workflow) = url
        .strip_prefix("teams+")
        .filter(|rest| rest.starts_with("https://") || rest.starts_with("http://"))
    {
        return Ok(Target {
            url: workflow.to_owned(),
            format: Format::TeamsWorkflow,
        });
    }
    if url.starts_with("http://") || url.starts_with("https://") {
        let format = if is_workflow_host(url) {
            Format::TeamsWorkflow
        } else {
            Format::Json
        };
        return Ok(Target {
            url: url.to_owned(),
            format,
        });
    }
    let uri: Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL ({e})"))?;
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
    let (user, host) = match authority.rsplit_once('@') {
        Some((user, host)) => (Some(user), host),
        None => (None, authority),
    };
    let mut parts = Parts {
        url,
        uri: &uri,
        scheme: uri.scheme_str().unwrap_or_default(),
        authority,
        user,
        host,
        path: uri.path().split('/').filter(|p| !p.is_empty()).collect(),
        base: "https",
    };
    if parts
        .query("disabletls")
        .is_some_and(|v| v == "yes" || v == "true")
    {
        parts.base = "http";
    }
    match parts.scheme {
        "slack" => slack(&parts),
        "mattermost" => mattermost(&parts),
        "teams" => Err(format!(
            "{url:?}: teams:// names an Office 365 connector webhook, which Microsoft retired; in the channel create a Workflows webhook (Workflows, \"Send webhook alerts to a channel\") and give its https:// URL (teams+https://URL for a Workflows endpoint on another host)"
        )),
        "generic" | "generic+http" | "generic+https" => Ok(generic(&parts)),
        other => Err(format!(
            "{url:?}: the {other}:// scheme is not supported; give an http(s) webhook URL (a Teams Workflows URL too), or a shoutrrr slack://, mattermost://, generic:// or smtp:// URL"
        )),
    }
}

fn slack(p: &Parts) -> Result<Target, String> {
    let Parts {
        url,
        user,
        host,
        path,
        ..
    } = p;
    let (user, host) = (*user, *host);
    // slack://hook:A-B-C@webhook (shoutrrr 0.6+) or slack://[botname@]A/B/C.
    let tokens: Vec<String> = match (user, host) {
        (Some(user), "webhook") => user
            .strip_prefix("hook:")
            .map(|t| t.split('-').map(str::to_owned).collect())
            .unwrap_or_default(),
        _ => std::iter::once(host)
            .chain(path.iter().copied())
            .map(str::to_owned)
            .collect(),
    };
    if tokens.len() != 3 || tokens.iter().any(String::is_empty) {
        return Err(format!(
            "{url:?}: a Slack webhook URL is slack://hook:TOKEN-A-TOKEN-B-TOKEN-C@webhook (or give the https://hooks.slack.com/services/... URL); a slack:// API token is not supported"
        ));
    }
    let botname = p
        .query("botname")
        .or_else(|| user.filter(|u| !u.starts_with("hook:")).map(str::to_owned));
    Ok(Target {
        url: format!("https://hooks.slack.com/services/{}", tokens.join("/")),
        format: Format::Slack {
            username: botname,
            channel: p.query("channel"),
        },
    })
}

fn mattermost(p: &Parts) -> Result<Target, String> {
    let Parts {
        url,
        user,
        host,
        path,
        base,
        ..
    } = p;
    // mattermost://[username@]host[:port]/token[/channel]
    let (token, channel) = match path.as_slice() {
        [token] => (*token, None),
        [token, channel] => (*token, Some((*channel).to_owned())),
        _ => {
            return Err(format!(
                "{url:?}: a Mattermost URL is mattermost://[username@]host[:port]/token[/channel]"
            ));
        }
    };
    Ok(Target {
        url: format!("{base}://{host}/hooks/{token}"),
        format: Format::Mattermost {
            username: user.map(str::to_owned),
            channel,
        },
    })
}

/// Whether `url` is a Teams Workflows (Power Automate) trigger: those hosts read only an
/// Adaptive Card message, not nodeward's own JSON.
fn is_workflow_host(url: &str) -> bool {
    let Ok(uri) = url.parse::<Uri>() else {
        return false;
    };
    let host = uri.host().unwrap_or_default().to_ascii_lowercase();
    [
        ".logic.azure.com",
        ".powerplatform.com",
        ".powerautomate.com",
    ]
    .iter()
    .any(|suffix| host.ends_with(suffix))
        || host == "flow.microsoft.com"
}

fn generic(p: &Parts) -> Target {
    let Parts {
        uri,
        scheme,
        authority,
        base,
        ..
    } = p;
    let base = match *scheme {
        "generic+http" => "http",
        "generic+https" => "https",
        _ => *base,
    };
    let query = uri
        .query()
        .map(|q| {
            q.split('&')
                .filter(|p| !p.to_lowercase().starts_with("disabletls="))
                .collect::<Vec<_>>()
                .join("&")
        })
        .filter(|q| !q.is_empty())
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    Target {
        url: format!("{base}://{authority}{}{query}", uri.path()),
        format: Format::Json,
    }
}

/// The body for `format` of a notification whose text is `text`, with nodeward's own fields
/// (`json`, used as is for [`Format::Json`]).
pub fn body(format: &Format, text: &str, json: Value) -> Value {
    let with = |mut body: Value, username: &Option<String>, channel: &Option<String>| {
        if let Some(u) = username {
            body["username"] = json!(u);
        }
        if let Some(c) = channel {
            body["channel"] = json!(c);
        }
        body
    };
    match format {
        Format::Json => json,
        Format::Slack { username, channel } | Format::Mattermost { username, channel } => {
            with(json!({"text": text}), username, channel)
        }
        Format::TeamsWorkflow => adaptive_card(text, &json),
    }
}

/// The message a Teams Workflows webhook posts to its channel: one Adaptive Card with the
/// text and nodeward's fields as facts (those with a value).
fn adaptive_card(text: &str, ours: &Value) -> Value {
    let facts: Vec<Value> = [
        ("Node", "node"),
        ("Event", "event"),
        ("Maintenance", "maintenance"),
        ("Reason", "reason"),
        ("Action", "action"),
        ("Message", "message"),
        ("Correlation", "correlation"),
        ("Time", "time"),
    ]
    .iter()
    .filter_map(|(title, field)| {
        let value = ours.get(*field)?.as_str().filter(|v| !v.is_empty())?;
        Some(json!({"title": title, "value": value}))
    })
    .collect();
    json!({
        "type": "message",
        "attachments": [{
            "contentType": "application/vnd.microsoft.card.adaptive",
            "contentUrl": null,
            "content": {
                "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
                "type": "AdaptiveCard",
                "version": "1.4",
                "msteams": {"width": "Full"},
                "body": [
                    {"type": "TextBlock", "text": text, "wrap": true, "weight": "Bolder"},
                    {"type": "FactSet", "facts": facts},
                ],
            },
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shoutrrr_urls_become_the_webhooks_they_name() {
        let cases = [
            (
                "slack://hook:T0AAA-B0BBB-abcDEF123@webhook?channel=ops&botname=kured",
                "https://hooks.slack.com/services/T0AAA/B0BBB/abcDEF123",
                Format::Slack {
                    username: Some("kured".into()),
                    channel: Some("ops".into()),
                },
            ),
            (
                "slack://prod@T0AAA/B0BBB/abcDEF123",
                "https://hooks.slack.com/services/T0AAA/B0BBB/abcDEF123",
                Format::Slack {
                    username: Some("prod".into()),
                    channel: None,
                },
            ),
            (
                "mattermost://bot@chat.example.com/4jq8yx3tgtn1xe1hdw9wbh8gqo/alerts",
                "https://chat.example.com/hooks/4jq8yx3tgtn1xe1hdw9wbh8gqo",
                Format::Mattermost {
                    username: Some("bot".into()),
                    channel: Some("alerts".into()),
                },
            ),
            (
                "mattermost://127.0.0.1:8065/tok?disabletls=yes",
                "http://127.0.0.1:8065/hooks/tok",
                Format::Mattermost {
                    username: None,
                    channel: None,
                },
            ),
            (
                "https://prod-12.westeurope.logic.azure.com:443/workflows/a5b6/triggers/manual/paths/invoke?api-version=2016-06-01&sig=o7p8",
                "https://prod-12.westeurope.logic.azure.com:443/workflows/a5b6/triggers/manual/paths/invoke?api-version=2016-06-01&sig=o7p8",
                Format::TeamsWorkflow,
            ),
            (
                "https://default1234.56.environment.api.powerplatform.com/powerautomate/automations/direct/workflows/a5b6/triggers/manual/paths/invoke?sig=o7p8",
                "https://default1234.56.environment.api.powerplatform.com/powerautomate/automations/direct/workflows/a5b6/triggers/manual/paths/invoke?sig=o7p8",
                Format::TeamsWorkflow,
            ),
            (
                "teams+https://flows.example.com/invoke?sig=o7p8",
                "https://flows.example.com/invoke?sig=o7p8",
                Format::TeamsWorkflow,
            ),
            (
                "generic://hooks.example.com/nodeward?disabletls=yes&team=infra",
                "http://hooks.example.com/nodeward?team=infra",
                Format::Json,
            ),
            (
                "generic+https://hooks.example.com:8443/in",
                "https://hooks.example.com:8443/in",
                Format::Json,
            ),
            (
                "https://example.com/hook",
                "https://example.com/hook",
                Format::Json,
            ),
        ];
        for (url, posted, format) in cases {
            assert_eq!(
                target(url),
                Ok(Target {
                    url: posted.to_owned(),
                    format
                }),
                "{url}"
            );
        }
    }

    #[test]
    fn an_unsupported_or_malformed_url_says_what_form_is_expected() {
        for (url, says) in [
            (
                "telegram://token@telegram?chats=@ops",
                "the telegram:// scheme is not supported",
            ),
            (
                "slack://xoxb:123@C0123",
                "a Slack webhook URL is slack://hook:",
            ),
            (
                "teams://g1d2@t3n4/a5b6/o7p8?host=contoso.webhook.office.com",
                "Microsoft retired; in the channel create a Workflows webhook",
            ),
            ("mattermost://host", "a Mattermost URL is mattermost://"),
        ] {
            let err = target(url).expect_err(url);
            assert!(err.contains(says), "{url}: {err}");
        }
    }

    #[test]
    fn each_service_gets_the_body_it_reads() {
        let ours = json!({"text": "draining n1", "node": "n1"});
        assert_eq!(body(&Format::Json, "draining n1", ours.clone()), ours);
        let slack = Format::Slack {
            username: Some("kured".into()),
            channel: None,
        };
        assert_eq!(
            body(&slack, "draining n1", ours.clone()),
            json!({"text": "draining n1", "username": "kured"})
        );
        let teams = body(&Format::TeamsWorkflow, "draining n1", ours);
        let card = &teams["attachments"][0]["content"];
        assert_eq!(card["type"], "AdaptiveCard");
        assert_eq!(card["body"][0]["text"], "draining n1");
        assert_eq!(
            card["body"][1]["facts"],
            json!([{"title": "Node", "value": "n1"}]),
            "only the fields with a value"
        );
    }
}
