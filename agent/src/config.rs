//! The agent's configuration file (YAML). Every field is optional; unknown fields are refused
//! so that a typo never silently turns a check off.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::Error;

/// Where the agent looks for its configuration when `--config` is not given.
pub const DEFAULT_PATH: &str = "/etc/nodeward/agent.yaml";

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Config {
    pub detectors: Detectors,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Detectors {
    pub network: NetworkConfig,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct NetworkConfig {
    pub enabled: bool,
    pub interfaces: InterfacesConfig,
    pub default_route: RoutesConfig,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            interfaces: InterfacesConfig::default(),
            default_route: RoutesConfig::default(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct InterfacesConfig {
    /// Interfaces that never count as the node's network: exact names, or prefixes ending in
    /// `*`. By default the bridges and veths that container runtimes and CNIs create.
    pub ignore: Vec<String>,
}

impl Default for InterfacesConfig {
    fn default() -> Self {
        let defaults = [
            "veth*",
            "docker*",
            "cni*",
            "cali*",
            "flannel*",
            "cilium_*",
            "kube-ipvs*",
            "virbr*",
            "lxc*",
            "tunl*",
        ];
        Self {
            ignore: defaults.into_iter().map(String::from).collect(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct RoutesConfig {
    pub ipv6: Ipv6Mode,
}

/// Whether an IPv6 default route is expected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum Ipv6Mode {
    /// Expected when the node has a global IPv6 address.
    #[default]
    Auto,
    Required,
    Ignored,
}

impl Config {
    /// Reads `path`, or [`DEFAULT_PATH`] when none is given and it exists; the defaults when
    /// neither.
    pub fn load(path: Option<&Path>) -> Result<Self, Error> {
        let path = match path {
            Some(p) => p.to_path_buf(),
            None if Path::new(DEFAULT_PATH).exists() => PathBuf::from(DEFAULT_PATH),
            None => return Ok(Self::default()),
        };
        let text = std::fs::read_to_string(&path).map_err(|e| Error::Config {
            path: path.clone(),
            message: format!("cannot read it: {e}"),
        })?;
        Self::parse(&text).map_err(|message| Error::Config { path, message })
    }

    /// Parses and validates configuration text; the error names the field and the fix.
    pub fn parse(text: &str) -> Result<Self, String> {
        // An empty file is the defaults, as an empty YAML document would be.
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let config: Self = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), String> {
        for (index, pattern) in self.detectors.network.interfaces.ignore.iter().enumerate() {
            let star = pattern.find('*');
            if pattern.is_empty() || star.is_some_and(|at| at != pattern.len() - 1) {
                return Err(format!(
                    "detectors.network.interfaces.ignore[{index}]: {pattern:?} is not an interface name or a prefix ending in a single '*' (e.g. \"eth0\" or \"veth*\")"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_text_is_the_defaults() {
        assert_eq!(Config::parse(""), Ok(Config::default()));
        assert!(Config::default().detectors.network.enabled);
    }

    #[test]
    fn reads_every_field() {
        let config = Config::parse(
            "detectors:\n  network:\n    enabled: false\n    interfaces:\n      ignore: [\"eth9\", \"tap*\"]\n    defaultRoute:\n      ipv6: Required\n",
        )
        .expect("valid");
        let network = &config.detectors.network;
        assert!(!network.enabled);
        assert_eq!(network.interfaces.ignore, vec!["eth9", "tap*"]);
        assert_eq!(network.default_route.ipv6, Ipv6Mode::Required);
    }

    #[test]
    fn unknown_field_is_named_with_its_place() {
        let err = Config::parse("detectors:\n  network:\n    enabled: true\n    interfacez: {}\n")
            .expect_err("typo");
        assert!(
            err.contains("detectors.network") && err.contains("interfacez"),
            "{err}"
        );
        assert!(err.contains("expected one of"), "{err}");
    }

    #[test]
    fn wrong_enum_value_lists_the_allowed_ones() {
        let err = Config::parse("detectors:\n  network:\n    defaultRoute:\n      ipv6: always\n")
            .expect_err("bad enum");
        assert!(
            err.contains("ipv6") && err.contains("Auto") && err.contains("Required"),
            "{err}"
        );
    }

    #[test]
    fn bad_ignore_pattern_names_the_entry_and_the_fix() {
        let err = Config::parse(
            "detectors:\n  network:\n    interfaces:\n      ignore: [\"eth0\", \"*eth\"]\n",
        )
        .expect_err("bad pattern");
        assert!(
            err.starts_with("detectors.network.interfaces.ignore[1]"),
            "{err}"
        );
        assert!(err.contains("prefix ending in a single '*'"), "{err}");
    }

    #[test]
    fn missing_file_is_an_error_naming_the_path() {
        let err = Config::load(Some(Path::new("/nonexistent/nodeward.yaml"))).expect_err("missing");
        assert!(
            err.to_string().contains("/nonexistent/nodeward.yaml"),
            "{err}"
        );
    }
}
