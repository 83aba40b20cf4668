//! Notifications by e-mail, from the shoutrrr URL kured users already have:
//! `smtp://[user:password@]host[:port]/?from=ADDRESS&to=ADDRESS[,ADDRESS...]` with shoutrrr's
//! `fromname`, `subject` (alias `title`), `auth`, `encryption`, `usestarttls` and
//! `clienthost` parameters. Sent with lettre over tokio, TLS by rustls.

use std::time::Duration;

use hyper::Uri;
use lettre::{
    AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor,
    message::{Mailbox, header::ContentType},
    transport::smtp::{
        authentication::{Credentials, Mechanism},
        client::{Tls, TlsParameters},
        extension::ClientId,
    },
};
use percent_encoding::percent_decode_str;

/// How the connection is secured (shoutrrr's `encryption`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encryption {
    /// Plain text, never upgraded.
    None,
    /// STARTTLS, required.
    Explicit,
    /// TLS from the first byte (port 465).
    Implicit,
    /// TLS on port 465; elsewhere STARTTLS when the server offers it and `usestarttls` is on.
    Auto,
}

/// How the client logs in (shoutrrr's `auth`); CRAM-MD5 is not offered by lettre.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Auth {
    /// No login, even with a user in the URL.
    None,
    Plain,
    OAuth2,
    /// PLAIN or LOGIN, whichever the server offers, when the URL has a user.
    Unknown,
}

/// One e-mail destination.
#[derive(Clone, PartialEq, Eq)]
pub struct Email {
    pub host: String,
    pub port: u16,
    pub user: Option<(String, String)>,
    pub from: Mailbox,
    pub to: Vec<Mailbox>,
    /// Fixed subject; without one, each mail's subject is its text.
    pub subject: Option<String>,
    pub encryption: Encryption,
    pub auth: Auth,
    pub starttls: bool,
    /// The name said in EHLO; the host's own name when `auto`.
    pub client_host: Option<String>,
}

impl std::fmt::Debug for Email {
    // The password stays out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Email")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user.as_ref().map(|(user, _)| user))
            .field("from", &self.from)
            .field("to", &self.to)
            .field("encryption", &self.encryption)
            .finish_non_exhaustive()
    }
}

const FORM: &str =
    "smtp://[user:password@]host[:port]/?from=ADDRESS&to=ADDRESS[,ADDRESS...][&subject=...]";

