//! The webhook's serving certificate and the CA the API server trusts it by, issued and renewed
//! by the coordinator itself, so that no render of the chart (`helm template`, Argo CD, Flux)
//! creates or rotates them behind its back.
//!
//! What is kept (in one Secret) is [`Material`]: the issuing CA, optionally its successor, the
//! trust bundle (`ca.crt`, the `caBundle` of the webhook configuration) and the serving
//! certificate. [`decide`] is the whole policy, over plain facts read from the certificates:
//! - the serving certificate is renewed when a third of its life is left, or when it no longer
//!   names the service or was not issued by the current CA;
//! - the CA gets a successor when a third of its life is left: the successor joins the trust
//!   bundle at once but issues nothing yet, so every API server trusts it long before it is
//!   needed; when a sixth is left, the successor takes over and issues a new serving
//!   certificate, and the old CA stays in the bundle until it expires.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use x509_parser::{certificate::X509Certificate, extensions::GeneralName, pem::Pem};

/// Secret keys, in `kubernetes.io/tls` style (`tls.crt`, `tls.key`, `ca.crt`) plus the CAs' own.
pub const TRUST_BUNDLE: &str = "ca.crt";
pub const SERVING_CERT: &str = "tls.crt";
pub const SERVING_KEY: &str = "tls.key";
pub const ISSUER_CERT: &str = "issuer.crt";
pub const ISSUER_KEY: &str = "issuer.key";
pub const NEXT_ISSUER_CERT: &str = "next-issuer.crt";
pub const NEXT_ISSUER_KEY: &str = "next-issuer.key";

/// Certificates are valid from a little before they were made: the API server's clock may be
/// behind ours.
const CLOCK_SKEW: Duration = Duration::from_secs(5 * 60);

/// What the certificates must be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    /// DNS names the API server reaches the webhook by (the Service's, and any extra).
    pub dns_names: Vec<String>,
    /// How long a CA is valid.
    pub ca_lifetime: Duration,
    /// How long a serving certificate is valid (never past its CA).
    pub serving_lifetime: Duration,
}

impl Wanted {
    /// The names of Service `service` in `namespace`, as the API server may ask for them.
    pub fn service_names(service: &str, namespace: &str) -> Vec<String> {
        vec![
            format!("{service}.{namespace}.svc"),
            format!("{service}.{namespace}.svc.cluster.local"),
            format!("{service}.{namespace}"),
            service.to_owned(),
        ]
    }
}

/// A CA that issues: its certificate and private key (PEM).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authority {
    pub cert: String,
    pub key: String,
}

/// Everything kept, as PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Material {
    pub issuer: Authority,
    pub next_issuer: Option<Authority>,
    /// Every CA certificate the API server should trust now, concatenated.
    pub trust_bundle: String,
    pub serving_cert: String,
    pub serving_key: String,
}

/// The validity of one certificate, in seconds since the epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    pub not_before: i64,
    pub not_after: i64,
}

impl Validity {
    fn left(&self, now: i64) -> i64 {
        self.not_after - now
    }

    /// The life it was issued for: certificates made here start [`CLOCK_SKEW`] early.
    fn lifetime(&self) -> i64 {
        (self.not_after - self.not_before - seconds(CLOCK_SKEW)).max(1)
    }
}

/// What [`decide`] looks at, read from [`Material`] by [`facts`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    pub issuer: Validity,
    pub next_issuer: Option<Validity>,
    pub serving: Validity,
    pub serving_names: Vec<String>,
    /// The serving certificate's signature verifies with the issuer's key.
    pub serving_issued_by_issuer: bool,
    /// The bundle holds the issuer (and the successor, if any).
    pub bundle_trusts_issuers: bool,
    /// Some certificate in the bundle has expired.
    pub bundle_has_expired: bool,
    /// When the first certificate of the bundle expires.
    pub earliest_trusted_expiry: i64,
}

