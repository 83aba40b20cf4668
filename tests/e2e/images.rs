//! The container images `dist/images` builds (./tests/run builds them before the tests): what
//! each OCI archive holds, that their binaries run, and that the chart points at them.

use std::{
    collections::BTreeMap,
    io::Read,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context;
use nodeward_e2e::{repo_root, workspace_version};
use serde_json::Value;
use sha2::{Digest, Sha256};

const MIB: u64 = 1024 * 1024;

fn images_dir() -> PathBuf {
    repo_root().join("target/images")
}

/// An OCI image archive, read whole: its blobs by digest and its index.
struct Archive {
    path: PathBuf,
    blobs: BTreeMap<String, Vec<u8>>,
    index: Value,
}

impl Archive {
    fn open(path: &Path) -> anyhow::Result<Self> {
        let file = std::fs::File::open(path).with_context(|| {
            format!(
                "opening {} (built by dist/images, which ./tests/run runs first)",
                path.display()
            )
        })?;
        let mut blobs = BTreeMap::new();
        let mut index = Value::Null;
        let mut archive = tar::Archive::new(file);
        for entry in archive.entries()? {
            let mut entry = entry?;
            let name = entry.path()?.to_string_lossy().into_owned();
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes)?;
            if let Some(hex) = name.strip_prefix("blobs/sha256/").filter(|h| !h.is_empty()) {
                // Every blob is what its name says.
                let actual = format!("{:x}", Sha256::digest(&bytes));
                anyhow::ensure!(actual == hex, "blob {hex} has digest {actual}");
                blobs.insert(format!("sha256:{hex}"), bytes);
            } else if name == "index.json" {
                index = serde_json::from_slice(&bytes)?;
            }
        }
        Ok(Self {
            path: path.to_owned(),
            blobs,
            index,
        })
    }

    fn blob(&self, descriptor: &Value) -> anyhow::Result<&[u8]> {
        let digest = descriptor["digest"].as_str().context("a digest")?;
        let blob = self
            .blobs
            .get(digest)
            .with_context(|| format!("{} lacks blob {digest}", self.path.display()))?;
        anyhow::ensure!(
            descriptor["size"].as_u64() == Some(blob.len() as u64),
            "blob {digest} is not the size its descriptor says"
        );
        Ok(blob)
    }

    fn json(&self, descriptor: &Value) -> anyhow::Result<Value> {
        Ok(serde_json::from_slice(self.blob(descriptor)?)?)
    }

    /// The image manifests reachable from the index, with their platform.
    fn manifests(&self) -> anyhow::Result<Vec<(Value, Value)>> {
        let mut found = Vec::new();
        let mut queue: Vec<(Value, Value)> = self.index["manifests"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|d| (d.clone(), d["platform"].clone()))
            .collect();
        while let Some((descriptor, platform)) = queue.pop() {
            let document = self.json(&descriptor)?;
            if document["mediaType"] == "application/vnd.oci.image.index.v1+json" {
                for child in document["manifests"].as_array().into_iter().flatten() {
                    queue.push((child.clone(), child["platform"].clone()));
                }
            } else {
                found.push((document, platform));
            }
        }
        Ok(found)
    }

    /// The files of an image, layer over layer: path -> contents (directories: None).
    fn files(&self, manifest: &Value) -> anyhow::Result<BTreeMap<String, Option<Vec<u8>>>> {
        let mut files = BTreeMap::new();
        for layer in manifest["layers"].as_array().into_iter().flatten() {
            anyhow::ensure!(
                layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip",
                "layers are compressed: {layer}"
            );
            let mut layer = tar::Archive::new(flate2::read::GzDecoder::new(self.blob(layer)?));
            for entry in layer.entries()? {
                let mut entry = entry?;
                let path = entry
                    .path()?
                    .to_string_lossy()
                    .trim_end_matches('/')
                    .to_owned();
                let contents = if entry.header().entry_type().is_dir() {
                    None
                } else {
                    let mut bytes = Vec::new();
                    entry.read_to_end(&mut bytes)?;
                    Some(bytes)
                };
                files.insert(path, contents);
            }
        }
        Ok(files)
    }
}

/// The compressed size of an image: its manifest, config and layers.
fn compressed_size(archive: &Archive, manifest: &Value) -> anyhow::Result<u64> {
    let mut size = serde_json::to_vec(manifest)?.len() as u64;
    size += manifest["config"]["size"].as_u64().unwrap_or_default();
    for layer in manifest["layers"].as_array().into_iter().flatten() {
        size += archive.blob(layer)?.len() as u64;
    }
    Ok(size)
}