/// The destination of an `smtp://` URL; the error names the part that is wrong and the form.
pub fn parse(url: &str) -> Result<Email, String> {
    let uri: Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL ({e}); the form is {FORM}"))?;
    let authority = uri
        .authority()
        .ok_or_else(|| format!("{url:?}: no server; the form is {FORM}"))?;
    let host = authority.host().trim_matches(['[', ']']).to_owned();
    if host.is_empty() {
        return Err(format!("{url:?}: no server; the form is {FORM}"));
    }
    let port = authority.port_u16().unwrap_or(25);
    let decode = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
    let user = authority
        .as_str()
        .rsplit_once('@')
        .map(|(info, _)| match info.split_once(':') {
            Some((user, password)) => (decode(user), decode(password)),
            None => (decode(info), String::new()),
        });
    let query: Vec<(String, String)> = uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_ascii_lowercase(), decode(&v.replace('+', " "))))
        .collect();
    let param = |names: &[&str]| {
        query
            .iter()
            .find(|(k, _)| names.contains(&k.as_str()))
            .map(|(_, v)| v.clone())
    };
    let from_address = param(&["from", "fromaddress"])
        .ok_or_else(|| format!("{url:?}: from= is missing; the form is {FORM}"))?;
    let from_name = param(&["fromname"]).filter(|n| !n.is_empty());
    let from = mailbox(from_name, &from_address).map_err(|e| format!("{url:?}: from={e}"))?;
    let to = param(&["to", "toaddresses"])
        .ok_or_else(|| format!("{url:?}: to= is missing; the form is {FORM}"))?
        .split(',')
        .filter(|a| !a.trim().is_empty())
        .map(|a| mailbox(None, a).map_err(|e| format!("{url:?}: to={e}")))
        .collect::<Result<Vec<_>, _>>()?;
    if to.is_empty() {
        return Err(format!("{url:?}: to= names no address; the form is {FORM}"));
    }
    let encryption = match param(&["encryption"])
        .as_deref()
        .map(str::to_ascii_lowercase)
    {
        None => Encryption::Auto,
        Some(e) => match e.as_str() {
            "auto" => Encryption::Auto,
            "none" => Encryption::None,
            "explicittls" => Encryption::Explicit,
            "implicittls" => Encryption::Implicit,
            _ => {
                return Err(format!(
                    "{url:?}: encryption={e} is not one of None, ExplicitTLS, ImplicitTLS, Auto"
                ));
            }
        },
    };
    let auth = match param(&["auth"]).as_deref().map(str::to_ascii_lowercase) {
        None => Auth::Unknown,
        Some(a) => match a.as_str() {
            "unknown" => Auth::Unknown,
            "none" => Auth::None,
            "plain" => Auth::Plain,
            "oauth2" => Auth::OAuth2,
            "crammd5" => {
                return Err(format!(
                    "{url:?}: auth=CRAMMD5 is not supported; use Plain (over TLS) or OAuth2"
                ));
            }
            _ => {
                return Err(format!(
                    "{url:?}: auth={a} is not one of None, Plain, OAuth2, Unknown"
                ));
            }
        },
    };
    let starttls = match param(&["usestarttls"]).as_deref() {
        None => true,
        Some(v) => yes(v).ok_or_else(|| format!("{url:?}: usestarttls={v} is not yes or no"))?,
    };
    Ok(Email {
        host,
        port,
        user: user.filter(|(name, _)| !name.is_empty()),
        from,
        to,
        subject: param(&["subject", "title"]).filter(|s| !s.is_empty()),
        encryption,
        auth,
        starttls,
        client_host: param(&["clienthost"]).filter(|h| !h.is_empty()),
    })
}

fn yes(value: &str) -> Option<bool> {
    match value.to_ascii_lowercase().as_str() {
        "yes" | "true" | "1" => Some(true),
        "no" | "false" | "0" => Some(false),
        _ => None,
    }
}

fn mailbox(name: Option<String>, address: &str) -> Result<Mailbox, String> {
    let address = address
        .trim()
        .parse()
        .map_err(|e| format!("{address}: not an e-mail address ({e})"))?;
    Ok(Mailbox::new(name, address))
}

impl Email {
    /// Sends one mail whose subject (unless fixed) and first line are `text`, followed by
    /// `details`, within `timeout`.
    pub async fn send(&self, text: &str, details: &str, timeout: Duration) -> Result<(), String> {
        let subject = self
            .subject
            .clone()
            .unwrap_or_else(|| text.lines().next().unwrap_or_default().to_owned());
        let mut message = Message::builder()
            .from(self.from.clone())
            .subject(subject)
            .header(ContentType::TEXT_PLAIN);
        for to in &self.to {
            message = message.to(to.clone());
        }
        let message = message
            .body(format!("{text}\n\n{details}"))
            .map_err(|e| format!("composing the mail: {e}"))?;
        self.transport(timeout)?
            .send(message)
            .await
            .map(drop)
            .map_err(|e| format!("sending to {}:{}: {e}", self.host, self.port))
    }

