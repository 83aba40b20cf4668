//! Network interfaces: at least one non-loopback interface must be up with a usable address.

use std::{collections::BTreeMap, net::IpAddr};

use nix::{ifaddrs::getifaddrs, net::if_::InterfaceFlags};
use nodeward_api::conditions::node::NETWORK_PROBLEM;
use serde::Deserialize;

use super::Finding;

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

impl InterfacesConfig {
    pub fn validate(&self, place: &str) -> Result<(), String> {
        for (index, pattern) in self.ignore.iter().enumerate() {
            let star = pattern.find('*');
            if pattern.is_empty() || star.is_some_and(|at| at != pattern.len() - 1) {
                return Err(format!(
                    "{place}.ignore[{index}]: {pattern:?} is not an interface name or a prefix ending in a single '*' (e.g. \"eth0\" or \"veth*\")"
                ));
            }
        }
        Ok(())
    }
}

pub const DETECTOR: &str = "interfaces";

/// One interface as the kernel reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub up: bool,
    pub loopback: bool,
    pub addresses: Vec<IpAddr>,
}

/// Reads every interface with its flags and addresses.
pub fn read() -> Result<Vec<Interface>, nix::Error> {
    let mut by_name: BTreeMap<String, Interface> = BTreeMap::new();
    for entry in getifaddrs()? {
        let interface = by_name
            .entry(entry.interface_name.clone())
            .or_insert_with(|| Interface {
                name: entry.interface_name.clone(),
                up: false,
                loopback: false,
                addresses: Vec::new(),
            });
        // IFF_RUNNING: up and with carrier; IFF_UP alone is only administratively up.
        interface.up |= entry
            .flags
            .contains(InterfaceFlags::IFF_UP | InterfaceFlags::IFF_RUNNING);
        interface.loopback |= entry.flags.contains(InterfaceFlags::IFF_LOOPBACK);
        let address = entry.address.as_ref().and_then(|a| {
            a.as_sockaddr_in()
                .map(|v4| IpAddr::V4(v4.ip()))
                .or_else(|| a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
        });
        if let Some(address) = address {
            interface.addresses.push(address);
        }
    }
    Ok(by_name.into_values().collect())
}

pub fn observe(config: &InterfacesConfig) -> Finding {
    match read() {
        Ok(list) => evaluate(&list, config),
        Err(e) => Finding::unknown(
            DETECTOR,
            NETWORK_PROBLEM,
            "InterfacesUnreadable",
            format!("cannot list network interfaces: {e}"),
        ),
    }
}

/// Whether a relevant interface that is up has a usable IPv6 address.
pub fn has_global_ipv6(interfaces: &[Interface], config: &InterfacesConfig) -> bool {
    relevant(interfaces, config)
        .filter(|i| i.up)
        .flat_map(|i| &i.addresses)
        .any(|a| a.is_ipv6() && is_usable(a))
}

/// Whether an address can carry the node's traffic (not loopback, unspecified or link-local).
pub fn is_usable(address: &IpAddr) -> bool {
    match address {
        IpAddr::V4(v4) => !(v4.is_loopback() || v4.is_unspecified() || v4.is_link_local()),
        IpAddr::V6(v6) => {
            !(v6.is_loopback() || v6.is_unspecified() || (v6.segments()[0] & 0xffc0) == 0xfe80)
        }
    }
}

/// Whether `name` matches one of the ignore patterns (exact, or a prefix ending in `*`).
pub fn is_ignored(name: &str, patterns: &[String]) -> bool {
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == p,
    })
}

/// The interfaces that count: neither loopback nor ignored.
pub fn relevant<'a>(
    interfaces: &'a [Interface],
    config: &'a InterfacesConfig,
) -> impl Iterator<Item = &'a Interface> {
    interfaces
        .iter()
        .filter(|i| !i.loopback && !is_ignored(&i.name, &config.ignore))
}

