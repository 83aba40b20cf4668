//! A test's scratch files: a directory under the system's temporary directory, named for the
//! test (its id, or the process's for tests without a control plane), so that tests running side
//! by side never share a file.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// `<root>/<name>`, created if it is not there yet: the root is `$NODEWARD_TEST_SCRATCH`
/// (`tests/run` makes one per run and removes it when the run passes), else `$TMPDIR`.
pub fn dir(name: &str) -> anyhow::Result<PathBuf> {
    let root =
        std::env::var_os("NODEWARD_TEST_SCRATCH").map_or_else(std::env::temp_dir, PathBuf::from);
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Writes `contents` to `file` in `dir`; its path.
pub fn write(dir: &Path, file: &str, contents: impl AsRef<[u8]>) -> anyhow::Result<PathBuf> {
    let path = dir.join(file);
    std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Writes [`agent_config`] to `agent.yaml` in `dir`; its path.
pub fn agent_config_file(dir: &Path, detectors: &[&str], rest: &str) -> anyhow::Result<PathBuf> {
    write(dir, "agent.yaml", agent_config(detectors, rest))
}

/// The host detectors a test's agent runs only where the test turns them on: left on, they
/// would report this machine's own routes, disks, kubelet and kernel log.
const HOST_DETECTORS: [&str; 7] = [
    "network",
    "filesystem",
    "peers",
    "kernelLog",
    "kubelet",
    "containerRuntime",
    "rebootRequired",
];

/// An agent configuration (YAML) for a test: `detectors` are the `detectors:` entries it turns
/// on, one `name: {...}` each; every other host detector is off; `rest` follows (the other
/// top-level sections, `shutdownGuard` and `reporting` among them).
pub fn agent_config(detectors: &[&str], rest: &str) -> String {
    let mut yaml = String::from("detectors:\n");
    for name in HOST_DETECTORS {
        let prefix = format!("{name}:");
        if !detectors.iter().any(|d| d.starts_with(&prefix)) {
            yaml.push_str(&format!("  {name}: {{enabled: false}}\n"));
        }
    }
    for detector in detectors {
        yaml.push_str("  ");
        yaml.push_str(&detector.replace('\n', "\n  "));
        yaml.push('\n');
    }
    yaml.push_str(rest);
    yaml
}

#[cfg(test)]
mod tests {
    use super::agent_config;

    #[test]
    fn the_detectors_a_test_names_replace_their_off_switch() {
        let yaml = agent_config(
            &["rebootRequired: {sentinelFile: /x}", "peers:\n  port: 1"],
            "shutdownGuard: {enabled: false}\n",
        );
        assert!(
            yaml.starts_with("detectors:\n  network: {enabled: false}\n"),
            "{yaml}"
        );
        assert!(!yaml.contains("rebootRequired: {enabled: false}"), "{yaml}");
        assert!(!yaml.contains("peers: {enabled: false}"), "{yaml}");
        assert!(
            yaml.contains("  rebootRequired: {sentinelFile: /x}\n"),
            "{yaml}"
        );
        assert!(yaml.contains("  peers:\n    port: 1\n"), "{yaml}");
        assert!(
            yaml.ends_with("shutdownGuard: {enabled: false}\n"),
            "{yaml}"
        );
    }
}