    fn transport(&self, timeout: Duration) -> Result<AsyncSmtpTransport<Tokio1Executor>, String> {
        let tls = || {
            TlsParameters::new(self.host.clone()).map_err(|e| format!("TLS for {}: {e}", self.host))
        };
        let tls = match self.encryption {
            Encryption::None => Tls::None,
            Encryption::Explicit => Tls::Required(tls()?),
            Encryption::Implicit => Tls::Wrapper(tls()?),
            Encryption::Auto if self.port == 465 => Tls::Wrapper(tls()?),
            Encryption::Auto if self.starttls => Tls::Opportunistic(tls()?),
            Encryption::Auto => Tls::None,
        };
        let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(&self.host)
            .port(self.port)
            .tls(tls)
            .timeout(Some(timeout));
        match self.client_host.as_deref() {
            None => builder = builder.hello_name(ClientId::Domain("localhost".into())),
            Some("auto") => {}
            Some(name) => builder = builder.hello_name(ClientId::Domain(name.to_owned())),
        }
        if let Some((user, password)) = &self.user {
            let mechanisms = match self.auth {
                Auth::None => Vec::new(),
                Auth::Plain => vec![Mechanism::Plain],
                Auth::OAuth2 => vec![Mechanism::Xoauth2],
                Auth::Unknown => vec![Mechanism::Plain, Mechanism::Login],
            };
            if !mechanisms.is_empty() {
                builder = builder
                    .credentials(Credentials::new(user.clone(), password.clone()))
                    .authentication(mechanisms);
            }
        }
        Ok(builder.build())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shoutrrr_smtp_url_names_server_login_sender_and_recipients() {
        let email = parse(
            "smtp://ops%40example.com:s3cr%2Ft@mail.example.com:587/?from=nodes@example.com&fromname=Node+Reboots&to=a@example.com,b@example.com&subject=Reboots&encryption=ExplicitTLS&auth=Plain&clienthost=worker-1",
        )
        .expect("a valid URL");
        assert_eq!(email.host, "mail.example.com");
        assert_eq!(email.port, 587);
        assert_eq!(
            email.user,
            Some(("ops@example.com".into(), "s3cr/t".into()))
        );
        assert_eq!(email.from.to_string(), "Node Reboots <nodes@example.com>");
        assert_eq!(
            email.to.iter().map(|m| m.to_string()).collect::<Vec<_>>(),
            ["a@example.com", "b@example.com"]
        );
        assert_eq!(email.subject.as_deref(), Some("Reboots"));
        assert_eq!(email.encryption, Encryption::Explicit);
        assert_eq!(email.auth, Auth::Plain);
        assert_eq!(email.client_host.as_deref(), Some("worker-1"));
        assert!(
            !format!("{email:?}").contains("s3cr"),
            "the password is not logged"
        );

        let plain = parse("smtp://relay.internal/?from=n@x.io&to=o@x.io").expect("valid");
        assert_eq!(plain.port, 25);
        assert_eq!(plain.user, None);
        assert_eq!(plain.encryption, Encryption::Auto);
        assert_eq!(plain.auth, Auth::Unknown);
        assert!(plain.starttls);
    }

    #[test]
    fn a_bad_smtp_url_names_the_part_and_the_form() {
        for (url, says) in [
            ("smtp://mail.example.com/?to=o@x.io", "from= is missing"),
            ("smtp://mail.example.com/?from=n@x.io", "to= is missing"),
            (
                "smtp://mail.example.com/?from=n@x.io&to=,",
                "to= names no address",
            ),
            (
                "smtp://mail.example.com/?from=nobody&to=o@x.io",
                "from=nobody: not an e-mail address",
            ),
            (
                "smtp://mail.example.com/?from=n@x.io&to=o@x.io&encryption=SSL",
                "encryption=ssl is not one of",
            ),
            (
                "smtp://mail.example.com/?from=n@x.io&to=o@x.io&auth=CRAMMD5",
                "auth=CRAMMD5 is not supported",
            ),
            (
                "smtp://mail.example.com/?from=n@x.io&to=o@x.io&usestarttls=maybe",
                "usestarttls=maybe is not yes or no",
            ),
        ] {
            let err = parse(url).expect_err(url);
            assert!(err.contains(says), "{url}: {err}");
        }
    }
}