pub fn evaluate(interfaces: &[Interface], config: &InterfacesConfig) -> Finding {
    let mut usable = Vec::new();
    let mut down = Vec::new();
    let mut without_address = Vec::new();
    for interface in relevant(interfaces, config) {
        let addresses: Vec<String> = interface
            .addresses
            .iter()
            .filter(|a| is_usable(a))
            .map(ToString::to_string)
            .collect();
        if !interface.up {
            down.push(interface.name.as_str());
        } else if addresses.is_empty() {
            without_address.push(interface.name.as_str());
        } else {
            usable.push(format!("{} ({})", interface.name, addresses.join(", ")));
        }
    }
    if !usable.is_empty() {
        return Finding::ok(
            DETECTOR,
            NETWORK_PROBLEM,
            "InterfacesUp",
            format!("up with an address: {}", usable.join("; ")),
        );
    }
    let mut detail = Vec::new();
    if !down.is_empty() {
        detail.push(format!("down: {}", down.join(", ")));
    }
    if !without_address.is_empty() {
        detail.push(format!(
            "up without a usable address: {}",
            without_address.join(", ")
        ));
    }
    if detail.is_empty() {
        detail.push("no interface other than loopback (and ignored ones)".to_owned());
    }
    Finding::problem(
        DETECTOR,
        NETWORK_PROBLEM,
        "NoAddress",
        format!(
            "no non-loopback interface is up with a usable address ({})",
            detail.join("; ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::Status;

    fn iface(name: &str, up: bool, addresses: &[&str]) -> Interface {
        Interface {
            name: name.to_owned(),
            up,
            loopback: name == "lo",
            addresses: addresses
                .iter()
                .map(|a| a.parse().expect("address"))
                .collect(),
        }
    }

    #[test]
    fn an_up_interface_with_a_routable_address_is_enough() {
        let found = evaluate(
            &[
                iface("lo", true, &["127.0.0.1"]),
                iface("eth0", true, &["10.0.0.5", "fe80::1"]),
            ],
            &InterfacesConfig::default(),
        );
        assert_eq!(found.status, Status::Ok);
        found.assert_says("eth0 (10.0.0.5)");
    }

    #[test]
    fn loopback_and_link_local_only_is_no_address() {
        let found = evaluate(
            &[
                iface("lo", true, &["127.0.0.1", "::1"]),
                iface("eth0", true, &["169.254.3.4", "fe80::1"]),
            ],
            &InterfacesConfig::default(),
        );
        assert_eq!(found.status, Status::Problem);
        assert_eq!(found.reason, "NoAddress");
        found.assert_says("up without a usable address: eth0");
    }

    #[test]
    fn a_down_interface_does_not_count_even_with_an_address() {
        let found = evaluate(
            &[iface("lo", true, &[]), iface("eth0", false, &["10.0.0.5"])],
            &InterfacesConfig::default(),
        );
        assert_eq!(found.status, Status::Problem);
        assert!(found.message.contains("down: eth0"), "{}", found.message);
    }

    #[test]
    fn ignored_interfaces_do_not_hide_a_missing_address() {
        let config = InterfacesConfig {
            ignore: vec!["cni*".into(), "docker0".into()],
        };
        let interfaces = [
            iface("cni0", true, &["10.244.0.1"]),
            iface("docker0", true, &["172.17.0.1"]),
            iface("eth0", true, &[]),
        ];
        let found = evaluate(&interfaces, &config);
        assert_eq!(found.status, Status::Problem);
        assert!(is_ignored("cni0", &config.ignore) && !is_ignored("docker1", &config.ignore));
    }

    #[test]
    fn global_ipv6_alone_is_usable() {
        let found = evaluate(
            &[iface("eth0", true, &["2001:db8::5"])],
            &InterfacesConfig::default(),
        );
        assert_eq!(found.status, Status::Ok);
    }

    #[test]
    fn reads_this_machines_interfaces_with_loopback() {
        let interfaces = read().expect("getifaddrs works");
        assert!(interfaces.iter().any(|i| i.loopback), "{interfaces:?}");
    }
}
