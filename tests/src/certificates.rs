//! Client certificates issued the way an operator gets one: a key and a CSR made here, a
//! CertificateSigningRequest for the API server's client signer, approved by the admin and
//! signed by the controller manager (the control plane's CA).

use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

use crate::wait;

/// A certificate and its private key, PEM.
#[derive(Clone, Debug)]
pub struct ClientCertificate {
    pub certificate: String,
    pub key: String,
}

impl ClientCertificate {
    /// The certificate and the key as a kubeconfig carries them (`client-certificate-data`,
    /// `client-key-data`): base64 of the PEM.
    pub fn kubeconfig_data(&self) -> (String, String) {
        (base64_of(&self.certificate), base64_of(&self.key))
    }
}

/// A client certificate for `user` in `groups` (subject CN and O), valid for a day: requested
/// with `client` (the admin), approved, signed, and its request deleted.
pub async fn issue(
    client: &Client,
    name: &str,
    user: &str,
    groups: &[&str],
) -> anyhow::Result<ClientCertificate> {
    let key = rcgen::KeyPair::generate().context("generating a key")?;
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, user);
    for group in groups {
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, *group);
    }
    let csr = params
        .serialize_request(&key)
        .context("making the CSR")?
        .pem()
        .context("encoding the CSR")?;
    let requests: Api<CertificateSigningRequest> = Api::all(client.clone());
    let request: CertificateSigningRequest = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "request": base64_of(&csr),
            "signerName": "kubernetes.io/kube-apiserver-client",
            "expirationSeconds": 86400,
            "usages": ["client auth"],
        },
    }))?;
    // One left by an earlier run of the test goes first.
    wait::deleted(&requests, name, Duration::from_secs(30)).await?;
    requests
        .create(&PostParams::default(), &request)
        .await
        .with_context(|| format!("creating the CertificateSigningRequest {name}"))?;
    let approval = json!({"status": {"conditions": [{
        "type": "Approved", "status": "True", "reason": "NodewardTest",
        "message": "approved by the test as an operator would",
    }]}});
    requests
        .patch_approval(name, &PatchParams::default(), &Patch::Merge(approval))
        .await
        .with_context(|| format!("approving {name}"))?;
    let signed = wait::until(
        &requests,
        name,
        "the certificate signed",
        Duration::from_secs(60),
        |r| r.is_some_and(|r| r.status.as_ref().is_some_and(|s| s.certificate.is_some())),
    )
    .await?
    .context("the signed request")?;
    let certificate = signed
        .status
        .and_then(|s| s.certificate)
        .context("the certificate")?;
    requests.delete(name, &DeleteParams::default()).await?;
    Ok(ClientCertificate {
        certificate: String::from_utf8(certificate.0).context("the certificate's PEM")?,
        key: key.serialize_pem(),
    })
}

fn base64_of(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}
