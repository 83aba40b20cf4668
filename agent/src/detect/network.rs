//! The network section of the configuration: the interfaces, default-route, DNS and API
//! server detectors run on its schedule.

use std::time::Duration;

use serde::Deserialize;

use super::{dns::DnsConfig, interfaces::InterfacesConfig, routes::RoutesConfig};

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct NetworkConfig {
    pub enabled: bool,
    #[serde(deserialize_with = "crate::values::duration")]
    pub interval: Duration,
    #[serde(deserialize_with = "crate::values::duration")]
    pub timeout: Duration,
    #[serde(rename = "for", deserialize_with = "crate::values::duration")]
    pub hold: Duration,
    pub interfaces: InterfacesConfig,
    pub default_route: RoutesConfig,
    pub dns: DnsConfig,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(10),
            hold: Duration::from_secs(30),
            interfaces: InterfacesConfig::default(),
            default_route: RoutesConfig::default(),
            dns: DnsConfig::default(),
        }
    }
}

impl NetworkConfig {
    pub fn validate(&self, place: &str) -> Result<(), String> {
        self.interfaces.validate(&format!("{place}.interfaces"))
    }
}
