//! What a node runs: its OS image and kernel, and the versions of the packages an operator
//! named, read by its agent from the host (never changed by it). A NodeReport carries the
//! latest reading; a maintenance records the readings before and after it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// The most packages an agent reports the versions of.
pub const PACKAGES_LIMIT: usize = 32;

/// The longest package name (dpkg and rpm names are far shorter in practice).
pub const PACKAGE_NAME_LIMIT: usize = 128;

/// One reading of a node's software.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    /// The host's `/etc/os-release` `PRETTY_NAME`, e.g. `Debian GNU/Linux 13 (trixie)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub os_image: Option<String>,
    /// The running kernel's release (`uname -r`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub kernel: Option<String>,
    /// The boot the reading was taken in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub boot_id: Option<String>,
    /// The packages the agent was asked about (`inventory.packages`), installed or not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = PACKAGES_LIMIT))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub packages: Vec<PackageVersion>,
    /// How many upgrades the package manager knows of, from its local metadata as last
    /// refreshed (nodeward never refreshes it); absent when not asked for
    /// (`inventory.pendingUpdates`) or not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub updates_pending: Option<i32>,
    /// The package manager read (`dpkg` or `rpm`), when packages or updates were asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub package_manager: Option<String>,
    /// When it was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_at: Option<Time>,
    /// What could not be read, when something could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub error: Option<String>,
}

/// A named package's installed version.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PackageVersion {
    #[schemars(length(min = 1, max = PACKAGE_NAME_LIMIT))]
    pub name: String,
    /// The installed version (with its epoch and release, as the package manager prints it);
    /// absent when the package is not installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub version: Option<String>,
}

impl Inventory {
    /// The installed version of `package`, when it is reported and installed.
    pub fn version_of(&self, package: &str) -> Option<&str> {
        self.packages
            .iter()
            .find(|p| p.name == package)
            .and_then(|p| p.version.as_deref())
    }
}