/// What to do with the material.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Keep,
    /// Start over: a new CA and a new serving certificate (nothing usable is kept).
    Fresh(&'static str),
    /// A new serving certificate from the current CA.
    Reissue(&'static str),
    /// Make the CA's successor and add it to the trust bundle.
    PrepareSuccessor,
    /// The successor becomes the issuer and issues a new serving certificate.
    Promote,
    /// Drop expired CAs from the trust bundle (or add a missing issuer to it).
    RebuildBundle,
}

/// The renewal policy (see the module documentation).
pub fn decide(facts: &Facts, wanted: &Wanted, now: i64) -> Step {
    let issuer_left = facts.issuer.left(now);
    if issuer_left <= 0 {
        return Step::Fresh("the CA has expired");
    }
    // Thresholds follow the CA as it was made (a changed --webhook-ca-validity applies to the
    // next CA), so that a CA made for a long life is not replaced at once.
    let issuer_life = facts.issuer.lifetime();
    if issuer_left * 6 <= issuer_life && facts.next_issuer.is_some_and(|n| n.left(now) > 0) {
        return Step::Promote;
    }
    if issuer_left * 3 <= issuer_life && facts.next_issuer.is_none_or(|n| n.left(now) <= 0) {
        return Step::PrepareSuccessor;
    }
    let covers = wanted
        .dns_names
        .iter()
        .all(|name| facts.serving_names.contains(name));
    if !covers {
        return Step::Reissue("the serving certificate does not name every webhook address");
    }
    if !facts.serving_issued_by_issuer {
        return Step::Reissue("the serving certificate was not issued by the current CA");
    }
    let serving_life = facts.serving.lifetime();
    let serving_left = facts.serving.left(now);
    if serving_left * 3 <= serving_life {
        return Step::Reissue("a third of the serving certificate's life is left");
    }
    if !facts.bundle_trusts_issuers || facts.bundle_has_expired {
        return Step::RebuildBundle;
    }
    Step::Keep
}

/// When [`decide`] will next have something to do, if nothing else changes (seconds since the
/// epoch): the keeper sleeps until then.
pub fn next_due(facts: &Facts) -> i64 {
    let issuer_life = facts.issuer.lifetime();
    let mut due = match facts.next_issuer {
        Some(_) => facts.issuer.not_after - issuer_life / 6,
        None => facts.issuer.not_after - issuer_life / 3,
    };
    due = due.min(facts.serving.not_after - facts.serving.lifetime() / 3);
    if let Some(next) = facts.next_issuer {
        due = due.min(next.not_after);
    }
    due.min(facts.earliest_trusted_expiry)
}

/// Seconds since the epoch.
pub fn unix(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

fn seconds(duration: Duration) -> i64 {
    i64::try_from(duration.as_secs()).unwrap_or(i64::MAX)
}

fn parse_pems(pem: &str) -> Result<Vec<Pem>, String> {
    let pems: Vec<Pem> = Pem::iter_from_buffer(pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("not PEM: {e}"))?;
    if pems.is_empty() {
        return Err("holds no PEM block".to_owned());
    }
    Ok(pems)
}

fn validity(cert: &X509Certificate<'_>) -> Validity {
    Validity {
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
    }
}

fn dns_names(cert: &X509Certificate<'_>) -> Vec<String> {
    cert.subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    GeneralName::DNSName(dns) => Some((*dns).to_owned()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Reads the facts [`decide`] needs; the error says which part is unreadable (then everything
/// is made afresh).
pub fn facts(material: &Material, now: i64) -> Result<Facts, String> {
    let issuer_pem = parse_pems(&material.issuer.cert).map_err(|e| format!("{ISSUER_CERT} {e}"))?;
    let issuer = issuer_pem[0]
        .parse_x509()
        .map_err(|e| format!("{ISSUER_CERT}: {e}"))?;
    KeyPair::from_pem(&material.issuer.key).map_err(|e| format!("{ISSUER_KEY}: {e}"))?;
    let next_pem = match &material.next_issuer {
        Some(next) => {
            KeyPair::from_pem(&next.key).map_err(|e| format!("{NEXT_ISSUER_KEY}: {e}"))?;
            Some(parse_pems(&next.cert).map_err(|e| format!("{NEXT_ISSUER_CERT} {e}"))?)
        }
        None => None,
    };
    let next = match &next_pem {
        Some(pems) => Some(
            pems[0]
                .parse_x509()
                .map_err(|e| format!("{NEXT_ISSUER_CERT}: {e}"))?,
        ),
        None => None,
    };
    let serving_pem =
        parse_pems(&material.serving_cert).map_err(|e| format!("{SERVING_CERT} {e}"))?;
    let serving = serving_pem[0]
        .parse_x509()
        .map_err(|e| format!("{SERVING_CERT}: {e}"))?;
    KeyPair::from_pem(&material.serving_key).map_err(|e| format!("{SERVING_KEY}: {e}"))?;
    let bundle_pems =
        parse_pems(&material.trust_bundle).map_err(|e| format!("{TRUST_BUNDLE} {e}"))?;
    let mut bundle = Vec::new();
    for pem in &bundle_pems {
        bundle.push(
            pem.parse_x509()
                .map_err(|e| format!("{TRUST_BUNDLE}: {e}"))?,
        );
    }
    let in_bundle = |der: &[u8]| bundle_pems.iter().any(|b| b.contents == der);
    Ok(Facts {
        issuer: validity(&issuer),
        next_issuer: next.as_ref().map(validity),
        serving: validity(&serving),
        serving_names: dns_names(&serving),
        serving_issued_by_issuer: serving.issuer() == issuer.subject()
            && serving.verify_signature(Some(issuer.public_key())).is_ok(),
        bundle_trusts_issuers: in_bundle(&issuer_pem[0].contents)
            && next_pem.as_ref().is_none_or(|n| in_bundle(&n[0].contents)),
        bundle_has_expired: bundle.iter().any(|b| validity(b).not_after <= now),
        earliest_trusted_expiry: bundle
            .iter()
            .map(|b| validity(b).not_after)
            .min()
            .unwrap_or(now),
    })
}

fn time(seconds: i64) -> Result<time::OffsetDateTime, String> {
    time::OffsetDateTime::from_unix_timestamp(seconds)
        .map_err(|e| format!("{seconds} s is not a time: {e}"))
}

/// A new self-signed CA valid for `lifetime` from `now`.
pub fn new_authority(lifetime: Duration, now: i64) -> Result<Authority, String> {
    let key = KeyPair::generate().map_err(|e| format!("generating a CA key: {e}"))?;
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, format!("nodeward-webhook-ca-{now}"));
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = time(now - seconds(CLOCK_SKEW))?;
    params.not_after = time(now.saturating_add(seconds(lifetime)))?;
    let cert = params
        .self_signed(&key)
        .map_err(|e| format!("signing the CA: {e}"))?;
    Ok(Authority {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// A serving certificate for `wanted.dns_names` from `issuer`, never valid past the issuer.
pub fn issue_serving(
    issuer: &Authority,
    wanted: &Wanted,
    now: i64,
) -> Result<(String, String), String> {
    let issuer_key =
        KeyPair::from_pem(&issuer.key).map_err(|e| format!("reading the CA key: {e}"))?;
    let issuer_not_after = parse_pems(&issuer.cert)?[0]
        .parse_x509()
        .map(|c| c.validity().not_after.timestamp())
        .map_err(|e| format!("reading the CA certificate: {e}"))?;
    let signer = Issuer::from_ca_cert_pem(&issuer.cert, &issuer_key)
        .map_err(|e| format!("reading the CA certificate: {e}"))?;
    let key = KeyPair::generate().map_err(|e| format!("generating a serving key: {e}"))?;
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(
        DnType::CommonName,
        wanted.dns_names.first().cloned().unwrap_or_default(),
    );
    params.distinguished_name = name;
    params.subject_alt_names = wanted
        .dns_names
        .iter()
        .map(|dns| {
            dns.clone()
                .try_into()
                .map(SanType::DnsName)
                .map_err(|e| format!("{dns:?} is not a DNS name: {e}"))
        })
        .collect::<Result<_, _>>()?;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = time(now - seconds(CLOCK_SKEW))?;
    params.not_after = time(
        now.saturating_add(seconds(wanted.serving_lifetime))
            .min(issuer_not_after),
    )?;
    let cert = params
        .signed_by(&key, &signer)
        .map_err(|e| format!("signing the serving certificate: {e}"))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// The CA certificates of `pems` that are still valid at `now`, plus `add`, without repeats.
fn bundle(pems: &[&str], now: i64) -> String {
    let mut kept: Vec<Vec<u8>> = Vec::new();
    let mut out = String::new();
    for text in pems {
        let Ok(blocks) = parse_pems(text) else {
            continue;
        };
        for block in blocks {
            let Ok(cert) = block.parse_x509() else {
                continue;
            };
            if validity(&cert).not_after <= now || kept.contains(&block.contents) {
                continue;
            }
            kept.push(block.contents.clone());
            out.push_str(&pem_text(&block.contents));
        }
    }
    out
}

fn pem_text(der: &[u8]) -> String {
    pem::encode_config(
        &pem::Pem::new("CERTIFICATE", der.to_vec()),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    )
}

/// Everything made afresh.
pub fn fresh(wanted: &Wanted, now: i64) -> Result<Material, String> {
    let issuer = new_authority(wanted.ca_lifetime, now)?;
    let (serving_cert, serving_key) = issue_serving(&issuer, wanted, now)?;
    Ok(Material {
        trust_bundle: bundle(&[&issuer.cert], now),
        issuer,
        next_issuer: None,
        serving_cert,
        serving_key,
    })
}

/// Carries out `step` on `material`.
pub fn apply(
    step: Step,
    material: Option<&Material>,
    wanted: &Wanted,
    now: i64,
) -> Result<Option<Material>, String> {
    let Some(current) = material else {
        return fresh(wanted, now).map(Some);
    };
    let mut next = current.clone();
    match step {
        Step::Keep => return Ok(None),
        Step::Fresh(_) => return fresh(wanted, now).map(Some),
        Step::Reissue(_) => {
            (next.serving_cert, next.serving_key) = issue_serving(&next.issuer, wanted, now)?;
        }
        Step::PrepareSuccessor => {
            next.next_issuer = Some(new_authority(wanted.ca_lifetime, now)?);
        }
        Step::Promote => {
            let Some(successor) = next.next_issuer.take() else {
                return fresh(wanted, now).map(Some);
            };
            next.issuer = successor;
            (next.serving_cert, next.serving_key) = issue_serving(&next.issuer, wanted, now)?;
        }
        Step::RebuildBundle => {}
    }
    // The bundle keeps every CA still valid: the one that issued certificates until now (API
    // servers may not have the new serving certificate's issuer yet), the issuer, the successor.
    let mut sources: Vec<&str> = vec![&current.trust_bundle, &next.issuer.cert];
    if let Some(successor) = &next.next_issuer {
        sources.push(&successor.cert);
    }
    next.trust_bundle = bundle(&sources, now);
    Ok(Some(next))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400;

    fn wanted() -> Wanted {
        Wanted {
            dns_names: Wanted::service_names("nodeward-coordinator-webhook", "nodeward"),
            ca_lifetime: Duration::from_secs(3650 * DAY as u64),
            serving_lifetime: Duration::from_secs(365 * DAY as u64),
        }
    }

    fn facts_now(material: &Material, now: i64) -> Facts {
        facts(material, now).expect("readable material")
    }

    #[test]
    fn fresh_material_is_consistent_and_kept() {
        let now = 1_800_000_000;
        let material = fresh(&wanted(), now).expect("fresh material");
        let facts = facts_now(&material, now);
        assert!(facts.serving_issued_by_issuer);
        assert!(facts.bundle_trusts_issuers);
        assert_eq!(facts.serving_names, wanted().dns_names);
        assert_eq!(facts.serving.not_after, now + 365 * DAY);
        assert_eq!(facts.issuer.not_after, now + 3650 * DAY);
        assert_eq!(decide(&facts, &wanted(), now), Step::Keep);
        assert_eq!(decide(&facts, &wanted(), now + 200 * DAY), Step::Keep);
    }

    #[test]
    fn the_serving_certificate_is_renewed_with_a_third_of_its_life_left() {
        let now = 1_800_000_000;
        let material = fresh(&wanted(), now).expect("fresh material");
        let renew_at = now + 244 * DAY; // 121 of 365 days left
        let step = decide(&facts_now(&material, renew_at), &wanted(), renew_at);
        assert!(matches!(step, Step::Reissue(_)), "{step:?}");
        let renewed = apply(step, Some(&material), &wanted(), renew_at)
            .expect("renewal")
            .expect("a change");
        assert_ne!(renewed.serving_cert, material.serving_cert);
        assert_eq!(renewed.issuer, material.issuer, "the CA stays");
        assert_eq!(
            renewed.trust_bundle, material.trust_bundle,
            "the caBundle does not change"
        );
        let after = facts_now(&renewed, renew_at);
        assert!(after.serving_issued_by_issuer);
        assert_eq!(decide(&after, &wanted(), renew_at), Step::Keep);
    }

    #[test]
    fn a_changed_service_name_gets_a_new_certificate() {
        let now = 1_800_000_000;
        let material = fresh(&wanted(), now).expect("fresh material");
        let mut other = wanted();
        other.dns_names = Wanted::service_names("renamed-webhook", "nodeward");
        let step = decide(&facts_now(&material, now), &other, now);
        assert_eq!(
            step,
            Step::Reissue("the serving certificate does not name every webhook address")
        );
        let renewed = apply(step, Some(&material), &other, now)
            .expect("renewal")
            .expect("a change");
        assert_eq!(facts_now(&renewed, now).serving_names, other.dns_names);
    }

    #[test]
    fn the_ca_is_trusted_before_it_issues_and_the_old_one_until_it_expires() {
        let lifetime = Duration::from_secs(600);
        let wanted = Wanted {
            ca_lifetime: lifetime,
            serving_lifetime: Duration::from_secs(60),
            ..wanted()
        };
        let start = 1_800_000_000;
        let first = fresh(&wanted, start).expect("fresh");
        let old_ca = first.issuer.clone();
        // The CA lives 600 s: its successor is made with 200 s left and takes over with 100 s
        // left.
        let mut material = first;
        let mut now = start;
        let mut steps = Vec::new();
        while now < start + 1200 {
            let facts = facts_now(&material, now);
            let step = decide(&facts, &wanted, now);
            if step == Step::Keep {
                assert!(
                    next_due(&facts) > now,
                    "due at {} but nothing to do",
                    now - start
                );
            } else {
                assert!(
                    next_due(&facts) <= now,
                    "{step:?} at {} before it was due at {}",
                    now - start,
                    next_due(&facts) - start
                );
                steps.push((now - start, step));
                material = apply(step, Some(&material), &wanted, now)
                    .expect("apply")
                    .expect("a change");
                let after = facts_now(&material, now);
                assert!(
                    after.serving_issued_by_issuer && after.bundle_trusts_issuers,
                    "after {step:?} at {}: {after:?}",
                    now - start
                );
                assert!(
                    after.serving.not_after <= after.issuer.not_after,
                    "never valid past its CA"
                );
                if step == Step::Promote && now - start < 600 {
                    assert!(
                        material.trust_bundle.contains(old_ca.cert.trim()),
                        "the old CA stays trusted while it is valid"
                    );
                }
            }
            now += 10;
        }
        let kinds: Vec<Step> = steps.iter().map(|(_, s)| *s).collect();
        let prepare = kinds
            .iter()
            .position(|s| *s == Step::PrepareSuccessor)
            .expect("a successor was prepared");
        let promote = kinds
            .iter()
            .position(|s| *s == Step::Promote)
            .expect("the successor took over");
        assert!(prepare < promote, "{steps:?}");
        assert_eq!(steps[prepare].0, 400, "{steps:?}");
        assert_eq!(steps[promote].0, 500, "{steps:?}");
        assert!(
            !kinds.iter().any(|s| matches!(s, Step::Fresh(_))),
            "never started over: {steps:?}"
        );
        assert!(
            !material.trust_bundle.contains(old_ca.cert.trim()),
            "an expired CA leaves the bundle"
        );
    }

    #[test]
    fn unreadable_material_names_the_key_and_is_made_afresh() {
        let now = 1_800_000_000;
        let mut material = fresh(&wanted(), now).expect("fresh material");
        material.serving_key = "garbage".to_owned();
        let error = facts(&material, now).expect_err("unreadable");
        assert!(error.starts_with("tls.key"), "{error}");
        material.issuer.cert = String::new();
        let error = facts(&material, now).expect_err("unreadable");
        assert!(error.starts_with("issuer.crt"), "{error}");
    }

    #[test]
    fn an_expired_ca_starts_over() {
        let now = 1_800_000_000;
        let material = fresh(&wanted(), now).expect("fresh material");
        let later = now + 3651 * DAY;
        assert_eq!(
            decide(&facts_now(&material, later), &wanted(), later),
            Step::Fresh("the CA has expired")
        );
    }
}