struct Component {
    name: &'static str,
    user: &'static str,
    /// The size target, compressed.
    max_size: u64,
}

const COMPONENTS: [Component; 2] = [
    Component {
        name: "agent",
        user: "0:0",
        max_size: 10 * MIB,
    },
    Component {
        name: "coordinator",
        user: "65532:65532",
        max_size: 15 * MIB,
    },
];

const ARCHES: [&str; 2] = ["amd64", "arm64"];

#[test]
fn each_image_holds_only_its_binary_and_the_ca_bundle_for_both_architectures() -> anyhow::Result<()>
{
    let version = workspace_version()?;
    let ca_bundle = std::fs::read("/etc/ssl/certs/ca-certificates.crt")?;
    for component in COMPONENTS {
        let binary = format!("nodeward-{}", component.name);
        // The multi-architecture archive: one index naming both platforms.
        let all = Archive::open(&images_dir().join(format!("{binary}_{version}.oci.tar")))?;
        assert_eq!(
            all.index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
            format!("ghcr.io/nodeward/{binary}:{version}")
        );
        let mut platforms: Vec<String> = all
            .manifests()?
            .iter()
            .map(|(_, p)| {
                format!(
                    "{}/{}",
                    p["os"].as_str().unwrap_or("?"),
                    p["architecture"].as_str().unwrap_or("?")
                )
            })
            .collect();
        platforms.sort();
        assert_eq!(platforms, ["linux/amd64", "linux/arm64"], "{binary}");

        for arch in ARCHES {
            let archive = Archive::open(
                &images_dir().join(format!("{binary}_{version}_linux-{arch}.oci.tar")),
            )?;
            let manifests = archive.manifests()?;
            assert_eq!(manifests.len(), 1, "{binary} {arch}: one image");
            let (manifest, _) = &manifests[0];
            let config = archive.json(&manifest["config"])?;
            assert_eq!(config["architecture"], arch, "{binary}");
            assert_eq!(config["os"], "linux");
            let labels = &config["config"]["Labels"];
            assert_eq!(labels["org.opencontainers.image.version"], version.as_str());
            assert_eq!(labels["org.opencontainers.image.title"], binary.as_str());
            assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
            assert_eq!(
                labels["org.opencontainers.image.source"],
                "https://github.com/nodeward/nodeward"
            );
            let revision = labels["org.opencontainers.image.revision"]
                .as_str()
                .unwrap_or_default();
            assert!(
                revision.len() >= 12 && revision != "unknown",
                "{binary}: revision label {revision:?}"
            );
            assert_eq!(config["config"]["User"], component.user, "{binary}");
            assert_eq!(
                config["config"]["Entrypoint"],
                serde_json::json!([format!("/{binary}")])
            );

            let files = archive.files(manifest)?;
            let paths: Vec<&str> = files.keys().map(String::as_str).collect();
            assert_eq!(
                paths,
                [
                    "etc",
                    "etc/ssl",
                    "etc/ssl/certs",
                    "etc/ssl/certs/ca-certificates.crt",
                    binary.as_str(),
                ],
                "{binary} {arch}: nothing but the binary and the CA bundle"
            );
            assert_eq!(
                files["etc/ssl/certs/ca-certificates.crt"].as_deref(),
                Some(ca_bundle.as_slice()),
                "the build machine's CA bundle"
            );

            let size = compressed_size(&archive, manifest)?;
            println!(
                "{binary} linux/{arch}: {:.2} MiB compressed",
                size as f64 / MIB as f64
            );
            assert!(
                size <= component.max_size,
                "{binary} {arch}: {size} bytes compressed, more than {} MiB",
                component.max_size / MIB
            );
            let told = documented_size()?;
            assert!(
                (size as f64 - told as f64).abs() <= 0.75 * MIB as f64,
                "{binary} {arch}: {:.2} MiB compressed, but docs/install.md says about {} MiB: correct it",
                size as f64 / MIB as f64,
                told / MIB
            );
        }
    }
    Ok(())
}

