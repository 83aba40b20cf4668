//! `dist/release` as a releaser runs it, with a signing key of theirs: every artifact it says it
//! makes is there and whole (the tarballs' files, the chart, the SBOMs, the images), every file
//! is in SHA256SUMS with its hash, and the signature of SHA256SUMS verifies with the published
//! public key and fails for a changed one. A key that cannot sign is refused before anything is
//! built.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context;
use nodeward_e2e::{helm::run, repo_root};
use sha2::{Digest, Sha256};

fn release(key: &Path) -> Command {
    let mut command = Command::new(repo_root().join("dist/release"));
    command.env("NODEWARD_SIGNING_KEY", key);
    command
}

fn openssl(args: &[&str]) -> anyhow::Result<std::process::Output> {
    Ok(Command::new("openssl").args(args).output()?)
}

/// The names in a gzipped tarball, directories left out.
fn tarball_files(path: &Path) -> anyhow::Result<BTreeSet<String>> {
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(std::fs::File::open(path)?));
    let mut names = BTreeSet::new();
    for entry in archive.entries()? {
        let entry = entry?;
        if entry.header().entry_type().is_file() {
            names.insert(entry.path()?.display().to_string());
        }
    }
    Ok(names)
}

#[test]
fn a_release_has_every_artifact_it_names_summed_and_signed_with_the_releasers_key()
-> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("nodeward-release-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let key = dir.join("release-key.pem");
    let made = openssl(&[
        "genpkey",
        "-algorithm",
        "ed25519",
        "-out",
        &key.display().to_string(),
    ])?;
    anyhow::ensure!(made.status.success(), "openssl genpkey: {made:?}");

    // An RSA key cannot make the signature the release promises: refused at once.
    let rsa = dir.join("rsa.pem");
    openssl(&[
        "genpkey",
        "-algorithm",
        "rsa",
        "-out",
        &rsa.display().to_string(),
    ])?;
    let refused = release(&rsa).output()?;
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && said.contains("is not a PEM Ed25519 private key"),
        "{said}"
    );
    assert!(
        !said.contains("building"),
        "refused before building: {said}"
    );

    let out = PathBuf::from(run(&mut release(&key))?.trim());
    let version = nodeward_e2e::workspace_version()?;
    let files: BTreeSet<String> = std::fs::read_dir(&out)?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .collect::<anyhow::Result<_>>()?;
    let mut expected: BTreeSet<String> = [
        format!("nodeward-{version}-linux-amd64.tar.gz"),
        format!("nodeward-{version}-linux-arm64.tar.gz"),
        format!("nodeward-{version}.tgz"),
        format!("nodeward-agent-{version}.cdx.json"),
        format!("nodeward-coordinator-{version}.cdx.json"),
        format!("kubectl-nodeward-{version}.cdx.json"),
        "SHA256SUMS".to_owned(),
        "SHA256SUMS.sig".to_owned(),
        "nodeward-release.pub".to_owned(),
    ]
    .into();
    for image in ["nodeward-agent", "nodeward-coordinator"] {
        expected.insert(format!("{image}_{version}.oci.tar"));
        for arch in ["amd64", "arm64"] {
            expected.insert(format!("{image}_{version}_linux-{arch}.oci.tar"));
        }
    }
    assert_eq!(files, expected, "the artifacts in {}", out.display());

    for arch in ["amd64", "arm64"] {
        let name = format!("nodeward-{version}-linux-{arch}");
        let inside = tarball_files(&out.join(format!("{name}.tar.gz")))?;
        let want: BTreeSet<String> = [
            "nodeward-agent",
            "nodeward-coordinator",
            "kubectl-nodeward",
            "LICENSE",
            "README.md",
            "systemd/nodeward-agent.service",
            "systemd/logind.conf.d/zz-nodeward.conf",
        ]
        .iter()
        .map(|f| format!("{name}/{f}"))
        .collect();
        assert_eq!(inside, want, "{name}.tar.gz");
    }
    for sbom in ["nodeward-agent", "nodeward-coordinator", "kubectl-nodeward"] {
        let text = std::fs::read_to_string(out.join(format!("{sbom}-{version}.cdx.json")))?;
        let bom: serde_json::Value = serde_json::from_str(&text)?;
        assert_eq!(bom["bomFormat"], "CycloneDX", "{sbom}");
        assert_eq!(bom["specVersion"], "1.5", "{sbom}");
        let components = bom["components"].as_array().map(Vec::len).unwrap_or(0);
        assert!(
            text.contains("\"kube\"") && components > 50,
            "{sbom}: {components} components"
        );
    }

    // Every other file is summed, with its hash.
    let sums = std::fs::read_to_string(out.join("SHA256SUMS"))?;
    let summed: BTreeSet<String> = sums
        .lines()
        .map(|line| {
            let (hash, file) = line.split_once("  ").context("a SHA256SUMS line")?;
            let actual = hex(&Sha256::digest(std::fs::read(out.join(file))?));
            assert_eq!(hash, actual, "{file}");
            Ok(file.to_owned())
        })
        .collect::<anyhow::Result<_>>()?;
    let unsummed: BTreeSet<String> = ["SHA256SUMS", "SHA256SUMS.sig", "nodeward-release.pub"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    assert_eq!(
        summed,
        files.difference(&unsummed).cloned().collect(),
        "SHA256SUMS names every artifact"
    );

    // The signature verifies with the published key, and not for changed sums.
    let verify = |sums: &Path| {
        openssl(&[
            "pkeyutl",
            "-verify",
            "-pubin",
            "-inkey",
            &out.join("nodeward-release.pub").display().to_string(),
            "-rawin",
            "-in",
            &sums.display().to_string(),
            "-sigfile",
            &out.join("SHA256SUMS.sig").display().to_string(),
        ])
    };
    assert!(verify(&out.join("SHA256SUMS"))?.status.success());
    let changed = dir.join("SHA256SUMS");
    std::fs::write(&changed, sums.replacen('0', "1", 1))?;
    assert!(
        !verify(&changed)?.status.success(),
        "a changed SHA256SUMS does not verify"
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