/// The images' size as docs/install.md gives it ("About N MiB each, compressed").
fn documented_size() -> anyhow::Result<u64> {
    let install = std::fs::read_to_string(repo_root().join("docs/install.md"))?;
    let (before, _) = install
        .split_once(" MiB each, compressed")
        .context("docs/install.md gives the images' size as \"About N MiB each, compressed\"")?;
    let mebibytes: u64 = before
        .rsplit("About ")
        .next()
        .unwrap_or_default()
        .trim()
        .parse()
        .context("the size docs/install.md gives")?;
    Ok(mebibytes * MIB)
}

/// Writes the image's binary to a temporary file; its path.
fn unpack_binary(component: &str, arch: &str) -> anyhow::Result<PathBuf> {
    let version = workspace_version()?;
    let binary = format!("nodeward-{component}");
    let archive =
        Archive::open(&images_dir().join(format!("{binary}_{version}_linux-{arch}.oci.tar")))?;
    let (manifest, _) = archive.manifests()?.remove(0);
    let bytes = archive
        .files(&manifest)?
        .remove(&binary)
        .flatten()
        .with_context(|| format!("the {arch} image has no {binary}"))?;
    let dir = nodeward_e2e::scratch::dir(&format!("nodeward-images-{}", std::process::id()))?;
    let path = dir.join(format!("{binary}-{arch}"));
    std::fs::write(&path, bytes)?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    Ok(path)
}

#[test]
fn the_binaries_unpacked_from_the_images_run_statically_on_both_architectures() -> anyhow::Result<()>
{
    let version = workspace_version()?;
    for (arch, target, runner) in [
        ("amd64", "x86_64-unknown-linux-musl", None),
        (
            "arm64",
            "aarch64-unknown-linux-musl",
            Some("qemu-aarch64-static"),
        ),
    ] {
        for component in COMPONENTS {
            let path = unpack_binary(component.name, arch)?;
            let command = |args: &[&str]| {
                let mut command = match runner {
                    Some(runner) => {
                        let mut c = Command::new(runner);
                        c.arg(&path);
                        c
                    }
                    None => Command::new(&path),
                };
                command.args(args);
                command
            };
            let output = command(&["--version"])
                .output()
                .with_context(|| format!("running {} (under {runner:?})", path.display()))?;
            let printed = String::from_utf8_lossy(&output.stdout).into_owned();
            assert!(output.status.success(), "{printed}");
            assert!(
                printed.starts_with(&format!("nodeward-{} {version} (revision ", component.name))
                    && printed.trim_end().ends_with(&format!(", {target})")),
                "{arch}: {printed}"
            );
            if component.name == "agent" {
                // The local detectors run to a verdict: 0 healthy, 1 a problem on this machine
                // (never 2, a bad configuration, nor a crash), with JSON that parses.
                let output = command(&["check", "--output", "json"]).output()?;
                let code = output.status.code();
                assert!(
                    matches!(code, Some(0 | 1)),
                    "{arch}: check exited {code:?}: {}",
                    String::from_utf8_lossy(&output.stderr)
                );
                let report: Value = serde_json::from_slice(&output.stdout)
                    .with_context(|| format!("{arch}: check's JSON"))?;
                assert!(
                    report["findings"].as_array().is_some_and(|f| !f.is_empty()),
                    "{arch}: {report}"
                );
                let problems = report["problems"].as_u64().context("problems")?;
                assert_eq!(
                    code == Some(1),
                    problems > 0,
                    "{arch}: exit {code:?}, {report}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn the_chart_points_at_the_images_the_build_makes() -> anyhow::Result<()> {
    let version = workspace_version()?;
    let chart: Value = serde_yaml::from_str(&std::fs::read_to_string(
        repo_root().join("charts/nodeward/Chart.yaml"),
    )?)?;
    assert_eq!(
        chart["appVersion"],
        version.as_str(),
        "Chart.yaml appVersion"
    );
    let values: Value = serde_yaml::from_str(&std::fs::read_to_string(
        repo_root().join("charts/nodeward/values.yaml"),
    )?)?;
    let built = std::fs::read_to_string(images_dir().join("images.txt"))?;
    for component in ["agent", "coordinator"] {
        let image = &values[component]["image"];
        assert_eq!(
            image["tag"], "",
            "{component}: the tag defaults to appVersion"
        );
        let reference = format!(
            "{}:{version}",
            image["repository"].as_str().context("repository")?
        );
        assert!(
            built
                .lines()
                .any(|l| l.starts_with(&format!("{reference}\t"))),
            "{reference} is not among the built images:\n{built}"
        );
    }
    Ok(())
}
